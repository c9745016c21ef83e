"""python benchmarks/trial_nvmath.py [--calls 1000] [--replays 1000] [--dtypes float32 bfloat16] [--json FILE]:
nvmath-python's cuBLAS and cuBLASLt bindings tried against minidl's ctypes ones (issue 40).

minidl binds cuBLAS (kernels/gpu/_cublas.py: the dense layers' GEMMs) and cuBLASLt (_cublaslt.py: one GEMM
with the bias and the ReLU in its epilogue) through ctypes, with every enum value written by hand. This trial
runs the same GEMMs through `nvmath.bindings.cublas` and `nvmath.bindings.cublasLt`, laid out and cached as
minidl lays them out, at the dense layers' shapes (LeNet's 400->120->84->10 at batch 32 and 256, ResNet-50's
2048->1000 head at 256), in float32 (full FP32) and bfloat16, and prints one line a check, `holds` or
`fails (why)`, then the decision that docs/kernels.md's rule gives ("cuBLAS bindings: nvmath-python trial").

The checks: `import` (and what nvmath's import loads), `enums` (minidl's hand-written values against nvmath's),
`lt-results` / `gemm-results` (the same outputs, bit for bit where the same algorithm runs, and both near a
float64 reference), `lt-capture` / `gemm-capture` (recorded in a CuPy stream capture, replayed on new inputs),
`no-alloc` (no device memory taken per call), `host-overhead` (eager, host time per call), `graph-time` (a
replayed graph's time), `library` (one libcublasLt and one libcublas in the process). A check that raises
fails with the error in one line; the trial goes on with the next.

It installs nothing. On the device, from the repository root:

    . .device/env.sh
    python3 -m pip install -q --no-index --no-deps --target /tmp/nvm .device/nvmath-wheels/*.whl
    PYTHONPATH=/tmp/nvm:$PYTHONPATH python3 benchmarks/trial_nvmath.py --json $OUT/trial_nvmath.json

Exit 0 when every check holds, 1 when one fails, 2 (one line) without CuPy or a GPU.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# (name, batch M, inputs C, outputs K): the dense layers minidl's zoo trains
SHAPES = tuple((f"lenet-fc{i}-b{m}", m, c, k) for m in (32, 256) for i, (c, k) in
               enumerate(((400, 120), (120, 84), (84, 10)), 1)) + (("resnet50-fc-b256", 256, 2048, 1000),)
DTYPES = ("float32", "bfloat16")
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}     # max |y - reference| / max |reference|; bf16 rounds y
OVERHEAD = 1.10                                     # nvmath may cost at most 10% more host time per call


class Unsupported(RuntimeError):
    """cuBLASLt's heuristics found no algorithm for this GEMM (as minidl's _cublaslt.Unsupported)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python benchmarks/trial_nvmath.py", description=__doc__.splitlines()[1])
    p.add_argument("--calls", type=int, default=1000, help="eager calls timed per case (default 1000)")
    p.add_argument("--replays", type=int, default=1000, help="graph replays timed per case (default 1000)")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--json", metavar="FILE", help="write every check's cases and figures to FILE")
    args = p.parse_args(argv)
    for flag in ("calls", "replays"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    return args


def gpu_missing() -> str | None:
    """Why the trial cannot run here (no CuPy, no CUDA device), or None."""
    try:
        import cupy
    except Exception as e:  # noqa: BLE001  a broken install raises more than ImportError
        return f"needs CuPy and a GPU: {type(e).__name__}: {e}"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception as e:  # noqa: BLE001  no driver: CUDA errors surface as several types
        return f"needs a CUDA device: {type(e).__name__}: {e}"
    return "needs a CUDA device"


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0][:300]


class Checks:
    """Each check's cases: (case, holds, why, figures); a case that raises fails with its error."""

    def __init__(self) -> None:
        self.rows: dict[str, list[dict[str, Any]]] = {}

    def run(self, check: str, case: str, fn: Callable[[], tuple[bool, str, dict]]) -> dict[str, Any]:
        try:
            holds, why, figures = fn()
        except Exception as e:  # noqa: BLE001  the trial reports every failure and goes on
            holds, why, figures = False, one_line(e), {}
        row = {"case": case, "holds": bool(holds), "why": why, **figures}
        self.rows.setdefault(check, []).append(row)
        print(f"  {check:<13} {case:<34} {'holds' if holds else 'FAILS'}  {why}", flush=True)
        return row

    def summary(self) -> list[str]:
        lines = []
        for check, rows in self.rows.items():
            bad = [r for r in rows if not r["holds"]]
            if bad:
                lines.append(f"check {check}: fails ({len(bad)} of {len(rows)}; {bad[0]['case']}: {bad[0]['why']})")
            else:
                lines.append(f"check {check}: holds ({len(rows)} case{'s' * (len(rows) > 1)})")
        return lines

    def failing(self) -> list[str]:
        return [c for c, rows in self.rows.items() if any(not r["holds"] for r in rows)]


