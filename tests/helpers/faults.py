"""A fault on purpose in one rank of a data-parallel run, for tests/test_distributed_faults.py.

    python faults.py FAULT RANK STEP train ARGS...   # python -m minidl.train ARGS, with the fault
    python faults.py FAULT RANK STEP api OUT          # Trainer.fit in Python (LeNet-5, random images)

The time of a kill or a hang goes to OUT.killed (api) or $FAULT_NOTE.killed (train).
FAULT, done by rank RANK once step STEP is trained (a callback every fit is given, as a user's would be):
    kill       SIGKILL to itself (the out-of-memory killer's way: no code runs)
    hang       sleeps for ever (a rank stuck outside MPI: a dead file system, a loop)
    slow:MS    sleeps MS ms after every step from STEP on (a rank that falls behind)
    slowsave:S rank RANK's checkpoint saves take S seconds more (a slow disk: no hang)
    none       nothing (a normal run)
"""
import os
import signal
import sys
import time

import numpy as np

from minidl import distributed
from minidl.training import callbacks, saving, trainer


class Fault(callbacks.Callback):
    def __init__(self, fault, rank, step, note):
        self.fault, self.rank, self.step, self.note = fault, rank, step, note

    def on_step_end(self, run):
        if distributed.init().rank != self.rank or run.step < self.step:
            return
        if self.fault in ("kill", "hang") and run.step == self.step:
            with open(self.note, "w") as f:          # when the fault came, for the test's clock
                f.write(repr(time.time()))
        if self.fault == "kill" and run.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.fault == "hang" and run.step == self.step:
            while True:
                time.sleep(60)
        elif self.fault.startswith("slow:"):
            time.sleep(float(self.fault[5:]) / 1e3)


def install(fault, rank, step, note):
    """Every Trainer.fit of this process gets the Fault callback (and, for slowsave, slower saves)."""
    fit = trainer.Trainer.fit

    def fit_with_fault(self, *args, callbacks=(), **kwargs):
        return fit(self, *args, callbacks=[*callbacks, Fault(fault, rank, step, note)], **kwargs)
    trainer.Trainer.fit = fit_with_fault
    if fault.startswith("slowsave:"):
        save = saving.ckpt.save

        def slow_save(*args, **kwargs):
            if distributed.init().rank == rank:
                time.sleep(float(fault[9:]))
            return save(*args, **kwargs)
        saving.ckpt.save = slow_save


def api(out):
    """Trainer.fit from Python under mpiexec: LeNet-5 on random images, saving every 20 steps."""
    import minidl as dl
    from minidl import models, optim
    world = distributed.init()
    x, y = np.random.default_rng(0).integers(0, 255, (512, 28, 28), np.uint8), np.arange(512) % 10
    t = dl.Trainer(models.lenet5(device="cpu"), optim.SGD(lr=0.01), device="cpu", world=world)
    t.fit(x, y, steps=1_000_000, batch_size=8, monitor=10, checkpoint=out, save_every=20)


if __name__ == "__main__":
    fault, rank, step, how, *rest = sys.argv[1:]
    note = (rest[0] if how == "api" else os.environ.get("FAULT_NOTE", "fault")) + ".killed"
    install(fault, int(rank), int(step), note)
    if how == "api":
        distributed.init().guard(api)(rest[0])
    else:
        from minidl.cli import train
        sys.exit(train.main(rest))
