"""A first run on empty caches, and the runs after it (issue 27): a second process with the same
caches compiles nothing and times nothing; ranks of one host never compile a module twice."""
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.gpu import _cuda  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
LENET = ["--model", "lenet", "-b", "16", "-x", "100"]


def _warmup(cache, wait=True, **env):
    env = dict(os.environ, MINIDL_CACHE=str(cache / "minidl"), CUPY_CACHE_DIR=str(cache / "cupy"), **env)
    cmd = [sys.executable, "-m", "minidl.warmup", *LENET]
    p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return _counts(p) if wait else p


def _counts(p):
    out = p.communicate(timeout=600)[0]
    assert p.returncode == 0, out
    m = re.search(r"(\d+) kernels compiled, (\d+) convolutions timed", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)), out


def test_a_second_process_on_the_same_caches_compiles_and_times_nothing(tmp_path):
    compiled, timed, out = _warmup(tmp_path)
    assert compiled > 0 and timed > 0, out
    assert (tmp_path / "minidl" / "cudnn-engines.json").exists()
    compiled, timed, out = _warmup(tmp_path)
    assert (compiled, timed) == (0, 0), out


def test_two_processes_on_one_empty_cache_compile_each_module_once(tmp_path):
    # counted in the processes themselves: without compile workers, which would compile for them
    alone, _, _ = _warmup(tmp_path / "alone", MINIDL_COMPILE_WORKERS="0")
    procs = [_warmup(tmp_path / "shared", wait=False, MINIDL_COMPILE_WORKERS="0") for _ in range(2)]
    together = sum(_counts(p)[0] for p in procs)
    assert together <= alone + 2, (alone, together)     # +2: a module both asked for at the same moment


def test_the_old_paths_still_run(tmp_path):
    compiled, timed, out = _warmup(tmp_path, MINIDL_PARALLEL_COMPILE="0", MINIDL_COMPILE_LOCK="0",
                                   MINIDL_AUTOTUNE_TOPK="0")
    assert compiled > 0 and timed > 0, out


def test_prefetch_compiles_every_known_module_and_get_finds_it(monkeypatch):
    from minidl.kernels.gpu import _vec, dense, norm, optim, softmax  # noqa: F401  their Modules register
    monkeypatch.setattr(_cuda, "_pool", [])
    monkeypatch.setattr(_cuda, "_pool_device", [])
    for m in _cuda._registry:
        monkeypatch.setattr(m, "_mods", {})
    _cuda.prefetch()
    _cuda.wait()
    for m in _cuda._registry:
        assert None in m._mods, m.names[:2]
        assert m.get(m.names[0]) is not None
    line = _cuda.progress.line()
    assert line.startswith("preparing: compiling ") and "convolutions" in line


def test_a_module_made_after_the_pool_started_compiles_in_the_pool(monkeypatch):
    # the kernel families import after a cuda Device starts the pool: their Modules must join it,
    # or the first step compiles them on its own thread, one after another
    monkeypatch.setattr(_cuda, "_pool", [])
    monkeypatch.setattr(_cuda, "_pool_device", [])
    monkeypatch.setattr(_cuda, "_registry", [])
    _cuda.prefetch()
    late = _cuda.Module('extern "C" __global__ void late_one(float* x) { x[threadIdx.x] = 1.0f; }', ["late_one"])
    _cuda.wait()
    assert None in late._mods            # compiled without anyone asking for it: by the pool
    x = cp.zeros(4, cp.float32)
    late.get("late_one")((1,), (4,), (x,))
    assert x.tolist() == [1.0] * 4


def test_progress_listeners_hear_the_main_thread_and_can_stop():
    heard = []
    stop = _cuda.progress.listen(heard.append)
    _cuda.progress._said = 0.0
    _cuda.progress.add(timed=0)
    stop()
    _cuda.progress._said = 0.0
    _cuda.progress.add(timed=0)
    assert len(heard) == 1 and heard[0].startswith("preparing:")


_WORKERS = """
import sys
from minidl import backend
from minidl.kernels.gpu import _cuda
backend.get_device("cuda")
workers = list(_cuda._workers)
codes = [w.wait() for w in workers]
print("workers", len(workers), "codes", codes)
"""


def test_compile_workers_fill_an_empty_cache_once(tmp_path):
    # on empty caches a cuda Device starts worker processes, which compile every Module and rehearsal
    # into the cache and stamp it; a process on that cache starts none and finds the kernels there
    env = dict(os.environ, MINIDL_CACHE=str(tmp_path / "minidl"), CUPY_CACHE_DIR=str(tmp_path / "cupy"),
               MINIDL_COMPILE_WORKERS="3")
    first = subprocess.run([sys.executable, "-c", _WORKERS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "workers 3 codes [0, 0, 0]" in first.stdout, first.stdout + first.stderr
    deadline = time.time() + 30                 # the stamp follows the last worker (a thread of the first)
    while not list((tmp_path / "cupy" / "minidl-locks").glob("workers-*.done")) and time.time() < deadline:
        time.sleep(0.2)
    assert list((tmp_path / "cupy" / "minidl-locks").glob("workers-*.done"))
    second = subprocess.run([sys.executable, "-c", _WORKERS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "workers 0 codes []" in second.stdout, second.stdout + second.stderr
    compiled, timed, out = _warmup(tmp_path)      # the rehearsals' kernels and every Module: found compiled
    assert compiled <= 3, out
