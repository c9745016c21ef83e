"""Channels-last on the GPU: every kernel a channels-last graph reaches, given NHWC-ordered inputs,
against the CPU's NCHW kernels (fp32, and bf16 for the convolutions), its outputs in the order the
layout contract says; then whole models: training steps (eager and captured) and inference with the
`channels_last` pass end where the NCHW graph ends.
"""
import importlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import models, optim  # noqa: E402
from minidl.backend import get_device  # noqa: E402
from minidl.graph import arena  # noqa: E402
from minidl.kernels.gpu import cudnn_graphs as cudnn  # noqa: E402
from minidl.kernels.gpu._util import channels_last, lies_in  # noqa: E402
from minidl.precision import dtype_of  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402


@pytest.fixture(autouse=True)
def no_tf32():
    cudnn.set_tf32(False)
    yield
    cudnn.set_tf32(True)


def families(name):
    return importlib.import_module(f"minidl.kernels.cpu.{name}"), importlib.import_module(f"minidl.kernels.gpu.{name}")


def nhwc(a, dtype=np.float32):
    """The host array `a` (N, C, H, W) on the device, NCHW-shaped, lying channels-last."""
    d = cp.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1)).astype(dtype))
    return d.transpose(0, 3, 1, 2)


def rand(*shape, seed=0):
    return np.random.default_rng(seed + len(shape) + sum(shape)).standard_normal(shape).astype(np.float32)


def is_cl(a):
    assert lies_in(a, True), f"expected a channels-last array, got strides {a.strides} for shape {a.shape}"


CONVS = [  # x shape, w shape, stride, padding
    ((4, 16, 7, 7), (32, 16, 3, 3), (1, 1), 1),
    ((4, 16, 7, 7), (64, 16, 1, 1), (1, 1), 0),                   # 1x1: the filter is KRSC too
    ((4, 32, 8, 8), (16, 32, 3, 3), (2, 2), 0),                   # strided, after an explicit Pad2D
    ((4, 1, 14, 14), (16, 1, 7, 7), (2, 2), 0),                   # the stem: C = 1 lies in both orders
]


@pytest.mark.parametrize("dt", ["float32", "bfloat16"])
@pytest.mark.parametrize("x_shape,w_shape,stride,padding", CONVS)
def test_conv2d_reads_and_writes_channels_last(dt, x_shape, w_shape, stride, padding):
    c, g = families("conv")
    dt = dtype_of(dt)
    tol = "conv" if dt == np.float32 else dt.name
    rnd = (lambda a: a) if dt == np.float32 else (lambda a: a.astype(dt).astype(np.float32))
    plan = c.conv2d_plan((None,) + x_shape[1:], w_shape, stride, padding, (1, 1))
    x, w, b = rnd(rand(*x_shape)), rnd(rand(*w_shape, seed=1)), rnd(rand(w_shape[0], seed=2))
    y = c.conv2d_fprop(plan, x, w, b)
    gy = rnd(rand(*y.shape, seed=3))
    dx, dw, db, dgy = nhwc(x, dt), cp.asarray(w.astype(dt)), cp.asarray(b.astype(dt)), nhwc(gy, dt)
    got = g.conv2d_fprop(plan, dx, dw, db, cl=True)
    is_cl(got)
    close(got, y, tol)
    close(g.conv2d_bias_relu_fprop(plan, dx, dw, db, cl=True), np.maximum(y, 0), tol)
    z = rnd(rand(*y.shape, seed=4))         # the shortcut lies as y does
    got = g.conv2d_bias_add_act_fprop(plan, dx, dw, db, nhwc(z, dt), cl=True)
    is_cl(got)
    close(got, np.maximum(y + z, 0), tol)
    gx = g.conv2d_dgrad(plan, dgy, dw)
    if x_shape[1] > 1:
        is_cl(gx)                                  # follows gy
    close(gx, c.conv2d_dgrad(plan, gy, w), tol)
    want = np.zeros_like(w)
    c.conv2d_wgrad(plan, x, gy, want, accumulate=False)
    close(g.conv2d_wgrad(plan, dx, dgy, cp.zeros(w_shape, dt), accumulate=False), want, tol)
    nchw_gy = cp.ascontiguousarray(dgy)            # a Flatten's gradient: NCHW, brought into x's order
    close(g.conv2d_wgrad(plan, dx, nchw_gy, cp.zeros(w_shape, dt), accumulate=False), want, tol)


# M = N*H*W values a channel: 32 (H = W = 1: both orders at once) and 100 in one block; 392, 1024,
# 1568 and 2304 (C = 40: idle lanes) split over blocks; 12544 with C = 256: cuDNN's forward, then the
# split backward (16 rows a thread)
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape", [(32, 96, 1, 1), (8, 64, 7, 7), (64, 16, 4, 4), (4, 3, 5, 5), (32, 64, 7, 7),
                                   (16, 40, 12, 12), (64, 256, 14, 14)])
