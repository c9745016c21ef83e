"""Generated nets for the fusion-equivalence tests (tests/test_fusion_equivalence.py and its GPU twin).

`net(seed)` builds a small seeded random model from the pieces the inference passes and the schedule
rewrite: residual Adds of a 3x3 and a 1x1 conv (either order, the Add feeding a pool or a ReLU), identity
shortcuts, a conv read twice, max and average pools (padded or not), Pad2D (zero and not), convs padded
every way, BN (after a conv, after a conv's own ReLU, alone), Normalize at the input or not, ReLU before
or after the pool or inside the conv, Dropout, Dense heads (chains of one to three), a final Softmax, and
now and then an intermediate value as a second model output. Every choice is drawn from
`numpy.random.default_rng(seed)`, so a failing seed is rebuilt exactly.

`rules(m)` names what the optimised path of an InferenceModel runs (the schedule's fused calls and what
the passes folded), so a test can assert that every rule ran on some net: "chain+normalize" is the
Normalize staged inside the chain kernel, "normalize,chain" its own kernel before it.
"""
import numpy as np

import minidl as dl
from minidl import layers as L

from minidl.testing import randomize_weights

# every fused call the schedule makes, and every rewrite of the inference passes: each must run on some net
SCHEDULE_RULES = ("conv_pool", "normalize+conv_pool", "mlp", "add_relu", "chain", "chain+normalize",
                  "normalize,chain", "chain+softmax")
PASS_RULES = ("batchnorm_folded", "pad_folded", "normalize_folded", "relu_fused", "add_fused", "dropout_removed",
              "softmax_removed")


