"""Task 5: data as it comes: a generator, a map-style dataset, an iterable of batches, NHWC images,
and an augmentation of your own. Each fit trains a fresh LeNet-5 for a few tens of steps.
"""
import numpy as np

import minidl as dl

(x, y), test = dl.data.mnist("train"), dl.data.mnist("test")
x, y = x[:3200], y[:3200]                                           # uint8 (3200, 28, 28), int labels


def fit(data, what, **kw):
    trainer = dl.Trainer(dl.models.lenet5(), dl.optim.Adam(3e-3), device="cpu", seed=0)
    trainer.fit(data, monitor=1000, **kw)
    score = trainer.evaluate((test[0][:1000], test[1][:1000]))
    print(f"{what:46s} {trainer.step:3d} steps, test accuracy {score.accuracy:.1%}")
    return trainer


def batches(n):
    """A generator of (x_batch, y_batch), as a Keras user writes one."""
    for i in range(n):
        yield x[32 * i:32 * (i + 1)], y[32 * i:32 * (i + 1)]


class Digits:
    """A map-style dataset, as a torch user has: len() and [i] -> (image, label)."""
    def __len__(self):
        return len(x)

    def __getitem__(self, i):
        return x[i].astype(np.float32) / 255, int(y[i])


seen = []


def invert_some(xb, yb):
    """An augmentation of your own: invert half the images (uint8 in, uint8 out)."""
    seen.append(len(xb))
    flip = np.random.default_rng(len(seen)).random(len(xb)) < 0.5
    xb = xb.copy()
    xb[flip] = 255 - xb[flip]
    return xb, yb


fit((x, y), "arrays (the fast path)", steps=50, batch_size=32)
fit(batches(50), "a generator of batches", steps=50)
fit(batches(30), "a generator ending before steps=50", steps=50)
fit(Digits(), "a map-style dataset", steps=50, batch_size=32)
fit([(x[i:i + 32], y[i:i + 32]) for i in range(0, 1600, 32)], "a list of 50 batches, 1 epoch", epochs=1)
fit((x[..., None], y), "NHWC (N, 28, 28, 1), found by its shape", steps=50, batch_size=32)
fit((x, y), "arrays with augment=invert_some", steps=50, batch_size=32, augment=invert_some)
print("augment was called on", len(seen), "batches of", set(seen))
try:
    fit((x.astype(np.float32), y), "floats in [0, 255]", steps=5)
except ValueError as e:
    print("floats in [0, 255] refused:", e)
