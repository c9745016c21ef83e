"""The max-pool kernels' fast paths against pool.py's one-value-a-thread kernels, bit for bit, and
against the CPU: the vectorised channels-last ones (kernels/gpu/_pool_vec.py) over windows that
overlap, padding, ties (values drawn from a few levels, so a window often holds its maximum twice)
and NaN, and the NCHW backward a window a thread where windows tile the input, in float32, bfloat16
and float16."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from minidl.kernels.cpu import pool as cpu_pool  # noqa: E402
from minidl.kernels.gpu import _pool_vec, pool  # noqa: E402
from minidl.kernels.gpu._util import NHWC, channels_last  # noqa: E402
from minidl.precision import dtype_of  # noqa: E402

GEOMETRIES = [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 3), (1, 1), (1, 1)), ((2, 3), (1, 2), (0, 1))]


def _nhwc(a, dtype):
    return cp.asarray(np.ascontiguousarray(a.transpose(0, 2, 3, 1))).astype(dtype).transpose(0, 3, 1, 2)


def _scalar(kernel, plan, arrays, like):
    """pool.py's ElementwiseKernel path on the same arrays (what ran before the vectorised kernels)."""
    out = cp.empty_like(like.transpose(NHWC)).transpose(0, 3, 1, 2)
    return pool._run(kernel, arrays, out, (plan, arrays[0].shape[1], arrays[0].shape))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_vectorised_max_pool_equals_the_scalar_kernels_bit_for_bit(dtype, geometry):
    dt = dtype_of(dtype)
    ksize, stride, pad = geometry
    shape = (3, 16, 7, 9)
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, shape).astype(np.float32)           # few levels: ties in most windows
    x[0, 3, 2, 2] = np.nan
    x = _nhwc(x, dt)
    plan = pool.pool2d_plan(shape, ksize, stride, pad)
    y = pool.maxpool2d_fprop(plan, x)
    assert channels_last(y) and _pool_vec.takes([x.transpose(NHWC), y.transpose(NHWC)], shape[1])
    want = _scalar("max_f", plan, [x], y)
    assert cp.array_equal(y.view(np.uint16 if dt.itemsize == 2 else np.uint32),
                          want.view(np.uint16 if dt.itemsize == 2 else np.uint32))
    gy = _nhwc(rng.standard_normal(y.shape).astype(np.float32), dt)
    gx = pool.maxpool2d_bprop(plan, x, y, gy)
    assert channels_last(gx)
    want_gx = _scalar("max_b", plan, [x, y, gy], gx)
    assert cp.array_equal(gx.astype(np.float32), want_gx.astype(np.float32))
    assert float(cp.abs(gx.astype(np.float32)).sum()) > 0


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_vectorised_max_pool_equals_the_cpu(geometry):
    ksize, stride, pad = geometry
    shape = (2, 8, 6, 5)
    rng = np.random.default_rng(1)
    x = rng.integers(-2, 3, shape).astype(np.float32)
    plan = pool.pool2d_plan(shape, ksize, stride, pad)
    y = pool.maxpool2d_fprop(plan, _nhwc(x, np.float32))
    np.testing.assert_array_equal(cp.asnumpy(y), cpu_pool.maxpool2d_fprop(plan, x))
    gy = rng.standard_normal(y.shape).astype(np.float32)
    gx = pool.maxpool2d_bprop(plan, _nhwc(x, np.float32), y, _nhwc(gy, np.float32))
    np.testing.assert_allclose(cp.asnumpy(gx), cpu_pool.maxpool2d_bprop(plan, x, cpu_pool.maxpool2d_fprop(plan, x), gy),
                               rtol=1e-6, atol=1e-6)


def test_channels_the_vector_does_not_divide_take_the_scalar_kernels():
    x = cp.zeros((2, 6, 4, 4), np.float32).transpose(0, 2, 3, 1).copy().transpose(0, 3, 1, 2)
    assert not _pool_vec.takes([x.transpose(NHWC)], 6)
    plan = pool.pool2d_plan(x.shape, (2, 2), (2, 2), (0, 0))
    assert channels_last(pool.maxpool2d_fprop(plan, x))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,ksize", [((3, 6, 28, 28), 2), ((2, 16, 10, 10), 2), ((2, 3, 9, 6), (3, 2))])
def test_nchw_backward_of_windows_that_tile_equals_the_scalar_kernel(dtype, shape, ksize):
    dt = dtype_of(dtype)
    rng = np.random.default_rng(2)
    x = rng.integers(-2, 3, shape).astype(np.float32)             # ties in most windows
    x[0, 1, 0, 0] = np.nan                                        # a NaN first: that window's y is NaN
    x[1, 0, 2, 3] = np.nan                                        # a NaN later: never the maximum
    x = cp.asarray(x).astype(dt)
    plan = pool.pool2d_plan(shape, ksize, ksize, 0)
    y = pool.maxpool2d_fprop(plan, x)
    gy = cp.asarray(rng.standard_normal(y.shape).astype(np.float32)).astype(dt)
    gx = cp.full(x.shape, 9, dt)                                  # every value written, none left over
    pool.maxpool2d_bprop(plan, x, y, gy, out=gx)
    want = pool._run("max_b", [x, y, gy], cp.empty_like(x), (plan, shape[1], shape))
    assert cp.array_equal(gx.astype(np.float32), want.astype(np.float32))
    assert float(cp.abs(gx.astype(np.float32)).sum()) > 0


def test_nchw_windows_that_do_not_tile_take_the_scalar_kernel(monkeypatch):
    x = cp.asarray(np.random.default_rng(3).standard_normal((2, 3, 7, 7)).astype(np.float32))
    plan = pool.pool2d_plan(x.shape, 2, 2, 0)                     # 7 = 3 x 2 + 1: the last row is in no window
    y = pool.maxpool2d_fprop(plan, x)
    monkeypatch.setattr(pool, "_max_b_tiled", None)               # would fail if called
    gx = pool.maxpool2d_bprop(plan, x, y, cp.ones_like(y))
    assert float(gx[:, :, 6].sum()) == 0 and float(gx.sum()) == y.size
