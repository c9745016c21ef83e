"""Data-parallel ranks (minidl.distributed): the loader's slices, launch detection, and runs under
`mpiexec -n N` on the CPU: N ranks at b end like one process at N*b (gradients in buckets, the mean
in the update, every per-image draw keyed by the global batch); stops agreed without a host round trip per step
and resumed exactly; failures end every rank."""
import contextlib
import os
import pathlib
import signal
import subprocess
import re
import sys
import time

import numpy as np
import pytest

import minidl as dl
from minidl import distributed, models
from minidl.data.loader import Loader
from tests.helpers.mpi_ranks import MPI_MISSING, needs_mpi

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "helpers" / "dist_worker.py"
DATA = os.environ.get("MINIDL_DATA")
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")


def launch(n, *args, timeout=120, **kw):
    cmd = (["mpiexec", "-n", str(n)] if n else []) + [sys.executable, *map(str, args)]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=timeout, **kw)


# -- without MPI ---------------------------------------------------------------------------------
def test_ranks_take_slice_r_of_the_global_batch_of_one_process():
    x, y = np.zeros((100, 4, 4), np.uint8), np.arange(100)
    cpu = dl.get_device("cpu")
    one = Loader(x, y, 30, cpu, seed=3, classes=100)
    ranks = [Loader(x, y, 10, cpu, seed=3, classes=100, rank=r, world=3) for r in range(3)]
    assert len(one) == len(ranks[0]) == 3
    for epoch in (0, 5):
        for k in range(3):
            parts = np.concatenate([r.indices(epoch, k) for r in ranks])
            assert np.array_equal(parts, one.indices(epoch, k))
    # evaluation (no drop_last): a rank past the end of the last, partial batch gets an empty slice
    tail = [Loader(x, y, 40, cpu, shuffle=False, drop_last=False, classes=100, rank=r, world=2) for r in range(2)]
    assert len(tail[0]) == 2 and list(map(len, (tail[0].indices(0, 1), tail[1].indices(0, 1)))) == [20, 0]
    with pytest.raises(ValueError, match="x 4 ranks"):
        Loader(x, y, 30, cpu, classes=100, world=4)


