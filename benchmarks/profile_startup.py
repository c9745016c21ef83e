"""Where a training run's start goes on the GPU, phase by phase, with empty caches (cold) and full ones (warm).

    python benchmarks/profile_startup.py --cold --warm -r50 -b32
    python benchmarks/profile_startup.py --cold --variant all-engines:MINIDL_AUTOTUNE_TOPK=0 -r50 -b32
    python benchmarks/profile_startup.py --cold --warm --cli "python -m minidl.train -b32 -n500 -m100 -r50"

Flags it does not know are `python -m minidl.train`'s, and describe the run. Each run is a child process,
because CuPy reads CUPY_CACHE_DIR when it is imported: --cold gives a child fresh MINIDL_CACHE and
CUPY_CACHE_DIR folders, --warm then reuses the last cold run's (or --cache-dir's); a --variant is one
more cold run with extra environment variables. The child builds what minidl.train builds
(minidl.cli.warmup.build_trainer) on synthetic images and times: imports, get_device, the model, the
Trainer, the first step (split into NVRTC compiles waited for on the main thread, cuDNN graph builds,
cuDNN plans loaded from the plan cache and written to it (gpu/plan_cache.py), engine choice and timing,
the CUDA-graph capture, the rest), the first evaluation batch, then
steady steps. --cli times a whole command instead (wall time, and the first step it reports). The
compiles listed are this process's: the compile workers' (minidl/kernels/gpu/compile_workers.py) run in
processes of their own.
Without CuPy and a GPU it says so in one line and exits with status 2.
"""
import argparse
import collections
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time

class Timers:
    """Wall time, calls and the longest call per name, of wrapped functions on the main thread only
    (the compile pool's threads are counted by minidl's own progress); a call inside another of the
    same name counts once."""

    def __init__(self):
        self.s, self.n, self.max = collections.Counter(), collections.Counter(), collections.Counter()
        self.depth = collections.Counter()

    def wrap(self, owner, attr, name=None):
        fn, name = getattr(owner, attr), name or attr

        def timed(*a, **k):
            if threading.current_thread() is not threading.main_thread() or self.depth[name]:
                return fn(*a, **k)
            self.depth[name] += 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t
                self.depth[name] -= 1
                self.s[name] += dt
                self.n[name] += 1
                self.max[name] = max(self.max[name], dt)
        setattr(owner, attr, timed)


FE_METHODS = ("validate", "build_operation_graph", "create_execution_plans", "deselect_numeric_notes",
              "check_support", "build_plans", "build_plan_at_index", "get_execution_plan_count",
              "get_plan_name_at_index", "get_workspace_size", "get_workspace_size_plan_at_index",
              "get_behavior_notes_for_plan_at_index", "_execute", "_execute_plan_at_index")


