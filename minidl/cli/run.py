"""The one builder of a training run, shared by the commands that train (`minidl train`, `minidl warmup`).

A command resolves its flags once into a RunPlan (`recipes.plan`: each flag left out takes the
model's recipe), then builds what the plan says here: the device set as the flags say, the model,
the optimizer over the run's schedule, and the Trainer. Every later reader (the lines a run prints,
the checkpoint, the warm-up's caches) reads the plan and this Run, not the flags and the recipes
again, so the two commands build the same run from the same flags. Not a command itself: a module
of the commands (cli.COMMANDS names no `run`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from minidl.cli.runplan import RunPlan

if TYPE_CHECKING:
    from minidl.backend import Device
    from minidl.distributed import World
    from minidl.graph.model import Model
    from minidl.optim import Optimizer
    from minidl.training.trainer import Trainer

MOMENTUM = 0.9          # the momentum of --optimizer momentum (the flag's help says so)


@dataclass(frozen=True)
class Run:
    """What a training command runs: the plan its flags resolved to, and what was built for it (a
    command's, not `minidl.callbacks.Run`, which is what a callback sees of the loop)."""
    plan: RunPlan
    model: Model
    optimizer: Optimizer
    trainer: Trainer
    per_epoch: int           # batches in an epoch of the training set (every rank's: global batches)

    @property
    def total_steps(self) -> int:
        """The run's length in steps: -n, or --epochs of `per_epoch` batches (a total, not steps to add)."""
        return self.plan.total_steps(self.per_epoch)


def device_for(args: argparse.Namespace, spec: str, **kw: Any) -> Device:
    """minidl.get_device(spec, seed=--seed, **kw) with --tf32 / --no-tf32 and --nondeterministic applied."""
    import minidl as dl
    device = dl.get_device(spec, seed=args.seed, **kw)
    device.set_tf32(args.tf32)
    device.set_deterministic(not args.nondeterministic)
    return device


def build_run(args: argparse.Namespace, device: Device, plan: RunPlan, per_epoch: int, *, world: World | None = None,
              log: Callable[..., Any] = print, progress: bool | None = None) -> Run:
    """The model, optimizer and Trainer of `plan` on `device`, as `python -m minidl.train` runs them.

    per_epoch: batches in an epoch (the training images // the global batch), which the schedule spans
    with --epochs. args: the flags a plan does not record (--no-graph, --channels-last, --grad-reduce, ...).
    world, log, progress: the Trainer's (the warm-up's prints nothing). The Trainer carries the plan's
    JSON, which its checkpoints save, so a resumed run is checked against the run that was planned.
    """
    import minidl as dl
    from minidl import models, optim
    model = models.get(plan.model, device=device, seed=plan.seed)     # the plan's tag: lenet5, resnet50, ...
    kw = {"momentum": MOMENTUM} if plan.optimizer == "momentum" else {}
    optimizer = optim.get(plan.optimizer, lr=plan.lr, weight_decay=plan.weight_decay,
                          schedule=plan.schedule_fn(optim.schedules, per_epoch), **kw)
    trainer = dl.Trainer(model, optimizer, seed=plan.seed, graph=args.graph, world=world, log=log, progress=progress,
                         precision=plan.precision, label_smoothing=plan.label_smoothing, shift=plan.shift,
                         flip=plan.flip, channels_last=args.channels_last, grad_reduce=args.grad_reduce,
                         shard_optimizer=getattr(args, "shard_optimizer", False))
    trainer.plan = plan.to_json()
    return Run(plan, model, optimizer, trainer, per_epoch)
