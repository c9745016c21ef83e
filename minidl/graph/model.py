"""Model and Sequential: a Network (network.py) as its user holds it, with the names users bring from Keras
and PyTorch: images in (`predict`, `evaluate`), weights by name (`get_weights`, `named_parameters`,
`freeze`), the architecture as JSON (`config`, `from_config`) and pickle, the `summary` and the repr.

`predict` and `evaluate` are the graph room's one use of `data`: images go through the Loader, as
fit's do, and every entry point reads the model's input contract (layers/input_contract.py,
docs/input.md) from one place: uint8 / 255 or floats in [0, 1], normalised only by a model's own Normalize.
"""
from __future__ import annotations

from collections.abc import Iterator
from numbers import Integral
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .._types import Array
from ..data.errors import DataError
from ..data.loader import Loader
from ..data.sources import layout, renamed
from ..layers.base import Layer
from ..layers.node import Input
from ..metrics import Score
from .config import config_of, graph_of_config
from .network import Network
from .summary import print_summary

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


class Model(Network):
    """A DAG of layers from `inputs` to `outputs`, built on `device` in `dtype` (a Network), as its user holds it.

    forward(x, training) -> y;  backward(gy) -> gx, adding parameter gradients into `grads`.
    predict(images) -> class probabilities; parameters(), named_parameters(), summary(): below.
    weights: {'layer/param': array} to start from (checked against the model before anything is
    allocated) instead of the seeded initializers. Nodes another Model was built on give this one
    copies of their layers, starting from that model's weights (each model trains its own).
    A model pickles (and deep-copies) as its config and weights.
    """

    # -- images in -----------------------------------------------------------------------------
    def predict(self, x: ArrayLike, batch_size: int = 256, normalize: bool | tuple[float, float] | None = None,
                data_format: str | None = None) -> np.ndarray:
        """The model's output for images `x`, in evaluation mode, as a host NumPy array (N, classes):
        what Model.forward gives for them (class probabilities for a model that ends in a Softmax, as the
        zoo's nets do; logits for one without), and what the compiled model, `minidl infer`, its artifact
        and its ONNX file give.

        x: (N, H, W) or (N, C, H, W), uint8 in [0, 255] or floats in [0, 1], the input contract of
        Trainer.fit and evaluate (docs/input.md), checked by the same Loader; anything else is a
        DataError (a ValueError). A model that carries its preprocessing (layers.Normalize) applies it
        itself; a model without one reads the images as they are, floats in [0, 1], as fit trained it.
        normalize: for a model without Normalize trained on normalised images (a Loader's `normalize`,
        e.g. True for MNIST's mean and std): the Loader applies it first. Refused for a model with one.
        `batch_size` images go through each forward (dropout off, BN's running statistics).
        data_format: 'channels_last' for (N, H, W, C) images, found from the shape alone where it says so
        (as fit's, data/sources.py).
        """
        if not (self.single_input and self.single_output):
            raise ValueError(f"{self.name}: predict takes a model of one input and one output; call forward")
        if isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size <= 0:
            raise ValueError(f"{self.name}.predict: batch_size must be a positive int, got {batch_size!r}")
        if self._takes_images and normalize not in (None, False):
            raise ValueError(f"{self.name}.predict: normalize={normalize!r}, but {self.name} carries its own "
                             "Normalize: pass the images alone")
        images = _nchw(self, np.asarray(x), data_format, f"{self.name}.predict")
        try:
            loader = Loader(images, np.zeros(len(images) if images.ndim else 0, np.int64), batch_size, self.device,
                            shuffle=False, drop_last=False, normalize=normalize or False)
        except DataError as e:
            raise renamed(e, f"{self.name}.predict") from None
        return np.concatenate([np.array(self.device.to_host(self.forward(xb, training=False))) for xb, _ in loader])

    def evaluate(self, x: ArrayLike, y: ArrayLike, batch_size: int = 256,
                 normalize: bool | tuple[float, float] | None = None, data_format: str | None = None) -> Score:
        """Score(mean cross-entropy, accuracy as a fraction) of the model on images `x` and int labels `y`,
        without a Trainer (Keras's model.evaluate): batches as predict takes them (the input contract,
        `normalize` as predict's, dropout off, BN's running statistics). A model ending in a Softmax is
        scored on its probabilities, one without on its logits; Trainer.evaluate's numbers, up to rounding.
        data_format: 'channels_last' for (N, H, W, C) images, found from the shape alone where it says so."""
        if not (self.single_input and self.single_output):
            raise ValueError(f"{self.name}: evaluate takes a model of one input and one output; call forward")
        if self._takes_images and normalize not in (None, False):
            raise ValueError(f"{self.name}.evaluate: normalize={normalize!r}, but {self.name} carries its own "
                             "Normalize: pass the images alone")
        images, labels = _nchw(self, np.asarray(x), data_format, f"{self.name}.evaluate"), np.asarray(y)
        try:
            loader = Loader(images, labels, batch_size, self.device, shuffle=False, drop_last=False,
                            classes=self.outputs[0].shape[-1], normalize=normalize or False)
        except DataError as e:
            raise renamed(e, f"{self.name}.evaluate") from None
        probabilities = self.layers[-1].kind == "softmax"
        loss, hits = 0.0, 0
        for xb, yb in loader:
            out = np.asarray(self.device.to_host(self.forward(xb, training=False)), np.float64)   # (N, classes)
            yb = np.asarray(self.device.to_host(yb)).astype(np.int64)
            if probabilities:
                logp = np.log(np.maximum(out, np.finfo(np.float64).tiny))
            else:                            # log-softmax, shifted by the max for stability
                z = out - out.max(axis=1, keepdims=True)
                logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            loss -= float(logp[np.arange(len(yb)), yb].sum())
            hits += int((out.argmax(axis=1) == yb).sum())
        n = max(len(labels), 1)
        return Score(loss / n, hits / n)

    # -- weights and layers by name -------------------------------------------------------------
    def freeze(self, *names: str) -> Model:
        """Freeze weights (Keras's `layer.trainable = False`, torch's requires_grad_(False)): the named
        layers' or 'layer/param' weights, all of them where none is named. The optimizer leaves a frozen
        weight, its decay and its state as they are, also in a step captured before (docs/training.md)."""
        for p in self._weights_named(names, "freeze"):
            p.trainable = False
        return self

    def unfreeze(self, *names: str) -> Model:
        """Unfreeze weights, as freeze names them (all where none is named)."""
        for p in self._weights_named(names, "unfreeze"):
            p.trainable = True
        return self

    def _weights_named(self, names, what):
        if not names:
            return [p for p in self.params.values() if p.weight]
        layers = {layer.name: layer for layer in self.layers}
        unknown = [n for n in names if n not in layers and n not in self.params]
        if unknown:
            raise ValueError(f"{self.name}.{what}: no layer or parameter {', '.join(map(repr, unknown))}; layers: "
                             f"{', '.join(layers)}")
        return [p for n in names
                for p in (layers[n].params.values() if n in layers else [self.params[n]]) if p.weight]

    def named_parameters(self) -> Iterator[tuple[str, Array]]:
        """('layer/param', array) for each weight (frozen ones too), in layer order, as torch's named_parameters.

        The arrays are views into the model's flat arena, on its device: assigning into one
        (`w[...] = ...`) changes the model. BN's running statistics are state, not parameters
        (torch's buffers): get_weights() has them too.
        """
        return ((k, p.data) for k, p in self.params.items() if p.weight)

    def parameters(self) -> Iterator[Array]:
        """The arrays of named_parameters(), as torch's parameters()."""
        return (a for _, a in self.named_parameters())

    @property
    def n_params(self) -> int:
        """Weights, frozen ones included (the flat buffer also holds alignment gaps)."""
        return sum(p.size for p in self.params.values() if p.weight)

    def get_grads(self) -> dict[str, np.ndarray]:
        """{'layer/param': NumPy array} of the weights' gradients (frozen ones too)."""
        return {k: np.array(self.device.to_host(p.grad)) for k, p in self.params.items() if p.weight}

    def layer(self, name: str) -> Layer:
        """The layer named `name` (Keras's get_layer); a KeyError lists the names there are."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer {name!r}; layers: {', '.join(other.name for other in self.layers)}")

    # -- what it is, in words -----------------------------------------------------------------------
    def summary(self, print_fn: Callable[[str], object] = print) -> None:
        """Print layer, output shape and parameter count, one row per layer, and the totals."""
        print_summary(self.nodes, self.params, print_fn)

    def __repr__(self) -> str:
        ins = ", ".join(str(tuple(n.shape[1:])) for n in self.inputs)
        device = getattr(self, "device", None)
        where = f"{device.name} {device.dtype.name}" if device is not None else "not built"
        return (f"Model({self.name!r}: input {ins}, {len(self.layers)} layers, {self.n_params:,} parameters, "
                f"{where})")

    # -- the architecture as JSON, and pickle ---------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The architecture as JSON-able data: inputs, and each layer's class, arguments and inputs."""
        return config_of(self.name, self.inputs, self.nodes, self.outputs)     # graph/config.py, beside its reverse

    @classmethod
    def from_config(cls, config: dict[str, Any], **kwargs: Any) -> Model:
        """Rebuild a model from `config()`; kwargs (device, dtype, seed, weights) go to Model.

        A config that is not one `config()` could have written raises a ValueError naming the
        part that is wrong; with `weights`, they are checked against it before any allocation.
        """
        return cls(*graph_of_config(config), name=str(config.get("name", "model")), **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        """A model pickles as its config, weights, device, dtype and seed, and unpickles (copy.deepcopy,
        copy.copy) as a new model of its own arenas with equal weights. The layer classes travel as
        pickle's references, so unpickling imports the modules that define them."""
        classes = sorted({type(layer) for layer in self.layers}, key=lambda c: (c.__module__, c.__name__))
        return _unpickle, (type(self), self.config(), self.get_weights(), self.device.name, self.device.dtype.name,
                           self.seed, classes)


def Sequential(layers: Sequence[Layer], input_shape: Sequence[int], **kwargs: Any) -> Model:
    """A Model that chains `layers` from one input of per-sample `input_shape`."""
    x = h = Input(input_shape)
    for layer in layers:
        if not isinstance(layer, Layer):
            raise TypeError(f"Sequential takes layers, got {type(layer).__name__}")
        h = layer(h)
    return Model(x, h, **kwargs)


def _nchw(model: Any, images: np.ndarray, data_format: str | None, where: str) -> np.ndarray:
    """`images` as (N, C, H, W) where they come NHWC (data_format='channels_last', or the shape alone says
    so): fit's rule (data/sources.layout), so predict and evaluate take what fit takes."""
    return layout(model, data_format, where)(images, f"{where} images")


def _unpickle(model: Any, config: dict[str, Any], weights: dict[str, np.ndarray], device: str, dtype: str,
              seed: int, classes: list[type]) -> Any:
    """Model.__reduce__'s inverse: `model` is the Model class (`classes` are there so that pickle imports
    the modules defining the layers first)."""
    return model.from_config(config, device=device, dtype=dtype, seed=seed, weights=weights)
