"""Gradient buckets (minidl.distributed.buckets) and the reducer's step around them, in one process: the plan
tiles the arena in backward order, each bucket starts once a step when its gradients are final,
and a reducer whose sum is a second, identical rank trains exactly like one process (the mean is
folded into the optimizer's update)."""
import numpy as np
import pytest

import minidl as dl
from minidl.distributed import buckets
from minidl import distributed, models, optim
from minidl.graph import passes
from minidl.losses import softmax_cross_entropy
from minidl.metrics import Mean
from minidl.training.step import TrainStep


def _net(name, depth=None):
    model = models.get(name, depth=depth, device=dl.get_device("cpu"), seed=0)
    return model, model.lower(passes.training)


def _trainable_backward(net):
    return [layer.name for layer in reversed(net.layers) if any(p.trainable for p in layer.params.values())]


@pytest.mark.parametrize("name,depth,cap_mib", [("lenet", None, 0.02), ("lenet", None, buckets.CAP_MIB),
                                                ("resnet", 18, 0.5)])
def test_buckets_tile_the_arena_in_backward_order(name, depth, cap_mib):
    _, net = _net(name, depth)
    cap = int(cap_mib * 2 ** 20)
    plan = buckets.plan(net, cap)
    spans = sorted((b.lo, b.hi) for b in plan)
    assert spans[0][0] == 0 and spans[-1][1] == net.grads.size
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))             # no gap, no overlap
    assert [b.lo for b in plan] == sorted((b.lo for b in plan), reverse=True)   # the arena end first
    assert [n for b in plan for n in b.layers] == _trainable_backward(net)     # backward order
    size = {layer.name: sum(p.size for p in layer.params.values() if p.trainable) * 4 for layer in net.layers}
    for b in plan[:-1]:                       # as small as the cap allows: full, less its last layer not
        assert (b.hi - b.lo) * 4 >= cap and sum(size[n] for n in b.layers[:-1]) < cap
    if cap_mib < 1:
        assert len(plan) > 2


@pytest.mark.parametrize("tail_mib", [0.01, 0.2, 1.0])
def test_a_tail_cap_splits_the_last_bucket_to_the_layers_backward_finishes_last(tail_mib):
    """The last bucket is final only when backward ends: under a tail cap its final layers, up to the
    cap (at least one), go in a bucket of their own; the other buckets are as before."""
    _, net = _net("resnet", 18)
    cap, tail = int(2 * 2 ** 20), int(tail_mib * 2 ** 20)
    plain, split = buckets.plan(net, cap), buckets.plan(net, cap, tail)
    assert split[:-2] == plain[:-1] and len(split) == len(plain) + 1
    bulk, last = split[-2:]
    assert (last.lo, bulk.hi) == (plain[-1].lo, plain[-1].hi)      # the same range, cut in two
    assert bulk.layers + last.layers == plain[-1].layers and bulk.layers and last.layers
    assert last.hi == bulk.lo and last.lo == 0                      # the arena's head: the stem's
    size = {layer.name: sum(p.size for p in layer.params.values() if p.weight) * 4 for layer in net.layers}
    assert (last.hi - last.lo) * 4 <= tail or len(last.layers) == 1
    if len(bulk.layers) > 1:                      # as much as the cap takes: one layer more would not fit
        assert (last.hi - last.lo) * 4 + size[bulk.layers[-1]] > tail
    assert buckets.plan(net, cap, int(1e9)) == plain                # a cap above the last bucket: no split


def test_a_tail_cap_leaves_a_one_layer_bucket_and_lenet_alone():
    _, net = _net("lenet")
    whole = buckets.plan(net, int(buckets.CAP_MIB * 2 ** 20))
    assert len(whole) == 1 and buckets.plan(net, int(buckets.CAP_MIB * 2 ** 20), 1) != whole   # split to one layer
    one = buckets.plan(net, 1)                                       # a bucket a layer: nothing to split
    assert buckets.plan(net, 1, 1) == one


@pytest.mark.parametrize("value,want", [("", 0.0), ("0", 0.0), ("0.00", 0.0), ("2", 2.0), ("0.5", 0.5)])
def test_the_tail_cap_comes_from_the_environment(value, want):
    assert buckets.tail_mib_from_env({"MINIDL_BUCKET_TAIL_MIB": value}) == want
    assert buckets.tail_mib_from_env({}) == buckets.TAIL_MIB == 0.0


@pytest.mark.parametrize("value", ["abc", "-1", "1e9", "nan"])
def test_a_bad_tail_cap_is_one_error_naming_the_variable_and_its_value(value):
    want = rf"^MINIDL_BUCKET_TAIL_MIB must be 0 \(off\) or a bucket size .* got '{value}'$"
    with pytest.raises(ValueError, match=want):
        buckets.tail_mib_from_env({"MINIDL_BUCKET_TAIL_MIB": value})


@pytest.mark.parametrize("name,depth", [("lenet", None), ("resnet", 18)])
def test_each_bucket_starts_once_a_step_when_its_gradients_are_final(name, depth):
    model, net = _net(name, depth)
    snapshots = []
    bk = buckets.GradientBuckets(net, lambda view, lo: snapshots.append(view.copy()), cap_mib=0.05)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 1, 28, 28)).astype(np.float32), np.array([3, 7])
    for step in range(2):
        snapshots.clear()
        gz = softmax_cross_entropy(net.forward(x, training=True), y)[2]
        net.zero_grad()
        net.backward(gz, input_grads=False, ready=bk.begin())
        assert bk.started == list(range(len(bk)))          # each once, in the order backward finished them
        bk.flush()
        assert bk.started == list(range(len(bk))) and len(snapshots) == len(bk)
        for b, seen in zip(bk.buckets, snapshots):        # what was handed over is what backward left
            np.testing.assert_array_equal(seen, net.grads[b.lo:b.hi])
    bk.begin()
    bk.flush()                                             # no backward: flush starts every bucket
    assert bk.started == list(range(len(bk)))


