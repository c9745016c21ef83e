"""GPU time of each batch-norm layer of ResNet-50's lowered channels-last training step: minidl's
channels-last RawKernels (kernels/gpu/norm.py's choice) against cuDNN's NHWC kernels for every layer
with more values a channel than one block takes. Each layer's forward and backward captured alone.

    python benchmarks/bench_norm.py [--batch 32 256] [--precision bf16]
"""
import argparse
import collections
import sys

import numpy as np

import minidl as dl
from minidl import models, optim
from profile_train import gpu_ms


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16")
    args = p.parse_args()
    ok, why = dl.backend.cuda_status()
    if not ok:
        print(f"bench_norm: needs a GPU: {why}", file=sys.stderr)
        return 2
    from minidl.kernels.gpu import norm
    default = norm._NHWC_SPLIT_MAX_M
    configs = (("minidl", default), ("cudnn", norm._NHWC_ONE_BLOCK_M))
    for batch in args.batch:
        dev = dl.get_device("cuda")
        trainer = dl.Trainer(models.resnet(50, device=dev), optim.Momentum(0.01), progress=False, log=lambda s: None,
                             precision=args.precision, channels_last=True)
        rng = np.random.default_rng(0)
        trainer._step.net.releases = False        # keep every value, to time each layer on it
        trainer.train_step(dev.asarray(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)),
                           dev.asarray(rng.integers(0, 10, batch).astype(np.int32)))
        net = trainer._step.net
        values, total, seen = dict(net._values), collections.defaultdict(float), {}
        for node in net.nodes:
            if node.layer.kind != "batchnorm":
                continue
            layer, xs = node.layer, [values[id(p)] for p in node.parents]
            key = xs[0].shape
            if key not in seen:
                gy, seen[key] = dev.xp.ones_like(values[id(node)]), []
                for name, top in configs:
                    norm._NHWC_SPLIT_MAX_M = top
                    f = gpu_ms(dev, lambda: layer.forward(xs, True), 20)
                    layer.forward(xs, True)
                    seen[key].append((f, gpu_ms(dev, lambda: layer.backward(gy), 20)))
                norm._NHWC_SPLIT_MAX_M = default
                M = xs[0].size // xs[0].shape[1]
                print(f"b{batch} M={M:6d} C={xs[0].shape[1]:5d}  " + "  ".join(
                    f"{n} {f * 1e3:5.1f}/{b * 1e3:5.1f} us" for (n, _), (f, b) in zip(configs, seen[key])))
            for (name, _), (f, b) in zip(configs, seen[key]):
                total[name] += f + b
        print(f"b{batch} {args.precision}, all BN layers, forward + backward: " +
              ", ".join(f"{k} {v:.3f} ms" for k, v in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
