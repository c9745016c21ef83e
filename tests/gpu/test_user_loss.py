"""A loss the user writes (minidl.losses.Loss) on the GPU: written with the array module of its inputs,
it trains in the captured step as in eager steps, and the hits (CuPy's argmax) count as on the CPU."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from tests.conftest import mnist_lookalike  # noqa: E402
from minidl import layers as L, losses, optim  # noqa: E402


class MeanSquaredError(losses.Loss):
    """sum over rows of mean_k (z_k - onehot_k)^2, on whichever device the logits are."""

    def value_and_grad(self, logits, labels, gz):
        xp = cp.get_array_module(logits)
        N, K = logits.shape
        diff = logits - xp.eye(K, dtype=logits.dtype)[labels]
        xp.multiply(diff, 2.0 / (N * K), out=gz)
        return (diff * diff).mean(axis=1).sum()


def _train(device, graph):
    images, labels = mnist_lookalike(512)
    model = dl.Sequential([L.Flatten(), L.Dense(32), L.ReLU(), L.Dense(10)], (1, 28, 28), seed=0,
                          device=dl.get_device(device, seed=0))
    t = dl.Trainer(model, optim.SGD(lr=0.1), progress=False, log=lambda s: None, graph=graph,
                   loss=MeanSquaredError())
    first = t.fit((images, labels), steps=8, batch_size=32, monitor=8)
    last = t.fit((images, labels), more_steps=120, batch_size=32, monitor=40)
    return first, last, model.device.to_host(model.flat)


def test_a_user_loss_trains_captured_as_eager_and_as_on_the_cpu():
    first, last, w_graph = _train("cuda", graph=True)
    assert last.loss < first.loss / 2 and last.accuracy > 0.5
    _, last_eager, w_eager = _train("cuda", graph=False)
    np.testing.assert_allclose(w_graph, w_eager, rtol=1e-4, atol=1e-6)
    _, last_cpu, w_cpu = _train("cpu", graph=False)
    assert abs(last_cpu.accuracy - last.accuracy) <= 0.02
    np.testing.assert_allclose(w_graph, w_cpu, rtol=1e-2, atol=1e-3)
