"""minidl.inference on the CPU: folded + fused output equals the eval-mode model; artifacts; the CLI."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import minidl as dl
from minidl import checkpoint
from minidl import inference, layers as L, models, optim
from minidl.data import write_idx
from minidl.inference import ArtifactError
from minidl.testing import randomize_weights

ROOT = pathlib.Path(__file__).resolve().parents[1]
RTOL = 1e-5     # max |compiled - model| / max |model|: float32 rounding of the folded weights


def assert_close(got, want, rtol=RTOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    scale = float(np.abs(want).max())
    err = float(np.abs(got - want).max())
    assert err <= rtol * scale, f"max error {err:.3g} is more than {rtol:g} of max |y| {scale:.3g}"


randomize = randomize_weights          # non-trivial BN statistics, gamma, beta and biases


def eval_outputs(model, x):
    """(output, logits) of the eval-mode model."""
    y = model.forward(x, training=False)
    return y.copy(), model.lower(dl.graph.passes.drop_final_softmax).forward(x).copy()


def batch(n=3, shape=(1, 28, 28), seed=1):
    """Images in [0, 1], the input contract (docs/input.md) of the zoo's models, which carry Normalize."""
    return np.random.default_rng(seed).random(size=(n, *shape), dtype=np.float32)


def kinds(m):
    return [n.kind for n in m.nodes]


# -- equality with the eval-mode model --------------------------------------------------------------
def test_lenet_compiles_to_the_models_probabilities_and_to_logits_when_asked():
    model = randomize(models.lenet5())
    x = batch(5)
    y, z = eval_outputs(model, x)
    logits = inference.compile(model, probabilities=False)
    probs = inference.compile(model)                         # the model's own outputs, as Model.predict's
    assert_close(logits.predict(x), z)
    assert_close(probs.predict(x), y)
    assert_close(probs.predict(x), model.predict(x))
    assert_close(inference.compile(model, probabilities=True).predict(x), y)
    assert "softmax" not in kinds(logits) and kinds(probs)[-1] == "softmax"
    np.testing.assert_allclose(probs.predict(x).sum(axis=1), 1.0, rtol=1e-6)
    # LeNet: every ReLU fused into its conv or dense; no BN to fold; Normalize kept (a padded first conv)
    assert kinds(logits) == ["normalize", "conv2d", "pool", "conv2d", "pool", "flatten", "dense", "dense", "dense"]
    assert logits.stats["relu_fused"] == 4 and logits.stats.get("batchnorm_folded", 0) == 0


def test_resnet18_folds_every_bn_and_equals_the_model():
    model = randomize(models.resnet(18))
    x = batch(3)
    y, z = eval_outputs(model, x)
    m = inference.compile(model, probabilities=False)
    assert_close(m.predict(x), z)
    assert_close(inference.compile(model).predict(x), y)
    # 20 BNs folded into their convs, the 4 explicit pads into the strided convs, 17 ReLUs fused
    assert m.stats["batchnorm_folded"] == 20 and m.stats["pad_folded"] == 4 and m.stats["relu_fused"] == 17
    assert "batchnorm" not in kinds(m) and "pad" not in kinds(m) and "relu" not in kinds(m)
    assert len(m.nodes) == 32 < len(model.layers) and m.nodes[0].kind == "normalize"   # kept: the stem pads
    stem = m.nodes[1].layer                                      # pad, conv, BN and ReLU as one conv
    assert stem.name == "conv2d" and stem.padding == (3, 3, 3, 3) and stem.activation == "relu"


def test_resnet50_adds_each_shortcut_in_its_blocks_last_conv(tmp_path):
    """A bottleneck's last conv is 1x1 of stride 1 (`takes_residual`): its block's Add and ReLU become that
    conv's residual input and activation (the GPU's GEMM epilogue), kept by an artifact; ResNet-18's 3x3
    ones stay as they are."""
    model = randomize(models.resnet(50))
    x = batch(2)
    _, z = eval_outputs(model, x)
    m = inference.compile(model, probabilities=False)
    residual = [n for n in m.nodes if n.kind == "conv2d" and n.layer.residual]
    assert m.stats["add_fused"] == 16 and len(residual) == 16 and "add" not in kinds(m)
    assert all(n.layer.ksize == (1, 1) and n.layer.activation == "relu" and len(n.parents) == 2 for n in residual)
    assert_close(m.predict(x), z)
    back = inference.load(m.save(tmp_path / "r50.npz"), device="cpu")
    assert back.stats["add_fused"] == 16 and np.array_equal(back.predict(x), m.predict(x))
    assert not inference.compile(randomize(models.resnet(18))).stats.get("add_fused")


