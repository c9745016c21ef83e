"""Every GPU kernel against its CPU twin (the reference) on random float32 inputs.

One tolerance table (tests/helpers/tolerance.py); cuDNN tests assert the call counter moved (the
cuDNN path really ran). test_captured_step.py captures a whole training step into a CUDA graph.
"""
import importlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.gpu import cudnn_graphs as cudnn  # noqa: E402
from tests.helpers import optim_rules  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402


def families(name):
    """(cpu, gpu) modules of one kernel family."""
    return importlib.import_module(f"minidl.kernels.cpu.{name}"), importlib.import_module(f"minidl.kernels.gpu.{name}")


def _calls():
    return dict(cudnn.calls)


def _moved(before, **expected):
    for op, n in expected.items():
        assert cudnn.calls[op] == before.get(op, 0) + n, f"cuDNN {op} ran {cudnn.calls[op] - before.get(op, 0)} times"


CONVS = [  # x shape, w shape, stride, padding, dilation
    ((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), 1, (1, 1)),
    ((2, 4, 9, 7), (6, 4, 3, 3), (2, 2), "same", (1, 1)),
    ((3, 2, 8, 8), (5, 2, 2, 2), (1, 1), "same", (1, 1)),      # pads (0, 1, 0, 1): asymmetric
    ((2, 3, 10, 10), (4, 3, 3, 3), (1, 1), 2, (2, 2)),
    ((2, 8, 7, 7), (16, 8, 1, 1), (2, 2), 0, (1, 1)),
    ((2, 3, 12, 11), (4, 3, 5, 3), (2, 1), (2, 1), (1, 1)),
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding,dilation", CONVS)
def test_conv2d_matches_cpu(no_tf32, rand, x_shape, w_shape, stride, padding, dilation):
    c, g = families("conv")
    plan = c.conv2d_plan((None,) + x_shape[1:], w_shape, stride, padding, dilation)
    assert g.conv2d_plan((None,) + x_shape[1:], w_shape, stride, padding, dilation) == plan
    x, w, b = rand(*x_shape), rand(*w_shape), rand(w_shape[0])
    y = c.conv2d_fprop(plan, x, w, b)
    gy, gw0 = rand(*y.shape), rand(*w_shape)
    before = _calls()
    out = cp.empty(y.shape, np.float32)
    assert g.conv2d_fprop(plan, cp.asarray(x), cp.asarray(w), cp.asarray(b), out=out) is out
    close(out, y, "conv")
    close(g.conv2d_fprop(plan, cp.asarray(x), cp.asarray(w)), c.conv2d_fprop(plan, x, w), "conv")
    close(g.conv2d_dgrad(plan, cp.asarray(gy), cp.asarray(w)), c.conv2d_dgrad(plan, gy, w), "conv")
    want, gw = gw0.copy(), cp.asarray(gw0)
    c.conv2d_wgrad(plan, x, gy, want)
    g.conv2d_wgrad(plan, cp.asarray(x), cp.asarray(gy), gw)
    close(gw, want, "conv")
    close(g.conv2d_bias_relu_fprop(plan, cp.asarray(x), cp.asarray(w), cp.asarray(b)), np.maximum(y, 0), "conv")
    _moved(before, conv_fprop=2, conv_dgrad=1, conv_wgrad=1, conv_bias_relu_fprop=1)


def test_conv2d_with_tf32(rand):
    c, g = families("conv")
    plan = c.conv2d_plan((None, 16, 12, 12), (32, 16, 3, 3), (1, 1), 1, (1, 1))
    x, w = rand(4, 16, 12, 12), rand(32, 16, 3, 3)
    assert cudnn.tf32_enabled()
    before = _calls()
    close(g.conv2d_fprop(plan, cp.asarray(x), cp.asarray(w)), c.conv2d_fprop(plan, x, w), "conv_tf32")
    _moved(before, conv_fprop=1)


def test_conv2d_on_misaligned_parameter_views(no_tf32, rand):
    """Parameters are views into one flat buffer; a 4-byte offset must still give right answers."""
    c, g = families("conv")
    plan = c.conv2d_plan((None, 3, 8, 8), (4, 3, 3, 3), (1, 1), 1, (1, 1))
    x, w, b, gy = rand(2, 3, 8, 8), rand(4, 3, 3, 3), rand(4), rand(2, 4, 8, 8)
    flat, grad = cp.zeros(1 + w.size + 4, np.float32), cp.zeros(1 + w.size, np.float32)
    wv, bv, gwv = flat[1:1 + w.size].reshape(w.shape), flat[1 + w.size:], grad[1:].reshape(w.shape)
    wv[...], bv[...] = cp.asarray(w), cp.asarray(b)
    close(g.conv2d_fprop(plan, cp.asarray(x), wv, bv), c.conv2d_fprop(plan, x, w, b), "conv")
    g.conv2d_wgrad(plan, cp.asarray(x), cp.asarray(gy), gwv)
    want = np.zeros_like(w)
    c.conv2d_wgrad(plan, x, gy, want)
    close(gwv, want, "conv")


@pytest.mark.parametrize("force_cudnn", [False, True])
@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (8, 16, 4, 4), (32, 10, 1, 1)])
def test_batchnorm_matches_cpu(rand, shape, force_cudnn, monkeypatch):
    """Both GPU paths: the one-block-per-channel kernels (small N*H*W) and cuDNN's graphs."""
    c, g = families("norm")
    if force_cudnn:
        monkeypatch.setattr(g, "_KERNEL_MAX_M", 0)
    C = shape[1]
    x = 2 * rand(*shape) + 0.5
    gamma, beta, rm, rv = rand(C), rand(C), 0.1 * rand(C), np.abs(rand(C)) + 0.5
    crm, crv, grm, grv = rm.copy(), rv.copy(), cp.asarray(rm), cp.asarray(rv)
    before = _calls()
    y, mean, invstd = c.bn_fprop_train(x, gamma, beta, crm, crv, 0.1, 1e-5)
    gyo, gmean, ginv = g.bn_fprop_train(cp.asarray(x), cp.asarray(gamma), cp.asarray(beta), grm, grv, 0.1, 1e-5)
    for got, want in ((gyo, y), (gmean, mean), (ginv, invstd), (grm, crm), (grv, crv)):
        close(got, want, "bn")
    yi = g.bn_fprop_infer(cp.asarray(x), cp.asarray(gamma), cp.asarray(beta), grm, grv, 1e-5)
    close(yi, c.bn_fprop_infer(x, gamma, beta, crm, crv, 1e-5), "bn")
    gy, gg0, gb0 = rand(*shape), rand(C), rand(C)
    gg, gb, cgg, cgb = cp.asarray(gg0), cp.asarray(gb0), gg0.copy(), gb0.copy()
    want = c.bn_bprop(x, gy, gamma, mean, invstd, cgg, cgb)
    got = g.bn_bprop(cp.asarray(x), cp.asarray(gy), cp.asarray(gamma), gmean, ginv, gg, gb)
    close(got, want, "bn")
    close(gg, cgg, "bn")
    close(gb, cgb, "bn")
    if force_cudnn and C == 16:                  # cuDNN has engines for this C; 3 and 10 take the kernels
        _moved(before, bn_fprop_train=1, bn_bprop=1)


