"""minidl: a small deep-learning framework with explicit forward and backward passes."""
from . import layers
from .backend import Device, get_device
from .graph import Input, Model, Sequential

__version__ = "0.1.0"
