"""The sharded optimizer (ZeRO stage 1, minidl/distributed/shard.py) on the CPU under MPICH: 2 ranks at b,
each updating half the arena with half the optimizer state, train the run of one process at 2b (momentum
and Adam, with clipping by the global norm, a frozen layer and a parameter group, one bucket or one a
layer); its checkpoints are the unsharded format and resume across the two modes and rank counts."""
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import minidl as dl
from minidl import distributed, models, optim, precision
from minidl.distributed import shard as zero
from minidl.distributed.buckets import Bucket

from tests.test_distributed import ENV, launch, needs_mpi

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "helpers" / "shard_worker.py"
LAYERS = ["--bucket-mib", "0.001"]          # the small net's layers each in a bucket of its own: 3 pieces a rank


def _relative(a, b):
    return np.abs(a["flat"] - b["flat"]).max() / np.abs(a["flat"]).max()


# -- without MPI ---------------------------------------------------------------------------------
def test_each_rank_takes_chunk_r_of_every_bucket_and_its_state_packs_them_in_bucket_order():
    buckets = [Bucket(192, 320, ("b",)), Bucket(0, 192, ("a",))]          # backward order: the arena's top first
    assert zero.plan(buckets, 0, 2) == [zero.Piece(192, 256, 0, 0), zero.Piece(0, 96, 64, 1)]
    assert zero.plan(buckets, 1, 2) == [zero.Piece(256, 320, 0, 0), zero.Piece(96, 192, 64, 1)]
    for ranks in (2, 3, 4, 5, 7):
        plans = [zero.plan(buckets, r, ranks) for r in range(ranks)]
        owned = sorted(i for pieces in plans for p in pieces if p.counted for i in range(p.lo, p.hi))
        assert owned == list(range(320)), ranks      # the pieces tile the arena, a shared remainder counted once
        assert len({sum(p.hi - p.lo for p in pieces) for pieces in plans}) == 1     # every rank's state: one size


def test_a_bucket_n_ranks_cannot_split_evenly_leaves_its_last_values_to_every_rank():
    """128 values among 3 ranks: chunks of 42, and the last 2 all-reduced and updated by all (counted once)."""
    buckets = [Bucket(192, 320, ("b",)), Bucket(0, 192, ("a",))]
    assert zero.plan(buckets, 1, 3) == [zero.Piece(234, 276, 0, 0), zero.Piece(318, 320, 42, 0, True, False),
                                        zero.Piece(64, 128, 44, 1)]
    assert zero.plan(buckets, 0, 3)[1] == zero.Piece(318, 320, 42, 0, True, True)


class _World:
    def __init__(self, rank, size):
        self.rank, self.size, self.main = rank, size, rank == 0


def test_the_ranks_packed_shards_unpack_into_the_whole_arena():
    buckets = [Bucket(256, 384, ("c",)), Bucket(64, 256, ("b",)), Bucket(0, 64, ("a",))]
    whole = np.arange(384, dtype=np.float32)
    for ranks, size in ((4, 96), (3, 130)):                         # 3: each bucket leaves one value to all
        shards = [zero.Shard(_World(r, ranks), None, buckets, None, np) for r in range(ranks)]
        every = np.stack([s.pack(whole) for s in shards])          # what rank 0 gathers
        assert every.shape == (ranks, size) and shards[0].size == size
        assert np.array_equal(shards[0]._unpack(every), whole)


def test_the_flag_is_refused_with_fp16_before_any_data_is_read():
    p = subprocess.run([sys.executable, "-m", "minidl.train", "--shard-optimizer", "--precision", "fp16",
                        "--data-dir", "/nonexistent"], env=ENV, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].endswith("use bf16 or fp32"), p.stderr


