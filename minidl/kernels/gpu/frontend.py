"""The cuDNN Frontend's Python module (`cudnn`), imported without PyTorch.

`import cudnn` imports torch when it is installed, for a torch-tensor wrapper (cudnn.wrapper) that
minidl never calls: minidl hands the Frontend raw device pointers and the Frontend's own data types.
That import was most of what `get_device("cuda")` cost. So the
first import hides torch from the Frontend; a process that imported torch itself keeps it as it is.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType


def load() -> ModuleType:
    """The `cudnn` module; ImportError (or the Frontend's own error) when it cannot be imported."""
    if "cudnn" in sys.modules or "torch" in sys.modules:
        return importlib.import_module("cudnn")
    sys.modules["torch"] = None  # type: ignore[assignment]  # while set, `import torch` raises ModuleNotFoundError
    try:
        return importlib.import_module("cudnn")
    finally:
        del sys.modules["torch"]
