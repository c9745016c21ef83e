"""Optimizer updates on the GPU: one fused ElementwiseKernel each, in place over the flat buffers.

Weight decay is coupled (d = g + wd p), as in PyTorch. Scalars may be Python numbers or 0-d device
arrays (lr, t on the device let a captured CUDA graph replay with a schedule).
"""
import cupy as cp


def _like(a, p):
    """A 0-d device scalar (the optimizer keeps lr in float64) in p's dtype, as the kernels' T wants."""
    return a.astype(p.dtype) if isinstance(a, cp.ndarray) and a.dtype != p.dtype else a

_sgd = cp.ElementwiseKernel("T g, T lr, T wd", "T p", "p -= lr * (g + wd * p)", "minidl_sgd")
_momentum = cp.ElementwiseKernel(
    "T g, T lr, T mu, T wd, bool nesterov", "T p, T v",
    "T d = g + wd * p; v = mu * v + d; p -= lr * (nesterov ? d + mu * v : v)", "minidl_momentum")
_adam = cp.ElementwiseKernel(
    "T g, T lr, T b1, T b2, T eps, T wd, T t", "T p, T m, T v",
    """
    T d = g + wd * p;
    m = b1 * m + ((T)1 - b1) * d;
    v = b2 * v + ((T)1 - b2) * d * d;
    T bc1 = (T)1 - pow(b1, t), bc2 = (T)1 - pow(b2, t);
    p -= lr * (m / bc1) / (sqrt(v / bc2) + eps);
    """, "minidl_adam")
_rmsprop = cp.ElementwiseKernel(
    "T g, T lr, T rho, T eps, T wd", "T p, T s",
    "T d = g + wd * p; s = rho * s + ((T)1 - rho) * d * d; p -= lr * d / (sqrt(s) + eps)", "minidl_rmsprop")


def sgd_update(p, g, lr, wd=0.0):
    """p -= lr (g + wd p)."""
    _sgd(g, _like(lr, p), wd, p)


def momentum_update(p, g, v, lr, mu, wd=0.0, nesterov=False):
    """v = mu v + d;  p -= lr (d + mu v if nesterov else v),  d = g + wd p."""
    _momentum(g, _like(lr, p), mu, wd, bool(nesterov), p, v)


def adam_update(p, g, m, v, lr, b1, b2, eps, wd, t):
    """m = b1 m + (1-b1) d;  v = b2 v + (1-b2) d²;  p -= lr m̂ / (√v̂ + eps),  t counted from 1."""
    _adam(g, _like(lr, p), b1, b2, eps, wd, _like(t, p), p, m, v)


def rmsprop_update(p, g, s, lr, rho, eps, wd=0.0):
    """s = rho s + (1-rho) d²;  p -= lr d / (√s + eps),  d = g + wd p."""
    _rmsprop(g, _like(lr, p), rho, eps, wd, p, s)
