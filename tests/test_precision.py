"""The precision policy on the CPU: names, casts, the cast pass, the half-storage kernels, and every
layer's forward and backward in bf16/fp16 against float32 within per-dtype tolerances."""
import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl import precision
from minidl.backend import get_device
from minidl.graph import Graph, passes

BF16, FP16, FP32 = precision.BFLOAT16, precision.FLOAT16, precision.FLOAT32
# Relative error (in norm) of a half-precision forward or backward against float32: a few roundings
# of inputs, weights and results, each at most 2^-9 (bfloat16) or 2^-12 (float16) relative.
REL_TOL = {"bfloat16": 1.2e-2, "float16": 1.5e-3}


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(np.asarray(b, np.float64)), 1e-30))


def test_policies_by_name_and_alias():
    assert precision.policy().name == precision.policy("float32").name == "fp32"
    bf, fp = precision.policy("bfloat16"), precision.policy("fp16")
    assert (bf.compute, bf.param, bf.loss_scale, bf.mixed) == (BF16, FP32, None, True)
    assert fp.compute == FP16 and fp.loss_scale == precision.LossScale(2.0 ** 16, 2.0, 0.5, 2000)
    assert precision.policy(bf) is bf
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        precision.policy("fp8")
    with pytest.raises(ValueError, match="no loss scaling"):
        precision.policy("bf16", loss_scale=precision.LossScale())
    with pytest.raises(ValueError, match="backoff"):
        precision.LossScale(backoff=2.0)


@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_every_half_value_round_trips_through_float32(dtype):
    bits = np.arange(2 ** 16, dtype=np.uint16).view(dtype)
    bits = bits[~np.isnan(bits.astype(np.float32))]
    back = bits.astype(np.float32).astype(dtype)
    assert np.array_equal(back.view(np.uint16), bits.view(np.uint16))


def test_casts_round_to_nearest_even_and_fp16_overflows_to_inf():
    x = L.Input((4,))
    model = dl.Model(x, L.Cast("bfloat16")(x))
    # 1 + 2^-8 lies halfway between the bf16 neighbours 1 and 1 + 2^-7: the even one (1) wins, and
    # 1 + 3*2^-8, halfway between 1 + 2^-7 and 1 + 2^-6, goes up to the even 1 + 2^-6; bf16 has fp32's range
    v = np.array([[1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.0e38, -2.5]], np.float32)
    y = model.forward(v)
    assert y.dtype == BF16 and y.astype(np.float32).tolist()[0][:2] == [1.0, 1 + 2 ** -6]
    assert abs(float(y[0, 2]) / 3.0e38 - 1) < 2 ** -8 and float(y[0, 3]) == -2.5
    gx = model.backward(np.ones((1, 4), BF16))
    assert gx.dtype == FP32 and (gx == 1).all()
    half = dl.Model(x, L.Cast("float16")(x))
    with np.errstate(over="ignore"):                 # 7e4 overflows float16, as it must
        y = half.forward(np.array([[7e4, -7e4, 6e-8, 65504]], np.float32))
    assert y.astype(np.float32).tolist() == [[np.inf, -np.inf, 2 ** -24, 65504]]      # 6e-8: the subnormal 2^-24


def test_the_cast_pass_puts_casts_at_the_edges_of_the_compute_region():
    x = L.Input((3, 8, 8))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1)(x)))
    y = L.Softmax()(L.Dense(5)(L.Flatten()(L.Conv2D(4, 3)(h))))
    model = dl.Model(x, y)
    g = passes.cast(Graph.of(model, share_params=True), BF16)
    # softmax keeps float32 behind a cast; BN keeps float32 statistics and parameters but reads and
    # writes bfloat16 itself (io_in_compute_dtype): no casts around it
    assert [n.kind for n in g.nodes] == ["cast", "conv2d", "batchnorm", "relu", "conv2d",
                                         "flatten", "dense", "cast", "softmax"]
    assert g.stats == {"cast_to_bfloat16": 1, "cast_to_float32": 1}
    lowered = dl.Model.of_graph(g, model.device, shares=model)
    computes = [n.layer.device.dtype.name for n in lowered.nodes]          # the dtype of each layer's parameters
    assert computes == ["float32", "bfloat16", "float32", "bfloat16", "bfloat16",
                        "bfloat16", "bfloat16", "bfloat16", "float32"]
    assert [n.dtype.name for n in lowered.nodes][:4] == ["bfloat16"] * 4     # what each gives: BN bfloat16 too
    bn = lowered.nodes[2].layer
    assert bn.gamma.data.dtype == FP32 and bn.running_var.data.dtype == FP32
    assert bn.gamma is model.params[f"{bn.name}/gamma"]                      # the master's, no copy
    assert lowered.forward(np.ones((2, 3, 8, 8), np.float32)).dtype == FP32
    # a config round trip keeps the casts, so the dtypes come back with it
    again = dl.Model.from_config(lowered.config())
    assert [n.dtype for n in again.nodes] == [n.dtype for n in lowered.nodes]
    assert passes.cast(Graph.of(model), FP32).stats == {}                  # fp32: nothing to do


