"""Batch normalisation on the GPU: one CuPy RawKernel per direction (BN, optionally fused with the
ReLU after it) where a channel's values are few, cuDNN Frontend batchnorm graphs where they are many.

Statistics are per channel over (N, H, W); x is (N, C, H, W) or (N, C). `invstd` = 1/sqrt(var + eps)
with the biased batch variance; the running variance is updated with the unbiased one, as cuDNN and
PyTorch do: r = (1 - momentum) r + momentum * batch.

Why the RawKernels: a ResNet-50 step at batch 32 has BNs of M = N*H*W = 32..6272 values per channel, where a
cuDNN batchnorm call, plus its ReLU, mask and add kernels, takes several times what one kernel does. One block
handles CB whole channels in registers (R values a thread), sums in double (two passes: no E[x^2] - E[x]^2
cancellation), updates the running statistics and writes y (ReLU included) or gx, ggamma, gbeta: one
deterministic launch a direction. In graph replays (tests/gpu/test_fused.py) they take about a third of cuDNN's
time in each direction. Above _KERNEL_MAX_M values per channel cuDNN runs (one block a channel leaves SMs idle);
where cuDNN has no engine (C not a multiple of its vector width: C = 3, 10) the RawKernels run at any size.
In float64 the RawKernels (templated on T) run at every size: the cuDNN batchnorm graphs used here are
float32 ones. Channels-last arrays (a channels-last graph, passes.channels_last) give channels-last
outputs from their own RawKernels (_norm_nhwc_cuda.py): up to 256 values a channel one launch a
direction, above that two, the values split over blocks (partial sums, then combined in a fixed
order); cuDNN's NHWC forward where it is faster (C >= 256 with M >= 4096) and above 2**20 values a
channel. In a ResNet-50 bf16 step BN's GPU time is about two thirds of what cuDNN's NHWC kernels
take (benchmarks/profile_train.py). Under a precision policy x
and gy come in the compute dtype (bfloat16, float16) while gamma, beta and the statistics stay
float32: the channels-last RawKernels and cuDNN's NHWC graphs take that mix as it is; the other
paths compute on float32 copies and round what they write to x's dtype.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array
from . import cudnn_graphs as _cd
from ._dtypes import FLOAT_DOUBLE, SINGLE_AND_HALF_CTYPES
from ._norm_cuda import BN_SOURCE
from ._norm_nhwc_cuda import BN_NHWC_SPLIT_SOURCE
from ._util import (CTYPES, RELU, RELU_BPROP, Split, astype, channels_last, empty, in_order,
                    lies_in, memory, out_array, out_arrays, pointwise, sm_count)

DTYPES = FLOAT_DOUBLE     # the RawKernels in both; cuDNN's graphs for large float32 channels

_KERNEL_MAX_M = 8192            # values per channel up to which the RawKernels beat cuDNN
_RS = (4, 8, 16)                # values a thread may keep in registers (a kernel each: fewer, fewer registers)
_PER_THREAD = 2                 # values a thread the block size aims at (at most 512 threads)
_ROW = 8                        # contiguous values a block's rows aim at when S is small (power of two, <= 32)

# One module a type and kernel (a run needs one type: the compile workers build the parts side by side, and a
# first step waits for its own type's kernels only)
_MOD = {t: Split(BN_SOURCE, [[f"{k}<{t}, {r}>" for r in _RS + (0,)] for k in ("bn_fwd", "bn_bwd")])
        for t in CTYPES.values()}

_NHWC_RS = (1, 2, 4, 8, 16)      # rows a thread of the channels-last kernels keeps (32 rows of threads a block)
_NHWC_TYPES = SINGLE_AND_HALF_CTYPES
# Thresholds from per-BN-layer timings of ResNet-50 bf16 at b32 and b256 (graph replays):
_NHWC_ONE_BLOCK_M = 256          # one block a channel up to here (faster than the split kernels there)
_CUDNN_FWD = (256, 4096)         # C, M from which cuDNN's NHWC forward is faster
_NHWC_SPLIT_MAX_M = 1 << 20      # values a channel up to which the RawKernels run (above: cuDNN)
_NHWC = {t: Split(BN_NHWC_SPLIT_SOURCE, [[f"{k}<{t}, {r}>" for r in _NHWC_RS] for k in (
    "bn_fwd_nhwc", "bn_bwd_nhwc", "bn_stats_nhwc", "bn_norm_nhwc", "bn_bwd_sums_nhwc", "bn_bwd_dx_nhwc")])
          for t in _NHWC_TYPES.values()}


def _nhwc_rows(x, gamma, forward=False):
    """(R, B) for the channels-last RawKernels where they take x, else (0, 0): a channel's M values
    in one block (B = 1, one launch a direction) up to _NHWC_ONE_BLOCK_M, else over B blocks of 32
    rows of threads, R rows a thread, the fewest that make at most a block an SM. H = W = 1 lies in
    both orders: taken too. The forward leaves to cuDNN what its NHWC kernels do faster (_CUDNN_FWD)."""
    M, C = x.size // x.shape[1], x.shape[1]
    if (x.ndim != 4 or not lies_in(x, True) or x.dtype not in _NHWC_TYPES or gamma.dtype != np.float32
            or x.size >= 2 ** 31 or M > _NHWC_SPLIT_MAX_M or forward and C >= _CUDNN_FWD[0] and M >= _CUDNN_FWD[1]):
        return 0, 0
    if M <= _NHWC_ONE_BLOCK_M:
        return next(r for r in _NHWC_RS if M <= 32 * r), 1
    tiles = -(-C // 32)
    R = next((r for r in _NHWC_RS if tiles * -(-M // (32 * r)) <= sm_count()), _NHWC_RS[-1])
    return R, -(-M // (32 * R))


def _nhwc_launch(x, R, B):
    M = x.size // x.shape[1]
    return (-(-x.shape[1] // 32), B), (32, min(32, -(-M // R))), M


_infer = cp.ElementwiseKernel(
    "T x, raw T rm, raw T rv, raw T gamma, raw T beta, T eps, int32 C, int32 S, int32 relu", "T y", """
    int c = (i / S) % C;
    T t = (x - rm[c]) * (rsqrt(rv[c] + eps) * gamma[c]) + beta[c];
    y = relu && t < (T)0 ? (T)0 : t
    """, "minidl_bn_infer")
_add2 = cp.ElementwiseKernel("T da, T db", "T a, T b", "a += da; b += db", "minidl_bn_add2")


def _geometry(x):
    N, C = x.shape[:2]
    return N, C, x.size // max(N * C, 1)


def _launch(x):
    """(grid, block, CB, R) for the RawKernels: CB channels a block, about _PER_THREAD values a thread.

    Small power-of-two S: CB*S = _ROW values of a row are contiguous (whole 32-byte sectors at 8 floats).
    """
    N, C, S = _geometry(x)
    CB = 1
    while S & (S - 1) == 0 and 2 * CB * S <= _ROW and C % (2 * CB) == 0:
        CB *= 2
    M = N * S * CB
    threads = min(512, max(32, 32 * -(-M // (32 * _PER_THREAD))))   # whole warps
    R = next((r for r in _RS if M <= r * threads), 0)     # 0: more than 16 a thread, read from memory
    return (C // CB,), (threads,), CB, R


def _use_kernel(x):
    N, C, S = _geometry(x)
    return x.dtype != np.float32 or (N * S <= _KERNEL_MAX_M and x.size < 2 ** 31)


def _check(x, *arrays):
    if x.size >= 2 ** 31:                       # the RawKernels index with 32-bit ints
        raise ValueError(f"batch norm kernels take fewer than 2**31 values, got {x.shape} {x.dtype}")
    for a in (x,) + arrays:
        if not a.flags.c_contiguous or a.dtype != x.dtype:
            raise ValueError(f"batch norm: arrays must be C-contiguous {x.dtype}, got {a.shape} {a.dtype}")


def _kernel_fprop(x, gamma, beta, rm, rv, momentum, eps, y, mean, invstd, relu):
    N, C, S = _geometry(x)
    _check(x, gamma, beta, rm, rv, y, mean, invstd)
    grid, block, CB, R = _launch(x)
    _MOD[CTYPES[x.dtype]].get(f"bn_fwd<{CTYPES[x.dtype]}, {R}>")(grid, block, (
        x, gamma, beta, y, mean, invstd, rm, rv, np.int32(N), np.int32(C), np.int32(S), np.int32(CB),
        float(eps), float(momentum), np.int32(relu)))
    return y


def _kernel_bprop(x, gy, y, gamma, mean, invstd, ggamma, gbeta, gx, relu, accumulate):
    N, C, S = _geometry(x)
    _check(x, gy, gamma, mean, invstd, ggamma, gbeta, gx, *((y,) if relu else ()))
    grid, block, CB, R = _launch(x)
    _MOD[CTYPES[x.dtype]].get(f"bn_bwd<{CTYPES[x.dtype]}, {R}>")(grid, block, (
        x, gy, y if relu else x, gamma, mean, invstd, ggamma, gbeta, gx, np.int32(N), np.int32(C), np.int32(S),
        np.int32(CB), np.int32(relu), np.int32(accumulate)))
    return gx


def _dims(x):
    """x's shape as cuDNN's 4-D (N, C, H, W) and the (1, C, 1, 1) shape of its statistics."""
    return tuple(x.shape) + (1,) * (4 - x.ndim), (1, x.shape[1], 1, 1)


def _cudnn_fprop(x, gamma, beta, rm, rv, momentum, eps, y, mean, invstd):
    xd, sd = _dims(x)

    def build(g, io):
        outs = g.batchnorm(name="bn", input=io.input("x", xd), scale=io.input("gamma", sd),
                           bias=io.input("beta", sd), in_running_mean=io.input("rm", sd),
                           in_running_var=io.input("rv", sd), epsilon=io.scalar("eps"),
                           momentum=io.scalar("momentum"))
        for name, t, dim in zip(("y", "mean", "invstd", "rm_next", "rv_next"), outs, (xd, sd, sd, sd, sd)):
            io.output(name, t, dim)

    arrays = dict(x=x, gamma=gamma, beta=beta, rm=rm, rv=rv, y=y, mean=mean, invstd=invstd, rm_next=rm, rv_next=rv)
    _cd.run("bn_fprop_train", arrays, build, scalars=dict(eps=eps, momentum=momentum))


def _cudnn_bprop(x, gy, gamma, mean, invstd, dgamma, dbeta, gx):
    """cuDNN's batchnorm_backward: overwrites gx, dgamma, dbeta."""
    xd, sd = _dims(x)

    def build(g, io):
        outs = g.batchnorm_backward(name="dbn", grad=io.input("gy", xd), input=io.input("x", xd),
                                    scale=io.input("gamma", sd), mean=io.input("mean", sd),
                                    inv_variance=io.input("invstd", sd))
        for name, t, dim in zip(("gx", "dgamma", "dbeta"), outs, (xd, sd, sd)):
            io.output(name, t, dim)

    arrays = dict(x=x, gy=gy, gamma=gamma, mean=mean, invstd=invstd, gx=gx, dgamma=dgamma, dbeta=dbeta)
    _cd.run("bn_bprop", arrays, build)


