"""The sharded optimizer (ZeRO stage 1, Rajbhandari et al., SC 2020): each rank updates only its shard of
the flat parameter arena and keeps optimizer state for that shard alone.

Every gradient bucket (buckets.py) is cut into N equal contiguous chunks, chunk r rank r's. While
backward runs each bucket is reduce-scattered instead of all-reduced: rank r then holds the sum over
the ranks of its chunk only. The optimizer updates chunk r of every bucket (its `pieces`; the state
of all of them packed into arrays the shard's size) and, as each piece is updated, the bucket's
parameters are all-gathered from their owners, so every rank holds the whole model for the next
forward. A ring all-reduce is a reduce-scatter and an all-gather: the bytes on the wire are the
same; the optimizer's state and its memory traffic are 1/N of the unsharded update's.

The chunks need equal counts (NCCL, MPI's reduce_scatter_block). The arena starts every tensor on a
256-byte boundary (graph/arena.py), so each bucket holds a multiple of 64 float32 values and splits
evenly among 2, 4, 8, ... 64 ranks. Among other counts a bucket's last (length mod N) values, fewer
than N, are all-reduced instead and updated alike on every rank (their state kept by each): no padding,
no copies, one all-reduce of a few values a bucket more.

Checkpoints keep the unsharded format: `gather` brings every rank's state to rank 0 before a save
(collective), and a resumed run, sharded or not and over any number of ranks, takes its own piece of
the whole state (`pack`), so runs resume across the two modes and across rank counts.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .._types import Array

if TYPE_CHECKING:
    from . import World
    from .buckets import Bucket


class Piece(NamedTuple):
    """Elements lo:hi of the arena that this rank updates, from bucket `bucket`; `at`: where their state
    begins in the shard's. `shared`: the bucket's remainder, updated alike on every rank (`counted`: this
    rank's Σ g² includes it: rank 0's alone, so the global norm counts it once)."""
    lo: int
    hi: int
    at: int
    bucket: int
    shared: bool = False
    counted: bool = True


def plan(buckets: list[Bucket], rank: int, ranks: int) -> list[Piece]:
    """Rank `rank`'s chunk of each bucket, and the remainder a bucket's length leaves past N equal chunks
    (fewer than N values, shared), in the buckets' order: their state packs in that order."""
    pieces, at = [], 0
    for i, b in enumerate(buckets):
        c = (b.hi - b.lo) // ranks
        if c:
            pieces.append(Piece(b.lo + rank * c, b.lo + (rank + 1) * c, at, i))
            at += c
        if b.lo + ranks * c < b.hi:
            pieces.append(Piece(b.lo + ranks * c, b.hi, at, i, True, rank == 0))
            at += b.hi - b.lo - ranks * c
    return pieces


class Shard:
    """This rank's shard of the arenas the buckets `buckets` cut: what a sharded optimizer updates.

    The Reducer hands it each bucket as backward finishes it (`reduce`). The optimizer (optim/sharded.py)
    reads `pieces` and `size` (its state's length), packs the per-element controls with `pack`, sums its
    clip norm with `total`, calls `updated(i)` as it finishes piece i (the bucket's all-gather starts) and
    `finished()` after the last (the step waits for every gather). coll: the Reducer's communicator;
    flat: the parameter arena the buckets cut.
    """

    def __init__(self, world: World, coll: Any, buckets: list[Bucket], flat: Array | None, xp: Any) -> None:
        self.world, self.coll, self.xp = world, coll, xp
        self.arena = max((b.hi for b in buckets), default=0)     # the buckets tile the arena
        self.pieces = plan(buckets, world.rank, world.size)
        self._even = {b.lo: (b.hi - b.lo) // world.size * world.size for b in buckets}   # the chunks' part
        self._gathered = [] if flat is None else [     # each piece's bucket's chunks, fixed: a captured step keeps them
            None if p.shared else flat[buckets[p.bucket].lo:buckets[p.bucket].lo + self._even[buckets[p.bucket].lo]]
            for p in self.pieces]
        self.size = sum(p.hi - p.lo for p in self.pieces)
        self._norm = xp.zeros((), np.float64)       # fixed: a captured step sums into this very array
        self._whole: dict[str, np.ndarray] | None = None

    def pack(self, whole: np.ndarray) -> np.ndarray:
        """This rank's elements of the host array `whole` (the arena's length), in the shard's order."""
        return np.concatenate([whole[p.lo:p.hi] for p in self.pieces]) if self.pieces else whole[:0]

    def reduce(self, view: Array, lo: int, wire: Array | None) -> None:
        """The bucket at `lo` (its gradients `view`; `wire`: a narrower twin, or None), begun: its chunks
        reduce-scattered, its remainder (fewer than N values) all-reduced."""
        n = self._even[lo]
        if n:
            self.coll.reduce_scatter(view[:n], "sum", None if wire is None else wire[:n])
        if n < view.size:
            self.coll.start(view[n:], "sum", None if wire is None else wire[n:])

    def updated(self, i: int) -> None:
        """Piece i is updated: its bucket's chunks go to every rank (begun; finished() waits). A shared
        remainder every rank updated alike: nothing to send."""
        if not self.pieces[i].shared:
            self.coll.all_gather(self._gathered[i])

    def finished(self) -> None:
        """Every bucket gathered before what follows (the next forward) reads the parameters."""
        self.coll.wait()

    def total(self, partials: list[Array]) -> Array:
        """Σ over the ranks of Σ partials (0-d float64 device arrays, one per piece): the clip norm's Σ g²."""
        xp, s = self.xp, self._norm
        s.fill(0)
        for a in partials:
            xp.add(s, a, out=s)
        self.coll.allreduce(s, "sum")
        return s

    # -- checkpoints: the whole state on rank 0 ------------------------------------------------
    def gather(self, state: dict[str, Array], device: Any) -> None:
        """Every rank's packed `state` to rank 0, laid out as the arena (collective: every rank calls it
        before a save); rank 0's optimizer's state_dict then returns it (`whole`)."""
        ranks, comm = self.world.size, self.world.comm
        self._whole = {}
        for k in sorted(state):
            mine = np.ascontiguousarray(device.to_host(state[k]))
            every = np.empty((ranks, mine.size), mine.dtype) if self.world.main else None
            self.world.wait_all([comm.Igather(mine, every, root=0)])
            if every is not None:
                self._whole[k] = self._unpack(every)

    def _unpack(self, every: np.ndarray) -> np.ndarray:
        """Every rank's packed shard (ranks, size) as one arena-long array: rank r's chunk of a bucket
        lies r chunks past the bucket's start; a shared remainder is rank 0's (every rank's is the same)."""
        me = self.world.rank
        out = np.zeros(self.arena, every.dtype)
        for p in self.pieces:
            c = p.hi - p.lo
            if p.shared:
                out[p.lo:p.hi] = every[0, p.at:p.at + c]
            else:
                start = p.lo - me * c                  # the bucket's first element
                out[start:start + c * len(every)] = every[:, p.at:p.at + c].reshape(-1)
        return out

    def whole(self) -> dict[str, np.ndarray]:
        """The whole state, arena-long, that `gather` brought to rank 0 (once: a later save gathers again)."""
        if self._whole is None:
            raise RuntimeError("a sharded optimizer's state_dict() holds every rank's state only after "
                               "Shard.gather() on every rank (Trainer.save does it)")
        whole, self._whole = self._whole, None
        return whole