def test_the_half_storage_kernels_compute_in_float32_and_round_what_they_write():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 7)).astype(BF16), rng.standard_normal((3, 7)).astype(BF16)
    k = get_device("cpu").compute_in("bfloat16").kernels.dense
    y = k.dense_fprop(x, w)
    assert y.dtype == BF16 and np.array_equal(y, (x.astype(FP32) @ w.astype(FP32).T).astype(BF16))
    gw = np.ones((3, 7), BF16)
    gy = rng.standard_normal((5, 3)).astype(BF16)
    k.dense_wgrad(x, gy, gw)                         # adds into the bfloat16 gradient, rounded once
    assert np.array_equal(gw, (1 + gy.astype(FP32).T @ x.astype(FP32)).astype(BF16))
    act = get_device("cpu").compute_in("float16").kernels.activation
    h = np.array([-1.0, 2.0, -3.0], FP16)
    assert act.relu_fprop(h, out=h) is h and h.tolist() == [0.0, 2.0, 0.0]    # in place stays in place


def test_the_half_storage_kernels_write_back_every_argument_they_update():
    """A float16 argument a kernel writes into (running statistics, gradients added into) holds the float32
    kernel's result, rounded once (kernels/cpu/storage.py WRITTEN)."""
    half, full = get_device("cpu").compute_in("float16").kernels, get_device("cpu").kernels
    x = (np.arange(16) / 4).astype(FP16).reshape(2, 2, 2, 2)
    stats16, stats32 = [np.zeros(2, FP16), np.ones(2, FP16)], [np.zeros(2, FP32), np.ones(2, FP32)]
    one, zero = np.ones(2, FP32), np.zeros(2, FP32)
    half.norm.bn_fprop_train(x, one, zero, *stats16, 0.3, 1e-5)
    full.norm.bn_fprop_train(x.astype(FP32), one, zero, *stats32, 0.3, 1e-5)
    gb16, gb32 = np.full(2, 0.5, FP16), np.full(2, 0.5, FP32)
    half.dense.bias_grad(x, gb16)
    full.dense.bias_grad(x.astype(FP32), gb32)
    for got, want in zip((*stats16, gb16), (*stats32, gb32)):
        assert got.dtype == FP16 and np.array_equal(got, want.astype(FP16)), (got, want)
    assert not np.array_equal(stats16[0], np.zeros(2, FP16)) and not np.array_equal(gb16, np.full(2, 0.5, FP16))


def _one_layer(make, shape, n_inputs=1):
    xs = [L.Input(shape) for _ in range(n_inputs)]
    return dl.Model(xs[0] if n_inputs == 1 else xs, make()(*xs), seed=3)


LAYERS = {
    "conv": (lambda: L.Conv2D(6, 3, stride=2, padding=1), (3, 9, 9), 1),
    "conv_relu": (lambda: L.Conv2D(4, 3, activation="relu"), (2, 7, 7), 1),
    "dense": (lambda: L.Dense(20), (30,), 1),
    "relu": (L.ReLU, (3, 6, 6), 1),
    "leaky_relu": (lambda: L.LeakyReLU(0.1), (3, 6, 6), 1),
    "sigmoid": (L.Sigmoid, (3, 6, 6), 1),
    "tanh": (L.Tanh, (3, 6, 6), 1),
    "maxpool": (lambda: L.MaxPool2D(2), (3, 8, 8), 1),
    "avgpool": (lambda: L.AvgPool2D(3, stride=2, padding=1), (3, 8, 8), 1),
    "global_avgpool": (L.GlobalAvgPool2D, (3, 5, 5), 1),
    "pad": (lambda: L.Pad2D(1), (2, 4, 4), 1),
    "add_relu": (lambda: L.Add(activation="relu"), (3, 4, 4), 2),
    "dropout": (lambda: L.Dropout(0.25), (40,), 1),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(LAYERS))
