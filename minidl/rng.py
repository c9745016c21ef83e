"""The device's counter-based generator (Philox4x32-10): its key and its counter on the device."""
from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np


class CounterRNG:
    """The device's generator for dropout masks, shifts and flips: counter-based (Philox4x32-10,
    kernels.*.dropout), so a draw depends on `key` and a counter alone. `offset` (a 0-d uint64 on
    the device) is where the next draw starts; kernels advance it there, so a captured CUDA graph
    draws anew at every replay, and the whole state is two numbers, saved in checkpoints on either
    device.

    Data-parallel ranks share one stream, keyed by the global batch: a kernel drawing `count`
    numbers for its rank's slice of a batch starts at offset + skip(count) (rank r of N takes
    draws r x count onwards, the draws one process at N x b would give those images) and then
    advances the offset by advance(count) = N x count, as that process would. So N ranks shift,
    flip and mask exactly the images one process would, and the state saved is the same on every
    rank: a run resumes at any N that keeps the global batch.
    """

    def __init__(self, xp: ModuleType, seed: int) -> None:
        seed = int(seed)
        self.key = (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF)
        self.offset = xp.zeros((), np.uint64)
        self.rank, self.ranks = 0, 1

    def shard(self, rank: int, ranks: int) -> None:
        """Draw as rank `rank` of `ranks`, each holding the same share of every batch."""
        if not 0 <= rank < ranks:
            raise ValueError(f"rank must be in [0, {ranks}), got {rank}")
        self.rank, self.ranks = int(rank), int(ranks)

    def skip(self, count: int) -> int:
        """Where this rank's `count` draws begin, counted from `offset`."""
        return self.rank * count

    def advance(self, count: int) -> None:
        """Past the draws of every rank's `count` (after the kernel that read `offset`)."""
        self.offset += self.ranks * count

    def state(self) -> dict[str, Any]:
        return {"key": list(self.key), "offset": int(self.offset)}

    def set_state(self, state: dict[str, Any]) -> None:
        """Continue the draws `state()` describes (its key and its offset)."""
        key = state.get("key") if isinstance(state, dict) else None
        ok = (isinstance(key, list) and len(key) == 2 and all(type(k) is int and 0 <= k <= 0xFFFFFFFF for k in key)
              and type(state.get("offset")) is int and 0 <= state["offset"] < 2 ** 63)
        if not ok:
            shape = "{'key': [two 32-bit ints], 'offset': int}"
            raise ValueError(f"generator state must be {shape}, got {state!r}"[:200])
        self.key = tuple(key)     # type: ignore[arg-type]  # a list of two ints: `ok` checked it
        self.offset.fill(state["offset"])
