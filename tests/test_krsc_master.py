"""The float32 master's filters laid K, kH, kW, C (graph/arena.py, lay_krsc): a channels-last training
lowering lays the model's own filters in the order cuDNN's channels-last convolutions read, so they are not
transposed at every call. Only the arena's order changes: weights, gradients, training and the optimizer's
state (in checkpoints too) are what they were. The CPU never asks for channels-last itself, so these tests
lower by hand or let the CPU's backend answer as the GPU does."""
import gc

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl import optim
from minidl.graph import arena, passes


def net(seed=0):
    x = L.Input((3, 8, 8))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(5, 3, padding=1, bias=False)(x)))     # 3x3 over 3 channels: laid
    h = L.Conv2D(4, 1, activation="relu")(h)                                        # 1x1: lies alike both ways
    h = L.MaxPool2D(2)(L.Conv2D(6, (3, 2), padding=1)(h))                           # 3x2: laid
    return dl.Model(x, L.Dense(3)(L.Flatten()(h)), seed=seed)


LAID = ("conv2d/w", "conv2d_2/w")


def cl_lowering(model):
    return model.lower(lambda g: passes.channels_last(passes.training(g)))


def data(n=24, seed=1):
    rng = np.random.default_rng(seed)
    return rng.uniform(0, 1, (n, 3, 8, 8)).astype(np.float32), rng.integers(0, 3, n)


def test_a_channels_last_lowering_lays_the_filters_and_keeps_every_value():
    model = net()
    before = model.get_weights()
    low = cl_lowering(model)
    for k, w in model.get_weights().items():
        np.testing.assert_array_equal(w, before[k], err_msg=k)
    for k, p in model.params.items():
        laid = k in LAID
        assert p.data.flags.c_contiguous is not laid, k
        assert p.grad is None or p.grad.flags.c_contiguous is not laid, k
        assert low.params[k] is p                      # the lowering trains the model's own Parameter
        if p.data.ndim == 4:                           # the arena's range holds K, kH, kW, C where laid
            order = before[k].transpose(0, 2, 3, 1) if laid else before[k]
            np.testing.assert_array_equal(model.flat[p.offset:p.offset + p.size], order.ravel(), err_msg=k)
    assert arena.laid_krsc(model.params) == tuple(sorted((model.params[k].offset,) + model.params[k].shape
                                                         for k in LAID))
    cl_lowering(model)                                 # laid already: nothing moves again
    np.testing.assert_array_equal(model.get_weights()["conv2d/w"], before["conv2d/w"])


def test_a_live_lowering_keeps_the_filters_as_they_lie():
    """A captured step of another lowering reads the filters at the addresses and strides it was captured
    with: while one is alive, a new channels-last lowering leaves the arena alone (cuDNN transposes)."""
    model = net()
    plain = model.lower(passes.training)
    cl_lowering(model)
    assert arena.laid_krsc(model.params) == ()
    del plain
    gc.collect()
    cl_lowering(model)
    assert len(arena.laid_krsc(model.params)) == 2


@pytest.fixture
def cpu_answers_channels_last(monkeypatch):
    """The CPU's backend answers `channels_last` as asked (as the GPU does for a large float32 model)."""
    backend = type(dl.get_device("cpu").backend)
    monkeypatch.setattr(backend, "channels_last", lambda self, dtype, requested=None, macs=0.0: bool(requested))


def trainer(channels_last, opt=None):
    opt = opt or optim.Momentum(0.05, momentum=0.9, weight_decay=1e-3)
    return dl.Trainer(net(), opt, channels_last=channels_last, progress=False, log=lambda s: None)


def trained(channels_last, steps=5):
    t = trainer(channels_last)
    t.fit(data(), steps=steps, batch_size=8)
    return t


def test_training_through_laid_filters_is_training_as_before(cpu_answers_channels_last):
    """The same run with the filters laid and not: the same weights and the same optimizer state to the last
    bit (the update is elementwise; the CPU reads a laid filter in its own order), the state in checkpoints'
    (K, C, kH, kW) order; in the arena it lies as the filters do."""
    laid, plain = trained(True), trained(False)
    assert laid.channels_last and not plain.channels_last
    assert len(arena.laid_krsc(laid.model.params)) == 2 and arena.laid_krsc(plain.model.params) == ()
    for k, w in plain.model.get_weights().items():
        np.testing.assert_array_equal(laid.model.get_weights()[k], w, err_msg=k)
    x, _ = data(6, seed=2)                  # every entry point answers alike over the laid filters
    np.testing.assert_array_equal(laid.model.predict(x), plain.model.predict(x))
    np.testing.assert_array_equal(laid.model.forward(x), plain.model.forward(x))
    compiled = [dl.inference.compile(t.model).predict(x) for t in (laid, plain)]
    np.testing.assert_array_equal(*compiled)
    (slot, v), = plain.optimizer.state_dict()["arrays"].items()
    assert np.any(v)
    np.testing.assert_array_equal(laid.optimizer.state_dict()["arrays"][slot], v)
    p = laid.model.params["conv2d_2/w"]
    np.testing.assert_array_equal(np.asarray(laid.optimizer.state[slot][p.offset:p.offset + p.size]),
                                  v[p.offset:p.offset + p.size].reshape(p.shape).transpose(0, 2, 3, 1).ravel())


