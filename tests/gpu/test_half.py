"""bfloat16 and float16 on the GPU: every kernel family a precision policy's compute region calls, against
the float32 CPU kernels on the same (rounded) inputs, within TOL[dtype] (float sums, the output rounded
to the half type); the Cast layer, the compute-dtype copies of the arena and loss scaling on the device.
"""
import importlib

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl import layers as L  # noqa: E402
from minidl.backend import CounterRNG, get_device  # noqa: E402
from minidl.graph import arena  # noqa: E402
from minidl.kernels.gpu import cudnn_graphs as cudnn  # noqa: E402
from minidl.layers.base import Parameter  # noqa: E402
from minidl.training.loss_scale import DynamicLossScale  # noqa: E402
from minidl.precision import LossScale, dtype_of  # noqa: E402
from tests.helpers.tolerance import close  # noqa: E402


def families(name):
    """(cpu, gpu) modules of one kernel family."""
    return importlib.import_module(f"minidl.kernels.cpu.{name}"), importlib.import_module(f"minidl.kernels.gpu.{name}")


@pytest.fixture(params=["bfloat16", "float16"])
def dt(request):
    return dtype_of(request.param)


@pytest.fixture
def pair(dt):
    """pair(*shape) -> (float32 host array, the same values on the device in dt): standard normals rounded to dt."""
    rng = np.random.default_rng(0)

    def make(*shape):
        h = rng.standard_normal(shape).astype(np.float32).astype(dt)
        return h.astype(np.float32), cp.asarray(h)
    return make


def check(got, want, dt):
    assert got.dtype == dt, got.dtype
    close(got, want, dt.name)


CONVS = [  # x shape, w shape, stride, padding
    ((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), 1),
    ((2, 1, 12, 12), (6, 1, 5, 5), (1, 1), 2),                   # LeNet's first conv: one input channel
    ((2, 1, 14, 14), (8, 1, 7, 7), (2, 2), 0),                   # the ResNet stem after its Pad2D(3)
    ((2, 16, 7, 7), (32, 16, 1, 1), (2, 2), 0),                  # a strided projection shortcut
    ((3, 8, 8, 8), (8, 8, 2, 2), (1, 1), "same"),                # pads (0, 1, 0, 1): asymmetric
]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", CONVS)
def test_conv2d(dt, pair, x_shape, w_shape, stride, padding):
    """fprop, fprop + bias, the fused bias + ReLU graph, dgrad, wgrad (added and overwriting): cuDNN ran each."""
    c, g = families("conv")
    plan = c.conv2d_plan((None,) + x_shape[1:], w_shape, stride, padding, (1, 1))
    (x, dx), (w, dw), (b, db) = pair(*x_shape), pair(*w_shape), pair(w_shape[0])
    y = c.conv2d_fprop(plan, x, w, b)
    (gy, dgy), (gw0, dgw) = pair(*y.shape), pair(*w_shape)
    before = dict(cudnn.calls)
    check(g.conv2d_fprop(plan, dx, dw), c.conv2d_fprop(plan, x, w), dt)
    check(g.conv2d_fprop(plan, dx, dw, db), y, dt)
    check(g.conv2d_bias_relu_fprop(plan, dx, dw, db), np.maximum(y, 0), dt)
    z, dz = pair(*y.shape)                  # a shortcut added, with and without the ReLU
    check(g.conv2d_bias_add_act_fprop(plan, dx, dw, db, dz), np.maximum(y + z, 0), dt)
    check(g.conv2d_bias_add_act_fprop(plan, dx, dw, db, dz, relu=False), y + z, dt)
    check(g.conv2d_dgrad(plan, dgy, dw), c.conv2d_dgrad(plan, gy, w), dt)
    want = gw0.copy()
    c.conv2d_wgrad(plan, x, gy, want)
    check(g.conv2d_wgrad(plan, dx, dgy, dgw), want, dt)
    fresh = np.full_like(w, np.nan)
    c.conv2d_wgrad(plan, x, gy, fresh, accumulate=False)
    check(g.conv2d_wgrad(plan, dx, dgy, cp.full_like(dgw, np.nan), accumulate=False), fresh, dt)
    for op in ("conv_fprop", "conv_bias_relu_fprop", "conv_dgrad", "conv_wgrad"):
        assert cudnn.calls[op] > before.get(op, 0), f"cuDNN {op} did not run"


