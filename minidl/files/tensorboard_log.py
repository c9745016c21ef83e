"""Training metrics as TensorBoard scalars, beside (or instead of) the JSON Lines of metrics_log.

    log = TensorBoardLog("runs/lenet")          # then: tensorboard --logdir runs
    log.interval(step=100, epoch=0, loss=0.41, accuracy=88.2, lr=0.01, images_per_s=51000.0)
    log.evaluation(step=938, epoch=1, test_loss=0.09, test_accuracy=97.1)

The same records as MetricsLog, under the tags train/loss, train/accuracy, train/lr,
train/images_per_s and <name>/loss, <name>/accuracy for an evaluation of the set <name>, each at
its step. tensorboardX writes the event files (it needs protobuf, not TensorFlow or PyTorch): the
`tensorboard` extra.
"""
from __future__ import annotations

import math
import os

from . import warn_once


class TensorBoardLog:
    """Scalars in a TensorBoard event file under the folder `logdir` (created if missing).

    tensorboardX writes from a thread of its own; a write that fails there (a full disk) would end
    that thread with a traceback and then block the next record forever. The event writer's write
    and flush are therefore guarded: a failure is kept, warned about once, and training goes on.
    """

    def __init__(self, logdir: str | os.PathLike) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            from ..install_hint import install_hint
            raise ImportError(f"TensorBoard logs need tensorboardX "
                              f"({install_hint('tensorboard', 'tensorboardX')})") from None
        self.logdir, self.failed, self.error, self.writer = str(logdir), False, None, None
        try:
            self.writer = SummaryWriter(logdir=self.logdir)
            self._guard(self.writer._get_file_writer().event_writer._ev_writer)
        except OSError as e:
            warn_once(self, f"TensorBoard folder {self.logdir}", e)

    def _guard(self, events):
        """Wrap the events writer's write_event and flush so an OSError is kept, not raised."""
        def guarded(fn):
            def call(*args):
                if self.error is None:
                    try:
                        return fn(*args)
                    except OSError as e:
                        self.error = e
            return call
        events.write_event, events.flush = guarded(events.write_event), guarded(events.flush)

    def _scalars(self, step, prefix, values):
        if self.error is not None:
            warn_once(self, f"TensorBoard folder {self.logdir}", self.error)
        if self.failed:
            return
        for name, v in values.items():
            if v is not None and math.isfinite(float(v)):     # as MetricsLog's null: a diverged loss has no point
                self.writer.add_scalar(f"{prefix}/{name}", float(v), int(step))
        self.writer.flush()

    def interval(self, step: int, epoch: int, loss: float | None, accuracy: float | None, lr: float | None,
                 images_per_s: float | None, wall_s: float | None = None) -> None:
        """One training interval (MetricsLog.interval's arguments; epoch and wall_s are the event's)."""
        self._scalars(step, "train", {"loss": loss, "accuracy": accuracy, "lr": lr, "images_per_s": images_per_s})

    def evaluation(self, step: int, epoch: int, test_loss: float | None, test_accuracy: float | None,
                   name: str = "test", wall_s: float | None = None) -> None:
        """One evaluation of the set `name` after `step` training steps."""
        self._scalars(step, name, {"loss": test_loss, "accuracy": test_accuracy})

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.error is not None:
            warn_once(self, f"TensorBoard folder {self.logdir}", self.error)

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc):
        self.close()
