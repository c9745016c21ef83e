"""The CUDA device functions the chain kernel's generated source is built on (see chain.py).

copy_async / cp_async_commit / cp_async_wait: cp.async copies global -> shared memory that land
while the conv stages compute. conv_stage: one stride-1 conv + bias (+ ReLU) (+ PxP max-pool) of
one sample, shared memory to shared memory. dense_rows: a warp per RO output rows of a dense layer.
The source expects `#define NT` (threads a block) before it.
"""
from ._util import LOAD_K, REDUCE

CHAIN_LIB = REDUCE + LOAD_K + r"""
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
                        const bool inside = (unsigned)yy < (unsigned)H && (unsigned)xx < (unsigned)W;
                        pt[r][q] = (!CHECK || inside) ? ic[yy * WS + xx] : 0.f;
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