@pytest.mark.parametrize("N,C,K", [(7, 5, 4), (64, 400, 120)])
def test_dense(dt, pair, N, C, K):
    c, g = families("dense")
    (x, dx), (w, dw), (b, db), (gy, dgy), (gw0, dgw) = pair(N, C), pair(K, C), pair(K), pair(N, K), pair(K, C)
    check(g.dense_fprop(dx, dw, db), c.dense_fprop(x, w, b), dt)
    out = cp.empty((N, K), dt)
    assert g.dense_fprop(dx, dw, out=out) is out
    check(out, c.dense_fprop(x, w), dt)
    check(g.dense_dgrad(dgy, dw), c.dense_dgrad(gy, w), dt)
    want = gw0.copy()
    c.dense_wgrad(x, gy, want)
    check(g.dense_wgrad(dx, dgy, dgw), want, dt)


@pytest.mark.parametrize("shape", [(7, 4), (2, 4, 3, 3), (256, 4, 24, 24), (9000, 4)])
def test_bias_grad_sums_in_float(dt, pair, shape):
    """One block per channel, or parts summed in float in a second kernel: 9000 values of 1 + tiny
    would lose the tiny parts in a bfloat16 sum."""
    c, g = families("dense")
    for accumulate in (True, False):
        (gy, dgy), (gb0, dgb) = pair(*shape), pair(shape[1])
        want = gb0.copy()
        c.bias_grad(gy, want, accumulate=accumulate)
        check(g.bias_grad(dgy, dgb, accumulate=accumulate), want, dt)
    ones = cp.ones((9000, 4), dt)
    check(g.bias_grad(ones, cp.zeros(4, dt), accumulate=False), np.full(4, 9000.0, np.float32), dt)


@pytest.mark.parametrize("name,args", [("relu_fprop", "x"), ("relu_bprop", "y gy")])
# (the other activations' fused kernels: tests/gpu/test_activation_xp.py, against the layers' expressions)
def test_activations(dt, pair, name, args):
    c, g = families("activation")
    values = {k: pair(3, 4, 5) for k in ("x", "y", "gy")}
    values["a"] = (0.1, 0.1)
    host, dev = zip(*[values[a] for a in args.split()])
    want = getattr(c, name)(*host)
    check(getattr(g, name)(*dev), want, dt)
    out = cp.empty(want.shape, dt)
    assert getattr(g, name)(*dev, out=out) is out


POOLS = [((2, 3, 8, 8), 2, 2, 0), ((2, 3, 9, 9), 3, 2, 1), ((2, 2, 8, 9), (2, 3), (1, 2), (1, 1))]


@pytest.mark.parametrize("x_shape,ksize,stride,padding", POOLS)
def test_pooling(dt, pair, x_shape, ksize, stride, padding):
    c, g = families("pool")
    plan = c.pool2d_plan((None,) + x_shape[1:], ksize, stride, padding)
    (x, dx), (gy, dgy) = pair(*x_shape), pair(x_shape[0], x_shape[1], *plan.out_shape[2:])
    y = c.maxpool2d_fprop(plan, x)
    dy = g.maxpool2d_fprop(plan, dx)
    check(dy, y, dt)
    assert np.array_equal(cp.asnumpy(dy).astype(np.float32), y)          # a selection: exact
    check(g.maxpool2d_bprop(plan, dx, dy, dgy), c.maxpool2d_bprop(plan, x, y, gy), dt)
    check(g.avgpool2d_fprop(plan, dx), c.avgpool2d_fprop(plan, x), dt)
    check(g.avgpool2d_bprop(plan, dgy), c.avgpool2d_bprop(plan, gy), dt)
    (x, dx), (gy, dgy) = pair(2, 3, 5, 6), pair(2, 3, 1, 1)
    check(g.global_avgpool_fprop(dx), c.global_avgpool_fprop(x), dt)
    check(g.global_avgpool_bprop(dgy, x.shape), c.global_avgpool_bprop(gy, x.shape), dt)


def test_merge_and_pad(dt, pair):
    cm, gm = families("merge")
    (a, da), (b, db), (e, de) = pair(2, 3, 4), pair(2, 3, 4), pair(2, 3, 4)
    check(gm.add_fprop([da, db]), cm.add_fprop([a, b]), dt)
    check(gm.add_fprop([da, db], relu=True), cm.add_fprop([a, b], relu=True), dt)
    check(gm.add_fprop([da, db, de], out=da), cm.add_fprop([a, b, e]), dt)
    cpd, gpd = families("pad")
    (x, dx), pads = pair(2, 3, 4, 5), (1, 2, 0, 3)
    y = cpd.pad2d_fprop(x, pads, 0.5)
    check(gpd.pad2d_fprop(dx, pads, 0.5), y, dt)
    gy, dgy = pair(*y.shape)
    check(gpd.pad2d_bprop(dgy, pads), cpd.pad2d_bprop(gy, pads), dt)