def test_each_layer_in_half_precision_matches_float32(name, dtype):
    make, shape, n = LAYERS[name]
    model = _one_layer(make, shape, n)
    ref = model.lower(lambda g: g)
    half = model.lower(lambda g: passes.cast(g, dtype))
    assert half.nodes[n].layer.device.dtype == np.dtype(dtype)          # the layer itself computes in dtype
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((8, *shape)).astype(np.float32) for _ in range(n)]
    if name == "maxpool":     # quarters in [-16, 16), exact in both dtypes: rounding makes no new ties to route
        xs = [rng.integers(-64, 64, (8, *shape)).astype(np.float32) / 4]
    outs = []
    for net in (ref, half):
        model.device.rng.offset.fill(0)                                  # dropout: the same mask both times
        y = net.forward(*xs, training=True)
        gy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
        net.zero_grad()
        gx = net.backward(gy)
        outs.append((y, gx if n > 1 else [gx], model.get_grads()))
    (y0, gx0, g0), (y1, gx1, g1) = outs
    tol = REL_TOL[dtype]
    assert y1.dtype == FP32 and rel(y1, y0) <= tol
    assert name == "maxpool" or not np.array_equal(y1, y0)           # rounded, but close
    for a, b in zip(gx1, gx0):
        assert a.dtype == FP32 and rel(a, b) <= tol
    for k in g0:
        assert rel(g1[k], g0[k]) <= tol, k


def test_layers_that_keep_float32_compute_exactly_as_in_float32():
    x = L.Input((3, 6, 6))
    model = dl.Model(x, L.LRN(3)(L.BatchNorm2D()(x)), seed=0)
    half = model.lower(lambda g: passes.cast(g, FP16))
    assert [n.kind for n in half.nodes] == ["batchnorm", "lrn"]                 # no casts needed at all
    v = np.random.default_rng(0).standard_normal((4, 3, 6, 6)).astype(np.float32)
    assert np.array_equal(half.forward(v, training=False), model.forward(v, training=False))


def test_compute_copies_follow_the_master_and_gradients_end_in_float32():
    model = _one_layer(lambda: L.Dense(6), (5,))
    net = model.lower(lambda g: passes.cast(g, BF16))
    w = net.layers[1].w
    assert w is not model.layers[0].w and w.data.dtype == BF16 and model.flat.dtype == FP32
    x = np.ones((2, 5), np.float32)
    net.forward(x)
    assert np.array_equal(w.data, model.layers[0].w.data.astype(BF16))
    model.layers[0].w.data[...] += 1e-3                                     # the optimizer changes the master
    net.forward(x)
    assert np.array_equal(w.data, model.layers[0].w.data.astype(BF16))     # the next forward sees it
    net.zero_grad()
    net.backward(np.ones((2, 6), np.float32))
    assert (model.layers[0].w.grad == 2 * x[0]).all() and model.grads.dtype == FP32


def test_a_channels_last_convolution_trains_on_filters_lying_k_kh_kw_c():
    """Under channels-last the copies of 3x3 filters lie K, kH, kW, C (cuDNN's faster NHWC filters);
    1x1 ones lie both ways and stay. Same values, so on the CPU the same results, gradients too."""
    x = L.Input((3, 6, 6))
    y = L.Conv2D(4, (1, 1))(L.Conv2D(5, (3, 3), padding=1)(x))
    model = dl.Model(x, L.Dense(2)(L.Flatten()(y)), device="cpu")
    plain = model.lower(lambda g: passes.cast(passes.training(g), BF16))
    cl = model.lower(lambda g: passes.cast(passes.channels_last(passes.training(g)), BF16))
    w3, w1 = (layer.w for layer in cl.layers if layer.kind == "conv2d")
    v = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    outs = []
    for net in (plain, cl):
        net.zero_grad()
        outs.append((net.forward(v, training=True), net.backward(np.ones((2, 2), np.float32), input_grads=False)))
        outs[-1] += (model.grads.copy(),)
    assert w3.data.transpose(0, 2, 3, 1).flags.c_contiguous and not w3.data.flags.c_contiguous
    assert w1.data.flags.c_contiguous
    assert np.array_equal(w3.data, model.layers[0].w.data.astype(BF16))
    assert np.array_equal(outs[0][0], outs[1][0]) and np.array_equal(outs[0][2], outs[1][2])
    assert np.abs(outs[1][2]).sum() > 0


