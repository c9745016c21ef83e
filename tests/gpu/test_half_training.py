"""bf16 and fp16 precision policies on the GPU: training steps against the CPU's run of the same policy,
captured against eager, fp16 loss scaling inside a captured step, and half-precision inference of a
trained LeNet-5 against its fp32 predictions on MNIST's test set."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import inference, layers as L, models, optim  # noqa: E402
from minidl.data.loader import Loader  # noqa: E402
from minidl.graph import arena  # noqa: E402
from minidl.kernels.gpu import cudnn_graphs as cudnn  # noqa: E402
from minidl.models.resnet import build_resnet  # noqa: E402
from minidl.precision import LossScale, policy  # noqa: E402
from tests.test_loss_scale import Spike  # noqa: E402

# How far a few steps of the same policy on the two devices may drift apart, relative to the size of the
# weights' change: both round every value to the half type, but after float sums in another order a
# value can land one ulp apart, and later layers carry that on.
DRIFT = {"bf16": 0.2, "fp16": 0.08}


def data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def small_resnet(device, seed=0):
    """One basic block a stage: stem, pad, projection shortcuts, BN between every conv, Add + ReLU."""
    return build_resnet("basic", (1, 1, 1, 1), device=device, seed=seed)


MODELS = {"lenet": lambda device: models.lenet5(device=device, seed=0), "resnet": small_resnet}


def train(model_name, device, precision, graph, steps=4):
    model = MODELS[model_name](dl.get_device(device, seed=0))
    w0 = model.flat.copy()
    trainer = dl.Trainer(model, optim.Momentum(0.02), seed=0, graph=graph, progress=False, log=lambda s: None,
                         precision=policy(precision, always=True))      # the half paths, however small the net
    result = trainer.fit(data(), steps=steps, batch_size=32, monitor=steps)
    flat = arena.canonical(model.device.to_host(model.flat), arena.laid_krsc(model.params))   # the CPU's order
    return flat, model.device.to_host(w0), result, trainer


@pytest.mark.parametrize("model_name", ["lenet", "resnet"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_training_steps_match_the_cpu_run_of_the_same_policy(model_name, precision):
    w_cpu, w0, r_cpu, _ = train(model_name, "cpu", precision, graph=False)
    before = dict(cudnn.calls)
    w_gpu, w0_gpu, r_gpu, trainer = train(model_name, "cuda", precision, graph=True)
    assert np.array_equal(w0, w0_gpu) and trainer._step._captured
    assert trainer._step.net.copies[0].flat.dtype == policy(precision).compute     # the half arena trained
    assert cudnn.calls["conv_wgrad"] > before.get("conv_wgrad", 0)
    change = np.linalg.norm(w_cpu - w0)
    assert change > 0 and np.linalg.norm(w_gpu - w_cpu) / change < DRIFT[precision]
    assert r_gpu[0] == pytest.approx(r_cpu[0], rel=DRIFT[precision] / 5)


@pytest.mark.parametrize("model_name", ["lenet", "resnet"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_captured_half_precision_step_equals_the_eager_step(model_name, precision):
    w_eager, _, r_eager, _ = train(model_name, "cuda", precision, graph=False)
    w_graph, _, r_graph, trainer = train(model_name, "cuda", precision, graph=True)
    assert trainer._step._captured
    np.testing.assert_array_equal(w_graph, w_eager)                  # the same kernels, deterministic engines
    assert r_graph[1] == r_eager[1] and r_graph[0] == pytest.approx(r_eager[0], rel=1e-6)   # metrics: sums differ


def spiky_net(device):
    x = L.Input((1, 28, 28))
    h = L.MaxPool2D(2)(L.Conv2D(4, 5, activation="relu")(x))
    y = L.Dense(10)(Spike()(L.Dense(16, activation="relu")(L.Flatten()(h))))
    return dl.Model(x, y, device=device, seed=1)


def test_fp16_loss_scaling_skips_an_injected_overflow_inside_the_captured_step():
    model = spiky_net(dl.get_device("cuda"))
    trainer = dl.Trainer(model, optim.Adam(lr=1e-3), progress=False, log=lambda s: None, graph=True,
                         precision=policy("fp16", loss_scale=LossScale(init=2.0 ** 10, interval=3), always=True))
    spike = trainer._step.net.layer("spike").factor
    trainer.fit(data(), steps=2, batch_size=32)
    assert trainer._step._captured
    flat, state = model.flat.copy(), {k: v.copy() for k, v in trainer.optimizer.state.items()}
    spike.fill(np.inf)                                    # read by the graph at its next replay
    trainer.fit(data(), more_steps=1, batch_size=32)      # skipped: no TrainingDiverged
    assert trainer.loss_scale == {"scale": 512.0, "clean": 0, "skipped": 1} and trainer.optimizer.t == 2
    assert cp.array_equal(model.flat, flat) and all(cp.array_equal(trainer.optimizer.state[k], v)
                                                     for k, v in state.items())
    spike.fill(1.0)
    trainer.fit(data(), more_steps=3, batch_size=32)
    assert trainer.loss_scale == {"scale": 1024.0, "clean": 0, "skipped": 1} and trainer.optimizer.t == 5
    assert not cp.array_equal(model.flat, flat)


@pytest.fixture(scope="module")
def trained_lenet():
    """LeNet-5 after one fp32 epoch of MNIST on the GPU, and the test set."""
    model = models.lenet5(device=dl.get_device("cuda"), seed=0)
    trainer = dl.Trainer(model, optim.Adam(1e-3), seed=0, progress=False, log=lambda s: None)
    trainer.fit(dl.data.mnist("train"), epochs=1, batch_size=32, monitor=10 ** 6)
    return model, dl.data.mnist("test")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_inference_agrees_with_fp32_on_mnist(trained_lenet, precision):
    model, test = trained_lenet
    fp32 = inference.compile(model, device="cuda")
    before = dict(cudnn.calls)
    half = inference.compile(model, device="cuda", precision=policy(precision, always=True))
    loader = Loader(*test, 1000, model.device, shuffle=False, drop_last=False, normalize=False)   # [0, 1]
    same = correct = 0
    for x, y in loader:
        p32, p = fp32.predict(x).argmax(1), half.predict(x)
        assert p.dtype == np.float32                     # outputs come out float32, after the last Cast
        same += int((p.argmax(1) == p32).sum())
        correct += int((p.argmax(1) == y).sum())
    assert same / loader.N >= 0.999 and correct / loader.N > 0.97, (same, correct)
    assert cudnn.calls["conv_bias_relu_fprop"] > before.get("conv_bias_relu_fprop", 0)   # fused, in half
    assert half.chain is None and {st.kind for st in half.steps} <= {"normalize", "conv2d", "pool", "flatten", "dense",
                                                                  "cast", "softmax"}
