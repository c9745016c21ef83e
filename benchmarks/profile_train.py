"""GPU time per layer of one training step, each layer's forward and backward captured in its
own CUDA graph (so launch overhead is excluded), summed by layer type: the layers of the lowered
training graph (casts and fused activations included), the compute-dtype copies of the weights
(refresh before forward, gather after backward) and the optimizer's update.

    python benchmarks/profile_train.py [--depth 50] [--batch 32] [--repeats 20] [--precision bf16]
                                       [--channels-last | --no-channels-last]
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
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    args = p.parse_args()
    ok, why = dl.backend.cuda_status()
    if not ok:
        print(f"profile_train: needs a GPU: {why}", file=sys.stderr)
        return 2
    dev = dl.get_device("cuda")
    model = models.resnet(args.depth, device=dev) if args.depth else models.lenet5(device=dev)
    trainer = dl.Trainer(model, optim.Momentum(0.01), progress=False, log=lambda s: None, precision=args.precision,
                         channels_last=args.channels_last)
    rng = np.random.default_rng(0)
    x = dev.asarray(rng.standard_normal((args.batch, 1, 28, 28)).astype(np.float32))
    y = dev.asarray(rng.integers(0, 10, args.batch).astype(np.int32))
    trainer._step.net.releases = False                # keep every value, to time each layer on it
    trainer.train_step(x, y)                           # plans, buffers
    net = trainer._step.net                            # the lowered graph the step runs
    values = dict(net._values)
    by_type, total = collections.defaultdict(float), 0.0
    for c in net.copies:
        by_type["weight copies refresh"] += gpu_ms(dev, lambda: c.refresh(net.flat), args.repeats)
        by_type["weight copies gather"] += gpu_ms(dev, lambda: c.gather(net.grads), args.repeats)
    total += sum(by_type.values())
    for node in net.nodes:
        layer = node.layer
        xs = [values[id(p)] for p in node.parents]
        fwd = gpu_ms(dev, lambda: layer.forward(xs, True), args.repeats)
        gy = dev.xp.ones_like(values[id(node)])            # in the value's memory order
        layer.forward(xs, True)
        bwd = gpu_ms(dev, lambda: layer.backward(gy), args.repeats)
        by_type[type(layer).__name__ + " fwd"] += fwd
        by_type[type(layer).__name__ + " bwd"] += bwd
        total += fwd + bwd
    opt_ms = gpu_ms(dev, trainer.optimizer.step, args.repeats)
    zero_ms = gpu_ms(dev, net.zero_grad, args.repeats)
    print(f"per-layer GPU time, {model.name} batch {args.batch} {args.precision}"
          f"{' channels-last' if trainer.channels_last else ''} (ms per step):")
    for k, v in sorted(by_type.items(), key=lambda kv: -kv[1]):
        print(f"  {k:22s} {v:7.3f}")
    print(f"  {'optimizer step':22s} {opt_ms:7.3f}\n  {'zero_grad':22s} {zero_ms:7.3f}")
    print(f"  {'sum':22s} {total + opt_ms + zero_ms:7.3f}")


if __name__ == "__main__":
    sys.exit(main())