def test_batchnorm_in_channels_last(shape, relu):
    c, g = families("norm")
    x, gy = rand(*shape), rand(*shape, seed=1)
    C = shape[1]
    gamma, beta = rand(C, seed=2), rand(C, seed=3)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    y, mean, invstd = c.bn_fprop_train(x, gamma, beta, rm, rv, 0.1, 1e-5, relu=relu)
    drm, drv = cp.zeros(C, np.float32), cp.ones(C, np.float32)
    dy, dmean, dinvstd = g.bn_fprop_train(nhwc(x), cp.asarray(gamma), cp.asarray(beta), drm, drv, 0.1, 1e-5,
                                          relu=relu)
    is_cl(dy)
    for got, want in ((dy, y), (dmean, mean), (dinvstd, invstd), (drm, rm), (drv, rv)):
        close(got, want, "bn")
    gg, gb = np.ones(C, np.float32), np.zeros(C, np.float32)
    gx = c.bn_bprop(x, gy, gamma, mean, invstd, gg, gb, y=y, relu=relu)
    dgg, dgb = cp.ones(C, np.float32), cp.zeros(C, np.float32)
    dgx = g.bn_bprop(nhwc(x), nhwc(gy), cp.asarray(gamma), dmean, dinvstd, dgg, dgb, y=dy, relu=relu)
    is_cl(dgx)
    for got, want in ((dgx, gx), (dgg, gg), (dgb, gb)):
        close(got, want, "bn")
    yi = g.bn_fprop_infer(nhwc(x), cp.asarray(gamma), cp.asarray(beta), drm, drv, 1e-5, relu=relu)
    is_cl(yi)
    close(yi, c.bn_fprop_infer(x, gamma, beta, rm, rv, 1e-5, relu=relu), "bn")
    again = g.bn_bprop(nhwc(x), nhwc(gy), cp.asarray(gamma), dmean, dinvstd, cp.ones(C, np.float32),
                       cp.zeros(C, np.float32), y=dy, relu=relu)
    assert cp.array_equal(again, dgx)              # a fixed order of sums: the same bits every time


def test_pooling_padding_and_pointwise_keep_channels_last():
    shape = (4, 8, 9, 9)
    x, gy2 = rand(*shape), rand(*shape, seed=5)
    dx = nhwc(x)
    cp_, gp = families("pool")
    plan = cp_.pool2d_plan(shape, (3, 3), (2, 2), (1, 1))
    y = cp_.maxpool2d_fprop(plan, x)
    dy = gp.maxpool2d_fprop(plan, dx)
    is_cl(dy)
    close(dy, y, "exact")
    gy = rand(*y.shape, seed=4)
    dgx = gp.maxpool2d_bprop(plan, dx, dy, nhwc(gy))
    is_cl(dgx)
    close(dgx, cp_.maxpool2d_bprop(plan, x, y, gy), "pool")
    close(gp.avgpool2d_fprop(plan, dx), cp_.avgpool2d_fprop(plan, x), "pool")
    cpad, gpad = families("pad")
    yp = gpad.pad2d_fprop(dx, (1, 2, 3, 0), 0.0)
    is_cl(yp)
    close(yp, cpad.pad2d_fprop(x, (1, 2, 3, 0), 0.0), "exact")
    gyp = rand(*yp.shape, seed=6)
    close(gpad.pad2d_bprop(nhwc(gyp), (1, 2, 3, 0)), cpad.pad2d_bprop(gyp, (1, 2, 3, 0)), "exact")
    cm, gm = families("merge")
    s = gm.add_fprop([dx, nhwc(gy2)], relu=True)
    is_cl(s)
    close(s, cm.add_fprop([x, gy2], relu=True), "exact")
    ca, ga = families("activation")
    r = ga.relu_fprop(dx)
    is_cl(r)
    close(r, ca.relu_fprop(x), "exact")
    close(ga.relu_bprop(r, nhwc(gy2)), ca.relu_bprop(np.maximum(x, 0), gy2), "exact")
    cd, gd = families("dense")
    gb = cp.zeros(8, np.float32)
    want = np.zeros(8, np.float32)
    cd.bias_grad(gy2, want, accumulate=False)
    close(gd.bias_grad(nhwc(gy2), gb, accumulate=False), want, "ulp")


def test_dropout_keeps_channels_last_and_masks_by_its_own_rule():
    dev = get_device("cuda", seed=0)
    x = nhwc(np.ones((4, 8, 5, 5), np.float32))
    _, g = families("dropout")
    y, mask = g.dropout_fprop(x, 0.5, dev.rng)
    is_cl(y)
    is_cl(mask)
    assert cp.array_equal(y, x * mask)
    kept = float((mask > 0).mean())
    assert 0.35 < kept < 0.65


def _resnet(dev):
    return models.get("resnet", depth=18, device=dev, seed=0)


def _train(channels_last, graph, precision="fp32", steps=4):
    dev = dl.get_device("cuda", seed=0)
    model = _resnet(dev)
    trainer = dl.Trainer(model, optim.get("momentum", lr=0.02, momentum=0.9), graph=graph, progress=False,
                         log=lambda s: None, precision=precision, channels_last=channels_last)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (256, 28, 28), dtype=np.uint8), rng.integers(0, 10, 256)
    trainer.fit((x, y), steps=steps, batch_size=32, monitor=steps)
    return trainer, arena.canonical(dev.to_host(model.flat), arena.laid_krsc(model.params))   # laid or not


