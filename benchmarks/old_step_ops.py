"""What a captured training step ran before issue 42's fusions (its books and its batch gather one kernel
each, the dense layers' bias in the GEMM's epilogue): the operations, one launch each, for tests and
benchmarks/step_kernels.py to compare against (patched in as the families' functions)."""
from __future__ import annotations

import numpy as np


def _xp(a):
    if isinstance(a, np.ndarray):
        return np
    import cupy
    return cupy


def old_books(loss_sum, correct, finite, steps, loss_total, correct_total):
    """softmax.loss_tally as five operations (on the GPU five CuPy launches): isfinite, logical_and,
    three in-place adds; on NumPy arrays too (tests/test_step_books.py holds the CPU kernel to it)."""
    xp = _xp(finite)
    xp.logical_and(finite, xp.isfinite(loss_sum), out=finite)
    if steps is not None:
        steps += finite
    loss_total += loss_sum
    correct_total += correct


def old_gather(x, y, idx):
    """augment.gather_batch as two cupy.take."""
    import cupy as cp
    return cp.take(x, idx, axis=0), cp.take(y, idx, axis=0)


def patch_old(setattr_, device, dense=True):
    """Put the old operations in place of the fused ones on `device`'s families, through `setattr_`
    (pytest's monkeypatch.setattr, or a recorder that puts them back); the dense forward too if `dense`."""
    setattr_(device.kernels.softmax, "loss_tally", old_books)
    setattr_(device.kernels.augment, "gather_batch", old_gather)
    if dense:
        setattr_(device.kernels.dense, "dense_fprop", old_dense_fprop)


def old_dense_fprop(x, w, b=None, out=None):
    """dense.dense_fprop as cuBLAS's GEMM and, with a bias, CuPy's add: two launches."""
    import cupy as cp

    from minidl.kernels.gpu._cublas import gemm
    y = cp.empty((x.shape[0], w.shape[0]), x.dtype) if out is None else out
    gemm(x, w, y, trans_b=True)
    if b is not None:
        cp.add(y, b, out=y)
    return y
