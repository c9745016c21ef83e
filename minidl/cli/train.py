"""python -m minidl.train: train a net of the zoo on MNIST, with the C++ trainer's flags.

    python -m minidl.train -b32 -n500 -m100 -r50      # ResNet-50, 500 steps of batch 32
    python -m minidl.train --model lenet --epochs 1 -s
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, Callable, Sequence

from minidl import distributed
from minidl.cli import recipes, stops
from minidl.cli.flags import Parser, check_args, checkpoint_path, run_cli, saves, training_parser
from minidl.cli.recipes import DEFAULT_STEPS  # noqa: F401 (re-exported: the run's length without -n or --epochs)
from minidl.cli.run import build_run, device_for

if TYPE_CHECKING:
    from minidl.metrics import Score


def run(args: argparse.Namespace, out: Callable[..., Any] = print) -> Score:
    import minidl as dl
    from minidl import data
    from minidl.files.metrics_log import open_logs
    from minidl.threads import set_threads

    path = checkpoint_path(args)
    world = distributed.init()                   # one process, or rank r of N under mpiexec
    distributed.watchdog.start(world)            # ranks watch each other from here (distributed/watchdog.py)
    distributed.heartbeat.phase("loading data")
    out = out if world.main else (lambda *a: None)  # rank 0 prints
    stop_path = stops.claim_outputs(args, path) if world.main else path
    with stops.Signals() as signals:                  # SIGINT/SIGTERM/SIGHUP: nothing trained is lost
        threads = set_threads(args.threads)
        device = device_for(args, args.device, verbose=world.main, gpu=world.local_rank if world.size > 1 else None)

        out(f"== {args.dataset.upper()} training with minidl ==")
        plan = recipes.plan(args)                  # the flags resolved once: what follows reads the plan
        out(plan.describe())
        out("[TRAIN]")
        paths = world.host_first(lambda: data.find_dataset(args.dataset, args.data_dir))   # one download a host
        out(f"loading {paths['train-images-idx3-ubyte']}")
        train = data.load(args.dataset, "train", args.data_dir)
        out(f"loaded {len(train[0])} items..")
        test = data.load(args.dataset, "test", args.data_dir)     # checked now, not after the whole run

        per_epoch = len(train[0]) // (args.batch_size * world.size)   # -b is per rank
        built = build_run(args, device, plan, per_epoch, world=world, log=out)
        model, trainer, total = built.model, built.trainer, built.total_steps   # -n / --epochs are totals
        if args.resume:
            meta = trainer.resume(path)
            out(f"resumed from {path} at step {meta.get('step', 0)}")
        elif args.load:
            dl.checkpoint.load_weights(path, model)
            out(f"loaded weights from {path}")
        mode = f", {threads} thread{'s' * (threads > 1)}" if device.name == "cpu" else \
            f", {'CUDA graph' if trainer.graph else 'eager'}, TF32 {'on' if args.tf32 else 'off'}" \
            f"{', channels-last' if trainer.channels_last else ''}"
        out(f".. model {plan.model}: {len(model.layers)} layers, {model.n_params:,} parameters, "
            f"{plan.optimizer} lr {plan.lr:g} {plan.schedule}, batch {args.batch_size}"
            f"{f' x {world.size} ranks' if world.size > 1 else ''}, {args.precision}{mode} ..")

        log = open_logs(args.metrics, args.tensorboard) if world.main else None      # rank 0 writes
        target = ([dl.StopAtAccuracy(args.target_accuracy / 100, test, every=args.eval_every,
                                     batch_size=args.test_batch)] if args.target_accuracy is not None else [])
        trained = trainer.step < total
        if trained:
            with signals.deferred(trainer), stops.hint_resume(path):     # a stop: finish the step, save, exit
                trainer.fit(train, steps=total, batch_size=args.batch_size, monitor=args.monitor,
                            save_to=path if saves(args) else None, save_every=args.save_every,
                            checkpoint=stop_path, metrics_log=log, callbacks=target)
            t = dict(trainer.timing)
            evals = target[0].eval_s if target else 0.0      # the target's evaluations are not training
            if evals:
                t["total_s"] -= evals
                t["steady_ms"] = (t["total_s"] - t["first_s"]) / max(t["steps"] - 1, 1) * 1e3
            rest = f"; then {t['steady_ms']:.3f} ms/step" if t["steps"] > 1 else ""
            how = "" if device.name == "cpu" else f", with compilation{' and capture' if trainer.graph else ''}"
            apart = f"; {evals:.2f} s of evaluations apart" if evals else ""
            out(f"trained {t['steps']} steps in {t['total_s']:.1f} s "
                f"(first step {t['first_s']:.2f} s{how}{rest}{apart})")
            if trainer.loss_scale:
                out("fp16 loss scale {scale:g}, {skipped} steps skipped on overflow".format(**trainer.loss_scale))
            if saves(args):        # -s, --save-every and --resume end in the checkpoint
                out(f"saved {path}")
        else:
            out(f"the run is complete: step {trainer.step} of {total}")
        kept: str | os.PathLike | None = path if saves(args) or not trained else None   # where the trained weights are
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


def parser() -> Parser:
    """The training command line's flags; their values are checked by check_args."""
    return training_parser()


def _checked(p: Parser, args: argparse.Namespace) -> argparse.Namespace:
    """The flags checked (check_args), and $MINIDL_WATCHDOG_S as a flag is: one line naming it, exit 2."""
    args = check_args(p, args)
    try:
        distributed.watchdog.timeout_from_env()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = distributed.parse_agreed(p, argv, _checked)    # checked; under mpiexec the ranks agree, or exit 2
    return run_cli(distributed.init().guard(run), args)   # a failing rank ends every rank


if __name__ == "__main__":
    sys.exit(main())