def _ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def _set(fn: Callable, obj: int, attr: int, value: Any, dtype: Any) -> None:
    buf = np.array([value], dtype)
    fn(obj, int(attr), _ptr(buf), buf.nbytes)


def _alignment(ptr: int) -> int:
    return min(ptr & -ptr, 256) if ptr else 256


class NvLt:
    """y = act(x wᵀ + b) through nvmath.bindings.cublasLt, planned, cached and called as minidl's
    _cublaslt.matmul does it (same layouts, preference, heuristic, per-call bias pointer), so that the two
    differ in their bindings alone."""

    def __init__(self, nvmath: Any, workspace: Any) -> None:
        from nvmath.bindings import cublas, cublasLt
        self.lt, self.cb, self.ws, self.handle = cublasLt, cublas, workspace, cublasLt.create()
        dt = nvmath.CudaDataType
        self.types = {np.dtype(np.float32): int(dt.CUDA_R_32F), np.dtype("float16"): int(dt.CUDA_R_16F)}
        try:
            import ml_dtypes
            self.types[np.dtype(ml_dtypes.bfloat16)] = int(dt.CUDA_R_16BF)
        except ImportError:
            pass
        self.r32f, self.plans = int(dt.CUDA_R_32F), {}  # type: int, dict[tuple, tuple]
        self.bias_attr = int(cublasLt.MatmulDescAttribute.BIAS_POINTER)
        self.one, self.zero = np.ones(1, np.float32), np.zeros(1, np.float32)
        self.one_ptr, self.zero_ptr = _ptr(self.one), _ptr(self.zero)
        self.last: tuple | None = None          # the plan of the last call (lt_results reads its algorithm)

    def plan(self, M, K, C, dtype, relu, bias, tf32, aligns):
        lt, cb = self.lt, self.cb
        A, E, P = lt.MatmulDescAttribute, lt.Epilogue, lt.MatmulPreferenceAttribute
        ct = cb.ComputeType.COMPUTE_32F_FAST_TF32 if tf32 and dtype == np.float32 else cb.ComputeType.COMPUTE_32F
        desc = lt.matmul_desc_create(int(ct), self.r32f)
        _set(lt.matmul_desc_set_attribute, desc, A.TRANSA, 1, np.int32)
        _set(lt.matmul_desc_set_attribute, desc, A.TRANSB, 0, np.int32)
        epilogue = (E.RELU_BIAS if relu else E.BIAS) if bias else (E.RELU if relu else E.DEFAULT)
        _set(lt.matmul_desc_set_attribute, desc, A.EPILOGUE, int(epilogue), np.uint32)
        if bias:                                      # before the heuristics, as minidl: they read its alignment
            _set(lt.matmul_desc_set_attribute, desc, A.BIAS_POINTER, bias, np.uint64)
        t = self.types[np.dtype(dtype)]
        layouts = [lt.matrix_layout_create(t, r, c, r) for r, c in ((C, K), (C, M), (K, M))]
        pref = lt.matmul_preference_create()
        _set(lt.matmul_preference_set_attribute, pref, P.MAX_WORKSPACE_BYTES, self.ws.nbytes, np.uint64)
        for attr, align in zip((P.MIN_ALIGNMENT_A_BYTES, P.MIN_ALIGNMENT_B_BYTES, P.MIN_ALIGNMENT_C_BYTES,
                                P.MIN_ALIGNMENT_D_BYTES), aligns):
            _set(lt.matmul_preference_set_attribute, pref, attr, align, np.uint32)
        result, found = np.zeros(1, lt.matmul_heuristic_result_dtype), np.zeros(1, np.int32)
        a, b, cd = layouts
        try:
            lt.matmul_algo_get_heuristic(self.handle, desc, a, b, cd, cd, pref, 1, _ptr(result), _ptr(found))
        except lt.cuBLASLtError as e:
            raise Unsupported(f"no algorithm ({e})") from e
        if found[0] < 1:
            raise Unsupported(f"cuBLASLt has no algorithm for {M}x{C} by {C}x{K} ({np.dtype(dtype).name})")
        bias_ptr = np.zeros(1, np.uint64)             # the bias pointer the descriptor copies at each call
        return desc, layouts, result, bias_ptr, _ptr(bias_ptr), _ptr(result)

    def __call__(self, x, w, y, b=None, relu=False, tf32=False):
        import cupy as cp
        (M, C), K = x.shape, w.shape[0]
        aligns = tuple(_alignment(a.data.ptr) for a in (w, x, y, y))
        key = (cp.cuda.runtime.getDevice(), M, K, C, x.dtype.char, relu,
               None if b is None else _alignment(b.data.ptr), bool(tf32), aligns)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self.plan(M, K, C, x.dtype, relu, None if b is None else b.data.ptr, tf32,
                                               aligns)
        self.last = plan
        desc, (a, bl, cd), _, bias_ptr, bias_addr, algo = plan
        if b is not None:
            bias_ptr[0] = b.data.ptr
            self.lt.matmul_desc_set_attribute(desc, self.bias_attr, bias_addr, 8)
        self.lt.matmul(self.handle, desc, self.one_ptr, w.data.ptr, a, x.data.ptr, bl, self.zero_ptr, y.data.ptr,
                       cd, y.data.ptr, cd, algo, self.ws.data.ptr, self.ws.nbytes, cp.cuda.get_current_stream().ptr)
        return y


