"""The recipe tools on the GPU against the CPU: label smoothing in the fused cross-entropy, random
shifts and flips drawn from the device's generator (the same bits), warm-up on the device schedule,
and a captured step that shifts and flips anew at every replay and resumes exactly."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import layers as L, optim  # noqa: E402
from minidl.backend import CounterRNG  # noqa: E402
from minidl.kernels.cpu import augment as caug, softmax as csm  # noqa: E402
from minidl.kernels.gpu import augment as gaug, softmax as gsm  # noqa: E402
from minidl.optim import schedules  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402


@pytest.mark.parametrize("K,eps", [(10, 0.1), (100, 0.3), (10, 0.0)])
def test_smoothed_xent_matches_cpu(rand, K, eps):
    z = 3 * rand(37, K)
    labels = np.random.default_rng(1).integers(0, K, 37).astype(np.int32)
    loss, correct, gz = csm.softmax_xent(z, labels, smoothing=eps)
    gloss, gcorrect, ggz = gsm.softmax_xent(cp.asarray(z), cp.asarray(labels), smoothing=eps)
    close(gloss, loss, "ulp")
    assert int(gcorrect) == int(correct)
    close(ggz, gz, "ulp")


@pytest.mark.parametrize("shape,m", [((64, 1, 28, 28), 2), ((7, 3, 5, 9), 1), ((5, 1, 6, 6), 3)])
def test_random_shift_is_the_cpus_bit_for_bit(rand, shape, m):
    x = rand(*shape)
    c, g = CounterRNG(np, 77), CounterRNG(cp, 77)
    for _ in range(3):                                   # the offset advances alike on both
        want = caug.random_shift(x, m, -0.42, c)
        got = gaug.random_shift(cp.asarray(x), m, -0.42, g)
        np.testing.assert_array_equal(got.get(), want)
        assert int(g.offset) == int(c.offset)


@pytest.mark.parametrize("shape", [(64, 1, 28, 28), (7, 3, 5, 9), (33, 1, 6, 2)])
def test_random_flip_is_the_cpus_bit_for_bit(rand, shape):
    x = rand(*shape)
    c, g = CounterRNG(np, 77), CounterRNG(cp, 77)
    for _ in range(3):                                   # the offset advances alike on both
        want = caug.random_flip(x, c)
        got = gaug.random_flip(cp.asarray(x), g)
        np.testing.assert_array_equal(got.get(), want)
        assert int(g.offset) == int(c.offset)
    assert not np.array_equal(want, x) and not np.array_equal(want, x[..., ::-1])   # some flipped, some not


def test_warmup_schedule_steps_equal_the_cpu():
    out = {}
    for name in ("cpu", "cuda"):
        x = L.Input((6,))
        m = dl.Model(x, L.Dense(3)(x), device=name, seed=0)
        opt = optim.SGD(0.1, schedule=schedules.warmup(3, schedules.cosine(5))).setup(m)
        m.grads[...] = m.device.asarray(np.linspace(-1, 1, m.grads.size, dtype=np.float32))
        for _ in range(7):
            opt.step()
        out[name] = m.device.to_host(m.flat)
    np.testing.assert_allclose(out["cuda"], out["cpu"], rtol=1e-6, atol=1e-7)


def _net(device, seed=0):
    x = L.Input((1, 12, 12))
    return dl.Model(x, L.Softmax()(L.Dense(10)(L.ReLU()(L.Dense(32)(L.Flatten()(x))))), device=device, seed=seed)


def _data(n=256):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 12, 12), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def _run(device, graph, steps, resume_from=None, save_to=None, flip=False):
    model = _net(dl.get_device(device, seed=0))
    trainer = dl.Trainer(model, optim.SGD(0.05), graph=graph, progress=False, log=lambda s: None,
                         label_smoothing=0.1, shift=2, flip=flip)
    if resume_from:
        trainer.resume(resume_from)
    trainer.fit(_data(), more_steps=steps, batch_size=32, monitor=steps)
    if save_to:
        trainer.save(save_to)
    return trainer


def test_shifted_captured_run_is_the_eager_run_and_the_cpus():
    captured, eager, cpu = _run("cuda", True, 12), _run("cuda", False, 12), _run("cpu", False, 12)
    assert captured.graph and captured._step._captured, "the step did not run captured"
    assert int(captured.device.rng.offset) == int(cpu.device.rng.offset) == 12 * 2 * 32   # replays drew anew
    for other, rtol, atol in ((eager, 1e-5, 1e-6), (cpu, 2e-3, 2e-4)):      # cuBLAS vs NumPy sums: as test_training
        for k, w in other.model.get_weights().items():
            np.testing.assert_allclose(captured.model.get_weights()[k], w, rtol=rtol, atol=atol, err_msg=k)


def test_a_resumed_shifted_run_on_the_gpu_is_the_straight_run(tmp_path):
    straight = _run("cuda", True, 12)
    _run("cuda", True, 5, save_to=str(tmp_path / "c.npz"))
    resumed = _run("cuda", True, 7, resume_from=str(tmp_path / "c.npz"))
    for k, w in straight.model.get_weights().items():
        np.testing.assert_array_equal(resumed.model.get_weights()[k], w, err_msg=k)


def test_flipped_captured_run_is_the_eager_run_and_the_cpus_and_resumes_exactly(tmp_path):
    captured, eager, cpu = (_run("cuda", True, 12, flip=True), _run("cuda", False, 12, flip=True),
                            _run("cpu", False, 12, flip=True))
    assert captured.graph and captured._step._captured, "the step did not run captured"
    assert int(captured.device.rng.offset) == int(cpu.device.rng.offset) == 12 * 3 * 32   # replays drew anew
    for other, rtol, atol in ((eager, 1e-5, 1e-6), (cpu, 2e-3, 2e-4)):
        for k, w in other.model.get_weights().items():
            np.testing.assert_allclose(captured.model.get_weights()[k], w, rtol=rtol, atol=atol, err_msg=k)
    _run("cuda", True, 5, save_to=str(tmp_path / "c.npz"), flip=True)
    resumed = _run("cuda", True, 7, resume_from=str(tmp_path / "c.npz"), flip=True)
    for k, w in captured.model.get_weights().items():
        np.testing.assert_array_equal(resumed.model.get_weights()[k], w, err_msg=k)
