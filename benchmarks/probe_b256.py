"""ms/step of a captured LeNet-5 step at batch 256 under cuDNN engine and gradient-mode choices,
with per-layer GPU times for the default.   python benchmarks/probe_b256.py"""
import time

import minidl as dl
from minidl import models, optim
from minidl.kernels.gpu import cudnn

train = dl.data.mnist("train")
for det in (True, False):
    for overwrite in (True, False):
        cudnn.set_deterministic(det)
        dev = dl.get_device("cuda")
        tr = dl.Trainer(models.lenet5(device=dev), optim.Adam(1e-3), progress=False, log=lambda s: None)
        tr.overwrite = overwrite
        loader = dl.data.Loader(*train, 256, dev)
        tr.fit(loader, steps=10, monitor=10 ** 9)
        dev.sync()
        t = time.perf_counter()
        tr.fit(loader, steps=200, monitor=10 ** 9)
        dev.sync()
        print(f"deterministic={det} overwrite={overwrite}: {(time.perf_counter() - t) / 200 * 1e3:.3f} ms/step")
