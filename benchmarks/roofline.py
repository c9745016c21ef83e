"""python benchmarks/roofline.py [--device NAME] [--measured [PRECISION=]FILE ...]: each bench row against its limit.

Issue 30, point 2, the part that needs no GPU. For every row of the issue's table (the cases of bench_infer.py and
bench_train.py: lenet-10k, lenet-b32, lenet-b256, resnet50 (b32), resnet50-b256, resnet50-b1, resnet50-b1000) and
each precision (fp32, bf16) it builds the zoo model on the CPU, lowers it as minidl runs it (graph/passes.py: the
inference lowering, or the training lowering) and counts from the nodes' shapes:

- arithmetic: 2 x MACs of every convolution and dense layer, forward; training adds wgrad and dgrad (each as much
  as the forward), except the dgrad of a layer fed by the model input (through views), which the step skips
  (`input_grads=False` in minidl/training/step.py);
- least memory traffic: the input read once (float32 images); every activation written once and read once in the
  forward, and in training its gradient written once and read once and the activation itself read once more in
  backward (an Add saves nothing); Flatten and a zero Pad2D move nothing (a view; padding a conv applies itself);
  weights read once per pass; training also writes the float32 gradients once and runs the optimizer once over the
  arena (weights read and written, gradients read, each state array of TRAIN_CASES' optimizer read and written).
  Activations in the row's dtype (bf16: 2 bytes); training weights, gradients and optimizer state are the float32
  master (4 bytes); bf16 inference reads its weights in bf16. "elementwise MB" is the part of the traffic that
  BN, ReLU, pooling and Add move: they are counted as bytes, not FLOPs;
- the time each needs at the GPU's datasheet peak (PEAKS; fp32 convolutions on TF32 tensor cores, cuDNN's default
  in minidl; fp32 dense layers on the FP32 cores, cuBLAS's default math), the limit (the larger of the two) and,
  given measured times, the fraction of the limit achieved (limit / measured).

--measured takes a JSON file, repeatable: {"lenet-10k": {"fp32": 0.314, "bf16": 1.708}, ...} (ms per call or step),
or what `benchmarks/bench.py train|infer --json` writes (minidl's graphed figure of each case; an infer file names its
precision; a train file does not, so pass it as bf16=FILE; fp32 is assumed otherwise).

The kernel count per step and the launch floor (an empty CUDA graph of that many nodes, replayed) need the device:
benchmarks/roofline_gpu.py measures them there (with the busiest kernels of each row) and `--gpu FILE` adds its
figures as two more columns.

    python benchmarks/roofline.py --device "NVIDIA H200" --measured bf16=train_bf16.json --measured infer_fp32.json \
        --gpu gpu.json
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, cast

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:             # `python benchmarks/roofline.py` puts only benchmarks/ there
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_infer import INFER_CASES  # noqa: E402
from benchmarks.bench_train import TRAIN_CASES  # noqa: E402

if TYPE_CHECKING:
    from minidl.graph import Model, Node

# Datasheet peaks (dense, no 2:4 sparsity), TFLOPS and TB/s, keyed by the name CUDA reports. H100 SXM5: FP32 66.9,
# TF32 tensor 494.7 (989.4 is with sparsity), BF16 tensor 989.4, HBM3 3.35 TB/s
# (https://glennklockwood.com/garden/processors/h100, from NVIDIA's H100 datasheet and Hopper whitepaper). H200:
# the same GH100 compute, HBM3e 4.8 TB/s (https://lzwjava.github.io/nvidia-h200-gpu-specs-en,
# https://www.aiminingco.com/gpu/h200/specs).
PEAKS: dict[str, dict[str, float]] = {
    "NVIDIA H100 80GB HBM3": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "hbm": 3.35e12},
    "NVIDIA H200": {"fp32": 66.9e12, "tf32": 494.7e12, "bf16": 989.4e12, "hbm": 4.8e12},
}
DEFAULT_DEVICE = "NVIDIA H100 80GB HBM3"
# The math each GEMM family runs in under a precision: minidl's cuDNN convolutions take TF32 engines in fp32
# (Device.set_tf32, on by default); its cuBLAS dense layers run full FP32 (kernels/gpu/_cublas.py).
MATH = {"fp32": {"conv2d": "tf32", "dense": "fp32"}, "bf16": {"conv2d": "bf16", "dense": "bf16"}}
ACT_BYTES = {"fp32": 4, "bf16": 2}
PRECISIONS = tuple(MATH)
ROWS = ("lenet-10k", "lenet-b32", "lenet-b256", "resnet50", "resnet50-b256", "resnet50-b1", "resnet50-b1000")
GEMMS = ("conv2d", "dense")
VIEWS = ("flatten", "pad")                # move nothing at the limit
SAVES_NOTHING = ("add",)                  # whose backward reads no activation


@dataclass
class Work:
    """What one call or step must do: GEMM FLOPs by family, and bytes moved (of which `eltwise` by non-GEMM layers)."""
    flops: dict[str, float]
    bytes: float
    eltwise: float

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())


@dataclass
class Limit:
    """A row's work and the time it needs at the device's peaks (seconds)."""
    row: str
    precision: str
    work: Work
    compute_s: float
    memory_s: float

    @property
    def limit_s(self) -> float:
        """The row cannot run faster than the slower of its arithmetic and its memory traffic."""
        return max(self.compute_s, self.memory_s)


@dataclass
class GpuFigures:
    """The GPU-only figures of a row: kernels per step (captured graph nodes) and the launch floor (seconds)."""
    kernels: int
    launch_floor_s: float


def read_gpu(path: str) -> dict[tuple[str, str], GpuFigures]:
    """{(row, precision): GpuFigures} from what `benchmarks/roofline_gpu.py --json` wrote on the device."""
    with open(path) as f:
        data = json.load(f)
    return {(row, p): GpuFigures(round(float(fig["kernels"])), float(fig["launch_floor_us"]) / 1e6)
            for row, by_precision in data.items() for p, fig in by_precision.items()}


def case(row: str) -> tuple[dict[str, Any], bool]:
    """(the bench case of `row`, whether it trains)."""
    if row in TRAIN_CASES:
        return cast("dict[str, Any]", TRAIN_CASES[row]), True
    return cast("dict[str, Any]", INFER_CASES[row]), False


def lower(model: Model, training: bool) -> Model:
    """`model` as minidl runs it: the training lowering (passes.training), or the inference one (BN folded, pads
    folded, ReLUs fused; passes.inference) on the CPU."""
    import numpy as np

    from minidl.graph import Graph, Model, passes
    if training:
        return model.lower(passes.training)
    graph = passes.inference(Graph.of(model, weights={k: v.astype(np.float64) for k, v in model.get_weights().items()}))
    return Model.of_graph(graph, model.device, name=model.name, weights=graph.weights)


def lowered(name: str, depth: int | None, training: bool) -> Model:
    """The zoo model `name` built on the CPU and lowered (`lower`)."""
    from minidl import models
    return lower(models.get(name, depth=depth, device="cpu"), training)


def _size(shape: Sequence[int | None], N: int) -> int:
    return N * math.prod(int(s or 0) for s in shape[1:])      # shapes carry the batch dimension first, as None


def _fed_by_input(node: Node) -> bool:
    """Whether the node reads a model input directly or through views (its dgrad is never needed)."""
    p = node.parents[0]                 # a residual conv's second input (its shortcut) is no image
    while p.layer is not None and p.kind in VIEWS:
        p, = p.parents
    return p.layer is None


def gemm_flops(node: Node, N: int) -> float:
    """Forward FLOPs (2 x MACs) of a conv or dense node at batch N: 2 N K oH oW C kH kW, or 2 N K C."""
    layer, x = node.layer, node.parents[0].shape           # a residual conv's shortcut adds no MACs
    if node.kind == "conv2d":
        kH, kW = layer.ksize  # type: ignore[attr-defined]  # a Conv2D (its kind)
        return 2.0 * _size(node.shape, N) * x[1] * kH * kW
    return 2.0 * _size(node.shape, N) * x[1]


def count(model: Model, N: int, precision: str, training: bool, slots: int = 0) -> Work:
    """The arithmetic and least memory traffic of one forward (and, training, backward and update) at batch N."""
    a = ACT_BYTES[precision]
    flops = {g: 0.0 for g in GEMMS}
    x = _size(model.inputs[0].shape, N) * 4.0       # float32 images, read once (and by wgrad in backward)
    moved, eltwise = x * (2 if training else 1), 0.0
    for node in model.nodes:
        if node.kind in VIEWS:
            continue
        out = _size(node.shape, N) * a
        fwd = 2 * out                                   # written once, read once
        bwd = (2 * out + (0 if node.kind in SAVES_NOTHING else out)) if training else 0
        moved += fwd + bwd
        if node.kind in GEMMS:
            passes = (2 if _fed_by_input(node) else 3) if training else 1    # fprop [+ wgrad [+ dgrad]]
            flops[node.kind] += passes * gemm_flops(node, N)
        else:
            eltwise += fwd + bwd
    params = list(model.params.values())
    P = sum(p.size for p in params if p.trainable)
    if training:                 # float32 master: read in forward and backward, gradients written, one update
        stats = sum(p.size for p in params if not p.trainable)     # BN running statistics, read and written
        moved += 4.0 * (2 * P + 2 * stats + P + P * (3 + 2 * slots))
    else:
        moved += a * sum(p.size for p in params)
    return Work(flops, moved, eltwise)


def limit(row: str, precision: str, peaks: Mapping[str, float], model: Model | None = None) -> Limit:
    """The Limit of one row under one precision on a device of `peaks`."""
    c, training = case(row)
    model = model if model is not None else lowered(c["model"], c["depth"], training)
    slots = len(_optimizer(c).slots) if training else 0
    work = count(model, c["batch"], precision, training, slots)
    compute = sum(f / peaks[MATH[precision][g]] for g, f in work.flops.items())
    return Limit(row, precision, work, compute, work.bytes / peaks["hbm"])


def _optimizer(c: Mapping[str, Any]) -> Any:
    from minidl import optim
    return optim.get(c["optimizer"], lr=c["lr"])


def limits(peaks: Mapping[str, float], rows: Sequence[str] = ROWS,
           precisions: Sequence[str] = PRECISIONS) -> list[Limit]:
    """Every row under every precision; each model is built and lowered once."""
    built: dict[tuple[str, int | None, bool], Model] = {}
    out: list[Limit] = []
    for row in rows:
        c, training = case(row)
        key = (c["model"], c["depth"], training)
        if key not in built:
            built[key] = lowered(*key)
        out.extend(limit(row, p, peaks, built[key]) for p in precisions)
    return out


def read_measured(spec: str) -> dict[tuple[str, str], float]:
    """{(row, precision): ms} from `[PRECISION=]FILE`: a {row: {precision: ms}} mapping or bench.py's --json."""
    precision, path = "", spec
    head, sep, tail = spec.partition("=")
    if sep and head in PRECISIONS:
        precision, path = head, tail
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if "cases" in data:                               # bench.py infer --json
        precision = precision or str(data.get("precision", "fp32"))
        return {(row, precision): float(r["minidl"]["ms_per_call"]) for row, r in data["cases"].items()}
    out: dict[tuple[str, str], float] = {}
    for row, r in data.items():
        if isinstance(r, dict) and "minidl" in r:     # bench.py train --json
            out[(row, precision or "fp32")] = float(r["minidl"]["ms_per_step"])
        elif isinstance(r, dict):
            out.update({(row, p): float(ms) for p, ms in r.items()})
        else:
            raise ValueError(f"{path}: row {row!r} is neither {{precision: ms}} nor bench.py's figures")
    return out


