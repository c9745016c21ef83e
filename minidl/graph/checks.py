"""What a Model refuses from its user, each as one ValueError naming the layer and the shapes: no layers,
names that clash, gradients before a forward, weights that do not fit, and a layer of the user's that
breaks the layer contract (an output unlike what its build declared, a backward of the wrong arity). Each is
given the model's name (`model`) and the parts it checks, so these checks stand under the model they guard."""
from __future__ import annotations

import gc
import re
from typing import TYPE_CHECKING, Any, Mapping, NoReturn, Sequence

import numpy as np

from .._types import Array
from ..layers.base import _fmt
from ..precision import is_float

if TYPE_CHECKING:
    from ..layers.base import Layer, Parameter
    from ..layers.node import Node


def no_layers(name: str) -> NoReturn:
    """Model(x, x): nothing to compute, nothing to train."""
    raise ValueError(f"{name}: no layer between the inputs and the outputs (Model(x, x)): "
                     f"a model needs at least one layer")


# The names the ONNX export gives the graph's inputs and outputs (inference/onnx_export.py): a layer so named,
# or named below one ("input/unit"), would write over them.
RESERVED = re.compile(r"(input|output)(_\d+)?")


def names(model: str, layers: Sequence[Layer]) -> None:
    """Layer names: unique, none of RESERVED, and none a parameter path's prefix of another's: parameters
    are 'layer/param', so a layer "d/w" next to a layer "d" would share "d"'s namespace (its weights,
    the ONNX tensors "d/..."). One ValueError naming both layers."""
    seen: dict[str, str] = {}
    for layer in layers:
        if layer.name in seen:
            raise ValueError(f"{model}: two layers are named {layer.name!r} ({seen[layer.name]} and "
                             f"{type(layer).__name__}): layer names must be unique in a model")
        seen[layer.name] = type(layer).__name__
    for layer in layers:
        parts = layer.name.split("/")
        if RESERVED.fullmatch(parts[0]):
            raise ValueError(f"{model}: layer {layer.name} ({type(layer).__name__}): the name {parts[0]!r} "
                             f"is reserved for the model's inputs and outputs (ONNX export); choose another name")
        for i in range(1, len(parts)):
            stem = "/".join(parts[:i])
            if stem in seen:
                raise ValueError(f"{model}: layer names {stem!r} ({seen[stem]}) and {layer.name!r} "
                                 f"({type(layer).__name__}) clash: parameters are named 'layer/param', so no "
                                 f"layer name may begin with another's name and '/'")


def not_lowered(model: str, lowerings: Sequence[Any], device: Any) -> None:
    """model.to(device) while a lowering of the model lives (a Trainer's training step, which trains its
    arenas; `lowerings`: weak references to them): the step would go on training the old arenas while the
    model answered from the new ones."""
    if any(ref() is not None for ref in lowerings):
        gc.collect()                       # a Trainer let go of, still in a reference cycle
    if any(ref() is not None for ref in lowerings):
        raise ValueError(f"{model}.to({device.name}, {device.dtype.name}): a Trainer trains this model (its "
                         f"training step shares the model's weights); move the model before making the Trainer, "
                         f"or pass Trainer(..., device=)")


def gradients(model: str, outputs: Sequence[Node], out_shapes: Sequence[tuple[int, ...]] | None,
              first: Layer, gys: Sequence[Array]) -> None:
    """backward needs a forward before it (`out_shapes`: the last forward's output shapes, None before any),
    and a gradient of each output's shape."""
    if out_shapes is None:
        raise ValueError(f"{model}: backward before forward: run forward(x, training=True) first "
                         f"(layer {first.name} has nothing saved to differentiate)")
    for o, g, shape in zip(outputs, gys, out_shapes):
        if tuple(getattr(g, "shape", ())) != shape:
            raise ValueError(f"{model}: the gradient of output {o.layer.name} has shape "
                             f"{tuple(getattr(g, 'shape', ()))}, the output has shape {shape}")