def _try(cudnn_graph, *args):
    """Whether cuDNN ran the graph (False where it has no engine for it)."""
    try:
        cudnn_graph(*args)
        return True
    except _cd.Unsupported:
        return False


def bn_fprop_train(x: Array, gamma: Array, beta: Array, running_mean: Array, running_var: Array, momentum: float,
                   eps: float, out: Array | None = None, relu: bool = False) -> tuple[Array, Array, Array]:
    """y = gamma (x - mean) invstd + beta with batch statistics, then max(y, 0) if relu.
    -> (y, mean (C,), invstd (C,)).

    Updates running_mean/var in place. `out` is y or a tuple (y, mean, invstd).
    """
    N, C, S = _geometry(x)
    if N * S < 2:
        raise ValueError(f"batch norm in training needs more than one value per channel, got input {x.shape}")
    cl = channels_last(x)
    outs = out if isinstance(out, (tuple, list)) else (out, None, None)
    y = out_array(outs[0], x.shape, x.dtype, cl=cl)
    mean, invstd = out_arrays(outs[1:], [((C,), gamma.dtype), ((C,), gamma.dtype)])
    args = (x, gamma, beta, running_mean, running_var, momentum, eps, y, mean, invstd)
    R, B = _nhwc_rows(x, gamma, forward=True)
    if R:                                      # channels-last: the RawKernels, any io type
        grid, block, M = _nhwc_launch(x, R, B)
        t, xm, ym = _NHWC_TYPES[x.dtype], memory(x, True), y.transpose(0, 2, 3, 1)
        tail = (running_mean, running_var, np.int32(M), np.int32(C), float(eps), float(momentum), np.int32(relu))
        if B == 1:                             # one launch
            _NHWC[t].get(f"bn_fwd_nhwc<{t}, {R}>")(grid, block, (xm, gamma, beta, ym, mean, invstd) + tail)
        else:                                  # partial statistics, then combined and applied
            part = cp.empty((B, C, 2), np.float64)
            _NHWC[t].get(f"bn_stats_nhwc<{t}, {R}>")(grid, block, (xm, part, np.int32(M), np.int32(C)))
            _NHWC[t].get(f"bn_norm_nhwc<{t}, {R}>")(grid, block, (xm, part, gamma, beta, ym, mean, invstd) + tail)
        return y, mean, invstd
    if x.dtype != gamma.dtype:                 # x in a policy's compute dtype: statistics in float32
        if cl and _try(_cudnn_fprop, *args):   # cuDNN reads and writes the half type itself
            return (pointwise(RELU, y, out=y) if relu else y), mean, invstd
        y32 = bn_fprop_train(astype(x, gamma.dtype), *args[1:7], out=(None, mean, invstd), relu=relu)[0]
        y[...] = astype(y32, x.dtype)
        return y, mean, invstd
    if cl or not _use_kernel(x):               # channels-last: cuDNN's NHWC kernels where ours leave it
        try:
            _cudnn_fprop(*args)
            if relu:
                pointwise(RELU, y, out=y)
            return y, mean, invstd
        except _cd.Unsupported:
            pass
    if cl:                                      # the RawKernels read NCHW: through a copy
        yc = _kernel_fprop(cp.ascontiguousarray(x), *args[1:7], cp.empty(x.shape, x.dtype), mean, invstd, relu)
        y[...] = yc
        return y, mean, invstd
    _kernel_fprop(*args, relu)
    return y, mean, invstd


