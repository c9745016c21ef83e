"""Softmax and fused softmax cross-entropy on the GPU: one warp per row, no host synchronisation; and a
training step's books of its loss in one launch (`loss_tally`)."""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array
from ._dtypes import FLOAT_DOUBLE
from ._util import CTYPES, ITYPES, REDUCE, Module, buffer, out_array

DTYPES = FLOAT_DOUBLE     # templates compiled for float and double

_CODE = REDUCE + r"""
#define ROW_SETUP                                                   \
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; \
    int lane = threadIdx.x % 32;                                    \
    if (row >= N) return;

template<typename T>
__global__ void softmax_fwd(const T* x, T* y, long long N, int K) {
    ROW_SETUP
    const T* xr = x + row * K; T* yr = y + row * K;
    T m = xr[0];
    for (int k = lane; k < K; k += 32) m = xr[k] > m ? xr[k] : m;
    m = warp_max(m);
    T s = 0;
    for (int k = lane; k < K; k += 32) s += exp(xr[k] - m);
    T inv = (T)1 / warp_sum(s);
    for (int k = lane; k < K; k += 32) yr[k] = exp(xr[k] - m) * inv;
}

template<typename T>
__global__ void softmax_bwd(const T* y, const T* gy, T* gx, long long N, int K) {
    ROW_SETUP
    const T* yr = y + row * K; const T* gr = gy + row * K; T* gxr = gx + row * K;
    T dot = 0;
    for (int k = lane; k < K; k += 32) dot += yr[k] * gr[k];
    dot = warp_sum(dot);
    for (int k = lane; k < K; k += 32) gxr[k] = yr[k] * (gr[k] - dot);
}

// Per row, with label smoothing eps (target q = (1-eps) onehot + eps/K): loss = logsumexp(z) -
// (1-eps) z[label] - eps mean(z); hit = (first argmax == label); gz = (softmax - q) * invN.
template<typename T, typename L>
__global__ void xent(const T* z, const L* labels, T* gz, T* loss, long long* hit, long long N, int K, T invN,
                     T eps) {
    ROW_SETUP
    const T* zr = z + row * K; T* gr = gz + row * K;
    int label = (int)labels[row];
    T m = zr[0]; int arg = 0;
    for (int k = lane; k < K; k += 32) if (zr[k] > m) { m = zr[k]; arg = k; }
    for (int o = 16; o > 0; o >>= 1) {      // max with the lowest index among ties, as argmax
        T om = __shfl_xor_sync(0xffffffff, m, o); int oa = __shfl_xor_sync(0xffffffff, arg, o);
        if (om > m || (om == m && oa < arg)) { m = om; arg = oa; }
    }
    T s = 0, zs = 0;
    for (int k = lane; k < K; k += 32) { s += exp(zr[k] - m); zs += zr[k] - m; }
    s = warp_sum(s);
    zs = warp_sum(zs);
    T inv = (T)1 / s, on = (T)1 - eps, off = eps / (T)K;
    for (int k = lane; k < K; k += 32) gr[k] = (exp(zr[k] - m) * inv - off - (k == label ? on : (T)0)) * invN;
    if (lane == 0) {
        T zl = zr[label] - m;
        loss[row] = log(s) - zl + eps * (zl - zs / (T)K);
        hit[row] = arg == label;
    }
}

// One block: the totals of xent's per-row results (no CUB temporaries, so CUDA-graph safe).
template<typename T>
__global__ void xent_total(const T* loss, const long long* hit, T* loss_sum, long long* correct, long long N) {
    T l = 0; long long h = 0;
    for (long long j = threadIdx.x; j < N; j += blockDim.x) { l += loss[j]; h += hit[j]; }
    l = block_sum(l);
    __syncthreads();
    h = block_sum(h);
    if (threadIdx.x == 0) { *loss_sum = l; *correct = h; }
}

// A training step's books after its loss, one thread (training/step.py): CuPy's isfinite, logical_and
// and three in-place adds (a launch each, in a step of LeNet-5's size as long as their work) in one
// launch, each the same arithmetic: the float64 sum adds the loss widened to double, the counts add
// 0 or 1 and the hits as int64. `count` 0: the steps are counted by the caller (after the ranks' AND).
template<typename T>
__global__ void loss_tally(const T* loss, const long long* hits, bool* finite, long long* steps,
                           double* loss_total, long long* correct_total, int count) {
    T l = *loss;
    bool ok = *finite && isfinite(l);
    *finite = ok;
    if (count) *steps += (long long)ok;
    *loss_total += (double)l;
    *correct_total += *hits;
}
"""
_NAMES = [f"softmax_fwd<{t}>" for t in CTYPES.values()] + [f"softmax_bwd<{t}>" for t in CTYPES.values()] + \
    [f"xent<{t}, {i}>" for t in CTYPES.values() for i in ITYPES.values()] + \
    [f"xent_total<{t}>" for t in CTYPES.values()] + [f"loss_tally<{t}>" for t in CTYPES.values()]
