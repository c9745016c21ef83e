"""The cuDNN plan cache's host side (kernels/gpu/plan_cache.py): files, keys, and what is passed over.

cuDNN does not run here: a stand-in Frontend graph serialises to known bytes and records what it is
given. The GPU side (a real plan serialised, loaded in a fresh process, bit-identical outputs) is
tests/gpu/test_plan_cache.py.
"""
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from minidl.kernels.gpu import plan_cache

KEY = repr(("plan", "Stand-in GPU", "sm_90", 132, 91900, "1.20.0", 13000, "conv_fprop", (("x", (2, 3, 8, 8)),)))
UIDS = {"x": 1, "w": 2, "y": 3}
LOG = "minidl.kernels.gpu.plan_cache"


class Graph:
    """A Frontend graph's serialisation surface: serialize() -> list of byte values (as pybind11 gives)."""

    def __init__(self, blob=b"PLAN:eng7_k2=1", refuse=None, takes=(list, bytearray)):
        self.blob, self.refuse, self.takes, self.given, self.built = blob, refuse, takes, None, []

    def serialize(self):
        if self.refuse:
            raise RuntimeError(self.refuse)
        return list(self.blob)

    def deserialize(self, data):
        if not isinstance(data, self.takes):     # pybind11 2.13: bytes refused (a str is a description)
            raise RuntimeError(f"Unable to cast Python instance of type {type(data)} to C++ type 'std::vector'")
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.given = bytes(data)

    def build_plan_at_index(self, i):
        self.built.append(i)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path))
    monkeypatch.setattr(plan_cache, "stats", plan_cache.stats.__class__())
    return tmp_path


def _saved(key=KEY, remembered=None, index=None, g=None):
    g = g or Graph()
    plan_cache.save(key, g, index, UIDS, remembered)
    plan_cache.flush()
    return g


def test_a_saved_plan_is_loaded_whole_with_its_uids(cache):
    _saved(remembered="eng7_k2=1")
    files = os.listdir(cache / "cudnn-plans")
    assert files == [os.path.basename(plan_cache.path(KEY))] and files[0].endswith(".plan")
    fresh = Graph(blob=b"")
    got = plan_cache.load(KEY, lambda: fresh, ["x", "w", "y"], remembered="eng7_k2=1")
    assert got == (fresh, UIDS)
    assert fresh.given == b"PLAN:eng7_k2=1"
    assert plan_cache.stats["loaded"] == 1 and plan_cache.stats["saved"] == 1


def test_a_binding_that_takes_only_lists_is_given_one(cache):
    _saved()
    fresh = Graph(takes=list)
    assert plan_cache.load(KEY, lambda: fresh, ["x"]) == (fresh, UIDS)
    assert fresh.given == b"PLAN:eng7_k2=1"


def test_the_chosen_plan_is_made_the_candidate_before_it_is_serialised(cache):
    g = _saved(index=5)
    assert g.built == [5]           # serialize() writes the candidate: the last plan built
    g = _saved(index=None)
    assert g.built == []            # the heuristics' plan, as execute() runs it


def test_no_file_no_note(cache, caplog):
    caplog.set_level(logging.DEBUG, LOG)
    assert plan_cache.load(KEY, lambda: pytest.fail("no graph to make"), ["x"]) is None
    assert caplog.records == []


def _damage(path, how):
    data = open(path, "rb").read()
    head, _, blob = data[len(plan_cache.MAGIC):].partition(b"\n")
    meta = json.loads(head)
    if how == "truncated":
        data = data[:-3]
    elif how == "flipped":
        data = data[:-1] + bytes([data[-1] ^ 1])
    elif how == "garbage":
        data = os.urandom(64)
    elif how == "header":
        data = plan_cache.MAGIC + b"{not json\n" + blob
    elif how == "empty":
        data = b""
    else:                           # a field of the header changed: another GPU or library, another format
        meta.update(how)
        data = plan_cache.MAGIC + json.dumps(meta).encode() + b"\n" + blob
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage", "header", "empty", {"format": 0},
                                 {"key": KEY.replace("sm_90", "sm_80")}, {"uids": {"x": 1}}, {"uids": "x"}])