def child(argv, result_path, top):
    t_start = time.time()
    t0 = time.perf_counter()
    from minidl import backend
    from minidl.cli import train, warmup
    ok, why = backend.cuda_status()
    if not ok:
        print(f"profile_startup: needs CuPy and a usable CUDA GPU: {why}", file=sys.stderr)
        return 2
    import cupy
    from minidl.kernels.gpu import _cuda, capture, cudnn_graphs as cudnn, engines, plan_cache, timing
    r = {"imports": time.perf_counter() - t0}
    p = warmup.parser()
    args = train.check_args(p, p.parse_args(argv))
    t = time.perf_counter()
    device = backend.get_device("cuda", seed=args.seed)
    device.set_tf32(args.tf32)
    device.set_deterministic(not args.nondeterministic)
    r["get_device"] = time.perf_counter() - t
    t = time.perf_counter()
    trainer = warmup.build_trainer(args, device)
    r["model_and_trainer"] = time.perf_counter() - t
    tm = Timers()
    tm.wrap(cupy.cuda.compiler, "_compile_module_with_cache", "nvrtc_wait")
    tm.wrap(_cuda.Module, "_compile", "nvrtc_wait")          # a Module the pool is compiling: waited for
    tm.wrap(cudnn, "_build", "cudnn_build")
    tm.wrap(cudnn._Graph, "use_plan")
    tm.wrap(plan_cache, "load", "plan_load")                 # a plan read and deserialised (or passed over)
    tm.wrap(plan_cache, "save", "plan_save")                 # a plan serialised and queued for its file
    tm.wrap(engines, "choose", "engine_choice")
    tm.wrap(engines, "fastest", "engine_choice_fastest")
    tm.wrap(timing, "time_queued", "timing_runs")
    tm.wrap(capture.CapturedCall, "_capture", "capture")
    for m in FE_METHODS:
        if hasattr(cudnn._fe.pygraph, m):
            tm.wrap(cudnn._fe.pygraph, m, "fe." + m)
    data = warmup.synthetic(4 * args.batch_size)
    prof = None
    if top:
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
    t = time.perf_counter()
    trainer.fit(data, steps=1, batch_size=args.batch_size, monitor=1)
    r["first_step"] = time.perf_counter() - t
    r["compiles"] = [["main" if main else "pool", round(start - t, 2), round(dt, 2), name]
                     for main, start, dt, name in list(_cuda.progress.compiles)]     # start < 0: before the step
    r["ready_wall"] = time.time() - t_start
    if prof is not None:
        prof.disable()
    parts = ("nvrtc_wait", "cudnn_build", "plan_load", "plan_save", "engine_choice", "engine_choice_fastest",
             "capture")
    r.update({k: tm.s[k] for k in parts})
    r["other"] = r["first_step"] - sum(tm.s[k] for k in parts)
    r["calls"] = {k: [tm.n[k], round(tm.s[k], 3), round(tm.max[k], 3)] for k in sorted(tm.s)}
    prog = _cuda.progress
    r["nvrtc"] = {"compiles": prog.compiled, "compile_s_all_threads": round(prog.compile_s, 2),
                  "timed_convolutions": prog.timed, "timing_s": round(prog.timing_s, 2)}
    r["engines"] = dict(engines.stats, chosen_ms=sum(x[3] for x in engines.report),
                        heuristic_ms=sum(x[2] for x in engines.report), timed=len(engines.report))
    r["plans"] = {k: round(v, 3) if isinstance(v, float) else v for k, v in plan_cache.stats.items()}
    r["plans"]["built"] = tm.n["cudnn_build"]
    t = time.perf_counter()
    trainer.evaluate(warmup.synthetic(args.test_batch), batch_size=args.test_batch, steps=1)
    r["first_eval"] = time.perf_counter() - t
    trainer.fit(data, more_steps=30, batch_size=args.batch_size, monitor=30)
    r["steady_ms"] = trainer.timing["steady_ms"]
    with open(result_path, "w") as f:
        json.dump(r, f)
    if prof is not None:
        import pstats
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(top)
    return 0


def run_child(cmd, env, timeout):
    """(return code, wall seconds, output) of one child."""
    t = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return out.returncode, time.perf_counter() - t, out.stdout + out.stderr
    except subprocess.TimeoutExpired as e:
        return 124, time.perf_counter() - t, f"timed out after {timeout} s: {e.output or ''}"


