"""The CPU backend: NumPy arrays, the reference kernels of minidl/kernels/cpu/, MPI collectives.

A precision policy's float16/bfloat16 compute on the CPU runs the float32 kernels over half storage
(kernels/cpu/storage.py wraps every family), so CI checks its casts and loss scaling without a GPU.
"""
from __future__ import annotations

import importlib
import types
from typing import Any

import numpy as np

from .. import precision, threads
from .._types import Array, DTypeLike
from ..kernels.families import Kernels
from . import Backend, register

_HALF: dict[np.dtype, Kernels] = {}     # dtype -> the families storing in it (one set per dtype)


class CPU(Backend):
    """NumPy on the host: every answer is the host default of `Backend` but the kernels' half storage."""

    name, kernels_package, label = "cpu", "minidl.kernels.cpu", "CPU"

    def owns(self, a: Array) -> bool:
        return isinstance(a, np.ndarray)

    def start(self, gpu: int | None) -> tuple[types.ModuleType, Any]:
        threads.use_default()        # BLAS threads as the command lines choose them, unless the user chose
        return np, None

    def kernels(self, dtype: DTypeLike, current: Kernels | None = None) -> Kernels:
        """The float families, or for float16/bfloat16 the same wrapped to store in it and compute in float32."""
        dtype = np.dtype(dtype)
        if dtype not in precision.HALF:
            return self.families()
        if dtype not in _HALF:
            _HALF[dtype] = importlib.import_module("minidl.kernels.cpu.storage").families(self.families(), dtype)
        return _HALF[dtype]


register(CPU())
