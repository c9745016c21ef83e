"""A rank that dies, hangs or falls behind (issue 41): one minidl line naming the rank, what it was doing
and the last good checkpoint, within 10 s, exit status non-zero, every rank ended; a rank slower than the
others one warning; a normal run none of these. Faults are injected by tests/helpers/faults.py (a callback
every fit gets), under MPICH's mpiexec, 2 ranks on the CPU; the judging itself is tested without MPI."""
import io
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from minidl.distributed import heartbeat, sentinel, watchdog
from tests.helpers.mpi_ranks import needs_mpi

ROOT = pathlib.Path(__file__).resolve().parents[1]
FAULTS = ROOT / "tests" / "helpers" / "faults.py"
DATA = os.environ.get("MINIDL_DATA")
needs_data = pytest.mark.skipif(not DATA, reason="MINIDL_DATA (real MNIST) is not set")
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1")
TRAIN = ["-n", "100000", "-m", "10", "-b", "8", "--device", "cpu", "--save-every", "20"]


def faulty(tmp_path, fault, rank, step, *args, how="train", env=None, timeout=120):
    """mpiexec -n 2 with rank `rank` doing `fault` after step `step` -> (process, stderr's minidl lines,
    seconds from the fault to the job's end where the fault noted its time)."""
    cmd = ["mpiexec", "-n", "2", sys.executable, FAULTS, fault, rank, step, how, *args]
    env = dict(ENV, FAULT_NOTE=str(tmp_path / "n"), **(env or {}))
    t0 = time.time()
    p = subprocess.run(list(map(str, cmd)), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    note = tmp_path / ("out.npz.killed" if how == "api" else "n.killed")
    since = float(note.read_text()) if note.exists() else t0
    return p, [line for line in p.stderr.splitlines() if line.startswith("minidl:")], time.time() - since


def _run_folders():
    base = watchdog.runs_folder()
    return {n for n in os.listdir(base) if n.startswith("run-")} if os.path.isdir(base) else set()


# -- under mpiexec ---------------------------------------------------------------------------------------
@needs_mpi
@needs_data
def test_a_rank_killed_is_named_with_its_step_and_the_last_checkpoint_within_10_s(tmp_path):
    before = _run_folders()
    p, said, seconds = faulty(tmp_path, "kill", 1, 30, *TRAIN, "--checkpoint", tmp_path / "ck.npz")
    assert p.returncode != 0 and seconds < 10, p.stderr
    assert said == [f"minidl: rank 1 died after step 30 (between steps: callbacks, monitoring): its process ended "
                    f"without a word (killed? out of memory?); the run stops; last good checkpoint: "
                    f"{tmp_path / 'ck.npz'} at step 20"], p.stderr
    time.sleep(1.5)                                 # the sentinel's tidying
    assert _run_folders() <= before
    print(f"ended {seconds:.2f} s after the kill")


@needs_mpi
@needs_data
def test_a_rank_that_sleeps_for_ever_is_named_and_the_job_ends(tmp_path):
    p, said, seconds = faulty(tmp_path, "hang", 1, 30, *TRAIN, "--checkpoint", tmp_path / "ck.npz")
    assert p.returncode != 0, p.stderr
    assert len(said) == 1 and said[0].startswith("minidl: rank 1 stopped answering after step 30 (between steps"), \
        p.stderr
    assert re.search(r" [56] s ago; the run stops; last good checkpoint: .*ck\.npz at step 20$", said[0]), said
    assert p.stdout.count("step:   30") == 1 and "step:   40" not in p.stdout
    assert seconds < 10
    print(f"ended {seconds:.2f} s after the hang")


@needs_mpi
def test_through_the_python_api_a_rank_that_hangs_is_named_before_any_checkpoint(tmp_path):
    """Trainer.fit under mpiexec: the same watchdog (made with the Trainer's Reducer); nothing saved yet;
    MINIDL_WATCHDOG_S sets the time a rank may keep the others waiting."""
    t0 = time.perf_counter()
    p, said, _ = faulty(tmp_path, "hang", 0, 5, tmp_path / "out.npz", how="api", env={"MINIDL_WATCHDOG_S": "2"})
    assert p.returncode != 0 and time.perf_counter() - t0 < 60, p.stderr
    assert said == ["minidl: rank 0 stopped answering after step 5 (between steps: callbacks, monitoring) 2 s ago; "
                    "the run stops; no checkpoint was saved"], p.stderr


@needs_mpi
def test_through_the_python_api_a_rank_killed_is_named(tmp_path):
    p, said, seconds = faulty(tmp_path, "kill", 0, 25, tmp_path / "out.npz", how="api")
    assert p.returncode != 0 and seconds < 10, p.stderr
    assert len(said) == 1 and said[0].startswith("minidl: rank 0 died after step 25"), p.stderr
    assert said[0].endswith(f"last good checkpoint: {tmp_path / 'out.npz'} at step 20")


@needs_mpi
@needs_data
def test_a_rank_slower_each_step_is_named_once_and_the_run_goes_on(tmp_path):
    p, said, _ = faulty(tmp_path, "slow:60", 1, 5, "-n", "150", "-m", "50", "-b", "8", "--device", "cpu",
                        "-x", "100", "-y", "1")
    assert p.returncode == 0 and said == [], p.stderr
    said = [line for line in p.stderr.splitlines() if "slower than the others" in line]
    assert len(said) == 1, p.stderr
    m = re.fullmatch(r"warning: rank 1 is (\d+\.\d)x slower than the others \((\d+) ms a step against "
                     r"(\d+)\)", said[0])
    assert m and float(m.group(1)) > 3 and 60 <= int(m.group(2)) < 200, said


@needs_mpi
@needs_data
def test_a_normal_run_with_slow_saves_and_evaluation_says_none_of_it(tmp_path):
    """Rank 0's saves take 3 s more than MINIDL_WATCHDOG_S while rank 1 waits for it: a save declares
    itself slow (as the first step and evaluation do), so no rank is named; nothing is left behind."""
    before = _run_folders()
    p, said, _ = faulty(tmp_path, "slowsave:4", 0, 0, "-n", "45", "-m", "15", "-b", "8", "--device", "cpu",
                        "--save-every", "20", "-x", "200", "-y", "1", "--checkpoint", tmp_path / "ck.npz",
                        env={"MINIDL_WATCHDOG_S": "1"})
    assert p.returncode == 0 and said == [] and "warning" not in p.stderr, p.stderr
    assert "Done." in p.stdout
    assert _run_folders() <= before


WRONG = ("MINIDL_WATCHDOG_S must be the seconds a rank may keep the others waiting, a number in [0, 86400] "
         "(0: no watchdog), got 'soon'")


@needs_mpi
def test_a_bad_watchdog_timeout_is_one_line_naming_the_variable(tmp_path):
    """On the command line as a flag is (exit 2, before any data is read); in Python a ValueError."""
    env = dict(ENV, MINIDL_WATCHDOG_S="soon")
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "minidl.train", "-n", "5", "--device", "cpu",
                        "--data-dir", tmp_path], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.splitlines() == [f"error: {WRONG}"] and p.stdout == "", p.stderr
    p, _, _ = faulty(tmp_path, "none", 0, 0, tmp_path / "out.npz", how="api", env={"MINIDL_WATCHDOG_S": "soon"})
    assert p.returncode != 0 and WRONG in p.stderr


