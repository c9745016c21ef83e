import numpy as np
import pytest
from tests.helpers import reference
from tests.helpers.gradcheck import gradcheck

from minidl import Input, Model
from minidl.kernels.cpu import conv
from minidl.layers import Conv2D


@pytest.mark.parametrize("stride,padding,dilation", [
    (1, 0, 1), (2, 1, 1), (1, "same", 1), (2, "same", 2), (1, (1, 2), 2), ((2, 1), "valid", 1)])
def test_conv2d_backward_matches_finite_differences(stride, padding, dilation):
    gradcheck(Conv2D(3, 3, stride=stride, padding=padding, dilation=dilation), [(2, 2, 7, 6)])


def test_conv2d_without_bias_and_rectangular_kernel():
    gradcheck(Conv2D(2, (2, 3), bias=False, padding=1), [(1, 3, 5, 5)])


@pytest.mark.parametrize("activation", [None, "relu"])
def test_residual_conv2d_adds_z_before_its_activation_and_passes_the_gradient_to_z(activation):
    """act(conv(x) + b + z): the inference passes' fusion of a shortcut Add (passes.fuse_residual_adds)."""
    rng = np.random.default_rng(3)
    x, z = rng.standard_normal((2, 2, 6, 5)), rng.standard_normal((2, 3, 6, 5))
    a, r = Input(x.shape[1:]), Input(z.shape[1:])
    layer = Conv2D(3, 3, padding=1, activation=activation, residual=True)
    model = Model([a, r], layer(a, r), dtype="float64")
    plain = Model(a, Conv2D(3, 3, padding=1, name="plain")(a), dtype="float64")
    plain.set_weights({"plain/w": layer.w.data, "plain/b": layer.b.data})
    want = plain.forward(x) + z
    np.testing.assert_allclose(model.forward(x, z), np.maximum(want, 0) if activation else want, rtol=1e-13)
    gradcheck(Conv2D(3, 3, padding=1, activation=activation, residual=True), [(2, 2, 6, 5), (2, 3, 6, 5)])


def test_residual_conv2d_rejects_a_residual_of_another_shape_naming_both():
    a, r = Input((2, 6, 5)), Input((3, 3, 3))
    with pytest.raises(ValueError, match=r"conv2d.*residual input \(N, 3, 3, 3\) is not the output's shape "
                                         r"\(N, 3, 6, 5\)"):
        Model([a, r], Conv2D(3, 3, padding=1, residual=True)(a, r))


@pytest.mark.parametrize("stride,padding,dilation", [(1, 0, 1), (2, "same", 1), ((2, 1), (0, 1), (1, 2))])
def test_conv2d_forward_matches_loop_reference(stride, padding, dilation):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 8))
    layer = Conv2D(4, 3, stride=stride, padding=padding, dilation=dilation)
    x_node = Input((3, 7, 8))
    model = Model(x_node, layer(x_node), dtype="float64")
    layer.b.data[...] = rng.standard_normal(4)
    want = reference.conv2d(x, layer.w.data, layer.b.data, layer.stride, layer.plan.pads, layer.dilation)
    np.testing.assert_allclose(model.forward(x), want, rtol=1e-12, atol=1e-12)


def test_same_padding_keeps_size_at_stride_one_and_halves_at_two():
    assert conv.conv2d_plan((None, 1, 28, 28), (4, 1, 5, 5), (1, 1), "same", (1, 1)).out_shape == (None, 4, 28, 28)
    assert conv.conv2d_plan((None, 1, 28, 28), (4, 1, 4, 4), (2, 2), "same", (1, 1)).out_shape == (None, 4, 14, 14)


