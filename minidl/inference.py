"""Optimised inference: a trained Model lowered to a flat list of ops, replayed through CUDA graphs.

    m = minidl.inference.compile(model)            # or compile("checkpoints/lenet5.npz", device="cuda")
    y = m.predict(x)                               # logits (probabilities=True keeps the Softmax)
    m.save("lenet5.artifact.npz"); m = minidl.inference.load("lenet5.artifact.npz")

`compile` walks the model's graph in topological order and rewrites it for evaluation:
- BatchNorm2D right after a Conv2D whose output feeds only it is folded into the conv, with the
  running statistics: w' = γ w / √(σ² + ε),  b' = γ (b − μ) / √(σ² + ε) + β  (b = 0 without bias);
- a ReLU is fused into the conv, dense or add it follows when it is that output's sole consumer
  (on the GPU a conv+bias+ReLU runs as one cuDNN graph when the conv kernels offer one);
- a zero Pad2D feeding only a conv becomes that conv's padding (ResNet's strided convs);
- Dropout is removed; a final Softmax is removed unless probabilities=True (logits come out);
- everything else (standalone BN, pooling, Add, Flatten, LRN, Pad2D, activations) runs on the
  device kernels, as in the model.
Weights only, in float32 by default.

The op list (what an artifact stores) is then scheduled into kernel calls, the same way on both
devices (`InferenceModel.schedule(N)`; `direct=False` runs one call per op):
- conv(+bias)(+ReLU) followed by a 2x2 stride-2 MaxPool2D, stride 1 and small -> one direct kernel
  (minidl.kernels.<dev>.direct.conv2d_bias_relu_maxpool2x2_fprop; cuDNN is slow at LeNet's shapes);
- a run of dense ops, each the sole reader of the last -> one `mlp` call (one kernel at small N,
  else a cuBLAS GEMM and one bias+ReLU kernel a layer);
- add + ReLU -> one kernel;
- a whole model of the form conv-pool stages, flatten, dense chain (LeNet-5) -> ONE `chain`
  kernel at batch sizes up to CHAIN_MAX_BATCH (latency), the steps above beyond (throughput).
On the CPU the direct kernels are compositions of the reference kernels (the GPU's reference).

On cuda, `predict` keeps one fixed input buffer and one CUDA graph per batch size (captured at
first use with minidl.cudagraph.CapturedCall, and its first replay checked against eager
execution); a call copies x into the buffer and launches the graph. Given the input buffer itself
(`input_buffer(N)`), predict is one dict lookup and the graph launch. The array it returns is the
graph's output buffer: valid until the next call at that batch size (copy it to keep it). On
the CPU, predict returns fresh arrays.
"""
import importlib
import inspect
import os
import time
from collections import Counter, defaultdict, namedtuple

import numpy as np

from .backend import get_device
from .checkpoint import read_npz, write_npz
from .kernels.cpu.conv import ConvPlan, out_size
from .kernels.cpu.pool import pool2d_plan

FORMAT = "minidl-artifact-1"
GRAPH_CHECK_RTOL = 1e-4     # replay vs eager: the same kernels, so only nondeterministic sums differ
CHAIN_MAX_BATCH = 256       # batch sizes up to this run a chain-shaped model (LeNet) as one kernel (H100: faster to 256)
OpTime = namedtuple("OpTime", "name kind shape ms")


class ArtifactError(ValueError):
    """An inference artifact is missing, corrupt, or not a minidl artifact; the message names the file."""


class Op:
    """One step: `kind` applied to the values `inputs` (ids: model inputs first, then op i's output
    is value n_inputs + i), with hyper-parameters `attrs` and host weights `params`."""

    def __init__(self, kind, name, inputs, attrs=None, params=None):
        self.kind, self.name, self.inputs = kind, name, [int(v) for v in inputs]
        self.attrs, self.params = dict(attrs or {}), dict(params or {})
        self.shape = None       # per-sample output shape, from shape inference
        self.plan = None        # conv or pool plan (shape arithmetic, the same on both devices)
        self.arrays = {}        # params on the device

    def copy(self):
        """The same op without plans or device arrays (an InferenceModel binds its own)."""
        return Op(self.kind, self.name, self.inputs, self.attrs, self.params)

    def spec(self):
        return {"kind": self.kind, "name": self.name, "inputs": self.inputs, "attrs": self.attrs,
                "params": sorted(self.params), "shape": list(self.shape)}

    def __repr__(self):
        return f"Op({self.kind}, {self.name!r}, inputs={self.inputs}, shape={self.shape})"


