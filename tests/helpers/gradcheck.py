"""Central-difference gradient checks in float64 for layers and models."""
import numpy as np

from minidl.graph import Input, Model


def numeric_grad(f, a, eps=1e-5):
    """d f() / d a by central differences, perturbing `a` in place one element at a time."""
    g = np.zeros_like(a)
    flat, gflat = a.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


def rel_error(a, b):
    """max |a - b| / max(|a|, |b|, 1e-3): relative where the gradient is large, absolute near zero."""
    return float(np.max(np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), 1e-3)))


def check_model(model, xs, training=True, seed=0, tol=1e-6):
    """Compare analytic input and parameter gradients of sum(y * r) with central differences.

    Returns {name: max relative error}; asserts each is below `tol`.
    """
    rng = np.random.default_rng(seed + 1)
    y = model.forward(*xs, training=training)
    r = rng.standard_normal(y.shape)
    state = model.state_flat.copy()

    def loss():
        model.state_flat[...] = state            # running statistics must not drift between probes
        return float(np.sum(model.forward(*xs, training=training) * r))

    loss()
    model.zero_grad()
    gxs = model.backward(r)
    gxs = gxs if isinstance(gxs, list) else [gxs]
    errors = {}
    for i, (x, gx) in enumerate(zip(xs, gxs)):
        errors[f"x{i}"] = rel_error(gx, numeric_grad(loss, x))
    analytic = model.get_grads()
    for name, p in model.params.items():
        if p.trainable:
            errors[name] = rel_error(analytic[name], numeric_grad(loss, p.data))
    model.state_flat[...] = state
    bad = {k: v for k, v in errors.items() if not v < tol}
    assert not bad, f"gradient mismatch (max rel. error > {tol}): {bad}"
    return errors


def gradcheck(layer, in_shapes, training=True, seed=0, tol=1e-6, low=-1.0, high=1.0, inputs=None):
    """Wrap `layer` in a float64 model over inputs of `in_shapes` (batch first) and check it."""
    rng = np.random.default_rng(seed)
    nodes = [Input(s[1:]) for s in in_shapes]
    model = Model(nodes[0] if len(nodes) == 1 else nodes, layer(*nodes), dtype="float64", seed=seed)
    for p in model.params.values():          # non-trivial values for zero/one-initialised parameters
        p.data[...] += rng.uniform(-0.5, 0.5, p.shape)
    xs = inputs if inputs is not None else [rng.uniform(low, high, s) for s in in_shapes]
    return check_model(model, xs, training=training, seed=seed, tol=tol)
