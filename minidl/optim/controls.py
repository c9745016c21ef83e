"""Training controls over the flat arena: frozen weights, parameter groups, gradient clipping.

All of them become what the update kernels read per element (kernels.contract.Controls): `lrs`, each
element's multiplier of the step's lr (0 where its parameter is frozen: the kernels then leave its
weight, decay and optimizer state untouched), `wds`, each element's weight decay, and `gmul`, the
gradient's multiplier: grad_scale times the clip-norm factor min(1, clip_norm / (‖g‖ + 1e-6)) (as
torch.nn.utils.clip_grad_norm_), computed on the device from Σ g² over the trainable elements, so a
captured step clips with no host read. The arrays are filled in place, so a captured step reads a
parameter frozen after its capture; only the first switch from the plain kernels to the controlled
ones needs a new capture (`refresh` says when).
"""
from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..kernels.contract import Controls
from . import sharded

if TYPE_CHECKING:
    from .._types import Array
    from ..graph.model import Model

GROUP_KEYS = ("params", "lr", "weight_decay")


def check_groups(groups: Any, who: str) -> list[dict[str, Any]]:
    """PyTorch's parameter groups, checked: a list of {"params": [...], "lr": x, "weight_decay": y}
    (lr and weight_decay optional). The params are resolved against the model at setup."""
    if groups is None:
        return []
    if not isinstance(groups, (list, tuple)):
        raise TypeError(f"{who}: groups must be a list of dicts {{'params': [...], 'lr': ...}}, got {groups!r}")
    out = []
    for i, g in enumerate(groups):
        if not isinstance(g, dict) or "params" not in g or set(g) - set(GROUP_KEYS):
            raise ValueError(f"{who}: group {i} must be a dict with 'params' and optionally 'lr', "
                             f"'weight_decay', got {g!r}"[:300])
        for k in ("lr", "weight_decay"):
            v = g.get(k)
            if v is not None and not (isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)
                                      and float(v) >= 0):
                raise ValueError(f"{who}: group {i}'s {k} must be a finite number >= 0, got {v!r}")
        params = g["params"]
        out.append(dict(g, params=[params] if isinstance(params, str) else list(params)))
    return out


def check_clip(v: Any, what: str, who: str) -> float | None:
    if v is None:
        return None
    if not (isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) and float(v) > 0):
        raise ValueError(f"{who}: {what} must be a finite number > 0 or None, got {v!r}")
    return float(v)


def group_names(groups: list[dict[str, Any]], model: Model, who: str) -> list[list[str]]:
    """Each group's parameters as 'layer/param' names of `model`'s weights. A group names them by
    Parameter, by the array of model.parameters(), by layer (a Layer or its name: all its weights) or
    by 'layer/param' name; a weight in two groups, or a name the model lacks, is a ValueError."""
    weights = {k: p for k, p in model.params.items() if p.weight}
    by_id = {id(p): k for k, p in weights.items()} | {id(p.data): k for k, p in weights.items()}
    layers = {layer.name: layer for layer in model.layers}
    seen: dict[str, int] = {}
    out = []
    for i, g in enumerate(groups):
        names: list[str] = []
        for item in g["params"]:
            if isinstance(item, str) and item in weights:
                names.append(item)
            elif isinstance(item, str) and item in layers or hasattr(item, "params") and item in model.layers:
                layer = layers[item] if isinstance(item, str) else item
                names += [f"{layer.name}/{k}" for k, p in layer.params.items() if p.weight]
            elif id(item) in by_id:
                names.append(by_id[id(item)])
            else:
                raise ValueError(f"{who}: group {i}: {item!r} is not a weight or layer of {model.name} "
                                 f"(give Parameters, model.parameters() arrays, layers or 'layer/param' names)"[:300])
        for k in names:
            if seen.setdefault(k, i) != i:
                raise ValueError(f"{who}: {k} is in group {seen[k]} and group {i}: a weight belongs to one group")
        out.append(names)
    return out


