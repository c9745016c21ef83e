"""One GEMM with its epilogue through cuBLASLt (ctypes): y = act(x wᵀ + b + z), row-major.

A ResNet bottleneck's last conv is 1x1 of stride 1: on channels-last arrays, one GEMM of (N H W, C) by
(C, K). cuBLASLt computes D = epilogue(alpha A B + beta C) and its epilogues add a bias and apply a
ReLU, so with the block's shortcut as C (beta 1) the shortcut add and its ReLU cost no kernel and no
pass over memory of their own (kernels/gpu/conv.py sends its residual convs here). cuDNN 9.19's one
graph for conv + bias + add + ReLU was tried first: at ResNet-50's shapes most of its engines wrote
nothing, and one of them was wrong only inside a CUDA graph (docs/results.md).

float32 runs on TF32 tensor cores where cuDNN's convolutions do (cudnn_graphs.tf32_enabled), half
types with float accumulation. Each shape's descriptors and the heuristics' first algorithm are made
once (host work, so a captured call only records the matmul); cuBLASLt's matmuls can be captured, with
a fixed workspace (cuBLAS's, _cublas.workspace). Row-major y = x wᵀ is column-major yᵀ = w xᵀ: A = w
read transposed, B = xᵀ as it lies, C = zᵀ and D = yᵀ with K rows, the bias one value a row.
"""
from __future__ import annotations

import ctypes
from typing import Any

import cupy as cp
import numpy as np

from ._cublas import load, workspace
from ._dtypes import CUDA_R

_P, _U64, _I64 = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64
_R32F = 0                                       # cudaDataType CUDA_R_32F
_TYPES = {np.dtype(np.float32): _R32F, **CUDA_R}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77   # cublasComputeType_t
_TRANSA, _TRANSB, _EPILOGUE, _BIAS_POINTER = 3, 4, 7, 8               # cublasLtMatmulDescAttributes_t
_EPI_DEFAULT, _EPI_RELU, _EPI_BIAS, _EPI_RELU_BIAS = 1, 2, 4, 6       # cublasLtEpilogue_t
_PREF_WORKSPACE, _PREF_ALIGN = 1, (5, 6, 7, 8)  # cublasLtMatmulPreferenceAttributes_t: bytes; A, B, C, D
_state: dict[str, object] = {"lib": None}
_handles: dict[int, ctypes.c_void_p] = {}
_plans: dict[tuple, Any] = {}                   # shape key -> (descriptor, layouts, algorithm); None: none


class Unsupported(RuntimeError):
    """cuBLASLt has no algorithm for this GEMM (its shape, dtype, alignments or epilogue)."""


class _Heuristic(ctypes.Structure):             # cublasLtMatmulHeuristicResult_t
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _lib():
    lib = _state["lib"]
    if lib is None:
        lib = load("libcublasLt")
        lib.cublasLtCreate.argtypes = [ctypes.POINTER(_P)]
        lib.cublasLtMatmulDescCreate.argtypes = [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int]
        lib.cublasLtMatmulDescSetAttribute.argtypes = [_P, ctypes.c_int, _P, ctypes.c_size_t]
        lib.cublasLtMatrixLayoutCreate.argtypes = [ctypes.POINTER(_P), ctypes.c_int, _U64, _U64, _I64]
        lib.cublasLtMatmulPreferenceCreate.argtypes = [ctypes.POINTER(_P)]
        lib.cublasLtMatmulPreferenceSetAttribute.argtypes = [_P, ctypes.c_int, _P, ctypes.c_size_t]
        lib.cublasLtMatmulAlgoGetHeuristic.argtypes = [_P, _P, _P, _P, _P, _P, _P, ctypes.c_int,
                                                       ctypes.POINTER(_Heuristic), ctypes.POINTER(ctypes.c_int)]
        lib.cublasLtMatmul.argtypes = [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.c_size_t, _P]
        _state["lib"] = lib
    return lib


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"cuBLASLt {what} failed with status {status}")


def _set(fn, obj, attr, value):
    _check(fn(obj, attr, ctypes.addressof(value), ctypes.sizeof(value)), f"attribute {attr}")


def _alignment(ptr):
    return min(ptr & -ptr, 256) if ptr else 256


def takes(dtype) -> bool:
    return np.dtype(dtype) in _TYPES


