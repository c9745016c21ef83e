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
import logging
import math
import os
import time
from typing import TYPE_CHECKING, Any, Iterator

from .. import files
from .kinds import clash

if TYPE_CHECKING:
    from .tensorboard_log import TensorBoardLog


NUMBERS = ("epoch", "loss", "accuracy", "lr", "images_per_s", "wall_s", "test_loss", "test_accuracy")


MAX_LINE = 1 << 20          # bytes: a record is under 1 KB; a longer line is no metrics record
MAX_STEP = 2 ** 63          # a step beyond int64 is no step of a run


def _finite_or_null(v):
    if v is None:
        return True
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:    # an int too large for a float
        return False


class MetricsError(ValueError):
    """A metrics file is missing or holds a line that is not a JSON object."""


def _number(v):
    """A float for JSON: None where it is not finite (json would write NaN, which is not JSON)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def repair(path: str | os.PathLike) -> int:
    """Make a metrics log end with a newline before appending, so a resumed run does not glue its
    first record to a line; returns the bytes dropped.

    Only the log's own last line is touched: a complete record without its newline gets one; the
    start of a record cut short (a run killed mid-write, it opens as this writer's records do) is
    dropped; any other unterminated line is not this writer's, and the log is refused (MetricsError)."""
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return 0
            f.seek(max(size - MAX_LINE, 0))
            tail = f.read()
            if tail.endswith(b"\n"):
                return 0
            cut = tail.rfind(b"\n")
            if cut < 0 and size > len(tail):
                raise MetricsError(f"{path}: its last line is longer than {MAX_LINE:,} bytes and has no newline: "
                                   f"not a metrics log this run appends to")
            last = tail[cut + 1:]
            if _is_record(last):
                f.write(b"\n")                   # complete: it only lacked its newline
                return 0
            if not last.startswith(_OPENINGS):
                raise MetricsError(f"{path}: its last line ({last[:40]!r}) has no newline and is no metrics record "
                                   f"this writer began: left as it is, not appended to")
            keep = size - len(last)
            f.truncate(keep)
            return size - keep
    except (FileNotFoundError, IsADirectoryError):
        return 0


_log = logging.getLogger(__name__)
_OPENINGS = (b'{"step": ', b'{"eval": ')          # how every record this writer writes begins


def _is_record(line):
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return False
    return isinstance(record, dict) and type(record.get("step")) is int


class MetricsLog:
    """Appends JSON records to `path`, line-buffered: a killed run keeps every line it wrote.

    Only a regular file is opened (a FIFO would hang the run), and only a metrics log or a new or
    empty file (files.kinds: a checkpoint, an image, a text of another kind are refused, a
    WriteError naming what the file looks like); a last line cut short by a killed run is dropped
    first; a write that fails (a full disk) warns once and the run goes on.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path, self.failed = os.fspath(path), False
        why = clash(self.path, "metrics") if files.kind(self.path) is None else None
        if why:
            raise files.WriteError(f"metrics file {self.path} {why}")
        cut = repair(self.path) if files.kind(self.path) is None else 0
        if cut:
            _log.warning("%s: its last line was cut short (%d bytes, a run stopped mid-write); dropped it",
                         self.path, cut)
        self.file = files.open_append(self.path, "metrics")
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


def records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """The records of a metrics file one at a time, in file order, read line by line (bounded memory
    however large the file). A missing file, or a line that is not a JSON object with a step in
    [0, 2^63) and finite numbers, is a MetricsError naming the file and the line; a last line cut
    short (a run killed mid-write) is skipped."""
    path = os.fspath(path)
    where = os.fsdecode(path)
    if not os.path.isfile(path):
        what = files.kind(path)
        raise MetricsError(f"{where}: " + (f"is {what}, not a regular file" if what else "no such file"))
    try:
        f = open(path, "rb")
    except OSError as e:
        raise MetricsError(f"{where}: not a readable metrics file ({e.strerror or e})") from None
    with f:
        i = 0
        while True:
            try:
                raw = f.readline(MAX_LINE + 1)
            except OSError as e:
                raise MetricsError(f"{where}: not a readable metrics file ({e.strerror or e})") from None
            if not raw:
                return
            i += 1
            if len(raw) > MAX_LINE:
                raise MetricsError(f"{where}:{i}: a line longer than {MAX_LINE:,} bytes: not a metrics record")
            record = _record(where, i, raw, last=not raw.endswith(b"\n"))
            if record is not None:
                yield record


def _record(where, i, raw, last):
    """The record on line i, checked; None for a blank line or a torn last one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MetricsError(f"{where}:{i}: not UTF-8 text: not a metrics record") from None
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except RecursionError:
        raise MetricsError(f"{where}:{i}: brackets nested too deeply: not a metrics record") from None
    except ValueError:
        if last:                 # no newline after it: the writer was stopped mid-line
            return None
        raise MetricsError(f"{where}:{i}: not a JSON line: {line[:60]!r}") from None
    if not isinstance(record, dict) or type(record.get("step")) is not int:
        raise MetricsError(f"{where}:{i}: expected a JSON object with an integer step, got {line[:60]!r}")
    if not 0 <= record["step"] < MAX_STEP:
        raise MetricsError(f"{where}:{i}: step {str(record['step'])[:20]}{'...' * (len(str(record['step'])) > 20)} "
                           f"is outside [0, 2^63)")
    bad = next((k for k in NUMBERS if k in record and not _finite_or_null(record[k])), None)
    if bad:
        shown = str(record[bad]) if type(record[bad]) is int else json.dumps(record[bad])
        raise MetricsError(f"{where}:{i}: {bad} is {shown[:40]}, expected a finite number or null")
    return record


def read(path: str | os.PathLike) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(intervals, evaluations): the records of a metrics file (`records`), each a list of dicts in
    file order. For a file of any size, `records` reads one at a time."""
    intervals, evaluations = [], []      # type: list[dict[str, Any]], list[dict[str, Any]]
    for record in records(path):
        (evaluations if "eval" in record else intervals).append(record)
    return intervals, evaluations
