"""Layers: one family per file. Each has build (shapes), forward and backward."""
from ..graph import Input
from .activation import LeakyReLU, ReLU, Sigmoid, Tanh
from .base import Layer, Parameter
from .conv import Conv2D
from .dense import Dense, Flatten
from .merge import Add
from .pad import Pad2D
from .softmax import Softmax

try:        # written concurrently; registered here once they exist
    from .norm import LRN, BatchNorm2D
except ImportError:
    pass
try:
    from .pool import AvgPool2D, GlobalAvgPool2D, MaxPool2D
except ImportError:
    pass
try:
    from .dropout import Dropout
except ImportError:
    pass
