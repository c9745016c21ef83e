"""python -m minidl.train: train a net of the zoo on MNIST, with the C++ trainer's flags.

    python -m minidl.train -b32 -n500 -m100 -r50      # ResNet-50, 500 steps of batch 32
    python -m minidl.train --model lenet --epochs 1 -s
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence

from minidl import distributed, recipes, stops
from minidl.train_flags import DEFAULT_STEPS, IMAGES, add_precision, parser, positive  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from minidl.metrics import Score

MAX_RUNS = 1_000_000                                # infer --runs: beyond this a typo, not a benchmark


def _saved_plan(path):
    """The plan recorded in a checkpoint, or None (no plan, or a file run() will report on)."""
    from minidl import checkpoint
    try:
        plan = checkpoint.read(path)[0].get("meta", {}).get("plan")
    except (ValueError, AttributeError):
        return None
    return plan if isinstance(plan, dict) else None


def checkpoint_path(args: argparse.Namespace) -> str:
    """--checkpoint, else checkpoints/<model tag>.npz (lenet5, resnet18, simplenet, ...)."""
    return args.checkpoint or os.path.join("checkpoints", f"{recipes.model_tag(args)}.npz")


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace, batch_split: str = "train") -> argparse.Namespace:
    """Check every flag's value before any data is read or model built; the first bad one ends
    the run through p.error: the usage line and one message naming the flag, exit status 2.

    Shared by minidl.infer: each check runs only for the flags its parser has. `batch_split` is
    the split the batch size is drawn from (train for training, test for inference).
    """
    from minidl import files as _files
    a = vars(args)

    def flag(dest):          # the option string the user typed for `dest`, e.g. -b or --batch-size
        return next(act.option_strings[0] for act in p._actions if act.dest == dest)

    def error(dest, msg):
        p.error(f"argument {flag(dest)}: {msg}")

    if a.get("epochs") and a.get("steps") is not None:     # -n left at its default is None (train_flags)
        error("steps", "conflicts with --epochs: -n counts steps, --epochs whole epochs; give one of them")
    for dest, low in (("lr", "> 0"), ("weight_decay", ">= 0")):
        v = a.get(dest)
        if v is not None and (not math.isfinite(v) or (v <= 0 if low == "> 0" else v < 0)):
            error(dest, f"must be a finite number {low}, got {v}")
    if a.get("seed") is not None and a["seed"] < 0:
        error("seed", f"must be a non-negative integer, got {a['seed']}")
    limits = {"batch_size": (IMAGES[batch_split], f"{args.dataset} {batch_split} images"),
              "test_batch": (IMAGES["test"], f"{args.dataset} test images")}
    for dest, (n, what) in limits.items():
        if a.get(dest) is not None and a[dest] > n:
            error(dest, f"{a[dest]:,} is larger than the {n:,} {what}")
    recipes.check(a, error, IMAGES["train"])
    from minidl.threads import cpus
    if a.get("threads") is not None and a["threads"] > cpus():
        error("threads", f"{a['threads']} is more than the {cpus()} CPU(s) this process may use: "
                         f"each BLAS call would wait for cores")
    if a.get("runs") is not None and a["runs"] > MAX_RUNS:
        error("runs", f"{a['runs']:,} is more than {MAX_RUNS:,}")
    if "model" in a:
        try:
            recipes.model_of(args)
        except ValueError as e:          # -r with a net that is no ResNet, or another ResNet's depth
            error("depth", str(e))
    if a.get("load") and a.get("resume"):
        error("load", "conflicts with --resume (which restores the weights and the optimizer state)")
    if "resume" in a:                                # the training command line
        path = checkpoint_path(args)
        why = _files.unreadable(path) if a["resume"] or a["load"] else None
        if why:
            error("resume" if a["resume"] else "load", f"checkpoint {path} {why}")
        why = _files.problem(path) if args.save or args.save_every else None
        if why:          # found now, not by a traceback after the whole run
            what = "-s" if args.save else "--save-every"
            error("checkpoint" if args.checkpoint else "save" if args.save else "save_every",
                  f"{what} cannot save to {path}: it {why}")
        saved = _saved_plan(path) if args.resume else None
        diff = recipes.plan(args).differences(saved) if saved else []
        if diff:          # the resumed run must be the run that was planned
            error("resume", f"{path} is a run planned with other flags: " + "; ".join(diff))
    for dest in ("checkpoint", "artifact"):
        why = _files.unreadable(a[dest]) if "resume" not in a and a.get(dest) else None
        if why:
            error(dest, f"{a[dest]} {why}")
    for dest in ("metrics", "save_artifact"):          # regular files only: a FIFO would hang the run
        why = _files.problem(a[dest]) if a.get(dest) else None
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


def run(args: argparse.Namespace, out: Callable[..., Any] = print) -> Score:
    import minidl as dl
    from minidl import data, models, optim
    from minidl.metrics_log import open_logs
    from minidl.threads import set_threads

    model_name, depth = recipes.model_of(args)
    tag = recipes.model_tag(args)
    path = checkpoint_path(args)
    world = distributed.init()                   # one process, or rank r of N under mpiexec
    out = out if world.main else (lambda *a: None)  # rank 0 prints
    stop_path = stops.claim_outputs(args, path) if world.main else path
    with stops.Signals() as signals:                  # SIGINT/SIGTERM/SIGHUP: nothing trained is lost
        threads = set_threads(args.threads)
        device = dl.get_device(args.device, seed=args.seed, verbose=world.main,
                               gpu=world.local_rank if world.size > 1 else None)
        device.set_tf32(args.tf32)
        device.set_deterministic(not args.nondeterministic)

        out(f"== {args.dataset.upper()} training with minidl ==")
        plan = recipes.plan(args)
        out(plan.describe())
        out("[TRAIN]")
        paths = world.host_first(lambda: data.find_dataset(args.dataset, args.data_dir))   # one download a host
        out(f"loading {paths['train-images-idx3-ubyte']}")
        train = data.load(args.dataset, "train", args.data_dir)
        out(f"loaded {len(train[0])} items..")
        test = data.load(args.dataset, "test", args.data_dir)     # checked now, not after the whole run

        model = models.get(model_name, depth=depth, device=device, seed=args.seed)
        name, lr = plan.optimizer, plan.lr
        per_epoch = len(train[0]) // (args.batch_size * world.size)   # -b is per rank
        total = plan.total_steps(per_epoch)            # the run's length: -n / --epochs are totals
        kw = {"momentum": 0.9} if name == "momentum" else {}
        opt = optim.get(name, lr=lr, weight_decay=plan.weight_decay,
                        schedule=plan.schedule_fn(optim.schedules, per_epoch), **kw)
        trainer = dl.Trainer(model, opt, seed=args.seed, graph=args.graph, world=world, log=out,
                             precision=plan.precision, label_smoothing=plan.label_smoothing, shift=plan.shift,
                             flip=plan.flip, channels_last=args.channels_last, grad_reduce=args.grad_reduce)
        trainer.plan = plan.to_json()
        if args.resume:
            meta = trainer.resume(path)
            out(f"resumed from {path} at step {meta.get('step', 0)}")
        elif args.load:
            dl.checkpoint.load_weights(path, model)
            out(f"loaded weights from {path}")
        mode = f", {threads} thread{'s' * (threads > 1)}" if device.name == "cpu" else \
            f", {'CUDA graph' if trainer.graph else 'eager'}, TF32 {'on' if args.tf32 else 'off'}" \
            f"{', channels-last' if trainer.channels_last else ''}"
        out(f".. model {tag}: {len(model.layers)} layers, {model.n_params:,} parameters, "
            f"{name} lr {lr:g} {plan.schedule}, batch {args.batch_size}"
            f"{f' x {world.size} ranks' if world.size > 1 else ''}, {args.precision}{mode} ..")

        log = open_logs(args.metrics, args.tensorboard) if world.main else None      # rank 0 writes
        trained = trainer.step < total
        if trained:
            with signals.deferred(trainer), stops.hint_resume(path):     # a stop: finish the step, save, exit
                trainer.fit(train, steps=total - trainer.step, batch_size=args.batch_size, monitor=args.monitor,
                            save_to=path if args.save else None, save_every=args.save_every,
                            checkpoint=stop_path, metrics_log=log)
            t = trainer.timing
            rest = f"; then {t['steady_ms']:.3f} ms/step" if t["steps"] > 1 else ""
            how = "" if device.name == "cpu" else f", with compilation{' and capture' if trainer.graph else ''}"
            out(f"trained {t['steps']} steps in {t['total_s']:.1f} s (first step {t['first_s']:.2f} s{how}{rest})")
            if trainer.loss_scale:
                out("fp16 loss scale {scale:g}, {skipped} steps skipped on overflow".format(**trainer.loss_scale))
            if args.save:
                out(f"saved {path}")
        else:
            out(f"the run is complete: step {trainer.step} of {total}")
        kept: str | os.PathLike | None = path if args.save or not trained else None   # where the trained weights are
        try:
            signals.check()                    # a stop that came during the final save: honoured now
            out("[INFERENCE]")
            out(f"loading {paths['t10k-images-idx3-ubyte']}")
            out(f"loaded {len(test[0])} items..")
            score = trainer.evaluate(test, batch_size=args.test_batch, steps=args.test_steps)
        except stops.Interrupted as e:
            with signals.deferred(None):
                kept = kept or trainer.save(stop_path() if callable(stop_path) else stop_path)
            raise stops.stopped(e.signum, f"stopped after training, at step {trainer.step}", kept, path) from None
    seen = min(len(test[0]), args.test_batch * args.test_steps * world.size)   # -x is per rank too
    note = "" if seen == len(test[0]) else f" (first {seen} of {len(test[0])})"
    out(f"loss: {score.loss:.3f}, accuracy: {score.percent:.3f}%{note}")     # the C++ trainer's line
    if log is not None:
        log.evaluation(step=trainer.step, epoch=(trainer.step - 1) // per_epoch, test_loss=score.loss,
                       test_accuracy=score.percent)
        log.close()
    out("Done.")
    return score


def run_cli(run: Callable[[argparse.Namespace], Any], args: argparse.Namespace) -> int:
    """Run a command line's `run(args)`: a known failure is one `error:` line and exit status 1."""
    from minidl.backend import CaptureError, DeviceError
    from minidl.trainer import TrainingDiverged, TrainingStopped
    try:
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


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = check_args(p, p.parse_args(argv))
    return run_cli(distributed.init().guard(run), args)   # a failing rank ends every rank


if __name__ == "__main__":
    sys.exit(main())