POOLS = [((2, 3, 8, 8), 2, 2, 0), ((2, 3, 9, 9), 3, 2, 1), ((2, 2, 7, 7), 3, 1, "same"),
         ((2, 2, 8, 9), (2, 3), (1, 2), (1, 1))]


@pytest.mark.parametrize("x_shape,ksize,stride,padding", POOLS)
def test_pooling_matches_cpu(rand, x_shape, ksize, stride, padding):
    c, g = families("pool")
    plan = c.pool2d_plan((None,) + x_shape[1:], ksize, stride, padding)
    x = rand(*x_shape)
    gy = rand(x_shape[0], x_shape[1], *plan.out_shape[2:])
    y = c.maxpool2d_fprop(plan, x)
    gyo = g.maxpool2d_fprop(plan, cp.asarray(x))
    close(gyo, y, "exact")
    close(g.maxpool2d_bprop(plan, cp.asarray(x), gyo, cp.asarray(gy)), c.maxpool2d_bprop(plan, x, y, gy), "pool")
    close(g.avgpool2d_fprop(plan, cp.asarray(x)), c.avgpool2d_fprop(plan, x), "pool")
    close(g.avgpool2d_bprop(plan, cp.asarray(gy)), c.avgpool2d_bprop(plan, gy), "pool")


def test_global_avgpool_matches_cpu(rand):
    c, g = families("pool")
    x, gy = rand(2, 3, 5, 6), rand(2, 3, 1, 1)
    close(g.global_avgpool_fprop(cp.asarray(x)), c.global_avgpool_fprop(x), "pool")
    close(g.global_avgpool_bprop(cp.asarray(gy), x.shape), c.global_avgpool_bprop(gy, x.shape), "pool")


