"""Define a small convolutional net with the functional API and train it on MNIST for one epoch.

    python examples/custom_net.py [--device cpu|cuda|auto]
"""
import argparse
import logging

import minidl as dl
from minidl import layers as L


def build(device):
    x = L.Input((1, 28, 28))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(32, 3, padding=1, bias=False)(x)))
    h = L.MaxPool2D(2)(h)                                        # (N, 32, 14, 14)
    r = L.ReLU()(L.BatchNorm2D()(L.Conv2D(32, 3, padding="same", bias=False)(h)))
    h = L.Add()(h, r)                                            # a residual branch
    h = L.MaxPool2D(2)(h)                                        # (N, 32, 7, 7)
    h = L.Dropout(0.25)(L.Flatten()(h))
    y = L.Softmax()(L.Dense(10)(L.ReLU()(L.Dense(128)(h))))
    return dl.Model(x, y, device=device, name="custom")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="auto")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")   # minidl's log: the device chosen
    model = build(dl.get_device(args.device, verbose=True))
    model.summary()
    trainer = dl.Trainer(model, dl.optim.Adam(lr=1e-3))
    trainer.fit(dl.data.mnist("train"), epochs=1, batch_size=64, monitor=200)
    loss, acc = trainer.evaluate(dl.data.mnist("test"))
    print(f"test loss {loss:.4f}, accuracy {acc:.2%}")
    trainer.save("checkpoints/custom.npz")
