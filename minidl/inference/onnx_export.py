"""ONNX export of the inference graph: the model lowered by the shared inference passes, one ONNX
node (or two, with a fused ReLU) per minidl node, read from node kinds and layer attributes.

    proto = to_onnx(model)              # onnx.ModelProto, opset 17, batch dimension "N"
    onnx.save(proto, "model.onnx")

The graph is the one minidl.inference.compile runs: Graph.of(model, weights) through
minidl.graph.passes.inference (dropout removed, zero pads and BN folded into the convs, ReLUs
fused, the final Softmax dropped unless probabilities=True), built on the CPU in float32 so that
every layer's plan (pads, windows, strides) is decided. Its outputs are Model.predict's: the final
Softmax is kept (probabilities=False drops it: logits).

Inputs are what minidl's entry points take (docs/input.md): float32 images in [0, 1]; `uint8=True`
makes the input uint8 in [0, 255], followed by a Cast and a Div by 255. A model that carries its
preprocessing (layers.Normalize) exports a graph that starts with it, a Sub and a Div (or, where the
inference passes folded it into the first conv, that conv's weights); a model without one reads the
[0, 1] images as they are, as it was trained.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from .. import files, inference

if TYPE_CHECKING:
    import onnx

    from ..graph.model import Model

OPSET = 17
BATCH = "N"          # the dynamic batch dimension's name
# the node kinds exported by the _Emitter method of their name: the layers whose export reads what the
# inference passes decided (plans, folds, fused activations). Every other layer writes itself through its
# `onnx(builder, ins, out, weights)` method: the activations (layers/activation.py) and a user's layers.
KINDS = ("normalize", "conv2d", "dense", "pool", "avgpool", "gap", "flatten", "add", "batchnorm", "pad", "lrn",
         "softmax")


def lower(model: Model, probabilities: bool = True) -> Model:
    """The inference lowering of `model`, as minidl.inference.compile makes it, on the CPU in float32."""
    return inference.lower(model, "cpu", probabilities)[0]


def _onnx_pads(top, bottom, left, right):
    return [top, left, bottom, right]              # ONNX: all begins (H, W), then all ends


def _value_name(layer: str, n_in: int, n_out: int) -> str:
    """The ONNX name of a layer's output: its name with '%' and '/' escaped (%25, %2F), so that no layer's
    output is another's weight or step ('{name}/w', '{name}/pre_relu': layers 'd' and 'd/w'), and the
    graph's own input and output names escaped too (a layer named 'output'), one name per value (SSA)."""
    name = layer.replace("%", "%25").replace("/", "%2F")
    graph = {"input", "output"} if n_in == n_out == 1 else {*(f"input_{i}" for i in range(n_in)),
                                                              *(f"output_{i}" for i in range(n_out)), "input", "output"}
    return f"%{ord(name[0]):02X}{name[1:]}" if name in graph else name


