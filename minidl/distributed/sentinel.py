"""A rank's sentinel: a small process that outlives its rank, to say so when the rank dies without a word.

    python sentinel.py FOLDER RANK        # started by watchdog.start, its stdin a pipe from the rank

A rank killed outright (SIGKILL, the out-of-memory killer) runs no code, and the launcher kills the
others at once (MPICH's Hydra: SIGKILL to every other rank within milliseconds, before any of them
could notice): no rank is left to speak. So each rank starts this process in a session of its own,
which the launcher's kill does not reach, sharing the rank's stderr. It reads its stdin: "bye" (the
rank ends in order) ends it quietly; "spoke" (the rank printed its own failure) keeps it quiet too,
and it tidies the run's folder after the rank's end; end of file without either means the rank
died. It then notes the time in `ended.<rank>`, lets the others' sentinels do the same (SETTLE_S),
and the sentinel of the rank that died first, if no rank has spoken for the run yet
(heartbeat.claim), prints the one line: which rank, what it was doing (its last heartbeat), and the
last good checkpoint. MPICH's launcher forwards output until every process holding the ranks' stderr
has closed it, Open MPI's until it ends the others (1-2 s): either way the line is shown (0.3 s after
the death). Whoever speaks tidies the run's folder once every rank holding a record there has ended.

Started with the standard library only (no minidl, no NumPy: it costs a few MiB and starts at once).
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import TextIO

if __package__:
    from . import heartbeat
else:                               # run as a script: heartbeat.py lies beside it
    import heartbeat  # type: ignore[no-redef,import-not-found]

SETTLE_S = 0.3         # the launcher kills the other ranks within milliseconds of the first death
TIDY_S = 60.0          # the longest the run's folder waits for its ranks to end after the line


def died_line(rank: int, records: dict) -> str:
    rec = records.get(rank, {"step": 0, "phase": "starting"})
    return (f"minidl: rank {rank} died {heartbeat.where(rec)}: its process ended without a word (killed? out "
            f"of memory?); the run stops; {heartbeat.last_checkpoint(records)}")


def watch(folder: str, rank: int, stdin: TextIO | None = None, stderr: TextIO | None = None) -> str:
    """Wait for the rank's end; returns how it ended: 'bye' (in order), 'spoke' (after printing its own
    failure), 'died' (without a word: this sentinel printed the line) or 'after' (died after another
    rank, or after a rank spoke: quiet)."""
    stdin, stderr = stdin or sys.stdin, stderr or sys.stderr
    spoke = False
    for line in stdin:
        if line.strip() == "bye" and not spoke:
            return "bye"
        spoke = spoke or line.strip() == "spoke"
        if spoke and line.strip() == "bye":
            break
    _note(folder, rank)
    if spoke:
        return "spoke"
    time.sleep(SETTLE_S)
    ended = _ended(folder)
    first = min(ended, key=lambda r: (ended[r], r), default=rank)
    if first != rank or not heartbeat.claim(folder):
        return "after"
    stderr.write(heartbeat.failure_line(died_line(rank, heartbeat.read(folder))) + "\n")
    stderr.flush()
    return "died"


def _note(folder, rank):
    """ended.<rank>: when this sentinel saw its rank end."""
    with contextlib.suppress(OSError):
        with open(os.path.join(folder, f"ended.{rank}"), "w") as f:
            f.write(repr(time.time()))


def _ended(folder):
    ended = {}
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if name.startswith("ended."):
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(folder, name)) as f:
                        ended[int(name.split(".")[1])] = float(f.read())
    return ended


def tidy(folder: str, patience: float = TIDY_S) -> None:
    """The run failed and its line is said: once every rank still holding a record has ended (at most
    `patience` seconds), the folder goes. Until then the verdict stays, so no other line follows, and
    the dead ranks' records stay, so a rank the launcher leaves running is still named and ended."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline and not set(heartbeat.read(folder)) <= set(_ended(folder)):
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


if __name__ == "__main__":
    folder, rank = sys.argv[1], int(sys.argv[2])
    if watch(folder, rank) in ("died", "spoke"):   # the run failed, and its line is said
        os.close(2)                                # the launcher need not wait for the tidying
        tidy(folder)
