"""Helpers shared by the tests, never shipped in the package (the benchmarks import none of them).

    from tests.helpers import reference                        # naive loop forwards (float64)
    from minidl.testing import check_gradients, check_model_gradients    # the public gradient checker
    from tests.helpers.gradcheck import gradcheck, check_model            # its names in the tests
    from minidl.testing import randomize_weights               # non-trivial BN statistics and biases

`tests/conftest.py` puts the repository root on sys.path (pytest runs with --import-mode=importlib,
which adds nothing there itself), so `tests.helpers` imports from any test file.
"""
