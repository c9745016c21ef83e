"""Vectorised pointwise kernels: add, add + ReLU, ReLU and ReLU's backward over dense arrays of one
float type, 16 bytes a load (8 bfloat16/float16 values or 4 float32 ones a thread and step).

CuPy's ElementwiseKernels index value by value with 2- or 4-byte loads; on the activations of a
ResNet-50 step in bfloat16 they reach a small fraction of the GPU's memory speed. `_util.pointwise`
sends its four kernels here where every array is dense, of one dtype, 16-byte aligned and its size a
multiple of 8. Each value is computed in float and rounded once to nearest even (_cuda.HALF_CODE's
from_f), as CuPy's kernels do.
"""
import numpy as np

from ._cuda import HALF_CODE, Module, sm_count
from ._dtypes import SINGLE_AND_HALF_CTYPES

OPS = {"add": 0, "add_relu": 1, "relu": 2, "relu_bprop": 3}      # relu_bprop(y, gy): gy where y > 0
_TYPES = SINGLE_AND_HALF_CTYPES

_SOURCE = HALF_CODE + r"""
template<typename T, int OP>
__global__ void pointwise_vec(const uint4* a, const uint4* b, uint4* y, long long n16) {
    const int V = 16 / sizeof(T);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16;
         i += (long long)gridDim.x * blockDim.x) {
        uint4 va = a[i], vb = OP == 2 ? va : b[i], vo;
        const T* pa = reinterpret_cast<const T*>(&va);
        const T* pb = reinterpret_cast<const T*>(&vb);
        T* po = reinterpret_cast<T*>(&vo);
#pragma unroll
        for (int k = 0; k < V; ++k) {
            float x = to_f(pa[k]), z = to_f(pb[k]), r;
            if (OP == 0) r = x + z;
            else if (OP == 1) { r = x + z; r = r > 0.f ? r : 0.f; }
            else if (OP == 2) r = x > 0.f ? x : 0.f;
            else r = x > 0.f ? z : 0.f;
            po[k] = OP == 3 ? (x > 0.f ? pb[k] : from_f<T>(0.f)) : from_f<T>(r);
        }
        y[i] = vo;
    }
}
"""
_MOD = Module(_SOURCE, [f"pointwise_vec<{t}, {o}>" for t in _TYPES.values() for o in OPS.values()])


def takes(arrays):
    """Whether the vectorised kernels take these arrays (outputs included): dense, one float dtype,
    16-byte aligned, a multiple of 8 values."""
    a0 = arrays[0]
    return a0.dtype in _TYPES and a0.size % 8 == 0 and a0.size > 0 and all(
        a.dtype == a0.dtype and a.size == a0.size and a._c_contiguous and a.data.ptr % 16 == 0 for a in arrays)


def run(op, args, y):
    """y <- op(*args) (one or two inputs), all arrays as `takes` wants them; returns y."""
    n16 = args[0].nbytes // 16
    threads = 256
    grid = min(-(-n16 // threads), 8 * sm_count())
    a, b = args[0], args[-1]
    _MOD.get(f"pointwise_vec<{_TYPES[a.dtype]}, {OPS[op]}>")((grid,), (threads,), (a, b, y, np.int64(n16)))
    return y
