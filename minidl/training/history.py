"""Keras's History and the built-in callbacks its records drive: EarlyStopping, ReduceLROnPlateau and
ModelCheckpoint (the best model so far). Trainer.fit records the History every epoch, or every
`validation_freq` steps (Callback.on_record), with the validation score where it has validation_data.
StopAtAccuracy scores data of its own at an interval of its own and ends the run at a target accuracy,
timing training apart from its evaluations (time to accuracy)."""
from __future__ import annotations

import math
import os
import time
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

from ..metrics import Score
from .hooks import Callback

if TYPE_CHECKING:
    from .hooks import Run


class History(Score):
    """What Trainer.fit returns: the last monitoring interval's Score (`loss, accuracy = fit(...)`, as
    before) and Keras's History: `.history["loss"]`, `["accuracy"]`, `["val_loss"]`, `["val_accuracy"]`,
    `["lr"]`, `["step"]`, `["epoch"]`, one value per record (every epoch, or every `validation_freq` steps,
    and at the run's end); accuracy as a fraction. `history["val_loss"]` reads the same list."""
    history: dict[str, list[float]]

    @classmethod
    def of(cls, score: Score, history: dict[str, list[float]]) -> History:
        h = cls(*score)
        h.history = history
        return h

    def __getitem__(self, key):        # a str reads a record's list
        return self.history[key] if isinstance(key, str) else super().__getitem__(key)


class _Monitor(Callback):
    """What the built-ins below share: a logged value (`monitor`) and whether it improved."""

    def __init__(self, monitor: str, mode: str, min_delta: float) -> None:
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"{type(self).__name__}: mode must be 'auto', 'min' or 'max', got {mode!r}")
        if mode == "auto":
            mode = "max" if "acc" in monitor else "min"
        self.monitor, self.mode, self.min_delta = monitor, mode, abs(float(min_delta))
        self.best = math.inf if mode == "min" else -math.inf

    def value(self, logs: dict[str, float]) -> float:
        if self.monitor not in logs:
            raise ValueError(f"{type(self).__name__}: monitor {self.monitor!r} is not logged; the logs have "
                             f"{', '.join(logs)} (val_* needs fit(validation_data=...))")
        return logs[self.monitor]

    def improved(self, value: float) -> bool:
        """Whether `value` beats the best so far by min_delta (and then it is the best)."""
        better = (value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta)
        if better:
            self.best = value
        return better


class EarlyStopping(_Monitor):
    """Keras's EarlyStopping: stop the run once `monitor` has not improved by `min_delta` for `patience`
    records (epochs, or validation_freq steps). restore_best_weights: the model ends with the weights of
    its best record (kept on the host)."""

    def __init__(self, monitor: str = "val_loss", patience: int = 0, min_delta: float = 0.0, mode: str = "auto",
                 restore_best_weights: bool = False) -> None:
        super().__init__(monitor, mode, min_delta)
        self.patience, self.restore_best_weights = int(patience), restore_best_weights
        self.wait = 0
        self.stopped_step: int | None = None
        self.best_weights: dict[str, Any] | None = None

    def on_record(self, run: Run, logs: dict[str, float]) -> None:
        if self.improved(self.value(logs)):
            self.wait = 0
            if self.restore_best_weights:
                self.best_weights = run.trainer.model.get_weights()
            return
        self.wait += 1
        if self.wait >= self.patience:          # Keras's count: patience=2 stops at the second record without
            self.stopped_step, run.stop = run.step, True
            run.trainer.log(f"early stopping at step {run.step}: {self.monitor} has not improved on "
                            f"{self.best:.4g} for {self.wait} records")

    def on_train_end(self, run: Run) -> None:
        if self.best_weights is not None:
            run.trainer.model.set_weights(self.best_weights)


