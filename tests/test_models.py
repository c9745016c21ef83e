"""Model zoo: shapes, parameter counts from the architecture formulas, the seed's layer names,
gradients through residual blocks, and model lookup by name."""
import importlib
import pathlib

import numpy as np

import minidl as dl
import pytest
from tests.helpers.gradcheck import check_model

from minidl import Input, Model, models

R = importlib.import_module("minidl.models.resnet")      # the module; models.resnet is the function

SEED_LISTING = pathlib.Path("/work/shared/seeds/002_3955ee834b98b238.txt")
rng = np.random.default_rng(0)


def images(n, shape=(1, 28, 28)):
    """Images in [0, 1]: the zoo's models carry Normalize (docs/input.md)."""
    return rng.random((n, *shape), dtype=np.float32)


def names(model):
    """Layer names in graph order, without those the seed did not print by name (pad, flatten) or did not
    have (normalize: it normalised its data before the net)."""
    return [layer.name for layer in model.layers if not layer.name.startswith(("pad", "flatten", "normalize"))]


# -- parameter counts, written out from the architectures -----------------------------------------
def conv(C, K, k):
    return K * C * k * k                         # no bias: every ResNet conv is followed by BN


def bn(C):
    return 2 * C                                 # gamma, beta (running statistics are not trainable)


def resnet_params(depth, in_ch, classes):
    block, blocks = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
                     50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
                     152: ("bottleneck", (3, 8, 36, 3))}[depth]
    total, C = conv(in_ch, 64, 7) + bn(64), 64
    for stage, (w, n) in enumerate(zip((64, 128, 256, 512), blocks)):
        for i in range(n):
            stride = 2 if stage > 0 and i == 0 else 1
            if block == "basic":
                out = w
                total += conv(C, w, 3) + bn(w) + conv(w, w, 3) + bn(w)
            else:
                out = 4 * w
                total += conv(C, w, 1) + bn(w) + conv(w, w, 3) + bn(w) + conv(w, out, 1) + bn(out)
            if C != out or stride != 1:
                total += conv(C, out, 1) + bn(out)          # projection shortcut
            C = out
    return total + C * classes + classes                   # 1x1 spatial at the end: Flatten = C


@pytest.mark.parametrize("depth,count", [(18, 11_689_512), (34, 21_797_672), (50, 25_557_032),
                                         (101, 44_549_160), (152, 60_192_808)])
def test_resnet_formula_matches_the_published_imagenet_counts(depth, count):
    # torchvision's counts for 3-channel input, 1000 classes (same bias-free convs, fc with bias)
    assert resnet_params(depth, 3, 1000) == count


def test_lenet5_shape_and_parameter_count():
    model = models.lenet5()
    assert model.forward(images(3)).shape == (3, 10)
    expected = (6 * 1 * 5 * 5 + 6) + (16 * 6 * 5 * 5 + 16) + (16 * 5 * 5 * 120 + 120) \
        + (120 * 84 + 84) + (84 * 10 + 10)
    assert expected == 61_706
    assert model.n_params == expected
    assert [layer.name for layer in model.layers] == [
        "normalize", "conv2d", "relu", "pool", "conv2d_1", "relu_1", "pool_1", "flatten",
        "dense", "relu_2", "dense_1", "relu_3", "dense_2", "softmax"]


@pytest.mark.parametrize("depth", [18, 50])
def test_resnet_shape_and_parameter_count(depth):
    model = models.resnet(depth)
    assert model.n_params == resnet_params(depth, 1, 10)
    assert model.layer("dense").w.shape == (10, 512 if depth == 18 else 2048)   # 1x1 before Flatten
    batch = 1 if depth == 50 else 2                  # keeps ResNet-50 cheap on a 2-core CI runner
    y = model.forward(images(batch))
    assert y.shape == (batch, 10)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_resnet_running_statistics_are_state_not_parameters():
    model = models.resnet(18)
    bn_channels = sum(p.size for k, p in model.params.items() if k.endswith("/gamma"))
    assert model.state_flat.size == 2 * bn_channels


def seed_listing():
    if not SEED_LISTING.exists():
        pytest.skip(f"{SEED_LISTING} not present")
    lines = SEED_LISTING.read_text().splitlines()
    return [ln[len("CUDA: "):].strip() for ln in lines if ln.startswith("CUDA: ")]


def seed_style_names(blocks):
    """The seed's bottleneck ResNet listing for `blocks` per stage, numbered as the seed numbered."""
    count = {}

    def name(stem, first=0):
        i = count.get(stem, first)
        count[stem] = i + 1
        return stem if i == 0 else f"{stem}_{i}"

    out = [name("conv2d"), name("fbn"), name("relu"), name("pool")]
    for n in blocks:
        for i in range(n):
            if i == 0:                                          # projection shortcut first
                out += [name("conv2d"), name("fbn")]
            for _ in range(2):
                out += [name("conv2d"), name("fbn"), name("relu")]
            out += [name("conv2d"), name("fbn"), name("add", 1), name("relu")]
    return out + [name("dense"), name("softmax")]


def test_seed_listing_is_a_3_6_4_3_resnet50():
    seed = [n for n in seed_listing() if n != "pad_"]
    assert seed_style_names((3, 6, 4, 3)) == seed              # the seed's known fault
    assert seed_style_names((3, 4, 6, 3)) != seed


