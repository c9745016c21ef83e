"""What a user needs to test a layer of their own: the gradient checker minidl's own layers pass.

    from minidl.testing import check_gradients
    check_gradients(Swish(beta=1.5), in_shapes=[(2, 3, 4, 4)])      # raises GradientError if wrong

docs/custom-layers.md shows it on a worked example.
"""
from .gradients import GradientError, check_gradients, check_model_gradients, numeric_grad, rel_error

__all__ = ["GradientError", "check_gradients", "check_model_gradients", "numeric_grad", "rel_error"]
