"""A training step's books (the NaN flag, the good steps, the metrics' sums: softmax.loss_tally) and its
batch gather (augment.gather_batch) on the CPU: the operations the step ran before they became one
kernel each on the GPU, with the same results; and a step that diverges is counted as before."""
import numpy as np
import pytest

import minidl as dl
from minidl import layers as L, optim
from minidl.kernels.cpu import augment, softmax
from minidl.metrics import Mean
from minidl.training.step import TrainStep
from benchmarks.old_step_ops import old_books   # what training/step.py and metrics.py ran before loss_tally


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("counted", [True, False])
def test_loss_tally_keeps_the_books_as_the_separate_operations_did(dtype, counted):
    losses = [2.25, 1.0e-7, 3.5, np.nan, 1.5, np.inf, 0.75]
    hits = [3, 0, 7, 2, 5, 1, 4]
    books = [[np.ones((), bool), np.zeros((), np.int64), np.zeros((), np.float64), np.zeros((), np.int64)]
             for _ in range(2)]
    for loss, hit in zip(losses, hits):
        for fn, (finite, steps, total, correct) in zip((softmax.loss_tally, old_books), books):
            fn(np.asarray(loss, dtype), np.asarray(hit, np.int64), finite, steps if counted else None, total,
               correct)
        for got, want in zip(*books):
            assert got.dtype == want.dtype and got.shape == ()
            np.testing.assert_array_equal(got, want)
    finite, steps, total, correct = books[0]
    assert not finite and int(steps) == (3 if counted else 0) and np.isnan(total) and int(correct) == sum(hits)
    finite, steps, total, correct = (np.ones((), bool), np.zeros((), np.int64), np.zeros((), np.float64),
                                     np.zeros((), np.int64))
    softmax.loss_tally(np.asarray(2.5, dtype), np.asarray(4, np.int64), finite, steps, total, correct)
    softmax.loss_tally(np.asarray(0.25, dtype), np.asarray(1, np.int64), finite, steps, total, correct)
    assert bool(finite) and int(steps) == 2 and float(total) == 2.75 and int(correct) == 5


def test_gather_batch_takes_the_images_and_labels_of_the_indices():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((9, 1, 4, 3)).astype(np.float32), rng.integers(0, 10, 9).astype(np.int32)
    idx = np.array([8, 0, 3, 3, 5], np.int64)
    gx, gy = augment.gather_batch(x, y, idx)
    np.testing.assert_array_equal(gx, x[idx])
    np.testing.assert_array_equal(gy, y[idx])
    assert gx.dtype == x.dtype and gy.dtype == y.dtype and gx.shape == (5, 1, 4, 3)


def _step(reducer=None):
    x = L.Input((1, 6, 6))
    model = dl.Model(x, L.Softmax()(L.Dense(3)(L.Flatten()(x))), seed=0)
    return TrainStep(model, optim.SGD(0.1).setup(model), Mean(model.device), reducer), model


def test_an_eager_step_adds_its_loss_and_hits_and_counts_good_steps_until_the_loss_is_not_finite():
    step, model = _step()
    rng = np.random.default_rng(1)
    xb, yb = rng.standard_normal((8, 1, 6, 6)).astype(np.float32), np.array([0, 1, 2, 0, 1, 2, 0, 1])
    losses, hits = [], []
    for k in range(3):
        if k == 2:
            xb = xb.copy()
            xb[0, 0, 0, 0] = np.nan                   # the third step's loss is NaN
        before = model.flat.copy()
        loss_sum, correct = step.forward_backward(xb, yb)
        losses.append(float(loss_sum))
        hits.append(int(correct))
        model.flat[...] = before                      # the step below recomputes the same forward
        step(xb, yb)
    assert step.divergence() == 2                     # two finite steps came first
    assert step.metrics.count == 24 and int(step.metrics.correct) == sum(hits)
    assert np.isnan(float(step.metrics.loss)) and np.isfinite(losses[:2]).all() and np.isnan(losses[2])
    step.reset_flag()
    assert step.divergence() is None and int(step.good_steps) == 0
