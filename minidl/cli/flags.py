"""The command lines' shared flags, their checks and their error handler.

A flag several commands take (--device, --precision, --data-dir/--dataset, --threads, --checkpoint,
--seed, -x/-y, --model/-r) is added by one function here, its choices the library's own lists;
`training_parser` is train's whole command line (warmup's too). A `Parser` keeps, for each dest,
the option string that sets it, so `check_args` names a bad flag as the user typed it. What a
flag's value may be beyond its type (a batch larger than the data, -n with --epochs, a checkpoint
that cannot be written) is `check_args`'s to refuse, before any data is read; `run_cli` turns a
known failure of the run into one `error:` line.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from minidl import backends, cli, data, distributed, models, optim, precision
from minidl.cli import output, recipes, stops
from minidl.cli.checkpoints import check_training_checkpoint, infer_dataset
from minidl.cli.checkpoints import checkpoint_path, saves  # noqa: F401 (the commands import them from here)
from minidl.cli.recipes import DEFAULT_STEPS

if TYPE_CHECKING:
    from argparse import _ArgumentGroup

DEVICES = ("auto", *backends.names())              # minidl.get_device's specs: auto, or a registered backend
# Split sizes, known without reading a file, so that flags are checked before any data is loaded.
IMAGES = dict(data.datasets.SIZES)                  # MNIST and Fashion-MNIST alike
MAX_RUNS = 1_000_000                                # infer --runs: beyond this a typo, not a benchmark


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that keeps `options`: dest -> the first option string that sets it (-b, --lr)."""

    def __init__(self, **kw: Any) -> None:
        self.options: dict[str, str] = {}             # first: ArgumentParser's __init__ adds -h
        super().__init__(**kw)

    def add_argument(self, *names: Any, **kw: Any) -> argparse.Action:
        return self.note(super().add_argument(*names, **kw))

    def note(self, action: argparse.Action) -> argparse.Action:
        """Record `action`'s option string (an action added to a group is noted through this)."""
        if action.option_strings:
            self.options.setdefault(action.dest, action.option_strings[0])
        return action

    def error_in(self, dest: str, msg: str) -> NoReturn:
        """End the run as argparse does for a bad value: the usage line, `argument FLAG: msg`, status 2."""
        self.error(f"argument {self.options[dest]}: {msg}")


def positive(v: str) -> int:
    """argparse type: an integer > 0."""
    n = int(v)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {v}")
    return n


def add_precision(p: Parser, what: str, default: str | None = "fp32") -> None:
    """--precision: minidl.precision's policies, `what` saying what it does in this command."""
    p.add_argument("--precision", choices=tuple(precision.NAMES), default=default, help=f"precision (fp32): {what}")


def add_device(p: Parser) -> None:
    """--device: auto (a usable GPU, else the CPU), cpu or cuda."""
    p.add_argument("--device", choices=DEVICES, default="auto", help="device (auto)")


def add_data(p: Parser, where: str, default: str | None = "mnist", what: str = "dataset (mnist)") -> None:
    """--data-dir (`where` tells how the folder is searched) and --dataset (None: check_args decides)."""
    p.add_argument("--data-dir", help=where)
    p.add_argument("--dataset", choices=data.DATASETS, default=default, help=what)


def add_threads(p: Parser) -> None:
    """--threads: BLAS/OpenMP threads of a CPU run."""
    p.add_argument("--threads", type=positive, help="CPU: BLAS/OpenMP threads (1, or $OMP_NUM_THREADS)")


def add_checkpoint(p: Parser, what: str, group: _ArgumentGroup | None = None) -> None:
    """--checkpoint, `what` its help; added to `group` where one is given (a mutually exclusive group)."""
    p.note((group or p).add_argument("--checkpoint", help=what))


def add_seed(p: Parser) -> None:
    """--seed: weights, shuffling and dropout."""
    p.add_argument("--seed", type=int, default=0, help="seed for weights, shuffling and dropout (0)")


