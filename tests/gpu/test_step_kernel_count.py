"""LeNet-5's captured training step launches 5 kernels fewer than before issue 42's fusions of the books
(5 -> 1) and the batch gather (2 -> 1), counted as the nodes of its CUDA graph, and trains to the same bits;
the dense layers' bias in cuBLASLt's epilogue takes 3 more off (one add a layer), to float32 rounding;
a constant schedule one more (no t - 1), to the same bits."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import models, optim  # noqa: E402
from benchmarks.graph_nodes import graph_nodes  # noqa: E402
from benchmarks.old_step_ops import patch_old  # noqa: E402


def train(batch, steps=6, schedule=None):
    dev = dl.get_device("cuda", seed=0)
    model = models.lenet5(device=dev, seed=0)
    trainer = dl.Trainer(model, optim.Adam(1e-3, schedule=schedule), seed=0, graph=True, progress=False,
                         log=lambda s: None)
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (4 * batch, 28, 28), dtype=np.uint8), rng.integers(0, 10, 4 * batch)
    result = trainer.fit((images, labels), steps=steps, batch_size=batch, monitor=10 ** 6)
    (_, call), = trainer._step._captured.values()
    if not hasattr(call.graph, "graph"):
        pytest.skip("this CuPy's Graph does not expose its cudaGraph_t")
    return model.get_weights(), (result.loss, result.accuracy), graph_nodes(call.graph), trainer


@pytest.mark.parametrize("batch", [32, 256])
def test_lenet5s_captured_step_has_5_kernels_fewer_and_trains_to_the_same_bits(batch, monkeypatch):
    new_w, new_r, new_nodes, new_t = train(batch)
    with monkeypatch.context() as m:
        patch_old(m.setattr, new_t._step.device, dense=False)
        old_w, old_r, old_nodes, old_t = train(batch)
    print(f"LeNet-5 b{batch} captured step: {dict(new_nodes)} (before: {dict(old_nodes)})")
    assert old_nodes["kernel"] - new_nodes["kernel"] == 5, (old_nodes, new_nodes)
    assert sum(new_nodes.values()) == sum(old_nodes.values()) - 5
    for k in old_w:
        np.testing.assert_array_equal(new_w[k], old_w[k], err_msg=k)
    assert new_r == old_r                             # the loss and accuracy sums, bit for bit
    assert new_t._step.divergence() is None and int(new_t._step.good_steps) == 6
    assert new_t.optimizer.t == old_t.optimizer.t == 6


@pytest.mark.parametrize("batch", [32, 256])
def test_the_dense_bias_epilogue_takes_3_kernels_more_off_and_trains_alike(batch, monkeypatch):
    """With cuBLAS's GEMM and an add for each of the 3 dense layers put back as well: at least 8 kernels
    more (3 adds; cuBLASLt may also split K differently from cuBLAS), weights within float32 drift."""
    new_w, new_r, new_nodes, new_t = train(batch)
    with monkeypatch.context() as m:
        patch_old(m.setattr, new_t._step.device, dense=True)
        old_w, old_r, old_nodes, _ = train(batch)
    print(f"LeNet-5 b{batch} captured step: {dict(new_nodes)} (before all three: {dict(old_nodes)})")
    assert old_nodes["kernel"] - new_nodes["kernel"] >= 8, (old_nodes, new_nodes)
    for k in old_w:
        np.testing.assert_allclose(new_w[k], old_w[k], rtol=2e-3, atol=2e-4, err_msg=k)   # as GPU against CPU
    assert new_r[0] == pytest.approx(old_r[0], rel=1e-3)


def test_a_constant_schedule_launches_no_step_arithmetic_and_trains_to_the_same_bits():
    """The default schedule reads no step; the same lr from a schedule that may read it (a plain
    function) computes t - 1 first: one kernel more, the same run."""
    new_w, new_r, new_nodes, _ = train(32)
    old_w, old_r, old_nodes, _ = train(32, schedule=lambda lr, step: lr)
    assert old_nodes["kernel"] - new_nodes["kernel"] == 1, (old_nodes, new_nodes)
    for k in old_w:
        np.testing.assert_array_equal(new_w[k], old_w[k], err_msg=k)
    assert new_r == old_r
