"""CUDA graphs for CuPy code: capture a Python function once, replay it with one launch.

Reach it through the device: `device.capture(fn, warmup=2) -> CapturedCall`, and catch
`minidl.backend.CaptureError`. `CapturedCall(device, fn)` runs `fn()` eagerly to warm up, then
records one call of it on `device.stream` as a CUDA graph; `replay()` re-runs every kernel it
launched, on the same addresses, for the cost of one graph launch instead of one Python-driven
launch per kernel.

The rules `fn` must follow, because a graph replays kernels, never Python:

- Fixed addresses: `fn` reads inputs from buffers allocated before the capture and kept alive
  (write new data into them, never rebind them), and writes its outputs into arrays it
  allocates (returned, and kept by the CapturedCall) or into buffers it was given.
- Fixed shapes and control flow: whatever Python decides during the capture (branches, shapes,
  scalar kernel arguments, cuDNN plans) is frozen into the graph.
- No host synchronisation: no `.get()`, `float(a)`, `int(a)`, `bool(a)`, `stream.synchronize()`,
  no `cupy.asnumpy`, nothing that waits for the device (it breaks the capture: an error says so).
- No new host-to-device copies inside `fn` (`cupy.asarray(numpy_array)`): a captured copy would
  read the same host memory at every replay, which by then may be freed or changed. Copy into
  the input buffers before `replay()` instead.
- Everything `fn` needs compiled or planned is done by the warm-up runs (CuPy kernels, cuDNN
  graphs and their workspace, cuBLAS's workspace); the capture itself only records.

Memory (planned_memory.py): the warm-ups run on exact allocations (the device holds only what is
alive), the last of them traced; the capture allocates from one arena planned by liveness over that
trace (memplan.py), each array at an address fixed for the life of this object, so memory the graph
reads or writes is never handed to other code. Every captured call's memory is counted by
`planned_memory.live_memory()` (and through it `Device.memory_bytes()`), and `release_all()` can
destroy every graph: NCCL's communicator destroy waits until the graphs that recorded its
collectives are gone (collectives.Communicator.close).
"""
from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any


_RULES = ("inside it, avoid host synchronisation (.get(), float(), synchronize()) and host-to-device "
          "copies (see minidl.kernels.gpu.capture)")
_LIVE: weakref.WeakSet[CapturedCall] = weakref.WeakSet()      # every CapturedCall not yet collected


def release_all() -> None:
    """Destroy the graph of every live CapturedCall (they cannot replay afterwards)."""
    for c in list(_LIVE):
        c.release()


class CaptureError(RuntimeError):
    """`fn` could not be captured: it synchronised with the host or otherwise broke the rules."""


class CapturedCall:
    """fn() recorded as a CUDA graph on device.stream; `replay()` launches it.

    `result` is what `fn` returned during the capture (its output arrays, whose addresses stay
    valid for the life of this object and are rewritten by every replay). `warmup` eager runs
    come first, their results dropped; the last is traced for the memory plan, so with two the
    first does what happens once (compiling, timing cuDNN's engines) and the plan fits the capture.
    """

    def __init__(self, device: Any, fn: Callable[[], Any], warmup: int = 2) -> None:
        if getattr(device, "name", None) != "cuda":
            raise ValueError(f"CUDA graphs need a cuda device, got {device!r}")
        if warmup < 1:
            raise ValueError(f"at least one warm-up run is needed (kernels compile there), got {warmup}")
        cp = device.xp
        self.device, self.stream, self.name = device, device.stream, getattr(fn, "__name__", "fn")
        from . import _cuda
        from .planned_memory import PlannedMemory      # CuPy itself: imported only where a GPU is used
        _cuda.wait_ahead()                # the pool's rehearsals allocate: none may run into a capture
        self.memory = PlannedMemory(self.stream, cp.cuda.MemoryPool())
        weakref.finalize(self, self.memory.retire)
        _LIVE.add(self)
        with self.stream:
            with cp.cuda.using_allocator(self.memory.exact):
                for _ in range(warmup - 1):
                    fn()
            with self.memory.tracing():
                fn()
            self.stream.synchronize()   # warm-up errors surface here, before capturing
            with self.memory.capture():
                self.result, self.graph = self._capture(fn)
            self.graph.upload(self.stream)  # instantiate and upload now, not at the first replay
        # fn is not kept: a closure over its owner would make a reference cycle, and the graph would
        # live until the cyclic collector ran (a communicator's destroy at exit waits for it)

    def _capture(self, fn):
        # No cyclic garbage collection while capturing: a collected CUDA object (stream, event,
        # graph) would make a CUDA call that is illegal in the middle of a capture.
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            return self._record(fn)
        finally:
            if gc_was_on:
                gc.enable()

    def _record(self, fn):
        self.stream.begin_capture()
        try:
            result = fn()
        except BaseException as e:
            try:
                self.stream.end_capture()   # leave capture mode so the stream stays usable
            except Exception:  # noqa: BLE001  an invalidated capture reports itself here too
                pass
            if isinstance(e, Exception):    # the warm-up ran fn fine: capturing is what failed
                raise CaptureError(f"the function failed while being captured ({type(e).__name__}: {e}); "
                                   + _RULES) from e
            raise
        try:
            graph = self.stream.end_capture()
        except Exception as e:
            raise CaptureError(f"the function broke the CUDA graph capture ({e}); " + _RULES) from e
        return result, graph

    def replay(self) -> Any:
        """Launch the graph on device.stream (asynchronous); returns `result`."""
        if self.graph is None:
            raise CaptureError(f"CapturedCall({self.name}) was released: capture it again")
        self.graph.launch(self.stream)
        return self.result

    def release(self) -> None:
        """Destroy the graph and drop its outputs (the arena stays until this object goes)."""
        self.graph = self.result = None

    __call__ = replay

    @property
    def nbytes(self) -> int:
        """Device memory held for the graph now: its arena (temporaries and outputs), and what missed it."""
        return self.memory.used_bytes

    def __repr__(self) -> str:
        return f"CapturedCall({self.name}, {self.nbytes / 2**20:.1f} MiB; {self.memory.describe()})"
