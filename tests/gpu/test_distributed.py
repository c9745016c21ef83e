"""The data-parallel step on the GPU. On one GPU: the reductions forked onto their own stream and
joined back before the update, eager and captured in the step's CUDA graph, checked with a stand-in
second rank that is slow on purpose; and NCCL over a world of one rank, its bucketed all-reduce in
the captured step, leaving training exactly as it was. On two GPUs (skipped with fewer): two ranks
at b16 against one process at b32 under the recipe's shifts and flips, under the MPI launcher in
$MINIDL_MPIEXEC (default mpiexec): the summed gradient of step 1 (which a dropped bucket fails),
10 steps, gradients sent as bfloat16, and 50 steps measured against one GPU's own chaos; ranks
built with other seeds start from rank 0's weights (sent through the host); ranks started with other
flags end at once, exit 2, naming the difference.

    NCCL_NVLS_ENABLE=0 MINIDL_MPIEXEC="mpirun --allow-run-as-root" python -m pytest -q tests/gpu/test_distributed.py
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
from minidl.kernels.gpu.collectives import ReductionStream  # noqa: E402
from minidl.metrics import Mean  # noqa: E402
from minidl.training.step import TrainStep  # noqa: E402
from tests.helpers import mpi_ranks  # noqa: E402

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


class _Streams(ReductionStream):
    """Records the stream each reduction was given."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def _reduce(self, a, op, stream):
        self.seen.append(stream)
        with stream:
            a *= 2


def test_reductions_go_to_the_reduction_stream_only_inside_a_capture():
    """Kernels run on another stream outside a graph slow every later replay of the process
    (docs/distributed.md), so an uncaptured reduction runs in order on the current stream."""
    dev = dl.get_device("cuda", seed=0)
    r, a = _Streams(), cp.ones(1 << 20, cp.float32)
    current = cp.cuda.get_current_stream()
    r.start(a, "sum")
    r.wait()
    assert r.seen == [current] and not r._forked
    call = dev.capture(lambda: (r.start(a, "sum"), r.wait()))
    assert r.seen[1:] == [current, current, r.stream] and r.stream != current     # two warm-up runs, the capture
    call.replay()
    dev.sync()
    assert int(a[0]) == 2 ** (1 + 2 + 1)       # run eagerly once, in the two warm-up runs and in one replay


class _OneRankOverNCCL(distributed.World):
    """One rank that reduces anyway (over itself), so the NCCL path runs on a single GPU."""

    def reducer(self, device, bucket_mib=None, grad_reduce="fp32", stop_asked=None):
        return distributed.Reducer(self, device, bucket_mib=0.05, grad_reduce=grad_reduce,   # LeNet-5: 2 buckets
                                   stop_asked=stop_asked)


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



_gpus = mpi_ranks.gpu_count
_launcher = mpi_ranks.launcher


def _worker_runs(tmp_path, runs):
    """Each (name, ranks, b, steps, *flags) run of tests/helpers/dist_worker.py lenet on the GPU -> its npz."""
    worker = ROOT / "tests" / "helpers" / "dist_worker.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0")     # keep the caller's path: the cuDNN Frontend may live there
    out = {}
    for name, ranks, b, steps, *flags in runs:
        cmd = ([] if ranks == 1 else _launcher() + ["-n", str(ranks)]) + [
            sys.executable, str(worker), "lenet", str(tmp_path / f"{name}.npz"), str(b), str(steps), "--momentum",
            "--device", "cuda", "--watchdog", "120", *flags]                        # a hang: every rank's stack
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        out[name] = dict(np.load(tmp_path / f"{name}.npz"))
    return out


def _relative(a, b, key="flat"):
    return float(np.abs(a[key] - b[key]).max() / np.abs(a[key]).max())


