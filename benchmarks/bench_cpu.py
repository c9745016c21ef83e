"""CPU training step: minidl's LeNet-5 against PyTorch's CPU build, in one process, same batches.

    python benchmarks/bench_cpu.py [--steps 300] [--threads 1] [--torch-threads 2] [--profile]

minidl trains through the Trainer as `python -m minidl.train --device cpu` does (models.get('lenet'),
Adam lr 1e-3, batch 32); PyTorch trains the same network (conv 6@5x5 pad 2, max-pool, conv 16@5x5,
max-pool, dense 120, 84, 10) with torch.optim.Adam on the minidl loader's batches. Each side gets
a warm-up, then the median of 5 repeats of `--steps` steps. PyTorch runs with minidl's thread
count and, where it differs, with its own default (one thread per core), so one run prints both
comparisons; --torch-threads N runs it with N only. The load average is printed before and
after: other processes on the cores slow both sides, PyTorch's threads the most.
--profile prints minidl's cProfile.
"""
import argparse
import cProfile
import os
import sys
import pstats
import statistics
import time

import numpy as np

import minidl as dl
from minidl import data, models, optim
from minidl.threads import current_threads, set_threads


def minidl_step_ms(train, steps, repeats):
    model = models.get("lenet", device="cpu", seed=0)
    trainer = dl.Trainer(model, optim.get("adam", lr=1e-3), seed=0, log=lambda *_: None, progress=False)
    trainer.fit(train, steps=20, batch_size=32, monitor=10 ** 9)              # warm-up
    runs = []
    for _ in range(repeats):
        trainer.fit(train, steps=steps, batch_size=32, monitor=10 ** 9)
        runs.append(trainer.timing["total_s"] / steps * 1e3)
    return statistics.median(runs), trainer


def torch_step_ms(loader, steps, repeats):
    import torch
    from torch import nn
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    per_epoch = len(loader)
    batches = [loader.batch(0, k % per_epoch) for k in range(steps)]
    batches = [(torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64)))
               for x, y in batches]

    def run(n):
        t0 = time.perf_counter()
        for k in range(n):
            x, y = batches[k % len(batches)]
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        return time.perf_counter() - t0

    run(20)
    return statistics.median(run(steps) / steps * 1e3 for _ in range(repeats))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300, help="steps per timed repeat (300)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats; the median is reported (5)")
    p.add_argument("--threads", type=int, help="BLAS/OpenMP threads (minidl's default when omitted)")
    p.add_argument("--torch-threads", type=int,
                   help="PyTorch's intra-op threads (default: minidl's, then PyTorch's own default)")
    p.add_argument("--profile", action="store_true", help="cProfile minidl's steps, top 25 by own time")
    p.add_argument("--no-torch", action="store_true", help="time minidl only")
    args = p.parse_args(argv)

    threads = set_threads(args.threads)
    print("load average (1, 5, 15 min): %.2f %.2f %.2f" % os.getloadavg())
    try:
        train = data.load("mnist", "train")
    except data.DataError as e:        # no MNIST here and no network: one line, as the command lines do
        sys.exit(f"bench_cpu: error: {e}")
    ms, trainer = minidl_step_ms(train, args.steps, args.repeats)
    print(f"threads {threads} ({current_threads()}), LeNet-5, batch 32, Adam, {args.steps} steps x "
          f"{args.repeats}, median")
    print(f"minidl  CPU: {ms:.3f} ms/step")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(trainer.fit, train, steps=args.steps, batch_size=32, monitor=10 ** 9)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if not args.no_torch:
        import torch
        own = torch.get_num_threads()            # PyTorch's default: one thread per core
        counts = [args.torch_threads] if args.torch_threads else list(dict.fromkeys([threads, own]))
        loader = trainer._train_loader(train, 32)
        for n in counts:
            torch.set_num_threads(n)
            tms = torch_step_ms(loader, args.steps, args.repeats)
            what = "minidl's" if n == threads else "its default" if n == own else "--torch-threads"
            print(f"PyTorch CPU: {tms:.3f} ms/step (torch {torch.__version__}, {n} threads: {what})")
            print(f"  minidl / PyTorch at {n} threads: {ms / tms:.2f}x the time ({'faster' if ms < tms else 'slower'})")
    print("load average (1, 5, 15 min): %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
