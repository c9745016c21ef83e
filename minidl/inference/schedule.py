"""Scheduling: the nodes of an inference-lowered model -> kernel calls, the same way on every device.

A `Step` is one kernel call standing for one or more nodes. Node outputs are values numbered
after the model inputs (node i gives value n_inputs + i). Where the device's `direct` kernel
family takes the shapes and the dtype (its DTYPES: float32):
- conv(+bias)(+ReLU) read only by a 2x2 stride-2 max-pool, stride 1 and small -> one direct
  kernel (cuDNN is slow at LeNet's shapes);
- a run of dense layers, each the only reader of the last -> one `mlp` call;
- add + ReLU -> one kernel;
- a whole model of conv-pool stages, a flatten and a dense chain (LeNet-5) -> ONE `chain`
  kernel at batch sizes up to CHAIN_MAX_BATCH (latency); the steps above beyond (throughput);
  the input preprocessing it keeps (layers.Normalize before a padded conv) runs first, or inside
  the chain kernel where the family declares X_AFFINE; a final Softmax it keeps (the model's
  probabilities) runs after it (`Step.kernels` counts the launches).
A rule fuses only nodes whose whole computation its call makes (tests/test_fusion_equivalence.py):
one input each (a residual conv reads two), an activation it applies (ReLU) or none, and values
inside the call read by the next node alone.
Everything else is the node's own layer in evaluation mode.
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Iterable

import numpy as np

if TYPE_CHECKING:
    from .._types import Array, DTypeLike, KernelFamily
    from ..backend import Device
    from ..graph.model import Model
    from ..layers.node import Node

CHAIN_MAX_BATCH = 256       # batch sizes up to this run a chain-shaped model (LeNet) as one kernel


class Step:
    """One kernel call: `run([input arrays]) -> output` for the values `inputs`, giving value `out`."""

    def __init__(self, name: str, kind: str, nodes: list[Node], inputs: Iterable[int], out: int,
                 run: Callable[[list[Array]], Any]) -> None:
        self.name, self.kind, self.nodes, self.inputs, self.out, self.run = \
            name, kind, nodes, list(inputs), out, run
        self.kernels = 1                    # kernel launches it stands for (a chain after a kept Normalize: 2)
        self.x_affine: tuple[Array, Array] | None = None   # a Normalize the direct family applies as it stages x

    def __repr__(self) -> str:
        return f"Step({self.kind}, {self.name!r})"


def _layer_step(node, inputs, out):
    layer = node.layer

    def run(xs):
        y = layer.forward(xs, False)
        layer.saved = None                  # nothing runs backward here: let the buffers go
        return y
    return Step(layer.name, node.kind, [node], inputs, out, run)


def _arrays(layer):
    return layer.w.data, (None if layer.b is None else layer.b.data)


def _takes_one(node):
    """A node of one input whose layer applies only what a direct kernel applies after its own map: a
    ReLU or nothing, no residual added (a residual conv reads two inputs), in NCHW memory."""
    layer = node.layer
    return (len(node.parents) == 1 and not getattr(layer, "residual", False)
            and getattr(layer, "activation", None) in (None, "relu") and not getattr(layer, "channels_last", False))


def _conv_pool_ok(dk, conv, pool):
    """A plain stride-1 conv (`_takes_one`: one input, ReLU or none) read only by a 2x2 stride-2 unpadded
    max-pool, of a size the direct kernel takes."""
    if conv.kind != "conv2d" or pool.kind != "pool" or not _takes_one(conv) or len(pool.parents) != 1:
        return False
    c, p = conv.layer, pool.layer
    return (c.stride == (1, 1) and c.dilation == (1, 1) and tuple(p.plan.ksize) == (2, 2)
            and tuple(p.plan.stride) == (2, 2) and not any(p.plan.pads)
            and dk.supported_conv(c.plan.in_shape[1:], c.w.shape, c.plan.pads, 2))


def value_ids(model: Model) -> dict[int, int]:
    """{id(node): value id}: the model inputs first (0 .. n_in-1), then node i's output is n_in + i."""
    vid = {id(n): i for i, n in enumerate(model.inputs)}
    vid.update({id(n): len(model.inputs) + i for i, n in enumerate(model.nodes)})
    return vid


