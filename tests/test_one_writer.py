"""The one writer's waiting lock and cache folder (minidl.files: `exclusive`, `cache_dir`), and the places
that wrote and locked files by hand before (issue 40) doing it through it: the cuDNN engines' cache
(gpu/engines.py), the compile stripes (gpu/_nvrtc.py), the compile workers' stamp. The GPU modules run
here in child processes with CuPy stood in; tests/gpu/test_one_writer.py runs them on the device."""
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

from minidl import files

ROOT = pathlib.Path(__file__).resolve().parents[1]

_COUNT = """
import sys
from minidl import files
lock, counter, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for _ in range(n):
    with files.exclusive(lock) as held:
        assert held
        with open(counter) as f:
            value = int(f.read() or 0)
        with open(counter, "w") as f:          # read, then write: lost updates without the lock
            f.write(str(value + 1))
"""


def _child(code, *args, env=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_exclusive_lets_processes_and_threads_take_turns(tmp_path):
    lock, counter = tmp_path / "sub" / "c.lock", tmp_path / "count"
    counter.write_text("0")
    procs = [_child(_COUNT, lock, counter, 200) for _ in range(3)]

    def bump():
        for _ in range(200):
            with files.exclusive(lock):
                counter.write_text(str(int(counter.read_text() or 0) + 1))
    threads = [threading.Thread(target=bump) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert counter.read_text() == str(5 * 200)
    assert lock.exists()                                     # it stays: a waiter may hold it open


def test_exclusive_waits_for_a_holder_rather_than_refusing(tmp_path):
    lock = tmp_path / "w.lock"
    holder = _child("import sys, time\nfrom minidl import files\nwith files.exclusive(sys.argv[1]):\n"
                    "    print('held', flush=True)\n    time.sleep(1.0)\n", lock)
    assert holder.stdout.readline() == "held\n"
    t = time.perf_counter()
    with files.exclusive(lock) as held:
        waited = time.perf_counter() - t
    holder.communicate(timeout=60)
    assert held and waited > 0.5, waited


def test_exclusive_runs_the_block_unlocked_where_no_lock_can_be_had(tmp_path):
    (tmp_path / "afile").write_text("")                      # a folder no one can make, root included
    with files.exclusive(tmp_path / "afile" / "x.lock") as held:
        ran = True
    assert ran and held is False


def test_the_cache_folder_follows_minidl_cache_then_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MINIDL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert files.cache_dir() == str(tmp_path / "home" / ".cache" / "minidl")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert files.cache_dir() == str(tmp_path / "xdg" / "minidl")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")       # the XDG rule: a relative path is ignored
    assert files.cache_dir() == str(tmp_path / "home" / ".cache" / "minidl")
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path / "mine"))
    assert files.cache_dir() == str(tmp_path / "mine")


_STAND_IN = """
import json, sys, types
from unittest import mock
for name in ("cupy", "cupy.cuda", "cupy.cuda.compiler", "cudnn"):
    sys.modules[name] = mock.MagicMock(name=name)      # module-level CuPy calls get stand-ins
cp = sys.modules["cupy"]
from minidl.kernels.gpu import _cuda, _nvrtc, engines
"""

_ENGINES = _STAND_IN + """
cp.cuda.runtime.getDevice.return_value = 0
cp.cuda.runtime.getDeviceProperties.return_value = {"name": b"Stand-in GPU"}
cp.cuda.get_current_stream.return_value.is_capturing.return_value = False
mine, times = sys.argv[1], json.loads(sys.argv[2])
engines.timing.time_queued = lambda fn, runs: times[fn()]   # a fake timing: each candidate's milliseconds
print(engines.fastest(("conv", mine), {name: (lambda name=name: name) for name in times}))
"""


def _engines(cache, key, times, **env):
    p = _child(_ENGINES, key, json.dumps(times), env={"MINIDL_CACHE": str(cache), **env})
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    return out.strip()


