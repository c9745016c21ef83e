"""An optimizer on its rank's shard of the flat arena (ZeRO stage 1; distributed/shard.py cuts the shard).

A sharded optimizer (Optimizer.setup(..., shard=)) keeps state for its rank's pieces of the arena
alone, packed one after the other, and runs its update (the fused kernel or the rule, as they are) on
each piece in turn as if it were the whole arena; each piece's bucket is all-gathered as soon as the
piece is updated, while the next one is. The controls' per-element arrays are packed as the state is,
and clipping's Σ g² is summed over the pieces and then over the ranks: every rank clips by the norm
of the whole gradient.

What the optimizer asks of `shard`: `pieces` (lo, hi, at, ..., counted: arena elements lo:hi, their
state from `at` on, and whether this rank's Σ g² counts them: a remainder every rank updates counts
once), `size` (the state's length), `pack(whole)` (a host array as long as the arena -> this rank's
elements), `whole()` (the whole state, gathered to rank 0 before a save), `total(parts)` (a sum over
the ranks), `updated(i)` (piece i is updated) and `finished()` (all of them are).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from .._types import Array
    from ..kernels.contract import Controls


class Sharded(Protocol):
    """What the sharded update reads of its optimizer (optim/base.py's Optimizer), and swaps for each piece:
    its arena, state and controls, its shard, its update. Said here, so that this module stands under the base."""
    flat: Array
    grads: Array
    state: dict[str, Array]
    shard: Any
    kernels: Any                      # the device's optim family (its sq_norm)
    _controls: Any                    # a ControlState, or a piece's _Fixed stand-in during the loop

    @property
    def ctl(self) -> Controls | None: ...

    def update(self, lr: Array, t: Array, ok: Array | bool) -> None: ...


class _Fixed:
    """A piece's slice of the step's controls, standing in for the optimizer's ControlState during the loop."""

    def __init__(self, ctl: Controls) -> None:
        self.ctl = ctl

    def args(self) -> Controls:
        return self.ctl


def _views(opt: Sharded) -> list[tuple[Array, Array, dict[str, Array], slice]]:
    """(params, grads, state, the controls' slice) of each piece, made once for the arrays they view."""
    key = (id(opt.flat), id(opt.grads), opt.shard, *map(id, opt.state.values()))
    cached = opt.__dict__.get("_shard_views")
    if cached is None or cached[0] != key:
        views = [(opt.flat[p.lo:p.hi], opt.grads[p.lo:p.hi],
                  {k: a[p.at:p.at + p.hi - p.lo] for k, a in opt.state.items()}, slice(p.at, p.at + p.hi - p.lo))
                 for p in opt.shard.pieces]
        cached = opt.__dict__["_shard_views"] = (key, views)
    return cached[1]


def update(opt: Sharded, lr: Array, t: Array, ok: Array | bool) -> None:
    """One step of `opt` (Optimizer.update): on the whole arena, or on each piece of its shard, each bucket's
    gather begun as its piece is done, then waited for."""
    if opt.shard is None:
        opt.update(lr, t, ok)
        return
    views, ctl = _views(opt), opt.ctl                    # the clip factor: once, over every rank's pieces
    whole = opt.flat, opt.grads, opt.state, opt._controls
    try:
        for i, (opt.flat, opt.grads, opt.state, at) in enumerate(views):
            piece = None if ctl is None else _Fixed(ctl._replace(lrs=ctl.lrs[at], wds=ctl.wds[at]))
            opt._controls = piece              # ControlState's stand-in: args() alone is read
            opt.update(lr, t, ok)
            opt.shard.updated(i)
    finally:
        opt.flat, opt.grads, opt.state, opt._controls = whole
    opt.shard.finished()


def own(opt: Sharded, a: Any) -> np.ndarray:
    """A state array as long as the arena, as `opt` keeps it: its pieces' elements alone where sharded."""
    a = np.asarray(a).reshape(-1)
    return a if opt.shard is None else opt.shard.pack(a)


def sq_norm(opt: Sharded, lrs: Array) -> Array:
    """Σ g² over the trainable elements of every rank's pieces (clip_norm's), on the device: no host read."""
    parts = [opt.kernels.sq_norm(g, lrs[at]) for (_, g, _, at), p in zip(_views(opt), opt.shard.pieces) if p.counted]
    return opt.shard.total(parts)
