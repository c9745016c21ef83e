"""Layers: one family per file. Each has build (shapes), forward and backward."""
from ..graph import Input
from .activation import LeakyReLU, ReLU, Sigmoid, Tanh
from .base import Layer, Parameter
from .conv import Conv2D
from .dense import Dense, Flatten
from .dropout import Dropout
from .merge import Add
from .norm import LRN, BatchNorm2D
from .pad import Pad2D
from .pool import AvgPool2D, GlobalAvgPool2D, MaxPool2D
from .softmax import Softmax

__all__ = ["Input", "Layer", "Parameter", "Conv2D", "BatchNorm2D", "LRN", "ReLU", "LeakyReLU", "Sigmoid",
           "Tanh", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D", "Add", "Pad2D", "Flatten", "Dense",
           "Softmax", "Dropout"]
