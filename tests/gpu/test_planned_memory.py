"""Planned memory (kernels/gpu/planned_memory.py): a captured training step lives in one arena
planned by liveness, every allocation of the capture on its plan; a capture that departs from its
trace still computes right (what does not fit the plan goes to the pool), and the device counts it."""
import gc
import weakref

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import models, optim  # noqa: E402
from minidl.backend import CapturedCall  # noqa: E402
from minidl.kernels.gpu import planned_memory  # noqa: E402


def _data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


@pytest.mark.parametrize("model_fn", [models.lenet5, lambda device: models.resnet(18, device=device)],
                         ids=["lenet5", "resnet18"])
def test_a_captured_training_step_lives_in_its_planned_arena(model_fn):
    dev = dl.get_device("cuda")
    trainer = dl.Trainer(model_fn(device=dev), optim.Adam(1e-3), progress=False, log=lambda s: None)
    trainer.fit(_data(), steps=4, batch_size=32, monitor=4)
    (_, call), = trainer._step._captured.values()
    mem, plan = call.memory, call.memory.plan
    assert mem.misses == 0, mem.describe()
    assert len(plan.sizes) > 20 and mem.k == len(plan.sizes)       # the capture made every traced allocation
    assert plan.lower_bound <= plan.total <= 1.25 * plan.lower_bound
    assert plan.total < 0.75 * sum(plan.sizes)                       # arrays share: the plan reuses memory
    assert mem.arena_bytes == plan.total and mem.pool.total_bytes() == 0
    used, reserved = dev.memory_bytes()
    assert reserved >= mem.peak_bytes >= plan.total and used >= plan.total


def test_a_planned_capture_equals_its_eager_runs():
    dev = dl.get_device("cuda")
    x = cp.linspace(-1, 1, 4096, dtype=cp.float32)

    def fn():                                      # temporaries that die at once: they share bytes
        a = cp.tanh(x * 3)
        b = cp.exp(a) + x
        return (b * a).sum(), cp.sqrt(b * b + 1)
    want = [cp.asnumpy(v) for v in fn()]
    call = CapturedCall(dev, fn)
    assert call.memory.misses == 0 and len(call.memory.alive) == 2   # the results stay in the arena
    for _ in range(3):
        got = call.replay()
        dev.sync()
        for g, w in zip(got, want):
            np.testing.assert_array_equal(cp.asnumpy(g), w)


def test_what_departs_from_the_trace_misses_the_plan_and_stays_right():
    dev = dl.get_device("cuda")
    x = cp.arange(1024, dtype=cp.float32)
    runs, held = [], []

    def fn():
        runs.append(1)
        t = x * 2                                  # dies at the end of the expression below...
        if len(runs) == 3:
            held.append(t)                         # ...except in the capture: still alive at the next
        y = t + 1                                  # allocation, which the plan put on t's bytes
        del t
        z = y * 3                                  # the plan would reuse t's bytes here
        return z + y
    call = CapturedCall(dev, fn)
    assert call.memory.misses >= 1                 # a planned slot whose earlier tenant was still alive
    got = call.replay()
    dev.sync()
    np.testing.assert_array_equal(cp.asnumpy(got), (np.arange(1024) * 2 + 1) * 4)
    np.testing.assert_array_equal(cp.asnumpy(held[0]), np.arange(1024) * 2)


def test_warm_ups_hold_only_what_is_alive():
    dev = dl.get_device("cuda")
    x = cp.ones(1 << 20, dtype=cp.float32)        # 4 MiB

    def fn():
        total = x.copy()
        for _ in range(8):                         # eight 4 MiB temporaries, one alive at a time
            total += x * 2
        return total
    call = CapturedCall(dev, fn)
    mib = 2 ** 20
    assert call.memory.plan.total <= 3 * 4 * mib                     # result + one temporary (+ alignment)
    assert call.memory.peak <= 4 * 4 * mib                          # warm-ups freed each temporary at once
    dev.sync()
    np.testing.assert_array_equal(cp.asnumpy(call.replay()[:4]), np.full(4, 17, np.float32))


def test_an_array_a_cache_keeps_from_the_warm_ups_does_not_keep_the_arena():
    dev = dl.get_device("cuda")
    x, cache = cp.ones(4096, dtype=cp.float32), []

    def fn():
        if not cache:                              # filled at the first call, as a kernel family's scratch
            cache.append(cp.zeros(1 << 20, dtype=cp.float32))
        return cp.tanh(x) + cache[0][:4096]
    call = CapturedCall(dev, fn)
    memory = weakref.ref(call.memory)
    assert call.memory.books.live >= cache[0].nbytes
    del call
    gc.collect()
    assert memory() is None                        # the arena went with the call
    assert any(used >= cache[0].nbytes for used, _ in planned_memory.live_memory())   # still counted