@pytest.mark.parametrize("graph", [False, True])
def test_training_channels_last_ends_where_nchw_ends(graph):
    plain, w0 = _train(False, graph)
    cl, w1 = _train(True, graph)
    assert not plain.channels_last and cl.channels_last
    convs = [n for n in cl._step.net.nodes if "channels_last" in n.layer.layouts]
    assert convs and all(n.layer.channels_last for n in convs)
    scale = np.abs(w0).max()
    assert np.abs(w1 - w0).max() / scale < 1e-4        # sums in another order, TF32 off


def test_bf16_training_defaults_to_channels_last_and_agrees():
    cl, w1 = _train(None, True, "bf16")
    assert cl.channels_last                             # Device.channels_last: 2-byte types on the GPU
    plain, w0 = _train(False, True, "bf16")
    assert np.abs(w1 - w0).max() / np.abs(w0).max() < 2e-2


def test_inference_channels_last_predicts_as_nchw():
    dev = dl.get_device("cuda", seed=0)
    model = _resnet(dev)
    x = np.random.default_rng(1).random((64, 1, 28, 28), dtype=np.float32)        # images in [0, 1]
    a = dl.inference.compile(model, channels_last=False).predict(x)
    m = dl.inference.compile(model, channels_last=True)
    assert m.stats["channels_last"] > 0
    b = m.predict(x)
    close(cp.asnumpy(b), cp.asnumpy(a), "conv")


def test_lies_in_counts_ambiguous_arrays_in_both_orders():
    a = cp.zeros((2, 1, 4, 4), np.float32)
    assert lies_in(a, True) and lies_in(a, False) and not channels_last(a)
    b = nhwc(np.zeros((2, 3, 4, 4), np.float32))
    assert lies_in(b, True) and not lies_in(b, False) and channels_last(b)


@pytest.mark.parametrize("shape", [(32, 64, 7, 7), (8, 64, 4, 4), (2, 40, 3, 3), (64, 256, 8, 8)])
@pytest.mark.parametrize("layout", ["nchw", "nhwc", "nhwc-cudnn"])
@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_batchnorm_reads_and_writes_a_compute_dtype(dt, layout, shape, monkeypatch):
    """BN under a precision policy: x, gy, y, gx in the compute dtype, gamma, beta and the statistics
    float32. Channels-last: the RawKernels (C = 40: a block's lanes partly idle), one block a channel
    up to 256 values, split over blocks above, but cuDNN's forward at C = 256, M = 4096; "nhwc-cudnn":
    cuDNN with half io above 512 values, as where a channel has more than the RawKernels take. NCHW
    computes on float32 copies."""
    c, g = families("norm")
    if layout == "nhwc-cudnn":
        monkeypatch.setattr(g, "_NHWC_SPLIT_MAX_M", 512)
    dt = dtype_of(dt)
    x, gy = (rand(*shape, seed=s).astype(dt).astype(np.float32) for s in (0, 1))
    C = shape[1]
    gamma, beta = rand(C, seed=2), rand(C, seed=3)
    rm, rv = np.zeros(C, np.float32), np.ones(C, np.float32)
    y, mean, invstd = c.bn_fprop_train(x, gamma, beta, rm, rv, 0.1, 1e-5, relu=True)
    dev = (lambda a: nhwc(a, dt)) if layout != "nchw" else (lambda a: cp.asarray(a.astype(dt)))
    drm, drv = cp.zeros(C, np.float32), cp.ones(C, np.float32)
    before = dict(cudnn.calls)
    dy, dmean, dinvstd = g.bn_fprop_train(dev(x), cp.asarray(gamma), cp.asarray(beta), drm, drv, 0.1, 1e-5, relu=True)
    assert dy.dtype == dt and dmean.dtype == np.float32 and lies_in(dy, layout != "nchw")
    close(dy, y, dt.name)
    for got, want in ((dmean, mean), (dinvstd, invstd), (drm, rm), (drv, rv)):
        close(got, want, "bn")
    gg, gb = np.zeros(C, np.float32), np.zeros(C, np.float32)
    gx = c.bn_bprop(x, gy, gamma, mean, invstd, gg, gb, y=y, relu=True)
    dgg, dgb = cp.zeros(C, np.float32), cp.zeros(C, np.float32)
    dgx = g.bn_bprop(dev(x), dev(gy), cp.asarray(gamma), dmean, dinvstd, dgg, dgb, y=dy, relu=True)
    assert dgx.dtype == dt and lies_in(dgx, layout != "nchw")
    close(dgx, gx, dt.name)
    close(dgg, gg, dt.name)          # the ReLU mask from the rounded y: half-precision agreement
    close(dgb, gb, dt.name)
    ran = cudnn.calls["bn_fprop_train"] > before.get("bn_fprop_train", 0)
    M = shape[0] * shape[2] * shape[3]
    assert ran == (layout == "nhwc-cudnn" and M > 512 or layout == "nhwc" and C >= 256 and M >= 4096)
