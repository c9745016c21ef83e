"""Optimizer updates over the flat parameter buffer, in place (NumPy twins of the GPU's fused kernels).

The CPU optimizers do not call these: they run their update rules (optim/<name>.py's `rule`, through
optim/reference.py), and this family declares no FUSED. The functions stay as the NumPy twins the GPU
tests compare the fused kernels with (tests/gpu/test_kernels.py, test_float64.py, test_training_controls.py),
and a float16 arena's reference (tests/test_precision.py); tests/gpu/test_optim_xp.py compares every
registered optimizer's GPU step with its CPU rule.

Every state array is updated through ufuncs with `out=` and never rebound: CUDA-graph replay on
the GPU twin needs fixed addresses, and the CPU reference keeps the same contract. The gradient
`g` is never written to (a trainer may still read it, e.g. for a gradient norm). Weight decay is
coupled, as in torch.optim: g' = g + wd p. `ok` False (the trainer's NaN guard) changes nothing.
`scale` multiplies the gradient first (data-parallel ranks: 1/N turns their summed gradients into
the mean, with no pass of its own); at 1 no multiply happens, so one process rounds as before.

`ctl` (kernels.contract.Controls) makes the step size and the decay per element and clips the
gradient; the elements it freezes (lrs 0) are put back as they were after the update, weights and
state alike, so they stay bit-identical.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from ..._types import Array

FUSED: tuple[str, ...] = ()      # the CPU runs every optimizer's rule

if TYPE_CHECKING:
    from ..contract import Controls


def _decayed(p: Array, g: Array, wd: float, scale: float = 1.0) -> Array:
    """g' = scale g + wd p   (a fresh array; `g` itself when wd == 0 and scale == 1)."""
    if scale != 1.0:
        d = np.multiply(g, scale)
        if wd:
            d += np.multiply(p, wd)
        return d
    if not wd:
        return g
    d = np.multiply(p, wd)
    d += g
    return d


def _prepared(p: Array, g: Array, lr: float, wd: float, scale: float, ctl: Controls | None):
    """(g', lr): the gradient the update reads and its step size, a number or (P,) under `ctl`; a
    decoupled decay is applied to p here, before the update."""
    if ctl is None:
        return _decayed(p, g, wd, scale), lr
    d = np.multiply(g, float(ctl.gmul))
    if ctl.clip:
        np.clip(d, -ctl.clip, ctl.clip, out=d)
    lrs = np.multiply(ctl.lrs, lr)                       # (P,): 0 where frozen
    if ctl.decoupled:
        p -= lrs * ctl.wds * p                           # p <- p - lr wd p (AdamW), before the update
    else:
        d += ctl.wds * p
    return d, lrs


@contextmanager
def _frozen_kept(ctl: Controls | None, *arrays: Array):
    """Put the frozen elements (lrs 0) of `arrays` back as they were once the update is done."""
    if ctl is None:
        yield
        return
    idx = np.flatnonzero(ctl.lrs == 0)
    kept = [a[idx] for a in arrays]
    yield
    for a, k in zip(arrays, kept):
        a[idx] = k


def sq_norm(g: Array, lrs: Array) -> Array:
    """Σ g² over the elements where lrs != 0, in float64.   g, lrs (P,) -> 0-d."""
    d = np.where(lrs != 0, g, 0).astype(np.float64)
    return np.asarray(np.dot(d, d))


def sgd_update(p: Array, g: Array, lr: float | Array, wd: float = 0.0, ok: bool | Array = True,
               scale: float = 1.0, ctl: Controls | None = None) -> None:
    """p -= lr (scale g + wd p).   p, g (P,)."""
    lr = float(lr)                       # a 0-d array from the optimizer: a host number here
    if not ok:                           # the NaN guard: nothing changes
        return
    with _frozen_kept(ctl, p):
        d, lr = _prepared(p, g, lr, wd, scale, ctl)
        step = np.multiply(d, lr, out=None if d is g else d)     # reuse our own g' buffer, never g
        np.subtract(p, step, out=p)


def momentum_update(p: Array, g: Array, v: Array, lr: float | Array, mu: float, wd: float = 0.0, nesterov: bool = False,
                    ok: bool | Array = True, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """v = mu v + g';  p -= lr v, or with Nesterov p -= lr (g' + mu v).   p, g, v (P,)."""
    lr = float(lr)                       # a 0-d array from the optimizer: a host number here
    if not ok:                           # the NaN guard: nothing changes
        return
    with _frozen_kept(ctl, p, v):
        _momentum(p, g, v, lr, mu, wd, nesterov, scale, ctl)


def _momentum(p, g, v, lr, mu, wd, nesterov, scale, ctl):
    d, lr = _prepared(p, g, lr, wd, scale, ctl)
    np.multiply(v, mu, out=v)
    np.add(v, d, out=v)
    step = np.multiply(v, mu) if nesterov else np.multiply(v, lr)
    if nesterov:
        step += d
        step *= lr
    np.subtract(p, step, out=p)


def adam_update(p: Array, g: Array, m: Array, v: Array, lr: float | Array, b1: float, b2: float, eps: float, wd: float,
                t: int | Array, ok: bool | Array = True, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'²;  p -= lr m̂ / (√v̂ + eps), at step t >= 1.   (P,)"""
    lr, t = float(lr), float(t)          # 0-d arrays from the optimizer: host numbers here
    if not ok:                           # the NaN guard: nothing changes
        return
    with _frozen_kept(ctl, p, m, v):
        _adam(p, g, m, v, lr, b1, b2, eps, wd, t, scale, ctl)


def _adam(p, g, m, v, lr, b1, b2, eps, wd, t, scale, ctl):
    d, lr = _prepared(p, g, lr, wd, scale, ctl)
    tmp = np.multiply(d, 1.0 - b1)              # one scratch buffer serves every stage below
    np.multiply(m, b1, out=m)
    np.add(m, tmp, out=m)
    np.square(d, out=tmp)
    tmp *= 1.0 - b2
    np.multiply(v, b2, out=v)
    np.add(v, tmp, out=v)
    # √v̂ = √v / √(1 - b2^t); eps is added after the correction, as torch.optim.Adam does
    np.sqrt(v, out=tmp)
    tmp /= math.sqrt(1.0 - b2 ** t)
    tmp += eps
    np.divide(m, tmp, out=tmp)
    tmp *= lr / (1.0 - b1 ** t)                 # m̂ = m / (1 - b1^t), folded into the step size
    np.subtract(p, tmp, out=p)


def rmsprop_update(p: Array, g: Array, s: Array, lr: float | Array, rho: float, eps: float, wd: float = 0.0,
                   ok: bool | Array = True, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """s = rho s + (1-rho) g'²;  p -= lr g' / (√s + eps).   p, g, s (P,)."""
    lr = float(lr)                       # a 0-d array from the optimizer: a host number here
    if not ok:                           # the NaN guard: nothing changes
        return
    with _frozen_kept(ctl, p, s):
        _rmsprop(p, g, s, lr, rho, eps, wd, scale, ctl)


def _rmsprop(p, g, s, lr, rho, eps, wd, scale, ctl):
    d, lr = _prepared(p, g, lr, wd, scale, ctl)
    tmp = np.square(d)
    tmp *= 1.0 - rho
    np.multiply(s, rho, out=s)
    np.add(s, tmp, out=s)
    np.sqrt(s, out=tmp)
    tmp += eps
    np.divide(d, tmp, out=tmp)
    tmp *= lr
    np.subtract(p, tmp, out=p)