@pytest.mark.parametrize("first, second", [(True, False), (False, True)])
def test_a_checkpoint_resumes_exactly_in_either_layout(cpu_answers_channels_last, tmp_path, first, second):
    """Saved from one layout and resumed in the other: the run ends as the one never stopped."""
    straight = trained(False, steps=8)
    stopped = trained(first, steps=5)
    stopped.save(str(tmp_path / "c.npz"))
    resumed = trainer(second)
    resumed.resume(str(tmp_path / "c.npz"))
    resumed.fit(data(), steps=8, batch_size=8)
    assert len(arena.laid_krsc(resumed.model.params)) == (2 if second else 0)
    for k, w in straight.model.get_weights().items():
        np.testing.assert_array_equal(resumed.model.get_weights()[k], w, err_msg=k)


def test_an_optimizer_set_up_before_the_filters_were_laid_moves_its_state_with_them(cpu_answers_channels_last):
    """Trained by a plain lowering, then by a new Trainer of the same model and optimizer, channels-last once the
    first is gone: the state the first left is laid as the filters now are, and the run ends as the same two
    Trainers end with nothing laid."""
    def two_trainers(channels_last):
        first = trained(False, steps=3)
        model, opt = first.model, first.optimizer
        del first
        gc.collect()
        again = dl.Trainer(model, opt, channels_last=channels_last, progress=False, log=lambda s: None)
        assert opt._krsc == arena.laid_krsc(model.params) and len(opt._krsc) == (2 if channels_last else 0)
        again.fit(data(), more_steps=3, batch_size=8)
        return model

    laid, plain = two_trainers(True), two_trainers(False)
    for k, w in plain.get_weights().items():
        np.testing.assert_array_equal(laid.get_weights()[k], w, err_msg=k)


def test_a_half_copy_lies_as_its_laid_master_does():
    """A bfloat16 lowering that is not channels-last, of a model whose filters a channels-last one laid: its
    copies lie K, kH, kW, C too and are cast as they lie, holding the master's values rounded."""
    model = net()
    low = cl_lowering(model)
    del low
    gc.collect()
    half = model.lower(lambda g: passes.cast(passes.training(g), "bfloat16"))
    (copies,) = half.copies
    assert copies.permuted == ()                         # no permuting cast: the master lies as the copy
    x, _ = data(4)
    half.forward(x, training=True)                       # refresh: the copies from the master
    for k in LAID:
        copy, master = half.params[k], model.params[k]
        assert copy is not master and not copy.data.flags.c_contiguous
        np.testing.assert_array_equal(np.asarray(copy.data, np.float32),
                                      np.asarray(master.data).astype(copy.data.dtype).astype(np.float32))


def test_a_sharded_optimizers_state_leaves_in_checkpoints_order(cpu_answers_channels_last, tmp_path):
    """A rank sharding its optimizer (here the one rank of MPI's world) over laid filters saves the state in
    (K, C, kH, kW) order, as the unsharded, unlaid run does, and a resumed sharded rank saves it back alike."""
    MPI = pytest.importorskip("mpi4py.MPI")
    from minidl import distributed

    class OneShardingRank(distributed.World):
        def reducer(self, device, bucket_mib=None, grad_reduce="fp32", stop_asked=None, shard=False):
            return distributed.Reducer(self, device, bucket_mib=0.0005, grad_reduce=grad_reduce,
                                       stop_asked=stop_asked, shard=True)

    def trainer_on(world, channels_last):
        return dl.Trainer(net(), optim.Momentum(0.05, momentum=0.9), world=world, channels_last=channels_last,
                          progress=False, log=lambda s: None)

    sharded = trainer_on(OneShardingRank(0, 1, 0, MPI.COMM_WORLD), True)
    plain = trainer_on(distributed.World(), False)
    for t, name in ((sharded, "sharded"), (plain, "plain")):
        t.fit(data(), steps=4, batch_size=8)
        t.save(str(tmp_path / f"{name}.npz"))
    assert sharded.optimizer.shard is not None and len(arena.laid_krsc(sharded.model.params)) == 2
    again = trainer_on(OneShardingRank(0, 1, 0, MPI.COMM_WORLD), True)
    again.resume(str(tmp_path / "sharded.npz"))
    again.save(str(tmp_path / "again.npz"))
    files = {name: np.load(tmp_path / f"{name}.npz") for name in ("sharded", "plain", "again")}
    slots = [k for k in files["plain"].files if k.startswith("optim/")]
    assert slots and all(np.any(files["plain"][k]) for k in slots)
    for name in ("sharded", "again"):
        for k in slots:
            np.testing.assert_array_equal(files[name][k], files["plain"][k], err_msg=f"{name} {k}")
