"""python benchmarks/bench_dist.py: data-parallel training on 1, 2, 4 ... GPUs, minidl beside PyTorch DDP, one command.

Each (framework, case, precision, N) is one MPI launch of this file's --worker (so do not start this
file itself under mpirun). On a machine where MPI runs as root and NVLink SHARP must stay off:

    NCCL_NVLS_ENABLE=0 python benchmarks/bench_dist.py --launcher "mpirun --allow-run-as-root" \\
        --shard-optimizer --two-hosts --json dist.jsonl

runs N = 1, 2, 4 (--ranks; default: 1 and the powers of two up to the GPUs present, and their
count), ResNet-50 b256 and LeNet-5 b256 per GPU (--cases), fp32 and bf16 (--precision), minidl and
PyTorch DDP (--frameworks). A minidl launch at N > 1 measures, in one process, one Trainer after the
other: the step with its collectives; the step with them skipped (the same streams, events and
casts, no NCCL call: what N ranks cost before a byte is sent); with --shard-optimizer the step of
`Trainer(shard_optimizer=True)` (reduce-scatter, each rank's share of the update, all-gather; where
minidl's Trainer has no such keyword, one line says so and those runs are skipped); and the
collectives alone, captured in a CUDA graph: the all-reduce of the bytes the wire carries, in the
step's buckets, and reduce-scatter + all-gather of the same buckets. PyTorch DDP runs eager (its 25
MiB buckets overlapped with backward) on the same batches (the minidl Loader's rank slices), under
autocast for bf16; its all-reduce alone is torch.distributed.all_reduce of one buffer as large.

At the end: the table (benchmarks/scaling.py) of images/s, ms/step with and without collectives,
speed-up and efficiency against one GPU, the fraction of the all-reduce hidden behind backward,
minidl over DDP and the seconds each case took; the two-host table; and the model of 4-64 GPUs fed by
these parts. Before running it prints the launches and the time they should take (from the steps
measured before, docs/distributed.md, and the start-up of a process, docs/cold-start.md); --plan
prints that alone, without GPUs. --steps (default 100), or --quick (50 steps, 5 warm-up).

--grad-reduce fp32 bf16: the dtype gradients travel in (minidl's Trainer grad_reduce; PyTorch DDP's
bf16_compress_hook). --transport nvlink net: `net` puts NCCL on its network transport
(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1: sockets over loopback), a stand-in for ranks on two hosts;
--two-hosts adds that stand-in for ResNet-50 bf16 on 2 ranks with both wires, minidl beside DDP
(--net-steps steps). --json FILE appends one line per result; --from-json FILE prints the tables of
results gathered on machines of several sizes, without GPUs; --plot draws images/s against N.
Without usable GPUs (or an MPI launcher) it says so in one line and exits 2.
"""
import argparse
import gc
import inspect
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import scaling  # noqa: E402

CASES = {"resnet50-b256": dict(model="resnet", depth=50, batch=256, optimizer="momentum", lr=0.05),
         "lenet-b256": dict(model="lenet", depth=None, batch=256, optimizer="adam", lr=1e-3)}
WARMUP, QUICK_WARMUP = 10, 5
STEPS, QUICK_STEPS = 100, 50
NET_STEPS, QUICK_NET_STEPS = 20, 10
REPS = 20                       # replays of the collectives alone

# -- what the run should take ----------------------------------------------------------------------
# ms a step on one GPU (minidl: docs/distributed.md's 1-GPU figures; PyTorch DDP: its 2-GPU images/s
# there, 512 images a step), a 10% longer step at N > 1; over the network stand-in, ms per MiB sent
# (ResNet-50 bf16 on 2 ranks: 235 ms for 89.7 MiB, 159 for 44.9).
MS_STEP = {("resnet50-b256", "fp32"): {"minidl": 6.1, "torch-ddp": 20.7},
           ("resnet50-b256", "bf16"): {"minidl": 3.2, "torch-ddp": 24.1},
           ("lenet-b256", "fp32"): {"minidl": 0.31, "torch-ddp": 3.0},
           ("lenet-b256", "bf16"): {"minidl": 0.37, "torch-ddp": 3.5}}
