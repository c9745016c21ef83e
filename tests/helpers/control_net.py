"""The small net and data the training controls' GPU tests train (tests/gpu/test_training_controls.py,
tests/gpu/test_optim_xp.py): a conv + BN + ReLU + max-pool, two dense layers named "fc" and "head"
(groups and freezing name them), on random 12x12 uint8 images."""
import numpy as np

import minidl as dl
from minidl import layers as L


def net(device, seed=0):
    x = L.Input((1, 12, 12))
    h = L.ReLU()(L.BatchNorm2D()(L.Conv2D(8, 3, padding=1, bias=False)(x)))
    h = L.MaxPool2D(2)(h)
    h = L.ReLU()(L.Dense(32, name="fc")(L.Flatten()(h)))
    return dl.Model(x, L.Softmax()(L.Dense(10, name="head")(h)), device=device, seed=seed)


def data(n=256, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 12, 12), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)