class _Emitter:
    """Collects ONNX nodes and initializers; one method per kind of KINDS. A layer of another kind is
    handed it as `builder`, of which it calls `op(op_type, ins, out, **attrs)` and `const(name, array)`."""

    def __init__(self, helper, numpy_helper):
        self.h, self.nh = helper, numpy_helper
        self.nodes, self.inits = [], []

    def const(self, name, array):
        self.inits.append(self.nh.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type, ins, out, **attrs):
        self.nodes.append(self.h.make_node(op_type, ins, [out], name=out, **attrs))
        return out

    def with_activation(self, layer, op_type, ins, out, **attrs):
        """op, then a Relu where the layer applies one itself (fused by the inference passes)."""
        if not getattr(layer, "activation", None):
            return self.op(op_type, ins, out, **attrs)
        self.op(op_type, ins, out + "/pre_relu", **attrs)
        return self.op("Relu", [out + "/pre_relu"], out)

    # -- one method per kind: (node, input names, output name, the layer's weights) ---------------
    def normalize(self, node, ins, out, w):
        C, rank = node.shape[1], len(node.shape)
        shape = (1, C) + (1,) * (rank - 2)                  # per channel, broadcast over (N, C, ...)
        mean, std = (np.broadcast_to(np.array(v, np.float32), (C,)).reshape(shape)
                     for v in (node.layer.mean, node.layer.std))
        self.op("Sub", ins + [self.const(f"{out}/mean", mean)], out + "/centred")
        return self.op("Div", [out + "/centred", self.const(f"{out}/std", std)], out)

    def conv2d(self, node, ins, out, w):
        layer, plan = node.layer, node.layer.plan
        args = [self.const(f"{out}/w", w["w"])] + ([self.const(f"{out}/b", w["b"])] if "b" in w else [])
        attrs = dict(kernel_shape=list(layer.ksize), strides=list(plan.stride), dilations=list(plan.dilation),
                     pads=_onnx_pads(*plan.pads))
        if not layer.residual:
            return self.with_activation(layer, "Conv", ins + args, out, **attrs)
        self.op("Conv", ins[:1] + args, out + "/conv", **attrs)          # a residual conv: + z, then its ReLU
        return self.with_activation(layer, "Add", [out + "/conv", ins[1]], out)

    def dense(self, node, ins, out, w):
        K = node.layer.K
        b = w["b"] if "b" in w else np.zeros(K, np.float32)
        args = [self.const(f"{out}/w", w["w"]), self.const(f"{out}/b", b)]
        return self.with_activation(node.layer, "Gemm", ins + args, out, transB=1)

    def _pool(self, op_type, node, ins, out, **extra):
        plan = node.layer.plan
        return self.op(op_type, ins, out, kernel_shape=list(plan.ksize), strides=list(plan.stride),
                       pads=_onnx_pads(*plan.pads), **extra)

    def pool(self, node, ins, out, w):
        return self._pool("MaxPool", node, ins, out)

    def avgpool(self, node, ins, out, w):
        return self._pool("AveragePool", node, ins, out, count_include_pad=1)

    def gap(self, node, ins, out, w):
        return self.op("GlobalAveragePool", ins, out)

    def flatten(self, node, ins, out, w):
        return self.op("Flatten", ins, out, axis=1)

    def add(self, node, ins, out, w):
        return self.with_activation(node.layer, "Add" if len(ins) == 2 else "Sum", ins, out)

    def batchnorm(self, node, ins, out, w):
        args = [self.const(f"{out}/{k}", w[k]) for k in ("gamma", "beta", "running_mean", "running_var")]
        return self.with_activation(node.layer, "BatchNormalization", ins + args, out, epsilon=node.layer.eps)

    def pad(self, node, ins, out, w):
        top, bottom, left, right = node.layer.pads
        pads = self.const(f"{out}/pads", np.array([0, 0, top, left, 0, 0, bottom, right], np.int64))
        value = self.const(f"{out}/value", np.array(node.layer.value, np.float32))
        return self.op("Pad", ins + [pads, value], out, mode="constant")

    def lrn(self, node, ins, out, w):
        # minidl's window and alpha/size scaling are ONNX's (and cuDNN's): the same four numbers. ONNX
        # defines an even size as minidl does (floor((size-1)/2) channels behind, ceil((size-1)/2) ahead),
        # but onnxruntime takes odd sizes only: an even one is written out as its definition
        size, alpha, beta, k = node.layer.hyper()
        if size % 2:
            return self.op("LRN", ins, out, size=size, alpha=alpha, beta=beta, bias=k)
        return self._lrn_ops(node.shape[1], size, alpha, beta, k, ins[0], out)

    def _lrn_ops(self, C, size, alpha, beta, k, x, out):
        """y = x / (k + alpha/size * sum of x^2 over the window)^beta in plain ops: the window's sum is a
        1x1 Conv whose (C, C) weights are 1 inside each channel's window (clipped at the edges), else 0."""
        behind, ahead = (size - 1) // 2, size // 2
        window = np.zeros((C, C, 1, 1), np.float32)                       # (out channel, in channel, 1, 1)
        for c in range(C):
            window[c, max(0, c - behind):min(C, c + ahead + 1)] = 1.0
        sq = self.op("Mul", [x, x], out + "/square")
        total = self.op("Conv", [sq, self.const(f"{out}/window", window)], out + "/window_sum", kernel_shape=[1, 1])
        scaled = self.op("Mul", [total, self.const(f"{out}/alpha", np.array(alpha / size, np.float32))],
                         out + "/scaled")
        base = self.op("Add", [scaled, self.const(f"{out}/k", np.array(k, np.float32))], out + "/base")
        denom = self.op("Pow", [base, self.const(f"{out}/beta", np.array(beta, np.float32))], out + "/denom")
        return self.op("Div", [x, denom], out)

    def softmax(self, node, ins, out, w):
        return self.op("Softmax", ins, out, axis=1)


