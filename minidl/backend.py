"""Devices: a backend (minidl/backends/: cpu is NumPy, cuda is CuPy + cuDNN Frontend) and a dtype.

A `Device` bundles the array module `xp`, the kernel families of its backend, a seeded random
generator and the compute dtype, and answers the questions callers would otherwise ask CuPy or
cuDNN: whether an exception means out of memory, how many SMs the GPU has, how long a call takes,
how much device memory is held; it also captures CUDA graphs (`capture`). Every answer comes from
its backend (`device.backend`), found by name in the registry, so a new backend is a new
`minidl.backends.Backend` registered under its name, and nothing here changes. CuPy and cuDNN are
named only in `minidl/backends/cuda.py` and `minidl/kernels/gpu/`, imported when a cuda Device is
made, so `import minidl` works without them.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

import numpy as np

from . import backends, precision
from ._types import Array, DTypeLike
from .backends import DeviceError, DtypeError, MemoryUse
from .backends.cuda import CaptureError, CapturedCall  # CUDA graphs (kernels/gpu/capture.py, no CuPy at import)
from .kernels.families import KERNEL_FAMILIES, Kernels
from .rng import CounterRNG

__all__ = ["CaptureError", "CapturedCall", "CounterRNG", "Device", "DeviceError", "DtypeError", "KERNEL_FAMILIES",
           "Kernels", "MemoryUse", "cuda_status", "get_device", "kernels_for"]

_log = logging.getLogger(__name__)
_KERNELS: dict[str, Kernels] = {}    # backend name -> its float families, for kernels_for


def kernels_for(a: Array) -> Kernels:
    """The kernel families of the backend that holds array `a` (the registry asks each backend)."""
    backend = backends.of_array(a)
    if backend.name not in _KERNELS:
        _KERNELS[backend.name] = backend.families()
    return _KERNELS[backend.name]


class Device:
    """An array module, its kernels, a generator and a dtype: everything a layer needs to run."""

    def __init__(self, name: str, dtype: DTypeLike = "float32", seed: int = 0, gpu: int | None = None) -> None:
        self.dtype = precision.dtype_of(dtype)
        self.backend: backends.Backend = backends.find(name)
        self.name = self.backend.name
        self.xp, self.stream = self.backend.start(gpu)   # gpu: a data-parallel rank's accelerator
        self.rng = CounterRNG(self.xp, seed)
        self.can_capture: bool = self.backend.can_capture   # CUDA graphs: a captured training step
        self.kernels: Kernels = self.backend.kernels(self.dtype)   # typed by the contract (kernels/families.py)

    def with_dtype(self, dtype: DTypeLike) -> Device:
        """The same backend, computing in `dtype` (float64 for gradient checks)."""
        d = object.__new__(Device)
        d.__dict__.update(self.__dict__)
        d.dtype = precision.dtype_of(dtype)
        d.kernels = self.backend.kernels(d.dtype, self.kernels)
        return d

    def has(self, family: str, function: str | None = None) -> bool:
        """Whether this device's kernels hold the family `family` (and its `function`): the contract's
        optional families and extras (minidl/kernels/families.py) are asked for here, never probed."""
        module = getattr(self.kernels, family, None)
        return module is not None and (function is None or hasattr(module, function))

    def dtype_problem(self, families: Iterable[str]) -> str | None:
        """Why the kernel families `families` (names in `kernels`) cannot compute in this device's dtype,
        in one line, or None when all of them can.

        The support table lives in the families: each declares the dtypes it computes in as `DTYPES`
        (none declared: any), and where the answer depends on the library at hand (cuDNN's engines)
        also `dtype_problem(dtype) -> reason or None` (the contract's hook). Layers ask at build
        (Layer.kernel_families), the inference schedule and the optimizers too, so a model that cannot
        run here is refused before anything runs, with one line naming the layer: never a raw error
        from inside a kernel.
        """
        where = self.backend.label
        for name in families:
            family: Any = getattr(self.kernels, name, None)
            why: str | None = None
            dtypes = getattr(family, "DTYPES", None)
            if not self.has(name):
                why = f"no {name} kernels on the {where}"
            elif dtypes is not None and self.dtype.name not in dtypes:
                why = f"the {name} kernels compute in {' and '.join(dtypes)} only"
            elif hasattr(family, "dtype_problem"):
                why = family.dtype_problem(self.dtype)
            if why:
                instead = "--precision fp32" if self.dtype in precision.HALF else "float32"
                return (f"{self.dtype.name} is not supported on the {where} ({why}); "
                        f"use {instead}{self.backend.elsewhere}")
        return None

    def compute_in(self, dtype: DTypeLike) -> Device:
        """This device for the layers a precision policy runs in `dtype` (bfloat16, float16): on the CPU
        float32 kernels over half storage (kernels/cpu/storage.py), on the GPU the families' own half
        kernels; a layer whose families cannot is refused at build (dtype_problem), by name."""
        dtype = precision.dtype_of(dtype)
        return self if dtype == self.dtype else self.with_dtype(dtype)

    def set_tf32(self, on: bool) -> None:
        """Allow TF32 tensor-core math in FP32 cuDNN convolutions (the default) or forbid it."""
        self.backend.set_tf32(on)

    def set_deterministic(self, on: bool) -> None:
        """Only cuDNN engines with a fixed reduction order (the default: seeded runs repeat bit for
        bit), or any engine (faster for some shapes, LeNet-5's training step at batch 256 among them)."""
        self.backend.set_deterministic(on)

    def set_autotune(self, on: bool) -> None:
        """Time cuDNN's candidate engines once per convolution shape and keep the fastest (the
        default; the choice is cached on disk), or take cuDNN's heuristic first choice."""
        self.backend.set_autotune(on)

    def rng_state(self) -> dict[str, Any]:
        """The generator's state as JSON-able data, for checkpoints."""
        return self.rng.state()

    def set_rng_state(self, state: dict[str, Any] | None) -> None:
        if state is not None:
            self.rng.set_state(state)

    def asarray(self, a: Any, dtype: DTypeLike | None = None) -> Array:
        """Copy a host array (or scalar) to this device."""
        return self.xp.asarray(a, dtype=dtype)

    def fill(self, a: Array, value: Any) -> None:
        """a[...] = value, copied from the host. A fill kernel is compiled once per dtype, 0.1 s each on
        an empty cache (docs/cold-start.md); a copy compiles nothing. For the small arrays of a
        run's counters and flags."""
        host = np.full(a.shape or (1,), value, a.dtype)     # CuPy fills a 0-d array it is given
        self.xp.copyto(a, self.xp.asarray(host).reshape(a.shape))

    def to_host(self, a: Array) -> np.ndarray:
        """A NumPy copy of a device array (asked of the backend that holds it: a NumPy array is its own)."""
        return backends.of_array(a).to_host(a)

    def preparing(self, say: Callable[[str], None]) -> Callable[[], None]:
        """Call say(line) while kernels compile and convolutions are timed ("preparing: compiling
        3/35 kernels, timing 4 convolutions"); returns the function that stops it."""
        return self.backend.preparing(say)

    def sync(self) -> None:
        self.backend.synchronize(self)

    def channels_last(self, compute_dtype: DTypeLike, requested: bool | None = None, macs: float = 0.0) -> bool:
        """Whether convolutions should write channels-last activations (graph.passes.channels_last)
        in a model of `macs` multiply-adds an image (graph.passes.macs_per_image): `requested` if
        given, else where it was measured faster: on the GPU in 2-byte types, and in float32 for
        models large enough for tensor cores (cuDNN transposes NCHW around its NHWC kernels). The
        CPU computes in its own order: never."""
        return self.backend.channels_last(compute_dtype, requested, macs)

    def half_pays(self, macs: float) -> bool:
        """Whether a model of `macs` multiply-adds an image gains from a half-precision policy here
        (precision.where_it_pays): on the GPU from about ten million; on the CPU, whose half
        kernels emulate the rounding, always (the policy is kept for its numerics)."""
        return self.backend.half_pays(macs)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """Whether `exc` says the device ran out of memory (CuPy, the CUDA runtime or cuDNN); False on cpu."""
        return self.backend.is_out_of_memory(self, exc)

    @property
    def sm_count(self) -> int | None:
        """Streaming multiprocessors of the GPU (from its CUDA attributes); os.cpu_count() on cpu."""
        return self.backend.sm_count()

    def communicator(self, comm: Any) -> Any:
        """In-place collectives over this device's arrays among the ranks of the MPI communicator
        `comm` (collective: every rank calls it): MPI on cpu, NCCL on cuda, one GPU per rank
        (kernels/*/collectives.py: allreduce, start/wait that overlap what follows, close)."""
        return self.backend.communicator(comm)

    def capture(self, fn: Callable[[], Any], warmup: int = 2) -> CapturedCall:
        """fn() recorded as a CUDA graph after `warmup` eager runs -> CapturedCall (`.replay()`, `.result`).

        The rules fn must follow are in minidl/kernels/gpu/capture.py; a broken capture raises
        CaptureError. CUDA graphs exist only on cuda: on cpu this raises DeviceError.
        """
        return self.backend.capture(self, fn, warmup)

    def elapsed_ms(self, fn: Callable[[], object], repeats: int = 1) -> float:
        """Milliseconds per call of fn(), over `repeats` calls: CUDA events on the device stream (device
        time, launches included when fn launches from Python); on cpu, time.perf_counter."""
        return self.backend.elapsed_ms(self, fn, repeats)

    def memory_bytes(self) -> MemoryUse | None:
        """MemoryUse(used, reserved) of device memory: CuPy's default pool plus every captured call's memory
        (kernels/gpu/planned_memory.py: graph memory lives there). None on cpu (NumPy allocations are not tracked)."""
        return self.backend.memory_bytes(self)

    def free_memory(self) -> None:
        """Give CuPy's cached, unused blocks back to the GPU, so that the `reserved` of the next
        memory_bytes() counts only what later code holds (a fresh peak). No-op on cpu."""
        self.backend.free_memory(self)

    def __repr__(self) -> str:
        return f"Device({self.name!r}, dtype={self.dtype.name})"


def cuda_status() -> tuple[bool, str]:
    """(usable, reason): whether CuPy, a CUDA device and the cuDNN Frontend are all usable."""
    return backends.find("cuda").status()


def _preferred() -> tuple[str, str]:
    """(name, reason) of the usable backend 'auto' takes (the most preferred; its reason, or why the
    preferred ones are not usable)."""
    ordered = sorted(backends.names(), key=lambda n: -backends.find(n).prefer)
    reasons: list[str] = []
    for name in ordered:
        ok, why = backends.find(name).status()
        if ok:
            return name, why if not reasons else reasons[0]
        reasons.append(why)
    raise DeviceError("; ".join(reasons))


def get_device(spec: str | Device = "auto", dtype: DTypeLike = "float32", seed: int = 0, verbose: bool = False,
               gpu: int | None = None) -> Device:
    """Resolve 'auto', a backend's name ('cpu', 'cuda'; 'gpu' for cuda) or a Device into a Device; 'auto'
    prefers a usable GPU.

    gpu: the index of the GPU a cuda device uses (a rank's local rank); None: the current one.
    verbose: 'auto's choice and why is logged at INFO (logger minidl.backend; at DEBUG without it).
    """
    if isinstance(spec, Device):
        return spec
    if spec == "auto":
        spec, why = _preferred()
        (_log.info if verbose else _log.debug)("device: %s (%s)", spec, why)
    else:
        ok, why = backends.find(spec).status()
        if not ok:
            raise DeviceError(why)
    return Device(spec, dtype=dtype, seed=seed, gpu=gpu)
