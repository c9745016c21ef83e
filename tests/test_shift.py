"""Random shifts of training images (kernels.cpu.augment) against a naive loop, drawn from the
device's counter-based generator; trained with, a run resumes exactly."""
import numpy as np
import pytest
from tests.helpers import reference

from minidl.backend import CounterRNG
from minidl.kernels.cpu import augment
from minidl.kernels.cpu.dropout import philox_uniform
from minidl.training.step import TrainStep
from tests.helpers import resumable


@pytest.mark.parametrize("shape,m", [((5, 1, 7, 6), 2), ((3, 2, 4, 4), 1), ((4, 1, 5, 5), 3)])
def test_random_shift_matches_the_loop_reference(shape, m):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    rng = CounterRNG(np, 11)
    rng.offset += 40
    dy, dx = augment.shift_draws(shape[0], m, rng.key, 40)
    y = augment.random_shift(x, m, -0.5, rng)
    np.testing.assert_array_equal(y, reference.shift_images(x, dy, dx, np.float32(-0.5)))
    assert int(rng.offset) == 40 + 2 * shape[0]          # two draws per image
    assert y.dtype == x.dtype


def test_shifts_come_from_the_generator_words_and_cover_the_range_evenly():
    N, m = 20_000, 2
    dy, dx = augment.shift_draws(N, m, (5, 9), 123)
    r = (philox_uniform(2 * N, (5, 9), 123) * 2.0 ** 24).astype(np.int64)    # the draws' top 24 bits
    np.testing.assert_array_equal(dy, r[0::2] * 5 // 2 ** 24 - 2)             # floor(5 u) - 2
    np.testing.assert_array_equal(dx, r[1::2] * 5 // 2 ** 24 - 2)
    for s in (dy, dx):
        counts = np.bincount(s + m, minlength=2 * m + 1)
        assert len(counts) == 2 * m + 1
        # each of 5 values about N/5 = 4,000: 5 standard deviations of a binomial is 283
        assert np.all(np.abs(counts - N / 5) < 5 * np.sqrt(N * 0.2 * 0.8))
    assert np.corrcoef(dy, dx)[0, 1] ** 2 < 1e-3                               # rows and columns apart


def test_the_largest_draw_stays_in_range():
    # r = 2^24 - 1 is the top word; a float32 u * 5 would round it up to 5 and shift by 3
    r = np.array([2 ** 24 - 1, 0], np.int64)
    assert list(r * 5 >> 24) == [4, 0]


def test_successive_calls_draw_new_shifts_and_a_reseeded_generator_repeats_them():
    x = np.arange(8 * 36, dtype=np.float32).reshape(8, 1, 6, 6)
    a = CounterRNG(np, 3)
    first, second = augment.random_shift(x, 2, 0.0, a), augment.random_shift(x, 2, 0.0, a)
    assert not np.array_equal(first, second)
    b = CounterRNG(np, 3)
    np.testing.assert_array_equal(augment.random_shift(x, 2, 0.0, b), first)
    np.testing.assert_array_equal(augment.random_shift(x, 2, 0.0, b), second)
    out = np.empty_like(x)
    assert augment.random_shift(x, 2, 0.0, CounterRNG(np, 3), out=out) is out
    np.testing.assert_array_equal(out, first)


def test_train_step_shifts_the_batch_with_the_loaders_background():
    import minidl as dl
    from minidl import layers as L
    from minidl.metrics import Mean
    seen = []
    x = L.Input((1, 6, 6))
    model = dl.Model(x, L.Softmax()(L.Dense(3)(L.Flatten()(x))), seed=0)
    step = TrainStep(model, dl.optim.SGD(0.1).setup(model), Mean(model.device), shift=1)
    forward = step.net.forward
    step.net.forward = lambda xb, training: seen.append(xb.copy()) or forward(xb, training=training)
    xb = np.ones((4, 1, 6, 6), np.float32)
    step.blank = -2.0
    step(xb, np.array([0, 1, 2, 0]))
    dy, dx = augment.shift_draws(4, 1, model.device.rng.key, 0)
    np.testing.assert_array_equal(seen[0], reference.shift_images(xb, dy, dx, np.float32(-2.0)))
    assert int(model.device.rng.offset) == 8
    for bad in ({"shift": -1}, {"shift": 1.5}, {"smoothing": 1.0}):
        with pytest.raises(ValueError, match="TrainStep: smoothing must be"):
            TrainStep(model, step.optimizer, step.metrics, **bad)


def test_a_resumed_shifted_run_is_the_straight_run(tmp_path):
    def run(steps, resume_from=None, save_to=None, shift=2):
        return resumable.run(steps, resume_from, save_to, shift=shift, label_smoothing=0.1)

    straight = run(10)
    run(4, save_to=str(tmp_path / "c.npz"))
    resumed = run(6, resume_from=str(tmp_path / "c.npz"))
    assert int(resumed.device.rng.offset) == int(straight.device.rng.offset) == 10 * 2 * 16
    for k, w in straight.model.get_weights().items():
        np.testing.assert_array_equal(resumed.model.get_weights()[k], w, err_msg=k)
    unshifted = run(10, shift=0).model.get_weights()
    assert not np.array_equal(unshifted["dense/w"], straight.model.get_weights()["dense/w"])