def weights(model: str, params: Mapping[str, Parameter], layers: Sequence[Layer], weights: Mapping[str, Any],
            strict: bool) -> None:
    """Names, shapes and dtypes of {'layer/param': array} against the model's parameters `params`."""
    unknown = sorted(set(weights) - set(params))
    missing = sorted(set(params) - set(weights))
    if unknown or (strict and missing):
        raise ValueError(f"{model}: weights do not match the model: "
                         f"unknown {unknown or 'none'}, missing {missing or 'none'}")
    for k, a in weights.items():
        if tuple(np.shape(a)) != params[k].shape:
            raise ValueError(f"{model}: {k} has shape {params[k].shape}, got {tuple(np.shape(a))}")
        dtype = getattr(a, "dtype", np.dtype("f"))
        if not (dtype.kind in "iu" or is_float(dtype)):
            raise ValueError(f"{model}: {k} has dtype {a.dtype}, expected real numbers")
        host = np.asarray(a)
        bad = int(np.count_nonzero(~np.isfinite(host if host.dtype.kind in "fiu" else host.astype(np.float32))))
        if bad:
            raise ValueError(f"{model}: {k} holds {bad} non-finite value(s) (NaN or infinity)")
    by_layer: dict[int, dict[str, Any]] = {}
    owner = {f"{layer.name}/{p}": (layer, p) for layer in layers for p in layer.params}
    for k, a in weights.items():
        layer, p = owner[k]
        by_layer.setdefault(id(layer), {"layer": layer})[p] = a
    for group in by_layer.values():          # what each layer's own checks refuse (BN: a negative variance)
        group.pop("layer").check_weights(group)


def built_shape(layer: Any, shape: Any) -> tuple[int | None, ...]:
    """What a layer's build returned, as its output shape: a sequence of positive ints (None for the batch)."""
    try:
        dims = tuple(shape)
        ok = bool(dims) and all(d is None or (isinstance(d, (int, np.integer)) and d > 0) for d in dims)
    except TypeError:
        ok = False
    if not ok:
        raise layer.error(f"build returned {shape!r}; it must return the output shape, a tuple of positive ints "
                          f"with the batch dimension first (None)")
    return tuple(None if d is None else int(d) for d in dims)


def layer_output(node: Node, xs: Sequence[Array], y: Any, xp: Any) -> None:
    """A user's layer's forward result against its build: one array of the device's kind, of the shape
    build declared (the batch its input has), in the dtype the graph carries there (its input's, or its
    `out_dtype`). Caught here, not three layers later as a NumPy error or a silent float64 model."""
    layer = node.layer
    if not isinstance(y, xp.ndarray):
        raise layer.error(f"forward returned {type(y).__name__}, expected one {xp.__name__} array of shape "
                          f"{_fmt(node.shape)}")
    n = xs[0].shape[0] if xs else None
    want = tuple(n if d is None else d for d in node.shape)
    if tuple(y.shape) != want:
        raise layer.error(f"forward returned shape {tuple(y.shape)}, but its build declared {_fmt(node.shape)} "
                          f"({want} for this batch)")
    if y.dtype != node.dtype:
        raise layer.error(f"forward returned dtype {y.dtype}, expected {node.dtype} (its input's; a layer that "
                          f"changes the dtype declares out_dtype)")


def layer_grads(node: Node, gxs: Any, need: Any, inputs: Sequence[tuple[tuple[int, ...], Any]], xp: Any) -> None:
    """A user's layer's backward result: a tuple of one gradient per input, each an array of that input's
    shape and dtype, or None where `need` says the gradient is not read. `inputs`: the (shape, dtype) of
    the values its forward read. A bare array, (None,) for a read input or () would cut or garble the
    gradients of every layer before it."""
    layer, n = node.layer, len(node.parents)
    if not isinstance(gxs, (tuple, list)) or len(gxs) != n:
        got = f"{len(gxs)} gradient(s)" if isinstance(gxs, (tuple, list)) else f"a bare {type(gxs).__name__}"
        raise layer.error(f"backward returned {got}; it must return a tuple of {n} (one gradient per input, "
                          f"None where need.input(i) is False)")
    for i, (g, (shape, dtype)) in enumerate(zip(gxs, inputs)):
        if g is None:
            if need.input(i):
                raise layer.error(f"backward returned None for input {i}, whose gradient the graph reads "
                                  f"(need.input({i}) is True)")
        elif not isinstance(g, xp.ndarray) or tuple(g.shape) != shape or g.dtype != dtype:
            what = (f"shape {tuple(g.shape)}, {g.dtype}" if isinstance(g, xp.ndarray) else type(g).__name__)
            raise layer.error(f"backward's gradient for input {i} is {what}; expected an array of its input's "
                              f"shape {shape}, {dtype}")
