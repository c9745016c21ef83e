"""Optimizers over the flat parameter arena, and learning-rate schedules."""
from __future__ import annotations

from typing import Any

from . import schedules
from .adam import Adam, AdamW
from .base import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD, Momentum

OPTIMIZERS = {"sgd": SGD, "momentum": Momentum, "adam": Adam, "adamw": AdamW, "rmsprop": RMSprop}


def get(name: str, **kw: Any) -> Optimizer:
    """The optimizer called `name` ("sgd", "momentum", "adam", "adamw", "rmsprop"), built with `kw`."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](**kw)


__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "AdamW", "RMSprop", "schedules", "get", "OPTIMIZERS"]
