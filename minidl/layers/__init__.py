"""Layers: one family per file. Each has build (shapes), forward and backward."""
from .activation import LeakyReLU, ReLU, Sigmoid, Tanh
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

__all__ = ["Input", "Node", "Layer", "Need", "Parameter", "Conv2D", "BatchNorm2D", "LRN", "ReLU", "LeakyReLU",
           "Sigmoid", "Tanh", "MaxPool2D", "AvgPool2D", "GlobalAvgPool2D", "Add", "Pad2D", "Flatten", "Dense",
           "Softmax", "Dropout", "Cast", "Normalize"]