def plan(model: Model, dk: KernelFamily | None) -> tuple[list[Step], Step | None]:
    """(steps at any batch size, the chain step for small batches or None) of an inference model.

    dk: the device's direct kernel family, or None to run one layer per step. A rule fuses nodes only
    where the fused call computes exactly what they do: each node reads only what the call gives it
    (one input, no residual), applies only what the call applies (ReLU or nothing), and every value
    inside the call is read by the next node alone (no other reader, not a model output).
    """
    nodes, n_in, vid = model.nodes, len(model.inputs), value_ids(model)
    outputs = {vid[id(o)] for o in model.outputs}
    ins = [[vid[id(p)] for p in n.parents] for n in nodes]
    readers = Counter(v for i in ins for v in i) + Counter(outputs)

    def sole(i):                             # node i's value is read once, by the next node, its one input
        v = n_in + i
        return readers[v] == 1 and v not in outputs and i + 1 < len(nodes) and ins[i + 1] == [v]

    def conv_pool(i):                        # nodes i (the conv) and i + 1 (its pool)
        return sole(i) and _conv_pool_ok(dk, nodes[i], nodes[i + 1])

    steps, i = [], 0
    while i < len(nodes):
        node = nodes[i]
        if dk is not None and dk.X_AFFINE and node.kind == "normalize" and len(node.parents) == 1 \
                and sole(i) and conv_pool(i + 1):          # normalised as the input is staged
            steps.append(_conv_pool_step(dk, nodes[i + 1], nodes[i + 2], ins[i], n_in + i + 2, node))
            i += 3
        elif dk is not None and conv_pool(i):
            steps.append(_conv_pool_step(dk, node, nodes[i + 1], ins[i], n_in + i + 1))
            i += 2
        elif dk is not None and node.kind == "dense" and _takes_one(node):
            j = i
            while j + 1 < len(nodes) and nodes[j + 1].kind == "dense" and _takes_one(nodes[j + 1]) and sole(j):
                j += 1
            steps.append(_mlp_step(dk, nodes[i:j + 1], ins[i], n_in + j))
            i = j + 1
        elif dk is not None and node.kind == "add" and node.layer.activation == "relu":
            steps.append(Step(node.layer.name, "add_relu", [node], ins[i], n_in + i, dk.add_relu_fprop))
            i += 1
        else:
            steps.append(_layer_step(node, ins[i], n_in + i))
            i += 1
    chain = _chain_step(dk, model, steps, outputs) if dk is not None else None
    return steps, chain


def _x_affine(pre):
    """The (a, b) of a kept Normalize node, y = a x + b per channel (its `affine`), as host float32 arrays:
    constants of the call, which a GPU family copies to the device once (a captured call copies nothing)."""
    return tuple(np.asarray(v, np.float32) for v in pre.layer.affine(pre.shape[1]))


def _conv_pool_step(dk, conv, pool, inputs, out, pre=None):
    """conv + pool as one direct call; after a Normalize `pre`, which the family applies as it stages
    its input (X_AFFINE: its zero padding stays zero, as the padding of the normalised input)."""
    layer = conv.layer
    w, b = _arrays(layer)
    pads, relu = tuple(layer.plan.pads), layer.activation == "relu"
    name = f"{layer.name}+{pool.layer.name}"
    if pre is None:
        return Step(name, "conv_pool", [conv, pool], inputs, out,
                    lambda xs: dk.conv2d_bias_relu_maxpool2x2_fprop(xs[0], w, b, pads, relu))
    ab = _x_affine(pre)
    step = Step(f"{pre.layer.name}+{name}", "conv_pool", [pre, conv, pool], inputs, out,
                lambda xs: dk.conv2d_bias_relu_maxpool2x2_fprop(xs[0], w, b, pads, relu, x_affine=ab))
    step.x_affine = ab
    return step


