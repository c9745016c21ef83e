"""Stochastic gradient descent, plain and with (Nesterov) momentum, as torch.optim.SGD."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Optimizer

if TYPE_CHECKING:
    from .._types import Array
    from .schedules import ScheduleSpec


class SGD(Optimizer):
    """p -= lr g';  with momentum mu: v = mu v + g', p -= lr v (Nesterov: p -= lr (g' + mu v));  g' = g + wd p.

    `SGD(lr, momentum=0.9, nesterov=True)` as torch.optim.SGD (without dampening): with momentum > 0
    it keeps the velocity `v` and runs the momentum kernel, as Momentum does; at 0 the plain kernel.
    All but lr are keyword-only: minidl's second positional argument was weight_decay, torch's momentum.
    """
    name = "sgd"
    default_lr = 0.01
    hyper = ("momentum", "nesterov")

    def __init__(self, lr: float, *, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0,
                 schedule: ScheduleSpec = None, **controls: Any) -> None:
        super().__init__(lr, weight_decay, schedule, **controls)
        if isinstance(momentum, bool) or not 0.0 <= momentum < 1.0:
            raise ValueError(f"{type(self).__name__}: momentum must be in [0, 1), got {momentum!r}")
        if nesterov and not momentum:
            raise ValueError(f"{type(self).__name__}: nesterov=True needs a momentum > 0 (as torch.optim.SGD)")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.slots = ("v",) if momentum else ()      # the velocity, only where there is momentum
        self.fused = "momentum_update" if momentum else "sgd_update"

    def rule(self, xp: Any, p: Array, g: Array, state: dict[str, Array], lr: Array, t: Array) -> Array:
        if not self.slots:
            return xp.subtract(p, xp.multiply(lr, g))
        v = state["v"] = xp.add(xp.multiply(state["v"], self.momentum), g)
        step = xp.add(g, xp.multiply(v, self.momentum)) if self.nesterov else v
        return xp.subtract(p, xp.multiply(lr, step))

    def fused_update(self, kernel: Any, lr: Array, t: Array, ok: Array | bool) -> None:
        if self.slots:
            kernel(self.flat, self.grads, self.state["v"], lr, self.momentum, self.weight_decay, self.nesterov, ok,
                   scale=self.grad_scale, ctl=self.ctl)
        else:
            kernel(self.flat, self.grads, lr, self.weight_decay, ok, scale=self.grad_scale, ctl=self.ctl)


class Momentum(SGD):
    """SGD with momentum 0.9 unless told: v = mu v + g';  p -= lr v  (Nesterov: p -= lr (g' + mu v)).

    What optim.get("momentum") and the command line's --optimizer momentum build; its checkpoints name
    it "momentum" and always hold v (momentum 0 included), as before SGD took a momentum.
    """
    name = "momentum"
    default_lr = 0.05

    def __init__(self, lr: float, momentum: float = 0.9, nesterov: bool = False, weight_decay: float = 0.0,
                 schedule: ScheduleSpec = None, **controls: Any) -> None:
        super().__init__(lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, schedule=schedule,
                         **controls)
        self.slots, self.fused = ("v",), "momentum_update"