class NvGemm:
    """c = op(a) @ op(b) + beta c through nvmath.bindings.cublas, on a handle bound to the current stream with
    a fixed workspace, as minidl's _cublas.gemm does it (same checks, same operand swap)."""

    def __init__(self, nvmath: Any, workspace: Any) -> None:
        from nvmath.bindings import cublas
        self.cb, self.ws, self.handles = cublas, workspace, {}  # type: Any, Any, dict[int, list]
        dt = nvmath.CudaDataType
        import ml_dtypes
        self.half = {np.dtype("float16"): int(dt.CUDA_R_16F), np.dtype(ml_dtypes.bfloat16): int(dt.CUDA_R_16BF)}
        self.scalars = {v: np.array([v], np.float32) for v in (0.0, 1.0)}
        self.pointers = {v: _ptr(a) for v, a in self.scalars.items()}          # made once, as NvLt's

    def _handle(self):
        import cupy as cp
        dev, stream = cp.cuda.runtime.getDevice(), cp.cuda.get_current_stream().ptr
        h = self.handles.get(dev)
        if h is None:
            h = self.handles[dev] = [self.cb.create(), None]
        if h[1] != stream:
            self.cb.set_stream(h[0], stream)
            self.cb.set_workspace(h[0], self.ws.data.ptr, self.ws.nbytes)      # set_stream resets it
            h[1] = stream
        return h[0]

    def __call__(self, a, b, c, trans_a=False, trans_b=False, beta=0.0):
        if c.dtype != np.float32 and c.dtype not in self.half:
            raise ValueError(f"gemm: float32, float16 or bfloat16 arrays, got {c.dtype}")
        for name, x in (("a", a), ("b", b), ("c", c)):
            if x.ndim != 2 or not x.flags.c_contiguous or x.dtype != c.dtype:
                raise ValueError(f"gemm: {name} must be a C-contiguous 2-D {c.dtype} array, got {x.shape}")
        M, K = a.shape[::-1] if trans_a else a.shape
        Kb, N = b.shape[::-1] if trans_b else b.shape
        if K != Kb or c.shape != (M, N):
            raise ValueError(f"gemm: shapes {a.shape} @ {b.shape} -> {c.shape} do not match")
        one, f_beta = self.pointers[1.0], self.pointers[beta]
        if c.dtype in self.half:
            r = self.half[c.dtype]
            self.cb.gemm_ex(self._handle(), int(trans_b), int(trans_a), N, M, K, one, b.data.ptr, r, b.shape[1],
                            a.data.ptr, r, a.shape[1], f_beta, c.data.ptr, r, N,
                            int(self.cb.ComputeType.COMPUTE_32F), int(self.cb.GemmAlgo.DEFAULT))
        else:
            self.cb.sgemm(self._handle(), int(trans_b), int(trans_a), N, M, K, one, b.data.ptr, b.shape[1],
                          a.data.ptr, a.shape[1], f_beta, c.data.ptr, N)
        return c


def _host(a: Any) -> np.ndarray:
    return a.get()


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def _rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