WIRE_MIB = {"resnet50-b256": 89.7, "lenet-b256": 0.24}          # float32 gradients
NET_MS_PER_MIB = 3.0
# seconds to start a launch on warm caches (a process, MNIST, the model, NCCL, the first steps;
# docs/cold-start.md: 4-10 s for a ResNet-50 process), each further Trainer of a minidl launch, and
# the compiles of a case's first launch on empty caches (a fresh machine)
START_S = {"minidl": {"resnet50-b256": 9.0, "lenet-b256": 5.0}, "torch-ddp": {"resnet50-b256": 9.0, "lenet-b256": 7.0}}
VARIANT_S = {"resnet50-b256": 3.0, "lenet-b256": 1.0}
COLD_S = {"resnet50-b256": 20.0, "lenet-b256": 5.0}


@dataclass(frozen=True)
class Launch:
    """One MPI launch: `framework` on `n` ranks; a minidl launch measures each of `variants` in turn
    ('reduce': the step with collectives, 'none': without, 'shard': the sharded optimizer's)."""
    framework: str
    case: str
    precision: str
    n: int
    wire: str
    transport: str
    variants: tuple
    steps: int
    warmup: int

    def estimate_s(self, cold=False):
        """Seconds this launch should take (module constants above); cold: on empty caches."""
        ms = MS_STEP[(self.case, self.precision)][self.framework] * (1.1 if self.n > 1 else 1.0)
        net = NET_MS_PER_MIB * WIRE_MIB[self.case] * (0.5 if self.wire == "bf16" else 1.0)
        run = sum((self.steps + self.warmup) * (ms + (net if self.transport == "net" and v != "none" else 0.0))
                  for v in self.variants) / 1e3
        return (START_S[self.framework][self.case] + VARIANT_S[self.case] * (len(self.variants) - 1) + run
                + (COLD_S[self.case] if cold else 0.0))

    def head(self):
        """The columns that name this launch in the live lines."""
        return f"{self.case:<15}{self.precision:<6}{self.wire:<6}{self.transport:<7}{self.n:>3}  "


def default_ranks(gpus):
    """1, the powers of two below `gpus`, and `gpus` itself: 4 GPUs -> [1, 2, 4], 6 -> [1, 2, 4, 6]."""
    ranks, n = [], 1
    while n < gpus:
        ranks.append(n)
        n *= 2
    return ranks + [gpus] if gpus >= 1 else [1]


def plan(args, gpus):
    """The launches of this command on a machine of `gpus` GPUs, in the order run."""
    steps = args.steps or (QUICK_STEPS if args.quick else STEPS)
    warmup = QUICK_WARMUP if args.quick else WARMUP
    ranks = [n for n in (args.ranks or default_ranks(gpus)) if n <= gpus]
    extra = ("shard",) if args.shard_optimizer else ()
    out = []

    def add(framework, case, precision, n, wire, transport, n_steps, extra=extra):
        variants = ("reduce",) if framework != "minidl" or n == 1 else ("reduce", "none", *extra)
        out.append(Launch(framework, case, precision, n, wire, transport, variants, n_steps, warmup))
    for case in args.cases:
        for precision in args.precision:
            for transport in args.transport:
                for wire in args.grad_reduce:
                    for n in ranks:
                        if n == 1 and (transport, wire) != (args.transport[0], args.grad_reduce[0]):
                            continue                      # one GPU sends nothing: measured once
                        for framework in args.frameworks:
                            add(framework, case, precision, n, wire, transport, steps)
    if args.two_hosts and gpus >= 2:
        net_steps = args.net_steps or (QUICK_NET_STEPS if args.quick else NET_STEPS)
        for wire in ("fp32", "bf16"):
            for framework in args.frameworks:
                add(framework, "resnet50-b256", "bf16", 2, wire, "net", net_steps, extra=())
    return out


def estimate_s(launches):
    """Seconds all of `launches` should take, each (case, precision)'s first compiling on empty caches."""
    seen, total = set(), 0.0
    for launch in launches:
        key = (launch.framework, launch.case, launch.precision)
        total += launch.estimate_s(cold=launch.framework == "minidl" and key not in seen)
        seen.add(key)
    return total


