"""Convolution at a batch of one or a few: a block per output channel and sample, a GEMV in effect.

At batch 1 a ResNet-50 convolution is a matrix-vector product: each weight is read once and used
for a handful of outputs, so the time is the weights' bytes over memory bandwidth, a microsecond or
two. cuDNN's engines, tiled for batches, take many times that for ResNet-50's layer-3 and -4
convolutions at batch 1 (benchmarks/profile_infer.py). Here a block owns output channel k of sample
n at up to PW output positions: its threads stride over the C*kH*kW products in the weights' memory
order (coalesced reads of the row, U loads in flight a thread; K, kH, kW, C filters over channels-last
x in 16-byte loads of weights and pixels, tap by tap), accumulate in float, and sum across the block (shuffles, then
shared memory); bias and ReLU are applied on the sum.
Any stride and padding, NCHW or channels-last x and y, K, C, kH, kW or K, kH, kW, C weights, float32 /
float16 / bfloat16. conv.py decides when to use it (`SMALL_N`); the CPU's conv2d_fprop is its reference.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..._types import Array
from ._dtypes import SINGLE_AND_HALF_CTYPES
from ._util import HALF_CODE, Module, channels_last, lies_in, out_array

if TYPE_CHECKING:
    import cupy as cp

    from ..shapes import ConvPlan

PW = 8                 # output positions per block at most (registers: one float accumulator each)
_THREADS = 128         # threads per block, splitting the C*kH*kW products

_SOURCE = HALF_CODE + r"""
#define NT %d
#define U 4
// PW positions a block, KH x KW taps: compile-time, so that nothing is computed for positions a block
// does not have and the tap arithmetic divides by constants
// V > 1: K, kH, kW, C filters (a 1x1 one lies so too) over channels-last x, C a multiple of V: at each
// tap the weights and a pixel's channels are both contiguous, read V at a time (16 bytes)
template<typename T, int XCL, int WCL, int YCL, int PW, int KH, int KW, int V>
__global__ void __launch_bounds__(NT, 8) small_conv(const T* __restrict__ x, const T* __restrict__ w,
        const T* __restrict__ b, T* __restrict__ y, int N, int C, int H, int W, int K, int SH,
        int SW, int PT, int PL, int OH, int OW, int has_b, int relu, int chunks)
{
    // block: output channel k of sample n at positions p0 .. p0 + np - 1; threads split the C*KH*KW products
    __shared__ float red[NT / 32][PW];
    const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
    const int chunk = blockIdx.x %% chunks, k = (blockIdx.x / chunks) %% K, n = blockIdx.x / (chunks * K);
    const int p0 = chunk * PW, np = min(PW, OH * OW - p0), KHW = KH * KW, CRS = C * KHW;
    int ih0[PW], iw0[PW];
    float acc[PW];
    #pragma unroll
    for (int q = 0; q < PW; ++q) {
        const int p = p0 + min(q, np - 1);
        ih0[q] = (p / OW) * SH - PT;
        iw0[q] = (p %% OW) * SW - PL;
        acc[q] = 0.f;
    }
    const T* wk = w + (size_t)k * CRS;
    if (V > 1) {
        // K, kH, kW, C weights over channels-last x: at each tap, the C channels of the filter and of the
        // pixel it meets are both contiguous
        const int CV = C / V;
        const uint4* w4 = reinterpret_cast<const uint4*>(wk);
        const uint4* x4 = reinterpret_cast<const uint4*>(x);
        #pragma unroll 2
        for (int r = tid; r < KHW * CV; r += NT) {
            const int ij = KHW == 1 ? 0 : r / CV, rv = r - ij * CV;
            const int i = ij / KW, j = ij - i * KW;
            const uint4 wr = __ldg(w4 + r);
            const T* wt = reinterpret_cast<const T*>(&wr);
            #pragma unroll
            for (int q = 0; q < PW; ++q) {
                const int ih = ih0[q] + i, iw = iw0[q] + j;
                if (q < np && ih >= 0 && ih < H && iw >= 0 && iw < W) {
                    const uint4 xr = __ldg(x4 + (((size_t)n * H + ih) * W + iw) * CV + rv);
                    const T* xt = reinterpret_cast<const T*>(&xr);
                    float sum = 0.f;
                    #pragma unroll
                    for (int e = 0; e < V; ++e) sum += to_f(wt[e]) * to_f(xt[e]);
                    acc[q] += sum;
                }
            }
        }
    } else {
        for (int r0 = tid; r0 < CRS; r0 += NT * U) {
            #pragma unroll
            for (int u = 0; u < U; ++u) {
                const int r = r0 + u * NT;
                const bool ok = r < CRS;
                int c, ij;                               // r walks the weights' row in memory order
                if (WCL) { c = r %% C; ij = r / C; } else { c = r / KHW; ij = r - c * KHW; }
                const int i = ij / KW, j = ij - i * KW;
                bool in[PW];
                bool any = false;
                #pragma unroll
                for (int q = 0; q < PW; ++q) {
                    const int ih = ih0[q] + i, iw = iw0[q] + j;
                    in[q] = ok && q < np && ih >= 0 && ih < H && iw >= 0 && iw < W;
                    any |= in[q];
                }
                const float wv = any ? to_f(__ldg(wk + r)) : 0.f;   // a weight only padding meets is not read
                #pragma unroll
                for (int q = 0; q < PW; ++q) {
                    const int ih = ih0[q] + i, iw = iw0[q] + j;
                    const size_t xi = XCL ? (((size_t)n * H + ih) * W + iw) * C + c
                                          : (((size_t)n * C + c) * H + ih) * W + iw;
                    acc[q] += wv * (in[q] ? to_f(__ldg(x + xi)) : 0.f);
                }
            }
        }
    }
    #pragma unroll
    for (int q = 0; q < PW; ++q) {
        float v = acc[q];
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0) red[wid][q] = v;
    }
    __syncthreads();
    if (tid < np) {
        float v = has_b ? to_f(b[k]) : 0.f;
        #pragma unroll
        for (int u = 0; u < NT / 32; ++u) v += red[u][tid];
        if (relu && v < 0.f) v = 0.f;                // a NaN stays NaN
        const int p = p0 + tid, oy = p / OW, ox = p %% OW;
        const size_t yi = YCL ? (((size_t)n * OH + oy) * OW + ox) * K + k : (((size_t)n * K + k) * OH + oy) * OW + ox;
        y[yi] = from_f<T>(v);
    }
}
""" % _THREADS

_CTYPES = SINGLE_AND_HALF_CTYPES
_MOD = Module(_SOURCE)      # each variant compiled when first used


def supported(plan: ConvPlan, x: Array, w: Array, b: Array | None) -> bool:
    """Whether small_conv2d_fprop takes these arrays (else cuDNN does)."""
    return (x.dtype in _CTYPES and w.dtype == x.dtype and (b is None or b.dtype == x.dtype)
            and tuple(plan.dilation) == (1, 1) and lies_in(x, channels_last(x)) and lies_in(w, channels_last(w))
            and (b is None or b.flags.c_contiguous))


def _positions(P):
    """Output positions a block takes: PW (8) or, for fewer, the next power of two."""
    return next(pw for pw in (1, 2, 4, PW) if P <= pw or pw == PW)


def _vector(x, w):
    """Elements a 16-byte load reads where the vector path applies (channels-last x, K, kH, kW, C filters,
    C a multiple), else 1."""
    V = 16 // x.dtype.itemsize
    ok = (lies_in(x, True) and lies_in(w, True) and x.shape[1] % V == 0
          and x.data.ptr % 16 == 0 and w.data.ptr % 16 == 0)
    return V if ok else 1


def kernel(x: Array, w: Array, cl: bool, P: int) -> cp.RawKernel:
    K, _, KH, KW = w.shape
    name = (f"small_conv<{_CTYPES[x.dtype]}, {int(channels_last(x))}, {int(channels_last(w))}, {int(cl)}, "
            f"{_positions(P)}, {KH}, {KW}, {_vector(x, w)}>")
    return _MOD.get(name)


def small_conv2d_fprop(plan: ConvPlan, x: Array, w: Array, b: Array | None = None, out: Array | None = None,
                       relu: bool = False, cl: bool = False) -> Array:
    """y = conv(x, w) + b (then max(., 0) if relu).  x (N, C, H, W), w (K, C, kH, kW) -> y (N, K, oH, oW),
    channels-last if `cl`; arrays as `supported` says."""
    N, C, H, W = x.shape
    K = w.shape[0]
    OH, OW = plan.out_shape[2:]
    y = out_array(out, (N, K, OH, OW), x.dtype, cl=cl)
    chunks = -(-OH * OW // _positions(OH * OW))
    pt, _, pl, _ = plan.pads
    i32 = np.int32
    kernel(x, w, cl, OH * OW)((N * K * chunks,), (_THREADS,),
                              (x, w, w if b is None else b, y, i32(N), i32(C), i32(H), i32(W), i32(K),
                               i32(plan.stride[0]), i32(plan.stride[1]), i32(pt), i32(pl), i32(OH), i32(OW),
                               i32(b is not None), i32(relu), i32(chunks)))
    return y
