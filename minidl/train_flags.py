"""The flags of python -m minidl.train (minidl.warmup's too): their names, types, defaults and help.

What a flag's value may be beyond its type (a batch larger than the data, -n with --epochs, a
checkpoint that cannot be written) is minidl.train.check_args's to refuse, before any data is read.
"""
from __future__ import annotations

import argparse

from minidl import distributed, models, recipes
from minidl.recipes import DEFAULT_STEPS

# Split sizes, known without reading a file, so that flags are checked before any data is loaded.
IMAGES = {"train": 60_000, "test": 10_000}          # MNIST and Fashion-MNIST alike


def positive(v: str) -> int:
    """argparse type: an integer > 0."""
    n = int(v)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return n


def add_precision(p: argparse.ArgumentParser, what: str, default: str | None = "fp32") -> None:
    """The --precision flag (minidl.precision's policies), shared with minidl.infer."""
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=default, help=f"precision (fp32): {what}")


def parser() -> argparse.ArgumentParser:
    """The training command line's flags; their values are checked by minidl.train.check_args."""
    p = argparse.ArgumentParser(
        prog="python -m minidl.train",
        description="Train a net of minidl's zoo on MNIST / Fashion-MNIST, then score the whole test set. "
                    "Flags left out take the model's default recipe (minidl/recipes.py; each run prints it).")
    p.add_argument("-b", dest="batch_size", type=positive, default=32, help="batch size (32)")
    # default None: a -n given is told from one left out (refused with --epochs; recipes.steps resolves it)
    p.add_argument("-n", dest="steps", type=positive, default=None,
                   help=f"training steps ({DEFAULT_STEPS}; not with --epochs)")
    p.add_argument("-m", dest="monitor", type=positive, default=100, help="monitoring interval in steps (100)")
    p.add_argument("-l", dest="load", action="store_true", help="load the checkpoint's weights before training")
    p.add_argument("-s", dest="save", action="store_true", help="save a checkpoint after training")
    p.add_argument("-x", dest="test_batch", type=positive, default=1000, help="test batch size (1000)")
    p.add_argument("-y", dest="test_steps", type=positive, default=10,
                   help="test steps (10: the whole test set at -x 1000)")
    p.add_argument("-r", dest="depth", type=int, choices=(18, 34, 50, 101, 152),
                   help="ResNet depth; implies --model resnet")
    p.add_argument("--model", choices=models.names(), metavar="NAME",
                   help=f"network, one of {', '.join(models.names())} (lenet; resnet with -r, default 18)")
    p.add_argument("--epochs", type=positive, help="train whole epochs instead of -n steps (not with -n)")
    p.add_argument("--optimizer", choices=tuple(recipes.DEFAULT_LR), help="optimizer (the recipe's; momentum is 0.9)")
    p.add_argument("--lr", type=float, help="learning rate (the recipe's; another optimizer's: adam/rmsprop 1e-3, "
                                            "momentum 0.05, sgd 0.01)")
    p.add_argument("--schedule", choices=("cosine", "constant", "step", "inverse-time"),
                   help="learning-rate schedule over the run's steps (cosine: to 0 at the last step; "
                        "step: x0.1 every third of the run; inverse-time: lr/(1+1e-4*step), the C++ trainer's)")
    p.add_argument("--warmup", type=int, metavar="STEPS", help="linear lr warm-up over the first STEPS steps")
    p.add_argument("--weight-decay", type=float, help="L2 weight decay")
    p.add_argument("--label-smoothing", type=float, metavar="EPS", help="label smoothing of the training loss")
    p.add_argument("--shift", type=int, metavar="PIXELS", help="shift training images by up to PIXELS (0: none)")
    p.add_argument("--flip", action=argparse.BooleanOptionalAction,
                   help="mirror each training image left to right with probability 1/2 (--no-flip: never)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="device (auto)")
    add_precision(p, "convolutions, dense layers and activations in bf16/fp16 with fp32 accumulation; fp32 "
                     "master weights, optimizer state, BN statistics and loss; fp16 with dynamic loss scaling")
    p.add_argument("--data-dir", help="dataset folder, searched alone (it must exist); without it: $MINIDL_DATA, "
                                      "./dataset, /usr/share/datasets, then a download")
    p.add_argument("--dataset", choices=("mnist", "fashion-mnist"), default="mnist", help="dataset (mnist)")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, shuffling and dropout (0)")
    p.add_argument("--threads", type=positive, help="CPU: BLAS/OpenMP threads (1, or $OMP_NUM_THREADS)")
    p.add_argument("--checkpoint", help="checkpoint path (checkpoints/<model>.npz)")
    p.add_argument("--grad-reduce", choices=distributed.GRAD_REDUCE, default="fp32",
                   help="several ranks: the dtype gradients travel in (fp32; bf16: half the bytes, rounded)")
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="GPU: run each step eagerly instead of replaying it as one CUDA graph")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="GPU: convolutions write channels-last (NHWC) activations (default: in bf16/fp16, "
                        "where it is faster)")
    tf = p.add_mutually_exclusive_group()
    tf.add_argument("--tf32", dest="tf32", action="store_true", default=True,
                    help="GPU: allow TF32 tensor cores in FP32 convolutions (the default)")
    tf.add_argument("--no-tf32", dest="tf32", action="store_false", help="GPU: full FP32 convolutions")
    p.add_argument("--nondeterministic", action="store_true",
                   help="GPU: let cuDNN pick engines that reduce in any order (faster for some shapes; "
                        "seeded runs then differ in the last bits)")
    p.add_argument("--metrics", metavar="PATH",
                   help="append one JSON line per monitoring interval and per evaluation (minidl.plot draws them)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write the same records as TensorBoard scalars into DIR (needs tensorboardX)")
    p.add_argument("--save-every", type=positive, metavar="N",
                   help="also save a resumable checkpoint every N steps (to --checkpoint)")
    p.add_argument("--resume", action="store_true",
                   help="restore weights, optimizer state and step from the checkpoint and continue")
    return p