# -- shape inference: per-sample shapes in, per-sample shape out; sets op.plan ----------------------
def _one(op, shapes, rank=None):
    """The single input's per-sample shape, checked for rank."""
    if len(shapes) != 1 or (rank is not None and len(shapes[0]) != rank):
        raise ValueError(f"op {op.name} ({op.kind}) takes one {rank or 'any'}-D input, got {shapes}")
    return tuple(shapes[0])


def _param(op, name, shape, optional=False):
    p = op.params.get(name)
    if p is None:
        if optional:
            return None
        raise ValueError(f"op {op.name} ({op.kind}) has no parameter {name!r}")
    if tuple(p.shape) != tuple(shape):
        raise ValueError(f"op {op.name} ({op.kind}): {name} has shape {tuple(p.shape)}, expected {tuple(shape)}")
    return p


def _shape_conv(op, shapes):
    C, H, W = _one(op, shapes, 3)
    w = op.params.get("w")
    if w is None or w.ndim != 4 or w.shape[1] != C:
        raise ValueError(f"op {op.name} (conv): weights {None if w is None else w.shape} "
                         f"do not fit input {(C, H, W)}")
    K, _, kH, kW = w.shape
    _param(op, "b", (K,), optional=True)
    pads, (sH, sW), (dH, dW) = op.attrs["pads"], op.attrs["stride"], op.attrs["dilation"]
    oH, oW = out_size(H, kH, sH, dH, pads[0], pads[1]), out_size(W, kW, sW, dW, pads[2], pads[3])
    if min(oH, oW) <= 0 or min(pads) < 0:
        raise ValueError(f"op {op.name} (conv): a {kH}x{kW} kernel does not fit {(C, H, W)} with pads {pads}")
    op.plan = ConvPlan((None, C, H, W), tuple(w.shape), (None, K, oH, oW), tuple(pads), (sH, sW), (dH, dW))
    return (K, oH, oW)


def _shape_dense(op, shapes):
    C, = _one(op, shapes, 1)
    w = op.params.get("w")
    if w is None or w.ndim != 2 or w.shape[1] != C:
        raise ValueError(f"op {op.name} (dense): weights {None if w is None else w.shape} do not fit input ({C},)")
    _param(op, "b", (w.shape[0],), optional=True)
    return (w.shape[0],)


def _shape_bn(op, shapes):
    shape = _one(op, shapes, 3)
    for name in ("gamma", "beta", "mean", "var"):
        _param(op, name, (shape[0],))
    return shape


def _shape_pool(op, shapes):
    C, H, W = _one(op, shapes, 3)
    op.plan = pool2d_plan((None, C, H, W), op.attrs["ksize"], op.attrs["stride"], op.attrs["padding"])
    return op.plan.out_shape[1:]


def _shape_pad(op, shapes):
    C, H, W = _one(op, shapes, 3)
    t, b, l, r = op.attrs["pads"]
    return (C, H + t + b, W + l + r)


def _shape_add(op, shapes):
    first = shapes[0]
    if len(shapes) < 2 or any(tuple(s) != tuple(first) for s in shapes):
        raise ValueError(f"op {op.name} (add) needs two or more inputs of one shape, got {shapes}")
    return first


def _same(rank=None):
    return lambda op, shapes: _one(op, shapes, rank)


# -- execution: (kernels, op, inputs) -> output -------------------------------------------------------
def _conv(k, plan, x, w, b, relu):
    if not relu:
        return k.conv.conv2d_fprop(plan, x, w, b)
    fused = getattr(k.conv, "conv2d_bias_relu_fprop", None)     # one cuDNN graph where offered
    if fused is not None and b is not None:
        return fused(plan, x, w, b)
    y = k.conv.conv2d_fprop(plan, x, w, b)
    return k.activation.relu_fprop(y, out=y)                     # in place: y is fresh


def _run_dense(k, op, xs):
    y = k.dense.dense_fprop(xs[0], op.arrays["w"], op.arrays.get("b"))
    return k.activation.relu_fprop(y, out=y) if op.attrs["relu"] else y    # in place: y is fresh


def _run_add(k, op, xs):
    if op.attrs["relu"] and "relu" in inspect.signature(k.merge.add_fprop).parameters:
        return k.merge.add_fprop(xs, relu=True)                  # one kernel where the family offers it
    y = k.merge.add_fprop(xs)
    return k.activation.relu_fprop(y, out=y) if op.attrs["relu"] else y


def _run_bn(k, op, xs):
    a = op.arrays
    return k.norm.bn_fprop_infer(xs[0], a["gamma"], a["beta"], a["mean"], a["var"], op.attrs["eps"])


def _activation(name, *attrs):
    def run(k, op, xs):
        return getattr(k.activation, f"{name}_fprop")(xs[0], *(op.attrs[a] for a in attrs))
    return run