def add_test(p: Parser) -> None:
    """-x, -y: the evaluation's batch size and number of batches."""
    # default None: a named recipe's test batch where -x is left out (recipes.fill, in check_args)
    p.add_argument("-x", dest="test_batch", type=positive, default=None,
                   help=f"test batch size ({recipes.DEFAULT_TEST_BATCH}; --recipe fast: "
                        f"{recipes.NAMED['fast']['test_batch']})")
    p.add_argument("-y", dest="test_steps", type=positive, default=10,
                   help="test steps (10: the whole test set at -x 1000)")


def add_model(p: Parser) -> None:
    """-r and --model: a ResNet depth, a net of the zoo by name."""
    p.add_argument("-r", dest="depth", type=int, choices=tuple(models.RESNET_DEPTHS),
                   help="ResNet depth; implies --model resnet")
    p.add_argument("--model", choices=models.names(), metavar="NAME",
                   help=f"network, one of {', '.join(models.names())} (lenet; resnet with -r, default 18)")


def training_parser(prog: str = "python -m minidl.train", description: str | None = None) -> Parser:
    """The training command line's flags (minidl.train's, minidl.warmup's); checked by check_args.

    prog: the command's module door, `python -m minidl.<command>`; its usage line names the command as
    it was invoked (`minidl train` through the dispatcher: minidl.cli.prog)."""
    command = prog.removeprefix("python -m minidl.")
    p = Parser(prog=cli.prog(command) if command != prog else prog, description=description or (
        "Train a net of minidl's zoo on MNIST / Fashion-MNIST, then score the whole test set. "
        "Flags left out take the model's default recipe (minidl/cli/recipes.py; each run prints it)."))
    # default None: a named recipe's batch where -b is left out (recipes.fill, in check_args)
    p.add_argument("-b", dest="batch_size", type=positive, default=None,
                   help=f"batch size ({recipes.DEFAULT_BATCH}; a --recipe's own)")
    # default None: a -n given is told from one left out (refused with --epochs; recipes.steps resolves it)
    p.add_argument("-n", dest="steps", type=positive, default=None,
                   help=f"training steps ({DEFAULT_STEPS}; not with --epochs)")
    p.add_argument("-m", dest="monitor", type=positive, default=100, help="monitoring interval in steps (100)")
    p.add_argument("-l", dest="load", action="store_true", help="load the checkpoint's weights before training")
    p.add_argument("-s", dest="save", action="store_true", help="save a checkpoint after training")
    add_test(p)
    add_model(p)
    p.add_argument("--epochs", type=positive, help="train whole epochs instead of -n steps (not with -n)")
    p.add_argument("--recipe", choices=("default", *recipes.NAMED), default="default",
                   help="a named recipe: fast (LeNet-5 to 99%% test accuracy in the fewest steps: batch "
                        f"{recipes.NAMED['fast']['batch_size']}, {recipes.NAMED['fast']['epochs']} epochs planned); "
                        "flags given still win")
    p.add_argument("--target-accuracy", type=float, metavar="PERCENT",
                   help="score the test set every --eval-every steps and stop at the first step whose test "
                        "accuracy reaches PERCENT; prints the step, the epoch and the seconds of training")
    p.add_argument("--eval-every", type=positive, metavar="STEPS",
                   help="with --target-accuracy: steps between test-set evaluations (a tenth of an epoch)")
    p.add_argument("--optimizer", choices=tuple(optim.OPTIMIZERS), help="optimizer (the recipe's; momentum is 0.9)")
    p.add_argument("--lr", type=float, help="learning rate (the recipe's; another optimizer's own: "
                   + ", ".join(f"{n} {recipes.default_lr(n):g}" for n in optim.OPTIMIZERS) + ")")
    p.add_argument("--schedule", choices=recipes.SCHEDULES,
                   help="learning-rate schedule over the run's steps (cosine: to 0 at the last step; "
                        "step: x0.1 every third of the run; inverse-time: lr/(1+1e-4*step), the C++ trainer's)")
    p.add_argument("--warmup", type=int, metavar="STEPS", help="linear lr warm-up over the first STEPS steps")
    p.add_argument("--weight-decay", type=float, help="L2 weight decay")
    p.add_argument("--label-smoothing", type=float, metavar="EPS", help="label smoothing of the training loss")
    p.add_argument("--shift", type=int, metavar="PIXELS", help="shift training images by up to PIXELS (0: none)")
    p.add_argument("--flip", action=argparse.BooleanOptionalAction,
                   help="mirror each training image left to right with probability 1/2 (--no-flip: never)")
    add_device(p)
    add_precision(p, "convolutions, dense layers and activations in bf16/fp16 with fp32 accumulation; fp32 "
                     "master weights, optimizer state, BN statistics and loss; fp16 with dynamic loss scaling")
    add_data(p, "dataset folder, searched alone (it must exist); without it: $MINIDL_DATA, ./dataset, "
                "/usr/share/datasets, then a download")
    add_seed(p)
    add_threads(p)
    add_checkpoint(p, "checkpoint path (checkpoints/<model>.npz on MNIST, checkpoints/<model>-<dataset>.npz "
                      "on another dataset)")
    p.add_argument("--grad-reduce", choices=distributed.GRAD_REDUCE, default="fp32",
                   help="several ranks: the dtype gradients travel in (fp32; bf16: half the bytes, rounded)")
    p.add_argument("--shard-optimizer", action="store_true",
                   help="several ranks: each updates 1/N of the parameters and keeps optimizer state for those "
                        "alone (ZeRO stage 1: reduce-scatter, update, all-gather; the same run)")
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="GPU: run each step eagerly instead of replaying it as one CUDA graph")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None,
                   help="GPU: convolutions write channels-last (NHWC) activations (default: where it is faster: "
                        "in bf16/fp16, and in fp32 for models of 10M multiply-adds an image or more)")
    tf = p.add_mutually_exclusive_group()
    p.note(tf.add_argument("--tf32", dest="tf32", action="store_true", default=True,
                           help="GPU: allow TF32 tensor cores in FP32 convolutions (the default)"))
    p.note(tf.add_argument("--no-tf32", dest="tf32", action="store_false", help="GPU: full FP32 convolutions"))
    p.add_argument("--nondeterministic", action="store_true",
                   help="GPU: let cuDNN pick engines that reduce in any order (faster for some shapes; "
                        "seeded runs then differ in the last bits)")
    p.add_argument("--metrics", metavar="PATH",
                   help="append one JSON line per monitoring interval and per evaluation (minidl.plot draws them)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also write the same records as TensorBoard scalars into DIR (needs tensorboardX)")
    p.add_argument("--save-every", type=positive, metavar="N",
                   help="save a resumable checkpoint every N steps and at the end (to --checkpoint; implies -s)")
    p.add_argument("--resume", action="store_true",
                   help="restore weights, optimizer state and step from the checkpoint, continue, and save "
                        "into it at the end")
    return p