def test_dense_matches_cpu(rand):
    c, g = families("dense")
    x, w, b, gy, gw0 = rand(7, 5), rand(4, 5), rand(4), rand(7, 4), rand(4, 5)
    close(g.dense_fprop(cp.asarray(x), cp.asarray(w), cp.asarray(b)), c.dense_fprop(x, w, b), "dense")
    out = cp.empty((7, 4), np.float32)
    assert g.dense_fprop(cp.asarray(x), cp.asarray(w), out=out) is out
    close(out, c.dense_fprop(x, w), "dense")
    close(g.dense_dgrad(cp.asarray(gy), cp.asarray(w)), c.dense_dgrad(gy, w), "dense")
    gw, want = cp.asarray(gw0), gw0.copy()
    g.dense_wgrad(cp.asarray(x), cp.asarray(gy), gw)
    c.dense_wgrad(x, gy, want)
    close(gw, want, "dense")
    # one block per channel (N*S small), and channels split into parts summed in a second kernel
    for shape in ((7, 4), (2, 4, 3, 3), (300, 4), (256, 4, 24, 24), (64, 4, 130, 1), (9000, 4)):
        for accumulate in (True, False):
            gyb, gb0 = rand(*shape), rand(4)
            gb, want = cp.asarray(gb0), gb0.copy()
            g.bias_grad(cp.asarray(gyb), gb, accumulate=accumulate)
            c.bias_grad(gyb, want, accumulate=accumulate)
            close(gb, want, "dense")


@pytest.mark.parametrize("name,args,op", [("relu_fprop", "x", "exact"), ("relu_bprop", "y gy", "exact")])
# (the other activations' fused kernels: tests/gpu/test_activation_xp.py, against the layers' expressions)
def test_activations_match_cpu(rand, name, args, op):
    c, g = families("activation")
    values = {"x": rand(3, 4, 5), "y": rand(3, 4, 5), "gy": rand(3, 4, 5), "a": 0.1}
    host = [values[a] for a in args.split()]
    dev = [cp.asarray(v) if isinstance(v, np.ndarray) else v for v in host]
    want = getattr(c, name)(*host)
    close(getattr(g, name)(*dev), want, op)
    out = cp.empty(want.shape, np.float32)
    assert getattr(g, name)(*dev, out=out) is out


def test_merge_pad_match_cpu(rand):
    cm, gm = families("merge")
    xs = [rand(2, 3, 4) for _ in range(3)]
    close(gm.add_fprop([cp.asarray(x) for x in xs[:2]]), cm.add_fprop(xs[:2]), "exact")
    dxs = [cp.asarray(x) for x in xs]
    close(gm.add_fprop(dxs, out=dxs[0]), cm.add_fprop(xs), "ulp")
    cpd, gpd = families("pad")
    x, pads = rand(2, 3, 4, 5), (1, 2, 0, 3)
    y = cpd.pad2d_fprop(x, pads, 0.5)
    close(gpd.pad2d_fprop(cp.asarray(x), pads, 0.5), y, "exact")
    gy = rand(*y.shape)
    close(gpd.pad2d_bprop(cp.asarray(gy), pads), cpd.pad2d_bprop(gy, pads), "exact")


@pytest.mark.parametrize("size", [5, 4])
def test_lrn_matches_cpu(rand, size):
    c, g = families("lrn")
    x, gy = rand(2, 7, 3, 4), rand(2, 7, 3, 4)
    args = (size, 0.5, 0.75, 2.0)
    y, scale = c.lrn_fprop(x, *args)
    gyo, gscale = g.lrn_fprop(cp.asarray(x), *args)
    close(gyo, y, "ulp")
    close(gscale, scale, "ulp")
    got = g.lrn_bprop(cp.asarray(x), gyo, gscale, cp.asarray(gy), *args)
    close(got, c.lrn_bprop(x, y, scale, gy, *args), "ulp")


def test_dropout(rand):
    """The GPU's Philox draws are the CPU's bit for bit: the same masks, and the offset advances alike."""
    from minidl.backend import CounterRNG
    c, g = families("dropout")
    x, gy, rate = rand(4, 5, 6, 7), rand(4, 5, 6, 7), 0.3
    np.testing.assert_array_equal(cp.asnumpy(g.philox_uniform(1000, (5, 9), 123)), c.philox_uniform(1000, (5, 9), 123))
    grng, crng = CounterRNG(cp, 3), CounterRNG(np, 3)
    for _ in range(2):                                   # the second call draws from where the first stopped
        y, mask = g.dropout_fprop(cp.asarray(x), rate, grng)
        cy, cmask = c.dropout_fprop(x, rate, crng)
        close(mask, cmask, "exact")
        close(y, cy, "exact")
    assert int(grng.offset) == int(crng.offset) == 2 * x.size
    m = cp.asnumpy(mask)
    assert set(np.unique(m)) <= {np.float32(0), np.float32(1 / (1 - rate))}
    assert abs((m > 0).mean() - (1 - rate)) < 0.05
    close(g.dropout_bprop(cp.asarray(gy), mask), c.dropout_bprop(gy, m), "exact")