def table(results):
    names = list(results)
    rows = [("phase (s)",) + tuple(names)]
    indent = ["nvrtc_wait", "cudnn_build", "plan_load", "plan_save", "engine_choice", "engine_choice_fastest",
              "capture", "other"]
    keys = ["imports", "get_device", "model_and_trainer", "first_step", *indent, "first_eval", "ready_wall",
            "process_wall", "steady_ms"]
    for k in keys:
        if any(k in r for r in results.values()):
            rows.append((("  " if k in indent else "") + k,) + tuple(
                f"{r[k]:.2f}" if isinstance(r.get(k), float) else "-" for r in results.values()))
    for k in ("nvrtc", "engines", "plans"):
        for name, r in results.items():
            if k in r:
                rows.append((f"{k} [{name}]", json.dumps(r[k])))
    for name, r in results.items():
        c = r.get("compiles", [])
        main = [x for x in c if x[0] == "main"]
        if c:
            main_s = sum(x[2] for x in main)
            rows.append((f"compiles [{name}]", f"{len(c)} ({len(main)} on the main thread, {main_s:.2f} s)"))
        for thread, start, dt, label in sorted(c, key=lambda x: -x[2])[:12]:
            rows.append((f"  compile [{name}]", f"{thread} at {start:.2f} s: {dt:.2f} s {label}"))
    for name, r in results.items():
        for fn, (n, sec, longest) in sorted(r.get("calls", {}).items(), key=lambda kv: -kv[1][1])[:14]:
            rows.append((f"calls [{name}] {fn}", f"n={n} s={sec} max={longest}"))
    width = max(len(r[0]) for r in rows)
    return "\n".join(r[0].ljust(width) + "  " + "  ".join(c.rjust(10) for c in r[1:]) for r in rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="Other flags: python -m minidl.train's.")
    p.add_argument("--cold", action="store_true", help="a run with fresh, empty caches")
    p.add_argument("--warm", action="store_true", help="a run on the last cold run's caches (or --cache-dir)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:K=V[,K=V]",
                   help="one more cold run with these environment variables")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="for every run")
    p.add_argument("--cache-dir", help="where the caches live (default: a new temporary folder)")
    p.add_argument("--cli", help="time this command line instead (wall, and the first step it prints)")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="print the first step's N top functions")
    p.add_argument("--json", help="write every run's numbers here")
    p.add_argument("--timeout", type=int, default=400, help="seconds per run (400)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.child:
        return child(rest, args.child, args.cprofile)
    if importlib.util.find_spec("cupy") is None:
        print("profile_startup: needs CuPy and a usable CUDA GPU: cupy is not installed", file=sys.stderr)
        return 2
    both = not args.cold and not args.warm
    plan = [("cold", {})] if args.cold or both else []
    plan += [("warm", None)] if args.warm or both else []
    plan += [(v.partition(":")[0], dict(kv.split("=", 1) for kv in v.partition(":")[2].split(",") if kv))
             for v in args.variant]
    base = dict(os.environ, **dict(kv.split("=", 1) for kv in args.env))
    root = args.cache_dir or tempfile.mkdtemp(prefix="minidl-startup-")
    results, last = {}, root                # a warm run takes the last cold run's folder, else root
    for i, (name, extra) in enumerate(plan):
        folder = last if extra is None else os.path.join(root, f"{i}-{name}")
        last = last if extra is None or extra else folder     # variants keep their caches to themselves
        env = dict(base, **(extra or {}), MINIDL_CACHE=os.path.join(folder, "minidl"),
                   CUPY_CACHE_DIR=os.path.join(folder, "cupy"))
        out_json = os.path.join(root, f"{i}-{name}.json")
        cmd = shlex.split(args.cli) if args.cli else [sys.executable, os.path.abspath(__file__), "--child", out_json,
                                                       "--cprofile", str(args.cprofile)] + rest
        rc, wall, text = run_child(cmd, env, args.timeout)
        print(f"== {name}: exit {rc}, {wall:.1f} s ({' '.join(f'{k}={v}' for k, v in (extra or {}).items())})")
        if rc == 2 and "needs CuPy" in text:
            print(text.strip().splitlines()[-1], file=sys.stderr)
            return 2
        if rc != 0 or args.cprofile or args.cli:
            print(text[-6000:])
        r = {}
        if not args.cli and rc == 0:
            with open(out_json) as f:
                r = json.load(f)
        m = re.search(r"first step ([0-9.]+) s", text)
        if m:
            r["first_step"] = float(m.group(1))
        r["process_wall"] = wall
        results[name] = r
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
