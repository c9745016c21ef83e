"""Devices: the CPU (NumPy) and CUDA (CuPy + cuDNN Frontend) backends.

A `Device` bundles the array module `xp`, the kernel families of that backend, a seeded random
generator and the compute dtype, and answers the questions callers would otherwise ask CuPy or
cuDNN: whether an exception means out of memory, how many SMs the GPU has, how long a call takes,
how much device memory is held; it also captures CUDA graphs (`capture`). CuPy and cuDNN are named
only here and in `minidl/kernels/gpu/`; CuPy is imported lazily so `import minidl` works without it.
"""
import collections
import importlib
import os
import time
import types

import numpy as np

from .kernels.gpu.capture import CaptureError, CapturedCall  # imports no CuPy

__all__ = ["CaptureError", "CapturedCall", "Device", "DeviceError", "KERNEL_FAMILIES", "MemoryUse", "cuda_status",
           "get_device"]

KERNEL_FAMILIES = ("conv", "dense", "activation", "merge", "pad", "pool", "norm", "lrn",
                   "dropout", "softmax", "optim", "direct", "augment")

MemoryUse = collections.namedtuple("MemoryUse", "used reserved")
MemoryUse.__doc__ = """Device memory in bytes: `used` by live arrays now, `reserved` by the pools (their high-water
mark: CuPy pools keep freed blocks), over CuPy's default pool and every live CapturedCall's pool."""


class DeviceError(RuntimeError):
    """The requested device cannot be used (missing package, no GPU, out of memory)."""


def _load_kernels(backend):
    ns = types.SimpleNamespace()
    for family in KERNEL_FAMILIES:
        try:
            setattr(ns, family, importlib.import_module(f"minidl.kernels.{backend}.{family}"))
        except ModuleNotFoundError as e:
            if not e.name.startswith(f"minidl.kernels.{backend}"):
                raise
    return ns


_KERNELS = {}


def kernels_for(a):
    """The kernel families of the backend that holds array `a` (NumPy: cpu, else gpu)."""
    backend = "cpu" if isinstance(a, np.ndarray) else "gpu"
    if backend not in _KERNELS:
        _KERNELS[backend] = _load_kernels(backend)
    return _KERNELS[backend]


class CounterRNG:
    """The device's generator for dropout: counter-based (Philox4x32-10, kernels.*.dropout), so a draw
    depends on `key` and a counter alone. `offset` (a 0-d uint64 on the device) is where the next
    draw starts; kernels advance it there, so a captured CUDA graph draws anew at every replay, and
    the whole state is two numbers, saved in checkpoints on either device."""

    def __init__(self, xp, seed):
        seed = int(seed)
        self.key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
        self.offset = xp.zeros((), np.uint64)

    def state(self):
        return {"key": list(self.key), "offset": int(self.offset)}

    def set_state(self, state):
        """Continue the draws `state()` describes (its key, which the seed gave, and its offset)."""
        key = state.get("key") if isinstance(state, dict) else None
        ok = (isinstance(key, list) and len(key) == 2 and all(type(k) is int and 0 <= k <= 0xFFFFFFFF for k in key)
              and type(state.get("offset")) is int and 0 <= state["offset"] < 2 ** 63)
        if not ok:
            raise ValueError(f"generator state must be {{'key': [two 32-bit ints], 'offset': int}}, got {state!r}"[:200])
        self.key = tuple(key)
        self.offset.fill(state["offset"])


