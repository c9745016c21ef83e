"""The cuDNN-vs-PyTorch study's nets: shapes, parameter counts written out by hand, the kinds of
their layers, lookup by name, and a gradient check through a small one."""
import numpy as np
import pytest

from minidl import models
from tests.helpers.gradcheck import check_model


def conv(C, K, k):
    return K * C * k * k + K                     # weights and bias


def dense(C, K):
    return C * K + K


# 28 -conv5-> 24 -pool-> 12 (SimpleNet: 20*12*12 = 2880 features);
# LeNet: 12 -conv5-> 8 -pool-> 4 (50*4*4 = 800); LargeNet: 28 -> 26 -> 13 -> 11 -> 5 -> 3 -> 1 (70)
COUNTS = {
    "simplenet": conv(1, 20, 5) + dense(2880, 10),
    "lenet-caffe": conv(1, 20, 5) + conv(20, 50, 5) + dense(800, 500) + dense(500, 10),
    "relunet": conv(1, 20, 5) + conv(20, 50, 5) + dense(800, 500) + dense(500, 10),
    "largenet": conv(1, 20, 3) + conv(20, 50, 3) + conv(50, 70, 3) + dense(70, 500) + dense(500, 10),
}
KINDS = {
    "simplenet": ["conv2d", "pool", "flatten", "dense", "softmax"],
    "lenet-caffe": ["conv2d", "pool", "conv2d", "pool", "flatten", "dense", "relu", "dense", "softmax"],
    "relunet": ["conv2d", "relu", "pool", "conv2d", "relu", "pool", "flatten", "dense", "relu", "dense",
                "softmax"],
    "largenet": ["conv2d", "pool", "conv2d", "pool", "conv2d", "pool", "flatten", "dense", "relu", "dense",
                 "softmax"],
}
FEATURES = {"simplenet": 2880, "lenet-caffe": 800, "relunet": 800, "largenet": 70}


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_zoo_net_shapes_counts_and_layers(name):
    m = models.get(name)
    assert m.n_params == COUNTS[name]
    assert [n.kind for n in m.nodes] == ["normalize", *KINDS[name]]          # the input preprocessing first
    assert [n.kind for n in models.get(name, preprocess=False).nodes] == KINDS[name]
    flat = next(n for n in m.nodes if n.kind == "flatten")
    assert flat.shape == (None, FEATURES[name])
    y = m.forward(np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32))      # images in [0, 1]
    assert y.shape == (3, 10)
    np.testing.assert_allclose(y.sum(axis=1), 1, rtol=1e-5)      # a final Softmax


def test_zoo_names_and_errors():
    assert models.get("lenet_caffe").name == "lenet_caffe"
    assert models.get("ReLUNet").name == "relunet"
    assert models.get("largenet", classes=5).nodes[-1].shape == (None, 5)
    with pytest.raises(ValueError, match="takes no depth"):
        models.get("simplenet", depth=3)


def test_zoo_nets_check_their_gradients_in_float64():
    # SimpleNet on a 12x12 input: conv5 -> 8x8, pool -> 4x4, dense 320 -> 3
    m = models.simplenet(input_shape=(1, 12, 12), classes=3, dtype="float64", seed=1)
    x = np.random.default_rng(2).uniform(0.05, 0.95, (2, 1, 12, 12))   # images (its Normalize), probes stay in [0, 1]
    check_model(m, [x])


# -- benchmarks/compare.py: the pieces that need no GPU ----------------------------------------------
def test_compare_copies_minidl_weights_into_the_torch_twin():
    torch = pytest.importorskip("torch")
    tm = pytest.importorskip("benchmarks.torch_models")
    from benchmarks import compare
    for name in compare.MODELS:
        model = models.get(name, seed=7)
        pre = model.layers[0]                                # the zoo's Normalize: the twin applies it too
        twin = compare.copy_weights(model, tm.torch_model({"model": name}, normalize=(pre.mean, pre.std))).eval()
        x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)            # images in [0, 1]
        with torch.no_grad():
            got = torch.softmax(twin(torch.from_numpy(x)), 1).numpy()
        np.testing.assert_allclose(got, model.forward(x), rtol=1e-4, atol=1e-6)


def test_compare_writes_one_markdown_row_per_model_and_epoch():
    from benchmarks.compare import markdown_table
    runs = {"minidl": [{"epoch": 1, "test_accuracy": 97.123, "train_s": 0.5},
                       {"epoch": 5, "test_accuracy": 98.5, "train_s": 0.9}],
            "PyTorch": [{"epoch": 1, "test_accuracy": 97.0, "train_s": 3.0}]}
    lines = markdown_table({"simplenet": runs}, [1, 5]).splitlines()
    assert lines[0] == ("| model | epochs | minidl accuracy (%) | PyTorch accuracy (%) | minidl s/epoch | "
                        "PyTorch s/epoch | speed-up | minidl total (s) | PyTorch total (s) |")
    assert lines[2] == "| simplenet | 1 | 97.12 | 97.00 | 0.500 | 3.000 | 6.0x | 0.50 | 3.00 |"
    # epochs 2-5 take minidl 0.4 s, 0.1 s each; PyTorch has no row there
    assert lines[3] == "| simplenet | 5 | 98.50 | - | 0.100 | - | - | 0.90 | - |"


def test_compare_without_a_gpu_is_one_line_and_exit_2(capsys):
    from benchmarks import compare
    if compare.gpu_problem() is None:
        pytest.skip("a GPU is here: compare would run")
    assert compare.main(["--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("compare: ") and err.count("\n") == 1


def test_compare_framework_without_json_is_a_flag_error(capsys):
    from benchmarks import compare
    with pytest.raises(SystemExit) as e:
        compare.main(["--epochs", "1", "--framework", "minidl"])
    assert e.value.code == 2 and "--framework needs --json" in capsys.readouterr().err


def test_torch_recipe_shift_moves_each_image_by_at_most_s_pixels_with_zero_fill():
    torch = pytest.importorskip("torch")
    from benchmarks.torch_recipe import shifted
    torch.manual_seed(0)
    x = torch.rand(64, 1, 28, 28) + 1          # no zeros of its own: a zero is fill
    grid = torch.arange(28)
    out = shifted(x, 2, grid, grid)
    moves = set()
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))           # (64, 1, 32, 32): a 2-px zero border
    for i in range(64):
        found = [(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)
                 if torch.equal(out[i, 0], padded[i, 0, 2 + dy:30 + dy, 2 + dx:30 + dx])]
        assert len(found) == 1
        moves.add(found[0])
    assert len(moves) > 10                      # the offsets differ from image to image
    assert torch.equal(shifted(x, 0, grid, grid), x)