class Case:
    """One dense layer's arrays in one dtype: x (M, C), w (K, C), b (K,) on the device and the host; x2, a
    second input for the replays."""

    def __init__(self, cp: Any, M: int, C: int, K: int, dtype: str, seed: int) -> None:
        import ml_dtypes
        self.dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
        rng = np.random.default_rng(seed)
        self.hx, self.hx2, self.hw, self.hb, self.hgy = (rng.standard_normal(s).astype(np.float32).astype(self.dtype)
                                                         for s in ((M, C), (M, C), (K, C), (K,), (M, K)))
        self.x, self.x2, self.w, self.b, self.gy = (cp.asarray(a) for a in (self.hx, self.hx2, self.hw, self.hb,
                                                                             self.hgy))
        self.M, self.C, self.K, self.tol = M, C, K, TOLERANCE[dtype]
        cp.cuda.runtime.deviceSynchronize()     # the copies done before any stream reads them

    def empty(self, cp: Any, shape: tuple[int, ...]) -> Any:
        return cp.zeros(shape, self.dtype)

    def reference(self, relu: bool) -> np.ndarray:
        f = np.float64
        y = self.hx.astype(f) @ self.hw.astype(f).T + self.hb.astype(f)              # (M, K)
        return np.maximum(y, 0.0) if relu else y


def _algo_bytes(result: Any) -> bytes:
    """The 64 algorithm bytes of a heuristic result: minidl's ctypes struct or a NumPy record."""
    if hasattr(result, "algo") and not isinstance(result, np.ndarray):
        return bytes(result.algo)
    return np.asarray(result)["algo"].tobytes()


def lt_results(cp, L, nv, case, relu):
    """minidl's _cublaslt.matmul against NvLt on the same arrays: y = act(x wᵀ + b)."""
    y_ml, y_nv = case.empty(cp, (case.M, case.K)), case.empty(cp, (case.M, case.K))
    before = set(L._plans)
    errors = []
    for fn, unsupported in ((lambda: L.matmul(case.x, case.w, y_ml, case.b, None, relu, False), L.Unsupported),
                            (lambda: nv(case.x, case.w, y_nv, case.b, relu, False), Unsupported)):
        try:
            fn()
            errors.append(None)
        except unsupported as e:
            errors.append(one_line(e))
    if any(errors):
        return (errors[0] is not None) == (errors[1] is not None), f"minidl: {errors[0]}; nvmath: {errors[1]}", {}
    ref, hy_ml, hy_nv = case.reference(relu), _host(y_ml), _host(y_nv)
    new = [v for k, v in L._plans.items() if k not in before and v is not None]
    same_algo = bool(new) and _algo_bytes(new[-1][2]) == _algo_bytes(nv.last[2])
    bits, between = _bits_equal(hy_ml, hy_nv), _rel(hy_nv.astype(np.float64), hy_ml.astype(np.float64))
    abs_diff = float(np.max(np.abs(hy_nv.astype(np.float64) - hy_ml.astype(np.float64))))
    e_ml, e_nv = _rel(hy_ml, ref), _rel(hy_nv, ref)
    holds = e_ml <= case.tol and e_nv <= case.tol and (bits if same_algo else between <= 2 * case.tol)
    why = (f"{'bit-identical' if bits else f'differ by {abs_diff:.1e} ({between:.1e} of the largest)'}, "
           f"{'same' if same_algo else 'other'} "
           f"algorithm; error against float64 {e_ml:.1e} (minidl) {e_nv:.1e} (nvmath)")
    return holds, why, {"bit_identical": bits, "same_algo": same_algo, "max_abs_diff": abs_diff,
                        "max_rel_diff": between, "err_minidl": e_ml, "err_nvmath": e_nv}


FORMS = {"fprop": (False, True, 0.0), "dgrad": (False, False, 0.0), "wgrad": (True, False, 1.0)}   # ta, tb, beta


def gemm_operands(cp, case, form):
    """(a, b, c0) of a dense layer's GEMM: fprop x wᵀ, dgrad gy w, wgrad gw += gyᵀ x (c0: gw's old value)."""
    if form == "fprop":
        return case.x, case.w, case.empty(cp, (case.M, case.K))
    if form == "dgrad":
        return case.gy, case.w, case.empty(cp, (case.M, case.C))
    return case.gy, case.x, case.w.copy()                                                 # gw (K, C)