def _conv(rng, h, C, H, K=None, relu=None):
    """A conv of a random window, padding, stride and bias: (node, K, H after it)."""
    K = K or int(rng.integers(2, 6))
    k = int(rng.choice([1, 3, 3, 5])) if H >= 5 else 1
    pad = [0, k // 2, "same", (1, 0, 2, 1) if k == 3 else 0][int(rng.integers(0, 4))]
    stride = 2 if rng.random() < 0.15 and H >= 6 else 1
    layer = L.Conv2D(K, k, stride=stride, padding=pad, bias=bool(rng.random() < 0.8),
                     activation="relu" if relu else None)
    if pad == "same":
        oH = -(-H // stride)
    else:
        t, b = (pad, pad) if isinstance(pad, int) else pad[:2]
        oH = (H + t + b - k) // stride + 1
    return layer(h), K, oH


def _pool(rng, h, H, max2=2):
    """A pool of a random kind (or none), a 2x2 max-pool (the direct kernel's) `max2` times as likely as
    each other kind: (node, H after it)."""
    kind = rng.choice(["max2"] * max2 + ["max3s1", "max2pad", "avg2", "none"]) if H >= 4 else "none"
    if kind == "max2":
        return L.MaxPool2D(2)(h), H // 2
    if kind == "max3s1":
        return L.MaxPool2D(3, stride=1, padding=1)(h), H
    if kind == "max2pad":
        return L.MaxPool2D(2, padding=1)(h), H // 2 + 1
    if kind == "avg2":
        return L.AvgPool2D(2)(h), H // 2
    return h, H


def _stage(rng, h, C, H, extra):
    """One stage: a block, then ReLU and pool placements. Returns (node, C, H)."""
    block = rng.choice(["conv", "conv", "conv_bn", "pad_conv", "residual", "residual", "residual", "identity",
                        "shared"])
    if block == "conv":
        h, C, H = _conv(rng, h, C, H, relu=rng.random() < 0.3)
    elif block == "conv_bn":
        inner = rng.random() < 0.3                         # BN after the conv's own ReLU: no fold
        h, C, H = _conv(rng, h, C, H, relu=inner)
        h = L.BatchNorm2D(activation="relu" if rng.random() < 0.3 else None)(h)
    elif block == "pad_conv":
        p = int(rng.integers(1, 3))
        h = L.Pad2D(p, value=0.0 if rng.random() < 0.7 else 0.5)(h)
        h, C, H = _conv(rng, h, C, H + 2 * p)
    elif block in ("residual", "shared"):
        K = int(rng.integers(2, 6))
        a = L.Conv2D(K, 3, padding=1)(h)
        if block == "shared":                              # a read by the 1x1 and by the Add
            b = L.Conv2D(K, 1)(a)
        else:
            b = L.Conv2D(K, 1, bias=bool(rng.random() < 0.7))(h)
            if rng.random() < 0.2:
                b = L.BatchNorm2D()(b)
        if rng.random() < 0.2:                             # a residual 1x1 conv already fed by another Add
            b = L.Conv2D(K, 1)(L.Add()(b, a))
        pair = (a, b) if rng.random() < 0.5 else (b, a)
        h = L.Add(activation="relu" if rng.random() < 0.3 else None)(*pair)
        C = K
        if rng.random() < 0.25:
            extra.append(a)                                # an intermediate value as a model output
    else:                                                  # identity: conv(h) + h
        c = L.Conv2D(C, 3, padding=1)(h)
        h = L.Add(activation="relu" if rng.random() < 0.5 else None)(c, h)
    where = rng.choice(["before", "after", "none"])
    if where == "before":
        h = L.ReLU()(h)
    if rng.random() < 0.3:
        extra.append(h)                                    # the pool's input as a model output too
    h, H = _pool(rng, h, H, 6 if block in ("residual", "shared") else 2)   # Add -> max-pool: issue 38.1's net
    if where == "after":
        h = L.ReLU()(h)
    if rng.random() < 0.1:
        h = L.BatchNorm2D()(h)                             # BN after a pool: stays
    return h, C, H


def _lenet(rng, h, C, H):
    """Conv-ReLU-maxpool stages as the chain kernel takes them (LeNet's shape)."""
    for _ in range(int(rng.integers(1, 3))):
        K, pad = int(rng.integers(2, 7)), int(rng.integers(0, 2))
        h = L.Conv2D(K, 3, padding=pad, activation="relu" if rng.random() < 0.5 else None)(h)
        if rng.random() < 0.5:
            h = L.ReLU()(h)
        h, C, H = L.MaxPool2D(2)(h), K, (H + 2 * pad - 2) // 2
    return h, C, H


def net(seed, softmax=None):
    """A seeded random Model of the pieces above, weights randomised (BN statistics, biases).
    softmax: force a final Softmax on (True) or off (False); None draws it."""
    rng = np.random.default_rng(seed)
    C, H = int(rng.choice([1, 3])), int(rng.choice([10, 12, 13]))
    x = L.Input((C, H, H))
    h = x
    if rng.random() < 0.5:
        mean = [0.5, 0.4, 0.3][:C] if C == 3 and rng.random() < 0.5 else 0.1307
        h = L.Normalize(mean, [0.25, 0.3, 0.2][:C] if C == 3 else 0.3081)(h)
    extra = []
    if rng.random() < 0.3:
        h, C, H = _lenet(rng, h, C, H)
    else:
        for _ in range(int(rng.integers(1, 3))):
            h, C, H = _stage(rng, h, C, H, extra)
    h = L.Flatten()(h) if rng.random() < 0.85 else L.Flatten()(L.GlobalAvgPool2D()(h))
    if rng.random() < 0.3:
        h = L.Dropout(0.3)(h)
    for _ in range(int(rng.integers(0, 3))):
        h = L.Dense(int(rng.integers(4, 12)), activation="relu" if rng.random() < 0.3 else None)(h)
        if rng.random() < 0.5:
            h = L.ReLU()(h)
    y = L.Dense(5)(h)
    if softmax if softmax is not None else rng.random() < 0.5:
        y = L.Softmax()(y)
    outputs = [y] + (extra[-1:] if rng.random() < 0.6 else [])
    model = dl.Model(x, outputs if len(outputs) > 1 else y, device="cpu", seed=seed, name=f"net{seed}")
    return randomize_weights(model, seed)


def images(model, n, seed=0):
    """n float32 images in [0, 1] of `model`'s input shape."""
    return np.random.default_rng(seed).random((n, *model.inputs[0].shape[1:]), dtype=np.float32)


def rules(m):
    """The names of what the optimised path of InferenceModel `m` runs: its schedule's fused calls at
    large batches and, if it has one, its chain, and what the inference passes did (m.stats)."""
    seen = set()
    for st in m.steps:
        if st.kind == "conv_pool":
            seen.add("normalize+conv_pool" if st.nodes[0].kind == "normalize" else "conv_pool")
        elif st.kind in ("mlp", "add_relu"):
            seen.add(st.kind)
    if m.chain is not None:
        post = m.chain.nodes[-1].kind == "softmax"
        if m.chain.nodes[0].kind != "normalize":
            seen.add("chain")
        else:             # staged inside the chain kernel (x_affine), or its own kernel before it
            seen.add("chain+normalize" if m.chain.kernels == 1 + post else "normalize,chain")
        if post:
            seen.add("chain+softmax")
    seen.update(k for k in PASS_RULES if m.stats.get(k))
    return seen
