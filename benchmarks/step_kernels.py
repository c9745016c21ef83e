"""python benchmarks/step_kernels.py [--rows lenet-b32 lenet-b256] [--precisions fp32 bf16] [--reps N]: a bench row's
captured training step (benchmarks/bench_train.py's cases: model, batch, optimizer; random 28x28 images) three ways
in one process: `before` (the operations issue 42's fusions replaced, benchmarks/old_step_ops.py patched in),
`books` (the books and the batch gather fused, the dense forward as before: cuBLAS and an add) and `after` (all of
it). Printed: the CUDA graph's nodes by type (cuGraphGetNodes, no profiler) and the median time of one replay (CUDA
events around N back-to-back replays, 5 rounds; N 500 for LeNet-5's rows, 50 for ResNet-50's). The three ways run
twice, interleaved, so drift shows as a difference between the repeats. Needs a GPU and CuPy."""
from __future__ import annotations

import argparse
import gc
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_train import TRAIN_CASES  # noqa: E402

WAYS = ("before", "books", "after")


def measure(row: str, precision: str, reps: int, way: str) -> tuple[dict, float]:
    """({node kind: count}, us a replay) of `row`'s captured step under `precision`, the fusions as `way` says."""
    import cupy as cp
    import numpy as np

    import minidl as dl
    from minidl import models, optim
    from benchmarks.graph_nodes import graph_nodes
    from benchmarks.old_step_ops import patch_old
    case = TRAIN_CASES[row]
    gc.collect()                                          # the previous way's graphs and buffers go now
    dev = dl.get_device("cuda", seed=0)
    dev.free_memory()
    undo: list = []
    if way != "after":
        def setattr_(obj, name, value):
            undo.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)
        patch_old(setattr_, dev)
        if way == "books":                               # the fused books and gather back, the dense forward old
            for obj, name, value in undo[:2]:
                setattr(obj, name, value)
    try:
        model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
        opt = optim.get(case["optimizer"], lr=case["lr"],
                        **({"momentum": 0.9} if case["optimizer"] == "momentum" else {}))
        trainer = dl.Trainer(model, opt, seed=0, graph=True, progress=False, log=lambda s: None, precision=precision)
        batch = case["batch"]
        rng = np.random.default_rng(0)
        images, labels = rng.integers(0, 256, (4 * batch, 28, 28), dtype=np.uint8), rng.integers(0, 10, 4 * batch)
        trainer.fit((images, labels), steps=6, batch_size=batch, monitor=10 ** 9)
        (_, call), = trainer._step._captured.values()
        nodes = dict(graph_nodes(call.graph))
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(5):
            start.record(call.stream)
            for _ in range(reps):
                call.replay()
            end.record(call.stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1000.0 / reps)
        return nodes, statistics.median(times)
    finally:
        for obj, name, value in reversed(undo):
            setattr(obj, name, value)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="+", default=["lenet-b32", "lenet-b256"], choices=list(TRAIN_CASES))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16", "fp16"))
    p.add_argument("--reps", type=int, help="replays a round (500 for LeNet-5's rows, 50 for ResNet-50's)")
    args = p.parse_args()
    for row in args.rows:
        reps = args.reps or (500 if row.startswith("lenet") else 50)
        for precision in args.precisions:
            for way in WAYS * 2:
                nodes, us = measure(row, precision, reps, way)
                print(f"{row} {precision} {way:6}: {nodes.get('kernel', 0)} kernels ({sum(nodes.values())} nodes: "
                      f"{nodes}), replay {us:.1f} us", flush=True)


if __name__ == "__main__":
    main()
