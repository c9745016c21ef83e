"""Central-difference gradient checks in float64, for layers and whole models.

A layer's backward is checked as minidl checks its own: the layer is wrapped in a float64 model on
the CPU, a random projection r of its output makes a scalar, L = sum(y * r), and every input and
trainable parameter gradient from backward is compared with (L(a + eps) - L(a - eps)) / (2 eps), one
element at a time (exhaustive: keep the shapes tiny).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..graph import Input, Model

if TYPE_CHECKING:
    from ..layers.base import Layer


class GradientError(AssertionError):
    """A backward that disagrees with central differences; `errors` holds every relative error by name."""

    def __init__(self, message: str, errors: dict[str, float]) -> None:
        super().__init__(message)
        self.errors = errors


def numeric_grad(f: Callable[[], float], a: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """d f() / d a by central differences, perturbing `a` in place one element at a time."""
    g = np.zeros_like(a)
    flat, gflat = a.reshape(-1), g.reshape(-1)              # views: a's memory is what f reads
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


def rel_error(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(|a|, |b|, 1e-3): relative where the gradient is large, absolute near zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-3), initial=0.0))


def check_model_gradients(model: Model, xs: Sequence[np.ndarray], training: bool = True, seed: int = 0,
                          tol: float = 1e-6) -> dict[str, float]:
    """Compare a float64 model's input and parameter gradients of sum(y * r) with central differences.

    xs: one float64 array per model input. Returns {'x0': error, ..., 'layer/param': error}, the
    maximum relative error of each (`rel_error`); raises GradientError naming the worst where any is
    not below `tol`. Running statistics are restored before every probe, so BN in training mode
    checks too.
    """
    if model.device.dtype != np.float64:
        raise ValueError(f"check_model_gradients needs a float64 model (central differences in float32 are "
                         f"noise), got {model.device.dtype}: build it with dtype='float64'")
    rng = np.random.default_rng(seed + 1)
    y = model.forward(*xs, training=training)
    r = rng.standard_normal(y.shape)
    state = model.state_flat.copy()

    def loss() -> float:
        model.state_flat[...] = state            # running statistics must not drift between probes
        return float(np.sum(model.forward(*xs, training=training) * r))

    loss()
    model.zero_grad()
    gxs = model.backward(r)
    gxs = gxs if isinstance(gxs, list) else [gxs]
    errors = {f"x{i}": rel_error(gx, numeric_grad(loss, x)) for i, (x, gx) in enumerate(zip(xs, gxs))}
    analytic = model.get_grads()
    for name, p in model.params.items():
        if p.weight:                  # frozen weights have gradients too
            errors[name] = rel_error(analytic[name], numeric_grad(loss, p.data))
    model.state_flat[...] = state
    worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else np.inf)   # NaN is worst
    if not errors[worst] < tol:
        raise GradientError(f"{model.name}: the gradient of {worst} differs from central differences: max relative "
                            f"error {errors[worst]:.3g} (tolerance {tol:g}); all: "
                            + ", ".join(f"{k} {v:.2g}" for k, v in errors.items()), errors)
    return errors


def check_gradients(layer: Layer, in_shapes: Sequence[Sequence[int]], training: bool = True, seed: int = 0,
                    tol: float = 1e-6, low: float = -1.0, high: float = 1.0,
                    inputs: Sequence[np.ndarray] | None = None) -> dict[str, float]:
    """Check `layer`'s backward against central differences in float64, for its inputs and parameters.

    in_shapes: one shape per input, batch first, e.g. [(2, 3, 5, 5)] (tiny: every element is probed).
    The layer is built on the CPU in float64; its parameters get uniform(-0.5, 0.5) added (so zeros-
    and ones-initialised ones are checked away from their start); inputs are uniform(low, high), or
    `inputs`. Returns {'x0': error, ..., 'param': error}; raises GradientError, one line naming the
    worst, where any error is not below `tol`.
    """
    rng = np.random.default_rng(seed)
    nodes = [Input(s[1:]) for s in in_shapes]
    model = Model(nodes[0] if len(nodes) == 1 else nodes, layer(*nodes), dtype="float64", seed=seed,
                  name=f"layer {layer.name or type(layer).__name__} ({type(layer).__name__})")
    for p in model.params.values():          # non-trivial values for zero/one-initialised parameters
        p.data[...] += rng.uniform(-0.5, 0.5, p.shape)
    xs = list(inputs) if inputs is not None else [rng.uniform(low, high, s) for s in in_shapes]
    errors = check_model_gradients(model, xs, training=training, seed=seed, tol=tol)
    prefix = f"{layer.name}/"
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in errors.items()}