_LRN = ("size", "alpha", "beta", "k")
_KINDS = {   # kind -> (shape inference, execution)
    "conv": (_shape_conv, lambda k, op, xs: _conv(k, op.plan, xs[0], op.arrays["w"], op.arrays.get("b"),
                                                    op.attrs["relu"])),
    "dense": (_shape_dense, _run_dense),
    "bn": (_shape_bn, _run_bn),
    "add": (_shape_add, _run_add),
    "relu": (_same(), _activation("relu")),
    "leaky_relu": (_same(), _activation("leaky_relu", "alpha")),
    "sigmoid": (_same(), _activation("sigmoid")),
    "tanh": (_same(), _activation("tanh")),
    "maxpool": (_shape_pool, lambda k, op, xs: k.pool.maxpool2d_fprop(op.plan, xs[0])),
    "avgpool": (_shape_pool, lambda k, op, xs: k.pool.avgpool2d_fprop(op.plan, xs[0])),
    "gap": (lambda op, s: (_one(op, s, 3)[0], 1, 1), lambda k, op, xs: k.pool.global_avgpool_fprop(xs[0])),
    "flatten": (lambda op, s: (int(np.prod(_one(op, s))),), lambda k, op, xs: xs[0].reshape(xs[0].shape[0], -1)),
    "pad": (_shape_pad, lambda k, op, xs: k.pad.pad2d_fprop(xs[0], op.attrs["pads"], op.attrs["value"])),
    "lrn": (_same(3), lambda k, op, xs: k.lrn.lrn_fprop(xs[0], *(op.attrs[a] for a in _LRN))[0]),
    "softmax": (_same(1), lambda k, op, xs: k.softmax.softmax_fprop(xs[0])),
}


