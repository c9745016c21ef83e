"""A training run's plan: what the command line decided, saved in every checkpoint of the run.

A resumed run must be the run that was planned: `-n` / `--epochs` give the run's total (not
steps to add), the schedule spans that total, and a command that would change the plan of the
run it resumes is refused, naming the flag that differs. Data-parallel ranks count by the global
batch (-b per rank x N ranks): a run may resume at another N that keeps it, since N ranks draw and
step exactly as one process at that batch (minidl.distributed).
"""
from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..optim.schedules import Schedule

# Plan field -> the flag that sets it, for messages.
FLAGS = {"model": "-r/--model", "dataset": "--dataset", "batch_size": "-b", "steps": "-n", "epochs": "--epochs",
         "optimizer": "--optimizer", "lr": "--lr", "weight_decay": "--weight-decay", "schedule": "--schedule",
         "seed": "--seed", "precision": "--precision", "warmup": "--warmup", "label_smoothing": "--label-smoothing",
         "shift": "--shift", "flip": "--flip"}


@dataclass(frozen=True)
class RunPlan:
    model: str              # lenet5, resnet18, ...
    dataset: str
    batch_size: int
    steps: int | None       # -n, when the run is planned in steps (None with --epochs)
    epochs: int | None      # --epochs, or None
    optimizer: str
    lr: float
    weight_decay: float
    schedule: str
    seed: int
    precision: str = "fp32"     # fp32, bf16, fp16 (minidl.precision)
    warmup: int = 0         # steps of linear lr warm-up, composed with the schedule
    label_smoothing: float = 0.0
    shift: int = 0          # training images shifted by random integers of up to this many pixels
    flip: bool = False      # training images mirrored left to right, each with probability 1/2
    ranks: int = 1          # data-parallel ranks, each taking batch_size images of every step

    def total_steps(self, per_epoch: int) -> int:
        """The run's length in steps, for a training set of `per_epoch` batches."""
        # a plan gives steps where it gives no epochs (recipes.steps): never None here
        return self.epochs * per_epoch if self.epochs else self.steps    # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def differences(self, saved: dict[str, Any]) -> list[str]:
        """'-b 32 (the checkpoint's run: 64)' for every field where `saved` (a plan's JSON) differs."""
        out = []
        unset: dict[str, Any] = {f.name: None if f.default is MISSING else f.default for f in fields(self)}  # old plans
        for k, flag in FLAGS.items():
            mine, theirs = getattr(self, k), saved.get(k, unset[k])
            if k == "batch_size":          # the global batch: any split of it over the ranks
                ranks = saved.get("ranks", 1)
                ranks = ranks if type(ranks) is int and ranks > 0 else 0       # a crafted plan: no match
                if mine * self.ranks != theirs * ranks:
                    out.append(f"-b {mine} (the checkpoint's run: {theirs})" if self.ranks == ranks == 1 else
                               f"-b {mine} x {self.ranks} ranks = {mine * self.ranks} images a step (the "
                               f"checkpoint's run: {theirs} x {ranks} = {theirs * ranks}; keep -b x ranks)")
            elif mine != theirs:
                out.append(f"{flag} {_show(mine)} (the checkpoint's run: {_show(theirs)})")
        return out

    def schedule_fn(self, schedules: ModuleType, per_epoch: int) -> Schedule:
        """The learning-rate schedule over the whole run, after `warmup` steps of linear warm-up."""
        total = self.total_steps(per_epoch)
        fn = {"cosine": lambda: schedules.cosine(total), "constant": schedules.constant,
              "step": lambda: schedules.step_decay(max(total // 3, 1), 0.1),
              "inverse-time": lambda: schedules.inverse_time(1e-4)}[self.schedule]()
        return schedules.warmup(self.warmup, fn) if self.warmup else fn

    def describe(self) -> str:
        """The recipe in one line, printed at the start of a run."""
        length = f"{self.epochs} epoch{'s' * (self.epochs > 1)}" if self.epochs else f"{self.steps} steps"
        return (f"recipe: seed {self.seed}, {self.model} on {self.dataset}, {self.optimizer} lr {self.lr:g}, "
                f"{self.schedule} schedule, warm-up {self.warmup} steps, weight decay {self.weight_decay:g}, "
                f"label smoothing {self.label_smoothing:g}, shifts of up to {self.shift} px, "
                f"{'' if self.flip else 'no '}horizontal flips, "
                f"batch {self.batch_size}, {length}")


def _show(v):
    if isinstance(v, bool):
        return "on" if v else "off"
    return "unset" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
