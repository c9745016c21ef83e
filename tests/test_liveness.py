"""Liveness written once (graph/liveness.py): `last_reads` says after which step each value is read for
the last time; Model.forward and the compiled model (inference/model.py) both drop values by it."""
import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl.graph import liveness

liveness_last_reads = liveness.last_reads        # the one count, kept before a test wraps it


def brute_force(steps, keep):
    """For each step k, the values v (not kept) that step k touches and no later step reads: asked of
    every (value, step) pair directly, with no bookkeeping to share a mistake with last_reads."""
    values = {v for reads, writes in steps for v in (*reads, writes)}
    return [sorted(v for v in values if v not in keep and (v in reads or v == writes)
                   and not any(v in later for later, _ in steps[k + 1:]))
            for k, (reads, writes) in enumerate(steps)]


def generated_steps(rng, n_inputs, n_steps):
    """Random DAG steps: step k writes value n_inputs + k from one to three earlier values (read twice, at times)."""
    steps = []
    for k in range(n_steps):
        made = n_inputs + k
        steps.append((list(rng.integers(0, made, rng.integers(1, 4))), made))
    return steps


@pytest.mark.parametrize("seed", range(40))
def test_last_reads_matches_a_brute_force_count_on_generated_graphs(seed):
    rng = np.random.default_rng(seed)
    n_inputs, n_steps = int(rng.integers(1, 4)), int(rng.integers(1, 25))
    steps = generated_steps(rng, n_inputs, n_steps)
    keep = set(rng.choice(n_inputs + n_steps, min(3, n_inputs + n_steps - 1), replace=False).tolist())
    got = [sorted(d) for d in liveness.last_reads(steps, keep)]
    assert got == brute_force(steps, keep)
    every = [v for d in got for v in d]
    assert len(every) == len(set(every))                     # each value dropped once at most


def generated_model(seed):
    """A random DAG of ReLU, Dense and Add over one input, with one or two outputs."""
    rng = np.random.default_rng(seed)
    x = L.Input((6,))
    made = [x]
    for _ in range(int(rng.integers(2, 12))):
        kind = rng.integers(0, 3)
        a, b = (made[int(i)] for i in rng.integers(0, len(made), 2))
        made.append(L.ReLU()(a) if kind == 0 else L.Dense(6)(a) if kind == 1 else L.Add()(a, b))
    outputs = [made[-1]] + ([made[int(rng.integers(1, len(made) - 1))]] if len(made) > 3 and seed % 2 else [])
    outputs = list({id(o): o for o in outputs}.values())
    return dl.Model(x, outputs if len(outputs) > 1 else outputs[0], dtype="float64", seed=seed)


@pytest.mark.parametrize("seed", range(12))
def test_a_models_forward_drops_each_value_where_the_brute_force_count_says(seed, monkeypatch):
    """On generated models, Model.forward counts with liveness.last_reads (once, then kept), its count over the
    nodes equals the brute-force one, and dropping by it leaves the outputs as keeping every value does."""
    model = generated_model(seed)
    steps, keep = liveness.steps_of(model.nodes), {id(o) for o in model.outputs}
    assert [sorted(d) for d in liveness.last_reads(steps, keep)] == brute_force(steps, keep)
    x = np.random.default_rng(seed).standard_normal((3, 6))
    kept = model.forward(x)
    calls = []
    monkeypatch.setattr(liveness, "last_reads", lambda *a: calls.append(a) or liveness_last_reads(*a))
    model._deaths, model.releases = None, True
    dropped = model.forward(x)
    assert len(calls) == 1 and calls[0][0] == steps           # Model.forward counts with liveness.last_reads
    assert model._values is None
    for a, b in zip(kept if isinstance(kept, list) else [kept], dropped if isinstance(dropped, list) else [dropped]):
        np.testing.assert_array_equal(a, b)


def test_the_compiled_model_drops_by_the_same_count():
    """InferenceModel.schedule's drops are liveness.last_reads' (the same function), equal to the brute-force
    count on its kernel steps, and the compiled model predicts what the model does."""
    from minidl.inference import model as compiled
    assert compiled.last_reads is liveness_last_reads
    x = L.Input((1, 4, 4))
    h = L.ReLU()(L.Conv2D(2, 3, padding=1)(x))
    net = dl.Model(x, L.Dense(3)(L.Flatten()(L.Add()(h, L.Conv2D(2, 1)(h)))), seed=1)
    infer = dl.inference.compile(net)
    steps, free = infer.schedule(2)
    keep = set(infer.outputs) | {0}
    assert [sorted(d) for d in free] == brute_force([(st.inputs, st.out) for st in steps], keep)
    images = np.random.default_rng(0).uniform(0, 1, (2, 1, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(infer.predict(images), net.predict(images), rtol=1e-5, atol=1e-6)
