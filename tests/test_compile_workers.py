"""The compile workers' shared work list and claims (minidl/kernels/gpu/compile_workers.py), and where the
pool's rehearsals run (gpu/ahead.py): plain Python, checked without a GPU; tests/gpu/test_cold_start.py
runs them for real."""
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import threading
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compile_workers", ROOT / "minidl/kernels/gpu/compile_workers.py")
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)        # not through minidl.kernels.gpu, whose package imports CuPy
_spec = importlib.util.spec_from_file_location("affinity", ROOT / "minidl/kernels/gpu/affinity.py")
affinity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(affinity)


def _module(code, names):
    return types.SimpleNamespace(code=code, names=names, compiled=[], _compile=lambda key, names: None)


def test_jobs_put_the_rehearsals_first_then_the_largest_modules_in_one_order():
    small = _module("a", ["k<float>"])
    large = _module("b", ["x<1>", "x<2>", "x<3>"])
    mid = _module("c", ["y<1>", "y<2>"])
    ran = []
    rehearsals = [lambda: ran.append("r1"), lambda: ran.append("r2")]
    for m in (small, large, mid):
        m._compile = lambda key, names, m=m: ran.append(m.code)
    one = workers.jobs([small, large, mid], rehearsals)
    other = workers.jobs([mid, small, large], rehearsals)     # another import order, the same list
    for job in one:
        job()
    assert ran == ["r1", "r2", "b", "c", "a"]
    ran.clear()
    for job in other:
        job()
    assert ran == ["r1", "r2", "b", "c", "a"]


def test_each_job_is_claimed_by_one_worker_only(tmp_path):
    won = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        won.extend(i for i in range(50) if workers.claim(str(tmp_path), i))
    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == list(range(50))


def test_the_last_worker_to_finish_stamps_the_cache_and_drops_the_claims(tmp_path):
    claims, stamp = tmp_path / "claims", tmp_path / "cache" / "minidl-locks" / "workers-x.done"
    claims.mkdir()
    assert workers.claim(str(claims), 0)
    for me in (11, 12):
        workers.finished(str(claims), 3, str(stamp), me=me)
        assert not stamp.exists() and claims.exists()        # two of three: no stamp yet
    workers.finished(str(claims), 3, str(stamp), me=13)
    assert stamp.read_text() == "compiled\n" and not claims.exists()


_LINE = """
import sys, types
from unittest import mock
for name in ("cupy", "cupy.cuda", "cupy.cuda.compiler"):
    sys.modules[name] = mock.MagicMock(name=name)      # _cuda's module-level CuPy calls get stand-ins
from minidl.kernels.gpu import _cuda
print(_cuda.progress.line())
_cuda._workers[:] = [types.SimpleNamespace(poll=lambda code=code: code) for code in (None, None, 0)]
_cuda.progress.add(compiled=3, queued=4, timed=5)
print(_cuda.progress.line())
"""


def test_the_preparing_line_names_the_worker_processes_still_compiling():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _LINE], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "preparing: compiling 0 kernels, timing 0 convolutions",
        "preparing: compiling 3/7 kernels (and 2 worker processes), timing 5 convolutions"]


def test_the_worker_count_comes_from_the_environment_or_the_cores(monkeypatch):
    import os

    import pytest
    monkeypatch.delenv("MINIDL_COMPILE_WORKERS", raising=False)
    assert workers.count() == min(8, (os.cpu_count() or 2) - 1)
    monkeypatch.setenv("MINIDL_COMPILE_WORKERS", "3")
    assert workers.count() == 3
    monkeypatch.setenv("MINIDL_COMPILE_WORKERS", "many")
    with pytest.raises(ValueError, match="MINIDL_COMPILE_WORKERS must be a whole number.*'many'"):
        workers.count()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs Linux and 2 cores")
def test_a_worker_started_from_a_rank_bound_to_one_core_runs_on_every_core():
    """Open MPI binds each of two ranks to one core; a worker it starts must not share that core."""
    import subprocess
    import sys
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        os.sched_setaffinity(child.pid, {0})                 # as it inherits it from a bound rank
        affinity.unbind(child.pid)
        assert os.sched_getaffinity(child.pid) == set(range(os.cpu_count()))
    finally:
        child.communicate(b"")
    seen = []

    def pool_thread():                                      # a pool thread of a bound rank: itself only
        os.sched_setaffinity(0, {0})
        affinity.unbind()
        seen.append(os.sched_getaffinity(0))
    t = threading.Thread(target=pool_thread)
    t.start()
    t.join()
    assert seen == [set(range(os.cpu_count()))]
    assert os.sched_getaffinity(0) == set(range(os.cpu_count()))       # the thread's binding was its own


_REHEARSE = """
import json, os, sys
from unittest import mock
for name in ("cupy", "cupy.cuda", "cudnn"):
    sys.modules[name] = mock.MagicMock(name=name)      # module-level calls return stand-ins
from minidl.kernels.gpu import _cuda, ahead
stamp, queued = sys.argv[1], []
_cuda.stamp_path = lambda dev: stamp
_cuda.ahead = queued.append
ahead.training()                      # the stamp is there: CuPy's cache holds every rehearsal's kernels
warm = len(queued)
os.remove(stamp)
ahead._done.clear()
ahead.training()
print(json.dumps({"warm": warm, "cold": queued == list(ahead.REHEARSALS)}))
"""


def test_the_rehearsals_run_only_where_the_workers_stamp_is_missing(tmp_path):
    """On a warm cache they would compile nothing, and runs that rehearsed replayed their CUDA graphs 7%
    slower (docs/cold-start.md). In a child process with CuPy stood in, so no other test sees it."""
    stamp = tmp_path / "workers-x.done"
    stamp.write_text("")
    run = subprocess.run([sys.executable, "-c", _REHEARSE, str(stamp)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"warm": 0, "cold": True}