def gemm_results(cp, C, nv, case, form):
    ta, tb, beta = FORMS[form]
    a, b, c0 = gemm_operands(cp, case, form)
    c_ml, c_nv = c0.copy(), c0.copy()
    C.gemm(a, b, c_ml, ta, tb, beta)
    nv(a, b, c_nv, ta, tb, beta)
    f = np.float64
    ha, hb = (_host(v).astype(f) for v in (a, b))
    ref = (ha.T if ta else ha) @ (hb.T if tb else hb) + beta * _host(c0).astype(f)
    hy_ml, hy_nv = _host(c_ml), _host(c_nv)
    bits, e_ml, e_nv = _bits_equal(hy_ml, hy_nv), _rel(hy_ml, ref), _rel(hy_nv, ref)
    holds = bits and e_ml <= case.tol and e_nv <= case.tol
    why = f"{'bit-identical' if bits else 'differ'}; error against float64 {e_ml:.1e} (minidl) {e_nv:.1e} (nvmath)"
    return holds, why, {"bit_identical": bits, "err_minidl": e_ml, "err_nvmath": e_nv}


def capture(cp, stream, fn, y, x, x2):
    """fn() (y from x) recorded on `stream`; (graph, the replay equals the eager result, and after x2 is
    copied into x, the replay equals the new eager result)."""
    with stream:
        fn()
        stream.synchronize()
        eager = _host(y)
        gc_was_on = gc.isenabled()
        gc.disable()                    # a collected CUDA object would make an illegal call mid-capture
        try:
            stream.begin_capture()
            try:
                fn()
            except BaseException:
                try:
                    stream.end_capture()
                except Exception:  # noqa: BLE001  an invalidated capture reports itself here too
                    pass
                raise
            graph = stream.end_capture()
        finally:
            if gc_was_on:
                gc.enable()
        y.data.memset_async(0, y.nbytes)
        graph.launch(stream)
        stream.synchronize()
        first = _bits_equal(_host(y), eager)
        x.data.copy_from_device_async(x2.data, x.nbytes)
        fn()
        stream.synchronize()
        eager2 = _host(y)
        y.data.memset_async(0, y.nbytes)
        graph.launch(stream)
        stream.synchronize()
        second = _bits_equal(_host(y), eager2) and not _bits_equal(eager, eager2)
    return graph, first, second


def capture_pair(cp, stream, case, graphs, key, out_shape, calls):
    """Capture minidl's call and nvmath's (calls[path](x, y) -> the call), each on its own copy of x and its
    own y; nvmath's must replay right (minidl's is reported beside it)."""
    states, unsupported = {}, []
    for path in ("minidl", "nvmath"):
        with stream:
            x, y = case.x.copy(), case.empty(cp, out_shape)
        try:
            graph, first, second = capture(cp, stream, calls[path](x, y), y, x, case.x2)
            graphs[(key, path)] = (graph, x, y)     # the arrays it reads and writes live as long as it
            states[path] = (first and second, f"replay {'equal' if first else 'DIFFERS'}, on new input "
                            f"{'equal' if second else 'DIFFERS'}")
        except Exception as e:  # noqa: BLE001  one line, and the other path is still tried
            states[path] = (False, one_line(e))
            unsupported += [path] if "Unsupported" in type(e).__name__ else []
    why = f"nvmath: {states['nvmath'][1]}; minidl: {states['minidl'][1]}"
    if len(unsupported) == 2:                   # no algorithm either way (lt_results says so too)
        return True, "no algorithm for this GEMM either way: nothing to capture", {}
    return states["nvmath"][0], why, {"minidl_holds": states["minidl"][0]}


def _timed(cp, stream, fn, n):
    """(host us per call, device us per call, device bytes taken) over n calls, after 10 warm-up calls."""
    with stream:
        for _ in range(10):
            fn()
        stream.synchronize()
        free0 = cp.cuda.runtime.memGetInfo()[0]
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        e1.record(stream)
        e1.synchronize()
        free1 = cp.cuda.runtime.memGetInfo()[0]
    return 1e6 * (t1 - t0) / n, 1e3 * cp.cuda.get_elapsed_time(e0, e1) / n, free0 - free1


def time_pair(cp, stream, fns, graphs, calls, replays):
    """Eager host and device time per call of each path (best of 3, alternating) and a replay's time."""
    best: dict[str, dict[str, float]] = {p: {"host_us": math.inf, "device_us": math.inf, "alloc_bytes": 0,
                                             "launch_us": math.inf, "replay_us": math.inf} for p in fns}
    for _ in range(3):
        for path, fn in fns.items():
            host, dev, alloc = _timed(cp, stream, fn, calls)
            b = best[path]
            b["host_us"], b["device_us"] = min(b["host_us"], host), min(b["device_us"], dev)
            b["alloc_bytes"] = max(b["alloc_bytes"], alloc)
            if path in graphs:
                launch, replay, _ = _timed(cp, stream, lambda g=graphs[path][0]: g.launch(stream), replays)
                b["launch_us"], b["replay_us"] = min(b["launch_us"], launch), min(b["replay_us"], replay)
    return best


