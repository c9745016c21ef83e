"""Training controls (docs/training.md): frozen weights, parameter groups, gradient clipping and
decoupled weight decay (AdamW), each against its formula written out in NumPy over several steps,
on a real model's flat arena (float64, so the references agree to rounding)."""
import math

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L, optim

STEPS = 6


def model(seed=0, dtype="float64"):
    """dense (4 -> 5), dense_1 (5 -> 3): four weights in one arena."""
    return dl.Sequential([L.Dense(5), L.ReLU(), L.Dense(3)], (4,), dtype=dtype, seed=seed)


def weights(m):
    return {k: np.array(p.data, np.float64) for k, p in m.params.items()}


def grad_steps(m, opt, steps=STEPS, seed=1, each=None):
    """Run `steps` optimizer steps on random gradients; returns the gradients each step used."""
    rng, used = np.random.default_rng(seed), []
    for t in range(1, steps + 1):
        g = {k: rng.standard_normal(p.shape) * 3 for k, p in m.params.items()}
        for k, p in m.params.items():
            p.grad[...] = g[k]
        if each is not None:
            each(t)
        opt.step()
        used.append(g)
    return used


def global_norm(g, names):
    return math.sqrt(sum(float(np.sum(g[k] ** 2)) for k in names))


# -- decoupled weight decay: torch.optim.AdamW's formula, written out ----------------------------------
def torch_adamw(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
    """torch.optim.AdamW (amsgrad off): p *= 1 - lr wd; m, v; p -= lr m̂ / (√v̂ + eps)."""
    p, m, v = p.copy(), np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        p *= 1 - lr * wd
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return p


def test_adamw_is_torchs_adamw_over_several_steps():
    m = model()
    w0 = weights(m)
    opt = optim.AdamW(lr=0.01, weight_decay=0.1).setup(m)
    assert opt.decoupled_weight_decay and optim.get("adamw", lr=0.01).weight_decay == 0.01   # torch's default
    used = grad_steps(m, opt)
    for k, p in m.params.items():
        np.testing.assert_allclose(p.data, torch_adamw(w0[k], [g[k] for g in used], 0.01, 0.1), rtol=1e-12,
                                   atol=1e-14)
    # the decay is decoupled: coupled Adam with the same weight decay ends elsewhere
    coupled = model()
    grad_steps(coupled, optim.Adam(lr=0.01, weight_decay=0.1).setup(coupled))
    assert not np.allclose(coupled.flat, m.flat, atol=1e-6)


def test_decoupled_weight_decay_in_the_base_serves_every_optimizer():
    """SGD with decoupled decay: p -= lr wd p, then p -= lr g (Keras's base, SGDW)."""
    m = model()
    w0 = weights(m)
    grad_steps(m, optim.SGD(0.1, weight_decay=0.05, decoupled_weight_decay=True).setup(m))
    rng = np.random.default_rng(1)
    ref = dict(w0)
    for _ in range(STEPS):
        g = {k: rng.standard_normal(p.shape) * 3 for k, p in m.params.items()}
        for k in ref:
            ref[k] = ref[k] - 0.1 * 0.05 * ref[k]
            ref[k] = ref[k] - 0.1 * g[k]
    for k, p in m.params.items():
        np.testing.assert_allclose(p.data, ref[k], rtol=1e-12)
    adam = model()
    grad_steps(adam, optim.Adam(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True).setup(adam))
    adamw = model()
    grad_steps(adamw, optim.AdamW(lr=0.01, weight_decay=0.1).setup(adamw))
    assert np.array_equal(adam.flat, adamw.flat)


# -- freezing --------------------------------------------------------------------------------------------
def test_a_frozen_weight_its_decay_and_its_state_stay_bit_identical_while_the_others_follow_adam():
    m = model()
    w0 = weights(m)
    opt = optim.Adam(lr=0.01, weight_decay=0.01).setup(m)
    frozen = m.params["dense/w"]

    def freeze_at_3(t):
        if t == 3:
            frozen.trainable = False          # frozen after two steps: its Adam state is not zero
            freeze_at_3.kept = frozen.data.copy(), {k: s[frozen.offset:frozen.offset + frozen.size].copy()
                                                    for k, s in opt.state.items()}
    used = grad_steps(m, opt, each=freeze_at_3)
    data, state = freeze_at_3.kept
    assert np.array_equal(frozen.data, data)
    assert all(np.array_equal(s[frozen.offset:frozen.offset + frozen.size], state[k]) for k, s in opt.state.items())
    assert not m.params["dense/w"].trainable and m.layer("dense").trainable is False
    # the others: Adam with coupled decay, step by step, as if nothing were frozen
    for k in ("dense/b", "dense_1/w", "dense_1/b"):
        p, mm, vv = w0[k].copy(), 0, 0
        for t, g in enumerate(used, 1):
            d = g[k] + 0.01 * p
            mm, vv = 0.9 * mm + 0.1 * d, 0.999 * vv + 0.001 * d * d
            p = p - 0.01 * (mm / (1 - 0.9 ** t)) / (np.sqrt(vv / (1 - 0.999 ** t)) + 1e-8)
        np.testing.assert_allclose(m.params[k].data, p, rtol=1e-12, atol=1e-14)
    frozen.trainable = True                 # unfrozen: it trains again
    grad_steps(m, opt, steps=1)
    assert not np.array_equal(frozen.data, data)


def test_freeze_api_layers_before_build_and_state_refused():
    dense = L.Dense(5)
    dense.trainable = False                 # Keras: before the model is built
    m = dl.Sequential([dense, L.ReLU(), L.Dense(3)], (4,))
    assert not m.params["dense/w"].trainable and not m.params["dense/b"].trainable and m.params["dense_1/w"].trainable
    m.unfreeze()
    assert all(p.trainable for p in m.params.values())
    assert m.freeze("dense_1", "dense/b") is m
    assert [k for k, p in m.params.items() if not p.trainable] == ["dense/b", "dense_1/w", "dense_1/b"]
    assert len(list(m.named_parameters())) == 4          # frozen weights are still parameters (torch's)
    with pytest.raises(ValueError, match=r"model.freeze: no layer or parameter 'fc'"):
        m.freeze("fc")
    with pytest.raises(TypeError, match="trainable must be True or False"):
        m.params["dense/w"].trainable = 0
    bn = dl.Sequential([L.Conv2D(2, 3), L.BatchNorm2D()], (1, 5, 5))
    with pytest.raises(ValueError, match="running_mean is state"):
        bn.params["fbn/running_mean"].trainable = True
    lines = []
    m.summary(print_fn=lines.append)
    assert lines[-1] == "total params: 20 trainable, 23 non-trainable"


# -- parameter groups ----------------------------------------------------------------------------------
def test_groups_give_each_their_lr_and_weight_decay_and_follow_the_base_lr():
    m = model()
    w0 = weights(m)
    groups = [{"params": m.layer("dense_1").params.values(), "lr": 0.01},        # by Parameter
              {"params": ["dense/b"], "weight_decay": 0.0}]                          # by name
    opt = optim.SGD(0.1, momentum=0.9, weight_decay=0.02, groups=groups).setup(m)
    used = grad_steps(m, opt, each=lambda t: setattr(opt, "lr", 0.05) if t == 4 else None)
    for k, (lr_mult, wd) in {"dense/w": (1, 0.02), "dense/b": (1, 0.0), "dense_1/w": (0.1, 0.02),
                             "dense_1/b": (0.1, 0.02)}.items():
        p, v = w0[k].copy(), 0
        for t, g in enumerate(used, 1):
            lr = (0.1 if t < 4 else 0.05) * lr_mult     # the base lr changed: the group's moved with it
            d = g[k] + wd * p
            v = 0.9 * v + d
            p = p - lr * v
        np.testing.assert_allclose(m.params[k].data, p, rtol=1e-12, err_msg=k)
    cfg = opt.config()
    assert cfg["groups"] == [{"params": ["dense_1/w", "dense_1/b"], "lr": 0.005},
                             {"params": ["dense/b"], "weight_decay": 0.0}]
    again = optim.get("sgd", **cfg).setup(model())        # a checkpoint's config rebuilds it
    assert np.array_equal(again._controls.lrs, opt._controls.lrs)


def test_groups_by_layer_and_by_array_and_their_errors():
    m = model()
    opt = optim.Adam(1e-3, groups=[{"params": ["dense"], "lr": 1e-4},
                                   {"params": [m.params["dense_1/w"].data], "lr": 0.0}]).setup(m)
    lrs = opt._controls.lrs
    p = m.params
    assert set(lrs[p["dense/w"].offset:p["dense/w"].offset + 20]) == {0.1}
    assert set(lrs[p["dense_1/w"].offset:p["dense_1/w"].offset + 15]) == {0.0}    # lr 0: as frozen
    with pytest.raises(ValueError, match=r"Adam: group 0: 'fc' is not a weight or layer of model"):
        optim.Adam(groups=[{"params": ["fc"], "lr": 1e-4}]).setup(model())
    with pytest.raises(ValueError, match="dense/w is in group 0 and group 1"):
        optim.Adam(groups=[{"params": ["dense"]}, {"params": ["dense/w"]}]).setup(model())
    with pytest.raises(ValueError, match=r"group 0 must be a dict with 'params'"):
        optim.Adam(groups=[{"lr": 1e-4}])
    with pytest.raises(ValueError, match="group 0's lr must be a finite number >= 0"):
        optim.Adam(groups=[{"params": ["dense"], "lr": -1}])
    with pytest.raises(ValueError, match="base lr, which is 0"):
        optim.SGD(0.0, groups=[{"params": ["dense"], "lr": 0.1}])


# -- clipping -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("clip_norm,clip_value", [(1.0, None), (None, 0.5), (2.0, 0.3), (1e6, None)])
def test_clipping_against_the_numpy_global_norm(clip_norm, clip_value):
    m = model()
    w0 = weights(m)
    m.params["dense_1/b"].trainable = False             # a frozen weight is not in the norm
    opt = optim.SGD(0.1, clip_norm=clip_norm, clip_value=clip_value).setup(m)
    used = grad_steps(m, opt)
    live = ["dense/w", "dense/b", "dense_1/w"]
    ref = dict(w0)
    for g in used:
        c = min(1.0, clip_norm / (global_norm(g, live) + 1e-6)) if clip_norm else 1.0
        for k in live:
            d = g[k] * c
            ref[k] = ref[k] - 0.1 * (np.clip(d, -clip_value, clip_value) if clip_value else d)
    for k in live:
        np.testing.assert_allclose(m.params[k].data, ref[k], rtol=1e-12, err_msg=k)
    assert np.array_equal(m.params["dense_1/b"].data, w0["dense_1/b"])
    assert global_norm(used[0], live) > 3          # the norm clip binds (except at 1e6)


def test_rmsprop_clips_with_its_gradient_scale_first():
    """Among N ranks the gradients arrive summed: grad_scale 1/N first, then the clip, as one process's."""
    m = model()
    w0 = weights(m)
    opt = optim.RMSprop(0.01, clip_norm=1.5).setup(m, grad_scale=0.5)
    used = grad_steps(m, opt)
    names = list(w0)
    ref, s = dict(w0), {k: 0 for k in names}
    for g in used:
        c = min(1.0, 1.5 / (0.5 * global_norm(g, names) + 1e-6))
        for k in names:
            d = g[k] * 0.5 * c
            s[k] = 0.99 * s[k] + 0.01 * d * d
            ref[k] = ref[k] - 0.01 * d / (np.sqrt(s[k]) + 1e-8)
    for k in names:
        np.testing.assert_allclose(m.params[k].data, ref[k], rtol=1e-12)


def test_bad_controls_are_one_line():
    with pytest.raises(ValueError, match="SGD: clip_norm must be a finite number > 0 or None, got -1"):
        optim.SGD(0.1, clip_norm=-1)
    with pytest.raises(ValueError, match="Adam: clip_value must be"):
        optim.Adam(clip_value=float("nan"))
    with pytest.raises(TypeError, match="decoupled_weight_decay must be True or False"):
        optim.Adam(decoupled_weight_decay=1)


def test_without_controls_the_plain_kernels_run():
    m = model()
    opt = optim.Adam(1e-3).setup(m)
    assert opt.ctl is None
    m.params["dense/b"].trainable = False
    assert opt.refresh() is True and opt.ctl is not None      # switched: a captured step is captured anew
    m.params["dense/b"].trainable = True
    assert opt.refresh() is False                             # stays controlled: only the arrays change


# -- every registered optimizer: the controls live in the base, around its rule --------------------------
@pytest.mark.parametrize("name", sorted(optim.OPTIMIZERS))
def test_every_registered_optimizer_decays_decoupled_and_leaves_a_frozen_weight_alone(name):
    """Decoupled decay is p (1 - lr wd) before the optimizer's own step (Loshchilov & Hutter), whatever the
    optimizer: the same optimizer without decay on weights decayed by hand ends at the same place."""
    lr, wd = optim.OPTIMIZERS[name].default_lr * 10, 0.1
    decayed, by_hand = model(), model()
    w0 = weights(decayed)
    for m in (decayed, by_hand):
        m.params["dense/b"].trainable = False
    opt = optim.get(name, lr=lr, weight_decay=wd, decoupled_weight_decay=True).setup(decayed)
    plain = optim.get(name, lr=lr, weight_decay=0.0).setup(by_hand)
    used = grad_steps(decayed, opt)
    rng = np.random.default_rng(1)
    for t in range(1, STEPS + 1):          # the same gradients as grad_steps drew
        g = {k: rng.standard_normal(p.shape) * 3 for k, p in by_hand.params.items()}
        for k, p in by_hand.params.items():
            p.grad[...] = g[k]
            if p.trainable:
                p.data[...] *= 1 - lr * wd
        plain.step()
        assert all(np.array_equal(g[k], used[t - 1][k]) for k in g)
    for k, p in decayed.params.items():
        np.testing.assert_allclose(p.data, by_hand.params[k].data, rtol=1e-10, atol=1e-13, err_msg=k)
    assert np.array_equal(decayed.params["dense/b"].data, w0["dense/b"])       # frozen: bit-identical
    assert not np.allclose(decayed.params["dense/w"].data, w0["dense/w"])
    undecayed = model()
    grad_steps(undecayed, optim.get(name, lr=lr, weight_decay=0.0).setup(undecayed))
    assert not np.allclose(undecayed.params["dense/w"].data, decayed.params["dense/w"].data, rtol=1e-6)