def test_a_damaged_or_foreign_file_is_passed_over_with_one_debug_line(cache, caplog, how):
    _saved()
    _damage(plan_cache.path(KEY), how)
    caplog.set_level(logging.DEBUG, LOG)
    made = []
    assert plan_cache.load(KEY, lambda: made.append(Graph()) or made[-1], ["x", "w", "y"]) is None
    assert not any(g.given for g in made)            # nothing reached cuDNN that was not this graph's plan
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.DEBUG
    assert "passed over" in caplog.records[0].getMessage() and "\n" not in caplog.records[0].getMessage()
    assert plan_cache.stats["passed_over"] == 1


def test_a_plan_of_an_engine_no_longer_remembered_is_stale(cache, caplog):
    _saved(remembered="eng7_k2=1")
    caplog.set_level(logging.DEBUG, LOG)
    assert plan_cache.load(KEY, Graph, ["x"], remembered="eng9") is None     # the engine file was re-timed
    assert plan_cache.load(KEY, Graph, ["x"], remembered=None) is None        # ... or removed
    assert plan_cache.load(KEY, Graph, ["x"], remembered="eng7_k2=1") is not None
    assert [r.getMessage().count("no longer") for r in caplog.records] == [1, 1]


def test_a_key_written_by_another_graph_is_never_loaded(cache):
    _saved()
    other = KEY.replace("(2, 3, 8, 8)", "(4, 3, 8, 8)")
    assert plan_cache.path(other) != plan_cache.path(KEY)
    assert plan_cache.load(other, Graph, ["x"]) is None
    os.replace(plan_cache.path(KEY), plan_cache.path(other))     # a file under another graph's name
    assert plan_cache.load(other, Graph, ["x"]) is None


def test_a_plan_cudnn_refuses_to_load_is_passed_over(cache, caplog):
    _saved()
    caplog.set_level(logging.DEBUG, LOG)
    assert plan_cache.load(KEY, lambda: Graph(refuse="CUDNN_STATUS_BAD_PARAM\nmore"), ["x"]) is None
    assert "CUDNN_STATUS_BAD_PARAM" in caplog.records[0].getMessage()
    assert "more" not in caplog.records[0].getMessage()


def test_a_loaded_graph_that_cannot_say_what_it_needs_is_passed_over(cache, caplog):
    _saved()
    caplog.set_level(logging.DEBUG, LOG)

    def wrap(g, uids):
        raise RuntimeError("get_workspace_size failed")
    assert plan_cache.load(KEY, Graph, ["x"], None, wrap) is None
    assert plan_cache.load(KEY, Graph, ["x"], None, lambda g, uids: ("ready", uids)) == ("ready", UIDS)
    assert "get_workspace_size failed" in caplog.records[0].getMessage()


def test_a_plan_cudnn_cannot_serialise_is_not_written(cache, caplog):
    caplog.set_level(logging.DEBUG, LOG)
    _saved(g=Graph(refuse="CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION Failed"))
    assert not (cache / "cudnn-plans").exists()
    assert plan_cache.stats["unserialisable"] == 1
    assert len(caplog.records) == 1 and "not kept" in caplog.records[0].getMessage()


def test_a_cache_that_cannot_be_written_costs_only_the_build(tmp_path, monkeypatch, caplog):
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path / "afile" / "cache"))
    caplog.set_level(logging.DEBUG, LOG)
    _saved()                                    # no exception
    assert plan_cache.load(KEY, Graph, ["x"]) is None
    assert (tmp_path / "afile").read_text() == ""
    assert any("not written" in r.getMessage() for r in caplog.records)


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("MINIDL_PLAN_CACHE", "0")
    assert not plan_cache.enabled()
    monkeypatch.delenv("MINIDL_PLAN_CACHE")
    assert plan_cache.enabled()


