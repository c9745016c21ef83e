"""Fused inference kernels ("direct" family) on the GPU: hand-written CUDA for small shapes.

The same functions as `minidl/kernels/cpu/direct.py` (the reference, whose docstring lists them):

- `conv2d_bias_relu_maxpool2x2_fprop` / `conv2d_bias_relu_fprop`: a direct (no im2col, no GEMM)
  stride-1 convolution with the bias, ReLU and a 2x2 max-pool in its epilogue, one kernel per conv
  stage. A block stages S samples (zero-padded) and the weights of KT output channels in shared
  memory, transposed to [c][i][j][k]; a thread owns one pooled position and computes its PxP conv
  outputs for all KT channels in registers, so each weight read (a shared-memory broadcast) feeds
  P*P*KT FMAs. Full FP32. The (KT, S, threads) configuration is chosen per batch size: many
  channels per thread at large N (reuse), one at small N (parallelism).
- `chain_fprop`: a whole small network in ONE kernel (LeNet-5 up to batch 256): conv stages in
  shared memory (weights staged transposed, the input zero-padded), then the dense chain. One
  block row per sample; the first dense layer's rows are split over G blocks, each of which
  recomputes the (cheap) conv stages itself, so no grid-wide barrier is needed; the last block of
  a sample to finish (an atomic ticket) runs the remaining dense layers and resets its ticket for
  the next launch (CUDA-graph safe). Dense weights arrive by cp.async while the convs run.
  Measured on an H100: LeNet-5 at batch 1 is 10.5 us of GPU time in this kernel.
- `mlp_fprop`: a dense chain: the chain kernel at small N, else cuBLAS GEMMs (FP32) each followed
  by one bias(+ReLU) kernel.
- `add_relu_fprop`, `bias_act_fprop`: one elementwise kernel each.

All float32 and C-contiguous; every kernel runs on CuPy's current stream and can be captured.
"""

import cupy as cp
import numpy as np

from ..cpu.direct import (conv_geometry, pads4, supported_chain, supported_conv)  # noqa: F401  one definition
from ._cublas import gemm
from ._util import REDUCE, out_array

N_SM = 132                  # H100/H200; only used to size grids
CHAIN_THREADS = 512
_F32 = np.dtype(np.float32)
_kernels = {}               # source key -> (RawKernel, dynamic shared bytes)
_scratch = {}               # (chain key, N, G) -> (h1 (N, D1) float32, tickets (N,) uint32)

_add_relu = cp.ElementwiseKernel("T a, T b", "T y", "T v = a + b; y = v > (T)0 ? v : (T)0", "minidl_add_relu")
_bias_relu = cp.ElementwiseKernel("T y, raw T b, int32 K", "T z", "T v = y + b[i % K]; z = v > (T)0 ? v : (T)0",
                                  "minidl_bias_relu")
_bias = cp.ElementwiseKernel("T y, raw T b, int32 K", "T z", "z = y + b[i % K]", "minidl_bias")
_relu = cp.ElementwiseKernel("T y", "T z", "z = y > (T)0 ? y : (T)0", "minidl_relu_direct")


def _check(name, a, ndim=None):
    if a.dtype != _F32 or not a.flags.c_contiguous or (ndim is not None and a.ndim != ndim):
        raise ValueError(f"direct kernels take C-contiguous float32 arrays{f' of {ndim} dimensions' if ndim else ''}; "
                         f"{name} is {a.shape} {a.dtype}")


def _compile(key, src, name, smem):
    hit = _kernels.get(key)
    if hit is None:
        mod = cp.RawModule(code=src, options=("-std=c++14",))
        kern = mod.get_function(name)
        if smem > 48 * 1024:
            kern.max_dynamic_shared_size_bytes = smem
        hit = _kernels[key] = (kern, smem, mod)
    return hit[0], hit[1]


# -- the conv stage kernel ---------------------------------------------------------------------------
_LOAD_W = r"""
__device__ __forceinline__ void load_w(float (&r)[KT], const float* p) {
#if KT % 4 == 0
    #pragma unroll
    for (int i = 0; i < KT / 4; ++i) {
        float4 v = reinterpret_cast<const float4*>(p)[i];
        r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
    }
#elif KT % 2 == 0
    #pragma unroll
    for (int i = 0; i < KT / 2; ++i) {
        float2 v = reinterpret_cast<const float2*>(p)[i];
        r[2 * i] = v.x; r[2 * i + 1] = v.y;
    }
#else
    #pragma unroll
    for (int i = 0; i < KT; ++i) r[i] = p[i];
#endif
}
"""

