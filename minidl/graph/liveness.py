"""When a training step lets go of a value: liveness over the static graph.

Forward: a node's output is read by the nodes after it; once the last of them has run, the model
drops its reference (never an output's). What a layer's backward needs it keeps in `saved`, which
only its own backward reads: the model drops that right after it. Memory then goes to what comes
later, as Caffe and MXNet share buffers: eagerly CuPy's pool hands it on; a captured step is traced
with these deaths and planned (kernels/gpu/planned_memory.py), so the gradients of backward reuse the
activations of forward at addresses fixed once.

`last_reads` is the one count of when a value is read for the last time: Model.forward and the compiled
model (inference/model.py) both drop by it. Model.backward calls `release_saved` (and, overwriting
gradients, `zero_unreached`) as each layer is done.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Iterable, Sequence

if TYPE_CHECKING:
    from ..layers.base import Layer
    from ..layers.node import Node


def last_reads(steps: Sequence[tuple[Iterable[int], int]], keep: Collection[int]) -> list[list[int]]:
    """For steps [(the ids of the values it reads, the id of the value it writes)] in the order they run:
    for each step, the ids of the values it is the last to touch, read or written (a value no later step
    reads), but none in `keep` (the outputs, and the caller's arrays).

    Model.forward drops them after each node (its steps: `steps_of(nodes)`), and a compiled model after
    each kernel call (inference/model.py), so the memory pool hands that memory to later steps.
    """
    last = {}
    for k, (reads, writes) in enumerate(steps):
        last[writes] = k               # a value no one reads dies where it is made
        for v in reads:
            last[v] = k
    deaths: list[list[int]] = [[] for _ in steps]
    for v, k in last.items():
        if v not in keep:
            deaths[k].append(v)
    return deaths


def steps_of(nodes: Iterable[Node]) -> list[tuple[list[int], int]]:
    """A model's nodes as `last_reads` steps: the ids of each node's parents, and its own id."""
    return [([id(p) for p in node.parents], id(node)) for node in nodes]


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