def test_float64_compile_of_resnet18_is_tight():
    model = randomize(models.resnet(18, dtype="float64"))
    x = batch(2).astype(np.float64)
    _, z = eval_outputs(model, x)
    assert_close(inference.compile(model, dtype="float64", probabilities=False).predict(x), z, rtol=1e-12)


def _zoo():
    """Every layer family, with the patterns folding must leave alone."""
    x = L.Input((3, 12, 12))
    a = L.Conv2D(8, 3, padding=1)(x)                      # feeds a BN *and* the Add: no folding
    h = L.ReLU()(L.BatchNorm2D()(a))
    h = L.Conv2D(8, 3, padding=1, bias=False)(h)          # bias=False + BN: folded
    h = L.BatchNorm2D()(h)
    h = L.LeakyReLU(0.1)(L.Add()(h, a))
    h = L.Pad2D(1, value=0.5)(h)                          # non-zero pad: kept
    h = L.Conv2D(8, 3, stride=2)(L.Pad2D((0, 1, 0, 1))(L.Dropout(0.3)(h)))   # zero pad -> conv padding
    h = L.LRN(size=3)(h)
    h = L.BatchNorm2D()(L.AvgPool2D(2)(h))                # BN not after a conv: an inference BN op
    h = L.Tanh()(h)
    s = L.Sigmoid()(L.GlobalAvgPool2D()(h))
    h = L.Dense(16)(L.Flatten()(s))
    h = L.Dropout(0.5)(L.ReLU()(h))
    y = L.Softmax()(L.Dense(5)(h))
    return dl.Model(x, y, name="zoo")


def test_every_layer_family_equals_the_model():
    model = randomize(_zoo())
    x = batch(4, (3, 12, 12))
    y, z = eval_outputs(model, x)
    m = inference.compile(model, probabilities=False)
    assert_close(m.predict(x), z)
    assert_close(inference.compile(model).predict(x), y)
    k = kinds(m)
    assert k.count("batchnorm") == 2 and m.stats["batchnorm_folded"] == 1   # the shared conv's BN and the pooled one
    assert k.count("pad") == 1 and m.stats["pad_folded"] == 1
    assert "dropout" not in k and m.stats["dropout_removed"] == 2
    for kind in ("leaky_relu", "lrn", "avgpool", "tanh", "gap", "sigmoid", "add"):
        assert kind in k, kind
    assert "relu" not in k and m.nodes[1].layer.activation == "relu"   # the unfolded BN applies its ReLU
    for n in m.nodes:                                            # no BN reads a conv it could fold into
        if n.kind == "batchnorm":
            src = n.parents[0]
            assert src.kind != "conv2d" or src.layer.name == "conv2d"


def test_model_without_bn_or_bias():
    model = randomize(dl.Sequential([L.Conv2D(4, 3, bias=False), L.ReLU(), L.MaxPool2D(2), L.Flatten(),
                                     L.Dense(6, bias=False), L.ReLU(), L.Dense(3)], (2, 9, 9)))
    x = batch(3, (2, 9, 9))
    _, z = eval_outputs(model, x)
    m = inference.compile(model)
    assert_close(m.predict(x), z)
    assert kinds(m) == ["conv2d", "pool", "flatten", "dense", "dense"]
    assert m.nodes[0].layer.activation == "relu" and m.nodes[0].layer.b is None
    assert m.nodes[3].layer.b is None and m.nodes[3].layer.activation == "relu"


def test_dropout_is_removed_and_eval_output_kept():
    model = randomize(dl.Sequential([L.Flatten(), L.Dense(20), L.ReLU(), L.Dropout(0.5), L.Dense(20),
                                     L.Dropout(0.2), L.ReLU(), L.Dense(4), L.Softmax()], (1, 6, 6)))
    x = batch(8, (1, 6, 6))
    y, z = eval_outputs(model, x)
    m = inference.compile(model, probabilities=False)
    assert_close(m.predict(x), z)
    assert_close(inference.compile(model).predict(x), y)
    assert kinds(m) == ["flatten", "dense", "dense", "dense"]      # ReLU after Dropout fused all the same
    assert m.stats["dropout_removed"] == 2 and m.stats["relu_fused"] == 2


