"""Gradient buckets: the flat gradient arena cut into contiguous ranges in backward order, each one
all-reduced as soon as backward has finished every layer it holds.

Backward reaches the last layers first, so their gradients are final while the first layers are
still being differentiated. Data-parallel ranks therefore reduce the arena bucket by bucket while
backward goes on (PyTorch DDP's buckets, Li et al., VLDB 2020): the graph calls `ready(layer)` as
each layer's parameter gradients become final (Model.backward), and a bucket is handed to
`start(view)` when its last layer has reported. On the GPU `start` issues the NCCL all-reduce on a
second stream after the work queued so far (inside a captured step; outside one in order on the
compute stream); on the CPU a non-blocking MPI all-reduce.

The parameters lie in the arena in the model's forward order, so layers taken in backward order
walk the arena from its end to its start, and a run of consecutive layers is one contiguous range:
one collective, no packing. A bucket takes layers until it holds `cap` bytes (the last one may
pass it); a layer whose range does not adjoin the bucket's (a lowering that reordered nodes)
starts a new bucket, so the plan stays right, only finer. The ranges tile the whole arena:
alignment gaps go with the tensor before them, and the arena's head with the lowest layer.

The last bucket is final only when backward ends, so its collective is the one nothing hides.
Greedy cutting leaves it whatever remains (ResNet-50 at 25 MiB: 7.5 MiB, its first 50 layers,
most of them final well before the stem's). A `tail` cap splits it: the layers backward finishes last,
up to `tail` bytes (at least one), become a bucket of their own, and the rest goes out while they
are differentiated. One collective more a step; off by default ($MINIDL_BUCKET_TAIL_MIB): on GPUs
it gained nothing (docs/distributed.md).
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, NamedTuple

from .._types import Array

if TYPE_CHECKING:
    from ..graph.model import Model
    from ..layers.base import Layer

CAP_MIB = 25.0       # per bucket: 4 all-reduces for ResNet-50's 89.7 MiB, one for LeNet-5's 0.24 MiB (distributed.md)
MAX_MIB = 65536.0    # 64 GiB: beyond any GPU's gradient arena, so a larger value is a typo
TAIL_MIB = 0.0       # the last bucket's cap (0: as greedy cutting leaves it)


def check_cap(value: object, name: str = "bucket_mib") -> float:
    """`value` (a number, or its text) as a bucket size in MiB, else ValueError naming `name` and the value."""
    try:
        mib = float(value)        # type: ignore[arg-type]  # anything float() takes; the rest is refused
    except (TypeError, ValueError):
        mib = math.nan
    if isinstance(value, bool) or not 0 < mib <= MAX_MIB:
        raise ValueError(f"{name} must be a bucket size in MiB, a number in (0, {MAX_MIB:g}], got {value!r}")
    return mib


def bucket_mib_from_env(environ: Mapping[str, str] | None = None) -> float:
    """$MINIDL_BUCKET_MIB checked (ValueError naming it), or CAP_MIB where it is unset or empty."""
    value = (os.environ if environ is None else environ).get("MINIDL_BUCKET_MIB", "")
    return check_cap(value, "MINIDL_BUCKET_MIB") if value.strip() else CAP_MIB


def tail_mib_from_env(environ: Mapping[str, str] | None = None) -> float:
    """$MINIDL_BUCKET_TAIL_MIB checked (ValueError naming it): 0 (or unset, empty) leaves the last
    bucket as it falls, else a cap as check_cap takes it."""
    value = (os.environ if environ is None else environ).get("MINIDL_BUCKET_TAIL_MIB", "")
    try:
        if not value.strip() or float(value) == 0:
            return TAIL_MIB
        return check_cap(value)
    except ValueError:
        raise ValueError(f"MINIDL_BUCKET_TAIL_MIB must be 0 (off) or a bucket size in MiB, a number in "
                         f"(0, {MAX_MIB:g}], got {value!r}") from None


class Bucket(NamedTuple):
    """Elements lo:hi of the gradient arena, final once every layer named in `layers` has reported."""
    lo: int
    hi: int
    layers: tuple[str, ...]


def plan(net: Model, cap_bytes: int, tail_bytes: int = 0) -> list[Bucket]:
    """The buckets of `net`'s gradient arena, in the order backward completes them; the last one
    split to at most `tail_bytes` of the final layers (at least one) where tail_bytes > 0."""
    owners = [layer for layer in reversed(net.layers) if _trainable(layer)]
    starts = sorted({min(p.offset for p in _trainable(layer)) for layer in owners})
    ends = dict(zip(starts, starts[1:] + [net.grads.size]))
    itemsize = net.grads.dtype.itemsize
    buckets: list[Bucket] = []
    los: dict[str | None, int] = {}                   # where each layer's range begins
    for layer in owners:
        lo = min(p.offset for p in _trainable(layer))
        hi = ends[lo]
        lo = los[layer.name] = 0 if lo == starts[0] else lo     # the arena's head goes with its lowest layer
        last = buckets[-1] if buckets else None
        if last is not None and last.lo == hi and (last.hi - last.lo) * itemsize < cap_bytes:
            buckets[-1] = Bucket(lo, last.hi, last.layers + (layer.name,))
        else:
            buckets.append(Bucket(lo, hi, (layer.name,)))
    if tail_bytes > 0 and buckets and (buckets[-1].hi - buckets[-1].lo) * itemsize > tail_bytes:
        buckets[-1:] = _split_tail(buckets[-1], los, tail_bytes // itemsize)
    return buckets


def _split_tail(last: Bucket, los: dict[str | None, int], tail: int) -> list[Bucket]:
    """`last` as two buckets: its first layers, and its final ones (lowest in the arena) up to `tail`
    elements, at least one layer; `last` itself where it holds one layer."""
    names = last.layers
    j = len(names) - 1                                # the tail: names[j:]
    while j > 1 and los[names[j - 2]] - last.lo <= tail:
        j -= 1
    if j < 1:
        return [last]
    cut = los[names[j - 1]]                           # the bulk's lowest layer begins where the tail ends
    return [Bucket(cut, last.hi, names[:j]), Bucket(last.lo, cut, names[j:])]


def _trainable(layer):
    return [p for p in layer.params.values() if p.weight]      # frozen weights too: they stay in the arena


class GradientBuckets:
    """The buckets of `net` with a countdown per step: `begin()` gives the backward hook, `flush()`
    starts what is left (a layer backward never reached) so each bucket starts exactly once a step.

    start(view, lo): called with each bucket's view of net.grads and where it begins, in the order
    the buckets complete.
    `started` lists this step's bucket indices in the order they were started.
    """

    def __init__(self, net: Model, start: Callable[[Array, int], object], cap_mib: float = CAP_MIB,
                 tail_mib: float = TAIL_MIB) -> None:
        self.buckets = plan(net, int(cap_mib * 2 ** 20), int(tail_mib * 2 ** 20))
        self.views = [net.grads[b.lo:b.hi] for b in self.buckets]      # fixed: a captured step keeps them
        self.start = start
        self._of: dict[str | None, int] = {name: i for i, b in enumerate(self.buckets) for name in b.layers}
        self.begin()

    def __len__(self) -> int:
        return len(self.buckets)

    def begin(self) -> Callable[[Layer], None]:
        """A new step: every bucket waits for all its layers again. Returns the hook ready(layer)."""
        self._left = [len(b.layers) for b in self.buckets]
        self.started: list[int] = []
        return self.ready

    def ready(self, layer: Layer) -> None:
        """Backward is done with `layer`: start its bucket if it was the bucket's last layer."""
        i = self._of.get(layer.name)
        if i is None:
            return                                       # a layer without trainable parameters
        self._left[i] -= 1
        if self._left[i] == 0:
            self._start(i)

    def flush(self) -> None:
        """Start every bucket this step has not started (after begin() alone: all of them)."""
        for i, left in enumerate(self._left):
            if left > 0:
                self._start(i)

    def _start(self, i):
        self._left[i] = 0
        self.started.append(i)
        self.start(self.views[i], self.buckets[i].lo)
