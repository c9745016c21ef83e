"""Dense chains and their elementwise epilogues on the GPU, for the inference schedule.

`mlp_fprop` runs a chain of dense layers as the chain kernel (chain.py) at small N, else as cuBLAS
GEMMs (FP32) each followed by one bias(+ReLU) kernel (`bias_act_fprop`); `add_relu_fprop` is the
merge family's one-kernel add + ReLU. The NumPy reference is minidl/kernels/cpu/mlp.py.
"""
from __future__ import annotations

from collections.abc import Sequence

import cupy as cp
import numpy as np

from ..._types import Array
from ..shapes import supported_chain
from ._cublas import gemm
from ._util import RELU, out_array
from .chain import chain_fprop
from .merge import add_fprop

MLP_CHAIN_MAX = 256      # batch sizes up to this run a dense chain as the chain kernel; beyond, cuBLAS

_bias_relu = cp.ElementwiseKernel("T y, raw T b, int32 K", "T z", "T v = y + b[i % K]; z = v > (T)0 ? v : (T)0",
                                  "minidl_bias_relu")
_bias = cp.ElementwiseKernel("T y, raw T b, int32 K", "T z", "z = y + b[i % K]", "minidl_bias")


def mlp_fprop(x: Array, ws: Sequence[Array], bs: Sequence[Array | None], relus: Sequence[bool],
              out: Array | None = None) -> Array:
    """A chain of dense layers: h = relu?(h @ w.T + b) for each layer.   x (N, D0) -> (N, DL)."""
    x2 = x.reshape(x.shape[0], -1)                  # (N, D0)
    stages = [("dense", w, b, r) for w, b, r in zip(ws, bs, relus)]
    if x2.shape[0] <= MLP_CHAIN_MAX and supported_chain(x2.shape[1:], stages):
        return chain_fprop(x2, stages, out=out)
    h = x2
    for i, (w, b, relu) in enumerate(zip(ws, bs, relus)):
        y = out_array(out if i == len(ws) - 1 else None, (h.shape[0], w.shape[0]), h.dtype)
        gemm(h, w, y, trans_b=True)
        h = bias_act_fprop(y, b, relu, out=y)
    return h


def bias_act_fprop(y: Array, b: Array | None, relu: bool, out: Array | None = None) -> Array:
    """y + b (b (K,) along the last axis), then max(., 0) if relu; one kernel.   y (N, K) -> (N, K)."""
    z = out_array(out, y.shape, y.dtype)
    if b is not None:
        (_bias_relu if relu else _bias)(y, b, np.int32(b.shape[0]), z)
    elif relu:
        RELU(y, z)
    elif z is not y:
        cp.copyto(z, y)
    return z


def add_relu_fprop(xs: Sequence[Array], out: Array | None = None) -> Array:
    """y = max(sum of xs, 0); one kernel for two inputs.   xs: arrays of one shape -> y of that shape."""
    y = out_array(out, xs[0].shape, xs[0].dtype) if out is not None else None
    return add_fprop(xs, out=y, relu=True)
