"""The one module that imports cuDNN: handles, the graph cache, call counters, workspaces, TF32.

Kernel families describe a graph (`build(g, io)`) and the arrays it runs on; `run` builds it once per
(op, shapes, dtypes, pointer alignment, extra), or loads its built plan (gpu/plan_cache.py: `serialize`,
`deserialize`), and executes it on CuPy's current stream.

What the cuDNN Frontend 1.20 Python API does (read from the wheel's bindings and NVIDIA's tests):
- `cudnn.pygraph(handle=, io_data_type=, intermediate_data_type=, compute_data_type=)`;
  `g.tensor(name=, dim=, stride=, data_type=, is_pass_by_value=)`; outputs need `set_output(True)`.
- ops: `conv_fprop(image, weight, pre_padding, post_padding, stride, dilation, compute_data_type)`,
  `conv_dgrad(loss, filter, ...)`, `conv_wgrad(image, loss, ...)` (cross-correlation, as PyTorch);
  `bias(input, bias)`; `batchnorm(input, scale, bias, in_running_mean, in_running_var, epsilon,
  momentum) -> (y, mean, inv_variance, next_running_mean, next_running_var)`;
  `batchnorm_inference(input, mean, inv_variance, scale, bias)` (takes 1/sqrt(var+eps), not var);
  `batchnorm_backward(grad, input, scale, mean, inv_variance) -> (dx, dscale, dbias)` (overwrites).
- building: validate, build_operation_graph, create_execution_plans([heur modes]), optional
  deselect_*_notes, check_support, build_plans; `get_workspace_size()` after that.
- `execute({uid: pointer}, workspace, handle=)`: int pointers go straight through (anything else
  through `cudnn.datatypes`, which imports torch): device pointers are `arr.data.ptr`, host scalars
  (pass-by-value: epsilon, momentum) NumPy arrays' `ctypes.data`, read when `execute` enqueues.
- `set_stream(handle=, stream=)` binds the handle to a raw stream; we re-bind whenever CuPy's
  current stream changes, so CuPy stream capture (CUDA graphs) records the executes.
- TF32: no math-mode switch in the Python API. FP32 engines on TF32 tensor cores carry the note
  TENSOR_CORE: `set_tf32(False)` deselects them (and DOWN_CONVERT_INPUTS ones), as PyTorch filters
  cuDNN v8 engines without allow_tf32. On by default for convolutions (about 1e-3 relative error);
  NVIDIA_TF32_OVERRIDE=0 disables TF32 process-wide (cuDNN and cuBLAS) whatever `set_tf32` says.
- float16/bfloat16: HALF/BFLOAT16 io, FLOAT intermediate and compute types (conv_bias_relu_fprop's
  bias and ReLU run on float virtual tensors; only y is rounded); no TF32 question. Engines noted
  REDUCED_PRECISION_REDUCTION are deselected (one autotuned float16 dgrad was far off otherwise).
- float64: DOUBLE io, intermediate and compute types, never an engine that DOWN_CONVERT_INPUTS;
  whether this cuDNN has the engines is asked at build (conv.dtype_problem), not assumed.
- engines found lacking (FP32, NCHW; docs/kernels.md): batchnorm and batchnorm_backward need C a
  multiple of their vector width, batchnorm_inference had none: norm.py catches `Unsupported`.
- pointer alignment: cuDNN assumes 16 bytes; a less aligned parameter view into the flat arena gets
  `set_alignment` and its own graph (the arena aligns each parameter to 256 bytes: fast engines).
"""
from __future__ import annotations
import collections
from typing import Any, Callable

import cupy as cp
import numpy as np
from ..._types import Array, DTypeLike
from . import _cuda, engines, frontend, plan_cache
from ._dtypes import CUDNN

_fe = frontend.load()             # the cuDNN Frontend, without the PyTorch it would import

calls: collections.Counter[str] = collections.Counter()   # op name -> executes, so tests can assert the cuDNN path ran
_state = {"tf32": True, "deterministic": True}
_handles: dict[int, list] = {}  # device id -> [handle, stream pointer it is bound to]
_graphs: dict[tuple, Any] = {}  # full key -> _Graph
_workspaces: dict[int, list] = {}  # device id -> workspace buffers, the last one the largest
_DT = {dtype: getattr(_fe.data_type, name) for dtype, name in CUDNN.items()}
_HEUR = [_fe.heur_mode.A, _fe.heur_mode.FALLBACK]


