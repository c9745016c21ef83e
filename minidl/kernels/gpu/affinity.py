"""CPU affinity of the compile helpers: a rank may be bound to one core, its helpers are not."""
from __future__ import annotations

import os


def unbind(pid: int = 0) -> None:
    """Let process `pid` (0: this thread, on Linux) run on any core of the machine. An MPI launcher may
    bind each rank to one core (Open MPI does for two ranks), and the workers a rank starts, and its
    compile pool's threads, inherit that binding: eight workers then shared the rank's one core with
    it, and its start took four times longer. Both live for the first seconds of a run only."""
    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(pid, range(os.cpu_count() or 1))
        except OSError:                          # a cgroup that forbids it: stay where we are
            pass
