"""What the CUDA sources of the GPU families share: the 2-byte types, their conversions to and from
float, templated modules compiled once, and the GPU's size. Imports nothing of minidl."""
import cupy as cp
import ml_dtypes
import numpy as np

# The 2-byte types of a precision policy, for RawKernels that read them as float (HALF_CODE's Acc).
HALF_CTYPES = {np.dtype("float16"): "__half", np.dtype(ml_dtypes.bfloat16): "__nv_bfloat16"}

# RawKernels over half types: Acc<T>::type is what a value of T is summed in (float for the 2-byte
# types: their 8- or 11-bit mantissas would lose a sum's low bits), and conversions are explicit,
# because float op __half is ambiguous in CUDA's headers. to_f reads any of the io types as float;
# from_f<T> rounds a float to T to nearest even, bfloat16 by hand as NumPy's ml_dtypes does (CUDA's
# __float2bfloat16_rn flushed a float32 subnormal to zero on the H200), a NaN to a quiet NaN.
HALF_CODE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template<typename T> struct Acc { typedef T type; };
template<> struct Acc<__half> { typedef float type; };
template<> struct Acc<__nv_bfloat16> { typedef float type; };
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ unsigned short bf16_bits(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template<typename T> __device__ __forceinline__ T from_f(float v);
template<> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template<> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template<> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    unsigned short b = bf16_bits(v);
    return *reinterpret_cast<__nv_bfloat16*>(&b);
}
"""

# Compile options of every RawModule: CuPy's default, the same as its ElementwiseKernels'. CuPy
# compiles an empty file once per process and set of options (to fingerprint the compiler for its
# disk cache); one set for all of minidl's kernels keeps that to one compile, 13 ms on an H200, that
# a RawModule with options of its own paid again inside the first training step.
OPTIONS = ()

_sm_counts = {}  # device id -> streaming multiprocessors


def sm_count():
    """The current GPU's streaming multiprocessors (132 on an H100 SXM or H200), asked once per GPU."""
    dev = cp.cuda.Device()
    if dev.id not in _sm_counts:
        _sm_counts[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return _sm_counts[dev.id]


class Module:
    """A CUDA source with templated kernels, fetched as `mod.get("name<float>")`: compiled once with
    all of `names`, or, where names is None, each name on its own when first asked for (a source
    with many instantiations of which a run uses few). CuPy caches the compiled code on disk."""

    def __init__(self, code, names=None):
        self.code, self.names, self._mods = code, None if names is None else list(names), {}

    def get(self, name):
        key = name if self.names is None else None
        if key not in self._mods:
            self._mods[key] = cp.RawModule(code=self.code, options=OPTIONS,
                                           name_expressions=[name] if self.names is None else self.names)
        return self._mods[key].get_function(name)
