"""2-D convolution on the GPU: cuDNN Frontend graphs for fprop (+ fused bias), dgrad and wgrad.

float32; float16 and bfloat16 (a precision policy: half io, float accumulation, bias and ReLU fused
on float intermediates); and float64 where this cuDNN builds double convolutions (`dtype_problem`
asks it once per GPU, so a model is refused at build rather than in its first step). In float64
cuDNN runs the convolution alone, in double, and one CuPy kernel adds the bias and applies the ReLU.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..._types import Array, DTypeLike
from ..shapes import ConvPlan, conv2d_plan  # plans are shape arithmetic: one definition
from . import _cublaslt as _lt, cudnn_graphs as _cd, engines, small_conv as _small
from ._dtypes import ELEMENTWISE
from ._util import ADD_RELU, NHWC, RELU, channels_last, in_order, lies_in, memory, out_array, pointwise

# float64: cuDNN's double engines, if it has them (dtype_problem); float16/bfloat16: half io, FLOAT compute
DTYPES = ELEMENTWISE

# y (N, K, S) += b[k], then max(y, 0) if relu: the float64 epilogue (fused into the cuDNN graph in float32).
_bias_act = cp.ElementwiseKernel("raw T b, int32 K, int32 S, int32 relu", "T y",
                                 "T t = y + b[(i / S) % K]; y = relu && t < (T)0 ? (T)0 : t", "minidl_conv_bias_act")
# Batches of at most SMALL_N samples may convolve forward in small_conv.py's kernel (a GEMV a block)
# instead: each shape is timed both ways once (engines.fastest). At batch 1 it wins most of
# ResNet-50's convolutions in float32 and about a third in bfloat16, where cuDNN's batch-tiled engines
# spend many times what reading the weights takes; at batch 2 and beyond it lost more than it won.
SMALL_N = 1
_verdicts: dict[tuple[int, bool], str | None]
_verdicts = {}      # (GPU, deterministic engines only) -> None, or why cuDNN builds no float64 convolution


def dtype_problem(dtype: DTypeLike) -> str | None:
    """None where this cuDNN convolves in `dtype`, else why not (one line). float32: always. float64:
    tried once per GPU: fprop, dgrad and wgrad of a small convolution in double must build, run and
    agree with the CPU's float64 kernels (a cuDNN has been seen to run them but give wrong values)."""
    if np.dtype(dtype) != np.float64:
        return None
    key = (cp.cuda.runtime.getDevice(), _cd.deterministic_only())
    if key not in _verdicts:
        _verdicts[key] = _try_float64()
    return _verdicts[key]


def _try_float64():
    from ..cpu import conv as cpu              # the reference: same plans, NumPy in float64
    plan = conv2d_plan((2, 3, 6, 6), (4, 3, 3, 3), (1, 1), 1, (1, 1))
    rng = np.random.default_rng(0)
    x, w, gy = (rng.standard_normal(s) for s in ((2,) + plan.in_shape[1:], plan.w_shape, (2,) + plan.out_shape[1:]))
    gw = np.zeros_like(w)
    cpu.conv2d_wgrad(plan, x, gy, gw, accumulate=False)     # writes gw
    want = (cpu.conv2d_fprop(plan, x, w), cpu.conv2d_dgrad(plan, gy, w), gw)
    try:
        got = (conv2d_fprop(plan, cp.asarray(x), cp.asarray(w)), conv2d_dgrad(plan, cp.asarray(gy), cp.asarray(w)),
               conv2d_wgrad(plan, cp.asarray(x), cp.asarray(gy), cp.zeros(w.shape), accumulate=False))
    except (RuntimeError, ValueError, _cd._fe.cudnnGraphNotSupportedError) as e:   # whatever cuDNN said
        said = (str(e.__cause__ or e).splitlines() or [type(e).__name__])[0][:160]   # cuDNN's own words
        return f"cuDNN {_cd.version()} builds no float64 convolution on this GPU: {said}"
    if not all(np.allclose(cp.asnumpy(g), r, rtol=1e-9, atol=1e-9) for g, r in zip(got, want)):
        return f"cuDNN {_cd.version()}'s float64 convolutions give wrong values on this GPU (checked against the CPU)"
    return None


