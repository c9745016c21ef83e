"""Built cuDNN plans kept on disk, so a warm process loads each graph's plan instead of rebuilding it.

A warm process used to rebuild every graph from the engine remembered for it (gpu/engines.py):
describe the graph, validate it, ask the heuristics, check support, finalise the plan; cuDNN
compiles a plan of a runtime-compiled engine again with NVRTC. ResNet-50's warm start spent 2.0 of
4.6 s there (issue 42). The cuDNN Frontend serialises a built graph: `pygraph.serialize()` (1.20,
python/pygraph/pygraph.cpp) returns the graph's description, the JSON of the plan it would run
(`plans.candidate`: the last plan built, or the heuristics' first) and its tensors' uids, as a list
of byte values; `pygraph.deserialize(sequence_of_bytes)` on a graph made with a handle loads that
plan without heuristics or checks (a `str` would be read as a graph description without a plan, and
pybind11 refuses `bytes` for it: `_deserialize`). NVIDIA documents serialisation for runtime-compiled
engines and a GPU identical to the one that built the plan; where cuDNN cannot serialise a plan
`serialize` raises and the graph is simply built the next time, as before.

One file a graph, `$MINIDL_CACHE/cudnn-plans/<sha256 of the key>.plan`: a magic line, one JSON line
(format, the full key, the tensors' uids, the engine name remembered when it was written, size and
sha256 of the plan), then the plan. The key names everything a plan is valid for: the GPU (name,
compute capability, SM count), the cuDNN, Frontend, CUDA runtime and driver versions, and the graph
(op, shapes, dtypes, layout, pointer alignment, TF32, determinism, whether engines are timed). A file
that is of another format or key (a copied cache, another GPU), damaged, whose remembered engine is
no longer the remembered one, or that cuDNN refuses to load, is passed over with one debug line and
the graph is built; its new plan replaces the file. Files are written through `minidl.files` on one
thread of their own (2 ms each with the fsyncs: ResNet-50 has about 300 graphs), finished when the
process exits. MINIDL_PLAN_CACHE=0 turns it off.
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Collection
from typing import Any

from ... import files

FORMAT = 1
MAGIC = b"minidl cudnn plan\n"
stats: collections.Counter[str] = collections.Counter()   # loaded, saved, passed over, unserialisable, seconds
_log = logging.getLogger(__name__)
_writer: list[concurrent.futures.ThreadPoolExecutor] = []
_pending: list[concurrent.futures.Future] = []
_machines: dict[int, tuple | None] = {}     # device id -> machine(), asked once


def enabled() -> bool:
    return os.environ.get("MINIDL_PLAN_CACHE", "1") != "0"


def folder() -> str:
    return os.path.join(files.cache_dir(), "cudnn-plans")


def machine(dev: int, cudnn_version: int, frontend_version: str) -> tuple | None:
    """What of GPU `dev` and the libraries a built plan is valid for: the GPU's name, compute
    capability and SM count (a MIG slice has fewer), the cuDNN, Frontend, CUDA runtime and driver
    versions (a runtime-compiled plan may hold PTX an older driver cannot load); None (no plan
    cache) where CUDA cannot say."""
    if dev not in _machines:
        try:
            import cupy as cp           # here: the rest of this file is host logic, tested without CuPy
            p = cp.cuda.runtime.getDeviceProperties(dev)
            name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
            _machines[dev] = (name, f"sm_{p['major']}{p['minor']}", p["multiProcessorCount"], cudnn_version,
                              frontend_version, cp.cuda.runtime.runtimeGetVersion(),
                              cp.cuda.runtime.driverGetVersion())
        except Exception as e:          # noqa: BLE001  no plan cache rather than no run
            _log.debug("cuDNN plan cache off: %s", e)
            _machines[dev] = None
    return _machines[dev]


def key(machine: tuple, graph: tuple, timed: bool) -> str:
    """A plan's key: `machine` (GPU name, compute capability, SMs, cuDNN, Frontend and CUDA versions),
    `graph` (op, TF32, determinism, extra, layout, and each array's name, shape, dtype and alignment)."""
    return repr(("plan", FORMAT) + tuple(machine) + tuple(graph) + (("timed", bool(timed)),))


def path(key: str) -> str:
    """The file of the plan for `key` (the name: a hash; the key itself is inside the file)."""
    return os.path.join(folder(), hashlib.sha256(key.encode()).hexdigest()[:40] + ".plan")


def encode(key: str, blob: bytes, uids: dict[str, int], remembered: str | None) -> bytes:
    head = {"format": FORMAT, "key": key, "uids": uids, "remembered": remembered,
            "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
    return MAGIC + json.dumps(head, sort_keys=True).encode() + b"\n" + blob


def decode(data: bytes, key: str, names: Collection[str], remembered: str | None) -> tuple[bytes, dict[str, int]]:
    """(plan, uids) from a file's bytes; ValueError saying why it is not this graph's plan."""
    if not data.startswith(MAGIC):
        raise ValueError("not a plan file")
    line, sep, blob = data[len(MAGIC):].partition(b"\n")
    try:
        head = json.loads(line) if sep else None
    except ValueError:
        head = None
    if not isinstance(head, dict):
        raise ValueError("damaged header")
    if head.get("format") != FORMAT:
        raise ValueError(f"format {head.get('format')!r}, not {FORMAT}")
    if head.get("key") != key:
        raise ValueError("written for another GPU, library or graph")
    if head.get("size") != len(blob) or head.get("sha256") != hashlib.sha256(blob).hexdigest():
        raise ValueError("damaged plan")
    uids = head.get("uids")
    if not isinstance(uids, dict) or not all(isinstance(u, int) for u in uids.values()) or set(names) - set(uids):
        raise ValueError("its tensors are not the graph's")
    if head.get("remembered") != remembered:
        raise ValueError(f"its engine {head.get('remembered')!r} is no longer the one remembered ({remembered!r})")
    return blob, uids


def load(key: str, make_graph: Callable[[], Any], names: Collection[str], remembered: str | None = None,
         wrap: Callable[[Any, dict[str, int]], Any] = lambda g, uids: (g, uids)) -> Any:
    """wrap(graph, uids): the graph for `key` with its plan loaded from disk, or None (one debug line)
    where there is none to load. make_graph() -> an empty Frontend graph on this process's handle;
    names: the tensors the caller will pass; remembered: the engine name gpu/engines.py remembers for
    the graph now (None where it is not timed), which the file must have been written with; wrap may
    ask the loaded graph what it needs (its workspace): where that fails, the plan is passed over too."""
    t = time.perf_counter()
    file = path(key)
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError:
        return None                     # not built before (or not readable): built now, no note
    try:
        blob, uids = decode(data, key, names, remembered)
        got = wrap(_deserialize(make_graph, blob), uids)
    except Exception as e:              # noqa: BLE001  stale, foreign, damaged, or refused by cuDNN
        stats["passed_over"] += 1
        _log.debug("cuDNN plan %s passed over (%s); the graph is built again", os.path.basename(file),
                   str(e).splitlines()[0] if str(e) else type(e).__name__)
        return None
    stats["loaded"] += 1
    stats["load_s"] += time.perf_counter() - t     # type: ignore[assignment]  # a Counter holds seconds too
    return got


def _deserialize(make_graph, blob):
    """A new graph with `blob` loaded. The binding casts its argument to std::vector<uint8_t>, which
    pybind11 2.13 does from a sequence of ints but not from bytes (and a str would be read as a graph
    description): a bytearray, a sequence without a Python int per byte; a list where it is refused."""
    g = make_graph()
    try:
        g.deserialize(bytearray(blob))
    except Exception as e:
        if "Unable to cast" not in str(e):      # pybind11's cast_error, raised before cuDNN is called
            raise
        g = make_graph()
        g.deserialize(list(blob))
    return g


def save(key: str, g: Any, index: int | None, uids: dict[str, int], remembered: str | None) -> None:
    """Serialise the plan graph `g` runs (plan `index`, or its candidate where None) and write it for
    `key` on the writer thread; where cuDNN cannot serialise it, one debug line and nothing written."""
    t = time.perf_counter()
    try:
        if index is not None:
            g.build_plan_at_index(index)   # built already: this makes it the candidate serialize() writes
        blob = bytes(g.serialize())
    except Exception as e:              # noqa: BLE001  an engine cuDNN cannot serialise
        stats["unserialisable"] += 1
        _log.debug("cuDNN plan not kept: %s", str(e).splitlines()[0] if str(e) else type(e).__name__)
        return
    data = encode(key, blob, uids, remembered)
    stats["save_s"] += time.perf_counter() - t     # type: ignore[assignment]
    if not _writer:
        _writer.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="minidl-plans"))
    _pending[:] = [f for f in _pending if not f.done()]
    _pending.append(_writer[0].submit(_write, path(key), data))


def _write(file, data):
    try:
        files.write_atomic(file, lambda f: f.write(data))
        stats["saved"] += 1
    except Exception as e:              # noqa: BLE001  a read-only cache, another rank writing it: built next time
        _log.debug("cuDNN plan not written: %s", e)


def flush() -> None:
    """Wait for the plans queued to be written (the writer thread also finishes them at exit)."""
    while _pending:
        _pending.pop(0).result()