class Device:
    """An array module, its kernels, a generator and a dtype: everything a layer needs to run."""

    def __init__(self, name, dtype="float32", seed=0, gpu=None):
        self.name, self.dtype = name, np.dtype(dtype)
        if name == "cpu":
            self.xp = np
            self.rng = CounterRNG(np, seed)
            self.can_capture = False         # CUDA graphs: a captured training step
        elif name == "cuda":
            cp = _import_cupy()
            if gpu is not None:              # a data-parallel rank: the GPU of its local rank
                _use_gpu(cp, gpu)
            self.xp = cp
            self.stream = _compute_stream(cp)
            self.rng = CounterRNG(cp, seed)
            self.can_capture = True
        else:
            raise ValueError(f"unknown device {name!r}: expected 'cpu', 'cuda' or 'auto'")
        self.kernels = _load_kernels("cpu" if name == "cpu" else "gpu")

    def with_dtype(self, dtype):
        """The same backend, computing in `dtype` (float64 for gradient checks)."""
        d = object.__new__(Device)
        d.__dict__.update(self.__dict__)
        d.dtype = np.dtype(dtype)
        return d

    def set_tf32(self, on):
        """Allow TF32 tensor-core math in FP32 cuDNN convolutions (the default) or forbid it."""
        if self.name == "cuda":
            importlib.import_module("minidl.kernels.gpu.cudnn").set_tf32(on)

    def set_deterministic(self, on):
        """Only cuDNN engines with a fixed reduction order (the default: seeded runs repeat bit for
        bit), or any engine (faster for some shapes: LeNet-5 at batch 256 steps in 0.58 ms, not 0.98)."""
        if self.name == "cuda":
            importlib.import_module("minidl.kernels.gpu.cudnn").set_deterministic(on)

    def rng_state(self):
        """The generator's state as JSON-able data, for checkpoints."""
        return self.rng.state()

    def set_rng_state(self, state):
        if state is not None:
            self.rng.set_state(state)

    def asarray(self, a, dtype=None):
        """Copy a host array (or scalar) to this device."""
        return self.xp.asarray(a, dtype=dtype)

    def to_host(self, a):
        """A NumPy copy of a device array."""
        return a if isinstance(a, np.ndarray) else a.get()

    def sync(self):
        if self.name == "cuda":
            self.stream.synchronize()

    def is_out_of_memory(self, exc):
        """Whether `exc` says the device ran out of memory (CuPy, the CUDA runtime or cuDNN); False on cpu."""
        if self.name != "cuda":
            return False
        msg = str(exc)
        return (isinstance(exc, self.xp.cuda.memory.OutOfMemoryError) or "CUDNN_STATUS_ALLOC_FAILED" in msg
                or "out of memory" in msg.lower())

    @property
    def sm_count(self):
        """Streaming multiprocessors of the GPU (from its CUDA attributes); os.cpu_count() on cpu."""
        if self.name != "cuda":
            return os.cpu_count()
        return importlib.import_module("minidl.kernels.gpu._util").sm_count()

    def collectives(self, comm):
        """NCCL all-reduce among the ranks of the MPI communicator `comm`, one GPU each
        (minidl/kernels/gpu/nccl.py; the CPU ranks reduce over MPI itself). cuda only."""
        if self.name != "cuda":
            raise DeviceError(f"NCCL needs a cuda device; this is {self!r}")
        return importlib.import_module("minidl.kernels.gpu.nccl").Communicator(comm)

    def capture(self, fn, warmup=2):
        """fn() recorded as a CUDA graph after `warmup` eager runs -> CapturedCall (`.replay()`, `.result`).

        The rules fn must follow are in minidl/kernels/gpu/capture.py; a broken capture raises
        CaptureError. CUDA graphs exist only on cuda: on cpu this raises DeviceError.
        """
        if self.name != "cuda":
            raise DeviceError(f"CUDA graphs need a cuda device; this is {self!r} (run fn directly on the cpu)")
        return CapturedCall(self, fn, warmup=warmup)

    def elapsed_ms(self, fn, repeats=1):
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

    def memory_bytes(self):
        """MemoryUse(used, reserved) of device memory: CuPy's default pool plus every live CapturedCall's
        private pool (graph memory lives there). None on cpu (NumPy allocations are not tracked)."""
        if self.name != "cuda":
            return None
        live = importlib.import_module("minidl.kernels.gpu.capture").live_pools()
        pools = [self.xp.get_default_memory_pool()] + live
        return MemoryUse(sum(p.used_bytes() for p in pools), sum(p.total_bytes() for p in pools))

    def free_memory(self):
        """Give CuPy's cached, unused blocks back to the GPU, so that the `reserved` of the next
        memory_bytes() counts only what later code holds (a fresh peak). No-op on cpu."""
        if self.name == "cuda":
            self.xp.get_default_memory_pool().free_all_blocks()

    def __repr__(self):
        return f"Device({self.name!r}, dtype={self.dtype.name})"


_STREAMS = {}


def _compute_stream(cp):
    """One non-blocking stream per GPU, made current: CUDA graphs cannot be captured on the
    legacy default stream, and cuDNN is bound to whatever stream is current.

    The stream is entered as a context and never left: `.use()` alone would not put it on CuPy's
    stream stack, and the first `with stream:` block would then exit to the legacy stream,
    which does not wait for ours.
    """
    dev = cp.cuda.Device().id
    if dev not in _STREAMS:
        _STREAMS[dev] = cp.cuda.Stream(non_blocking=True)
        _STREAMS[dev].__enter__()
    elif cp.cuda.get_current_stream() != _STREAMS[dev]:
        _STREAMS[dev].__enter__()
    return _STREAMS[dev]


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
        raise DeviceError(f"no usable GPU (CuPy and a CUDA device are needed): {type(e).__name__}: {e}") from None
    return cupy


def cuda_status():
    """(usable, reason): whether CuPy, a CUDA device and the cuDNN Frontend are all usable."""
    try:
        _import_cupy()
    except DeviceError as e:
        return False, str(e)
    try:
        importlib.import_module("cudnn")   # the cuDNN Frontend Python API
    except Exception as e:
        return False, f"the cuDNN Frontend (import cudnn) is missing: {e}"
    return True, "CuPy, a CUDA device and the cuDNN Frontend are usable"


def get_device(spec="auto", dtype="float32", seed=0, verbose=False, gpu=None):
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
