"""Fused inference kernels ("direct" family), NumPy reference: compositions of the CPU kernels.

`minidl/kernels/gpu/direct.py` implements the same functions as hand-written CUDA kernels for the
small shapes where cuDNN and one-kernel-per-op execution are slow (LeNet-5's 1->6 channel 5x5
conv at large batches; at batch 1 launches dominate). Here each function is
the plain composition of the reference kernels, so the GPU kernels are tested against it.

    conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads=0, relu=True, out=None)
        y = maxpool2x2(relu(conv(x, w) + b)): stride 1, no dilation, a 2x2 stride-2 floor pool.
    conv2d_bias_relu_fprop(x, w, b, pads=0, relu=True, out=None)          the same, no pool
    mlp_fprop(x, ws, bs, relus, out=None)                                  a chain of dense layers
    chain_fprop(x, stages, out=None)                                       conv stages, flatten, dense chain
    add_relu_fprop(xs, out=None)                                           max(sum of xs, 0)
    bias_act_fprop(y, b, relu, out=None)                                   y + b (per column), then ReLU

`stages` is a list of ("conv", w, b, pads, pool, relu) (pool 1 or 2) and ("dense", w, b, relu)
tuples: the conv stages first, then (after an implicit flatten) one or more dense ones.
`supported_conv(...)` and `supported_chain(...)` say which shapes the GPU kernels take; the
inference planner asks them on both devices, so the CPU runs the very plan the GPU runs.

The functions live in three files, mirrored by name in minidl/kernels/gpu/: direct_conv.py (the
conv stages, pads4, conv_geometry, supported_conv), chain.py (chain_fprop, supported_chain) and
mlp.py (mlp_fprop, add_relu_fprop, bias_act_fprop). This module is the `direct` kernel family
(`device.kernels.direct`) that gathers them.
"""
from .chain import chain_fprop, supported_chain
from .direct_conv import (conv2d_bias_relu_fprop, conv2d_bias_relu_maxpool2x2_fprop, conv_geometry, pads4,
                          supported_conv)
from .mlp import add_relu_fprop, bias_act_fprop, mlp_fprop

# The dtypes the family computes in (Device.dtype_problem reads it): its GPU twin's CUDA is float32, and the
# inference schedule plans alike on both devices, so other dtypes run one layer a step everywhere.
DTYPES = ("float32",)
X_AFFINE = True          # the conv+pool and chain functions take a Normalize as x_affine=

__all__ = ["DTYPES", "X_AFFINE", "add_relu_fprop", "bias_act_fprop", "chain_fprop", "conv2d_bias_relu_fprop",
           "conv2d_bias_relu_maxpool2x2_fprop", "conv_geometry", "mlp_fprop", "pads4", "supported_chain",
           "supported_conv"]
