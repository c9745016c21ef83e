"""Adam (Kingma & Ba), with coupled weight decay as torch.optim.Adam."""
from __future__ import annotations

from numbers import Real
from typing import TYPE_CHECKING, Any

from .base import Optimizer

if TYPE_CHECKING:
    from .._types import Array
    from .schedules import ScheduleSpec


class Adam(Optimizer):
    """m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'²;  p -= lr m̂ / (√v̂ + eps),  g' = g + wd p.

    The decay rates as b1=, b2= or as torch.optim.Adam's betas=(b1, b2); one of the two spellings.
    `controls`: decoupled_weight_decay, clip_norm, clip_value, groups (Optimizer's).
    """
    name = "adam"
    default_lr = 1e-3
    slots = ("m", "v")
    hyper = ("b1", "b2", "eps")
    fused = "adam_update"

    def __init__(self, lr: float = 1e-3, b1: float | None = None, b2: float | None = None, eps: float = 1e-8,
                 weight_decay: float = 0.0, schedule: ScheduleSpec = None, *,
                 betas: tuple[float, float] | None = None, **controls: Any) -> None:
        super().__init__(lr, weight_decay, schedule, **controls)
        if betas is not None:
            if b1 is not None or b2 is not None:
                raise ValueError("Adam: give betas=(b1, b2) or b1=/b2=, not both")
            if not (isinstance(betas, (tuple, list)) and len(betas) == 2
                    and all(isinstance(b, Real) and not isinstance(b, bool) for b in betas)):
                raise ValueError(f"Adam: betas must be a pair of numbers (b1, b2), got {betas!r}")
            b1, b2 = betas
        b1, b2 = 0.9 if b1 is None else b1, 0.999 if b2 is None else b2
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0 and eps >= 0):
            raise ValueError(f"Adam: need 0 <= b1, b2 < 1 and eps >= 0, got b1={b1}, b2={b2}, eps={eps}")
        self.b1, self.b2, self.eps = float(b1), float(b2), float(eps)

    @property
    def betas(self) -> tuple[float, float]:
        """(b1, b2), as torch.optim.Adam names them."""
        return self.b1, self.b2

    def rule(self, xp: Any, p: Array, g: Array, state: dict[str, Array], lr: Array, t: Array) -> Array:
        b1, b2 = self.b1, self.b2
        m = state["m"] = xp.add(xp.multiply(state["m"], b1), xp.multiply(g, 1.0 - b1))
        v = state["v"] = xp.add(xp.multiply(state["v"], b2), xp.multiply(xp.square(g), 1.0 - b2))
        # m̂ / (√v̂ + eps) with the corrections on the 0-d values: √v̂ = √v / √(1 - b2^t), eps after it (as
        # torch.optim.Adam), 1 / (1 - b1^t) folded into the step size
        denom = xp.add(xp.divide(xp.sqrt(v), xp.sqrt(xp.subtract(1.0, xp.power(b2, t)))), self.eps)
        step_size = xp.divide(lr, xp.subtract(1.0, xp.power(b1, t)))
        return xp.subtract(p, xp.multiply(step_size, xp.divide(m, denom)))

    def fused_update(self, kernel: Any, lr: Array, t: Array, ok: Array | bool) -> None:
        kernel(self.flat, self.grads, self.state["m"], self.state["v"], lr, self.b1, self.b2, self.eps,
               self.weight_decay, t, ok, scale=self.grad_scale, ctl=self.ctl)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW and Keras's AdamW:
    p -= lr_t wd p, then the Adam update of the undecayed gradient. weight_decay 0.01 unless told."""
    name = "adamw"
    decoupled_default = True

    def __init__(self, lr: float = 1e-3, b1: float | None = None, b2: float | None = None, eps: float = 1e-8,
                 weight_decay: float = 0.01, schedule: ScheduleSpec = None, *,
                 betas: tuple[float, float] | None = None, **controls: Any) -> None:
        super().__init__(lr, b1, b2, eps, weight_decay, schedule, betas=betas, **controls)