class Controlled(sharded.Sharded, Protocol):
    """What the controls read of their optimizer (optim/base.py's Optimizer), as it is at each refresh: its
    settings and the arena it updates, and (sharded) what a sharded optimizer's sum of squares reads.
    Said here, so that the controls stand under the base that holds them."""
    model: Model | None
    xp: Any
    grad_scale: float
    weight_decay: float
    decoupled_weight_decay: bool
    clip_norm: float | None
    clip_value: float | None
    groups: list[dict[str, Any]]
    _group_base_lr: float             # the lr the groups' lrs are multiples of


class ControlState:
    """The device arrays of one optimizer's controls, kept up to date with its model's frozen flags."""

    def __init__(self, opt: Controlled) -> None:
        self.opt, self.on = opt, False
        self.key: tuple | None = None
        self.lrs: Array | None = None
        self.wds: Array | None = None
        self.weights = [p for p in getattr(opt.model, "params", {}).values() if p.weight]
        self.flags = type(self.weights[0]) if self.weights else None    # Parameter: it counts `trainable` changes

    def wanted(self) -> bool:
        """Whether the plain kernels no longer do: a control is set or a weight frozen."""
        o = self.opt
        return bool(o.groups or o.clip_norm or o.clip_value or o.decoupled_weight_decay
                    or any(p.frozen for p in self.weights))

    def refresh(self) -> bool:
        """Fill lrs and wds where the frozen flags, groups or decay changed; True where the update switched
        from the plain kernels to the controlled ones (a captured step must then be captured again)."""
        key = (getattr(self.flags, "changes", 0), self.opt.weight_decay)
        if key == self.key:                # per step: a few attribute reads, whatever the model's size
            return False
        self.key = key
        switched = not self.on and self.wanted()
        self.on = self.on or switched
        if self.on:
            self._fill()
        return switched

    def _fill(self) -> None:
        o = self.opt
        model, xp = o.model, o.xp
        lrs = np.zeros(o.flat.size, np.float64)          # alignment gaps: 0, left alone
        wds = np.zeros(o.flat.size, np.float64)
        for p in self.weights:
            lrs[p.offset:p.offset + p.size] = 0.0 if p.frozen else 1.0
            wds[p.offset:p.offset + p.size] = o.weight_decay
        for names, g in zip(group_names(o.groups, model, type(o).__name__), o.groups):   # type: ignore[arg-type]
            for k in names:
                p = model.params[k]                      # type: ignore[union-attr]
                sl = slice(p.offset, p.offset + p.size)
                if g.get("lr") is not None:
                    lrs[sl] *= g["lr"] / o._group_base_lr
                if g.get("weight_decay") is not None:
                    wds[sl] = g["weight_decay"]
        if o.shard is not None:                          # a sharded optimizer's: its pieces alone
            lrs, wds = o.shard.pack(lrs), o.shard.pack(wds)
        if self.lrs is None:
            self.lrs, self.wds = xp.asarray(lrs, o.flat.dtype), xp.asarray(wds, o.flat.dtype)
        else:                                            # in place: a captured step reads these addresses
            self.lrs[...] = xp.asarray(lrs, o.flat.dtype)
            self.wds[...] = xp.asarray(wds, o.flat.dtype)   # type: ignore[index]

    def args(self) -> Controls | None:
        """What the update kernels read this step (None: the plain kernels); the clip-norm factor is
        computed here, on the device."""
        if not self.on:
            return None
        o, xp = self.opt, self.opt.xp
        gmul: Any = o.grad_scale
        if o.clip_norm:
            sq = o.kernels.sq_norm(o.grads, self.lrs) if o.shard is None else sharded.sq_norm(o, self.lrs)
            norm = xp.multiply(xp.sqrt(sq), o.grad_scale)
            gmul = xp.multiply(xp.minimum(xp.divide(o.clip_norm, xp.add(norm, 1e-6)), 1.0), o.grad_scale)
        return Controls(self.lrs, self.wds, gmul, o.clip_value or 0.0, o.decoupled_weight_decay)