# -- under mpiexec ---------------------------------------------------------------------------------
@needs_mpi
def test_reduce_scatter_and_all_gather_of_the_mpi_communicator():
    code = """if True:
        import numpy as np
        from mpi4py import MPI
        from minidl.kernels.cpu.collectives import Communicator
        comm = MPI.COMM_WORLD
        c, r = Communicator(comm), comm.rank
        a = np.arange(8, dtype=np.float32) + 10 * r           # rank 0: 0..7, rank 1: 10..17
        c.reduce_scatter(a, "sum")
        c.wait()
        mine = a[4 * r:4 * r + 4].copy()
        assert np.array_equal(mine, 2 * np.arange(4 * r, 4 * r + 4) + 10), mine
        assert np.array_equal(a[4 * (1 - r):4 * (2 - r)], np.arange(4 * (1 - r), 4 * (2 - r)) + 10 * r), a  # kept
        a[4 * r:4 * r + 4] = 100 + r
        c.all_gather(a)
        c.wait()
        assert np.array_equal(a, np.repeat([100.0, 101.0], 4)), a
    """
    p = launch(2, "-c", code)
    assert p.returncode == 0, p.stderr


@needs_mpi
@pytest.mark.parametrize("optimizer,buckets", [("momentum", []), ("momentum", LAYERS), ("adam", LAYERS)])
def test_two_sharded_ranks_train_the_run_of_one_process_with_half_the_optimizer_state(tmp_path, optimizer, buckets):
    # momentum in float64: the runs agree to rounding (the sums run in another order); Adam in float32 as the
    # command line trains, 12 steps (within chaos's ~20, tests/test_distributed.py): its weights to 1e-5.
    flag = ["--optimizer", optimizer, *buckets] + (["--float64"] if optimizer == "momentum" else [])
    one = launch(0, WORKER, tmp_path / "one.npz", 32, 12, *flag)
    two = launch(2, WORKER, tmp_path / "two.npz", 16, 12, "--shard", *flag)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert _relative(a, b) <= (1e-12 if optimizer == "momentum" else 1e-5)
    slots = 1 if optimizer == "momentum" else 2
    assert a["state_sizes"].tolist() == [[int(a["arena"])] * slots]
    assert b["state_sizes"].tolist() == [[int(a["arena"]) // 2] * slots] * 2     # half each: the memory saved


@needs_mpi
def test_three_sharded_ranks_whose_buckets_leave_a_remainder_train_the_run_of_one_process(tmp_path):
    """3 ranks do not split the 64-value multiples of the buckets: each bucket's last values are all-reduced
    and updated on every rank, and the clip norm counts them once."""
    flag = ["--optimizer", "momentum", "--float64", *LAYERS]
    one = launch(0, WORKER, tmp_path / "one.npz", 48, 12, *flag)
    three = launch(3, WORKER, tmp_path / "three.npz", 16, 12, "--shard", *flag)
    assert one.returncode == 0 and three.returncode == 0, one.stderr + three.stderr
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "three.npz")
    assert _relative(a, b) <= 1e-12
    arena = int(a["arena"])
    assert b["state_sizes"].shape == (3, 1) and arena // 3 <= int(b["state_sizes"][0, 0]) < arena // 3 + 3 * 3


@needs_mpi
def test_a_shard_that_skips_the_clip_norms_sum_over_the_ranks_is_caught(tmp_path):
    """The check above can fail: each rank clipping by its own shard's norm trains another run."""
    code = (f"import sys, runpy; from minidl.distributed import shard; "
            f"shard.Shard.total = lambda self, parts: sum(parts[1:], parts[0]); "
            f"sys.argv = ['w', *sys.argv[1:]]; runpy.run_path({str(WORKER)!r}, run_name='__main__')")
    flag = ["--optimizer", "momentum", "--float64", *LAYERS]
    one = launch(0, WORKER, tmp_path / "one.npz", 32, 12, *flag)
    two = launch(2, "-c", code, tmp_path / "two.npz", 16, 12, "--shard", *flag)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert _relative(np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")) > 1e-4


@needs_mpi
@pytest.mark.parametrize("extra", [["--precision", "bf16"], ["--grad-reduce", "bf16"]])
def test_under_bf16_the_sharded_ranks_train_the_unsharded_ranks_run(tmp_path, extra):
    """bf16 compute copies cast from the gathered float32 masters; bf16 on the wire rounded as the all-reduce's."""
    runs = {name: launch(2, WORKER, tmp_path / f"{name}.npz", 16, 12, *LAYERS, *extra, *shard)
            for name, shard in (("all", []), ("shard", ["--shard"]))}
    assert all(p.returncode == 0 for p in runs.values()), "".join(p.stderr for p in runs.values())
    assert _relative(np.load(tmp_path / "all.npz"), np.load(tmp_path / "shard.npz")) <= 1e-6


@needs_mpi
def test_a_sharded_checkpoint_is_the_unsharded_one_and_resumes_across_modes_and_rank_counts(tmp_path):
    flag = ["--optimizer", "adam", "--float64", *LAYERS]
    run = lambda n, name, *more: launch(n, WORKER, tmp_path / f"{name}.npz", 32 // max(n, 1), *more, *flag)  # noqa: E731
    steps = [run(0, "whole", 24),                                                        # never stopped
             run(0, "one", 12, "--save", tmp_path / "one.ckpt.npz"),
             run(2, "two", 12, "--shard", "--save", tmp_path / "two.ckpt.npz"),
             run(2, "on_two", 24, "--shard", "--resume", tmp_path / "one.ckpt.npz"),     # unsharded -> sharded
             run(0, "on_one", 24, "--resume", tmp_path / "two.ckpt.npz"),                # sharded -> one process
             run(4, "on_four", 24, "--shard", "--resume", tmp_path / "two.ckpt.npz")]    # 2 sharded -> 4 sharded
    assert all(p.returncode == 0 for p in steps), "".join(p.stderr for p in steps)
    one, two = np.load(tmp_path / "one.ckpt.npz"), np.load(tmp_path / "two.ckpt.npz")
    assert sorted(one.files) == sorted(two.files) and "optim/m" in one.files
    for k in one.files:
        if k != "__meta__":
            assert one[k].shape == two[k].shape
            np.testing.assert_allclose(two[k], one[k], rtol=1e-10, atol=1e-14, err_msg=k)
    whole = np.load(tmp_path / "whole.npz")
    for name in ("on_two", "on_one", "on_four"):
        resumed = np.load(tmp_path / f"{name}.npz")
        assert int(resumed["step"]) == 24 and _relative(whole, resumed) <= 1e-12, name


class _OneShardingRank(distributed.World):
    """One rank whose Reducer reduces and shards anyway (over MPI's world of this one process)."""

    def reducer(self, device, bucket_mib=None, grad_reduce="fp32", stop_asked=None, shard=False):
        return distributed.Reducer(self, device, bucket_mib=0.05, grad_reduce=grad_reduce,      # LeNet-5: 2 buckets
                                   stop_asked=stop_asked, shard=True)


def _lenet(world, **kw):
    dev = dl.get_device("cpu", seed=0)
    opt = optim.Adam(lr=1e-3, clip_norm=1.0, groups=[{"params": ["dense"], "lr": 5e-4}])
    return dl.Trainer(models.get("lenet", device=dev, seed=0), opt, world=world, progress=False,
                      log=lambda s: None, **kw)


def test_a_one_rank_sharding_reducer_trains_as_one_process_and_refuses_fp16():
    """In this process (no launcher): the sharded path through Trainer, Reducer and optimizer, exactly as one
    process trains; fp16's loss scaling, which reads the whole gradient, is refused naming the flag."""
    MPI = pytest.importorskip("mpi4py.MPI")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (256, 28, 28), dtype=np.uint8), rng.integers(0, 10, 256)
    plain, sharded = _lenet(distributed.World()), _lenet(_OneShardingRank(0, 1, 0, MPI.COMM_WORLD))
    assert len(sharded.optimizer.shard.pieces) == 2 and sharded.optimizer.shard is sharded.reducer.shard
    results = [t.fit((x, y), steps=10, batch_size=32, monitor=5) for t in (plain, sharded)]
    # the clip norm sums two pieces' squares where one process sums the arena's (float64): equal to rounding
    assert np.abs(plain.model.flat - sharded.model.flat).max() <= 1e-6 * np.abs(plain.model.flat).max()
    assert results[1].loss == pytest.approx(results[0].loss, rel=1e-6)
    with pytest.raises(ValueError, match="shard_optimizer: precision fp16's loss scaling"):
        _lenet(_OneShardingRank(0, 1, 0, MPI.COMM_WORLD), precision=precision.policy("fp16", always=True))
