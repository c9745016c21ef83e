"""mpiexec -n N python benchmarks/dist_variants.py [CASE] [PRECISION] [VARIANTS] [--data-first]
[--no-host-timer] [--guard]: dist_worker.py's minidl Trainers one after another in a plain script, each rank's
fit step beside its captured step's GPU time.

Why: on 2 H100s (2026-11-27, night) the same two-rank ResNet-50 bf16 step replayed in 3.274 ms in
dist_worker.py's processes and in 2.930 in this script's, each rank alone 3.072 against 2.905: the
worker's processes are in the slowed state docs/results.md describes, this script's are not, and
which step of the worker's puts them there is not known. VARIANTS (comma-separated, default
lone,reduce,lone,none,lone): `lone` trains alone (no communicator), `reduce` with the collectives,
`none` with them skipped. One JSON line a variant: each rank's steady step (`ms`), its host's median
step (`host_step_median_ms`), one replay's launch and the graph's GPU time replayed back to back.
The ways this script's processes differ from the worker's, each made like the worker's by a flag to
find which one matters: --data-first loads the data set before the GPU's Device is made (the
worker's order), --no-host-timer leaves the Trainer's step loop unwrapped, --guard runs the Trainers
inside World.guard (as the worker does where N > 1; its one-GPU launch, unguarded, was not slowed).
The first `lone` variant's captured step stays as a canary: every later variant replays it once its
Trainer is built (the process's communicator connected) and once it has trained (`canary_built_ms`,
`canary_trained_ms`), which tells which of them slows the process. The communicator is the
process's (World.communicator), kept from Trainer to Trainer and destroyed at exit.
"""
import argparse
import gc
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks import dist_worker as W
import minidl as dl
from minidl import distributed, models, optim
from minidl.distributed import World

STEPS, WARMUP = 200, 5


def one(variant, case, precision, world, dev, train, host_timer=True, canary=None):
    """The variant's row (rank 0 prints it) -> (its Trainer, its captured call)."""
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
    kw = {"momentum": 0.9} if case["optimizer"] == "momentum" else {}
    tr = dl.Trainer(model, optim.get(case["optimizer"], lr=case["lr"], **kw), progress=False, log=lambda s: None,
                    world=World() if variant == "lone" else world, precision=precision)
    undo = W._skip_collectives(tr.reducer) if variant == "none" and tr.reducer else (lambda: None)
    stages = {}
    if canary is not None:
        if tr.reducer:
            tr.reducer.coll._ready()                   # its NCCL communicator connected
        stages["canary_built_ms"] = dev.elapsed_ms(canary.replay, 50)
    host, run_step = [], tr._run_step

    def timed_step(*a):
        t = time.perf_counter()
        run_step(*a)
        host.append(time.perf_counter() - t)
    if host_timer:
        tr._run_step = timed_step
    s, _ = W._timed(lambda n: tr.fit(train, more_steps=n, batch_size=case["batch"], monitor=10 ** 9), dev.sync,
                    world.comm.Barrier, STEPS, WARMUP, steady_ms=lambda: tr.timing["steady_ms"])
    _, call = next(iter(tr._step._captured.values()))
    dev.sync()
    t = time.perf_counter()
    call.replay()
    launch_ms = 1e3 * (time.perf_counter() - t)
    gpu_ms = dev.elapsed_ms(call.replay, 50)
    if canary is not None:
        stages["canary_trained_ms"] = dev.elapsed_ms(canary.replay, 50)
    h = sorted(host[-STEPS:]) or [float("nan")]
    rows = world.comm.gather((1e3 * s / STEPS, 1e3 * h[len(h) // 2], launch_ms, gpu_ms, *stages.values()), root=0)
    if world.main:
        keys = ("ms", "host_step_median_ms", "launch_ms", "graph_gpu_ms", *stages)
        print(json.dumps({"variant": variant, **{k: [round(r[i], 4) for r in rows] for i, k in enumerate(keys)}}),
              flush=True)
    undo()
    return tr, call


def main(argv=None):
    p = argparse.ArgumentParser(prog="dist_variants.py", description=__doc__.splitlines()[0])
    p.add_argument("case", nargs="?", default="resnet50-b256", choices=sorted(W.CASES))
    p.add_argument("precision", nargs="?", default="bf16", choices=("fp32", "bf16"))
    p.add_argument("variants", nargs="?", default="lone,reduce,lone,none,lone")
    p.add_argument("--data-first", action="store_true", help="load the data before making the Device")
    p.add_argument("--no-host-timer", action="store_true", help="leave the Trainer's step loop unwrapped")
    p.add_argument("--guard", action="store_true", help="run the Trainers inside World.guard")
    args = p.parse_args(argv)
    world = distributed.init()
    return (world.guard(run) if args.guard else run)(args, world)


def run(args, world):
    train = dl.data.load("mnist", "train") if args.data_first else None
    dev = dl.get_device("cuda", gpu=world.local_rank)
    if train is None:
        train = dl.data.load("mnist", "train")
    kept, canary = [], None
    for variant in args.variants.split(","):
        tr, call = one(variant, W.CASES[args.case], args.precision, world, dev, train,
                       host_timer=not args.no_host_timer, canary=canary)
        if canary is None and variant == "lone":      # the first lone Trainer stays, its step the canary
            kept.append(tr)                           # (the graph writes the Trainer's arrays)
            canary = call
        del tr, call
        gc.collect()
        dev.free_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
