"""A whole small network in ONE kernel on the GPU (LeNet-5 up to batch 256): `chain_fprop`.

Conv stages in shared memory (weights staged transposed, the input zero-padded), then the dense
chain. One block row per sample; the first dense layer's rows are split over G blocks, each of which
recomputes the (cheap) conv stages itself, so no grid-wide barrier is needed; the last block of a
sample to finish (an atomic ticket) runs the remaining dense layers and resets its ticket for the
next launch (CUDA-graph safe). Dense weights arrive by cp.async while the convs run. At batch 1
LeNet-5's whole forward is this one launch. The source is generated per network
(_chain_source.py, on the device functions of _chain_cuda.py); the NumPy reference is
minidl/kernels/cpu/chain.py, `supported_chain` is in minidl/kernels/shapes.py.
"""
from __future__ import annotations

from collections.abc import Sequence

import cupy as cp
import numpy as np

from ..._types import Array
from ..shapes import conv_geometry, pads4, supported_chain
from ._chain_source import CHAIN_THREADS, chain_source
from ._util import check_f32, out_array, raw_kernel, sm_count
from .direct_conv import affine_on_device

_scratch: dict[tuple, tuple[Array, Array]] = {}  # (chain key, N) -> (h1 (N, D1) float32, tickets (N,) uint32)


def _stage_shapes(x_shape, stages):
    """Per-sample output shapes of the stages."""
    shapes, shape = [], tuple(x_shape)
    for st in stages:
        if st[0] == "conv":
            _, w, _, pads, pool, _ = st
            _, (pH, pW) = conv_geometry(shape, w.shape, pads, pool)
            shape = (w.shape[0], pH, pW)
        else:
            shape = (st[1].shape[0],)
        shapes.append(shape)
    return shapes


def chain_blocks(N: int, D1: int, sms: int | None = None) -> int:
    """Blocks per sample G for the chain kernel at batch N: the first dense layer split 8+ rows a block,
    about one block an SM in all (sms: the GPU's SM count, asked of the device when None)."""
    return max(1, min(-(-D1 // 8), (sms or sm_count()) // max(N, 1)))


def _chain_key(x_shape, stages):
    key = [tuple(x_shape)]
    for st in stages:
        if st[0] == "conv":
            _, w, b, pads, pool, relu = st
            key.append(("conv", w.shape, b is not None, pads4(pads), pool, bool(relu)))
        else:
            key.append(("dense", st[1].shape, st[2] is not None, bool(st[3])))
    return tuple(key)


def chain_fprop(x: Array, stages: Sequence[tuple], out: Array | None = None, blocks: int | None = None,
                x_affine: tuple[Array, Array] | None = None) -> Array:
    """conv stages, a flatten and a dense chain in one kernel (see the module docstring).

    x (N, *sample shape) -> y (N, D). stages: ("conv", w, b, pads, pool, relu) then ("dense", w, b, relu)
    tuples (b may be None). blocks: blocks per sample (the first dense layer's split), else chosen.
    x_affine: (a, b) host float32 arrays (C,): the input is staged as a x + b per channel (a
    Normalize), inside the first conv's zero padding.
    """
    check_f32("x", x)
    if not supported_chain(x.shape[1:], stages):
        raise ValueError(f"chain: the stages do not fit the chain kernel for inputs {x.shape[1:]}")
    for st in stages:
        for a in st[1:3]:
            if a is not None:
                check_f32("weights", a)
    N = x.shape[0]
    shapes = _stage_shapes(x.shape[1:], stages)
    D_out = shapes[-1][0]
    y = out_array(out, (N, D_out), x.dtype)
    if N == 0:
        return y
    first = next(i for i, st in enumerate(stages) if st[0] == "dense")
    D1 = shapes[first][0]
    G = max(1, min(int(blocks or chain_blocks(N, D1)), D1))
    R = -(-D1 // G)
    G = -(-D1 // R)
    key = ("chain", _chain_key(x.shape[1:], stages), R, x_affine is not None)
    kern, smem = raw_kernel(key, lambda: chain_source(x.shape[1:], stages, shapes, R, x_affine is not None),
                            "direct_chain")
    h1, tickets = _chain_scratch(key, N, D1)
    args = [x] + ([] if x_affine is None else list(affine_on_device(x_affine)))
    for st in stages:
        args += [st[1], st[1] if st[2] is None else st[2]]
    args += [y, h1, tickets, np.int32(R)]
    kern((G, N), (CHAIN_THREADS,), tuple(args), shared_mem=smem)
    return y


def _chain_scratch(key, N, D1):
    """The first dense layer's outputs and the per-sample tickets: fixed addresses, tickets zeroed once.
    Allocated from CuPy's default pool (not a CUDA graph's private one), outside any capture."""
    s = _scratch.get((key, N))
    if s is None:
        with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            s = _scratch[(key, N)] = (cp.empty((N, D1), dtype=np.float32), cp.zeros((N,), dtype=np.uint32))
    return s

