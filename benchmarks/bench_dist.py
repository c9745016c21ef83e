"""python benchmarks/bench_dist.py: data-parallel training on 1, 2, 4 ... GPUs, minidl beside PyTorch DDP, one command.

Each (framework, case, precision, N) is one MPI launch of benchmarks/dist_worker.py (so do not start
this file itself under mpirun). On a machine where MPI runs as root and NVLink SHARP must stay off:

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
(--net-steps steps). --lone adds, at each N > 1, the N ranks training alone at once, each its own
run on its own GPU with no communicator: what sharing one host costs before a byte is sent.
--clocks samples the GPUs' SM clock, power and throttle reasons (nvidia-smi) over each timed run.
--json FILE appends one line per result; --from-json FILE prints the tables of
results gathered on machines of several sizes, without GPUs; --plot draws images/s against N.
Without usable GPUs (or an MPI launcher) it says so in one line and exits 2.
"""
import argparse
import contextlib
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "dist_worker.py"
sys.path.insert(0, str(ROOT))
from benchmarks import gpu_clocks, scaling  # noqa: E402
from benchmarks.dist_worker import CASES, NO_SHARD, has_shard_optimizer  # noqa: E402

WARMUP, QUICK_WARMUP = 10, 5
STEPS, QUICK_STEPS = 100, 50
NET_STEPS, QUICK_NET_STEPS = 20, 10


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
    first, extra = ("lone",) * args.lone, ("shard",) * args.shard_optimizer
    out = []

    def add(framework, case, precision, n, wire, transport, n_steps, first=first, extra=extra):
        # `lone` first: a process that has made a Trainer with collectives replays every step after
        # it slower (docs/distributed.md), and the ranks alone are the baseline the others stand beside
        variants = ("reduce",) if framework != "minidl" or n == 1 else (*first, "reduce", "none", *extra)
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
                add(framework, "resnet50-b256", "bf16", 2, wire, "net", net_steps, first=(), extra=())
    return out


def estimate_s(launches):
    """Seconds all of `launches` should take, each (case, precision)'s first compiling on empty caches."""
    seen, total = set(), 0.0
    for launch in launches:
        key = (launch.framework, launch.case, launch.precision)
        total += launch.estimate_s(cold=launch.framework == "minidl" and key not in seen)
        seen.add(key)
    return total


