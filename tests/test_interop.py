"""The zoo's ResNet beyond 28x28 and torchvision's weights in it: the head is global average pooling
at any input size, the parameter counts are torchvision's, and minidl.interop maps the names (checked
on a state dict written here; against torchvision's own outputs where torch and torchvision import)."""
import numpy as np
import pytest

from minidl import checkpoint, inference, interop, models

rng = np.random.default_rng(0)


def torchvision_shapes(block, blocks, classes=1000):
    """{key: shape} of torchvision's ResNet state dict, written out from its modules (no torch here)."""
    out = {}

    def conv(name, K, C, k):
        out[f"{name}.weight"] = (K, C, k, k)

    def bn(name, C):
        out.update({f"{name}.{p}": (C,) for p in ("weight", "bias", "running_mean", "running_var")})
        out[f"{name}.num_batches_tracked"] = ()
    conv("conv1", 64, 3, 7)
    bn("bn1", 64)
    C = 64
    for s, (width, n) in enumerate(zip((64, 128, 256, 512), blocks), 1):
        C_out = width * (4 if block == "bottleneck" else 1)
        for i in range(n):
            p = f"layer{s}.{i}."
            if block == "basic":
                conv(p + "conv1", width, C, 3), bn(p + "bn1", width)
                conv(p + "conv2", width, width, 3), bn(p + "bn2", width)
            else:
                conv(p + "conv1", width, C, 1), bn(p + "bn1", width), conv(p + "conv2", width, width, 3)
                bn(p + "bn2", width), conv(p + "conv3", C_out, width, 1), bn(p + "bn3", C_out)
            if i == 0 and C != C_out or (i == 0 and s > 1):
                conv(p + "downsample.0", C_out, C, 1), bn(p + "downsample.1", C_out)
            C = C_out
    out["fc.weight"], out["fc.bias"] = (classes, C), (classes,)
    return out


def random_state(shapes):
    return {k: (np.array(3) if k.endswith("num_batches_tracked") else rng.uniform(0.5, 1.5, s).astype(np.float32))
            for k, s in shapes.items()}


@pytest.mark.parametrize("depth,count", [(18, 11_689_512), (50, 25_557_032)])
def test_a_torchvision_shaped_resnet_has_torchvisions_parameter_count_at_any_size(depth, count):
    for size in (224, 64):
        m = models.resnet(depth, input_shape=(3, size, size), classes=1000, preprocess=False)
        assert m.n_params == count
        assert [n.kind for n in m.nodes][-4:] == ["gap", "flatten", "dense", "softmax"]
        assert m.layer("dense").w.shape == (1000, 512 if depth == 18 else 2048)


def test_the_head_is_a_global_average_pool_at_any_size_and_the_28x28_one_is_unchanged(tmp_path):
    assert models.resnet(18, input_shape=(1, 28, 28)).config() == models.resnet(18, global_pool=False).config()
    assert "GlobalAvgPool2D" not in str(models.resnet(18).config())      # a 1x1 last stage: the pool is the identity
    flat, gap = models.resnet(18, seed=3), models.resnet(18, seed=3, global_pool=True)
    x = rng.random((2, 1, 28, 28), dtype=np.float32)
    np.testing.assert_allclose(gap.forward(x), flat.forward(x), rtol=1e-5, atol=1e-7)
    # a checkpoint of the 28x28 net (the C++ trainer's Flatten head) loads into today's zoo net
    checkpoint.save(tmp_path / "r18.npz", flat)
    checkpoint.load_weights(tmp_path / "r18.npz", models.resnet(18))
    # at 56x56 the last stage is 2x2: the Dense reads 512 pooled features, not 2048
    m = models.resnet(18, input_shape=(1, 56, 56))
    assert m.layer("dense").w.shape == (10, 512) and m.forward(rng.random((1, 1, 56, 56), np.float32)).shape == (1, 10)
    old = models.resnet(18, input_shape=(1, 56, 56), global_pool=False)        # the head before: 2048 features
    assert old.layer("dense").w.shape == (10, 2048)
    checkpoint.save(tmp_path / "r18_56.npz", old)                # such a checkpoint loads as it was built
    kinds = [n.kind for n in checkpoint.load_model(tmp_path / "r18_56.npz").nodes]
    assert kinds[-3:] == ["flatten", "dense", "softmax"]
    checkpoint.load_weights(tmp_path / "r18_56.npz", models.resnet(18, input_shape=(1, 56, 56), global_pool=False))
    with pytest.raises(checkpoint.CheckpointError, match=r"dense/w has shape \(10, 512\), got \(10, 2048\)"):
        checkpoint.load_weights(tmp_path / "r18_56.npz", models.resnet(18, input_shape=(1, 56, 56)))