def check_args(p: Parser, args: argparse.Namespace, trains: bool = True) -> argparse.Namespace:
    """Check every flag's value before any data is read or model built; the first bad one ends
    the run through p.error: the usage line and one message naming the flag, exit status 2.

    Each check runs only for the flags `p` has. `trains`: the command trains (train, warmup): its
    batch is drawn from the training split and its checkpoint is read or written as -l, -s and
    --resume say; otherwise (infer) the batch is drawn from the test split and --checkpoint and
    --artifact are files to read.
    """
    from minidl import files as _files
    a = vars(args)
    error = p.error_in
    split = "train" if trains else "test"
    recipes.fill(a)                            # a named recipe's batch and length, where the flags leave them out
    if not trains and "dataset" in a:
        infer_dataset(args, error)

    if a.get("epochs") and a.get("steps") is not None:     # -n left at its default is None
        error("steps", "conflicts with --epochs: -n counts steps, --epochs whole epochs; give one of them")
    for dest, low in (("lr", "> 0"), ("weight_decay", ">= 0")):
        v = a.get(dest)
        if v is not None and (not math.isfinite(v) or (v <= 0 if low == "> 0" else v < 0)):
            error(dest, f"must be a finite number {low}, got {v}")
    if a.get("seed") is not None and a["seed"] < 0:
        error("seed", f"must be a non-negative integer, got {a['seed']}")
    limits = {"batch_size": (IMAGES[split], f"{args.dataset} {split} images"),
              "test_batch": (IMAGES["test"], f"{args.dataset} test images")}
    for dest, (n, what) in limits.items():
        if a.get(dest) is not None and a[dest] > n:
            error(dest, f"{a[dest]:,} is larger than the {n:,} {what}")
    recipes.check(a, error, IMAGES["train"])
    target = a.get("target_accuracy")
    if target is not None and not (math.isfinite(target) and 0 < target <= 100):
        error("target_accuracy", f"must be a test accuracy in percent, in (0, 100], got {target}")
    if a.get("eval_every") is not None and target is None:
        error("eval_every", "needs --target-accuracy (it says how often the target is checked)")
    from minidl.threads import cpus
    if a.get("threads") is not None and a["threads"] > cpus():
        error("threads", f"{a['threads']} is more than the {cpus()} CPU(s) this process may use: "
                         f"each BLAS call would wait for cores")
    if a.get("runs") is not None and a["runs"] > MAX_RUNS:
        error("runs", f"{a['runs']:,} is more than {MAX_RUNS:,}")
    if "model" in a:
        try:
            recipes.model_of(args)
        except ValueError as e:          # -r with a net that is no ResNet, or another ResNet's depth, or
            error("recipe" if str(e).startswith("--recipe") else "depth", str(e))    # a named recipe's net
    if a.get("shard_optimizer"):
        shard_problem(a, error)
    if a.get("load") and a.get("resume"):
        error("load", "conflicts with --resume (which restores the weights and the optimizer state)")
    if trains:
        check_training_checkpoint(args, error)
    for dest in ("checkpoint", "artifact"):
        why = _files.unreadable(a[dest], dest) if not trains and a.get(dest) else None
        if why:
            error(dest, f"{a[dest]} {why}")
    inputs = [a.get("checkpoint"), a.get("artifact")] if not trains else []
    for dest, kind in (("metrics", "metrics"), ("save_artifact", "artifact")):   # regular files of their kind
        why = _files.problem(a[dest], kind, reads=inputs) if a.get(dest) else None
        if why:
            error(dest, f"{a[dest]} {why}")
    if a.get("tensorboard"):
        why = _files.problem(os.path.join(a["tensorboard"], "events"))       # the folder, made if missing
        if why:
            error("tensorboard", f"{a['tensorboard']}: an event file there {why}")
        if importlib.util.find_spec("tensorboardX") is None:
            from minidl.install_hint import install_hint
            error("tensorboard", f"needs tensorboardX ({install_hint('tensorboard', 'tensorboardX')})")
    return args