class ReduceLROnPlateau(_Monitor):
    """Keras's ReduceLROnPlateau: lr <- max(lr x factor, min_lr) once `monitor` has not improved by
    `min_delta` for `patience` records; then `cooldown` records before counting again. Sets the
    optimizer's base lr (its schedule and every parameter group follow), captured steps included."""

    def __init__(self, monitor: str = "val_loss", factor: float = 0.1, patience: int = 10, min_delta: float = 1e-4,
                 cooldown: int = 0, min_lr: float = 0.0, mode: str = "auto") -> None:
        super().__init__(monitor, mode, min_delta)
        if not 0.0 < factor < 1.0:
            raise ValueError(f"ReduceLROnPlateau: factor must be in (0, 1), got {factor!r}")
        self.factor, self.patience, self.cooldown, self.min_lr = float(factor), int(patience), int(cooldown), min_lr
        self.wait = self.cool = 0

    def on_record(self, run: Run, logs: dict[str, float]) -> None:
        value = self.value(logs)
        if self.cool > 0:
            self.cool -= 1
            self.wait = 0
        if self.improved(value):
            self.wait = 0
        elif self.cool == 0:
            self.wait += 1
            opt = run.trainer.optimizer
            if self.wait >= self.patience and opt.lr > self.min_lr:
                opt.lr = max(opt.lr * self.factor, self.min_lr)
                run.trainer.log(f"step {run.step}: {self.monitor} has not improved on {self.best:.4g}: lr {opt.lr:g}")
                self.wait, self.cool = 0, self.cooldown


class ModelCheckpoint(_Monitor):
    """Keras's ModelCheckpoint: save a checkpoint at each record, or with save_best_only only where
    `monitor` improved (the best model so far). `path` may name the record: '{step}', '{epoch}' (from 1,
    Keras's: the first epoch's is ckpt-01-...) and the logs' keys ('ckpt-{epoch:02d}-{val_loss:.3f}.npz').
    Saves as Run.save does (the NaN flag first; every rank calls it, rank 0 writes) a checkpoint that resumes."""

    def __init__(self, path: str | os.PathLike, monitor: str = "val_loss", save_best_only: bool = False,
                 mode: str = "auto") -> None:
        super().__init__(monitor, mode, 0.0)
        self.path, self.save_best_only = path, save_best_only
        self.saved: str | os.PathLike | None = None

    def on_record(self, run: Run, logs: dict[str, float]) -> None:
        if self.save_best_only and not self.improved(self.value(logs)):
            return
        # '{epoch}' counts from 1 in a file name, as Keras's does (the History's 'epoch' list from 0, as Keras's)
        path = str(self.path).format(**{**logs, "epoch": logs["epoch"] + 1}) if "{" in str(self.path) else self.path
        run.save(path)
        self.saved = path


