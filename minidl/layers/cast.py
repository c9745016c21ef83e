"""Cast: a value converted to another floating-point dtype (the edges of a precision policy)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .. import precision
from .._types import Array, BatchShape, DTypeLike
from .base import ALL, Layer, Need, record_config

if TYPE_CHECKING:
    from ..backend import Device


class Cast(Layer):
    """y = x rounded to `dtype` (to nearest even; beyond float16's range: inf);  gx = gy in x's dtype.

    Any shape. The precision pass (minidl.graph.passes.cast) puts one wherever a value crosses
    between layers computing in a policy's dtype and layers that keep float32. The layers after a
    Cast compute in its dtype: a model infers dtypes along the graph as it infers shapes.
    """

    prefix = "cast"

    @record_config
    def __init__(self, dtype: DTypeLike, name: str | None = None) -> None:
        super().__init__(name)
        self.dtype = precision.dtype_of(dtype)
        if not precision.is_float(self.dtype):
            raise self.error(f"casts to floating-point dtypes only, got {dtype!r}")

    @property
    def out_dtype(self) -> np.dtype:  # type: ignore[override]  # read-only here, a class attribute elsewhere
        return self.dtype

    def config(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name}

    def build(self, in_shapes: Sequence[BatchShape], device: Device) -> BatchShape:
        shape, = in_shapes
        self.in_dtype = device.dtype           # the device a layer is built on computes in its input's dtype
        return tuple(shape)

    # Overflow to inf is the cast's defined result (fp16 loss scaling watches for it), not a warning.
    def forward(self, xs: Sequence[Array], training: bool) -> Array:
        x, = xs
        with np.errstate(over="ignore"):
            return _astype(x, self.dtype)

    def backward(self, gy: Array, need: Need = ALL) -> tuple[Array | None, ...]:
        with np.errstate(over="ignore"):
            return (_astype(gy, self.in_dtype),)


def _astype(a, dtype):
    """a in `dtype`, in a's memory order; a channels-last array is converted through its dense NHWC
    view (a copy over the strided array would gather value by value, 3x slower on the GPU)."""
    if a.ndim == 4 and not a.flags.c_contiguous:
        v = a.transpose(0, 2, 3, 1)
        if v.flags.c_contiguous:
            return v.astype(dtype).transpose(0, 3, 1, 2)
    return a.astype(dtype)
