"""Optimizer updates on the GPU: one fused ElementwiseKernel each, in place over the flat buffers.

lr and t arrive as float64 (0-d device arrays from the optimizer, or numbers: on the device they
let a captured CUDA graph replay with a schedule) and are rounded to the parameters' type inside
the kernel. Weight decay is coupled (d = g + wd p), as in PyTorch. `ok` (a 0-d device bool, or
True) gates the whole update: where it is False nothing changes, neither the weights nor the
state (the trainer's NaN guard, decided on the device inside a captured step).
"""
import cupy as cp

DTYPES = ("float32", "float64")     # ElementwiseKernels on T; lr and t arrive as float64


_sgd = cp.ElementwiseKernel("T g, float64 lr, T wd, bool ok", "T p", "if (ok) p -= (T)lr * (g + wd * p)", "minidl_sgd")
_momentum = cp.ElementwiseKernel(
    "T g, float64 lr, T mu, T wd, bool nesterov, bool ok", "T p, T v",
    "if (ok) { T d = g + wd * p; v = mu * v + d; p -= (T)lr * (nesterov ? d + mu * v : v); }", "minidl_momentum")
_adam = cp.ElementwiseKernel(
    "T g, float64 lr_, T b1, T b2, T eps, T wd, float64 t_, bool ok", "T p, T m, T v",
    """
    if (!ok) return;
    T lr = (T)lr_, t = (T)t_;
    T d = g + wd * p;
    m = b1 * m + ((T)1 - b1) * d;
    v = b2 * v + ((T)1 - b2) * d * d;
    T bc1 = (T)1 - pow(b1, t), bc2 = (T)1 - pow(b2, t);
    p -= lr * (m / bc1) / (sqrt(v / bc2) + eps);
    """, "minidl_adam")
_rmsprop = cp.ElementwiseKernel(
    "T g, float64 lr, T rho, T eps, T wd, bool ok", "T p, T s",
    "if (ok) { T d = g + wd * p; s = rho * s + ((T)1 - rho) * d * d; p -= (T)lr * d / (sqrt(s) + eps); }",
    "minidl_rmsprop")


def sgd_update(p, g, lr, wd=0.0, ok=True):
    """p -= lr (g + wd p), where the 0-d `ok` holds (else nothing changes)."""
    _sgd(g, lr, wd, ok, p)


def momentum_update(p, g, v, lr, mu, wd=0.0, nesterov=False, ok=True):
    """v = mu v + d;  p -= lr (d + mu v if nesterov else v),  d = g + wd p; where `ok` holds."""
    _momentum(g, lr, mu, wd, bool(nesterov), ok, p, v)


def adam_update(p, g, m, v, lr, b1, b2, eps, wd, t, ok=True):
    """m = b1 m + (1-b1) d;  v = b2 v + (1-b2) d²;  p -= lr m̂ / (√v̂ + eps),  t counted from 1; where `ok` holds."""
    _adam(g, lr, b1, b2, eps, wd, t, ok, p, m, v)


def rmsprop_update(p, g, s, lr, rho, eps, wd=0.0, ok=True):
    """s = rho s + (1-rho) d²;  p -= lr d / (√s + eps),  d = g + wd p; where `ok` holds."""
    _rmsprop(g, lr, rho, eps, wd, ok, p, s)
