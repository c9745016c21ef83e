"""A run for the sharded optimizer's tests (tests/test_shard.py, tests/gpu/test_shard.py):
`python shard_worker.py OUT B STEPS [flags]`, alone (one process) or under `mpiexec -n N`.

A small net without BatchNorm (so N ranks at b compute what one process at N*b does): conv, max-pool,
dense "fc", dense "head", on random 12x12 images; its conv frozen, "fc" in a parameter group (half the
lr, its own weight decay) and the gradients clipped to a global norm, unless --plain. Rank 0 writes
OUT (.npz): the weights, the step, and every rank's optimizer state sizes (`state_sizes`, one row a rank).

--optimizer adam|momentum; --shard: Trainer(shard_optimizer=True); --float64; --bucket-mib M (small:
one bucket a layer); --save C: a checkpoint at the end; --resume C: start from C; --device cuda (one
GPU a rank, TF32 off); --eager: no CUDA graph; --precision bf16; --grad-reduce bf16; --watchdog S: a rank
still running after S seconds prints its stack and exits.
"""
import argparse
import faulthandler
import os
import sys

import numpy as np

import minidl as dl
from minidl import distributed, layers as L, optim, precision


def net(device):
    x = L.Input((1, 12, 12))
    h = L.MaxPool2D(2)(L.ReLU()(L.Conv2D(4, 3, padding=1, name="conv")(x)))
    h = L.ReLU()(L.Dense(32, name="fc")(L.Flatten()(h)))
    return dl.Model(x, L.Softmax()(L.Dense(10, name="head")(h)), device=device, seed=0)


def data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    x = np.clip(rng.normal(20 * y[:, None, None] + 30, 40, (n, 12, 12)), 0, 255).astype(np.uint8)
    return x, y


def main(*argv):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("b", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--shard", action="store_true")
    p.add_argument("--plain", action="store_true")
    p.add_argument("--float64", action="store_true")
    p.add_argument("--bucket-mib", type=float)
    p.add_argument("--save")
    p.add_argument("--resume")
    p.add_argument("--device", default="cpu")
    p.add_argument("--eager", action="store_true")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--grad-reduce", default="fp32")
    p.add_argument("--watchdog", type=float)
    args = p.parse_args(argv)
    if args.watchdog:                        # a hang ends with every rank's Python stack
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    if args.bucket_mib is not None:
        os.environ["MINIDL_BUCKET_MIB"] = str(args.bucket_mib)
    world = distributed.init()
    device = dl.get_device(args.device, dtype="float64" if args.float64 else "float32",
                           gpu=world.local_rank if world.size > 1 else None)
    device.set_tf32(False)
    model = net(device)
    controls = {} if args.plain else dict(clip_norm=0.5, groups=[{"params": ["fc"], "lr": 0.5 * 1e-2,
                                                                  "weight_decay": 1e-3}])
    opt = (optim.Adam(lr=1e-2, **controls) if args.optimizer == "adam"
           else optim.get("momentum", lr=1e-2, momentum=0.9, **controls))
    if not args.plain:
        model.layer("conv").trainable = False
    trainer = dl.Trainer(model, opt, world=world, graph=not args.eager, shard_optimizer=args.shard,
                         grad_reduce=args.grad_reduce, precision=precision.policy(args.precision, always=True))
    if args.resume:
        trainer.resume(args.resume)
    trainer.fit(data(), steps=args.steps, batch_size=args.b, monitor=5)
    if args.save:
        trainer.save(args.save)
    sizes = np.array([[a.size for _, a in sorted(opt.state.items())]], np.int64)
    if world.size > 1:
        sizes = world.comm.gather(sizes, root=0)
        sizes = np.concatenate(sizes) if world.main else None
    if world.main:
        np.savez(args.out, flat=device.to_host(model.flat), step=trainer.step, state_sizes=sizes,
                 arena=model.flat.size, ranks=world.size)


if __name__ == "__main__":
    distributed.init().guard(main)(*sys.argv[1:])
