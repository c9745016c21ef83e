"""python benchmarks/bench_rows.py [--precisions fp32 bf16] [--json FILE] [--check-half]: minidl's bench rows alone.

The rows of `bench.py train` and `bench.py infer` (the same cases, models, batches and timing), minidl only, without
PyTorch's runs beside them: quick enough to run the same rows from two checkouts in one call, which is how a change is
shown to keep the speed (`--json` each, then compare). `--check-half` exits 1, naming the rows, when a half-precision
row is slower than its fp32 row by more than the noise (`--tolerance`, 3%): issue 30's rule that `--precision bf16`
is never slower than fp32.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_infer import INFER_CASES, _measure  # noqa: E402
from benchmarks.bench_train import TRAIN_CASES, minidl_train  # noqa: E402

ROWS = ("lenet-10k", "lenet-b32", "lenet-b256", "resnet50", "resnet50-b256", "resnet50-b1", "resnet50-b1000")


def infer_ms(row: str, precision: str, runs: int = 1000) -> float:
    """ms per call (batch 1: median latency) of the compiled zoo model on the case's batch of [0, 1] images."""
    import numpy as np

    import minidl as dl
    from minidl import inference, models
    case = INFER_CASES[row]
    dev = dl.get_device("cuda", seed=0)
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
    compiled = inference.compile(model, device=dev, precision=precision, probabilities=False)
    N = case["batch"]
    buf = compiled.input_buffer(N)
    buf[...] = dev.asarray(np.random.default_rng(N).random((N, *model.inputs[0].shape[1:]), np.float32))
    return float(_measure(lambda: compiled.predict(buf), dev.sync, N, runs)["ms_per_call"])


def rows(names: Sequence[str], precisions: Sequence[str], out=print) -> dict[str, dict[str, float]]:
    import minidl as dl
    train = test = None
    if any(r in TRAIN_CASES for r in names):
        train, test = dl.data.load("mnist", "train"), dl.data.load("mnist", "test")
    result: dict[str, dict[str, float]] = {}
    for row in names:
        for p in precisions:
            if row in TRAIN_CASES:
                ms = minidl_train(TRAIN_CASES[row], train, test, precision=p)["ms_per_step"]
            else:
                ms = infer_ms(row, p)
            result.setdefault(row, {})[p] = ms
            out(f"{row:<15} {p:<5} {ms:8.4f} ms")
    return result


def slower_half(result: dict[str, dict[str, float]], tolerance: float) -> list[str]:
    """The rows whose half-precision figure exceeds their fp32 figure by more than `tolerance` (a fraction)."""
    return [f"{row} {p}: {ms:.4f} ms against fp32 {by['fp32']:.4f} ms" for row, by in result.items()
            for p, ms in by.items() if p != "fp32" and "fp32" in by and ms > by["fp32"] * (1 + tolerance)]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/bench_rows.py", description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS, metavar="ROW", help=" ".join(ROWS))
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=("fp32", "bf16", "fp16"))
    p.add_argument("--json", help="write {row: {precision: ms}} here")
    p.add_argument("--check-half", action="store_true", help="exit 1 if a half row is slower than its fp32 row")
    p.add_argument("--tolerance", type=float, default=0.03, help="noise allowed by --check-half (0.03)")
    args = p.parse_args(argv)
    result: dict[str, Any] = rows(args.rows, args.precisions)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=1))
    bad = slower_half(result, args.tolerance) if args.check_half else []
    for line in bad:
        print(f"half slower than fp32: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
