"""The fused update kernels' signatures (kernels/contract.py, Optim) over the optimizers' own rules: what
the GPU's fused kernels are compared with. Each update builds the optimizer whose `fused` it is and runs its
`rule` through optim/reference.py, the one formula the CPU trains with, on NumPy arrays in place: the
gradient's scale, coupled decay, the controls (Controls) and the gate `ok` are reference.py's."""
import numpy as np

from minidl import optim
from minidl.optim import reference


def _step(opt, p, g, state, lr, t, wd, ok, scale, ctl):
    """One in-place step of opt.rule over p and the `state` arrays: reference.apply takes the fused kernels'
    arguments as they come."""
    reference.apply(opt.rule, np, p, g, state, np.float64(lr), wd, np.float64(t), ok, scale, ctl)


def sgd_update(p, g, lr, wd=0.0, ok=True, scale=1.0, ctl=None):
    _step(optim.SGD(1.0), p, g, {}, lr, 1, wd, ok, scale, ctl)


def momentum_update(p, g, v, lr, mu, wd=0.0, nesterov=False, ok=True, scale=1.0, ctl=None):
    _step(optim.SGD(1.0, momentum=mu, nesterov=nesterov), p, g, {"v": v}, lr, 1, wd, ok, scale, ctl)


def adam_update(p, g, m, v, lr, b1, b2, eps, wd, t, ok=True, scale=1.0, ctl=None):
    _step(optim.Adam(1.0, b1, b2, eps), p, g, {"m": m, "v": v}, lr, t, wd, ok, scale, ctl)


def rmsprop_update(p, g, s, lr, rho, eps, wd=0.0, ok=True, scale=1.0, ctl=None):
    _step(optim.RMSprop(1.0, rho, eps), p, g, {"s": s}, lr, 1, wd, ok, scale, ctl)