def test_dropout_draws_the_float32_masks(dt, pair):
    c, g = families("dropout")
    (x, dx), (gy, dgy), rate = pair(4, 5, 6, 7), pair(4, 5, 6, 7), 0.3
    y, mask = g.dropout_fprop(dx, rate, CounterRNG(cp, 3))
    cy, cmask = c.dropout_fprop(x, rate, CounterRNG(np, 3))
    assert np.array_equal(cp.asnumpy(mask).astype(np.float32) > 0, cmask > 0)       # the same Philox draws
    check(mask, cmask, dt)
    check(y, cy, dt)
    check(g.dropout_bprop(dgy, mask), gy * cp.asnumpy(mask).astype(np.float32), dt)


def test_the_cast_layer_rounds_to_nearest_even_as_numpy(dt):
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32) * 1e3
    x[0, :3] = (1e5, -1e5, np.nan)                                       # beyond float16: inf, as on the CPU
    cast = L.Cast(dt.name)
    cast.build([x.shape], get_device("cuda"))
    y = cast.forward([cp.asarray(x)], True)
    got, nan = cp.asnumpy(y), np.isnan(x)           # CUDA's NaN has other payload bits than NumPy's: a NaN all the same
    assert y.dtype == dt and np.isnan(got.astype(np.float32)[nan]).all()
    assert np.array_equal(got.view(np.uint16)[~nan], x.astype(dt).view(np.uint16)[~nan])
    gx = cast.backward(y)[0]
    assert gx.dtype == np.float32 and np.array_equal(cp.asnumpy(gx), x.astype(dt).astype(np.float32), equal_nan=True)


def test_the_arena_copies_refresh_and_gather_in_one_pass(dt):
    """Plain copies in one pass each way; a channels-last filter's copy lies K, kH, kW, C."""
    rng = np.random.default_rng(0)
    masters = [Parameter(k, s, "zeros") for k, s in (("a", (3, 70)), ("b", (50,)), ("f", (8, 5, 3, 3)), ("c", (4, 5)))]
    flat, grads, _ = arena.allocate(cp, np.dtype(np.float32), masters)
    flat[...] = cp.asarray(rng.standard_normal(flat.size).astype(np.float32))
    grads.fill(7.0)
    copies = [Parameter(m.name, m.shape, "zeros") for m in masters[:3]]          # "c" stays float32
    side = arena.Copies(get_device("cuda"), flat, [(p, m, p.name == "f") for p, m in zip(copies, masters)], dt)
    side.refresh(flat)
    assert copies[2].data.transpose(0, 2, 3, 1).flags.c_contiguous and not copies[2].data.flags.c_contiguous
    for p, m in zip(copies, masters):
        assert p.data.dtype == dt and np.array_equal(cp.asnumpy(p.data).view(np.uint16),
                                                     cp.asnumpy(m.data).astype(dt).view(np.uint16))
    for p in copies:
        p.grad[...] = cp.asarray(rng.standard_normal(p.shape).astype(dt))
    side.gather(grads)
    for p, m in zip(copies, masters):
        assert np.array_equal(cp.asnumpy(m.grad), cp.asnumpy(p.grad).astype(np.float32))
    assert (masters[3].grad == 7.0).all()                               # not a copy's: left alone


@pytest.mark.parametrize("kernel", [True, False])          # False: the fallback, copied one filter at a time
def test_filters_permute_to_k_kh_kw_c_and_back(dt, kernel, monkeypatch):
    from minidl.kernels.gpu import cast as k
    if not kernel:
        monkeypatch.setattr(k, "HALF_CTYPES", {})
    rng = np.random.default_rng(2)
    shapes, filters, o = [(8, 5, 3, 3), (4, 1, 7, 7), (16, 32, 3, 3), (3, 600, 3, 3)], [], 0
    for shape in shapes:
        filters.append((o,) + shape)
        o += int(np.prod(shape)) + 64                                     # gaps, as the arena's alignment leaves
    master = rng.standard_normal(o).astype(np.float32)
    low = cp.zeros(o, dt)
    k.cast_filters_krsc(low, cp.asarray(master), tuple(filters))
    back = cp.full(o, 5.0, np.float32)
    k.cast_filters_kcrs(back, low, tuple(filters))
    got, back, want_back = cp.asnumpy(low), cp.asnumpy(back), np.full(o, 5.0, np.float32)
    for (at, K, C, kh, kw) in filters:
        n = K * C * kh * kw
        want = master[at:at + n].reshape(K, C, kh, kw).transpose(0, 2, 3, 1).astype(dt).reshape(-1)
        assert np.array_equal(got[at:at + n].view(np.uint16), want.view(np.uint16))
        assert not got[at + n:at + n + 64].astype(np.float32).any()         # the gaps stay as they were
        want_back[at:at + n] = master[at:at + n].astype(dt).astype(np.float32)
    assert np.array_equal(back, want_back)


