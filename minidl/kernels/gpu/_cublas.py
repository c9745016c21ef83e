"""Row-major GEMM through cuBLAS (ctypes) on our own handle, so that it can be captured.

CuPy's cuBLAS bindings refuse to run while a stream is being captured into a CUDA graph
("calling cuBLAS API during stream capture is currently unsupported"). cuBLAS itself supports
capture when its handle has a user workspace, so we keep one handle per device, bind it to
CuPy's current stream, and give it a fixed workspace after every cublasSetStream (which resets
the workspace). Math mode is cuBLAS's default: full FP32, no TF32.
"""
import ctypes

import cupy as cp
import numpy as np

from ._util import buffer

_WORKSPACE = 32 << 20           # bytes: what cuBLAS recommends for Hopper
_state = {"lib": None}
_handles = {}                   # device id -> [handle, stream pointer it is bound to]
_P, _I = ctypes.c_void_p, ctypes.c_int


def _lib():
    lib = _state["lib"]
    if lib is None:
        import cupy.cublas  # noqa: F401  makes CuPy load libcublas, which we then find by name or in the maps
        names = ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
        with open("/proc/self/maps") as f:
            names += [line.split()[-1] for line in f if "/libcublas.so" in line]
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise OSError("libcublas is not loadable")
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(_P)]
        lib.cublasSetStream_v2.argtypes = [_P, _P]
        lib.cublasSetWorkspace_v2.argtypes = [_P, _P, ctypes.c_size_t]
        for fn, t in ((lib.cublasSgemm_v2, ctypes.c_float), (lib.cublasDgemm_v2, ctypes.c_double)):
            ptr = ctypes.POINTER(t)
            fn.argtypes = [_P, _I, _I, _I, _I, _I, ptr, _P, _I, _P, _I, ptr, _P, _I]
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
        ws = buffer("cublas_workspace", (_WORKSPACE,), np.uint8)
        _check(lib.cublasSetStream_v2(h[0], stream), "set stream")
        _check(lib.cublasSetWorkspace_v2(h[0], ws.data.ptr, _WORKSPACE), "set workspace")
        h[1] = stream
    return h[0]


def gemm(a, b, c, trans_a=False, trans_b=False, beta=0.0):
    """c = op(a) @ op(b) + beta c on C-contiguous 2-D float32 (sgemm) or float64 (dgemm) arrays; op transposes
    when asked."""
    if c.dtype not in (np.float32, np.float64):
        raise ValueError(f"gemm: float32 or float64 arrays, got {c.dtype}")
    for name, x in (("a", a), ("b", b), ("c", c)):
        if x.ndim != 2 or not x.flags.c_contiguous or x.dtype != c.dtype:
            raise ValueError(f"gemm: {name} must be a C-contiguous 2-D {c.dtype} array, got {x.shape} {x.dtype}")
    M, K = a.shape[::-1] if trans_a else a.shape
    Kb, N = b.shape[::-1] if trans_b else b.shape
    if K != Kb or c.shape != (M, N):
        raise ValueError(f"gemm: shapes {a.shape}{'ᵀ' * trans_a} @ {b.shape}{'ᵀ' * trans_b} -> {c.shape} do not match")
    lib = _lib()
    fn, t = (lib.cublasSgemm_v2, ctypes.c_float) if c.dtype == np.float32 else (lib.cublasDgemm_v2, ctypes.c_double)
    # Row-major c = op(a) op(b) is column-major cᵀ = op(b)ᵀ op(a)ᵀ: swap the operands, keep the ops.
    _check(fn(_handle(lib), int(trans_b), int(trans_a), N, M, K, ctypes.byref(t(1.0)), b.data.ptr, b.shape[1],
              a.data.ptr, a.shape[1], ctypes.byref(t(beta)), c.data.ptr, N), "gemm")
    return c
