"""Keras's History and the built-in callbacks its records drive: EarlyStopping, ReduceLROnPlateau and
ModelCheckpoint (the best model so far). Trainer.fit records the History every epoch, or every
`validation_freq` steps (Callback.on_record), with the validation score where it has validation_data."""
from __future__ import annotations

import math
import os
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
