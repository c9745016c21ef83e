"""The plans a warm run loaded slowly, listed at exit and loaded on a thread as the next run starts
(kernels/gpu/plans_ahead.py): what is listed, in what order, what is passed over, and that the thread
stops at exit.

cuDNN does not run here: plan files are written in plan_cache's format with stand-in plans, and the
thread's load is a stand-in that records what it is given. The GPU side (a warm process's first step
finds its slow plans loaded) is tests/gpu/test_plan_cache.py.
"""
import json
import os
import threading
import time

import pytest

from minidl.kernels.gpu import plan_cache, plans_ahead

MACHINE = repr(("Stand-in GPU", "sm_90", 132, 91900, "1.20.0", 13000, 13000))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path))
    monkeypatch.setattr(plan_cache, "seen", {})
    monkeypatch.setattr(plans_ahead, "_run", {})
    monkeypatch.setattr(plans_ahead, "warmed", {})
    monkeypatch.setattr(plans_ahead, "stats", plans_ahead.stats.__class__())
    monkeypatch.setattr(plans_ahead.atexit, "register", lambda f: None)   # the tests call finish() themselves
    os.makedirs(plan_cache.folder())
    return tmp_path


def _plan(name, blob=None):
    """A plan file `name` holding the plan bytes `blob` (default: the name's own bytes); its path."""
    blob = blob if blob is not None else name.encode()
    path = os.path.join(plan_cache.folder(), name)
    with open(path, "wb") as f:
        f.write(plan_cache.encode(f"key of {name}", blob, {"x": 1}, None))
    return path


def _process(loads, machine=MACHINE, thread=None):
    """One process: its thread warms what is listed (thread: plan bytes -> seconds that load takes,
    default 0.01 s: slow), then its step loads plans (loads: plan file -> seconds, None: built), then it exits."""
    warming = plans_ahead.start(machine, lambda b: time.sleep((thread or {}).get(b, 0.01)))
    if warming is not None:
        warming.join()
    plan_cache.seen.update(loads)
    plans_ahead.finish()
    plans_ahead._run.clear()             # the next "process"
    plan_cache.seen.clear()
    plans_ahead.warmed.clear()


def _listed(machine=MACHINE):
    with open(plans_ahead.list_path()) as f:
        return json.load(f)["lists"].get(machine)


def _warm_next(machine=MACHINE, load=None):
    got = []
    thread = plans_ahead.start(machine, load or got.append)
    if thread is not None:
        thread.join()
    return got, thread


def test_slow_and_built_plans_are_listed_in_first_use_order_and_warmed_next_time(cache):
    a, b, c, d = (_plan(n) for n in ("a.plan", "b.plan", "c.plan", "d.plan"))
    _process({c: 0.090, a: 0.001, d: None, b: 0.030})        # d built here: its load time is not known yet
    assert _listed() == ["c.plan", "d.plan", "b.plan"]
    got, thread = _warm_next()
    assert got == [b"c.plan", b"d.plan", b"b.plan"]
    assert thread.daemon and plans_ahead.stats["warmed"] == 3


def test_a_plan_that_loaded_fast_leaves_the_list_and_unseen_ones_stay_behind_this_runs(cache):
    a, b, c = (_plan(n) for n in ("a.plan", "b.plan", "c.plan"))
    _process({a: 0.05, b: 0.05})
    _process({b: 0.002, c: 0.04}, thread={b"b.plan": 0})     # b fast now; a not used by this run, warmed slowly
    assert _listed() == ["c.plan", "a.plan"]


def test_a_warmed_plan_is_judged_by_the_threads_load_not_the_steps_which_found_it_warm(cache):
    slow, quick = _plan("slow.plan"), _plan("quick.plan")
    _process({slow: 0.09, quick: 0.03})
    _process({slow: 0.002, quick: 0.002}, thread={b"slow.plan": 0.02, b"quick.plan": 0})
    assert _listed() == ["slow.plan"]


