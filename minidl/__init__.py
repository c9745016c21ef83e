"""minidl: a small deep-learning framework with explicit forward and backward passes."""
from .training import callbacks
from . import checkpoint
from . import data, graph, inference, layers, losses, metrics, models, optim, precision, threads
from .backend import Device, get_device
from .graph import Input, Model, Sequential
from .threads import set_threads
from .training.trainer import Trainer, TrainingDiverged, TrainingStopped
from .training.callbacks import Callback, TrainingInterrupted
from .training.history import EarlyStopping, History, ModelCheckpoint, ReduceLROnPlateau, StopAtAccuracy

__version__ = "0.1.0"

# the public names, what `from minidl import *` gives (tests/test_packaging.py: every name imported above is
# listed here, and every name listed exists); a new public import is added to both
__all__ = [
    # the sub-packages a user reaches through `dl.<name>`
    "callbacks", "checkpoint", "data", "graph", "inference", "layers", "losses", "metrics", "models", "optim",
    "precision", "threads",
    # the objects at the top level
    "Device", "get_device", "Input", "Model", "Sequential", "set_threads", "Trainer", "TrainingDiverged",
    "TrainingStopped", "TrainingInterrupted", "Callback", "History", "EarlyStopping", "ReduceLROnPlateau",
    "ModelCheckpoint", "StopAtAccuracy",
]


def _silent_unless_configured():
    """A library's logger (the logging HOWTO): records go where the application's logging sends them, nowhere
    by default; the command lines show them (minidl/cli/output.py). Imported here, so __all__ stays the API."""
    import logging
    logging.getLogger(__name__).addHandler(logging.NullHandler())


_silent_unless_configured()