# -- the judging, without MPI ---------------------------------------------------------------------------
def rec(rank, phase, step=10, since=0.0, beat=100.0, work_s=0.05, steps=10, checkpoint=None):
    return {"rank": rank, "phase": phase, "step": step, "since": since, "beat": beat, "work_s": work_s,
            "steps": steps, "checkpoint": checkpoint}


def test_a_rank_long_in_a_timed_phase_while_another_waits_is_named_and_slow_phases_never():
    now, t = 100.0, 5.0
    waiting = rec(0, "waiting", 11, since=99.0, checkpoint=["ck.npz", 300])
    assert watchdog.judge({0: waiting, 1: rec(1, "step", 11, since=94.5)}, now, t) == (
        "minidl: rank 1 stopped answering during step 11 (forward, backward, update) 6 s ago; the run stops; "
        "last good checkpoint: ck.npz at step 300")
    assert watchdog.judge({0: waiting, 1: rec(1, "step", 11, since=96.0)}, now, t) is None       # not yet
    for slow in ("first step", "evaluation", "saving", "loading data", "idle", "starting"):
        assert watchdog.judge({0: waiting, 1: rec(1, slow, since=0.0)}, now, t) is None
    # nobody waits for it (a rank busy on its own between fits): not judged
    assert watchdog.judge({0: rec(0, "idle"), 1: rec(1, "between steps", since=0.0)}, now, t) is None
    # a model whose steps take 2 s: hung only past HANG_STEPS of them
    assert watchdog.judge({0: waiting, 1: rec(1, "step", since=80.0, work_s=20.0, steps=10)}, now, t) is None
    assert watchdog.judge({0: waiting, 1: rec(1, "step", since=50.0, work_s=20.0, steps=10)}, now, t)
    # before any step is counted, the first step's time bounds the next: a CPU ResNet's 8 s steps are no hang
    first = rec(1, "step", step=2, since=80.0, work_s=0.0, steps=0)
    assert watchdog.judge({0: waiting, 1: dict(first, last_s=8.0)}, now, t) is None
    assert watchdog.judge({0: waiting, 1: dict(first, last_s=0.01)}, now, t)


