"""Training metrics as JSON Lines: one object per line, appended, flushed at each line.

    log = MetricsLog("run.jsonl")
    log.interval(step=100, epoch=0, loss=0.41, accuracy=88.2, lr=0.01, images_per_s=51000.0, wall_s=3.2)
    log.evaluation(step=938, epoch=1, test_loss=0.09, test_accuracy=97.1)   # {"eval": "test", ...}

A training interval's line: step, epoch, loss, accuracy (%), lr, images_per_s, wall_s (seconds
since the log was opened). An evaluation's line: eval (the set's name), step, epoch, test_loss,
test_accuracy (%), wall_s. A value that is not finite (a diverged loss) is written as null, so
every line is strict JSON. `read` gives the records back; `python -m minidl.plot` draws them.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from .. import files

if TYPE_CHECKING:
    from .tensorboard_log import TensorBoardLog


NUMBERS = ("epoch", "loss", "accuracy", "lr", "images_per_s", "wall_s", "test_loss", "test_accuracy")


def _finite_or_null(v):
    return v is None or (type(v) in (int, float) and math.isfinite(v))


class MetricsError(ValueError):
    """A metrics file is missing or holds a line that is not a JSON object."""


def _number(v):
    """A float for JSON: None where it is not finite (json would write NaN, which is not JSON)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def repair(path: str | os.PathLike) -> int:
    """Cut a last line that has no newline (a run killed mid-write) so that appending starts a
    fresh line; returns the bytes dropped. A resumed run must not glue its first record to it."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(max(size - 65536, 0))
            tail = f.read()
            if tail.endswith(b"\n"):
                return 0
            cut = tail.rfind(b"\n")
            keep = size - len(tail) + cut + 1 if cut >= 0 else 0
            f.truncate(keep)
            return size - keep
    except (FileNotFoundError, IsADirectoryError):
        return 0


class MetricsLog:
    """Appends JSON records to `path`, line-buffered: a killed run keeps every line it wrote.

    Only a regular file is opened (a FIFO would hang the run); a last line cut short by a killed
    run is dropped first; a write that fails (a full disk) warns once and the run goes on.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path, self.failed = os.fspath(path), False
        cut = repair(self.path) if files.kind(self.path) is None else 0
        if cut:
            print(f"warning: {self.path}: its last line was cut short ({cut} bytes, a run stopped mid-write); "
                  f"dropped it", file=sys.stderr)
        self.file = files.open_append(self.path)
        self.t0 = time.perf_counter()

    def write(self, record: dict[str, Any]) -> None:
        if self.failed:
            return
        try:
            self.file.write(json.dumps(record, allow_nan=False) + "\n")
        except OSError as e:
            files.warn_once(self, f"metrics file {self.path}", e)

    def interval(self, step: int, epoch: int, loss: float | None, accuracy: float | None, lr: float | None,
                 images_per_s: float | None, wall_s: float | None = None) -> None:
        """One training interval: its mean loss and accuracy (%), the lr, throughput and time."""
        self.write({"step": int(step), "epoch": int(epoch), "loss": _number(loss), "accuracy": _number(accuracy),
                    "lr": _number(lr), "images_per_s": _number(images_per_s),
                    "wall_s": _number(time.perf_counter() - self.t0 if wall_s is None else wall_s)})

    def evaluation(self, step: int, epoch: int, test_loss: float | None, test_accuracy: float | None,
                   name: str = "test", wall_s: float | None = None) -> None:
        """One evaluation of the set `name` after `step` training steps."""
        self.write({"eval": str(name), "step": int(step), "epoch": int(epoch), "test_loss": _number(test_loss),
                    "test_accuracy": _number(test_accuracy),
                    "wall_s": _number(time.perf_counter() - self.t0 if wall_s is None else wall_s)})

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as e:
            files.warn_once(self, f"metrics file {self.path}", e)

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc):
        self.close()


class Logs:
    """Several logs as one (a JSON file and TensorBoard, say): each record goes to every log."""

    def __init__(self, *logs: MetricsLog | TensorBoardLog) -> None:
        self.logs = logs

    def interval(self, **record: Any) -> None:
        for log in self.logs:
            log.interval(**record)

    def evaluation(self, **record: Any) -> None:
        for log in self.logs:
            log.evaluation(**record)

    def close(self) -> None:
        for log in self.logs:
            log.close()


def open_logs(path: str | os.PathLike | None = None,
              tensorboard: str | os.PathLike | None = None) -> MetricsLog | TensorBoardLog | Logs | None:
    """The logs of a run as one: a JSON Lines file at `path`, TensorBoard scalars in the folder
    `tensorboard` (minidl.files.tensorboard_log), or both; None for neither."""
    logs: list[MetricsLog | TensorBoardLog] = [MetricsLog(path)] if path else []
    if tensorboard:
        from .tensorboard_log import TensorBoardLog
        logs.append(TensorBoardLog(tensorboard))
    return Logs(*logs) if len(logs) > 1 else logs[0] if logs else None


def read(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(intervals, evaluations): the records of a metrics file, each a list of dicts in file order.

    A missing file, or a line that is not a JSON object with a step, is a MetricsError naming
    the file and the line. A last line cut short (a run killed mid-write) is skipped.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MetricsError(f"{path}: no such file")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsError(f"{path}: not a readable metrics file ({type(e).__name__})") from None
    intervals, evaluations = [], []      # type: list[dict[str, Any]], list[dict[str, Any]]
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if i == len(lines):          # no newline after it: the writer was stopped mid-line
                continue
            raise MetricsError(f"{path}:{i}: not a JSON line: {line[:60]!r}") from None
        if not isinstance(record, dict) or type(record.get("step")) is not int:
            raise MetricsError(f"{path}:{i}: expected a JSON object with an integer step, got {line[:60]!r}")
        bad = next((k for k in NUMBERS if k in record and not _finite_or_null(record[k])), None)
        if bad:
            raise MetricsError(f"{path}:{i}: {bad} is {json.dumps(record[bad])[:40]}, expected a finite number or null")
        (evaluations if "eval" in record else intervals).append(record)
    return intervals, evaluations
