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
