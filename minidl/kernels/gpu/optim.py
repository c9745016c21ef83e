"""Optimizer updates on the GPU: one fused ElementwiseKernel each, in place over the flat buffers.

They override the optimizers' update rules (optim/<name>.py's `rule`, which CuPy runs for an optimizer
with no kernel here): an optimizer whose `fused` is in FUSED calls its kernel instead, one launch a step.

lr and t arrive as float64 (0-d device arrays from the optimizer, or numbers: on the device they
let a captured CUDA graph replay with a schedule) and are rounded to the parameters' type inside
the kernel. Weight decay is coupled (d = g + wd p), as in PyTorch. `ok` (a 0-d device bool, or
True) gates the whole update: where it is False nothing changes, neither the weights nor the
state (the trainer's NaN guard, decided on the device inside a captured step).

`scale` multiplies the gradient first (data-parallel ranks: 1/N turns their summed gradients into
the mean inside the update, with no pass of its own). Each update is compiled twice from one
source: as written, used when scale is 1, so one process runs the very code it always ran (no
multiply by 1 that could change how the compiler contracts the arithmetic into FMAs), and with
every read of g replaced by (g * scale).

A third twin serves `ctl` (kernels.contract.Controls), from the same source too: it reads the
per-element lr multiplier `lrs` (0: the element is frozen, nothing of it is touched) and decay
`wds`, a gradient multiplier `gmul` (a 0-d device array: grad_scale times the clip-norm factor,
computed on the device) and a clip value; the decay is coupled or, with `dec`, decoupled (p -= lr wd p
first, AdamW). The arrays keep their addresses, so a captured step reads what the optimizer last
wrote into them (a parameter frozen after the capture included).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

import cupy as cp

from ..._types import Array
from ._dtypes import FLOAT_DOUBLE

if TYPE_CHECKING:
    from ..contract import Controls

DTYPES = FLOAT_DOUBLE     # ElementwiseKernels on T; lr and t arrive as float64
FUSED = ("sgd_update", "momentum_update", "adam_update", "rmsprop_update")    # what optimizers call instead of `rule`


def _kernels(params, outs, body, name):
    """(the kernel as written, its twin reading g x scale, its twin under Controls)."""
    scaled = re.sub(r"\bg\b", "(g * scale)", body)
    return (cp.ElementwiseKernel(params, outs, body, name),
            cp.ElementwiseKernel(params + ", T scale", outs, scaled, name + "_scaled"),
            cp.ElementwiseKernel(params + ", T lrs, T wds, float64 gmul, T clip, bool dec", outs,
                                 _controlled(body, "lr_" if "lr_" in params else "lr"), name + "_controlled"))


def _controlled(body, lr):
    """`body` reading the clipped gc = g gmul, the step size lr lrs and the decay wds (0 when decoupled,
    which is applied first), all of it skipped where lrs is 0 (a frozen element)."""
    body = re.sub(r"\bg\b", "gc", body)
    body = re.sub(r"\bwd\b", "(dec ? (T)0 : wds)", body)
    body = re.sub(r"\(T\)" + lr + r"\b", f"((T){lr} * lrs)", body)
    return f"""
    if (lrs != (T)0) {{
        T gc = g * (T)gmul;
        if (clip > (T)0) gc = min(max(gc, -clip), clip);
        if (ok && dec) p -= ((T){lr} * lrs) * wds * p;
        {body};
    }}
    """


def _launch(kernels, scale, ins, outs, ctl=None):
    if ctl is not None:
        kernels[2](*ins, ctl.lrs, ctl.wds, ctl.gmul, ctl.clip, bool(ctl.decoupled), *outs)
    elif scale == 1:
        kernels[0](*ins, *outs)
    else:
        kernels[1](*ins, scale, *outs)


# Σ g² where lrs != 0 (the trainable elements), accumulated in double: clip_norm's global norm
_sq_norm = cp.ReductionKernel("T g, T lrs", "float64 s", "lrs != (T)0 ? (double)g * (double)g : 0.0",
                              "a + b", "s = a", "0", "minidl_masked_sq_sum")


def sq_norm(g: Array, lrs: Array) -> Array:
    """Σ g² over the elements where lrs != 0, a 0-d float64 device array (no host read)."""
    return _sq_norm(g, lrs)


_sgd = _kernels("T g, float64 lr, T wd, bool ok", "T p", "if (ok) p -= (T)lr * (g + wd * p)", "minidl_sgd")
_momentum = _kernels(
    "T g, float64 lr, T mu, T wd, bool nesterov, bool ok", "T p, T v",
    "if (ok) { T d = g + wd * p; v = mu * v + d; p -= (T)lr * (nesterov ? d + mu * v : v); }", "minidl_momentum")
_adam = _kernels(
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
_rmsprop = _kernels(
    "T g, float64 lr, T rho, T eps, T wd, bool ok", "T p, T s",
    "if (ok) { T d = g + wd * p; s = rho * s + ((T)1 - rho) * d * d; p -= (T)lr * d / (sqrt(s) + eps); }",
    "minidl_rmsprop")


def sgd_update(p: Array, g: Array, lr: float | Array, wd: float = 0.0, ok: bool | Array = True,
               scale: float = 1.0, ctl: Controls | None = None) -> None:
    """p -= lr (scale g + wd p), where the 0-d `ok` holds (else nothing changes)."""
    _launch(_sgd, scale, (g, lr, wd, ok), (p,), ctl)


def momentum_update(p: Array, g: Array, v: Array, lr: float | Array, mu: float, wd: float = 0.0, nesterov: bool = False,
                    ok: bool | Array = True, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """v = mu v + d;  p -= lr (d + mu v if nesterov else v),  d = scale g + wd p; where `ok` holds."""
    _launch(_momentum, scale, (g, lr, mu, wd, bool(nesterov), ok), (p, v), ctl)


def adam_update(p: Array, g: Array, m: Array, v: Array, lr: float | Array, b1: float, b2: float, eps: float, wd: float,
                t: int | Array, ok: bool | Array = True, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """m = b1 m + (1-b1) d;  v = b2 v + (1-b2) d²;  p -= lr m̂ / (√v̂ + eps),  d = scale g + wd p, t counted
    from 1; where `ok` holds."""
    _launch(_adam, scale, (g, lr, b1, b2, eps, wd, t, ok), (p, m, v), ctl)


def rmsprop_update(p: Array, g: Array, s: Array, lr: float | Array, rho: float, eps: float, wd: float = 0.0,
                   ok: bool | Array = True, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """s = rho s + (1-rho) d²;  p -= lr d / (√s + eps),  d = scale g + wd p; where `ok` holds."""
    _launch(_rmsprop, scale, (g, lr, rho, eps, wd, ok), (p, s), ctl)