def _conv_args(plan, dtype):
    pt, pb, pl, pr = plan.pads
    return dict(pre_padding=[pt, pl], post_padding=[pb, pr], stride=list(plan.stride),
                dilation=list(plan.dilation), compute_data_type=_cd.compute_type(dtype))


def _check_x(plan, x, what="x"):
    if x.ndim != 4 or x.shape[1:] != tuple(plan.in_shape[1:]):
        raise ValueError(f"conv2d: {what} has shape {x.shape}, the plan expects (N, *{plan.in_shape[1:]})")


def _fprop(op, plan, x, w, b, out, relu, cl):
    _check_x(plan, x)
    y = out_array(out, (x.shape[0],) + tuple(plan.out_shape[1:]), x.dtype, cl=cl)
    if x.shape[0] <= SMALL_N and _small.supported(plan, x, w, b):
        key = ("conv_fprop", _cd.version(), x.shape, x.strides, w.shape, w.strides, x.dtype.name, plan.stride,
               plan.pads, b is not None, relu, cl)
        small = lambda: _small.small_conv2d_fprop(plan, x, w, b, y, relu, cl)      # noqa: E731
        if engines.fastest(key, {"cudnn": lambda: _cudnn_fprop(op, plan, x, w, b, y, relu), "small": small}) \
                == "small":
            return small()
    return _cudnn_fprop(op, plan, x, w, b, y, relu)


def _cudnn_fprop(op, plan, x, w, b, y, relu):
    K = plan.w_shape[0]
    fuse = x.dtype != np.float64            # cuDNN's fusion engines take no double: the epilogue is ours
    arrays = dict(x=x, w=w, y=y) if b is None or not fuse else dict(x=x, w=w, b=b, y=y)

    def build(g, io):
        t = g.conv_fprop(image=io.input("x"), weight=io.input("w"), **_conv_args(plan, x.dtype))
        if "b" in arrays:                       # fused into the conv's epilogue
            t = g.bias(input=t, bias=io.input("b", (1, K, 1, 1)))
        if relu and fuse:
            t = g.relu(input=t)
        io.output("y", t)

    _cd.run(op if fuse else "conv_fprop", arrays, build, extra=(plan.pads, plan.stride, plan.dilation), conv=True)
    if not fuse and b is not None:              # float64 (channels-last too: the bias index is logical)
        _bias_act(b, np.int32(K), np.int32(plan.out_shape[2] * plan.out_shape[3]), np.int32(relu), y)
    elif not fuse and relu:
        pointwise(RELU, y, out=y)
    return y


def conv2d_fprop(plan: ConvPlan, x: Array, w: Array, b: Array | None = None, out: Array | None = None,
                 cl: bool = False) -> Array:
    """y = conv(x, w) + b.   x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW), channels-last
    if `cl` (x may lie in either order; cuDNN reads both)."""
    return _fprop("conv_fprop", plan, x, w, b, out, relu=False, cl=cl)


def conv2d_bias_relu_fprop(plan: ConvPlan, x: Array, w: Array, b: Array | None, out: Array | None = None,
                           cl: bool = False) -> Array:
    """y = max(conv(x, w) + b, 0) as one cuDNN graph (inference; float64: the conv, then one kernel).
    Shapes and `cl` as conv2d_fprop."""
    return _fprop("conv_bias_relu_fprop", plan, x, w, b, out, relu=True, cl=cl)


