"""RMSprop (Hinton), uncentred and without momentum, as torch.optim.RMSprop's defaults."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Optimizer

if TYPE_CHECKING:
    from .._types import Array
    from .schedules import ScheduleSpec


class RMSprop(Optimizer):
    """s = rho s + (1-rho) g'²;  p -= lr g' / (√s + eps),  g' = g + wd p."""
    name = "rmsprop"
    default_lr = 1e-3          # the command line's; the constructor's is torch.optim.RMSprop's 1e-2
    slots = ("s",)
    hyper = ("rho", "eps")
    fused = "rmsprop_update"

    def __init__(self, lr: float = 1e-2, rho: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                 schedule: ScheduleSpec = None, **controls: Any) -> None:
        super().__init__(lr, weight_decay, schedule, **controls)
        if not (0.0 <= rho < 1.0 and eps >= 0):
            raise ValueError(f"RMSprop: need 0 <= rho < 1 and eps >= 0, got rho={rho}, eps={eps}")
        self.rho, self.eps = float(rho), float(eps)

    def rule(self, xp: Any, p: Array, g: Array, state: dict[str, Array], lr: Array, t: Array) -> Array:
        s = state["s"] = xp.add(xp.multiply(state["s"], self.rho), xp.multiply(xp.square(g), 1.0 - self.rho))
        return xp.subtract(p, xp.multiply(lr, xp.divide(g, xp.add(xp.sqrt(s), self.eps))))

    def fused_update(self, kernel: Any, lr: Array, t: Array, ok: Array | bool) -> None:
        kernel(self.flat, self.grads, self.state["s"], lr, self.rho, self.eps, self.weight_decay, ok,
               scale=self.grad_scale, ctl=self.ctl)
