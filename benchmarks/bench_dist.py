"""python benchmarks/bench_dist.py: data-parallel training speed on 1 and 2 GPUs, minidl and PyTorch DDP.

One command runs every case, N = 1 and 2, both frameworks, each under its own MPI launch of this
file's --worker (so do not start this file itself under mpirun). On a machine where MPI runs as
root and NVLink SHARP must stay off:

    NCCL_NVLS_ENABLE=0 python benchmarks/bench_dist.py --launcher "mpirun --allow-run-as-root"

Per case, precision and N it prints images/s (N x b per step, b per rank), ms per step, and the
all-reduce of the whole gradient alone, ms (minidl: its Reducer's buckets on the reduction stream, eager;
PyTorch: torch.distributed.all_reduce of one buffer as large). The step's communication that
backward does not hide is roughly ms/step at N = 2 less ms/step at N = 1. minidl runs its captured
step (the bucketed NCCL all-reduce inside the CUDA graph); PyTorch DDP runs eager (its default 25
MiB buckets, overlapped with backward), on the same batches (the minidl Loader's rank slices).
--precision fp32 bf16 (both by default): minidl's precision policy (float32 master weights and
gradients, summed in float32), PyTorch under autocast bf16. A worker that does not end within
--timeout seconds is reported as failed. --bucket-mib sets minidl's bucket size. At the end a Markdown
table gives each result's speed-up and efficiency against one GPU and minidl's ratio to PyTorch DDP
(benchmarks/scaling.py), and a model of 4 and 8 GPUs from the measured 1- and 2-GPU steps and the
all-reduce (scaling.model); --plot draws images/s against N. --from-json FILE reads results appended
by --json on other machines (2, 4 and 8 GPUs) and prints the table and plot of all of them, without GPUs.

--grad-reduce fp32 bf16: the dtype the gradients travel in (minidl's Trainer grad_reduce; PyTorch
DDP's bf16_compress_hook for bf16), so each case also runs with half the bytes on the wire.
--grad-reduce none runs minidl's step with its collectives skipped (the rest kept), so the step's
time splits into what N ranks cost without sending and what the all-reduce adds.
--transport nvlink net: `net` puts NCCL on its network transport (NCCL_P2P_DISABLE=1
NCCL_SHM_DISABLE=1: sockets over loopback), a stand-in for ranks on two hosts; the table then
shows the step against the bytes each rank sends (wire MiB). Without usable GPUs it says so in one
line and exits 2.
"""
import argparse
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import scaling  # noqa: E402
CASES = {"resnet50-b256": dict(model="resnet", depth=50, batch=256, optimizer="momentum", lr=0.05),
         "lenet-b256": dict(model="lenet", depth=None, batch=256, optimizer="adam", lr=1e-3)}
WARMUP = 10


def _timed(fit, sync, barrier, steps):
    fit(WARMUP)
    sync()
    barrier()
    t0 = time.perf_counter()
    fit(steps)
    sync()
    return time.perf_counter() - t0


def minidl_worker(case, steps, world, train, precision, grad_reduce):
    import minidl as dl
    from minidl import models, optim
    dev = dl.get_device("cuda", gpu=world.local_rank if world.size > 1 else None)
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
    opt = optim.get(case["optimizer"], lr=case["lr"], **({"momentum": 0.9} if case["optimizer"] == "momentum" else {}))
    trainer = dl.Trainer(model, opt, progress=False, log=lambda s: None, world=world, precision=precision,
                         grad_reduce="fp32" if grad_reduce == "none" else grad_reduce)
    if grad_reduce == "none" and trainer.reducer:      # the step's streams, events and casts, no collective
        trainer.reducer.coll._reduce = lambda a, op, stream: None
    s = _timed(lambda n: trainer.fit(train, more_steps=n, batch_size=case["batch"], monitor=10 ** 9), dev.sync,
               world.comm.Barrier if world.comm else lambda: None, steps)
    reducer = trainer.reducer
    ar = dev.elapsed_ms(reducer.sum_grads, 20) if reducer else 0.0
    wire = model.grads.size * (2 if grad_reduce == "bf16" else 4) / 2 ** 20
    return s, ar, len(reducer.buckets) if reducer else 0, wire


