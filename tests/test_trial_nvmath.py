"""benchmarks/trial_nvmath.py's parts that need no GPU: its flags, its one-line exit without CuPy, the way a
failing check is reported and the trial goes on, and the timing rule (issue 40)."""
import sys

import pytest

from benchmarks import trial_nvmath as trial


def test_flags_default_to_the_trial_the_issue_asks_for() -> None:
    args = trial.parse_args([])
    assert (args.calls, args.replays, args.dtypes, args.json) == (1000, 1000, ["float32", "bfloat16"], None)
    assert trial.parse_args(["--dtypes", "bfloat16", "--calls", "5"]).dtypes == ["bfloat16"]


@pytest.mark.parametrize("argv,named", [(["--calls", "0"], "--calls"), (["--replays", "-1"], "--replays"),
                                        (["--dtypes", "float64"], "--dtypes")])
def test_a_bad_flag_exits_2_naming_it(argv, named, capsys) -> None:
    with pytest.raises(SystemExit) as e:
        trial.parse_args(argv)
    assert e.value.code == 2 and named in capsys.readouterr().err


def test_without_cupy_it_prints_one_line_and_exits_2(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)          # `import cupy` raises ImportError
    assert trial.main(["--calls", "3"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("trial_nvmath: needs CuPy")


def test_the_shapes_are_the_dense_layers_of_lenet_and_resnet50() -> None:
    shapes = {(m, c, k) for _, m, c, k in trial.SHAPES}
    assert shapes == {(m, c, k) for m in (32, 256) for c, k in ((400, 120), (120, 84), (84, 10))} | {(256, 2048, 1000)}


def test_a_check_that_raises_fails_in_one_line_and_the_next_runs(capsys) -> None:
    checks = trial.Checks()

    def broken():
        raise RuntimeError("cuBLASLt status 7\nsecond line")
    checks.run("lt-capture", "lenet-fc1-b32 float32 bias", broken)
    checks.run("lt-capture", "lenet-fc2-b32 float32 bias", lambda: (True, "replay equal", {}))
    checks.run("enums", "minidl's values", lambda: (True, "20 values compared, all equal", {}))
    printed = capsys.readouterr().out
    assert "FAILS  RuntimeError: cuBLASLt status 7" in printed and "second line" not in printed
    assert checks.failing() == ["lt-capture"]
    assert checks.summary() == [
        "check lt-capture: fails (1 of 2; lenet-fc1-b32 float32 bias: RuntimeError: cuBLASLt status 7)",
        "check enums: holds (1 case)"]


def _timing(case, ml_host, nv_host, device=2.0, alloc=0, replay=(5.0, 5.0)):
    return {"case": case, "minidl": {"host_us": ml_host, "device_us": device, "alloc_bytes": 0, "replay_us": replay[0]},
            "nvmath": {"host_us": nv_host, "device_us": device, "alloc_bytes": alloc, "replay_us": replay[1]}}


def _judged(timings):
    checks = trial.Checks()
    trial.judge_times(checks, timings)
    return {check: rows[0]["holds"] for check, rows in checks.rows.items()}


def test_host_overhead_holds_within_10_percent_and_fails_past_it() -> None:
    within = [_timing("a", 10.0, 10.5), _timing("b", 20.0, 18.0)]
    assert _judged(within) == {"no-alloc": True, "host-overhead": True, "graph-time": True}
    past = [_timing("a", 10.0, 12.0), _timing("b", 20.0, 23.0)]
    assert _judged(past)["host-overhead"] is False


def test_gpu_bound_cases_are_left_out_of_the_host_judgement() -> None:
    # the second case's GPU time exceeds its host time: its 2x is the queue's pace, not the binding's
    timings = [_timing("small", 10.0, 10.2), _timing("big", 10.0, 20.0, device=30.0)]
    assert _judged(timings)["host-overhead"] is True


def test_memory_taken_per_call_or_a_slower_replay_fails() -> None:
    assert _judged([_timing("a", 10.0, 10.0, alloc=2 << 20)])["no-alloc"] is False
    assert _judged([_timing("a", 10.0, 10.0, replay=(5.0, 6.0))])["graph-time"] is False


def test_nothing_timed_fails_rather_than_holds() -> None:
    assert _judged([{"case": "a", "error": "Unsupported"}]) == {"no-alloc": False, "host-overhead": False,
                                                               "graph-time": False}