def set_tf32(on: bool) -> None:
    """Allow (True, the default) or forbid TF32 tensor-core math in FP32 convolutions."""
    _state["tf32"] = bool(on)


def set_deterministic(on: bool) -> None:
    """Use only engines whose reductions have a fixed order (the default), or any engine."""
    _state["deterministic"] = bool(on)


def tf32_enabled() -> bool:
    return _state["tf32"]


def deterministic_only() -> bool:
    return _state["deterministic"]


def compute_type(dtype: DTypeLike) -> Any:
    """cuDNN's compute type for arrays of `dtype`: DOUBLE for float64 (cuDNN's double engines compute
    in double throughout), else FLOAT."""
    return _fe.data_type.DOUBLE if dtype == np.float64 else _fe.data_type.FLOAT


def version() -> int:
    return _fe.backend_version()


def handle(dev: int | None = None) -> Any:
    """This device's cuDNN handle, bound to CuPy's current stream."""
    dev = cp.cuda.runtime.getDevice() if dev is None else dev
    h = _handles.get(dev)
    if h is None:
        _cuda.prefetch()          # the first cuDNN call of a step: CUDA modules compile meanwhile
        h = _handles[dev] = [_fe.create_handle(), None]
    stream = cp.cuda.get_current_stream().ptr
    if h[1] != stream:
        _fe.set_stream(handle=h[0], stream=stream)
        h[1] = stream
    return h[0]


def _align(ptr):
    return min(ptr & -ptr, 16) if ptr else 16


def _strides(dim, a, cl):
    """The strides (in elements) of `a` seen as `dim`: packed, or NHWC in a channels-last graph
    (`cl`) for a 4-D array that lies in that order (C = 1 or 1x1 ones lie in both, filters too:
    a 1x1 filter is then KRSC); statistics and (C,) vectors stay packed."""
    nhwc = cl and len(dim) == 4 and a.ndim == 4 and a.shape == tuple(dim) and a.transpose(0, 2, 3, 1)._c_contiguous
    order = (0, 2, 3, 1) if nhwc else range(len(dim))
    st, acc = [0] * len(dim), 1
    for i in reversed(list(order)):
        st[i] = acc
        acc *= dim[i]
    return st


def _cl(a):
    return not a._c_contiguous and a.transpose(0, 2, 3, 1)._c_contiguous


class Unsupported(RuntimeError):
    """cuDNN has no engine for this graph (op, shapes, layout); remembered per key."""


class _IO:
    """Hands a graph builder the tensors matching the arrays it will run on."""

    def __init__(self, g, arrays, cl):
        self.g, self.arrays, self.cl, self.tensors = g, arrays, cl, {}

    def input(self, name, dim=None):
        a = self.arrays[name]
        dim = list(dim or a.shape)
        t = self.g.tensor(name=name, dim=dim, stride=_strides(dim, a, self.cl), data_type=_DT[a.dtype])
        if _align(a.data.ptr) < 16:
            t.set_alignment(_align(a.data.ptr))
        self.tensors[name] = t
        return t

    def scalar(self, name):
        """A host float32 scalar read at execute time (epsilon, momentum)."""
        t = self.g.tensor(name=name, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1],
                          data_type=_fe.data_type.FLOAT, is_pass_by_value=True)
        self.tensors[name] = t
        return t

    def output(self, name, t, dim=None):
        a = self.arrays[name]
        dim = list(dim or a.shape)
        t.set_output(True)
        t.set_data_type(_DT[a.dtype])
        t.set_dim(dim)
        t.set_stride(_strides(dim, a, self.cl))
        if _align(a.data.ptr) < 16:
            t.set_alignment(_align(a.data.ptr))
        self.tensors[name] = t
        return t


