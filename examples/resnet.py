"""Train a ResNet from the zoo on MNIST or Fashion-MNIST, save it, reload it and evaluate.

    python examples/resnet.py --depth 18 --steps 200 [--dataset fashion-mnist] [--device cuda]
"""
import argparse
import logging

import minidl as dl
from minidl import models

if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--depth", type=int, default=18)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")   # minidl's log: the device chosen

    device = dl.get_device(args.device, verbose=True)
    model = models.resnet(args.depth, device=device)
    opt = dl.optim.Momentum(lr=0.01, momentum=0.9, schedule=dl.optim.schedules.cosine(args.steps))
    trainer = dl.Trainer(model, opt)
    trainer.fit(dl.data.load(args.dataset, "train"), steps=args.steps, batch_size=32, monitor=50)
    path = trainer.save(f"checkpoints/resnet{args.depth}-{args.dataset}.npz")

    restored = dl.checkpoint.load_model(path, device=device)     # architecture + weights, no pickle
    test = dl.data.load(args.dataset, "test")
    print("trained :", dl.Trainer(model, dl.optim.SGD(0.0)).evaluate(test))
    print("restored:", dl.Trainer(restored, dl.optim.SGD(0.0)).evaluate(test))