def test_a_heartbeat_that_stops_is_a_rank_that_stopped_answering_in_any_phase():
    line = watchdog.judge({0: rec(0, "idle"), 1: rec(1, "saving", step=7, beat=92.0)}, 100.0, 5.0)
    assert line == ("minidl: rank 1 stopped answering during step 7 (saving a checkpoint) 8 s ago; the run stops; "
                    "no checkpoint was saved")


def test_the_slower_rank_is_found_from_its_work_per_step():
    before = {0: rec(0, "step", work_s=1.0, steps=100), 1: rec(1, "step", work_s=1.0, steps=100),
              2: rec(2, "step", work_s=1.0, steps=100)}
    after = {0: rec(0, "step", work_s=1.36, steps=110), 1: rec(1, "step", work_s=2.12, steps=110),
             2: rec(2, "step", work_s=1.36, steps=110)}
    r, ms, others = watchdog.slower(before, after)
    assert r == 1 and round(ms) == 112 and round(others) == 36
    even = {k: dict(v, work_s=1.36) for k, v in after.items()}
    assert watchdog.slower(before, even) is None
    tiny = {k: dict(v, work_s=v["work_s"] * 0.01 + 0.99) for k, v in after.items()}   # 1x vs 2x of 0.4 ms
    assert watchdog.slower(before, tiny) is None                                      # not worth a word


def test_ages_are_measured_on_this_hosts_clock_so_a_host_whose_clock_is_behind_is_not_stopped(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(watchdog.time, "monotonic", lambda: clock[0])
    observed, now = watchdog.Observed(), 5000.0       # rank 1's host's clock is 60 s behind ours
    far = {0: rec(0, "waiting", since=4999.0, beat=5000.0), 1: rec(1, "step", since=4939.0, beat=4940.0)}
    assert watchdog.judge(far, now, 5.0) is not None                        # its own times: "stopped"
    assert watchdog.judge(observed(far, now), now, 5.0) is None              # first seen: new
    for k in range(1, 30):                                                   # it beats on, its steps go on
        clock[0] += 0.25
        far[0] = dict(far[0], beat=5000.0 + 0.25 * k)                      # rank 0 waits, and beats
        far[1] = dict(far[1], beat=4940.0 + 0.25 * k, step=10 + k, since=4940.0 + 0.25 * k)
        assert watchdog.judge(observed(far, now + 0.25 * k), now + 0.25 * k, 5.0) is None
    for k in range(1, 30):                                                   # its step stops; it still beats
        clock[0] += 0.25
        far[0] = dict(far[0], beat=5010.0 + 0.25 * k)
        far[1] = dict(far[1], beat=4950.0 + 0.25 * k)
        line = watchdog.judge(observed(far, now + 10 + 0.25 * k), now + 10 + 0.25 * k, 5.0)
        assert (line is None) == (0.25 * k <= 5.0), k
    assert line.startswith("minidl: rank 1 stopped answering during step 39 (forward, backward, update) 7 s ago")


@pytest.mark.parametrize("value,seconds", [("", 5.0), ("0", 0.0), ("2.5", 2.5)])
def test_the_timeout_comes_from_minidl_watchdog_s(monkeypatch, value, seconds):
    monkeypatch.setenv("MINIDL_WATCHDOG_S", value)
    assert watchdog.timeout_from_env() == seconds


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "1e9"])
def test_a_timeout_that_is_no_number_of_seconds_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("MINIDL_WATCHDOG_S", value)
    with pytest.raises(ValueError, match=f"^MINIDL_WATCHDOG_S must be .* got '{re.escape(value)}'$"):
        watchdog.timeout_from_env()


