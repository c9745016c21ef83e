"""Every fusion of the optimised inference path equals the model it replaces (issue 38.1).

Generated nets (tests/helpers/fusion_nets.py: residual Adds of 3x3 and 1x1 convs, pools, pads, BN,
Normalize, ReLU placements, Dropout, Dense heads, Softmax) run through `inference.compile` (the passes, the
schedule's fused calls, the one-kernel chain at small batches, the layer-by-layer steps at large ones)
and must give Model.forward's outputs to float32 tolerance (bf16: within its rounding); the artifact gives
the compiled outputs bit for bit; and across the nets every schedule rule and every pass has run at least once.
"""
import types

import numpy as np
import pytest

import minidl as dl
from minidl import inference, layers as L, precision
from minidl.inference import schedule
from minidl.testing import randomize_weights
from tests.helpers import fusion_nets

SEEDS = range(64)


def _close(got, want):
    """float32 tolerance: folded weights and fused calls sum in another order than the layers."""
    got, want = (g if isinstance(g, list) else [g] for g in (got, want))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-5 * max(1.0, float(np.abs(w).max())))


def _equal(got, want):
    for g, w in zip(*((v if isinstance(v, list) else [v]) for v in (got, want))):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


@pytest.fixture(scope="module")
def seen():
    """The rules each net's optimised path ran, filled by the tests below, read by the last one."""
    return set()


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_model_equals_model_forward(seed, seen, monkeypatch, tmp_path):
    model = fusion_nets.net(seed)
    x = fusion_nets.images(model, 5, seed)
    want = model.forward(x)
    m = inference.compile(model, probabilities=True)
    seen.update(fusion_nets.rules(m))
    _close(m.predict(x), want)                                     # the chain where the model is one
    plain = inference.compile(model, probabilities=True, direct=False)
    _close(plain.predict(x), want)
    path = m.save(tmp_path / "net.artifact.npz")
    _equal(inference.load(path, device="cpu").predict(x), m.predict(x))
    monkeypatch.setattr(schedule, "CHAIN_MAX_BATCH", 0)            # the fused steps of large batches
    big = inference.compile(model, probabilities=True)
    assert all(st is not big.chain for st in big.schedule(5)[0])
    _close(big.predict(x), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_compiled_logits_equal_the_model_without_its_softmax(seed, seen):
    model = fusion_nets.net(seed, softmax=True)
    logits = fusion_nets.net(seed, softmax=False)
    logits.set_weights(model.get_weights())
    x = fusion_nets.images(model, 4, seed + 1)
    m = inference.compile(model, probabilities=False)
    seen.update(fusion_nets.rules(m))
    _close(m.predict(x), logits.forward(x))


@pytest.mark.parametrize("seed", SEEDS)
def test_bf16_compiled_model_is_within_bf16_of_the_model(seed):
    """Under bf16 (forced: these nets are too small for it to pay) the same nets stay within bf16's
    rounding of the float32 model (3.1% of the largest output at worst on the CPU's bf16 storage)."""
    model = fusion_nets.net(seed)
    x = fusion_nets.images(model, 4, seed)
    m = inference.compile(model, probabilities=True, precision=precision.policy("bf16", always=True))
    assert m.precision == "bf16"
    got, want = m.predict(x), model.forward(x)
    for g, w in zip(*((v if isinstance(v, list) else [v]) for v in (got, want))):
        err, scale = float(np.abs(np.asarray(g, np.float64) - w).max()), max(float(np.abs(w).max()), 1e-3)
        assert err <= 8e-2 * scale, f"max error {err:.3g} is more than 8% of max |y| {scale:.3g}"


@pytest.mark.parametrize("seed", [s for s in SEEDS if s % 3 == 0])
def test_compiled_predict_by_default_equals_model_predict_on_uint8_images(seed):
    """The compiled model's default outputs are Model.predict's (the model's Softmax kept), for the same
    uint8 images, (N, C, H, W) or, for one channel, (N, H, W)."""
    model = fusion_nets.net(seed)
    if len(model.outputs) > 1:
        pytest.skip("Model.predict takes one-output models")
    u8 = np.random.default_rng(seed).integers(0, 256, (4, *model.inputs[0].shape[1:]), dtype=np.uint8)
    m = inference.compile(model)
    for x in (u8, u8[:, 0]) if u8.shape[1] == 1 else (u8,):
        _close(m.predict(x), model.predict(x))


@pytest.mark.parametrize("seed", [s for s in SEEDS if s % 4 == 0])
def test_a_family_without_x_affine_runs_the_normalize_first(seed, seen, monkeypatch):
    """A direct family that cannot stage a Normalize (X_AFFINE False, as a GPU family may declare) runs it
    as its own kernel before the fused calls and the chain: the same outputs."""
    family = types.SimpleNamespace(**{k: getattr(dl.get_device("cpu").kernels.direct, k)
                                      for k in dir(dl.get_device("cpu").kernels.direct) if not k.startswith("__")})
    family.X_AFFINE = False
    monkeypatch.setattr(schedule, "direct_family", lambda device, dtype=None: family)
    model = fusion_nets.net(seed)
    x = fusion_nets.images(model, 3, seed)
    m = inference.compile(model, probabilities=True)
    assert all(st.x_affine is None for st in m.steps)
    seen.update(fusion_nets.rules(m))
    _close(m.predict(x), model.forward(x))


def test_the_issue_net_residual_add_relu_maxpool_keeps_the_shortcut():
    """Issue 38.1's net: Add(3x3 conv, 1x1 conv) -> ReLU -> 2x2 max-pool -> Dense. The Add becomes the 1x1
    conv's residual; the conv+pool fusion must not take that conv (it would drop the residual)."""
    x = L.Input((1, 12, 12))
    a, b = L.Conv2D(4, 3, padding=1)(x), L.Conv2D(4, 1)(x)
    y = L.Dense(10)(L.Flatten()(L.MaxPool2D(2)(L.ReLU()(L.Add()(a, b)))))
    model = randomize_weights(dl.Model(x, y, device="cpu"))
    m = inference.compile(model)
    assert m.stats["add_fused"] == 1
    assert all(not getattr(n.layer, "residual", False) for st in m.steps if st.kind == "conv_pool" for n in st.nodes)
    images = fusion_nets.images(model, 6)
    _close(m.predict(images), model.forward(images))


def test_a_conv_with_its_own_relu_keeps_the_bn_after_it():
    """BN after a conv that applies its ReLU itself is not BN of the conv: no fold."""
    x = L.Input((2, 6, 6))
    y = L.Flatten()(L.BatchNorm2D()(L.Conv2D(3, 3, activation="relu")(x)))
    model = randomize_weights(dl.Model(x, y, device="cpu"))
    m = inference.compile(model)
    assert not m.stats.get("batchnorm_folded") and "batchnorm" in [n.kind for n in m.nodes]
    images = fusion_nets.images(model, 3)
    _close(m.predict(images), model.forward(images))


def test_a_residual_conv_fed_by_another_add_keeps_both():
    """Add(Add(1x1 conv, z1), z2): the first Add makes the 1x1 conv residual; the second must not fuse into
    it again (a residual conv has two inputs: cloning it with a new residual would drop z1)."""
    x = L.Input((3, 5, 5))
    z1, z2 = L.Conv2D(3, 3, padding=1)(x), L.Conv2D(3, 1)(x)
    y = L.Flatten()(L.Add()(L.Add()(L.Conv2D(3, 1)(x), z1), z2))
    model = randomize_weights(dl.Model(x, y, device="cpu"))
    m = inference.compile(model)
    images = fusion_nets.images(model, 3)
    _close(m.predict(images), model.forward(images))


def test_every_schedule_rule_and_pass_ran_on_some_net(seen):
    """Runs after the tests above (pytest keeps file order): each rule of the optimised path was checked."""
    if not seen:
        pytest.skip("run with the equivalence tests above")
    missing = set(fusion_nets.SCHEDULE_RULES + fusion_nets.PASS_RULES) - seen
    assert not missing, f"no generated net exercised {sorted(missing)}: widen tests/helpers/fusion_nets.py"