# cudnn_graphs.run with stand-ins for CuPy and the Frontend, one child process per "run" sharing a cache:
# the first builds and writes, the second loads without building, a damaged file is built again.
_RUN = textwrap.dedent("""
    import json, logging, sys, types
    from unittest import mock
    import numpy as np
    for name in ("cupy", "cupy.cuda", "cupy.cuda.compiler", "cudnn"):
        sys.modules[name] = mock.MagicMock(name=name)
    cp, fe = sys.modules["cupy"], sys.modules["cudnn"]
    cp.cuda.runtime.getDevice.return_value = 0
    cp.cuda.runtime.getDeviceProperties.return_value = {"name": b"Stand-in GPU", "major": 9, "minor": 0,
                                                        "multiProcessorCount": 132}
    cp.cuda.runtime.runtimeGetVersion.return_value = cp.cuda.runtime.driverGetVersion.return_value = 13000
    cp.cuda.get_current_stream.return_value.is_capturing.return_value = False
    fe.backend_version.return_value = 91900
    fe.__version__ = "1.20.0"
    fe.cudnnGraphNotSupportedError = type("NotSupported", (RuntimeError,), {})
    seen = {"built": 0, "deserialized": [], "packs": []}

    class Tensor:
        uids = iter(range(100, 1000))
        def __init__(self): self.uid = next(Tensor.uids)
        def get_uid(self): return self.uid
        def __getattr__(self, name): return lambda *a, **k: self

    class Graph:
        def __init__(self, **kw): pass
        def tensor(self, **kw): return Tensor()
        def conv_fprop(self, **kw): return Tensor()
        def build_plans(self, policy): seen["built"] += 1
        def serialize(self): return list(b"PLAN")
        def deserialize(self, data): seen["deserialized"].append(bytes(data).decode())
        def get_workspace_size(self): return 0
        def execute(self, pack, ws, handle=None): seen["packs"].append(sorted(pack))
        def __getattr__(self, name): return lambda *a, **k: None
    fe.pygraph = Graph

    from minidl.kernels.gpu import cudnn_graphs as cudnn, engines, plan_cache
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s: %(message)s")
    engines.set_autotune(False)
    cudnn.handle = lambda dev=None: 1
    cudnn.workspace = lambda size: 0

    class Array:
        def __init__(self, shape, ptr):
            self.shape, self.ndim, self.dtype, self._c_contiguous = shape, len(shape), np.dtype(np.float32), True
            self.data = types.SimpleNamespace(ptr=ptr)

    def build(g, io):
        io.output("y", g.conv_fprop(image=io.input("x"), weight=io.input("w")))

    arrays = dict(x=Array((2, 3, 8, 8), 256), w=Array((4, 3, 3, 3), 512), y=Array((2, 4, 6, 6), 768))
    cudnn.run("conv_fprop", arrays, build, extra=((1, 1), (1, 1)), conv=True)
    plan_cache.flush()
    print(json.dumps(dict(seen, stats=dict(plan_cache.stats))))
""")


def _run(cache):
    env = dict(os.environ, MINIDL_CACHE=str(cache), PYTHONPATH=os.getcwd())
    p = subprocess.run([sys.executable, "-c", _RUN], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_a_second_process_loads_the_plan_instead_of_building_and_a_damaged_one_is_rebuilt(tmp_path):
    first, _ = _run(tmp_path)
    assert first["built"] == 1 and first["deserialized"] == [] and first["stats"]["saved"] == 1
    second, _ = _run(tmp_path)
    assert second["built"] == 0 and second["deserialized"] == ["PLAN"]
    assert second["packs"] == first["packs"]                  # executed with the uids the build gave
    (plan,) = (tmp_path / "cudnn-plans").iterdir()
    plan.write_bytes(plan.read_bytes()[:-2])
    third, log = _run(tmp_path)
    assert third["built"] == 1 and third["deserialized"] == [] and third["packs"] == first["packs"]
    assert [line for line in log.splitlines() if "passed over" in line] != []
    fourth, _ = _run(tmp_path)                                 # the rebuilt plan replaced the damaged file
    assert fourth["built"] == 0 and fourth["deserialized"] == ["PLAN"]
