"""CPU training step: minidl's LeNet-5 against PyTorch's CPU build, in one process, same batches.

    python benchmarks/bench_cpu.py [--steps 300] [--threads 1] [--torch-threads 2] [--profile]

minidl trains through the Trainer as `python -m minidl.train --device cpu` does (models.get('lenet'),
Adam lr 1e-3, batch 32); PyTorch trains the same network (conv 6@5x5 pad 2, max-pool, conv 16@5x5,
max-pool, dense 120, 84, 10) with torch.optim.Adam on the minidl loader's batches. Each side gets
a warm-up, then the median of 5 repeats of `--steps` steps; the repeats alternate between the
two, so a change in the machine's load hits both alike. PyTorch runs with minidl's thread count
and, where it differs, with its own default (one thread per core), so one run prints both
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


def minidl_runner(train):
    """(trainer, run): run(n) trains n steps through the Trainer and returns ms per step."""
    model = models.get("lenet", device="cpu", seed=0)
    trainer = dl.Trainer(model, optim.get("adam", lr=1e-3), seed=0, log=lambda *_: None, progress=False)

    def run(n):
        trainer.fit(train, more_steps=n, batch_size=32, monitor=10 ** 9)
        return trainer.timing["total_s"] / n * 1e3

    run(20)                                                                   # warm-up
    return trainer, run


def torch_runner(loader, steps):
    """run(n, threads): n PyTorch steps on the minidl loader's batches; returns ms per step."""
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

    def run(n, threads):
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        for k in range(n):
            x, y = batches[k % len(batches)]
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
        return (time.perf_counter() - t0) / n * 1e3

    return run


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
    pools = current_threads()                    # minidl's pools, before PyTorch brings its own
    print("load average (1, 5, 15 min): %.2f %.2f %.2f" % os.getloadavg())
    try:
        train = data.load("mnist", "train")
    except data.DataError as e:        # no MNIST here and no network: one line, as the command lines do
        sys.exit(f"bench_cpu: error: {e}")
    trainer, minidl_run = minidl_runner(train)
    counts, torch_run = [], None
    if not args.no_torch:
        import torch
        own = torch.get_num_threads()            # PyTorch's default: one thread per core
        counts = [args.torch_threads] if args.torch_threads else list(dict.fromkeys([threads, own]))
        torch_run = torch_runner(trainer._train_loader(train, 32), args.steps)
        for n in counts:
            torch_run(20, n)                                                  # warm-up
    ms, tms = [], {n: [] for n in counts}
    for _ in range(args.repeats):
        ms.append(minidl_run(args.steps))
        for n in counts:
            tms[n].append(torch_run(args.steps, n))
        time.sleep(0.2)                          # PyTorch's OpenMP threads stop spinning first
    ms = statistics.median(ms)
    print(f"threads {threads} ({pools}), LeNet-5, batch 32, Adam, {args.steps} steps x "
          f"{args.repeats} (alternating), median")
    print(f"minidl  CPU: {ms:.3f} ms/step")
    for n in counts:
        t = statistics.median(tms[n])
        what = "minidl's" if n == threads else "its default" if n == own else "--torch-threads"
        print(f"PyTorch CPU: {t:.3f} ms/step (torch {torch.__version__}, {n} threads: {what})")
        print(f"  minidl / PyTorch at {n} threads: {ms / t:.2f}x the time ({'faster' if ms < t else 'slower'})")
    print("load average (1, 5, 15 min): %.2f %.2f %.2f" % os.getloadavg())
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(trainer.fit, train, steps=args.steps, batch_size=32, monitor=10 ** 9)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)

if __name__ == "__main__":
    main()