def _plan(lib, handle, key, M, K, C, dtype, relu, bias, tf32, aligns):
    """(matmul descriptor, layouts of A, B, C/D, algorithm) for this shape, made once. `bias`: the bias
    pointer or None (the heuristics read its alignment from it)."""
    desc = _P()
    compute = _COMPUTE_32F_FAST_TF32 if tf32 and dtype == np.float32 else _COMPUTE_32F
    _check(lib.cublasLtMatmulDescCreate(ctypes.byref(desc), compute, _R32F), "descriptor")
    _set(lib.cublasLtMatmulDescSetAttribute, desc, _TRANSA, ctypes.c_int32(1))
    _set(lib.cublasLtMatmulDescSetAttribute, desc, _TRANSB, ctypes.c_int32(0))
    epilogue = (_EPI_RELU_BIAS if relu else _EPI_BIAS) if bias else (_EPI_RELU if relu else _EPI_DEFAULT)
    _set(lib.cublasLtMatmulDescSetAttribute, desc, _EPILOGUE, ctypes.c_uint32(epilogue))
    if bias:
        _set(lib.cublasLtMatmulDescSetAttribute, desc, _BIAS_POINTER, _P(bias))
    t = _TYPES[dtype]
    layouts = [_P(), _P(), _P()]
    for lay, (rows, cols) in zip(layouts, ((C, K), (C, M), (K, M))):      # A = w (C x K), B = xᵀ, C = D = yᵀ
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(lay), t, rows, cols, rows), "layout")
    pref = _P()
    _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "preference")
    _set(lib.cublasLtMatmulPreferenceSetAttribute, pref, _PREF_WORKSPACE, ctypes.c_uint64(workspace().nbytes))
    for attr, align in zip(_PREF_ALIGN, aligns):
        _set(lib.cublasLtMatmulPreferenceSetAttribute, pref, attr, ctypes.c_uint32(align))
    result, found = _Heuristic(), ctypes.c_int(0)
    a, b, cd = layouts
    status = lib.cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, cd, cd, pref, 1, ctypes.byref(result),
                                                ctypes.byref(found))
    if status != 0 or found.value < 1:
        raise Unsupported(f"cuBLASLt has no algorithm for {M}x{C} by {C}x{K} ({np.dtype(dtype).name})")
    _plans[key] = plan = (desc, layouts, result)
    return plan


def matmul(x: cp.ndarray, w: cp.ndarray, y: cp.ndarray, b: cp.ndarray | None = None, z: cp.ndarray | None = None,
           relu: bool = False, tf32: bool = True) -> cp.ndarray:
    """y = act(x wᵀ + b + z): x (M, C), w (K, C), y and z (M, K), b (K,); C-contiguous, one float dtype
    (`takes`), b of it too. act is the ReLU if `relu`. Returns y."""
    (M, C), K = x.shape, w.shape[0]
    lib = _lib()
    dev = cp.cuda.runtime.getDevice()
    handle = _handles.get(dev)
    if handle is None:
        handle = _handles[dev] = _P()
        _check(lib.cublasLtCreate(ctypes.byref(handle)), "create")
    src = y if z is None else z
    aligns = tuple(_alignment(a.data.ptr) for a in (w, x, src, y))
    key = (dev, M, K, C, x.dtype.char, relu, None if b is None else _alignment(b.data.ptr), bool(tf32), aligns)
    plan = _plans.get(key, _plans)
    if plan is _plans:
        _plans[key] = None                      # until made: a shape without an algorithm is asked once
        plan = _plan(lib, handle, key, M, K, C, x.dtype, relu, None if b is None else b.data.ptr, tf32, aligns)
    if plan is None:
        raise Unsupported(f"cuBLASLt has no algorithm for {M}x{C} by {C}x{K} ({x.dtype.name})")
    desc, (a, bl, cd), algo = plan
    if b is not None:               # the bias pointer lives in the descriptor: set for this call
        _set(lib.cublasLtMatmulDescSetAttribute, desc, _BIAS_POINTER, _P(b.data.ptr))
    one, beta = ctypes.c_float(1.0), ctypes.c_float(0.0 if z is None else 1.0)
    ws = workspace()
    _check(lib.cublasLtMatmul(handle, desc, ctypes.addressof(one), w.data.ptr, a, x.data.ptr, bl,
                              ctypes.addressof(beta), src.data.ptr, cd, y.data.ptr, cd, ctypes.addressof(algo.algo),
                              ws.data.ptr, ws.nbytes, cp.cuda.get_current_stream().ptr), "matmul")
    return y
