"""Fully connected layers on the GPU: cuBLAS GEMMs (FP32 math) and a per-channel bias reduction.

The weight gradient accumulates straight into gw (GEMM with beta = 1, or beta = 0 to overwrite): no
temporary, fixed addresses.
"""
import cupy as cp
import numpy as np

from ._cublas import gemm
from ._util import CTYPES, REDUCE, Module, out_array

DTYPES = ("float32", "float64")     # cuBLAS sgemm and dgemm; the bias sum templated

_SUM = Module(REDUCE + r"""
template<typename T>
__global__ void channel_sum_add(const T* gy, T* gb, long long N, long long C, long long S, int accumulate) {
    // gb[c] += sum of gy[n, c, s] over n and s (gb[c] = ... if not accumulate); one block per channel c
    long long c = blockIdx.x;
    T acc = 0;
    for (long long j = threadIdx.x; j < N * S; j += blockDim.x)
        acc += gy[((j / S) * C + c) * S + j % S];
    acc = block_sum(acc);
    if (threadIdx.x == 0) gb[c] = accumulate ? gb[c] + acc : acc;
}
""", [f"channel_sum_add<{t}>" for t in CTYPES.values()])


def dense_fprop(x, w, b=None, out=None):
    """y = x @ w.T + b.   x (N, C), w (K, C), b (K,) -> y (N, K)."""
    y = out_array(out, (x.shape[0], w.shape[0]), x.dtype)
    gemm(x, w, y, trans_b=True)
    if b is not None:
        cp.add(y, b, out=y)
    return y


def dense_dgrad(gy, w, out=None):
    """gx = gy @ w.   gy (N, K), w (K, C) -> gx (N, C)."""
    gx = out_array(out, (gy.shape[0], w.shape[1]), gy.dtype)
    return gemm(gy, w, gx)


def dense_wgrad(x, gy, gw, accumulate=True):
    """gw += gy.T @ x (gw = ... if not accumulate).   x (N, C), gy (N, K), gw (K, C)."""
    return gemm(gy, x, gw, trans_a=True, beta=1.0 if accumulate else 0.0)


def bias_grad(gy, gb, accumulate=True):
    """gb += gy summed over every axis but 1 (gb = ... if not accumulate).   gy (N, K, ...), gb (K,)."""
    N, K = gy.shape[:2]
    S = gy.size // max(N * K, 1)
    if not gy.flags.c_contiguous:
        raise ValueError("bias_grad: gy must be C-contiguous")
    kern = _SUM.get(f"channel_sum_add<{CTYPES[gy.dtype]}>")
    kern((K,), (256,), (gy, gb, np.int64(N), np.int64(K), np.int64(S), np.int32(accumulate)))
    return gb