def _mlp_step(dk, nodes, inputs, out):
    ws, bs = zip(*[_arrays(n.layer) for n in nodes])
    relus = [n.layer.activation == "relu" for n in nodes]
    name = nodes[0].layer.name if len(nodes) == 1 else f"{nodes[0].layer.name}..{nodes[-1].layer.name}"
    return Step(name, "mlp", nodes, inputs, out, lambda xs: dk.mlp_fprop(xs[0], list(ws), list(bs), relus))


def _chain_step(dk, model, steps, outputs):
    """The whole model as one chain kernel call, if it is conv-pool stages, a flatten, a dense chain,
    after the input preprocessing where the model keeps it (a padded first conv: not folded), and before
    a final Softmax where the model keeps it (the probabilities it outputs: one kernel more). A
    family that declares X_AFFINE takes the preprocessing as `x_affine=(a, b)`, applied as it stages the
    input (its zero padding stays zero: the first conv_pool step carries it), so the chain stays one kernel;
    else it runs first, one elementwise kernel (the step's `kernels`: 2)."""
    if len(model.inputs) != 1 or len(outputs) != 1 or not steps:
        return None
    pre = post = None
    if steps[0].kind == "normalize" and steps[0].inputs == [0] and len(steps) > 1:
        pre, steps = steps[0], steps[1:]
    if steps[-1].kind == "softmax" and len(steps) > 1 and steps[-1].inputs == [steps[-2].out]:
        post, steps = steps[-1], steps[:-1]
    end = post.out if post is not None else steps[-1].out
    stages, prev = [], 0 if pre is None else pre.out
    for j, st in enumerate(steps):
        last = j == len(steps) - 1
        if st.inputs != [prev] or (last and end not in outputs):
            return None
        dense_seen = any(s[0] == "dense" for s in stages)
        if st.kind == "conv_pool" and not dense_seen and (j == 0 or st.x_affine is None):
            layer = st.nodes[-2].layer                  # the conv (after a Normalize the family stages)
            stages.append(("conv", *_arrays(layer), tuple(layer.plan.pads), 2, layer.activation == "relu"))
        elif st.kind == "flatten" and not dense_seen:
            pass
        elif st.kind == "mlp" and last:
            stages += [("dense", *_arrays(n.layer), n.layer.activation == "relu") for n in st.nodes]
        else:
            return None
        prev = st.out
    if not dk.supported_chain(model.inputs[0].shape[1:], stages):
        return None
    nodes = [n for st in ([pre] if pre else []) + steps + ([post] if post else []) for n in st.nodes]
    name = f"{nodes[0].layer.name}..{nodes[-1].layer.name}"
    ab = steps[0].x_affine
    if ab is not None:
        def chain(xs):
            return dk.chain_fprop(xs[0], stages, x_affine=ab)
    elif pre is None:
        def chain(xs):
            return dk.chain_fprop(xs[0], stages)
    else:
        def chain(xs):
            return dk.chain_fprop(pre.run(xs), stages)
    run = chain if post is None else (lambda xs: post.run([chain(xs)]))
    step = Step(name, "chain", nodes, [0], end, run)
    step.kernels = 1 + (pre is not None and ab is None) + (post is not None)
    return step


def direct_family(device: Device, dtype: DTypeLike | None = None) -> KernelFamily | None:
    """The device's direct kernel family where it computes in `dtype` (default: the device's; the
    family's DTYPES: float32), else None."""
    family = device.kernels.direct if device.has("direct") else None
    dtype = np.dtype(dtype or device.dtype)
    return family if family is not None and dtype.name in getattr(family, "DTYPES", (dtype.name,)) else None
