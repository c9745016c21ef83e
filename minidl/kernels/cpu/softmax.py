"""Softmax over classes and the fused, stable softmax cross-entropy."""
import numpy as np


def softmax_fprop(x, out=None):
    """y = exp(x - max x) / sum exp(x - max x) over axis 1 of (N, K)."""
    y = np.subtract(x, x.max(axis=1, keepdims=True), out=out)
    np.exp(y, out=y)
    y /= y.sum(axis=1, keepdims=True)
    return y


def softmax_bprop(y, gy, out=None):
    """gx = y (gy - sum(gy y))."""
    dot = (gy * y).sum(axis=1, keepdims=True)
    return np.multiply(y, gy - dot, out=out)


def softmax_xent(z, labels, gz=None):
    """Cross-entropy of logits z (N, K) against int labels (N,), via log-softmax.

    Returns (loss_sum, correct, gz): the summed per-sample loss and the number of argmax hits
    as 0-d arrays, and gz = (softmax(z) - onehot) / N, the gradient of the mean loss.
    """
    N = z.shape[0]
    rows = np.arange(N)
    shifted = z - z.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    s = e.sum(axis=1, keepdims=True)
    # log p[label] = shifted[label] - log s: no log of a rounded probability.
    loss_sum = np.asarray(np.sum(np.log(s[:, 0]) - shifted[rows, labels]))
    correct = np.asarray(np.count_nonzero(np.argmax(z, axis=1) == labels))
    gz = np.divide(e, s, out=gz)
    gz[rows, labels] -= 1
    gz /= N
    return loss_sum, correct, gz