def conv2d_bias_add_act_fprop(plan: ConvPlan, x: Array, w: Array, b: Array | None, z: Array, relu: bool = True,
                              out: Array | None = None, cl: bool = False) -> Array:
    """y = act(conv(x, w) + b + z): a residual z (y's shape and dtype) added and the ReLU applied (if `relu`) in
    one GEMM's epilogue where the conv is one GEMM (1x1, stride 1, unpadded, channels-last or H = W = 1;
    _cublaslt.py) and that is the faster at this shape, else the conv and then one kernel (inference: a
    ResNet bottleneck's shortcut add). Shapes and `cl` as conv2d_fprop."""
    _check_x(plan, x)
    y = out_array(out, (x.shape[0],) + tuple(plan.out_shape[1:]), x.dtype, cl=cl)
    if z.shape != y.shape or z.dtype != y.dtype:
        raise ValueError(f"conv2d: the residual z is {z.dtype} {z.shape}, the output {y.dtype} {y.shape}")

    def unfused():
        _fprop("conv_fprop", plan, x, w, b, y, relu=False, cl=cl)
        return pointwise(ADD_RELU if relu else cp.add, y, in_order(z, channels_last(y)), out=y)

    N, C, H, W = x.shape
    gemm = (tuple(plan.w_shape[2:]) == (1, 1) and tuple(plan.stride) == (1, 1) and not any(plan.pads)
            and w._c_contiguous and _lt.takes(x.dtype) and w.dtype == x.dtype and (b is None or b.dtype == x.dtype)
            and (H * W == 1 or all(lies_in(a, True) for a in (x, y))))
    if not gemm:
        return unfused()
    M, K = N * H * W, plan.w_shape[0]
    x2, z2, y2 = memory(x, True).reshape(M, C), memory(z, True).reshape(M, K), y.transpose(NHWC).reshape(M, K)

    def fused():
        try:
            return _lt.matmul(x2, w.reshape(K, C), y2, b, z2, relu, _cd.tf32_enabled())
        except _lt.Unsupported:             # found before anything is launched
            return unfused()

    key = ("conv_residual_gemm", x.shape, x.dtype.name, K, b is not None, relu, _cd.tf32_enabled())
    (fused if engines.fastest(key, {"gemm": fused, "conv": unfused}) == "gemm" else unfused)()
    return y


def conv2d_dgrad(plan: ConvPlan, gy: Array, w: Array, out: Array | None = None, cl: bool | None = None) -> Array:
    """gx = conv_transpose(gy, w).   gy (N, K, oH, oW), w (K, C, kH, kW) -> gx (N, C, H, W), channels-last
    if `cl` (None: as gy lies)."""
    cl = channels_last(gy) if cl is None else cl
    gx = out_array(out, (gy.shape[0],) + tuple(plan.in_shape[1:]), gy.dtype, cl=cl)

    def build(g, io):
        io.output("gx", g.conv_dgrad(loss=io.input("gy"), filter=io.input("w"), **_conv_args(plan, gy.dtype)))

    _cd.run("conv_dgrad", dict(gy=gy, w=w, gx=gx), build,
            extra=(plan.pads, plan.stride, plan.dilation), conv=True)
    return gx


def conv2d_wgrad(plan: ConvPlan, x: Array, gy: Array, gw: Array, accumulate: bool = True) -> Array:
    """gw += correlation of x with gy (gw = ... if not accumulate).   x (N, C, H, W), gy (N, K, oH, oW),
    gw (K, C, kH, kW)."""
    _check_x(plan, x)
    if not lies_in(x, channels_last(gy)):     # one layout per graph (a Flatten's gradient comes NCHW)
        gy = in_order(gy, channels_last(x))
    if gw.shape != tuple(plan.w_shape):
        raise ValueError(f"conv2d_wgrad: gw has shape {gw.shape}, expected {plan.w_shape}")
    # cuDNN overwrites its output: to accumulate, compute into a temporary, then add; to overwrite,
    # write gw itself (one kernel).
    dw = cp.empty(gw.shape, gw.dtype) if accumulate else gw

    def build(g, io):
        io.output("dw", g.conv_wgrad(image=io.input("x"), loss=io.input("gy"), **_conv_args(plan, x.dtype)))

    _cd.run("conv_wgrad", dict(x=x, gy=gy, dw=dw), build,
            extra=(plan.pads, plan.stride, plan.dilation), conv=True)
    if accumulate:
        cp.add(gw, dw, out=gw)
    return gw
