"""The ranks of one bench_dist launch (benchmarks/bench_dist.py starts them; not a command of its own):

    mpiexec -n N python benchmarks/dist_worker.py FRAMEWORK CASE --steps S --precision P --grad-reduce W ...

minidl: one Trainer after the other in this process, one per variant (`reduce`: the step with its
collectives; `none`: with them skipped; `shard`: Trainer(shard_optimizer=True), skipped with one
line where the Trainer has no such keyword; `lone`: every rank a process of its own training alone
on its GPU, all at once, which is what N GPUs in one host cost before any rank meets another), each
timed over the same batches, and after the first the collectives alone (`collectives_alone`).
PyTorch DDP: its eager step and its all-reduce alone.
Rank 0 prints one JSON line per result as it is measured, so a later failure keeps the earlier ones.
"""
import argparse
import gc
import inspect
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {"resnet50-b256": dict(model="resnet", depth=50, batch=256, optimizer="momentum", lr=0.05),
         "lenet-b256": dict(model="lenet", depth=None, batch=256, optimizer="adam", lr=1e-3)}
REPS = 20                       # replays of the collectives alone


def _timed(fit, sync, barrier, steps, warmup, steady_ms=None):
    """(seconds of `steps` steps, the wall-clock window of the timed fit). `steady_ms()`, where given,
    is the fit's own figure of a step after its first (minidl's Trainer.timing): what a call of fit
    costs once (its data's fingerprint, the ranks' agreement, the first step's sync) stays out. Else
    fit(steps) whole (PyTorch's loop has no such cost). fit(steps) less a fit of one step, tried on
    2026-11-27, went negative on two GPUs at 5 steps: the fixed cost's jitter is larger than a few
    of LeNet-5's steps. The window (unix seconds) is what bench_dist --clocks reads the clocks over."""
    fit(warmup)
    sync()
    barrier()
    start, t0 = time.time(), time.perf_counter()
    fit(steps)
    sync()
    s = time.perf_counter() - t0
    return (steady_ms() * steps / 1e3 if steady_ms else s), (start, time.time())


def graph_ms(trainer, dev, reps=50):
    """The captured step's GPU time, replayed `reps` times back to back (every rank replays alike, so its
    collectives match), or None where the step was not captured: the step without the host's part
    (the loop, the heartbeat, the data's indices), to set beside the fit's steady figure."""
    captured = getattr(getattr(trainer, "_step", None), "_captured", None)
    if dev.name != "cuda" or not captured:
        return None
    _, call = next(iter(captured.values()))
    return dev.elapsed_ms(call.replay, reps)


def has_shard_optimizer():
    """Whether minidl's Trainer takes shard_optimizer (the sharded optimizer, ZeRO stage 1)."""
    import minidl as dl
    return "shard_optimizer" in inspect.signature(dl.Trainer).parameters


NO_SHARD = "minidl's Trainer has no shard_optimizer keyword: the sharded-optimizer runs are skipped"


def _skip_collectives(reducer):
    """The reducer's collectives do nothing until the returned undo() is called; the rest of the step
    (its second stream's fork and join, the bf16 wire's casts on the GPU) stays. The communicator is
    the process's (World.communicator): the next Trainer gets it back whole."""
    coll = reducer.coll
    name = "_reduce" if hasattr(coll, "_reduce") else "start"      # NCCL: the collective; MPI: nothing started
    setattr(coll, name, lambda *a, **k: None)
    return lambda: delattr(coll, name)


