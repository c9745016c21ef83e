"""A rank's heartbeat: what it is doing (step, phase, since when), readable by the other ranks at any time.

Data-parallel ranks wait for each other at every step, so a rank that dies or hangs stops them all;
the others must say which rank and what it was doing. Each rank keeps one small record in the run's
folder (watchdog.py makes it), `rank<r>.rec`, read back by `read` as

    {"rank": 1, "pid": 4242, "host": "node1", "step": 341, "phase": "step", "since": <wall s>,
     "beat": <wall s>, "work_s": 3.61, "steps": 100, "last_s": 0.036, "checkpoint": ["ck.npz", 300]}

`beat`, rewritten every BEAT_S by a daemon thread, proves the process runs (the thread beats while
the main thread sleeps, spins or waits on a dead file system); `phase` and `since` say what the main
thread does and since when. The trainer and the waits declare the phases (`phase`, `during`,
`step_begins`, `step_ends`, `waiting`: module functions that do nothing where no heartbeat runs).
Each phase is one of three kinds: *timed* (a training step, the host work between steps: a rank
there for long while others wait is hung), *slow* (the first step's compiling and capture,
evaluation, a checkpoint's save, loading data, outside fit: long by nature, never judged hung) and
*waiting* (for the other ranks: never the culprit). `work_s` / `steps` is the host's own work per
step (the step's time less its waits), over steps without a slow phase: a rank whose work is much
larger than the others' is the one they wait for; `last_s` is the last step's, counted or not.

The record is a memory map of the file (binary fields, then the JSON of the rarely changing ones):
a phase is declared by writing a few bytes, no system call, cheap at every step of a fast model, and
a record is never older than the rank's last phase. A reader skips one it catches half-written.
Standard library only: the sentinel (sentinel.py), a process started without minidl, reads the
records through this module.
"""
from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import struct
import threading
import time
from typing import Any, Iterator

BEAT_S = 0.25
RECORD_BYTES = 1024
# the record: (step, phase's code, since) at 0, (beat,) at 24, (work_s, steps, last_s) at 32, from 64 the JSON of
# rank, pid, host and checkpoint, padded with spaces
_PHASE, _BEAT, _WORK = struct.Struct("<qid"), struct.Struct("<d"), struct.Struct("<dqd")
_BEAT_AT, _WORK_AT, _TEXT_AT = 24, 32, 64

# phase -> (how a line names it, kind)
PHASES = {
    "starting": ("starting", "slow"),
    "loading data": ("loading data", "slow"),
    "first step": ("its first step: compiling, planning, capturing", "slow"),
    "step": ("forward, backward, update", "timed"),
    "between steps": ("between steps: callbacks, monitoring", "timed"),
    "waiting": ("waiting for the other ranks", "waiting"),
    "evaluation": ("evaluation", "slow"),
    "saving": ("saving a checkpoint", "slow"),
    "idle": ("outside training steps", "slow"),
}
_NAMES = list(PHASES)
_CODES = {name: i for i, name in enumerate(_NAMES)}


