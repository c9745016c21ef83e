"""A whole training step of GPU kernels records into a CUDA graph (no host sync, no allocation)
and its replay equals the eager step."""
import importlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from tests.helpers.tolerance import close  # noqa: E402


def test_training_step_captures_into_a_cuda_graph(no_tf32, rand):
    """conv+bias, bn, relu, maxpool, dense, xent, backward, adam on buffers planned once: the step
    records into a CUDA graph (a host sync or a new allocation would break that) and replays to
    the eager result."""
    conv, norm, act, pool, dense, sm, opt = (importlib.import_module(f"minidl.kernels.gpu.{f}") for f in
                                             ("conv", "norm", "activation", "pool", "dense", "softmax", "optim"))
    N, C, K, F, classes = 8, 3, 4, 4 * 4 * 4, 10
    cplan = conv.conv2d_plan((None, C, 8, 8), (K, C, 3, 3), (1, 1), 1, (1, 1))
    pplan = pool.pool2d_plan(cplan.out_shape, 2, 2, 0)
    shapes = {"w": (K, C, 3, 3), "b": (K,), "gamma": (K,), "beta": (K,), "wd": (classes, F), "bd": (classes,)}
    sizes = [int(np.prod(s)) for s in shapes.values()]
    p, grad, m, v = (cp.zeros(sum(sizes), np.float32) for _ in range(4))
    offs = np.cumsum([0] + sizes)
    P = {k: p[o:o + n].reshape(s) for (k, s), o, n in zip(shapes.items(), offs, sizes)}
    G = {k: grad[o:o + n].reshape(s) for (k, s), o, n in zip(shapes.items(), offs, sizes)}
    rm, rv, mean, invstd = (cp.zeros(K, np.float32) for _ in range(4))
    x, labels = cp.asarray(rand(N, C, 8, 8)), cp.asarray(np.arange(N, dtype=np.int32) % classes)
    a1, a2, a3, g1, g2, g3 = (cp.empty((N, K, 8, 8), np.float32) for _ in range(6))
    a4, g4 = cp.empty((N, K, 4, 4), np.float32), cp.empty((N, K, 4, 4), np.float32)
    z, gz, total = cp.empty((N, classes), np.float32), cp.empty((N, classes), np.float32), cp.zeros((), np.float32)
    p0 = 0.3 * rand(p.size)

    def reset():
        cp.copyto(p, cp.asarray(p0))
        for a in (m, v, rm, total):
            a.fill(0)
        rv.fill(1)

    def step():
        grad.fill(0)
        conv.conv2d_fprop(cplan, x, P["w"], P["b"], out=a1)
        norm.bn_fprop_train(a1, P["gamma"], P["beta"], rm, rv, 0.1, 1e-5, out=(a2, mean, invstd))
        act.relu_fprop(a2, out=a3)
        pool.maxpool2d_fprop(pplan, a3, out=a4)
        dense.dense_fprop(a4.reshape(N, F), P["wd"], P["bd"], out=z)
        loss, _, _ = sm.softmax_xent(z, labels, gz=gz)
        cp.add(total, loss, out=total)
        dense.dense_wgrad(a4.reshape(N, F), gz, G["wd"])
        dense.bias_grad(gz, G["bd"])
        dense.dense_dgrad(gz, P["wd"], out=g4.reshape(N, F))
        pool.maxpool2d_bprop(pplan, a3, a4, g4, out=g3)
        act.relu_bprop(a3, g3, out=g2)
        norm.bn_bprop(a1, g2, P["gamma"], mean, invstd, G["gamma"], G["beta"], out=g1)
        dense.bias_grad(g1, G["b"])
        conv.conv2d_wgrad(cplan, x, g1, G["w"])
        opt.adam_update(p, grad, m, v, 1e-2, 0.9, 0.999, 1e-8, 0.0, 1)

    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        reset()
        step()                                   # builds the cuDNN graphs, compiles the kernels
        stream.synchronize()
        eager = [cp.asnumpy(a) for a in (p, rm, rv, total)]
        reset()
        stream.synchronize()
        pool_bytes = cp.get_default_memory_pool().total_bytes()
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        assert cp.get_default_memory_pool().total_bytes() == pool_bytes, "the step allocated"
        graph.launch(stream)
        stream.synchronize()
    assert eager[3] > 0
    for got, want in zip((p, rm, rv, total), eager):
        close(got, want, "optim")


def test_a_captured_call_keeps_no_cycle_and_release_destroys_its_graph():
    """NCCL's destroy waits for the graphs that recorded its collectives: a CapturedCall must not be
    kept alive by a cycle through its function, and release_all() must destroy every live graph."""
    import gc
    import weakref

    from minidl.backend import CaptureError, get_device
    from minidl.kernels.gpu import capture

    dev = get_device("cuda")

    class Owner:                                  # as a TrainStep holds its captured step
        def __init__(self):
            self.a = dev.xp.zeros(4, np.float32)

            def step():
                self.a += 1
            self.call = dev.capture(step, warmup=1)

    owner = Owner()
    owner.call.replay()
    assert float(owner.a[0]) == 2.0               # the warm-up, then one replay
    gone = weakref.ref(owner.call)
    gc_was_on = gc.isenabled()
    gc.disable()                                  # without the cyclic collector: plain reference counts
    try:
        del owner
        assert gone() is None
    finally:
        if gc_was_on:
            gc.enable()
    b = dev.xp.zeros(1, np.float32)
    kept = dev.capture(lambda: b.__iadd__(1), warmup=1)
    capture.release_all()
    assert kept.graph is None
    with pytest.raises(CaptureError, match="released"):
        kept.replay()
