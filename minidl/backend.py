"""Devices: the CPU (NumPy) and CUDA (CuPy + cuDNN Frontend) backends.

A `Device` bundles the array module `xp`, the kernel families of that backend, a seeded random
generator and the compute dtype, and answers the questions callers would otherwise ask CuPy or
cuDNN: whether an exception means out of memory, how many SMs the GPU has, how long a call takes,
how much device memory is held; it also captures CUDA graphs (`capture`). CuPy and cuDNN are named
only here and in `minidl/kernels/gpu/`; CuPy is imported lazily so `import minidl` works without it.
"""
from __future__ import annotations
import collections
import importlib
import os
import time
import types
from typing import Any, Callable, Iterable

import numpy as np

from . import precision
from .kernels.gpu.capture import CaptureError, CapturedCall  # imports no CuPy
from ._types import Array, DTypeLike
from .rng import CounterRNG

__all__ = ["CaptureError", "CapturedCall", "CounterRNG", "Device", "DeviceError", "DtypeError", "KERNEL_FAMILIES", "MemoryUse",
           "cuda_status", "get_device"]

KERNEL_FAMILIES = ("conv", "dense", "activation", "merge", "pad", "pool", "norm", "lrn",
                   "dropout", "softmax", "optim", "direct", "augment")

MemoryUse = collections.namedtuple("MemoryUse", "used reserved")
MemoryUse.__doc__ = """Device memory in bytes: `used` by live arrays now, `reserved` the high-water mark (CuPy's
default pool keeps freed blocks; a captured call's memory counts the most it held: warm-ups, arena, misses)."""


class DeviceError(RuntimeError):
    """The requested device cannot be used (missing package, no GPU, out of memory)."""


class DtypeError(ValueError):
    """A layer (or optimizer) needs kernels that cannot compute in the device's dtype (Device.dtype_problem);
    raised at build, naming the layer."""


def _load_kernels(backend):
    ns = types.SimpleNamespace()
    for family in KERNEL_FAMILIES:
        try:
            setattr(ns, family, importlib.import_module(f"minidl.kernels.{backend}.{family}"))
        except ModuleNotFoundError as e:
            if not e.name.startswith(f"minidl.kernels.{backend}"):
                raise
    return ns


_KERNELS: dict[str, types.SimpleNamespace] = {}
_HALF_KERNELS: dict[np.dtype, types.SimpleNamespace] = {}


def _cpu_half_kernels(ns, dtype):
    """The CPU families storing in float16/bfloat16, computing in float32 (kernels/cpu/storage.py)."""
    if dtype not in _HALF_KERNELS:
        _HALF_KERNELS[dtype] = importlib.import_module("minidl.kernels.cpu.storage").families(ns, dtype)
    return _HALF_KERNELS[dtype]


def kernels_for(a: Array) -> types.SimpleNamespace:
    """The kernel families of the backend that holds array `a` (NumPy: cpu, else gpu)."""
    backend = "cpu" if isinstance(a, np.ndarray) else "gpu"
    if backend not in _KERNELS:
        _KERNELS[backend] = _load_kernels(backend)
    return _KERNELS[backend]


