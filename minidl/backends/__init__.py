"""Backends as plug-ins: each is a `Backend` registered under its name, found by name or by an array.

A backend holds what a `minidl.backend.Device` would otherwise switch on: its array module, its
kernel families (one module a family under `kernels_package`, their contract in
minidl/kernels/contract.py, held in a `Kernels`: minidl/kernels/families.py), and its answers (is it
usable here, does an exception mean out of memory, can it capture a call as a graph, how a call is
timed, how much memory is held, how its arrays reach the host). The class below answers as a host
backend does (no streams, no graphs, no device memory); a backend overrides what it has. `cpu` (NumPy)
and `cuda` (CuPy + cuDNN) register themselves when this package is imported; a third registers with
`register(MyBackend())`, and `get_device("<its name>")` then finds it.
"""
from __future__ import annotations

import collections
import importlib
import os
import time
import types
from typing import Any, Callable

from .._types import Array, DTypeLike
from ..kernels.families import KERNEL_FAMILIES, Kernels

__all__ = ["Backend", "DeviceError", "DtypeError", "MemoryUse", "find", "names", "of_array", "register"]

MemoryUse = collections.namedtuple("MemoryUse", "used reserved")
MemoryUse.__doc__ = """Device memory in bytes: `used` by live arrays now, `reserved` the high-water mark (CuPy's
default pool keeps freed blocks; a captured call's memory counts the most it held: warm-ups, arena, misses)."""


class DeviceError(RuntimeError):
    """The requested device cannot be used (missing package, no GPU, out of memory)."""


class DtypeError(ValueError):
    """A layer (or optimizer) needs kernels that cannot compute in the device's dtype (Device.dtype_problem);
    raised at build, naming the layer."""


class Backend:
    """One kind of device: its name, kernels and answers. Methods that need a device's state (its
    stream, its array module) take the Device; the backend itself holds none, so one instance serves
    every Device of its kind."""

    name = ""                      # what get_device takes: "cpu", "cuda"
    aliases: tuple[str, ...] = ()  # other names get_device takes for it
    kernels_package = ""           # "minidl.kernels.cpu": one module a kernel family
    label = ""                     # how messages name it: "CPU", "GPU"
    elsewhere = ""                 # what a dtype refusal suggests besides another dtype (", or --device cpu")
    can_capture = False            # records a call as a graph (Device.capture), so a step can be replayed
    prefer = 0                     # get_device('auto') tries the usable backends highest first

    # -- found and started ----------------------------------------------------------------------
    def status(self) -> tuple[bool, str]:
        """(usable, reason): whether this backend can run here."""
        return True, f"the {self.label} is usable"

    def owns(self, a: Array) -> bool:
        """Whether `a` is one of this backend's arrays."""
        raise NotImplementedError

    def start(self, gpu: int | None) -> tuple[types.ModuleType, Any]:
        """(array module, stream or None) for a new Device; `gpu`: which accelerator, where there are several."""
        raise NotImplementedError

    # -- kernels --------------------------------------------------------------------------------
    def families(self) -> Kernels:
        """This backend's kernel families (family name -> module under `kernels_package`), typed by the
        contract (minidl/kernels/families.py); an optional family it has no module for is None."""
        found = {}
        for family in KERNEL_FAMILIES:
            try:
                found[family] = importlib.import_module(f"{self.kernels_package}.{family}")
            except ModuleNotFoundError as e:
                if not (e.name or "").startswith(self.kernels_package):
                    raise
        return Kernels(**found)

    def kernels(self, dtype: DTypeLike, current: Kernels | None = None) -> Kernels:
        """The families a Device computing in `dtype` calls: here the same modules in every dtype (they take
        the dtypes they declare themselves), so a Device's own `current` families are kept."""
        return self.families() if current is None else current

    def communicator(self, comm: Any) -> Any:
        """The collectives family's Communicator over the MPI communicator `comm` (loaded on demand)."""
        return importlib.import_module(f"{self.kernels_package}.collectives").Communicator(comm)

    # -- answers --------------------------------------------------------------------------------
    def to_host(self, a: Array) -> Any:
        """A NumPy copy of one of this backend's arrays."""
        return a

    def set_tf32(self, on: bool) -> None:
        """TF32 tensor-core math in float32 convolutions: nothing to set on a backend without it."""

    def set_deterministic(self, on: bool) -> None:
        """Only fixed-order reductions: nothing to set where every kernel has one."""

    def set_autotune(self, on: bool) -> None:
        """Time candidate engines per shape: nothing to set where there is one engine."""

    def preparing(self, say: Callable[[str], None]) -> Callable[[], None]:
        """Report preparation (compiling, timing) through say(line); returns the function that stops it."""
        return lambda: None

    def synchronize(self, device: Any) -> None:
        """Wait for the device's queued work: nothing is queued on a host backend."""

    def channels_last(self, compute_dtype: DTypeLike, requested: bool | None, macs: float = 0.0) -> bool:
        """Whether convolutions should write channels-last activations (for a model of `macs`
        multiply-adds an image): never where kernels keep their own order."""
        return False

    def half_pays(self, macs: float) -> bool:
        """Whether a model of `macs` multiply-adds an image runs faster in a 2-byte type: here, as
        asked (a backend whose half kernels emulate the rounding, as the CPU's, keeps a precision
        policy for its numerics, not its speed)."""
        return True

    def is_out_of_memory(self, device: Any, exc: BaseException) -> bool:
        """Whether `exc` says the device ran out of memory."""
        return False

    def sm_count(self) -> int | None:
        """How many processors run kernels side by side (a GPU's SMs; the host's cores)."""
        return os.cpu_count()

    def capture(self, device: Any, fn: Callable[[], Any], warmup: int) -> Any:
        """fn() recorded as a replayable graph: refused where the backend has none."""
        raise DeviceError(f"CUDA graphs need a cuda device; this is {device!r} (run fn directly on the cpu)")

    def elapsed_ms(self, device: Any, fn: Callable[[], object], repeats: int) -> float:
        """Milliseconds per call of fn() over `repeats` calls, by the host's clock."""
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return 1e3 * (time.perf_counter() - t0) / repeats

    def memory_bytes(self, device: Any) -> MemoryUse | None:
        """MemoryUse(used, reserved) of device memory; None where it is not tracked."""
        return None

    def free_memory(self, device: Any) -> None:
        """Give cached, unused blocks back; nothing is cached on a host backend."""


_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make `backend` findable under its name and aliases (a later one of the same name replaces it)."""
    for name in (backend.name, *backend.aliases):
        _REGISTRY[name] = backend
    return backend


def names() -> tuple[str, ...]:
    """The registered backends' names, in registration order (aliases left out)."""
    return tuple(dict.fromkeys(b.name for b in _REGISTRY.values()))


def find(name: str) -> Backend:
    """The backend registered as `name`; ValueError naming the others if none is."""
    if name not in _REGISTRY:
        known = [repr(n) for n in names()] + ["'auto'"]
        raise ValueError(f"unknown device {name!r}: expected {', '.join(known[:-1])} or {known[-1]}")
    return _REGISTRY[name]


def of_array(a: Array) -> Backend:
    """The backend that holds array `a` (each registered backend is asked whether it owns it)."""
    for name in names():
        if _REGISTRY[name].owns(a):
            return _REGISTRY[name]
    raise TypeError(f"no registered backend holds a {type(a).__module__}.{type(a).__name__}")


from . import cpu, cuda  # noqa: E402,F401  the built-in backends register themselves (they import the names above)