class _Graph:
    def __init__(self, g, uids, index=None, built=None):
        self.g = g
        self.uids = uids                # tensor name -> uid, what execute's pack is keyed by
        self.built = built              # the candidates engines.build_candidates built, for choose
        self.index = None               # the plan engines.choose kept; None: the heuristics' first
        self.use_plan(index)

    def use_plan(self, index):
        self.index = index
        self.workspace_size = self.g.get_workspace_size() if index is None else \
            self.g.get_workspace_size_plan_at_index(index)

    def execute(self, pack, handle):
        ws = workspace(self.workspace_size)        # asked each time: a later graph may have grown it
        if self.index is None:
            self.g.execute(pack, ws, handle=handle)
        else:
            self.g.execute_plan_at_index(pack, ws, index=self.index, handle=handle)


def workspace(size: int) -> int:
    """A pointer to at least `size` bytes of the one cuDNN workspace of this device.

    Graphs run one after another on one stream, so they share it. It grows to a new buffer of
    at least twice the size; an old buffer is freed unless a CUDA graph captured an execute on it
    (the graph keeps its address), so what stays is under twice the largest workspace.
    """
    held = _workspaces.setdefault(cp.cuda.runtime.getDevice(), [])
    if not held or held[-1][0].nbytes < size:
        nbytes = max(size, 2 * held[-1][0].nbytes if held else 1)
        held[:] = [w for w in held if w[1]] + [[cp.empty(nbytes, np.uint8), False]]
    return held[-1][0].data.ptr


def _pin_workspace(dev):
    """An execute is being captured: the current workspace must outlive the CUDA graph."""
    _workspaces[dev][-1][1] = True


def _io_type(arrays):
    """The graph's io type: DOUBLE if any array is float64, else HALF/BFLOAT16 if any is 2-byte, else FLOAT."""
    dtypes = {a.dtype for a in arrays.values()}
    if np.dtype(np.float64) in dtypes:
        return _fe.data_type.DOUBLE
    half = [d for d in dtypes if d.itemsize == 2 and d in _DT]
    return _DT[half[0]] if half else _fe.data_type.FLOAT


def _build(op, arrays, build, tf32, conv, deterministic, double, cl, tune_key=None):
    """The graph with the heuristics' plan built, or with tune_key (engines.choose's key) the plan
    remembered on disk for it, else the heuristics' first candidates (engines.topk(); 0: every
    plan) for engines.choose to time."""
    io_dt = _io_type(arrays)
    dt = _fe.data_type.DOUBLE if double else _fe.data_type.FLOAT       # intermediates and compute
    g = _fe.pygraph(handle=handle(), io_data_type=io_dt, intermediate_data_type=dt, compute_data_type=dt)
    io = _IO(g, arrays, cl)
    build(g, io)
    try:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans(_HEUR)
        # Two runs with one seed must agree bit for bit: no engines that reduce with atomics.
        notes = [_fe.numerical_note.NONDETERMINISTIC] if deterministic else []
        if double:                 # a float64 graph computes in double: FP64 tensor cores yes, down-conversion no
            notes += [_fe.numerical_note.DOWN_CONVERT_INPUTS]
        elif io_dt != _fe.data_type.FLOAT:  # half graphs: tensor cores yes, sums in half no
            notes += [_fe.numerical_note.REDUCED_PRECISION_REDUCTION]
        elif conv and not tf32:
            notes += [_fe.numerical_note.TENSOR_CORE, _fe.numerical_note.DOWN_CONVERT_INPUTS]
        if notes:
            g.deselect_numeric_notes(notes)
        g.check_support()
        index = None if tune_key is None else engines.build_remembered(g, tune_key)
        built = None
        if index is None and tune_key and engines.topk():
            rtc = _fe.behavior_note.RUNTIME_COMPILATION      # cuDNN compiles such a plan when it is built
            behaviour = g.get_behavior_notes_for_plan_at_index
            built = engines.build_candidates(g, engines.topk(), lambda i: rtc in behaviour(i))
        elif index is None:
            g.build_plans(_fe.build_plan_policy.ALL if tune_key else _fe.build_plan_policy.HEURISTICS_CHOICE)
    except (_fe.cudnnGraphNotSupportedError, RuntimeError) as e:   # no engine, or check_support said no
        shapes = {k: a.shape for k, a in arrays.items()}
        raise Unsupported(f"cuDNN has no engine for {op} on {shapes} (tf32={tf32}): {str(e).splitlines()[0]}") from e
    return _Graph(g, {name: t.get_uid() for name, t in io.tensors.items()}, index, built)


