"""A training step's books in one kernel (softmax.loss_tally): the same bits as the CuPy operations it
replaced (isfinite, logical_and and the in-place adds of the NaN flag, the good steps and the metrics'
sums), eagerly and recorded into a CUDA graph; other dtypes take CuPy's operations."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.gpu import softmax  # noqa: E402
from benchmarks.old_step_ops import old_books  # noqa: E402


def books():
    return [cp.ones((), bool), cp.zeros((), np.int64), cp.zeros((), np.float64), cp.zeros((), np.int64)]


def run(fn, losses, hits, dtype, counted, state):
    finite, steps, total, correct = state
    for loss, hit in zip(losses, hits):
        fn(cp.asarray(loss, dtype), cp.asarray(hit, np.int64), finite, steps if counted else None, total, correct)
    return [cp.asnumpy(a) for a in state]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("counted", [True, False])
def test_loss_tally_equals_cupys_operations_bit_for_bit(dtype, counted):
    rng = np.random.default_rng(0)
    losses = list(rng.standard_normal(40).astype(dtype) * 3 + 5) + [np.nan, 1.0, np.inf, 2.0]
    hits = list(rng.integers(0, 33, len(losses)))
    for stop in (40, len(losses)):                       # all finite (sums of many roundings), then past a NaN
        got = run(softmax.loss_tally, losses[:stop], hits[:stop], dtype, counted, books())
        want = run(old_books, losses[:stop], hits[:stop], dtype, counted, books())
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    assert not got[0] and int(got[1]) == (40 if counted else 0) and np.isnan(got[2])
    assert int(got[3]) == sum(int(h) for h in hits)


def test_loss_tally_records_into_a_cuda_graph_and_each_replay_adds_again():
    loss, hit = cp.asarray(np.float32(0.1)), cp.asarray(3, np.int64)
    state = books()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        softmax.loss_tally(loss, hit, state[0], state[1], state[2], state[3])      # compiled before the capture
        stream.begin_capture()
        softmax.loss_tally(loss, hit, state[0], state[1], state[2], state[3])
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        stream.synchronize()
    want = np.float64(0.0)
    for _ in range(4):
        want += np.float64(np.float32(0.1))
    assert bool(state[0]) and int(state[1]) == 4 and float(state[2]) == want and int(state[3]) == 12
    loss.fill(np.nan)
    graph.launch(stream)
    stream.synchronize()
    assert not bool(state[0]) and int(state[1]) == 4 and int(state[3]) == 15


def test_loss_tally_takes_a_users_dtypes_through_cupy():
    """A user's Loss may return a float16 sum: CuPy's operations, as before."""
    losses, hits = [np.float16(1.5), np.float16(2.25)], [1, 2]
    got = run(softmax.loss_tally, losses, hits, np.float16, True, books())
    want = run(old_books, losses, hits, np.float16, True, books())
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert float(got[2]) == 3.75 and int(got[1]) == 2
