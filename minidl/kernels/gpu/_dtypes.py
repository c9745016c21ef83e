"""Every dtype the GPU kernels know, once: its C type in CUDA sources, its cuDNN and cuBLAS codes,
 and the dtypes each way of writing a kernel computes in (the families' DTYPES).

A new precision starts here: a row in `C_TYPES` and the library codes it has; where CuPy has a
class for it, `ELEMENTWISE`, and the eight families written on CuPy's T take it through their DTYPES. No CuPy import:
NumPy and ml_dtypes only, so tests read the table on a machine without a GPU.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT, DOUBLE = np.dtype("float32"), np.dtype("float64")
HALF, BFLOAT16 = np.dtype("float16"), np.dtype(ml_dtypes.bfloat16)

# The C type of each float dtype in CUDA sources (RawKernels, templated modules).
C_TYPES = {FLOAT: "float", DOUBLE: "double", HALF: "__half", BFLOAT16: "__nv_bfloat16"}
# float/double templates (softmax, BN's NCHW kernels, the float64 paths)
CTYPES = {d: C_TYPES[d] for d in (FLOAT, DOUBLE)}
# The 2-byte types of a precision policy, for RawKernels that read them as float (_cuda.HALF_CODE's Acc).
HALF_CTYPES = {d: C_TYPES[d] for d in (HALF, BFLOAT16)}
# Kernels for float32 and the half types, not double (16-byte pointwise, BN's NHWC kernels, small_conv).
SINGLE_AND_HALF_CTYPES = {FLOAT: C_TYPES[FLOAT], **HALF_CTYPES}
# Integer labels (softmax cross-entropy).
ITYPES = {np.dtype("int32"): "int", np.dtype("int64"): "long long", np.dtype("uint8"): "unsigned char"}

# cuDNN Frontend data types, by member name of `cudnn.data_type` (cudnn_graphs.py looks them up).
CUDNN = {FLOAT: "FLOAT", DOUBLE: "DOUBLE", HALF: "HALF", BFLOAT16: "BFLOAT16"}
# cudaDataType_t (library_types.h) of the half types: cuBLAS GemmEx's A, B and C (_cublas.py).
CUDA_R = {HALF: 2, BFLOAT16: 14}

# The dtypes a family computes in, by how its kernels are written (a family's DTYPES).
ELEMENTWISE = tuple(d.name for d in (FLOAT, DOUBLE, HALF, BFLOAT16))   # CuPy's ElementwiseKernels on T (the
                                                 # types CuPy has a class for), and templates over C_TYPES
FLOAT_DOUBLE = tuple(d.name for d in CTYPES)     # float/double templates only
SINGLE = (FLOAT.name,)                           # hand-written float CUDA
