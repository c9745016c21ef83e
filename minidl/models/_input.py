"""The preprocessing the zoo's models carry at their input (docs/input.md).

Every zoo model starts with Normalize(MNIST's mean, std), so it takes the images of the input
contract (uint8 in [0, 255] or floats in [0, 1]) at every entry point: fit, evaluate, forward,
predict, inference, ONNX and the PyTorch twin. preprocess=False builds it without the layer: it reads
the [0, 1] images as they are, in training too (checkpoints load either way: the layer has no weights).
"""
from __future__ import annotations

from .. import layers as L
from ..layers.preprocess import MNIST


def preprocessing(preprocess: bool) -> list[L.Layer]:
    """[Normalize(MNIST's mean, std)] when `preprocess`, else []."""
    return [L.Normalize(*MNIST)] if preprocess else []
