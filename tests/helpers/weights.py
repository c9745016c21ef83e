"""Weights for tests and benchmarks that exercise every parameter (not the fresh-init zeros and ones)."""
import numpy as np


def randomize_weights(model, seed=0):
    """Non-trivial BN statistics, gamma, beta and biases on a freshly initialised minidl model; returns it."""
    rng = np.random.default_rng(seed)
    w = model.get_weights()
    draw = {"gamma": lambda n: rng.uniform(0.5, 1.5, n), "beta": lambda n: rng.normal(0, 0.2, n),
            "running_mean": lambda n: rng.normal(0, 0.2, n), "running_var": lambda n: rng.uniform(0.5, 2.0, n),
            "b": lambda n: rng.normal(0, 0.1, n)}
    for k, v in w.items():
        f = draw.get(k.rsplit("/", 1)[1])
        if f is not None:
            w[k] = f(v.shape)
    model.set_weights(w)
    return model
