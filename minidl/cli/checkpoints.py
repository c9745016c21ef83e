"""The checkpoint of a command line: its default path, whether the run writes it, and what is
refused before any data is read (each through the parser's `error`, exit 2, naming the flag).

A training run reads its checkpoint for -l and --resume and writes it for -s, --save-every and
--resume (`saves`); the file it writes must be a checkpoint's (files.kinds), of a run on the same
dataset, and for --resume the run that was planned. `minidl infer` takes the dataset its checkpoint
records (checkpoint.checkpoint_data) and refuses another.
"""
from __future__ import annotations

import argparse
import os
from typing import Callable, NoReturn

from minidl import data
from minidl.cli import recipes


def checkpoint_path(args: argparse.Namespace) -> str:
    """--checkpoint, else checkpoints/<model tag>.npz (lenet5, resnet18, simplenet, ...) on MNIST and
    checkpoints/<model tag>-<dataset>.npz on another dataset: a run on one dataset does not replace
    the other's checkpoint."""
    dataset = getattr(args, "dataset", None) or "mnist"
    tag = recipes.model_tag(args) + ("" if dataset == "mnist" else f"-{dataset}")
    return args.checkpoint or os.path.join("checkpoints", f"{tag}.npz")


def saves(args: argparse.Namespace) -> bool:
    """Whether a training run writes its checkpoint at the end: -s, --save-every (whose saves would
    otherwise stop at the last multiple of N) and --resume (a resumed run ends in the file it resumed)."""
    return bool(args.save or args.save_every or args.resume)


def _info(path):
    """A checkpoint's JSON record (read alone), or None: no such file, or one the run will report on."""
    from minidl.checkpoint import checkpoint_data
    try:
        return checkpoint_data.read_info(path) if os.path.isfile(path) else None
    except ValueError:
        return None


def _saved_plan(path):
    """The plan recorded in a checkpoint, or None (no plan, or a file the run will report on)."""
    meta = (_info(path) or {}).get("meta")
    plan = meta.get("plan") if isinstance(meta, dict) else None
    return plan if isinstance(plan, dict) else None


def infer_dataset(args: argparse.Namespace, error: Callable[[str, str], NoReturn]) -> None:
    """infer --checkpoint or --artifact: --dataset left out takes the file's; one that differs is refused.
    A file that does not say (saved before checkpoints and artifacts recorded it) is scored on --dataset
    or MNIST, with a note (args.dataset_note)."""
    from minidl.checkpoint import checkpoint_data
    source = args.checkpoint or getattr(args, "artifact", None)
    info = _info(source) if source else None
    recorded = checkpoint_data.dataset_of(info) if info else None
    if recorded is not None and recorded not in data.DATASETS:
        recorded = None
    if recorded and args.dataset and args.dataset != recorded:
        error("dataset", f"{args.dataset} is not the dataset {source} was trained on ({recorded}); "
                         f"leave --dataset out to score it on {recorded}")
    args.dataset_note = (f"note: {source} does not say which dataset it was trained on: scored on mnist "
                         f"(--dataset chooses; in Python, Trainer.save(path, dataset=...) records it)"
                         if args.dataset is None and info is not None and recorded is None
                         else None)        # printed by infer once the model is ready
    args.dataset = args.dataset or recorded or "mnist"


def check_training_checkpoint(args: argparse.Namespace, error: Callable[[str, str], NoReturn]) -> None:
    """A training run's checkpoint: readable where -l or --resume reads it; where the run writes it
    (`saves`), a file of its kind (files.kinds: a .npz, not an export, an artifact or a metrics log),
    not another dataset's run, and for --resume the run that was planned."""
    from minidl import files as _files
    from minidl.checkpoint import checkpoint_data
    path, a = checkpoint_path(args), vars(args)
    why = _files.unreadable(path, "checkpoint") if a["resume"] or a["load"] else None
    if why:
        error("resume" if a["resume"] else "load", f"checkpoint {path} {why}")
    if not saves(args):
        return
    what = "-s" if args.save else "--save-every" if args.save_every else "--resume"
    why = _files.problem(path, "checkpoint")
    if why:          # found now, not by a traceback after the whole run
        error("checkpoint" if args.checkpoint else "save" if args.save else
              "save_every" if args.save_every else "resume", f"{what} cannot save to {path}: it {why}")
    info = _info(path)
    theirs = checkpoint_data.dataset_of(info) if info else None
    if theirs and theirs != args.dataset and not args.resume:
        error("dataset", f"{what} would replace {path}, a run on {theirs}, with a run on {args.dataset}: "
                         f"give another --checkpoint")
    saved = _saved_plan(path) if args.resume else None
    diff = recipes.plan(args).differences(saved) if saved else []
    if diff:          # the resumed run must be the run that was planned
        error("resume", f"{path} is a run planned with other flags: " + "; ".join(diff))
