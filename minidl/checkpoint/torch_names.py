"""minidl parameter names -> the names the model's PyTorch twin uses: the one place they meet.

A twin (benchmarks/torch_models.py) is built layer for layer as an nn.Sequential: minidl's i-th
layer is the twin's module `i` (parameter-free layers such as ReLU, Pad2D and Flatten count; a
final Softmax is left out), and a residual block (shortcut, branch, Add, ReLU) is one module `i`
holding `short` and `body`, each an nn.Sequential of the shortcut's and the branch's layers:

    lenet5:   conv2d/w -> 0.weight,  dense_2/b -> 11.bias
    resnet18: conv2d_1/w -> 1.weight,  fbn_1/gamma -> 2.weight,  conv2d_8/w -> 7.short.0.weight

The input preprocessing (layers.Normalize, no parameters) is no module `i`: the twin applies it
before its first module (benchmarks/torch_models.py), so a model carries the same names with it
or without it, and safetensors files written before it load into either.

Names are decided from the graph (node kinds and edges), never from class names.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .._types import DTypeLike
    from ..graph.model import Model

# node kind -> {minidl parameter: PyTorch parameter or buffer}
PARAMS = {
    "conv2d": {"w": "weight", "b": "bias"},
    "dense": {"w": "weight", "b": "bias"},
    "batchnorm": {"gamma": "weight", "beta": "bias", "running_mean": "running_mean",
                  "running_var": "running_var"},
}
# A buffer of PyTorch's BatchNorm2d that minidl has no use for; written as 0 so that
# load_state_dict(strict=True) finds it (it only matters to BatchNorm2d(momentum=None)).
BN_COUNTER = "num_batches_tracked"


def _ancestors(node):
    """node's first parent, its first parent, ... up to the model input."""
    out = []
    while node.layer is not None:
        node = node.parents[0]
        out.append(node)
    return out


def _chain(node, stop, model):
    """The one-input layers from just after `stop` to `node`, in order."""
    out = []
    while node is not stop:
        if node.layer is None or len(node.parents) != 1:
            raise ValueError(f"{model.name}: the residual block ending at {out[-1].layer.name if out else node.name} "
                             f"is not a chain of one-input layers; it has no PyTorch twin layout")
        out.append(node)
        node = node.parents[0]
    return out[::-1]


def _blocks(model):
    """{id(node): (add node, 'short.i' or 'body.i' or None)} for the nodes of every residual block."""
    member = {}
    for add in (n for n in model.nodes if len(n.parents) == 2):
        s, h = add.parents
        ancestors = _ancestors(h)
        x = s
        while not any(a is x for a in ancestors):
            if x.layer is None:
                raise ValueError(f"{model.name}: {add.layer.name}'s inputs share no ancestor")
            x = x.parents[0]
        for part, node in (("short", s), ("body", h)):
            for i, n in enumerate(_chain(node, x, model)):
                member[id(n)] = (add, f"{part}.{i}")
        member[id(add)] = (add, None)
        readers = [n for n in model.nodes if any(p is add for p in n.parents)]
        if len(readers) == 1 and readers[0].kind == "relu":
            member[id(readers[0])] = (add, None)
    return member


def module_paths(model: Model) -> dict[str, str]:
    """{layer name: the twin's module path} for every layer of `model`."""
    member, top, paths = _blocks(model), {}, {}      # type: dict, dict[int, str], dict[str, str]
    for node in model.nodes:
        if getattr(node.layer, "takes_images", False):     # before module 0, not one of them
            continue
        if len(node.parents) > 2:
            raise ValueError(f"{model.name}: layer {node.layer.name} has {len(node.parents)} inputs; "
                             f"it has no PyTorch twin layout")
        block, sub = member.get(id(node), (node, None))
        if id(block) not in top:
            top[id(block)] = str(len(top))
        paths[node.layer.name] = top[id(block)] + ("." + sub if sub else "")
    return paths


def torch_names(model: Model) -> dict[str, str]:
    """{'layer/param': PyTorch state_dict key} for every parameter and statistic of `model`."""
    paths, names = module_paths(model), {}
    for node in model.nodes:
        layer = node.layer
        if not layer.params:
            continue
        if node.kind not in PARAMS:
            raise ValueError(f"{model.name}: layer {layer.name} of kind {node.kind!r} has parameters "
                             f"but no PyTorch name for them")
        for p in layer.params:
            names[f"{layer.name}/{p}"] = f"{paths[layer.name]}.{PARAMS[node.kind][p]}"
    return names


def counters(model: Model) -> dict[str, np.ndarray]:
    """The PyTorch BN buffers minidl does not keep: {key: 0 as int64}."""
    paths = module_paths(model)
    return {f"{paths[n.layer.name]}.{BN_COUNTER}": np.zeros((), np.int64)
            for n in model.nodes if n.kind == "batchnorm"}


def to_torch(model: Model, dtype: DTypeLike = np.float32) -> dict[str, np.ndarray]:
    """{PyTorch key: array} of the model's weights, ready for load_state_dict(strict=True)."""
    names = torch_names(model)
    out = {names[k]: np.ascontiguousarray(v, dtype=dtype) for k, v in model.get_weights().items()}
    return {**out, **counters(model)}


def from_torch(tensors: dict[str, np.ndarray], model: Model) -> dict[str, np.ndarray]:
    """{'layer/param': array} of PyTorch-named `tensors`, checked to name every parameter once."""
    back = {v: k for k, v in torch_names(model).items()}
    extra = set(counters(model))
    unknown = sorted(set(tensors) - set(back) - extra)
    missing = sorted(set(back) - set(tensors))
    if unknown or missing:
        raise ValueError(f"{model.name}: tensors do not match the model's PyTorch names: "
                         f"unknown {unknown[:5] or 'none'}, missing {missing[:5] or 'none'}")
    return {back[k]: v for k, v in tensors.items() if k in back}