_CONV = r"""
extern "C" __global__ void __launch_bounds__(NT, MINB)
direct_conv(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
            float* __restrict__ y, int N)
{
    // x (N, C, H, W), w (K, C, KH, KW), b (K,) -> y (N, K, POH, POW) = maxpool_PxP(relu(conv(x, w) + b))
    extern __shared__ float4 smem4[];
    float* sw = reinterpret_cast<float*>(smem4);        // [C*KH*KW][KTP]: weights of channels k0..k0+KT-1
    float* sb = sw + C * KH * KW * KTP;                 // [KTP]
    float* sx = sb + KTP;                               // [S][C][HP][WS]: the inputs, zero-padded
    const int n0 = blockIdx.x * S, k0 = blockIdx.y * KT, tid = threadIdx.x;
    const int nS = min(S, N - n0);
    #pragma unroll 4
    for (int i = tid; i < C * KH * KW * KT; i += NT) {
        const int kt = i / (C * KH * KW), cij = i - kt * (C * KH * KW);
        sw[cij * KTP + kt] = k0 + kt < K ? __ldg(w + (size_t)(k0 + kt) * (C * KH * KW) + cij) : 0.f;
    }
    if (tid < KT) sb[tid] = (HASB && k0 + tid < K) ? __ldg(b + k0 + tid) : 0.f;
    #pragma unroll 8
    for (int i = tid; i < nS * C * HP * WS; i += NT) {
        const int q = i % WS, r = (i / WS) % HP, sc = i / (WS * HP);
        const int hh = r - PT, ww = q - PL;
        float v = 0.f;
        if (q < WP && hh >= 0 && hh < H && ww >= 0 && ww < W)
            v = __ldg(x + ((size_t)n0 * C + sc) * (H * W) + hh * W + ww);
        sx[i] = v;
    }
    __syncthreads();
    for (int it = tid; it < nS * POH * POW; it += NT) {
        const int px = it % POW, py = (it / POW) % POH, s = it / (POW * POH);
        float acc[P * P][KT];
        #pragma unroll
        for (int a = 0; a < P * P; ++a)
            #pragma unroll
            for (int kt = 0; kt < KT; ++kt) acc[a][kt] = 0.f;
        const float* xs = sx + (s * C * HP + py * P) * WS + px * P;
        // An opaque zero: keeps the compiler from hoisting every weight load out of this loop into
        // registers (C*KH*KW*KT of them), which spills under the register cap.
        int zero;
        asm volatile("mov.u32 %0, 0;" : "=r"(zero));
        const float* swz = sw + zero;
        #pragma unroll @CUNROLL@
        for (int c = 0; c < C; ++c) {
            float pt[KH + P - 1][KW + P - 1];
            const float* xc = xs + c * (HP * WS);
            #pragma unroll
            for (int r = 0; r < KH + P - 1; ++r) {
#if VEC2
                #pragma unroll
                for (int q = 0; q < (KW + P - 1) / 2; ++q) {
                    const float2 v = *reinterpret_cast<const float2*>(xc + r * WS + 2 * q);
                    pt[r][2 * q] = v.x; pt[r][2 * q + 1] = v.y;
                }
#else
                #pragma unroll
                for (int q = 0; q < KW + P - 1; ++q) pt[r][q] = xc[r * WS + q];
#endif
            }
            const float* wc = swz + c * (KH * KW * KTP);
            #pragma unroll
            for (int r = 0; r < KH; ++r) {
                #pragma unroll
                for (int q = 0; q < KW; ++q) {
                    float wv[KT];
                    load_w(wv, wc + (r * KW + q) * KTP);
                    #pragma unroll
                    for (int dy = 0; dy < P; ++dy)
                        #pragma unroll
                        for (int dx = 0; dx < P; ++dx)
                            #pragma unroll
                            for (int kt = 0; kt < KT; ++kt)
                                acc[dy * P + dx][kt] = fmaf(pt[r + dy][q + dx], wv[kt], acc[dy * P + dx][kt]);
                }
            }
        }
        float* yo = y + ((size_t)(n0 + s) * K + k0) * (POH * POW) + py * POW + px;
        #pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            float m = acc[0][kt];
            #pragma unroll
            for (int a = 1; a < P * P; ++a) m = fmaxf(m, acc[a][kt]);
            m += sb[kt];                                  // max(a_i) + b == max(a_i + b), exactly
#if RELU
            m = fmaxf(m, 0.f);
#endif
            if (k0 + kt < K) yo[kt * (POH * POW)] = m;
        }
    }
}
"""