def test_relu_is_not_fused_into_an_output():
    x = L.Input((5,))
    d = L.Dense(4)(x)
    model = dl.Model(x, [d, L.ReLU()(d)])
    m = inference.compile(randomize(model))
    xs = batch(3, (5,))
    want = [a.copy() for a in model.forward(xs)]
    got = m.predict(xs)
    assert kinds(m) == ["dense", "relu"]
    for g, w in zip(got, want):
        assert_close(g, w)


class Twice(L.Layer):
    def build(self, in_shapes, device):
        return in_shapes[0]

    def forward(self, xs, training):
        return 2 * xs[0]


class Scale(Twice):
    def __init__(self, k, name=None):          # no decorator: Layer records the arguments itself
        super().__init__(name)
        self.k = k

    def forward(self, xs, training):
        return self.k * xs[0]


def test_a_users_layer_runs_in_inference_with_its_arguments():
    model = dl.Sequential([L.Flatten(), Twice(name="twice")], (2, 2))
    x = batch(3, (2, 2))
    assert_close(inference.compile(model).predict(x), model.forward(x))
    model = dl.Sequential([L.Flatten(), Scale(3, name="scale")], (2, 2))
    assert_close(inference.compile(model).predict(x), 3 * x.reshape(3, -1))


def test_predict_checks_shapes_and_input_buffer_works():
    model = randomize(models.lenet5())
    m = inference.compile(model)
    with pytest.raises(ValueError, match="inputs must be"):
        m.predict(np.zeros((2, 1, 27, 28), np.float32))
    buf = m.input_buffer(2)
    buf[...] = batch(2)
    assert_close(m.predict(buf), m.predict(batch(2)))


def test_profile_gives_one_row_per_kernel_call():
    m = inference.compile(randomize(models.lenet5()))
    for n in (4, 20):                                       # one chain kernel; the staged schedule
        rows = m.profile(batch(n), repeats=3)
        steps = m.schedule(n)[0]
        assert [r.name for r in rows] == [st.name for st in steps]
        assert [n for st in steps for n in st.nodes] == m.nodes   # every node, once, in order
        assert all(r.shape[0] == n and r.ms >= 0 for r in rows)
        assert sum(r.ms for r in rows) > 0
    plain = inference.compile(randomize(models.lenet5()), direct=False)
    assert [r.name for r in plain.profile(batch(4), repeats=3)] == [n.layer.name for n in plain.nodes]


# -- the direct (fused) schedule ------------------------------------------------------------------------
def steps(m, n):
    return [st.kind for st in m.schedule(n)[0]]


@pytest.mark.parametrize("n", [1, 3, inference.CHAIN_MAX_BATCH, inference.CHAIN_MAX_BATCH + 1, 70])
def test_lenet_schedule_is_one_chain_or_fused_stages_and_equals_plain(n):
    model = randomize(models.lenet5())
    x = batch(n, seed=n)
    y, z = eval_outputs(model, x)
    m = inference.compile(model, probabilities=False)
    plain = inference.compile(model, probabilities=False, direct=False)
    probs = inference.compile(model)                        # the model's Softmax kept: one kernel after
    assert steps(plain, n) == kinds(plain)
    if n <= inference.CHAIN_MAX_BATCH:                      # the chain kernel reads x through the Normalize
        assert steps(m, n) == ["chain"] and m.schedule(n)[0][0].kernels == 1
        assert steps(probs, n) == ["chain"] and probs.schedule(n)[0][0].kernels == 2
    else:                                                   # and so does the first conv+pool kernel
        assert steps(m, n) == ["conv_pool", "conv_pool", "flatten", "mlp"]
        assert steps(probs, n) == ["conv_pool", "conv_pool", "flatten", "mlp", "softmax"]
    assert_close(m.predict(x), z)
    assert_close(m.predict(x), plain.predict(x))
    assert_close(probs.predict(x), y)


def test_resnet_schedule_fuses_add_relu_and_the_dense():
    model = randomize(models.resnet(18))
    m = inference.compile(model, probabilities=False)
    k = steps(m, 2)
    assert k.count("add_relu") == 8 and k[-1] == "mlp" and "add" not in k and m.chain is None
    x = batch(2)
    assert_close(m.predict(x), eval_outputs(model, x)[1])