def _mapped(stem: str) -> set[str]:
    """The files of this process's mapped libraries whose name starts with `stem` (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if f"/{stem}" in line and ".so" in line}


def import_nvmath(state: dict) -> tuple[bool, str, dict]:
    """Import nvmath's two binding modules after CuPy has loaded cuBLAS; what it cost and what it loaded."""
    before = _mapped("lib")
    t0 = time.perf_counter()
    import nvmath
    from nvmath.bindings import cublas, cublasLt  # noqa: F401
    seconds = time.perf_counter() - t0
    state["nvmath"] = nvmath
    loaded = sorted(pathlib.Path(p).name for p in _mapped("lib") - before)
    versions = {"nvmath": getattr(nvmath, "__version__", "?")}
    for name in ("bindings", "core", "pathfinder"):
        try:
            mod = __import__(f"cuda.{name}", fromlist=["__version__"])
            where = pathlib.Path(str(mod.__file__)).parent.parent
            versions[f"cuda.{name}"] = f"{getattr(mod, '__version__', '?')} ({where})"
        except Exception as e:  # noqa: BLE001  reported, not fatal: nvmath.bindings may not need it
            versions[f"cuda.{name}"] = one_line(e)
    why = (f"{seconds:.3f} s; " + ", ".join(f"{k} {v}" for k, v in versions.items())
           + f"; loaded {', '.join(loaded) or 'nothing new'}")
    return True, why, {"import_s": seconds, "loaded": loaded, "versions": versions}


def enums(L: Any, C: Any, dtypes: Any, nvmath: Any) -> tuple[bool, str, dict]:
    """minidl's hand-written cuBLAS/cuBLASLt values against nvmath's, one by one."""
    from nvmath.bindings import cublas as cb, cublasLt as lt
    D, E, P, T = lt.MatmulDescAttribute, lt.Epilogue, lt.MatmulPreferenceAttribute, nvmath.CudaDataType
    pairs = []
    fallback = getattr(L, "_Ctypes", None)      # the ctypes fallback, where _cublaslt.py has one
    if fallback is not None:                    # its nested classes are named as nvmath's enums
        for group in ("MatmulDescAttribute", "Epilogue", "MatmulPreferenceAttribute"):
            for name, value in vars(getattr(fallback, group)).items():
                if not name.startswith("_"):
                    pairs.append((f"{group}.{name}", value, getattr(getattr(lt, group), name)))
    named = [("COMPUTE_32F", "_COMPUTE_32F", cb.ComputeType.COMPUTE_32F),
             ("COMPUTE_32F_FAST_TF32", "_COMPUTE_32F_FAST_TF32", cb.ComputeType.COMPUTE_32F_FAST_TF32),
             ("CUDA_R_32F", "_R32F", T.CUDA_R_32F), ("TRANSA", "_TRANSA", D.TRANSA), ("TRANSB", "_TRANSB", D.TRANSB),
             ("EPILOGUE", "_EPILOGUE", D.EPILOGUE), ("BIAS_POINTER", "_BIAS_POINTER", D.BIAS_POINTER),
             ("Epilogue.DEFAULT", "_EPI_DEFAULT", E.DEFAULT), ("Epilogue.RELU", "_EPI_RELU", E.RELU),
             ("Epilogue.BIAS", "_EPI_BIAS", E.BIAS), ("Epilogue.RELU_BIAS", "_EPI_RELU_BIAS", E.RELU_BIAS),
             ("MAX_WORKSPACE_BYTES", "_PREF_WORKSPACE", P.MAX_WORKSPACE_BYTES)]
    pairs += [(label, getattr(L, attr), value) for label, attr, value in named if hasattr(L, attr)]
    if hasattr(L, "_PREF_ALIGN"):
        pairs += [(f"MIN_ALIGNMENT_{m}_BYTES", v, getattr(P, f"MIN_ALIGNMENT_{m}_BYTES"))
                  for m, v in zip("ABCD", L._PREF_ALIGN)]
    if hasattr(L, "_Heuristic"):
        pairs.append(("heuristic result bytes", ctypes.sizeof(L._Heuristic), lt.matmul_heuristic_result_dtype.itemsize))
    if fallback is not None:
        pairs.append(("heuristic result bytes", fallback.matmul_heuristic_result_dtype.itemsize,
                      lt.matmul_heuristic_result_dtype.itemsize))
    pairs += [(f"cublas {label}", getattr(C, attr), value) for label, attr, value in
              (("COMPUTE_32F", "_COMPUTE_32F", cb.ComputeType.COMPUTE_32F), ("GEMM_DEFAULT", "_GEMM_DEFAULT",
                                                                              cb.GemmAlgo.DEFAULT)) if hasattr(C, attr)]
    pairs += [("CUBLAS_OP_N", 0, cb.Operation.N), ("CUBLAS_OP_T", 1, cb.Operation.T),   # gemm's int(trans)
              ("CUDA_R_16F", dtypes.CUDA_R[dtypes.HALF], T.CUDA_R_16F),
              ("CUDA_R_16BF", dtypes.CUDA_R[dtypes.BFLOAT16], T.CUDA_R_16BF)]
    wrong = [f"{label} {mine} != {int(theirs)}" for label, mine, theirs in pairs if int(mine) != int(theirs)]
    why = f"{len(pairs)} values compared" + (f"; differ: {', '.join(wrong)}" if wrong else ", all equal")
    return not wrong, why, {"compared": len(pairs), "differ": wrong}


