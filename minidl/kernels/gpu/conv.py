"""2-D convolution on the GPU: cuDNN Frontend graphs for fprop (+ fused bias), dgrad and wgrad."""
import cupy as cp

from ..cpu.conv import ConvPlan, conv2d_plan  # noqa: F401  plans are shape arithmetic: one definition
from . import cudnn as _cd
from ._util import buffer, out_array

_FLOAT = _cd._fe.data_type.FLOAT


def _conv_args(plan):
    pt, pb, pl, pr = plan.pads
    return dict(pre_padding=[pt, pl], post_padding=[pb, pr], stride=list(plan.stride),
                dilation=list(plan.dilation), compute_data_type=_FLOAT)


def _check_x(plan, x, what="x"):
    if x.ndim != 4 or x.shape[1:] != tuple(plan.in_shape[1:]):
        raise ValueError(f"conv2d: {what} has shape {x.shape}, the plan expects (N, *{plan.in_shape[1:]})")


def _fprop(op, plan, x, w, b, out, relu):
    _check_x(plan, x)
    K = plan.w_shape[0]
    y = out_array(out, (x.shape[0],) + tuple(plan.out_shape[1:]), x.dtype)
    arrays = dict(x=x, w=w, y=y) if b is None else dict(x=x, w=w, b=b, y=y)

    def build(g, io):
        t = g.conv_fprop(image=io.input("x"), weight=io.input("w"), **_conv_args(plan))
        if b is not None:                       # fused into the conv's epilogue
            t = g.bias(input=t, bias=io.input("b", (1, K, 1, 1)))
        if relu:
            t = g.relu(input=t)
        io.output("y", t)

    _cd.run(op, arrays, build, extra=(plan.pads, plan.stride, plan.dilation), conv=True)
    return y


def conv2d_fprop(plan, x, w, b=None, out=None):
    """y = conv(x, w) + b.   x (N, C, H, W), w (K, C, kH, kW), b (K,) -> y (N, K, oH, oW)."""
    return _fprop("conv_fprop", plan, x, w, b, out, relu=False)


def conv2d_bias_relu_fprop(plan, x, w, b, out=None):
    """y = max(conv(x, w) + b, 0) as one cuDNN graph (inference).   Shapes as conv2d_fprop."""
    return _fprop("conv_bias_relu_fprop", plan, x, w, b, out, relu=True)


def conv2d_dgrad(plan, gy, w, out=None):
    """gx = conv_transpose(gy, w).   gy (N, K, oH, oW), w (K, C, kH, kW) -> gx (N, C, H, W)."""
    gx = out_array(out, (gy.shape[0],) + tuple(plan.in_shape[1:]), gy.dtype)

    def build(g, io):
        io.output("gx", g.conv_dgrad(loss=io.input("gy"), filter=io.input("w"), **_conv_args(plan)))

    _cd.run("conv_dgrad", dict(gy=gy, w=w, gx=gx), build,
            extra=(plan.pads, plan.stride, plan.dilation), conv=True)
    return gx


def conv2d_wgrad(plan, x, gy, gw, accumulate=True):
    """gw += correlation of x with gy (gw = ... if not accumulate).   x (N, C, H, W), gy (N, K, oH, oW),
    gw (K, C, kH, kW)."""
    _check_x(plan, x)
    if gw.shape != tuple(plan.w_shape):
        raise ValueError(f"conv2d_wgrad: gw has shape {gw.shape}, expected {plan.w_shape}")
    # cuDNN overwrites its output: to accumulate, compute into a scratch buffer (one per shape, fixed
    # address), then add; to overwrite, write gw itself (one kernel).
    dw = buffer("conv_wgrad", gw.shape, gw.dtype) if accumulate else gw

    def build(g, io):
        io.output("dw", g.conv_wgrad(image=io.input("x"), loss=io.input("gy"), **_conv_args(plan)))

    _cd.run("conv_wgrad", dict(x=x, gy=gy, dw=dw), build,
            extra=(plan.pads, plan.stride, plan.dilation), conv=True)
    if accumulate:
        cp.add(gw, dw, out=gw)
    return gw
