"""The sharded optimizer (ZeRO stage 1, minidl/distributed/shard.py) on the GPU: NCCL's reduce-scatter and
all-gather on the reduction stream, eager and inside the captured step.

On one GPU: a one-rank NCCL reducer that shards anyway (its shard the whole arena) trains exactly as one
process, eager and captured, so the collectives' calls and their fork/join run on any GPU machine. On two
GPUs (skipped with fewer), under the MPI launcher in $MINIDL_MPIEXEC (default mpiexec), TF32 off: two
sharded ranks at b16 train the run of one GPU at b32 (momentum and Adam, clipping by the global norm, a
frozen layer, a parameter group; one bucket and one a layer; eager and captured) with half the optimizer
state each, the unsharded ranks' run under bf16 (policy and wire), and a sharded checkpoint resumes on one GPU;
and NCCL's reduce-scatter and all-gather alone, in place, plain and through a bfloat16 wire.

    NCCL_NVLS_ENABLE=0 MINIDL_MPIEXEC="mpirun --allow-run-as-root" python -m pytest -q tests/gpu/test_shard.py
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")
MPI = pytest.importorskip("mpi4py.MPI")

import minidl as dl  # noqa: E402
from minidl import distributed, models, optim  # noqa: E402
from tests.helpers import mpi_ranks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "helpers" / "shard_worker.py"
LAYERS = ["--bucket-mib", "0.001"]          # the worker's small net: a bucket a layer, 3 pieces a rank
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")      # NVLink SHARP off, as on the machines we run on


class _OneShardingRank(distributed.World):
    """One rank that reduces and shards anyway (over itself), so the sharded NCCL path runs on one GPU."""

    def reducer(self, device, bucket_mib=None, grad_reduce="fp32", stop_asked=None, shard=False):
        return distributed.Reducer(self, device, bucket_mib=0.05, grad_reduce=grad_reduce,     # LeNet-5: 2 buckets
                                   stop_asked=stop_asked, shard=True)


def _train(world, graph):
    dev = dl.get_device("cuda", seed=0)
    model = models.get("lenet", device=dev, seed=0)
    opt = optim.Adam(lr=1e-3, clip_norm=1.0, groups=[{"params": ["dense"], "lr": 5e-4}])
    trainer = dl.Trainer(model, opt, world=world, graph=graph, progress=False, log=lambda s: None)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (512, 28, 28), dtype=np.uint8), rng.integers(0, 10, 512)
    result = trainer.fit((x, y), steps=20, batch_size=32, monitor=10)
    return trainer, dev.to_host(model.flat), result


@pytest.mark.parametrize("graph", [True, False])
def test_a_one_rank_sharding_nccl_reducer_trains_as_one_process(graph):
    plain = _train(distributed.World(), graph)
    trainer, flat, result = _train(_OneShardingRank(0, 1, 0, MPI.COMM_WORLD), graph)
    assert trainer.graph is graph and len(trainer.reducer.buckets) == 2
    assert trainer.optimizer.shard is trainer.reducer.shard and len(trainer.optimizer.shard.pieces) == 2
    # the clip norm sums two pieces' squares where one process sums the arena's (float64): equal to rounding
    assert np.abs(flat - plain[1]).max() <= 1e-6 * np.abs(plain[1]).max()
    assert result.loss == pytest.approx(plain[2].loss, rel=1e-6) and result.accuracy == plain[2].accuracy
    trainer.reducer.coll.close()



_gpus = mpi_ranks.gpu_count
_launcher = mpi_ranks.launcher


def _runs(tmp_path, runs):
    """Each (name, ranks, b, steps, *flags) run of tests/helpers/shard_worker.py on the GPU -> its npz."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0")     # keep the caller's path: the cuDNN Frontend may live there
    out = {}
    for name, ranks, b, steps, *flags in runs:
        cmd = ([] if ranks == 1 else _launcher() + ["-n", str(ranks)]) + [
            sys.executable, str(WORKER), str(tmp_path / f"{name}.npz"), str(b), str(steps), "--device", "cuda",
            "--watchdog", "120", *map(str, flags)]                                  # a hang: every rank's stack
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out[name] = dict(np.load(tmp_path / f"{name}.npz"))
    return out