def library(C: Any, nvmath: Any) -> tuple[bool, str, dict]:
    """One libcublasLt and one libcublas mapped in the process, and the same cuBLASLt version seen both ways."""
    from nvmath.bindings import cublasLt as lt
    lt_files = sorted({str(pathlib.Path(p).resolve()) for p in _mapped("libcublasLt.so")})
    cb_files = sorted({str(pathlib.Path(p).resolve()) for p in _mapped("libcublas.so")})
    mine = C.load("libcublasLt").cublasLtGetVersion()
    theirs = lt.get_version()
    holds = len(lt_files) == 1 and len(cb_files) == 1 and mine == theirs
    why = f"libcublasLt {lt_files}, libcublas {cb_files}; version {mine} (ctypes) {theirs} (nvmath)"
    return holds, why, {"libcublasLt": lt_files, "libcublas": cb_files}


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def judge_times(checks: Checks, timings: list[dict]) -> None:
    """The aggregated checks over every timed case: no-alloc, host-overhead, graph-time."""
    def rows():
        return [t for t in timings if "minidl" in t and "nvmath" in t]

    def no_alloc():
        taken = max((t["nvmath"]["alloc_bytes"] for t in rows()), default=0)
        return bool(rows()) and taken == 0, f"{len(rows())} cases, at most {taken} bytes taken over the calls", {}

    def host():
        # judged where both paths' host time per call exceeds the GPU's (else the queue may pace the loop)
        judged = [t for t in rows() if all(t[p]["device_us"] < t[p]["host_us"] for p in ("minidl", "nvmath"))]
        use = judged or rows()
        ratios = [t["nvmath"]["host_us"] / t["minidl"]["host_us"] for t in use]
        g, worst = _geomean(ratios), max(ratios, default=math.nan)
        return g <= OVERHEAD, (f"nvmath/minidl host time per call {g:.2f}x (geometric mean of {len(use)} "
                               f"{'host-bound' if judged else 'timed'} cases; worst {worst:.2f}x)"), {"ratio": g}

    def graph():
        ratios = [t["nvmath"]["replay_us"] / t["minidl"]["replay_us"] for t in rows()
                  if math.isfinite(t["nvmath"]["replay_us"]) and math.isfinite(t["minidl"]["replay_us"])]
        g = _geomean(ratios)
        return bool(ratios) and g <= OVERHEAD, f"nvmath/minidl replay time {g:.2f}x over {len(ratios)} cases", {
            "ratio": g}

    checks.run("no-alloc", "nvmath, every timed case", no_alloc)
    checks.run("host-overhead", "every timed case", host)
    checks.run("graph-time", "every timed case", graph)