# -- lowering a Model ---------------------------------------------------------------------------------
class _Lowering:
    """Model graph -> (ops, output value ids, stats), folding and fusing on the way."""

    def __init__(self, model, probabilities):
        from . import layers as L
        self.L, self.model = L, model
        raw = defaultdict(list)                          # id(node) -> consumer nodes
        for node in model.nodes:
            for p in node.parents:
                raw[id(p)].append(node)
        out_ids = {id(o) for o in model.outputs}
        self.removed = {id(n) for n in model.nodes if isinstance(n.layer, L.Dropout) or (
            isinstance(n.layer, L.Softmax) and not probabilities and id(n) in out_ids and not raw[id(n)])}
        # Uses and consumers seen through removed nodes: a consumer of dropout(h) consumes h.
        self.uses, self.consumers, self.out_ids = Counter(), defaultdict(list), set()
        for node in model.nodes:
            if id(node) not in self.removed:
                for p in node.parents:
                    c = self.canon(p)
                    self.uses[id(c)] += 1
                    self.consumers[id(c)].append(node)
        for o in model.outputs:
            self.uses[id(self.canon(o))] += 1
            self.out_ids.add(id(self.canon(o)))
        self.vids = {id(n): i for i, n in enumerate(model.inputs)}
        self.ops, self.producer, self.pads = [], {}, {}
        self.stats = Counter(layers=len(model.layers))
        for n in model.nodes:
            if id(n) in self.removed:
                self.stats["dropout_removed" if isinstance(n.layer, L.Dropout) else "softmax_removed"] += 1

    def canon(self, node):
        while id(node) in self.removed:
            node = node.parents[0]
        return node

    def sole_consumer(self, node):
        """The one layer node reading `node`'s value, if exactly one does and it is no model output."""
        if self.uses[id(node)] == 1 and id(node) not in self.out_ids:
            return self.consumers[id(node)][0]
        return None

    def host(self, p):
        return np.asarray(self.model.device.to_host(p.data), dtype=np.float64)

    def emit(self, node, kind, inputs, attrs=None, params=None, name=None):
        op = Op(kind, name or node.layer.name, [self.vids[id(x)] for x in inputs], attrs, params)
        vid = len(self.model.inputs) + len(self.ops)
        self.ops.append(op)
        self.vids[id(node)], self.producer[vid] = vid, op
        return op

    def fuse(self, node, x, what):
        """`node` joins the op that produced x's value (its sole reader): it adds no op."""
        vid = self.vids[id(x)]
        self.producer[vid].name += "+" + node.layer.name
        self.vids[id(node)] = vid
        self.stats[what] += 1

    def run(self):
        L = self.L
        for node in self.model.nodes:
            if id(node) in self.removed:
                continue
            layer, ins = node.layer, [self.canon(p) for p in node.parents]
            cls = type(layer).__name__
            handler = getattr(self, "_" + cls.lower(), None) if getattr(L, cls, None) is type(layer) else None
            if handler is None:
                raise ValueError(f"compile: layer {layer.name} ({type(layer).__name__}) has no inference op")
            handler(node, layer, ins, L)
        for op in self.ops:                   # the fused conv+bias+ReLU kernel wants a bias
            if op.kind == "conv" and op.attrs["relu"] and "b" not in op.params:
                op.params["b"] = np.zeros(op.params["w"].shape[0])
        outputs = [self.vids[id(self.canon(o))] for o in self.model.outputs]
        self.stats["ops"] = len(self.ops)
        return self.ops, outputs, dict(self.stats)

    # one handler per layer class ----------------------------------------------------------------
    def _pad2d(self, node, layer, ins, L):
        if layer.value == 0 and isinstance(getattr(self.sole_consumer(node), "layer", None), L.Conv2D):
            self.pads[id(node)] = layer.pads           # the conv reads the unpadded input instead
            self.stats["pad_folded"] += 1
            return
        self.emit(node, "pad", ins, {"pads": list(layer.pads), "value": layer.value})

    def _conv2d(self, node, layer, ins, L):
        x, pads, name = ins[0], list(layer.plan.pads), layer.name
        if id(x) in self.pads:
            pads = [a + b for a, b in zip(pads, self.pads[id(x)])]
            x, name = self.canon(x.parents[0]), f"{x.layer.name}+{layer.name}"
        params = {"w": self.host(layer.w)}
        if layer.b is not None:
            params["b"] = self.host(layer.b)
        self.emit(node, "conv", [x], {"pads": pads, "stride": list(layer.stride),
                                      "dilation": list(layer.dilation), "relu": False}, params, name)

    def _batchnorm2d(self, node, layer, ins, L):
        x = ins[0]
        stats = (layer.gamma, layer.beta, layer.running_mean, layer.running_var)
        g, beta, mean, var = (self.host(p) for p in stats)
        op = self.producer.get(self.vids.get(id(x)))
        if isinstance(x.layer, L.Conv2D) and self.sole_consumer(x) is node and getattr(op, "kind", "") == "conv":
            scale = g / np.sqrt(var + layer.eps)                                    # (K,)
            op.params["w"] = op.params["w"] * scale[:, None, None, None]            # (K, C, kH, kW)
            op.params["b"] = (op.params.get("b", 0.0) - mean) * scale + beta
            return self.fuse(node, x, "bn_folded")
        self.emit(node, "bn", ins, {"eps": layer.eps}, {"gamma": g, "beta": beta, "mean": mean, "var": var})

    def _relu(self, node, layer, ins, L):
        x = ins[0]
        op = self.producer.get(self.vids.get(id(x)))
        if op is not None and op.kind in ("conv", "dense", "add") and not op.attrs["relu"] \
                and self.sole_consumer(x) is node:
            op.attrs["relu"] = True
            return self.fuse(node, x, "relu_fused")
        self.emit(node, "relu", ins)

    def _dense(self, node, layer, ins, L):
        params = {"w": self.host(layer.w)}
        if layer.b is not None:
            params["b"] = self.host(layer.b)
        self.emit(node, "dense", ins, {"relu": False}, params)

    def _add(self, node, layer, ins, L):
        self.emit(node, "add", ins, {"relu": False})

    def _maxpool2d(self, node, layer, ins, L, kind="maxpool"):
        padding = layer.padding if isinstance(layer.padding, (int, str)) else list(layer.padding)
        self.emit(node, kind, ins, {"ksize": list(layer.ksize), "stride": list(layer.stride), "padding": padding})

    def _avgpool2d(self, node, layer, ins, L):
        self._maxpool2d(node, layer, ins, L, "avgpool")

    def _globalavgpool2d(self, node, layer, ins, L):
        self.emit(node, "gap", ins)

    def _flatten(self, node, layer, ins, L):
        self.emit(node, "flatten", ins)

    def _leakyrelu(self, node, layer, ins, L):
        self.emit(node, "leaky_relu", ins, {"alpha": layer.alpha})

    def _sigmoid(self, node, layer, ins, L):
        self.emit(node, "sigmoid", ins)

    def _tanh(self, node, layer, ins, L):
        self.emit(node, "tanh", ins)

    def _lrn(self, node, layer, ins, L):
        self.emit(node, "lrn", ins, dict(zip(_LRN, layer.hyper())))

    def _softmax(self, node, layer, ins, L):
        self.emit(node, "softmax", ins)


