"""What a user needs to test a layer of their own: the gradient checker minidl's own layers pass, and
weights that exercise every parameter (for tests of inference, fusions and exports).

    from minidl.testing import check_gradients, randomize_weights
    check_gradients(Swish(beta=1.5), in_shapes=[(2, 3, 4, 4)])      # raises GradientError if wrong
    model = randomize_weights(dl.models.resnet(18))                 # BN statistics, gamma, beta, biases drawn

docs/custom-layers.md shows it on a worked example.
"""
from .gradients import GradientError, check_gradients, check_model_gradients, numeric_grad, rel_error
from .weights import randomize_weights

__all__ = ["GradientError", "check_gradients", "check_model_gradients", "numeric_grad", "rel_error",
           "randomize_weights"]