@pytest.mark.parametrize("K", [10, 100])
def test_softmax_matches_cpu(rand, K):
    c, g = families("softmax")
    x, gy = 3 * rand(37, K), rand(37, K)
    y = c.softmax_fprop(x)
    close(g.softmax_fprop(cp.asarray(x)), y, "ulp")
    close(g.softmax_bprop(cp.asarray(y), cp.asarray(gy)), c.softmax_bprop(y, gy), "ulp")


@pytest.mark.parametrize("K,ldtype", [(10, np.int32), (10, np.uint8), (100, np.int64)])
def test_softmax_xent_matches_cpu(rand, K, ldtype):
    c, g = families("softmax")
    z = 3 * rand(37, K)
    labels = np.random.default_rng(1).integers(0, K, 37).astype(ldtype)
    labels[::2] = z[::2].argmax(axis=1)              # about half the rows hit
    loss, correct, gz = c.softmax_xent(z, labels)
    gloss, gcorrect, ggz = g.softmax_xent(cp.asarray(z), cp.asarray(labels))
    assert gloss.shape == () and gcorrect.shape == ()
    close(gloss, loss, "ulp")
    assert int(gcorrect) == int(correct)
    close(ggz, gz, "ulp")


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adam", "rmsprop"])
def test_optimizers_match_their_rules_over_steps(rand, name):
    c, g = optim_rules, families("optim")[1]        # the optimizers' rules, the GPU's fused kernels
    P = 1000
    p, states = rand(P), [np.abs(rand(P)) for _ in range(2)]
    dp, dstates = cp.asarray(p), [cp.asarray(s) for s in states]
    for t in range(1, 6):
        grad = rand(P)
        for mod, pp, ss, gg in ((c, p, states, grad), (g, dp, dstates, cp.asarray(grad))):
            if name == "sgd":
                mod.sgd_update(pp, gg, 0.1, 0.01)
            elif name in ("momentum", "nesterov"):
                mod.momentum_update(pp, gg, ss[0], 0.1, 0.9, 0.01, name == "nesterov")
            elif name == "adam":
                mod.adam_update(pp, gg, ss[0], ss[1], 1e-2, 0.9, 0.999, 1e-8, 0.01, t)
            else:
                mod.rmsprop_update(pp, gg, ss[0], 1e-2, 0.9, 1e-8, 0.01)
        close(dp, p, "optim")
        for ds, s in zip(dstates, states):
            close(ds, s, "optim")


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "rmsprop"])
def test_optimizer_grad_scale_matches_the_rule_and_the_prescaled_gradient(rand, name):
    """scale: data-parallel ranks fold 1/N into the update. The scaled kernel matches the rule's; with
    no weight decay g*0.5 is exact, so it equals the unscaled kernel run on 0.5 g bit for bit."""
    c, g = optim_rules, families("optim")[1]        # the optimizers' rules, the GPU's fused kernels
    P = 1000
    p0, s0 = rand(P), np.abs(rand(P))

    def run(mod, xp, grads, scale, wd):
        p, s1, s2 = xp.asarray(p0.copy()), xp.asarray(s0.copy()), xp.asarray(s0.copy())
        for t, gr in enumerate(grads, 1):
            gr = xp.asarray(gr)
            if name == "sgd":
                mod.sgd_update(p, gr, 0.1, wd, scale=scale)
            elif name == "momentum":
                mod.momentum_update(p, gr, s1, 0.1, 0.9, wd, False, scale=scale)
            elif name == "adam":
                mod.adam_update(p, gr, s1, s2, 1e-2, 0.9, 0.999, 1e-8, wd, t, scale=scale)
            else:
                mod.rmsprop_update(p, gr, s1, 1e-2, 0.9, 1e-8, wd, scale=scale)
        return p
    grads = [rand(P) for _ in range(5)]
    close(run(g, cp, grads, 1 / 3, 0.01), run(c, np, grads, 1 / 3, 0.01), "optim")
    halved = [gr * np.float32(0.5) for gr in grads]
    assert cp.array_equal(run(g, cp, grads, 0.5, 0.0), run(g, cp, halved, 1.0, 0.0))
