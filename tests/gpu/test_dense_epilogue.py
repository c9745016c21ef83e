"""A dense layer's forward with the bias in cuBLASLt's epilogue (dense.dense_fprop): the product of
cuBLAS's GEMM and the add it replaced to float32 rounding, at LeNet-5's and odd shapes, a bias off the
16-byte boundary, the half types, float64 kept on cuBLAS (the same bits), recorded into a CUDA graph."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.gpu import dense  # noqa: E402
from benchmarks.old_step_ops import old_dense_fprop  # noqa: E402


def arrays(N, C, K, dtype=np.float32, bias_offset=0, seed=0):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((N, C)), rng.standard_normal((K, C)) / np.sqrt(C)
    arena = cp.asarray(rng.standard_normal(K + bias_offset).astype(dtype))
    return cp.asarray(x.astype(dtype)), cp.asarray(w.astype(dtype)), arena[bias_offset:]


@pytest.mark.parametrize("N, C, K", [(32, 400, 120), (32, 120, 84), (32, 84, 10), (256, 400, 120), (256, 84, 10),
                                     (7, 5, 3), (1, 2048, 1000)])
@pytest.mark.parametrize("bias_offset", [0, 1])                 # a bias 4 bytes into the arena
def test_the_bias_epilogue_equals_gemm_and_add_to_float32_rounding(N, C, K, bias_offset):
    x, w, b = arrays(N, C, K, bias_offset=bias_offset)
    dense._NO_EPILOGUE.clear()
    got = cp.asnumpy(dense.dense_fprop(x, w, b))
    assert not dense._NO_EPILOGUE, "cuBLASLt refused the shape: the fused path did not run"
    old = cp.asnumpy(old_dense_fprop(x, w, b))
    exact = cp.asnumpy(x).astype(np.float64) @ cp.asnumpy(w).astype(np.float64).T + cp.asnumpy(b)
    scale = np.abs(exact).max()
    assert np.abs(got - exact).max() <= 2e-6 * scale * np.sqrt(C)     # full FP32 math, not TF32's 10-bit mantissa
    assert np.abs(got - old).max() <= 4e-6 * scale * np.sqrt(C)
    out = cp.empty((N, K), np.float32)
    assert dense.dense_fprop(x, w, b, out=out) is out
    np.testing.assert_array_equal(cp.asnumpy(out), got)             # one plan per shape: the same bits again


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_half_types_take_the_epilogue_too(dtype):
    from minidl.kernels.gpu._dtypes import BFLOAT16, HALF
    dt = HALF if dtype == "float16" else BFLOAT16
    rng = np.random.default_rng(0)
    shapes = ((64, 256), (128, 256), (128,))
    x, w, b = (cp.asarray(rng.standard_normal(s).astype(np.float32).astype(dt)) for s in shapes)
    dense._NO_EPILOGUE.clear()
    got = cp.asnumpy(dense.dense_fprop(x, w, b))
    assert got.dtype == dt and not dense._NO_EPILOGUE
    want = cp.asnumpy(old_dense_fprop(x, w, b)).astype(np.float32)
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_float64_keeps_cublas_and_the_add_bit_for_bit():
    x, w, b = arrays(16, 30, 7, np.float64)
    np.testing.assert_array_equal(cp.asnumpy(dense.dense_fprop(x, w, b)), cp.asnumpy(old_dense_fprop(x, w, b)))
    np.testing.assert_array_equal(cp.asnumpy(dense.dense_fprop(x, w)), cp.asnumpy(old_dense_fprop(x, w, None)))


def test_the_bias_epilogue_records_into_a_cuda_graph():
    x, w, b = arrays(32, 400, 120)
    y = cp.empty((32, 120), np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        dense.dense_fprop(x, w, b, out=y)                           # the plan made before the capture
        want = cp.asnumpy(y)
        y.fill(0)
        stream.begin_capture()
        dense.dense_fprop(x, w, b, out=y)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(y), want)
