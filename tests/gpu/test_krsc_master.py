"""The float32 master's filters laid K, kH, kW, C on the GPU (graph/arena.py, lay_krsc): a channels-last
training lowering lays them where cuDNN's channels-last convolutions read them. Trained laid against the
same run whose filters stay K, C, kH, kW (a live lowering keeps them so), in fp32 and bf16, captured and
eager: the same weights and optimizer state to the tolerance of other engines; the model's own NCHW forward
reads the laid filters too."""
import gc

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import models, optim  # noqa: E402
from minidl.graph import arena, passes  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_tf32")      # full FP32 convolutions (conftest.py)


def data(n=128, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)


def run(laid, precision="fp32", graph=True, steps=4):
    """(trainer, canonical weights, canonical optimizer state) of a ResNet-18 trained channels-last."""
    model = models.get("resnet", depth=18, device=dl.get_device("cuda", seed=0), seed=0)
    keep = None if laid else model.lower(passes.training)        # a live lowering: the filters stay as they lie
    before = model.get_weights()
    trainer = dl.Trainer(model, optim.Momentum(0.02, momentum=0.9), graph=graph, progress=False,
                         log=lambda s: None, precision=precision, channels_last=True)
    assert len(arena.laid_krsc(model.params)) == (16 if laid else 0)     # the 3x3 filters (the stem has C = 1)
    for k, w in model.get_weights().items():
        np.testing.assert_array_equal(w, before[k], err_msg=k)        # laid, not changed
    trainer.fit(data(), steps=steps, batch_size=32, monitor=steps)
    del keep
    gc.collect()
    (state,) = trainer.optimizer.state_dict()["arrays"].values()          # momentum: one slot
    return trainer, model.get_weights(), state


@pytest.mark.parametrize("graph", [True, False])
def test_fp32_training_with_laid_filters_ends_where_it_ends_without(graph):
    laid, w1, v1 = run(True, graph=graph)
    plain, w0, v0 = run(False, graph=graph)
    assert laid._step.net.copies == [] and plain._step.net.copies == []   # fp32: the lowering trains the master
    for k, w in w0.items():
        assert np.abs(w1[k] - w).max() <= 1e-4 * max(np.abs(w).max(), 1e-3), k
    assert np.abs(v1 - v0).max() <= 1e-4 * np.abs(v0).max()             # the state in (K, C, kH, kW) order


def test_bf16_copies_of_laid_filters_are_cast_as_they_lie():
    laid, w1, _ = run(True, precision="bf16")
    plain, w0, _ = run(False, precision="bf16")
    assert laid._step.net.copies[0].permuted == ()          # no permuting cast left (the stem's C = 1 lies alike)
    assert len(plain._step.net.copies[0].permuted) == 16
    for k, w in w0.items():
        assert np.abs(w1[k] - w).max() <= 2e-2 * max(np.abs(w).max(), 1e-3), k


def test_the_models_own_forward_reads_the_laid_filters():
    """After a channels-last Trainer laid them, the model's own NCHW forward (cuDNN given NCHW x and a
    K, kH, kW, C filter) computes what a model built from its weights computes."""
    trainer, weights, _ = run(True, steps=2)
    model = trainer.model
    x = np.random.default_rng(1).random((16, 1, 28, 28), dtype=np.float32)
    fresh = models.get("resnet", depth=18, device=model.device, seed=0)
    fresh.set_weights(weights)
    assert arena.laid_krsc(fresh.params) == ()
    a, b = cp.asnumpy(model.forward(x)), cp.asnumpy(fresh.forward(x))
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()
