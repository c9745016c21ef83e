"""benchmarks/bench_dist.py without GPUs: its flags, the launches a command makes and the time they
should take, the one line where no GPU is usable, and its workers and driver run end to end on the
CPU under mpiexec (minidl's step with and without collectives, the collectives alone)."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from benchmarks import bench_dist, dist_worker
from benchmarks.bench_dist import Launch

needs_mpi = pytest.mark.skipif(shutil.which("mpiexec") is None or importlib.util.find_spec("mpi4py") is None,
                               reason="needs mpiexec and mpi4py (pip install 'minidl[dist]')")


def _mnist_or_skip():
    from minidl import data
    try:
        data.mnist("train", download=False)
    except data.DataError:
        pytest.skip("MNIST is not on this machine (MINIDL_DATA)")


@pytest.mark.parametrize("gpus,ranks", [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8])])
def test_the_ranks_default_to_the_powers_of_two_up_to_the_gpus_present(gpus, ranks):
    assert bench_dist.default_ranks(gpus) == ranks


def _plan(argv, gpus=4):
    return bench_dist.plan(bench_dist._parser().parse_args(argv), gpus)


def test_one_command_plans_the_whole_four_gpu_table():
    launches = _plan(["--shard-optimizer", "--two-hosts"])
    nvlink = [x for x in launches if x.transport == "nvlink"]
    assert len(nvlink) == 2 * 2 * 3 * 2 and len(launches) == 28        # cases x precisions x N x frameworks, + 4
    mine = {(x.case, x.precision, x.n): x.variants for x in nvlink if x.framework == "minidl"}
    assert mine[("resnet50-b256", "bf16", 1)] == ("reduce",)             # one GPU: no collectives to skip
    assert mine[("lenet-b256", "fp32", 4)] == ("reduce", "none", "shard")
    assert all(x.variants == ("reduce",) for x in launches if x.framework == "torch-ddp")
    net = [(x.framework, x.wire, x.n, x.case, x.precision, x.variants, x.steps)
           for x in launches if x.transport == "net"]
    assert net == [("minidl", "fp32", 2, "resnet50-b256", "bf16", ("reduce", "none"), 20),
                   ("torch-ddp", "fp32", 2, "resnet50-b256", "bf16", ("reduce",), 20),
                   ("minidl", "bf16", 2, "resnet50-b256", "bf16", ("reduce", "none"), 20),
                   ("torch-ddp", "bf16", 2, "resnet50-b256", "bf16", ("reduce",), 20)]
    assert {x.steps for x in nvlink} == {100} and {x.warmup for x in launches} == {10}


def test_the_ranks_alone_run_first_in_their_launch_and_not_over_sockets():
    """A process that has made a Trainer with collectives replays later steps slower: the ranks alone,
    the baseline, come before it."""
    launches = _plan(["--lone", "--shard-optimizer", "--two-hosts", "--cases", "lenet-b256", "--precision", "fp32"])
    mine = {(x.n, x.transport, x.wire): x.variants for x in launches if x.framework == "minidl"}
    assert mine[(4, "nvlink", "fp32")] == ("lone", "reduce", "none", "shard")
    assert mine[(1, "nvlink", "fp32")] == ("reduce",)
    assert all("lone" not in x.variants for x in launches if x.transport == "net")


def test_quick_steps_ranks_past_the_gpus_and_one_gpu_measured_once():
    launches = _plan(["--quick", "--ranks", "1", "2", "8", "--grad-reduce", "fp32", "bf16", "--transport", "nvlink",
                      "net", "--cases", "lenet-b256", "--precision", "fp32", "--frameworks", "minidl"], gpus=2)
    assert [(x.n, x.wire, x.transport) for x in launches] == [
        (1, "fp32", "nvlink"), (2, "fp32", "nvlink"), (2, "bf16", "nvlink"), (2, "fp32", "net"), (2, "bf16", "net")]
    assert {(x.steps, x.warmup) for x in launches} == {(50, 5)}
    assert _plan(["--two-hosts"], gpus=1) == _plan([], gpus=1)          # no stand-in on one GPU


def test_the_time_a_launch_should_take_is_its_start_and_its_steps():
    x = Launch("minidl", "resnet50-b256", "fp32", 2, "fp32", "nvlink", ("reduce", "none", "shard"), 100, 10)
    # 9 s to start, 3 s for each further Trainer, 3 variants x 110 steps x 6.1 ms x 1.1 (N > 1)
    assert x.estimate_s() == pytest.approx(9 + 2 * 3 + 3 * 110 * 6.71e-3)
    assert x.estimate_s(cold=True) == pytest.approx(x.estimate_s() + 20)
    net = Launch("minidl", "resnet50-b256", "bf16", 2, "bf16", "net", ("reduce", "none"), 20, 10)
    # over sockets 3 ms per MiB sent: 44.85 MiB of bf16 gradients; the step without collectives sends none
    assert net.estimate_s() == pytest.approx(9 + 3 + 30 * (3.52 + 3.0 * 44.85) / 1e3 + 30 * 3.52 / 1e3)
    first, again = (Launch("minidl", "lenet-b256", "fp32", n, "fp32", "nvlink", ("reduce",), 100, 10) for n in (1, 2))
    assert bench_dist.estimate_s([first, again]) == pytest.approx(first.estimate_s(True) + again.estimate_s())


def test_plan_prints_the_launches_and_their_time_without_gpus(capsys):
    assert bench_dist.main(["--plan", "--ranks", "1", "2", "4", "--shard-optimizer", "--two-hosts"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 29 and out[-1].startswith("28 launches on 4 GPUs")
    assert "min on a fresh machine (empty caches)" in out[-1]
    assert any(line.split()[:7] == ["lenet-b256", "bf16", "fp32", "nvlink", "4", "minidl", "reduce+none+shard"]
               for line in out)


def test_without_a_usable_gpu_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    import minidl.backend
    monkeypatch.setattr(minidl.backend, "cuda_status", lambda: (False, "no CUDA device"))
    assert bench_dist.main(["--launcher", sys.executable]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == "bench_dist: needs CUDA GPUs and an MPI launcher: no CUDA device\n"


def test_started_under_mpiexec_it_says_so_in_one_line_and_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert bench_dist.main([]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("argv,words", [(["--steps", "0"], "--steps must be >= 1"),
                                        (["--ranks", "0", "2"], "--ranks must be >= 1"),
                                        (["--grad-reduce", "none"], "invalid choice: 'none'"),
                                        (["--net-steps", "-1"], "--net-steps must be >= 1")])
def test_bad_flags_are_one_line_and_exit_2(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        bench_dist.main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


ENV = {**os.environ, "PYTHONPATH": str(bench_dist.ROOT), "OPENBLAS_NUM_THREADS": "1"}


@needs_mpi
def test_a_minidl_worker_measures_the_step_with_and_without_collectives_and_the_collectives_alone():
    _mnist_or_skip()
    cmd = ["mpiexec", "-n", "2", sys.executable, dist_worker.__file__, "minidl", "lenet-b256", "--steps",
           "2", "--warmup", "1", "--precision", "fp32", "--device", "cpu", "--variants", "reduce", "none", "shard",
           "lone"]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in p.stdout.splitlines()]     # rank 0 alone prints
    assert len(rows) == 4
    with_, without, shard, lone = rows
    assert lone["lone"] and not lone["collectives"] and lone["buckets"] is None     # no Reducer: a run of its own
    assert len(lone["ms_ranks"]) == 2 and lone["ms_step"] == lone["ms_ranks"][0] and min(lone["ms_ranks"]) > 0
    assert all(r["window"][0] < r["window"][1] for r in (with_, without, lone))
    assert with_["collectives"] and not with_["shard"] and with_["buckets"] == 1
    import minidl as dl
    arena = dl.models.get("lenet", device=dl.get_device("cpu")).grads.size      # LeNet-5's gradient arena
    assert with_["wire_mib"] == pytest.approx(arena * 4 / 2 ** 20) and 62006 <= arena < 63000
    assert with_["allreduce_ms"] > 0 and with_["rs_ag_ms"] > 0 and with_["images_s"] > 0
    assert not without["collectives"] and "allreduce_ms" not in without and without["ms_step"] > 0
    if dist_worker.has_shard_optimizer():
        assert shard["shard"] and shard["collectives"] and shard["ms_step"] > 0
    else:
        assert shard == {"variant": "shard", "skipped": dist_worker.NO_SHARD}


@needs_mpi
def test_the_driver_launches_the_ranks_and_prints_the_table(tmp_path):
    _mnist_or_skip()
    out = tmp_path / "dist.jsonl"
    cmd = [sys.executable, bench_dist.__file__, "--device", "cpu", "--frameworks", "minidl", "--cases", "lenet-b256",
           "--precision", "fp32", "--ranks", "1", "2", "--steps", "2", "--quick", "--json", str(out)]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["ranks"], r["collectives"]) for r in rows] == [(1, True), (2, True), (2, False)]
    assert all(r["case"] == "lenet-b256" and r["transport"] == "nvlink" and r["seconds"] > 0 for r in rows)
    assert "2 launches on 2 GPUs" in p.stdout and "all launches:" in p.stdout
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("| lenet-b256 | fp32 | minidl | 2 |"))
    cells = [c.strip() for c in line.split("|")[1:-1]]
    assert cells[6] == f"{rows[2]['ms_step']:.3f}" and cells[7] == f"{rows[1]['allreduce_ms']:.3f}"
    assert "| parts | n |" in p.stdout                                 # the model, fed by these parts


def test_the_collectives_alone_cover_every_bucket_though_they_come_in_backward_order():
    """Backward completes the last layers' bucket first: the highest range of the arena comes first."""
    from types import SimpleNamespace as NS
    import minidl as dl
    MPI = pytest.importorskip("mpi4py.MPI")
    sizes = []
    coll = NS(allreduce=lambda a, op: sizes.append(a.size))
    reducer = NS(coll=coll, buckets=NS(buckets=[NS(lo=100, hi=250), NS(lo=0, hi=100)]))
    out = dist_worker.collectives_alone(reducer, dl.get_device("cpu"), NS(size=1, comm=MPI.COMM_SELF), "fp32", reps=2)
    assert sizes == [150, 100] * 3                      # one warm-up pass, then 2 timed
    assert out["alone_how"] == "host" and out["allreduce_ms"] >= 0 and out["rs_ag_ms"] >= 0


