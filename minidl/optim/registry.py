"""The optimizers by name: each Optimizer subclass that names itself lands here as its class is defined
(Optimizer.__init_subclass__), so optim.OPTIMIZERS, optim.get and the command line's --optimizer choices
and default lr follow the code, with no table kept by hand."""
from __future__ import annotations

import math
from numbers import Real
from typing import Protocol


class Registered(Protocol):
    """What the registry reads of an optimizer class (optim/base.py's Optimizer declares both): said here,
    so that the registry stands under the base that registers into it."""
    name: str
    default_lr: float | None


REGISTRY: dict[str, type] = {}       # name -> Optimizer subclass (typed as such where read: optim.OPTIMIZERS)


def register(cls: type[Registered]) -> None:
    """Enter `cls` under cls.name; a TypeError names what a registered optimizer lacks or whose the name is."""
    lr = cls.default_lr
    if not (isinstance(lr, Real) and math.isfinite(lr) and lr > 0):
        raise TypeError(f"optimizer {cls.__name__}: a registered optimizer declares default_lr, the command "
                        f"line's learning rate for it (a number > 0), got {lr!r}")
    old = REGISTRY.get(cls.name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(f"optimizer {cls.__name__}: the name {cls.name!r} is {old.__module__}.{old.__qualname__}'s;"
                        f" give another name, or register=False")
    REGISTRY[cls.name] = cls         # the same class defined again (a module reloaded) replaces itself
