"""Optimizers over the flat parameter arena, and learning-rate schedules.

The registry is the code: every module of this package is imported here, and each Optimizer subclass
that names itself registers under its name (Optimizer.__init_subclass__). So a new optimizer is one file,
`optim/<name>.py`: optim.get, OPTIMIZERS, the command line's --optimizer choices and its default lr
(`default_lr`) follow, and its class is an attribute of this package (optim.Lion).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from . import schedules
from .base import Optimizer
from .sgd import SGD, Momentum           # first: the registry's order is the command line's
from .adam import Adam, AdamW
from .lion import Lion                    # not needed at run time (the scan below): for type checkers
from .registry import REGISTRY
from .rmsprop import RMSprop

for _m in pkgutil.iter_modules(__path__):              # the optimizers no line above names
    if not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

OPTIMIZERS: dict[str, type[Optimizer]] = REGISTRY     # name -> class; a user's registered subclass too
globals().update({c.__name__: c for c in REGISTRY.values() if c.__module__.startswith(f"{__name__}.")})   # optim.Lion


def get(name: str, **kw: Any) -> Optimizer:
    """The optimizer registered as `name` ("sgd", "momentum", "adam", "adamw", "rmsprop", "lion", ...),
    built with `kw`."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](**kw)


__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamW", "Lion", "RMSprop", "schedules", "get", "OPTIMIZERS"]
__all__ += [c.__name__ for c in REGISTRY.values()
            if c.__module__.startswith(f"{__name__}.") and c.__name__ not in __all__]
