"""python -m minidl.warmup: fill the GPU caches a training run needs, ahead of time.

    python -m minidl.warmup --model resnet -r50 -b32 [--precision bf16]

Takes `python -m minidl.train`'s flags and does what that command does before its first step and at
its first evaluation (CUDA kernels compiled, cuDNN engines timed, the step captured), on synthetic
images, so that the caches hold all of it: an image built for a cluster runs this once, and every run
of the same flags afterwards starts in seconds. The caches are CuPy's compiled kernels in
$CUPY_CACHE_DIR (default ~/.cupy/kernel_cache) and the cuDNN engine choices in $MINIDL_CACHE
(default ~/.cache/minidl); it prints both folders and their sizes. Flags that only matter after the
start (-n, -m, --metrics, ...) are accepted and ignored. Without a usable GPU it says so in one line
and exits with status 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from minidl.cli import recipes
from minidl.cli.flags import IMAGES, Parser, check_args, run_cli, training_parser
from minidl.cli.run import build_run, device_for

if TYPE_CHECKING:
    from minidl.backend import Device
    from minidl.training.trainer import Trainer


def parser() -> Parser:
    """minidl.train's parser under this command's name: the same flags mean the same run."""
    return training_parser("python -m minidl.warmup", "Fill the compile and cuDNN engine caches for the training "
                           "run these flags describe (python -m minidl.train's flags), on synthetic images.")


def synthetic(n: int, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 28, 28), labels uint8 (n,)): MNIST's shapes and types, random values."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), (np.arange(n) % classes).astype(np.uint8)


def build_trainer(args: argparse.Namespace, device: Device, train_images: int = IMAGES["train"]) -> Trainer:
    """The model, optimizer and Trainer `python -m minidl.train` builds for `args` on `device` (cli/run.py's
    build_run, over an epoch of `train_images`), printing nothing."""
    plan = recipes.plan(args)
    return build_run(args, device, plan, train_images // args.batch_size, log=lambda *a, **k: None,
                     progress=False).trainer


def caches() -> list[tuple[str, str]]:
    """[(what, folder)] of the caches a GPU run fills."""
    cupy_dir = os.environ.get("CUPY_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cupy", "kernel_cache")
    engines = importlib.import_module("minidl.kernels.gpu.engines")
    return [("CUDA kernels (CuPy)", cupy_dir), ("cuDNN engine choices", os.path.dirname(engines.cache_path()))]


def folder_bytes(folder: str) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(root, f))
            except OSError:
                pass
    return total


def run(args: argparse.Namespace, out: Callable[[str], Any] = print) -> None:
    device = device_for(args, "cuda")
    progress = importlib.import_module("minidl.kernels.gpu._cuda").progress
    t0 = time.perf_counter()
    trainer = build_trainer(args, device)
    stop = progress.listen(out)
    try:
        trainer.fit(synthetic(2 * args.batch_size), steps=1, batch_size=args.batch_size, monitor=1)
        trainer.evaluate(synthetic(args.test_batch), batch_size=args.test_batch, steps=1)
    finally:
        stop()
    out(f"warm-up done in {time.perf_counter() - t0:.1f} s: {progress.compiled} kernels compiled, "
        f"{progress.timed} convolutions timed")
    for what, folder in caches():
        out(f"{what}: {folder} ({folder_bytes(folder) / 1e6:.1f} MB)")


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = check_args(p, p.parse_args(argv))
    from minidl.backend import cuda_status
    ok, why = (False, "--device cpu was asked for") if args.device == "cpu" else cuda_status()
    if not ok:
        print(f"minidl.warmup: needs a usable CUDA GPU: {why}", file=sys.stderr)
        return 2
    return run_cli(run, args)


if __name__ == "__main__":
    sys.exit(main())
