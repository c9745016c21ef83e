"""python -m minidl.infer: test accuracy, latency and a per-op profile of a compiled model.

    python -m minidl.infer --checkpoint checkpoints/lenet5.npz --latency
    python -m minidl.infer --checkpoint checkpoints/resnet18.npz --save-artifact resnet18.artifact.npz
    python -m minidl.infer --artifact resnet18.artifact.npz --profile --batch-size 1000
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from .. import cli
from .flags import (Parser, add_checkpoint, add_data, add_device, add_precision, add_threads, check_args, positive,
                    run_cli)

if TYPE_CHECKING:
    from .._types import Array
    from ..data.loader import Loader
    from ..inference import InferenceModel, OpTime

THROUGHPUT_IMAGES = 10_000


def parser() -> Parser:
    p = Parser(
        prog=cli.prog("infer"),
        description="Compile a trained model for inference (BN folded, ReLU fused, CUDA graphs on the "
                    "GPU) and report its accuracy over the whole test set, optionally its latency and "
                    "a per-op profile.")
    src = p.add_mutually_exclusive_group(required=True)
    add_checkpoint(p, "a training checkpoint to compile (python -m minidl.train -s)", src)
    p.note(src.add_argument("--artifact", help="an inference artifact written by --save-artifact"))
    p.add_argument("--batch-size", type=positive, default=1000, help="batch size for accuracy and profile (1000)")
    p.add_argument("--latency", action="store_true",
                   help="batch-1 latency (median, p99) and throughput over 10,000 images in one batch")
    p.add_argument("--runs", type=positive, default=1000, help="batch-1 runs timed by --latency (1000)")
    p.add_argument("--profile", action="store_true", help="print a per-op time table at --batch-size")
    add_device(p)
    add_data(p, "dataset folder (else $MINIDL_DATA, ./dataset, /usr/share/datasets)", default=None,
             what="dataset (the one the checkpoint was trained on; another is refused; mnist where it does not say)")
    p.add_argument("--save-artifact", metavar="PATH", help="write the compiled model as a weights-only artifact")
    p.add_argument("--no-graphs", action="store_true",
                   help="run the ops eagerly on the GPU instead of replaying CUDA graphs (debugging)")
    p.add_argument("--no-direct", action="store_true",
                   help="one kernel call per op instead of the fused direct kernels (conv+ReLU+pool, "
                        "dense chains, a whole LeNet in one kernel at small batch)")
    p.add_argument("--no-tf32", action="store_true",
                   help="full FP32 convolutions on the GPU (TF32 is on by default)")
    add_threads(p)
    add_precision(p, "compile the checkpoint with convolutions, dense layers and activations in bf16/fp16 (BN "
                     "folded in fp32 first), report how often its predictions agree with fp32's, save artifacts "
                     "in it; an artifact keeps the precision it was compiled in", default=None)
    return p


def accuracy(model: InferenceModel, loader: Loader) -> float:
    """Percentage of argmax hits over the loader's batches, counted on the device, read once."""
    xp = model.device.xp
    hits = xp.zeros((), dtype=np.int64)
    for x, y in loader:
        z = model.predict(x)
        hits += (xp.argmax(z, axis=1) == y).sum()   # queued before the next predict reuses z
    return 100.0 * int(hits) / loader.N


def agreement(model: InferenceModel, reference: Callable[[Array], Array], loader: Loader) -> float:
    """Percentage of images where `model` and `reference` (a function of a batch) predict the same class
    (argmax), counted on the device."""
    xp = model.device.xp
    same = xp.zeros((), dtype=np.int64)
    for x, _ in loader:
        a = xp.argmax(model.predict(x), axis=1)
        same += (a == xp.argmax(reference(x), axis=1)).sum()
    return 100.0 * int(same) / loader.N


def latency(model: InferenceModel, x1: Array, runs: int) -> tuple[float, float]:
    """Seconds per batch-1 call with the input already in the model's input buffer, one sync per run."""
    dev = model.device
    buf = model.input_buffer(1)
    buf[...] = x1
    for _ in range(10):
        model.predict(buf)
    times = np.empty(runs)
    for i in range(runs):
        dev.sync()
        t0 = time.perf_counter()
        model.predict(buf)
        dev.sync()
        times[i] = time.perf_counter() - t0
    return float(np.median(times)), float(np.percentile(times, 99))


def throughput(model: InferenceModel, x: Array) -> tuple[float, int]:
    """(seconds per call, calls) for one batch holding all of x, at least 3 calls and about 1 s."""
    dev = model.device
    buf = model.input_buffer(len(x))
    buf[...] = x
    model.predict(buf)
    dev.sync()
    calls, t0 = 0, time.perf_counter()
    while calls < 3 or (calls < 50 and time.perf_counter() - t0 < 1.0):
        model.predict(buf)
        dev.sync()                                    # a sync per call: the clock reads finished work
        calls += 1
    return (time.perf_counter() - t0) / calls, calls


