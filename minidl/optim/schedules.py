"""Learning-rate schedules: callables f(base_lr, step) -> lr, with step counted from 0.

base_lr and step may be numbers or 0-d device arrays, so an optimizer evaluates its schedule on the
device, inside a captured training step, without reading anything back to the host. The formulas
call the ufuncs of the step's own array module (_xp) with no Python operators between arrays and
numbers: the first time a process hands CuPy a NumPy ufunc or an operator with a Python number
(`array - 1.0`), CuPy imports cupyx.scipy.sparse and SciPy, a pause the first step would pay.
A schedule with a horizon (cosine) is tabulated on the host instead
(Optimizer._lr_at in base.py).

Each carries a JSON-able `config` ({"name": ..., **arguments}) so an optimizer's state can name
its schedule and `get(**config)` can rebuild it.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np

if TYPE_CHECKING:
    Schedule = Callable[[Any, Any], Any]       # f(base_lr, step) -> lr; numbers or 0-d device arrays
    ScheduleSpec = Union[str, dict, Callable[[Any, Any], Any], None]     # what resolve() accepts


def _xp(a):
    """The array module of `a`: CuPy for a device array, else NumPy (numbers included)."""
    return sys.modules["cupy"] if type(a).__module__.startswith("cupy") else np


def _schedule(fn, name, **kw):
    fn.config = {"name": name, **kw}
    fn.__qualname__ = fn.__name__ = name
    return fn


def constant() -> Schedule:
    """lr = base_lr. It reads no step (`reads_step` False): an optimizer computes no t - 1 for it."""
    f = _schedule(lambda base_lr, step: base_lr, "constant")
    f.reads_step = False          # a function attribute
    return f


def step_decay(step_size: int, gamma: float = 0.1) -> Schedule:
    """lr = base_lr · gamma^⌊step / step_size⌋."""
    if step_size < 1:
        raise ValueError(f"step_decay: step_size must be >= 1, got {step_size}")

    def f(base_lr, step):
        xp = _xp(step)
        return xp.multiply(base_lr, xp.power(gamma, xp.floor_divide(step, step_size)))
    return _schedule(f, "step_decay", step_size=step_size, gamma=gamma)


def cosine(total_steps: int, min_lr: float = 0.0) -> Schedule:
    """lr = min_lr + (base_lr - min_lr) (1 + cos(π min(step, T) / T)) / 2."""
    if total_steps < 1:
        raise ValueError(f"cosine: total_steps must be >= 1, got {total_steps}")

    def f(base_lr, step):
        # held at min_lr after total_steps rather than climbing back up the cosine
        return min_lr + (base_lr - min_lr) * (1 + np.cos(np.pi * np.minimum(step, total_steps) / total_steps)) / 2
    f.horizon = total_steps      # type: ignore[attr-defined]  # constant from there on: may be tabulated
    return _schedule(f, "cosine", total_steps=total_steps, min_lr=min_lr)


def inverse_time(decay: float) -> Schedule:
    """lr = base_lr / (1 + decay · step)   (the C++ trainer's decay)."""
    if decay < 0:
        raise ValueError(f"inverse_time: decay must be >= 0, got {decay}")

    def f(base_lr, step):
        xp = _xp(step)
        return xp.divide(base_lr, xp.add(1.0, xp.multiply(decay, step)))
    return _schedule(f, "inverse_time", decay=decay)


def warmup(steps: int, schedule: ScheduleSpec) -> Schedule:
    """lr = schedule(base_lr, step) · min(1, (step + 1) / steps): a linear ramp over the first
    `steps` steps (Goyal et al., 2017), composed with any schedule (a name, config or callable)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"warmup: steps must be an int >= 1, got {steps!r}")
    inner = resolve(schedule)

    def f(base_lr, step):
        xp = _xp(step)
        return xp.multiply(inner(base_lr, step), xp.minimum(1.0, xp.divide(xp.add(step, 1.0), steps)))
    if getattr(inner, "horizon", None) is not None:      # constant past both: still tabulated
        f.horizon = max(inner.horizon, steps)      # type: ignore[attr-defined]  # a function attribute
    return _schedule(f, "warmup", steps=steps, schedule=getattr(inner, "config", None))


SCHEDULES: dict[str, Callable[..., Schedule]] = {
    "constant": constant, "step_decay": step_decay, "cosine": cosine, "inverse_time": inverse_time, "warmup": warmup}

# The command line's names (--schedule), each over a run of `total` steps as cli/runplan.py builds it.
RUN_SCHEDULES: dict[str, Callable[[int], Schedule]] = {
    "cosine": lambda total: cosine(total), "constant": lambda total: constant(),
    "step": lambda total: step_decay(max(total // 3, 1), 0.1), "inverse-time": lambda total: inverse_time(1e-4)}
_ALIASES = {"step_decay": "step", "inverse_time": "inverse-time"}


def over_run(name: str) -> Schedule:
    """A schedule named without its arguments ("cosine", as on the command line): it spans the run,
    so Trainer.fit builds it once it knows the run's total steps (`for_run`); called before, it says so."""
    def f(base_lr, step):
        raise ValueError(f"schedule {name!r} spans a run: Trainer.fit sets its length; without a Trainer "
                         f"give schedules.{name.replace('-', '_')}(...) with its arguments")
    f.over_run = name             # type: ignore[attr-defined]  # what for_run builds
    return _schedule(f, name)


def for_run(schedule: Schedule, total: int) -> Schedule:
    """`schedule` itself, or, where it was named without arguments (over_run), that schedule over `total` steps."""
    name = getattr(schedule, "over_run", None)
    return schedule if name is None else RUN_SCHEDULES[name](total)


def get(name: str, **kw: Any) -> Schedule:
    """The schedule called `name`, built with keyword arguments `kw`; a command-line name given without
    arguments ("cosine", "step", "inverse-time") spans the run Trainer.fit trains (over_run)."""
    run_name = _ALIASES.get(name, name)
    if not kw and run_name in RUN_SCHEDULES and run_name != "constant":
        return over_run(run_name)
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}: expected one of "
                         f"{', '.join(dict.fromkeys([*SCHEDULES, *RUN_SCHEDULES]))}")
    return SCHEDULES[name](**kw)


def resolve(spec: ScheduleSpec) -> Schedule:
    """None -> constant(); a name or a config dict -> get(...); a callable is kept as is."""
    if spec is None:
        return constant()
    if isinstance(spec, str):
        return get(spec)
    if isinstance(spec, dict):
        return get(**spec)
    if callable(spec):
        return spec
    raise TypeError(f"a schedule is a callable f(base_lr, step), a name or a config dict, got {spec!r}")
