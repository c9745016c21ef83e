"""Helpers shared by the GPU kernel families: output buffers, pairs, templated CUDA modules."""
import cupy as cp
import numpy as np

CTYPES = {np.dtype("float32"): "float", np.dtype("float64"): "double"}
ITYPES = {np.dtype("int32"): "int", np.dtype("int64"): "long long", np.dtype("uint8"): "unsigned char"}

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


# The ReLU kernels, defined once for every family (activation, merge, norm, direct).
RELU = cp.ElementwiseKernel("T x", "T y", "y = x > (T)0 ? x : (T)0", "minidl_relu")
RELU_BPROP = cp.ElementwiseKernel("T y, T gy", "T gx", "gx = y > (T)0 ? gy : (T)0", "minidl_relu_bprop")
ADD_RELU = cp.ElementwiseKernel("T a, T b", "T y", "T s = a + b; y = s > (T)0 ? s : (T)0", "minidl_add_relu")

_buffers = {}   # (device, tag, shape, dtype) -> CuPy array
_sm_counts = {}  # device id -> streaming multiprocessors


def sm_count():
    """The current GPU's streaming multiprocessors (132 on an H100 SXM or H200), asked once per GPU."""
    dev = cp.cuda.Device()
    if dev.id not in _sm_counts:
        _sm_counts[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return _sm_counts[dev.id]


def buffer(tag, shape, dtype):
    """A device array allocated once per (device, tag, shape, dtype) and reused: a fixed address."""
    key = (cp.cuda.runtime.getDevice(), tag, tuple(shape), np.dtype(dtype).str)
    a = _buffers.get(key)
    if a is None:
        a = _buffers[key] = cp.empty(shape, dtype=dtype)
    return a


def out_array(out, shape, dtype, what="out"):
    """`out` checked against (shape, dtype), or a new array."""
    shape = tuple(int(s) for s in shape)
    if out is None:
        return cp.empty(shape, dtype=dtype)
    if out.shape != shape or out.dtype != dtype:
        raise ValueError(f"{what} has shape {out.shape} {out.dtype}, expected {shape} {np.dtype(dtype)}")
    return out


def out_arrays(out, specs):
    """Several outputs: `out` is None, the first array, or a tuple with one array (or None) per spec."""
    outs = tuple(out) if isinstance(out, (tuple, list)) else (out,) + (None,) * (len(specs) - 1)
    return tuple(out_array(o, s, d) for o, (s, d) in zip(outs, specs))


class Module:
    """A CUDA source with templated kernels, compiled once, fetched as `mod.get("name<float>")`."""

    def __init__(self, code, names):
        self.code, self.names, self._mod = code, list(names), None

    def get(self, name):
        if self._mod is None:
            self._mod = cp.RawModule(code=self.code, options=("-std=c++14",), name_expressions=self.names)
        return self._mod.get_function(name)
