"""A layer's constructor arguments as its config: what `Layer.__init_subclass__`'s wrapper records.

A checkpoint rebuilds each layer by calling its class with its config, so the config must be JSON
data; one that is not is refused when the layer is made, naming the layer and the argument, rather
than when the model is saved (after the training it took).
"""
from __future__ import annotations

import functools
import inspect
import json
import reprlib
from typing import Any, Callable, TypeVar

import numpy as np


_Init = TypeVar("_Init", bound=Callable[..., None])
_Config = TypeVar("_Config", bound=Callable[..., Any])


def recorded_arguments(config: _Config) -> _Config:
    """Marks Layer.config: a class whose config() is this one has its arguments checked to be JSON data
    when made (a class that writes its own config() decides for itself)."""
    config._from_arguments = True  # type: ignore[attr-defined]  # read by record_config's wrapper
    return config


def record_config(init: _Init) -> _Init:
    """`__init__` that records its arguments as the layer's config (`Layer.config`).

    Every Layer subclass's `__init__` is wrapped so when the class is made (`Layer.__init_subclass__`);
    the decorator is kept for code that names it, and wrapping twice is wrapping once. The outermost
    `__init__` records (a subclass's, not the `super().__init__` it calls); `name` is accepted even
    where the signature lacks it; an argument a config cannot hold (not JSON data) is refused here,
    in one line naming the layer and the argument, unless the class writes its own `config()`.
    """
    if getattr(init, "_records_config", False):
        return init
    sig = inspect.signature(init)
    kinds = {k: p.kind for k, p in sig.parameters.items()}
    takes_name = "name" in kinds or inspect.Parameter.VAR_KEYWORD in kinds.values()

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        if type(self).__init__ is not wrapper:        # a super().__init__ call: the subclass records
            return init(self, *args, **kwargs)
        name = None if takes_name else kwargs.pop("name", None)
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError as e:
            raise TypeError(f"{type(self).__name__}: {e}") from None
        bound.apply_defaults()
        init(self, *args, **kwargs)
        if name is not None:
            self.name = str(name)
        self._config = arguments(self, bound, kinds, check=getattr(type(self).config, "_from_arguments", False))
    wrapper._records_config = True  # type: ignore[attr-defined]  # marks a wrapped __init__
    return wrapper  # type: ignore[return-value]  # functools.wraps: the signature of init


def arguments(layer: Any, bound: inspect.BoundArguments, kinds: dict[str, Any], check: bool = True) -> dict[str, Any]:
    """{argument: value} of a bound __init__ call, **kwargs spread, `name` left out; with `check`, each is
    JSON data (else a TypeError from layer.error naming it)."""
    config: dict[str, Any] = {}
    for k, v in list(bound.arguments.items())[1:]:          # [0]: self
        if kinds[k] is inspect.Parameter.VAR_KEYWORD:
            config.update(v)
        elif kinds[k] is inspect.Parameter.VAR_POSITIONAL:
            if v:
                raise layer.error(f"takes *{k}, which its config cannot record by name: give __init__ named "
                                  f"arguments", TypeError)
        else:
            config[k] = v
    config.pop("name", None)
    for k, v in config.items() if check else ():
        try:
            json.dumps(jsonable(v))
        except (TypeError, ValueError):
            raise layer.error(f"hyper-parameter {k}={reprlib.repr(v)} cannot be recorded in its config (a "
                              f"checkpoint rebuilds the layer from it): pass numbers, strings, bools, None, or "
                              f"lists and dicts of them", TypeError) from None
    return config


def jsonable(v: Any) -> Any:
    """Tuples as lists, NumPy scalars as Python numbers and NumPy arrays as nested lists, so configs go
    through JSON."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (tuple, list)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    return v
