import numpy as np
import pytest
from tests.helpers import reference
from tests.helpers.gradcheck import gradcheck

from minidl import Input, Model
from minidl.kernels.cpu import pool
from minidl.layers.pool import AvgPool2D, GlobalAvgPool2D, MaxPool2D

CONFIGS = [(2, 2, 0), (3, 2, 1), (3, 1, 1), ((2, 3), (1, 2), 0), (3, 2, "same"), (2, 1, "same"),
           (3, None, "valid")]


def distinct(shape, seed=0):
    """Values in [-1, 1) with no ties (spacing 2/size >> the finite-difference step)."""
    size = int(np.prod(shape))
    return np.random.default_rng(seed).permutation(size).reshape(shape) * (2.0 / size) - 1.0


def run(layer, x):
    node = Input(x.shape[1:])
    model = Model(node, layer(node), dtype="float64")
    return model, model.forward(x)


@pytest.mark.parametrize("ksize,stride,padding", CONFIGS)
@pytest.mark.parametrize("Pool,ref", [(MaxPool2D, reference.maxpool2d), (AvgPool2D, reference.avgpool2d)])
def test_pool_forward_matches_loop_reference(Pool, ref, ksize, stride, padding):
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 8))
    layer = Pool(ksize, stride, padding)
    _, y = run(layer, x)
    want = ref(x, layer.ksize, layer.stride, layer.plan.pads)
    assert layer.plan.out_shape == (None, *want.shape[1:])
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ksize,stride,padding", CONFIGS)
@pytest.mark.parametrize("Pool", [MaxPool2D, AvgPool2D])
@pytest.mark.parametrize("H", [7, 8])
def test_pool_backward_matches_finite_differences(Pool, ksize, stride, padding, H):
    shape = (2, 2, H, 6)
    gradcheck(Pool(ksize, stride, padding), [shape], inputs=[distinct(shape)])


@pytest.mark.parametrize("ksize,stride,padding", CONFIGS)
@pytest.mark.parametrize("H", [7, 8])       # 8: a 2x2 pool's windows tile the input (no zero fill)
def test_maxpool_backward_matches_loop_reference_with_ties(ksize, stride, padding, H):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 3, (2, 3, H, 8)).astype(np.float64)    # many ties inside each window
    plan = pool.pool2d_plan(x.shape, ksize, stride or ksize, padding)
    y = pool.maxpool2d_fprop(plan, x)
    gy = rng.standard_normal(y.shape)
    want = reference.maxpool2d_backward(x, gy, plan.ksize, plan.stride, plan.pads)
    np.testing.assert_allclose(pool.maxpool2d_bprop(plan, x, y, gy), want, rtol=1e-12, atol=1e-12)


def test_maxpool_overlapping_windows_accumulate_into_a_shared_max():
    # 3x3 stride 2 pad 1 (ResNet's stem): x[1, 1] lies in windows (0,0), (0,1), (1,0), (1,1).
    x = np.zeros((1, 1, 5, 5))
    x[0, 0, 1, 1] = 9.0
    plan = pool.pool2d_plan(x.shape, 3, 2, 1)
    y = pool.maxpool2d_fprop(plan, x)
    gy = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    gx = pool.maxpool2d_bprop(plan, x, y, gy)
    assert gx[0, 0, 1, 1] == 1 + 2 + 4 + 5
    # Other windows hold only zeros (ties): each routes to its first real cell, row-major.
    assert (gx[0, 0, 0, 3], gx[0, 0, 1, 3], gx[0, 0, 3, 0], gx[0, 0, 3, 1], gx[0, 0, 3, 3]) == (3, 6, 7, 8, 9)
    assert gx.sum() == gy.sum() and np.count_nonzero(gx) == 6


def test_avgpool_counts_padding_in_the_divisor():
    x = np.ones((1, 1, 2, 2))
    y = pool.avgpool2d_fprop(pool.pool2d_plan(x.shape, 3, 1, 1), x)
    np.testing.assert_allclose(y, np.full((1, 1, 2, 2), 4 / 9))


