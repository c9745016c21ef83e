"""Casting kernels on the GPU: the compute-dtype copies of the master weights and their gradients
(graph/arena.py), and a reduction's wire dtype (collectives.py).

float32 <-> float16/bfloat16 over whole arenas as vectorised RawKernels (16- and 8-byte loads and
stores), and a channels-last convolution's filters permuted on the way, a block a filter; any other
pair of dtypes, or an array the kernels do not take, falls back to CuPy's copyto (kernels/shapes.py's
`cast_filters` one filter at a time). Rounding is to nearest even, as NumPy's astype.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array
from ..shapes import cast_filters, filter_view  # noqa: F401  (filter_view: the family's, on both sides)
from ._cuda import HALF_CODE, HALF_CTYPES, Module, sm_count

# The compute-dtype weight copies (graph/arena.py), float32 <-> float16/bfloat16 over whole arenas:
# four values a thread through 16- and 8-byte loads and stores (arena lengths are multiples of 64).
# On ResNet-50's parameters these are two to three times faster than CuPy's copyto
# (benchmarks/profile_train.py).
_CAST_SOURCE = HALF_CODE + r"""
template<typename H> __device__ __forceinline__ unsigned short bits(float v);
template<> __device__ __forceinline__ unsigned short bits<__half>(float v) {
    return __half_as_ushort(__float2half_rn(v));
}
template<> __device__ __forceinline__ unsigned short bits<__nv_bfloat16>(float v) { return bf16_bits(v); }

struct __align__(8) half4 { unsigned short v[4]; };

template<typename H>
__global__ void cast_down(const float4* src, H* dst, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        float4 a = src[i];
        half4 o = {{bits<H>(a.x), bits<H>(a.y), bits<H>(a.z), bits<H>(a.w)}};
        reinterpret_cast<half4*>(dst)[i] = o;
    }
}

template<typename H>
__global__ void cast_up_where(const H* src, const uchar4* mask, float* dst, long long n4) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        uchar4 m = mask[i];
        half4 in = reinterpret_cast<const half4*>(src)[i];
        float f[4];
        for (int k = 0; k < 4; ++k) f[k] = to_f(*reinterpret_cast<const H*>(&in.v[k]));
        if (m.x && m.y && m.z && m.w) {
            reinterpret_cast<float4*>(dst)[i] = make_float4(f[0], f[1], f[2], f[3]);
        } else {
            if (m.x) dst[4 * i] = f[0];
            if (m.y) dst[4 * i + 1] = f[1];
            if (m.z) dst[4 * i + 2] = f[2];
            if (m.w) dst[4 * i + 3] = f[3];
        }
    }
}

// Filters permuted on the way (graph/arena.py): a block a filter k, its C x RS values written in order
// and gathered from their place in the other layout (a filter, at most 18 KB, stays in L1 while its
// block reads it RS or C times over). f[3 b .. 3 b + 2] = (offset of block b's filter, C, RS).
template<typename H>
__global__ void cast_down_krsc(const float* src, H* dst, const long long* f) {
    const float* s = src + f[3 * blockIdx.x];
    H* d = dst + f[3 * blockIdx.x];
    int C = (int)f[3 * blockIdx.x + 1], RS = (int)f[3 * blockIdx.x + 2], n = C * RS;
    for (int j = threadIdx.x; j < n; j += blockDim.x) d[j] = from_f<H>(s[(j % C) * RS + j / C]);   // (RS, C)
}