def compile(model_or_checkpoint_path, device=None, probabilities=False, dtype="float32", direct=True):
    """An InferenceModel of a trained Model, or of the model a checkpoint file describes.

    device: 'cpu', 'cuda', 'auto' or a Device; None keeps the model's device ('auto' for a path).
    probabilities: keep a final Softmax (else the model outputs logits).
    direct: schedule the fused direct kernels (conv+ReLU+pool, dense chains, whole small models).
    """
    source = model_or_checkpoint_path
    if isinstance(source, (str, os.PathLike)):
        from .checkpoint import load_model
        model = load_model(os.fspath(source), device="cpu")          # folding is host work
        device = "auto" if device is None else device
    else:
        model = source
        device = model.device.name if device is None else device
    ops, outputs, stats = _Lowering(model, probabilities).run()
    return InferenceModel(ops, [n.shape[1:] for n in model.inputs], outputs, device=device,
                          probabilities=probabilities, name=model.name, stats=stats, dtype=dtype, direct=direct)


# -- schedules: ops -> kernel calls -------------------------------------------------------------------
class Step:
    """One kernel call of a schedule: `run(kernels, [input arrays]) -> output` for the values `inputs`,
    giving value `out`; it stands for the ops `ops` (one op, or several fused)."""

    def __init__(self, name, kind, ops, inputs, out, run):
        self.name, self.kind, self.ops, self.inputs, self.out, self.run = name, kind, ops, list(inputs), out, run

    def __repr__(self):
        return f"Step({self.kind}, {self.name!r})"


def _op_step(op, vid):
    run = _KINDS[op.kind][1]
    return Step(op.name, op.kind, [op], op.inputs, vid, lambda k, xs, op=op: run(k, op, xs))


def _direct_pool_ok(conv, pool):
    """A stride-1 conv read only by a 2x2 stride-2 unpadded max-pool, of a size the direct kernel takes."""
    from .kernels.cpu import direct
    return (tuple(conv.attrs["stride"]) == (1, 1) and tuple(conv.attrs["dilation"]) == (1, 1)
            and tuple(pool.plan.ksize) == (2, 2) and tuple(pool.plan.stride) == (2, 2) and not any(pool.plan.pads)
            and direct.supported_conv(conv.plan.in_shape[1:], conv.params["w"].shape, conv.attrs["pads"], 2))


