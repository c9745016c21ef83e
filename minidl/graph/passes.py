"""Passes: Graph -> Graph rewrites, each asking the layers what they declare (never their class).

Training and inference are two lowerings of one model graph:
    training(graph)                 the input preprocessing dropped (the Loader applies it to the whole
                                    set once), the final Softmax dropped (the loss reads logits), a
                                    ReLU fused into the BN or Add before it (one kernel instead of
                                    two), else moved after the max-pool reading it (on 4x fewer values)
    inference(graph, probabilities) dropout removed, zero pads, BN and the input preprocessing folded
                                    into the convs (the last where exact), every fusable ReLU fused,
                                    a residual Add (and its ReLU) fused into the conv it reads, the
                                    final Softmax dropped unless asked for
A precision policy is one more pass after either pipeline: `cast(graph, compute)`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Sequence

import numpy as np

from .. import precision
from .._types import DTypeLike
from ..layers.cast import Cast          # the one layer the graph itself inserts
from ..layers.node import Node

if TYPE_CHECKING:
    from ..backend import Device
    from .ir import Graph


def drop_inference_identities(g: Graph) -> Graph:
    """Remove layers that are the identity in evaluation (dropout)."""
    for node in [n for n in g.nodes if n.layer.inference_identity]:
        g.bypass(node, f"{node.kind}_removed")
    return g


def drop_final_softmax(g: Graph) -> Graph:
    """A Softmax that is a model output read by nobody else goes: the model then outputs logits."""
    for node in [o for o in g.outputs if o.kind == "softmax" and not g.readers(o)]:
        g.bypass(node, "softmax_removed")
    return g


def _plain(node: Node) -> bool:
    """A node of one input whose layer applies nothing after its own map (no activation, no residual
    added): what a layer folded into it, or a residual joining it, may be composed with exactly."""
    return len(node.parents) == 1 and getattr(node.layer, "activation", None) is None


def fold_into_producers(g: Graph) -> Graph:
    """A layer that folds into the layer before it (BN into a conv) does, where it is that layer's only
    reader and that layer is `_plain` (BN after a conv's own ReLU is not BN of the conv)."""
    for node in list(g.nodes):
        src = node.parents[0]
        if src.layer is None or g.sole_reader(src) is not node or not _plain(src):
            continue
        folded = node.layer.fold_into_producer(src.layer, g.weights)
        if folded is not None:
            layer, weights = folded
            g.replace(src, layer, weights)
            g.bypass(node, f"{node.kind}_folded")
    return g


def fold_into_consumers(g: Graph) -> Graph:
    """A layer that folds into the layer reading it (a zero pad into a conv's padding) does."""
    for node in list(g.nodes):
        reader = g.sole_reader(node)
        if reader is None or reader.parents[0] is not node:        # a residual is no input to pad
            continue
        layer = node.layer.fold_into_consumer(reader.layer, node.parents[0].shape[1:])
        if layer is not None:
            g.replace(reader, layer)
            g.bypass(node, f"{node.kind}_folded")
    return g


def _preprocessing(g: Graph) -> list[Node]:
    """The nodes that declare `takes_images` (layers.Normalize) and read a model input directly."""
    inputs = {id(n) for n in g.inputs}
    return [n for n in g.nodes if getattr(n.layer, "takes_images", False)
            and all(id(p) in inputs for p in n.parents)]


def drop_preprocessing(g: Graph) -> Graph:
    """The input preprocessing goes from a training graph: the data Loader has applied it to the whole
    set on the device once (data.loader.normalization(model)), so a step runs no kernel for it."""
    for node in _preprocessing(g):
        g.bypass(node, f"{node.kind}_by_loader")
    return g


def fold_preprocessing(g: Graph) -> Graph:
    """The input preprocessing y = a x + b (per channel, the layer's `affine`) folds into the conv that
    is its only reader where that is exact, a conv without padding (zero padding of y is not zero
    padding of x): w' = w a (per input channel), b' = b + sum over c, kH, kW of w b. Elsewhere it stays,
    one elementwise kernel."""
    for node in _preprocessing(g):
        reader = g.sole_reader(node)
        if reader is None or reader.kind != "conv2d" or tuple(reader.parents) != (node,):
            continue
        conv, in_shape = reader.layer, node.shape[1:]
        if any(conv.pads(in_shape)):  # type: ignore[attr-defined]  # a Conv2D (its kind)
            continue
        a, b = node.layer.affine(in_shape[0])  # type: ignore[attr-defined]  # declared with takes_images
        w = g.weights[f"{conv.name}/w"]                                         # (K, C, kH, kW)
        bias = g.weights.get(f"{conv.name}/b", np.zeros(w.shape[0]))
        g.replace(reader, conv.clone(bias=True), {"w": w * a[None, :, None, None],
                                                  "b": bias + np.einsum("kcij,c->k", w, b)})
        g.bypass(node, f"{node.kind}_folded")
    return g


def fuse_activations(g: Graph, into: Collection[str] | None = None) -> Graph:
    """A fusable activation read from a layer that can apply it (and has none yet) joins that layer.

    into: the producer kinds allowed (None: any that declares the activation).
    """
    for node in list(g.nodes):
        act, src = node.layer.fusable_activation, node.parents[0]
        if act is None or src.layer is None or g.sole_reader(src) is not node:
            continue
        if act in src.layer.activations and src.layer.activation is None and (into is None or src.kind in into):
            g.replace(src, src.layer.clone(share_params=True, activation=act))
            g.bypass(node, f"{act}_fused")
    return g


def fuse_residual_adds(g: Graph) -> Graph:
    """An Add of two values, the first of which a layer taking a residual (`takes_residual`: a 1x1 conv of
    stride 1, with no activation of its own) and read by this Add alone, becomes that layer with the other
    value as its residual and the Add's activation: act(conv(x) + b + z), which the GPU computes in the
    GEMM's epilogue (a ResNet bottleneck's shortcut add and ReLU: one kernel fewer each, two passes over
    memory fewer)."""
    for node in list(g.nodes):
        if node.kind != "add" or len(node.parents) != 2:
            continue
        for i, src in enumerate(node.parents):
            layer = src.layer
            if layer is None or not layer.takes_residual or not _plain(src) or g.sole_reader(src) is not node:
                continue
            other = node.parents[1 - i]
            fused = layer.clone(share_params=True, residual=True, activation=node.layer.activation)
            g.replace(node, fused)
            node.parents, node.name = (src.parents[0], other), fused.name
            g.stats["add_fused"] += 1
            g.reorder()
            break
    return g


def sink_activations(g: Graph) -> Graph:
    """A fusable activation whose sole reader commutes with it (`commutes_with`) moves after that
    reader: a ReLU before a 2x2 max-pool then runs forward and backward on 4x fewer values."""
    for node in list(g.nodes):
        act, reader = node.layer.fusable_activation, g.sole_reader(node)
        if act is not None and reader is not None and act in reader.layer.commutes_with:
            g.swap(node, reader, f"{act}_sunk")
    return g


def channels_last(g: Graph) -> Graph:
    """Layout pass: every layer that can (`layouts`: the convolutions) writes its output channels-last,
    N, H, W, C in memory under the NCHW shape, the order of the GPU's tensor-core convolutions. The
    layers after it (BN, pooling, padding, adds, activations) keep their input's order, and whatever
    reads a 4-D value as 2-D (a Flatten) reads it in NCHW order, so shapes, weights and the model's
    inputs and outputs are what they were: only memory order differs inside."""
    for node in list(g.nodes):
        if "channels_last" in node.layer.layouts and not node.layer.channels_last:
            g.replace(node, node.layer.clone(share_params=True, channels_last=True))
            g.stats["channels_last"] += 1
    return g


# The training kernels of BN and Add apply a ReLU in the same pass over memory; a conv or dense
# layer would only add a separate ReLU kernel, so training fuses into these two only.
TRAINING_FUSION = ("batchnorm", "add")


def training(g: Graph) -> Graph:
    g = drop_final_softmax(drop_preprocessing(g))
    return sink_activations(fuse_activations(g, into=TRAINING_FUSION))


def inference(g: Graph, probabilities: bool = False) -> Graph:
    g = drop_inference_identities(g)
    if not probabilities:
        g = drop_final_softmax(g)
    return fuse_residual_adds(fuse_activations(fold_preprocessing(fold_into_producers(fold_into_consumers(g)))))


def cast(g: Graph, compute: DTypeLike, base: DTypeLike = "float32") -> Graph:
    """Precision pass: every layer computes in `compute` except those that keep float32 (declared
    `keeps_fp32`: BN, softmax, LRN); a Cast converts a value where it crosses between the two, once
    per value and dtype. A float32 layer that reads and writes the compute dtype itself
    (`io_in_compute_dtype`: BN, whose kernels round what they write) stays between compute-dtype
    layers with no Cast. Inputs and outputs stay in `base` (the loss reads float32 logits).

    A layer moved to `compute` gets a clone with parameters of its own: in a training lowering
    they become compute-dtype copies of the master's (graph/arena.py); in an inference graph the
    weights, looked up by name, are rounded to `compute` when the model is built.
    """
    compute, base = np.dtype(compute), np.dtype(base)
    if compute == base:
        return g
    dtype, casts = {id(n): base for n in g.inputs}, {}

    def as_dtype(node, want):
        if dtype[id(node)] == want:
            return node
        key = (id(node), want)
        if key not in casts:
            casts[key] = Node(Cast(want.name), (node,), node.shape)
            dtype[id(casts[key])] = want
            g.stats[f"cast_to_{want.name}"] += 1
        return casts[key]

    for node in list(g.nodes):
        if node.layer.keeps_fp32 and node.layer.io_in_compute_dtype:     # float32 inside, no casts around
            dtype[id(node)] = dtype[id(node.parents[0])]
            continue
        want = base if node.layer.keeps_fp32 else compute
        node.parents = tuple(as_dtype(p, want) for p in node.parents)
        if want != base:
            g.replace(node, node.layer.clone())
        dtype[id(node)] = want
    g.outputs = [as_dtype(o, base) for o in g.outputs]
    g.reorder()
    return g


def macs_per_image(nodes: Sequence[Node]) -> float:
    """Multiply-adds of one image through the convolutions and dense layers among `nodes` (a model's or a
    graph's; K oH oW C kH kW for a conv, out x in for a dense layer): what the device weighs when it
    decides whether half precision and channels-last pay for a model (Device.half_pays, .channels_last)."""
    total = 0.0
    for node in nodes:
        if node.kind in ("conv2d", "dense"):
            kH, kW = getattr(node.layer, "ksize", (1, 1))
            total += float(np.prod(node.shape[1:])) * node.parents[0].shape[1] * kH * kW
    return total


def precision_and_layout(nodes: Sequence[Node], device: Device, policy: precision.Policy,
                         channels_last: bool | None) -> tuple[precision.Policy, bool]:
    """(the policy a model of these nodes runs under on `device`, whether its convolutions go
    channels-last): both decided by the device from the model's multiply-adds an image, so the
    training and the inference lowering decide alike (precision.where_it_pays, Device.channels_last)."""
    macs = macs_per_image(nodes)
    runs = precision.where_it_pays(policy, device.half_pays(macs))
    return runs, device.channels_last(runs.compute, channels_last, macs)