_COLLECTIVES = """if True:
    import sys
    import cupy as cp
    from mpi4py import MPI
    from minidl.kernels.gpu.collectives import Communicator
    from minidl.precision import BFLOAT16
    comm = MPI.COMM_WORLD
    r = comm.rank
    cp.cuda.Device(r).use()
    c = Communicator(comm)
    for wire in (None, cp.empty(8, BFLOAT16) if "bf16" in sys.argv else None):
        a = cp.arange(8, dtype=cp.float32) + 10 * r           # rank 0: 0..7, rank 1: 10..17
        c.reduce_scatter(a, "sum", wire)
        c.wait()
        h = cp.asnumpy(a)
        assert (h[4 * r:4 * r + 4] == 2 * cp.asnumpy(cp.arange(4 * r, 4 * r + 4)) + 10).all(), h
        assert (h[4 * (1 - r):4 * (2 - r)] == cp.asnumpy(cp.arange(4 * (1 - r), 4 * (2 - r))) + 10 * r).all(), h
        a[4 * r:4 * r + 4] = 100 + r
        c.all_gather(a)
        c.wait()
        assert (cp.asnumpy(a) == [100.0] * 4 + [101.0] * 4).all(), a
    c.close()
"""


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_nccl_reduce_scatter_and_all_gather_in_place_on_two_gpus():
    """Each rank's chunk summed in place (the other chunk left as it was), then every chunk its owner's;
    through a bfloat16 wire too (these small integers are exact in it)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0")
    p = subprocess.run(_launcher() + ["-n", "2", sys.executable, "-c", _COLLECTIVES, "bf16"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]


def _relative(a, b):
    return float(np.abs(a["flat"] - b["flat"]).max() / np.abs(a["flat"]).max())


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("optimizer", ["momentum", "adam"])
@pytest.mark.parametrize("mode", ["captured", "eager"])
def test_two_sharded_gpus_train_the_run_of_one_gpu_with_half_the_optimizer_state(tmp_path, optimizer, mode):
    flags = ["--optimizer", optimizer] + (["--eager"] if mode == "eager" else [])
    r = _runs(tmp_path, [("one", 1, 32, 12, *flags), ("two", 2, 16, 12, "--shard", *flags),
                         ("layers", 2, 16, 12, "--shard", *LAYERS, *flags), ("all", 2, 16, 12, *LAYERS, *flags)])
    assert _relative(r["one"], r["two"]) <= 1e-5 and _relative(r["one"], r["layers"]) <= 1e-5
    assert _relative(r["all"], r["layers"]) <= 1e-6      # the sharded ranks' run is the unsharded ranks'
    slots = 1 if optimizer == "momentum" else 2
    assert r["all"]["state_sizes"].tolist() == [[int(r["all"]["arena"])] * slots] * 2
    assert r["layers"]["state_sizes"].tolist() == [[int(r["all"]["arena"]) // 2] * slots] * 2


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("extra", [["--precision", "bf16"], ["--grad-reduce", "bf16"]])
def test_two_sharded_gpus_under_bf16_train_the_unsharded_gpus_run(tmp_path, extra):
    """bf16 copies cast from the all-gathered float32 masters; bf16 on the wire rounded as the all-reduce's."""
    r = _runs(tmp_path, [("all", 2, 16, 12, *LAYERS, *extra), ("shard", 2, 16, 12, "--shard", *LAYERS, *extra)])
    assert _relative(r["all"], r["shard"]) <= 1e-6


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_a_checkpoint_of_two_sharded_gpus_resumes_on_one_gpu(tmp_path):
    ckpt = tmp_path / "two.ckpt.npz"
    r = _runs(tmp_path, [("whole", 1, 32, 20, *LAYERS), ("two", 2, 16, 10, "--shard", "--save", ckpt, *LAYERS),
                         ("resumed", 1, 32, 20, "--resume", ckpt, *LAYERS)])
    assert int(r["resumed"]["step"]) == 20 and _relative(r["whole"], r["resumed"]) <= 1e-5