RECIPE = ["--shift", "2", "--flip"]       # per-image draws keyed by the global batch (rng.CounterRNG)


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("bucket_mib", ["8", "0.05"])
def test_two_gpus_sum_the_gradient_of_one_gpu_and_a_dropped_bucket_is_caught(tmp_path, bucket_mib):
    """Step 1, TF32 off: the ranks' summed gradient / 2 is one GPU's at b32 to float32 rounding (the
    sums run in another order); a bucket left out of the all-reduce on purpose fails the same check.
    Then 10 steps: the weights agree as closely, before rounding has had steps to grow."""
    flags = ["--bucket-mib", bucket_mib, *RECIPE]
    r = _worker_runs(tmp_path, [("one", 1, 32, 1, "--grads", *flags), ("two", 2, 16, 1, "--grads", *flags),
                                ("dropped", 2, 16, 1, "--grads", "--drop-bucket", "0", *flags),
                                ("bf16", 2, 16, 1, "--grads", "--grad-reduce", "bf16", *flags),
                                ("one10", 1, 32, 10, *flags), ("two10", 2, 16, 10, *flags)])
    assert int(r["two"]["size"]) == 2
    for name in ("two", "dropped", "bf16"):
        r[name]["grads"] = r[name]["grads"] / 2
    assert _relative(r["one"], r["two"], "grads") <= 1e-5
    assert 1e-6 < _relative(r["one"], r["bf16"], "grads") <= 2 ** -7     # bfloat16: each term and the sum rounded
    assert _relative(r["one"], r["dropped"], "grads") > 1e-2
    assert _relative(r["one10"], r["two10"]) <= 1e-5


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_two_gpus_in_bf16_gather_each_bucket_from_the_copies_as_the_whole_arena_at_once(tmp_path):
    """Under the bf16 policy (channels-last KRSC filter copies) each bucket is cast into the float32
    arena as it starts: many small buckets give the gradient of one bucket cast after backward, and
    that is one GPU's bf16 gradient at b32 to bfloat16 rounding (the ranks' partial sums round apart)."""
    flags = ["--grads", "--precision", "bf16", *RECIPE]
    r = _worker_runs(tmp_path, [("one", 1, 32, 1, *flags), ("small", 2, 16, 1, "--bucket-mib", "0.02", *flags),
                                ("whole", 2, 16, 1, "--bucket-mib", "8", *flags)])
    assert _relative(r["small"], r["whole"], "grads") <= 1e-7
    r["small"]["grads"] = r["small"]["grads"] / 2
    assert _relative(r["one"], r["small"], "grads") <= 5e-2


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_two_gpus_drift_from_one_no_faster_than_one_gpu_from_itself_nudged_by_an_ulp(tmp_path):
    """After 50 float32 steps the 2-GPU and 1-GPU weights differ by up to ~1e-2 (max-pool near-ties
    turning rounding into chaos), so that is measured against chaos itself: one GPU against the
    same run with every initial weight moved by one ulp. A fault drifts far more than that."""
    r = _worker_runs(tmp_path, [("one", 1, 32, 50, *RECIPE), ("two", 2, 16, 50, *RECIPE),
                                ("nudged", 1, 32, 50, "--nudge", *RECIPE)])
    two, chaos = _relative(r["one"], r["two"]), _relative(r["one"], r["nudged"])
    print(f"after 50 steps: 2 GPUs vs 1 {two:.2e}; 1 GPU vs itself nudged by an ulp {chaos:.2e}")
    assert two <= max(10 * chaos, 1e-5)


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_a_failing_gpu_rank_ends_every_rank_within_10_s_naming_itself(tmp_path):
    """Rank 1 raises while rank 0 waits for it inside NCCL: rank 1 prints one line and aborts the job."""
    import time
    worker = ROOT / "tests" / "helpers" / "dist_worker.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0")
    t0 = time.perf_counter()
    p = subprocess.run(_launcher() + ["-n", "2", sys.executable, str(worker), "fail", str(tmp_path / "x"),
                                      "--device", "cuda"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "error: rank 1: injected failure\n" in p.stderr, p.stderr[-2000:]
    print(f"the job ended {time.perf_counter() - t0:.1f} s after it began")


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
@pytest.mark.skipif(not os.environ.get("MINIDL_DATA"), reason="MINIDL_DATA (real MNIST) is not set")
def test_sigterm_to_the_launcher_saves_once_and_one_gpu_resumes_the_run_at_the_same_global_batch(tmp_path):
    """SIGTERM to every rank of 2 on GPUs, as a batch scheduler sends it (Open MPI 4.1's mpirun, the
    launcher on our GPU machines, ends its ranks at once on a signal of its own, nothing saved; MPICH's
    mpiexec forwards it: tests/test_distributed.py): rank 0 saves once, the job exits 143; one GPU at
    -b32 resumes the -b16 x 2 run from there (the global batch kept); a -b16 resume is refused."""
    import re
    import signal
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NCCL_NVLS_ENABLE="0")
    common = [sys.executable, "-m", "minidl.train", "-n", "20000", "-m", "100", "-x", "100", "-y", "1",
              "--checkpoint", str(tmp_path / "c.npz")]
    proc = subprocess.Popen(_launcher() + ["-n", "2"] + common + ["-b", "16"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (line := proc.stdout.readline()).startswith("step:"):
        assert line, proc.stderr.read()[-2000:]
    ranks = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(ranks) == 2, ranks
    for pid in ranks:
        os.kill(int(pid), signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip() and "step/s" not in line]     # no progress bars
    said = [line for line in lines if line.startswith("SIGTERM: stopped at step")]
    assert proc.returncode == 143 and len(said) == 1, (proc.returncode, lines[-20:])
    step = int(re.search(r"step (\d+)", said[0]).group(1))
    refused = subprocess.run(common + ["-b", "16", "--resume"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "-b 16 x 1 ranks" in refused.stderr, refused.stderr[-2000:]
    resumed = subprocess.run(common + ["-b", "32", "--resume"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0 and f"at step {step}" in resumed.stdout, resumed.stderr[-2000:]


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                NCCL_NVLS_ENABLE="0")


@pytest.mark.skipif(_gpus() < 2, reason="needs 2 GPUs")
def test_two_gpus_built_with_other_seeds_train_one_run_from_rank_0s_weights(tmp_path):
    """Rank r's model, device and Trainer seeded with r: the Trainer sends rank 0's weights (through
    the host: device -> MPI -> device), seed and generator to every rank, so both GPUs hold the same
    weights after 5 steps, and the run is the all-seed-0 run (to the rounding of other cuDNN engines)."""
    worker = ROOT / "tests" / "helpers" / "dist_worker.py"
    for name, flags in (("apart", ["--seed-per-rank"]), ("alike", [])):
        cmd = _launcher() + ["-n", "2", sys.executable, str(worker), "lenet", str(tmp_path / name), "16", "5",
                             "--momentum", "--device", "cuda", "--watchdog", "120", "--all-ranks", *RECIPE, *flags]
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
    r0, r1, alike = (dict(np.load(tmp_path / f"{n}.npz")) for n in ("apart.0", "apart.1", "alike.0"))
    np.testing.assert_array_equal(r0["flat"], r1["flat"])
    assert _relative(alike, r0) <= 1e-5


def test_ranks_started_with_other_flags_exit_2_naming_the_first_difference():
    """Under this machine's launcher (Open MPI's mpirun on ours), each rank its own -n (MPMD): before any
    GPU work every rank exits 2 and rank 0 names the difference once (the launcher may add its own note)."""
    import time
    common = [sys.executable, "-m", "minidl.train", "-n", "20", "-m", "10", "-b", "16"]
    t0 = time.perf_counter()
    p = subprocess.run(_launcher() + ["-n", "1", *common, ":", "-n", "1", *common, "-n", "30"], env=_env(),
                       capture_output=True, text=True, timeout=120)
    said = [line for line in p.stderr.splitlines() if "rank 1: -n is 30, rank 0 has 20" in line]
    assert p.returncode == 2 and len(said) == 1 and time.perf_counter() - t0 < 60, p.stderr[-2000:]


@pytest.mark.skipif(not os.environ.get("MINIDL_DATA"), reason="MINIDL_DATA (real MNIST) is not set")
def test_two_ranks_shown_one_gpu_exit_1_naming_it_once():
    """CUDA_VISIBLE_DEVICES=0 exported to two ranks (a rank shown one GPU takes it, as Slurm's
    --gpus-per-task=1 needs): both ranks on GPU 0, which NCCL refused at the first collective in its own
    words; now every rank ends at the communicator's making and rank 0 names the two ranks and the GPU."""
    common = [sys.executable, "-m", "minidl.train", "-n", "20", "-m", "10", "-b", "16", "--device", "cuda"]
    p = subprocess.run(_launcher() + ["-n", "2", *common], env=dict(_env(), CUDA_VISIBLE_DEVICES="0"),
                       capture_output=True, text=True, timeout=180)
    said = [line for line in p.stderr.splitlines() if line.startswith("error: ranks 0 and 1 share GPU ")]
    assert p.returncode == 1 and len(said) == 1 and "NCCL failure" not in p.stderr, p.stderr[-2000:]
