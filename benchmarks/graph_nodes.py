"""The nodes of a captured CUDA graph, counted by type through the driver (libcuda's cuGraphGetNodes and
cuGraphNodeGetType, child graphs opened): how many kernels a captured step launches, with no profiler."""
from __future__ import annotations

import collections
import ctypes

# CUgraphNodeType
KINDS = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
         7: "event_record"}


def _check(status, what):
    if status != 0:
        raise RuntimeError(f"{what} failed with CUresult {status}")


def graph_nodes(graph) -> collections.Counter:
    """{kind: count} of a cupy.cuda.graph.Graph's nodes (its `graph` handle), a child graph's counted
    inside it."""
    return _count(ctypes.CDLL("libcuda.so.1"), ctypes.c_void_p(graph.graph))


def _count(cuda, handle):
    n = ctypes.c_size_t(0)
    _check(cuda.cuGraphGetNodes(handle, None, ctypes.byref(n)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * max(n.value, 1))()
    _check(cuda.cuGraphGetNodes(handle, nodes, ctypes.byref(n)), "cuGraphGetNodes")
    out: collections.Counter = collections.Counter()
    kind = ctypes.c_int(0)
    for node in nodes[:n.value]:
        node = ctypes.c_void_p(node)
        _check(cuda.cuGraphNodeGetType(node, ctypes.byref(kind)), "cuGraphNodeGetType")
        if kind.value == 4:
            child = ctypes.c_void_p()
            _check(cuda.cuGraphChildGraphNodeGetGraph(node, ctypes.byref(child)), "cuGraphChildGraphNodeGetGraph")
            out.update(_count(cuda, child))
        else:
            out[KINDS.get(kind.value, str(kind.value))] += 1
    return out
