"""A user's layer written with `device.xp` (docs/custom-layers.md's Swish) on the GPU: it trains in the
captured step as in eager steps and as on the CPU; and the zoo's ResNet with its global-average-pool
head (inputs larger than 32x32) gives the CPU's outputs on the GPU, in the model and compiled."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from tests.conftest import mnist_lookalike  # noqa: E402
from minidl import inference, layers as L, models, optim  # noqa: E402


class GpuSwish(L.Layer):
    """y = x sigmoid(beta x), beta trained (the docs page's layer)."""
    prefix = kind = "gpu_swish"

    def __init__(self, beta=1.0, name=None):
        super().__init__(name)
        self.beta0 = float(beta)

    def build(self, in_shapes, device):
        self.xp = device.xp
        self.beta = self.param("beta", (1,), lambda rng, shape, fi, fo: np.full(shape, self.beta0))
        return in_shapes[0]

    def forward(self, xs, training):
        x, = xs
        s = 1 / (1 + self.xp.exp(-self.beta.data * x))
        self.saved = x, s
        return x * s

    def backward(self, gy, need):
        x, s = self.saved
        ds = s * (1 - s)
        self.beta.grad += (gy * x * x * ds).sum()
        return (gy * (s + self.beta.data * x * ds),)


def _train(device, graph):
    images, labels = mnist_lookalike(512)
    model = dl.Sequential([L.Conv2D(4, 3, padding=1), GpuSwish(1.5), L.MaxPool2D(2), L.Flatten(), L.Dense(10),
                           L.Softmax()], (1, 28, 28), seed=0, device=dl.get_device(device, seed=0))
    t = dl.Trainer(model, optim.SGD(lr=0.05), progress=False, log=lambda s: None, graph=graph)
    first = t.fit((images, labels), steps=8, batch_size=32, monitor=8)
    last = t.fit((images, labels), more_steps=120, batch_size=32, monitor=40)
    return first, last, model.device.to_host(model.flat), model.get_weights()["gpu_swish/beta"]


def test_a_users_xp_layer_trains_captured_as_eager_and_as_on_the_cpu(no_tf32):
    first, last, w_graph, beta = _train("cuda", graph=True)
    assert last.loss < first.loss and beta[0] != 1.5               # its parameter trains
    _, _, w_eager, _ = _train("cuda", graph=False)
    np.testing.assert_allclose(w_graph, w_eager, rtol=1e-4, atol=1e-6)
    _, _, w_cpu, _ = _train("cpu", graph=False)
    np.testing.assert_allclose(w_graph, w_cpu, rtol=1e-2, atol=1e-3)


def test_the_zoo_resnet_with_global_pooling_matches_the_cpu(no_tf32):
    x = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)     # images in [0, 1]
    cpu = models.resnet(18, input_shape=(3, 64, 64), classes=100, preprocess=False, seed=1,
                        zero_init_residual=False)
    gpu = models.resnet(18, input_shape=(3, 64, 64), classes=100, preprocess=False, seed=1,
                        zero_init_residual=False, device="cuda")
    assert [n.kind for n in gpu.nodes][-4:] == ["gap", "flatten", "dense", "softmax"]
    want = cpu.forward(x, training=False)
    np.testing.assert_allclose(gpu.device.to_host(gpu.forward(x, training=False)), want, rtol=1e-2, atol=1e-5)
    logits = inference.compile(cpu, probabilities=False).predict(x)     # up to tens: 18 layers, random weights
    compiled = inference.compile(gpu, device="cuda", probabilities=False)
    got = compiled.predict(x)                                           # the graph's device buffer
    np.testing.assert_allclose(cp.asnumpy(got), logits, rtol=1e-3, atol=1e-2)
