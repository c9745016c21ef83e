"""A data-parallel training run for tests/test_distributed.py: `python dist_worker.py MODE OUT ...`,
alone (one process) or under `mpiexec -n N` (N ranks). Rank 0 writes OUT (.npz); with --all-ranks
every rank writes OUT.<rank>.npz.

    lenet OUT B STEPS      LeNet-5, Adam, B images per rank, on a seeded random set
                           (--momentum: momentum SGD instead; --float64: in float64)
    bn OUT B STEPS         a small conv net with BatchNorm; evaluate and save to OUT.ckpt.npz
    fail OUT               rank 1 raises after a few steps while the others train on
"""
import sys

import numpy as np

import minidl as dl
from minidl import distributed, layers as L, models, optim


def data(n=1024, seed=1):
    """Images with a learnable class: the label sets the mean brightness of the image."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 10, n)
    x = np.clip(rng.normal(20 * y[:, None, None] + 30, 40, (n, 28, 28)), 0, 255).astype(np.uint8)
    return x, y


def bn_net():
    x = L.Input((1, 28, 28))
    h = L.MaxPool2D(2)(L.ReLU()(L.BatchNorm2D()(L.Conv2D(4, 3, padding=1, bias=False)(x))))
    y = L.Softmax()(L.Dense(10)(L.Flatten()(h)))
    return dl.Model(x, y, device=dl.get_device("cpu"), seed=0)


def main(mode, out, *rest):
    world = distributed.init()
    train = data()
    if mode == "fail":
        trainer = dl.Trainer(models.get("lenet", device=dl.get_device("cpu"), seed=0), optim.Adam(lr=1e-3))
        trainer.fit(train, steps=3, batch_size=8)
        if world.rank == 1:
            raise ValueError("injected failure")
        trainer.fit(train, steps=100_000, batch_size=8)      # waits on rank 1 in the all-reduce
        return
    b, steps = int(rest[0]), int(rest[1])
    device = dl.get_device("cpu", dtype="float64" if "--float64" in rest else "float32")
    model = models.get("lenet", device=device, seed=0) if mode == "lenet" else bn_net()
    opt = optim.Adam(lr=1e-3) if "--momentum" not in rest else optim.get("momentum", lr=0.01, momentum=0.9)
    trainer = dl.Trainer(model, opt, seed=0)
    result = trainer.fit(train, steps=steps, batch_size=b, monitor=25)
    score = trainer.evaluate(data(300, seed=2), batch_size=64)
    if mode == "bn":
        trainer.save(out + ".ckpt.npz")
    arrays = dict(flat=model.flat, state=model.state_flat, fit=result, score=score, size=world.size)
    if "--all-ranks" in rest:
        np.savez(f"{out}.{world.rank}.npz", **arrays)
    elif world.main:
        np.savez(out, **arrays)


if __name__ == "__main__":
    distributed.init().guard(main)(*sys.argv[1:])
