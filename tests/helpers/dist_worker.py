"""A data-parallel training run for tests/test_distributed.py: `python dist_worker.py MODE OUT ...`,
alone (one process) or under `mpiexec -n N` (N ranks). Rank 0 writes OUT (.npz); with --all-ranks
every rank writes OUT.<rank>.npz.

    lenet OUT B STEPS      LeNet-5, Adam, B images per rank, on a seeded random set
                           (--momentum: momentum SGD instead; --float64: in float64)
    bn OUT B STEPS         a small conv net with BatchNorm; evaluate and save to OUT.ckpt.npz
    dropout OUT B STEPS    a small MLP with dropout, Adam; OUT.<rank>.npz also holds its last mask
    fail OUT               rank 1 raises after a few steps while the others train on

--shift P / --flip: the recipe's augmentation (random shifts of up to P pixels, random flips);
--grads: OUT also holds the gradient arena after the last step (summed over the ranks);
--drop-bucket I: the reducer skips bucket I (a fault on purpose, for the tests that must catch it);
--precision bf16: the bf16 policy (float32 master weights, bfloat16 copies);
--pid-file: each rank writes its process id to OUT.<rank>.pid once it trains;
--grad-reduce bf16: gradients travel between the ranks as bfloat16;
--nudge: the initial weights moved by one ulp (a rounding-sized difference, to measure chaos);
--checkpoint C: stop requests and --resume use C; --stop-at R:S: rank R alone asks to stop during
step S; --count: count the host's MPI calls (the npz gets `blocking`, `nonblocking`, `buckets`);
--seed-per-rank: rank r builds its model, device and Trainer with seed r (the Trainer makes them
rank 0's); --stall R:S: rank R sleeps 10 minutes after step S (the others wait for it in a
collective), and SIGTERM asks the trainer to stop, as the command line's handler does;
--device cuda: one GPU per rank (TF32 off); --bucket-mib M: the reducer's bucket size (--tail-mib T:
its last's); --eager: no CUDA graph; --watchdog S: a rank still running after S seconds prints
every thread's Python stack and exits (faulthandler), so a hang ends with where each rank waits.
"""
import argparse
import collections
import faulthandler
import os
import signal
import sys
import time

import numpy as np

import minidl as dl
from minidl.training import callbacks
from minidl import distributed, layers as L, models, optim, precision
from minidl.training.trainer import TrainingStopped