def test_fusion_respects_other_readers_and_shapes():
    x = L.Input((2, 12, 12))
    a = L.Conv2D(4, 3, padding=1)(x)
    p = L.MaxPool2D(2)(L.ReLU()(a))
    q = L.MaxPool2D(3)(L.Conv2D(4, 3, padding=1)(p))            # a 3x3 pool: not the 2x2 kernel
    s = L.Conv2D(4, 3, stride=2, padding=1)(p)                  # strided: not direct
    h = L.Flatten()(L.Add()(s, L.MaxPool2D(2)(L.MaxPool2D(1)(p))))
    h1 = L.Dense(8)(h)
    y = L.Dense(3)(L.ReLU()(h1))
    model = randomize(dl.Model(x, [y, h1, q], name="branches"))   # h1 is an output: the chain stops there
    m = inference.compile(model)
    k = steps(m, 3)
    assert k.count("conv_pool") == 1 and k.count("mlp") == 2 and m.chain is None
    xs = batch(3, (2, 12, 12))
    want = [a.copy() for a in model.forward(xs)]
    for g, w in zip(m.predict(xs), want):
        assert_close(g, w)


def test_cpu_direct_kernels_equal_their_compositions():
    from minidl.kernels.cpu import conv, direct, pool
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 11, 10))
    w, b = rng.standard_normal((5, 3, 3, 4)), rng.standard_normal(5)
    pads = (1, 2, 0, 3)                                          # asymmetric, as a folded Pad2D gives
    xp = np.pad(x, ((0, 0), (0, 0), (1, 2), (0, 3)))
    y = conv.conv2d_fprop(conv.conv2d_plan(xp.shape, w.shape, (1, 1), 0, (1, 1)), xp, w, b)
    np.testing.assert_allclose(direct.conv2d_bias_relu_fprop(x, w, b, pads, relu=False), y, rtol=1e-12)
    r = np.maximum(y, 0)
    np.testing.assert_allclose(direct.conv2d_bias_relu_fprop(x, w, b, pads), r, rtol=1e-12)
    pooled = pool.maxpool2d_fprop(pool.pool2d_plan(r.shape, 2, 2, 0), r)
    assert pooled.shape == (2, 5, 6, 5)                          # 12x10 conv output, floor pool
    np.testing.assert_allclose(direct.conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads), pooled, rtol=1e-12)
    assert direct.conv_geometry(x.shape, w.shape, pads, 2) == ((12, 10), (6, 5))
    assert direct.supported_conv(x.shape[1:], w.shape, pads, 2)
    assert not direct.supported_conv((3, 200, 200), w.shape, 0, 2)
    ws = [rng.standard_normal((7, 5 * 6 * 5)), rng.standard_normal((3, 7))]
    stages = [("conv", w, b, pads, 2, True), ("dense", ws[0], None, True), ("dense", ws[1], b[:3], False)]
    h = np.maximum(pooled.reshape(2, -1) @ ws[0].T, 0) @ ws[1].T + b[:3]
    np.testing.assert_allclose(direct.chain_fprop(x, stages), h, rtol=1e-12)
    np.testing.assert_allclose(direct.mlp_fprop(pooled, ws, [None, b[:3]], [True, False]), h, rtol=1e-12)
    assert direct.supported_chain(x.shape[1:], stages)
    assert not direct.supported_chain(x.shape[1:], stages[:1])   # no dense stage
    np.testing.assert_allclose(direct.add_relu_fprop([y, -y, y]), np.maximum(y, 0), rtol=1e-12)


# -- artifacts ------------------------------------------------------------------------------------------
def test_artifact_round_trip_gives_identical_outputs(tmp_path):
    for model in (models.lenet5(), models.resnet(18), _zoo()):
        m = inference.compile(randomize(model))
        path = tmp_path / f"{model.name}.npz"
        assert m.save(path) == path
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []   # no temp left
        with np.load(path, allow_pickle=False) as z:                                  # plain arrays
            assert "__meta__" in z.files
        back = inference.load(path, device="cpu")
        assert kinds(back) == kinds(m) and back.stats == m.stats and back.name == m.name
        x = batch(2, model.inputs[0].shape[1:])
        np.testing.assert_array_equal(back.predict(x), m.predict(x))


def test_missing_and_corrupt_artifacts_name_the_file(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(ArtifactError, match="nope.npz"):
        inference.load(missing)
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"this is not a zip file")
    with pytest.raises(ArtifactError, match="corrupt.npz"):
        inference.load(corrupt)
    good = tmp_path / "good.npz"
    inference.compile(models.lenet5()).save(good)
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(ArtifactError, match="truncated.npz"):
        inference.load(truncated)
    ckpt = checkpoint.save(tmp_path / "model.ckpt.npz", models.lenet5())
    with pytest.raises(ArtifactError, match="model.ckpt.npz.*checkpoint"):
        inference.load(ckpt)
    assert issubclass(ArtifactError, ValueError)