class Heartbeat:
    """This rank's record in `folder` (rank<r>.rec), kept in a shared memory map of the file: the main
    thread writes its phase there (a few bytes, no system call: cheap enough for every step of a fast
    model), the daemon thread the beat every BEAT_S (and flushes it, for a folder other hosts read)."""

    def __init__(self, folder: str, rank: int) -> None:
        self.folder, self.rank = folder, rank
        self.path = os.path.join(folder, f"rank{rank}.rec")
        self.step, self.phase, self.since = 0, "starting", time.time()
        self.work_s, self.steps = 0.0, 0              # host work of the steps counted, and how many
        self.last_s = 0.0                             # the last step's work, counted or not
        self._t0: float | None = None                 # where the step under way is timed from (monotonic)
        self._waited, self._slow = 0.0, False          # its waits so far; whether a slow phase came in it
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, RECORD_BYTES)
            self._map = mmap.mmap(fd, RECORD_BYTES)
        finally:
            os.close(fd)
        self.describe(None)
        self._write_phase()
        _BEAT.pack_into(self._map, _BEAT_AT, time.time())
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minidl-heartbeat", daemon=True)
        self._thread.start()

    def describe(self, checkpoint: list[Any] | None) -> None:
        """The record's slow part: who this is, and the last good checkpoint it knows."""
        text = json.dumps({"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                           "checkpoint": checkpoint}).encode()[:RECORD_BYTES - _TEXT_AT]
        self._map[_TEXT_AT:] = text.ljust(RECORD_BYTES - _TEXT_AT)

    def _write_phase(self):
        _PHASE.pack_into(self._map, 0, self.step, _CODES[self.phase], self.since)

    def set(self, phase: str, step: int | None = None) -> None:
        self.phase, self.since = phase, time.time()
        if step is not None:
            self.step = step
        if PHASES[phase][1] == "slow":
            self._slow = True
        self._write_phase()

    def step_begins(self, step: int, first: bool) -> None:
        if self._t0 is None:
            self._t0, self._waited = time.monotonic(), 0.0
        self.set("first step" if first else "step", step)

    def step_ends(self, step: int) -> None:
        """A step's work: from the end of the step before (its callbacks, the stop vote) to this one's end,
        less the waits for the other ranks, where no slow phase came (the first step, a save, evaluation)."""
        if self._t0 is not None:
            took = time.monotonic() - self._t0 - self._waited
            if not self._slow:
                self.work_s, self.steps = self.work_s + took, self.steps + 1
            self.last_s = took          # a first step's too: before any step is counted, a bound for the next
            _WORK.pack_into(self._map, _WORK_AT, self.work_s, self.steps, self.last_s)
        # a fit's first step stays slow until the next begins: the sync after it waits for the device's
        # compiling and the first collectives (a GPU's NCCL still connecting)
        self.set("first step" if self.phase == "first step" else "between steps", step)
        self._t0, self._waited, self._slow = time.monotonic(), 0.0, False

    def _run(self):
        while not self._done.wait(BEAT_S):
            _BEAT.pack_into(self._map, _BEAT_AT, time.time())
            with contextlib.suppress(OSError):
                self._map.flush()

    def close(self) -> None:
        """Stop beating and remove the record."""
        self._done.set()
        self._thread.join()
        self._map.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


_current: Heartbeat | None = None


def current() -> Heartbeat | None:
    return _current


def install(beat: Heartbeat | None) -> None:
    global _current
    _current = beat


def phase(name: str, step: int | None = None) -> None:
    """The main thread now does `name` (PHASES), at `step` if given."""
    if _current is not None:
        _current.set(name, step)


@contextlib.contextmanager
def during(name: str) -> Iterator[None]:
    """`name` for the block, then the phase before it again."""
    beat = _current
    if beat is None:
        yield
        return
    before, since = beat.phase, beat.since
    beat.set(name)
    try:
        yield
    finally:
        beat.phase, beat.since = before, since if PHASES[before][1] != "timed" else time.time()
        beat._write_phase()


def step_begins(step: int, first: bool = False) -> None:
    """Step `step` begins (first: a fit's first, which compiles and captures: slow)."""
    if _current is not None:
        _current.step_begins(step, first)


def step_ends(step: int) -> None:
    if _current is not None:
        _current.step_ends(step)


@contextlib.contextmanager
def waiting() -> Iterator[None]:
    """The block waits for the other ranks: its time is not this rank's work."""
    beat = _current
    if beat is None:
        yield
        return
    t0 = time.monotonic()
    with during("waiting"):
        try:
            yield
        finally:
            beat._waited += time.monotonic() - t0


def checkpointed(path: Any, step: int) -> None:
    """A checkpoint at `path` holds step `step` (saved, or the one this run resumed from)."""
    if _current is not None:
        _current.describe([os.fspath(path), int(step)])


# -- reading the records (the watchdog, the sentinel) ----------------------------------------------
def failure_line(line: str, isatty: bool | None = None) -> str:
    """The run's one failure line as written: after a newline where rank 0 may draw a progress bar (the
    Trainer draws one where stdout is a terminal: under Open MPI, a pty, while stderr is a pipe), which
    may have left its line unended, in another process under a launcher that merges the ranks' output."""
    import sys
    bar = sys.stdout.isatty() if isatty is None else isatty
    return ("\n" if bar else "") + line


def read(folder: str) -> dict[int, dict[str, Any]]:
    """Every rank's record in `folder` that reads whole: {rank: record} (the fields of the module's docstring)."""
    out = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith("rank") and name.endswith(".rec"):
                with contextlib.suppress(OSError, ValueError, IndexError, struct.error):
                    with open(os.path.join(folder, name), "rb") as f:
                        rec = _parse(f.read(RECORD_BYTES))
                    out[int(rec["rank"])] = rec
    return out


def _parse(raw: bytes) -> dict[str, Any]:
    rec = json.loads(raw[_TEXT_AT:].decode().strip())
    step, code, since = _PHASE.unpack_from(raw, 0)
    (beat,), (work_s, steps, last_s) = _BEAT.unpack_from(raw, _BEAT_AT), _WORK.unpack_from(raw, _WORK_AT)
    rec.update(step=step, phase=_NAMES[code], since=since, beat=beat, work_s=work_s, steps=steps, last_s=last_s)
    return rec


def where(rec: dict[str, Any]) -> str:
    """What a record's rank was doing: 'during step 341 (forward, backward, update)'."""
    phase = str(rec.get("phase"))
    words = PHASES.get(phase, (phase, "timed"))[0]
    if phase == "between steps":
        return f"after step {rec['step']} ({words})"
    if phase in ("starting", "loading data"):
        return f"while {words}"
    return f"during step {rec['step']} ({words})" if rec.get("step") else f"during {words}"


def last_checkpoint(records: dict[int, dict[str, Any]]) -> str:
    """'last good checkpoint: ck.npz at step 300', from the newest any rank recorded, or that none was."""
    found = [r["checkpoint"] for r in records.values() if r.get("checkpoint")]
    if not found:
        return "no checkpoint was saved"
    path, step = max(found, key=lambda c: c[1])
    return f"last good checkpoint: {path} at step {step}"


def claim(folder: str) -> bool:
    """Whether this process is the first to speak for the run's failure (one line from one rank)."""
    try:
        os.close(os.open(os.path.join(folder, "verdict"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        return True
    except FileExistsError:
        return False
    except OSError:             # the folder is gone: the run ended
        return False
