"""Initialisers: f(rng, shape, fan_in, fan_out) -> float64 NumPy array, drawn on the host.

Drawing on the host from one seeded NumPy generator makes a model's initial weights identical
on every device.
"""
from __future__ import annotations

import numpy as np

from ._types import Initializer


def zeros(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return np.zeros(shape)


def ones(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return np.ones(shape)


def he_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """N(0, 2/fan_in): keeps activation variance through ReLU layers (He et al., 2015)."""
    return rng.normal(0.0, np.sqrt(2.0 / fan_in), size=shape)


def he_uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    limit = np.sqrt(6.0 / fan_in)
    return rng.uniform(-limit, limit, size=shape)


def glorot_uniform(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    """U(-a, a), a = sqrt(6/(fan_in+fan_out)) (Glorot and Bengio, 2010)."""
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape)


def glorot_normal(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int, fan_out: int) -> np.ndarray:
    return rng.normal(0.0, np.sqrt(2.0 / (fan_in + fan_out)), size=shape)


_NAMES = ("zeros", "ones", "he_normal", "he_uniform", "glorot_uniform", "glorot_normal")


def get(name_or_fn: str | Initializer) -> Initializer:
    """An initializer by name, or the callable itself."""
    if callable(name_or_fn):
        return name_or_fn
    if name_or_fn not in _NAMES:
        raise ValueError(f"unknown initializer {name_or_fn!r}: expected one of {', '.join(_NAMES)}")
    return globals()[name_or_fn]
