"""Direct convolution on the GPU: stride-1 conv + bias (+ ReLU) (+ 2x2 max-pool), one kernel a stage.

No im2col, no GEMM: a block stages S samples (zero-padded) and the weights of KT output channels in
shared memory, transposed to [c][i][j][k]; a thread owns one pooled position and computes its PxP
conv outputs for all KT channels in registers, so each weight read (a shared-memory broadcast) feeds
P*P*KT FMAs. Full FP32. The (KT, S, threads) configuration is chosen per batch size and for the
GPU's SM count: many channels per thread at large N (reuse), one at small N (parallelism).
The NumPy reference is `minidl/kernels/cpu/direct_conv.py`; `supported_conv` (kernels/shapes.py) says
which shapes this kernel takes.
"""
from __future__ import annotations

from collections.abc import Sequence

import cupy as cp
import numpy as np

from ..._types import Array
from ..shapes import conv_geometry, pads4, supported_conv
from ._util import LOAD_K, check_f32, defines, out_array, raw_kernel, round_up, sm_count

_CONV = r"""
extern "C" __global__ void __launch_bounds__(NT, MINB)
direct_conv(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
            float* __restrict__ y, int N, const float* __restrict__ xa, const float* __restrict__ xb,
            float xa1, float xb1)
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
            v = XAFF == 1 ? fmaf(__ldg(x + ((size_t)n0 * C + sc) * (H * W) + hh * W + ww), xa1, xb1)   // one channel
                          : __ldg(x + ((size_t)n0 * C + sc) * (H * W) + hh * W + ww);
        sx[i] = v;
    }
    if (XAFF == 2) {        // a Normalize, in place on what this thread staged, inside the image: the padding
        #pragma unroll 1    // stays 0, as a normalised input's (its own loop: the staging keeps its registers)
        for (int i = tid; i < nS * C * HP * WS; i += NT) {
            const int q = i % WS, r = (i / WS) % HP, sc = i / (WS * HP);
            const int hh = r - PT, ww = q - PL;
            if (q < WP && hh >= 0 && hh < H && ww >= 0 && ww < W)
                sx[i] = fmaf(sx[i], __ldg(xa + sc % C), __ldg(xb + sc % C));
        }
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
                    load_k<KT>(wv, wc + (r * KW + q) * KTP);
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


def _min_blocks(KT, P, NT):
    """__launch_bounds__ blocks per SM: registers capped near what the accumulators and patch need."""
    cap = 128 if P * P * KT >= 32 else 96
    return max(1, min(8, 65536 // (NT * cap)))


def choose_conv(N: int, C: int, K: int, kH: int, kW: int, P: int, pH: int, pW: int, rows: int, cols: int,
                sms: int | None = None) -> tuple[int, int, int, int]:
    """(KT, S, NT, MINB) for the conv stage kernel at batch N: channels per thread, samples and threads
    per block, blocks per SM the registers are capped for. Scored by the threads' share of useful
    items, the GPU's fill and the warps an SM holds (registers, shared memory). sms: the GPU's SM count
    (asked of the device when None)."""
    sms = sms or sm_count()
    npos = pH * pW
    divs = [d for d in range(1, min(K, 16) + 1) if K % d == 0]
    # Enough threads to fill the GPU with the most channels per thread (weight reuse); else parallelism first.
    KT = next((d for d in reversed(divs) if N * npos * (K // d) >= sms * 256), divs[0])
    WS = round_up(cols, 2)
    best = None
    for S in range(1, min(32, N) + 1):
        smem = 4 * (C * kH * kW * round_up(KT, 4) + round_up(KT, 4) + S * C * rows * WS)
        if smem > 100 * 1024:
            break
        items = S * npos
        blocks = -(-N // S) * (K // KT)
        for NT in range(32, 257, 32):
            if NT > round_up(items, 32) or (NT < 128 and round_up(items, 32) >= 128):
                continue
            minb = _min_blocks(KT, P, NT)
            per_sm = max(1, min(minb, (227 * 1024) // (smem + 1024), 2048 // NT, 32))
            eff = items / (-(-items // NT) * NT)
            fill = min(1.0, blocks / (sms * per_sm))
            occ = min(1.0, per_sm * NT / 32 / 16)
            score = (round(eff * fill * occ, 3), -abs(NT - 256), -S)
            if best is None or score > best[0]:
                best = (score, (KT, S, NT, minb))
    return best[1]     # type: ignore[index]  # S = 1 fits shared memory within supported_conv's limits


def affine_on_device(x_affine: tuple[Array, Array]) -> tuple[Array, Array]:
    """A Normalize's (a, b), host float32 arrays (C,), as device arrays made once per values and GPU: a
    captured call then copies nothing."""
    a, b = (np.ascontiguousarray(v, np.float32) for v in x_affine)
    key = (cp.cuda.runtime.getDevice(), a.tobytes(), b.tobytes())
    if key not in _AFFINE:
        _AFFINE[key] = (cp.asarray(a), cp.asarray(b))
    return _AFFINE[key]


_AFFINE: dict[tuple[int, bytes, bytes], tuple[Array, Array]] = {}


def _conv_direct(x, w, b, pads, pool, relu, out, config, x_affine=None):
    check_f32("x", x, 4)
    check_f32("w", w, 4)
    if b is not None:
        check_f32("b", b, 1)
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
    WS, KTP = round_up(cols, 2), round_up(KT, 4)
    vec2 = pool == 2 and (kW + 1) % 2 == 0
    key = ("conv", C, H, W, K, kH, kW, t, l, pool, pH, pW, bool(relu), b is not None, KT, S, NT, MINB,
           x_affine is not None)

    def source():
        smem = 4 * (C * kH * kW * KTP + KTP + S * C * rows * WS)
        src = defines(C=C, H=H, W=W, K=K, KH=kH, KW=kW, PT=t, PL=l, P=pool, POH=pH, POW=pW, RELU=relu,
                      HASB=b is not None, XAFF=0 if x_affine is None else 1 if C == 1 else 2, KT=KT, KTP=KTP,
                      S=S, NT=NT, MINB=MINB, HP=rows, WP=cols, WS=WS, VEC2=vec2,
                      ) + LOAD_K + _CONV.replace("@CUNROLL@", str(C if C * kH * kW <= 50 else 1))
        return src, smem
    kern, smem = raw_kernel(key, source, "direct_conv")
    xa, xb = (w, w) if x_affine is None else affine_on_device(x_affine)     # read by XAFF 2 only
    a1, b1 = (float(v[0]) for v in x_affine) if x_affine is not None and C == 1 else (1.0, 0.0)   # XAFF 1
    kern((-(-N // S), -(-K // KT)), (NT,), (x, w, w if b is None else b, y, np.int32(N), xa, xb,
                                            np.float32(a1), np.float32(b1)), shared_mem=smem)
    return y


def conv2d_bias_relu_maxpool2x2_fprop(x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0,
                                      relu: bool = True, out: Array | None = None,
                                      config: Sequence[int] | None = None,
                                      x_affine: tuple[Array, Array] | None = None) -> Array:
    """y = maxpool2x2(relu(conv(x, w) + b)), stride-1 conv, floor pool, one kernel.

    x (N, C, H, W), w (K, C, kH, kW), b (K,) or None -> y (N, K, oH // 2, oW // 2); pads an int,
    a pair or (top, bottom, left, right); config (KT, S, threads[, min blocks per SM]) overrides
    the per-N choice (choose_conv); x_affine (a, b) host float32 arrays (C,): x staged as a x + b
    per channel inside the zero padding (a Normalize before the conv).
    """
    return _conv_direct(x, w, b, pads, 2, relu, out, config, x_affine)


def conv2d_bias_relu_fprop(x: Array, w: Array, b: Array | None, pads: int | Sequence[int] = 0, relu: bool = True,
                           out: Array | None = None, config: Sequence[int] | None = None) -> Array:
    """y = relu(conv(x, w) + b), stride 1, one kernel.   -> (N, K, oH, oW)."""
    return _conv_direct(x, w, b, pads, 1, relu, out, config)
