"""Adam (Kingma & Ba), with coupled weight decay as torch.optim.Adam."""
from .base import Optimizer


class Adam(Optimizer):
    """m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'²;  p -= lr m̂ / (√v̂ + eps),  g' = g + wd p."""
    name = "adam"
    slots = ("m", "v")
    hyper = ("b1", "b2", "eps")

    def __init__(self, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, schedule=None):
        super().__init__(lr, weight_decay, schedule)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0 and eps >= 0):
            raise ValueError(f"Adam: need 0 <= b1, b2 < 1 and eps >= 0, got b1={b1}, b2={b2}, eps={eps}")
        self.b1, self.b2, self.eps = float(b1), float(b2), float(eps)

    def update(self, lr, t, ok):
        self.kernels.adam_update(self.flat, self.grads, self.state["m"], self.state["v"], lr,
                                 self.b1, self.b2, self.eps, self.weight_decay, t, ok, scale=self.grad_scale)
