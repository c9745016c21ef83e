"""Dynamic loss scaling on the device, for float16 training (Micikevicius et al., 2018).

float16 gradients below 2^-24 flush to zero; multiplying the loss gradient by a scale S keeps
them in range, and dividing the float32 gradients by S afterwards undoes it. S is chosen by the
run itself: a step whose gradients overflow (inf or NaN) is skipped (the optimizer's gate) and S
backs off (x0.5); after `interval` clean steps in a row S grows (x2). State and decisions are 0-d
device arrays changed in place by array operations, so a captured CUDA graph makes them at every
replay and the host reads nothing. A skipped step is routine here, not divergence: only a loss
that is not finite stops training (minidl.training.step).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._types import Array

if TYPE_CHECKING:
    from ..backend import Device
    from ..precision import LossScale


class DynamicLossScale:
    """scale (0-d float32), clean (steps since the last overflow or growth), skipped (steps skipped
    so far): device arrays for one run under `config` (a precision.LossScale)."""

    def __init__(self, device: Device, config: LossScale) -> None:
        self.xp, self.config, self.device = device.xp, config, device
        self.scale = self.xp.empty((), dtype=np.float32)
        self.clean = self.xp.zeros((), dtype=np.int64)
        self.skipped = self.xp.zeros((), dtype=np.int64)
        self.gate = self.xp.empty((), dtype=bool)       # this step's update goes ahead
        device.fill(self.scale, config.init)
        device.fill(self.gate, True)

    def scale_grad(self, gz: Array) -> None:
        """gz *= scale, in place: the loss gradient that starts backward."""
        self.xp.multiply(gz, self.scale, out=gz)

    def unscale(self, grads: Array, live: Array) -> Array:
        """grads *= 1/scale in place, then the decision: returns the gate (a 0-d device bool), True where
        `live` (the run's finite-loss flag) holds and every gradient is finite. On a live step an
        overflow skips it, backs the scale off and restarts the clean count; `interval` clean steps grow it.
        """
        xp, cfg = self.xp, self.config
        xp.multiply(grads, xp.reciprocal(self.scale), out=grads)    # 1/S of a power of two: exact
        ok = xp.all(xp.isfinite(grads))
        xp.logical_and(live, ok, out=self.gate)
        overflow = xp.logical_and(live, xp.logical_not(ok))
        self.skipped += overflow
        # clean + 1 on a clean live step, 0 after an overflow, unchanged once the run has diverged
        self.clean[...] = xp.where(overflow, 0, self.clean + self.gate)
        grow = xp.greater_equal(self.clean, cfg.interval)     # not `>=`: optim/schedules.py
        factor = xp.where(overflow, np.float32(cfg.backoff), xp.where(grow, np.float32(cfg.growth), np.float32(1)))
        xp.multiply(self.scale, factor, out=self.scale)
        self.clean[...] = xp.where(grow, 0, self.clean)
        return self.gate

    def device_arrays(self) -> list[Array]:
        """What a step changes: snapshotted around a capture's warm-up."""
        return [self.scale, self.clean, self.skipped, self.gate]

    def state(self) -> dict[str, float]:
        """{'scale', 'clean', 'skipped'} as host numbers, for checkpoints (one sync)."""
        return {"scale": float(self.scale), "clean": int(self.clean), "skipped": int(self.skipped)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from `state()`'s numbers; a malformed record raises a ValueError naming it."""
        ok = (isinstance(state, dict) and isinstance(state.get("scale"), float) and np.isfinite(state["scale"])
              and state["scale"] > 0 and all(type(state.get(k)) is int and state[k] >= 0 for k in ("clean", "skipped")))
        if not ok:
            raise ValueError(f"loss scale state must be {{'scale': float > 0, 'clean': int, 'skipped': int}}, "
                             f"got {state!r}"[:200])
        for name in ("scale", "clean", "skipped"):
            self.device.fill(getattr(self, name), state[name])
