"""The optimizers' kernels on the CPU: the global gradient norm of clip_norm, and no fused updates.

Every optimizer on the CPU runs its update rule, written once over the array module (optim/<name>.py's
`rule`, through optim/reference.py), so this family lists no FUSED; the GPU's fused kernels
(kernels/gpu/optim.py) are compared with those rules (tests/helpers/optim_rules.py).
"""
from __future__ import annotations

import numpy as np

from ..._types import Array

FUSED: tuple[str, ...] = ()      # the CPU runs every optimizer's rule


def sq_norm(g: Array, lrs: Array) -> Array:
    """Σ g² over the elements where lrs != 0, in float64.   g, lrs (P,) -> 0-d."""
    d = np.where(lrs != 0, g, 0).astype(np.float64)
    return np.asarray(np.dot(d, d))
