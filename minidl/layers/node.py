"""Symbolic tensors: `Node` (a layer applied to nodes) and `Input` (a model input).

They live with the layers because `layer(node)` makes one; the graph (minidl.graph) orders
and runs them and knows no concrete layer type.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from .._types import BatchShape

if TYPE_CHECKING:
    import numpy as np

    from .base import Layer


class Node:
    """A tensor in the graph: the output of `layer` applied to `parents` (or a model input).

    `shape` and `dtype` are filled in when a model builds the graph (the batch dimension first, None).
    """

    def __init__(self, layer: Layer | None, parents: Iterable[Node], shape: BatchShape | None = None,
                 name: str | None = None) -> None:
        # typed as set: None only for a model input's layer (graph code tells inputs apart before reading it)
        # and an unbuilt node's shape (a model builds its nodes before reading them)
        self.layer: Layer = layer  # type: ignore[assignment]
        self.shape: BatchShape = shape  # type: ignore[assignment]
        self.parents = tuple(parents)
        self.dtype: np.dtype | None = None
        self.name = name if layer is None else layer.name

    @classmethod
    def from_layer(cls, layer: Layer, parents: Sequence[Node]) -> Node:
        for p in parents:
            if not isinstance(p, Node):
                raise TypeError(f"{type(layer).__name__} must be called on graph nodes, got {type(p).__name__}")
        if getattr(layer, "_called", False):
            raise ValueError(f"{type(layer).__name__} {layer.name or ''} is already used in a graph; "
                             "create a new layer instead (weights are not shared)")
        n = layer.n_inputs
        if n is not None and len(parents) != n:
            raise ValueError(f"{type(layer).__name__} takes {n} input(s), got {len(parents)}")
        if n is None and len(parents) < 2:
            raise ValueError(f"{type(layer).__name__} takes two or more inputs, got {len(parents)}")
        layer._called = True
        return cls(layer, parents)

    @property
    def kind(self) -> str | None:
        return "input" if self.layer is None else self.layer.kind

    def __repr__(self):
        return f"Node({self.layer.name if self.layer else self.name}, {self.shape})"


def Input(shape: Sequence[int], name: str | None = None) -> Node:
    """A model input of per-sample `shape` (e.g. (1, 28, 28)); the batch dimension is implicit."""
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise ValueError(f"Input shape must be a sequence of ints, got {shape!r}") from None
    if not dims or min(dims) <= 0:
        raise ValueError(f"Input shape must be positive sizes, got {tuple(shape)}")
    return Node(None, (), (None, *dims), name=name or "input")


def toposort(outputs: Iterable[Node]) -> list[Node]:
    """Every node that `outputs` depend on, each after its parents (inputs included)."""
    order, seen = [], set()
    for out in outputs:
        stack = [(out, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.append(node)
            elif id(node) not in seen:
                seen.add(id(node))
                stack.append((node, True))
                stack.extend((p, False) for p in reversed(node.parents) if id(p) not in seen)
    return order
