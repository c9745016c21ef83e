"""The ranks watch each other: a rank that dies, hangs or falls behind is named in one line.

    watchdog.start(world)      # once per process, collectively (Reducer, python -m minidl.train)

Each rank publishes its heartbeat (heartbeat.py) into a folder of the run, under the folder of
minidl's file locks (minidl.files: $MINIDL_LOCK_DIR, else a per-user runtime or temporary folder;
one host, or several where that folder is shared), starts its sentinel (sentinel.py: a rank killed
outright), and runs a daemon thread that reads every record it sees every POLL_S:

- a rank whose heartbeat is older than the timeout (its process does not run), or which has been in a
  timed phase (a step, the work between steps) past the timeout while another rank waits for it:
  one line, `minidl: rank 1 stopped answering after step 341 (between steps: callbacks, monitoring)
  6 s ago; the run stops; last good checkpoint: ck.npz at step 300`, from the first rank to see it
  (heartbeat.claim), and the job is aborted (exit status 1);
- rank 0: a rank whose work per step (its step's time less its waits) is SLOW_RATIO times the others'
  over two windows of WINDOW_S in a row: one warning (warnings.warn; the command line's `warning: ...`
  line), once: `rank 1 is 3.1x slower than the others (112 ms a step against 36)`.

The timeout is $MINIDL_WATCHDOG_S (seconds, default 5; 0 turns the watchdog off), and at least
HANG_STEPS of the rank's own usual steps, so a slow model's long steps are no hang. Slow phases (the
first step, evaluation, a save) are never judged hung, only a heartbeat that stops. Ages are taken on
this host's clock (Observed): the hosts' clocks need not agree.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from typing import IO, Any

from . import heartbeat

TIMEOUT_S = 5.0          # $MINIDL_WATCHDOG_S's default
POLL_S = 0.25
HANG_STEPS = 20          # a rank is hung past this many of its usual steps too
SLOW_RATIO, SLOW_MS = 1.5, 5.0   # a rank this many times slower than the others, and by this many ms a step
WINDOW_S = 2.0
ABORT_S = 3.0            # a rank that sees a failure another rank spoke for ends the job this much later

_running: Watchdog | None = None
_started = False                  # start() was called: its collective is behind us


def timeout_from_env() -> float:
    """$MINIDL_WATCHDOG_S: seconds (0: off); anything else is a ValueError naming it."""
    text = os.environ.get("MINIDL_WATCHDOG_S", "")
    try:
        value = float(text) if text.strip() else TIMEOUT_S
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:         # NaN too
        raise ValueError(f"MINIDL_WATCHDOG_S must be the seconds a rank may keep the others waiting, a "
                         f"number in [0, 86400] (0: no watchdog), got {text!r}")
    return value


def judge(records: dict[int, dict[str, Any]], now: float, timeout: float) -> str | None:
    """The line naming the first rank that stopped answering, or None (a pure function of the records)."""
    waiting = [r for r, rec in records.items() if rec["phase"] == "waiting"]
    for r, rec in sorted(records.items()):
        kind = heartbeat.PHASES.get(rec["phase"], ("", "timed"))[1]
        steps = rec.get("steps") or 0
        usual = rec["work_s"] / steps if steps else rec.get("last_s", 0.0)     # before any: the first step's
        limit = max(timeout, HANG_STEPS * usual)
        if now - rec["beat"] > timeout:
            age = now - rec["beat"]
        elif kind == "timed" and now - rec["since"] > limit and any(w != r for w in waiting):
            age = now - rec["since"]
        else:
            continue
        return (f"minidl: rank {r} stopped answering {heartbeat.where(rec)} {age:.0f} s ago; the run stops; "
                f"{heartbeat.last_checkpoint(records)}")
    return None


def slower(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]) -> tuple[int, float, float] | None:
    """(rank, its ms a step, the others' mean) of a rank SLOW_RATIO times slower than the others between two
    readings of the records, or None. Each rank's work: its steps' time less its waits, slow phases apart."""
    per = {}
    for r, rec in after.items():
        if r in before and rec["steps"] - before[r]["steps"] >= 3:
            per[r] = 1e3 * (rec["work_s"] - before[r]["work_s"]) / (rec["steps"] - before[r]["steps"])
    if len(per) < 2:
        return None
    r = max(per, key=per.get)               # type: ignore[arg-type]
    others = sum(v for k, v in per.items() if k != r) / (len(per) - 1)
    if per[r] >= SLOW_RATIO * others and per[r] - others >= SLOW_MS:
        return r, per[r], others
    return None


class Observed:
    """The records' times on this host's clock: when this watchdog saw each rank's beat and phase change.
    Hosts' clocks may disagree by more than the timeout (no NTP): a record's own wall times would then make
    a live rank look stopped. A phase or beat first seen is taken as new."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[float, float, tuple[Any, ...], float]] = {}

    def __call__(self, records: dict[int, dict[str, Any]], now: float) -> dict[int, dict[str, Any]]:
        t, out = time.monotonic(), {}
        for r, rec in records.items():
            beat, phase = rec["beat"], (rec["step"], rec["phase"], rec["since"])
            old = self.seen.get(r)
            t_beat = old[1] if old and old[0] == beat else t
            t_phase = old[3] if old and old[2] == phase else t
            self.seen[r] = (beat, t_beat, phase, t_phase)
            out[r] = dict(rec, beat=now - (t - t_beat), since=now - (t - t_phase))
        return out


class Watchdog:
    """This rank's heartbeat, sentinel and watching thread, in `folder` (one per run)."""

    def __init__(self, world: Any, folder: str, timeout: float) -> None:
        self.world, self.folder, self.timeout = world, folder, timeout
        self.beat = heartbeat.Heartbeat(folder, world.rank)
        heartbeat.install(self.beat)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sentinel.py")
        self.sentinel = subprocess.Popen([sys.executable, "-E", "-S", script, folder, str(world.rank)],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         start_new_session=True)     # the launcher's kill spares it
        self._pipe: IO[bytes] = self.sentinel.stdin      # type: ignore[assignment]  # PIPE: never None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minidl-watchdog", daemon=True)
        self._thread.start()

    def _run(self):
        window: dict[int, dict[str, Any]] | None = None
        t_window, strikes, warned, observed = time.monotonic(), 0, False, Observed()
        while not self._done.wait(POLL_S):
            records = heartbeat.read(self.folder)
            now = time.time()
            line = judge(observed(records, now), now, self.timeout)
            if line is not None:
                self._end(line)
                return
            if self.world.rank == 0 and not warned and time.monotonic() - t_window >= WINDOW_S:
                found = slower(window, records) if window is not None else None
                strikes = strikes + 1 if found else 0
                if strikes == 2 and found:
                    r, ms, others = found
                    warnings.warn(f"rank {r} is {ms / others:.1f}x slower than the others ({ms:.0f} ms a step "
                                  f"against {others:.0f})", RuntimeWarning, stacklevel=1)    # what to act on
                    warned = True
                window, t_window = records, time.monotonic()

    def _end(self, line):
        if heartbeat.claim(self.folder):
            from tqdm import tqdm                   # a bar drawn by this rank is cleared first, one by another
            tqdm.write(heartbeat.failure_line(line), file=sys.stderr)    # rank ended
            sys.stderr.flush()
            self.tell("spoke")
            time.sleep(0.5)                         # the launcher forwards output on its own
        else:                                       # another rank spoke and ends the job; if it has not
            time.sleep(ABORT_S)                     # (a launcher that leaves ranks running), this rank does
        with contextlib.suppress(Exception):
            from mpi4py import MPI
            if self.world.comm is not None and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
                self.world.comm.Abort(1)            # every rank ends, now (MPI from this thread: allowed)
        os._exit(1)                                 # else the launcher ends the others

    def tell(self, word: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._pipe.write(word.encode() + b"\n")
            self._pipe.flush()

    def stop(self, word: str = "bye") -> None:
        """The rank ends in order (bye) or after printing its own failure (spoke): nothing more to watch."""
        self._done.set()
        self.tell(word)
        with contextlib.suppress(OSError):
            self._pipe.close()
        heartbeat.install(None)
        self.beat.close()
        with contextlib.suppress(OSError):
            os.rmdir(self.folder)                   # the last rank's


def start(world: Any) -> Watchdog | None:
    """The process's watchdog among `world`'s ranks, started once (collective the first time: rank 0 names
    the run's folder); None for one process, or with $MINIDL_WATCHDOG_S=0."""
    global _running, _started
    if _started or world.size == 1:
        return _running
    _started = True
    name = world.comm.bcast(f"run-{socket.gethostname()}-{os.getpid()}-{time.time_ns()}" if world.main else None)
    timeout = timeout_from_env()          # after the collective: ranks given other values stay in step
    if not timeout:
        return None
    folder = os.path.join(runs_folder(), name)
    os.makedirs(folder, exist_ok=True)
    _running = Watchdog(world, folder, timeout)
    atexit.register(stop)
    hook = sys.excepthook

    def spoke(*exc):                # an error's traceback is the rank's own word: the sentinel stays quiet
        claim()
        hook(*exc)
    sys.excepthook = spoke
    return _running


def runs_folder() -> str:
    """Where the runs' folders go: minidl's per-user folder of file locks (files.locks), shared by the hosts
    that share $MINIDL_LOCK_DIR."""
    from ..files.locks import _lock_dir
    return _lock_dir() or os.path.join(os.path.expanduser("~"), ".minidl-runs")


def claim() -> bool:
    """This rank speaks for the run's failure (World's abort line, a traceback), so no other line follows;
    False where another rank spoke first (its line is the run's: this rank's failure follows from it)."""
    if _running is None:
        return True
    first = heartbeat.claim(_running.folder) or not os.path.isdir(_running.folder)
    _running.tell("spoke")
    return first


def stop() -> None:
    """The rank ends in order: the heartbeat stops, the sentinel goes quietly, the record goes."""
    global _running
    if _running is not None:
        _running.stop()
        _running = None
