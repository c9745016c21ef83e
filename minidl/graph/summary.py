"""A model's summary table: layer, output shape and parameter count, one row per layer, and the totals."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from ..layers.base import _fmt

if TYPE_CHECKING:
    from ..layers.base import Parameter
    from ..layers.node import Node


def print_summary(nodes: Sequence[Node], params: Mapping[str, Parameter], print_fn: Callable[[str], object] = print
                  ) -> None:
    """Model.summary() of a model of these nodes and parameters, one print_fn call a line."""
    rows = [("layer (type)", "output shape", "params")]
    for node in nodes:
        n = sum(p.size for p in node.layer.params.values() if p.weight)
        rows.append((f"{node.layer.name} ({type(node.layer).__name__})", _fmt(node.shape), f"{n:,}"))
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    line = "-" * (w[0] + w[1] + w[2] + 4)
    print_fn(line)
    for i, r in enumerate(rows):
        print_fn(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}")
        if i == 0:
            print_fn(line)
    print_fn(line)
    trainable = sum(p.size for p in params.values() if p.trainable)
    frozen = sum(p.size for p in params.values() if not p.trainable)     # state and frozen weights
    print_fn(f"total params: {trainable:,} trainable, {frozen:,} non-trainable")
