"""The stream minidl computes on: one per GPU, non-blocking, made current once."""
from __future__ import annotations

import cupy as cp

_STREAMS: dict[int, cp.cuda.Stream] = {}


def compute_stream() -> cp.cuda.Stream:
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
