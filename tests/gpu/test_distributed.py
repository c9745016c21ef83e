"""The data-parallel step on the GPU. On one GPU: the reductions forked onto their own stream and
joined back before the update, eager and captured in the step's CUDA graph, checked with a stand-in
second rank that is slow on purpose; and NCCL over a world of one rank, its bucketed all-reduce in
the captured step, leaving training exactly as it was. On two GPUs (skipped with fewer): two ranks
at b16 against one process at b32, under the MPI launcher in $MINIDL_MPIEXEC (default mpiexec).

    NCCL_NVLS_ENABLE=0 MINIDL_MPIEXEC="mpirun --allow-run-as-root" python -m pytest -q tests/gpu/test_distributed.py
"""
import os
import pathlib
import shlex
import subprocess
import sys

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")
MPI = pytest.importorskip("mpi4py.MPI")

import minidl as dl  # noqa: E402
from minidl import distributed, models, optim  # noqa: E402
from minidl.kernels.gpu.collectives import ReductionStream  # noqa: E402
from minidl.metrics import Mean  # noqa: E402
from minidl.step import TrainStep  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")      # NVLink SHARP off, as on the machines we run on

_spin = cp.RawKernel(r'''
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}''', "spin")


class _SlowSecondRankAlike(ReductionStream):
    """A stand-in for a second rank holding the same arrays: a sum doubles them, an AND keeps them.
    It first spins for `cycles` on the reduction stream, so an update that did not wait for the
    reductions would read undoubled gradients; and a reduction not ordered after backward would
    double gradients that backward then overwrites (a captured graph runs unordered nodes at once)."""

    def __init__(self, cycles):
        super().__init__()
        self.cycles = cycles

    def _reduce(self, a, op, stream):
        with stream:
            _spin((1,), (1,), (np.int64(self.cycles),))
            if op == "sum":
                a *= 2


def _lenet_steps(reducer=None, seed=0):
    dev = dl.get_device("cuda", seed=seed)
    model = models.get("lenet", device=dev, seed=seed)
    return model, TrainStep(model, optim.get("momentum", lr=0.01, momentum=0.9).setup(model), Mean(dev), reducer)


def _images(n=256):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)


@pytest.mark.parametrize("captured", [False, True])
@pytest.mark.parametrize("cycles", [0, 2_000_000])              # ~1 ms at 2 GHz: longer than a LeNet step
def test_the_reduction_stream_forks_after_backward_and_joins_before_the_update(captured, cycles):
    plain, plain_step = _lenet_steps()
    coll = _SlowSecondRankAlike(cycles)
    reducer = distributed.Reducer(distributed.World(0, 2), plain.device, bucket_mib=0.05, communicator=coll)
    twin, twin_step = _lenet_steps(reducer)
    assert len(reducer.buckets) == 2 and twin_step.optimizer.grad_scale == 0.5
    x, y = _images()
    loader = dl.data.Loader(x, y, 32, plain.device, seed=0, classes=10)
    for k in range(6):
        for step in (plain_step, twin_step):
            if captured:
                step.replay(loader, 0, k)
            else:
                step(*loader.batch(0, k))
    plain.device.sync()
    assert cp.array_equal(twin.grads, 2 * plain.grads)                # the sum stays in the buffer
    assert cp.array_equal(twin.flat, plain.flat)                      # (2g) x 1/2 = g in the update
    assert bool(twin_step.finite) and int(twin_step.good_steps) == 6


class _OneRankOverNCCL(distributed.World):
    """One rank that reduces anyway (over itself), so the NCCL path runs on a single GPU."""

    def reducer(self, device, bucket_mib=None, grad_reduce="fp32"):
        return distributed.Reducer(self, device, bucket_mib=0.05, grad_reduce=grad_reduce)   # LeNet-5: 2 buckets


def _train(world, graph=True, steps=30):
    dev = dl.get_device("cuda", seed=0)
    model = models.get("lenet", device=dev, seed=0)
    trainer = dl.Trainer(model, optim.Adam(lr=1e-3), world=world, graph=graph, progress=False, log=lambda s: None)
    x, y = _images(512)
    result = trainer.fit((x, y), steps=steps, batch_size=32, monitor=10)
    return trainer, dev.to_host(model.flat), result, trainer.evaluate((x[:200], y[:200]), batch_size=64)


@pytest.mark.parametrize("graph", [True, False])
def test_a_one_rank_nccl_reducer_leaves_training_as_it_was(graph):
    plain = _train(distributed.World(), graph)
    trainer, flat, result, score = _train(_OneRankOverNCCL(0, 1, 0, MPI.COMM_WORLD), graph)
    assert trainer.graph is graph and len(trainer.reducer.buckets) == 2
    assert np.array_equal(flat, plain[1])                  # sums over one rank; grad_scale 1: no multiply
    assert result == plain[2] and score == plain[3]
    flag = trainer.device.xp.zeros((), bool)
    trainer.reducer.coll.allreduce(flag, "and")            # bool: MIN over uint8
    assert not bool(flag)
    trainer.reducer.coll.close()


def _launcher():
    return shlex.split(os.environ.get("MINIDL_MPIEXEC", "mpiexec"))


def _gpus():
    try:
        return cp.cuda.runtime.getDeviceCount()
    except Exception:                  # no driver: conftest skips this file's tests anyway
        return 0


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("bucket_mib", ["8", "0.05"])
def test_two_gpus_at_b16_end_with_the_weights_of_one_gpu_at_b32(tmp_path, bucket_mib):
    worker = ROOT / "tests" / "helpers" / "dist_worker.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0")     # keep the caller's path: the cuDNN Frontend may live there
    common = ["--momentum", "--device", "cuda", "--bucket-mib", bucket_mib, "--watchdog", "120"]   # a hang: stacks
    one = subprocess.run([sys.executable, str(worker), "lenet", str(tmp_path / "one.npz"), "32", "50", *common],
                         env=env, capture_output=True, text=True, timeout=300)
    two = subprocess.run(_launcher() + ["-n", "2", sys.executable, str(worker), "lenet", str(tmp_path / "two.npz"),
                                        "16", "50", *common], env=env, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert int(b["size"]) == 2
    assert np.abs(a["flat"] - b["flat"]).max() / np.abs(a["flat"]).max() <= 1e-4    # sum order, TF32 off
    np.testing.assert_allclose(b["score"], a["score"], rtol=1e-4)
