"""The training loop's seam (Keras's callbacks, Lightning's hooks): what a run does besides training,
and the built-ins `Trainer.fit` makes from its arguments (the NaN stop, the progress bar and the
monitoring line, the metrics log, periodic checkpoints, the save at a stop request), written as a
user's own callback would be. How a run ends early: TrainingDiverged, TrainingStopped.

Keras's built-ins a user adds (EarlyStopping, ReduceLROnPlateau, ModelCheckpoint), driven by the records
of the run's History (`on_record`), are history.py's; `minidl.callbacks` holds both files' names."""
from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Callable

from . import progress
from .history import EarlyStopping, History, ModelCheckpoint, ReduceLROnPlateau, StopAtAccuracy  # noqa: F401 (users' import)
from .hooks import Callback, Run, TrainingDiverged, TrainingInterrupted, TrainingStopped  # noqa: F401 (likewise)

if TYPE_CHECKING:
    from tqdm import tqdm

    from ..metrics import Score
    from ..files.metrics_log import Logs, MetricsLog
    from ..files.tensorboard_log import TensorBoardLog


class TerminateOnNaN(Callback):
    """Keras's TerminateOnNaN: at each monitoring interval, before any later callback sees its score,
    the NaN flag is read; a loss that was not finite raises TrainingDiverged naming its step, the
    weights those before it and `save_to` (the run's checkpoint) left untouched. Always fit's first."""

    def __init__(self, save_to: str | os.PathLike | None = None) -> None:
        self.save_to = save_to

    def on_interval(self, run: Run, score: Score) -> None:
        run.check_finite(self.save_to)


class Progress(Callback):
    """tqdm's bar over the run's steps on a terminal (Trainer's `progress`), the line
    `step:  100, loss: 0.082, accuracy: 45.188%` every `monitor` steps in the trainer's log (above
    the bar), and the cold first step's "preparing" line (`say`, for Device.preparing)."""

    def __init__(self) -> None:
        self.bar: tqdm | None = None
        self.say: Callable[[str], None] = lambda line: None
        self.log: Callable[..., object] = print

    def on_train_begin(self, run: Run) -> None:
        self.log = run.trainer.log
        self.bar = progress.bar(run.end - run.start, run.trainer.progress)
        self.say = progress.preparing(self.bar, self.log)

    def on_step_end(self, run: Run) -> None:
        if self.bar is not None:
            self.bar.update(run.step - run.start - self.bar.n)     # 0 where on_interval counted the step

    def on_interval(self, run: Run, score: Score) -> None:
        if run.step % run.monitor == 0:
            self.on_step_end(run)                # the bar counts the step before the line is written
            line = f"step: {run.step:4d}, loss: {score.loss:.3f}, accuracy: {score.percent:.3f}%"
            (self.log if self.bar is None else self.bar.write)(line)

    def on_train_end(self, run: Run) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class MetricsRecords(Callback):
    """One record per monitoring interval in `log` (minidl.files.metrics_log.open_logs: JSON lines,
    TensorBoard or both): step, epoch, loss, accuracy (%), lr, images per second since the last."""

    def __init__(self, log: MetricsLog | TensorBoardLog | Logs) -> None:
        self.log, self.t = log, 0.0

    def on_train_begin(self, run: Run) -> None:
        self.t = time.perf_counter()

    def on_interval(self, run: Run, score: Score) -> None:
        now = time.perf_counter()
        self.log.interval(step=run.step, epoch=(run.step - 1) // run.per_epoch, loss=score.loss,
                          accuracy=score.percent, lr=run.trainer.optimizer.current_lr,
                          images_per_s=run.images / max(now - self.t, 1e-9))
        self.t = now


class Checkpoints(Callback):
    """Save to `path` every `every` steps (Run.save: the NaN flag first; collective, every rank)."""

    def __init__(self, path: str | os.PathLike, every: int) -> None:
        self.path, self.every = path, every

    def on_step_end(self, run: Run) -> None:
        if run.step % self.every == 0:
            run.save(self.path)


class SaveOnStop(Callback):
    """A stop request (Trainer.request_stop, from SIGINT, SIGTERM or SIGHUP in minidl.train) agreed by
    every rank ends the run after the same step; when it ends, after the other callbacks, this saves
    to `path` (the NaN flag first) and raises TrainingStopped (exit status 128 + the signal).

    path: a checkpoint path, a function returning one (called at the stop: minidl.cli.stops.fresh_name
    picks a name that is free then), or None (nothing saved). Always fit's last.
    """

    def __init__(self, path: str | os.PathLike | Callable[[], str | os.PathLike | None] | None) -> None:
        self.path = path

    def on_train_end(self, run: Run) -> None:
        if run.signal is None:
            return
        run.check_finite(None if callable(self.path) else self.path)
        path = self.path() if callable(self.path) else self.path    # chosen now: a name free at the stop
        if path:
            run.trainer.save(path)
        raise TrainingStopped(f"stopped at step {run.step}" + (f"; saved {path}" if path else ""), run.signal, path)


sys.modules.setdefault("minidl.callbacks", sys.modules[__name__])   # `from minidl.callbacks import EarlyStopping`