@pytest.mark.parametrize("env,launched", [({}, False), ({"PMI_RANK": "0", "PMI_SIZE": "2"}, True),
                                          ({"PMI_RANK": "0", "PMI_SIZE": "1"}, False),
                                          ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"}, True)])
def test_an_mpi_launch_is_read_from_the_environment(env, launched):
    assert distributed.launched_by_mpi(env) is launched


def test_one_process_never_imports_mpi4py():
    code = ("import sys, minidl as dl; from minidl import models, optim\n"
            "t = dl.Trainer(models.get('lenet', device=dl.get_device('cpu')), optim.Adam())\n"
            "assert t.world.size == 1 and t.reducer is None and 'mpi4py' not in sys.modules")
    env = {k: v for k, v in ENV.items() if k not in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK")}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_the_run_description_holds_the_flags_and_the_minidl_values_a_host_may_not_set_for_itself():
    from minidl.distributed import agreement
    env = {"MINIDL_BUCKET_MIB": "4", "MINIDL_DATA": "/data", "MINIDL_CACHE": "/c", "HOME": "/root"}
    d = agreement.describe({"-n": 20, "--seed": 0}, env)
    assert d == {"-n": 20, "--seed": 0, "MINIDL_BUCKET_MIB": "4"}
    assert agreement.first_difference(d, d, 1) is None
    assert agreement.first_difference({**d, "--seed": 5, "-n": 30}, d, 3) == "rank 3: -n is 30, rank 0 has 20"
    assert agreement.first_difference(agreement.describe({"-n": 20, "--seed": 0}, {}), d, 1) == \
        "rank 1: MINIDL_BUCKET_MIB is unset, rank 0 has 4"
    assert agreement.first_difference({**d, "MINIDL_" + "NEW": "1"}, d, 1) == \
        "rank 1: MINIDL_" "NEW is 1, rank 0 has unset"
    assert agreement.first_difference({**d, "-n": 20.0}, d, 1) is not None        # 20 and 20.0: other types


# -- under mpiexec ---------------------------------------------------------------------------------
@needs_mpi
@pytest.mark.parametrize("optimizer,buckets", [("adam", None), ("momentum", None), ("momentum", 0.05),
                                               ("momentum", "tail")])
def test_two_ranks_at_b16_end_with_the_weights_of_one_process_at_b32(tmp_path, optimizer, buckets):
    # float32: the two runs sum their gradients in another order, so they differ by ~1e-7 from the
    # first step on; a max-pool window whose two largest values lie closer than that (1 ulp apart:
    # a few such windows come up in 50 steps) then sends its gradient to another cell in each run,
    # and from there they drift apart by chaos (1e-2 within 20 steps). In float64 the runs stay
    # equal to rounding: the strict check runs there.
    flag = ["--momentum", "--float64"] if optimizer == "momentum" else []
    # LeNet-5's 0.24 MiB in one bucket, or in 2; "tail": the last of them split, its final layers apart
    flag += (["--bucket-mib", 0.05, "--tail-mib", 0.01] if buckets == "tail"
             else ["--bucket-mib", buckets] if buckets else [])
    one, two = launch(0, WORKER, "lenet", tmp_path / "one.npz", 32, 50, *flag), \
        launch(2, WORKER, "lenet", tmp_path / "two.npz", 16, 50, *flag)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert two.stdout.count("step:   50") == 1                   # rank 0 prints, the same line
    lines = [[float(v) for v in re.findall(r"\d+\.\d+", out)] for out in (one.stdout, two.stdout)]
    np.testing.assert_allclose(lines[1], lines[0], rtol=2e-2)    # the same run, after rounding drift
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert int(b["size"]) == 2
    if optimizer == "momentum":   # float64, rounding only: the gradient sums run in another order
        assert np.abs(a["flat"] - b["flat"]).max() / np.abs(a["flat"]).max() <= 1e-12
        np.testing.assert_allclose(b["score"], a["score"], rtol=1e-12)   # evaluation shards summed
    else:
        # Adam divides each step by sqrt(v): where a gradient is ~0 its sign is rounding noise and
        # the step still has size lr, so the order of the gradient sums alone (the batch split
        # into ranks) moves such weights by ~lr a step. The same run all the same: the printed
        # lines agree (above) and the weights to 1e-2.
        assert np.linalg.norm(a["flat"] - b["flat"]) <= 1e-2 * np.linalg.norm(a["flat"])


def _relative(a, b, key="flat"):
    return np.abs(a[key] - b[key]).max() / np.abs(a[key]).max()


@needs_mpi
@pytest.mark.parametrize("mode,augment", [("lenet", ["--shift", "2", "--flip"]), ("dropout", [])])
def test_two_ranks_draw_the_shifts_flips_and_masks_of_one_process(tmp_path, mode, augment):
    """In float32 under the recipe's augmentation: every per-image draw is keyed by the image's place
    in the global batch, so the two runs see the same images and end equal to rounding. (20 steps:
    on this set of noise images a max-pool near-tie turns rounding into chaos from step ~25 on,
    in one process against itself nudged by an ulp as much: see the GPU test.)"""
    flag = ["--momentum", *augment]
    one, two = launch(0, WORKER, mode, tmp_path / "one", 32, 20, *flag), \
        launch(2, WORKER, mode, tmp_path / "two", 16, 20, *flag)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    name = (lambda n: tmp_path / f"{n}.0.npz") if mode == "dropout" else (lambda n: tmp_path / f"{n}.npz")
    assert _relative(np.load(name("one")), np.load(name("two"))) <= 1e-5


@needs_mpi
def test_the_summed_gradient_of_step_1_is_one_process_gradient_and_a_dropped_bucket_is_caught(tmp_path):
    """The check the GPU test runs too: after one step the ranks' summed gradient / N is one
    process's gradient to float32 rounding; a bucket left unsummed on purpose fails it."""
    flag = ["--momentum", "--shift", "2", "--grads", "--bucket-mib", "0.05"]
    one, two, broken = (launch(0, WORKER, "lenet", tmp_path / "one.npz", 32, 1, *flag),
                        launch(2, WORKER, "lenet", tmp_path / "two.npz", 16, 1, *flag),
                        launch(2, WORKER, "lenet", tmp_path / "broken.npz", 16, 1, *flag, "--drop-bucket", 1))
    assert all(p.returncode == 0 for p in (one, two, broken)), one.stderr + two.stderr + broken.stderr
    a, b, c = (dict(np.load(tmp_path / f"{n}.npz")) for n in ("one", "two", "broken"))
    b["grads"], c["grads"] = b["grads"] / 2, c["grads"] / 2
    assert _relative(a, b, "grads") <= 1e-6
    assert _relative(a, c, "grads") > 1e-2


@needs_mpi
def test_gradients_sent_as_bfloat16_are_the_sum_rounded_to_bfloat16(tmp_path):
    """--grad-reduce bf16: step 1's summed gradient is one process's to bfloat16's precision (8-bit
    mantissa: relative 2^-8 of the largest), and is not the float32 sum; training goes on alike."""
    flag = ["--momentum", "--grads"]
    one, two = (launch(0, WORKER, "lenet", tmp_path / "one.npz", 32, 1, *flag),
                launch(2, WORKER, "lenet", tmp_path / "two.npz", 16, 1, *flag, "--grad-reduce", "bf16"))
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    a, b = dict(np.load(tmp_path / "one.npz")), dict(np.load(tmp_path / "two.npz"))
    b["grads"] = b["grads"] / 2
    assert 1e-6 < _relative(a, b, "grads") <= 2 ** -8
    from ml_dtypes import bfloat16
    assert np.array_equal(b["grads"] * 2, (b["grads"] * 2).astype(bfloat16).astype(np.float32))   # on the wire
    longer = [launch(n, WORKER, "lenet", tmp_path / f"l{n}.npz", 32 // max(n, 1), 20, "--momentum", *extra)
              for n, extra in ((0, []), (2, ["--grad-reduce", "bf16"]))]
    assert all(p.returncode == 0 for p in longer), [p.stderr for p in longer]
    a, b = (np.load(tmp_path / f"l{n}.npz")["flat"] for n in (0, 2))
    assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(a)


@needs_mpi
def test_a_run_saved_at_two_ranks_resumes_at_one_with_the_global_batch_kept_or_is_refused(tmp_path):
    """The checkpoint holds the global batch (16 x 2): one process resumes it at b32 exactly (float64,
    dropout masks drawn by global place); at b16 it is refused, naming the batch size to use."""
    ckpt = tmp_path / "ck.npz"
    flag = ["--momentum", "--float64", "--checkpoint", ckpt]
    straight = launch(2, WORKER, "dropout", tmp_path / "straight", 16, 20, *flag[:2])
    stopped = launch(2, WORKER, "dropout", tmp_path / "stopped", 16, 20, *flag, "--stop-at", "0:7")
    assert straight.returncode == 0 and stopped.returncode == 0, straight.stderr + stopped.stderr
    resumed = launch(0, WORKER, "dropout", tmp_path / "resumed", 32, 20, *flag, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    a, b = np.load(tmp_path / "straight.0.npz"), np.load(tmp_path / "resumed.0.npz")
    assert int(np.load(tmp_path / "stopped.0.npz")["stopped_at"]) == 8 and int(b["step"]) == 20
    assert _relative(a, b) <= 1e-12
    refused = launch(0, WORKER, "dropout", tmp_path / "refused", 16, 20, *flag, "--resume")
    assert refused.returncode != 0 and "batches of 32 images" in refused.stderr
    assert "use batch_size=32" in refused.stderr


@needs_mpi
def test_four_ranks_at_b8_end_with_the_weights_of_one_process_at_b32(tmp_path):
    """Any N (the scaling issue's CPU run): 4 ranks, more than this machine's cores, in float64."""
    flag = ["--momentum", "--float64"]
    one, four = launch(0, WORKER, "lenet", tmp_path / "one.npz", 32, 30, *flag), \
        launch(4, WORKER, "lenet", tmp_path / "four.npz", 8, 30, *flag)
    assert one.returncode == 0 and four.returncode == 0, one.stderr + four.stderr
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "four.npz")
    assert int(b["size"]) == 4
    assert np.abs(a["flat"] - b["flat"]).max() / np.abs(a["flat"]).max() <= 1e-12
    np.testing.assert_allclose(b["score"], a["score"], rtol=1e-12)     # four evaluation shards summed


@needs_mpi
def test_batchnorm_statistics_are_averaged_and_rank_0_saves_a_usual_checkpoint(tmp_path):
    p = launch(2, WORKER, "bn", tmp_path / "bn", 8, 10, "--all-ranks")
    assert p.returncode == 0, p.stderr
    r0, r1 = np.load(tmp_path / "bn.0.npz"), np.load(tmp_path / "bn.1.npz")
    assert np.array_equal(r0["flat"], r1["flat"]) and np.array_equal(r0["state"], r1["state"])
    sys.path.insert(0, str(WORKER.parent))
    from dist_worker import bn_net
    model = bn_net()
    dl.checkpoint.load_weights(str(tmp_path / "bn.ckpt.npz"), model)
    assert np.array_equal(model.state_flat, r0["state"]) and np.array_equal(model.flat, r0["flat"])


@needs_mpi
def test_a_failing_rank_ends_every_rank_with_one_line_naming_it(tmp_path):
    t0 = time.perf_counter()
    p = launch(2, WORKER, "fail", tmp_path / "x", timeout=60)
    assert p.returncode != 0 and time.perf_counter() - t0 < 30
    assert "error: rank 1: injected failure" in p.stderr.splitlines()


def rank_killed(tmp_path, device="cpu"):
    """mpiexec -n 2 training; rank 1 killed with SIGKILL -> (seconds until the job ended, its stderr)."""
    cmd = ["mpiexec", "-n", "2", sys.executable, str(WORKER), "lenet", tmp_path / "x", 8, 1_000_000, "--pid-file",
           "--device", device]
    proc = subprocess.Popen(list(map(str, cmd)), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.readline()                     # the first monitoring line: both ranks are training
    os.kill(int((tmp_path / "x.1.pid").read_text()), signal.SIGKILL)
    t0 = time.perf_counter()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("mpiexec -n 2 still running 60 s after rank 1 was killed")
    return time.perf_counter() - t0, proc.returncode, err


@needs_mpi
def test_a_rank_killed_ends_the_job_within_10_s(tmp_path):
    """No rank can speak for one killed outright: the launcher ends the others and names it."""
    seconds, status, err = rank_killed(tmp_path)
    assert status != 0 and seconds < 10, err
    print(f"ended {seconds:.1f} s after the kill: {err.strip().splitlines()[-3:]}")


@needs_mpi
def test_the_first_rank_of_a_host_fetches_before_the_others_look(tmp_path):
    """World.host_first: what local rank 0 makes (a dataset's download) is there when the others run."""
    code = ("import os, sys, time; from minidl import distributed\n"
            "w = distributed.init(); f = os.path.join(sys.argv[1], 'data')\n"
            "def fetch():\n"
            "    if not os.path.exists(f):\n"
            "        time.sleep(0.5); open(f, 'a').write(f'made by {w.rank}')\n"
            "    return open(f).read()\n"
            "open(os.path.join(sys.argv[1], f'saw.{w.rank}'), 'w').write(w.host_first(fetch))")
    p = launch(3, "-c", code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert [(tmp_path / f"saw.{r}").read_text() for r in range(3)] == ["made by 0"] * 3


@needs_mpi
def test_ctrl_c_stops_every_rank(tmp_path):
    cmd = ["mpiexec", "-n", "2", sys.executable, str(WORKER), "lenet", tmp_path / "x", 8, 1_000_000]
    proc = subprocess.Popen(list(map(str, cmd)), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.readline()                     # the first monitoring line: both ranks are training
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("mpiexec -n 2 still running 30 s after Ctrl-C")
    # Ctrl-C in fit is a stop request (training/interrupt.py): the ranks agree, stop after the same step
    # and raise TrainingInterrupted, which the worker catches as a TrainingStopped and goes on to evaluate
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
    out = np.load(tmp_path / "x.npz")
    assert 0 < int(out["stopped_at"]) == int(out["step"]) < 1_000_000


@needs_mpi
@pytest.mark.skipif(not DATA, reason="MINIDL_DATA (real MNIST) is not set")
def test_two_ranks_of_the_command_line_train_the_run_of_one_process_under_the_default_recipe(tmp_path):
    """The LeNet recipe (random shifts of 2 pixels) on real MNIST, 50 momentum steps in float32:
    `mpiexec -n 2 ... -b16` saves the weights of `-b32` in one process, to rounding."""
    common = ["-m", "minidl.train", "-n", "50", "-m", "25", "--optimizer", "momentum", "--lr", "0.01", "-x", "100",
              "-y", "1", "--device", "cpu", "-s"]
    one = launch(0, *common, "-b", "32", "--checkpoint", tmp_path / "one.npz", cwd=tmp_path)
    two = launch(2, *common, "-b", "16", "--checkpoint", tmp_path / "two.npz", cwd=tmp_path)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    assert "shifts of up to 2 px" in one.stdout
    (meta_a, a), (meta_b, b) = (dl.checkpoint.read(str(tmp_path / f"{n}.npz")) for n in ("one", "two"))
    assert meta_b["meta"]["ranks"] == 2 and meta_b["meta"]["global_batch"] == meta_a["meta"]["global_batch"] == 32
    params = [k for k in a if k.startswith("param/")]
    assert max(np.abs(a[k] - b[k]).max() / np.abs(a[k]).max() for k in params) <= 1e-5
    # one process may resume it only with the global batch kept (the Trainer's resume: the worker test)
    refused = launch(0, *common, "-b", "16", "--checkpoint", tmp_path / "two.npz", "--resume", cwd=tmp_path)
    assert refused.returncode == 2 and "-b 16 x 1 ranks = 16 images a step" in refused.stderr, refused.stderr


@needs_mpi
@pytest.mark.skipif(not DATA, reason="MINIDL_DATA (real MNIST) is not set")
def test_three_ranks_run_the_command_line_and_rank_0_prints_and_saves(tmp_path):
    ckpt = tmp_path / "l.npz"
    p = launch(3, "-m", "minidl.train", "--model", "lenet", "-n", "20", "-m", "10", "-b", "8", "-x", "300",
               "-y", "2", "--device", "cpu", "-s", "--checkpoint", ckpt, "--grad-reduce", "bf16", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert sum(line.startswith("step:") for line in out) == 2 and out.count("Done.") == 1
    assert "batch 8 x 3 ranks" in p.stdout and "(first 1800 of 10000)" in p.stdout
    dl.checkpoint.load_weights(str(ckpt), models.get("lenet", device=dl.get_device("cpu")))


@needs_mpi
def test_ranks_meet_on_the_host_only_at_monitoring_steps_and_reduce_each_bucket_once_a_step(tmp_path):
    p = launch(2, WORKER, "lenet", tmp_path / "c", 8, 50, "--count", "--all-ranks", "--bucket-mib", 0.05)
    assert p.returncode == 0, p.stderr
    for r in (0, 1):
        c = np.load(tmp_path / f"c.{r}.npz")
        assert int(c["buckets"]) == 2 and int(c["step"]) == 50
        # no blocking MPI call (its wait would spin in C, deaf to SIGTERM): every one is begun
        # non-blocking and waited for by polling (distributed.waits)
        assert int(c["blocking"]) == 0
        # per step: each bucket once, the NaN flag, and the stop vote; at each of the 2 monitoring
        # steps the loss, hits and count; then the final stop vote
        assert int(c["nonblocking"]) == 50 * (2 + 1 + 1) + 2 * 3 + 1


@needs_mpi
def test_each_rank_draws_the_dropout_masks_of_its_slice_of_one_process_batch(tmp_path):
    one, two = launch(0, WORKER, "dropout", tmp_path / "one", 16, 5), launch(2, WORKER, "dropout", tmp_path / "d", 8, 5)
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    m0, m1 = (np.load(tmp_path / f"d.{r}.npz")["mask"] for r in (0, 1))
    assert m0.shape == m1.shape == (8, 64) and 0.35 < np.mean(m0 != m1) < 0.65     # unlike each other
    np.testing.assert_array_equal(np.concatenate([m0, m1]), np.load(tmp_path / "one.0.npz")["mask"])


@needs_mpi
def test_a_stop_asked_of_one_rank_stops_all_after_one_step_and_resumes_exactly(tmp_path):
    """Rank 1 alone asks to stop during step 7 (SIGTERM to one process): the vote posted after step 7
    is read after step 8, so every rank stops after step 8 and rank 0 saves there; the same ranks
    resumed from it end bit-identical to a run never stopped, dropout masks included."""
    ckpt = tmp_path / "ck.npz"
    runs = [launch(2, WORKER, "dropout", tmp_path / "straight", 8, 20),
            launch(2, WORKER, "dropout", tmp_path / "stopped", 8, 20, "--checkpoint", ckpt, "--stop-at", "1:7")]
    runs.append(launch(2, WORKER, "dropout", tmp_path / "resumed", 8, 20, "--checkpoint", ckpt, "--resume"))
    assert all(p.returncode == 0 for p in runs), [p.stderr for p in runs]
    for r in (0, 1):
        straight, stopped, resumed = (np.load(tmp_path / f"{n}.{r}.npz") for n in ("straight", "stopped", "resumed"))
        assert int(stopped["stopped_at"]) == 8 and int(resumed["step"]) == 20
        np.testing.assert_array_equal(resumed["flat"], straight["flat"])
        np.testing.assert_array_equal(resumed["mask"], straight["mask"])
    assert dl.checkpoint.read(str(ckpt))[0]["meta"]["step"] == 8


@needs_mpi
@pytest.mark.skipif(not DATA, reason="MINIDL_DATA (real MNIST) is not set")
@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_the_launcher_stops_every_rank_and_rank_0_saves_a_resumable_checkpoint(tmp_path, sig, status):
    """Ctrl-C or SIGTERM to mpiexec reaches every rank: they agree on the step, rank 0 saves once,
    and the job exits 130 or 143; --resume goes on from there."""
    def interrupted(*extra):
        cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "minidl.train", "--model", "lenet", "-n", "100000",
               "-m", "10", "-b", "8", "--device", "cpu", "--checkpoint", str(tmp_path / "l.npz"), *extra]
        proc = subprocess.Popen(cmd, env=ENV, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = []
        while not (line := proc.stdout.readline()).startswith("step:"):    # training on every rank
            if not line:
                proc.kill()
                pytest.fail("the run ended before its first monitoring line: " + proc.stderr.read()[-500:])
            lines.append(line)
        proc.send_signal(sig)                            # mpiexec hands it to every rank
        out, err = proc.communicate(timeout=60)
        said = [line for line in err.splitlines() if line.startswith(f"{sig.name}: stopped at step")]
        assert proc.returncode == status and len(said) == 1, err   # rank 0 tells, once
        return "".join(lines), int(re.search(r"step (\d+)", said[0]).group(1))
    _, first = interrupted()
    assert dl.checkpoint.read(str(tmp_path / "l.npz"))[0]["meta"]["step"] == first
    out, second = interrupted("--resume")
    assert f"at step {first}" in out and second > first


# -- ranks started on different runs -----------------------------------------------------------------
TRAIN = [sys.executable, "-m", "minidl.train", "-n", "20", "-m", "10", "-b", "16", "--device", "cpu", "-y", "1"]


def launch_apart(rank0, rank1, env1=None, timeout=60):
    """mpiexec -n 1 <rank 0's command> : -n 1 <rank 1's> (MPMD: each rank its own flags and environment)
    -> (the finished process, seconds it took)."""
    extra = [a for k, v in (env1 or {}).items() for a in ("-env", k, v)]
    cmd = ["mpiexec", "-n", "1", *rank0, ":", "-n", "1", *extra, *rank1]
    t0 = time.perf_counter()
    p = subprocess.run(list(map(str, cmd)), env=ENV, capture_output=True, text=True, timeout=timeout)
    return p, time.perf_counter() - t0


@needs_mpi
@pytest.mark.parametrize("extra,env,line", [
    (["--seed", "5"], None, "--seed is 5, rank 0 has 0"),
    (["-b", "48"], None, "-b is 48, rank 0 has 16"),
    (["--dataset", "fashion-mnist"], None, "--dataset is fashion-mnist, rank 0 has mnist"),
    (["-m", "7"], None, "-m is 7, rank 0 has 10"),
    (["-n", "30"], None, "-n is 30, rank 0 has 20"),
    ([], {"MINIDL_BUCKET_MIB": "4"}, "MINIDL_BUCKET_MIB is 4, rank 0 has unset")])
def test_ranks_started_on_different_runs_all_exit_2_with_one_line_naming_the_first_difference(tmp_path, extra,
                                                                                              env, line):
    """Before any data is read: rank 0 prints the one line, every rank exits 2, no MPI abort, no hang
    (the -m and -n cases spun for 10 minutes, deaf to SIGTERM; MINIDL_BUCKET_MIB's aborted MPI)."""
    p, seconds = launch_apart(TRAIN, TRAIN + extra, env)
    assert p.returncode == 2 and seconds < 30, p.stderr
    assert p.stderr.splitlines() == [f"error: the ranks were started on different runs: rank 1: {line}"]
    assert p.stdout == ""


@needs_mpi
def test_flags_each_rank_may_set_for_itself_are_not_compared(tmp_path):
    """--threads and --metrics may differ (per host, written by rank 0 alone): the run goes on."""
    p, _ = launch_apart(TRAIN + ["-n", "2", "-x", "16"], TRAIN + ["-n", "2", "-x", "16", "--threads", "1",
                                                               "--metrics", tmp_path / "m.jsonl"], timeout=120)
    assert p.returncode == 0 and p.stdout.count("Done.") == 1, p.stderr


@needs_mpi
def test_help_under_two_ranks_is_printed_once():
    p = launch(2, "-m", "minidl.train", "-h", timeout=60)
    assert p.returncode == 0 and p.stdout.count("usage:") == 1 and p.stderr == "", p.stderr


@needs_mpi
def test_a_flag_refused_on_one_rank_ends_every_rank_with_its_line():
    p, seconds = launch_apart(TRAIN, TRAIN + ["-n", "abc"])
    assert p.returncode == 2 and seconds < 30, p.stderr
    assert p.stderr.splitlines() == ["error: rank 1: argument -n: invalid positive value: 'abc'"]


@pytest.mark.parametrize("n", [0, 2])
@pytest.mark.parametrize("value", ["abc", "-1", "0", "1e9"])
def test_a_bad_bucket_size_is_one_line_naming_the_variable_and_exit_2(value, n):
    if n and MPI_MISSING:
        pytest.skip(MPI_MISSING)
    env = dict(ENV, MINIDL_BUCKET_MIB=value)
    cmd = (["mpiexec", "-n", str(n)] if n else []) + TRAIN
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    line = f"error: MINIDL_BUCKET_MIB must be a bucket size in MiB, a number in (0, 65536], got '{value}'"
    assert p.stderr.splitlines() == [line]


def test_a_bad_tail_cap_is_one_line_naming_the_variable_and_exit_2():
    p = subprocess.run(TRAIN, env=dict(ENV, MINIDL_BUCKET_TAIL_MIB="-1"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stdout == "", p.stderr
    assert p.stderr.splitlines() == ["error: MINIDL_BUCKET_TAIL_MIB must be 0 (off) or a bucket size in MiB, a "
                                     "number in (0, 65536], got '-1'"]


@needs_mpi
@pytest.mark.parametrize("mode", ["lenet", "dropout"])
def test_ranks_built_with_other_seeds_train_one_run_from_rank_0s_weights(tmp_path, mode):
    """Through the Python API, rank r's model, device and Trainer seeded with r: the Trainer starts
    every rank from rank 0's weights, seed and generator, so the run is the all-seed-0 run, bit for bit."""
    apart = launch(2, WORKER, mode, tmp_path / "apart", 16, 5, "--seed-per-rank", "--all-ranks")
    alike = launch(2, WORKER, mode, tmp_path / "alike", 16, 5, "--all-ranks")
    assert apart.returncode == 0 and alike.returncode == 0, apart.stderr + alike.stderr
    r0, r1, same = (np.load(tmp_path / f"{n}.npz") for n in ("apart.0", "apart.1", "alike.0"))
    np.testing.assert_array_equal(r0["flat"], r1["flat"])
    np.testing.assert_array_equal(r0["flat"], same["flat"])
    if mode == "dropout":                         # rank 1 drew its slice of rank 0's masks
        np.testing.assert_array_equal(r1["mask"], np.load(tmp_path / "alike.1.npz")["mask"])


@needs_mpi
def test_sigterm_ends_ranks_waiting_for_a_rank_that_never_comes(tmp_path):
    """Rank 0 stalls after step 3 (a rank stuck outside MPI); rank 1 waits in step 4's collectives.
    SIGTERM to the launcher, recorded as a stop request (the command line's handler): rank 1's wait
    polls, sees the stop, and STOP_GRACE_S (10 s) later ends the job with one line, status 143.
    (MPI's own wait spun in C, where no Python signal handler runs: the job went on for ever.)"""
    cmd = ["mpiexec", "-n", "2", sys.executable, str(WORKER), "lenet", tmp_path / "x", 8, 1000, "--stall", "0:3",
           "--pid-file"]
    env = dict(ENV, MINIDL_WATCHDOG_S="0")      # the watchdog would name rank 0 first (test_distributed_faults.py)
    proc = subprocess.Popen(list(map(str, cmd)), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.perf_counter()
    while not all((tmp_path / f"x.{r}.pid").exists() for r in (0, 1)) and time.perf_counter() - t0 < 60:
        time.sleep(0.2)
    time.sleep(3)                                 # step 3 done: rank 0 asleep, rank 1 waiting
    proc.send_signal(signal.SIGTERM)
    t0 = time.perf_counter()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        for r in (0, 1):                          # the ranks too, which a killed launcher may leave
            with contextlib.suppress(OSError, ValueError):
                os.kill(int((tmp_path / f"x.{r}.pid").read_text()), signal.SIGKILL)
        pytest.fail("mpiexec -n 2 still running 60 s after SIGTERM")
    assert proc.returncode == 143 and time.perf_counter() - t0 < 30, err
    said = [line for line in err.splitlines() if line.startswith("SIGTERM: rank 1 waited")]
    assert len(said) == 1 and said[0].endswith("in a collective they did not reach (ranks out of step): "
                                               "the job ends, nothing saved"), err


_FIT = """
import sys
import numpy as np
import minidl as dl
from minidl import models, optim
from minidl.distributed import RanksDisagree
world = dl.distributed.init()
steps = [20, 30][world.rank] if sys.argv[1] == "steps" else 20
batch = [16, 48][world.rank] if sys.argv[1] == "batch" else 16
x, y = np.random.default_rng(0).integers(0, 255, (256, 28, 28), np.uint8), np.arange(256) % 10
trainer = dl.Trainer(models.lenet5(device="cpu"), optim.SGD(lr=0.01), device="cpu", world=world)
try:
    trainer.fit(x, y, steps=steps, batch_size=batch, monitor=10)
except RanksDisagree as e:
    print(f"rank {world.rank}: {e}")
    sys.exit(2)
"""


@needs_mpi
@pytest.mark.parametrize("what,line", [("steps", "rank 1: steps is 30, rank 0 has 20"),
                                       ("batch", "rank 1: batch_size is 48, rank 0 has 16")])
def test_ranks_calling_fit_on_different_runs_stop_naming_the_difference(what, line):
    """Through the Python API, where no command line was compared: fit's run (its last step, batch,
    steps an epoch, monitoring interval) is agreed before the first step, so ranks out of step end
    with one line each instead of waiting for each other for ever."""
    p = launch(2, "-c", _FIT, what, timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert p.stdout.count(line) == 2, p.stdout + p.stderr
