"""One GEMM with its epilogue through cuBLASLt: y = act(x wᵀ + b + z), row-major.

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

The bindings (`bindings()`): nvmath-python's `nvmath.bindings.cublasLt`, generated from cuBLASLt's headers,
where it imports (pyproject.toml's `nvmath` extra), else `_Ctypes`, the few calls and values used here bound
by ctypes and named as nvmath names them, so that the code is written once over either. Both call the
libcublasLt CuPy loaded (docs/kernels.md, cuBLAS bindings: nvmath-python trial).
"""
from __future__ import annotations

import ctypes
import warnings
from typing import Any

import cupy as cp
import numpy as np

from ._cublas import load, workspace
from ._dtypes import CUDA_R

_R32F = 0                                       # cudaDataType CUDA_R_32F
_TYPES = {np.dtype(np.float32): _R32F, **CUDA_R}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32 = 68, 77   # cublasComputeType_t (cuBLAS's, not cuBLASLt's bindings)
_SCALARS = np.array([1.0, 0.0], np.float32)     # alpha 1, beta 0 or 1: host pointers read at each call
_ONE, _ZERO = _SCALARS.ctypes.data, _SCALARS.ctypes.data + 4
_state: dict[str, Any] = {"lt": None}
_handles: dict[int, int] = {}
_plans: dict[tuple, Any] = {}                   # shape key -> (descriptor, layouts, heuristic, ...); None: none


class Unsupported(RuntimeError):
    """cuBLASLt has no algorithm for this GEMM (its shape, dtype, alignments or epilogue)."""


class _Ctypes:
    """The cuBLASLt calls and values this file uses, by ctypes, named as nvmath.bindings.cublasLt names
    them (pointers and handles as ints; a failing status raises cuBLASLtError)."""

    class MatmulDescAttribute:                  # cublasLtMatmulDescAttributes_t
        TRANSA, TRANSB, EPILOGUE, BIAS_POINTER = 3, 4, 7, 8

    class Epilogue:                             # cublasLtEpilogue_t
        DEFAULT, RELU, BIAS, RELU_BIAS = 1, 2, 4, 6

    class MatmulPreferenceAttribute:            # cublasLtMatmulPreferenceAttributes_t (bytes)
        MAX_WORKSPACE_BYTES = 1
        MIN_ALIGNMENT_A_BYTES, MIN_ALIGNMENT_B_BYTES, MIN_ALIGNMENT_C_BYTES, MIN_ALIGNMENT_D_BYTES = 5, 6, 7, 8

    class cuBLASLtError(RuntimeError):       # nvmath's name
        pass

    # cublasLtMatmulHeuristicResult_t: the algorithm (8 words), workspace bytes, state, waves, 4 reserved
    matmul_heuristic_result_dtype = np.dtype([("algo", "<u8", (8,)), ("workspace_size", "<u8"), ("state", "<i4"),
                                              ("waves_count", "<f4"), ("reserved", "<i4", (4,))])

    def __init__(self) -> None:
        lib = load("libcublasLt")
        P, I, S, PP = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
        U64, I64 = ctypes.c_uint64, ctypes.c_int64
        made: dict[str, tuple[str, list]] = {       # each writes what it makes through its first argument
            "create": ("cublasLtCreate", []),
            "matmul_desc_create": ("cublasLtMatmulDescCreate", [I, I]),
            "matrix_layout_create": ("cublasLtMatrixLayoutCreate", [I, U64, U64, I64]),
            "matmul_preference_create": ("cublasLtMatmulPreferenceCreate", [])}
        for name, (symbol, args) in made.items():
            getattr(lib, symbol).argtypes = [PP, *args]
            setattr(self, name, self._maker(getattr(lib, symbol), symbol))
        calls: dict[str, tuple[str, list]] = {
            "matmul_desc_set_attribute": ("cublasLtMatmulDescSetAttribute", [P, I, P, S]),
            "matmul_preference_set_attribute": ("cublasLtMatmulPreferenceSetAttribute", [P, I, P, S]),
            "matmul_algo_get_heuristic": ("cublasLtMatmulAlgoGetHeuristic", [P] * 7 + [I, P, P]),
            "matmul": ("cublasLtMatmul", [P] * 14 + [S, P])}
        for name, (symbol, args) in calls.items():
            getattr(lib, symbol).argtypes = args
            setattr(self, name, self._checked(getattr(lib, symbol), symbol))

    def _checked(self, fn, symbol):
        def call(*args):
            status = fn(*args)
            if status != 0:
                raise self.cuBLASLtError(f"{symbol} failed with status {status}")
        return call

    def _maker(self, fn, symbol):
        call = self._checked(fn, symbol)

        def make(*args):
            out = ctypes.c_void_p()
            call(ctypes.byref(out), *args)
            return out.value or 0
        return make


def bindings() -> Any:
    """The cuBLASLt bindings in use: nvmath.bindings.cublasLt where it imports, else `_Ctypes`'s."""
    lt = _state["lt"]
    if lt is None:
        lt = _state["lt"] = _nvmath() or _Ctypes()
    return lt


def _nvmath() -> Any:
    """nvmath.bindings.cublasLt, imported after CuPy has loaded cuBLASLt (nvmath's loader then finds that
    copy), or None where nvmath-python is not installed or does not import."""
    load("libcublasLt")
    try:
        from nvmath.bindings import cublasLt
    except ImportError:
        return None
    except Exception as e:  # noqa: BLE001  a broken install (its CUDA packages at other versions) raises more
        warnings.warn(f"nvmath-python does not import ({type(e).__name__}: {e}); cuBLASLt through ctypes",
                      RuntimeWarning, stacklevel=3)
        return None
    return cublasLt