# -- the workers (one per rank, under the MPI launcher) ---------------------------------------------
def _timed(fit, sync, barrier, steps, warmup):
    fit(warmup)
    sync()
    barrier()
    t0 = time.perf_counter()
    fit(steps)
    sync()
    return time.perf_counter() - t0


def has_shard_optimizer():
    """Whether minidl's Trainer takes shard_optimizer (the sharded optimizer, ZeRO stage 1)."""
    import minidl as dl
    return "shard_optimizer" in inspect.signature(dl.Trainer).parameters


NO_SHARD = "minidl's Trainer has no shard_optimizer keyword: the sharded-optimizer runs are skipped"


def _skip_collectives(reducer):
    """The reducer's collectives do nothing from now on; the rest of the step (its second stream's
    fork and join, the bf16 wire's casts on the GPU) stays."""
    coll = reducer.coll
    if hasattr(coll, "_reduce"):                  # NCCL: the collective itself
        coll._reduce = lambda a, op, stream: None
    else:                                         # MPI (the CPU): nothing started
        coll.start = lambda a, op, wire=None: None


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
            from minidl.backend import CaptureError
            try:
                call = device.capture(fn, warmup=2).replay
            except CaptureError:
                out["alone_how"] = "eager"
        else:
            fn()
        out[key] = device.elapsed_ms(call, reps)
    return out


def _release(trainer):
    """Destroy the trainer's communicator (NCCL: the captured graphs first), so that the next Trainer
    of this launch connects its own as the first did."""
    coll = getattr(getattr(trainer, "reducer", None), "coll", None)
    if coll is not None and hasattr(coll, "close"):
        coll.close()


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
    with collectives, the collectives alone; its communicator destroyed after."""
    import minidl as dl
    from minidl import models, optim
    t0 = time.perf_counter()
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
    kw = {"momentum": 0.9} if case["optimizer"] == "momentum" else {}
    trainer = dl.Trainer(model, optim.get(case["optimizer"], lr=case["lr"], **kw), progress=False,
                         log=lambda s: None, world=world, precision=precision, grad_reduce=wire,
                         **({"shard_optimizer": True} if variant == "shard" else {}))
    if variant == "none" and trainer.reducer:
        _skip_collectives(trainer.reducer)
    s = _timed(lambda n: trainer.fit(train, more_steps=n, batch_size=case["batch"], monitor=10 ** 9), dev.sync,
               world.comm.Barrier if world.comm else lambda: None, steps, warmup)
    row = {"images_s": steps * case["batch"] * world.size / s, "ms_step": 1e3 * s / steps,
           "collectives": variant != "none", "shard": variant == "shard",
           "buckets": len(trainer.reducer.buckets.buckets) if trainer.reducer and variant != "shard" else None,
           "wire_mib": model.grads.size * (2 if wire == "bf16" else 4) / 2 ** 20}
    if variant == "reduce" and trainer.reducer:
        row.update(collectives_alone(trainer.reducer, dev, world, wire))
    _release(trainer)
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
    s = _timed(fit, torch.cuda.synchronize, tdist.barrier, steps, warmup)
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
    emit({"images_s": steps * case["batch"] * world.size / s, "ms_step": 1e3 * s / steps, "collectives": True,
          "shard": False, "allreduce_ms": start.elapsed_time(end) / REPS, "alone_how": "eager", "buckets": None,
          "wire_mib": buf.numel() * buf.element_size() / 2 ** 20, "seconds": time.perf_counter() - t0})


def worker(framework, name, args):
    import minidl as dl
    from minidl import distributed
    world = distributed.init()
    fn = minidl_worker if framework == "minidl" else torch_worker

    def emit(row):
        if world.main:
            print(json.dumps(row), flush=True)
    world.guard(fn)(CASES[name], args.steps or STEPS, args.warmup, world, dl.data.load("mnist", "train"),
                    args.precision[0], args.grad_reduce[0], tuple(args.variants), args.device, emit)
    return 0


# -- the driver ----------------------------------------------------------------------------------------
def _launch(cmd, env, timeout):
    """(result rows, why it failed or None) of one launch. Its process group is killed where it
    outlives `timeout`, so no rank is left holding a GPU."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        why = None
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        why = f"still running after {timeout:.0f} s (killed)"
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if why is None and p.returncode:
        lines = [ln for ln in err.splitlines() if "rror" in ln][-1:] or err.strip().splitlines()[-1:]
        why = f"exit {p.returncode}: {' '.join(lines)[:200]}"
    return rows, why


