"""The CUDA source of the batch-norm RawKernels (norm.py): bn_fwd and bn_bwd, templated on the value
type T and on R, the values a thread keeps in registers (0: read from memory). NCHW arrays only:
norm.py gives channels-last ones to cuDNN.
"""

BN_SOURCE = r"""
// A block holds CB channels c0..c0+CB-1 of x (N, C, S): N rows of L = CB*S contiguous values, the row n at
// (n*C + c0)*S. With CB > 1, S and L are powers of two, L <= 32 and blockDim a multiple of 32, so a thread's
// column is always lane % L: its channel c0 + (lane % L) / S is the same for all its values.
#define CHANNEL (CB == 1 ? 0 : (threadIdx.x & 31) % L / S)
#define WRITER (CB == 1 ? threadIdx.x == 0 : threadIdx.x < L && threadIdx.x % S == 0)

// The values a thread meets, blockDim apart: row n, column r, stepped without divisions.
struct Walk {
    int n, r, dn, dr, L, at0, CS;
    __device__ Walk(int L, int C, int S, int c0)
        : n(threadIdx.x / L), r(threadIdx.x % L), dn(blockDim.x / L), dr(blockDim.x % L), L(L), at0(c0 * S),
          CS(C * S) {}
    __device__ int at() const { return n * CS + at0 + r; }
    __device__ void next() { n += dn; r += dr; if (r >= L) { r -= L; ++n; } }
};

// Sums over the threads of one channel, returned to every thread of it; fixed order: deterministic.
template<int K> __device__ void channel_sum(double (&v)[K], int S, int L, int CB) {
    __shared__ double part[K][16][32];           // [value][warp][channel in block]: at most 512 threads
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5, ch = CHANNEL;
    for (int o = 16; o > 0; o >>= 1)
        if (o < S || o >= L)                     // lanes l and l^o hold one channel (always, when CB == 1)
            for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffff, v[k], o);
    __syncthreads();                             // earlier readers of part are done
    if (CB == 1 ? lane == 0 : lane < L && lane % S == 0)
        for (int k = 0; k < K; ++k) part[k][warp][ch] = v[k];
    __syncthreads();
    for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int w = 0; w < nwarps; ++w) s += part[k][w][ch];
        v[k] = s;
    }
}

// y = gamma (x - mean) invstd + beta, then max(y, 0) if relu; writes mean, invstd, the running statistics.
// R > 0: the thread's at most R values stay in registers; R == 0: they are read again from memory.
template<typename T, int R>
__global__ void __launch_bounds__(512)
bn_fwd(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* invstd, T* rm, T* rv,
       int N, int C, int S, int CB, double eps, double momentum, int relu) {
    int L = CB * S, c0 = blockIdx.x * CB, c = c0 + CHANNEL;
    double Mc = (double)N * S;
    T v[R > 0 ? R : 1];
    double s[1] = {0}, q[1] = {0};
    if (R > 0) {
        Walk w(L, C, S, c0);
#pragma unroll
        for (int i = 0; i < R; ++i, w.next()) { v[i] = w.n < N ? x[w.at()] : (T)0; s[0] += v[i]; }
    } else {
        for (Walk w(L, C, S, c0); w.n < N; w.next()) s[0] += x[w.at()];
    }
    channel_sum<1>(s, S, L, CB);
    double mu = s[0] / Mc;
    if (R > 0) {
        Walk w(L, C, S, c0);
#pragma unroll
        for (int i = 0; i < R; ++i, w.next()) if (w.n < N) { double d = v[i] - mu; q[0] += d * d; }
    } else {
        for (Walk w(L, C, S, c0); w.n < N; w.next()) { double d = x[w.at()] - mu; q[0] += d * d; }
    }
    channel_sum<1>(q, S, L, CB);
    double var = q[0] / Mc, inv = rsqrt(var + eps);
    if (WRITER) {
        mean[c] = mu; invstd[c] = inv;
        rm[c] = (1 - momentum) * rm[c] + momentum * mu;
        rv[c] = (1 - momentum) * rv[c] + momentum * var * Mc / (Mc > 1 ? Mc - 1 : 1);
    }
    T m = mu, scale = gamma[c] * inv, b = beta[c];
    Walk w(L, C, S, c0);
    if (R > 0) {
#pragma unroll
        for (int i = 0; i < R; ++i, w.next())
            if (w.n < N) { T t = (v[i] - m) * scale + b; y[w.at()] = relu && t < (T)0 ? (T)0 : t; }
    } else {
        for (; w.n < N; w.next()) { T t = (x[w.at()] - m) * scale + b; y[w.at()] = relu && t < (T)0 ? (T)0 : t; }
    }
}

// gy' = gy masked by y > 0 if relu; ggamma (+)= sum gy' xhat, gbeta (+)= sum gy';
// gx = gamma invstd (gy' - mean(gy') - xhat mean(gy' xhat)).
template<typename T, int R>
__global__ void __launch_bounds__(512)
bn_bwd(const T* x, const T* gy, const T* y, const T* gamma, const T* mean, const T* invstd,
       T* ggamma, T* gbeta, T* gx, int N, int C, int S, int CB, int relu, int accumulate) {
    int L = CB * S, c0 = blockIdx.x * CB, c = c0 + CHANNEL;
    double Mc = (double)N * S;
    T mu = mean[c], inv = invstd[c];
    T xh[R > 0 ? R : 1], g[R > 0 ? R : 1];
    double s[2] = {0, 0};                        // sum gy', sum gy' xhat
    if (R > 0) {
        Walk w(L, C, S, c0);
#pragma unroll
        for (int i = 0; i < R; ++i, w.next()) {
            xh[i] = 0; g[i] = 0;
            if (w.n < N) {
                int k = w.at();
                xh[i] = (x[k] - mu) * inv;
                g[i] = relu && !(y[k] > (T)0) ? (T)0 : gy[k];
            }
            s[0] += g[i]; s[1] += (double)g[i] * xh[i];
        }
    } else {
        for (Walk w(L, C, S, c0); w.n < N; w.next()) {
            int k = w.at();
            T gk = relu && !(y[k] > (T)0) ? (T)0 : gy[k];
            s[0] += gk; s[1] += (double)gk * ((x[k] - mu) * inv);
        }
    }
    channel_sum<2>(s, S, L, CB);
    if (WRITER) {
        gbeta[c] = accumulate ? (T)(gbeta[c] + s[0]) : (T)s[0];
        ggamma[c] = accumulate ? (T)(ggamma[c] + s[1]) : (T)s[1];
    }
    T a = gamma[c] * inv, mb = s[0] / Mc, mg = s[1] / Mc;
    Walk w(L, C, S, c0);
    if (R > 0) {
#pragma unroll
        for (int i = 0; i < R; ++i, w.next())
            if (w.n < N) gx[w.at()] = a * (g[i] - mb - xh[i] * mg);
    } else {
        for (; w.n < N; w.next()) {
            int k = w.at();
            T gk = relu && !(y[k] > (T)0) ? (T)0 : gy[k];
            gx[k] = a * (gk - mb - (x[k] - mu) * inv * mg);
        }
    }
}
"""
