"""A call recorded into a CUDA graph that never runs.

Recording compiles and loads every kernel the call launches and fails where the call cannot be
captured, and nothing executes: engine timing (timing.py) refuses a candidate a training step could
not capture, and the compile pool's rehearsals (_cuda.ahead) load the elementwise kernels of a first
step without running them on a stream of their own, since kernels run outside a graph on a stream
other than the compute stream leave the process replaying every graph slower (docs/distributed.md).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cupy as cp


def record_once(fn: Callable[[], Any], stream: cp.cuda.Stream) -> None:
    """Record one fn() on `stream` and destroy the graph, never instantiated. Relaxed mode, so that other
    threads' calls go on meanwhile; an error of fn or of the capture is raised."""
    cp.cuda.runtime.streamBeginCapture(stream.ptr, cp.cuda.runtime.streamCaptureModeRelaxed)
    try:
        fn()
    finally:
        graph = cp.cuda.runtime.streamEndCapture(stream.ptr)
        cp.cuda.runtime.graphDestroy(graph)
