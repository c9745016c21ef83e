"""The Layer contract, parameters, and the small helpers every layer family shares."""
from typing import NamedTuple

import numpy as np

from .. import init as _init
from ..backend import DtypeError
from .node import Node


class Parameter:
    """A named tensor of a layer: `data` and `grad` are views into the model's flat buffers.

    Trainable parameters live in the model's parameter arena (updated by the optimizer);
    non-trainable state (BN running statistics) lives in its state arena (saved, not updated).
    """

    def __init__(self, name, shape, initializer, trainable=True, fan=None):
        self.name, self.shape, self.trainable = name, tuple(int(s) for s in shape), trainable
        self.initializer = _init.get(initializer)
        self.fan = fan or _fans(self.shape)
        self.data = None
        self.grad = None
        self.offset = None                 # where `data` starts in its arena (set when allocated)

    @property
    def size(self):
        return int(np.prod(self.shape))

    def __repr__(self):
        return f"Parameter({self.name!r}, {self.shape})"


def _fans(shape):
    """(fan_in, fan_out) for a dense (K, C) or conv (K, C, kH, kW) weight."""
    if len(shape) < 2:
        return (shape[0] if shape else 1,) * 2
    receptive = int(np.prod(shape[2:]))
    return shape[1] * receptive, shape[0] * receptive