def test_artifact_with_wrong_weights_is_rejected(tmp_path):
    path = tmp_path / "a.npz"
    inference.compile(models.lenet5()).save(path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["conv2d/w"] = arrays["conv2d/w"][:, :, :3]     # a 5x5 filter cut to 3x5
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ArtifactError, match="bad.npz.*conv2d/w"):
        inference.load(bad)


def test_compile_from_a_checkpoint_path(tmp_path):
    model = randomize(models.resnet(18))
    path = checkpoint.save(tmp_path / "resnet18.npz", model)
    m = inference.compile(str(path), device="cpu", probabilities=False)
    x = batch(2)
    _, z = eval_outputs(model, x)
    assert_close(m.predict(x), z)
    assert m.name == "resnet18" and m.stats["batchnorm_folded"] == 20
    with pytest.raises(checkpoint.CheckpointError, match="missing.npz"):
        inference.compile(tmp_path / "missing.npz")


# -- the command line -----------------------------------------------------------------------------------
def _synthetic_mnist(root, n_test=10000, seed=0):
    """IDX files where the label is where a bright 8x8 square sits: LeNet learns it in a few steps."""
    rng = np.random.default_rng(seed)

    def make(n):
        labels = rng.integers(0, 10, n).astype(np.uint8)
        images = rng.integers(0, 60, (n, 28, 28)).astype(np.uint8)
        for i, c in enumerate(labels):
            r, q = divmod(int(c), 5)
            images[i, 4 + 12 * r:12 + 12 * r, 1 + 5 * q:6 + 5 * q] = 255
        return images, labels

    folder = root / "mnist"
    folder.mkdir(parents=True)
    train, test = make(2000), make(n_test)
    for split, (images, labels) in (("train", train), ("t10k", test)):
        write_idx(folder / f"{split}-images-idx3-ubyte", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte", labels)
    return train, test


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data dir, checkpoint path, eval accuracy %) of a LeNet-5 trained 60 steps on synthetic data."""
    root = tmp_path_factory.mktemp("infer")
    train, test = _synthetic_mnist(root / "data")
    model = models.lenet5()
    trainer = dl.Trainer(model, optim.get("adam", lr=1e-3), log=lambda *a: None, progress=False)
    trainer.fit(train, steps=60, batch_size=32, monitor=1000)
    acc = trainer.evaluate(test, batch_size=1000).percent       # as the infer CLI prints it
    path = checkpoint.save(root / "lenet5.npz", model)
    return root / "data", path, acc


def infer(*args, data_dir=None):
    env = {k: v for k, v in os.environ.items() if k != "MINIDL_DATA"}
    env["PYTHONPATH"] = str(ROOT)
    extra = ["--data-dir", str(data_dir)] if data_dir else []
    return subprocess.run([sys.executable, "-m", "minidl.infer", *args, *extra], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_cli_prints_the_models_eval_accuracy(trained, tmp_path):
    data_dir, ckpt, acc = trained
    assert acc > 20                                         # trained, not chance
    art = tmp_path / "lenet5.artifact.npz"
    p = infer("--checkpoint", str(ckpt), "--device", "cpu", "--save-artifact", str(art), data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    assert f"accuracy: {acc:.3f}% (10000 mnist test images" in p.stdout, p.stdout     # names its dataset
    assert "14 layers -> 10 nodes" in p.stdout and art.is_file()             # the Softmax kept
    p = infer("--artifact", str(art), "--device", "cpu", "--batch-size", "768", data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    assert f"accuracy: {acc:.3f}%" in p.stdout                # a partial last batch changes nothing


def test_cli_scores_issue_38s_residual_net_as_the_model_does(tmp_path):
    """Issue 38.1: Add(3x3 conv, 1x1 conv) -> ReLU -> 2x2 max-pool scored 83.74% by `minidl infer` where the
    model scored 92.19% (the conv+pool fusion dropped the Add's second input). Now infer, its artifact and
    --no-direct print the model's own accuracy, and bf16 is compared with the model itself."""
    data_dir = tmp_path / "data"
    train, test = _synthetic_mnist(data_dir)
    x = L.Input((1, 28, 28))
    h = L.Normalize()(x)
    h = L.MaxPool2D(2)(L.ReLU()(L.Add()(L.Conv2D(6, 3, padding=1)(h), L.Conv2D(6, 1)(h))))
    model = dl.Model(x, L.Softmax()(L.Dense(10)(L.Flatten()(h))), name="res", seed=0)
    trainer = dl.Trainer(model, optim.get("adam", lr=1e-3), log=lambda *a: None, progress=False)
    trainer.fit(train, steps=40, batch_size=32, monitor=1000)
    acc = trainer.evaluate(test, batch_size=1000).percent
    assert acc > 20
    ckpt, art = checkpoint.save(tmp_path / "res.npz", model), tmp_path / "res.artifact.npz"
    for args in (["--checkpoint", str(ckpt), "--save-artifact", str(art)], ["--artifact", str(art)],
                 ["--checkpoint", str(ckpt), "--no-direct"]):
        p = infer(*args, "--device", "cpu", data_dir=data_dir)
        assert p.returncode == 0, p.stderr
        assert f"accuracy: {acc:.3f}%" in p.stdout, (args, p.stdout)
    p = infer("--checkpoint", str(ckpt), "--device", "cpu", "--precision", "bf16", data_dir=data_dir)
    assert p.returncode == 0 and "(the fp32 model itself, Model.forward)" in p.stdout, p.stderr


def test_cli_latency_and_profile(trained):
    data_dir, ckpt, _ = trained
    p = infer("--checkpoint", str(ckpt), "--device", "cpu", "--latency", "--profile", "--batch-size", "200",
              data_dir=data_dir)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "latency (batch 1, 1000 runs, input on the device): median" in out and " p99 " in out
    assert "throughput (10000 images in one batch" in out and "images/s" in out
    assert "profile at batch 200" in out and "normalize..softmax" in out and "total" in out


def test_cli_errors(trained, tmp_path):
    data_dir, ckpt, _ = trained
    p = infer("--checkpoint", str(tmp_path / "missing.npz"), "--device", "cpu", data_dir=data_dir)
    assert p.returncode == 2 and "usage:" in p.stderr and "--checkpoint" in p.stderr   # a bad flag
    assert "missing.npz" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"junk")
    p = infer("--artifact", str(bad), "--device", "cpu", data_dir=data_dir)
    assert p.returncode == 1 and "error: artifact" in p.stderr and "bad.npz" in p.stderr
    assert infer("--device", "cpu").returncode == 2                                  # no model given
    assert infer("--checkpoint", str(ckpt), "--artifact", "x").returncode == 2       # both given
    assert infer("--checkpoint", str(ckpt), "--batch-size", "0").returncode == 2


