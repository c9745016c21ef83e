"""The one per-op tolerance table the GPU tests compare with the CPU kernels through."""
import numpy as np

# (rtol, atol); atol is scaled by max(1, max |want|).
TOL = {
    "conv": (1e-4, 1e-5),        # TF32 off: FP32 sums of C*kH*kW products, in another order
    "conv_tf32": (0, 2e-2),      # TF32: products of 10-bit mantissas
    "dense": (1e-5, 1e-5),       # cuBLAS in FP32 (CuPy leaves TF32 off unless CUPY_TF32=1)
    "bn": (1e-4, 1e-5),          # statistics summed in another order
    "pool": (1e-6, 1e-6),
    "exact": (0, 0),             # copies, selections, products of two values
    "ulp": (1e-5, 1e-6),         # exp, tanh, pow: CUDA's and NumPy's libm differ by a few ulps
    "optim": (1e-5, 1e-6),
    "float64": (1e-11, 1e-12),   # float64 on both sides: sums in another order, libm's last ulp
    # A half-precision GPU kernel against the float32 CPU kernel on the same (rounded) inputs: float
    # sums, then the output rounded to 8 (bfloat16) or 11 (float16) significant bits, twice where a
    # kernel writes an intermediate (the GEMM before its bias, wgrad's scratch before the add): two ulps.
    "bfloat16": (2.0 ** -7, 2.0 ** -8),
    "float16": (2.0 ** -10, 2.0 ** -11),
}


def close(got, want, op):
    """Assert a device (or host) array equals the reference within TOL[op]."""
    rtol, atol = TOL[op]
    want = np.asarray(want)
    got = got.get() if hasattr(got, "get") else np.asarray(got)        # a CuPy array comes to the host
    if got.dtype.itemsize == 2 and got.dtype.kind in "fV":           # float16, bfloat16: compared as float32
        got = got.astype(np.float32)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=op)
