"""What the CUDA sources of the GPU families share: the 2-byte types, their conversions to and from
float, templated modules compiled once, the GPU's size, and how minidl's CUDA code gets compiled.
Imports nothing of minidl.

Compiling is most of a first run on a machine whose caches are empty (CuPy's NVRTC compiles, one
after another, about half a second each), so:
- `prefetch()` compiles every `Module` whose names are known in a thread pool, ahead of first use
  and beside the main thread's work; it starts when a cuda Device is made (or the first
  Module kernel or cuDNN handle is asked for), and a Module made later (its family imported after)
  joins the pool at once. MINIDL_PARALLEL_COMPILE=0: each compiles when first used.
- `ahead(fn)` records fn in a CUDA graph on the same pool, before any Module waiting there, and runs
  none of it: a rehearsal that calls CuPy elementwise kernels on tiny arrays (gpu/ahead.py), whose
  code depends on the dtypes of a call and so cannot be named as a Module's can; the first step then
  finds them compiled and loaded.
- NVRTC compiles one program at a time in a process (threads add little; docs/kernels.md, Notes
  from the code, has the figure), so on empty caches a cuda Device first starts worker
  processes (gpu/compile_workers.py, listed in `_workers`) that compile the Modules and run the
  rehearsals into CuPy's disk cache side by side; the pool's threads wait for them and load what
  they wrote, and this process compiles itself only what it needs before they get to it.
- every CuPy compile holds a file lock beside CuPy's kernel cache (gpu/_nvrtc.py), so processes of
  one host (ranks, workers) never compile one source twice: the second waits and reads the first's
  result from the cache. MINIDL_COMPILE_LOCK=0 turns the lock off.
- MINIDL_NVRTC_PCH=1 lets NVRTC precompile the headers its sources share (CuPy's `--pch`, which
  CuPy passes only to NVRTC 12.8 and later); off unless asked: it shortens the many small compiles
  of a small model's first step but lengthened a ResNet-50's (docs/cold-start.md).
- `progress` counts what is compiled and timed before a first step and reports it as one line.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import heapq
import itertools
import os
import threading
import time
from typing import Any

import cupy as cp

from . import _dtypes, _nvrtc, affinity
from .record import record_once

# The 2-byte types of a precision policy, for RawKernels that read them as float (HALF_CODE's Acc).
HALF_CTYPES = _dtypes.HALF_CTYPES

# RawKernels over half types: Acc<T>::type is what a value of T is summed in (float for the 2-byte
# types: their 8- or 11-bit mantissas would lose a sum's low bits), and conversions are explicit,
# because float op __half is ambiguous in CUDA's headers. to_f reads any of the io types as float;
# from_f<T> rounds a float to T to nearest even, bfloat16 by hand as NumPy's ml_dtypes does (CUDA's
# __float2bfloat16_rn was found flushing a float32 subnormal to zero: docs/kernels.md), a NaN to a quiet NaN.
HALF_CODE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
template<typename T> struct Acc { typedef T type; };
template<> struct Acc<__half> { typedef float type; };
template<> struct Acc<__nv_bfloat16> { typedef float type; };
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ unsigned short bf16_bits(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
template<typename T> __device__ __forceinline__ T from_f(float v);
template<> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template<> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template<> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
    unsigned short b = bf16_bits(v);
    return *reinterpret_cast<__nv_bfloat16*>(&b);
}
"""

# Compile options of every RawModule: CuPy's default, the same as its ElementwiseKernels'. CuPy
# compiles an empty file once per process and set of options (to fingerprint the compiler for its
# disk cache); one set for all of minidl's kernels keeps that to one compile, which
# a RawModule with options of its own paid again inside the first training step.
OPTIONS = ()

_sm_counts: dict[int, int] = {}  # device id -> streaming multiprocessors


def sm_count():
    """The current GPU's streaming multiprocessors (132 on an H100 SXM or H200), asked once per GPU."""
    dev = cp.cuda.Device()
    if dev.id not in _sm_counts:
        _sm_counts[dev.id] = int(dev.attributes["MultiProcessorCount"])
    return _sm_counts[dev.id]


