"""Network: a DAG of layers built on a device, its parameters in one flat buffer, run forward and backward.

`layer(node)` records an edge; a network of (inputs, outputs) orders the DAG once, names layers the way the C++
trainer printed them (ir.Graph.name_layers), builds every layer (shape inference), and lays all parameters out in one
flat buffer with their gradients in a second. Backward runs in reverse order, tells each layer which input gradients
are read and whether parameter gradients add up, and sums the gradients of nodes that feed several layers (ResNet
shortcuts). `lower(passes)` gives the same network rewritten by graph passes, training the same parameters (see
minidl.graph.passes). It is all a training step and an inference lowering run; Model (model.py) is a Network as its
user holds it.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from .._types import Array, DTypeLike
from ..backend import Device, get_device
from ..layers import registry
from ..layers.base import Layer, Need, _fmt
from ..layers.input_contract import images_in, takes_images
from ..layers.node import Node
from . import arena, checks, liveness
from .ir import Graph

N = TypeVar("N", bound="Network")   # lower, to and of_graph give the class they are called on (a Model: a Model)


class Network:
    """A DAG of layers from `inputs` to `outputs`, built on `device` in `dtype`.

    forward(x, training) -> y;  backward(gy) -> gx, adding parameter gradients into `grads`.
    weights: {'layer/param': array} to start from (checked against the model before anything is
    allocated) instead of the seeded initializers. Nodes another Model was built on give this one
    copies of their layers, starting from that model's weights (each model trains its own).
    """

    checks_every_layer = False     # True: minidl's own layers' results are checked too (the tests' switch)
    device: Device                 # set by build

    def __init__(self, inputs: Node | Sequence[Node], outputs: Node | Sequence[Node], device: str | Device = "cpu",
                 dtype: DTypeLike = "float32", seed: int = 0, name: str = "model",
                 weights: Mapping[str, Any] | None = None, _shares: Network | None = None) -> None:
        self.single_input = isinstance(inputs, Node)
        self.single_output = isinstance(outputs, Node)
        graph = Graph([inputs] if self.single_input else inputs,  # type: ignore[list-item, arg-type]  # Node or nodes
                      [outputs] if self.single_output else outputs)  # type: ignore[list-item, arg-type]
        graph, taken = graph.free_of_other_models(snapshot=weights is None)
        graph.name_layers()
        self.inputs, self.outputs, self.nodes = graph.inputs, graph.outputs, graph.nodes
        self.layers = [n.layer for n in self.nodes]
        self.name, self.seed = name, seed
        if not self.nodes and _shares is None and weights is None:
            checks.no_layers(name)
        checks.names(name, self.layers)
        self._out_shapes: list[tuple[int, ...]] | None = None   # the last forward's: backward's gradients match
        self._kept = {id(o) for o in self.outputs}              # the values forward never drops
        self.copies: list[arena.Copies] = []                    # a lowering's compute-dtype copies (arena.py)
        self.side_arenas: dict[np.dtype, arena.Arenas] = {}
        self.releases = False              # True: drop each value after its last reader (liveness.py)
        self._deaths: list[list[int]] | None = None
        self._lowerings: list[weakref.ref[Network]] = []
        self._takes_images = takes_images(self)   # the graph is fixed: whether it carries its Normalize
        if _shares is not None:            # a lowering: the same parameters, already in an arena
            self._build_shared(_shares)
            return
        self.build(get_device(device, dtype=dtype, seed=seed), weights)
        if weights is None:
            self.init_weights(seed)
            self.set_weights(taken, strict=False)       # copies of another model's layers start as they are

    @classmethod
    def of_graph(cls: type[N], graph: Graph, device: Device, name: str = "model",
                 weights: Mapping[str, Any] | None = None, shares: Network | None = None) -> N:
        """A model of a pass-rewritten Graph: on its own arena from `weights`, or sharing `shares`'."""
        ins, outs = graph.inputs, graph.outputs
        return cls(ins[0] if len(ins) == 1 else ins, outs[0] if len(outs) == 1 else outs, device=device,
                   dtype=device.dtype, name=name, weights=weights, _shares=shares)

    def lower(self: N, passes: Callable[[Graph], Graph]) -> N:
        """This model rewritten by `passes` (Graph -> Graph), training the same parameters."""
        lowered = self.of_graph(passes(Graph.of(self, share_params=True)), self.device, self.name, shares=self)
        self._lowerings = [r for r in self._lowerings if r() is not None] + [weakref.ref(lowered)]   # see to()
        return lowered

    # -- construction ---------------------------------------------------------------------
    def _infer_shapes(self, device):
        """Build every layer: shapes, dtypes, parameter declarations, kernel plans.

        Values start in the device's dtype; a layer computes in its inputs' dtype (on `device.compute_in(dtype)`)
        and passes it on, a Cast (`out_dtype`) its own; BN (`io_in_compute_dtype`) is built in the device's.
        """
        self.device, devices = device, {device.dtype: device}
        me = weakref.ref(self)
        for node in self.inputs:
            node.dtype = device.dtype
        for node in self.nodes:
            layer, dtypes = node.layer, {p.dtype for p in node.parents}
            if len(dtypes) > 1:
                raise layer.error(f"reads values of several dtypes ({', '.join(sorted(d.name for d in dtypes))})")
            dtype = dtypes.pop()
            at = device.dtype if layer.keeps_fp32 and layer.io_in_compute_dtype else dtype   # parameters' dtype
            layer.device = devices[at] = devices.get(at) or device.compute_in(at)
            node.shape = checks.built_shape(layer, layer.build([p.shape for p in node.parents], layer.device))
            node.dtype = layer.out_dtype or dtype
            layer._model = me              # a second Model of these nodes copies it (Graph.free_of_other_models)
        self.params = {f"{layer.name}/{k}": p for layer in self.layers for k, p in layer.params.items()}
        self._dtypes = {f"{layer.name}/{k}": layer.device.dtype for layer in self.layers for k in layer.params}
        # What each backward must give: an input's gradient only where a layer reads it.
        self._needs = [tuple(p.layer is not None for p in node.parents) for node in self.nodes]
        # The layers whose results are checked (a user's: checks.layer_output, layer_grads); their inputs' shapes.
        self._checked = [self.checks_every_layer or not registry.is_minidl(type(n.layer).__module__)
                         for n in self.nodes]
        self._inputs_seen = {}             # id(node) -> [(shape, dtype)] of the values its forward read

    def build(self, device: Device, weights: Mapping[str, Any] | None = None) -> None:
        """Infer every shape, declare parameters and make kernel plans on `device`; then allocate.

        Given `weights`, their names and shapes are checked before anything is allocated.
        """
        self._infer_shapes(device)
        if weights is not None:
            self._check_weights(weights, strict=True)
        self._allocate()
        if weights is not None:
            self.set_weights(weights)

    def _build_shared(self, model):
        """The model's arenas: compute-dtype copies of its weights, its filters read channels-last laid K, kH, kW, C
        (arena.Copies, arena.lay_krsc: not while another lowering, a captured step, reads them as they lie)."""
        self._infer_shapes(model.device)
        self.flat, self.grads, self.state_flat = model.flat, model.grads, model.state_flat
        krsc, alone = arena.krsc_keys(self.layers), not any(r() is not None for r in model._lowerings)
        arena.lay_krsc([model.params[k] for k in sorted(krsc) if alone and k in model.params])
        self.copies = arena.share(self.params, self._dtypes, krsc, model.name, model.params, model.flat, model.device)

    def _allocate(self):
        """The arenas (graph/arena.py): one in the device's dtype, one more per other dtype layers compute in."""
        (self.flat, self.grads, self.state_flat), self.side_arenas = arena.allocate_by_dtype(
            self.device.xp, self.device.dtype, self.params, self._dtypes, arena.krsc_keys(self.layers))

    def init_weights(self, seed: int = 0) -> None:
        """Draw every parameter from its initializer with one seeded host generator."""
        rng = np.random.default_rng(seed)
        for p in self.params.values():
            p.data[...] = self.device.asarray(p.initializer(rng, p.shape, *p.fan).astype(p.data.dtype))

    def to(self: N, device: str | Device, dtype: DTypeLike | None = None) -> N:
        """Rebuild on another device (or dtype), keeping the weights and running statistics; on the device
        and dtype it is on already, nothing changes (torch's `to`). A model a Trainer trains is refused (its
        step trains these arenas): Trainer(model, optimizer, device=...) moves it before it trains."""
        if device is self.device and dtype is None:
            return self
        dev = get_device(device, dtype=dtype or self.device.dtype, seed=self.seed)
        if not isinstance(device, Device) and (dev.name, dev.dtype) == (self.device.name, self.device.dtype):
            return self
        checks.not_lowered(self.name, self._lowerings, dev)
        weights = self.get_weights()
        self.build(dev, weights)
        return self

    # -- running --------------------------------------------------------------------------
    @property
    def needs_rng(self) -> bool:
        """Whether a training forward draws random numbers (dropout)."""
        return any(layer.needs_rng for layer in self.layers)

    @property
    def overwrites_grads(self) -> bool:
        """Whether every layer with parameters can overwrite its gradients (backward(accumulate=False))."""
        return all(layer.overwrites_grads for layer in self.layers if any(p.weight for p in layer.params.values()))

    def forward(self, *xs: Array, training: bool = False) -> Any:
        """Run the graph; returns the output (or a list of outputs)."""
        if len(xs) != len(self.inputs):
            raise ValueError(f"{self.name} takes {len(self.inputs)} input(s), got {len(xs)}")
        for c in self.copies:              # compute-dtype weights from the float32 master
            c.refresh(self.flat)
        values, deaths = {}, self._deaths or liveness.last_reads(liveness.steps_of(self.nodes), self._kept)
        for i, (node, x) in enumerate(zip(self.inputs, xs)):
            values[id(node)] = self.prepare_input(self.images_in(x, i), i)    # uint8 / 255 (docs/input.md)
        for node, dead, check in zip(self.nodes, deaths, self._checked):
            ins = [values[id(p)] for p in node.parents]
            y = values[id(node)] = node.layer.forward(ins, training)
            if check:                      # a user's layer: its output against its build
                checks.layer_output(node, ins, y, self.device.xp)
                self._inputs_seen[id(node)] = [(tuple(x.shape), x.dtype) for x in ins]
            for v in dead if self.releases else ():
                del values[v]
        self._values, self._deaths = None if self.releases else values, deaths
        outs = [values[id(o)] for o in self.outputs]
        self._out_shapes = [tuple(y.shape) for y in outs]
        return outs[0] if self.single_output else outs

    __call__ = forward

    def backward(self, *gys: Array, input_grads: bool = True, accumulate: bool = True,
                 ready: Callable[[Layer], object] | None = None) -> Any:
        """Propagate output gradients back; returns the input gradient(s).

        Parameter gradients are added into `grads` (call `zero_grad` between steps). With
        input_grads=False, layers fed only by model inputs skip their input gradient (training
        never needs it) and None is returned. accumulate=False overwrites the parameter gradients
        instead of adding (no zero_grad needed); only for models where `overwrites_grads` holds.
        ready(layer), if given, is called in backward order as soon as each layer's parameter
        gradients are final (data-parallel ranks start reducing them while backward goes on).
        With compute-dtype copies they are final in the copies: the hook's owner brings each range
        it reads into the float32 arena with `gather(lo, hi)` (the Reducer, bucket by bucket, so
        the first buckets travel while backward goes on); without a hook backward gathers it all.
        """
        if not accumulate and not self.overwrites_grads:
            raise ValueError(f"{self.name}: a layer adds into its gradients; use accumulate=True")
        if len(gys) != len(self.outputs):
            raise ValueError(f"{self.name}: backward takes {len(self.outputs)} output gradient(s), got {len(gys)}")
        checks.gradients(self.name, self.outputs, self._out_shapes, self.layers[0], gys)
        if self.releases:                  # what forward saved is let go by this backward
            self._out_shapes = None
        done = self._after_each_layer(accumulate, ready)
        grads: dict[int, Array] = {}
        add = self.device.kernels.merge.add_fprop     # a value read twice: its gradients add
        for o, g in zip(self.outputs, gys):
            grads[id(o)] = g if id(o) not in grads else grads[id(o)] + g
        for node, reads, check in zip(reversed(self.nodes), reversed(self._needs), reversed(self._checked)):
            gy = grads.pop(id(node), None)       # None: this node does not lead to the outputs
            need = Need(tuple(input_grads or r for r in reads), accumulate)
            gxs = () if gy is None else node.layer.backward(gy, need)
            if check and gy is not None:         # a user's layer: one gradient per input, of its shape
                checks.layer_grads(node, gxs, need, self._inputs_seen[id(node)], self.device.xp)
            for hook in done:
                hook(node.layer, gy is not None)
            for parent, gx in zip(node.parents, gxs):
                if gx is not None:
                    prev = grads.get(id(parent))
                    grads[id(parent)] = gx if prev is None else add([prev, gx])      # kept in memory order
        if ready is None:                  # the copies' gradients into the float32 arena, all at once
            self.gather()
        gxs = [grads.get(id(i)) for i in self.inputs]  # type: ignore[assignment]  # the inputs' gradients now
        return gxs[0] if self.single_input else gxs

    def _after_each_layer(self, accumulate: bool, ready: Callable[[Layer], object] | None) -> list[Callable]:
        """The hooks backward calls with (layer, reached) once a layer is done, reached or not, in order:
        an overwriting backward zeroes what it never reached; a releasing model drops what the layer
        saved (liveness.py); `ready` hears that its gradients are final (distributed/buckets.py)."""
        hooks: list[Callable[[Layer, bool], object]] = []
        if not accumulate:
            hooks.append(liveness.zero_unreached)
        if self.releases:
            hooks.append(liveness.release_saved)
        if ready is not None:
            hooks.append(lambda layer, reached: ready(layer))
        return hooks

    def gather(self, lo: int = 0, hi: int | None = None) -> None:
        """Elements lo:hi of the compute-dtype copies' gradients into the float32 arena `grads`
        (whole layers: a range backward's `ready` hook has seen final). No copies: nothing to do."""
        for c in self.copies:
            c.gather(self.grads, lo, hi)

    def zero_grad(self) -> None:
        """Zero the parameter gradients (and the compute-dtype copies'), as torch's zero_grad; backward adds."""
        self.grads.fill(0)
        for c in self.copies:
            c.zero_grad()

    # -- the parameters as host arrays (`to` moves them; `weights=` starts from them) -----------
    def _check_weights(self, weights, strict):
        checks.weights(self.name, self.params, self.layers, weights, strict)

    def set_weights(self, weights: Mapping[str, Any], strict: bool = True) -> list[str]:
        """Copy arrays into parameters by 'layer/param' name, checking names and shapes first;
        strict=False loads part of them (`set_weights({"conv2d/w": w0}, strict=False)`); unknown names
        are refused either way. Returns the names left as they were (none when strict).
        """
        self._check_weights(weights, strict)
        for k, a in weights.items():
            self.params[k].data[...] = self.device.asarray(np.asarray(a), dtype=self.params[k].data.dtype)
        return sorted(set(self.params) - set(weights))

    def get_weights(self) -> dict[str, np.ndarray]:
        """{'layer/param': NumPy array} for every parameter and running statistic."""
        return {k: np.array(self.device.to_host(p.data)) for k, p in self.params.items()}

    # -- the input, as forward reads it (the input contract, docs/input.md) ----------------------
    def images_in(self, x: Any, i: int = 0) -> Any:
        """Input `i` as the model's first layer reads it (docs/input.md): uint8 images divided by 255,
        (N, H, W) images given their channel where the input is (1, H, W), and for a model that carries
        its preprocessing (layers.Normalize) a host float array's range checked to be in [0, 1] (one
        DataError naming `{name}.forward`, the dtype and the range). forward calls it before
        prepare_input (a training lowering reads the Loader's float batches: they pass as they are)."""
        shape = tuple(self.inputs[i].shape[1:])
        if len(shape) == 3 and shape[0] == 1 and tuple(getattr(x, "shape", ()))[1:] == shape[1:]:
            x = x.reshape(x.shape[0], *shape)                   # (N, H, W) -> (N, 1, H, W), as fit takes them
        xp = self.device.xp if isinstance(x, self.device.xp.ndarray) else np
        return images_in(x, f"{self.name}.forward images", xp, check=self._takes_images)

    def prepare_input(self, x: Any, i: int = 0) -> Array:
        """x as the array this model's input `i` reads: checked for shape, on its device, in its dtype."""
        node, shape = self.inputs[i], tuple(getattr(x, "shape", ()))
        if shape[1:] != node.shape[1:]:
            raise ValueError(f"{self.name}: input {node.name} expects shape {_fmt(node.shape)}, got {shape}")
        if shape[0] < 1:
            raise ValueError(f"{self.name}: input {node.name} got an empty batch {shape}; N must be >= 1")
        if not isinstance(x, self.device.xp.ndarray):
            return self.device.asarray(x, dtype=self.device.dtype)
        if x.dtype != self.device.dtype:
            if x.dtype.kind not in "fiub":
                raise ValueError(f"{self.name}: input {node.name} has dtype {x.dtype}, expected numbers")
            return x.astype(self.device.dtype)
        return x