def bn_fprop_infer(x: Array, gamma: Array, beta: Array, running_mean: Array, running_var: Array, eps: float,
                   out: Array | None = None, relu: bool = False) -> Array:
    """y = gamma (x - running_mean) / sqrt(running_var + eps) + beta, then max(y, 0) if relu.   x -> y."""
    N, C, S = _geometry(x)
    cl = channels_last(x)
    y = out_array(out, x.shape, x.dtype, cl=cl)
    if x.dtype != gamma.dtype:                 # a policy's compute dtype: computed in float32, then rounded
        y[...] = astype(bn_fprop_infer(astype(x, gamma.dtype), gamma, beta, running_mean, running_var, eps,
                                       relu=relu), x.dtype)
        return y
    if cl:                                      # on the NHWC views the channel is the innermost index
        S, x, yv = 1, memory(x, True), y.transpose(0, 2, 3, 1)
    else:
        yv = y
    _infer(x, running_mean, running_var, gamma, beta, eps, np.int32(C), np.int32(S), np.int32(relu), yv)
    return y


def bn_bprop(x: Array, gy: Array, gamma: Array, mean: Array, invstd: Array, ggamma: Array, gbeta: Array,
             out: Array | None = None, y: Array | None = None, relu: bool = False, accumulate: bool = True) -> Array:
    """gx of batch norm in training mode (of BN + ReLU if relu: gy masked by y > 0, y the fused output);
    adds into ggamma, gbeta, or overwrites them if not accumulate.   x, gy (N, C, H, W) -> gx."""
    if relu and (y is None or y.shape != x.shape):
        raise ValueError("bn_bprop: relu=True needs y, the output of bn_fprop_train(..., relu=True)")
    cl = channels_last(x)
    gx = out_array(out, x.shape, x.dtype, cl=cl)
    gy = in_order(gy, cl)
    R, B = _nhwc_rows(x, gamma)
    if R:                                      # channels-last: the RawKernels, any io type
        grid, block, M = _nhwc_launch(x, R, B)
        C, t, xm, gym = x.shape[1], _NHWC_TYPES[x.dtype], memory(x, True), memory(gy, True)
        ym, gxm = memory(y if relu else x, True), gx.transpose(0, 2, 3, 1)
        tail = (np.int32(M), np.int32(C), np.int32(relu))
        if B == 1:                             # one launch
            _NHWC[t].get(f"bn_bwd_nhwc<{t}, {R}>")(grid, block, (
                xm, gym, ym, gamma, mean, invstd, ggamma, gbeta, gxm) + tail + (np.int32(accumulate),))
        else:                                  # partial sums, then combined and applied
            part = cp.empty((B, C, 2), np.float64)
            _NHWC[t].get(f"bn_bwd_sums_nhwc<{t}, {R}>")(grid, block, (xm, gym, ym, mean, invstd, part) + tail)
            _NHWC[t].get(f"bn_bwd_dx_nhwc<{t}, {R}>")(grid, block, (
                xm, gym, ym, gamma, mean, invstd, part, ggamma, gbeta, gxm) + tail + (np.int32(accumulate),))
        return gx
    mixed = x.dtype != gamma.dtype             # x, gy in a policy's compute dtype
    if mixed and not cl:                       # the RawKernels: in float32, gx rounded
        gx[...] = astype(bn_bprop(astype(x, gamma.dtype), astype(gy, gamma.dtype), gamma, mean, invstd, ggamma,
                                  gbeta, y=None if y is None else astype(y, gamma.dtype), relu=relu,
                                  accumulate=accumulate), x.dtype)
        return gx
    if cl or not _use_kernel(x):
        if relu:                                 # masked gy in a temporary of gy's memory order
            gy, relu = pointwise(RELU_BPROP, y, gy, out=empty(x.shape, x.dtype, cl)), False
        # cuDNN overwrites dscale/dbias: accumulating goes through temporaries and an add.
        dgamma = cp.empty(ggamma.shape, ggamma.dtype) if accumulate else ggamma
        dbeta = cp.empty(gbeta.shape, gbeta.dtype) if accumulate else gbeta
        try:
            _cudnn_bprop(x, gy, gamma, mean, invstd, dgamma, dbeta, gx)
            if accumulate:
                _add2(dgamma, dbeta, ggamma, gbeta)
            return gx
        except _cd.Unsupported:
            pass
    if mixed:                                  # cuDNN took no half io here: in float32, gx rounded
        gx[...] = astype(bn_bprop(astype(x, gamma.dtype), astype(gy, gamma.dtype), gamma, mean, invstd, ggamma,
                                  gbeta, accumulate=accumulate), x.dtype)        # gy is masked already
        return gx
    if cl:                                      # the RawKernels read NCHW: through copies
        gx[...] = _kernel_bprop(cp.ascontiguousarray(x), cp.ascontiguousarray(gy), None, gamma, mean, invstd,
                                ggamma, gbeta, cp.empty(x.shape, x.dtype), False, accumulate)
        return gx
    _kernel_bprop(x, gy, y, gamma, mean, invstd, ggamma, gbeta, gx, relu, accumulate)
    return gx
