"""The training batch gathered in one launch (augment.gather_batch): the very values of the two cupy.take
it replaced, for every word size its rows copy in, eagerly and recorded into a CUDA graph."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.gpu import augment  # noqa: E402


def case(shape, dtype, n=50, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n,) + shape) * 100).astype(dtype)
    return cp.asarray(x), cp.asarray(rng.integers(0, 10, n).astype(np.int32))


@pytest.mark.parametrize("shape, dtype", [((1, 28, 28), np.float32),      # 16-byte words (LeNet's images)
                                          ((3, 2), np.float32),           # 24 bytes a row: 8-byte words
                                          ((7,), np.float32),             # 28: 4-byte words
                                          ((3, 3), np.float16),           # 18: 2-byte words
                                          ((5,), np.uint8),               # 5: bytes
                                          ((2, 2), np.float64)])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_gather_batch_equals_two_takes(shape, dtype, index_dtype):
    x, y = case(shape, dtype)
    idx = cp.asarray(np.random.default_rng(1).permutation(50)[:33].astype(index_dtype))
    idx[0] = 49                                          # the last image, and one taken twice
    idx[1] = 49
    gx, gy = augment.gather_batch(x, y, idx)
    assert gx.shape == (33,) + shape and gx.dtype == x.dtype and gy.dtype == np.int32 and gx.flags.c_contiguous
    np.testing.assert_array_equal(cp.asnumpy(gx), cp.asnumpy(cp.take(x, idx, axis=0)))
    np.testing.assert_array_equal(cp.asnumpy(gy), cp.asnumpy(cp.take(y, idx, axis=0)))


def test_a_view_off_the_16_byte_boundary_copies_in_smaller_words():
    x, y = case((1, 28, 28), np.float32)
    x = x.reshape(50, -1)[:, 1:]                         # rows of 783 floats, not contiguous: the takes
    xs = cp.ascontiguousarray(x)[1:]                     # contiguous, rows 3132 bytes: 4-byte words
    idx = cp.arange(10, 0, -1, dtype=np.int64)
    for a, labels in ((x, y), (xs, y[1:])):
        gx, gy = augment.gather_batch(a, labels, idx)
        np.testing.assert_array_equal(cp.asnumpy(gx), cp.asnumpy(a)[cp.asnumpy(idx)])
        np.testing.assert_array_equal(cp.asnumpy(gy), cp.asnumpy(labels)[cp.asnumpy(idx)])


def test_other_label_dtypes_take_cupys_take():
    x, y = case((4,), np.float32)
    idx = cp.asarray([3, 1, 4], np.int64)
    gx, gy = augment.gather_batch(x, y.astype(np.int64), idx)
    assert gy.dtype == np.int64
    np.testing.assert_array_equal(cp.asnumpy(gy), cp.asnumpy(y)[[3, 1, 4]])
    np.testing.assert_array_equal(cp.asnumpy(gx), cp.asnumpy(x)[[3, 1, 4]])


def test_gather_batch_records_into_a_cuda_graph_that_reads_new_indices():
    x, y = case((1, 28, 28), np.float32)
    idx = cp.arange(32, dtype=np.int64)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        augment.gather_batch(x, y, idx)                  # compiled before the capture
        stream.begin_capture()
        gx, gy = augment.gather_batch(x, y, idx)
        graph = stream.end_capture()
        order = np.random.default_rng(2).permutation(50)[:32]
        cp.copyto(idx, cp.asarray(order))
        graph.launch(stream)
        stream.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(gx), cp.asnumpy(x)[order])
    np.testing.assert_array_equal(cp.asnumpy(gy), cp.asnumpy(y)[order])
