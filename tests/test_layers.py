"""Activations, Add, Pad2D, Dense, Flatten, Softmax: forwards against references, gradient checks."""
import numpy as np
import pytest
from tests.helpers.gradcheck import check_model, gradcheck

from minidl import Input, Model, Sequential
from minidl import layers as L
from minidl.backend import Device
from minidl.kernels.cpu import softmax as ksoftmax
from minidl.layers.activation import _Activation
from minidl.precision import dtype_of

BF16 = dtype_of("bfloat16")

rng = np.random.default_rng(0)


def away_from_zero(shape):
    """Inputs at least 0.05 from 0, so central differences never straddle a ReLU kink."""
    x = rng.uniform(0.05, 1.0, shape)
    return x * rng.choice([-1.0, 1.0], shape)


@pytest.mark.parametrize("layer,ref", [
    (L.ReLU, lambda x: np.where(x > 0, x, 0)),
    (lambda: L.LeakyReLU(0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    (L.Sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    (L.Tanh, np.tanh),
])
def test_activation_forward_and_backward(layer, ref):
    x = away_from_zero((3, 2, 4, 5)) * 3
    node = Input(x.shape[1:])
    model = Model(node, layer()(node), dtype="float64")
    np.testing.assert_allclose(model.forward(x), ref(x), rtol=1e-13, atol=1e-15)
    check_model(model, [x])


ACTIVATIONS = sorted(n for n in L.__all__ if isinstance(getattr(L, n), type) and issubclass(getattr(L, n), _Activation))


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_a_fused_cpu_kernel_computes_the_activations_expressions(name):
    """Where the CPU family offers an activation's `kernel` pair (ReLU's), the layer runs it: it computes
    what the layer's expressions say, which every other backend and activation runs."""
    layer, act = getattr(L, name)(), Device("cpu", dtype="float64").kernels.activation
    if not layer.kernel or not hasattr(act, f"{layer.kernel}_fprop"):
        pytest.skip(f"{name}: the CPU runs its expressions")
    x, gy = away_from_zero((3, 2, 4, 5)) * 3, rng.standard_normal((3, 2, 4, 5))
    y = getattr(act, f"{layer.kernel}_fprop")(x, *layer.kernel_args())
    np.testing.assert_array_equal(y, act.elementwise(layer.f, x))
    s = x if layer.needs_input else y
    np.testing.assert_array_equal(getattr(act, f"{layer.kernel}_bprop")(s, gy, *layer.kernel_args()),
                                  act.elementwise(layer.df, s, gy))


def test_the_expressions_follow_the_inputs_memory_order_and_round_half_storage_once():
    act = Device("cpu").kernels.activation
    x = np.ascontiguousarray(away_from_zero((2, 3, 4, 5)).transpose(1, 2, 3, 0)).transpose(3, 0, 1, 2)   # CHWN
    gy = rng.standard_normal(x.shape)                                                                     # NCHW
    gx = act.elementwise(L.Tanh().df, x, gy)
    assert gx.transpose(1, 2, 3, 0).flags.c_contiguous and np.allclose(gx, gy * (1 - x * x))
    half = Device("cpu").compute_in("bfloat16").kernels.activation
    xb = x.astype(BF16)
    y = half.elementwise(L.Sigmoid().f, xb)
    assert y.dtype == BF16 and np.array_equal(y, (0.5 + 0.5 * np.tanh(0.5 * xb.astype(np.float32))).astype(BF16))


def test_sigmoid_does_not_overflow_for_large_inputs():
    node = Input((3,))
    y = Model(node, L.Sigmoid()(node)).forward(np.array([[-1000.0, 0.0, 1000.0]], np.float32))
    np.testing.assert_array_equal(y, [[0.0, 0.5, 1.0]])


def test_add_of_three_inputs():
    shapes = [(2, 3, 4, 4)] * 3
    xs = [rng.standard_normal(s) for s in shapes]
    nodes = [Input(s[1:]) for s in shapes]
    model = Model(nodes, L.Add()(*nodes), dtype="float64")
    np.testing.assert_allclose(model.forward(*xs), xs[0] + xs[1] + xs[2])
    gradcheck(L.Add(), shapes)


def test_add_rejects_mismatched_inputs_naming_layer_and_shapes():
    a, b = Input((3, 4, 4)), Input((3, 2, 2))
    with pytest.raises(ValueError, match=r"add_1 .*one shape.*\(N, 3, 4, 4\) and \(N, 3, 2, 2\)"):
        Model([a, b], L.Add()(a, b))


@pytest.mark.parametrize("padding,value", [(1, 0.0), ((1, 2), 0.5), ((0, 1, 2, 3), -1.0)])
def test_pad2d(padding, value):
    x = rng.standard_normal((2, 3, 4, 5))
    node = Input(x.shape[1:])
    layer = L.Pad2D(padding, value)
    model = Model(node, layer(node), dtype="float64")
    top, bottom, left, right = layer.pads
    want = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)
    np.testing.assert_array_equal(model.forward(x), want)
    check_model(model, [x])


@pytest.mark.parametrize("padding", [-1, (1, 2, 3), "same", 1.5])
def test_pad2d_rejects_bad_padding_naming_the_layer(padding):
    with pytest.raises(ValueError, match="pad_x"):
        L.Pad2D(padding, name="pad_x")


@pytest.mark.parametrize("bias", [True, False])
def test_dense_forward_and_backward(bias):
    x = rng.standard_normal((4, 6))
    node = Input((6,))
    layer = L.Dense(3, bias=bias)
    model = Model(node, layer(node), dtype="float64")
    want = x @ layer.w.data.T + (layer.b.data if bias else 0)
    np.testing.assert_allclose(model.forward(x), want, rtol=1e-13)
    gradcheck(L.Dense(3, bias=bias), [(4, 6)])


def test_flatten_then_dense_backward():
    x = rng.standard_normal((2, 2, 3, 3))
    node = Input(x.shape[1:])
    model = Model(node, L.Dense(4)(L.Flatten()(node)), dtype="float64")
    check_model(model, [x])


def test_dense_rejects_4d_input_naming_the_layer():
    x = Input((1, 28, 28))
    with pytest.raises(ValueError, match=r"dense .*2-D input.*Flatten"):
        Model(x, L.Dense(10)(x))


def test_softmax_forward_and_backward():
    x = rng.standard_normal((4, 5)) * 3
    node = Input((5,))
    model = Model(node, L.Softmax()(node), dtype="float64")
    e = np.exp(x)
    np.testing.assert_allclose(model.forward(x), e / e.sum(1, keepdims=True), rtol=1e-13)
    check_model(model, [x])


def test_softmax_xent_is_stable_and_matches_the_definition():
    z = rng.standard_normal((6, 4)) * 4
    labels = rng.integers(0, 4, 6)
    loss_sum, correct, gz = ksoftmax.softmax_xent(z, labels)
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    assert float(loss_sum) == pytest.approx(-np.log(p[np.arange(6), labels]).sum(), rel=1e-12)
    assert int(correct) == np.sum(p.argmax(1) == labels)
    onehot = np.eye(4)[labels]
    np.testing.assert_allclose(gz, (p - onehot) / 6, rtol=1e-12, atol=1e-15)
    # Logits far apart: the loss of a confident wrong answer is finite and exact, not log(0).
    loss_sum, _, _ = ksoftmax.softmax_xent(np.array([[0.0, 1000.0]], np.float32), np.array([0]))
    assert float(loss_sum) == pytest.approx(1000.0)


def test_branch_with_add_sums_gradients_like_layers_composed_by_hand():
    """y = relu(conv_a(x)) + conv_b(x): x feeds two layers, its gradient is the sum of both paths."""
    x = away_from_zero((2, 2, 5, 5))
    node = Input(x.shape[1:])
    ca, cb, relu, add = L.Conv2D(3, 3, padding=1), L.Conv2D(3, 1), L.ReLU(), L.Add()
    model = Model(node, add(relu(ca(node)), cb(node)), dtype="float64")
    gy = rng.standard_normal((2, 3, 5, 5))
    model.forward(x, training=True)
    model.zero_grad()
    gx = model.backward(gy)
    graph_grads = model.get_grads()

    # The same computation, layer by layer, by hand.
    model.zero_grad()
    ya = ca.forward([x], True)
    relu.forward([ya], True)
    cb.forward([x], True)
    g_ra, g_cb = add.backward(gy)
    gx_a, = ca.backward(relu.backward(g_ra)[0])
    gx_b, = cb.backward(g_cb)
    np.testing.assert_allclose(gx, gx_a + gx_b, rtol=1e-12)
    for k, g in model.get_grads().items():
        np.testing.assert_allclose(graph_grads[k], g, rtol=1e-12)
    check_model(model, [x])


def test_seed_style_names_and_summary(capsys):
    x = Input((1, 8, 8))
    h = L.ReLU()(L.Conv2D(2, 3, padding=1)(x))
    h = L.Add()(h, L.ReLU()(L.Conv2D(2, 3, padding=1)(h)))
    y = L.Softmax()(L.Dense(10)(L.Flatten()(h)))
    model = Model(x, y)
    assert [layer.name for layer in model.layers] == [
        "conv2d", "relu", "conv2d_1", "relu_1", "add_1", "flatten", "dense", "softmax"]
    model.summary()
    out = capsys.readouterr().out
    assert "conv2d_1 (Conv2D)" in out and "(N, 2, 8, 8)" in out
    assert f"total params: {2 * 9 + 2 + 2 * 2 * 9 + 2 + 128 * 10 + 10:,} trainable" in out


def test_wrong_input_shape_names_the_model_input():
    model = Sequential([L.Flatten(), L.Dense(3)], input_shape=(1, 4, 4))
    with pytest.raises(ValueError, match=r"expects shape \(N, 1, 4, 4\), got \(2, 1, 5, 5\)"):
        model.forward(np.zeros((2, 1, 5, 5), np.float32))


def test_parameters_live_in_one_flat_buffer():
    model = Sequential([L.Conv2D(2, 3), L.Flatten(), L.Dense(3)], input_shape=(1, 5, 5))
    for p in model.params.values():
        assert p.data.base is model.flat and p.grad.base is model.grads
    assert model.n_params == sum(p.size for p in model.params.values())
