"""Names for type hints shared across minidl (hints only: nothing here runs at import).

An array is a NumPy array on the CPU and a CuPy array on the GPU; minidl's code is written once
for both (a Device's `xp`), so a hint cannot name one module's class: `Array` stands for either.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import numpy as np

Array = Any                          # numpy.ndarray or cupy.ndarray
DTypeLike = Union[np.dtype, str, type]
# a graph node's shape: ints, the batch dimension first and None until known (Any: a checker cannot tell
# the first entry from the rest, and shape arithmetic reads the others)
BatchShape = tuple[Any, ...]
IntOrPair = Union[int, Sequence[int]]   # a window size, stride or padding: an int or a pair of ints
# one kernel family (minidl/kernels/contract.py): a backend's module, or its half-storage wrapper (all
# of them, typed: minidl.kernels.families.Kernels)
KernelFamily = Any
# an initializer (minidl.init): f(rng, shape, fan_in, fan_out) -> float64 host array
Initializer = Callable[[np.random.Generator, tuple[int, ...], int, int], np.ndarray]