def test_the_copy_kernels_round_as_numpy_does_at_ties_overflow_subnormals_and_nan(dt):
    from minidl.kernels.gpu import cast as k
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-9, 6, 4096)).astype(np.float32)
    x[:6] = (1e5, -1e5, np.inf, 1e-40, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8)    # overflow, subnormal, ties
    x[6] = np.nan
    low = cp.empty(x.size, dt)
    k.cast_copy(low, cp.asarray(x))
    got, nan = cp.asnumpy(low).view(np.uint16), np.isnan(x)
    bad = np.flatnonzero((got != x.astype(dt).view(np.uint16)) & ~nan)
    numpy_bits = x[bad[:4]].astype(dt).view(np.uint16)
    assert bad.size == 0, f"{bad.size} differ, e.g. {x[bad[:4]]} -> {got[bad[:4]]} (NumPy {numpy_bits})"
    assert np.isnan(cp.asnumpy(low).astype(np.float32)[nan]).all()
    mask = rng.random(x.size) < 0.7
    up = cp.full(x.size, -3.0, np.float32)
    k.cast_copy_where(up, low, cp.asarray(mask))
    want = np.where(mask, x.astype(dt).astype(np.float32), np.float32(-3.0))
    assert np.array_equal(cp.asnumpy(up), want, equal_nan=True)


def test_loss_scaling_skips_an_overflow_and_halves_the_scale_inside_a_captured_call():
    dev = get_device("cuda")
    s = DynamicLossScale(dev, LossScale(init=8.0, interval=3))
    live, grads, fill = cp.ones((), bool), cp.zeros(6, np.float32), cp.zeros(6, np.float32)

    def step():
        cp.copyto(grads, fill)
        s.unscale(grads, live)

    call = dev.capture(step, warmup=1)                  # the warm-up: a clean step of zeros
    assert int(s.clean) == 1
    fill[...] = 16.0
    call.replay()
    assert bool(s.gate) and (grads == 2.0).all() and float(s.scale) == 8.0
    fill[3] = np.inf                                                      # an injected overflow
    call.replay()
    call.replay()
    assert not bool(s.gate) and float(s.scale) == 2.0 and int(s.skipped) == 2 and int(s.clean) == 0
    fill[3] = 1.0
    for _ in range(3):
        call.replay()
    assert bool(s.gate) and float(s.scale) == 4.0 and int(s.clean) == 0           # x2 after 3 clean steps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(4, 16, 6, 6), (3, 5, 3, 3)])        # 576 values a channel-slice; 135: not 8 x
@pytest.mark.parametrize("cl", [False, True])
def test_pointwise_kernels_agree_with_float32_rounded_once(dtype, shape, cl):
    """add, add + ReLU, ReLU and ReLU's backward through _util.pointwise: the vectorised kernels where
    the arrays are dense (both layouts), CuPy's elsewhere; each value computed in float32, rounded once."""
    from minidl.kernels.gpu import _vec
    from minidl.kernels.gpu._util import ADD_RELU, RELU, RELU_BPROP, lies_in, pointwise
    dt = dtype_of(dtype)
    rng = np.random.default_rng(4)
    a, b = (rng.standard_normal(shape).astype(np.float32).astype(dt) for _ in range(2))
    dev = (lambda h: cp.asarray(np.ascontiguousarray(h.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)) if cl \
        else cp.asarray
    f32 = (a.astype(np.float32), b.astype(np.float32))
    want = {cp.add: f32[0] + f32[1], ADD_RELU: np.maximum(f32[0] + f32[1], 0), RELU: np.maximum(f32[0], 0),
            RELU_BPROP: np.where(f32[0] > 0, f32[1], 0)}
    calls = []
    real = _vec.run
    try:
        _vec.run = lambda *args: calls.append(1) or real(*args)
        for kernel, w in want.items():
            args = (dev(a),) if kernel is RELU else (dev(a), dev(b))
            y = pointwise(kernel, *args)
            assert y.dtype == dt and lies_in(y, cl)
            assert np.array_equal(cp.asnumpy(y).astype(np.float32), w.astype(dt).astype(np.float32))
            out = dev(np.zeros(shape, dt))
            assert pointwise(kernel, *args, out=out) is out and cp.array_equal(out, y)
    finally:
        _vec.run = real
    assert len(calls) == (8 if np.prod(shape) % 8 == 0 else 0)
