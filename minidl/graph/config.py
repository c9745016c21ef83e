"""A model config (Model.config()'s JSON) back to graph nodes, every field checked first; and a model's config."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..layers.base import Layer
from ..layers.node import Input, Node

if TYPE_CHECKING:
    from .model import Model


def config_of(model: Model) -> dict[str, Any]:
    """Model.config(): inputs, and each layer's class, arguments and inputs (by index), as JSON-able data."""
    index = {id(n): i for i, n in enumerate(model.inputs)}
    layers: list[dict[str, Any]] = []
    for node in model.nodes:
        index[id(node)] = len(model.inputs) + len(layers)
        layers.append({"class": type(node.layer).__name__, "name": node.layer.name,
                       "config": node.layer.config(), "inputs": [index[id(p)] for p in node.parents]})
    return {"name": model.name, "inputs": [list(n.shape[1:]) for n in model.inputs], "layers": layers,
            "outputs": [index[id(o)] for o in model.outputs]}


def graph_of_config(config: Any) -> tuple[Node | list[Node], Node | list[Node]]:
    """(inputs, outputs) nodes of a model config, every field checked before a layer is made."""
    if not isinstance(config, dict):
        raise ValueError(f"a model config is a JSON object, got {type(config).__name__}")
    try:
        ins, specs, outs = config["inputs"], config["layers"], config["outputs"]
    except KeyError as e:
        raise ValueError(f"the model config has no {e.args[0]!r}") from None
    if not (isinstance(ins, list) and ins and isinstance(specs, list) and isinstance(outs, list) and outs):
        raise ValueError("the model config needs non-empty lists 'inputs', 'layers' and 'outputs'")
    nodes = [Input(shape) if isinstance(shape, list) else Input(None)  # type: ignore[arg-type]  # refused, named
             for shape in ins]
    for i, spec in enumerate(specs):
        where = f"model config layer {i}"
        if not isinstance(spec, dict) or not isinstance(spec.get("config", {}), dict):
            raise ValueError(f"{where}: expected an object with 'class', 'name', 'config', 'inputs'")
        layer_cls = (Layer.registry.get(spec.get("class"))  # type: ignore[arg-type]  # a str: checked below
                     if isinstance(spec.get("class"), str) else None)
        if layer_cls is None:
            raise ValueError(f"{where}: unknown layer class {spec.get('class')!r}")
        refs = spec.get("inputs")
        if not (isinstance(refs, list) and refs and all(type(r) is int and 0 <= r < len(nodes) for r in refs)):
            raise ValueError(f"{where} ({spec.get('name')}): inputs must index earlier nodes, got {refs!r}")
        try:
            layer = layer_cls(**spec.get("config", {}), name=spec.get("name"))
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"{where} ({spec.get('name')}): {e}") from None
        nodes.append(layer(*[nodes[r] for r in refs]))
    if not all(type(o) is int and 0 <= o < len(nodes) for o in outs):
        raise ValueError(f"model config outputs must index nodes, got {outs!r}")
    ins, outs = nodes[:len(ins)], [nodes[o] for o in outs]
    return ins[0] if len(ins) == 1 else ins, outs[0] if len(outs) == 1 else outs
