"""The CUDA source of the channels-last batch-norm RawKernels (norm.py): x is (M, C) in memory, the
channel innermost. A block of 32 x RY threads holds 32 channels (lane tx: channel c0 + tx, so a warp
reads 32 neighbouring values) and the rows ty, ty + RY, ... of them, at most R a thread, in
registers: one launch a direction for M <= R * RY, sums in double in a fixed order (deterministic).
T, the io type: float, __half or __nv_bfloat16 (read as float, written rounded once to nearest even
by _cuda's from_f); the parameters and statistics are float.
"""
from ._cuda import HALF_CODE

BN_NHWC_SOURCE = HALF_CODE + r"""
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
        if (m < M) {
            float t = (v[i] - m0) * scale + b;
            y[(long long)m * C + c] = from_f<T>(relu && t < 0.f ? 0.f : t);
        }
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

# Channels-last BN where a channel has more values than one block keeps: the rows are split over
# gridDim.y blocks of 32 x RY threads, R rows a thread (RB = R * RY rows a block). Each direction is
# two launches: partial sums per (block row, channel) into `part` (doubles), then a pass that combines
# them in block order (deterministic) and writes the outputs; block row 0 writes the per-channel ones.
BN_NHWC_SPLIT_SOURCE = BN_NHWC_SOURCE + r"""
// part[b][c] = (mean, M2) of block row b's values of channel c: two passes over registers.
template<typename T, int R>
__global__ void __launch_bounds__(1024)
bn_stats_nhwc(const T* x, double* part, int M, int C) {
    int c = blockIdx.x * 32 + threadIdx.x, RY = blockDim.y, m0 = blockIdx.y * R * RY;
    bool on = c < C;
    int n = min(R * RY, M - m0);
    float v[R];
    double s = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = threadIdx.y + i * RY;
        v[i] = on && m < n ? to_f(x[(long long)(m0 + m) * C + c]) : 0.f;
        s += v[i];
    }
    double mu = column_sum(s) / n, q = 0;
#pragma unroll
    for (int i = 0; i < R; ++i)
        if (threadIdx.y + i * RY < n) { double d = v[i] - mu; q += d * d; }
    q = column_sum(q);
    if (on && threadIdx.y == 0) {
        double* p = part + 2 * ((long long)blockIdx.y * C + c);
        p[0] = mu; p[1] = q;
    }
}

// The channel's (mean, M2) from the blocks' partials, returned to every thread of the column: row ty
// of the block takes block rows ty, ty + RY, ... and column_sum adds the rows in order (deterministic);
// M2 = sum over blocks of M2_b + n_b (mean_b - mean)^2 (Chan et al.'s parallel variance).
__device__ void combine_stats(const double* part, int c, int C, int M, int RB, double& mu, double& m2) {
    double s = 0, q = 0;
    for (int b = threadIdx.y; b < gridDim.y && c < C; b += blockDim.y)
        s += min(RB, M - b * RB) * part[2 * ((long long)b * C + c)];
    mu = column_sum(s) / M;
    for (int b = threadIdx.y; b < gridDim.y && c < C; b += blockDim.y) {
        const double* p = part + 2 * ((long long)b * C + c);
        double d = p[0] - mu;
        q += p[1] + min(RB, M - b * RB) * d * d;
    }
    m2 = column_sum(q);
}

template<typename T, int R>
__global__ void __launch_bounds__(1024)
bn_norm_nhwc(const T* x, const double* part, const float* gamma, const float* beta, T* y, float* mean,
             float* invstd, float* rm, float* rv, int M, int C, double eps, double momentum, int relu) {
    int c = blockIdx.x * 32 + threadIdx.x, RY = blockDim.y, RB = R * RY, m0 = blockIdx.y * RB;
    double mu, m2;
    combine_stats(part, c, C, M, RB, mu, m2);
    if (c >= C) return;
    double var = m2 / M, inv = rsqrt(var + eps);
    if (blockIdx.y == 0 && threadIdx.y == 0) {
        mean[c] = mu; invstd[c] = inv;
        rm[c] = (1 - momentum) * rm[c] + momentum * mu;
        rv[c] = (1 - momentum) * rv[c] + momentum * var * M / (M > 1 ? M - 1 : 1);
    }
    float mf = mu, scale = gamma[c] * (float)inv, b = beta[c];
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = m0 + threadIdx.y + i * RY;
        if (m < M) {
            long long k = (long long)m * C + c;
            float t = (to_f(x[k]) - mf) * scale + b;
            y[k] = from_f<T>(relu && t < 0.f ? 0.f : t);
        }
    }
}

// part[b][c] = (sum g, sum g xhat) over block row b, g = gy masked by y > 0 if relu.
template<typename T, int R>
__global__ void __launch_bounds__(1024)
bn_bwd_sums_nhwc(const T* x, const T* gy, const T* y, const float* mean, const float* invstd, double* part,
                 int M, int C, int relu) {
    int c = blockIdx.x * 32 + threadIdx.x, RY = blockDim.y, m0 = blockIdx.y * R * RY;
    bool on = c < C;
    float mu = on ? mean[c] : 0.f, inv = on ? invstd[c] : 0.f;
    double s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = m0 + threadIdx.y + i * RY;
        if (on && m < M) {
            long long k = (long long)m * C + c;
            float g = relu && !(to_f(y[k]) > 0.f) ? 0.f : to_f(gy[k]);
            s0 += g; s1 += (double)g * ((to_f(x[k]) - mu) * inv);
        }
    }
    s0 = column_sum(s0);
    s1 = column_sum(s1);
    if (on && threadIdx.y == 0) {
        double* p = part + 2 * ((long long)blockIdx.y * C + c);
        p[0] = s0; p[1] = s1;
    }
}

template<typename T, int R>
__global__ void __launch_bounds__(1024)
bn_bwd_dx_nhwc(const T* x, const T* gy, const T* y, const float* gamma, const float* mean, const float* invstd,
               const double* part, float* ggamma, float* gbeta, T* gx, int M, int C, int relu, int accumulate) {
    int c = blockIdx.x * 32 + threadIdx.x, RY = blockDim.y, m0 = blockIdx.y * R * RY;
    bool on = c < C;
    double s0 = 0, s1 = 0;                // the blocks' partials, as combine_stats adds them
    for (int b = threadIdx.y; b < gridDim.y && on; b += RY) {
        s0 += part[2 * ((long long)b * C + c)];
        s1 += part[2 * ((long long)b * C + c) + 1];
    }
    s0 = column_sum(s0);
    s1 = column_sum(s1);
    if (!on) return;
    if (blockIdx.y == 0 && threadIdx.y == 0) {
        gbeta[c] = accumulate ? (float)(gbeta[c] + s0) : (float)s0;
        ggamma[c] = accumulate ? (float)(ggamma[c] + s1) : (float)s1;
    }
    float mu = mean[c], inv = invstd[c], a = gamma[c] * inv, mb = s0 / M, mg = s1 / M;
#pragma unroll
    for (int i = 0; i < R; ++i) {
        int m = m0 + threadIdx.y + i * RY;
        if (m < M) {
            long long k = (long long)m * C + c;
            float g = relu && !(to_f(y[k]) > 0.f) ? 0.f : to_f(gy[k]);
            gx[k] = from_f<T>(a * (g - mb - (to_f(x[k]) - mu) * inv * mg));
        }
    }
}
"""
