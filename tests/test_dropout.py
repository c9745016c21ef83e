import numpy as np
import pytest
from tests.helpers.gradcheck import gradcheck, numeric_grad, rel_error

from minidl import Input, Model
from minidl.backend import CounterRNG
from minidl.kernels.cpu import dropout
from minidl.layers.dropout import Dropout


def _model(layer, shape, dtype="float64", seed=0):
    x = Input(shape[1:])
    return Model(x, layer(x), dtype=dtype, seed=seed)


@pytest.mark.parametrize("shape", [(2, 3, 4), (3, 2, 3, 3)])
def test_dropout_eval_is_the_identity_and_its_gradient(shape):
    x = np.random.default_rng(0).standard_normal(shape)
    assert np.array_equal(_model(Dropout(0.4), shape).forward(x, training=False), x)
    gradcheck(Dropout(0.4), [shape], training=False)


def test_dropout_kernel_with_a_fixed_mask_matches_finite_differences():
    rng = np.random.default_rng(1)
    x, r = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 4, 5))
    def f():
        # Reseeding draws the same mask every call, so the map is linear and fixed.
        return float(np.sum(dropout.dropout_fprop(x, 0.3, CounterRNG(np, 7))[0] * r))
    _, mask = dropout.dropout_fprop(x, 0.3, CounterRNG(np, 7))
    assert rel_error(dropout.dropout_bprop(r, mask), numeric_grad(f, x)) < 1e-6


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dropout_training_backward_is_gy_times_the_forward_mask(dtype):
    rng = np.random.default_rng(2)
    shape, rate = (4, 3, 5, 5), 0.3
    layer = Dropout(rate)
    model = _model(layer, shape, dtype=dtype)
    x, gy = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    y = model.forward(x, training=True)
    mask = layer.saved
    assert mask.dtype == np.dtype(dtype) and mask.shape == shape
    assert set(np.unique(mask)) == {0, np.dtype(dtype).type(1 / (1 - rate))}
    np.testing.assert_array_equal(y, x * mask)
    np.testing.assert_array_equal(model.backward(gy), gy * mask)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.8])
def test_dropout_keeps_expectation_and_fraction(rate):
    n = 400_000
    layer = Dropout(rate)
    model = _model(layer, (n, 1))
    y = model.forward(np.ones((n, 1)), training=True)
    kept = np.mean(y != 0)
    # 5 standard deviations of the Bernoulli estimates: fails by chance about once in 3 million.
    assert abs(kept - (1 - rate)) < 5 * np.sqrt(rate * (1 - rate) / n)
    assert abs(y.mean() - 1.0) < 5 * np.sqrt(rate / (1 - rate) / n)


def test_dropout_draws_fresh_masks_from_the_seeded_device_generator():
    shape, x = (8, 50), np.ones((8, 50))
    a, b = _model(Dropout(), shape, seed=3), _model(Dropout(), shape, seed=3)
    m1, m2 = a.forward(x, training=True), a.forward(x, training=True)
    assert not np.array_equal(m1, m2)                                  # a new mask every step
    np.testing.assert_array_equal(b.forward(x, training=True), m1)     # reproducible from the seed


def test_dropout_rate_zero_is_the_identity_in_training():
    x = np.random.default_rng(4).standard_normal((3, 7))
    model = _model(Dropout(0.0), x.shape)
    np.testing.assert_array_equal(model.forward(x, training=True), x)


def test_dropout_kernels_honour_out():
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    out = np.empty_like(x)
    y, mask = dropout.dropout_fprop(x, 0.5, CounterRNG(np, 0), out=out)
    assert y is out and mask.dtype == np.float32
    gx = np.empty_like(x)
    assert dropout.dropout_bprop(x, mask, out=gx) is gx


@pytest.mark.parametrize("rate", [-0.1, 1.0, 1.5, "0.5"])
def test_dropout_rejects_bad_rate_naming_the_layer(rate):
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\)") as e:
        Dropout(rate, name="drop_fc")
    assert "drop_fc" in str(e.value)


def test_philox_matches_the_published_known_answers():
    """Random123's known-answer test for Philox4x32-10, first word: counter 0 and key 0 give 0x6627e8d5."""
    M0, M1 = dropout.M0, dropout.M1
    assert (M0, M1) == (0xD2511F53, 0xCD9E8D57)
    u = dropout.philox_uniform(1, (0, 0), 0)
    assert int(u[0] * 2 ** 24) == 0x6627e8d5 >> 8


def test_counter_generator_draws_continue_where_they_stopped():
    rng = CounterRNG(np, 11)
    whole = dropout.philox_uniform(10, rng.key, 0)
    x = np.ones(4)
    dropout.dropout_fprop(x, 0.5, rng)
    assert int(rng.offset) == 4
    np.testing.assert_array_equal(dropout.philox_uniform(6, rng.key, int(rng.offset)), whole[4:])
    state = rng.state()
    other = CounterRNG(np, 11)
    other.set_state(state)
    assert int(other.offset) == 4
    third = CounterRNG(np, 12)
    third.set_state(state)                                  # the saved key wins over the seed's
    assert third.key == rng.key
    with pytest.raises(ValueError, match="generator state must be"):
        third.set_state({"key": [1, 2], "offset": -1})


def test_ranks_draw_their_slices_of_one_process_draws_and_save_its_state():
    """Data-parallel rank r of N draws what one process at N x b draws for the images r b .. (r+1) b
    of the global batch (dropout masks, shifts and flips alike), every rank advances as that
    process does, and a saved state continues on any rank."""
    from minidl.kernels.cpu import augment
    one, ranks = CounterRNG(np, 5), [CounterRNG(np, 5) for _ in range(4)]
    for r, rng in enumerate(ranks):
        rng.shard(r, 4)
    x = np.arange(8 * 1 * 6 * 6, dtype=np.float32).reshape(8, 1, 6, 6)
    for _ in range(3):                                   # draws in sequence, as a step's layers make them
        whole = dropout.dropout_fprop(np.ones((8, 64), np.float32), 0.5, one)[1]
        parts = [dropout.dropout_fprop(np.ones((2, 64), np.float32), 0.5, r)[1] for r in ranks]
        np.testing.assert_array_equal(np.concatenate(parts), whole)
        for draw in (lambda v, g: augment.random_shift(v, 2, -1.0, g), augment.random_flip):
            whole = draw(x, one)
            np.testing.assert_array_equal(np.concatenate([draw(x[2 * r:2 * r + 2], g) for r, g in enumerate(ranks)]),
                                          whole)
    assert all(r.state() == one.state() for r in ranks)          # every rank saves the same state
    again = CounterRNG(np, 99)
    again.shard(2, 4)
    again.set_state(ranks[2].state())
    np.testing.assert_array_equal(dropout.dropout_fprop(np.ones(64, np.float32), 0.5, again)[1],
                                  dropout.dropout_fprop(np.ones(64, np.float32), 0.5, ranks[2])[1])
    with pytest.raises(ValueError, match="rank must be in"):
        again.shard(4, 4)

