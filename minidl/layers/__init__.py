"""Layers: one family per file. Each has build (shapes), forward and backward.

Every layer class a module here defines is exported (`__all__` is read from the layer registry, so a
class not imported below is missed by no one: tests/test_every_layer.py fails); the activations come
with activation.py's own `__all__`, so a new one is written in that file alone.
"""
# ruff: noqa: F401  (the imports are the exports: ruff cannot read an __all__ taken from the registry)
from . import registry
from .activation import *  # noqa: F403  (ReLU, LeakyReLU, Sigmoid, Tanh, ...: activation.__all__)
from .base import Layer, Need, Parameter
from .cast import Cast
from .conv import Conv2D
from .dense import Dense, Flatten
from .dropout import Dropout
from .merge import Add
from .node import Input, Node
from .norm import LRN, BatchNorm2D
from .pad import Pad2D
from .pool import AvgPool2D, GlobalAvgPool2D, MaxPool2D
from .preprocess import Normalize
from .softmax import Softmax

__all__ = ["Input", "Node", "Layer", "Need", "Parameter", *registry.defined_in(__name__)]
