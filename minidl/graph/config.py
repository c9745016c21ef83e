"""A model config (Model.config()'s JSON) back to graph nodes, every field checked first; and a model's config."""
from __future__ import annotations

import json
from typing import Any, Sequence

from ..layers import registry
from ..layers.node import Input, Node


def config_of(name: str, inputs: Sequence[Node], nodes: Sequence[Node], outputs: Sequence[Node]) -> dict[str, Any]:
    """Model.config() of the model `name` of these nodes: inputs, and each layer's class, arguments and inputs
    (by index), as JSON-able data."""
    index = {id(n): i for i, n in enumerate(inputs)}
    layers: list[dict[str, Any]] = []
    for node in nodes:
        index[id(node)] = len(inputs) + len(layers)
        cls = type(node.layer)              # its module too: a user's ReLU is not minidl's (layers/registry.py)
        layers.append({"class": cls.__name__, "module": cls.__module__, "name": node.layer.name,
                       "config": node.layer.config(), "inputs": [index[id(p)] for p in node.parents]})
    return {"name": name, "inputs": [list(n.shape[1:]) for n in inputs], "layers": layers,
            "outputs": [index[id(o)] for o in outputs], CONTRACT: "images"}


# A config that has this key is of a model that takes the input contract's images, [0, 1] (docs/input.md),
# normalised by its own Normalize if it has one. One without it is from before: every such model was
# trained on MNIST-normalised floats (the Loader's default then), which `with_preprocessing` makes explicit.
CONTRACT = "input"


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
        name, module = spec.get("class"), spec.get("module")
        if not isinstance(name, str) or not isinstance(module, (str, type(None))):
            raise ValueError(f"{where}: 'class' must be a name and 'module' a module's name, got {name!r}, {module!r}")
        try:
            layer_cls = registry.find(name, module)
        except ValueError as e:
            raise ValueError(f"{where} ({spec.get('name')}): {e}") from None
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


def without_preprocessing(config: dict[str, Any], mean: float, std: float) -> dict[str, Any]:
    """A copy of a model config without its input Normalize of this `mean` and `std` (a layer declaring
    `takes_images` that reads a model input), its readers reading that input instead. With the Loader's
    default (MNIST's), that layer is what the Loader applied to a model from before it, so
    checkpoint.first_difference compares the two so: a checkpoint from before loads into today's zoo
    model, and back."""
    config = json.loads(json.dumps(config))            # tuples as lists; the caller's record untouched
    layers, n_in = config.get("layers"), len(config.get("inputs") or [])
    if not isinstance(layers, list):
        return config
    for j, spec in enumerate(layers):
        cls = _class_of(spec)
        ins = spec.get("inputs") if cls is not None else None
        if not (getattr(cls, "takes_images", False) and isinstance(ins, list) and len(ins) == 1
                and type(ins[0]) is int and ins[0] < n_in and spec.get("config") == {"mean": mean, "std": std}):
            continue
        me, src = n_in + j, ins[0]

        def ref(r: Any) -> Any:
            return src if r == me else r - 1 if type(r) is int and r > me else r
        config["layers"] = [{**s, "inputs": [ref(r) for r in s.get("inputs", [])]} if isinstance(s, dict) else s
                            for i, s in enumerate(layers) if i != j]
        config["outputs"] = [ref(r) for r in config.get("outputs") or []]
        return config
    return config


def _class_of(spec: Any) -> type | None:
    """The layer class a config entry names, or None where it names none known."""
    name = spec.get("class") if isinstance(spec, dict) else None
    module = spec.get("module") if isinstance(spec, dict) else None
    try:
        return registry.find(name, module) if isinstance(name, str) and isinstance(module, (str, type(None))) else None
    except ValueError:
        return None


def with_preprocessing(config: Any, mean: float, std: float) -> Any:
    """A config from before the input contract (no CONTRACT key), of one input and no Normalize at it,
    with what the Loader applied to its model made explicit: a Normalize(mean, std) reading the input,
    whatever read the input reading the Normalize, so the model takes [0, 1] images at every entry point
    as today's models do. Any other config is returned as it is (a malformed one is from_config's to name)."""
    if not isinstance(config, dict) or CONTRACT in config:
        return config
    layers, ins = config.get("layers"), config.get("inputs")
    if not (isinstance(layers, list) and isinstance(ins, list) and len(ins) == 1
            and all(isinstance(s, dict) for s in layers)):
        return config
    for spec in layers:
        if getattr(_class_of(spec), "takes_images", False) and spec.get("inputs") == [0]:
            return config                                      # it carries its preprocessing already
    names, name, i = {s.get("name") for s in layers}, "normalize", 0
    while name in names:
        i += 1
        name = f"normalize_{i}"

    def ref(r: Any) -> Any:                                    # the input's readers read the Normalize (1)
        return r + 1 if type(r) is int else r
    shifted = [{**s, "inputs": [ref(r) for r in s["inputs"]]} if isinstance(s.get("inputs"), list) else s
               for s in layers]
    norm = {"class": "Normalize", "module": "minidl.layers.preprocess", "name": name,
            "config": {"mean": mean, "std": std}, "inputs": [0]}
    outs = config.get("outputs")
    return {**config, "layers": [norm, *shifted], "outputs": [ref(r) for r in outs] if isinstance(outs, list) else outs,
            CONTRACT: "images"}
