"""Optimizer: one fused kernel call per step over the model's flat parameter and gradient buffers."""
import numpy as np

from . import schedules as _schedules


class Optimizer:
    """Base optimizer: p ← update(p, g, state, lr_t) with lr_t = schedule(lr, t - 1) at step t >= 1.

    Subclasses set `name`, `slots` (state arrays, each zeros_like(flat)), `hyper` (the constructor's
    other hyper-parameters, kept as attributes) and `update(lr)`.
    """
    name = "optimizer"
    slots = ()
    hyper = ()

    def __init__(self, lr, weight_decay=0.0, schedule=None):
        if lr < 0 or weight_decay < 0:
            raise ValueError(f"{type(self).__name__}: lr and weight_decay must be >= 0, got {lr}, {weight_decay}")
        self.lr, self.weight_decay = float(lr), float(weight_decay)
        self.schedule = _schedules.resolve(schedule)
        self.current_lr = self.lr
        self.t = 0
        self.state = {}
        self.model = self._pending = None

    def setup(self, model):
        """Bind model.flat / model.grads and the device's optim kernels; allocate zeroed state.

        State loaded before setup is applied now. Setting up the same model again keeps the state:
        in place if its buffers are unchanged (captured CUDA graphs stay valid), else copied over
        to the new buffers (model.to(device) reallocates the arena); another model starts afresh.
        """
        if model is self.model and model.flat is self.flat and model.grads is self.grads:
            return self
        pending, self._pending = self._pending, None
        if pending is None and model is self.model and self.state:
            pending = self.state_dict()
        self.model, self.device = model, model.device
        self.flat, self.grads = model.flat, model.grads
        self.xp, self.kernels = model.device.xp, model.device.kernels.optim
        self.state = {k: self.xp.zeros_like(self.flat) for k in self.slots}
        if pending is not None:
            self.load_state_dict(pending)
        else:
            self.t = 0
        return self

    def step(self):
        """Apply one update in place from model.grads; the first step is t = 1."""
        if self.model is None:
            raise RuntimeError(f"{type(self).__name__}.step() before setup(model)")
        self.t += 1
        self.current_lr = float(self.schedule(self.lr, self.t - 1))
        self.update(self.current_lr, self.t)

    def update(self, lr, t):
        """One in-place update with learning rate `lr` at step `t` (floats, or 0-d device arrays)."""
        raise NotImplementedError

    # -- a step captured in a CUDA graph ---------------------------------------------------
    # A graph freezes scalar kernel arguments, so lr and t live in 0-d device arrays: the graph
    # increments t itself, and the host rewrites lr before a replay only when the schedule moves it.
    def bind_device_scalars(self):
        """Allocate (or reset to the current step) the device copies of lr and t."""
        dtype = self.flat.dtype
        self._t_dev = self.xp.full((), self.t, dtype)
        self._lr_dev = self.xp.zeros((), dtype)
        self._lr_set = None

    def device_step(self):
        """The update reading lr and t from the device: what a captured step records."""
        self._t_dev += 1
        self.update(self._lr_dev, self._t_dev)

    def host_step(self):
        """Before each replay: advance the host step count and refresh lr on the device if needed."""
        self.t += 1
        self.current_lr = float(self.schedule(self.lr, self.t - 1))
        if self.current_lr != self._lr_set:
            self._lr_dev.fill(self.current_lr)
            self._lr_set = self.current_lr

    def device_arrays(self):
        """Every array a step changes: snapshotted around a capture's warm-up."""
        return list(self.state.values()) + [self._t_dev]

    def config(self):
        """The constructor's arguments, JSON-able: get(name, **config()) rebuilds this optimizer."""
        cfg = {"lr": self.lr, "weight_decay": self.weight_decay}
        cfg.update({k: getattr(self, k) for k in self.hyper})
        # a user's own schedule function has no config: it is recorded as None and not rebuilt
        cfg["schedule"] = getattr(self.schedule, "config", None)
        return cfg

    def state_dict(self):
        """{"name", "config", "t", "arrays": {slot: NumPy host copy}}."""
        arrays = {}
        for k, a in self.state.items():
            h = self.device.to_host(a)
            arrays[k] = h.copy() if h is a else h
        return {"name": self.name, "config": self.config(), "t": self.t, "arrays": arrays}

    def load_state_dict(self, d):
        """Restore step, hyper-parameters and state arrays (copied in place: addresses are kept)."""
        if d.get("name") != self.name:
            raise ValueError(f"optimizer state is for {d.get('name')!r}, not {self.name!r}")
        arrays = d.get("arrays", {})
        if set(arrays) != set(self.slots):
            raise ValueError(f"{self.name} state arrays must be {sorted(self.slots)}, got {sorted(arrays)}")
        if self.model is None:  # nothing to copy into yet: applied by setup()
            self._pending = d
            return
        for k, a in arrays.items():
            if np.size(a) != self.state[k].size:
                raise ValueError(f"{self.name} state {k!r} has {np.size(a)} values, the model has "
                                 f"{self.state[k].size} parameters")
        for k, a in arrays.items():
            self.state[k][...] = self.xp.asarray(np.asarray(a).reshape(-1), dtype=self.state[k].dtype)
        for k, v in d.get("config", {}).items():
            if k in ("lr", "weight_decay") or k in self.hyper:
                setattr(self, k, v)
        self.t = int(d.get("t", 0))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if v is not None)
        return f"{type(self).__name__}({args})"