def run(args: argparse.Namespace) -> int:
    import cupy as cp

    from minidl.kernels.gpu import _cublas as C, _cublaslt as L, _dtypes
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.runtime.getDevice())
    if hasattr(L, "use_bindings"):             # _cublaslt.py with nvmath's bindings where they import: its
        L.use_bindings("ctypes")                # ctypes ones are what nvmath's are tried against
    print(f"trial_nvmath: {props['name'].decode()}, CuPy {cp.__version__}; minidl's side: its ctypes bindings",
          flush=True)
    checks = Checks()
    state: dict[str, Any] = {}
    timings: list[dict] = []
    graphs: dict[tuple, Any] = {}
    C.load("libcublasLt")                        # CuPy's cuBLAS first, as in a minidl process
    checks.run("import", "nvmath.bindings.cublas(Lt)", lambda: import_nvmath(state))
    nvmath = state.get("nvmath")
    if nvmath is not None:
        checks.run("enums", "minidl's values", lambda: enums(L, C, _dtypes, nvmath))
        ws = C.workspace()
        nv_lt, nv_gemm = NvLt(nvmath, ws), NvGemm(nvmath, ws)
        stream = cp.cuda.Stream(non_blocking=True)
        for dtype in args.dtypes:
            for seed, (name, M, Cin, K) in enumerate(SHAPES):
                label, made = f"{name} {dtype}", []

                def setup():
                    made.append(Case(cp, M, Cin, K, dtype, seed))
                    return True, f"x ({M}, {Cin}), w ({K}, {Cin})", {}
                with stream:
                    checks.run("setup", label, setup)
                if made:
                    case_checks(cp, stream, checks, made[0], label, L, C, nv_lt, nv_gemm, graphs, timings, args)
        judge_times(checks, timings)
        checks.run("library", "after both bindings ran", lambda: library(C, nvmath))
    print("\n".join(checks.summary()))
    failing = checks.failing()
    print("decision: " + (f"keep ctypes ({', '.join(failing)} fails; docs/kernels.md)" if failing else
                          "adopt nvmath's bindings (every check holds; docs/kernels.md)"))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"checks": checks.rows, "timings": timings}, indent=1,
                                                      default=str))
    return 1 if failing else 0


def case_checks(cp, stream, checks, case, label, L, C, nv_lt, nv_gemm, graphs, timings, args):
    """Every check of one shape and dtype: results, captures, then the timings of both paths."""
    out = (case.M, case.K)
    with stream:                # every array and call of this case on the trial's one stream
        for relu in (False, True):
            checks.run("lt-results", f"{label} {'bias+relu' if relu else 'bias'}",
                       lambda: lt_results(cp, L, nv_lt, case, relu))
        for form in FORMS:
            checks.run("gemm-results", f"{label} {form}", lambda: gemm_results(cp, C, nv_gemm, case, form))
        for relu in (False, True):
            lt_calls = {"minidl": lambda x, y: lambda: L.matmul(x, case.w, y, case.b, None, relu, False),
                        "nvmath": lambda x, y: lambda: nv_lt(x, case.w, y, case.b, relu, False)}
            checks.run("lt-capture", f"{label} {'bias+relu' if relu else 'bias'}",
                       lambda: capture_pair(cp, stream, case, graphs, (label, "lt", relu), out, lt_calls))
        gemm_calls = {"minidl": lambda x, y: lambda: C.gemm(x, case.w, y, trans_b=True),
                      "nvmath": lambda x, y: lambda: nv_gemm(x, case.w, y, trans_b=True)}
        checks.run("gemm-capture", f"{label} fprop",
                   lambda: capture_pair(cp, stream, case, graphs, (label, "gemm", None), out, gemm_calls))
        y = {p: case.empty(cp, out) for p in ("minidl", "nvmath")}
        families = {("lt", True): {"minidl": lambda: L.matmul(case.x, case.w, y["minidl"], case.b, None, True, False),
                                   "nvmath": lambda: nv_lt(case.x, case.w, y["nvmath"], case.b, True, False)},
                    ("gemm", None): {"minidl": lambda: C.gemm(case.x, case.w, y["minidl"], trans_b=True),
                                     "nvmath": lambda: nv_gemm(case.x, case.w, y["nvmath"], trans_b=True)}}
        for (family, relu), fns in families.items():
            row: dict[str, Any] = {"case": f"{label} {family}"}
            try:
                mine = {p: graphs[((label, family, relu), p)] for p in fns if ((label, family, relu), p) in graphs}
                row.update(time_pair(cp, stream, fns, mine, args.calls, args.replays))
                print("  time          " + f"{row['case']:<34} " + "; ".join(
                    f"{p} host {row[p]['host_us']:.1f} us, device {row[p]['device_us']:.1f} us, replay "
                    f"{row[p]['replay_us']:.1f} us" for p in fns), flush=True)
            except Exception as e:  # noqa: BLE001  a timing that fails is reported and left out of the judgement
                row["error"] = one_line(e)
                print(f"  time          {row['case']:<34} failed: {row['error']}", flush=True)
            timings.append(row)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    why = gpu_missing()
    if why:
        print(f"trial_nvmath: {why}")
        return 2
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