# -- the driver ----------------------------------------------------------------------------------------
def _launch(cmd, env, timeout):
    """(result rows, why it failed or None) of one launch. Where it outlives `timeout` its process
    group gets SIGTERM (the launchers end their ranks on it), then SIGKILL 5 s later, so no rank is
    left holding a GPU. Its output goes to files, so a process that escaped the group and still holds
    them delays nothing."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, start_new_session=True)
        why = None
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            why = f"still running after {timeout:.0f} s (stopped)"
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=5)
                    break
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if why is None and p.returncode:
        lines = [ln for ln in stderr.splitlines() if "rror" in ln][-1:] or stderr.strip().splitlines()[-1:]
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
    p.add_argument("--lone", action="store_true",
                   help="also, at each N > 1, N processes training alone on their GPUs at once (no communicator)")
    p.add_argument("--clocks", action="store_true",
                   help="sample the GPUs' SM clock, power and throttle reasons (nvidia-smi) over each timed run")
    p.add_argument("--transport", nargs="+", choices=("nvlink", "net"), default=["nvlink"],
                   help="net: NCCL over sockets, the stand-in for two hosts (default nvlink)")
    p.add_argument("--two-hosts", action="store_true",
                   help="also the two-host stand-in: ResNet-50 bf16, 2 ranks, NCCL over sockets, fp32 and bf16 wires")
    p.add_argument("--net-steps", type=int, help=f"timed steps over the network (default {NET_STEPS})")
    p.add_argument("--launcher", default=os.environ.get("MINIDL_MPIEXEC", "mpiexec"),
                   help="the MPI launcher command, without -n (default $MINIDL_MPIEXEC or mpiexec)")
    p.add_argument("--bucket-mib", type=float, help="minidl's gradient bucket size (default 25)")
    p.add_argument("--bucket-tail-mib", type=float, help="minidl's last bucket's cap (default 0: as it falls)")
    p.add_argument("--timeout", type=float, default=120, help="seconds a launch may take (default 120)")
    p.add_argument("--plan", action="store_true", help="print the launches and the time they should take, run nothing")
    p.add_argument("--json", help="also append one JSON line per result to this file")
    p.add_argument("--plot", help="draw images/s against N into this PNG (matplotlib)")
    p.add_argument("--from-json", help="no runs: the tables (and --plot) of the results in this JSON-lines file")
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
    if args.from_json:
        rows = scaling.read(args.from_json)
        lone = [r for r in rows if r.get("lone")]
        results = [r for r in rows if not r.get("lone")]
        if lone:
            print(lone_table(results, lone))
        return _report(results, args.plot)
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
    if args.bucket_tail_mib is not None:
        env["MINIDL_BUCKET_TAIL_MIB"] = str(args.bucket_tail_mib)
    print(f"{len(launches)} launches on {gpus} GPUs, about {estimate_s(launches) / 60:.1f} min (empty caches)")
    print(f"{'case':<15}{'prec':<6}{'wire':<6}{'link':<7}{'N':>3}  {'framework':<26}{'images/s':>12}{'ms/step':>10}"
          f"{'alone ms':>10}{'RS+AG ms':>10}{'wire MiB':>10}{'s':>6}")
    results, lone, t_all = [], [], time.perf_counter()
    for launch in launches:
        cmd = launcher + ["-n", str(launch.n), sys.executable, str(WORKER), launch.framework, launch.case,
                          "--steps", str(launch.steps), "--warmup", str(launch.warmup), "--precision",
                          launch.precision, "--grad-reduce", launch.wire, "--device", args.device,
                          "--variants", *launch.variants]
        link_env = dict(env, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1") if launch.transport == "net" else env
        t0 = time.perf_counter()
        with gpu_clocks.Sampler() if args.clocks else contextlib.nullcontext() as sampler:
            rows, why = _launch(cmd, link_env, args.timeout)
        for row in rows:
            if "skipped" in row:
                print(f"{launch.head()}{launch.framework:<10} {row['variant']}: {row['skipped']}")
                continue
            r = dict(row, case=launch.case, precision=launch.precision, ranks=launch.n,
                     framework=launch.framework, grad_reduce=launch.wire, transport=launch.transport)
            if sampler is not None and r.get("window"):
                r["clocks"] = gpu_clocks.summary(sampler.samples, r["window"], launch.n)
            (lone if r.get("lone") else results).append(r)
            fmt = lambda k, f: "-" if r.get(k) is None else format(r[k], f)     # noqa: E731
            name = f"minidl alone x{launch.n}" if r.get("lone") else scaling.label(r)
            print(f"{launch.head()}{name:<26}{r['images_s']:>12,.0f}{r['ms_step']:>10.3f}"
                  f"{fmt('allreduce_ms', '.3f'):>10}{fmt('rs_ag_ms', '.3f'):>10}{fmt('wire_mib', '.1f'):>10}"
                  f"{fmt('seconds', '.0f'):>6}", flush=True)
            if r.get("ms_ranks"):
                print(f"{launch.head()}{'':<26}each rank alone: {' '.join(f'{ms:.3f}' for ms in r['ms_ranks'])} ms")
            if r.get("clocks"):
                print(f"{launch.head()}{'':<26}{_clock_cell(r['clocks'])}")
            for note in ("alone_error", "alone_how"):
                if note in r and r[note] not in ("graph", "host"):
                    print(f"{launch.head()}{scaling.label(r):<26}collectives alone: {r[note]}")
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps(r) + "\n")
        took = time.perf_counter() - t0
        print(f"{launch.head()}{launch.framework:<10} {'failed: ' + why if why else 'done'} in {took:.0f} s "
              f"(estimated {launch.estimate_s():.0f})", flush=True)
    print(f"all launches: {time.perf_counter() - t_all:.0f} s (estimated {estimate_s(launches):.0f} on empty caches)")
    if lone:
        print(lone_table(results, lone))
    return _report(results, args.plot)


def _clock_cell(c):
    return (f"GPUs over the timed steps: SM {c['sm_mhz']:.0f} MHz, <= {c['power_w']:.0f} W, <= {c['temp_c']:.0f} C, "
            f"throttle reasons {c['reasons']} ({c['samples']} samples)")


def lone_table(results, lone):
    """Markdown rows: N processes each training alone on its GPU at once, against one GPU's step of
    the same launch plan and the ranks' steps without and with collectives: what N GPUs in one host
    cost before any rank meets another. The speed-up of N alone is the ranks' against the lone step
    of their own launch: a process's step moves with its history (docs/results.md, 2026-11-27
    night), so one GPU's launch is not always the fair baseline. The last column is each process's
    captured step replayed alone on the GPU (dist_worker's graph_ms: one GPU / with collectives /
    without / alone), which shows a process slowed that way without the host's part."""
    def pick(rows, **match):
        found = [r for r in rows if r["framework"] == "minidl" and r["transport"] == "nvlink" and not r["shard"]
                 and r["grad_reduce"] == "fp32" and all(r[k] == v for k, v in match.items())]
        return found[0] if found else {}
    rows = [scaling.normalise(r) for r in results]
    lines = ["| case | precision | N | 1 GPU ms | N alone at once ms (slowest) | ranks without collectives ms | "
             "ranks with them ms | speed-up of N alone | on the GPU: 1 / with / without / alone ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.3f}"       # noqa: E731
    for r in lone:
        key = dict(case=r["case"], precision=r["precision"])
        one, with_ = pick(rows, ranks=1, **key), pick(rows, ranks=r["ranks"], collectives=True, **key)
        without = pick(rows, ranks=r["ranks"], collectives=False, **key)
        speedup = "-" if not with_ else f"{r['ranks'] * r['ms_step'] / with_['ms_step']:.2f}x"
        gpu = " / ".join(fmt(x.get("graph_ms")) for x in (one, with_, without, r))
        lines.append(f"| {r['case']} | {r['precision']} | {r['ranks']} | {fmt(one.get('ms_step'))} | "
                     f"{fmt(r['ms_step'])} ({fmt(max(r.get('ms_ranks') or [r['ms_step']]))}) | "
                     f"{fmt(without.get('ms_step'))} | {fmt(with_.get('ms_step'))} | {speedup} | {gpu} |")
    return "\n".join(lines)


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