# -- a direct family that stages its input through the Normalize (X_AFFINE) -------------------------------
class _StagingFamily:
    """The CPU direct family plus x_affine=(a, b): the input normalised per channel, y = a x + b, before
    the zero padding, as a family declaring X_AFFINE stages it (here by composition, the reference)."""
    X_AFFINE = True

    def __init__(self, dk):
        self.dk = dk

    def __getattr__(self, name):
        return getattr(self.dk, name)

    @staticmethod
    def _normalised(x, x_affine):
        a, b = x_affine
        return x * a[:, None, None] + b[:, None, None]

    def conv2d_bias_relu_maxpool2x2_fprop(self, x, w, b, pads=0, relu=True, out=None, x_affine=None):
        x = x if x_affine is None else self._normalised(x, x_affine)
        return self.dk.conv2d_bias_relu_maxpool2x2_fprop(x, w, b, pads, relu, out=out)

    def chain_fprop(self, x, stages, out=None, x_affine=None):
        return self.dk.chain_fprop(x if x_affine is None else self._normalised(x, x_affine), stages, out=out)


@pytest.mark.parametrize("n", [2, inference.CHAIN_MAX_BATCH + 1])
def test_a_family_that_stages_the_normalize_keeps_lenet_one_chain_kernel(n):
    from minidl.inference import schedule
    model = randomize(models.lenet5())
    m = inference.compile(model, direct=False, probabilities=False)
    steps, chain = schedule.plan(m.model, _StagingFamily(schedule.direct_family(m.device)))
    assert [st.kind for st in steps] == ["conv_pool", "conv_pool", "flatten", "mlp"]
    assert steps[0].nodes[0].kind == "normalize" and chain.kernels == 1
    x = batch(n, seed=n)
    values = {0: x}
    for st in steps:
        values[st.out] = st.run([values[v] for v in st.inputs])
    assert_close(values[steps[-1].out], m.predict(x))
    assert_close(chain.run([x]), m.predict(x))