class Need(NamedTuple):
    """What the graph asks of a backward (Caffe's propagate_down).

    inputs: one flag per input, whether its gradient is read (else return None for it); None:
    all are. accumulate: add parameter gradients into what is there (else overwrite; only layers
    that declare `overwrites_grads` are asked to).
    """
    inputs: tuple = None
    accumulate: bool = True

    def input(self, i):
        """Whether input i's gradient is read."""
        return self.inputs is None or self.inputs[i]

    @property
    def grad_kw(self):
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
    """

    registry = {}          # class name -> class, for rebuilding models from their configs
    kind = None            # what passes see: "conv2d", "batchnorm", "relu", ... (default: prefix)
    prefix = None          # the seed's layer-name stem, e.g. "conv2d", "fbn"
    n_inputs = 1           # None: any number >= 2
    first_index = 0        # the seed numbered adds from add_1
    overwrites_grads = False   # backward honours need.accumulate=False (its kernels take the flag)
    fusable_activation = None  # "relu": a producer that takes this activation can apply it instead
    activations = ()           # activations this layer can apply to its output (its `activation` argument)
    layouts = ()               # memory orders it can write its output in ("channels_last": its argument)
    commutes_with = ()         # activations f with layer(f(x)) = f(layer(x)), gradients too (max-pool: ReLU)
    inference_identity = False # the layer is the identity in evaluation (dropout): inference drops it
    needs_rng = False          # forward draws random numbers from device.rng in training (dropout)
    keeps_fp32 = False         # computes in float32 under every precision policy (BN statistics, softmax)
    io_in_compute_dtype = False  # with keeps_fp32: float32 parameters and arithmetic, but reads and writes
                                 # the compute dtype (BN: no casts around it)
    out_dtype = None           # the dtype of its output where it differs from its input's (Cast)
    channels_last_params = ()  # (K, C, kH, kW) parameters its kernels read faster lying K, kH, kW, C
                               # (a channels-last conv's filters): their compute-dtype copies lie so

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if not cls.__name__.startswith("_"):
            Layer.registry[cls.__name__] = cls
        if cls.kind is None and cls.prefix is not None:
            cls.kind = cls.prefix

    def __init__(self, name=None):
        self.name = name if name is None else str(name)
        self.params = {}
        self.saved = None
        self.device = None

    # -- parameters -----------------------------------------------------------------------
    def param(self, name, shape, initializer, trainable=True, fan=None):
        """Declare (or on a rebuild, re-find) a parameter; its arrays arrive after the model allocates."""
        p = self.params.get(name)
        if p is None or p.shape != tuple(shape):
            p = self.params[name] = Parameter(name, shape, initializer, trainable, fan)
        return p

    def state(self, name, shape, initializer):
        """Declare non-trainable state (running statistics), saved in checkpoints."""
        return self.param(name, shape, initializer, trainable=False)

    def get_weights(self):
        """{param name: NumPy copy} of this layer's parameters and statistics."""
        return {k: np.array(self.device.to_host(p.data)) for k, p in self.params.items()}

    def set_weights(self, weights):
        """Copy arrays into this layer's parameters by name ('w', 'b', 'gamma', ...), checking shapes."""
        for k, a in weights.items():           # check everything before changing anything
            if k not in self.params:
                raise self.error(f"has no parameter {k!r}; it has {', '.join(self.params) or 'none'}")
            if tuple(np.shape(a)) != self.params[k].shape:
                raise self.error(f"parameter {k} has shape {self.params[k].shape}, got {tuple(np.shape(a))}")
        for k, a in weights.items():
            p = self.params[k]
            p.data[...] = self.device.asarray(np.asarray(a), dtype=p.data.dtype)

    # -- the contract -------------------------------------------------------------------------
    def build(self, in_shapes, device):
        raise NotImplementedError

    def forward(self, xs, training):
        raise NotImplementedError

    def backward(self, gy, need=ALL):
        raise NotImplementedError

    def __call__(self, *nodes):
        return Node.from_layer(self, nodes)

    # -- what the passes ask ------------------------------------------------------------------
    def clone(self, share_params=False, **changes):
        """A new, unbuilt layer of this class and name with `changes` to its arguments.

        share_params=True: the clone uses this layer's Parameter objects (a lowering of a model
        that trains the same weights); else it declares its own when built.
        """
        layer = type(self)(**{**self.config(), **changes}, name=self.name)
        if share_params:
            layer.params = self.params
        return layer

    def fold_into_producer(self, producer, weights):
        """(producer', weights') with this layer's effect folded into the layer before it, or None.

        `weights` are the producer's host arrays by parameter name ('w', 'b'), in float64.
        """
        return None

    def fold_into_consumer(self, consumer, weights):
        """(consumer', weights') with this layer folded into the layer that reads it, or None."""
        return None

    # -- helpers for subclasses -----------------------------------------------------------
    def kernel_families(self, device, *names):
        """The device's kernel families `names` (device.kernels.<name>), once each has said it computes in
        the device's dtype (Device.dtype_problem); else one error naming this layer, raised at build."""
        why = device.dtype_problem(names)
        if why:
            raise self.error(why, DtypeError)
        return tuple(getattr(device.kernels, n) for n in names)

    def error(self, message, kind=ValueError):
        """A ValueError (or the subclass `kind`) naming this layer."""
        return kind(f"layer {self.name or type(self).__name__} ({type(self).__name__}): {message}")

    def expect_rank(self, shape, rank, what="input"):
        if len(shape) != rank:
            raise self.error(f"expects a {rank}-D {what} (with batch), got shape {_fmt(shape)}")

    def check_activation(self, activation):
        """The `activation` argument: None or one of the activations this layer applies."""
        if activation is not None and activation not in self.activations:
            raise self.error(f"activation must be None or one of {list(self.activations)}, got {activation!r}")
        return activation

    def config(self):
        """The constructor arguments, for checkpoints (JSON-serialisable)."""
        return {k: v for k, v in getattr(self, "_config", {}).items() if k != "name"}

    def __repr__(self):
        return f"{type(self).__name__}(name={self.name!r})"


def _fmt(shape):
    return "(" + ", ".join("N" if s is None else str(s) for s in shape) + ")"


def pair(v, what="value"):
    """An int or a 2-sequence as a pair of ints."""
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    t = tuple(int(x) for x in v)
    if len(t) != 2:
        raise ValueError(f"{what} must be an int or a pair, got {v!r}")
    return t


def positive_pair(layer, v, what):
    try:
        p = pair(v, what)
    except (TypeError, ValueError):
        raise layer.error(f"{what} must be an int or a pair of ints, got {v!r}") from None
    if min(p) <= 0:
        raise layer.error(f"{what} must be positive, got {v!r}")
    return p


def record_config(init):
    """Decorator for __init__: keep the constructor arguments (for checkpoints and summaries)."""
    import functools
    import inspect

    sig = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        cfg = {k: v for k, v in bound.arguments.items() if k != "self"}
        init(self, *args, **kwargs)
        self._config = {k: _jsonable(v) for k, v in cfg.items()}
    return wrapper


def _jsonable(v):
    """Tuples as lists and NumPy scalars as Python numbers, so configs go through JSON."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return v
