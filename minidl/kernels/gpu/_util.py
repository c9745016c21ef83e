"""Helpers shared by the GPU kernel families: output buffers, pairs, templated CUDA modules."""
from __future__ import annotations

from typing import Any

import cupy as cp
import numpy as np

from ..._types import Array
from . import _vec
from ._cuda import HALF_CODE, HALF_CTYPES, OPTIONS, Module, Split, sm_count  # noqa: F401  (the families import them from here)
from ._dtypes import CTYPES, ITYPES  # noqa: F401  (the families import them from here)

# Warp and block sums used by the RawKernels; a block has at most 32 warps.
REDUCE = r"""
template<typename T> __device__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}
template<typename T> __device__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) { T u = __shfl_xor_sync(0xffffffff, v, o); v = u > v ? u : v; }
    return v;
}
template<typename T> __device__ T block_sum(T v) {
    __shared__ T part[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = (blockDim.x + 31) / 32;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    v = threadIdx.x < nwarps ? part[threadIdx.x] : (T)0;
    if (warp == 0) v = warp_sum(v);
    return v;                                      // valid in thread 0
}
"""


# The same for ElementwiseKernels, whose T is CuPy's float16 / bfloat16 class (read as float):
# `ACC a = 0; a += (ACC)x;` sums in float, `(T)a` rounds back.
ACC = r"""
template<typename T> struct minidl_acc { typedef T type; };
template<> struct minidl_acc<float16> { typedef float type; };
template<> struct minidl_acc<bfloat16> { typedef float type; };
#define ACC minidl_acc<T>::type
"""

# The ReLU kernels, defined once for every family (activation, merge, norm, direct).
RELU = cp.ElementwiseKernel("T x", "T y", "y = x > (T)0 ? x : (T)0", "minidl_relu")
RELU_BPROP = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = y > (T)0 ? gy : (T)0", "minidl_relu_bprop")
ADD_RELU = cp.ElementwiseKernel("T a, T b", "T y", "T s = a + b; y = s > (T)0 ? s : (T)0", "minidl_add_relu")
_VEC_OPS = {ADD_RELU: "add_relu", RELU: "relu", RELU_BPROP: "relu_bprop", cp.add: "add"}   # pointwise's fast ones

_buffers: dict[tuple, Array] = {}   # (device, tag, shape, dtype) -> CuPy array


def buffer(tag, shape, dtype):
    """A device array allocated once per (device, tag, shape, dtype) and reused: a fixed address."""
    key = (cp.cuda.runtime.getDevice(), tag, tuple(shape), np.dtype(dtype).str)
    a = _buffers.get(key)
    if a is None:
        a = _buffers[key] = cp.empty(shape, dtype=dtype)
    return a


# Channels-last: an (N, C, H, W) array whose values lie in N, H, W, C order (strides of an NHWC
# array seen through transpose(0, 3, 1, 2)). Arrays keep NCHW shapes everywhere; only the memory
# order differs, and each kernel writes its outputs in the order of its input (`channels_last`).
NHWC = (0, 2, 3, 1)          # the axes of an NCHW-shaped array in channels-last memory order


def channels_last(a):
    """Whether a 4-D array lies in channels-last order and not also in NCHW order (C = 1 or
    H = W = 1 lie in both: they count as NCHW, and every kernel takes them either way)."""
    return a.ndim == 4 and not a._c_contiguous and a.transpose(NHWC)._c_contiguous


def lies_in(a, cl):
    """Whether `a` (NCHW shape) lies in channels-last order if `cl`, else in NCHW order (both can hold)."""
    return (a.transpose(NHWC) if cl else a)._c_contiguous


def empty(shape, dtype, cl=False):
    """An uninitialised (N, C, H, W) array, in channels-last order if `cl`."""
    if not cl:
        return cp.empty(shape, dtype=dtype)
    n, c, h, w = shape
    return cp.empty((n, h, w, c), dtype=dtype).transpose(0, 3, 1, 2)


def memory(a, cl):
    """a's values as a C-contiguous array in memory order: the (N, H, W, C) view if `cl`, else a
    itself; copied into that order where `a` does not lie in it (a gradient from a Flatten)."""
    v = a.transpose(NHWC) if cl else a
    return v if v._c_contiguous else cp.ascontiguousarray(v)


def in_order(a, cl):
    """`a` (NCHW shape) lying in channels-last order if `cl`, else in NCHW order: itself or a copy."""
    if lies_in(a, cl):
        return a
    return memory(a, True).transpose(0, 3, 1, 2) if cl else cp.ascontiguousarray(a)


