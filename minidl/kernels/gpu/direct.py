"""Fused inference kernels ("direct" family) on the GPU: hand-written CUDA for small shapes.

The `direct` kernel family (`device.kernels.direct`): one name for the functions of three files,
each mirrored by its NumPy reference in minidl/kernels/cpu/ (whose direct.py lists the signatures):

- direct_conv.py: `conv2d_bias_relu_maxpool2x2_fprop`, `conv2d_bias_relu_fprop`: a stride-1 conv
  with bias, ReLU and a 2x2 max-pool in its epilogue, one kernel a conv stage.
- chain.py: `chain_fprop`: a whole small network (LeNet-5 up to batch 256) in ONE kernel.
- mlp.py: `mlp_fprop` (dense chains), `bias_act_fprop`, `add_relu_fprop`.

All float32 and C-contiguous; every kernel runs on CuPy's current stream and can be captured.
`supported_conv` and `supported_chain` (kernels/shapes.py, so both devices plan alike) say which shapes the
kernels take; grids are sized for the GPU's SM count, read from the device.
"""
from ..shapes import conv_geometry, pads4, supported_chain, supported_conv
from ._dtypes import SINGLE
from .chain import CHAIN_THREADS, chain_blocks, chain_fprop
from .direct_conv import choose_conv, conv2d_bias_relu_fprop, conv2d_bias_relu_maxpool2x2_fprop
from .mlp import MLP_CHAIN_MAX, add_relu_fprop, bias_act_fprop, mlp_fprop

DTYPES = SINGLE          # hand-written float CUDA (Device.dtype_problem reads it)
X_AFFINE = True          # the conv+pool and chain kernels stage their input through a Normalize (x_affine=)

__all__ = ["CHAIN_THREADS", "DTYPES", "X_AFFINE", "MLP_CHAIN_MAX", "add_relu_fprop", "bias_act_fprop", "chain_blocks",
           "chain_fprop", "choose_conv", "conv2d_bias_relu_fprop", "conv2d_bias_relu_maxpool2x2_fprop",
           "conv_geometry", "mlp_fprop", "pads4", "supported_chain", "supported_conv"]
