"""CPU kernels' fused and overwrite modes: BN + ReLU equals BN then ReLU, accumulate=False overwrites
and True adds, add + ReLU equals add then ReLU; the fused BN + ReLU gradient by central differences."""
import numpy as np
import pytest
from tests.helpers.gradcheck import numeric_grad

from minidl.kernels.cpu import activation, conv, dense, merge, norm

EXACT = dict(rtol=1e-12, atol=1e-12)


def _bn_inputs(rng, shape):
    C = shape[1]
    x = 2 * rng.standard_normal(shape) + 0.5
    return x, rng.uniform(0.5, 2, C), rng.standard_normal(C), 0.1 * rng.standard_normal(C), rng.uniform(0.5, 2, C)


@pytest.mark.parametrize("shape", [(4, 3, 5, 5), (8, 16, 2, 2), (32, 10, 1, 1)])
def test_bn_relu_fprop_equals_bn_then_relu(shape):
    rng = np.random.default_rng(0)
    x, gamma, beta, rm, rv = _bn_inputs(rng, shape)
    rm1, rv1, rm2, rv2 = rm.copy(), rv.copy(), rm.copy(), rv.copy()
    y, mean, invstd = norm.bn_fprop_train(x, gamma, beta, rm1, rv1, 0.1, 1e-5)
    yr, mr, ir = norm.bn_fprop_train(x, gamma, beta, rm2, rv2, 0.1, 1e-5, relu=True)
    np.testing.assert_allclose(yr, activation.relu_fprop(y), **EXACT)
    for got, want in ((mr, mean), (ir, invstd), (rm2, rm1), (rv2, rv1)):
        np.testing.assert_allclose(got, want, **EXACT)
    out = np.empty_like(x)
    assert norm.bn_fprop_train(x, gamma, beta, rm2, rv2, 0.1, 1e-5, out=out, relu=True)[0] is out
    yi = norm.bn_fprop_infer(x, gamma, beta, rm, rv, 1e-5, relu=True)
    np.testing.assert_allclose(yi, activation.relu_fprop(norm.bn_fprop_infer(x, gamma, beta, rm, rv, 1e-5)), **EXACT)


@pytest.mark.parametrize("accumulate", [True, False])
def test_bn_relu_bprop_equals_relu_bprop_then_bn_bprop(accumulate):
    rng = np.random.default_rng(1)
    shape = (4, 3, 5, 5)
    x, gamma, beta, rm, rv = _bn_inputs(rng, shape)
    y, mean, invstd = norm.bn_fprop_train(x, gamma, beta, rm, rv, 0.1, 1e-5, relu=True)
    gy, g0 = rng.standard_normal(shape), rng.standard_normal((2, 3))
    gg1, gb1 = g0.copy()
    want = norm.bn_bprop(x, activation.relu_bprop(y, gy), gamma, mean, invstd, gg1, gb1)
    gg2, gb2 = g0.copy() if accumulate else np.full((2, 3), np.nan)
    got = norm.bn_bprop(x, gy, gamma, mean, invstd, gg2, gb2, y=y, relu=True, accumulate=accumulate)
    np.testing.assert_allclose(got, want, **EXACT)
    offset = 0 if accumulate else g0                 # overwriting drops what the gradients held
    np.testing.assert_allclose(np.stack([gg2, gb2]), np.stack([gg1, gb1]) - offset, **EXACT)
    with pytest.raises(ValueError, match="needs y"):
        norm.bn_bprop(x, gy, gamma, mean, invstd, gg2, gb2, relu=True)


def _overwrite_then_add(fn, grad_shape, rng):
    """fn(g, accumulate) fills g; returns (g after overwrite of garbage, g after adding to g0, g0)."""
    g = np.full(grad_shape, np.nan)
    fn(g, False)
    g0 = rng.standard_normal(grad_shape)
    ga = g0.copy()
    fn(ga, True)
    return g, ga, g0


def test_param_gradients_overwrite_or_add():
    rng = np.random.default_rng(2)
    plan = conv.conv2d_plan((None, 3, 6, 6), (4, 3, 3, 3), (1, 1), 1, (1, 1))
    x, gy = rng.standard_normal((2, 3, 6, 6)), rng.standard_normal((2, 4, 6, 6))
    xd, gyd = rng.standard_normal((5, 7)), rng.standard_normal((5, 4))
    bx, bgy = rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((2, 3, 4, 4))
    cases = [
        (lambda g, a: conv.conv2d_wgrad(plan, x, gy, g, accumulate=a), (4, 3, 3, 3)),
        (lambda g, a: dense.dense_wgrad(xd, gyd, g, accumulate=a), (4, 7)),
        (lambda g, a: dense.bias_grad(gy, g, accumulate=a), (4,)),
        (lambda g, a: norm.bn_bprop(bx, bgy, np.ones(3), np.zeros(3), np.ones(3), g[0], g[1], accumulate=a), (2, 3)),
    ]
    for fn, shape in cases:
        g, ga, g0 = _overwrite_then_add(fn, shape, rng)
        want = np.zeros(shape)
        fn(want, True)                           # the default adds: into zeros, the gradient itself
        np.testing.assert_allclose(g, want, **EXACT)
        np.testing.assert_allclose(ga, g0 + want, **EXACT)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_add_relu_equals_add_then_relu(n):
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, 3, 4)) for _ in range(n)]
    want = activation.relu_fprop(sum(xs))
    np.testing.assert_allclose(merge.add_fprop(xs, relu=True), want, **EXACT)
    out = np.empty_like(xs[0])
    assert merge.add_fprop(xs, out=out, relu=True) is out
    np.testing.assert_allclose(out, want, **EXACT)
    np.testing.assert_allclose(merge.add_fprop(xs), sum(xs), **EXACT)
    alias = [x.copy() for x in xs]
    assert merge.add_fprop(alias, out=alias[-1], relu=True) is alias[-1]   # in place into an input
    np.testing.assert_allclose(alias[-1], want, **EXACT)


def test_bn_relu_gradient_matches_central_differences():
    rng = np.random.default_rng(4)
    shape = (3, 2, 3, 2)
    x, gamma, beta, _, _ = _bn_inputs(rng, shape)
    r = rng.standard_normal(shape)

    def f():
        y, _, _ = norm.bn_fprop_train(x, gamma, beta, np.zeros(2), np.ones(2), 0.1, 1e-5, relu=True)
        return float((r * y).sum())

    # Away from the kink: no normalised output within 0.01 of zero (a step h = 1e-6 never crosses it).
    y, mean, invstd = norm.bn_fprop_train(x, gamma, beta, np.zeros(2), np.ones(2), 0.1, 1e-5, relu=True)
    pre = (x - mean[:, None, None]) * (gamma * invstd)[:, None, None] + beta[:, None, None]
    assert np.abs(pre).min() > 0.01 and (y > 0).any() and (y == 0).any()
    ggamma, gbeta = np.zeros(2), np.zeros(2)
    gx = norm.bn_bprop(x, r, gamma, mean, invstd, ggamma, gbeta, y=y, relu=True, accumulate=False)
    nx, ngamma, nbeta = (numeric_grad(f, a, eps=1e-6) for a in (x, gamma, beta))
    for got, want in ((gx, nx), (ggamma, ngamma), (gbeta, nbeta)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