def pointwise(kernel, *args, out=None):
    """kernel(*args[, out]) over arrays of one shape, in the memory order of the first array:
    channels-last arrays run as their NHWC views, since CuPy indexes a strided array value by
    value, several times slower than the same kernel on the views. The results
    come back NCHW-shaped, channels-last. Scalars pass through; `out` must lie in that order.
    ADD_RELU, RELU, RELU_BPROP and cp.add go to _vec's 16-byte kernels where the arrays allow."""
    cl = channels_last(args[0])
    op = _VEC_OPS.get(kernel)
    arrays = args + (() if out is None else (out,))
    if op is not None and all(isinstance(a, cp.ndarray) and a.shape == args[0].shape for a in arrays):
        views = [a.transpose(NHWC) if cl else a for a in arrays]          # the values in memory order
        if _vec.takes(views):
            y = empty(args[0].shape, args[0].dtype, cl) if out is None else out
            _vec.run(op, views[:len(args)], y.transpose(NHWC) if cl else y)
            return y
    if not cl:
        return kernel(*args) if out is None else kernel(*args, out)
    views = [memory(a, True) if isinstance(a, cp.ndarray) and a.ndim == 4 else a for a in args]
    if out is not None:
        views.append(out_array(out, args[0].shape, out.dtype, cl=True).transpose(NHWC))
    y = kernel(*views)
    if out is not None:
        return out
    return tuple(v.transpose(0, 3, 1, 2) for v in y) if isinstance(y, tuple) else y.transpose(0, 3, 1, 2)


def astype(a, dtype):
    """`a` in `dtype` (itself if it is), in a's memory order: a channels-last array is converted on
    its dense NHWC view."""
    if a.dtype == dtype:
        return a
    return memory(a, True).astype(dtype).transpose(0, 3, 1, 2) if channels_last(a) else a.astype(dtype)


def out_array(out, shape, dtype, what="out", cl=False):
    """`out` checked against (shape, dtype, memory order), or a new array (channels-last if `cl`)."""
    shape = tuple(int(s) for s in shape)
    if out is None:
        return empty(shape, dtype, cl)
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"{what} has shape {out.shape} {out.dtype}, expected {shape} {np.dtype(dtype)}")
    if cl and not out.transpose(NHWC)._c_contiguous:
        raise ValueError(f"{what} must lie in channels-last order, got strides {out.strides}")
    return out


def out_arrays(out, specs):
    """Several outputs: `out` is None, the first array, or a tuple with one array (or None) per spec."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,) + (None,) * (len(specs) - 1)
    return tuple(out_array(o, s, d) for o, (s, d) in zip(outs, specs))


# NV consecutive floats of shared memory into registers, as float4 or float2 loads where NV allows
# (p aligned to 4 floats when NV % 4 == 0, to 2 when even): the direct conv and chain kernels' weights.
LOAD_K = r"""
template<int NV>
__device__ __forceinline__ void load_k(float (&r)[NV], const float* p) {
    if (NV % 4 == 0) {
        #pragma unroll
        for (int i = 0; i < NV / 4; ++i) {
            const float4 v = reinterpret_cast<const float4*>(p)[i];
            r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
        }
    } else if (NV % 2 == 0) {
        #pragma unroll
        for (int i = 0; i < NV / 2; ++i) {
            const float2 v = reinterpret_cast<const float2*>(p)[i];
            r[2 * i] = v.x; r[2 * i + 1] = v.y;
        }
    } else {
        #pragma unroll
        for (int i = 0; i < NV; ++i) r[i] = p[i];
    }
}
"""

_F32 = np.dtype(np.float32)
_raw: dict[Any, tuple] = {}        # source key -> (RawKernel, dynamic shared bytes, RawModule kept alive)


def check_f32(name, a, ndim=None):
    """Raise unless `a` is a C-contiguous float32 array (of `ndim` dimensions): what the direct kernels take."""
    if a.dtype != _F32 or not a.flags.c_contiguous or (ndim is not None and a.ndim != ndim):
        raise ValueError(f"direct kernels take C-contiguous float32 arrays{f' of {ndim} dimensions' if ndim else ''}; "
                         f"{name} is {a.shape} {a.dtype}")


def raw_kernel(key, make_source, name):
    """(RawKernel `name`, dynamic shared bytes), compiled once per key from make_source() -> (CUDA source, bytes)."""
    hit = _raw.get(key)
    if hit is None:
        src, smem = make_source()
        mod = cp.RawModule(code=src, options=OPTIONS)
        kern = mod.get_function(name)
        if smem > 48 * 1024:                        # beyond 48 KiB dynamic shared memory is opt-in
            kern.max_dynamic_shared_size_bytes = smem
        hit = _raw[key] = (kern, smem, mod)
    return hit[0], hit[1]


def defines(**kw):
    """`#define NAME value` lines for integer (or bool) template values of a CUDA source."""
    return "".join(f"#define {k} {int(v)}\n" for k, v in kw.items())


def round_up(v, m):
    """v rounded up to a multiple of m."""
    return -(-v // m) * m
