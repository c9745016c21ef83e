"""Device diagnostic (not collected): GPU vs CPU, per layer output and gradient, for the branchy test net."""
import sys

import numpy as np

sys.path.insert(0, "tests/gpu")
import minidl as dl  # noqa: E402
from minidl import optim  # noqa: E402
from minidl.kernels.gpu import cudnn  # noqa: E402
from test_training import branchy_net, data  # noqa: E402

cudnn.set_tf32(False)
images, labels = data(32)
res = {}
for name in ("cpu", "cuda"):
    dev = dl.get_device(name)
    model = branchy_net(dev)
    x, y = dl.data.Loader(images, labels, 32, dev, shuffle=False).batch(0, 0)
    tr = dl.Trainer(model, optim.SGD(0.0), graph=False, progress=False, log=lambda s: None)
    model.fuse(True)
    tr._forward_backward(x, y)
    res[name] = ({n.layer.name: dev.to_host(model._values[id(n)]) for n in model.nodes}, model.get_grads())
for i, what in enumerate(("output", "grad")):
    for k, a in res["cpu"][i].items():
        b = res["cuda"][i][k]
        print(f"{what:6s} {k:12s} rel.err {np.abs(a - b).max() / (np.abs(a).max() + 1e-12):.2e}")
