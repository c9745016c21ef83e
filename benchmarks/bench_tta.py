"""Time to accuracy (`python benchmarks/bench.py tta`): a warm `minidl train` to a target MNIST test
accuracy against PyTorch eager with the data on the GPU (benchmarks/torch_recipe.py): the same net
(LeNet-5 from the same initial weights), the same named recipe and the same stop rule (the test set
scored every tenth of an epoch and at the last step, the run stopped at the first score that reaches
the target; StopAtAccuracy). Each run is a process of its own, timed end to end; one run of each,
untimed, comes first, so the caches are warm (CuPy's kernels, cuDNN's engine choices and plans, the
decoded data set, the OS's file cache, and Python's bytecode: the children run without
PYTHONDONTWRITEBYTECODE, which a machine may set, so that imports read what the warm-up compiled, as
on a machine where the packages were installed). Per framework and seed: seconds of training to the
target (evaluations left out), the first step's seconds, the step reached, the whole process's
seconds; then the means over the seeds and PyTorch's over minidl's. Prints figures and ratios;
judges nothing.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
# minidl train's line (minidl/training/history.py, StopAtAccuracy.on_train_end)
_REACHED = re.compile(r"target accuracy [\d.]+% reached at step (\d+) \(epoch ([\d.]+)\): ([\d.]+)%; ([\d.]+) s of "
                      r"training \(first step ([\d.]+) s\), ([\d.]+) s in (\d+) evaluation")
_NOT = re.compile(r"target accuracy [\d.]+% not reached")
FIGURES = (("train_s", "training to the target (s)"), ("first_s", "first step (s)"),
           ("process_s", "whole process (s)"), ("step", "step reached"), ("eval_s", "evaluations (s, apart)"))


def commands(framework: str, seed: int, recipe: str, target: float) -> list[str]:
    """The command line of one run."""
    if framework == "minidl":
        return [sys.executable, "-m", "minidl.train", "--recipe", recipe, "--target-accuracy", f"{target:g}",
                "--seed", str(seed), "--device", "cuda", "-m", "1000000"]
    return [sys.executable, "-m", "benchmarks.torch_recipe", "--model", "lenet", "--recipe", recipe,
            "--target-accuracy", f"{target:g}", "--seed", str(seed)]


def parse(framework: str, out: str) -> dict[str, Any] | None:
    """{step, epoch, accuracy, train_s, first_s, eval_s, evaluations, reached} of a run's output; None
    where the output has no result line (the run failed)."""
    if framework == "pytorch":
        line = next((x for x in out.splitlines() if x.startswith("time to accuracy: ")), None)
        return None if line is None else json.loads(line.split(": ", 1)[1])
    m = _REACHED.search(out)
    if m:
        step, epoch, acc, train_s, first_s, eval_s, evals = m.groups()
        return {"reached": True, "step": int(step), "epoch": float(epoch), "accuracy": float(acc),
                "train_s": float(train_s), "first_s": float(first_s), "eval_s": float(eval_s),
                "evaluations": int(evals)}
    return {"reached": False} if _NOT.search(out) else None


def run_one(framework: str, seed: int, recipe: str, target: float) -> dict[str, Any]:
    """One run in a process of its own; its figures and `process_s`, or `error` with the output's tail."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONDONTWRITEBYTECODE", None)          # a warm machine has its bytecode (the docstring)
    t = time.perf_counter()
    p = subprocess.run(commands(framework, seed, recipe, target), cwd=ROOT, env=env, capture_output=True, text=True)
    process_s = time.perf_counter() - t
    got = parse(framework, p.stdout)
    if got is None:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"seed": seed, "error": f"exit {p.returncode}: " + " | ".join(tail)}
    return {"seed": seed, **got, "process_s": process_s}


def describe(r: dict[str, Any]) -> str:
    """One run in words."""
    if "error" in r:
        return r["error"]
    if not r["reached"]:
        return f"target not reached (process {r['process_s']:.2f} s)"
    return (f"step {r['step']} (epoch {r['epoch']:.2f}), {r['train_s']:.3f} s of training, first step "
            f"{r['first_s']:.3f} s, process {r['process_s']:.2f} s")


def summary(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The mean of each figure over the runs that reached the target (None where none did)."""
    done = [r for r in runs if r.get("reached")]
    return {k: statistics.fmean(r[k] for r in done) if done else None for k, _ in FIGURES}


def bench_tta(seeds: int = 5, recipe: str = "fast", target: float = 99.0,
              out: Callable[..., Any] = print) -> dict[str, Any]:
    """Both frameworks over `seeds` seeds; prints each run, then the table of means and ratios."""
    results: dict[str, Any] = {"recipe": recipe, "target": target, "seeds": seeds}
    for fw in ("minidl", "pytorch"):
        warm = run_one(fw, 0, recipe, target)             # fills the caches; not counted
        out(f"{fw}: warm-up run {'done' if 'error' not in warm else 'FAILED: ' + warm['error']}")
        runs = [run_one(fw, s, recipe, target) for s in range(seeds)]
        for r in runs:
            out(f"{fw} seed {r['seed']}: {describe(r)}")
        results[fw] = {"runs": runs, "mean": summary(runs),
                       "reached": sum(bool(r.get("reached")) for r in runs)}
    print_table(results, out)
    return results


def print_table(results: dict[str, Any], out: Callable[..., Any] = print) -> None:
    m, t = results["minidl"]["mean"], results["pytorch"]["mean"]
    out(f"\ntime to {results['target']:g}% MNIST test accuracy, LeNet-5, --recipe {results['recipe']}, "
        f"mean of the seeds that reached it (minidl {results['minidl']['reached']}/{results['seeds']}, "
        f"PyTorch {results['pytorch']['reached']}/{results['seeds']})")
    out("| figure | minidl | PyTorch eager | PyTorch / minidl |")
    out("|---|---|---|---|")
    for k, name in FIGURES:
        a, b = m[k], t[k]
        fmt = (lambda v: "-" if v is None else f"{v:.1f}") if k == "step" else \
              (lambda v: "-" if v is None else f"{v:.3f}")
        ratio = f"{b / a:.2f}x" if a and b else "-"
        out(f"| {name} | {fmt(a)} | {fmt(b)} | {ratio} |")
