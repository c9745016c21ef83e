"""python benchmarks/bench_layout.py: ResNet-50 training steps NCHW against channels-last, fp32 and bf16,
at b256 and b32 (momentum SGD on MNIST, the whole step captured; 10 warm-up steps, then the steps
timed end to end). The figures the channels-last default (Device.channels_last) was chosen from.
"""
import sys
import time

import minidl as dl
from minidl import models, optim

CASES = ((50, 256, 40), (50, 32, 200))          # depth, batch, timed steps


def ms_per_step(train, depth, batch, precision, channels_last, steps):
    dev = dl.get_device("cuda", seed=0)
    model = models.get("resnet", depth=depth, device=dev, seed=0)
    trainer = dl.Trainer(model, optim.get("momentum", lr=0.01, momentum=0.9), progress=False, log=lambda s: None,
                         precision=precision, channels_last=channels_last)
    trainer.fit(train, steps=10, batch_size=batch, monitor=10)
    dev.sync()
    t0 = time.perf_counter()
    trainer.fit(train, more_steps=steps, batch_size=batch, monitor=steps)
    dev.sync()
    return (time.perf_counter() - t0) / steps * 1e3


def main():
    ok, why = dl.backend.cuda_status()
    if not ok:
        print(f"bench_layout: needs a GPU: {why}", file=sys.stderr)
        return 2
    train = dl.data.load("mnist", "train")
    print(f"{'case':<16}{'precision':<10}{'NCHW ms':>10}{'NHWC ms':>10}{'NCHW/NHWC':>11}")
    for depth, batch, steps in CASES:
        for precision in ("fp32", "bf16"):
            a, b = (ms_per_step(train, depth, batch, precision, cl, steps) for cl in (False, True))
            print(f"{f'resnet{depth}-b{batch}':<16}{precision:<10}{a:>10.3f}{b:>10.3f}{a / b:>10.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
