"""python benchmarks/roofline_gpu.py [--rows ...] [--precisions fp32 bf16] [--json FILE]: the GPU half of the roofline.

For each bench row (bench_train.py's and bench_infer.py's cases) and precision, minidl runs the row as the bench does
(training: a Trainer with its step captured as one CUDA graph; inference: `inference.compile(...).predict`, captured
per batch size) and PyTorch's profiler (CUPTI, which sees every kernel of the process, CuPy's and cuDNN's too) records
a number of steps or calls. Printed per row:

- kernels: GPU operations per step or call (kernels, plus the memsets and copies a graph also holds as nodes);
- busy us: the sum of their durations, per step (what the GPU computes; the rest of a step is gaps between them);
- step us: first start to last end of one step's operations, the median over the recorded steps;
- launch floor us: one replay of a CUDA graph of as many empty kernels, one after another (what the step would cost
  if every kernel did nothing);
- the kernels that take the most time, summed by name.

`--json FILE` writes {row: {precision: {...}}} for `benchmarks/roofline.py --gpu FILE`. Needs a GPU, CuPy and PyTorch.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import sys
from typing import Any, Callable, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_infer import INFER_CASES  # noqa: E402
from benchmarks.bench_train import TRAIN_CASES  # noqa: E402

ROWS = ("lenet-10k", "lenet-b32", "lenet-b256", "resnet50", "resnet50-b256", "resnet50-b1", "resnet50-b1000")
REPS = 20


def launch_floor_us(nodes: int, reps: int = 200) -> float:
    """One replay of a captured chain of `nodes` empty kernels, microseconds (CUDA events over `reps` replays)."""
    import cupy as cp
    nop = cp.RawKernel('extern "C" __global__ void nop() {}', "nop")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        nop((1,), (1,), ())                           # compiled and loaded before the capture
        stream.begin_capture()
        for _ in range(nodes):
            nop((1,), (1,), ())
        graph = stream.end_capture()
        graph.upload()
        for _ in range(10):
            graph.launch()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(reps):
            graph.launch()
        end.record()
        end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1e3 / reps


def _trace(fn: Callable[[], object], sync: Callable[[], object], reps: int) -> list[Any]:
    """The GPU activities (kernels, memsets, copies) of `reps` calls of fn, in start order."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            sync()
    return sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)


def _summary(events: list[Any], reps: int) -> dict[str, Any]:
    """Per step: operations, busy time, span (median over the steps: each step's events are one contiguous group,
    so a step's span is taken between the gaps that the host's sync leaves)."""
    per = len(events) / reps
    spans = []
    for i in range(reps):
        group = events[round(i * per):round((i + 1) * per)]
        if group:
            spans.append(max(e.time_range.end for e in group) - group[0].time_range.start)
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        by_name[e.name][0] += 1 / reps
        by_name[e.name][1] += (e.time_range.end - e.time_range.start) / reps
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:8]
    return {"kernels": round(per, 1), "busy_us": sum(e.time_range.end - e.time_range.start for e in events) / reps,
            "step_us": statistics.median(spans) if spans else 0.0,
            "top": [{"name": n[:80], "per_step": round(c, 1), "us": round(us, 2)} for n, (c, us) in top]}


def train_row(row: str, precision: str, train: Any) -> dict[str, Any]:
    """A training row: the bench's Trainer, warmed (captured), then REPS steps traced one by one."""
    import minidl as dl
    from minidl import models, optim
    c = TRAIN_CASES[row]
    dev = dl.get_device("cuda", seed=0)
    model = models.get(c["model"], depth=c["depth"], device=dev, seed=0)
    opt = optim.get(c["optimizer"], lr=c["lr"], **({"momentum": 0.9} if c["optimizer"] == "momentum" else {}))
    trainer = dl.Trainer(model, opt, seed=0, progress=False, log=lambda s: None, precision=precision)
    loader = dl.data.Loader(*train, c["batch"], dev, seed=0)
    trainer.fit(loader, steps=10, monitor=10 ** 9)
    dev.sync()
    steps = iter(range(10, 10 ** 9))       # the captured step alone, replayed as fit replays it (no fit around it)
    return _summary(_trace(lambda: trainer._step.replay(loader, 0, next(steps)), dev.sync, REPS), REPS)


def infer_row(row: str, precision: str) -> dict[str, Any]:
    """An inference row: the compiled model on random images of the case's batch, warmed, REPS calls traced."""
    import numpy as np

    import minidl as dl
    from minidl import inference, models
    c = INFER_CASES[row]
    dev = dl.get_device("cuda", seed=0)
    model = models.get(c["model"], depth=c["depth"], device=dev, seed=0)
    compiled = inference.compile(model, device=dev, precision=precision, probabilities=False)
    x = dev.xp.asarray(np.random.default_rng(0).random((c["batch"],) + model.inputs[0].shape[1:], np.float32))
    for _ in range(5):
        compiled.predict(x)
    dev.sync()
    return _summary(_trace(lambda: compiled.predict(x), dev.sync, REPS), REPS)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/roofline_gpu.py", description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS, metavar="ROW", help=" ".join(ROWS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16", "fp16"))
    p.add_argument("--json", help="write the figures here (for roofline.py --gpu)")
    args = p.parse_args(argv)
    import minidl as dl
    train = dl.data.load("mnist", "train") if any(r in TRAIN_CASES for r in args.rows) else None
    out: dict[str, dict[str, Any]] = {}
    for row in args.rows:
        for precision in args.precisions:
            fig = train_row(row, precision, train) if row in TRAIN_CASES else infer_row(row, precision)
            fig["launch_floor_us"] = launch_floor_us(max(1, round(fig["kernels"])))
            out.setdefault(row, {})[precision] = fig
            print(f"{row} {precision}: {fig['kernels']} kernels, busy {fig['busy_us']:.1f} us, step "
                  f"{fig['step_us']:.1f} us, launch floor {fig['launch_floor_us']:.1f} us", flush=True)
            for t in fig["top"]:
                print(f"    {t['us']:>9.2f} us  x{t['per_step']:<5} {t['name']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
