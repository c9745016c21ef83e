"""The layer graph: Input, Node, Model, Sequential.

`layer(node)` records an edge; `Model(inputs, outputs)` orders the DAG once, names layers the
way the seed printed them, builds every layer (shape inference), and lays all parameters out in
one flat buffer with their gradients in a second. Backward runs in reverse order and sums the
gradients of nodes that feed several layers (ResNet shortcuts).
"""
import numpy as np

from .backend import get_device
from .layers.base import Layer, _fmt


class Node:
    """A tensor in the graph: the output of `layer` applied to `parents` (or a model input)."""

    def __init__(self, layer, parents, shape=None):
        self.layer, self.parents, self.shape = layer, tuple(parents), shape

    @classmethod
    def from_layer(cls, layer, parents):
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

    def __repr__(self):
        return f"Node({self.layer.name if self.layer else 'input'}, {self.shape})"


def Input(shape, name=None):
    """A model input of per-sample `shape` (e.g. (1, 28, 28)); the batch dimension is implicit."""
    node = Node(None, (), (None, *(int(s) for s in shape)))
    node.name = name or "input"
    return node


def _toposort(outputs):
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


class Model:
    """A DAG of layers from `inputs` to `outputs`, built on `device` in `dtype`.

    forward(x, training) -> y;  backward(gy) -> gx, adding parameter gradients into `grads`.
    """

    def __init__(self, inputs, outputs, device="cpu", dtype="float32", seed=0, name="model"):
        self.single_input = isinstance(inputs, Node)
        self.single_output = isinstance(outputs, Node)
        self.inputs = [inputs] if self.single_input else list(inputs)
        self.outputs = [outputs] if self.single_output else list(outputs)
        self.name, self.seed = name, seed
        nodes = _toposort(self.outputs)
        for node in nodes:
            if node.layer is None and all(node is not i for i in self.inputs):
                raise ValueError(f"{node.name} is reached from the outputs but is not among the model's inputs")
        self.nodes = [n for n in nodes if n.layer is not None]
        self.layers = [n.layer for n in self.nodes]
        self._name_layers()
        self.device = None
        self.build(get_device(device, dtype=dtype, seed=seed))
        self.init_weights(seed)

    # -- construction ---------------------------------------------------------------------
    def _name_layers(self):
        taken = {layer.name for layer in self.layers if layer.name}
        counters = {}
        for layer in self.layers:
            if layer.name:
                continue
            stem = layer.prefix or type(layer).__name__.lower()
            i = counters.get(stem, layer.first_index)
            while (name := stem if i == 0 else f"{stem}_{i}") in taken:
                i += 1
            layer.name, counters[stem] = name, i + 1
            taken.add(name)
        names = [layer.name for layer in self.layers]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"layer names must be unique in a model: {', '.join(sorted(dup))}")

    def build(self, device):
        """Infer every shape, declare parameters and make kernel plans on `device`."""
        self.device = device
        for node in self.nodes:
            out = node.layer.build([p.shape for p in node.parents], device)
            node.shape = tuple(out)
        self.params = {f"{layer.name}/{k}": p for layer in self.layers for k, p in layer.params.items()}
        self._allocate()

    def _allocate(self):
        xp, dtype = self.device.xp, self.device.dtype
        trainable = [p for p in self.params.values() if p.trainable]
        frozen = [p for p in self.params.values() if not p.trainable]
        # Each tensor starts on a 256-byte boundary: cuDNN's fast engines want aligned pointers.
        # The gaps hold zeros with zero gradients, which every optimizer leaves at zero.
        align = max(256 // dtype.itemsize, 1)

        def layout(group):
            offsets, end = [], 0
            for p in group:
                offsets.append(end)
                end += -(-p.size // align) * align
            return offsets, end

        (t_off, t_end), (f_off, f_end) = layout(trainable), layout(frozen)
        self.flat = xp.zeros(t_end, dtype=dtype)
        self.grads = xp.zeros_like(self.flat)
        self.state_flat = xp.zeros(f_end, dtype=dtype)
        for p, o in zip(trainable, t_off):
            p.data = self.flat[o:o + p.size].reshape(p.shape)
            p.grad = self.grads[o:o + p.size].reshape(p.shape)
        for p, o in zip(frozen, f_off):
            p.data, p.grad = self.state_flat[o:o + p.size].reshape(p.shape), None

    def init_weights(self, seed=0):
        """Draw every parameter from its initializer with one seeded host generator."""
        rng = np.random.default_rng(seed)
        for p in self.params.values():
            p.data[...] = self.device.asarray(p.initializer(rng, p.shape, *p.fan).astype(self.device.dtype))

    def to(self, device, dtype=None):
        """Rebuild on another device (or dtype), keeping the weights and running statistics."""
        weights = self.get_weights()
        dev = get_device(device, dtype=dtype or self.device.dtype, seed=self.seed)
        self.build(dev)
        self.set_weights(weights)
        return self

    # -- running --------------------------------------------------------------------------
    @property
    def ends_in_softmax(self):
        from .layers.softmax import Softmax
        return self.single_output and isinstance(self.layers[-1], Softmax) and self.nodes[-1] is self.outputs[0]

    @property
    def logits(self):
        """The last forward's logits: the Softmax's input when the model ends in Softmax."""
        node = self.nodes[-1].parents[0] if self.ends_in_softmax else self.outputs[0]
        return self._values[id(node)]

    def forward(self, *xs, training=False):
        """Run the graph; returns the output (or a list of outputs)."""
        if len(xs) != len(self.inputs):
            raise ValueError(f"{self.name} takes {len(self.inputs)} input(s), got {len(xs)}")
        values = {}
        for node, x in zip(self.inputs, xs):
            if tuple(x.shape[1:]) != node.shape[1:]:
                raise ValueError(f"{self.name}: input {node.name} expects shape {_fmt(node.shape)}, "
                                 f"got {tuple(x.shape)}")
            values[id(node)] = x
        for node in self.nodes:
            values[id(node)] = node.layer.forward([values[id(p)] for p in node.parents], training)
        self._values = values
        outs = [values[id(o)] for o in self.outputs]
        return outs[0] if self.single_output else outs

    __call__ = forward

    def backward(self, *gys, from_logits=False, input_grads=True, accumulate=True):
        """Propagate output gradients back; returns the input gradient(s).

        Parameter gradients are added into `grads` (call `zero_grad` between steps). With
        from_logits=True, `gy` is the gradient of the final Softmax's input and that layer is
        skipped: the stable path for cross-entropy on a model that ends in Softmax. With
        input_grads=False, layers fed only by model inputs skip their input gradient (training
        never needs it) and None is returned. accumulate=False overwrites the parameter gradients
        instead of adding (no zero_grad needed); only for models where `can_overwrite` holds.
        """
        if not accumulate and not self.can_overwrite:
            raise ValueError(f"{self.name}: a layer adds into its gradients; use accumulate=True")
        nodes = self.nodes
        if from_logits:
            if not self.ends_in_softmax:
                raise ValueError(f"{self.name}: from_logits=True needs a model that ends in Softmax")
            nodes, start = nodes[:-1], [self.nodes[-1].parents[0]]
        else:
            start = self.outputs
        if len(gys) != len(start):
            raise ValueError(f"{self.name}: backward takes {len(start)} output gradient(s), got {len(gys)}")
        grads = {id(n): g for n, g in zip(start, gys)}
        for node in reversed(nodes):
            gy = grads.pop(id(node), None)
            if gy is None:      # this node does not lead to the outputs
                if not accumulate:
                    for p in node.layer.params.values():
                        if p.grad is not None:
                            p.grad.fill(0)
                continue
            node.layer.needs_gx = input_grads or any(p.layer is not None for p in node.parents)
            node.layer.accumulate = accumulate
            gxs = node.layer.backward(gy)
            for parent, gx in zip(node.parents, gxs):
                if gx is None:
                    continue
                prev = grads.get(id(parent))
                grads[id(parent)] = gx if prev is None else prev + gx
        gxs = [grads.get(id(i)) for i in self.inputs]
        return gxs[0] if self.single_input else gxs

    def zero_grad(self):
        self.grads.fill(0)

    @property
    def can_overwrite(self):
        """Whether every layer with parameters can overwrite its gradients (backward(accumulate=False))."""
        return all(l.overwrites for l in self.layers if any(p.trainable for p in l.params.values()))

    def fuse(self, on=True):
        """Let BatchNorm2D and Add apply a ReLU that is their only consumer, the ReLU passing through.

        The same math in fewer GPU kernels; the fused layer's recorded output is then post-ReLU.
        Returns the number of ReLUs fused.
        """
        from .layers.activation import ReLU
        from .layers.merge import Add
        from .layers.norm import BatchNorm2D
        consumers = {}
        for node in self.nodes:
            for p in node.parents:
                consumers[id(p)] = consumers.get(id(p), 0) + 1
        outputs = {id(o) for o in self.outputs}
        fused = 0
        for node in self.nodes:
            if not isinstance(node.layer, ReLU):
                continue
            src = node.parents[0]
            ok = isinstance(src.layer, (BatchNorm2D, Add)) and consumers[id(src)] == 1 and id(src) not in outputs
            if ok:
                src.layer.fuse_relu = node.layer.identity = on
                fused += on
        return fused

    # -- parameters by name -------------------------------------------------------------
    def layer(self, name):
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer {name!r}; layers: {', '.join(l.name for l in self.layers)}")

    def get_weights(self):
        """{'layer/param': NumPy array} for every parameter and running statistic."""
        return {k: self.device.to_host(p.data).copy() for k, p in self.params.items()}

    def get_grads(self):
        """{'layer/param': NumPy array} of the trainable parameters' gradients."""
        return {k: self.device.to_host(p.grad).copy() for k, p in self.params.items() if p.trainable}

    def set_weights(self, weights, strict=True):
        """Copy arrays into parameters by 'layer/param' name, checking names and shapes."""
        unknown = sorted(set(weights) - set(self.params))
        missing = sorted(set(self.params) - set(weights))
        if unknown or (strict and missing):
            raise ValueError(f"{self.name}: weights do not match the model: "
                             f"unknown {unknown or 'none'}, missing {missing or 'none'}")
        for k, a in weights.items():           # check everything before changing anything
            if tuple(np.shape(a)) != self.params[k].shape:
                raise ValueError(f"{self.name}: {k} has shape {self.params[k].shape}, got {tuple(np.shape(a))}")
        for k, a in weights.items():
            self.params[k].data[...] = self.device.asarray(np.asarray(a, dtype=self.device.dtype))

    @property
    def n_params(self):
        """Trainable parameters (the flat buffer also holds alignment gaps)."""
        return sum(p.size for p in self.params.values() if p.trainable)

    # -- architecture as JSON ---------------------------------------------------------------
    def config(self):
        """The architecture as JSON-able data: inputs, and each layer's class, arguments and inputs."""
        index = {id(n): i for i, n in enumerate(self.inputs)}
        layers = []
        for node in self.nodes:
            index[id(node)] = len(self.inputs) + len(layers)
            cfg = {k: v for k, v in node.layer.config().items() if k != "name"}
            layers.append({"class": type(node.layer).__name__, "name": node.layer.name, "config": cfg,
                           "inputs": [index[id(p)] for p in node.parents]})
        return {"name": self.name, "inputs": [list(n.shape[1:]) for n in self.inputs], "layers": layers,
                "outputs": [index[id(o)] for o in self.outputs]}

    @classmethod
    def from_config(cls, config, **kwargs):
        """Rebuild a model from `config()`; kwargs (device, dtype, seed) go to Model."""
        from . import layers as L
        nodes = [Input(shape) for shape in config["inputs"]]
        for spec in config["layers"]:
            layer_cls = getattr(L, spec["class"], None)
            if not (isinstance(layer_cls, type) and issubclass(layer_cls, Layer)):
                raise ValueError(f"unknown layer class {spec['class']!r} in the model config")
            layer = layer_cls(**spec["config"], name=spec["name"])
            nodes.append(layer(*[nodes[i] for i in spec["inputs"]]))
        ins, outs = nodes[:len(config["inputs"])], [nodes[i] for i in config["outputs"]]
        return cls(ins[0] if len(ins) == 1 else ins, outs[0] if len(outs) == 1 else outs,
                   name=config.get("name", "model"), **kwargs)

    def summary(self, print_fn=print):
        """Print layer, output shape and parameter count, one row per layer, and the totals."""
        rows = [("layer (type)", "output shape", "params")]
        for node in self.nodes:
            n = sum(p.size for p in node.layer.params.values() if p.trainable)
            rows.append((f"{node.layer.name} ({type(node.layer).__name__})", _fmt(node.shape), f"{n:,}"))
        w = [max(len(r[i]) for r in rows) for i in range(3)]
        line = "-" * (w[0] + w[1] + w[2] + 4)
        print_fn(line)
        for i, r in enumerate(rows):
            print_fn(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:>{w[2]}}")
            if i == 0:
                print_fn(line)
        print_fn(line)
        frozen = sum(p.size for p in self.params.values() if not p.trainable)
        print_fn(f"total params: {self.n_params:,} trainable, {frozen:,} non-trainable")


def Sequential(layers, input_shape, **kwargs):
    """A Model that chains `layers` from one input of per-sample `input_shape`."""
    x = h = Input(input_shape)
    for layer in layers:
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential takes layers, got {type(layer).__name__}")
        h = layer(h)
    return Model(x, h, **kwargs)
