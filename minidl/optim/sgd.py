"""Stochastic gradient descent, plain and with (Nesterov) momentum, as torch.optim.SGD."""
from .base import Optimizer


class SGD(Optimizer):
    """p -= lr (g + wd p)   over the flat buffers."""
    name = "sgd"

    def __init__(self, lr, weight_decay=0.0, schedule=None):
        super().__init__(lr, weight_decay, schedule)

    def update(self, lr, t, ok):
        self.kernels.sgd_update(self.flat, self.grads, lr, self.weight_decay, ok, scale=self.grad_scale)


class Momentum(Optimizer):
    """v = mu v + g';  p -= lr v   (Nesterov: p -= lr (g' + mu v)),  g' = g + wd p."""
    name = "momentum"
    slots = ("v",)
    hyper = ("momentum", "nesterov")

    def __init__(self, lr, momentum=0.9, nesterov=False, weight_decay=0.0, schedule=None):
        super().__init__(lr, weight_decay, schedule)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Momentum: momentum must be in [0, 1), got {momentum}")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def update(self, lr, t, ok):
        self.kernels.momentum_update(self.flat, self.grads, self.state["v"], lr, self.momentum,
                                     self.weight_decay, self.nesterov, ok, scale=self.grad_scale)
