"""When a training step lets go of a value: liveness over the static graph.

Forward: a node's output is read by the nodes after it; once the last of them has run, the model
drops its reference (never an output's). What a layer's backward needs it keeps in `saved`, which
only its own backward reads: the model drops that right after it. Memory then goes to what comes
later, as Caffe and MXNet share buffers: eagerly CuPy's pool hands it on; a captured step is traced
with these deaths and planned (kernels/gpu/planned_memory.py), so the gradients of backward reuse the
activations of forward at addresses fixed once.

Model.backward calls `release_saved` (and, overwriting gradients, `zero_unreached`) as each layer is done.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

if TYPE_CHECKING:
    from ..layers.base import Layer
    from ..layers.node import Node


def forward_deaths(nodes: Sequence[Node], outputs: Iterable[Node]) -> list[list[int]]:
    """For each node k, in order: the ids of the values whose last reader is node k (inputs and
    outputs of nodes; an output of the model never)."""
    last = {}
    for k, node in enumerate(nodes):
        for p in node.parents:
            last[id(p)] = k
    keep = {id(o) for o in outputs}
    deaths: list[list[int]] = [[] for _ in nodes]
    for v, k in last.items():
        if v not in keep:
            deaths[k].append(v)
    return deaths


def release_saved(layer: Layer, reached: bool) -> None:
    """Backward is done with `layer`: what its forward saved is read by no one else, so it goes."""
    layer.saved = None


def zero_unreached(layer: Layer, reached: bool) -> None:
    """An overwriting backward (accumulate=False) that never reached `layer` (it leads to no output)
    leaves its gradients zero, as zero_grad would have, instead of last step's."""
    if not reached:
        for p in layer.params.values():
            if p.grad is not None:
                p.grad.fill(0)