def test_a_launch_past_its_time_is_stopped_and_keeps_what_it_printed(tmp_path):
    """Its process group gets SIGTERM; a process outside it still holding the output delays nothing."""
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(15)'], start_new_session=True)\n"
            "print('{\"images_s\": 1.0}', flush=True)\n"
            "time.sleep(30)\n")
    t0 = time.perf_counter()
    rows, why = bench_dist._launch([sys.executable, "-c", code], ENV, timeout=2)
    assert time.perf_counter() - t0 < 10
    assert rows == [{"images_s": 1.0}] and why == "still running after 2 s (stopped)"
    rows, why = bench_dist._launch([sys.executable, "-c", "import sys; print('oops: an error', file=sys.stderr); "
                                    "sys.exit(3)"], ENV, timeout=10)
    assert rows == [] and why == "exit 3: oops: an error"


def test_the_gpus_clocks_are_read_over_the_timed_window_alone():
    from benchmarks import gpu_clocks
    rows = [gpu_clocks.parse(line) for line in (
        "2026/11/27 18:30:01.000, 0, 1980, 650.5, 60, 0x0000000000000000",
        "2026/11/27 18:30:01.500, 1, 1755, 700.1, 71, 0x0000000000000004",     # SW power cap
        "2026/11/27 18:30:01.500, 2, 1200, 300.0, 50, 0x0000000000000008",     # a GPU the launch did not use
        "2026/11/27 18:30:05.000, 0, 345, 90.0, 40, 0x0000000000000001")]      # idle, after the window
    assert gpu_clocks.parse("Field 'x' is not a valid field to query.") is None
    t0 = rows[0][0]
    s = gpu_clocks.summary(rows, (t0, t0 + 1), gpus=2)
    assert s == {"sm_mhz": (1980 + 1755) / 2, "power_w": 700.1, "temp_c": 71.0, "reasons": "0x4", "samples": 2}
    assert gpu_clocks.summary(rows, (t0 + 10, t0 + 11), gpus=2) is None


