"""The memory of a captured call: warm-ups on exact allocations, the capture in one planned arena.

CapturedCall (capture.py) runs `fn` through three CuPy allocators of one `PlannedMemory`:

1. `exact` for the warm-ups: one cudaMalloc per array, freed when the array goes, so the device
   holds only what is alive (no pool keeps a warm-up's freed blocks). The last warm-up is traced:
   each allocation's size and its birth and death on a clock of allocation events.
2. `make_plan` (memplan.py) gives each traced allocation an offset in one arena by liveness.
3. `planned` for the capture: its k-th allocation lands at the k-th offset, provided the size is
   the traced one and every earlier array sharing those bytes is gone (checked, never assumed);
   anything else (a miss) and arrays of other streams come from a private CuPy pool, as before
   planning. Frees of exact arrays during the capture wait until it ends (no cudaFree inside it).

The graph then reads and writes the arena at fixed addresses; it lives as long as any array in it.
"""
from __future__ import annotations

import contextlib
import gc
import weakref
from collections.abc import Iterator

import cupy as cp

from .memplan import Plan, make_plan

_LEDGERS: weakref.WeakSet[_Ledger]
_LEDGERS = weakref.WeakSet()     # the exact allocations' books of every PlannedMemory, while arrays remain


def live_memory() -> list[tuple[int, int]]:
    """(used, reserved) bytes of each PlannedMemory: reserved is its high-water mark while its call
    lives, then what its arrays still hold (cuDNN's workspace, for one, outlives the call)."""
    rows = []
    for ledger in list(_LEDGERS):
        m = ledger.memory()
        if m is None:
            rows.append((ledger.live, ledger.live))
        else:
            rows.append((m.used_bytes, m.used_bytes if m.retired else m.peak_bytes))
    return rows


class _Ledger:
    """The books of a PlannedMemory's exact allocations: bytes alive, the trace's clock and records,
    and the frees deferred while capturing. Its arrays refer to it alone, so an array a kernel
    family keeps after the call does not keep the call's arena alive."""

    def __init__(self, memory):
        self.memory = weakref.ref(memory)
        self.live = self.clock = 0
        self.trace, self.capturing, self.deferred = None, False, []
        _LEDGERS.add(self)

    def tick(self):
        self.clock += 1
        return self.clock


class _Exact:
    """Owner of one exact allocation: frees it (or defers the free) and ticks the trace when it goes."""
    __slots__ = ("ledger", "mem", "k")

    def __init__(self, ledger, mem, k):
        self.ledger, self.mem, self.k = ledger, mem, k

    def __del__(self):
        books = self.ledger
        books.live -= self.mem.size
        if books.trace is not None and self.k is not None:
            books.trace[2][self.k] = books.tick()
        if books.capturing:
            books.deferred.append(self.mem)     # cudaFree is not a call to make inside a capture


class _Planned:
    """Owner of one planned array in the arena: marks its slot free when it goes."""
    __slots__ = ("memory", "k")

    def __init__(self, memory, k):
        self.memory, self.k = memory, k

    def __del__(self):
        self.memory.alive.discard(self.k)