def _gpus(launcher, device="cuda", ranks=None):
    """(the GPUs present, None) or (0, why this machine cannot run the benchmark). On the CPU (the
    tests' runs): as many as the ranks asked for."""
    if device == "cpu":
        return (max(ranks or [2]), None) if shutil.which(launcher[0]) else (0, f"{launcher[0]} is not on PATH")
    from minidl.backend import cuda_status
    ok, why = cuda_status()
    if not ok:
        return 0, why
    if shutil.which(launcher[0]) is None:
        return 0, f"{launcher[0]} is not on PATH"
    import cupy
    return cupy.cuda.runtime.getDeviceCount(), None


def _parser():
    p = argparse.ArgumentParser(prog="python benchmarks/bench_dist.py", description=__doc__.splitlines()[0])
    p.add_argument("--ranks", nargs="+", type=int, help="N to run (default: 1, powers of two, and the GPUs present)")
    p.add_argument("--steps", type=int, help=f"timed steps of each case (default {STEPS}; --quick {QUICK_STEPS})")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_STEPS} steps after {QUICK_WARMUP} warm-up ({QUICK_NET_STEPS} over the network)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--precision", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--frameworks", nargs="+", choices=("minidl", "torch-ddp"), default=["minidl", "torch-ddp"])
    p.add_argument("--grad-reduce", nargs="+", choices=("fp32", "bf16"), default=["fp32"],
                   help="the dtype gradients travel in (default fp32); the step without collectives is always measured")
    p.add_argument("--shard-optimizer", action="store_true",
                   help="also minidl's sharded optimizer (Trainer shard_optimizer=True) at each N > 1")
    p.add_argument("--transport", nargs="+", choices=("nvlink", "net"), default=["nvlink"],
                   help="net: NCCL over sockets, the stand-in for two hosts (default nvlink)")
    p.add_argument("--two-hosts", action="store_true",
                   help="also the two-host stand-in: ResNet-50 bf16, 2 ranks, NCCL over sockets, fp32 and bf16 wires")
    p.add_argument("--net-steps", type=int, help=f"timed steps over the network (default {NET_STEPS})")
    p.add_argument("--launcher", default=os.environ.get("MINIDL_MPIEXEC", "mpiexec"),
                   help="the MPI launcher command, without -n (default $MINIDL_MPIEXEC or mpiexec)")
    p.add_argument("--bucket-mib", type=float, help="minidl's gradient bucket size (default 8)")
    p.add_argument("--timeout", type=float, default=120, help="seconds a launch may take (default 120)")
    p.add_argument("--plan", action="store_true", help="print the launches and the time they should take, run nothing")
    p.add_argument("--json", help="also append one JSON line per result to this file")
    p.add_argument("--plot", help="draw images/s against N into this PNG (matplotlib)")
    p.add_argument("--from-json", help="no runs: the tables (and --plot) of the results in this JSON-lines file")
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "CASE"), help=argparse.SUPPRESS)
    p.add_argument("--variants", nargs="+", choices=("reduce", "none", "shard"), default=["reduce"],
                   help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=int, default=WARMUP, help=argparse.SUPPRESS)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)  # cpu: the tests'
    return p


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    for flag, v in (("--steps", args.steps), ("--net-steps", args.net_steps)):
        if v is not None and v < 1:
            p.error(f"{flag} must be >= 1, got {v}")
    if args.ranks and min(args.ranks) < 1:
        p.error(f"--ranks must be >= 1, got {min(args.ranks)}")
    if args.worker:
        return worker(*args.worker, args)
    if args.from_json:
        return _report(scaling.read(args.from_json), args.plot)
    from minidl import distributed
    if distributed.launched_by_mpi():
        print("bench_dist: run it without mpirun/mpiexec: it launches each case's ranks itself (--launcher)",
              file=sys.stderr)
        return 2
    launcher = shlex.split(args.launcher)
    gpus, why = _gpus(launcher, args.device, args.ranks)
    if args.plan:
        machine = gpus or max(args.ranks or [4])
        launches = plan(args, machine)
        for launch in launches:
            print(f"{launch.head()}{launch.framework:<10} {'+'.join(launch.variants):<18} "
                  f"{launch.steps} steps  ~{launch.estimate_s():.0f} s")
        print(f"{len(launches)} launches on {machine} GPUs{'' if gpus else ' (none here)'}: about "
              f"{estimate_s(launches) / 60:.1f} min on a fresh machine (empty caches)")
        return 0
    if not gpus:
        print(f"bench_dist: needs CUDA GPUs and an MPI launcher: {why}", file=sys.stderr)
        return 2
    if args.ranks and max(args.ranks) > gpus:
        print(f"bench_dist: {gpus} GPUs here: N = {', '.join(str(n) for n in args.ranks if n > gpus)} left out")
    if args.shard_optimizer and not has_shard_optimizer():
        print(f"bench_dist: {NO_SHARD}")
        args.shard_optimizer = False
    return _run(args, plan(args, gpus), launcher, gpus)


