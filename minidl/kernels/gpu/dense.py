"""Fully connected layers on the GPU: cuBLAS GEMMs (FP32 math) and a per-channel bias reduction.

float16/bfloat16 arrays (a precision policy's compute dtype) go through cublasGemmEx with FP32
accumulation and the bias sums add in float: only the results are rounded to the half type.

The forward adds the bias in the GEMM's epilogue (cuBLASLt's BIAS, `_cublaslt.matmul`, full FP32 math
as cuBLAS's here: no TF32), one kernel where cuBLAS and an add were two (a training step of LeNet-5 ran
three such adds); y = round(x wᵀ + b) rounds once where the two kernels rounded twice, so the results
agree to float32 rounding. A shape or dtype cuBLASLt does not take (float64) keeps cuBLAS and the add.

The weight gradient accumulates straight into gw (GEMM with beta = 1, or beta = 0 to overwrite): no
temporary, fixed addresses.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array
from . import _cublaslt as _lt
from ._cublas import gemm
from ._dtypes import C_TYPES, ELEMENTWISE
from ._util import HALF_CODE, HALF_CTYPES, REDUCE, Module, channels_last, memory, out_array

# cuBLAS sgemm and dgemm; GemmEx on float16/bfloat16 with float32 accumulation; the bias sum templated
DTYPES = ELEMENTWISE
_TYPES = C_TYPES

_SUM = Module(HALF_CODE + REDUCE + r"""
template<typename T>
__global__ void channel_sum_part(const T* gy, typename Acc<T>::type* part, T* gb, long long N, long long C,
                                 long long S, long long P, int accumulate) {
    // Block (c, p) sums part p of P of channel c's N*S values of gy (N, C, S), in Acc<T> (float for the
    // half types). With P == 1 it adds the sum to gb[c] (or writes it, if not accumulate); else it
    // writes part[c * P + p].
    typedef typename Acc<T>::type A;
    long long c = blockIdx.x, p = blockIdx.y, total = N * S, chunk = (total + P - 1) / P;
    long long end = min(total, (p + 1) * chunk);
    A acc = 0;
    for (long long j = p * chunk + threadIdx.x; j < end; j += blockDim.x)
        acc += (A)gy[((j / S) * C + c) * S + j % S];
    acc = block_sum(acc);
    if (threadIdx.x == 0) {
        if (P > 1) part[c * P + p] = acc;
        else gb[c] = (T)(accumulate ? (A)gb[c] + acc : acc);
    }
}

template<typename T>
__global__ void channel_sum_finish(const typename Acc<T>::type* part, T* gb, long long C, long long P,
                                   int accumulate) {
    // gb[c] (+)= the P partial sums of channel c, added in a fixed order: deterministic
    typedef typename Acc<T>::type A;
    long long c = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (c >= C) return;
    A acc = 0;
    for (long long p = 0; p < P; ++p) acc += part[c * P + p];
    gb[c] = (T)(accumulate ? (A)gb[c] + acc : acc);
}
""", [f"channel_sum_{k}<{t}>" for k in ("part", "finish") for t in _TYPES.values()])
PART = 4096                         # values per block; parts per channel at most MAX_PARTS
MAX_PARTS = 128


_NO_EPILOGUE: set[tuple] = set()     # (x shape, w shape, dtype) cuBLASLt refused: cuBLAS and the add


def dense_fprop(x: Array, w: Array, b: Array | None = None, out: Array | None = None) -> Array:
    """y = x @ w.T + b.   x (N, C), w (K, C), b (K,) -> y (N, K).   The bias in the GEMM's epilogue
    where cuBLASLt takes it (one kernel), else cuBLAS's GEMM and an add."""
    y = out_array(out, (x.shape[0], w.shape[0]), x.dtype)
    if b is not None and _bias_epilogue(x, w, b, y):
        return y
    gemm(x, w, y, trans_b=True)
    if b is not None:
        cp.add(y, b, out=y)
    return y


def _bias_epilogue(x, w, b, y):
    """y = x wᵀ + b as one cuBLASLt matmul with the BIAS epilogue, FP32 math; False (nothing launched)
    where cuBLASLt does not take it."""
    key = (x.shape, w.shape, x.dtype.char)
    if (key in _NO_EPILOGUE or not _lt.takes(x.dtype) or x.ndim != 2 or 0 in x.shape or 0 in w.shape
            or not all(a.dtype == x.dtype and a.flags.c_contiguous for a in (w, b, y))):
        return False
    try:
        _lt.matmul(x, w, y, b, tf32=False)
    except (_lt.Unsupported, _lt.bindings().cuBLASLtError):     # refused before anything was launched
        _NO_EPILOGUE.add(key)
        return False
    return True


def dense_dgrad(gy: Array, w: Array, out: Array | None = None) -> Array:
    """gx = gy @ w.   gy (N, K), w (K, C) -> gx (N, C)."""
    gx = out_array(out, (gy.shape[0], w.shape[1]), gy.dtype)
    return gemm(gy, w, gx)


def dense_wgrad(x: Array, gy: Array, gw: Array, accumulate: bool = True) -> Array:
    """gw += gy.T @ x (gw = ... if not accumulate).   x (N, C), gy (N, K), gw (K, C)."""
    return gemm(gy, x, gw, trans_a=True, beta=1.0 if accumulate else 0.0)


def bias_grad(gy: Array, gb: Array, accumulate: bool = True) -> Array:
    """gb += gy summed over every axis but 1 (gb = ... if not accumulate).   gy (N, K, ...), gb (K,)."""
    if channels_last(gy):                        # a conv's channels-last gy: the (N H W, K) rows of its NHWC view
        gy = memory(gy, True).reshape(-1, gy.shape[1])
    N, K = gy.shape[:2]
    S = gy.size // max(N * K, 1)
    if not gy.flags.c_contiguous:
        raise ValueError("bias_grad: gy must be C-contiguous")
    if gb.dtype != gy.dtype or gb.shape != (K,):
        raise ValueError(f"bias_grad: gb must be ({K},) {gy.dtype}, got {gb.shape} {gb.dtype}")
    t = _TYPES[gy.dtype]
    P = int(min(MAX_PARTS, max(1, -(-N * S // PART))))   # few channels, many values: split each
    # the partial sums stay in the accumulation type (float for the half types)
    part = cp.empty((K * P,), np.float32 if gy.dtype in HALF_CTYPES else gy.dtype) if P > 1 else gb
    _SUM.get(f"channel_sum_part<{t}>")((K, P), (256,), (gy, part, gb, np.int64(N), np.int64(K), np.int64(S),
                                                        np.int64(P), np.int32(accumulate)))
    if P > 1:
        _SUM.get(f"channel_sum_finish<{t}>")((-(-K // 128),), (128,), (part, gb, np.int64(K), np.int64(P),
                                                                        np.int32(accumulate)))
    return gb
