"""The cuDNN plans the last runs loaded slowly, loaded again on a thread while the next run starts.

A plan loaded from the plan cache (gpu/plan_cache.py) costs about 2 ms, except where loading it does
work once per process: the first plan maps cuDNN's engine libraries, and a plan of a runtime-compiled
engine is compiled by NVRTC again (cuDNN keeps the compiled kernel for the life of the process, not on
disk). Those few plans were most of a warm LeNet-5 run's first step (docs/cold-start.md).

So each process notes how long each plan took to load (plan_cache.seen, or for a plan it warmed the
thread's own load, since the step's then found it warm; a plan built here has no load time yet and
counts as slow), and at exit keeps the slow ones, in the order it first used them, at the head of
`recent.json` beside the plans (one list per machine, at most KEEP names; a plan that loaded fast
leaves the list). The next process, as soon as its GPU starts (`start`), loads the plans of that
list on a thread of its own, each into a graph it drops: the libraries stay mapped and the compiled
kernels stay in cuDNN's process cache, so the first step's own loads of the same plans find them
there, while the main thread goes on importing, reading data and building the model. Nothing is
written by the thread, and it stops at exit; a missing, damaged or foreign list or plan warms
nothing. MINIDL_PLAN_CACHE=0 turns this off with the cache.
"""
from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ... import files
from . import plan_cache

SLOW_S = 0.005          # a load slower than this did once-a-process work: warm it next time
KEEP = 32               # names kept a machine
LIST = "recent.json"
stats: collections.Counter[str] = collections.Counter()   # warmed, failed
_log = logging.getLogger(__name__)
_run: dict[str, Any] = {}            # machine, thread, stop: the process's one warming
warmed: dict[str, float] = {}        # plan file name -> seconds the thread's load of it took


def list_path() -> str:
    return os.path.join(plan_cache.folder(), LIST)


def _lists() -> dict[str, list[str]]:
    """machine -> plan file names, from the list file; {} where it is missing or not one."""
    try:
        with open(list_path(), "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return {}
    lists = data.get("lists") if isinstance(data, dict) and data.get("format") == 1 else None
    if not isinstance(lists, dict):
        return {}
    return {m: [n for n in v if isinstance(n, str) and n == os.path.basename(n) and n.endswith(".plan")]
            for m, v in lists.items() if isinstance(m, str) and isinstance(v, list)}


def start(machine: str, load: Callable[[bytes], Any]) -> threading.Thread | None:
    """Once a process: a daemon thread that calls load(plan bytes) on each plan of `machine`'s list
    (load deserialises one into a graph it drops; any error it raises passes that plan over), and
    at exit the list is merged with this process's loads. Returns the thread, None where nothing is listed."""
    if _run or not plan_cache.enabled():
        return None
    stop = threading.Event()
    _run.update(machine=machine, stop=stop, thread=None)
    atexit.register(finish)
    names = _lists().get(machine, [])
    if not names:
        return None
    thread = threading.Thread(target=_warm, args=(names, load, stop), name="minidl-plans-ahead", daemon=True)
    _run["thread"] = thread
    thread.start()
    return thread


def warm(dev: int) -> threading.Thread | None:
    """start() for GPU `dev` (its machine as the plan cache keys it): the thread loads each plan through
    the cuDNN Frontend with a handle of its own, made on its first plan and kept for the process (the
    main thread's handle is never shared with it)."""
    from . import cudnn_graphs, frontend
    machine = cudnn_graphs.plan_machine(dev)
    if not machine:
        return None
    fe, own = frontend.load(), []

    def load(plan: bytes) -> None:
        if not own:
            import cupy as cp
            cp.cuda.runtime.setDevice(dev)
            own.append(fe.create_handle())
        plan_cache.deserialize(lambda: fe.pygraph(handle=own[0]), plan)
    return start(repr(machine), load)


def _warm(names: list[str], load: Callable[[bytes], Any], stop: threading.Event) -> None:
    for name in names:
        if stop.is_set():
            return
        try:
            t = time.perf_counter()
            with open(os.path.join(plan_cache.folder(), name), "rb") as f:
                load(plan_cache.plan_bytes(f.read()))
            warmed[name] = time.perf_counter() - t
            stats["warmed"] += 1
        except Exception as e:          # noqa: BLE001  gone, damaged, refused: the step builds or loads it as before
            stats["failed"] += 1
            _log.debug("cuDNN plan %s not warmed: %s", name, str(e).splitlines()[0] if str(e) else type(e).__name__)


def finish() -> None:
    """Stop the thread (after the plan it is loading) and keep this process's slow plans at the head
    of its machine's list (written atomically; where it cannot be, the next run warms less)."""
    if "machine" not in _run:
        return
    _run["stop"].set()
    if _run["thread"] is not None:
        _run["thread"].join()
    machine = _run.pop("machine")
    _run.clear()
    plan_cache.flush()                   # the plans built here are on disk before they are listed
    _run["done"] = True                  # once a process: start() after finish() does nothing
    seen = {os.path.basename(f): s for f, s in plan_cache.seen.items()}
    seen.update(warmed)                  # the step's own load of a warmed plan was fast: the thread's says
    if not seen:
        return
    lists = _lists()
    old = lists.get(machine, [])
    slow = [n for n, s in seen.items() if s is None or s >= SLOW_S]
    kept = slow + [n for n in old if n not in seen]
    kept = [n for n in kept if os.path.exists(os.path.join(plan_cache.folder(), n))][:KEEP]
    if kept == old:
        return
    lists[machine] = kept
    data = json.dumps({"format": 1, "lists": lists}, sort_keys=True).encode()
    try:
        files.write_atomic(list_path(), lambda f: f.write(data))
    except Exception as e:              # noqa: BLE001  a read-only cache: nothing warmed next time
        _log.debug("cuDNN plan list not written: %s", e)