def use_bindings(name: str) -> None:
    """Choose the bindings, "nvmath" or "ctypes" (the trial and the tests compare the two); forgets the
    handles and plans made with the others."""
    if name not in ("nvmath", "ctypes"):
        raise ValueError(f"use_bindings: 'nvmath' or 'ctypes', got {name!r}")
    lt = _nvmath() if name == "nvmath" else _Ctypes()
    if lt is None:
        raise ImportError("use_bindings: nvmath-python's bindings do not import (pyproject.toml's nvmath extra)")
    _state["lt"] = lt
    _handles.clear()
    _plans.clear()


def _set(fn, obj, attr, value, dtype):
    buf = np.array([value], dtype)
    fn(obj, int(attr), buf.ctypes.data, buf.nbytes)


def _alignment(ptr):
    return min(ptr & -ptr, 256) if ptr else 256


def takes(dtype) -> bool:
    return np.dtype(dtype) in _TYPES


def _plan(lt, handle, key, M, K, C, dtype, relu, bias, tf32, aligns):
    """(matmul descriptor, layouts of A, B, C/D, heuristic result, algorithm pointer, bias pointer's buffer
    and its address, the attribute's code) for this shape, made once. `bias`: the bias pointer or None (the
    heuristics read its alignment from it)."""
    D, E, P = lt.MatmulDescAttribute, lt.Epilogue, lt.MatmulPreferenceAttribute
    compute = _COMPUTE_32F_FAST_TF32 if tf32 and dtype == np.float32 else _COMPUTE_32F
    desc = lt.matmul_desc_create(compute, _R32F)
    _set(lt.matmul_desc_set_attribute, desc, D.TRANSA, 1, np.int32)
    _set(lt.matmul_desc_set_attribute, desc, D.TRANSB, 0, np.int32)
    epilogue = (E.RELU_BIAS if relu else E.BIAS) if bias else (E.RELU if relu else E.DEFAULT)
    _set(lt.matmul_desc_set_attribute, desc, D.EPILOGUE, int(epilogue), np.uint32)
    if bias:
        _set(lt.matmul_desc_set_attribute, desc, D.BIAS_POINTER, bias, np.uint64)
    t = _TYPES[dtype]
    layouts = [lt.matrix_layout_create(t, rows, cols, rows) for rows, cols in ((C, K), (C, M), (K, M))]
    pref = lt.matmul_preference_create()        # A = w (C x K), B = xᵀ, C = D = yᵀ
    _set(lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, workspace().nbytes, np.uint64)
    for attr, align in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                            P.MIN_ALIGNMENT_D_BYTES), aligns):
        _set(lt.matmul_preference_set_attribute, pref, attr, align, np.uint32)
    result, found = np.zeros(1, lt.matmul_heuristic_result_dtype), np.zeros(1, np.int32)
    a, b, cd = layouts
    try:
        lt.matmul_algo_get_heuristic(handle, desc, a, b, cd, cd, pref, 1, result.ctypes.data, found.ctypes.data)
    except lt.cuBLASLtError:
        found[0] = 0
    if found[0] < 1:
        raise Unsupported(f"cuBLASLt has no algorithm for {M}x{C} by {C}x{K} ({np.dtype(dtype).name})")
    bias_ptr = np.zeros(1, np.uint64)           # the descriptor copies the bias pointer at each call
    _plans[key] = plan = (desc, layouts, result, result.ctypes.data, bias_ptr, bias_ptr.ctypes.data,
                          int(D.BIAS_POINTER))
    return plan


def matmul(x: cp.ndarray, w: cp.ndarray, y: cp.ndarray, b: cp.ndarray | None = None, z: cp.ndarray | None = None,
           relu: bool = False, tf32: bool = True) -> cp.ndarray:
    """y = act(x wᵀ + b + z): x (M, C), w (K, C), y and z (M, K), b (K,); C-contiguous, one float dtype
    (`takes`), b of it too. act is the ReLU if `relu`. Returns y."""
    (M, C), K = x.shape, w.shape[0]
    lt = bindings()
    dev = cp.cuda.runtime.getDevice()
    handle = _handles.get(dev)
    if handle is None:
        handle = _handles[dev] = lt.create()
    src = y if z is None else z
    aligns = tuple(_alignment(a.data.ptr) for a in (w, x, src, y))
    key = (dev, M, K, C, x.dtype.char, relu, None if b is None else _alignment(b.data.ptr), bool(tf32), aligns)
    plan = _plans.get(key, _plans)
    if plan is _plans:
        _plans[key] = None                      # until made: a shape without an algorithm is asked once
        plan = _plan(lt, handle, key, M, K, C, x.dtype, relu, None if b is None else b.data.ptr, tf32, aligns)
    if plan is None:
        raise Unsupported(f"cuBLASLt has no algorithm for {M}x{C} by {C}x{K} ({x.dtype.name})")
    desc, (a, bl, cd), _, algo, bias_ptr, bias_addr, bias_attr = plan
    if b is not None:               # the bias pointer lives in the descriptor: set for this call
        bias_ptr[0] = b.data.ptr
        lt.matmul_desc_set_attribute(desc, bias_attr, bias_addr, 8)
    ws = workspace()
    lt.matmul(handle, desc, _ONE, w.data.ptr, a, x.data.ptr, bl, _ZERO if z is None else _ONE, src.data.ptr, cd,
              y.data.ptr, cd, algo, ws.data.ptr, ws.nbytes, cp.cuda.get_current_stream().ptr)
    return y