def _kinds(model, N):
    steps = model.schedule(N)[0]
    return f"{len(steps)} call{'s' * (len(steps) != 1)} ({', '.join(st.kind for st in steps)})"


def print_profile(rows: list[OpTime], out: Callable[[str], Any]) -> None:
    """One line per kernel call: name, kind, output shape, microseconds and share of the total."""
    shapes = ["(" + ", ".join(map(str, r.shape)) + ")" for r in rows]
    w, ws = max(2, *(len(r.name) for r in rows)), max(6, *(len(s) for s in shapes))
    total = sum(r.ms for r in rows) or 1.0
    out(f"{'op':<{w}}  {'kind':<10}  {'output':<{ws}}  {'time (us)':>10}  {'share':>6}")
    for r, shape in zip(rows, shapes):
        out(f"{r.name:<{w}}  {r.kind:<10}  {shape:<{ws}}  {1e3 * r.ms:>10.1f}  {100 * r.ms / total:>5.1f}%")
    out(f"{'total':<{w}}  {'':<10}  {'':<{ws}}  {1e3 * total:>10.1f}")


def run(args: argparse.Namespace, out: Callable[[str], Any] = print) -> float:
    import minidl as dl
    from minidl import data, inference
    from minidl.data.loader import Loader
    from minidl.threads import set_threads

    set_threads(args.threads)
    device = dl.get_device(args.device, verbose=True)
    if args.no_tf32:
        device.set_tf32(False)
    if args.checkpoint:
        model = inference.compile(args.checkpoint, device=device, precision=args.precision)
        s = model.stats
        out(f"compiled {args.checkpoint}: {s.get('layers', '?')} layers -> {len(model.nodes)} nodes "
            f"({s.get('batchnorm_folded', 0)} BN folded, {s.get('relu_fused', 0)} ReLU fused, "
            f"{s.get('pad_folded', 0)} pads folded, {s.get('dropout_removed', 0)} dropout removed)")
    else:
        model = inference.load(args.artifact, device=device)
        out(f"loaded {args.artifact}: {model.name}, {len(model.nodes)} nodes, {model.n_params:,} parameters, "
            f"{model.precision}")
        if args.precision not in (None, model.precision):
            raise ValueError(f"--precision {args.precision}: {args.artifact} was compiled in {model.precision}; "
                             "compile the checkpoint in another precision instead")
    if getattr(args, "dataset_note", None):              # a file that does not say its dataset
        print(args.dataset_note, file=sys.stderr)
    if args.no_graphs:
        model.cuda_graphs = False
    if args.no_direct:
        model.direct = False
    out(f"schedule: batch 1 {_kinds(model, 1)}; batch {args.batch_size} {_kinds(model, args.batch_size)}")
    if args.save_artifact:
        model.save(args.save_artifact)
        out(f"saved {args.save_artifact}")

    images, labels = data.load(args.dataset, "test", args.data_dir)
    # every model compiled now takes [0, 1] images (docs/input.md); an artifact from before, normalised ones
    loader = Loader(images, labels, args.batch_size, device, shuffle=False, drop_last=False,
                    normalize=not model.images)
    if tuple(loader.x.shape[1:]) != model.input_shapes[0]:
        raise ValueError(f"the model takes inputs {model.input_shapes[0]}, {args.dataset} images are "
                         f"{tuple(loader.x.shape[1:])}")
    t0 = time.perf_counter()
    acc = accuracy(model, loader)
    out(f"accuracy: {acc:.3f}% ({loader.N} {args.dataset} test images, batch {args.batch_size}, "
        f"{time.perf_counter() - t0:.2f} s with compilation)")
    if args.checkpoint and model.precision != "fp32":
        # against the model itself, layer by layer in fp32 (Model.forward), not another lowering of it:
        # a fault of the passes or the schedule then shows here too
        from minidl.checkpoint import load_model
        reference = load_model(args.checkpoint, device=device)
        same = agreement(model, lambda x: reference.forward(x, training=False), loader)
        out(f"{model.precision} agrees with fp32 on {same:.2f}% of the {loader.N} test predictions (the fp32 "
            "model itself, Model.forward)")

    if args.profile:
        rows = model.profile(loader.x[:args.batch_size])
        how = "CUDA events over graph-captured repeats" if device.name == "cuda" else "perf_counter, median"
        out(f"profile at batch {min(args.batch_size, loader.N)} ({how}):")
        print_profile(rows, out)

    if args.latency:
        med, p99 = latency(model, loader.x[:1], args.runs)
        out(f"latency (batch 1, {args.runs} runs, input on the device): median {1e6 * med:.1f} us, "
            f"p99 {1e6 * p99:.1f} us")
        n = min(THROUGHPUT_IMAGES, loader.N)
        sec, calls = throughput(model, loader.x[:n])
        out(f"throughput ({n} images in one batch, {calls} calls): {1e3 * sec:.3f} ms per call, "
            f"{n / sec:,.0f} images/s")
    return acc


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    return run_cli(run, check_args(p, p.parse_args(argv), trains=False))


if __name__ == "__main__":
    sys.exit(main())
