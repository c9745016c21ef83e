"""The graph the passes read and rewrite: nodes in topological order, readers, host weights.

A `Graph` is a copy of a model's nodes with fresh (unbuilt) layer clones, so a pass may change
it freely; `weights` holds host arrays by 'layer/param' name for the passes that fold weights.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Iterable, Mapping, Protocol, Sequence

import numpy as np

from ..layers.node import Node, toposort
from .checks import RESERVED

if TYPE_CHECKING:
    from ..layers.base import Layer


class Nodes(Protocol):
    """What Graph.of copies: a model's nodes in order, from its inputs to its outputs (a Model, a Graph)."""
    @property
    def inputs(self) -> Sequence[Node]: ...
    @property
    def nodes(self) -> Sequence[Node]: ...
    @property
    def outputs(self) -> Sequence[Node]: ...


class Graph:
    """Nodes from `inputs` to `outputs`, each after its parents; `stats` counts what passes did."""

    nodes: list[Node]          # the layer nodes in order (set by _order)

    def __init__(self, inputs: Iterable[Node], outputs: Iterable[Node], weights: Mapping[str, np.ndarray] | None = None
                 ) -> None:
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.weights = dict(weights or {})
        self.stats: Counter[str] = Counter()
        self._order()

    def _order(self):
        order = toposort(self.outputs)
        inputs = {id(n) for n in self.inputs}
        for node in order:
            if node.layer is None and id(node) not in inputs:
                raise ValueError(f"{node.name} is reached from the outputs but is not among the model's inputs")
        self.nodes = [n for n in order if n.layer is not None]

    @classmethod
    def of(cls, model: Nodes, share_params: bool = False, weights: Mapping[str, np.ndarray] | None = None) -> Graph:
        """A copy of `model`'s graph with layer clones (sharing the model's parameters, or not)."""
        copies = {}
        for node in model.inputs:
            copies[id(node)] = Node(None, (), node.shape, name=node.name)
        for node in model.nodes:
            try:
                layer = node.layer.clone(share_params=share_params)
            except TypeError as e:
                raise ValueError(f"layer {node.layer.name} ({type(node.layer).__name__}) cannot be copied for the "
                                 f"graph passes ({e}): its __init__ must take back what its config() returns") from None
            copies[id(node)] = Node(layer, [copies[id(p)] for p in node.parents], node.shape)
        return cls([copies[id(n)] for n in model.inputs], [copies[id(n)] for n in model.outputs], weights)

    def free_of_other_models(self, snapshot: bool = True) -> tuple[Graph, dict[str, np.ndarray]]:
        """This graph for a new Model: where a layer is built into another model still alive (a second
        Model of the same nodes), a copy of the whole graph in which such layers are clones, so each model
        owns its layers and arenas (sharing them would leave the first training nothing); and with
        `snapshot`, {'layer/param': host array} of those layers' weights, for the clones to start from."""
        def taken(layer):
            owner = getattr(layer, "_model", None)
            return owner is not None and owner() is not None
        if not any(taken(n.layer) for n in self.nodes):
            return self, {}
        weights = {f"{n.layer.name}/{k}": np.array(n.layer.device.to_host(p.data)) for n in self.nodes
                   if snapshot and taken(n.layer) for k, p in n.layer.params.items() if p.data is not None}
        copies = {id(n): Node(None, (), n.shape, name=n.name) for n in self.inputs}
        for node in self.nodes:
            layer = node.layer
            if taken(layer):
                try:
                    layer = layer.clone()
                except TypeError as e:
                    raise ValueError(f"layer {layer.name} ({type(layer).__name__}) is built into another Model, "
                                     f"and a second Model copies its layers; it cannot be copied ({e}): its "
                                     f"__init__ must take back what its config() returns") from None
            copies[id(node)] = Node(layer, [copies[id(p)] for p in node.parents], node.shape)
        return Graph([copies[id(n)] for n in self.inputs], [copies[id(n)] for n in self.outputs]), weights

    def name_layers(self) -> None:
        """Name each unnamed layer the way the C++ trainer printed them (`conv2d`, `conv2d_1`, `relu_3`): its
        `prefix` or class name, numbered from its `first_index` past the names the graph holds already."""
        layers = [n.layer for n in self.nodes]
        taken = {layer.name for layer in layers if layer.name}
        counters: dict[str, int] = {}
        for layer in layers:
            if layer.name:
                continue
            stem = layer.prefix or type(layer).__name__.lower()
            stem = f"{stem}_layer" if RESERVED.fullmatch(stem) else stem    # a user's class Output
            i = counters.get(stem, layer.first_index)
            while (name := stem if i == 0 else f"{stem}_{i}") in taken:
                i += 1
            layer.name, counters[stem] = name, i + 1
            taken.add(name)

    # -- reading ----------------------------------------------------------------------------
    def readers(self, node: Node) -> list[Node]:
        """The nodes that read `node`, once per read."""
        return [n for n in self.nodes for p in n.parents if p is node]

    def is_output(self, node: Node) -> bool:
        return any(o is node for o in self.outputs)

    def sole_reader(self, node: Node) -> Node | None:
        """The one node reading `node`, if exactly one does and `node` is not a model output."""
        readers = self.readers(node)
        return readers[0] if len(readers) == 1 and not self.is_output(node) else None

    # -- rewriting --------------------------------------------------------------------------
    def bypass(self, node: Node, stat: str | None = None) -> None:
        """Remove a one-input node: whatever read it reads its input instead."""
        src = node.parents[0]
        for n in self.nodes:
            if any(p is node for p in n.parents):
                n.parents = tuple(src if p is node else p for p in n.parents)
        self.outputs = [src if o is node else o for o in self.outputs]
        self._drop_weights(node.layer)
        if stat:
            self.stats[stat] += 1
        self._order()

    def swap(self, node: Node, reader: Node, stat: str | None = None) -> None:
        """Exchange a shape-preserving one-input node and its sole reader (one-input too): the reader
        reads the node's input, the node reads the reader, and the reader's readers read the node."""
        for n in self.nodes:
            if n is not reader and any(p is reader for p in n.parents):
                n.parents = tuple(node if p is reader else p for p in n.parents)
        self.outputs = [node if o is reader else o for o in self.outputs]
        reader.parents, node.parents, node.shape = node.parents, (reader,), reader.shape
        if stat:
            self.stats[stat] += 1
        self._order()

    def replace(self, node: Node, layer: Layer, weights: Mapping[str, np.ndarray] | None = None) -> None:
        """Give `node` a new layer (and, if given, new host weights for it)."""
        if weights is not None:
            self._drop_weights(node.layer)
            self.weights.update({f"{layer.name}/{k}": v for k, v in weights.items()})
        node.layer = layer

    def reorder(self) -> None:
        """Order the nodes again after a pass rewired parents or outputs itself (new nodes join)."""
        self._order()

    def _drop_weights(self, layer):
        """The host weights of `layer` alone: 'name/param' with exactly its name before the last '/'
        (a prefix would also take those of a layer named 'name/w', whose weights are 'name/w/...')."""
        for k in [k for k in self.weights if k.rpartition("/")[0] == layer.name]:
            del self.weights[k]

    def __repr__(self):
        return f"Graph({len(self.nodes)} nodes: {', '.join(n.layer.name for n in self.nodes)})"
