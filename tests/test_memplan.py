"""The memory plan (kernels/gpu/memplan.py): arrays alive together never share bytes, the arena
stays near the most bytes alive at once, and each allocation knows which earlier ones it reuses."""
import numpy as np
import pytest

from minidl.kernels.gpu.memplan import ALIGN, aligned, lower_bound, make_plan


def _check(plan, sizes, births, deaths):
    n = len(sizes)
    end = [o + aligned(s) for o, s in zip(plan.offsets, sizes)]
    assert all(o % ALIGN == 0 and o >= 0 for o in plan.offsets)
    assert max(end) == plan.total >= plan.lower_bound == lower_bound(sizes, births, deaths)
    for k in range(n):
        shared = []
        for j in range(n):
            if j == k:
                continue
            meet_in_time = births[j] < deaths[k] and births[k] < deaths[j]
            meet_in_bytes = plan.offsets[j] < end[k] and plan.offsets[k] < end[j]
            assert not (meet_in_time and meet_in_bytes), (j, k)
            if j < k and meet_in_bytes:
                shared.append(j)
                assert deaths[j] <= births[k]          # a reused buffer's last reader has run
        assert plan.sharers[k] == shared


def _random_trace(rng, n):
    """n allocations in birth order, each dying some events later (a clock of births and deaths)."""
    births, deaths, clock = [], [], 0
    for _ in range(n):
        clock += 1
        births.append(clock)
    deaths = [b + int(rng.integers(1, 3 * n)) for b in births]
    sizes = [int(rng.choice([1, 100, 513, 4096, 70_000, 1 << 20])) for _ in range(n)]
    return sizes, births, deaths


@pytest.mark.parametrize("seed", range(5))
def test_arrays_alive_together_never_share_bytes(seed):
    sizes, births, deaths = _random_trace(np.random.default_rng(seed), 120)
    plan = make_plan(sizes, births, deaths)
    _check(plan, sizes, births, deaths)
    assert plan.total <= 1.5 * plan.lower_bound


def test_a_chain_reuses_two_buffers():
    # x0 -> x1 -> x2 -> x3: each value dies once the next is made (forward of an inference chain)
    sizes, births, deaths = [4096] * 4, [1, 2, 4, 6], [3, 5, 7, 8]
    plan = make_plan(sizes, births, deaths)
    _check(plan, sizes, births, deaths)
    assert plan.total == plan.lower_bound == 2 * 4096
    assert plan.offsets[0] == plan.offsets[2] and plan.offsets[1] == plan.offsets[3]


def test_a_training_trace_plans_near_its_lower_bound():
    # forward keeps L activations for backward; backward makes a gradient per layer, frees the
    # activation it read and the gradient before: gradients reuse the activations' memory
    L, clock, sizes, births, deaths = 6, 0, [], [], []
    for i in range(L):
        clock += 1
        sizes.append((L - i) * 10_000), births.append(clock), deaths.append(None)
    for i in reversed(range(L)):
        clock += 1
        sizes.append((L - i) * 10_000), births.append(clock), deaths.append(None)
        g = len(sizes) - 1
        clock += 1
        deaths[i] = clock                          # the activation, read by its layer's backward
        if i < L - 1:
            clock += 1
            deaths[g - 1] = clock                  # the gradient of the layer after
    deaths = [clock + 1 if d is None else d for d in deaths]
    plan = make_plan(sizes, births, deaths)
    _check(plan, sizes, births, deaths)
    assert plan.total <= 1.15 * plan.lower_bound        # greedy by size: not optimal, close
    assert plan.total < sum(aligned(s) for s in sizes) / 1.5


def test_nothing_to_plan_and_bad_lifetimes():
    assert make_plan([], [], []).total == 0
    with pytest.raises(ValueError, match="die after it is born"):
        make_plan([10], [5], [5])