def test_the_lone_table_sets_n_gpus_at_once_beside_one_gpu_and_the_ranks():
    results = [dict(case="resnet50-b256", precision="bf16", framework="minidl", ranks=n, collectives=c,
                    ms_step=ms, grad_reduce="fp32", transport="nvlink", images_s=1.0, graph_ms=g)
               for n, c, ms, g in ((1, True, 3.3, 3.25), (4, True, 3.8, 3.75), (4, False, 3.7, 3.7))]
    lone = [dict(results[0], ranks=4, collectives=False, lone=True, ms_step=3.65, ms_ranks=[3.65, 3.6, 3.72, 3.7],
                 graph_ms=3.6)]
    line = bench_dist.lone_table(results, lone).splitlines()[-1]
    assert line == ("| resnet50-b256 | bf16 | 4 | 3.300 | 3.650 (3.720) | 3.700 | 3.800 | 3.84x | "
                    "3.250 / 3.750 / 3.700 / 3.600 |")
    results[0].pop("graph_ms")                  # rows from before the worker reported it
    assert bench_dist.lone_table(results, lone).splitlines()[-1].endswith("| - / 3.750 / 3.700 / 3.600 |")


def test_a_fits_fixed_cost_stays_out_of_its_steps():
    """minidl's figure is the fit's own steady step (Trainer.timing): a fixed cost per call of fit (the
    data's fingerprint, tens of ms) is not spread over the steps; PyTorch's loop is timed whole."""
    import time as clock
    fit = lambda n: clock.sleep(0.03 + 0.001 * n)          # noqa: E731  30 ms a call, 1 ms a step
    s, (t0, t1) = dist_worker._timed(fit, lambda: None, lambda: None, 10, 1, steady_ms=lambda: 1.0)
    assert s == pytest.approx(0.010) and t1 - t0 >= 0.04
    whole, _ = dist_worker._timed(fit, lambda: None, lambda: None, 10, 1)
    assert whole >= 0.04


def test_without_nvidia_smi_the_clocks_are_no_rows_and_no_error(monkeypatch):
    from benchmarks import gpu_clocks
    monkeypatch.setenv("PATH", "/nonexistent")
    with gpu_clocks.Sampler(period_ms=10) as s:
        pass
    assert s.samples == []