def test_engine_choices_of_processes_at_once_all_reach_the_cache_file(tmp_path):
    cache = tmp_path / "cache"
    procs = [_child(_ENGINES, f"shape{i}", json.dumps({"cudnn": 2.0, "small": 1.0}), env={"MINIDL_CACHE": str(cache)})
             for i in range(6)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "small", err
    table = json.loads((cache / "cudnn-engines.json").read_text())
    assert table == {repr(("Stand-in GPU", ("conv", f"shape{i}"))): "small" for i in range(6)}
    assert [p.name for p in cache.iterdir() if p.name.endswith(".tmp")] == []


def test_a_remembered_choice_is_not_timed_again_and_the_file_keeps_its_format(tmp_path):
    cache = tmp_path / "xdg" / "minidl"
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "MINIDL_CACHE": ""}
    assert _engines(cache, "a", {"cudnn": 1.0, "small": 3.0}, **env) == "cudnn"
    assert _engines(cache, "a", {"cudnn": 9.0, "small": 1.0}, **env) == "cudnn"      # from the file, not timed
    text = (cache / "cudnn-engines.json").read_text()
    assert text == json.dumps({repr(("Stand-in GPU", ("conv", "a"))): "cudnn"}, indent=0, sort_keys=True)


def test_a_cache_that_cannot_be_written_costs_only_the_timing(tmp_path):
    (tmp_path / "afile").write_text("")                      # a folder no one can make, root included
    assert _engines(tmp_path / "afile" / "cache", "a", {"cudnn": 2.0, "small": 1.0}) == "small"
    assert (tmp_path / "afile").read_text() == ""


_STRIPES = _STAND_IN + """
import threading, time
folder, spans = sys.argv[1], []
compiler = types.SimpleNamespace(_use_pch=False)
class Program:
    def compile(self, *a, **k):
        pass
def compile_module(source, options=(), **kw):
    t = time.perf_counter()
    time.sleep(0.3)
    spans.append((source, t, time.perf_counter()))
compiler._NVRTCProgram, compiler._compile_module_with_cache = Program, compile_module
sys.modules["cupy.cuda"].compiler = compiler             # what `from cupy.cuda import compiler` finds
_nvrtc.install(_cuda.progress, lambda name, default: {"MINIDL_COMPILE_LOCK": "1"}.get(name, default) == "1",
               lambda: folder)
def same(source):
    return _nvrtc.stripe_lock(folder, repr((source, (), None, None)).encode())
other = next(s for s in ("b", "c", "d", "e") if same(s) != same("a"))
threads = [threading.Thread(target=compiler._compile_module_with_cache, args=(s,)) for s in ("a", "a", other)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"spans": spans, "other": other, "locks": sorted(__import__("os").listdir(folder))}))
"""


def test_compiles_of_one_source_take_turns_and_other_stripes_do_not_wait(tmp_path):
    p = _child(_STRIPES, tmp_path / "locks")
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    got = json.loads(out.splitlines()[-1])
    spans = {s: [(a, b) for src, a, b in got["spans"] if src == s] for s in ("a", got["other"])}
    (a1, b1), (a2, b2) = sorted(spans["a"])
    assert a2 >= b1 - 1e-3                                  # the same source: one after the other
    (o1, o2), = spans[got["other"]]
    assert o1 < b1 and a1 < o2                             # another stripe: alongside the first
    assert all(name.startswith("stripe-") and name.endswith(".lock") for name in got["locks"]), got["locks"]
    assert len(got["locks"]) == 2


def test_the_workers_stamp_is_written_by_the_one_writer_and_a_read_only_cache_is_no_error(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("compile_workers", ROOT / "minidl/kernels/gpu/compile_workers.py")
    workers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workers)
    calls = []
    real = files.write_atomic
    workers.files = type("Files", (), {"WriteError": files.WriteError,
                                       "write_atomic": staticmethod(lambda *a, **k: calls.append(a) or real(*a, **k))})
    claims, stamp = tmp_path / "claims", tmp_path / "cache" / "workers-x.done"
    claims.mkdir()
    workers.finished(str(claims), 1, str(stamp), me=1)
    assert stamp.read_text() == "compiled\n" and [c[0] for c in calls] == [str(stamp)]
    (tmp_path / "afile").write_text("")                      # a folder no one can make, root included
    claims.mkdir()
    workers.finished(str(claims), 1, str(tmp_path / "afile" / "workers-x.done"), me=1)    # no exception
    assert not claims.exists() and (tmp_path / "afile").read_text() == ""
