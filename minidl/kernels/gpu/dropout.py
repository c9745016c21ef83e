"""Inverted dropout on the GPU, drawing from the device's CuPy generator."""
import cupy as cp

from ._util import out_arrays

# The mask buffer first receives uniform [0, 1) draws and is thresholded in place.
_fwd = cp.ElementwiseKernel("T x, T rate, T scale", "T y, T mask",
                            "mask = mask >= rate ? scale : (T)0; y = x * mask", "minidl_dropout")


def dropout_fprop(x, rate, rng, out=None):
    """y = x mask with mask 1/(1-rate) w.p. 1-rate, else 0.  -> (y, mask). `out` is y or (y, mask)."""
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    y, mask = out_arrays(out, [(x.shape, x.dtype), (x.shape, x.dtype)])
    # size must be given: CuPy 14's Generator.random(out=) without size draws ONE value and broadcasts it.
    # It also draws into a temporary and copies (one pool allocation per call: not yet CUDA-graph safe).
    rng.random(size=x.shape, dtype=x.dtype, out=mask)
    _fwd(x, rate, 1.0 / (1.0 - rate), y, mask)
    return y, mask


def dropout_bprop(gy, mask, out=None):
    """gx = gy mask (the mask holds 0 or 1/(1-rate))."""
    return cp.multiply(gy, mask, out=out)