def test_global_avgpool_forward_and_backward():
    x = np.random.default_rng(3).standard_normal((2, 3, 5, 4))
    layer = GlobalAvgPool2D()
    model, y = run(layer, x)
    assert model.nodes[-1].shape == (None, 3, 1, 1)
    np.testing.assert_allclose(y, reference.global_avgpool(x), rtol=1e-12, atol=1e-12)
    gradcheck(GlobalAvgPool2D(), [(2, 3, 5, 4)])


def test_kernels_keep_float32_and_write_into_out():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    plan = pool.pool2d_plan((None, 3, 6, 6), 3, 2, 1)
    for fprop in (pool.maxpool2d_fprop, pool.avgpool2d_fprop):
        out = np.empty((2, 3, 3, 3), np.float32)
        assert fprop(plan, x, out=out) is out and fprop(plan, x).dtype == np.float32
    y = pool.maxpool2d_fprop(plan, x)
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gx = np.empty_like(x)
    assert pool.maxpool2d_bprop(plan, x, y, gy, out=gx) is gx and gx.dtype == np.float32
    assert pool.avgpool2d_bprop(plan, gy, out=gx) is gx
    g = np.empty((2, 3, 1, 1), np.float32)
    assert pool.global_avgpool_fprop(x, out=g) is g and g.dtype == np.float32
    assert pool.global_avgpool_bprop(g, x.shape, out=gx) is gx and gx.dtype == np.float32


def test_same_padding_gives_ceil_size_and_stride_defaults_to_window():
    assert pool.pool2d_plan((None, 1, 7, 7), 3, 2, "same").out_shape == (None, 1, 4, 4)
    assert pool.pool2d_plan((None, 1, 7, 7), 2, 1, "same").pads == (0, 1, 0, 1)
    assert MaxPool2D(3).stride == (3, 3) and AvgPool2D((2, 3)).stride == (2, 3)


def test_layers_are_named_as_the_seed_printed_them():
    x = Input((1, 8, 8))
    h = AvgPool2D(2)(MaxPool2D(2)(MaxPool2D(1)(x)))
    model = Model(x, GlobalAvgPool2D()(h))
    assert [layer.name for layer in model.layers] == ["pool", "pool_1", "avgpool", "gap"]
    assert model.layers[0].config() == {"ksize": 1, "stride": None, "padding": 0}


@pytest.mark.parametrize("Pool", [MaxPool2D, AvgPool2D])
@pytest.mark.parametrize("kwargs,match", [
    (dict(ksize=0), "kernel size must be positive"),
    (dict(ksize=(2, -1)), "kernel size must be positive"),
    (dict(ksize=2, stride=0), "stride must be positive"),
    (dict(ksize=2, stride=-1), "stride must be positive"),
    (dict(ksize=2, padding="full"), "unknown padding 'full'"),
    (dict(ksize=2, padding=-1), "padding must be non-negative"),
    (dict(ksize=3, padding=2), "more than half the 3x3 window"),
    (dict(ksize=(4, 2), padding=(2, 2)), "more than half the 4x2 window"),
])
def test_pool_rejects_bad_hyper_parameters_naming_the_layer(Pool, kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        Pool(**kwargs, name="stem_pool")
    assert "stem_pool" in str(e.value)


@pytest.mark.parametrize("make,stem", [(lambda: MaxPool2D(2), "pool"), (lambda: AvgPool2D(2), "avgpool"),
                                       (GlobalAvgPool2D, "gap")])
def test_pool_rejects_non_4d_input_naming_layer_and_shape(make, stem):
    x = Input((10,))
    with pytest.raises(ValueError, match=rf"{stem} .*4-D input.*\(N, 10\)"):
        Model(x, make()(x))


@pytest.mark.parametrize("Pool", [MaxPool2D, AvgPool2D])
def test_pool_rejects_a_window_that_does_not_fit(Pool):
    x = Input((1, 2, 2))
    with pytest.raises(ValueError, match=r"pool .*3x3 window does not fit a 2x2 input"):
        Model(x, Pool(3)(x))
    with pytest.raises(ValueError, match="more than half"):
        pool.pool2d_plan((None, 1, 8, 8), 2, 2, 2)
