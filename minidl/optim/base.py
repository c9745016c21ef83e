"""Optimizer: the base of every optimizer over the model's flat parameter and gradient buffers, and their registry."""
from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING, Any

import numpy as np

from ..backend import DtypeError
from ..graph import arena
from . import reference, registry as _registry, schedules as _schedules, sharded
from .controls import ControlState, check_clip, check_groups, group_names

if TYPE_CHECKING:
    from .._types import Array
    from ..kernels.contract import Controls
    from ..graph.model import Model
    from .schedules import ScheduleSpec


class Optimizer:
    """Base optimizer: p <- update(p, g, state, lr_t) with lr_t = schedule(lr, t - 1) at step t >= 1.

    The step count t, the base learning rate and lr_t live on the device as 0-d arrays, and `step()` computes lr_t
    there: the same update runs eagerly and inside a captured CUDA graph (whose replays then advance t and the
    schedule themselves), with nothing read back to the host. A new optimizer is one class in one file,
    `optim/<name>.py` (docs/training.md, Writing an optimizer): `name` (it registers under it: optim.get,
    optim.OPTIMIZERS and the command line's --optimizer follow), `default_lr` (the command line's lr for it), `slots`
    (state arrays, each zeros_like(flat)), `hyper` (the constructor's other hyper-parameters, kept as attributes) and
    `rule(xp, p, g, state, lr, t) -> new p`, its update written once over the array module (optim/reference.py applies
    it on every device, the controls and the gate around it). Where a device holds a fused kernel for it (`fused`, a
    name in the optim family's FUSED), `fused_update` calls that instead. `register=False` in the class statement
    keeps a subclass out of the registry.

    grad_scale: the gradients enter the update multiplied by it, inside the update kernel; given at `setup` by whoever
    knows how the gradients arrive: 1/N among N data-parallel ranks (minidl.training.step: the ranks sum their
    gradients, the update takes the mean); at 1, one process, the kernels skip the multiply. A Python number, so a
    captured step holds it as it was at the capture.

    Training controls, keyword-only, for every optimizer (docs/training.md; optim/controls.py): weight_decay: coupled
    (g + wd p, torch.optim.Adam's) unless decoupled_weight_decay=True: p -= lr_t wd p before the update (Loshchilov &
    Hutter; torch.optim.AdamW's, Keras's base). clip_norm: the gradients are scaled so that their global L2 norm (over
    every trainable element) is at most clip_norm (torch.nn.utils.clip_grad_norm_, Keras's global_clipnorm);
    clip_value: then clipped to [-clip_value, clip_value] (Keras's clipvalue). groups: PyTorch's parameter groups, a
    list of {"params": [...], "lr": ..., "weight_decay": ...}: params as Parameters, model.parameters() arrays, layers
    or names; a group's lr is a multiplier of the base lr (group lr / lr), so schedules and ReduceLROnPlateau move
    every group alike. Frozen weights (Parameter.trainable = False, layer.trainable, model.freeze) are left as they
    are, their optimizer state too, even when frozen after a capture. Without any of these the update kernels run as
    they always did.
    """
    name = "optimizer"
    default_lr: float | None = None    # the command line's lr for this optimizer (--optimizer without --lr)
    slots: tuple[str, ...] = ()
    hyper: tuple[str, ...] = ()
    fused: str | None = None           # the optim family's fused kernel that replaces `rule` where a device has it
    grad_scale = 1.0
    shard: Any = None                  # distributed.shard.Shard: the update runs on this rank's pieces alone
    _krsc: arena.Filters = ()          # the filters laid K, kH, kW, C in the arena (graph/arena.py) the state follows
    flat: Array          # the model's parameters and gradients, bound by setup()
    grads: Array

    decoupled_default = False          # AdamW: True

    def __init_subclass__(cls, register: bool = True, **kw: Any) -> None:
        """Register a subclass that names itself (`name` in its own body) under that name (registry.py)."""
        super().__init_subclass__(**kw)
        if register and "name" in cls.__dict__:
            _registry.register(cls)

    def __init__(self, lr: float, weight_decay: float = 0.0, schedule: ScheduleSpec = None, *,
                 decoupled_weight_decay: bool | None = None, clip_norm: float | None = None,
                 clip_value: float | None = None, groups: list[dict[str, Any]] | None = None):
        who = type(self).__name__
        for what, v in (("lr", lr), ("weight_decay", weight_decay)):
            if not (isinstance(v, Real) and math.isfinite(v) and v >= 0):
                raise ValueError(f"{who}: {what} must be a finite number >= 0, got {v!r}")
        if decoupled_weight_decay is not None and not isinstance(decoupled_weight_decay, bool):
            raise TypeError(f"{who}: decoupled_weight_decay must be True or False, got {decoupled_weight_decay!r}")
        self._lr, self.weight_decay = float(lr), float(weight_decay)
        self.decoupled_weight_decay = (self.decoupled_default if decoupled_weight_decay is None
                                       else decoupled_weight_decay)
        self.clip_norm = check_clip(clip_norm, "clip_norm", who)
        self.clip_value = check_clip(clip_value, "clip_value", who)
        self.groups = check_groups(groups, who)
        if self._lr == 0 and any(g.get("lr") for g in self.groups):
            raise ValueError(f"{who}: a group's lr is a multiple of the base lr, which is 0: give lr > 0")
        self._group_base_lr = self._lr     # groups' lrs are multiples of this one (fixed at construction)
        self._controls: ControlState | None = None
        self.schedule = _schedules.resolve(schedule)
        self._t = 0                        # host copy while no model is set up
        self._lr_fn, self._lr_table = (None, None), None     # (schedule, its device function), a cosine's table
        self.state: dict[str, Array] = {}
        self.model: Model | None = None
        self._pending: dict[str, Any] | None = None

    def check_free_for(self, model: Model) -> None:
        """Refuse to serve a second model (a second Trainer's): setup would rebind the flat buffers and
        the first Trainer's steps would silently update the other model."""
        if self.model is not None and self.model is not model:
            raise ValueError(f"Trainer: this {type(self).__name__} already trains model {self.model.name!r} "
                             f"(another Trainer's): give each Trainer an optimizer of its own")

    def setup(self, model: Model, grad_scale: float = 1.0, shard: Any = None) -> Optimizer:
        """Bind model.flat / model.grads and the device's optim kernels; allocate zeroed state.

        State loaded before setup is applied now. Setting up the same model again keeps the state: in place if its
        buffers are unchanged (captured CUDA graphs stay valid), else copied over to the new buffers (model.to(device)
        reallocates the arena; a lowering lays filters K, kH, kW, C, graph/arena.py); another model starts afresh.
        grad_scale: what the gradients are multiplied by in the update (1/N: the mean of N ranks' sums).
        shard: this rank's part of the arena among N sharding ranks (ZeRO stage 1, optim/sharded.py), or None.
        """
        if not (math.isfinite(grad_scale) and grad_scale > 0):
            raise ValueError(f"{type(self).__name__}: grad_scale must be a finite number > 0, got {grad_scale!r}")
        self.grad_scale = float(grad_scale)
        if (model is self.model and model.flat is self.flat and model.grads is self.grads and shard is self.shard
                and arena.laid_krsc(model.params) == self._krsc):      # the arena laid as the state is
            return self
        why = model.device.dtype_problem(("optim",))
        if why:
            raise DtypeError(f"{type(self).__name__}: {why}")
        pending, self._pending = self._pending, None
        if pending is None and model is self.model and self.state and self.shard is None:
            pending = self.state_dict()
        t, same = self.t, model is self.model
        self.model, self.device, self.shard = model, model.device, shard
        self.flat, self.grads, self._krsc = model.flat, model.grads, arena.laid_krsc(model.params)
        self.xp, self.kernels = model.device.xp, model.device.kernels.optim
        fused = self.fused
        self._fused = getattr(self.kernels, fused) if fused in getattr(self.kernels, "FUSED", ()) and fused else None
        self.state = {k: self.xp.zeros(shard.size if shard else self.flat.size, self.flat.dtype) for k in self.slots}
        # 0-d device scalars: a captured step reads and advances them at every replay.
        self._t_dev, self._lr_dev = self.xp.zeros((), np.float64), self.xp.zeros((), np.float64)
        self._lr_fn, self._lr_table = (None, None), None      # the schedule on this device, made at the first step
        self.t, self.lr = (t if same else 0), self._lr
        if pending is not None:
            self.load_state_dict(pending)
        self._controls = ControlState(self)
        self._controls.refresh()            # groups resolved now: a bad one is named at setup
        return self

    def refresh(self) -> bool:
        """Bring the per-element controls up to date with the weights' `trainable` flags (host only, no
        device read); True where the update kernels changed, so a captured step must be captured again."""
        return self._controls.refresh() if self._controls is not None else False

    # -- the step ---------------------------------------------------------------------------
    def step(self, gate: Array | None = None) -> None:
        """Apply one update in place from model.grads; the first step is t = 1. gate: a 0-d device bool; where
        False the update changes nothing, t included (the trainer's NaN guard, a step skipped by loss scaling)."""
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.step() before setup(model)")
        self.refresh()                      # a weight frozen since the last step
        self._t_dev += True if gate is None else gate
        sharded.update(self, self._lr_at()(self._lr_dev, self._t_dev), self._t_dev, True if gate is None else gate)

    def _lr_at(self):
        """lr_t = schedule(lr, t - 1) as a device function of the 0-d arrays (lr, t).

        A schedule with a horizon (cosine) is tabulated once on the host, lr_t for t = 0 ..
        horizon + 1, and read with one gather: a few kernels in a captured step instead of one per
        operation of its formula. The table is refilled in place when lr changes. No t - 1 for one that reads no step.
        """
        if self._lr_fn[0] is not self.schedule:
            schedule, horizon, xp = self.schedule, getattr(self.schedule, "horizon", None), self.xp
            self._lr_table, step = None, getattr(schedule, "reads_step", True)      # constant: reads none
            if horizon is None:       # not t - 1.0: schedules.py
                fn = lambda lr, t: schedule(lr, xp.subtract(t, 1.0) if step else None)     # noqa: E731
            else:
                self._lr_table = self.xp.asarray(self._tabulate(schedule, horizon))
                table, last = self._lr_table, horizon + 1
                fn = lambda lr, t: xp.take(table, xp.minimum(t, last).astype(np.int64))   # noqa: E731
            self._lr_fn = (schedule, fn)
        return self._lr_fn[1]

    def _tabulate(self, schedule, horizon):
        return np.array([schedule(self._lr, max(t - 1, 0)) for t in range(horizon + 2)], np.float64)

    @property
    def ctl(self) -> Controls | None:
        """What the update kernels read besides their hyper-parameters (kernels.contract.Controls), or
        None: the plain kernels (no control set, no weight frozen)."""
        return self._controls.args() if self._controls is not None else None

    def update(self, lr: Array, t: Array, ok: Array | bool) -> None:
        """One in-place update with learning rate `lr` at step `t` (0-d float64 device arrays), where
        `ok` (True or a 0-d device bool) holds: the device's fused kernel where it has one, else `rule`."""
        if self._fused is not None:
            return self.fused_update(self._fused, lr, t, ok)
        reference.apply(self.rule, self.xp, self.flat, self.grads, self.state, lr, self.weight_decay, t, ok,
                        self.grad_scale, self.ctl)

    def rule(self, xp: Any, p: Array, g: Array, state: dict[str, Array], lr: Array, t: Array) -> Array:
        """The update, written once over the array module `xp`: the new p from p and the gradient g
        (scaled, decayed and clipped already), assigning each state slot's new value into `state`.
        lr: a 0-d array, or (P,) under per-element controls; t: the step, from 1. Never write into an
        array given; read nothing to the host (a captured step replays it). optim/reference.py runs it."""
        raise NotImplementedError(f"{type(self).__name__} has no update rule")

    def fused_update(self, kernel: Any, lr: Array, t: Array, ok: Array | bool) -> None:
        """Call the device's fused kernel `kernel` (the optim family's function named `fused`) for this step."""
        raise NotImplementedError(f"{type(self).__name__} names a fused kernel but does not call it")

    @property
    def t(self) -> int:
        """Steps taken (one host read of the device counter)."""
        return self._t if self.model is None else int(self.device.to_host(self._t_dev))

    @t.setter
    def t(self, t: int) -> None:
        if self.model is None:
            self._t = int(t)
        else:
            self.device.fill(self._t_dev, int(t))

    @property
    def lr(self) -> float:
        """The base learning rate; setting it takes effect at the next step (captured ones too)."""
        return self._lr

    @lr.setter
    def lr(self, lr: float) -> None:
        if not (isinstance(lr, Real) and math.isfinite(lr) and lr >= 0):
            raise ValueError(f"{type(self).__name__}: lr must be a finite number >= 0, got {lr!r}")
        self._lr = float(lr)
        if self.model is not None:
            self.device.fill(self._lr_dev, self._lr)
            if self._lr_table is not None:       # in place: a captured step keeps reading this very table
                schedule = self._lr_fn[0]
                self._lr_table[...] = self.xp.asarray(self._tabulate(schedule, schedule.horizon))

    @property
    def current_lr(self) -> float:
        """The learning rate of the last step taken (the base one before any); a constant one reads no device."""
        if not getattr(self.schedule, "reads_step", True):         # a read would wait for every queued step
            return self._lr
        return float(self.schedule(self._lr, max(self.t - 1, 0)))

    def device_arrays(self) -> list[Array]:
        """Every array a step changes: snapshotted around a capture's warm-up."""
        return list(self.state.values()) + [self._t_dev]

    # -- state ------------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The constructor's arguments, JSON-able: get(name, **config()) rebuilds this optimizer."""
        cfg: dict[str, Any] = {"lr": self.lr, "weight_decay": self.weight_decay}
        cfg.update({k: getattr(self, k) for k in self.hyper})
        if self.decoupled_weight_decay != self.decoupled_default:
            cfg["decoupled_weight_decay"] = self.decoupled_weight_decay
        cfg.update({k: getattr(self, k) for k in ("clip_norm", "clip_value") if getattr(self, k)})
        if self.groups:                    # by name, once a model resolved them: JSON, rebuilt by get()
            names = (group_names(self.groups, self.model, self.name) if self.model is not None
                     else [g["params"] for g in self.groups])
            rate = self.lr / self._group_base_lr if self._group_base_lr else 1.0    # the lr moved since: groups too
            cfg["groups"] = [dict(g, params=n, **({"lr": g["lr"] * rate} if g.get("lr") is not None else {}))
                             for g, n in zip(self.groups, names)]
        # a user's own schedule function has no config: it is recorded as None and not rebuilt
        cfg["schedule"] = getattr(self.schedule, "config", None)
        return cfg

    def state_dict(self) -> dict[str, Any]:
        """{"name", "config", "t", "arrays": {slot: NumPy host copy, filters in (K, C, kH, kW) order}}."""
        arrays = self.shard.whole() if self.shard else {k: self.device.to_host(v) for k, v in self.state.items()}
        arrays = {k: arena.canonical(a, self._krsc) for k, a in arrays.items()}
        return {"name": self.name, "config": self.config(), "t": self.t, "arrays": arrays}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore step, hyper-parameters and state arrays (copied in place: addresses are kept).

        Everything is checked before anything changes; a ValueError says what does not fit.
        """
        if not isinstance(d, dict) or d.get("name") != self.name:
            raise ValueError(f"optimizer state is for {d.get('name') if isinstance(d, dict) else d!r}, "
                             f"not {self.name!r}")
        arrays, config, t = d.get("arrays", {}), d.get("config", {}), d.get("t", 0)
        if not isinstance(arrays, dict) or set(arrays) != set(self.slots):
            raise ValueError(f"{self.name} state arrays must be {sorted(self.slots)}, "
                             f"got {sorted(arrays) if isinstance(arrays, dict) else arrays!r}")
        if type(t) is not int or t < 0:
            raise ValueError(f"{self.name} state: step t must be an int >= 0, got {t!r}")
        if not isinstance(config, dict):
            raise ValueError(f"{self.name} state: config must be an object, got {config!r}")
        hyper = {k: v for k, v in config.items() if k in ("lr", "weight_decay") or k in self.hyper}
        for k, v in hyper.items():
            if isinstance(getattr(self, k), bool):
                if not isinstance(v, bool):
                    raise ValueError(f"{self.name} state: {k} must be true or false, got {v!r}")
            elif not (isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)
                      and v >= 0):     # type: ignore[operator]  # typeshed's numbers.Real has no >=
                raise ValueError(f"{self.name} state: {k} must be a finite number >= 0, got {v!r}")
        if self.model is None:  # nothing to copy into yet: applied by setup()
            self._pending = d
            return
        for k, a in arrays.items():
            if getattr(a, "dtype", np.dtype("O")).kind != "f" or np.size(a) != self.flat.size:
                raise ValueError(f"{self.name} state {k!r} has {np.size(a)} values of "
                                 f"{getattr(a, 'dtype', type(a).__name__)}, the model has {self.flat.size} "
                                 "float parameters")
        for k, a in arrays.items():                           # filters into the order the arena lies in
            a = arena.canonical(a, self._krsc, to_arena=True)
            self.state[k][...] = self.xp.asarray(sharded.own(self, a), dtype=self.state[k].dtype)
        for k, v in hyper.items():
            setattr(self, k, v)
        self.t = t

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if v is not None)
        return f"{type(self).__name__}({args})"
