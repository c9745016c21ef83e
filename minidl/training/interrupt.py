"""Ctrl-C in Trainer.fit from Python: the step finishes, `checkpoint=` is saved and TrainingInterrupted
(a TrainingStopped and a KeyboardInterrupt) is raised, as the command line does on SIGINT (cli/stops.py)."""
from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from ..distributed import heartbeat
from .hooks import TrainingInterrupted, TrainingStopped

if TYPE_CHECKING:
    from .hooks import Trains

Fit = TypeVar("Fit", bound=Callable[..., Any])


def stops_on_ctrl_c(fit: Fit) -> Fit:
    """Trainer.fit, with Ctrl-C a stop request while it runs (ctrl_c_stops); however fit ends, its rank is
    then out of training (distributed.heartbeat: no step of it left to judge hung while others wait)."""
    @functools.wraps(fit)
    def wrapped(trainer: Trains, *args: Any, **kwargs: Any) -> Any:
        try:
            with ctrl_c_stops(trainer):
                return fit(trainer, *args, **kwargs)
        finally:
            heartbeat.phase("idle")
    return wrapped  # type: ignore[return-value]


@contextmanager
def ctrl_c_stops(trainer: Trains) -> Iterator[None]:
    """Ctrl-C during fit (Python's default SIGINT handler, in the main thread) asks for a stop after
    the step, as the command line's signals do; a second one interrupts at once. A request that no step
    took up (fit had nothing left to train) is a KeyboardInterrupt when fit returns."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield                              # the command line's handler, or not ours to change
        return

    def handler(signum, frame):
        if trainer._stop is not None:
            raise KeyboardInterrupt
        trainer.log("\nstopping after this step (Ctrl-C again to interrupt at once)")
        trainer.request_stop(signum)
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    except TrainingStopped as e:        # SaveOnStop's, after our request: a KeyboardInterrupt as well
        if e.signum != signal.SIGINT:
            raise
        raise TrainingInterrupted(str(e), e.signum, e.path) from None
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if trainer._stop == signal.SIGINT:
        trainer._stop = None
        raise KeyboardInterrupt