def test_resnet_with_the_seeds_stage_counts_reproduces_its_listing():
    seed = [n for n in seed_listing() if n != "pad_"]
    assert names(R.build_resnet("bottleneck", (3, 6, 4, 3))) == seed


def test_resnet50_names_follow_the_seed_with_the_correct_stage_counts():
    seed = [n for n in seed_listing() if n != "pad_"]
    ours = names(models.resnet(50))
    assert ours == seed_style_names((3, 4, 6, 3))
    assert sorted(ours) == sorted(seed)          # the same 174 names; only where stages start moves
    assert ours[-3:] == ["relu_48", "dense", "softmax"]


def test_resnet18_forward_backward_gives_finite_gradients():
    model = models.resnet(18)
    net = model.lower(dl.graph.passes.training)  # the loss's view: logits out, the same parameters
    x, labels = images(2), np.array([3, 7])
    z = net.forward(x, training=True)
    gy = np.exp(z - z.max(1, keepdims=True))
    gy /= gy.sum(1, keepdims=True)               # d(mean cross-entropy)/d(logits) = (p - onehot) / N
    gy[np.arange(2), labels] -= 1
    net.zero_grad()
    gx = net.backward(gy / 2)
    assert gx.shape == x.shape and np.isfinite(gx).all()
    grads = model.get_grads()
    assert set(grads) == {k for k, p in model.params.items() if p.trainable}
    bad = [k for k, g in grads.items() if not np.isfinite(g).all()]
    assert not bad, f"non-finite gradients: {bad}"
    assert np.abs(grads["dense/w"]).sum() > 0 and np.abs(grads["conv2d/w"]).sum() > 0


@pytest.mark.parametrize("unit,C,width,stride", [
    (R._basic, 3, 3, 1),            # identity shortcut
    (R._basic, 2, 3, 2),            # projection, strided 3x3 after a Pad2D
    (R._bottleneck, 8, 2, 1),       # identity shortcut (8 = 4 * 2)
    (R._bottleneck, 3, 2, 2),       # projection
])
def test_residual_block_gradients(unit, C, width, stride):
    x = Input((C, 5, 5))
    model = Model(x, unit(x, C, width, stride), dtype="float64", seed=1)
    check_model(model, [rng.standard_normal((3, C, 5, 5))], tol=1e-5)


@pytest.mark.parametrize("depth", [18, 50])
def test_zero_init_residual_zeroes_each_branch_last_bn_gamma(depth):
    """Each block's residual branch ends in a BN with gamma 0 (every other BN: 1); off, all are 1."""
    per_block = 2 if depth == 18 else 3                  # BNs on the residual branch of a block
    for zero in (True, False):
        model = models.resnet(depth, zero_init_residual=zero)
        bns = [layer for layer in model.layers if isinstance(layer, dl.layers.BatchNorm2D)]
        # graph order per block: [shortcut BN], branch BNs, add: a branch's last BN precedes an add
        last = {model.layers[i - 1].name for i, layer in enumerate(model.layers) if isinstance(layer, dl.layers.Add)}
        assert len(last) == sum(R.RESNET_DEPTHS[depth][1]) and last <= {layer.name for layer in bns}
        weights = model.get_weights()
        for layer in bns:
            g = weights[f"{layer.name}/gamma"]
            assert np.all(g == (0.0 if zero and layer.name in last else 1.0)), layer.name
        assert len(bns) == 1 + per_block * len(last) + 4 - (depth == 18)     # stem, blocks, projections


@pytest.mark.parametrize("unit,C,width", [(R._basic, 3, 3), (R._bottleneck, 8, 2)])
def test_zero_init_residual_block_is_relu_identity_at_init(unit, C, width):
    """With an identity shortcut the block starts as relu(x), in training and inference mode."""
    x = Input((C, 5, 5))
    model = Model(x, unit(x, C, width, 1), dtype="float64", seed=1)
    xs = rng.standard_normal((3, C, 5, 5))
    for training in (True, False):
        np.testing.assert_array_equal(model.forward(xs, training=training), np.maximum(xs, 0))
    off = Model(x := Input((C, 5, 5)), unit(x, C, width, 1, "ones"), dtype="float64", seed=1)
    assert not np.allclose(off.forward(xs, training=True), np.maximum(xs, 0))


@pytest.mark.parametrize("depth", [0, 20, 51, "50x", None, True])
def test_bad_depth_raises_listing_the_choices(depth):
    with pytest.raises(ValueError, match="18, 34, 50, 101, 152"):
        models.resnet(depth)


def test_get_by_name():
    assert models.get("lenet").n_params == models.get("LeNet5").n_params == 61_706
    assert models.get("resnet", depth=18).n_params == resnet_params(18, 1, 10)
    assert models.get("resnet18", classes=5).layer("dense").w.shape == (5, 512)
    assert models.get("resnet", depth="18").name == "resnet18"
    assert set(models.MODELS) >= {"lenet", "lenet5", "resnet"}
    with pytest.raises(ValueError, match="needs a depth"):
        models.get("resnet")
    with pytest.raises(ValueError, match="lenet, lenet5, resnet"):
        models.get("vgg16")
    with pytest.raises(ValueError, match="takes no depth"):
        models.get("lenet", depth=18)
    with pytest.raises(ValueError, match="contradicts"):
        models.get("resnet18", depth=50)
