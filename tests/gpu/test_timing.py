"""Timing a candidate on the GPU alone (kernels/gpu/timing.py): the GPU's time, not the host's, with the
host busy too; what cannot be captured is no candidate; nothing made or destroyed per call."""
import threading
import time

import pytest

cp = pytest.importorskip("cupy")

from minidl.kernels.gpu import timing  # noqa: E402


def _events_ms(fn, runs):
    """fn's GPU time by events around `runs` calls on the current stream: right where each call is
    long against its launch."""
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    fn()
    start.record()
    for _ in range(runs):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / runs


def test_a_long_copy_times_as_events_around_it_do():
    src, dst = cp.ones(64 << 20, cp.float32), cp.empty(64 << 20, cp.float32)   # 256 MiB each way
    ms = timing.time_queued(lambda: dst.__setitem__(slice(None), src), 5)
    assert ms == pytest.approx(_events_ms(lambda: dst.__setitem__(slice(None), src), 5), rel=0.1)


def test_short_calls_are_timed_without_the_hosts_launch_time():
    """Launches of a 1-element add take far more host time than GPU time: queued behind the hold
    they are timed as the GPU runs them back to back."""
    x = cp.zeros(1, cp.float32)

    def twenty_adds():
        for _ in range(20):
            x.__iadd__(1)

    ms = timing.time_queued(twenty_adds, 2)
    start = time.perf_counter()
    twenty_adds()
    cp.cuda.get_current_stream().synchronize()
    host_ms = 1e3 * (time.perf_counter() - start)
    assert ms is not None and ms < host_ms / 2


def test_what_cannot_be_captured_is_no_candidate():
    x = cp.zeros(4, cp.float32)
    assert timing.time_queued(lambda: float(x.sum()), 3) is None          # a copy to the host syncs
    assert timing.time_queued(lambda: x.__iadd__(1), 3) is not None       # and the stream works after


def test_two_events_a_device_however_many_calls_and_the_callers_stream():
    x = cp.zeros(16, cp.float32)
    timing.time_queued(lambda: x.__iadd__(1), 2)
    clock = timing._clocks[cp.cuda.runtime.getDevice()]
    made = (clock.start, clock.stop)
    mine, seen = cp.cuda.Stream(non_blocking=True), set()
    with mine:
        for _ in range(20):
            timing.time_queued(lambda: (seen.add(cp.cuda.get_current_stream().ptr), x.__iadd__(1)), 2)
    assert timing._clocks[cp.cuda.runtime.getDevice()] is clock
    assert (clock.start, clock.stop) == made
    assert seen == {mine.ptr}


def test_under_the_legacy_stream_the_runs_go_on_minidls_stream():
    """The legacy stream cannot capture: fn runs on minidl's compute stream, where the hold and the
    events are, and short calls are still timed without the host."""
    from minidl.kernels.gpu.stream import compute_stream
    x, seen = cp.zeros(1, cp.float32), set()

    def twenty_adds():
        seen.add(cp.cuda.get_current_stream().ptr)
        for _ in range(20):
            x.__iadd__(1)

    with cp.cuda.Stream.null:
        ms = timing.time_queued(twenty_adds, 2)
    timed = set(seen)
    start = time.perf_counter()
    twenty_adds()
    cp.cuda.get_current_stream().synchronize()
    host_ms = 1e3 * (time.perf_counter() - start)
    assert timed == {compute_stream().ptr}
    assert ms is not None and ms < host_ms / 2


def test_short_calls_are_timed_without_the_host_while_another_thread_keeps_it_busy():
    """Another thread's Python (as the compile pool's during a first step) slows the host's queueing:
    the hold grows until it covers the runs, and the GPU's time is still what is measured."""
    x, done = cp.zeros(1, cp.float32), threading.Event()

    def twenty_adds():
        for _ in range(20):
            x.__iadd__(1)

    def busy():
        while not done.is_set():
            sum(range(1000))
    other = threading.Thread(target=busy)
    other.start()
    try:
        ms = timing.time_queued(twenty_adds, 2)
        start = time.perf_counter()
        twenty_adds()
        cp.cuda.get_current_stream().synchronize()
        host_ms = 1e3 * (time.perf_counter() - start)
    finally:
        done.set()
        other.join()
    assert ms is not None and ms < host_ms / 2
