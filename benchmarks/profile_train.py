"""GPU time per layer of one training step, each layer's forward and backward captured in its
own CUDA graph (so launch overhead is excluded), summed by layer type.

    python benchmarks/profile_train.py [--depth 50] [--batch 32] [--repeats 20]
"""
import argparse
import collections
import sys

import numpy as np

import minidl as dl
from minidl import models, optim


def gpu_ms(device, fn, repeats):
    """GPU milliseconds per call of fn: `repeats` calls captured as one CUDA graph, timed by events."""
    call = device.capture(lambda: [fn() for _ in range(repeats)], warmup=1)
    call.replay()
    return device.elapsed_ms(call.replay) / repeats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depth", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    ok, why = dl.backend.cuda_status()
    if not ok:
        print(f"profile_train: needs a GPU: {why}", file=sys.stderr)
        return 2
    dev = dl.get_device("cuda")
    model = models.resnet(args.depth, device=dev) if args.depth else models.lenet5(device=dev)
    trainer = dl.Trainer(model, optim.Momentum(0.01), progress=False, log=lambda s: None)
    rng = np.random.default_rng(0)
    x = dev.asarray(rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32))
    y = dev.asarray(rng.integers(0, 10, args.batch).astype(np.int32))
    trainer.train_step(x, y)                           # plans, buffers
    values = dict(model._values)
    by_type, total = collections.defaultdict(float), 0.0
    for node in model.nodes:
        layer = node.layer
        xs = [values[id(p)] for p in node.parents]
        fwd = gpu_ms(dev, lambda: layer.forward(xs, True), args.repeats)
        gy = dev.xp.ones_like(values[id(node)])
        layer.forward(xs, True)
        bwd = gpu_ms(dev, lambda: layer.backward(gy), args.repeats)
        by_type[type(layer).__name__ + " fwd"] += fwd
        by_type[type(layer).__name__ + " bwd"] += bwd
        total += fwd + bwd
    opt_ms = gpu_ms(dev, trainer.optimizer.step, args.repeats)
    zero_ms = gpu_ms(dev, model.zero_grad, args.repeats)
    print(f"per-layer GPU time, {model.name} batch {args.batch} (ms per step):")
    for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]):
        print(f"  {k:22s} {v:7.3f}")
    print(f"  {'optimizer step':22s} {opt_ms:7.3f}\n  {'zero_grad':22s} {zero_ms:7.3f}")
    print(f"  {'sum':22s} {total + opt_ms + zero_ms:7.3f}")


if __name__ == "__main__":
    sys.exit(main())