def test_a_model_built_channels_last_keeps_its_filters_k_kh_kw_c_in_its_own_arena():
    """An inference lowering's channels-last convolutions are built as such: their 3x3 filters lie
    K, kH, kW, C in the model's own arena (cuDNN would transpose them at every call), 1x1 ones as
    they are; the weights read and written keep their (K, C, kH, kW) meaning, and a half-precision
    copy of such a master is taken as it lies."""
    def build(cl):
        x = L.Input((3, 6, 6))
        y = L.Conv2D(4, (1, 1), channels_last=cl)(L.Conv2D(5, (3, 3), padding=1, channels_last=cl)(x))
        return dl.Model(x, L.Dense(2)(L.Flatten()(y)), device="cpu", seed=0)
    plain, cl = build(False), build(True)
    cl.set_weights(plain.get_weights())
    w3, w1 = (layer.w for layer in cl.layers if layer.kind == "conv2d")
    p3 = next(layer.w for layer in plain.layers if layer.kind == "conv2d")
    assert w3.data.transpose(0, 2, 3, 1).flags.c_contiguous and not w3.data.flags.c_contiguous
    assert w3.grad.strides == w3.data.strides and w1.data.flags.c_contiguous
    o, n = w3.offset, w3.size
    assert np.array_equal(cl.flat[o:o + n], p3.data.transpose(0, 2, 3, 1).ravel())
    assert all(np.array_equal(a, b) for a, b in zip(cl.get_weights().values(), plain.get_weights().values()))
    v = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype(np.float32)
    for net in (plain, cl):
        net.zero_grad()
        net.forward(v, training=True)
        net.backward(np.ones((2, 2), np.float32), input_grads=False)
    assert np.array_equal(cl.forward(v), plain.forward(v))
    assert all(np.array_equal(a, b) for a, b in zip(cl.get_grads().values(), plain.get_grads().values()))
    half = cl.lower(lambda g: passes.cast(passes.training(g), BF16))
    half.forward(v)
    assert np.array_equal(next(layer.w for layer in half.layers if layer.kind == "conv2d").data, w3.data.astype(BF16))


def test_a_model_with_half_precision_weights_of_its_own_is_not_trained_by_hand():
    x = L.Input((5,))
    model = dl.Model(x, L.Dense(3)(L.Cast("bfloat16")(x)))
    assert model.layers[1].w.data.dtype == BF16 and model.side_arenas
    with pytest.raises(ValueError, match="no optimizer updates"):
        dl.Trainer(model, dl.optim.SGD(lr=0.1), device="cpu", progress=False)


def test_batchnorm_kernels_take_a_compute_dtype_and_keep_float32_statistics():
    """BN reads and writes bfloat16 / float16 while its parameters and statistics stay float32: the
    kernels compute in float32 and round what they return, once."""
    from minidl.kernels.cpu import norm
    rng = np.random.default_rng(0)
    x32 = rng.standard_normal((4, 3, 5, 5)).astype(FP32)
    for dt in (BF16, FP16):
        x, gy = x32.astype(dt), rng.standard_normal(x32.shape).astype(dt)
        gamma, beta = rng.standard_normal(3).astype(FP32), rng.standard_normal(3).astype(FP32)
        rm, rv, rm32, rv32 = np.zeros(3, FP32), np.ones(3, FP32), np.zeros(3, FP32), np.ones(3, FP32)
        y, mean, invstd = norm.bn_fprop_train(x, gamma, beta, rm, rv, 0.1, 1e-5, relu=True)
        want, mean32, invstd32 = norm.bn_fprop_train(x.astype(FP32), gamma, beta, rm32, rv32, 0.1, 1e-5, relu=True)
        assert y.dtype == dt and mean.dtype == FP32 and rm.dtype == FP32
        assert np.array_equal(y, want.astype(dt)) and np.array_equal(rv, rv32) and np.array_equal(invstd, invstd32)
        gg, gb, gg32, gb32 = (np.zeros(3, FP32) for _ in range(4))
        gx = norm.bn_bprop(x, gy, gamma, mean, invstd, gg, gb, y=y, relu=True)
        gx32 = norm.bn_bprop(x.astype(FP32), gy.astype(FP32), gamma, mean, invstd, gg32, gb32, y=y.astype(FP32),
                             relu=True)
        assert gx.dtype == dt and np.array_equal(gx, gx32.astype(dt)) and np.array_equal(gg, gg32)
        yi = norm.bn_fprop_infer(x, gamma, beta, rm, rv, 1e-5)
        assert yi.dtype == dt and np.array_equal(yi, norm.bn_fprop_infer(x.astype(FP32), gamma, beta, rm, rv,
                                                                          1e-5).astype(dt))