class Module:
    """A CUDA source with templated kernels, fetched as `mod.get("name<float>")`: compiled once with
    all of `names` (by `prefetch` in the background, or here when first asked for), or, where names
    is None, each name on its own when first asked for (a source with many instantiations of which a
    run uses few). CuPy caches the compiled code on disk."""

    def __init__(self, code, names=None):
        self.code, self.names, self._mods = code, None if names is None else list(names), {}
        self._lock = threading.Lock()         # one compile per key, whichever thread asks first
        if self.names is not None:
            _registry.append(self)
            _submit(self)                     # a family imported after the pool started: compiles now too

    def _compile(self, key, names, dev=None):
        with self._lock:
            mod = self._mods.get(key)
            if mod is None:
                mod = cp.RawModule(code=self.code, options=OPTIONS, name_expressions=names)
                with cp.cuda.Device(dev):     # a pool thread loads the module on the caller's GPU
                    mod.compile()
                self._mods[key] = mod
        return mod

    def get(self, name):
        key = name if self.names is None else None
        mod = self._mods.get(key)
        if mod is None:
            prefetch()                        # the first kernel asked for: the others compile meanwhile
            mod = self._compile(key, [name] if self.names is None else self.names)
        return mod.get_function(name)


class Split:
    """One source whose kernels compile in parts, each a Module of its own (`groups` of names), so the
    compile workers build the parts side by side: a source of 30 instantiations took one NVRTC call of
    2-3 s, on the first step's critical path. `get(name)` as a Module's."""

    def __init__(self, code, groups):
        self.parts = [Module(code, names) for names in groups]
        self._part = {n: m for m in self.parts for n in m.names}

    def get(self, name):
        return self._part[name].get(name)


class Progress:
    """What a first step prepares: NVRTC compiles done (and known to come) in this process, cuDNN
    convolutions timed. `listen(fn)` calls fn(line) on the main thread as counts change, at most
    twice a second; `line()` is "preparing: compiling 3/7 kernels, timing 4 convolutions".
    `compiles`: (on the main thread?, start, seconds, first kernel's name) of each NVRTC compile, for
    benchmarks/profile_startup.py."""

    def __init__(self):
        self.lock = threading.Lock()
        self.compiled, self.compile_s, self.queued = 0, 0.0, 0   # compile_s: summed over threads
        self.compiles: list[tuple[bool, float, float, str]] = []
        self.timed, self.timing_s, self.to_time = 0, 0.0, None   # to_time: convolutions, where known
        self.listeners, self._said = [], 0.0

    def add(self, **counts):
        with self.lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)
        if self.listeners and threading.current_thread() is threading.main_thread():
            now = time.monotonic()
            if now - self._said >= 0.5:
                self._said = now
                for fn in list(self.listeners):
                    fn(self.line())

    def line(self):
        k = f"{self.compiled}/{self.compiled + self.queued}" if self.queued else f"{self.compiled}"
        busy = sum(w.poll() is None for w in _workers)        # their compiles are counted in their processes
        by = f" (and {busy} worker process{'es' * (busy > 1)})" if busy else ""
        t = f"{self.timed}/{self.to_time}" if self.to_time else f"{self.timed}"
        return f"preparing: compiling {k} kernels{by}, timing {t} convolutions"

    def listen(self, fn):
        """Call fn(line) as preparation goes on; returns a function that stops it."""
        self.listeners.append(fn)
        return lambda: fn in self.listeners and self.listeners.remove(fn)


progress = Progress()
_registry: list[Module] = []          # every Module with its names known, for prefetch
_pool: list[Any] = []              # the prefetch's executor and its futures, once started
_pool_device: list[int] = []       # the GPU it compiles for
_tasks: list[tuple[int, int, Any]] = []      # (priority, order, task): each pool job runs the first
_tasks_lock, _order = threading.Lock(), itertools.count()
_rehearsals: list[threading.Event] = []      # set as each `ahead` rehearsal ends
_workers: list[Any] = []                      # the compile worker processes (subprocess.Popen), if started
_rehearsal_streams: dict[tuple, Any] = {}     # (GPU, pool thread) -> the stream its rehearsals record on
_rehearsal_lock = threading.Lock()
AHEAD, MODULE = 0, 1                          # priorities: rehearsals first (each is short)
WORKER_WAIT_S = 120                           # the longest the pool waits for a compile worker


def _flag(name, default):
    return os.environ.get(name, default) not in ("0", "")