_MOD = Module(_CODE, _NAMES)
_ROWS = 8                                       # rows (warps) per block of 256 threads


def _launch(name, N, args):
    _MOD.get(name)(((N + _ROWS - 1) // _ROWS,), (32 * _ROWS,), args)


def softmax_fprop(x: Array, out: Array | None = None) -> Array:
    """y = exp(x - max) / sum exp(x - max) over axis 1.   x (N, K) -> y (N, K)."""
    N, K = x.shape
    y = out_array(out, x.shape, x.dtype)
    _launch(f"softmax_fwd<{CTYPES[x.dtype]}>", N, (x, y, np.int64(N), np.int32(K)))
    return y


def softmax_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = y (gy - sum(gy y)) per row.   y, gy (N, K) -> gx (N, K)."""
    N, K = y.shape
    gx = out_array(out, y.shape, y.dtype)
    _launch(f"softmax_bwd<{CTYPES[y.dtype]}>", N, (y, gy, gx, np.int64(N), np.int32(K)))
    return gx


def softmax_xent(z: Array, labels: Array, gz: Array | None = None,
                 smoothing: float = 0.0) -> tuple[Array, Array, Array]:
    """Fused cross-entropy from logits.  z (N, K), labels (N,) ints -> (loss_sum, correct, gz).

    loss_sum (z's dtype) and correct (int64) are 0-d device arrays kept per (N, K, dtype): the next
    call of the same shape overwrites them, so add them into the running totals before then.
    gz = (softmax(z) - q) / N with the target q = (1 - smoothing) onehot(labels) + smoothing / K.
    """
    N, K = z.shape
    if not (z.flags.c_contiguous and labels.flags.c_contiguous):
        raise ValueError("softmax_xent: z and labels must be C-contiguous")
    gz = out_array(gz, z.shape, z.dtype, "gz")
    loss_rows, hit_rows = cp.empty((N,), z.dtype), cp.empty((N,), np.int64)
    loss_sum = buffer(f"xent_loss_sum_{N}_{K}", (), z.dtype)
    correct = buffer(f"xent_correct_{N}_{K}", (), np.int64)
    name = f"xent<{CTYPES[z.dtype]}, {ITYPES[labels.dtype]}>"
    _launch(name, N, (z, labels, gz, loss_rows, hit_rows, np.int64(N), np.int32(K), z.dtype.type(1.0 / N),
                          z.dtype.type(smoothing)))
    _MOD.get(f"xent_total<{CTYPES[z.dtype]}>")((1,), (256,), (loss_rows, hit_rows, loss_sum, correct, np.int64(N)))
    return loss_sum, correct, gz


def loss_tally(loss_sum: Array, correct: Array, finite: Array, steps: Array | None, loss_total: Array,
               correct_total: Array) -> None:
    """A training step's books, in place on 0-d device arrays, in one launch (no host sync, no allocation:
    a captured step records it): finite &= isfinite(loss_sum); steps += finite (None: the caller counts);
    loss_total (float64) += loss_sum; correct_total (int64) += correct. Other dtypes (a user's Loss) take
    CuPy's operations, the same arithmetic one launch each."""
    arrays = (loss_sum, correct, finite, loss_total, correct_total) + (() if steps is None else (steps,))
    fused = (loss_sum.dtype in CTYPES and correct.dtype == np.int64 and finite.dtype == np.bool_
             and loss_total.dtype == np.float64 and correct_total.dtype == np.int64
             and (steps is None or steps.dtype == np.int64) and all(a.size == 1 for a in arrays))
    if not fused:
        cp.logical_and(finite, cp.isfinite(loss_sum), out=finite)
        if steps is not None:
            steps += finite
        loss_total += loss_sum
        correct_total += correct
        return
    count = steps is not None
    _MOD.get(f"loss_tally<{CTYPES[loss_sum.dtype]}>")(
        (1,), (1,), (loss_sum, correct, finite, steps if count else correct_total, loss_total, correct_total,
                     np.int32(count)))