def test_the_list_is_kept_per_machine_and_capped(cache, monkeypatch):
    monkeypatch.setattr(plans_ahead, "KEEP", 3)
    paths = [_plan(f"p{i}.plan") for i in range(5)]
    _process({p: 0.02 for p in paths[:2]}, machine="other GPU")
    _process({p: 0.02 for p in paths})
    assert _listed() == ["p0.plan", "p1.plan", "p2.plan"]
    assert _listed("other GPU") == ["p0.plan", "p1.plan"]
    assert _warm_next("a third GPU") == ([], None)


def test_a_listed_plan_that_is_gone_damaged_or_refused_is_passed_over(cache):
    good, gone, damaged, refused = (_plan(n) for n in ("good.plan", "gone.plan", "damaged.plan", "refused.plan"))
    _process({gone: 0.02, damaged: 0.02, refused: 0.02, good: 0.02})
    os.remove(gone)
    with open(damaged, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(b"!")
    got = []

    def load(blob):
        if blob == b"refused.plan":
            raise RuntimeError("CUDNN_STATUS_BAD_PARAM")
        got.append(blob)
    _warm_next(load=load)
    assert got == [b"good.plan"]
    assert plans_ahead.stats["failed"] == 3 and plans_ahead.stats["warmed"] == 1


@pytest.mark.parametrize("text", [b"", b"{not json", b'{"format": 2, "lists": {}}', b'{"format": 1, "lists": []}',
                                  b'{"format": 1, "lists": {"M": ["../outside.plan", 7, "x.plan"]}}'])
def test_a_damaged_or_foreign_list_warms_nothing_it_should_not(cache, text):
    _plan("x.plan")
    with open(os.path.join(cache, "outside.plan"), "wb") as f:     # a plan file, but not beside the plans
        f.write(plan_cache.encode("key", b"outside", {"x": 1}, None))
    with open(plans_ahead.list_path(), "wb") as f:
        f.write(text)
    got, _ = _warm_next("M")
    assert got == ([b"x.plan"] if b"x.plan" in text else [])     # only a plain name beside the plans


def test_exit_stops_the_thread_after_the_plan_it_is_loading(cache):
    paths = [_plan(f"p{i}.plan") for i in range(3)]
    _process({p: 0.02 for p in paths})
    started, release, got = threading.Event(), threading.Event(), []

    def load(blob):
        got.append(blob)
        started.set()
        release.wait(5)
    plans_ahead.start(MACHINE, load)
    started.wait(5)
    threading.Timer(0.05, release.set).start()
    plans_ahead.finish()                 # joins: the thread saw the stop before its second plan
    assert got == [b"p0.plan"] and not any(t.name == "minidl-plans-ahead" for t in threading.enumerate())
    assert plans_ahead.start(MACHINE, load) is None            # once a process


def test_off_with_the_plan_cache_and_a_list_that_cannot_be_written_costs_nothing(cache, monkeypatch):
    p = _plan("p.plan")
    monkeypatch.setenv("MINIDL_PLAN_CACHE", "0")
    assert plans_ahead.start(MACHINE, lambda b: None) is None
    monkeypatch.delenv("MINIDL_PLAN_CACHE")
    monkeypatch.setattr(plans_ahead.files, "write_atomic", lambda *a, **k: (_ for _ in ()).throw(OSError("read-only")))
    _process({p: 0.02})                  # no exception at exit
    assert not os.path.exists(plans_ahead.list_path())


def test_a_plan_file_gives_its_plan_whatever_graph_it_is_for(cache):
    with open(_plan("p.plan", b"\x00plan bytes"), "rb") as f:
        data = f.read()
    assert plan_cache.plan_bytes(data) == b"\x00plan bytes"
    for bad in (b"not a plan", data[:-1], data.replace(b'"format": 1', b'"format": 9')):
        with pytest.raises(ValueError):
            plan_cache.plan_bytes(bad)
