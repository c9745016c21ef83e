"""python benchmarks/placement.py [--trainers N] [--reset WHAT] [--junk-mib N] [--precision bf16]: one
process's captured ResNet-50 b256 step, what it runs and where its memory lies.

Why: on an H200 the same bf16 step took 3.000 ms in a process that chose its cuDNN engines by timing
them and 2.837 ms in the next process, which loaded them (docs/results.md, 2026-11-27 evening); a
Trainer made after others were released was as slow. For each Trainer this prints the captured step's
GPU time (the graph replayed alone) beside what could differ between a fast and a slow process:
the digest of the cuDNN graphs' keys, of the engines they execute and of the kernel choices
`engines.fastest` made, the cuDNN workspace, and each arena's address. --junk-mib allocates and frees
that much first (CuPy's pool and cudaMalloc); --trainers builds Trainers one after another, and
--reset says what is thrown away between them (`graphs`: the built cuDNN graphs and the workspace).
"""
import argparse
import gc
import hashlib
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

PAGE = 2 << 20


def where(name, array_or_memory):
    ptr, size = ((array_or_memory.data.ptr, array_or_memory.nbytes) if hasattr(array_or_memory, "data")
                 else (array_or_memory.ptr, array_or_memory.size))
    return {"name": name, "ptr": hex(ptr), "offset_in_2mib": ptr % PAGE, "mib": round(size / 2 ** 20, 1)}


def digest(items):
    return hashlib.sha1(repr(sorted(items)).encode()).hexdigest()[:10]


def what_runs():
    """Digests of the cuDNN graphs built, the engines they execute (where a plan index was kept;
    a plan loaded whole runs its one plan) and the kernel choices engines.fastest made."""
    from minidl.kernels.gpu import cudnn_graphs, engines
    graphs = {repr(k): g for k, g in cudnn_graphs._graphs.items() if g is not None}
    named = [(k, g.g.get_plan_name_at_index(g.index)) for k, g in graphs.items() if g.index is not None]
    held = [w.nbytes for ws in cudnn_graphs._workspaces.values() for w, _ in ws]
    return {"graphs": len(graphs), "graph_keys": digest(graphs), "plans_named": len(named), "engines": digest(named),
            "kernel_choices": digest((repr(k), v) for k, v in engines._chosen.items()),
            "engines_timed": engines.stats["timed"], "workspace_mib": [round(b / 2 ** 20, 1) for b in held]}


def kernel_table(path, replay, dev, repeats=20):
    """Each kernel's name, launches and mean microseconds over `repeats` replays, as CUPTI sees them
    (through PyTorch's profiler, which records every kernel of the process), into a CSV file."""
    import collections
    import csv
    from torch.profiler import ProfilerActivity, profile
    dev.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            replay()
        dev.sync()
    total, count = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            total[e.name] += e.time_range.elapsed_us()
            count[e.name] += 1
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "launches_per_step", "us_per_step"])
        for name, us in total.most_common():
            w.writerow([name, count[name] / repeats, round(us / repeats, 3)])


def one_trainer(dl, dev, train, precision, steps, kernels=None):
    from minidl import models, optim
    model = models.get("resnet", depth=50, device=dev, seed=0)
    trainer = dl.Trainer(model, optim.get("momentum", lr=0.05, momentum=0.9), progress=False, log=lambda s: None,
                         precision=precision)
    trainer.fit(train, more_steps=5, batch_size=256, monitor=10 ** 9)
    trainer.fit(train, more_steps=steps, batch_size=256, monitor=10 ** 9)
    _, call = next(iter(trainer._step._captured.values()))
    graph_ms = [round(dev.elapsed_ms(call.replay, 100), 4) for _ in range(3)]   # the step's GPU time alone
    if kernels:
        kernel_table(kernels, call.replay, dev)
    arenas = [where("model.flat", model.flat), where("model.grads", model.grads),
              where("graph arena", call.memory.arena)]
    result = {"ms_step": round(trainer.timing["steady_ms"], 4), "graph_ms": graph_ms, **what_runs(), "arenas": arenas}
    return result, (trainer, call)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/placement.py", description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--junk-mib", type=int, default=0, help="allocate and free this much first (pool and cudaMalloc)")
    p.add_argument("--kernels", help="write each kernel's time per step here (CSV; PyTorch's profiler)")
    p.add_argument("--then-fp32", action="store_true",
                   help="then build a float32 Trainer (its engines chosen, by timing on a cache without them), "
                        "drop it and replay the first Trainer's step again")
    p.add_argument("--trainers", type=int, default=1, help="Trainers built one after another (default 1)")
    p.add_argument("--reset", choices=("none", "graphs"), default="none",
                   help="what goes between Trainers: graphs = the built cuDNN graphs and their workspace")
    args = p.parse_args(argv)
    import cupy as cp
    import minidl as dl
    from minidl.kernels.gpu import cudnn_graphs
    dev = dl.get_device("cuda")
    if args.junk_mib:
        pooled = cp.empty(args.junk_mib << 20, cp.uint8)
        direct = cp.cuda.memory.Memory(args.junk_mib << 20)
        del pooled, direct
    train = dl.data.load("mnist", "train")
    for t in range(args.trainers):
        if t and args.reset == "graphs":
            cudnn_graphs._graphs.clear()
            cudnn_graphs._workspaces.clear()
        gc.collect()
        dev.free_memory()
        result, (trainer, call) = one_trainer(dl, dev, train, args.precision, args.steps,
                                              args.kernels and f"{args.kernels}.{t}.csv")
        print(json.dumps({"trainer": t, "precision": args.precision, "junk_mib": args.junk_mib, "reset": args.reset,
                          **result}), flush=True)
        if args.then_fp32:
            other, _ = one_trainer(dl, dev, train, "fp32", 2)
            again = [round(dev.elapsed_ms(call.replay, 100), 4) for _ in range(3)]
            print(json.dumps({"trainer": t, "after_fp32_trainer": {"graph_ms": again, "fp32": other}}), flush=True)
        del trainer, call
    return 0


if __name__ == "__main__":
    sys.exit(main())
