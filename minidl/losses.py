"""Losses on arrays: softmax cross-entropy, computed stably from logits."""
from __future__ import annotations

from ._types import Array
from .backend import kernels_for


def softmax_cross_entropy(logits: Array, labels: Array, gz: Array | None = None,
                          smoothing: float = 0.0) -> tuple[Array, Array, Array]:
    """Mean cross-entropy of logits (N, K) against int labels (N,), from log-softmax; with label
    smoothing eps in [0, 1) against the target (1 - eps) onehot + eps / K.

    Returns (loss_sum, correct, gz) as 0-d device arrays and the gradient of the mean loss
    w.r.t. the logits, written into `gz` when given (a fixed buffer for captured steps).
    """
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"softmax_cross_entropy: logits must be (N, classes) and labels (N,), "
                         f"got {tuple(logits.shape)} and {tuple(labels.shape)}")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"softmax_cross_entropy: label smoothing must be in [0, 1), got {smoothing}")
    return kernels_for(logits).softmax.softmax_xent(logits, labels, gz, smoothing)
