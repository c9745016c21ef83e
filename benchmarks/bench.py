"""python benchmarks/bench.py train|infer (or python -m benchmarks.bench): minidl and PyTorch side by side.

In one process, on one GPU. train (bench_train.py): both frameworks train the same architecture on the
same MNIST batches; prints ms/step, ratios, peak GPU memory and test accuracy. infer (bench_infer.py):
minidl's compiled inference model against PyTorch eager and PyTorch in a CUDA graph on the same weights;
prints batch-1 latency, ms per call for large batches, memory and the outputs' largest difference. tta
(bench_tta.py): a warm `minidl train --recipe fast --target-accuracy 99` against PyTorch eager with the data
on the GPU (torch_recipe.py), the same net, recipe and stop rule, each run a process of its own: seconds of
training to 99.0%, the first step, the whole process, the step reached, means over 5 seeds and ratios.
--precision (fp32, bf16, fp16) runs minidl under that policy and PyTorch in its best configuration for
it (autocast, channels-last). --json writes the figures. Without a usable GPU it says so in one line and
exits with status 2. The PyTorch models are in torch_models.py.
"""
import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:             # `python benchmarks/bench.py` puts only benchmarks/ there
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_infer import INFER_CASES, bench_infer  # noqa: E402
from benchmarks.bench_train import TRAIN_CASES, bench_train  # noqa: E402
from benchmarks.bench_tta import bench_tta  # noqa: E402


def _environment():
    """GPU, CuPy, cuDNN and PyTorch versions, where they answer."""
    env = {}
    try:
        import cupy as cp
        env["gpu"] = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        env["cupy"] = cp.__version__
    except Exception:                     # noqa: BLE001  no CuPy, driver or device: each raises its own type
        pass
    try:
        from minidl.kernels.gpu import cudnn_graphs as cudnn
        env["cudnn"] = cudnn.version()
    except Exception:                     # noqa: BLE001  no cuDNN Frontend or library: a version it cannot report
        pass
    try:
        import torch
        env["torch"] = torch.__version__
    except ImportError:
        pass
    return env


def parser():
    p = argparse.ArgumentParser(prog="python benchmarks/bench.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train", help="training speed against PyTorch eager and CUDA-graph")
    t.add_argument("--cases", default=",".join(TRAIN_CASES), help="comma-separated: " + ", ".join(TRAIN_CASES))
    t.add_argument("--json", help="write the figures to this file")
    t.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="precision policy (fp32)")
    t.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="minidl's convolutions channels-last (default: the device's choice, on in bf16/fp16)")
    i = sub.add_parser("infer", help="inference latency and throughput against PyTorch eager and CUDA-graph")
    i.add_argument("--cases", default=",".join(INFER_CASES), help="comma-separated: " + ", ".join(INFER_CASES))
    i.add_argument("--runs", type=int, default=1000, help="timed batch-1 calls per runner (1000)")
    i.add_argument("--json", help="write the figures to this file")
    i.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="precision policy (fp32)")
    a = sub.add_parser("tta", help="time to a test accuracy against PyTorch eager (whole processes, warm)")
    a.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 of each framework (5)")
    a.add_argument("--target", type=float, default=99.0, help="test accuracy in percent (99)")
    a.add_argument("--recipe", choices=("fast",), default="fast", help="minidl's named recipe both run (fast)")
    a.add_argument("--json", help="write the figures to this file")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    table = TRAIN_CASES if args.what == "train" else INFER_CASES
    names = args.cases.split(",") if args.what != "tta" else []
    bad = [n for n in names if n not in table]
    if bad:
        p.error(f"unknown case(s) {', '.join(bad)}: expected {', '.join(table)}")
    if args.what == "tta" and not (args.seeds >= 1 and 0 < args.target <= 100):
        p.error(f"--seeds must be at least 1 and --target in (0, 100], got {args.seeds} and {args.target}")
    if args.what == "infer" and args.runs < 1000:
        p.error(f"--runs must be at least 1000 (a p99 needs them), got {args.runs}")
    from minidl.backend import cuda_status
    ok, why = cuda_status()
    if not ok:
        print(f"bench: the benchmarks need a GPU: {why}", file=sys.stderr)
        return 2
    if args.what == "tta":
        results = {**bench_tta(args.seeds, args.recipe, args.target), "environment": _environment()}
    elif args.what == "train":
        results = bench_train(names, precision=args.precision, channels_last=args.channels_last)
    else:
        results = {"cases": bench_infer(names, runs=args.runs, precision=args.precision), "environment": _environment(),
                   "precision": args.precision}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
