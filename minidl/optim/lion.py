"""Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"): the sign of an
interpolated momentum, with decoupled weight decay."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Optimizer

if TYPE_CHECKING:
    from .._types import Array
    from .schedules import ScheduleSpec


class Lion(Optimizer):
    """p -= lr sign(b1 m + (1-b1) g);  m = b2 m + (1-b2) g;  decoupled decay p -= lr wd p first.

    Every step moves each weight by ±lr, so Lion takes a learning rate 3-10x smaller than AdamW's and a
    weight decay as much larger (the paper's advice): lr 3e-4 unless told. One state array, m.
    """
    name = "lion"
    default_lr = 3e-4
    slots = ("m",)
    hyper = ("b1", "b2")
    decoupled_default = True

    def __init__(self, lr: float = 3e-4, b1: float = 0.9, b2: float = 0.99, weight_decay: float = 0.0,
                 schedule: ScheduleSpec = None, **controls: Any) -> None:
        super().__init__(lr, weight_decay, schedule, **controls)
        if not (0.0 <= b1 <= 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"Lion: need 0 <= b1 <= 1 and 0 <= b2 < 1, got b1={b1}, b2={b2}")
        self.b1, self.b2 = float(b1), float(b2)

    def rule(self, xp: Any, p: Array, g: Array, state: dict[str, Array], lr: Array, t: Array) -> Array:
        m = state["m"]
        direction = xp.sign(xp.add(xp.multiply(m, self.b1), xp.multiply(g, 1.0 - self.b1)))
        state["m"] = xp.add(xp.multiply(m, self.b2), xp.multiply(g, 1.0 - self.b2))
        return xp.subtract(p, xp.multiply(lr, direction))
