"""Which cuDNN engine runs a graph: the heuristics' first candidates timed once per key, the fastest kept.

cuDNN's heuristics rank the engines for a graph without running them, and at the small shapes
minidl trains (LeNet's 5x5 convs at batch 256, ResNet-50 at batch 1) their first choice can be
several times slower than the best engine. As `torch.backends.cudnn.benchmark` does, `choose`
runs each candidate plan on the real arrays a few times and keeps the fastest; the filters
applied before (no nondeterministic engines in deterministic mode, no TF32 engines without TF32)
still hold, so a deterministic run chooses among deterministic engines only.

The choice is remembered on disk, keyed by GPU, cuDNN version, op, shapes, dtypes, pointer
alignment, tf32 and determinism, as the plan's name (engine and knobs; an index into the
candidate list would not survive a new cuDNN), in `$MINIDL_CACHE/cudnn-engines.json` (default
`$XDG_CACHE_HOME/minidl`, else `~/.cache/minidl`: `files.cache_dir`). So a second run of the same
model takes the same engines (its numbers are the same) without timing again, and builds only those
plans (`build_remembered`). `MINIDL_AUTOTUNE=0`
makes the heuristics' choice the default. Timing needs a stream that is not capturing: a graph
first met during a CUDA-graph capture takes the heuristics' first plan.

Building a plan is what a cold cache pays most for (cuDNN finalises each candidate, and compiles
those noted RUNTIME_COMPILATION with NVRTC), so only the heuristics' first `topk()` candidates that
build are built and timed (`build_candidates`; MINIDL_AUTOTUNE_TOPK, default 16, which chose
engines as fast as every candidate did at ResNet-50's shapes where 4 lost a few percent; 0: every
candidate, as before), and runtime-compiled ones only where the heuristics rank one first
(MINIDL_AUTOTUNE_RTC=1: those too). The file keeps its format: a key's entry is still the chosen
plan's name. Ranks of one host write it in turn (`files.exclusive`), each merging what the others
wrote, so no rank's choices are lost; it is written as minidl writes every file (`files.write_atomic`).
A warm run builds from the remembered engine only where gpu/plan_cache.py has no built plan to load,
and a built plan is loaded only while this file remembers the engine it was written with (`remembered`).
"""
from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable, Hashable
from typing import Any

import cupy as cp

from . import _cuda, timing
from ... import files

TIMED_RUNS = 10
TOPK = 16                           # candidates built and timed per graph (topk)
MARGIN = 0.05                       # a timed plan must beat the heuristics' choice by 5%
WORKSPACE_CAP = 64 << 20            # bytes a timed plan may ask for beyond the heuristics' choice
report: list[tuple] = []            # (key, plans timed, heuristic ms, chosen ms, chosen workspace bytes)
stats: collections.Counter[str]
stats = collections.Counter()       # graphs timed, plans built for timing, their seconds, remembered, skipped
_state = {"autotune": os.environ.get("MINIDL_AUTOTUNE", "1") != "0"}   # the default; flags set it
_disk: dict[str, dict[str, str]] = {}          # path -> {key: plan name}, read once
_chosen: dict[tuple, str] = {}        # (GPU, key) -> the name fastest() chose: an eager call asks no more


def set_autotune(on: bool) -> None:
    """Time the candidate engines (True, the default) or take the heuristics' first choice."""
    _state["autotune"] = bool(on)


def autotune_enabled() -> bool:
    return _state["autotune"]


def cache_path() -> str:
    return os.path.join(files.cache_dir(), "cudnn-engines.json")


def _read(path):
    if path not in _disk:
        try:
            with open(path) as f:
                table = json.load(f)
            _disk[path] = {str(k): str(v) for k, v in table.items()} if isinstance(table, dict) else {}
        except (OSError, ValueError):
            _disk[path] = {}            # missing or damaged: time again, rewrite it whole
    return _disk[path]


def _write(path, table):
    """Atomically (a crash mid-write leaves the old file, never half of one), one process at a time
    (the lock file beside it, waited for), with the entries another process wrote since `table` was
    read merged in (ours win)."""
    try:
        with files.exclusive(path + ".lock"):
            _disk.pop(path, None)
            for k, v in _read(path).items():
                table.setdefault(k, v)
            _disk[path] = table
            text = json.dumps(table, indent=0, sort_keys=True)
            files.write_atomic(path, lambda f: f.write(text.encode()))
    except files.WriteError:
        pass                            # a read-only home costs only the timing next time


def topk() -> int:
    """How many of the heuristics' candidates a graph builds and times (0: all of them)."""
    try:
        return max(0, int(os.environ.get("MINIDL_AUTOTUNE_TOPK", str(TOPK))))
    except ValueError:
        return TOPK


def build_candidates(g: Any, k: int, compiles: Callable[[int], object] = lambda i: False) -> list[int]:
    """Build the first `k` plans of graph `g` that build, in the heuristics' order, and return their
    indices. A plan for which compiles(i) is true (cuDNN would compile it at run time) is skipped
    unless it is the first, or MINIDL_AUTOTUNE_RTC=1. RuntimeError where none builds."""
    built: list[int]
    t, built = time.perf_counter(), []
    rtc = os.environ.get("MINIDL_AUTOTUNE_RTC", "0") not in ("0", "")
    for i in range(g.get_execution_plan_count()):
        if len(built) >= k:
            break
        if built and not rtc and _true(compiles, i):
            stats["skipped"] += 1
            continue
        try:
            g.build_plan_at_index(i)
        except Exception:               # noqa: BLE001  deselected, or no support: not a candidate
            continue
        built.append(i)
    stats["built"] += len(built)
    stats["build_s"] += time.perf_counter() - t     # type: ignore[assignment]  # a Counter holds seconds too
    if not built:
        raise RuntimeError("no execution plan of the heuristics' candidates could be built")
    return built