def run(op: str, arrays: dict[str, Array], build: Callable[[Any, Any], None], scalars: dict[str, float] | None = None,
        extra: tuple = (), conv: bool = False) -> None:
    """Execute graph `op` on `arrays` (name -> CuPy array, inputs and outputs alike: C-contiguous,
    or 4-D channels-last, given to cuDNN as NHWC strides).

    `build(g, io)` describes the graph on first use; `scalars` (name -> float) feed pass-by-value
    tensors; `extra` is whatever else the graph depends on (padding, stride...); `conv` graphs obey
    set_tf32 (float32 ones: a graph on float64 arrays is built and computed in double). Raises
    Unsupported (at once on later calls) where cuDNN has no engine for the graph.
    """
    ptrs, layout = {}, []
    for k, a in arrays.items():
        if not a._c_contiguous:
            if a.ndim != 4 or not _cl(a):
                raise ValueError(f"{op}: {k} must be C-contiguous or channels-last, got strides {a.strides}")
            layout.append(k)
        ptrs[k] = a.data.ptr
    double = any(a.dtype == np.float64 for a in arrays.values())
    half = any(a.dtype.itemsize == 2 for a in arrays.values())
    tf32 = conv and _state["tf32"] and not double and not half      # TF32 is a float32 convolution's choice
    dev = cp.cuda.runtime.getDevice()
    det = _state["deterministic"]
    key = (op, dev, tf32, det, extra, tuple(layout)) + tuple((k, a.shape, a.dtype.char, _align(ptrs[k]))
                                                             for k, a in arrays.items())
    gr = _graphs.get(key, _graphs)
    tune = conv and engines.autotune_enabled()     # convolutions are pure: timing them is harmless
    if gr is _graphs:
        tune_key = _disk_key(key, dev) if tune else None
        machine = plan_cache.enabled() and plan_cache.machine(dev, version(), getattr(_fe, "__version__", "?"))
        pkey = machine and plan_cache.key(machine, key[:1] + key[2:], tune)
        gr = pkey and plan_cache.load(pkey, lambda: _fe.pygraph(handle=handle()), [*arrays, *(scalars or ())],
                                      tune_key and engines.remembered(tune_key), _Graph)
        if gr:                          # the built plan loaded whole (gpu/plan_cache.py)
            _graphs[key] = gr
        else:
            try:
                gr = _graphs[key] = _build(op, arrays, build, tf32, conv, det, double, bool(layout), tune_key)
            except Unsupported:
                _graphs[key] = None
                raise
            if tune and gr.index is None:
                pack = {gr.uids[k]: p for k, p in ptrs.items()}
                gr.use_plan(engines.choose(gr.g, _disk_key(key, dev), pack, lambda: handle(dev), workspace, gr.built))
            if pkey and not cp.cuda.get_current_stream().is_capturing():   # settled untimed: not kept
                plan_cache.save(pkey, gr.g, gr.index, gr.uids, tune_key and engines.remembered(tune_key))
    if gr is None:
        raise Unsupported(f"cuDNN has no engine for {op} on {[a.shape for a in arrays.values()]}")
    uids = gr.uids
    pack = {uids[k]: p for k, p in ptrs.items()}
    host = [np.full((1, 1, 1, 1), v, np.float32) for v in scalars.values()] if scalars else ()
    for k, h in zip(scalars or (), host):      # kept alive in `host` until execute has read them
        pack[uids[k]] = h.ctypes.data
    gr.execute(pack, handle(dev))
    if cp.cuda.get_current_stream().is_capturing():
        _pin_workspace(dev)
    calls[op] += 1


def _disk_key(key, dev):
    """The graph's key for the engine cache on disk: which GPU and cuDNN, then the graph itself."""
    gpu = cp.cuda.runtime.getDeviceProperties(dev)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
    return repr((gpu, version()) + key[:1] + key[2:])
