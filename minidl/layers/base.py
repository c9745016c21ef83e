"""The Layer contract and parameters; the argument helpers the layer families share are in args.py."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

import numpy as np

from .. import init as _init
from .._types import Array, BatchShape, Initializer, KernelFamily
from ..backend import DtypeError
from . import registry as _registry
from .args import _fans, _fmt, pair, positive_pair  # noqa: F401  # the layer families import them from here
from .recording import jsonable, record_config, recorded_arguments
from .node import Node

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from ..backend import Device


class Parameter:
    """A named tensor of a layer: `data` and `grad` are views into the model's flat buffers.

    Weights (`weight`, declared trainable) live in the model's parameter arena (updated by the
    optimizer); state (BN running statistics) lives in its state arena (saved, not updated).
    `trainable = False` freezes a weight (Keras, torch's requires_grad): it stays in the arena, and the
    optimizer leaves it, its weight decay and its optimizer state unchanged (docs/training.md).
    """

    changes = 0       # `trainable` set anywhere, counted: an optimizer rereads the flags only when it moved

    def __init__(self, name: str, shape: Sequence[int], initializer: str | Initializer, trainable: bool = True,
                 fan: tuple[int, int] | None = None) -> None:
        self.name, self.shape = name, tuple(int(s) for s in shape)
        self.weight = bool(trainable)        # where it lives: the parameter arena, or the state arena
        self.frozen = False
        self.initializer = _init.get(initializer)
        self.fan = fan or _fans(self.shape)
        self.data: Array = None
        self.grad: Array = None
        self.offset: int = None  # type: ignore[assignment]  # where `data` starts in its arena (set when allocated)

    @property
    def trainable(self) -> bool:
        """A weight the optimizer updates: declared trainable and not frozen."""
        return self.weight and not self.frozen

    @trainable.setter
    def trainable(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"parameter {self.name}: trainable must be True or False, got {value!r}")
        if not self.weight and value:
            raise ValueError(f"parameter {self.name} is state (running statistics), not a weight: it cannot train")
        self.frozen = self.weight and not value
        Parameter.changes += 1

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def __repr__(self):
        return f"Parameter({self.name!r}, {self.shape})"


class Need(NamedTuple):
    """What the graph asks of a backward (Caffe's propagate_down).

    inputs: one flag per input, whether its gradient is read (else return None for it); None:
    all are. accumulate: add parameter gradients into what is there (else overwrite; only layers
    that declare `overwrites_grads` are asked to).
    """
    inputs: tuple[bool, ...] | None = None
    accumulate: bool = True

    def input(self, i: int) -> bool:
        """Whether input i's gradient is read."""
        return self.inputs is None or self.inputs[i]

    @property
    def grad_kw(self) -> dict[str, bool]:
        """Keyword arguments for parameter-gradient kernels: {} adds, accumulate=False overwrites."""
        return {} if self.accumulate else {"accumulate": False}


ALL = Need()       # every input gradient, parameter gradients added: a backward called by hand


class Layer:
    """Base class: `build` decides shapes and parameters once, `forward`/`backward` compute.

    Subclasses implement `build(in_shapes, device) -> out_shape` (shapes carry the batch
    dimension first, possibly None), `forward(xs, training) -> y` and
    `backward(gy, need) -> tuple of gx, one per input` (None where `need` says it is not read).

    What the graph passes need is declared here, never looked up by class name:
    `kind`, the constructor arguments (`config()`), the parameters, and the class attributes below.
    A subclass's `__init__` arguments are recorded as its config without a decorator (`record_config`).
    """

    kind: str | None = None
    """What passes see: "conv2d", "batchnorm", "relu", ... (default: `prefix`)."""
    prefix: str | None = None
    """The C++ trainer's layer-name stem, e.g. "conv2d", "fbn": a model names layers prefix, prefix_1, ..."""
    n_inputs: int | None = 1
    """How many inputs it reads; None: any number >= 2."""
    first_index = 0
    """The number the first layer of this prefix gets (0: none, `conv2d`; the C++ trainer's first add was add_1)."""
    overwrites_grads = False
    """backward honours need.accumulate=False (its kernels take the flag)."""
    fusable_activation: str | None = None
    """"relu": a producer that takes this activation can apply it instead."""
    activations: tuple[str, ...] = ()
    """Activations this layer can apply to its output (its `activation` argument)."""
    layouts: tuple[str, ...] = ()
    """Memory orders it can write its output in ("channels_last": its argument)."""
    commutes_with: tuple[str, ...] = ()
    """Activations f with layer(f(x)) = f(layer(x)), gradients too (max-pool: ReLU)."""
    takes_residual = False
    """It can add a second input of its output's shape (passes.fuse_residual_adds)."""
    inference_identity = False
    """It is the identity in evaluation (dropout): inference drops it."""
    needs_rng = False
    """forward draws random numbers from device.rng in training (dropout)."""
    keeps_fp32 = False
    """It computes in float32 under every precision policy (BN statistics, softmax)."""
    io_in_compute_dtype = False
    """With keeps_fp32: float32 parameters and arithmetic, but it reads and writes the compute dtype (BN)."""
    out_dtype: np.dtype | None = None
    """The dtype of its output where it differs from its input's (Cast)."""
    channels_last_params: tuple[str, ...] = ()
    """(K, C, kH, kW) parameters its kernels read faster lying K, kH, kW, C (a channels-last conv's
    filters): their compute-dtype copies lie so."""
    activation: str | None         # the activation it applies (layers with `activations` only)
    channels_last: bool            # it writes its output channels-last (layers with `layouts` only)
    _called: bool                  # set when the layer is first applied to nodes (Node.from_layer)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.__name__.startswith("_"):
            _registry.register(cls)    # for rebuilding models from their configs (layers/registry.py)
        if cls.kind is None and cls.prefix is not None:
            cls.kind = cls.prefix
        if "__init__" in cls.__dict__:           # Keras's get_config, without writing one: the arguments
            cls.__init__ = record_config(cls.__dict__["__init__"])   # are recorded (checkpoints, clones)

    def __init__(self, name: str | None = None) -> None:
        self.name: str = name if name is None else str(name)  # type: ignore[assignment]  # None: the model names it
        self.params: dict[str, Parameter] = {}
        self.saved: Any = None
        self.device: Device = None  # type: ignore[assignment]  # set by the model before build

    # -- parameters -----------------------------------------------------------------------
    def param(self, name: str, shape: Sequence[int], initializer: str | Initializer, trainable: bool = True,
              fan: tuple[int, int] | None = None) -> Parameter:
        """Declare (or on a rebuild, re-find) a parameter; its arrays arrive after the model allocates."""
        p = self.params.get(name)
        if p is None or p.shape != tuple(shape):
            p = self.params[name] = Parameter(name, shape, initializer, trainable, fan)
            p.frozen = p.weight and not self.__dict__.get("_trainable", True)   # layer.trainable set before build
        return p

    @property
    def trainable(self) -> bool:
        """Whether the optimizer updates this layer's weights (Keras's `layer.trainable`): setting it
        freezes or unfreezes all of them, before or after build (a layer without weights: True)."""
        weights = [p for p in self.params.values() if p.weight]
        return all(p.trainable for p in weights) if weights else self.__dict__.get("_trainable", True)

    @trainable.setter
    def trainable(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"layer {self.name}: trainable must be True or False, got {value!r}")
        self.__dict__["_trainable"] = value
        for p in self.params.values():
            if p.weight:
                p.trainable = value

    def state(self, name: str, shape: Sequence[int], initializer: str | Initializer) -> Parameter:
        """Declare non-trainable state (running statistics), saved in checkpoints."""
        return self.param(name, shape, initializer, trainable=False)

    def get_weights(self) -> dict[str, np.ndarray]:
        """{param name: NumPy copy} of this layer's parameters and statistics."""
        return {k: np.array(self.device.to_host(p.data)) for k, p in self.params.items()}

    def set_weights(self, weights: Mapping[str, ArrayLike]) -> None:
        """Copy arrays into this layer's parameters by name ('w', 'b', 'gamma', ...), checking shapes."""
        for k, a in weights.items():           # check everything before changing anything
            if k not in self.params:
                raise self.error(f"has no parameter {k!r}; it has {', '.join(self.params) or 'none'}")
            if tuple(np.shape(a)) != self.params[k].shape:
                raise self.error(f"parameter {k} has shape {self.params[k].shape}, got {tuple(np.shape(a))}")
            if not np.isfinite(np.asarray(a, dtype=np.float64)).all():
                raise self.error(f"parameter {k} holds non-finite values (NaN or infinity)")
        self.check_weights(weights)
        for k, a in weights.items():
            p = self.params[k]
            p.data[...] = self.device.asarray(np.asarray(a), dtype=p.data.dtype)

    def check_weights(self, weights: Mapping[str, ArrayLike]) -> None:
        """Refuse values this layer's parameters cannot hold (one error naming the layer and parameter);
        every path that sets weights calls it (Model.set_weights, checkpoints, artifacts). `weights`:
        {param name: array}, some of the layer's parameters. BatchNorm2D: a negative running_var."""

    # -- the contract -------------------------------------------------------------------------
    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        """Check the input shapes (batch first, maybe None), declare parameters (`param`), return the output shape."""
        raise NotImplementedError

    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        """y of the inputs `xs` (arrays of `device.xp`); keep what backward needs in `self.saved`."""
        raise NotImplementedError

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        """One gradient per input (None where `need` says it is not read); add into each `param(...).grad`."""
        raise NotImplementedError

    def __call__(self, *nodes: Node) -> Node:
        return Node.from_layer(self, nodes)

    # -- what the passes ask ------------------------------------------------------------------
    def clone(self, share_params: bool = False, **changes: Any) -> Layer:
        """A new, unbuilt layer of this class and name with `changes` to its arguments.

        share_params=True: the clone uses this layer's Parameter objects (a lowering of a model
        that trains the same weights); else it declares its own when built.
        """
        own = type(self).config is not Layer.config            # a layer that writes its own config
        layer = type(self)(**{**(self.config() if own else getattr(self, "_config", {})), **changes}, name=self.name)
        if share_params:
            layer.params = self.params
        return layer

    def fold_into_producer(self, producer: Layer, weights: dict[str, np.ndarray]
                           ) -> tuple[Layer, dict[str, np.ndarray]] | None:
        """(producer', weights') with this layer's effect folded into the layer before it, or None.

        `weights` are the producer's host arrays by parameter name ('w', 'b'), in float64.
        """
        return None

    def fold_into_consumer(self, consumer: Layer, weights: tuple[int, ...]) -> Layer | None:
        """(consumer', weights') with this layer folded into the layer that reads it, or None."""
        return None

    # -- helpers for subclasses -----------------------------------------------------------
    def kernel_families(self, device: Device, *names: str) -> tuple[KernelFamily, ...]:
        """The device's kernel families `names` (device.kernels.<name>), once each has said it computes in
        the device's dtype (Device.dtype_problem); else one error naming this layer, raised at build."""
        why = device.dtype_problem(names)
        if why:
            raise self.error(why, DtypeError)
        return tuple(getattr(device.kernels, n) for n in names)

    def error(self, message: str, kind: type[Exception] = ValueError) -> Exception:
        """A ValueError (or the subclass `kind`) naming this layer."""
        return kind(f"layer {self.name or type(self).__name__} ({type(self).__name__}): {message}")

    def expect_rank(self, shape: BatchShape, rank: int, what: str = "input") -> None:
        if len(shape) != rank:
            raise self.error(f"expects a {rank}-D {what} (with batch), got shape {_fmt(shape)}")

    def check_activation(self, activation: str | None) -> str | None:
        """The `activation` argument: None or one of the activations this layer applies."""
        if activation is not None and activation not in self.activations:
            raise self.error(f"activation must be None or one of {list(self.activations)}, got {activation!r}")
        return activation

    @recorded_arguments
    def config(self) -> dict[str, Any]:
        """The constructor arguments (but `name`), as JSON data: a checkpoint rebuilds the layer from them.

        Recorded by every subclass's `__init__` without a decorator (`__init_subclass__` wraps it): the
        arguments bound by its signature, defaults applied, tuples as lists.
        """
        return {k: jsonable(v) for k, v in getattr(self, "_config", {}).items()}

    def __getstate__(self) -> dict[str, Any]:
        """An unbuilt layer pickles and copies as it is; a built one is refused (its weights are views
        into its model's arena, its kernels the device's): pickle or copy the model, or take clone()."""
        if getattr(self, "device", None) is not None:
            raise TypeError(f"layer {self.name} ({type(self).__name__}) is built into a model, whose arena holds "
                            f"its weights: pickle or copy.deepcopy the model, or take layer.clone() (unbuilt)")
        return self.__dict__

    def __repr__(self):
        return f"{type(self).__name__}(name={self.name!r})"
