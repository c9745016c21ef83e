"""What a captured training step ran before its books and its batch gather became one kernel each
(issue 42): the CuPy operations, one launch each, for tests and benchmarks/step_kernels.py to compare
against (patched in as the families' functions)."""
from __future__ import annotations


def old_books(loss_sum, correct, finite, steps, loss_total, correct_total):
    """softmax.loss_tally as five CuPy launches: isfinite, logical_and, three in-place adds."""
    import cupy as cp
    cp.logical_and(finite, cp.isfinite(loss_sum), out=finite)
    if steps is not None:
        steps += finite
    loss_total += loss_sum
    correct_total += correct


def old_gather(x, y, idx):
    """augment.gather_batch as two cupy.take."""
    import cupy as cp
    return cp.take(x, idx, axis=0), cp.take(y, idx, axis=0)


def patch_old(setattr_, device):
    """Put the old operations in place of the fused ones on `device`'s families, through `setattr_`
    (pytest's monkeypatch.setattr, or a recorder that puts them back)."""
    setattr_(device.kernels.softmax, "loss_tally", old_books)
    setattr_(device.kernels.augment, "gather_batch", old_gather)
