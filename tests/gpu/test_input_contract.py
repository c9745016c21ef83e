"""The input contract on the GPU (docs/input.md): a zoo model carries its Normalize, so the compiled model
takes uint8 and [0, 1] images and gives the CPU's answer in fp32 and bf16; the captured training step
runs no kernel for it (the Loader applies it) and still trains; LeNet's small-batch schedule stays one
chain step."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import inference, models, optim  # noqa: E402
from minidl.inference import schedule  # noqa: E402
from minidl.testing import randomize_weights  # noqa: E402

# max |GPU - CPU| / max |CPU|: fp32 with TF32 off (tests/gpu/test_inference.py's figures); bf16: the
# convolutions' inputs and weights rounded to 8 bits of mantissa, float32 sums
TOL = {("lenet5", "fp32"): 1e-4, ("resnet18", "fp32"): 5e-4, ("lenet5", "bf16"): 5e-2, ("resnet18", "bf16"): 1e-1}


def images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)


def host(m, y):
    m.device.sync()
    return cp.asnumpy(y).astype(np.float32)


def assert_close(got, want, tol):
    err, scale = float(np.abs(got - want).max()), float(np.abs(want).max())
    assert err <= tol * scale, f"max error {err:.3g} is more than {tol:g} of max |y| {scale:.3g}"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["lenet5", "resnet18"])
@pytest.mark.parametrize("N", [1, 64, 300])
def test_compiled_zoo_model_takes_uint8_and_unit_floats_and_gives_the_cpu_answer(no_tf32, name, precision, N):
    model = randomize_weights(models.get(name, seed=1), seed=2)
    cpu = inference.compile(model, device="cpu")
    gpu = inference.compile(model, device="cuda", precision=precision)
    assert gpu.images and "normalize" in [n.kind for n in gpu.nodes]     # kept: a padded first conv
    u8 = images(N, seed=N)
    unit = u8.astype(np.float32) / 255
    want = cpu.predict(u8)
    got8 = host(gpu, gpu.predict(u8))                                   # uint8 crosses, / 255 on the device
    got = host(gpu, gpu.predict(unit))
    assert_close(got8, want, TOL[name, precision])
    assert_close(got, want, TOL[name, precision])
    np.testing.assert_array_equal(got8, got)                            # the same floats reach the net
    buf = gpu.input_buffer(N)                                           # the buffer: images in [0, 1]
    buf[...] = cp.asarray(unit)
    assert_close(host(gpu, gpu.predict(buf)), want, TOL[name, precision])


def test_simplenet_folds_normalize_into_its_first_conv_on_the_gpu(no_tf32):
    model = randomize_weights(models.get("simplenet", seed=3), seed=4)
    gpu = inference.compile(model, device="cuda")
    assert gpu.stats["normalize_folded"] == 1 and "normalize" not in [n.kind for n in gpu.nodes]
    u8 = images(32, seed=5)
    assert_close(host(gpu, gpu.predict(u8)), inference.compile(model, device="cpu").predict(u8), 1e-4)


def test_lenet_small_batches_stay_one_chain_step():
    """One chain step at batch sizes up to CHAIN_MAX_BATCH, as before the layer. Its launches: one where
    the direct family stages the input through x_affine (X_AFFINE), else the Normalize kernel and the
    chain (2); the model without the layer: one; the model's Softmax, where kept (the default), one more."""
    m = inference.compile(randomize_weights(models.lenet5(seed=6)), device="cuda", probabilities=False)
    old = inference.compile(randomize_weights(models.lenet5(seed=6, preprocess=False)), device="cuda",
                            probabilities=False)
    probs = inference.compile(randomize_weights(models.lenet5(seed=6)), device="cuda")   # its Softmax kept
    dk = schedule.direct_family(m.device)
    for n in (1, 8, schedule.CHAIN_MAX_BATCH):
        steps, old_steps = m.schedule(n)[0], old.schedule(n)[0]
        assert [st.kind for st in steps] == [st.kind for st in old_steps] == [st.kind for st in probs.schedule(n)[0]]
        assert [st.kind for st in steps] == ["chain"] and old_steps[0].kernels == 1
        assert steps[0].kernels == (1 if getattr(dk, "X_AFFINE", False) else 2)
        assert probs.schedule(n)[0][0].kernels == steps[0].kernels + 1
    big = [st.kind for st in m.schedule(schedule.CHAIN_MAX_BATCH + 1)[0]]
    staged = ["normalize"] * (not getattr(dk, "X_AFFINE", False))        # else in the first conv_pool
    assert big == [*staged, "conv_pool", "conv_pool", "flatten", "mlp"]


@pytest.mark.parametrize("name", ["lenet5", "simplenet"])
def test_captured_training_step_of_a_zoo_model_runs_no_normalize_and_learns(name):
    train_set = dl.data.mnist("train")
    subset = (train_set[0][:3200], train_set[1][:3200])
    model = models.get(name, device=dl.get_device("cuda"), seed=0)
    trainer = dl.Trainer(model, optim.Adam(1e-3), progress=False, log=lambda s: None)
    assert "normalize" not in [n.kind for n in trainer._step.net.nodes]    # the Loader applied it
    first = trainer.fit(subset, steps=20, batch_size=32, monitor=20)
    last = trainer.fit((subset[0].astype(np.float32) / 255, subset[1]), more_steps=60, batch_size=32, monitor=60)
    assert trainer._step._captured and last.loss < first.loss and last.accuracy > 0.70
    u8 = subset[0][:500, None]
    assert (model.predict(u8).argmax(1) == subset[1][:500]).mean() > 0.7
