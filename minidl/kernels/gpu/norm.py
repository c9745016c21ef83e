"""Batch normalisation on the GPU: cuDNN Frontend batchnorm / batchnorm_backward where cuDNN has an
engine, CuPy kernels elsewhere.

Statistics are per channel over (N, H, W); x is (N, C, H, W) or (N, C). `invstd` = 1/sqrt(var + eps)
with the biased batch variance; the running variance is updated with the unbiased one, as cuDNN and
PyTorch do: r = (1 - momentum) r + momentum * batch.

Why two paths (probed on an H100, cuDNN 9.19, FP32 NCHW): cuDNN's batchnorm engines reject channel
counts that are not a multiple of their vector width ("tunable_params.c % elements_per_ldg != 0":
C = 3, 6, 10 fail, C = 16 builds), and batchnorm_inference found no engine for NCHW at all. So the
training graphs are tried once per shape and, where cuDNN has no engine (`cudnn.Unsupported`,
remembered per shape), the CuPy kernels below run instead: one block per channel, sums in double,
two passes for the variance. Inference is always one CuPy elementwise kernel.
"""
import cupy as cp
import numpy as np

from . import cudnn as _cd
from ._util import CTYPES, REDUCE, Module, buffer, out_arrays

_MOD = Module(REDUCE + r"""
// AT(j): offset of the j-th of channel c's M = N*S elements in x (N, C, S)
#define AT(j) ((((j) / S) * C + c) * S + (j) % S)
template<typename T>
__global__ void bn_stats(const T* x, T* mean, T* invstd, T* rm, T* rv, long long N, long long C, long long S,
                         double eps, double momentum) {
    long long c = blockIdx.x, M = N * S;
    __shared__ double mu;
    double acc = 0;
    for (long long j = threadIdx.x; j < M; j += blockDim.x) acc += x[AT(j)];
    acc = block_sum(acc);
    if (threadIdx.x == 0) mu = acc / M;
    __syncthreads();
    double sq = 0;
    for (long long j = threadIdx.x; j < M; j += blockDim.x) { double d = x[AT(j)] - mu; sq += d * d; }
    sq = block_sum(sq);
    if (threadIdx.x == 0) {
        double var = sq / M;
        mean[c] = mu; invstd[c] = rsqrt(var + eps);
        rm[c] = (1 - momentum) * rm[c] + momentum * mu;
        rv[c] = (1 - momentum) * rv[c] + momentum * var * M / (M > 1 ? M - 1 : 1);
    }
}

// sums of gy and gy * xhat per channel: added into ggamma, gbeta and kept (dgamma, dbeta) for the gx pass
template<typename T>
__global__ void bn_bwd_stats(const T* x, const T* gy, const T* mean, const T* invstd, T* ggamma, T* gbeta,
                             T* dgamma, T* dbeta, long long N, long long C, long long S) {
    long long c = blockIdx.x, M = N * S;
    double mu = mean[c], inv = invstd[c], sb = 0, sg = 0;
    for (long long j = threadIdx.x; j < M; j += blockDim.x) {
        long long k = AT(j);
        sb += gy[k]; sg += gy[k] * (x[k] - mu) * inv;
    }
    sb = block_sum(sb);
    __syncthreads();
    sg = block_sum(sg);
    if (threadIdx.x == 0) { dgamma[c] = sg; dbeta[c] = sb; ggamma[c] += sg; gbeta[c] += sb; }
}
""", [f"{k}<{t}>" for k in ("bn_stats", "bn_bwd_stats") for t in CTYPES.values()])

_INDEX = "int c = (i / S) % C;"
_apply = cp.ElementwiseKernel(
    "T x, raw T mean, raw T invstd, raw T gamma, raw T beta, int32 C, int32 S", "T y",
    _INDEX + "y = (x - mean[c]) * (invstd[c] * gamma[c]) + beta[c]", "minidl_bn_apply")
_infer = cp.ElementwiseKernel(
    "T x, raw T rm, raw T rv, raw T gamma, raw T beta, T eps, int32 C, int32 S", "T y",
    _INDEX + "y = (x - rm[c]) * (rsqrt(rv[c] + eps) * gamma[c]) + beta[c]", "minidl_bn_infer")
_bwd = cp.ElementwiseKernel(
    "T x, T gy, raw T mean, raw T invstd, raw T gamma, raw T dgamma, raw T dbeta, T invM, int32 C, int32 S",
    "T gx", _INDEX + """
    T xhat = (x - mean[c]) * invstd[c];
    gx = gamma[c] * invstd[c] * (gy - dbeta[c] * invM - xhat * dgamma[c] * invM)
    """, "minidl_bn_bprop")
