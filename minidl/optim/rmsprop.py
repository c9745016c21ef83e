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
    slots = ("s",)
    hyper = ("rho", "eps")

    def __init__(self, lr: float = 1e-2, rho: float = 0.99, eps: float = 1e-8, weight_decay: float = 0.0,
                 schedule: ScheduleSpec = None, **controls: Any) -> None:
        super().__init__(lr, weight_decay, schedule, **controls)
        if not (0.0 <= rho < 1.0 and eps >= 0):
            raise ValueError(f"RMSprop: need 0 <= rho < 1 and eps >= 0, got rho={rho}, eps={eps}")
        self.rho, self.eps = float(rho), float(eps)

    def update(self, lr: Array, t: Array, ok: Array | bool) -> None:
        self.kernels.rmsprop_update(self.flat, self.grads, self.state["s"], lr, self.rho, self.eps,
                                    self.weight_decay, ok, scale=self.grad_scale,
                                 ctl=self.ctl)