def data(n=1024, seed=1):
    """Images with a learnable class: the label sets the mean brightness of the image."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    x = np.clip(rng.normal(20 * y[:, None, None] + 30, 40, (n, 28, 28)), 0, 255).astype(np.uint8)
    return x, y


def bn_net(device=None):
    x = L.Input((1, 28, 28))
    h = L.MaxPool2D(2)(L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1, bias=False)(x))))
    y = L.Softmax()(L.Dense(10)(L.Flatten()(h)))
    return dl.Model(x, y, device=device or dl.get_device("cpu"), seed=0)


def dropout_net(device, seed=0):
    x = L.Input((1, 28, 28))
    h = L.Dropout(0.5, name="drop")(L.ReLU()(L.Dense(64)(L.Flatten()(x))))
    return dl.Model(x, L.Softmax()(L.Dense(10)(h)), device=device, seed=seed)


class CountingComm:
    """The MPI communicator, its calls counted by name (methods of mpi4py's Comm cannot be patched)."""

    def __init__(self, comm):
        self._comm, self.calls = comm, collections.Counter()

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr

        def counted(*args, **kw):
            self.calls[name] += 1
            return attr(*args, **kw)
        return counted


def parse(argv):
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("lenet", "bn", "dropout", "fail"))
    p.add_argument("out")
    p.add_argument("b", type=int, nargs="?", default=8)
    p.add_argument("steps", type=int, nargs="?", default=10)
    p.add_argument("--momentum", action="store_true")
    p.add_argument("--float64", action="store_true")
    p.add_argument("--all-ranks", action="store_true")
    p.add_argument("--checkpoint")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--stop-at")
    p.add_argument("--count", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bucket-mib", type=float)
    p.add_argument("--tail-mib", type=float, help="the last bucket's cap ($MINIDL_BUCKET_TAIL_MIB)")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--watchdog", type=float)
    p.add_argument("--shift", type=int, default=0)
    p.add_argument("--flip", action="store_true")
    p.add_argument("--grads", action="store_true")
    p.add_argument("--drop-bucket", type=int)
    p.add_argument("--nudge", action="store_true")
    p.add_argument("--grad-reduce", default="fp32")
    p.add_argument("--pid-file", action="store_true")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--seed-per-rank", action="store_true")
    p.add_argument("--stall")
    return p.parse_args(argv)


def main(*argv):
    args = parse(argv)
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    world = distributed.init()
    if args.count:
        world.comm = CountingComm(world.comm)
    seed = world.rank if args.seed_per_rank else 0
    device = dl.get_device(args.device, dtype="float64" if args.float64 else "float32", seed=seed,
                           gpu=world.local_rank if world.size > 1 else None)
    device.set_tf32(False)
    if args.bucket_mib is not None:
        os.environ["MINIDL_BUCKET_MIB"] = str(args.bucket_mib)
    if args.tail_mib is not None:
        os.environ["MINIDL_BUCKET_TAIL_MIB"] = str(args.tail_mib)
    train = data()
    if args.mode == "fail":
        trainer = dl.Trainer(models.get("lenet", device=device, seed=0), optim.Adam(lr=1e-3), world=world)
        trainer.fit(train, steps=3, batch_size=8)
        if world.rank == 1:
            raise ValueError("injected failure")
        trainer.fit(train, steps=100_000, batch_size=8)      # waits on rank 1 in the all-reduce
        return
    model = {"lenet": lambda: models.get("lenet", device=device, seed=seed), "bn": lambda: bn_net(device),
             "dropout": lambda: dropout_net(device, seed)}[args.mode]()
    opt = optim.get("momentum", lr=0.01, momentum=0.9) if args.momentum else optim.Adam(lr=1e-3)
    if args.nudge:
        flat = device.to_host(model.flat)
        model.flat[...] = device.xp.asarray(np.nextafter(flat, np.inf, dtype=flat.dtype))
    trainer = dl.Trainer(model, opt, seed=seed, world=world, graph=not args.eager, shift=args.shift, flip=args.flip,
                         grad_reduce=args.grad_reduce,
                         precision=precision.policy(args.precision, always=True))   # however small the net
    if args.drop_bucket is not None and trainer.reducer:
        _drop_bucket(trainer.reducer.buckets, args.drop_bucket)
    trainer._step.net.releases = args.mode != "dropout"      # keep the dropout mask for the test to read
    if args.pid_file:
        with open(f"{args.out}.{world.rank}.pid", "w") as f:
            f.write(str(os.getpid()))
    if args.resume:
        trainer.resume(args.checkpoint)
    stop = [_StopAt(world, *map(int, args.stop_at.split(":")))] if args.stop_at else []
    if args.stall:
        stop.append(_StallAt(world, *map(int, args.stall.split(":"))))
        signal.signal(signal.SIGTERM, lambda signum, frame: trainer.request_stop(signum))
    arrays = {}
    try:
        result = trainer.fit(train, steps=args.steps, batch_size=args.b, monitor=25,
                             checkpoint=args.checkpoint, callbacks=stop)
    except TrainingStopped as e:
        result, arrays["stopped_at"], arrays["saved"] = (np.nan, np.nan), trainer.step, e.path is not None
    if args.count:
        calls = world.comm.calls
        arrays.update(blocking=calls["Allreduce"] + calls["allreduce"], nonblocking=calls["Iallreduce"],
                      buckets=len(trainer.reducer.buckets) if trainer.reducer else 0)
    if args.mode == "dropout":                     # the last training step's mask
        arrays["mask"] = device.to_host(trainer._step.net.layer("drop").saved)
    score = trainer.evaluate(data(300, seed=2), batch_size=64)
    if args.mode == "bn":
        trainer.save(args.out + ".ckpt.npz")
    if args.grads:
        arrays["grads"] = device.to_host(trainer._step.net.grads)
    arrays.update(flat=device.to_host(model.flat), state=device.to_host(model.state_flat), fit=result, score=score,
                  size=world.size, step=trainer.step)
    if args.all_ranks or args.mode == "dropout":
        np.savez(f"{args.out}.{world.rank}.npz", **arrays)
    elif world.main:
        np.savez(args.out, **arrays)


def _drop_bucket(buckets, i):
    """Bucket i is never summed over the ranks: each rank keeps its own part of it."""
    start, dropped = buckets.start, buckets.views[i]
    buckets.start = lambda view, lo: None if view is dropped else start(view, lo)


class _StopAt(callbacks.Callback):
    """Rank `rank` alone asks for a stop once step `step` is done (as SIGTERM to one process would)."""

    def __init__(self, world, rank, step):
        self.world, self.rank, self.step = world, rank, step

    def on_step_end(self, run):
        if self.world.rank == self.rank and run.step == self.step:
            run.trainer.request_stop(signal.SIGTERM)


class _StallAt(callbacks.Callback):
    """Rank `rank` stops answering after step `step`: it sleeps (a rank stuck outside MPI)."""

    def __init__(self, world, rank, step):
        self.world, self.rank, self.step = world, rank, step

    def on_step_end(self, run):
        if self.world.rank == self.rank and run.step == self.step:
            time.sleep(600)


if __name__ == "__main__":
    distributed.init().guard(main)(*sys.argv[1:])
