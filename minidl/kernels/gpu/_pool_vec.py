"""Vectorised channels-last max pooling: forward and backward, 16 bytes a load (8 bfloat16/float16
channels or 4 float32 ones a thread).

pool.py's ElementwiseKernels take one value a thread: over the NHWC views of a ResNet-50 stem at
batch 1000 that is 2-byte loads and five 64-bit divisions per value, and its max-pool took ten times
the time its bytes need. Here a thread takes V neighbouring channels of one output (forward) or one
input position (backward), so the index arithmetic is paid once per V values and every load is one
uint4. The results are bit for bit pool.py's: each lane keeps the first maximum of its window in
row-major order (a NaN wins only where it comes first), the backward routes a window's gradient to
that first maximum, summed in float over the windows in (oh, ow) order and rounded once.

`pool.py` sends its channels-last max-pools here where `takes` holds.
"""
import numpy as np

from ._cuda import HALF_CODE, Module, sm_count
from ._dtypes import SINGLE_AND_HALF_CTYPES

_TYPES = SINGLE_AND_HALF_CTYPES

_SOURCE = HALF_CODE + r"""
#define GEOMETRY int C16, int H, int W, int oH, int oW, int kH, int kW, int sH, int sW, int pT, int pL
template<typename T>
__global__ void maxpool_cl_vec(const uint4* x, uint4* y, GEOMETRY, long long n) {
    const int V = 16 / sizeof(T);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        int c = i % C16; long long r = i / C16;
        int ow = r % oW; r /= oW;
        int oh = r % oH; long long b = r / oH;
        int h0 = oh * sH - pT, w0 = ow * sW - pL;
        uint4 vm = make_uint4(0, 0, 0, 0);
        T* m = reinterpret_cast<T*>(&vm);
        bool any = false;
        for (int kh = 0; kh < kH; ++kh) {
            int hh = h0 + kh; if (hh < 0 || hh >= H) continue;
            for (int kw = 0; kw < kW; ++kw) {
                int ww = w0 + kw; if (ww < 0 || ww >= W) continue;
                uint4 vv = x[((b * H + hh) * W + ww) * C16 + c];
                const T* v = reinterpret_cast<const T*>(&vv);
#pragma unroll
                for (int k = 0; k < V; ++k)
                    if (!any || to_f(v[k]) > to_f(m[k])) m[k] = v[k];
                any = true;
            }
        }
        y[i] = vm;
    }
}

// gx at input (h, w): the sum of gy over the windows whose first maximum (row-major) is (h, w).
template<typename T>
__global__ void maxpool_cl_vec_bprop(const uint4* x, const uint4* y, const uint4* gy, uint4* gx, GEOMETRY,
                                     long long n) {
    const int V = 16 / sizeof(T);
    typedef typename Acc<T>::type A;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        int c = i % C16; long long r = i / C16;
        int w = r % W; r /= W;
        int h = r % H; long long b = r / H;
        uint4 vx = x[i];
        const T* v = reinterpret_cast<const T*>(&vx);
        A acc[V];
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] = 0;
        int ah = h + pT - kH + 1, aw = w + pL - kW + 1;
        int oh0 = ah > 0 ? (ah + sH - 1) / sH : 0, oh1 = min(oH - 1, (h + pT) / sH);
        int ow0 = aw > 0 ? (aw + sW - 1) / sW : 0, ow1 = min(oW - 1, (w + pL) / sW);
        for (int oh = oh0; oh <= oh1; ++oh) for (int ow = ow0; ow <= ow1; ++ow) {
            long long o = ((b * oH + oh) * oW + ow) * C16 + c;
            uint4 vm = y[o];
            const T* m = reinterpret_cast<const T*>(&vm);
            bool mine[V], some = false;
#pragma unroll
            for (int k = 0; k < V; ++k) { mine[k] = to_f(v[k]) == to_f(m[k]); some |= mine[k]; }
            if (!some) continue;
            // an earlier position of the window holding the maximum takes the gradient instead
            int h0 = oh * sH - pT, w0 = ow * sW - pL;
            for (int hh = max(h0, 0); hh <= h && some; ++hh)
                for (int ww = max(w0, 0); ww < min(w0 + kW, W) && some; ++ww) {
                    if (hh == h && ww == w) break;
                    uint4 vp = x[((b * H + hh) * W + ww) * C16 + c];
                    const T* p = reinterpret_cast<const T*>(&vp);
                    some = false;
#pragma unroll
                    for (int k = 0; k < V; ++k) { mine[k] = mine[k] && to_f(p[k]) != to_f(m[k]); some |= mine[k]; }
                }
            if (!some) continue;
            uint4 vg = gy[o];
            const T* gg = reinterpret_cast<const T*>(&vg);
#pragma unroll
            for (int k = 0; k < V; ++k) if (mine[k]) acc[k] += (A)gg[k];
        }
        uint4 vo;
        T* out = reinterpret_cast<T*>(&vo);
#pragma unroll
        for (int k = 0; k < V; ++k) out[k] = from_f<T>(acc[k]);
        gx[i] = vo;
    }
}
"""
_MOD = Module(_SOURCE, [f"maxpool_cl_vec{s}<{t}>" for t in _TYPES.values() for s in ("", "_bprop")])
_THREADS = 256


def takes(arrays, C):
    """Whether these NHWC views (inputs and outputs) go to the vectorised kernels: one float dtype,
    C a multiple of the values in 16 bytes, each dense and 16-byte aligned."""
    a0 = arrays[0]
    return a0.dtype in _TYPES and C % (16 // a0.itemsize) == 0 and all(
        a.dtype == a0.dtype and a._c_contiguous and a.data.ptr % 16 == 0 for a in arrays)


def _geometry(plan, x):
    """The kernels' int32 geometry for x, an (N, H, W, C) view."""
    H, W, C = x.shape[1:]
    oH, oW = plan.out_shape[2:]
    return tuple(np.int32(v) for v in (C * x.itemsize // 16, H, W, oH, oW, *plan.ksize, *plan.stride, plan.pads[0],
                                       plan.pads[2]))


def _launch(name, dtype, args, n):
    grid = max(1, min(-(-n // _THREADS), 8 * sm_count()))
    _MOD.get(f"{name}<{_TYPES[dtype]}>")((grid,), (_THREADS,), (*args, np.int64(n)))


def maxpool_fprop(plan, x, y):
    """y <- the max over each window; x, y the NHWC views (`takes`). Returns y."""
    _launch("maxpool_cl_vec", x.dtype, (x, y, *_geometry(plan, x)), y.nbytes // 16)
    return y


def maxpool_bprop(plan, x, y, gy, gx):
    """gx <- gy routed to each window's first maximum; NHWC views (`takes`). Returns gx."""
    _launch("maxpool_cl_vec_bprop", x.dtype, (x, y, gy, gx, *_geometry(plan, x)), gx.nbytes // 16)
    return gx
