"""Softmax over classes, the fused, stable softmax cross-entropy, and a training step's books of the loss."""
from __future__ import annotations

import numpy as np

from ..._types import Array


def softmax_fprop(x: Array, out: Array | None = None) -> Array:
    """y = exp(x - max x) / sum exp(x - max x) over axis 1 of (N, K)."""
    y = np.subtract(x, x.max(axis=1, keepdims=True), out=out)
    np.exp(y, out=y)
    y /= y.sum(axis=1, keepdims=True)
    return y


def softmax_bprop(y: Array, gy: Array, out: Array | None = None) -> Array:
    """gx = y (gy - sum(gy y))."""
    dot = (gy * y).sum(axis=1, keepdims=True)
    return np.multiply(y, gy - dot, out=out)


def softmax_xent(z: Array, labels: Array, gz: Array | None = None,
                 smoothing: float = 0.0) -> tuple[Array, Array, Array]:
    """Cross-entropy of logits z (N, K) against int labels (N,), via log-softmax.

    With label smoothing eps the target is q = (1 - eps) onehot + eps / K (Szegedy et al., 2016).
    Returns (loss_sum, correct, gz): the summed per-sample loss -sum_k q_k log p_k and the number
    of argmax hits as 0-d arrays, and gz = (softmax(z) - q) / N, the gradient of the mean loss.
    """
    N, K = z.shape
    rows = np.arange(N)
    shifted = z - z.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    s = e.sum(axis=1, keepdims=True)
    # -log p_k = log s - shifted_k: no log of a rounded probability. The smoothed loss is
    # log s - (1 - eps) shifted[label] - eps mean_k shifted_k (q sums to 1).
    loss = np.log(s[:, 0]) - shifted[rows, labels]
    if smoothing:
        loss += smoothing * (shifted[rows, labels] - shifted.mean(axis=1))
    loss_sum = np.asarray(np.sum(loss))
    correct = np.asarray(np.count_nonzero(np.argmax(z, axis=1) == labels))
    gz = np.divide(e, s, out=gz)
    if smoothing:
        gz -= z.dtype.type(smoothing / K)
    gz[rows, labels] -= z.dtype.type(1 - smoothing)
    gz /= N
    return loss_sum, correct, gz


def loss_tally(loss_sum: Array, correct: Array, finite: Array, steps: Array | None, loss_total: Array,
               correct_total: Array) -> None:
    """A training step's books after its loss, in place on 0-d arrays (training/step.py): the NaN flag
    finite &= isfinite(loss_sum); steps += finite, the steps before the first non-finite loss (None:
    the caller counts, after the ranks' AND of the flag); the running sums loss_total (float64) +=
    loss_sum and correct_total (int64) += correct. The GPU does it in one launch."""
    np.logical_and(finite, np.isfinite(loss_sum), out=finite)
    if steps is not None:
        steps += finite
    loss_total += loss_sum
    correct_total += correct
