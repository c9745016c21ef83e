"""Helpers shared by the NumPy kernel families."""


def emit(y, out):
    """y, or y copied into `out` when one is given (the kernels' `out=` contract)."""
    if out is None:
        return y
    out[...] = y
    return out