def collectives_alone(reducer, device, world, wire, reps=REPS):
    """{allreduce_ms, rs_ag_ms, alone_how}: the gradient arena's collectives alone, in the step's
    buckets over the bytes `wire` carries: all-reduce; reduce-scatter then all-gather (each bucket
    cut to a multiple of the ranks). On the GPU each is captured in a CUDA graph and replayed
    (device time, no Python between the calls; eager where capturing fails); on the CPU, MPI."""
    xp, N = device.xp, world.size
    bounds = [(b.lo, b.hi) for b in reducer.buckets.buckets]
    if device.name == "cuda":
        from cupy.cuda import nccl
        from minidl.kernels.gpu.collectives import _TYPES
        from minidl.precision import BFLOAT16
        dtype = BFLOAT16 if wire == "bf16" else xp.float32
        coll = reducer.coll
        raw, code = coll._ready(), _TYPES[xp.dtype(dtype).name]
    else:
        from mpi4py import MPI
        dtype = xp.float32                            # MPI has no bfloat16
    buf = xp.zeros(max(hi for _, hi in bounds), dtype)               # buckets come in backward order
    shards = [xp.zeros((hi - lo) // N, dtype) for lo, hi in bounds]

    def allreduce():
        for lo, hi in bounds:
            reducer.coll.allreduce(buf[lo:hi], "sum")

    def rs_ag():
        for (lo, hi), shard in zip(bounds, shards):
            whole = buf[lo:lo + shard.size * N]
            if device.name == "cuda":
                stream = xp.cuda.get_current_stream().ptr
                raw.reduceScatter(whole.data.ptr, shard.data.ptr, shard.size, code, nccl.NCCL_SUM, stream)
                raw.allGather(shard.data.ptr, whole.data.ptr, shard.size, code, stream)
            else:
                world.comm.Reduce_scatter_block(whole, shard, op=MPI.SUM)
                world.comm.Allgather(shard, whole)
    out = {"alone_how": "graph" if device.name == "cuda" else "host"}
    for key, fn in (("allreduce_ms", allreduce), ("rs_ag_ms", rs_ag)):
        call = fn
        if device.name == "cuda":
            try:
                call = device.capture(fn, warmup=2).replay
            except Exception as e:  # noqa: BLE001  a benchmark: timed eagerly instead, saying why
                out["alone_how"] = f"eager ({type(e).__name__}: {e})"[:160]
        else:
            fn()
        out[key] = device.elapsed_ms(call, reps)
    return out


def minidl_worker(case, steps, warmup, world, train, precision, wire, variants, device="cuda", emit=print):
    """Each variant's result, emitted as it is measured (a later failure keeps the earlier ones)."""
    import minidl as dl
    dev = dl.get_device(device, gpu=world.local_rank if device == "cuda" and world.size > 1 else None)
    shard_ok = has_shard_optimizer()
    for variant in variants:
        if variant == "shard" and not shard_ok:
            emit({"variant": "shard", "skipped": NO_SHARD})
            continue
        emit(_minidl_variant(case, steps, warmup, world, train, precision, wire, variant, dev))
        gc.collect()                      # the Trainer's arenas and graphs go before the next is built
        dev.free_memory()


def _minidl_variant(case, steps, warmup, world, train, precision, wire, variant, dev):
    """One Trainer's result: its step (with or without collectives, or sharded) and, for the step
    with collectives, the collectives alone. The communicator is the process's, kept for the next
    (it is destroyed at exit: a destroyed one left the process replaying its graphs slower)."""
    import minidl as dl
    from minidl import models, optim
    t0 = time.perf_counter()
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
    kw = {"momentum": 0.9} if case["optimizer"] == "momentum" else {}
    from minidl.distributed import World
    trainer = dl.Trainer(model, optim.get(case["optimizer"], lr=case["lr"], **kw), progress=False,
                         log=lambda s: None, world=World() if variant == "lone" else world, precision=precision,
                         grad_reduce=wire, **({"shard_optimizer": True} if variant == "shard" else {}))
    undo = _skip_collectives(trainer.reducer) if variant == "none" and trainer.reducer else (lambda: None)
    s, window = _timed(lambda n: trainer.fit(train, more_steps=n, batch_size=case["batch"], monitor=10 ** 9),
                       dev.sync, world.comm.Barrier if world.comm else lambda: None, steps, warmup,
                       steady_ms=lambda: trainer.timing["steady_ms"])
    row = {"images_s": steps * case["batch"] * world.size / s, "ms_step": 1e3 * s / steps, "window": window,
           "collectives": variant not in ("none", "lone"), "shard": variant == "shard", "lone": variant == "lone",
           "buckets": len(trainer.reducer.buckets.buckets) if trainer.reducer and variant != "shard" else None,
           "wire_mib": model.grads.size * (2 if wire == "bf16" else 4) / 2 ** 20}
    row["graph_ms"] = graph_ms(trainer, dev)
    if variant == "reduce" and trainer.reducer:
        try:
            row.update(collectives_alone(trainer.reducer, dev, world, wire))
        except Exception as e:  # noqa: BLE001  the step's figures stand without them
            row["alone_error"] = f"{type(e).__name__}: {e}"[:200]
    if variant == "lone" and world.comm:               # each rank timed its own run: all of them
        row["ms_ranks"] = world.comm.gather(row["ms_step"], root=0)
    undo()
    row["seconds"] = time.perf_counter() - t0
    return row


def torch_worker(case, steps, warmup, world, train, precision, wire, variants, device="cuda", emit=print):
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    import minidl as dl
    from benchmarks.torch_models import torch_model
    t0 = time.perf_counter()
    torch.cuda.set_device(world.local_rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK=str(world.rank), WORLD_SIZE=str(world.size))
    tdist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch_model(case).cuda(), device_ids=[world.local_rank])
    if wire == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.bf16_compress_hook)
    opt = (torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9) if case["optimizer"] == "momentum"
           else torch.optim.Adam(model.parameters(), lr=case["lr"]))
    x_all = ((torch.tensor(train[0], device="cuda").float() / 255 - 0.1307) / 0.3081).unsqueeze(1)
    y_all = torch.tensor(train[1], device="cuda").long()
    order = dl.data.Loader(*train, case["batch"], dl.get_device("cpu"), rank=world.rank, world=world.size)
    done = [0]

    def fit(n):
        for _ in range(n):
            e, k = divmod(done[0], len(order))
            idx = torch.from_numpy(order.indices(e, k)).cuda()
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()
            opt.step()
            done[0] += 1
    s, window = _timed(fit, torch.cuda.synchronize, tdist.barrier, steps, warmup)
    buf = torch.zeros(sum(p.numel() for p in model.parameters()), device="cuda",
                      dtype=torch.bfloat16 if wire == "bf16" else torch.float32)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    tdist.all_reduce(buf)
    start.record()
    for _ in range(REPS):
        tdist.all_reduce(buf)
    end.record()
    torch.cuda.synchronize()
    tdist.destroy_process_group()
    emit({"images_s": steps * case["batch"] * world.size / s, "ms_step": 1e3 * s / steps, "window": window,
          "collectives": True,
          "shard": False, "allreduce_ms": start.elapsed_time(end) / REPS, "alone_how": "eager", "buckets": None,
          "wire_mib": buf.numel() * buf.element_size() / 2 ** 20, "seconds": time.perf_counter() - t0})


def worker(args):
    import minidl as dl
    from minidl import distributed
    world = distributed.init()
    fn = minidl_worker if args.framework == "minidl" else torch_worker

    def emit(row):
        if world.main:
            print(json.dumps(row), flush=True)
    world.guard(fn)(CASES[args.case], args.steps, args.warmup, world, dl.data.load("mnist", "train"),
                    args.precision, args.grad_reduce, tuple(args.variants), args.device, emit)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="dist_worker.py", description=__doc__.splitlines()[0])
    p.add_argument("framework", choices=("minidl", "torch-ddp"))
    p.add_argument("case", choices=CASES)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--grad-reduce", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--variants", nargs="+", choices=("reduce", "none", "shard", "lone"), default=["reduce"])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the tests' runs")
    return worker(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
