"""The names users bring to a Model: Keras's `predict`, `get_layer` (`layer`) and `get_weights`, PyTorch's
`parameters` / `named_parameters`, pickle and copy.deepcopy, and a repr that says what the model is. Model
(graph/model.py) takes them in as a base class.

`predict` and `evaluate` are the graph room's one use of `data`: images go through the Loader, as
fit's do, and every entry point reads the model's input contract (layers/input_contract.py,
docs/input.md) from one place: uint8 / 255 or floats in [0, 1], normalised only by a model's own Normalize.
"""
from __future__ import annotations

from collections.abc import Iterator
from numbers import Integral
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .._types import Array
from ..data.errors import DataError
from ..data.loader import Loader
from ..data.sources import layout, renamed
from ..layers.base import _fmt
from ..layers.input_contract import images_in, takes_images
from ..metrics import Score
from .summary import print_summary

if TYPE_CHECKING:
    from numpy.typing import ArrayLike

    from ..backend import Device
    from ..layers.base import Layer, Parameter
    from ..layers.node import Node
    from .arena import Arenas, Copies


class FamiliarAPI:
    """predict(x), parameters(), named_parameters() and repr over Model's forward and arenas."""

    if TYPE_CHECKING:              # what Model (graph/model.py) has, for the type checker
        name: str
        device: Device
        single_input: bool
        single_output: bool
        inputs: list[Node]
        outputs: list[Node]
        layers: list[Layer]
        params: dict[str, Parameter]
        copies: list[Copies]
        side_arenas: dict[np.dtype, Arenas]
        releases: bool
        _out_shapes: list[tuple[int, ...]] | None
        _deaths: list[list[int]] | None
        seed: int

        def config(self) -> dict[str, Any]: ...

        @property
        def n_params(self) -> int: ...

        def forward(self, *xs: Array, training: bool = False) -> Any: ...

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
        takes = takes_images(self)
        if takes and normalize not in (None, False):
            raise ValueError(f"{self.name}.predict: normalize={normalize!r}, but {self.name} carries its own "
                             "Normalize: pass the images alone")
        images = _nchw(self, np.asarray(x), data_format, f"{self.name}.predict")
        try:
            loader = Loader(images, np.zeros(len(images) if images.ndim else 0, np.int64), batch_size, self.device,
                            shuffle=False, drop_last=False, normalize=normalize or False)
        except DataError as e:
            raise renamed(e, f"{self.name}.predict") from None
        return np.concatenate([np.array(self.device.to_host(self.forward(xb, training=False))) for xb, _ in loader])

    def images_in(self, x: Any, i: int = 0) -> Any:
        """Input `i` as the model's first layer reads it (docs/input.md): uint8 images divided by 255,
        (N, H, W) images given their channel where the input is (1, H, W), and for a model that carries
        its preprocessing (layers.Normalize) a host float array's range checked to be in [0, 1] (one
        DataError naming `{name}.forward`, the dtype and the range). Model.forward calls it before
        prepare_input (a training lowering reads the Loader's float batches: they pass as they are)."""
        takes = self.__dict__.get("_takes_images")
        if takes is None:                  # the graph is fixed once built: looked up once
            takes = self.__dict__["_takes_images"] = takes_images(self)  # type: ignore[arg-type]  # self is a Model
        shape = tuple(self.inputs[i].shape[1:])
        if len(shape) == 3 and shape[0] == 1 and tuple(getattr(x, "shape", ()))[1:] == shape[1:]:
            x = x.reshape(x.shape[0], *shape)                   # (N, H, W) -> (N, 1, H, W), as fit takes them
        xp = self.device.xp if isinstance(x, self.device.xp.ndarray) else np
        return images_in(x, f"{self.name}.forward images", xp, check=takes)

    def evaluate(self, x: ArrayLike, y: ArrayLike, batch_size: int = 256,
                 normalize: bool | tuple[float, float] | None = None, data_format: str | None = None) -> Score:
        """Score(mean cross-entropy, accuracy as a fraction) of the model on images `x` and int labels `y`,
        without a Trainer (Keras's model.evaluate): batches as predict takes them (the input contract,
        `normalize` as predict's, dropout off, BN's running statistics). A model ending in a Softmax is
        scored on its probabilities, one without on its logits; Trainer.evaluate's numbers, up to rounding.
        data_format: 'channels_last' for (N, H, W, C) images, found from the shape alone where it says so."""
        if not (self.single_input and self.single_output):
            raise ValueError(f"{self.name}: evaluate takes a model of one input and one output; call forward")
        if takes_images(self) and normalize not in (None, False):  # type: ignore[arg-type]  # self is a Model
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

    def freeze(self, *names: str) -> FamiliarAPI:
        """Freeze weights (Keras's `layer.trainable = False`, torch's requires_grad_(False)): the named
        layers' or 'layer/param' weights, all of them where none is named. The optimizer leaves a frozen
        weight, its decay and its state as they are, also in a step captured before (docs/training.md)."""
        for p in self._weights_named(names, "freeze"):
            p.trainable = False
        return self

    def unfreeze(self, *names: str) -> FamiliarAPI:
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

    def summary(self, print_fn: Callable[[str], object] = print) -> None:
        """Print layer, output shape and parameter count, one row per layer, and the totals."""
        print_summary(self, print_fn)  # type: ignore[arg-type]  # self is a Model

    def __repr__(self) -> str:
        ins = ", ".join(str(tuple(n.shape[1:])) for n in self.inputs)
        device = getattr(self, "device", None)
        where = f"{device.name} {device.dtype.name}" if device is not None else "not built"
        return (f"Model({self.name!r}: input {ins}, {len(self.layers)} layers, {self.n_params:,} parameters, "
                f"{where})")

    # -- the model's input, its layers and arrays by name --------------------------------------
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

    def layer(self, name: str) -> Layer:
        """The layer named `name` (Keras's get_layer); a KeyError lists the names there are."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(f"{self.name} has no layer {name!r}; layers: {', '.join(other.name for other in self.layers)}")

    def get_weights(self) -> dict[str, np.ndarray]:
        """{'layer/param': NumPy array} for every parameter and running statistic."""
        return {k: np.array(self.device.to_host(p.data)) for k, p in self.params.items()}

    def get_grads(self) -> dict[str, np.ndarray]:
        """{'layer/param': NumPy array} of the weights' gradients (frozen ones too)."""
        return {k: np.array(self.device.to_host(p.grad)) for k, p in self.params.items() if p.weight}

    # -- pickle and copy ----------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        """A model pickles as its config, weights, device, dtype and seed, and unpickles (copy.deepcopy,
        copy.copy) as a new model of its own arenas with equal weights. The layer classes travel as
        pickle's references, so unpickling imports the modules that define them."""
        classes = sorted({type(layer) for layer in self.layers}, key=lambda c: (c.__module__, c.__name__))
        return _unpickle, (type(self), self.config(), self.get_weights(), self.device.name, self.device.dtype.name,
                           self.seed, classes)


def _nchw(model: Any, images: np.ndarray, data_format: str | None, where: str) -> np.ndarray:
    """`images` as (N, C, H, W) where they come NHWC (data_format='channels_last', or the shape alone says
    so): fit's rule (data/sources.layout), so predict and evaluate take what fit takes."""
    return layout(model, data_format, where)(images, f"{where} images")


def _unpickle(model: Any, config: dict[str, Any], weights: dict[str, np.ndarray], device: str, dtype: str,
              seed: int, classes: list[type]) -> Any:
    """Model.__reduce__'s inverse: `model` is the Model class (`classes` are there so that pickle imports
    the modules defining the layers first)."""
    return model.from_config(config, device=device, dtype=dtype, seed=seed, weights=weights)