# -- the inference model ------------------------------------------------------------------------------
class InferenceModel:
    """A flat list of ops on one device.   predict(x (N, *input_shape)) -> y (N, *output_shape)."""

    def __init__(self, ops, input_shapes, outputs, device="cpu", probabilities=False, name="model",
                 stats=None, dtype="float32", direct=True):
        dev = get_device(device, dtype=dtype)
        self.device = dev if dev.dtype == np.dtype(dtype) else dev.with_dtype(dtype)
        self.dtype, self.name, self.probabilities = self.device.dtype, name, bool(probabilities)
        self.ops, self.outputs, self.stats = [op.copy() for op in ops], [int(v) for v in outputs], dict(stats or {})
        self.input_shapes = [tuple(int(d) for d in s) for s in input_shapes]
        self.n_inputs = len(self.input_shapes)
        for op in self.ops:
            op.params = {k: np.ascontiguousarray(v, dtype=self.dtype) for k, v in op.params.items()}
        self._check()
        self._bind()
        self.cuda_graphs = self.device.name == "cuda"       # False: run eagerly (debugging)
        self._direct = bool(direct)
        self._plan()
        self._entries = {}                                  # batch size -> (input buffers, CapturedCall)
        self._replays = {}                                  # id(input buffer) -> (buffer, launch)

    def _check(self):
        """Shape inference over the op list; a ValueError names the op that does not fit."""
        shapes = list(self.input_shapes)
        for op in self.ops:
            if op.kind not in _KINDS:
                raise ValueError(f"op {op.name}: unknown kind {op.kind!r}")
            if not op.inputs or any(not 0 <= v < len(shapes) for v in op.inputs):
                raise ValueError(f"op {op.name} reads values {op.inputs}, only {len(shapes)} exist before it")
            op.shape = tuple(int(d) for d in _KINDS[op.kind][0](op, [shapes[v] for v in op.inputs]))
            shapes.append(op.shape)
        if not self.outputs or any(not 0 <= v < len(shapes) for v in self.outputs):
            raise ValueError(f"outputs {self.outputs} are not among the {len(shapes)} values")
        self.shapes = shapes

    def _bind(self):
        """Weights to the device, each its own (aligned) array."""
        for op in self.ops:
            op.arrays = {k: self.device.asarray(v) for k, v in op.params.items()}

    # -- scheduling -----------------------------------------------------------------------------------
    @property
    def direct(self):
        """Whether fused direct kernels are scheduled (True by default); setting it drops captured graphs."""
        return self._direct

    @direct.setter
    def direct(self, on):
        self._direct = bool(on)
        self._plan()
        self._entries, self._replays = {}, {}

    def _direct_kernels(self):
        """The device's direct kernel family, or None where it cannot serve (float64 on the GPU)."""
        if not self._direct or (self.device.name == "cuda" and self.dtype != np.float32):
            return None
        return importlib.import_module(f"minidl.kernels.{'cpu' if self.device.name == 'cpu' else 'gpu'}.direct")

    def _plan(self):
        """self.steps (the schedule at any batch size) and self.chain (one Step for small batches, or None)."""
        ops, n_in, dk = self.ops, self.n_inputs, self._direct_kernels()
        readers = Counter(v for op in ops for v in op.inputs) + Counter(self.outputs)
        steps, i = [], 0
        while i < len(ops):
            op, vid = ops[i], n_in + i
            nxt = ops[i + 1] if i + 1 < len(ops) else None
            sole = readers[vid] == 1 and vid not in self.outputs
            if dk and op.kind == "conv" and nxt is not None and nxt.kind == "maxpool" and nxt.inputs == [vid] \
                    and sole and _direct_pool_ok(op, nxt):
                steps.append(self._conv_pool_step(dk, op, nxt, vid + 1))
                i += 2
            elif dk and op.kind == "dense":
                j = i
                while j + 1 < len(ops) and ops[j + 1].kind == "dense" and ops[j + 1].inputs == [n_in + j] \
                        and readers[n_in + j] == 1 and n_in + j not in self.outputs:
                    j += 1
                steps.append(self._mlp_step(dk, ops[i:j + 1], n_in + j))
                i = j + 1
            elif dk and op.kind == "add" and op.attrs["relu"]:
                steps.append(Step(op.name, "add_relu", [op], op.inputs, vid,
                                  lambda k, xs: dk.add_relu_fprop(xs)))
                i += 1
            else:
                steps.append(_op_step(op, vid))
                i += 1
        self.steps = steps
        self.chain = self._chain_step(dk, steps) if dk else None
        self._schedules = {}

    def _conv_pool_step(self, dk, conv, pool, out):
        a, pads, relu = conv.arrays, tuple(conv.attrs["pads"]), conv.attrs["relu"]
        return Step(f"{conv.name}+{pool.name}", "conv_pool", [conv, pool], conv.inputs, out,
                    lambda k, xs: dk.conv2d_bias_relu_maxpool2x2_fprop(xs[0], a["w"], a.get("b"), pads, relu))

    def _mlp_step(self, dk, ops, out):
        ws, bs, relus = [op.arrays["w"] for op in ops], [op.arrays.get("b") for op in ops], [op.attrs["relu"] for op in ops]
        name = ops[0].name if len(ops) == 1 else f"{ops[0].name}..{ops[-1].name}"
        return Step(name, "mlp", ops, ops[0].inputs, out, lambda k, xs: dk.mlp_fprop(xs[0], ws, bs, relus))

    def _chain_step(self, dk, steps):
        """The whole model as one chain kernel call, if it is conv-pool stages, a flatten, a dense chain."""
        if self.n_inputs != 1 or len(self.outputs) != 1 or not steps:
            return None
        stages, prev = [], 0
        for j, st in enumerate(steps):
            last = j == len(steps) - 1
            if st.inputs != [prev] or (last and st.out != self.outputs[0]):
                return None
            if st.kind == "conv_pool" and not any(s[0] == "dense" for s in stages):
                conv = st.ops[0]
                stages.append(("conv", conv.arrays["w"], conv.arrays.get("b"), tuple(conv.attrs["pads"]), 2,
                               conv.attrs["relu"]))
            elif st.kind == "flatten" and not any(s[0] == "dense" for s in stages):
                pass
            elif st.kind == "mlp" and last:
                stages += [("dense", op.arrays["w"], op.arrays.get("b"), op.attrs["relu"]) for op in st.ops]
            else:
                return None
            prev = st.out
        if not dk.supported_chain(self.input_shapes[0], stages):
            return None
        ops = [op for st in steps for op in st.ops]
        return Step(f"{ops[0].name}..{ops[-1].name}", "chain", ops, [0], self.outputs[0],
                    lambda k, xs: dk.chain_fprop(xs[0], stages))

    def schedule(self, N):
        """(steps, free) at batch N: the kernel calls in order, and after each the values to drop."""
        sched = self._schedules.get(N)
        if sched is None:
            steps = [self.chain] if self.chain is not None and N <= CHAIN_MAX_BATCH else self.steps
            # Free each intermediate right after its last reader: on the GPU the memory pool hands
            # it to later steps (within one captured graph too), so peak memory stays small.
            last = {}
            for i, st in enumerate(steps):
                last[st.out] = i
                for v in st.inputs:
                    last[v] = i
            free = [[] for _ in steps]
            for v, i in last.items():
                if v >= self.n_inputs and v not in self.outputs:
                    free[i].append(v)
            sched = self._schedules[N] = (steps, free)
        return sched

    # -- running --------------------------------------------------------------------------------------
    def _forward(self, xs, keep=False):
        steps, free = self.schedule(xs[0].shape[0])
        values, k = dict(enumerate(xs)), self.device.kernels
        for st, drop in zip(steps, free):
            values[st.out] = st.run(k, [values[v] for v in st.inputs])
            if not keep:
                for v in drop:
                    del values[v]
        return values if keep else [values[v] for v in self.outputs]

    def _inputs(self, xs):
        if len(xs) != self.n_inputs:
            raise ValueError(f"{self.name} takes {self.n_inputs} input(s), got {len(xs)}")
        N = None
        for x, shape in zip(xs, self.input_shapes):
            if tuple(x.shape[1:]) != shape or (N is not None and x.shape[0] != N):
                raise ValueError(f"{self.name}: inputs must be (N, *{shape}) with one N, got {tuple(x.shape)}")
            N = x.shape[0]
        return N

    def _pack(self, outs):
        return outs[0] if len(outs) == 1 else list(outs)

    def _to_device(self, x):
        return self.device.asarray(x, dtype=self.dtype)

    def _entry(self, N):
        entry = self._entries.get(N)
        if entry is None:
            bufs = [self.device.xp.zeros((N, *s), dtype=self.dtype) for s in self.input_shapes]
            call = self._capture(bufs) if self.device.name == "cuda" and self.cuda_graphs else None
            entry = self._entries[N] = (bufs, call)
            if call is not None and len(bufs) == 1:
                launch, stream, out = call.graph.launch, call.stream, self._pack(call.result)

                def replay():
                    launch(stream)
                    return out
                self._replays[id(bufs[0])] = (bufs[0], replay)
        return entry

    def _capture(self, bufs):
        """The forward on `bufs` as a CapturedCall, its first replay checked against eager execution.

        The check runs once per batch size, on a random probe input: the graph replays the very
        kernels the eager run launched, so any difference means some kernel is not safe to
        capture, and that must fail loudly rather than return wrong outputs at every replay.
        """
        from .cudagraph import CaptureError, CapturedCall
        rng = np.random.default_rng(0)
        for buf in bufs:
            buf.set(rng.standard_normal(buf.shape, dtype=np.float32).astype(self.dtype, copy=False))
        want = [y.copy() for y in self._forward(bufs)]
        call = CapturedCall(self.device, lambda: self._forward(bufs))
        for w, y in zip(want, call.replay()):
            err, scale = float(abs(y - w).max()), float(abs(w).max())    # one host sync, at capture only
            if not err <= GRAPH_CHECK_RTOL * scale:
                raise CaptureError(f"{self.name}: the CUDA graph at batch {bufs[0].shape[0]} disagrees with "
                                   f"eager execution (max error {err:.3g}, max |y| {scale:.3g}): a kernel is not "
                                   "safe to capture; set cuda_graphs = False (minidl.infer --no-graphs)")
        return call

    def input_buffer(self, N, index=0):
        """The fixed input buffer for batch size N: write into it and pass it to predict (no copy)."""
        if self.device.name != "cuda":
            return self._entry(N)[0][index]
        with self.device.stream:
            return self._entry(N)[0][index]

    def predict(self, *xs):
        """Outputs for inputs xs (host or device arrays, (N, *input_shape)).

        On cuda with CUDA graphs (the default) the result is the graph's output buffer for this
        batch size, overwritten by the next call at the same N; the call does not wait for the GPU.
        Given the input buffer of a captured batch size (input_buffer(N)), it only launches the graph.
        """
        hit = self._replays.get(id(xs[0])) if xs else None
        if hit is not None and hit[0] is xs[0] and len(xs) == 1 and self.cuda_graphs:
            return hit[1]()
        N = self._inputs(xs)
        if self.device.name != "cuda":
            return self._pack(self._forward([self._to_device(x) for x in xs]))
        with self.device.stream:
            if not self.cuda_graphs:
                return self._pack(self._forward([self._to_device(x) for x in xs]))
            bufs, call = self._entry(N)
            for buf, x in zip(bufs, xs):
                if x is buf:
                    continue
                if isinstance(x, self.device.xp.ndarray):
                    buf[...] = x                     # device to device, on the stream
                else:
                    buf.set(np.ascontiguousarray(x, dtype=self.dtype))
            return self._pack(call.replay())

    __call__ = predict

    def profile(self, *xs, repeats=20):
        """Per-step times [OpTime(name, kind, shape, ms)] at this batch, one row per kernel call of
        schedule(N): each step's inputs come from one forward pass, and each step runs `repeats`
        times. GPU: the repeats are captured as one CUDA graph and timed with CUDA events (kernel
        time, no launch overhead); CPU: median of perf_counter.
        """
        N = self._inputs(xs)
        if self.device.name == "cuda":
            with self.device.stream:
                return self._profile([self._to_device(x) for x in xs], N, repeats)
        return self._profile([self._to_device(x) for x in xs], N, repeats)

    def _profile(self, xs, N, repeats):
        values, k, rows = self._forward(xs, keep=True), self.device.kernels, []
        for st in self.schedule(N)[0]:
            ins = [values[v] for v in st.inputs]
            if st.kind == "flatten":                      # a view: nothing runs
                ms = 0.0
            elif self.device.name == "cuda":
                def loop(st=st, ins=ins):                # outputs dropped: the pool reuses them
                    for _ in range(repeats):
                        st.run(k, ins)
                ms = self._time_gpu(loop, repeats)
            else:
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    st.run(k, ins)
                    times.append(time.perf_counter() - t0)
                ms = 1e3 * float(np.median(times))
            shape = self.shapes[st.out] if st.out < len(self.shapes) else ()
            rows.append(OpTime(st.name, st.kind, (N, *shape), ms))
        return rows

    def _time_gpu(self, fn, repeats):
        from .cudagraph import CapturedCall
        cp, stream = self.device.xp, self.device.stream
        call = CapturedCall(self.device, fn, warmup=1)
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        call.replay()
        end.record(stream)
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / repeats

    # -- description ------------------------------------------------------------------------------------
    @property
    def n_params(self):
        return int(sum(p.size for op in self.ops for p in op.params.values()))

    def summary(self, print_fn=print):
        """Print op, kind, output shape and parameter count, one row per op."""
        rows = [("op", "kind", "output shape", "params")]
        rows += [(op.name, op.kind, "(N, " + ", ".join(map(str, op.shape)) + ")",
                  f"{sum(p.size for p in op.params.values()):,}") for op in self.ops]
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            print_fn(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:>{w[3]}}")
        print_fn(f"{len(self.ops)} ops, {self.n_params:,} parameters, {self.dtype.name}, {self.device.name}")

    def __repr__(self):
        return f"InferenceModel({self.name!r}, {len(self.ops)} ops, {self.device})"

    # -- artifact ---------------------------------------------------------------------------------------
    def save(self, path):
        """Write the weights-only artifact (.npz of tensors + the op list as JSON) atomically."""
        arrays = {f"op{i}/{k}": v for i, op in enumerate(self.ops) for k, v in op.params.items()}
        info = {"format": FORMAT, "name": self.name, "dtype": self.dtype.name, "probabilities": self.probabilities,
                "inputs": [list(s) for s in self.input_shapes], "outputs": self.outputs, "stats": self.stats,
                "ops": [op.spec() for op in self.ops]}
        return write_npz(path, arrays, info)