def torch_worker(case, steps, world, train, precision, grad_reduce):
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    import minidl as dl
    from benchmarks.torch_models import torch_model
    torch.cuda.set_device(world.local_rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK=str(world.rank), WORLD_SIZE=str(world.size))
    tdist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch_model(case).cuda(), device_ids=[world.local_rank])
    if grad_reduce == "bf16":
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
    s = _timed(fit, torch.cuda.synchronize, tdist.barrier, steps)
    buf = torch.zeros(sum(p.numel() for p in model.parameters()), device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        tdist.all_reduce(buf)
    end.record()
    torch.cuda.synchronize()
    tdist.destroy_process_group()
    wire = buf.numel() * (2 if grad_reduce == "bf16" else 4) / 2 ** 20
    return s, start.elapsed_time(end) / 20, None, wire


def worker(framework, name, steps, precision, grad_reduce):
    import minidl as dl
    from minidl import distributed
    world = distributed.init()
    fn = minidl_worker if framework == "minidl" else torch_worker
    s, ar, buckets, wire = fn(CASES[name], steps, world, dl.data.load("mnist", "train"), precision, grad_reduce)
    if world.main:
        print(json.dumps({"images_s": steps * CASES[name]["batch"] * world.size / s, "ms_step": 1e3 * s / steps,
                          "allreduce_ms": ar, "buckets": buckets, "wire_mib": wire}))


def _launch(cmd, env, timeout, head):
    """The result line of one launch of the workers, or None (printed: why it failed or that it hung)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{head} failed: still running after {timeout:.0f} s (killed)")
        return None
    if r.returncode:
        why = [ln for ln in r.stderr.splitlines() if "rror" in ln][-1:] or r.stderr.strip().splitlines()[-1:]
        print(f"{head} failed (exit {r.returncode}): {' '.join(why)[:200]}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/bench_dist.py", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--ranks", nargs="+", type=int, default=[1, 2], help="N to run (default: 1 2)")
    p.add_argument("--launcher", default=os.environ.get("MINIDL_MPIEXEC", "mpiexec"),
                   help="the MPI launcher command, without -n (default $MINIDL_MPIEXEC or mpiexec)")
    p.add_argument("--bucket-mib", type=float, help="minidl's gradient bucket size (default 8)")
    p.add_argument("--precision", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--grad-reduce", nargs="+", choices=("fp32", "bf16", "none"), default=["fp32"],
                   help="the dtype gradients travel in (default fp32); none: minidl's step without its "
                        "collectives, what N ranks cost before any byte is sent (a profile)")
    p.add_argument("--transport", nargs="+", choices=("nvlink", "net"), default=["nvlink"],
                   help="net: NCCL over sockets, the stand-in for two hosts (default nvlink)")
    p.add_argument("--frameworks", nargs="+", choices=("minidl", "torch-ddp"), default=["minidl", "torch-ddp"])
    p.add_argument("--timeout", type=float, default=900, help="seconds a launch may take (default 900)")
    p.add_argument("--json", help="also append one JSON line per result to this file")
    p.add_argument("--plot", help="draw images/s against N into this PNG (matplotlib)")
    p.add_argument("--from-json", help="no runs: the table (and --plot) of the results in this JSON-lines file")
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "CASE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(*args.worker, args.steps, args.precision[0], args.grad_reduce[0])
    if args.from_json:
        return _report(scaling.read(args.from_json), args.plot)
    from minidl import distributed
    if distributed.launched_by_mpi():
        sys.exit("bench_dist: run it without mpirun/mpiexec: it launches each case's ranks itself (--launcher)")
    from minidl.backend import cuda_status
    launcher = shlex.split(args.launcher)
    ok, why = cuda_status()
    if not ok or shutil.which(launcher[0]) is None:
        print(f"bench_dist: needs CUDA GPUs and an MPI launcher: {why if not ok else launcher[0] + ' is not on PATH'}",
              file=sys.stderr)
        return 2
    import cupy
    gpus = cupy.cuda.runtime.getDeviceCount()
    # the caller's PYTHONPATH too (where the cuDNN Frontend may live)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"))
    if args.bucket_mib is not None:
        env["MINIDL_BUCKET_MIB"] = str(args.bucket_mib)
    print(f"{'case':<15}{'prec':<6}{'wire':<6}{'link':<7}{'N':>3}  {'framework':<10}{'images/s':>12}{'ms/step':>10}"
          f"{'all-reduce ms':>15}{'wire MiB':>10}{'buckets':>9}")
    results = []
    for name in args.cases:
        for precision in args.precision:
            for transport in args.transport:
                link_env = dict(env, NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1") if transport == "net" else env
                for grad_reduce in args.grad_reduce:
                    for n in [n for n in args.ranks if n <= gpus]:
                        if n == 1 and (transport, grad_reduce) != (args.transport[0], args.grad_reduce[0]):
                            continue                  # one GPU sends nothing: measured once
                        for framework in args.frameworks:
                            cmd = launcher + ["-n", str(n), sys.executable, __file__, "--worker", framework, name,
                                              "--steps", str(args.steps), "--precision", precision,
                                              "--grad-reduce", grad_reduce]
                            head = f"{name:<15}{precision:<6}{grad_reduce:<6}{transport:<7}{n:>3}  {framework:<10}"
                            res = _launch(cmd, link_env, args.timeout, head)
                            if res is None:
                                continue
                            results.append(dict(res, case=name, precision=precision, ranks=n, framework=framework,
                                                grad_reduce=grad_reduce, transport=transport))
                            print(f"{head}{res['images_s']:>12,.0f}{res['ms_step']:>10.3f}{res['allreduce_ms']:>15.3f}"
                                  f"{res['wire_mib']:>10.1f}{res['buckets'] if res['buckets'] is not None else '-':>9}",
                                  flush=True)
                            if args.json:
                                with open(args.json, "a") as f:
                                    f.write(json.dumps(results[-1]) + "\n")
    return _report(results, args.plot)


def _report(results, plot_path):
    print(scaling.table(results))
    print(scaling.model_table(results))
    if plot_path and results:
        scaling.plot(results, plot_path)
        print(f"plot: {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
