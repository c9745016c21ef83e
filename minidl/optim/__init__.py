"""Optimizers over the flat parameter arena, and learning-rate schedules."""
from __future__ import annotations

from typing import Any

from . import schedules
from .adam import Adam
from .base import Optimizer
from .rmsprop import RMSprop
from .sgd import SGD, Momentum

OPTIMIZERS = {"sgd": SGD, "momentum": Momentum, "adam": Adam, "rmsprop": RMSprop}


def get(name: str, **kw: Any) -> Optimizer:
    """The optimizer called `name` ("sgd", "momentum", "adam", "rmsprop"), built with `kw`."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](**kw)


__all__ = ["Optimizer", "SGD", "Momentum", "Adam", "RMSprop", "schedules", "get", "OPTIMIZERS"]
