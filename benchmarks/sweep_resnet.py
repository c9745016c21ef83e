"""Test accuracy of ResNet-50 after 500 steps of batch 32 for a few recipes (one process: the
cuDNN plans are built once).   python benchmarks/sweep_resnet.py"""
import sys

import minidl as dl
from minidl import models, optim

RECIPES = {
    "adam 1e-3": lambda n: optim.Adam(1e-3),
    "adam 1e-3 cosine": lambda n: optim.Adam(1e-3, schedule=optim.schedules.cosine(n)),
    "momentum 0.01": lambda n: optim.Momentum(0.01),
    "momentum 0.05 cosine": lambda n: optim.Momentum(0.05, schedule=optim.schedules.cosine(n)),
    "momentum 0.1 cosine": lambda n: optim.Momentum(0.1, schedule=optim.schedules.cosine(n)),
    "adam 2e-3 cosine": lambda n: optim.Adam(2e-3, schedule=optim.schedules.cosine(n)),
}
depth, steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50, 500
train, test = dl.data.mnist("train"), dl.data.mnist("test")
dev = dl.get_device("cuda")
for name, make in RECIPES.items():
    model = models.get("resnet", depth=depth, device=dev) if depth else models.lenet5(device=dev)
    tr = dl.Trainer(model, make(steps), progress=False, log=lambda s: None)
    loss, acc = tr.fit(train, steps=steps if depth else 1875, batch_size=32, monitor=100)
    print(f"{name:22s} last-100 train acc {acc:6.2f}%  test {tr.evaluate(test)[1]:6.2f}%", flush=True)
