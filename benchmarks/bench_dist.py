"""python benchmarks/bench_dist.py: data-parallel training speed on 1 and 2 GPUs, minidl and PyTorch DDP.

Each case runs under `mpiexec -n N` (N = 1, 2) as this file's --worker, fp32, eager PyTorch DDP
beside it on the same batches (the minidl Loader's rank slices). Printed per case and N: images/s
(N x b per step), and the all-reduce of the whole gradient alone, ms per step (minidl: its Reducer
on the flat buffer; PyTorch: torch.distributed.all_reduce of a buffer as large). -b is per rank.
UNVERIFIED: written without a GPU. Without a usable GPU it says so in one line and exits 2.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
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


def minidl_worker(case, steps, world, train):
    import minidl as dl
    from minidl import models, optim
    dev = dl.get_device("cuda", gpu=world.local_rank if world.size > 1 else None)
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=0)
    opt = optim.get(case["optimizer"], lr=case["lr"], **({"momentum": 0.9} if case["optimizer"] == "momentum" else {}))
    trainer = dl.Trainer(model, opt, progress=False, log=lambda s: None, world=world)
    s = _timed(lambda n: trainer.fit(train, steps=n, batch_size=case["batch"], monitor=10 ** 9), dev.sync,
               world.comm.Barrier if world.comm else lambda: None, steps)
    ar = dev.elapsed_ms(lambda: trainer.reducer.average_grads(model.grads), 20) if trainer.reducer else 0.0
    return s, ar


def torch_worker(case, steps, world, train):
    import torch
    import torch.distributed as tdist
    import torch.nn.functional as F
    import minidl as dl
    from benchmarks.torch_models import torch_model
    torch.cuda.set_device(world.local_rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK=str(world.rank), WORLD_SIZE=str(world.size))
    tdist.init_process_group("nccl")
    model = torch.nn.parallel.DistributedDataParallel(torch_model(case).cuda(), device_ids=[world.local_rank])
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
            F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
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
    return s, start.elapsed_time(end) / 20


def worker(framework, name, steps):
    import minidl as dl
    from minidl import distributed
    world = distributed.init()
    fn = minidl_worker if framework == "minidl" else torch_worker
    s, ar = fn(CASES[name], steps, world, dl.data.load("mnist", "train"))
    if world.main:
        print(json.dumps({"images_s": steps * CASES[name]["batch"] * world.size / s, "allreduce_ms": ar}))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/bench_dist.py", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--worker", nargs=2, metavar=("FRAMEWORK", "CASE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(*args.worker, args.steps)
    from minidl.backend import cuda_status
    ok, why = cuda_status()
    if not ok or shutil.which("mpiexec") is None:
        print(f"bench_dist: needs CUDA GPUs and mpiexec: {why if not ok else 'mpiexec is not on PATH'}",
              file=sys.stderr)
        return 2
    import cupy
    gpus = cupy.cuda.runtime.getDeviceCount()
    print(f"{'case':<15}{'N':>3}  {'framework':<10}{'images/s':>12}{'all-reduce ms':>15}")
    for name in CASES:
        for n in (1, 2)[:gpus]:
            for framework in ("minidl", "torch-ddp"):
                cmd = ["mpiexec", "-n", str(n), sys.executable, __file__, "--worker", framework, name,
                       "--steps", str(args.steps)]
                r = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
                if r.returncode:
                    print(f"{name:<15}{n:>3}  {framework:<10} failed: {r.stderr.strip().splitlines()[-1:]}")
                    continue
                res = json.loads(r.stdout.strip().splitlines()[-1])
                print(f"{name:<15}{n:>3}  {framework:<10}{res['images_s']:>12,.0f}{res['allreduce_ms']:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