@pytest.mark.parametrize("kwargs,match", [
    (dict(filters=4, ksize=0), "kernel size must be positive"),
    (dict(filters=4, ksize=3, stride=0), "stride must be positive"),
    (dict(filters=4, ksize=3, stride=-1), "stride must be positive"),
    (dict(filters=4, ksize=3, padding="full"), "unknown padding 'full'"),
    (dict(filters=0, ksize=3), "filters must be positive"),
])
def test_conv2d_rejects_bad_hyper_parameters_naming_the_layer(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        Conv2D(**kwargs, name="stem")
    assert "stem" in str(e.value)


def test_conv2d_rejects_wrong_input_shape_naming_layer_and_shapes():
    x = Input((10,))
    with pytest.raises(ValueError, match=r"conv2d .*4-D input.*\(N, 10\)"):
        Model(x, Conv2D(4, 3)(x))
    x = Input((1, 2, 2))
    with pytest.raises(ValueError, match=r"conv2d .*does not fit"):
        Model(x, Conv2D(4, 5)(x))


KERNEL_CONFIGS = [((1, 1), (1, 1, 1, 1), (1, 1)), ((2, 2), (1, 0, 1, 0), (1, 1)), ((2, 1), (0, 1, 1, 2), (1, 2))]


def _kernel_case(seed, N, stride, pads, dilation, K=4):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((N, 2, 9, 8)), rng.standard_normal((K, 2, 3, 3))
    plan = conv.conv2d_plan((None, 2, 9, 8), w.shape, stride, pads, dilation)
    gy = rng.standard_normal((N,) + plan.out_shape[1:])
    return plan, x, w, gy


def _run_step(plan, x, w, gy):
    """fprop, wgrad, dgrad in a layer's order (wgrad reads fprop's columns, dgrad wgrad's gy rows)."""
    b = np.arange(w.shape[0], dtype=x.dtype)
    y = conv.conv2d_fprop(plan, x, w, b)
    gw = np.ones(w.shape, x.dtype)
    conv.conv2d_wgrad(plan, x, gy, gw, accumulate=True)
    return y, gw - 1, conv.conv2d_dgrad(plan, gy, w)


@pytest.mark.parametrize("stride,pads,dilation", KERNEL_CONFIGS)
@pytest.mark.parametrize("chunk,keep", [(4096, True), (8, True), (8, False), (1, False)])
@pytest.mark.parametrize("K", [4, 6])           # 6: wgrad pads gy with zero rows to 8 (_gemm_rows)
def test_conv2d_kernels_match_the_loop_reference_in_every_block_layout(monkeypatch, stride, pads, dilation,
                                                                        chunk, keep, K):
    # chunk 8: one output row per block, so several blocks; keep False: wgrad builds the columns again
    monkeypatch.setattr(conv, "CHUNK_COLUMNS", chunk)
    monkeypatch.setattr(conv, "KEEP_COLS_BYTES", conv.KEEP_COLS_BYTES if keep else 0)
    plan, x, w, gy = _kernel_case(0, 3, stride, pads, dilation, K)
    y, gw, gx = _run_step(plan, x, w, gy)
    want_gx, want_gw = reference.conv2d_backward(x, w, gy, stride, pads, dilation)
    np.testing.assert_allclose(y, reference.conv2d(x, w, np.arange(K), stride, pads, dilation), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gw, want_gw, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gx, want_gx, rtol=1e-12, atol=1e-12)


def test_conv2d_kept_buffers_serve_only_the_arrays_they_were_made_from():
    stride, pads, dilation = KERNEL_CONFIGS[1]
    plan, x, w, gy = _kernel_case(1, 3, stride, pads, dilation)
    _, x2, _, gy2 = _kernel_case(2, 3, stride, pads, dilation)
    conv.conv2d_fprop(plan, x, w)                     # keeps x's columns
    gw = np.zeros(w.shape)
    conv.conv2d_wgrad(plan, x2, gy, gw, accumulate=False)          # another x: its own columns
    np.testing.assert_allclose(gw, reference.conv2d_backward(x2, w, gy, stride, pads, dilation)[1], rtol=1e-12)
    gx = conv.conv2d_dgrad(plan, gy2, w)                           # another gy than wgrad's
    np.testing.assert_allclose(gx, reference.conv2d_backward(x, w, gy2, stride, pads, dilation)[0], rtol=1e-12)
    # the same x, changed in place after fprop: wgrad differentiates the fprop that ran
    conv.conv2d_fprop(plan, x, w)
    x_then = x.copy()
    x += 1.0
    conv.conv2d_wgrad(plan, x, gy, gw, accumulate=False)
    np.testing.assert_allclose(gw, reference.conv2d_backward(x_then, w, gy, stride, pads, dilation)[1], rtol=1e-12)


def test_conv2d_plan_buffers_follow_the_batch_size_and_dtype():
    stride, pads, dilation = KERNEL_CONFIGS[0]
    plan = None
    for N, dtype in ((3, np.float64), (5, np.float64), (2, np.float32), (3, np.float64)):
        p, x, w, gy = _kernel_case(N, N, stride, pads, dilation)
        plan = plan or p
        x, w, gy = x.astype(dtype), w.astype(dtype), gy.astype(dtype)
        y, gw, gx = _run_step(plan, x, w, gy)
        assert y.dtype == gw.dtype == gx.dtype == dtype and y.shape[0] == gx.shape[0] == N
        want_gx, want_gw = reference.conv2d_backward(x, w, gy, stride, pads, dilation)
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(gx, want_gx, **tol)
        np.testing.assert_allclose(gw, want_gw, **tol)
