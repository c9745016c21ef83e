"""Timing a candidate kernel on the GPU alone, for engines.py's choices.

Launched from Python one by one, a call costs more host time (~12 us for a cuDNN execute) than many
candidates take on the GPU, so a timing that waited on the host would measure the host. The runs are
queued behind one kernel that holds the stream back (a single thread spinning for a number of
clock cycles) until the host has queued them all, and two events around them time the GPU alone.
Where the GPU got to the first event before the host had queued the last run, the hold doubles.
Memsets held the stream before: their hold grew only by what each took the GPU beyond what it took
the host to queue it, little on a fast GPU and nothing on a busy host, where the timing then
measured the host. Nothing is made or destroyed per candidate, and no stream but the caller's runs
anything.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import cupy as cp
import numpy as np

from ._cuda import Module
from .record import record_once
from .stream import compute_stream

HOLD_CYCLES = 1 << 18               # the first hold: about 0.13 ms at 2 GHz
MAX_CYCLES = 1 << 28                # about 0.13 s

_HOLD = Module(r"""
template<int ONE>
__global__ void minidl_hold(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
}""", ["minidl_hold<1>"])      # a template, as every Module's kernels are named by their instantiation


class _Clock:
    """A device's two events and how long its hold spins: made once, never destroyed. The runs go on
    the caller's stream: a process in which kernels had run on streams since destroyed (ten sufficed;
    timing each candidate on a stream of its own made one a candidate) or on the legacy stream
    replayed every CUDA graph, the training step's included, slower for the rest of its life
    (docs/results.md, benchmarks/graph_churn.py)."""

    def __init__(self):
        self.start, self.stop = cp.cuda.Event(), cp.cuda.Event()
        self.cycles = HOLD_CYCLES       # grows until the host queues the runs before the GPU gets to them


_clocks: dict[int, _Clock] = {}


def time_queued(fn: Callable[[], object], runs: int) -> float | None:
    """Milliseconds of one fn() (the mean of `runs`) on the current stream (minidl's where that is the
    legacy one), or None where it fails to run or be captured.

    One untimed run comes first (it builds, compiles and chooses what it needs). Where the GPU got to
    the first event before the host had queued the last run, the hold doubles and the runs are timed
    again."""
    dev = cp.cuda.runtime.getDevice()
    clock = _clocks.get(dev) or _clocks.setdefault(dev, _Clock())
    stream, start, stop = cp.cuda.get_current_stream(), clock.start, clock.stop
    if not stream.ptr:                  # the legacy stream cannot capture: minidl's own, made current
        stream = compute_stream()
    hold = _HOLD.get("minidl_hold<1>")  # launched on the current stream, which is `stream`
    try:
        fn()
        record_once(fn, stream)      # what cannot be captured is no candidate: a step is captured whole
        while True:
            hold((1,), (1,), (np.int64(clock.cycles),))
            start.record(stream)
            for _ in range(runs):
                fn()
            stop.record(stream)
            queued_in_time = not start.done
            stop.synchronize()
            if queued_in_time or clock.cycles >= MAX_CYCLES:
                break
            clock.cycles *= 2
    except Exception:                   # noqa: BLE001  what fails to run is not a candidate
        with contextlib.suppress(Exception):
            stream.synchronize()
        return None
    return cp.cuda.get_elapsed_time(start, stop) / runs
