"""The GPU's files written and locked through the one writer (minidl.files, issue 40): the cuDNN engines'
cache under $XDG_CACHE_HOME, merged by processes at once; a source two processes compile at once compiled
once (the stripe lock, files.exclusive); a compile worker on an empty cache stamps it (files.write_atomic).
tests/test_one_writer.py runs the same code with CuPy stood in."""
import json
import os
import pathlib
import subprocess
import sys
import time
import uuid

import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _env(tmp_path, **more):
    # the checkout first, then whatever else the machine's imports need (the cuDNN Frontend's folder)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, CUPY_CACHE_DIR=str(tmp_path / "cupy"),
               XDG_CACHE_HOME=str(tmp_path / "xdg"), MINIDL_COMPILE_WORKERS="0", **more)
    env.pop("MINIDL_CACHE", None)
    return env


def _start(code, tmp_path, *args, **env):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, env=_env(tmp_path, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(p, timeout=600):
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


_CONV = """
import json, sys
import cupy as cp, numpy as np
from minidl.kernels.gpu import _cuda, conv, engines
N, C, K = int(sys.argv[1]), 32, 64
plan = conv.conv2d_plan((None, C, 16, 16), (K, C, 3, 3), (1, 1), 0, (1, 1))
x, w = cp.ones((N, C, 16, 16), cp.float32), cp.ones((K, C, 3, 3), cp.float32)
conv.conv2d_fprop(plan, x, w)
cp.cuda.get_current_stream().synchronize()
print(json.dumps({"timed": _cuda.progress.timed, "path": engines.cache_path()}))
"""


def test_the_engines_cache_lives_under_xdg_and_keeps_what_processes_at_once_chose(tmp_path):
    procs = [_start(_CONV, tmp_path, n) for n in (3, 5, 7)]
    got = [_result(p) for p in procs]
    path = tmp_path / "xdg" / "minidl" / "cudnn-engines.json"
    assert {g["path"] for g in got} == {str(path)}
    assert all(g["timed"] > 0 for g in got), got
    table = json.loads(path.read_text())
    for n in (3, 5, 7):                                      # each process's shape, none lost to another's write
        assert any(f"({n}, 32, 16, 16)" in key for key in table), (n, list(table))
    assert not [f for f in os.listdir(path.parent) if f.endswith(".tmp")]
    again = _result(_start(_CONV, tmp_path, 5))
    assert again["timed"] == 0                               # read back: nothing timed


_COMPILE = """
import json, os, sys, time
from minidl.kernels.gpu import _cuda
code, go = sys.argv[1], sys.argv[2]
m = _cuda.Module(code, ["one_writer_probe"])
while not os.path.exists(go):
    time.sleep(0.01)
m.get("one_writer_probe")
print(json.dumps({"compiled": _cuda.progress.compiled}))
"""


def test_two_processes_compiling_one_new_source_at_once_compile_it_once(tmp_path):
    code = ('extern "C" __global__ void one_writer_probe(float* x) { x[threadIdx.x] = %d.0f; }'
            % (uuid.uuid4().int % 100000))                   # new to CuPy's cache however often this runs
    go = tmp_path / "go"
    procs = [_start(_COMPILE, tmp_path, code, go, MINIDL_PARALLEL_COMPILE="0") for _ in range(2)]
    time.sleep(15)                                           # both imported and waiting (CuPy's import is slow)
    go.write_text("")
    compiled = [_result(p)["compiled"] for p in procs]
    assert sum(compiled) == 1, compiled                      # the second waited on the stripe lock, then loaded
    locks = os.listdir(tmp_path / "cupy" / "minidl-locks")
    assert any(f.startswith("stripe-") and f.endswith(".lock") for f in locks), locks


def test_a_compile_worker_on_an_empty_cache_compiles_and_stamps_it(tmp_path):
    claims, stamp = tmp_path / "claims", tmp_path / "cupy" / "minidl-locks" / "workers-test.done"
    claims.mkdir()
    p = subprocess.run([sys.executable, "-m", "minidl.kernels.gpu.compile_workers", "0", str(claims), "1", str(stamp)],
                       cwd=ROOT, env=_env(tmp_path, MINIDL_PARALLEL_COMPILE="0"), capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert stamp.read_text() == "compiled\n" and not claims.exists()
    assert not [f for f in os.listdir(stamp.parent) if f.endswith(".tmp")]
    cached = [f for _, _, fs in os.walk(tmp_path / "cupy") for f in fs if f.endswith(".cubin")]
    assert len(cached) > 10, len(cached)