def _defines(**kw):
    return "".join(f"#define {k} {int(v)}\n" for k, v in kw.items())


def _round(v, m):
    return -(-v // m) * m


def _min_blocks(KT, P, NT):
    """__launch_bounds__ blocks per SM: registers capped near what the accumulators and patch need."""
    cap = 128 if P * P * KT >= 32 else 96
    return max(1, min(8, 65536 // (NT * cap)))


def choose_conv(N, C, K, kH, kW, P, pH, pW, rows, cols):
    """(KT, S, NT, MINB) for the conv stage kernel at batch N: channels per thread, samples and threads
    per block, blocks per SM the registers are capped for. Scored by the threads' share of useful
    items, the GPU's fill and the warps an SM holds (registers, shared memory)."""
    npos = pH * pW
    divs = [d for d in range(1, min(K, 16) + 1) if K % d == 0]
    # Enough threads to fill the GPU with the most channels per thread (weight reuse); else parallelism first.
    KT = next((d for d in reversed(divs) if N * npos * (K // d) >= N_SM * 256), divs[0])
    WS = _round(cols, 2)
    best = None
    for S in range(1, min(32, N) + 1):
        smem = 4 * (C * kH * kW * _round(KT, 4) + _round(KT, 4) + S * C * rows * WS)
        if smem > 100 * 1024:
            break
        items = S * npos
        blocks = -(-N // S) * (K // KT)
        for NT in range(32, 257, 32):
            if NT > _round(items, 32) or (NT < 128 and _round(items, 32) >= 128):
                continue
            minb = _min_blocks(KT, P, NT)
            per_sm = max(1, min(minb, (227 * 1024) // (smem + 1024), 2048 // NT, 32))
            eff = items / (-(-items // NT) * NT)
            fill = min(1.0, blocks / (N_SM * per_sm))
            occ = min(1.0, per_sm * NT / 32 / 16)
            score = (round(eff * fill * occ, 3), -abs(NT - 256), -S)
            if best is None or score > best[0]:
                best = (score, (KT, S, NT, minb))
    return best[1]


def _conv_direct(x, w, b, pads, pool, relu, out, config):
    _check("x", x, 4)
    _check("w", w, 4)
    if b is not None:
        _check("b", b, 1)
    N, C, H, W = x.shape
    K, _, kH, kW = w.shape
    t, _, l, _ = p4 = pads4(pads)
    (oH, oW), (pH, pW) = conv_geometry(x.shape, w.shape, p4, pool)
    if not supported_conv(x.shape, w.shape, p4, pool):
        raise ValueError(f"direct conv: shapes x {x.shape}, w {w.shape} (pool {pool}) are too large for the kernel")
    y = out_array(out, (N, K, pH, pW), x.dtype)
    if N == 0:
        return y
    rows, cols = pool * pH + kH - 1, pool * pW + kW - 1
    KT, S, NT, *minb = config or choose_conv(N, C, K, kH, kW, pool, pH, pW, rows, cols)
    MINB = minb[0] if minb else _min_blocks(KT, pool, NT)
    WS, KTP = _round(cols, 2), _round(KT, 4)
    vec2 = pool == 2 and (kW + 1) % 2 == 0
    key = ("conv", C, H, W, K, kH, kW, t, l, pool, pH, pW, bool(relu), b is not None, KT, S, NT, MINB)
    hit = _kernels.get(key)
    if hit is None:
        smem = 4 * (C * kH * kW * KTP + KTP + S * C * rows * WS)
        src = _defines(C=C, H=H, W=W, K=K, KH=kH, KW=kW, PT=t, PL=l, P=pool, POH=pH, POW=pW, RELU=relu,
                       HASB=b is not None, KT=KT, KTP=KTP, S=S, NT=NT, MINB=MINB, HP=rows, WP=cols, WS=WS, VEC2=vec2,
                       ) + _LOAD_W + _CONV.replace("@CUNROLL@", str(C if C * kH * kW <= 50 else 1))
        hit = _compile(key, src, "direct_conv", smem)
    kern, smem = hit[0], hit[1]
    kern((-(-N // S), -(-K // KT)), (NT,), (x, w, w if b is None else b, y, np.int32(N)), shared_mem=smem)
    return y


def conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads=0, relu=True, out=None, config=None):
    """y = maxpool2x2(relu(conv(x, w) + b)), stride-1 conv, floor pool, one kernel.

    x (N, C, H, W), w (K, C, kH, kW), b (K,) or None -> y (N, K, oH // 2, oW // 2); pads an int,
    a pair or (top, bottom, left, right); config (KT, S, threads[, min blocks per SM]) overrides
    the per-N choice (choose_conv).
    """
    return _conv_direct(x, w, b, pads, 2, relu, out, config)


def conv2d_bias_relu_fprop(x, w, b, pads=0, relu=True, out=None, config=None):
    """y = relu(conv(x, w) + b), stride 1, one kernel.   -> (N, K, oH, oW)."""
    return _conv_direct(x, w, b, pads, 1, relu, out, config)


# -- the chain kernel: conv stages + dense chain, one sample per block row ----------------------------
_CHAIN_LIB = REDUCE + r"""
__device__ __forceinline__ void copy_async(float* dst, const float* src, int n) {
    // dst[0:n] = src[0:n], global -> shared, asynchronously (cp.async; wait with cp_async_wait)
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    int i0 = 0;
    if (((reinterpret_cast<size_t>(src) | s) & 15) == 0) {
        const int n4 = n >> 2;
        for (int i = threadIdx.x; i < n4; i += NT)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s + 16 * i), "l"(src + 4 * i) : "memory");
        i0 = 4 * n4;
    }
    for (int i = i0 + threadIdx.x; i < n; i += NT)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"(s + 4 * i), "l"(src + i) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template<int GROUPS> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(GROUPS) : "memory");
}

template<int KT>
__device__ __forceinline__ void load_k(float (&r)[KT], const float* p) {
    // KT consecutive floats of shared memory (p aligned to KT floats when KT is even)
    if (KT % 4 == 0) {
        #pragma unroll
        for (int i = 0; i < KT / 4; ++i) {
            const float4 v = reinterpret_cast<const float4*>(p)[i];
            r[4 * i] = v.x; r[4 * i + 1] = v.y; r[4 * i + 2] = v.z; r[4 * i + 3] = v.w;
        }
    } else if (KT % 2 == 0) {
        #pragma unroll
        for (int i = 0; i < KT / 2; ++i) {
            const float2 v = reinterpret_cast<const float2*>(p)[i];
            r[2 * i] = v.x; r[2 * i + 1] = v.y;
        }
    } else {
        #pragma unroll
        for (int i = 0; i < KT; ++i) r[i] = p[i];
    }
}

template<int C, int HS, int WS, int H, int W, int K, int KH, int KW, int OT, int OL, int P, int POH, int POW,
         int RELU, int KT, int KP, int HASB, int CHECK, int VEC2>
__device__ __forceinline__ void conv_stage(const float* in, float* out, const float* ws, const float* b) {
    // in: smem (C, HS, WS) of one sample (row stride WS; when CHECK, rows/cols outside [0, H) x [0, W)
    // read as zeros: unpadded storage); window (py, px) starts at (py*P - OT, px*P - OL).
    // ws: smem weights transposed to [c][i][j][KP]; b (K,) -> out: smem (K, POH, POW)
    constexpr int NPOS = POH * POW, NG = K / KT;
    for (int it = threadIdx.x; it < NG * NPOS; it += NT) {
        const int g = it / NPOS, pos = it - g * NPOS, py = pos / POW, px = pos - py * POW, k0 = g * KT;
        const int y0 = py * P - OT, x0 = px * P - OL;
        float acc[P * P][KT];
        #pragma unroll
        for (int a = 0; a < P * P; ++a)
            #pragma unroll
            for (int kt = 0; kt < KT; ++kt) acc[a][kt] = 0.f;
        #pragma unroll 1
        for (int c = 0; c < C; ++c) {
            float pt[KH + P - 1][KW + P - 1];
            const float* ic = in + c * (HS * WS);
            #pragma unroll
            for (int r = 0; r < KH + P - 1; ++r) {
                if (VEC2) {
                    #pragma unroll
                    for (int q = 0; q < (KW + P - 1) / 2; ++q) {
                        const float2 v = *reinterpret_cast<const float2*>(ic + (y0 + r) * WS + x0 + 2 * q);
                        pt[r][2 * q] = v.x; pt[r][2 * q + 1] = v.y;
                    }
                } else {
                    #pragma unroll
                    for (int q = 0; q < KW + P - 1; ++q) {
                        const int yy = y0 + r, xx = x0 + q;
                        pt[r][q] = (!CHECK || ((unsigned)yy < (unsigned)H && (unsigned)xx < (unsigned)W)) ? ic[yy * WS + xx] : 0.f;
                    }
                }
            }
            const float* wc = ws + c * (KH * KW * KP) + k0;
            #pragma unroll
            for (int r = 0; r < KH; ++r)
                #pragma unroll
                for (int q = 0; q < KW; ++q) {
                    float wv[KT];
                    load_k<KT>(wv, wc + (r * KW + q) * KP);
                    #pragma unroll
                    for (int dy = 0; dy < P; ++dy)
                        #pragma unroll
                        for (int dx = 0; dx < P; ++dx)
                            #pragma unroll
                            for (int kt = 0; kt < KT; ++kt)
                                acc[dy * P + dx][kt] = fmaf(pt[r + dy][q + dx], wv[kt], acc[dy * P + dx][kt]);
                }
        }
        #pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
            float m = acc[0][kt];
            #pragma unroll
            for (int a = 1; a < P * P; ++a) m = fmaxf(m, acc[a][kt]);
            if (HASB) m += b[k0 + kt];
            if (RELU) m = fmaxf(m, 0.f);
            out[(k0 + kt) * NPOS + pos] = m;
        }
    }
}

template<int DIN, int RO, int RELU, int HASB>
__device__ __forceinline__ void dense_rows(const float* in, float* out, const float* w, const float* b,
                                           int o0, int o1, int wrow0) {
    // out[o] = relu?(in . w[o - wrow0] + b[o - wrow0]) for o in [o0, o1): a warp per RO rows, lanes along DIN
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = o0 + warp * RO; o < o1; o += (NT / 32) * RO) {
        float acc[RO];
        #pragma unroll
        for (int r = 0; r < RO; ++r) acc[r] = 0.f;
        const float* wo = w + (size_t)(o - wrow0) * DIN;
        if (DIN % 4 == 0) {
            #pragma unroll 4
            for (int d = lane * 4; d < DIN; d += 128) {
                const float4 xv = *reinterpret_cast<const float4*>(in + d);
                #pragma unroll
                for (int r = 0; r < RO; ++r)
                    if (o + r < o1) {
                        const float4 wv = *reinterpret_cast<const float4*>(wo + r * DIN + d);
                        acc[r] = fmaf(xv.x, wv.x, acc[r]); acc[r] = fmaf(xv.y, wv.y, acc[r]);
                        acc[r] = fmaf(xv.z, wv.z, acc[r]); acc[r] = fmaf(xv.w, wv.w, acc[r]);
                    }
            }
        } else {
            #pragma unroll 4
            for (int d = lane; d < DIN; d += 32) {
                const float xv = in[d];
                #pragma unroll
                for (int r = 0; r < RO; ++r)
                    if (o + r < o1) acc[r] = fmaf(xv, wo[r * DIN + d], acc[r]);
            }
        }
        #pragma unroll
        for (int r = 0; r < RO; ++r) {
            const float v0 = warp_sum(acc[r]);
            if (lane == r && o + r < o1) {
                float v = v0;
                if (HASB) v += b[o + r - wrow0];
                if (RELU) v = fmaxf(v, 0.f);
                out[o + r] = v;
            }
        }
    }
}
"""

CHAIN_SMEM_FLOATS = 48 * 1024       # 192 KiB of shared memory a block at most (one block an SM)


def _stage_shapes(x_shape, stages):
    """Per-sample output shapes of the stages."""
    shapes, shape = [], tuple(x_shape)
    for st in stages:
        if st[0] == "conv":
            _, w, _, pads, pool, _ = st
            _, (pH, pW) = conv_geometry(shape, w.shape, pads, pool)
            shape = (w.shape[0], pH, pW)
        else:
            shape = (st[1].shape[0],)
        shapes.append(shape)
    return shapes


def _ro(rows):
    return max(1, min(8, -(-rows // (CHAIN_THREADS // 32))))


def _vec2(P, kW, stride):
    return P == 2 and (kW + 1) % 2 == 0 and stride % 2 == 0


def _chain_kt(C, K, kH, kW, P, npos, vec2):
    """Channels per thread in a chain conv stage, by a cost model of one block (cycles of shared-memory
    loads and of FMA issue, whichever is larger): more channels a thread reuse each loaded input,
    fewer leave warps idle."""
    best, warps_sm = None, CHAIN_THREADS // 32
    for d in range(1, min(K, 16) + 1):
        if K % d:
            continue
        items = (K // d) * npos
        rounds, warps = -(-items // CHAIN_THREADS), min(warps_sm, -(-items // 32))
        w_lds = d // 4 if d % 4 == 0 else (d // 2 if d % 2 == 0 else d)
        patch = (kH + P - 1) * (kW + P - 1)
        patch_lds = patch // 2 if vec2 else patch * (2 if P == 2 else 1)      # stride-2 reads: 2-way conflicts
        lds = rounds * warps * C * (patch_lds + kH * kW * w_lds)
        fma = rounds * -(-warps // 4) * C * kH * kW * P * P * d
        cost = max(lds, fma)
        if best is None or cost <= best[0]:
            best = (cost, d)
    return best[1]


def _chain_source(x_shape, stages, shapes, R):
    """The chain kernel's CUDA source and dynamic shared bytes for these stages and R first-layer rows
    a block. Conv weights are staged in shared memory transposed to [c][i][j][k] and the input
    zero-padded for the first conv; dense weights that fit the shared-memory budget are copied there
    with cp.async (this block's first-layer rows with the input, the later layers as a second group
    that lands while the convs run); the rest are read from global memory."""
    first = next(i for i, st in enumerate(stages) if st[0] == "dense")
    if first > 0:                                       # the first conv reads a zero-padded copy of x
        C0, H0, W0 = x_shape
        t0, b0_, l0, r0 = pads4(stages[0][3])
        in_h, in_w = H0 + t0 + b0_, _round(W0 + l0 + r0, 2)
        size_in = C0 * in_h * in_w
    else:
        size_in = int(np.prod(x_shape))
    size = int(np.prod(x_shape))
    buf = _round(max([size_in] + [int(np.prod(s)) for s in shapes]), 4)
    used = 2 * buf
    place = {}                                          # (stage, 'w' or 'b') -> smem offset (floats)

    def reserve(key, n, required=False):
        nonlocal used
        if used + _round(n, 4) <= CHAIN_SMEM_FLOATS or required:
            place[key] = used
            used += _round(n, 4)

    for i, st in enumerate(stages[:first]):             # conv weights: always staged
        K, C, kH, kW = st[1].shape
        reserve((i, "w"), C * kH * kW * _round(K, 4), required=True)
    for i, st in enumerate(stages):                     # this block's first-layer rows, then the later layers
        if i >= first:
            rows = R if i == first else st[1].shape[0]
            reserve((i, "w"), rows * st[1].shape[1])
            if st[2] is not None:
                reserve((i, "b"), rows)

    args, stage_in, copies_a, copies_b = ["const float* __restrict__ x"], [], [], []
    ptr = {}
    for i, st in enumerate(stages):
        args += [f"const float* __restrict__ w{i}", f"const float* __restrict__ b{i}"]
        if st[0] == "conv":
            K, C, kH, kW = st[1].shape
            ckk, KP = C * kH * kW, _round(K, 4)
            stage_in.append(f"""#pragma unroll 8
    for (int j = threadIdx.x; j < {K * ckk}; j += NT) {{             // w{i} (K, C, kH, kW) -> [c][i][j][k]
        const int k = j / {ckk}, cij = j - k * {ckk};
        sm[{place[(i, 'w')]} + cij * {KP} + k] = __ldg(w{i} + j);
    }}""")
            ptr[(i, "w")], ptr[(i, "b")] = f"(sm + {place[(i, 'w')]})", f"b{i}"
            continue
        D_out, D_in = st[1].shape
        for part, src, per_row in (("w", f"w{i}", D_in), ("b", f"b{i}", 1)):
            if part == "b" and st[2] is None:
                ptr[(i, part)] = src
                continue
            g_src = f"{src} + (size_t)o0 * {per_row}" if i == first else src
            if (i, part) in place:
                n_expr = f"(o1 - o0) * {per_row}" if i == first else str(D_out * per_row)
                (copies_a if i == first else copies_b).append(
                    f"copy_async(sm + {place[(i, part)]}, {g_src}, {n_expr});")
                ptr[(i, part)] = f"(sm + {place[(i, part)]})"
            else:
                ptr[(i, part)] = f"({g_src})"
    if first > 0:
        x_load = f"""#pragma unroll 4
    for (int j = threadIdx.x; j < {size_in}; j += NT) {{            // x, zero-padded to ({C0}, {in_h}, {in_w})
        const int c = j / {in_h * in_w}, rem = j - c * {in_h * in_w}, hh = rem / {in_w} - {t0}, ww = rem % {in_w} - {l0};
        cur[j] = ((unsigned)hh < {H0}u && (unsigned)ww < {W0}u) ? __ldg(x + (size_t)n * {size} + (c * {H0} + hh) * {W0} + ww) : 0.f;
    }}"""
    else:
        copies_a.insert(0, f"copy_async(cur, x + (size_t)n * {size}, {size});")
        x_load = ""
    body = copies_a + ["cp_async_commit();"] + copies_b + ["cp_async_commit();", x_load] + stage_in + \
        ["cp_async_wait<1>();", "__syncthreads();"]
    shape, n_dense = tuple(x_shape), sum(st[0] == "dense" for st in stages)
    dense_i = 0
    for i, (st, out_shape) in enumerate(zip(stages, shapes)):
        hasb = st[2] is not None
        w_p, b_p = ptr[(i, "w")], ptr[(i, "b")]
        if st[0] == "conv":
            _, w, _, pads, pool, relu = st
            K, C, kH, kW = w.shape
            t, _, l, _ = pads4(pads)
            H, W = shape[1], shape[2]
            if i == 0:                                  # padded storage: windows start inside it
                HS, WS, OT, OL, check = in_h, in_w, 0, 0, 0
            elif not any(pads4(pads)):
                HS, WS, OT, OL, check = H, W, 0, 0, 0
            else:
                HS, WS, OT, OL, check = H, W, t, l, 1
            vec2 = int(not check and _vec2(pool, kW, WS))
            kt = _chain_kt(C, K, kH, kW, pool, out_shape[1] * out_shape[2], vec2)
            body.append(f"conv_stage<{C},{HS},{WS},{H},{W},{K},{kH},{kW},{OT},{OL},{pool},{out_shape[1]},"
                        f"{out_shape[2]},{int(bool(relu))},{kt},{_round(K, 4)},{int(hasb)},{check},{vec2}>"
                        f"(cur, nxt, {w_p}, {b_p});")
            body.append("__syncthreads(); { float* t_ = cur; cur = nxt; nxt = t_; }")
        else:
            _, w, _, relu = st
            D_out, D_in = w.shape
            last = dense_i == n_dense - 1
            if i == first:                                    # split over the G blocks of this sample
                tmpl = f"{D_in},{_ro(R)},{int(bool(relu))},{int(hasb)}"
                if last:
                    body.append(f"dense_rows<{tmpl}>(cur, y + (size_t)n * {D_out}, {w_p}, {b_p}, o0, o1, o0);")
                    body.append("cp_async_wait<0>();")
                else:
                    body.append(f"""float* dst = gridDim.x == 1 ? nxt : h1 + (size_t)n * {D_out};
    dense_rows<{tmpl}>(cur, dst, {w_p}, {b_p}, o0, o1, o0);
    if (gridDim.x > 1) {{
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) s_last = atomicAdd(tickets + n, 1u) == gridDim.x - 1;
        __syncthreads();
        if (!s_last) {{ cp_async_wait<0>(); return; }}
        __threadfence();
        for (int i = threadIdx.x; i < {D_out}; i += NT) nxt[i] = __ldcg(h1 + (size_t)n * {D_out} + i);
        if (threadIdx.x == 0) tickets[n] = 0u;            // ready for the next launch
    }}
    cp_async_wait<0>();
    __syncthreads(); {{ float* t_ = cur; cur = nxt; nxt = t_; }}""")
            else:
                tmpl = f"{D_in},{_ro(D_out)},{int(bool(relu))},{int(hasb)}"
                dst = f"y + (size_t)n * {D_out}" if last else "nxt"
                body.append(f"dense_rows<{tmpl}>(cur, {dst}, {w_p}, {b_p}, 0, {D_out}, 0);")
                if not last:
                    body.append("__syncthreads(); { float* t_ = cur; cur = nxt; nxt = t_; }")
            dense_i += 1
        shape = out_shape
    D1 = stages[first][1].shape[0]
    args += ["float* __restrict__ y", "float* __restrict__ h1", "unsigned int* __restrict__ tickets", "int R"]
    src = (f"#define NT {CHAIN_THREADS}\n" + _CHAIN_LIB + "\nextern \"C\" __global__ void __launch_bounds__(NT, 1)\n"
           "direct_chain(" + ", ".join(args) + ") {\n"
           "    extern __shared__ float4 smem4[];\n    float* sm = reinterpret_cast<float*>(smem4);\n"
           "    __shared__ unsigned int s_last;\n"
           f"    const int n = blockIdx.y, o0 = blockIdx.x * R, o1 = min({D1}, o0 + R);\n"
           f"    float* cur = sm; float* nxt = sm + {buf};\n"
           "    (void)s_last; (void)h1; (void)tickets;\n    " + "\n    ".join(body) + "\n}\n")
    return src, 4 * used


def chain_blocks(N, D1):
    """Blocks per sample G for the chain kernel at batch N: the first dense layer split 8+ rows a block."""
    return max(1, min(-(-D1 // 8), N_SM // max(N, 1)))


def _chain_key(x_shape, stages):
    key = [tuple(x_shape)]
    for st in stages:
        if st[0] == "conv":
            _, w, b, pads, pool, relu = st
            key.append(("conv", w.shape, b is not None, pads4(pads), pool, bool(relu)))
        else:
            key.append(("dense", st[1].shape, st[2] is not None, bool(st[3])))
    return tuple(key)


def chain_fprop(x, stages, out=None, blocks=None):
    """conv stages, a flatten and a dense chain in one kernel (see the module docstring).

    x (N, *sample shape) -> y (N, D). stages: ("conv", w, b, pads, pool, relu) then ("dense", w, b, relu)
    tuples (b may be None). blocks: blocks per sample (the first dense layer's split), else chosen.
    """
    _check("x", x)
    if not supported_chain(x.shape[1:], stages):
        raise ValueError(f"chain: the stages do not fit the chain kernel for inputs {x.shape[1:]}")
    for st in stages:
        for a in st[1:3]:
            if a is not None:
                _check("weights", a)
    N = x.shape[0]
    shapes = _stage_shapes(x.shape[1:], stages)
    D_out = shapes[-1][0]
    y = out_array(out, (N, D_out), x.dtype)
    if N == 0:
        return y
    first = next(i for i, st in enumerate(stages) if st[0] == "dense")
    D1 = shapes[first][0]
    G = max(1, min(int(blocks or chain_blocks(N, D1)), D1))
    R = -(-D1 // G)
    G = -(-D1 // R)
    key = ("chain", _chain_key(x.shape[1:], stages), R)
    hit = _kernels.get(key)
    if hit is None:
        src, smem = _chain_source(x.shape[1:], stages, shapes, R)
        kern, smem = _compile(key, src, "direct_chain", smem)
    else:
        kern, smem = hit[0], hit[1]
    h1, tickets = _chain_scratch(key, N, D1)
    args = [x]
    for st in stages:
        args += [st[1], st[1] if st[2] is None else st[2]]
    args += [y, h1, tickets, np.int32(R)]
    kern((G, N), (CHAIN_THREADS,), tuple(args), shared_mem=smem)
    return y


def _chain_scratch(key, N, D1):
    """The first dense layer's outputs and the per-sample tickets: fixed addresses, tickets zeroed once.
    Allocated from CuPy's default pool (not a CUDA graph's private one), outside any capture."""
    s = _scratch.get((key, N))
    if s is None:
        with cp.cuda.using_allocator(cp.get_default_memory_pool().malloc):
            s = _scratch[(key, N)] = (cp.empty((N, D1), dtype=np.float32), cp.zeros((N,), dtype=np.uint32))
    return s


# -- dense chains, adds ---------------------------------------------------------------------------------
MLP_CHAIN_MAX = 256      # batch sizes up to this run a dense chain as the chain kernel; beyond, cuBLAS


def mlp_fprop(x, ws, bs, relus, out=None):
    """A chain of dense layers: h = relu?(h @ w.T + b) for each layer.   x (N, D0) -> (N, DL)."""
    x2 = x.reshape(x.shape[0], -1)
    stages = [("dense", w, b, r) for w, b, r in zip(ws, bs, relus)]
    if x2.shape[0] <= MLP_CHAIN_MAX and supported_chain(x2.shape[1:], stages):
        return chain_fprop(x2, stages, out=out)
    h = x2
    for i, (w, b, relu) in enumerate(zip(ws, bs, relus)):
        y = out_array(out if i == len(ws) - 1 else None, (h.shape[0], w.shape[0]), h.dtype)
        gemm(h, w, y, trans_b=True)
        h = bias_act_fprop(y, b, relu, out=y)
    return h


def bias_act_fprop(y, b, relu, out=None):
    """y + b (b (K,) along the last axis), then max(., 0) if relu; one kernel."""
    z = out_array(out, y.shape, y.dtype)
    if b is not None:
        (_bias_relu if relu else _bias)(y, b, np.int32(b.shape[0]), z)
    elif relu:
        _relu(y, z)
    elif z is not y:
        cp.copyto(z, y)
    return z


def add_relu_fprop(xs, out=None):
    """y = max(sum of xs, 0); one kernel for two inputs."""
    if len(xs) == 1:
        return _relu(xs[0], out_array(out, xs[0].shape, xs[0].dtype))
    y = out_array(out, xs[0].shape, xs[0].dtype)
    a = xs[0]
    if len(xs) > 2:
        a = cp.add(xs[0], xs[1])
        for x in xs[2:-1]:
            cp.add(a, x, out=a)
    return _add_relu(a, xs[-1], y)
