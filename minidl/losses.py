"""Losses: softmax cross-entropy, computed stably from logits."""


def softmax_cross_entropy(model, labels, gz=None):
    """Mean cross-entropy of the last forward's logits against int `labels` (N,).

    For a model ending in Softmax the logits are that layer's input, so the log of a rounded
    probability is never taken. Returns (loss_sum, correct, gz) as 0-d device arrays and the
    gradient of the mean loss w.r.t. the logits; pass gz to `model.backward(gz, from_logits=...)`.
    """
    z = model.logits
    return model.device.kernels.softmax.softmax_xent(z, labels, gz)


def backward_from_loss(model, gz, accumulate=True):
    """Backpropagate the loss gradient w.r.t. the logits through the model (no input gradient)."""
    model.backward(gz, from_logits=model.ends_in_softmax, input_grads=False, accumulate=accumulate)
