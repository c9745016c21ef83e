"""The NCCL reducer on one GPU: a world of one rank over MPI makes the communicator, its all-reduce
is recorded into the captured step, and training ends exactly where it ends without it.
(Two GPUs and more: benchmarks/bench_dist.py under mpiexec.)"""
import numpy as np
import pytest

pytest.importorskip("cupy")
pytest.importorskip("cudnn")
MPI = pytest.importorskip("mpi4py.MPI")

import minidl as dl  # noqa: E402
from minidl import distributed, models, optim  # noqa: E402


class _OneRankOverNCCL(distributed.World):
    """One rank that reduces anyway (over itself), so the NCCL path runs on a single GPU."""

    def reducer(self, device):
        return distributed.Reducer(self, device)


def _train(world, steps=30):
    dev = dl.get_device("cuda", seed=0)
    model = models.get("lenet", device=dev, seed=0)
    trainer = dl.Trainer(model, optim.Adam(lr=1e-3), world=world, progress=False, log=lambda s: None)
    x = np.random.default_rng(0).integers(0, 256, (512, 28, 28), dtype=np.uint8)
    y = np.random.default_rng(1).integers(0, 10, 512)
    result = trainer.fit((x, y), steps=steps, batch_size=32, monitor=10)
    return trainer, dev.to_host(model.flat), result, trainer.evaluate((x[:200], y[:200]), batch_size=64)


def test_a_one_rank_nccl_reducer_in_the_captured_step_leaves_training_as_it_was():
    plain = _train(distributed.World())
    trainer, flat, result, score = _train(_OneRankOverNCCL(0, 1, 0, MPI.COMM_WORLD))
    assert trainer.graph and trainer.reducer is not None
    assert np.array_equal(flat, plain[1])                  # a sum over one rank, times 1.0
    assert result == plain[2] and score == plain[3]
    flag = trainer.device.xp.zeros((), bool)
    trainer.reducer.all_finite(flag)                       # bool: MIN over uint8
    assert not bool(flag)
    trainer.reducer.coll.close()
