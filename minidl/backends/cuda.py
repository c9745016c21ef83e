"""The CUDA backend: CuPy arrays, the kernels of minidl/kernels/gpu/ (cuDNN Frontend graphs, cuBLAS,
CuPy and hand-written CUDA), NCCL collectives, CUDA graphs.

CuPy is imported when a cuda Device is made (`start`), never at import, so `import minidl` works
without it; `start` also sets cuBLAS up (`gpu/_cublas.prepare`) and begins compiling the kernel
modules in the background (`gpu/_cuda.prefetch`, with worker processes on empty caches:
`gpu/compile_workers.py`) and the elementwise kernels a training step calls (`gpu/ahead.py`).
"""
from __future__ import annotations

import importlib
import os
import sys
import types
from typing import Any, Callable

import numpy as np

from .._types import Array, DTypeLike
from ..kernels.gpu.capture import CaptureError, CapturedCall  # noqa: F401  imports no CuPy (backend.py re-exports both)
from . import Backend, DeviceError, MemoryUse, register


def _gpu(module: str) -> Any:
    return importlib.import_module(f"minidl.kernels.gpu.{module}")


# Multiply-adds an image (convolutions and dense layers) from which a model gains from tensor cores
# on this backend: from half precision, and in float32 from channels-last (TF32) convolutions.
# LeNet-5 (0.42M) and the study's nets (at most 2.3M) ran slower in bf16 and NHWC on every bench
# row, ResNet-18 and -50 (33M, 78M) faster (docs/precision.md).
TENSOR_CORE_MACS = 10e6

class CUDA(Backend):
    """One NVIDIA GPU through CuPy, its work queued on the device's compute stream."""

    name, aliases, kernels_package, label = "cuda", ("gpu",), "minidl.kernels.gpu", "GPU"
    elsewhere, can_capture, prefer = ", or --device cpu", True, 1

    def status(self) -> tuple[bool, str]:
        """(usable, reason): whether CuPy, a CUDA device and the cuDNN Frontend are all usable."""
        try:
            _import_cupy()
        except DeviceError as e:
            return False, str(e)
        try:
            _gpu("frontend").load()   # the cuDNN Frontend Python API
        except Exception as e:  # noqa: BLE001  an ImportError, or the library's load failing in its own types
            return False, f"the cuDNN Frontend (import cudnn) is missing: {e}"
        return True, "CuPy, a CUDA device and the cuDNN Frontend are usable"

    def owns(self, a: Array) -> bool:
        cp = sys.modules.get("cupy")          # no CuPy imported: no CuPy array exists
        return cp is not None and isinstance(a, cp.ndarray)

    def start(self, gpu: int | None) -> tuple[types.ModuleType, Any]:
        cp = _import_cupy()
        if gpu is not None:              # a data-parallel rank: the GPU of its local rank
            _use_gpu(cp, gpu)
        if gpu in (None, 0):             # on empty caches, worker processes compile (one set a host),
            _gpu("compile_workers").start(cp.cuda.runtime.getDevice())
        _gpu("_cuda").prefetch()         # the modules load meanwhile,
        _gpu("ahead").training()         # and the elementwise kernels a training step calls
        stream = _gpu("stream").compute_stream()
        _gpu("_cublas").prepare()        # its one-time setup
        return cp, stream

    def to_host(self, a: Array) -> Any:
        return a.get()

    def set_tf32(self, on: bool) -> None:
        _gpu("cudnn_graphs").set_tf32(on)

    def set_deterministic(self, on: bool) -> None:
        _gpu("cudnn_graphs").set_deterministic(on)

    def set_autotune(self, on: bool) -> None:
        _gpu("engines").set_autotune(on)

    def preparing(self, say: Callable[[str], None]) -> Callable[[], None]:
        return _gpu("_cuda").progress.listen(say)

    def synchronize(self, device: Any) -> None:
        device.stream.synchronize()

    def channels_last(self, compute_dtype: DTypeLike, requested: bool | None, macs: float = 0.0) -> bool:
        """`requested` if given, else where it was measured faster: in 2-byte types, and in float32
        for a model of TENSOR_CORE_MACS or more (its TF32 convolutions are NHWC kernels too: cuDNN
        transposes NCHW around them); a smaller float32 model keeps NCHW, which minidl's direct
        kernels read."""
        if requested is not None:
            return bool(requested)
        return np.dtype(compute_dtype).itemsize == 2 or macs >= TENSOR_CORE_MACS

    def half_pays(self, macs: float) -> bool:
        """From TENSOR_CORE_MACS multiply-adds an image: below, kernel launches bound the model."""
        return macs >= TENSOR_CORE_MACS

    def is_out_of_memory(self, device: Any, exc: BaseException) -> bool:
        """CuPy's, the CUDA runtime's or cuDNN's words for it."""
        msg = str(exc)
        return (isinstance(exc, device.xp.cuda.memory.OutOfMemoryError) or "CUDNN_STATUS_ALLOC_FAILED" in msg
                or "out of memory" in msg.lower())

    def sm_count(self) -> int | None:
        return _gpu("_util").sm_count()

    def capture(self, device: Any, fn: Callable[[], Any], warmup: int) -> CapturedCall:
        return CapturedCall(device, fn, warmup=warmup)

    def elapsed_ms(self, device: Any, fn: Callable[[], object], repeats: int) -> float:
        """CUDA events on the device stream: device time, launches included when fn launches from Python."""
        cp = device.xp
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with device.stream:
            start.record(device.stream)
            for _ in range(repeats):
                fn()
            end.record(device.stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / repeats

    def memory_bytes(self, device: Any) -> MemoryUse | None:
        """CuPy's default pool plus every captured call's memory (gpu/planned_memory.py)."""
        pool = device.xp.get_default_memory_pool()
        calls = _gpu("planned_memory").live_memory()
        return MemoryUse(pool.used_bytes() + sum(u for u, _ in calls), pool.total_bytes() + sum(r for _, r in calls))

    def free_memory(self, device: Any) -> None:
        device.xp.get_default_memory_pool().free_all_blocks()


def _use_gpu(cp, gpu):
    """Make GPU `gpu` (a rank's local rank) current. Where the launcher gave each rank a GPU of its own
    (CUDA_VISIBLE_DEVICES naming one, as Slurm's --gpus-per-task=1 does), that one, whatever the
    local rank; else a local rank past the GPUs it sees is refused."""
    count = cp.cuda.runtime.getDeviceCount()
    given = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if count == 1 and len(given) == 1:
        gpu = 0
    if not 0 <= gpu < count:
        raise DeviceError(f"GPU {gpu} was asked for (one per rank on a host), but {count} are visible: "
                          "show every rank its host's GPUs, or each rank one of its own (CUDA_VISIBLE_DEVICES)")
    cp.cuda.Device(gpu).use()


def _import_cupy():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001  ImportError, or CUDA driver errors surfacing as several types
        from ..install_hint import install_hint
        hint = f" ({install_hint('cuda', 'cupy-cuda13x')})" if isinstance(e, ImportError) else ""
        raise DeviceError(f"no usable GPU (CuPy and a CUDA device are needed): {type(e).__name__}: {e}{hint}") from None
    return cupy


register(CUDA())
