"""The reference update: an optimizer's `rule`, written once over the array module `xp`, applied to the
flat arena on any device (NumPy on the CPU; CuPy on the GPU, inside a captured step too).

The rule is MLX's `apply_single`: `rule(xp, p, g, state, lr, t) -> new p`, reading the state arrays from
`state` and assigning their new values into it (`state["m"] = ...`), never writing into an array it was
given. What every optimizer shares happens here, around it: the gradient's scale (1/N among N ranks),
coupled weight decay (g + wd p), the training controls (kernels.contract.Controls: per-element lr and
decay, clipping, decoupled decay p - lr wd p before the rule, frozen elements), and the gate `ok` (the
trainer's NaN guard). The new values are then copied into the fixed arrays (p and each state array), in
place and only where `ok` holds and the element is not frozen: a CUDA graph replays the same addresses,
and the update reads nothing back to the host, so a captured step runs it as it is.

Numbers meet arrays through ufuncs here, not operators (`xp.multiply(g, s)`, not `g * s`): CuPy answers
the first `array <op> number` of a process by importing SciPy (optim/schedules.py), which a rule that
runs on the GPU had better avoid too. lr and t arrive in the parameters' dtype, as the fused GPU
kernels read them, so a float32 arena computes in float32.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .._types import Array

if TYPE_CHECKING:
    from ..kernels.contract import Controls

Rule = Callable[[Any, Array, Array, dict[str, Array], Array, Array], Array]   # Optimizer.rule: the new p


def _as(x: Any, dtype: Any) -> Any:
    """A device 0-d array in `dtype` (no host read); a Python number as it is (NumPy and CuPy keep it weak)."""
    return x.astype(dtype) if hasattr(x, "astype") else x


def apply(rule: Rule, xp: Any, p: Array, grads: Array, slots: dict[str, Array], lr: Array, wd: float, t: Array,
          ok: Array | bool, scale: float = 1.0, ctl: Controls | None = None) -> None:
    """One in-place step of `rule` over the flat arena `p` from `grads` and the state arrays `slots`, with
    lr and t (0-d device arrays), where `ok` (True or a 0-d device bool) holds: the arguments of the
    optim family's fused kernels (kernels.contract), wd the coupled decay, scale the gradients' multiplier
    (1/N among N ranks), ctl the training controls or None. Optimizer.update calls it with its own."""
    lr, t = _as(lr, p.dtype), _as(t, p.dtype)
    keep = None if ok is True else ok                   # where the new values are written
    if ctl is None:
        g = grads if scale == 1 else xp.multiply(grads, scale)
        if wd:
            g = xp.add(g, xp.multiply(p, wd))
        p_in = p
    else:
        g = xp.multiply(grads, _as(ctl.gmul, p.dtype))
        if ctl.clip:
            g = xp.clip(g, -ctl.clip, ctl.clip)
        lr = xp.multiply(ctl.lrs, lr)                   # (P,): 0 where frozen
        live = xp.not_equal(ctl.lrs, 0)
        keep = live if keep is None else xp.logical_and(live, keep)
        if ctl.decoupled:                               # p - lr wd p, then the rule on the undecayed g
            p_in = xp.subtract(p, xp.multiply(xp.multiply(lr, ctl.wds), p))
        else:
            g, p_in = xp.add(g, xp.multiply(ctl.wds, p)), p
    state = dict(slots)
    # A step the gate closes (an fp16 overflow) computes on inf/NaN and is not written: NumPy need not warn;
    # a real divergence is the trainer's NaN flag's to report.
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        new_p = rule(xp, p_in, g, state, lr, t)
    for dst, src in [(p, new_p)] + [(slots[k], state[k]) for k in slots]:
        if src is not dst:
            if keep is None:
                xp.copyto(dst, src)
            else:
                xp.copyto(dst, src, where=keep)