def to_onnx(model: Model, probabilities: bool | None = None, uint8: bool = False) -> onnx.ModelProto:
    """An onnx.ModelProto of `model`'s inference graph (float32, opset 17, dynamic batch), whose outputs
    are Model.predict's for the same images.

    probabilities: None or True keep a final Softmax; False drops it (logits).
    uint8: the input is uint8 images in [0, 255] (a Cast and a Div by 255 first), else floats in [0, 1].
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    lowered = lower(model, probabilities is not False)
    weights = lowered.get_weights()
    emit = _Emitter(helper, numpy_helper)
    names = {}
    graph_inputs = []
    for i, node in enumerate(lowered.inputs):
        names[id(node)] = "input" if len(lowered.inputs) == 1 else f"input_{i}"
        graph_inputs.append(helper.make_tensor_value_info(names[id(node)], TensorProto.UINT8 if uint8
                                                          else TensorProto.FLOAT, [BATCH, *node.shape[1:]]))
        if uint8:                    # the contract's uint8: / 255 in float32, as minidl's entry points divide
            cast = emit.op("Cast", [names[id(node)]], names[id(node)] + "/float", to=TensorProto.FLOAT)
            names[id(node)] = emit.op("Div", [cast, emit.const(f"{names[id(node)]}/255", np.array(255, np.float32))],
                                      names[id(node)] + "/unit")
    for node in lowered.nodes:
        # any other kind: the layer's onnx(builder, ins, out, weights) writes it (docs/custom-layers.md)
        own = None if node.kind in KINDS else getattr(node.layer, "onnx", None)
        if node.kind not in KINDS and not callable(own):
            raise ValueError(f"{model.name}: layer {node.layer.name} of kind {node.kind!r} has no ONNX mapping "
                             f"(a layer of your own gives one with an onnx(builder, ins, out, weights) method)")
        w = {k.rpartition("/")[2]: v for k, v in weights.items() if k.rpartition("/")[0] == node.layer.name}
        ins = [names[id(p)] for p in node.parents]
        out = _value_name(node.layer.name, len(lowered.inputs), len(lowered.outputs))
        names[id(node)] = own(emit, ins, out, w) if own else getattr(emit, str(node.kind))(node, ins, out, w)
    outputs = []
    for i, node in enumerate(lowered.outputs):
        name = "output" if len(lowered.outputs) == 1 else f"output_{i}"
        emit.op("Identity", [names[id(node)]], name)
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [BATCH, *node.shape[1:]]))
    graph = helper.make_graph(emit.nodes, lowered.name, graph_inputs, outputs, emit.inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="minidl")
    proto.ir_version = min(proto.ir_version, 8)       # IR 8 with opset 17: readable by older runtimes too
    onnx.checker.check_model(proto, full_check=True)
    return proto


def save_onnx(path: str | os.PathLike, model: Model, probabilities: bool | None = None,
              uint8: bool = False) -> str | os.PathLike:
    """Write `model`'s inference graph to `path` as ONNX through minidl.files' writer (temp file,
    fsync, rename: a full disk leaves the previous file whole); returns the path."""
    data = to_onnx(model, probabilities, uint8).SerializeToString()
    return files.write_atomic(path, lambda f: f.write(data), kind_written="onnx")     # files.kinds: never another kind