def test_a_heartbeat_record_reads_back_with_its_phase_step_and_checkpoint(tmp_path):
    beat = heartbeat.Heartbeat(str(tmp_path), 3)
    heartbeat.install(beat)
    try:
        heartbeat.step_begins(41)
        with heartbeat.waiting():
            got = heartbeat.read(str(tmp_path))[3]
            assert (got["phase"], got["step"]) == ("waiting", 41)
        heartbeat.step_ends(41)
        heartbeat.checkpointed(tmp_path / "ck.npz", 40)
        got = heartbeat.read(str(tmp_path))[3]
        assert (got["phase"], got["step"], got["steps"], got["pid"]) == ("between steps", 41, 1, os.getpid())
        assert heartbeat.last_checkpoint({3: got}) == f"last good checkpoint: {tmp_path / 'ck.npz'} at step 40"
        assert heartbeat.where(got) == "after step 41 (between steps: callbacks, monitoring)"
    finally:
        heartbeat.install(None)
        beat.close()
    assert heartbeat.read(str(tmp_path)) == {}               # the record goes with the heartbeat


def test_a_sentinel_speaks_only_for_the_first_rank_that_died_without_a_word_and_only_once(tmp_path):
    first, alone, spoken = (tmp_path / n for n in ("first", "alone", "spoken"))
    for folder in (first, alone, spoken):
        folder.mkdir()
    (first / "ended.0").write_text(repr(time.time() - 0.01))      # rank 0 went first
    err = io.StringIO()
    assert sentinel.watch(str(first), 1, io.StringIO(""), err) == "after"
    assert sentinel.watch(str(first), 2, io.StringIO("bye\n"), err) == "bye"      # ended in order
    assert err.getvalue() == ""
    assert sentinel.watch(str(alone), 0, io.StringIO(""), err) == "died"
    assert err.getvalue() == ("minidl: rank 0 died while starting: its process ended without a word (killed? out "
                              "of memory?); the run stops; no checkpoint was saved\n")
    assert heartbeat.claim(str(spoken))                  # a rank printed its own failure (World's abort line)
    assert sentinel.watch(str(spoken), 0, io.StringIO(""), err) == "after"
    assert sentinel.watch(str(spoken), 1, io.StringIO("spoke\nbye\n"), err) == "spoke"     # it was rank 1
    assert (spoken / "ended.1").exists() and err.getvalue().count("\n") == 1


def test_the_run_folder_goes_once_every_rank_with_a_record_has_ended(tmp_path):
    beat = heartbeat.Heartbeat(str(tmp_path), 4)           # a rank the launcher left running
    try:
        heartbeat.claim(str(tmp_path))
        t0 = time.perf_counter()
        sentinel.tidy(str(tmp_path), patience=0.5)
        assert time.perf_counter() - t0 >= 0.5 and not tmp_path.exists()   # waited for it, then went
    finally:
        beat.close()
    tmp_path.mkdir()
    beat = heartbeat.Heartbeat(str(tmp_path), 4)
    (tmp_path / "ended.4").write_text("0")
    t0 = time.perf_counter()
    sentinel.tidy(str(tmp_path), patience=30)
    assert time.perf_counter() - t0 < 5 and not tmp_path.exists()
    beat.close()


def test_the_failure_line_starts_a_line_of_its_own_where_a_bar_may_be_drawn():
    from minidl.distributed import heartbeat
    # a terminal may hold rank 0's unended bar (another process under a launcher that merges the output)
    assert heartbeat.failure_line("minidl: rank 1 died", isatty=True) == "\nminidl: rank 1 died"
    assert heartbeat.failure_line("minidl: rank 1 died", isatty=False) == "minidl: rank 1 died"
