"""What a Model refuses from its user, each as one ValueError naming the layer and the shapes."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NoReturn, Sequence

import numpy as np

from .._types import Array
from ..precision import is_float

if TYPE_CHECKING:
    from .model import Model


def no_layers(name: str) -> NoReturn:
    """Model(x, x): nothing to compute, nothing to train."""
    raise ValueError(f"{name}: no layer between the inputs and the outputs (Model(x, x)): "
                     f"a model needs at least one layer")


def gradients(model: Model, gys: Sequence[Array]) -> None:
    """backward needs a forward before it, and a gradient of each output's shape."""
    if model._out_shapes is None:
        raise ValueError(f"{model.name}: backward before forward: run forward(x, training=True) first "
                         f"(layer {model.layers[0].name} has nothing saved to differentiate)")
    for o, g, shape in zip(model.outputs, gys, model._out_shapes):
        if tuple(getattr(g, "shape", ())) != shape:
            raise ValueError(f"{model.name}: the gradient of output {o.layer.name} has shape "
                             f"{tuple(getattr(g, 'shape', ()))}, the output has shape {shape}")
    if model.releases:                  # what forward saved is let go by this backward
        model._out_shapes = None


def weights(model: Model, weights: Mapping[str, Any], strict: bool) -> None:
    """Names, shapes and dtypes of {'layer/param': array} against the model's parameters."""
    unknown = sorted(set(weights) - set(model.params))
    missing = sorted(set(model.params) - set(weights))
    if unknown or (strict and missing):
        raise ValueError(f"{model.name}: weights do not match the model: "
                         f"unknown {unknown or 'none'}, missing {missing or 'none'}")
    for k, a in weights.items():
        if tuple(np.shape(a)) != model.params[k].shape:
            raise ValueError(f"{model.name}: {k} has shape {model.params[k].shape}, got {tuple(np.shape(a))}")
        dtype = getattr(a, "dtype", np.dtype("f"))
        if not (dtype.kind in "iu" or is_float(dtype)):
            raise ValueError(f"{model.name}: {k} has dtype {a.dtype}, expected real numbers")
