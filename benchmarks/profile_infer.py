"""Where compiled inference spends its time at one batch size, summed by kind of kernel call.

    python benchmarks/profile_infer.py --batch 1 --precision bf16      (ResNet-50, random weights)

Prints the whole call's GPU time (its CUDA graph replayed back to back) and latency (launched and
waited for, median of --runs), then every kernel call timed alone (captured repeats: kernel time,
no launch gaps) summed by kind, and the slowest calls.
"""
import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="resnet", help="zoo model (resnet)")
    p.add_argument("--depth", type=int, default=50, help="ResNet depth (50)")
    p.add_argument("--batch", type=int, default=1, help="batch size (1)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32", help="precision (fp32)")
    p.add_argument("--runs", type=int, default=1000, help="latency runs (1000)")
    p.add_argument("--top", type=int, default=12, help="slowest calls listed (12)")
    args = p.parse_args(argv)

    import minidl as dl
    from minidl import inference, models
    dev = dl.get_device("cuda")
    model = models.get(args.model, depth=args.depth if args.model == "resnet" else None, device=dev)
    compiled = inference.compile(model, device=dev, precision=args.precision, probabilities=False)
    x = dev.xp.asarray(np.random.default_rng(0).random((args.batch,) + model.inputs[0].shape[1:], np.float32))
    compiled.predict(x)
    dev.sync()
    gpu_ms = dev.elapsed_ms(lambda: compiled.predict(x), 200)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        compiled.predict(x)
        dev.sync()
        times.append(time.perf_counter() - t0)
    rows = compiled.profile(x, repeats=50)
    print(f"{args.model}{args.depth or ''} batch {args.batch} {args.precision}: {len(rows)} kernel calls; "
          f"whole call {1e3 * gpu_ms:.1f} us of GPU time back to back, latency median "
          f"{1e6 * np.median(times):.1f} us; calls timed alone sum to {1e3 * sum(r.ms for r in rows):.1f} us")
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        by_kind[r.kind][0] += 1
        by_kind[r.kind][1] += r.ms
    for kind, (n, ms) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<12} {n:>4} calls {1e3 * ms:>9.1f} us")
    print("slowest calls:")
    for r in sorted(rows, key=lambda r: -r.ms)[:args.top]:
        print(f"  {r.name:<28} {r.kind:<12} {str(r.shape):<20} {1e3 * r.ms:>7.1f} us")


if __name__ == "__main__":
    main()
