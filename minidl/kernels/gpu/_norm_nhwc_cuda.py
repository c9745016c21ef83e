"""The CUDA source of the channels-last batch-norm RawKernels (norm.py): x is (M, C) in memory, the
channel innermost. A block of 32 x RY threads holds 32 channels (lane tx: channel c0 + tx, so a warp
reads 32 neighbouring values) and the rows ty, ty + RY, ... of them, at most R a thread, in
registers: one launch a direction for M <= R * RY, sums in double in a fixed order (deterministic).
T, the io type: float, __half or __nv_bfloat16 (read as float, written rounded once); the
parameters and statistics are float.
"""
from ._util import HALF_CODE

BN_NHWC_SOURCE = HALF_CODE + r"""
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template<typename T> __device__ __forceinline__ T from_f(float v);
template<> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template<> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template<> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// The sum over the block's rows of each column (channel), returned to every thread of it.
__device__ double column_sum(double v) {
    __shared__ double part[32][33], total[32];
    part[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0) {
        double s = 0;
        for (int k = 0; k < blockDim.y; ++k) s += part[k][threadIdx.x];
        total[threadIdx.x] = s;
    }
    __syncthreads();
    return total[threadIdx.x];
}

// y = gamma (x - mean) invstd + beta, then max(y, 0) if relu; writes mean, invstd, the running statistics.
template<typename T, int R>
__global__ void __launch_bounds__(1024)
bn_fwd_nhwc(const T* x, const float* gamma, const float* beta, T* y, float* mean, float* invstd, float* rm,
            float* rv, int M, int C, double eps, double momentum, int relu) {
    int c = blockIdx.x * 32 + threadIdx.x, RY = blockDim.y;
    bool on = c < C;
    float v[R];
    double s = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = threadIdx.y + i * RY;
        v[i] = on && m < M ? to_f(x[(long long)m * C + c]) : 0.f;
        s += v[i];
    }
    double mu = column_sum(s) / M, q = 0;
#pragma unroll
    for (int i = 0; i < R; ++i)
        if (threadIdx.y + i * RY < M) { double d = v[i] - mu; q += d * d; }
    double var = column_sum(q) / M, inv = rsqrt(var + eps);
    if (!on) return;
    if (threadIdx.y == 0) {
        mean[c] = mu; invstd[c] = inv;
        rm[c] = (1 - momentum) * rm[c] + momentum * mu;
        rv[c] = (1 - momentum) * rv[c] + momentum * var * M / (M > 1 ? M - 1 : 1);
    }
    float m0 = mu, scale = gamma[c] * (float)inv, b = beta[c];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = threadIdx.y + i * RY;
        if (m < M) { float t = (v[i] - m0) * scale + b; y[(long long)m * C + c] = from_f<T>(relu && t < 0.f ? 0.f : t); }
    }
}

// g = gy masked by y > 0 if relu; ggamma (+)= sum g xhat, gbeta (+)= sum g;
// gx = gamma invstd (g - mean(g) - xhat mean(g xhat)).
template<typename T, int R>
__global__ void __launch_bounds__(1024)
bn_bwd_nhwc(const T* x, const T* gy, const T* y, const float* gamma, const float* mean, const float* invstd,
            float* ggamma, float* gbeta, T* gx, int M, int C, int relu, int accumulate) {
    int c = blockIdx.x * 32 + threadIdx.x, RY = blockDim.y;
    bool on = c < C;
    float mu = on ? mean[c] : 0.f, inv = on ? invstd[c] : 0.f;
    float xh[R], g[R];
    double s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = threadIdx.y + i * RY;
        xh[i] = 0.f; g[i] = 0.f;
        if (on && m < M) {
            long long k = (long long)m * C + c;
            xh[i] = (to_f(x[k]) - mu) * inv;
            g[i] = relu && !(to_f(y[k]) > 0.f) ? 0.f : to_f(gy[k]);
        }
        s0 += g[i]; s1 += (double)g[i] * xh[i];
    }
    s0 = column_sum(s0);
    s1 = column_sum(s1);
    if (!on) return;
    if (threadIdx.y == 0) {
        gbeta[c] = accumulate ? (float)(gbeta[c] + s0) : (float)s0;
        ggamma[c] = accumulate ? (float)(ggamma[c] + s1) : (float)s1;
    }
    float a = gamma[c] * inv, mb = s0 / M, mg = s1 / M;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = threadIdx.y + i * RY;
        if (m < M) gx[(long long)m * C + c] = from_f<T>(a * (g[i] - mb - xh[i] * mg));
    }
}
"""
