"""Random horizontal flips of training images (kernels.cpu.augment) against a naive loop, drawn from
the device's counter-based generator like the shifts; trained with, a run resumes exactly."""
import numpy as np
import pytest
from tests.helpers import reference

from minidl.backend import CounterRNG
from minidl.kernels.cpu import augment
from minidl.kernels.cpu.dropout import philox_uniform
from minidl.training.step import TrainStep
from tests.helpers import resumable


@pytest.mark.parametrize("shape", [(9, 1, 7, 6), (3, 2, 4, 5), (4, 1, 5, 1)])
def test_random_flip_matches_the_loop_reference(shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    rng = CounterRNG(np, 11)
    rng.offset += 40
    flips = augment.flip_draws(shape[0], rng.key, 40)
    y = augment.random_flip(x, rng)
    np.testing.assert_array_equal(y, reference.flip_images(x, flips))
    assert int(rng.offset) == 40 + shape[0]              # one draw per image
    assert y.dtype == x.dtype and y.shape == x.shape


def test_flips_come_from_the_top_bit_of_the_generator_words_at_even_odds():
    N = 20_000
    flips = augment.flip_draws(N, (5, 9), 123)
    r = (philox_uniform(N, (5, 9), 123) * 2.0 ** 24).astype(np.int64)        # the draws' top 24 bits
    np.testing.assert_array_equal(flips, r >> 23 == 1)
    assert abs(flips.sum() - N / 2) < 5 * np.sqrt(N / 4)                     # 5 standard deviations
    assert np.corrcoef(flips[:-1], flips[1:])[0, 1] ** 2 < 1e-3              # neighbours apart


def test_successive_calls_draw_new_flips_and_a_reseeded_generator_repeats_them():
    x = np.arange(16 * 12, dtype=np.float32).reshape(16, 1, 3, 4)
    a = CounterRNG(np, 3)
    first, second = augment.random_flip(x, a), augment.random_flip(x, a)
    assert not np.array_equal(first, second)
    b = CounterRNG(np, 3)
    np.testing.assert_array_equal(augment.random_flip(x, b), first)
    np.testing.assert_array_equal(augment.random_flip(x, b), second)
    out = np.empty_like(x)
    assert augment.random_flip(x, CounterRNG(np, 3), out=out) is out
    np.testing.assert_array_equal(out, first)


def test_train_step_flips_then_shifts_the_batch():
    import minidl as dl
    from minidl import layers as L
    from minidl.metrics import Mean
    seen = []
    x = L.Input((1, 6, 6))
    model = dl.Model(x, L.Softmax()(L.Dense(3)(L.Flatten()(x))), seed=0)
    step = TrainStep(model, dl.optim.SGD(0.1).setup(model), Mean(model.device), shift=1, flip=True)
    forward = step.net.forward
    step.net.forward = lambda xb, training: seen.append(xb.copy()) or forward(xb, training=training)
    xb = np.random.default_rng(1).standard_normal((8, 1, 6, 6)).astype(np.float32)
    step.blank = -2.0
    step(xb, np.array([0, 1, 2, 0, 1, 2, 0, 1]))
    key = model.device.rng.key
    flips = augment.flip_draws(8, key, 0)                  # draws 0..7 flip, 8..23 shift
    dy, dx = augment.shift_draws(8, 1, key, 8)
    want = reference.shift_images(reference.flip_images(xb, flips), dy, dx, np.float32(-2.0))
    np.testing.assert_array_equal(seen[0], want)
    assert int(model.device.rng.offset) == 8 + 16
    with pytest.raises(ValueError, match="flip a bool"):
        TrainStep(model, step.optimizer, step.metrics, flip=1)


def test_a_resumed_flipped_run_is_the_straight_run(tmp_path):
    def run(steps, resume_from=None, save_to=None, flip=True):
        return resumable.run(steps, resume_from, save_to, flip=flip, shift=1)

    straight = run(10)
    run(4, save_to=str(tmp_path / "c.npz"))
    resumed = run(6, resume_from=str(tmp_path / "c.npz"))
    assert int(resumed.device.rng.offset) == int(straight.device.rng.offset) == 10 * 3 * 16
    for k, w in straight.model.get_weights().items():
        np.testing.assert_array_equal(resumed.model.get_weights()[k], w, err_msg=k)
    unflipped = run(10, flip=False).model.get_weights()
    assert not np.array_equal(unflipped["dense/w"], straight.model.get_weights()["dense/w"])