def test_torchvision_names_map_onto_the_zoo_net_in_its_graph_order():
    sd = random_state(torchvision_shapes("basic", (2, 2, 2, 2)))
    m = interop.load_torchvision_resnet(models.resnet(18, input_shape=(3, 32, 32), classes=1000, preprocess=False), sd)
    w = m.get_weights()
    # the zoo's names in graph order: stem conv2d/fbn; layer1.0 conv2d_1, conv2d_2; layer1.1 conv2d_3, conv2d_4;
    # layer2.0: its shortcut first (conv2d_5, fbn_5), then conv2d_6, conv2d_7
    pairs = {"conv2d/w": "conv1.weight", "fbn/gamma": "bn1.weight", "fbn/running_var": "bn1.running_var",
             "conv2d_1/w": "layer1.0.conv1.weight", "conv2d_2/w": "layer1.0.conv2.weight",
             "fbn_2/beta": "layer1.0.bn2.bias", "conv2d_4/w": "layer1.1.conv2.weight",
             "conv2d_5/w": "layer2.0.downsample.0.weight", "fbn_5/running_mean": "layer2.0.downsample.1.running_mean",
             "conv2d_6/w": "layer2.0.conv1.weight", "dense/w": "fc.weight", "dense/b": "fc.bias"}
    for ours, theirs in pairs.items():
        np.testing.assert_array_equal(w[ours], sd[theirs], err_msg=ours)
    sd50 = random_state(torchvision_shapes("bottleneck", (3, 4, 6, 3)))
    m50 = interop.load_torchvision_resnet(models.resnet(50, input_shape=(3, 32, 32), classes=1000, preprocess=False),
                                          sd50)
    np.testing.assert_array_equal(m50.get_weights()["conv2d_1/w"], sd50["layer1.0.downsample.0.weight"])
    np.testing.assert_array_equal(m50.get_weights()["conv2d_4/w"], sd50["layer1.0.conv3.weight"])


def test_a_state_dict_that_does_not_fit_is_one_line_naming_it():
    sd = random_state(torchvision_shapes("basic", (2, 2, 2, 2)))
    cases = [
        (models.resnet(18, input_shape=(3, 32, 32), preprocess=False), sd,
         r"^fc.weight has shape \(1000, 512\), resnet18's dense/w \(10, 512\) \(build the model with classes=1000\)$"),
        (models.resnet(34, input_shape=(3, 32, 32), classes=1000, preprocess=False), sd,
         r"^resnet34 has 73 conv, BN and dense layers, the torchvision ResNet 41"),
        (models.resnet(18, input_shape=(1, 32, 32), classes=1000, preprocess=False), sd,
         r"^conv1.weight has shape \(64, 3, 7, 7\), resnet18's conv2d/w \(64, 1, 7, 7\)$"),
        (models.resnet(18, input_shape=(3, 32, 32), classes=1000, preprocess=False), {**sd, "fc.extra": np.ones(1)},
         r"1 keys resnet18 has no place for, e.g. fc.extra$"),
        (models.resnet(18, input_shape=(3, 32, 32), classes=1000, preprocess=False), {"weight": np.ones(1)},
         r"^not a torchvision ResNet state dict"),
    ]
    for model, state, message in cases:
        before = model.get_weights()["conv2d/w"].copy()
        with pytest.raises(ValueError, match=message) as e:
            interop.load_torchvision_resnet(model, state)
        assert "\n" not in str(e.value)
        np.testing.assert_array_equal(model.get_weights()["conv2d/w"], before)      # nothing copied


@pytest.mark.parametrize("depth,size", [(18, 32), (18, 224), (50, 32), (50, 224)])
def test_torchvisions_own_resnet_loads_and_gives_its_outputs(depth, size, tmp_path):
    torch = pytest.importorskip("torch")
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(depth + size)
    net = getattr(tv.models, f"resnet{depth}")(weights=None)
    with torch.no_grad():                         # BN in eval mode with statistics of its own, not 0 and 1
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1), mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.0), mod.bias.uniform_(-0.1, 0.1)
        net.fc.weight.mul_(20)                    # logits of a few units, not the init's tenths: a sharper test
    net.eval()
    torch.save(net.state_dict(), tmp_path / "net.pth")
    model = models.resnet(depth, input_shape=(3, size, size), classes=1000, preprocess=False)
    interop.load_torchvision_resnet(model, tmp_path / "net.pth" if size == 32 else net.state_dict())
    x = np.random.default_rng(1).standard_normal((2, 3, size, size)).astype(np.float32)
    with torch.no_grad():
        logits = net(torch.from_numpy(x))
    np.testing.assert_allclose(model.forward(x, training=False), torch.softmax(logits, 1).numpy(), rtol=1e-4, atol=1e-7)
    scale = float(logits.abs().max())
    np.testing.assert_allclose(inference.compile(model).predict(x), logits.numpy(), atol=1e-4 * max(scale, 1), rtol=0)
