"""minidl: a small deep-learning framework with explicit forward and backward passes."""
from .training import callbacks
from .files import checkpoint
from . import data, graph, inference, layers, losses, metrics, models, optim, precision, threads
from .backend import Device, get_device
from .graph import Input, Model, Sequential
from .threads import set_threads
from .training.trainer import Trainer, TrainingDiverged, TrainingStopped

__version__ = "0.1.0"
