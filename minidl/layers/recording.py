"""A layer's constructor arguments as its config: what `Layer.__init_subclass__`'s wrapper records.

A checkpoint rebuilds each layer by calling its class with its config, so the config must be JSON
data; one that is not is refused when the layer is made, naming the layer and the argument, rather
than when the model is saved (after the training it took).
"""
from __future__ import annotations

import inspect
import json
import reprlib
from typing import Any

import numpy as np


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
