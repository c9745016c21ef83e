"""Losses on arrays: softmax cross-entropy, computed stably from logits, and the Loss a step trains on.

A `Loss` is what `Trainer(loss=...)` and `TrainStep` differentiate: called on the logits (N, K) and
the int labels (N,), it gives the summed loss and the argmax hits as 0-d device arrays and writes the
gradient of the mean loss into a buffer the caller keeps, all on the device (nothing read back), so a
captured CUDA graph records it with the rest of the step. `SoftmaxCrossEntropy` is the default.
"""
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
    _check_shapes("softmax_cross_entropy", logits, labels)
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"softmax_cross_entropy: label smoothing must be in [0, 1), got {smoothing}")
    return kernels_for(logits).softmax.softmax_xent(logits, labels, gz, smoothing)


def hits(logits: Array, labels: Array) -> Array:
    """How many rows of logits (N, K) have their largest value at the label (N,): a 0-d count."""
    return (logits.argmax(axis=1) == labels).sum()


class Loss:
    """A training loss of logits (N, K) against int labels (N,).

    loss(logits, labels, gz) -> (loss_sum, correct): the per-sample losses summed and the argmax hits
    (`hits`), and gz (N, K) <- d(mean loss)/d logits, written in place (the caller's buffer: a captured
    step keeps it at one address). Write `value_and_grad` (the sum, the gradient into gz) with array
    operations only, no host reads; override `__call__` where hits come cheaper fused (SoftmaxCrossEntropy).
    The mean is over this process's batch: data-parallel ranks then average the gradients.
    """

    def __call__(self, logits: Array, labels: Array, gz: Array) -> tuple[Array, Array]:
        _check_shapes(type(self).__name__, logits, labels)
        return self.value_and_grad(logits, labels, gz), hits(logits, labels)

    def value_and_grad(self, logits: Array, labels: Array, gz: Array) -> Array:
        """The summed loss as a 0-d array; the gradient of the mean loss written into gz."""
        raise NotImplementedError(f"{type(self).__name__} must define value_and_grad(logits, labels, gz)")

    def plain(self) -> Loss:
        """The loss evaluation reports: this one, less what only shapes training (label smoothing)."""
        return self


class SoftmaxCrossEntropy(Loss):
    """-sum_k q_k log softmax(z)_k,  q = (1 - smoothing) onehot(label) + smoothing / K  (one fused kernel).

    smoothing: label smoothing in [0, 1) (Szegedy et al., 2016); evaluation reports the plain loss.
    """

    def __init__(self, smoothing: float = 0.0) -> None:
        if isinstance(smoothing, bool) or not isinstance(smoothing, (int, float)) or not 0.0 <= smoothing < 1.0:
            raise ValueError(f"SoftmaxCrossEntropy: label smoothing must be in [0, 1), got {smoothing!r}")
        self.smoothing = float(smoothing)

    def __call__(self, logits: Array, labels: Array, gz: Array) -> tuple[Array, Array]:
        loss_sum, correct, _ = softmax_cross_entropy(logits, labels, gz, self.smoothing)
        return loss_sum, correct

    def value_and_grad(self, logits: Array, labels: Array, gz: Array) -> Array:
        return softmax_cross_entropy(logits, labels, gz, self.smoothing)[0]

    def plain(self) -> Loss:
        return self if not self.smoothing else SoftmaxCrossEntropy()

    def __repr__(self) -> str:
        return f"SoftmaxCrossEntropy(smoothing={self.smoothing:g})"


def _check_shapes(what, logits, labels):
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"{what}: logits must be (N, classes) and labels (N,), "
                         f"got {tuple(logits.shape)} and {tuple(labels.shape)}")
