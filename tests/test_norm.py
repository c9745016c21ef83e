import numpy as np
import pytest
from tests.helpers import reference
from tests.helpers.gradcheck import gradcheck

from minidl import Input, Model
from minidl.kernels.cpu import lrn, norm
from minidl.layers.norm import LRN, BatchNorm2D


def _model(layer, shape, dtype="float64"):
    x = Input(shape[1:])
    return Model(x, layer(x), dtype=dtype)


# -- BatchNorm2D ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (7, 2, 1, 1)])
def test_batchnorm_training_forward_matches_loop_reference(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape) * 3 + 1
    layer = BatchNorm2D(eps=1e-3)
    model = _model(layer, shape)
    layer.gamma.data[...] = rng.uniform(0.5, 2, shape[1])
    layer.beta.data[...] = rng.standard_normal(shape[1])
    want, _, _ = reference.batchnorm_train(x, layer.gamma.data, layer.beta.data, 1e-3)
    np.testing.assert_allclose(model.forward(x, training=True), want, rtol=1e-10, atol=1e-12)


def test_batchnorm_eval_forward_uses_running_statistics():
    rng = np.random.default_rng(1)
    shape = (3, 4, 5, 5)
    x = rng.standard_normal(shape)
    layer = BatchNorm2D()
    model = _model(layer, shape)
    for p, v in [(layer.gamma, rng.uniform(0.5, 2, 4)), (layer.beta, rng.standard_normal(4)),
                 (layer.running_mean, rng.standard_normal(4)), (layer.running_var, rng.uniform(0.2, 3, 4))]:
        p.data[...] = v
    state = model.state_flat.copy()
    want = reference.batchnorm_infer(x, layer.gamma.data, layer.beta.data, layer.running_mean.data,
                                     layer.running_var.data, 1e-5)
    np.testing.assert_allclose(model.forward(x, training=False), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(model.state_flat, state)       # evaluation leaves the statistics alone


def test_batchnorm_running_statistics_follow_the_momentum_formula_over_three_steps():
    rng = np.random.default_rng(2)
    shape, momentum = (5, 3, 4, 2), 0.3
    layer = BatchNorm2D(momentum=momentum)
    model = _model(layer, shape)
    rm, rv = np.zeros(3), np.ones(3)
    for step in range(3):
        x = rng.standard_normal(shape) * (step + 1) + step
        model.forward(x, training=True)
        batch = x.transpose(1, 0, 2, 3).reshape(3, -1)                  # (C, N*H*W)
        rm = (1 - momentum) * rm + momentum * batch.mean(axis=1)
        rv = (1 - momentum) * rv + momentum * batch.var(axis=1, ddof=1)  # unbiased, as cuDNN and PyTorch
        np.testing.assert_allclose(layer.running_mean.data, rm, rtol=1e-12)
        np.testing.assert_allclose(layer.running_var.data, rv, rtol=1e-12)


# N*H*W of 36, 40 and 8 values per channel: batch statistics are far from degenerate.
@pytest.mark.parametrize("shape", [(4, 3, 3, 3), (2, 2, 4, 5), (8, 3, 1, 1)])
def test_batchnorm_training_backward_matches_finite_differences(shape):
    gradcheck(BatchNorm2D(), [shape], training=True)


@pytest.mark.parametrize("shape", [(2, 3, 3, 3), (3, 2, 1, 4)])
def test_batchnorm_eval_backward_matches_finite_differences(shape):
    # gradcheck moves running_mean to U(-.5, .5) and running_var to U(.5, 1.5): non-trivial statistics.
    layer = BatchNorm2D()
    gradcheck(layer, [shape], training=False)
    assert np.all(layer.running_mean.data != 0) and np.all(layer.running_var.data != 1)


def test_batchnorm_kernels_honour_out():
    rng = np.random.default_rng(3)
    x, gy = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 4, 4))
    g, b, rm, rv = rng.uniform(0.5, 2, 3), rng.standard_normal(3), np.zeros(3), np.ones(3)
    out = np.empty_like(x)
    y, mean, invstd = norm.bn_fprop_train(x, g, b, rm, rv, 0.1, 1e-5, out=out)
    assert y is out and np.allclose(y, norm.bn_fprop_train(x, g, b, rm.copy(), rv.copy(), 0.1, 1e-5)[0])
    assert norm.bn_fprop_infer(x, g, b, rm, rv, 1e-5, out=out) is out
    gg, gb = np.ones(3), np.zeros(3)
    gx = norm.bn_bprop(x, gy, g, mean, invstd, gg, gb, out=out)
    assert gx is out
    np.testing.assert_allclose(gb, gy.sum(axis=(0, 2, 3)))                       # added, not assigned
    xhat = (x - mean[:, None, None]) * invstd[:, None, None]
    np.testing.assert_allclose(gg, 1 + (gy * xhat).sum(axis=(0, 2, 3)))


