"""The model's input contract: which images a model takes and how they are normalised (docs/input.md).

Every model takes the same images at every entry point: uint8 in [0, 255] (divided by 255) or floats
in [0, 1] (as they are); `pixel_scale` decides which, and refuses anything else. Nothing normalises
them but the model itself: a model that carries its preprocessing has a layer declaring
`takes_images` (layers.Normalize) reading its input, and `normalization` is the (mean, std) it
declares, what a Loader feeding its training lowering applies (the lowering drops the layer).

A concern of the model, so it lives with the layers that declare it, below every room that feeds
a model images: the data loaders (`data/loader.py`, `data/sources.py`), the graph's predict,
forward and evaluate (`graph/model.py`, `graph/network.py`) and the compiled model (`inference/model.py`).
"""
from __future__ import annotations

import warnings
from typing import Any, Protocol, Sequence

import numpy as np

from ..errors import DataError

CONTRACT = "uint8 in [0, 255] or floating point in [0, 1] (docs/input.md)"


class Model(Protocol):
    """What the contract reads of a model (a graph.Model; the layers sit below the graph, so they name no more)."""
    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> Sequence[Any]: ...
    @property
    def nodes(self) -> Sequence[Any]: ...
    @property
    def outputs(self) -> Sequence[Any]: ...


def pixel_scale(images: np.ndarray, where: str = "images") -> int:
    """What the images are divided by to lie in [0, 1]: 255 for uint8, 1 for floating images in [0, 1].

    The one input contract of Loader (so of Trainer.fit and evaluate), docs/input.md. Anything else is
    a DataError (a ValueError) naming the range or dtype found: 0-255 floats would train on pixels 255x
    too bright, [0, 1] floats taken for uint8 were divided by 255 twice (11% after 500 steps), and data
    normalised before would be normalised again. Integers other than uint8 and booleans are refused:
    their dtype does not say which scale they use. NaN passes, as a training loss stops on it.
    """
    if images.dtype == np.uint8:
        return 255
    if not np.issubdtype(images.dtype, np.floating):
        raise DataError(f"{where}: dtype {images.dtype}, expected {CONTRACT}")
    if images.size == 0:                # no values to range: the caller names the empty batch
        return 1
    with warnings.catch_warnings():     # all-NaN images: NaN passes (above), without NumPy's warning line
        warnings.simplefilter("ignore", RuntimeWarning)
        lo, hi = float(np.nanmin(images)), float(np.nanmax(images))     # one pass each, on the host
    if lo < 0 or hi > 1:
        why = ("infinite values" if np.isinf(lo) or np.isinf(hi) else
               "0-255 values? divide them by 255, or pass uint8" if lo >= 0 and hi <= 255 else
               "normalised already? pass the [0, 1] images: minidl normalises them (a model's Normalize, "
               "the Loader's normalize=)")
        raise DataError(f"{where}: {images.dtype} values in [{lo:.4g}, {hi:.4g}], expected {CONTRACT}; {why}")
    return 1


def images_in(images: Any, where: str, xp: Any = np, check: bool = True) -> Any:
    """Images at an entry point of a model: uint8 in [0, 255] divided by 255 (in float32), floats in
    [0, 1] as they are (with `check`, a host array's range is checked: pixel_scale's one DataError line,
    naming `where`, the dtype and the range). A device float array is not checked (that would wait for
    the device)."""
    if getattr(images, "dtype", None) == np.uint8:
        return xp.divide(images, np.float32(255), dtype=np.float32)
    if not check:
        return images
    if isinstance(images, np.ndarray):
        pixel_scale(images, where)
    elif not np.issubdtype(getattr(images, "dtype", np.dtype(np.float32)), np.floating):
        raise DataError(f"{where}: dtype {images.dtype}, expected {CONTRACT}")
    return images


def preprocessing(model: Model) -> Any:
    """The layer at `model`'s input that declares `takes_images` (layers.Normalize), or None: a model
    without it, which takes the contract's images as they are (floats in [0, 1])."""
    inputs = {id(n) for n in model.inputs}
    for node in model.nodes:
        if getattr(node.layer, "takes_images", False) and all(id(p) in inputs for p in node.parents):
            return node.layer
    return None


def takes_images(model: Model) -> bool:
    """Whether `model` carries its preprocessing (a Normalize at its input). Every model takes the
    contract's images at every entry point; one that carries it normalises them itself."""
    return preprocessing(model) is not None


def normalization(model: Model) -> bool | tuple[Any, Any]:
    """What a Loader feeding `model`'s training lowering applies (its `normalize=`): the (mean, std)
    the model's preprocessing declares (the lowering drops that layer, passes.drop_preprocessing), or
    False for a model without one: it trains on the contract's images as they are, floats in [0, 1]
    (uint8 / 255), what every entry point then gives it (docs/input.md). Nothing is applied that the
    model does not declare. The Trainer builds its Loaders so."""
    layer = preprocessing(model)
    if layer is None:
        return False
    return tuple(v[0] if len(v) == 1 else list(v) for v in (layer.mean, layer.std))  # type: ignore[return-value]