class _SecondRankAlike:
    """A communicator whose other rank holds the same arrays: a sum doubles, an AND keeps."""

    def __init__(self):
        self.calls = []

    def start(self, a, op, wire=None):
        self.calls.append(op)
        if op == "sum":
            a *= 2

    def wait(self):
        self.calls.append("wait")


@pytest.mark.parametrize("opt", ["momentum", "adam", "rmsprop", "sgd"])
def test_two_alike_ranks_train_exactly_like_one_process_with_the_mean_in_the_update(opt):
    kw = {"momentum": 0.9} if opt == "momentum" else {}
    plain, twin = (models.get("lenet", device=dl.get_device("cpu"), seed=0) for _ in range(2))
    coll = _SecondRankAlike()
    reducer = distributed.Reducer(distributed.World(0, 2), twin.device, bucket_mib=0.05, communicator=coll)
    steps = [TrainStep(m, optim.get(opt, lr=0.01, weight_decay=1e-3, **kw).setup(m), Mean(m.device), r)
             for m, r in ((plain, None), (twin, reducer))]
    assert steps[1].optimizer.grad_scale == 0.5 and steps[0].optimizer.grad_scale == 1.0
    rng = np.random.default_rng(1)
    for _ in range(5):
        coll.calls.clear()
        x, y = rng.standard_normal((8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)
        for s in steps:
            s(x, y)
        # per step: every bucket summed once, then the NaN flag AND-ed, then one wait before the update
        assert coll.calls == ["sum"] * len(reducer.buckets) + ["and", "wait"] and len(reducer.buckets) > 1
        np.testing.assert_array_equal(twin.grads, 2 * plain.grads)   # the sum stays: no averaging pass
        np.testing.assert_array_equal(twin.flat, plain.flat)         # (2g) x 1/2 = g, exactly


@pytest.mark.parametrize("name,depth,channels_last", [("lenet", None, False), ("resnet", 18, True)])
def test_half_precision_buckets_are_gathered_one_by_one_into_the_same_float32_gradients(name, depth, channels_last):
    """Under a bf16 policy the hook sees a layer final in its bfloat16 copy; gathering each bucket's
    range as it starts (what the Reducer does, so half-precision buckets travel during backward)
    leaves the float32 arena as backward's whole gather at the end does. (The GPU's KRSC filter
    copies: tests/gpu/test_distributed.py, two ranks in bf16.)"""
    dev = dl.get_device("cpu")
    model = models.get(name, depth=depth, device=dev, seed=0)
    step = TrainStep(model, optim.get("momentum", lr=0.01, momentum=0.9).setup(model), Mean(dev), policy="bf16",
                     channels_last=channels_last)
    net = step.net
    assert net.copies
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 1, 28, 28)).astype(np.float32), np.array([3, 7, 1, 0])

    def grads(hook):
        gz = softmax_cross_entropy(net.forward(x, training=True), y)[2]
        net.zero_grad()                            # a bucket never gathered would stay 0
        net.backward(gz, input_grads=False, ready=hook.begin() if hook else None)
        if hook:
            hook.flush()
        return net.grads.copy()
    whole = grads(None)
    seen = []
    bk = buckets.GradientBuckets(net, lambda view, lo: (net.gather(lo, lo + view.size), seen.append(lo)), cap_mib=0.05)
    assert len(bk) > 1
    np.testing.assert_array_equal(grads(bk), whole)
    assert len(seen) == len(bk) and np.count_nonzero(whole[:bk.buckets[-1].hi])     # the first layers' too


@pytest.mark.parametrize("value", ["abc", "-1", "0", "1e9", "nan", "inf", " "])
def test_a_bad_bucket_size_in_the_environment_is_one_error_naming_the_variable_and_its_value(value):
    env = {"MINIDL_BUCKET_MIB": value}
    if not value.strip():                       # empty: unset, the default
        assert buckets.bucket_mib_from_env(env) == buckets.CAP_MIB
        return
    with pytest.raises(ValueError, match=f"^MINIDL_BUCKET_MIB must be .* got '{value}'$"):
        buckets.bucket_mib_from_env(env)
    assert buckets.bucket_mib_from_env({"MINIDL_BUCKET_MIB": "0.25"}) == 0.25
    assert buckets.bucket_mib_from_env({}) == buckets.CAP_MIB


@pytest.mark.parametrize("value", [0, -2.0, float("nan"), 1e9, "x", True])
def test_the_reducer_refuses_a_bad_bucket_size_naming_it(value):
    world, device = distributed.World(0, 2), dl.get_device("cpu")
    with pytest.raises(ValueError, match="^bucket_mib must be a bucket size in MiB"):
        distributed.Reducer(world, device, bucket_mib=value, communicator=_SecondRankAlike())


def test_the_reducer_cuts_the_tail_the_environment_asks_for(monkeypatch):
    _, net = _net("resnet", 18)
    world, device = distributed.World(0, 2), dl.get_device("cpu")
    plain = distributed.Reducer(world, device, bucket_mib=2, communicator=_SecondRankAlike()).watch(net).buckets
    monkeypatch.setenv("MINIDL_BUCKET_TAIL_MIB", "0.2")
    tail = distributed.Reducer(world, device, bucket_mib=2, communicator=_SecondRankAlike()).watch(net).buckets
    assert tail == buckets.plan(net, 2 << 20, int(0.2 * 2 ** 20)) and len(tail) == len(plain) + 1