class PlannedMemory:
    """Allocators for one captured call on `stream`; `pool` takes misses and other streams' arrays."""

    plan: Plan                      # set by tracing(), None before (the methods that read it run after)
    arena: cp.cuda.memory.Memory    # allocated when capture() begins, None before
    alive: set[int]                 # the planned allocations alive now, by index

    def __init__(self, stream: cp.cuda.Stream, pool: cp.cuda.MemoryPool) -> None:
        self.stream, self.pool, self.device_id = stream, pool, cp.cuda.Device().id
        self.books, self.peak = _Ledger(self), 0
        self.plan, self.arena, self.warmup_peak, self.retired = None, None, 0, False  # type: ignore[assignment]
        self.alive, self.k, self.misses = set(), 0, 0

    def _ours(self, size):
        return size > 0 and cp.cuda.get_current_stream().ptr == self.stream.ptr

    def _pointer(self, ptr, size, owner):
        return cp.cuda.memory.MemoryPointer(cp.cuda.memory.UnownedMemory(ptr, size, owner, self.device_id), 0)

    # -- 1. warm-ups ----------------------------------------------------------------------------
    def exact(self, size: int) -> cp.cuda.MemoryPointer:
        """An allocation of its own (cudaMalloc), freed when its array goes."""
        try:
            mem = cp.cuda.memory.Memory(size)
        except cp.cuda.memory.OutOfMemoryError:
            cp.get_default_memory_pool().free_all_blocks()    # blocks other code let go of, then once more
            mem = cp.cuda.memory.Memory(size)
        books, k = self.books, None
        if books.trace is not None and self._ours(size):
            sizes, births, deaths = books.trace
            k = len(sizes)
            sizes.append(size), births.append(books.tick()), deaths.append(None)
        books.live += size
        self.peak = max(self.peak, books.live + self.arena_bytes)
        return self._pointer(mem.ptr, size, _Exact(books, mem, k))

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """Record the allocations (and frees) of this stream's arrays made inside the block.

        Cyclic garbage collection is off meanwhile, so every death happens where reference counts
        put it, as it will in the capture (which runs with the collector off too)."""
        gc_was_on = gc.isenabled()
        gc.disable()
        trace: tuple[list[int], list[int], list[int | None]]
        self.books.trace = trace = ([], [], [])
        try:
            with cp.cuda.using_allocator(self.exact):
                yield
        finally:
            self.books.trace = None
            if gc_was_on:
                gc.enable()
        sizes, births, deaths = trace
        end = self.books.tick()                # arrays still alive live to the end
        self.plan = make_plan(sizes, births, [end if d is None else d for d in deaths])

    # -- 3. the capture -------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Allocate from the plan inside the block (the arena is allocated on entry)."""
        self.warmup_peak = self.peak
        self.arena = cp.cuda.memory.Memory(self.plan.total)
        self.peak = max(self.peak, self.books.live + self.arena_bytes)
        self.books.capturing, self.k = True, 0
        try:
            with cp.cuda.using_allocator(self.planned):
                yield
        finally:
            self.books.capturing = False
        self.books.deferred.clear()            # the exact arrays freed during the capture go now

    def planned(self, size: int) -> cp.cuda.MemoryPointer:
        """The k-th allocation of the capture: at its planned offset when that is safe, else from the pool."""
        if not self._ours(size):
            return self.pool.malloc(size)
        k, p = self.k, self.plan
        self.k += 1
        if k >= len(p.sizes) or p.sizes[k] != size or not self.alive.isdisjoint(p.sharers[k]):
            self.misses += 1
            return self.pool.malloc(size)
        self.alive.add(k)
        return self._pointer(self.arena.ptr + p.offsets[k], size, _Planned(self, k))

    def retire(self) -> None:
        """Its call is gone: from now on only what its arrays still hold counts."""
        self.retired = True

    # -- what it holds --------------------------------------------------------------------------
    @property
    def arena_bytes(self) -> int:
        return self.arena.size if self.arena is not None else 0

    @property
    def used_bytes(self) -> int:
        """Exact arrays alive now, the arena, and the pool's arrays."""
        return self.books.live + self.arena_bytes + self.pool.used_bytes()

    @property
    def peak_bytes(self) -> int:
        """The most this call's memory ever held: exact arrays plus the arena, and the pool's reserve."""
        return self.peak + self.pool.total_bytes()

    def describe(self) -> str:
        """One line: the plan's arena against its lower bound, and what missed it."""
        if self.plan is None:
            return "no plan"
        p, mib = self.plan, 2 ** -20
        return (f"planned arena {p.total * mib:.1f} MiB for {len(p.sizes)} arrays (the most alive at once: "
                f"{p.lower_bound * mib:.1f} MiB), {self.misses} missed it; the warm-ups held at most "
                f"{self.warmup_peak * mib:.1f} MiB, arrays of their own now {self.books.live * mib:.1f} MiB")
