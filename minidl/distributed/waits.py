"""Waiting for the other ranks while still hearing signals.

MPI's blocking calls (MPI_Wait, MPI_Allreduce) spin inside C, where Python never runs a signal
handler: ranks out of step (one of them in a collective the others never reach) spun for ever and
ignored SIGTERM and Ctrl-C. So every wait of minidl's collectives on the host polls its requests
(MPI_Testall) from Python, and handlers run between polls. An exception a handler raises
(KeyboardInterrupt) ends the wait; a stop request a handler only records (the command line's,
Trainer.request_stop) is read through `asked`: once a stop is asked, a wait that goes on for
STOP_GRACE_S more seconds means the others are not coming (in step they would have arrived within
a step), and `stuck(signum, seconds)` ends the job (World: one line, status 128 + the signal).

The first polls spin, as MPI's own wait does, so a collective about to complete costs no more;
past SPIN_S a wait sleeps between polls (up to PAUSE_S), so a rank waiting long for another (a
checkpoint being written) does not keep a core busy.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from . import heartbeat

STOP_GRACE_S = 10.0     # a stop asked, and the others still not here: ranks out of step
SPIN_S = 0.01           # polled without a pause, as MPI_Wait would
PAUSE_S = 0.001         # then between polls


def wait_all(requests: Sequence[Any], asked: Callable[[], int | None] | None = None,
             stuck: Callable[[int, float], object] | None = None) -> None:
    """Complete every MPI request of `requests`, polling; see the module's docstring for `asked`, `stuck`."""
    from mpi4py import MPI
    test = MPI.Request.Testall
    if test(requests):
        return
    with heartbeat.waiting():                       # not this rank's work; the watchdog names whom it waits for
        _poll(requests, test, asked, stuck)


def _poll(requests, test, asked, stuck):
    t0 = time.monotonic()
    since = None                                    # when a stop was first seen asked
    while not test(requests):
        now = time.monotonic()
        signum = asked() if asked is not None else None
        if signum:
            since = since or now
            if now - since > STOP_GRACE_S and stuck is not None:
                stuck(signum, now - t0)
        if now - t0 > SPIN_S:
            time.sleep(PAUSE_S)