def prefetch():
    """Start compiling every Module with known names in a thread pool, on the current GPU, and
    return at once; a later `get` waits for its own compile only. Once per process."""
    if _pool or not _flag("MINIDL_PARALLEL_COMPILE", "1"):
        return
    workers = max(1, min(8, (os.cpu_count() or 2) - 1))
    _pool_device.append(cp.cuda.runtime.getDevice())
    _pool.append(concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="minidl-compile",
                                                       initializer=_pool_thread, initargs=(_pool_device[0],)))
    for m in _registry:
        _submit(m)


def _pool_thread(dev):
    """A pool thread starts on the pool's GPU and on any core. A new thread's current GPU is GPU 0, and
    leaving `with Device(dev)` there makes GPU 0 current again, which since CUDA 12 makes a context on
    it: every rank on another GPU held one on GPU 0 (docs/distributed.md). An MPI launcher may have
    bound the rank to one core, which its threads inherit."""
    cp.cuda.runtime.setDevice(dev)
    affinity.unbind()


def _queue(priority, task):
    """Run task(dev) on the pool: each job the pool takes runs the queued task of first priority."""
    with _tasks_lock:
        heapq.heappush(_tasks, (priority, next(_order), task))
    _pool.append(_pool[0].submit(_run_first, _pool_device[0]))


def _run_first(dev):
    with _tasks_lock:
        task = heapq.heappop(_tasks)[2]
    task(dev)


def _submit(m):
    """Queue Module m on the prefetch's pool, where it runs (the families import after a Device starts it)."""
    if _pool:
        progress.add(queued=1)
        _queue(MODULE, lambda dev: _background(m, dev))


def _background(m, dev):
    try:
        for w in _workers:               # they compile it into the disk cache: load it from there
            w.wait(WORKER_WAIT_S)        # (a worker stuck longer: get() compiles it when asked)
        m._compile(None, m.names, dev)
    except Exception:                   # noqa: BLE001  get() compiles it again and raises there
        pass
    finally:
        progress.add(queued=-1)


def ahead(fn):
    """Record fn() on the compile pool before the Modules queued there, on the pool's GPU and a stream
    of the rehearsals' own (one a GPU and pool thread, kept: two captures cannot share a stream, and
    the pool's threads rehearse at once), into a CUDA graph that is destroyed, never run: its
    kernels compile and load, and none runs outside a graph on a stream but the compute stream, which
    would leave the process replaying every graph slower (docs/distributed.md). An error is dropped
    (the real call meets it again). Nothing without the pool, nor where compile workers run (they
    rehearse gpu/ahead.py's list themselves)."""
    if not _pool or _workers:
        return
    done = threading.Event()
    _rehearsals.append(done)

    def rehearse(dev):
        try:
            with cp.cuda.Device(dev):
                key = (dev, threading.get_ident())
                with _rehearsal_lock:       # never destroyed: the pool's threads live as long
                    stream = _rehearsal_streams.get(key) or _rehearsal_streams.setdefault(
                        key, cp.cuda.Stream(non_blocking=True))
                with stream:
                    record_once(fn, stream)
        except Exception:               # noqa: BLE001  the first step calls it again and raises there
            pass
        finally:
            done.set()
    _queue(AHEAD, rehearse)


def wait_ahead():
    """Block until every `ahead` rehearsal has run: before a CUDA graph capture, which no other
    thread's allocation may interrupt."""
    for done in list(_rehearsals):
        done.wait()


def wait():
    """Block until every compile `prefetch` started has finished."""
    concurrent.futures.wait(_pool[1:])


def lock_folder():
    """Where the compile locks (and the compile workers' stamps) live: beside CuPy's kernel cache."""
    return os.path.join(os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache"),
                        "minidl-locks")


def stamp_path(dev: int) -> str:
    """The file that says this GPU's caches hold every job of the compile workers (gpu/compile_workers.py)
    and the rehearsals (gpu/ahead.py) for these kernel sources."""
    h = hashlib.sha1(repr((cp.__version__, cp.cuda.runtime.runtimeGetVersion(),
                           cp.cuda.Device(dev).compute_capability)).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + f.read())
    return os.path.join(lock_folder(), f"workers-{h.hexdigest()[:16]}.done")


_nvrtc.install(progress, _flag, lock_folder)