def shard_problem(a: dict[str, Any], error: Callable[[str, str], NoReturn]) -> None:
    """--shard-optimizer's refusal: fp16, whose loss scaling checks the whole gradient arena for overflow,
    of which a sharded rank sums only its shard (distributed/shard.py)."""
    if a.get("precision") == "fp16":
        error("shard_optimizer", "conflicts with --precision fp16 (its loss scaling reads the whole gradient, "
                                 "a sharded rank sums its shard alone): use bf16 or fp32")


def run_cli(run: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run a command line's `run(args)`: a known failure is one `error:` line and exit status 1."""
    from minidl.backend import CaptureError, DeviceError
    from minidl.training.trainer import TrainingDiverged, TrainingStopped
    try:
        with output.shown():                     # the library's log records and warnings: one line each
            run(args)
    except TrainingStopped as e:
        how = getattr(e, "hint", None)
        how = (how if how is not None else ": the same command with --resume continues it" if e.path
               else "; nothing saved")
        print(f"{signal.Signals(e.signum).name}: {e}{how}", file=sys.stderr)
        return 128 + e.signum
    except stops.Interrupted as e:                                            # before any training
        print(f"{e}: stopped before training; nothing saved", file=sys.stderr)
        return 128 + e.signum
    except (ValueError, DeviceError, CaptureError, TrainingDiverged) as e:   # data, checkpoint,
        print(f"error: {e}", file=sys.stderr)                                 # artifact, shape errors
        return 1
    except OSError as e:                                                      # a file the OS refused
        print(f"error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError as e:                                                  # the CPU's, as the GPU's
        print(f"error: {str(e) or 'out of CPU memory: try a smaller batch (-b, -x, --batch-size)'}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
