"""A whole small network as one call ("chain"), NumPy reference: conv stages, a flatten, dense stages.

minidl/kernels/gpu/chain.py runs it as ONE CUDA kernel; `supported_chain` says which stages that
kernel takes (shared memory holds one sample's activations and the conv weights; kernels/shapes.py).

`stages` is a list of ("conv", w, b, pads, pool, relu) (pool 1 or 2) and ("dense", w, b, relu)
tuples: the conv stages first, then (after an implicit flatten) one or more dense ones.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..._types import Array
from ..shapes import supported_chain  # noqa: F401  the family's: one definition
from ._util import emit
from .direct_conv import affine, conv2d_bias_relu_fprop, conv2d_bias_relu_maxpool2x2_fprop
from .mlp import mlp_fprop


def chain_fprop(x: Array, stages: Sequence[tuple], out: Array | None = None, blocks: int | None = None,
                x_affine: tuple[Array, Array] | None = None) -> Array:
    """conv stages, a flatten, dense stages (stages: see the module docstring).   x (N, ...) -> (N, D).
    `blocks` (the GPU kernel's grid) is ignored here; x_affine: a Normalize read into the first stage."""
    if x_affine is not None and stages[0][0] != "conv":
        raise ValueError("chain: x_affine needs a conv stage first")
    h = affine(x, x_affine)
    for st in stages:
        if st[0] == "conv":
            _, w, b, pads, pool, relu = st
            f = conv2d_bias_relu_maxpool2x2_fprop if pool == 2 else conv2d_bias_relu_fprop
            h = f(h, w, b, pads, relu)
        else:
            _, w, b, relu = st
            h = mlp_fprop(h, [w], [b], [relu])
    return emit(h, out)
