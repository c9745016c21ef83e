"""A dense layer's weight and bias gradients as one cuBLASLt GEMM (dense.dense_wgrad with gb: the BGRADB
epilogue): against float64 and against cuBLAS's GEMM and bias_grad's kernel it replaced, to float32
rounding, at LeNet-5's and odd shapes, a bias gradient off the 16-byte boundary; accumulating calls and
the other dtypes keep the two kernels; recorded into a CUDA graph."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.gpu import dense  # noqa: E402
from benchmarks.old_step_ops import old_dense_wgrad  # noqa: E402


def arrays(N, C, K, dtype=np.float32, offset=0, seed=0):
    """x, gy, gw and gb (`offset` values into an arena) on the device, made on the host in `dtype`."""
    rng = np.random.default_rng(seed)
    x, gy, gw = (rng.standard_normal(s).astype(np.float32).astype(dtype) for s in ((N, C), (N, K), (K, C)))
    arena = cp.asarray(rng.standard_normal(K + offset).astype(np.float32).astype(dtype))
    return cp.asarray(x), cp.asarray(gy), cp.asarray(gw), arena[offset:]


def exact(x, gy):
    x, gy = cp.asnumpy(x).astype(np.float64), cp.asnumpy(gy).astype(np.float64)
    return gy.T @ x, gy.sum(axis=0)


@pytest.mark.parametrize("N, C, K", [(32, 400, 120), (32, 120, 84), (32, 84, 10), (256, 400, 120), (256, 84, 10),
                                     (7, 5, 3), (1, 2048, 1000), (1000, 64, 10)])
@pytest.mark.parametrize("offset", [0, 1])                      # a bias gradient 4 bytes into the arena
def test_the_bias_gradient_epilogue_equals_gemm_and_bias_grad_to_float32_rounding(N, C, K, offset):
    x, gy, gw, gb = arrays(N, C, K, offset=offset)
    dense._NO_EPILOGUE.clear()
    assert dense.dense_wgrad(x, gy, gw, accumulate=False, gb=gb) is gw
    assert not dense._NO_EPILOGUE, "cuBLASLt refused the shape: the fused path did not run"
    got_w, got_b = cp.asnumpy(gw), cp.asnumpy(gb)
    old_w, old_b = cp.zeros_like(gw), cp.zeros_like(gb)
    old_dense_wgrad(x, gy, old_w, accumulate=False, gb=old_b)
    want_w, want_b = exact(x, gy)
    sw, sb = np.abs(want_w).max() + 1, np.abs(want_b).max() + 1
    assert np.abs(got_w - want_w).max() <= 2e-6 * sw * np.sqrt(N)       # full FP32 math, not TF32's
    assert np.abs(got_b - want_b).max() <= 2e-6 * sb * np.sqrt(N)
    assert np.abs(got_w - cp.asnumpy(old_w)).max() <= 4e-6 * sw * np.sqrt(N)
    assert np.abs(got_b - cp.asnumpy(old_b)).max() <= 4e-6 * sb * np.sqrt(N)
    again_w, again_b = cp.empty_like(gw), cp.empty_like(gb)
    dense.dense_wgrad(x, gy, again_w, accumulate=False, gb=again_b)
    np.testing.assert_array_equal(cp.asnumpy(again_w), got_w)          # one plan a shape: the same bits again
    np.testing.assert_array_equal(cp.asnumpy(again_b), got_b)


def test_an_accumulating_call_adds_both_gradients_through_the_two_kernels():
    x, gy, gw, gb = arrays(32, 84, 10)
    w0, b0 = cp.asnumpy(gw).astype(np.float64), cp.asnumpy(gb).astype(np.float64)
    dense.dense_wgrad(x, gy, gw, accumulate=True, gb=gb)          # the epilogue writes gb, never adds: not used
    want_w, want_b = exact(x, gy)
    np.testing.assert_allclose(cp.asnumpy(gw), w0 + want_w, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(cp.asnumpy(gb), b0 + want_b, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, "bfloat16"])
def test_other_dtypes_keep_cublas_and_bias_grad_bit_for_bit(dtype):
    from minidl.kernels.gpu._dtypes import BFLOAT16
    dt = BFLOAT16 if dtype == "bfloat16" else dtype
    x, gy, gw, gb = arrays(16, 30, 7, dt)
    old_w, old_b = cp.zeros_like(gw), cp.zeros_like(gb)
    dense.dense_wgrad(x, gy, gw, accumulate=False, gb=gb)
    old_dense_wgrad(x, gy, old_w, accumulate=False, gb=old_b)
    np.testing.assert_array_equal(cp.asnumpy(gw), cp.asnumpy(old_w))
    np.testing.assert_array_equal(cp.asnumpy(gb), cp.asnumpy(old_b))


def test_the_bias_gradient_epilogue_records_into_a_cuda_graph():
    x, gy, gw, gb = arrays(256, 400, 120)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        dense.dense_wgrad(x, gy, gw, accumulate=False, gb=gb)          # the plan made before the capture
        want_w, want_b = cp.asnumpy(gw), cp.asnumpy(gb)
        gw.fill(0)
        gb.fill(0)
        stream.begin_capture()
        dense.dense_wgrad(x, gy, gw, accumulate=False, gb=gb)
        graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(gw), want_w)
    np.testing.assert_array_equal(cp.asnumpy(gb), want_b)