def _plan(g, i):
    """(name, workspace bytes) of plan i, or None where it was not built."""
    try:
        return g.get_plan_name_at_index(i), g.get_workspace_size_plan_at_index(i)
    except Exception:                   # noqa: BLE001  the Frontend raises RuntimeError subclasses
        return None


def _time(g, pack, index, workspace_ptr, handle):
    """Milliseconds of one execute of plan `index`, or None where it fails to run or be captured."""
    def run():
        g.execute_plan_at_index(pack, workspace_ptr, index=index, handle=handle())   # handle() binds the stream
    try:
        return timing.time_queued(run, TIMED_RUNS)
    finally:
        handle()                                     # bound back to the current stream


def fastest(key: Hashable, candidates: dict[str, Callable[[], object]]) -> str:
    """The name of the fastest of `candidates` ({name: fn}, fn() one run writing fixed arrays), each
    timed once (timing.time_queued) and remembered on disk under this GPU and `key` (which names the
    libraries' versions where they matter); the first name without autotuning, or while the stream
    is capturing (no timing then)."""
    names = list(candidates)
    if not autotune_enabled():
        return names[0]
    memo = (cp.cuda.runtime.getDevice(), key)
    if _chosen.get(memo) in candidates:
        return _chosen[memo]
    props = cp.cuda.runtime.getDeviceProperties(memo[0])
    gpu = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    disk_key = repr((gpu, key))
    path = cache_path()
    table = _read(path)
    if table.get(disk_key) not in candidates:
        if cp.cuda.get_current_stream().is_capturing():
            return names[0]
        cp.cuda.get_current_stream().synchronize()     # nothing pending in what is timed
        t = time.perf_counter()
        times = {n: timing.time_queued(fn, TIMED_RUNS) for n, fn in candidates.items()}
        _cuda.progress.add(timed=1, timing_s=time.perf_counter() - t)
        ok = [n for n in names if times[n] is not None]
        table[disk_key] = min(ok, key=times.get) if ok else names[0]     # type: ignore[arg-type]  # ok: timed
        _write(path, table)
    _chosen[memo] = table[disk_key]
    return _chosen[memo]


def remembered(key: str) -> str | None:
    """The plan name remembered on disk for `key` (a plan cached whole must be of this engine)."""
    return _read(cache_path()).get(key)


def build_remembered(g: Any, key: str) -> int | None:
    """Build only the plan remembered on disk for `key` and return its index; None where none is
    remembered, or the candidates' names cannot be read before building (then the caller builds
    every plan and `choose` times them). A run on a warm cache builds one plan a graph, not dozens."""
    name = _read(cache_path()).get(key)
    if name is None:
        return None
    try:
        for i in range(g.get_execution_plan_count()):
            if g.get_plan_name_at_index(i) == name:
                g.build_plan_at_index(i)
                stats["remembered"] += 1
                return i
    except Exception:                   # noqa: BLE001  the Frontend raises RuntimeError subclasses
        pass
    return None


def _true(pred, i):
    try:
        return bool(pred(i))
    except Exception:                   # noqa: BLE001  a note the Frontend cannot read: not skipped
        return False


def choose(g: Any, key: str, pack: dict[int, int], handle: Callable[[], Any], workspace: Callable[[int], int],
           built: list[int] | None = None) -> int | None:
    """The index of the plan to run graph `g` on `pack`, or None for the heuristics' first built
    plan (what `execute` runs).

    built: the indices `build_candidates` built, else None (every plan was built: those that built
    are found by asking). key: a string naming the graph and the machine; handle() -> the cuDNN
    handle bound to the current stream; workspace(size) -> a device pointer. Outputs in `pack` are
    overwritten while timing: only pure graphs (convolutions) are tuned. A plan replaces the
    heuristics' choice (the first built plan that runs) only when it is faster by MARGIN, and none
    may ask for more workspace than the larger of WORKSPACE_CAP and what the heuristics' choice asks.
    """
    indices = range(g.get_execution_plan_count()) if built is None else built
    plans = {i: p for i in indices if (p := _plan(g, i)) is not None}
    built = list(plans)
    if len(built) <= 1:
        return None
    path = cache_path()
    table = _read(path)
    for i in built:
        if plans[i][0] == table.get(key):
            return i
    if cp.cuda.get_current_stream().is_capturing():
        return built[0]                 # the heuristics' choice: building sets execute's to the last
    cap = max(WORKSPACE_CAP, plans[built[0]][1])
    built = [i for i in built if plans[i][1] <= cap]
    ptr = workspace(max(plans[i][1] for i in built))
    cp.cuda.get_current_stream().synchronize()     # nothing pending in what is timed
    t = time.perf_counter()
    times = {i: _time(g, pack, i, ptr, handle) for i in built}
    _cuda.progress.add(timed=1, timing_s=time.perf_counter() - t)
    stats["timed"] += 1
    ok = [i for i in built if times[i] is not None]
    if not ok:
        return None
    first = ok[0]                       # FE's candidates come in the heuristics' order
    best = min(ok, key=times.get)     # type: ignore[arg-type]  # ok: the timed ones
    if times[best] > (1 - MARGIN) * times[first]:
        best = first
    report.append((key, len(built), times[first], times[best], plans[best][1]))
    table[key] = plans[best][0]
    _write(path, table)
    return best