class Device:
    """An array module, its kernels, a generator and a dtype: everything a layer needs to run."""

    def __init__(self, name: str, dtype: DTypeLike = "float32", seed: int = 0, gpu: int | None = None) -> None:
        self.name, self.dtype = name, precision.dtype_of(dtype)
        if name == "cpu":
            self.xp: types.ModuleType = np
            self.rng = CounterRNG(np, seed)
            self.can_capture = False         # CUDA graphs: a captured training step
        elif name == "cuda":
            cp = _import_cupy()
            if gpu is not None:              # a data-parallel rank: the GPU of its local rank
                _use_gpu(cp, gpu)
            self.xp = cp
            importlib.import_module("minidl.kernels.gpu._cuda").prefetch()   # modules compile meanwhile
            self.stream = importlib.import_module("minidl.kernels.gpu.stream").compute_stream()
            importlib.import_module("minidl.kernels.gpu._cublas").prepare()     # its one-time setup
            self.rng = CounterRNG(cp, seed)
            self.can_capture = True
        else:
            raise ValueError(f"unknown device {name!r}: expected 'cpu', 'cuda' or 'auto'")
        self.kernels = self._kernels_for(self.dtype, _load_kernels("cpu" if name == "cpu" else "gpu"))

    def _kernels_for(self, dtype, ns):
        return _cpu_half_kernels(ns, dtype) if self.name == "cpu" and dtype in precision.HALF else ns

    def with_dtype(self, dtype: DTypeLike) -> Device:
        """The same backend, computing in `dtype` (float64 for gradient checks)."""
        d = object.__new__(Device)
        d.__dict__.update(self.__dict__)
        d.dtype = precision.dtype_of(dtype)
        if self.name == "cpu":
            d.kernels = self._kernels_for(d.dtype, _load_kernels("cpu"))
        return d

    def dtype_problem(self, families: Iterable[str]) -> str | None:
        """Why the kernel families `families` (names in `kernels`) cannot compute in this device's dtype,
        in one line, or None when all of them can.

        The support table lives in the families: each declares the dtypes it computes in as `DTYPES`
        (none declared: any), and where the answer depends on the library at hand (cuDNN's engines)
        also `dtype_problem(dtype) -> reason or None`. Layers ask at build (Layer.kernel_families), the
        inference schedule and the optimizers too, so a model that cannot run here is refused before
        anything runs, with one line naming the layer: never a raw error from inside a kernel.
        """
        where = "GPU" if self.name == "cuda" else "CPU"
        for name in families:
            family, why = getattr(self.kernels, name, None), None
            dtypes = getattr(family, "DTYPES", None)
            if family is None:
                why = f"no {name} kernels on the {where}"
            elif dtypes is not None and self.dtype.name not in dtypes:
                why = f"the {name} kernels compute in {' and '.join(dtypes)} only"
            elif hasattr(family, "dtype_problem"):
                why = family.dtype_problem(self.dtype)
            if why:
                other = ", or --device cpu" if self.name == "cuda" else ""
                instead = "--precision fp32" if self.dtype in precision.HALF else "float32"
                return f"{self.dtype.name} is not supported on the {where} ({why}); use {instead}{other}"
        return None

    def compute_in(self, dtype: DTypeLike) -> Device:
        """This device for the layers a precision policy runs in `dtype` (bfloat16, float16): on the CPU
        float32 kernels over half storage (kernels/cpu/storage.py), on the GPU the families' own half
        kernels; a layer whose families cannot is refused at build (dtype_problem), by name."""
        dtype = precision.dtype_of(dtype)
        return self if dtype == self.dtype else self.with_dtype(dtype)

    def set_tf32(self, on: bool) -> None:
        """Allow TF32 tensor-core math in FP32 cuDNN convolutions (the default) or forbid it."""
        if self.name == "cuda":
            importlib.import_module("minidl.kernels.gpu.cudnn").set_tf32(on)

    def set_deterministic(self, on: bool) -> None:
        """Only cuDNN engines with a fixed reduction order (the default: seeded runs repeat bit for
        bit), or any engine (faster for some shapes, LeNet-5's training step at batch 256 among them)."""
        if self.name == "cuda":
            importlib.import_module("minidl.kernels.gpu.cudnn").set_deterministic(on)

    def set_autotune(self, on: bool) -> None:
        """Time cuDNN's candidate engines once per convolution shape and keep the fastest (the
        default; the choice is cached on disk), or take cuDNN's heuristic first choice."""
        if self.name == "cuda":
            importlib.import_module("minidl.kernels.gpu.engines").set_autotune(on)

    def rng_state(self) -> dict[str, Any]:
        """The generator's state as JSON-able data, for checkpoints."""
        return self.rng.state()

    def set_rng_state(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.rng.set_state(state)

    def asarray(self, a: Any, dtype: DTypeLike | None = None) -> Array:
        """Copy a host array (or scalar) to this device."""
        return self.xp.asarray(a, dtype=dtype)

    def to_host(self, a: Array) -> np.ndarray:
        """A NumPy copy of a device array."""
        return a if isinstance(a, np.ndarray) else a.get()

    def preparing(self, say: Callable[[str], None]) -> Callable[[], None]:
        """Call say(line) while kernels compile and convolutions are timed ("preparing: compiling
        3/35 kernels, timing 4 convolutions"); returns the function that stops it."""
        if self.name == "cpu":
            return lambda: None
        return importlib.import_module("minidl.kernels.gpu._cuda").progress.listen(say)

    def sync(self) -> None:
        if self.name == "cuda":
            self.stream.synchronize()

    def channels_last(self, compute_dtype: DTypeLike, requested: bool | None = None) -> bool:
        """Whether convolutions should write channels-last activations (graph.passes.channels_last):
        `requested` if given, else where it was measured faster: on the GPU in 2-byte types, whose
        tensor-core convolutions are NHWC kernels (cuDNN transposes NCHW around them). The CPU
        computes in its own order: never."""
        if self.name != "cuda":
            return False
        return bool(requested) if requested is not None else np.dtype(compute_dtype).itemsize == 2

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """Whether `exc` says the device ran out of memory (CuPy, the CUDA runtime or cuDNN); False on cpu."""
        if self.name != "cuda":
            return False
        msg = str(exc)
        return (isinstance(exc, self.xp.cuda.memory.OutOfMemoryError) or "CUDNN_STATUS_ALLOC_FAILED" in msg
                or "out of memory" in msg.lower())

    @property
    def sm_count(self) -> int | None:
        """Streaming multiprocessors of the GPU (from its CUDA attributes); os.cpu_count() on cpu."""
        return os.cpu_count() if self.name != "cuda" else importlib.import_module("minidl.kernels.gpu._util").sm_count()

    def communicator(self, comm: Any) -> Any:
        """In-place collectives over this device's arrays among the ranks of the MPI communicator
        `comm` (collective: every rank calls it): MPI on cpu, NCCL on cuda, one GPU per rank
        (kernels/*/collectives.py: allreduce, start/wait that overlap what follows, close)."""
        backend = "cpu" if self.name == "cpu" else "gpu"
        return importlib.import_module(f"minidl.kernels.{backend}.collectives").Communicator(comm)

    def capture(self, fn: Callable[[], Any], warmup: int = 2) -> CapturedCall:
        """fn() recorded as a CUDA graph after `warmup` eager runs -> CapturedCall (`.replay()`, `.result`).

        The rules fn must follow are in minidl/kernels/gpu/capture.py; a broken capture raises
        CaptureError. CUDA graphs exist only on cuda: on cpu this raises DeviceError.
        """
        if self.name != "cuda":
            raise DeviceError(f"CUDA graphs need a cuda device; this is {self!r} (run fn directly on the cpu)")
        return CapturedCall(self, fn, warmup=warmup)

    def elapsed_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        """Milliseconds per call of fn(), over `repeats` calls: CUDA events on the device stream (device
        time, launches included when fn launches from Python); on cpu, time.perf_counter."""
        if self.name != "cuda":
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            return 1e3 * (time.perf_counter() - t0) / repeats
        cp = self.xp
        start, end = cp.cuda.Event(), cp.cuda.Event()
        with self.stream:
            start.record(self.stream)
            for _ in range(repeats):
                fn()
            end.record(self.stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / repeats

    def memory_bytes(self) -> MemoryUse | None:
        """MemoryUse(used, reserved) of device memory: CuPy's default pool plus every captured call's memory
        (kernels/gpu/planned_memory.py: graph memory lives there). None on cpu (NumPy allocations are not tracked)."""
        if self.name != "cuda":
            return None
        pool = self.xp.get_default_memory_pool()
        calls = importlib.import_module("minidl.kernels.gpu.planned_memory").live_memory()
        return MemoryUse(pool.used_bytes() + sum(u for u, _ in calls), pool.total_bytes() + sum(r for _, r in calls))

    def free_memory(self) -> None:
        """Give CuPy's cached, unused blocks back to the GPU, so that the `reserved` of the next
        memory_bytes() counts only what later code holds (a fresh peak). No-op on cpu."""
        if self.name == "cuda":
            self.xp.get_default_memory_pool().free_all_blocks()

    def __repr__(self) -> str:
        return f"Device({self.name!r}, dtype={self.dtype.name})"


def _use_gpu(cp, gpu):
    count = cp.cuda.runtime.getDeviceCount()
    if not 0 <= gpu < count:
        raise DeviceError(f"GPU {gpu} was asked for (one per rank on a host), but {count} are visible")
    cp.cuda.Device(gpu).use()


def _import_cupy():
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or CUDA driver errors surfacing as several types
        from .install_hint import install_hint
        hint = f" ({install_hint('cuda', 'cupy-cuda13x')})" if isinstance(e, ImportError) else ""
        raise DeviceError(f"no usable GPU (CuPy and a CUDA device are needed): {type(e).__name__}: {e}{hint}") from None
    return cupy


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): whether CuPy, a CUDA device and the cuDNN Frontend are all usable."""
    try:
        _import_cupy()
    except DeviceError as e:
        return False, str(e)
    try:
        importlib.import_module("minidl.kernels.gpu.frontend").load()   # the cuDNN Frontend Python API
    except Exception as e:
        return False, f"the cuDNN Frontend (import cudnn) is missing: {e}"
    return True, "CuPy, a CUDA device and the cuDNN Frontend are usable"


def get_device(spec: str | Device = "auto", dtype: DTypeLike = "float32", seed: int = 0, verbose: bool = False,
               gpu: int | None = None) -> Device:
    """Resolve 'auto', 'cpu', 'cuda' or a Device into a Device; 'auto' prefers a usable GPU.

    gpu: the index of the GPU a cuda device uses (a rank's local rank); None: the current one.
    """
    if isinstance(spec, Device):
        return spec
    if spec == "auto":
        ok, why = cuda_status()
        spec = "cuda" if ok else "cpu"
        if verbose:
            print(f"device: {spec} ({why})")
    elif spec == "cuda":
        ok, why = cuda_status()
        if not ok:
            raise DeviceError(why)
    return Device(spec, dtype=dtype, seed=seed, gpu=gpu if spec == "cuda" else None)
