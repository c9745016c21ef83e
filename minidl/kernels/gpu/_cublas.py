"""Row-major GEMM through cuBLAS (ctypes) on our own handle, so that it can be captured.

CuPy's cuBLAS bindings refuse to run while a stream is being captured into a CUDA graph
("calling cuBLAS API during stream capture is currently unsupported"). cuBLAS itself supports
capture when its handle has a user workspace, so we keep one handle per device, bind it to
CuPy's current stream, and give it a fixed workspace after every cublasSetStream (which resets
the workspace). Math mode is cuBLAS's default: full FP32, no TF32. float16 and bfloat16 arrays go
through cublasGemmEx with CUBLAS_COMPUTE_32F (tensor cores, float accumulation, alpha and beta
float), as torch.autocast's matmuls do.
"""
from __future__ import annotations

import ctypes

import cupy as cp
import numpy as np

from ._dtypes import CUDA_R
from ._util import buffer

_WORKSPACE = 32 << 20           # bytes: what cuBLAS recommends for Hopper
_state = {"lib": None}
_handles: dict[int, list] = {}  # device id -> [handle, stream pointer it is bound to]
_P, _I = ctypes.c_void_p, ctypes.c_int
# cudaDataType_t of the half types (library_types.h), and cublasComputeType_t CUBLAS_COMPUTE_32F
_CUDA_R = CUDA_R
_COMPUTE_32F, _GEMM_DEFAULT = 68, -1


def load(stem: str) -> ctypes.CDLL:
    """The cuBLAS library `stem` ("libcublas", "libcublasLt") CuPy loaded, found by name or in the maps."""
    import cupy.cublas  # noqa: F401  makes CuPy load libcublas (and libcublasLt with it)
    names = [f"{stem}.so.13", f"{stem}.so.12", f"{stem}.so"]
    with open("/proc/self/maps") as f:
        names += [line.split()[-1] for line in f if f"/{stem}.so" in line]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise OSError(f"{stem} is not loadable")


def workspace() -> cp.ndarray:
    """This GPU's one cuBLAS workspace (fixed, so that calls can be captured), shared by cuBLASLt's
    matmuls (_cublaslt.py): both run on the current stream, one after another."""
    return buffer("cublas_workspace", (_WORKSPACE,), np.uint8)


def _lib():
    lib = _state["lib"]
    if lib is None:
        lib = load("libcublas")
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(_P)]
        lib.cublasSetStream_v2.argtypes = [_P, _P]
        lib.cublasSetWorkspace_v2.argtypes = [_P, _P, ctypes.c_size_t]
        for fn, t in ((lib.cublasSgemm_v2, ctypes.c_float), (lib.cublasDgemm_v2, ctypes.c_double)):
            ptr = ctypes.POINTER(t)
            fn.argtypes = [_P, _I, _I, _I, _I, _I, ptr, _P, _I, _P, _I, ptr, _P, _I]
        f32 = ctypes.POINTER(ctypes.c_float)             # GemmEx's alpha and beta: the compute type's
        lib.cublasGemmEx.argtypes = [_P, _I, _I, _I, _I, _I, f32, _P, _I, _I, _P, _I, _I, f32, _P, _I, _I, _I, _I]
        _state["lib"] = lib
    return lib


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"cuBLAS {what} failed with status {status}")


def _handle(lib):
    dev = cp.cuda.runtime.getDevice()
    h = _handles.get(dev)
    if h is None:
        p = _P()
        _check(lib.cublasCreate_v2(ctypes.byref(p)), "create")
        h = _handles[dev] = [p, None]
    stream = cp.cuda.get_current_stream().ptr
    if h[1] != stream:
        ws = workspace()
        _check(lib.cublasSetStream_v2(h[0], stream), "set stream")
        _check(lib.cublasSetWorkspace_v2(h[0], ws.data.ptr, _WORKSPACE), "set workspace")
        h[1] = stream
    return h[0]


def gemm(a, b, c, trans_a=False, trans_b=False, beta=0.0):
    """c = op(a) @ op(b) + beta c on C-contiguous 2-D float32 (sgemm), float64 (dgemm) or float16/bfloat16
    arrays (GemmEx, float accumulation); op transposes when asked."""
    if c.dtype not in (np.float32, np.float64) and c.dtype not in _CUDA_R:
        raise ValueError(f"gemm: float32, float64, float16 or bfloat16 arrays, got {c.dtype}")
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x.ndim != 2 or not x.flags.c_contiguous or x.dtype != c.dtype:
            raise ValueError(f"gemm: {name} must be a C-contiguous 2-D {c.dtype} array, got {x.shape} {x.dtype}")
    M, K = a.shape[::-1] if trans_a else a.shape
    Kb, N = b.shape[::-1] if trans_b else b.shape
    if K != Kb or c.shape != (M, N):
        raise ValueError(f"gemm: shapes {a.shape}{'ᵀ' * trans_a} @ {b.shape}{'ᵀ' * trans_b} -> {c.shape} do not match")
    lib = _lib()
    # Row-major c = op(a) op(b) is column-major cᵀ = op(b)ᵀ op(a)ᵀ: swap the operands, keep the ops.
    if c.dtype in _CUDA_R:
        one, f_beta, r = ctypes.c_float(1.0), ctypes.c_float(beta), _CUDA_R[c.dtype]
        _check(lib.cublasGemmEx(_handle(lib), int(trans_b), int(trans_a), N, M, K, ctypes.byref(one), b.data.ptr, r,
                                b.shape[1], a.data.ptr, r, a.shape[1], ctypes.byref(f_beta), c.data.ptr, r, N,
                                _COMPUTE_32F, _GEMM_DEFAULT), "GemmEx")
        return c
    fn, t = (lib.cublasSgemm_v2, ctypes.c_float) if c.dtype == np.float32 else (lib.cublasDgemm_v2, ctypes.c_double)
    _check(fn(_handle(lib), int(trans_b), int(trans_a), N, M, K, ctypes.byref(t(1.0)), b.data.ptr, b.shape[1],
              a.data.ptr, a.shape[1], ctypes.byref(t(beta)), c.data.ptr, N), "gemm")
    return c


def prepare():
    """Set cuBLAS up on the current GPU: its handle, bound to the current stream, and one 1x1 GEMM of
    each form a dense layer runs (fprop a @ b, dgrad a @ bᵀ, wgrad aᵀ @ b).

    A process's first GEMM loads the library's state (tens of milliseconds, against a fraction
    of one for the next), and a form's first call the kernels cuBLAS picks for it; a Device does this
    when it is made, like the CUDA context, so that it stays out of the first training step. It
    covers the library's state and what cuBLAS picks by form alone; a shape whose kernel differs
    still loads that kernel at its first call (SimpleNet's dense wgrad, for one).
    """
    one = cp.asarray(np.ones((1, 1), np.float32))     # a host copy: no fill kernel to compile
    for trans_a, trans_b in ((False, False), (False, True), (True, False)):
        gemm(one, one, cp.empty((1, 1), np.float32), trans_a, trans_b)
