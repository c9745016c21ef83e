"""Half-precision storage on the CPU: float16/bfloat16 arrays, float32 arithmetic.

A precision policy runs on the CPU so that its casts and loss scaling are tested in CI; speed
there does not matter, exactness of the emulation does. `families(ns, dtype)` wraps every kernel
of the float32 families: a float16/bfloat16 array argument is read as float32, the float32
kernel computes (float32 accumulation, as tensor cores and cuBLAS's 32F compute type do), and
every float32 array it returns, and every half-precision argument it writes (`WRITTEN`: `out`,
the gradients it adds into, running statistics), is rounded back to that dtype, to nearest even.
Arguments of other dtypes (float32 BN statistics, integer labels, the generator) pass through untouched.
The GPU kernels take half types natively instead. Overflow and invalid-value warnings are off
inside these kernels (see `run`).
"""
from __future__ import annotations

import functools
import inspect
import types

import numpy as np

from ..._types import DTypeLike
from ..families import Kernels

# The arguments kernels write into, by name: outputs, gradients added into, BN's running statistics
# (the optimizers' updates are their rules over the array module, optim/reference.py: no kernel here).
WRITTEN = ("out", "gz", "gw", "gb", "ggamma", "gbeta", "running_mean", "running_var")


def families(ns: Kernels, dtype: DTypeLike) -> Kernels:
    """The families of `ns` (family name -> module) with kernels that store in `dtype` and compute in float32."""
    out = {}
    for name, module in vars(ns).items():
        if module is None:                 # an optional family the backend has none of
            continue
        fam = types.SimpleNamespace()
        for attr, fn in vars(module).items():
            wrapped = inspect.isfunction(fn) and not attr.startswith("_")
            setattr(fam, attr, _kernel(fn, np.dtype(dtype)) if wrapped else fn)
        out[name] = fam
    return Kernels(**out)


def _half(a):
    return isinstance(a, np.ndarray) and a.dtype.itemsize == 2 and a.dtype.kind in "fV"


def _kernel(fn, dtype):
    sig = inspect.signature(fn)
    written = [p for p in WRITTEN if p in sig.parameters]

    @functools.wraps(fn)
    def run(*args, **kwargs):
        wide = {}                          # id(half array) -> (the array, its float32 copy)

        def up(a):
            if isinstance(a, (list, tuple)):
                return type(a)(up(v) for v in a)
            if not _half(a):
                return a
            if id(a) not in wide:          # one copy per array: aliased in/out arguments stay aliased
                wide[id(a)] = (a, a.astype(np.float32))
            return wide[id(a)][1]

        if not any(_half(a) or isinstance(a, (list, tuple)) and any(map(_half, a))
                   for a in (*args, *kwargs.values())):
            return fn(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        # Beyond float16's range rounds to inf, as on the GPU, and an overflowed fp16 step carries
        # inf and NaN through backward until the loss scale skips it: routine, not worth a warning.
        with np.errstate(over="ignore", invalid="ignore"):
            result = fn(*up(args), **{k: up(v) for k, v in kwargs.items()})
            for name in written:           # write back what the kernel wrote, rounded
                a = bound.arguments.get(name)
                if _half(a):
                    a[...] = wide[id(a)][1]
            return _down(result, {id(copy): a for a, copy in wide.values()}, dtype)
    return run


def _down(y, back, dtype):
    """Results rounded to `dtype`; a written argument's float32 copy is that argument itself."""
    if isinstance(y, tuple):
        return tuple(_down(v, back, dtype) for v in y)
    if isinstance(y, np.ndarray):
        if id(y) in back:
            return back[id(y)]
        if y.dtype == np.float32:
            return y.astype(dtype)
    return y
