"""Helpers shared by the tests (and the benchmarks), never shipped in the package.

    from tests.helpers import reference                        # naive loop forwards (float64)
    from tests.helpers.gradcheck import gradcheck, check_model, numeric_grad, rel_error
    from tests.helpers import randomize_weights                # non-trivial BN statistics and biases

`tests/conftest.py` puts the repository root on sys.path (pytest runs with --import-mode=importlib,
which adds nothing there itself), so `tests.helpers` imports from any test file.
"""
from .weights import randomize_weights

__all__ = ["randomize_weights"]
