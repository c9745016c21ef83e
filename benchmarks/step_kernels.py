"""python benchmarks/step_kernels.py [--batches 32 256] [--precisions fp32 bf16] [--reps 500]: LeNet-5's
captured training step, as benchmarks/bench_train.py's lenet rows train it (Adam 1e-3), three ways in one
process: `before` (the operations issue 42's fusions replaced, tests/helpers/old_step_ops.py patched in),
`books` (the books and the batch gather fused, the dense forward as before: cuBLAS and an add) and `after`
(all of it): the CUDA graph's nodes by type (cuGraphGetNodes, no profiler) and the median time of one
replay (CUDA events around `reps` back-to-back replays, 5 rounds). Needs a GPU and CuPy."""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def measure(batch: int, precision: str, reps: int, way: str) -> tuple[dict, float]:
    import cupy as cp
    import numpy as np

    import minidl as dl
    from minidl import models, optim
    from tests.helpers.graph_nodes import graph_nodes
    from tests.helpers.old_step_ops import patch_old
    dev = dl.get_device("cuda", seed=0)
    undo = []
    if way != "after":
        def setattr_(obj, name, value):
            undo.append((obj, name, getattr(obj, name)))
            setattr(obj, name, value)
        patch_old(setattr_, dev)
        if way == "books":                               # the fused books and gather back, the dense forward old
            for obj, name, value in undo[:2]:
                setattr(obj, name, value)
    try:
        model = models.lenet5(device=dev, seed=0)
        trainer = dl.Trainer(model, optim.Adam(1e-3), seed=0, graph=True, progress=False, log=lambda s: None,
                             precision=precision)
        rng = np.random.default_rng(0)
        images, labels = rng.integers(0, 256, (8 * batch, 28, 28), dtype=np.uint8), rng.integers(0, 10, 8 * batch)
        trainer.fit((images, labels), steps=10, batch_size=batch, monitor=10 ** 9)
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
    p.add_argument("--batches", nargs="+", type=int, default=[32, 256])
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16", "fp16"))
    p.add_argument("--reps", type=int, default=500, help="replays a round (500)")
    args = p.parse_args()
    for batch in args.batches:
        for precision in args.precisions:
            for way in ("before", "books", "after") * 2:    # interleaved: drift shows between the repeats
                nodes, us = measure(batch, precision, args.reps, way)
                print(f"lenet-b{batch} {precision} {way:6}: {nodes.get('kernel', 0)} kernels "
                      f"({sum(nodes.values())} nodes: {nodes}), replay {us:.1f} us")


if __name__ == "__main__":
    main()