def _run(args, launches, launcher, gpus):
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))   # the caller's too (cuDNN FE)
    env = dict(os.environ, PYTHONPATH=path, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    if args.bucket_mib is not None:
        env["MINIDL_BUCKET_MIB"] = str(args.bucket_mib)
    print(f"{len(launches)} launches on {gpus} GPUs, about {estimate_s(launches) / 60:.1f} min (empty caches)")
    print(f"{'case':<15}{'prec':<6}{'wire':<6}{'link':<7}{'N':>3}  {'framework':<26}{'images/s':>12}{'ms/step':>10}"
          f"{'alone ms':>10}{'RS+AG ms':>10}{'wire MiB':>10}{'s':>6}")
    results, t_all = [], time.perf_counter()
    for launch in launches:
        cmd = launcher + ["-n", str(launch.n), sys.executable, __file__, "--worker", launch.framework, launch.case,
                          "--steps", str(launch.steps), "--warmup", str(launch.warmup), "--precision",
                          launch.precision, "--grad-reduce", launch.wire, "--device", args.device,
                          "--variants", *launch.variants]
        link_env = dict(env, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1") if launch.transport == "net" else env
        t0 = time.perf_counter()
        rows, why = _launch(cmd, link_env, args.timeout)
        for row in rows:
            if "skipped" in row:
                print(f"{launch.head()}{launch.framework:<10} {row['variant']}: {row['skipped']}")
                continue
            results.append(dict(row, case=launch.case, precision=launch.precision, ranks=launch.n,
                                framework=launch.framework, grad_reduce=launch.wire, transport=launch.transport))
            r = results[-1]
            fmt = lambda k, f: "-" if r.get(k) is None else format(r[k], f)     # noqa: E731
            print(f"{launch.head()}{scaling.label(r):<26}{r['images_s']:>12,.0f}{r['ms_step']:>10.3f}"
                  f"{fmt('allreduce_ms', '.3f'):>10}{fmt('rs_ag_ms', '.3f'):>10}{fmt('wire_mib', '.1f'):>10}"
                  f"{fmt('seconds', '.0f'):>6}", flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
        took = time.perf_counter() - t0
        print(f"{launch.head()}{launch.framework:<10} {'failed: ' + why if why else 'done'} in {took:.0f} s "
              f"(estimated {launch.estimate_s():.0f})", flush=True)
    print(f"all launches: {time.perf_counter() - t_all:.0f} s (estimated {estimate_s(launches):.0f} on empty caches)")
    return _report(results, args.plot)


def _report(results, plot_path):
    print(scaling.table(results))
    print(scaling.HIDDEN_NOTE)
    net = scaling.net_table(results)
    if net:
        print("\ntwo hosts, stood in for (NCCL over sockets):")
        print(net)
    print()
    scaling.report(scaling.parts_from_results(results))
    if plot_path and results:
        scaling.plot(results, plot_path)
        print(f"plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
