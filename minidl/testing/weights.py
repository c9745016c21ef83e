"""Weights that exercise every parameter of a model (not a fresh model's zero biases and BN ones and
zeros): what a test of an inference path, a fusion or an export needs, so a wrong BatchNorm fold or a
dropped bias changes the output."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ..graph.model import Model


def randomize_weights(model: Model, seed: int = 0) -> Model:
    """Non-trivial BN statistics, gamma, beta and biases on a freshly initialised minidl model; returns it."""
    rng = np.random.default_rng(seed)
    w = model.get_weights()
    draw = {"gamma": lambda n: rng.uniform(0.5, 1.5, n), "beta": lambda n: rng.normal(0, 0.2, n),
            "running_mean": lambda n: rng.normal(0, 0.2, n), "running_var": lambda n: rng.uniform(0.5, 2.0, n),
            "b": lambda n: rng.normal(0, 0.1, n)}
    for k, v in w.items():
        f = draw.get(k.rsplit("/", 1)[1])
        if f is not None:
            w[k] = np.asarray(f(v.shape), dtype=v.dtype)
    model.set_weights(w)
    return model