template<typename H>
__global__ void cast_up_kcrs(const H* src, float* dst, const long long* f) {
    const H* s = src + f[3 * blockIdx.x];
    float* d = dst + f[3 * blockIdx.x];
    int C = (int)f[3 * blockIdx.x + 1], RS = (int)f[3 * blockIdx.x + 2], n = C * RS;
    for (int i = threadIdx.x; i < n; i += blockDim.x) d[i] = to_f(s[(i % RS) * C + i / RS]);       // (C, RS)
}
"""
_CAST = Module(_CAST_SOURCE, [f"{k}<{t}>" for k in ("cast_down", "cast_up_where", "cast_down_krsc", "cast_up_kcrs")
                              for t in HALF_CTYPES.values()])
_filters: dict[tuple, Array] = {}       # (device, filters) -> the per-block descriptors on the device


def _cast_launch(n4):
    threads = 256
    return (min(-(-n4 // threads), 8 * sm_count()),), (threads,)


def _vectorizable(*arrays):
    return all(a.ndim == 1 and a._c_contiguous and a.size % 4 == 0 and a.data.ptr % 16 == 0 for a in arrays)


def cast_copy(dst: Array, src: Array) -> None:
    """dst[...] = src rounded to dst's dtype (to nearest even): the compute-dtype copies of the master
    weights.   dst, src (P,)."""
    if src.dtype == np.float32 and dst.dtype in HALF_CTYPES and _vectorizable(dst, src):
        n4 = src.size // 4
        grid, block = _cast_launch(n4)
        _CAST.get(f"cast_down<{HALF_CTYPES[dst.dtype]}>")(grid, block, (src, dst, np.int64(n4)))
    else:
        cp.copyto(dst, src, casting="unsafe")


def cast_copy_where(dst: Array, src: Array, mask: Array) -> None:
    """dst[i] = src[i] as dst's dtype where mask[i]; elsewhere dst is left alone: the copies' gradients
    into the master's gradient arena.   dst, src, mask (P,)."""
    if dst.dtype == np.float32 and src.dtype in HALF_CTYPES and mask.dtype == np.bool_ \
            and _vectorizable(dst, src, mask):
        n4 = src.size // 4
        grid, block = _cast_launch(n4)
        _CAST.get(f"cast_up_where<{HALF_CTYPES[src.dtype]}>")(grid, block, (src, mask, dst, np.int64(n4)))
    else:
        cp.copyto(dst, src, casting="unsafe", where=mask)


def _descriptors(filters):
    """The device array of (offset, C, RS) per filter k of `filters` ((offset, K, C, kH, kW) ranges)."""
    key = (cp.cuda.runtime.getDevice(), filters)
    if key not in _filters:
        rows = [(o + k * C * kh * kw, C, kh * kw) for o, K, C, kh, kw in filters for k in range(K)]
        _filters[key] = cp.asarray(np.array(rows, np.int64).reshape(-1))
    return _filters[key]


def cast_filters_krsc(dst: Array, src: Array, filters: tuple[tuple[int, ...], ...]) -> None:
    """The (K, C, kH, kW) filters at `filters` ((offset, K, C, kH, kW) each, a tuple) of the float32 arena
    `src` into the half arena `dst`, each permuted to K, kH, kW, C within its range.   dst, src (P,)."""
    _cast_filters(dst, src, filters, "cast_down_krsc", dst.dtype, src.dtype, to_krsc=True)


def cast_filters_kcrs(dst: Array, src: Array, filters: tuple[tuple[int, ...], ...]) -> None:
    """The inverse: the half arena's K, kH, kW, C filters at `filters` into the float32 arena `dst` as
    (K, C, kH, kW).   dst, src (P,)."""
    _cast_filters(dst, src, filters, "cast_up_kcrs", src.dtype, dst.dtype, to_krsc=False)


def _cast_filters(dst, src, filters, kernel, half, single, to_krsc):
    """One launch, a block a filter k, where the types fit; else a copy each."""
    if filters and half in HALF_CTYPES and single == np.float32:
        desc = _descriptors(filters)
        _CAST.get(f"{kernel}<{HALF_CTYPES[half]}>")((desc.size // 3,), (256,), (src, dst, desc))
        return
    cast_filters(dst, src, filters, to_krsc, copyto=cp.copyto)
