"""The loop's seam as its callbacks see it: `Run` (one call of Trainer.fit), `Callback` (its hooks),
`Trains` (the trainer, `run.trainer`, as they see it), and how a run ends early (TrainingDiverged,
TrainingStopped, TrainingInterrupted). callbacks.py holds the built-ins written on it and is where users
import all of them from."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from ..backend import Device
    from ..data.loader import Loader
    from ..distributed import World
    from ..graph.model import Model
    from ..metrics import Score
    from ..optim.base import Optimizer


class Trains(Protocol):
    """The trainer as the loop's seam sees it (training/trainer.py's Trainer is one): what a callback, the
    History and Ctrl-C read and call. Said here, so that the seam stands under the trainer that calls it."""

    @property
    def model(self) -> Model: ...

    @property
    def optimizer(self) -> Optimizer: ...

    @property
    def step(self) -> int: ...

    @property
    def progress(self) -> bool: ...

    @property
    def log(self) -> Callable[..., Any]: ...

    @property
    def device(self) -> Device: ...

    @property
    def seed(self) -> int: ...

    @property
    def world(self) -> World: ...

    _stop: int | None                 # a stop request's signal number (request_stop; training/interrupt.py)
    _record_sums: list[float]         # loss x images, hits, images since the History's last record (history.py)

    def request_stop(self, signum: int) -> None: ...

    def check_finite(self, path: str | os.PathLike | None = None) -> None: ...

    def save(self, path: str | os.PathLike) -> str | os.PathLike | None: ...

    def evaluate(self, x: Any) -> Score: ...

    def _check_fits(self, top: int | None) -> None: ...  # the largest label against the model's classes (trainer.py)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left untouched."""
    collective = True                 # data-parallel ranks raise it together (distributed.World.guard)


class TrainingStopped(RuntimeError):
    """Training stopped on request (SIGINT, SIGTERM) after a whole step; `path`: where it saved, or None."""
    collective = True                 # data-parallel ranks raise it together, after the same step

    def __init__(self, message: str, signum: int, path: str | os.PathLike | None) -> None:
        super().__init__(message)
        self.signum, self.path, self.exit_status = signum, path, 128 + signum   # as a shell reports it


class TrainingInterrupted(TrainingStopped, KeyboardInterrupt):
    """Ctrl-C in Trainer.fit from Python (training/interrupt.py): the step finished, `checkpoint=` saved
    (`path`); it is a KeyboardInterrupt too, so code that catches one catches it."""


@dataclass(eq=False)
class Run:
    """One call of Trainer.fit as its callbacks see it: steps `start` < `step` <= `end`, `per_epoch`
    steps an epoch of `loader`, a monitoring interval every `monitor` steps.

    stop: a callback sets it to end the run after the current step (Keras's `stop_training`): the
    run then closes its last interval (the NaN check, on_interval), saves `save_to` and returns its
    score. images: what the last interval trained on, all ranks together. signal: the stop request
    (Trainer.request_stop: a signal number) every rank agreed on, which ended the run; else None.
    """
    trainer: Trains
    start: int
    end: int
    per_epoch: int
    loader: Loader
    monitor: int
    callbacks: list[Callback] = field(default_factory=list)
    stop: bool = False
    images: int = 0
    signal: int | None = None
    logs: dict[str, float] = field(default_factory=dict)
    history: dict[str, list[float]] = field(default_factory=dict)

    @property
    def step(self) -> int:
        """Steps trained so far, this run's and those before it (Trainer.step)."""
        return self.trainer.step

    def emit(self, hook: str, *args: object) -> None:
        """Call `hook` (a Callback method's name) of every callback, in order."""
        for c in self.callbacks:
            getattr(c, hook)(self, *args)

    def check_finite(self, path: str | os.PathLike | None = None) -> None:
        """Raise TrainingDiverged, naming `path` as left untouched, where a loss of this run was not
        finite (Trainer.check_finite: the device's NaN flag, one sync)."""
        self.trainer.check_finite(path)

    def save(self, path: str | os.PathLike) -> str | os.PathLike | None:
        """Save a checkpoint the way the loop does: the NaN flag is read first, so a run that diverged
        raises TrainingDiverged and leaves `path` untouched. Collective: every rank calls it."""
        self.check_finite(path)
        return self.trainer.save(path)


class Callback:
    """Hooks Trainer.fit calls, in this order, on every rank (a rank other than 0 has a silent log):

    on_train_begin(run) before the first step; on_step_end(run) after each step; on_interval(run, score)
    every `monitor` steps and at the end, after the ranks' sums, with the interval's Score (the same on
    every rank; TerminateOnNaN, fit's first callback, has checked it is finite); on_epoch_end(run, epoch)
    after an epoch's last step (epochs count from 0); on_train_end(run) when the run ends (its steps
    done, or stopped by a callback or a signal, before SaveOnStop's save), not when it raises. Each does
    nothing here: override those you need.

    A hook runs on the host between steps: reading a device array (float(), to_host) waits for the
    step, so read at on_interval, where the loop has synchronised already. With several ranks, set
    `run.stop` from what every rank sees alike (the step, the interval's score), so all stop together.
    """

    def on_train_begin(self, run: Run) -> None:
        pass

    def on_step_end(self, run: Run) -> None:
        pass

    def on_interval(self, run: Run, score: Score) -> None:
        pass

    def on_epoch_end(self, run: Run, epoch: int) -> None:
        pass

    def on_train_end(self, run: Run) -> None:
        pass

    def on_record(self, run: Run, logs: dict[str, float]) -> None:
        """After each record of the run's History (every epoch's end, or every `validation_freq` steps):
        `logs` is Keras's: 'loss', 'accuracy' (the mean since the last record), 'val_loss' and
        'val_accuracy' (with validation_data), 'lr' (the base learning rate), 'step', 'epoch'."""
