"""How a `python -m minidl.train` run ends when it is stopped: nothing trained is lost, nothing
it was not asked to write is replaced.

SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) alike: during training the handler
asks the trainer to stop (Trainer.request_stop), which finishes its step, and the callback
minidl.training.callbacks.SaveOnStop saves and stops (exit 128 + the signal); a signal during the final save is
honoured after it; one during evaluation keeps the trained weights and says where. A run that was
not asked to write the checkpoint (no -s, --save-every, --resume) saves at a stop only where no
file is (fresh_name).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
from typing import TYPE_CHECKING, Callable, Iterator

from minidl import files

if TYPE_CHECKING:
    from minidl.training.trainer import Trainer, TrainingStopped


def claim_outputs(args: argparse.Namespace, path: str) -> str | Callable[[], str]:
    """Lock every file this run writes, for the whole run, before anything is read or trained:
    a second run on one of them ends at once with "... is in use by pid N" (minidl.files).

    Returns where a stop (a signal) saves: the checkpoint where the run was asked to write it (-s,
    --save-every, --resume), else a function choosing at the stop the checkpoint path if nothing is
    there, else a fresh name beside it: a run never replaces a checkpoint it was not asked to write,
    and one that is not stopped creates nothing.
    """
    for p in (args.metrics, args.save_artifact if "save_artifact" in args else None):
        if p:
            files.hold(p)
    if args.save or args.save_every or args.resume:
        files.hold(path)
        return path
    return lambda: fresh_name(path)


@contextlib.contextmanager
def hint_resume(path: str) -> Iterator[None]:
    """A stop that saved beside the checkpoint (not asked to write it) says how to resume from there."""
    from minidl.training.trainer import TrainingStopped
    try:
        yield
    except TrainingStopped as e:
        if e.path and os.path.abspath(e.path) != os.path.abspath(path):
            e.hint = (f" ({path} was left as it was): the same command with "  # type: ignore[attr-defined]
                      f"--checkpoint {e.path} --resume continues it")
        raise


def stopped(signum: int, what: str, saved: str | os.PathLike | None, path: str) -> TrainingStopped:
    """TrainingStopped for a stop outside Trainer.fit, its hint naming how to go on."""
    from minidl.training.trainer import TrainingStopped
    e = TrainingStopped(what + (f"; the trained weights are in {saved}" if saved else ""), signum, saved)
    if saved and os.path.abspath(saved) != os.path.abspath(path):
        e.hint = f": -l --checkpoint {saved} starts from them"     # type: ignore[attr-defined]  # read by getattr
    elif saved:
        e.hint = ""                                               # type: ignore[attr-defined]
    return e


class Interrupted(Exception):
    """A signal outside training: raised where the run is, caught where something can be saved."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Signals:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) for a whole run.

    Outside training a signal raises Interrupted (TrainingStopped before training: nothing to
    save). Inside `deferred(trainer)` it is recorded and handed to the trainer, which finishes the
    step, saves and stops; a signal during a save is honoured after it (`check`).
    """
    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.defer, self.pending = False, None     # type: bool, int | None

    def __enter__(self) -> Signals:
        self.old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)

    def _handle(self, signum, frame):
        if not self.defer:
            raise Interrupted(signum)
        self.pending = signum
        if self.trainer is not None:
            self.trainer.request_stop(signum)

    @contextlib.contextmanager
    def deferred(self, trainer: Trainer | None) -> Iterator[None]:
        self.trainer, self.defer = trainer, True
        try:
            yield
        except Interrupted:
            raise
        finally:
            self.trainer, self.defer = None, False

    def check(self) -> None:
        """Raise Interrupted for a signal recorded while deferred and not yet acted on."""
        signum, self.pending = self.pending, None
        if signum is not None:
            raise Interrupted(signum)


def fresh_name(path: str) -> str:
    """`path` itself where nothing is there, no process holds it and its name is a checkpoint's
    (.npz), else <stem>.stopped[-k].npz, the first such name free: where a run that was not asked to
    write `path` may still save (a run started with -l from exported weights, w.safetensors, saves
    w.stopped.npz: a checkpoint under a checkpoint's name, never a zip named .safetensors)."""
    checkpoint_name = os.fspath(path).lower().endswith(".npz")
    if checkpoint_name and not os.path.lexists(path) and _try_hold(path):
        return path
    stem, ext = os.path.splitext(os.fspath(path))
    ext = ext if checkpoint_name else ".npz"
    for k in range(1, 1000):
        candidate = f"{stem}.stopped{'' if k == 1 else f'-{k}'}{ext}"
        if not os.path.lexists(candidate) and _try_hold(candidate):
            return candidate
    raise files.WriteError(f"no free name beside {path} to save to")


def _try_hold(path):
    try:
        files.hold(path)
        return True
    except files.WriteError:
        return False
