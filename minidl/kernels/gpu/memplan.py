"""A memory plan: offsets in one arena for arrays whose lifetimes are known in advance.

A captured call allocates the same arrays in the same order every time, so one traced run gives
each its size and lifetime [birth, death) on a clock that ticks at every allocation and free.
Arrays alive at the same time must not share bytes; any others may (Caffe's and MXNet's memory
sharing: a buffer is reused once its last reader has run). Offsets are chosen greedily by size,
largest first, each at the lowest offset clear of the arrays it meets in time (the greedy-by-size
planner of TFLite's arena). The arena's size is then at least the most bytes ever alive at once
(`lower_bound`) and, on the forward-then-backward traces of a training step, a few percent above.

Pure NumPy, no device: kernels/gpu/planned_memory.py traces and replays it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

ALIGN = 512                      # CuPy's allocation unit: every offset 512-aligned (16-byte vector loads)


class Plan(NamedTuple):
    sizes: list        # the traced request of each allocation, in order (bytes)
    offsets: list      # its offset in the arena
    total: int         # the arena's size
    lower_bound: int   # the most bytes (aligned) alive at one time
    sharers: list      # for each allocation: the earlier ones sharing any of its bytes (dead by its birth)


def aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def lower_bound(sizes: Sequence[int], births: Sequence[int], deaths: Sequence[int]) -> int:
    """The most bytes alive at once: a sweep over the births (+size) and deaths (-size)."""
    events = sorted([(b, aligned(s)) for s, b in zip(sizes, births)]
                    + [(d, -aligned(s)) for s, d in zip(sizes, deaths)])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def make_plan(sizes: Sequence[int], births: Sequence[int], deaths: Sequence[int]) -> Plan:
    """Plan for allocations k of sizes[k] alive over [births[k], deaths[k]) -> Plan.

    Greedy by size: the largest first, each at the lowest offset where no array it meets in time lies.
    """
    n = len(sizes)
    size = np.array([aligned(s) for s in sizes], dtype=np.int64)
    birth, death = np.asarray(births, dtype=np.int64), np.asarray(deaths, dtype=np.int64)
    if n and np.any(death <= birth):
        raise ValueError("memplan: every allocation must die after it is born")
    offset = np.full(n, -1, dtype=np.int64)
    placed = np.zeros(n, dtype=bool)
    for k in sorted(range(n), key=lambda k: (-size[k], birth[k])):
        meets = placed & (birth < death[k]) & (birth[k] < death)
        at = 0
        for j in sorted(np.nonzero(meets)[0], key=lambda j: offset[j]):
            if offset[j] - at >= size[k]:
                break                          # a gap below array j is wide enough
            at = max(at, offset[j] + size[j])
        offset[k], placed[k] = at, True
    end = offset + size
    sharers = [np.nonzero((offset[:k] < end[k]) & (end[:k] > offset[k]))[0].tolist() for k in range(n)]
    total = int(end.max()) if n else 0
    return Plan(list(sizes), offset.tolist(), total, lower_bound(sizes, births, deaths), sharers)