def test_batchnorm_float32_keeps_dtype():
    x = np.random.default_rng(4).standard_normal((4, 3, 2, 2)).astype(np.float32)
    model = _model(BatchNorm2D(), x.shape, dtype="float32")
    assert model.forward(x, training=True).dtype == np.float32
    assert model.forward(x, training=False).dtype == np.float32


@pytest.mark.parametrize("kwargs,match", [
    (dict(momentum=-0.1), "momentum must be in"), (dict(momentum=1.5), "momentum must be in"),
    (dict(eps=0.0), "eps must be positive"), (dict(eps=-1e-5), "eps must be positive"),
])
def test_batchnorm_rejects_bad_hyper_parameters_naming_the_layer(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        BatchNorm2D(**kwargs, name="bn_stem")
    assert "bn_stem" in str(e.value)


def test_batchnorm_rejects_wrong_rank_and_single_value_batches():
    x = Input((10,))
    with pytest.raises(ValueError, match=r"fbn .*4-D input.*\(N, 10\)"):
        Model(x, BatchNorm2D()(x))
    model = _model(BatchNorm2D(), (1, 3, 1, 1))
    with pytest.raises(ValueError, match=r"fbn .*more than one value per channel"):
        model.forward(np.ones((1, 3, 1, 1)), training=True)
    model.forward(np.ones((1, 3, 1, 1)), training=False)         # evaluation is fine


# -- LRN -----------------------------------------------------------------------------------

@pytest.mark.parametrize("size,C", [(1, 3), (3, 7), (4, 6), (5, 7), (5, 3), (6, 2)])
def test_lrn_forward_matches_loop_reference(size, C):
    rng = np.random.default_rng(size)
    x = rng.standard_normal((2, C, 3, 4)) * 2
    layer = LRN(size, alpha=0.3, beta=0.75, k=1.5)
    want = reference.lrn(x, size, 0.3, 0.75, 1.5)
    np.testing.assert_allclose(_model(layer, x.shape).forward(x), want, rtol=1e-12, atol=1e-12)


def test_lrn_even_window_reaches_further_ahead_as_cudnn():
    # cuDNN, lrnN = 4: channel c sums x^2 over [c - 1, c + 2].
    C, j = 6, 3
    x = np.zeros((1, C, 1, 1))
    x[0, j] = 1.0
    _, scale = lrn.lrn_fprop(x, 4, 4.0, 0.75, 1.0)
    touched = np.flatnonzero(scale[0, :, 0, 0] != 1.0)
    np.testing.assert_array_equal(touched, [j - 2, j - 1, j, j + 1])


@pytest.mark.parametrize("size,shape", [
    (3, (2, 5, 3, 3)), (5, (2, 7, 2, 3)), (4, (2, 6, 3, 2)), (5, (1, 3, 2, 2))])
def test_lrn_backward_matches_finite_differences(size, shape):
    # alpha large enough that the cross-channel term is a sizeable part of the gradient.
    gradcheck(LRN(size, alpha=0.8, beta=0.75, k=1.0), [shape], low=-2.0, high=2.0)


def test_lrn_backward_with_cudnn_defaults():
    gradcheck(LRN(), [(2, 6, 2, 2)], low=-3.0, high=3.0)


def test_lrn_kernels_honour_out():
    rng = np.random.default_rng(5)
    x, gy = rng.standard_normal((2, 5, 3, 3)), rng.standard_normal((2, 5, 3, 3))
    out = np.empty_like(x)
    y, scale = lrn.lrn_fprop(x, 5, 1e-4, 0.75, 2.0, out=out)
    assert y is out
    assert lrn.lrn_bprop(x, y, scale, gy, 5, 1e-4, 0.75, 2.0, out=np.empty_like(x)).shape == x.shape


@pytest.mark.parametrize("kwargs,match", [
    (dict(size=0), "size must be a positive int"), (dict(size=2.5), "size must be a positive int"),
    (dict(alpha=-1e-4), "alpha must be non-negative"), (dict(beta=-0.5), "beta must be non-negative"),
    (dict(k=0.0), "k must be positive"), (dict(k=-2.0), "k must be positive"),
])
def test_lrn_rejects_bad_hyper_parameters_naming_the_layer(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        LRN(**kwargs, name="norm1")
    assert "norm1" in str(e.value)


def test_lrn_rejects_wrong_rank():
    x = Input((4, 5))
    with pytest.raises(ValueError, match=r"lrn .*4-D input.*\(N, 4, 5\)"):
        Model(x, LRN()(x))
