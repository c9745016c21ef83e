"""Linear learning-rate warm-up composed with the schedules, on the optimizer's device path."""
import math

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L, optim
from minidl.optim import schedules


def _cosine(lr, s, T=10):
    return lr * (1 + math.cos(math.pi * min(s, T) / T)) / 2


@pytest.mark.parametrize("inner,fn", [
    (schedules.cosine(10), _cosine),                                      # tabulated: one gather
    (schedules.step_decay(4, 0.5), lambda lr, s: lr * 0.5 ** (s // 4)),   # a formula on the device
    (schedules.constant(), lambda lr, s: lr),
])
def test_warmup_ramps_linearly_then_follows_the_schedule(inner, fn):
    w = schedules.warmup(3, inner)
    expect = [fn(1.0, s) * min(1.0, (s + 1) / 3) for s in range(14)]
    assert [float(w(1.0, s)) for s in range(14)] == pytest.approx(expect, abs=1e-15)
    assert float(w(1.0, 0)) == pytest.approx(fn(1.0, 0) / 3)


@pytest.mark.parametrize("inner,fn", [(schedules.cosine(6), lambda lr, s: _cosine(lr, s, 6)),
                                      (schedules.inverse_time(0.5), lambda lr, s: lr / (1 + 0.5 * s))])
def test_sgd_steps_with_warmup_match_the_formula(inner, fn):
    x = L.Input((3,))
    model = dl.Model(x, L.Dense(2)(x), dtype="float64")
    opt = optim.SGD(0.4, schedule=schedules.warmup(4, inner)).setup(model)
    model.grads[...] = 1.0
    p = model.flat.copy()
    for t in range(1, 10):                      # the update at step t uses schedule step t - 1
        opt.step()
        p -= fn(0.4, t - 1) * min(1.0, t / 4)
        np.testing.assert_allclose(model.flat, p, rtol=1e-13)
    assert opt.current_lr == pytest.approx(fn(0.4, 8))


def test_warmup_config_rebuilds_and_its_horizon_covers_both():
    w = schedules.warmup(20, schedules.cosine(8))
    assert w.horizon == 20                      # constant only past the ramp and the cosine
    assert w.config == {"name": "warmup", "steps": 20,
                        "schedule": {"name": "cosine", "total_steps": 8, "min_lr": 0.0}}
    again = schedules.get(**w.config)
    assert [again(0.1, s) for s in range(25)] == pytest.approx([w(0.1, s) for s in range(25)])
    assert not hasattr(schedules.warmup(5, "constant"), "horizon")
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="warmup: steps must be an int >= 1"):
            schedules.warmup(bad, "constant")