class StopAtAccuracy(Callback):
    """Stop the run after the first step at which the accuracy on `data` reaches `target` (a fraction:
    0.99 is 99%; PyTorch Lightning's EarlyStopping(stopping_threshold=) on a validation accuracy).

    data: images and labels as Trainer.evaluate takes them (the test set), turned into one loader at the
    run's start and scored every `every` steps (default: a tenth of an epoch) and at the run's last
    step, in `batch_size` batches. Scoring runs the eval-mode forward between steps: the captured
    training step, its buffers and the generator are untouched, so the run trains as it would without.
    What it finds, after the run: `reached` (bool), `step` and `epoch` (epochs trained, a float) where
    the target was reached (None if not), `accuracy` (the last score), `best`, `curve` ([(step,
    accuracy)] of every evaluation), `train_s` (seconds of training to that step, or to the last
    evaluated step, from the run's start, its first step's preparation included, the evaluations
    excluded; the device synchronised before each), `first_s` (the first step's seconds, of those),
    `eval_s` and `evaluations` (their seconds and count). At the run's end one line in the trainer's log
    says which.
    """

    def __init__(self, target: float, data: Any, every: int | None = None, batch_size: int = 1000) -> None:
        if isinstance(target, bool) or not isinstance(target, Real) or not 0.0 < target <= 1.0:
            raise ValueError(f"StopAtAccuracy: target must be an accuracy as a fraction in (0, 1] (0.99 is 99%), "
                             f"got {target!r}")
        if data is None:
            raise ValueError("StopAtAccuracy: data to score is needed (the test set: (images, labels))")
        for what, v in (("every", every), ("batch_size", batch_size)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, Integral) or v <= 0):
                raise ValueError(f"StopAtAccuracy: {what} must be a positive int, got {v!r}")
        self.target: float = float(target)
        self.data: Any = data
        self.every: int | None = every
        self.batch_size: int = batch_size
        self._reset()

    def _reset(self) -> None:
        self.reached = False
        self.step: int | None = None             # where the target was reached
        self.epoch: float | None = None
        self.accuracy, self.best = math.nan, -math.inf
        self.curve: list[tuple[int, float]] = []
        self.train_s = self.eval_s = self.first_s = 0.0
        self.evaluations = 0
        self._t0 = 0.0

    def on_train_begin(self, run: Run) -> None:
        from ..data.sources import loader_for        # the loop's data, below training
        trainer = run.trainer
        self._reset()
        self.loader = loader_for(self.data, None, trainer.model, trainer.device, where="StopAtAccuracy",
                                 batch_size=self.batch_size, training=False, seed=trainer.seed,
                                 rank=trainer.world.rank, world=trainer.world.size, fits=trainer._check_fits)
        self.interval = self.every or max(run.per_epoch // 10, 1)
        self._t0 = time.perf_counter()

    def on_step_end(self, run: Run) -> None:
        if run.step == run.start + 1:            # fit has synchronised after the first step
            self.first_s = time.perf_counter() - self._t0
        if run.step % self.interval and run.step != run.end:
            return
        trainer = run.trainer
        trainer.device.sync()                    # the steps so far are training's, not the evaluation's
        t = time.perf_counter()
        self.train_s = t - self._t0 - self.eval_s
        self.accuracy = trainer.evaluate(self.loader).accuracy     # the same on every rank: all stop together
        self.eval_s += time.perf_counter() - t
        self.evaluations += 1
        self.curve.append((run.step, self.accuracy))
        self.best = max(self.best, self.accuracy)
        if self.accuracy >= self.target:
            self.reached, self.step, self.epoch, run.stop = True, run.step, run.step / run.per_epoch, True

    def on_train_end(self, run: Run) -> None:
        evals = f"{self.eval_s:.3f} s in {self.evaluations} evaluation{'s' * (self.evaluations != 1)}"
        if self.reached:
            line = (f"target accuracy {self.target:.2%} reached at step {self.step} (epoch {self.epoch:.2f}): "
                    f"{self.accuracy:.2%}; {self.train_s:.3f} s of training (first step {self.first_s:.3f} s), {evals}")
        else:
            best = f"best {self.best:.2%}" if self.evaluations else "never evaluated"
            line = (f"target accuracy {self.target:.2%} not reached in {run.step - run.start} steps ({best}): "
                    f"{self.train_s:.3f} s of training, {evals}")
        run.trainer.log(line)


def record(run: Run, val: Any) -> None:
    """A record of the run's History: the mean loss and accuracy of the monitoring intervals closed
    since the last record, the score on `val` (a Loader, or None), the base lr; then on_record."""
    trainer = run.trainer
    loss, correct, images = trainer._record_sums
    trainer._record_sums = [0.0, 0.0, 0]
    logs: dict[str, Any] = {"step": run.step, "epoch": (run.step - 1) // run.per_epoch}
    if images:
        logs["loss"], logs["accuracy"] = loss / images, correct / images
    if val is not None:
        logs["val_loss"], logs["val_accuracy"] = trainer.evaluate(val)
    logs["lr"] = trainer.optimizer.current_lr
    run.logs = logs
    for k, v in logs.items():
        run.history.setdefault(k, []).append(v)
    run.emit("on_record", logs)