def _us(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e6:.1f}"


def table(rows: Sequence[Limit], measured: Mapping[tuple[str, str], float] | None = None,
          gpu: Mapping[tuple[str, str], GpuFigures] | None = None) -> str:
    """The Markdown table; measured: {(row, precision): ms}; gpu: {(row, precision): GpuFigures} (read_gpu)."""
    measured, gpu = measured or {}, gpu or {}
    head = ["row", "precision", "GFLOP", "MB moved", "elementwise MB", "compute-bound us", "memory-bound us",
            "limit us", "measured us", "fraction"] + (["kernels", "launch floor us"] if gpu else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ms = measured.get((r.row, r.precision))
        cells = [r.row, r.precision, f"{r.work.total_flops / 1e9:.3f}", f"{r.work.bytes / 1e6:.2f}",
                 f"{r.work.eltwise / 1e6:.2f}", _us(r.compute_s), _us(r.memory_s), _us(r.limit_s),
                 _us(None if ms is None else ms / 1e3), "-" if ms is None else f"{r.limit_s / (ms / 1e3):.1%}"]
        if gpu:
            g = gpu.get((r.row, r.precision))
            cells += ["-", "-"] if g is None else [str(g.kernels), _us(g.launch_floor_s)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def peaks_of(name: str) -> dict[str, float] | None:
    """The datasheet peaks of a device by the name CUDA reports (case-insensitive), or None."""
    return next((v for k, v in PEAKS.items() if k.lower() == name.strip().lower()), None)


def main(argv: Sequence[str] | None = None, out: Callable[[str], object] = print) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/roofline.py", description=__doc__.splitlines()[0])
    p.add_argument("--device", default=DEFAULT_DEVICE, help=f"GPU name as CUDA reports it ({DEFAULT_DEVICE})")
    p.add_argument("--measured", action="append", default=[], metavar="[PRECISION=]FILE",
                   help="measured ms per row: {row: {precision: ms}} or bench.py --json (repeatable)")
    p.add_argument("--gpu", metavar="FILE", help="kernels per step and launch floors from roofline_gpu.py --json")
    args = p.parse_args(argv)
    peaks = peaks_of(args.device)
    if peaks is None:
        print(f"roofline: no datasheet peaks for {args.device!r}: known {', '.join(PEAKS)}", file=sys.stderr)
        return 2
    measured: dict[tuple[str, str], float] = {}
    try:
        for spec in args.measured:
            measured.update(read_measured(spec))
        gpu = read_gpu(args.gpu) if args.gpu else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"roofline: cannot read measured figures: {e}", file=sys.stderr)
        return 2
    out(f"Limits on {args.device} (datasheet peaks; time = max(FLOPs / peak, bytes / HBM bandwidth))\n")
    out(table(limits(peaks), measured, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