_add2 = cp.ElementwiseKernel("T da, T db", "T a, T b", "a += da; b += db", "minidl_bn_add2")


def _dims(x):
    """x's shape as cuDNN's 4-D (N, C, H, W) and the (1, C, 1, 1) shape of its statistics."""
    return tuple(x.shape) + (1,) * (4 - x.ndim), (1, x.shape[1], 1, 1)


def _geometry(x):
    N, C = x.shape[:2]
    return N, C, x.size // max(N * C, 1)


def bn_fprop_train(x, gamma, beta, running_mean, running_var, momentum, eps, out=None):
    """y = gamma (x - mean) invstd + beta with batch statistics.  -> (y, mean (C,), invstd (C,)).

    Updates running_mean/var in place. `out` is y or a tuple (y, mean, invstd).
    """
    N, C, S = _geometry(x)
    y, mean, invstd = out_arrays(out, [(x.shape, x.dtype), ((C,), gamma.dtype), ((C,), gamma.dtype)])
    xd, sd = _dims(x)

    def build(g, io):
        outs = g.batchnorm(name="bn", input=io.input("x", xd), scale=io.input("gamma", sd),
                           bias=io.input("beta", sd), in_running_mean=io.input("rm", sd),
                           in_running_var=io.input("rv", sd), epsilon=io.scalar("eps"),
                           momentum=io.scalar("momentum"))
        for name, t, dim in zip(("y", "mean", "invstd", "rm_next", "rv_next"), outs, (xd, sd, sd, sd, sd)):
            io.output(name, t, dim)

    arrays = dict(x=x, gamma=gamma, beta=beta, rm=running_mean, rv=running_var, y=y, mean=mean,
                  invstd=invstd, rm_next=running_mean, rv_next=running_var)
    try:
        _cd.run("bn_fprop_train", arrays, build, scalars=dict(eps=eps, momentum=momentum))
    except _cd.Unsupported:
        _MOD.get(f"bn_stats<{CTYPES[x.dtype]}>")((C,), (512,), (x, mean, invstd, running_mean, running_var,
                                                  np.int64(N), np.int64(C), np.int64(S), float(eps), float(momentum)))
        _apply(x, mean, invstd, gamma, beta, np.int32(C), np.int32(S), y)
    return y, mean, invstd


def bn_fprop_infer(x, gamma, beta, running_mean, running_var, eps, out=None):
    """y = gamma (x - running_mean) / sqrt(running_var + eps) + beta.   x (N, C, H, W) -> y."""
    N, C, S = _geometry(x)
    y, = out_arrays(out, [(x.shape, x.dtype)])
    _infer(x, running_mean, running_var, gamma, beta, eps, np.int32(C), np.int32(S), y)
    return y


def bn_bprop(x, gy, gamma, mean, invstd, ggamma, gbeta, out=None):
    """gx of batch norm in training mode; adds into ggamma, gbeta.   x, gy (N, C, H, W) -> gx."""
    N, C, S = _geometry(x)
    gx, = out_arrays(out, [(x.shape, x.dtype)])
    xd, sd = _dims(x)
    # cuDNN overwrites dscale/dbias: they go to scratch buffers, then add into the gradients.
    dgamma = buffer("bn_dgamma", ggamma.shape, ggamma.dtype)
    dbeta = buffer("bn_dbeta", gbeta.shape, gbeta.dtype)

    def build(g, io):
        outs = g.batchnorm_backward(name="dbn", grad=io.input("gy", xd), input=io.input("x", xd),
                                    scale=io.input("gamma", sd), mean=io.input("mean", sd),
                                    inv_variance=io.input("invstd", sd))
        for name, t, dim in zip(("gx", "dgamma", "dbeta"), outs, (xd, sd, sd)):
            io.output(name, t, dim)

    arrays = dict(x=x, gy=gy, gamma=gamma, mean=mean, invstd=invstd, gx=gx, dgamma=dgamma, dbeta=dbeta)
    try:
        _cd.run("bn_bprop", arrays, build)
        _add2(dgamma, dbeta, ggamma, gbeta)
    except _cd.Unsupported:
        _MOD.get(f"bn_bwd_stats<{CTYPES[x.dtype]}>")((C,), (512,), (x, gy, mean, invstd, ggamma, gbeta, dgamma, dbeta,
                                                      np.int64(N), np.int64(C), np.int64(S)))
        _bwd(x, gy, mean, invstd, gamma, dgamma, dbeta, x.dtype.type(1.0 / (N * S)), np.int32(C), np.int32(S), gx)
    return gx
