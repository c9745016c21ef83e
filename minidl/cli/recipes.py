"""The default recipe of each model: what `python -m minidl.train` trains with where no flag says
otherwise. Each was chosen against the targets in docs/results.md (The default recipes: targets and
evidence), where its accuracies are measured; `benchmarks/recipes.sh` runs them all.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Callable

from .. import distributed, models, optim
from .runplan import RunPlan

# Per model: optimizer, lr, schedule, warm-up steps, weight decay, label smoothing, shift in pixels,
# horizontal flips.
# LeNet-5 (CPU, seed 0): Adam at 3e-3 reaches 96.8% after -n300 (1e-3: 94.0%); shifts of 2 pixels
# with label smoothing 0.1 lift 10 epochs from 99.2% to 99.4%. ResNets: momentum 0.9 at 0.025 with
# cosine decay, no warm-up, label smoothing 0.1. ResNet-50 -b32 -n500 on the CPU, seeds 0, 1, 2:
# 97.83, 98.16, 97.82% (the former 0.05 with 50 warm-up steps: 97.01% at seed 0; 0.025 with them:
# 97.17, 97.42% at seeds 0, 1). The zero-init residual BN (models/resnet.py) lets them start at the
# full rate; without it the former recipe left ResNet-50 at 36.9%. On the GPU it gives about
# the same; shifts hurt -n500 there, so the ResNets train unshifted (docs/results.md has the figures).
RECIPES = {
    "lenet": {"optimizer": "adam", "lr": 3e-3, "schedule": "cosine", "warmup": 0, "weight_decay": 0.0,
              "label_smoothing": 0.1, "shift": 2, "flip": False},
    "resnet": {"optimizer": "momentum", "lr": 0.025, "schedule": "cosine", "warmup": 0, "weight_decay": 0.0,
               "label_smoothing": 0.1, "shift": 0, "flip": False},
}
# The cuDNN-vs-PyTorch study's nets train as the study trained them (benchmarks/compare.py, which
# measured their accuracies against PyTorch's): plain SGD at 0.01, constant, nothing added.
STUDY = {"optimizer": "sgd", "lr": 0.01, "schedule": "constant", "warmup": 0, "weight_decay": 0.0,
         "label_smoothing": 0.0, "shift": 0, "flip": False}
RECIPES.update({name: STUDY for name in ("simplenet", "lenet-caffe", "relunet", "largenet")})
# Per dataset, what differs from the model's recipe: Fashion-MNIST's garments fill the frame, so a
# shift cuts them off (LeNet-5, 10 epochs: 90.6% with shifts of 2 pixels, 91.3% without).
DATASETS = {"mnist": {}, "fashion-mnist": {"shift": 0}}
# Per model and dataset, what differs from both. LeNet-5 on Fashion-MNIST, 10 epochs (CPU, seeds 0
# to 3): weight decay 2e-4 gives 91.43, 91.41, 91.08, 91.31% against 90.99, 90.96, 91.18, 91.29%
# without (a test loss of 0.31-0.32 against 0.33; 1e-4: 91.47, 91.52, 90.88, 91.19%); a small gain,
# the size of the seeds' spread. Horizontal flips (--flip) do not help in ten epochs: 91.01, 90.86%
# (seeds 0, 1, without weight decay); they cost the net 2 points of training accuracy.
MODEL_DATASET = {("lenet", "fashion-mnist"): {"weight_decay": 2e-4}}
# Named recipes (--recipe NAME), each for one model: what differs from that model's recipe, and the batch
# size and run length it plans where -b, -n and --epochs are left out. `fast`: LeNet-5 to 99.0% MNIST test
# accuracy in the fewest steps (with --target-accuracy 99 the run stops there, scoring the test set every
# `eval_every` steps). Tuned on the CPU (docs/training.md, Time to accuracy, has the sweep): seeds 0-4 reach
# 99.0% at steps 432, 336, 288, 432, 372 (mean 372, 1.59 epochs; at lr 5e-3: mean 432); shifts of 1 pixel
# reach it sooner than none (which plateau near 98.95%) or 2, and batch 256 in half the steps of 128 at about
# the same images (512: not reached in 3 epochs).
NAMED = {
    "fast": {"model": "lenet", "batch_size": 256, "epochs": 3, "optimizer": "adam", "lr": 7e-3, "schedule": "cosine",
             "warmup": 20, "weight_decay": 0.0, "label_smoothing": 0.1, "shift": 1, "flip": False, "eval_every": 12,
             "test_batch": 10000},
}
# `fast` scores the whole test set as one batch: its target's evaluations (one every 12 steps) spent their time
# in the host's launches of ten batches, more than its training took (docs/results.md)
DEFAULT_BATCH = 32           # -b where neither the flag nor a named recipe gives it
DEFAULT_TEST_BATCH = 1000    # -x where neither the flag nor a named recipe gives it
# The learning-rate schedules a run plan names (RunPlan.schedule_fn builds each over the run).
SCHEDULES = ("cosine", "constant", "step", "inverse-time")
# An optimizer other than the recipe's (--optimizer without --lr) takes its own class's `default_lr`.
DEFAULT_STEPS = 2000         # the run's length where neither -n nor --epochs is given
MAX_SHIFT = 8                # of a 28x28 image: beyond this a shift leaves little of a digit


def default_lr(optimizer: str) -> float:
    """The learning rate of `optimizer` where neither a flag nor the model's recipe gives one: its class's."""
    return float(optim.OPTIMIZERS[optimizer].default_lr)      # type: ignore[arg-type]  # registered: a number


def named(args: argparse.Namespace) -> dict[str, Any]:
    """The named recipe --recipe gives (NAMED's entry), {} for the default recipes (or without the flag)."""
    return NAMED.get(getattr(args, "recipe", None) or "default", {})


def fill(a: dict[str, Any]) -> None:
    """What a named recipe plans where the flags leave it out (a: the parsed flags as a dict, changed in
    place): -b (else DEFAULT_BATCH), -x (else DEFAULT_TEST_BATCH), without -n and --epochs the run's length
    in epochs, and with --target-accuracy the steps between its evaluations."""
    recipe = NAMED.get(a.get("recipe") or "default", {})
    if "batch_size" in a and a["batch_size"] is None:
        a["batch_size"] = recipe.get("batch_size", DEFAULT_BATCH)
    if "test_batch" in a and a["test_batch"] is None:
        a["test_batch"] = recipe.get("test_batch", DEFAULT_TEST_BATCH)
    if "epochs" in recipe and a.get("epochs") is None and a.get("steps") is None:
        a["epochs"] = recipe["epochs"]
    if "eval_every" in recipe and a.get("target_accuracy") is not None and a.get("eval_every") is None:
        a["eval_every"] = recipe["eval_every"]


def model_of(args: argparse.Namespace) -> tuple[str, int | None]:
    """(model family, ResNet depth or None) that -r / --model name: the key of RECIPES, and a name
    minidl.models.get takes. A ValueError where they contradict (-r 18 with --model resnet50 or lenet),
    or contradict a named recipe's model."""
    own = named(args).get("model")
    name = args.model or ("resnet" if args.depth else own or "lenet")
    if own and models.tag(name, args.depth or (18 if name == "resnet" else None)) != models.tag(own, None):
        raise ValueError(f"--recipe {args.recipe} is {models.tag(own, None)}'s: it conflicts with "
                         + (f"-r {args.depth}" if args.depth else f"--model {name}"))
    if args.depth and name != "resnet" and name != f"resnet{args.depth}":      # resnet50 with -r 50 agrees
        raise ValueError(f"-r {args.depth} " + ("is a ResNet depth and " if not name.startswith("resnet") else "")
                         + f"conflicts with --model {name}")
    tag = models.tag(name, args.depth or (18 if name == "resnet" else None))     # lenet5, resnet50, simplenet, ...
    return ("resnet", int(tag[6:])) if tag.startswith("resnet") else ("lenet" if tag == "lenet5" else tag, None)


def steps(a: dict) -> int | None:
    """-n as the run takes it (a: the parsed flags as a dict): the flag, else DEFAULT_STEPS; None with
    --epochs. The flag's default is None so that check_args can refuse a -n given with --epochs."""
    return None if a.get("epochs") else a.get("steps") or DEFAULT_STEPS


def model_tag(args: argparse.Namespace) -> str:
    """The one name of the model the flags train (lenet5, resnet50, simplenet, lenet-caffe, ...)."""
    return models.tag(*model_of(args))


def plan(args: argparse.Namespace) -> RunPlan:
    """The RunPlan the flags decide: each flag left out takes the model's recipe (for the dataset)."""
    family, depth = model_of(args)
    recipe: dict[str, Any] = {**RECIPES[family], **DATASETS[args.dataset],
                              **MODEL_DATASET.get((family, args.dataset), {}), **named(args)}

    def pick(dest):
        v = getattr(args, dest)
        return recipe[dest] if v is None else v
    opt = pick("optimizer")
    lr = args.lr if args.lr is not None else recipe["lr"] if opt == recipe["optimizer"] else default_lr(opt)
    return RunPlan(model=models.tag(family, depth), dataset=args.dataset, batch_size=args.batch_size,
                   steps=steps(vars(args)), epochs=args.epochs, optimizer=opt, lr=float(lr),
                   weight_decay=float(pick("weight_decay")), schedule=pick("schedule"), seed=args.seed,
                   warmup=pick("warmup"), label_smoothing=float(pick("label_smoothing")), shift=pick("shift"),
                   flip=pick("flip"), precision=args.precision, ranks=distributed.size_from_env())


def check(a: dict[str, Any], error: Callable[[str, str], Any], images: int) -> None:
    """The recipe flags' values (a: the parsed flags as a dict); error(dest, message) ends the run.
    `images`: the training images, which bound the run's length for --warmup."""
    v = a.get("label_smoothing")
    if v is not None and not (math.isfinite(v) and 0 <= v < 1):
        error("label_smoothing", f"must be a number in [0, 1), got {v}")
    if a.get("shift") is not None and not 0 <= a["shift"] <= MAX_SHIFT:
        error("shift", f"must be an integer from 0 to {MAX_SHIFT} (pixels), got {a['shift']}")
    if a.get("warmup") is not None:
        total = a["epochs"] * (images // a["batch_size"]) if a.get("epochs") else steps(a)
        if a["warmup"] < 0:
            error("warmup", f"must be a non-negative integer (steps), got {a['warmup']}")
        if total and a["warmup"] >= total:
            error("warmup", f"{a['warmup']} steps of warm-up leave nothing of a run of {total} steps")