def load(path, device=None):
    """An InferenceModel from an artifact written by `save`, on `device` (None: 'auto').

    The file is checked on the host first (format tag, every op's weights and shapes), so an
    ArtifactError naming the file is raised for a missing, corrupt or foreign file.
    """
    info, arrays = read_npz(path, "artifact", ArtifactError)
    fmt = info.get("format")
    if fmt != FORMAT:
        ckpt = str(fmt).startswith("minidl-checkpoint")
        hint = "; it is a checkpoint: use compile() or --checkpoint" if ckpt else ""
        raise ArtifactError(f"artifact {path}: unknown format {fmt!r}, expected {FORMAT!r}{hint}")
    try:
        ops = []
        for i, spec in enumerate(info["ops"]):
            ops.append(Op(spec["kind"], spec["name"], spec["inputs"], spec["attrs"],
                          {k: arrays[f"op{i}/{k}"] for k in spec["params"]}))
        shapes = [tuple(spec["shape"]) for spec in info["ops"]]
        model = InferenceModel(ops, info["inputs"], info["outputs"], device="cpu", dtype=info["dtype"],
                               probabilities=info["probabilities"], name=info["name"], stats=info.get("stats"))
        for op, shape in zip(model.ops, shapes):
            if op.shape != shape:
                raise ValueError(f"op {op.name} computes shape {op.shape}, the artifact says {shape}")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise ArtifactError(f"artifact {path} is inconsistent: {type(e).__name__}: {e}") from None
    dev = get_device("auto" if device is None else device, dtype=model.dtype)
    if dev.name == "cpu":
        return model
    return InferenceModel(model.ops, model.input_shapes, model.outputs, device=dev, name=model.name,
                          probabilities=model.probabilities, stats=model.stats, dtype=model.dtype)
