"""Export: the ONNX inference graph against minidl's own inference on MNIST test images, the
.safetensors weights under the PyTorch twins' names, and the command line."""
import numpy as np
import pytest

import minidl as dl
from minidl import checkpoint
from minidl.checkpoint import torch_names
from minidl.cli import export
from minidl import inference, layers as L, models, optim
from minidl.data import mnist
from minidl.data.loader import MNIST_MEAN, MNIST_STD
from minidl.testing import randomize_weights
from tests.test_files import CAN_TMPFS, CAN_UNPRIVILEGE, as_user, on_full_disk

N_IMAGES = 2000


@pytest.fixture(scope="module")
def digits():
    """The first 2000 MNIST test images as floats in [0, 1] (the input contract, docs/input.md), and labels."""
    images, labels = mnist("test")
    return images[:N_IMAGES, None].astype(np.float32) / 255, labels[:N_IMAGES]      # (N, 1, 28, 28)


def onnx_run(model, x, probabilities=None, uint8=False):
    ort = pytest.importorskip("onnxruntime")
    from minidl.inference.onnx_export import to_onnx
    proto = to_onnx(model, probabilities, uint8)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return proto, np.concatenate([session.run(None, {"input": x[i:i + 500]})[0] for i in range(0, len(x), 500)])


def trained_lenet():
    images, labels = mnist("train")
    trainer = dl.Trainer(models.lenet5(seed=0), optim.Adam(lr=2e-3), device="cpu", progress=False,
                         log=lambda s: None)
    trainer.fit((images[:6000], labels[:6000]), epochs=1, batch_size=64)
    return trainer.model


NETS = {"lenet5": lambda: randomize_weights(models.lenet5(seed=1)),
        "resnet18": lambda: randomize_weights(models.resnet(18, seed=2), seed=3),
        "relunet": lambda: models.get("relunet", seed=4),
        "trained-lenet5": trained_lenet}


@pytest.mark.parametrize("name", sorted(NETS))
def test_onnx_logits_equal_minidl_inference_on_mnist(name, digits):
    pytest.importorskip("onnx")
    x, labels = digits
    model = NETS[name]()
    proto, got = onnx_run(model, x, probabilities=False)
    want = inference.compile(model, device="cpu", probabilities=False).predict(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert (got.argmax(1) == want.argmax(1)).all()
    if name == "trained-lenet5":
        assert (got.argmax(1) == labels).mean() > 0.8            # 88% after 94 steps
    ops = [n.op_type for n in proto.graph.node]
    assert not {"BatchNormalization", "Dropout", "Softmax"} & set(ops)      # folded, removed, dropped
    proto, probs = onnx_run(model, x[:500])                       # by default: Model.predict's outputs
    np.testing.assert_allclose(probs, model.predict(x[:500]), rtol=1e-4, atol=1e-5)
    assert proto.graph.node[-2].op_type == "Softmax"


@pytest.mark.parametrize("name", ["lenet", "simplenet", "resnet18"])
def test_onnx_starts_with_the_preprocessing_and_takes_uint8_too(name, digits):
    """Float images in [0, 1] and (uint8=True) uint8 in [0, 255] give minidl's answer on the same images:
    the Normalize as Sub/Div (LeNet, ResNet: a padded first conv) or folded into the conv (SimpleNet)."""
    pytest.importorskip("onnx")
    x = digits[0][:64]
    u8 = np.rint(x * 255).astype(np.uint8)
    model = randomize_weights(models.get(name, seed=6), seed=7)
    want = inference.compile(model, device="cpu").predict(u8)
    proto, got = onnx_run(model, x)
    proto8, got8 = onnx_run(model, u8, uint8=True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got8, want, rtol=1e-4, atol=1e-4)
    ops = [n.op_type for n in proto.graph.node]
    assert (ops[:2] == ["Sub", "Div"]) == (name != "simplenet")
    assert [n.op_type for n in proto8.graph.node][:2] == ["Cast", "Div"]
    assert proto8.graph.input[0].type.tensor_type.elem_type == 2           # TensorProto.UINT8


def test_onnx_of_a_model_without_the_preprocessing_takes_the_images_as_they_are(digits):
    """No Normalize, nothing normalises: the ONNX graph reads [0, 1] floats (or uint8 / 255), as the model
    was trained and as Model.predict gives them to it."""
    pytest.importorskip("onnx")
    model = randomize_weights(models.lenet5(seed=8, preprocess=False))
    x = digits[0][:64]
    u8 = np.rint(x * 255).astype(np.uint8)
    proto, got = onnx_run(model, x)
    np.testing.assert_allclose(got, model.predict(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(onnx_run(model, u8, uint8=True)[1], model.predict(u8), rtol=1e-4, atol=1e-5)
    assert proto.graph.node[0].op_type == "Conv"


def test_onnx_graph_has_opset_17_and_a_dynamic_batch():
    pytest.importorskip("onnx")
    from minidl.inference.onnx_export import to_onnx
    proto = to_onnx(models.lenet5())
    assert max(o.version for o in proto.opset_import if o.domain == "") >= 17
    for v in (proto.graph.input[0], proto.graph.output[0]):
        assert v.type.tensor_type.shape.dim[0].dim_param == "N"
    assert [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim[1:]] == [1, 28, 28]
    gemm = [n for n in proto.graph.node if n.op_type == "Gemm"]
    assert len(gemm) == 3 and all(a.name == "transB" and a.i == 1 for n in gemm for a in n.attribute)


def every_kind():
    """A model with every exported kind, and patterns the passes leave (a BN after a pool, a 0.5 pad)."""
    x = L.Input((3, 12, 12))
    a = L.Conv2D(8, 3, padding=1)(x)
    h = L.ReLU()(L.BatchNorm2D()(a))                            # a reads twice: BN is not folded
    h = L.BatchNorm2D()(L.Conv2D(8, 3, padding=1, bias=False, dilation=1)(h))
    h = L.LeakyReLU(0.1)(L.Add()(h, a))
    h = L.ReLU()(L.Add()(L.Conv2D(8, 1)(h), h))                 # a residual 1x1 conv: Conv, then Add and Relu
    h = L.Pad2D((1, 0, 2, 1), value=0.5)(h)
    h = L.Conv2D(8, 3, stride=2, dilation=(1, 2))(L.Pad2D((0, 1, 0, 1))(L.Dropout(0.3)(h)))
    h = L.MaxPool2D(3, stride=1, padding=1)(L.LRN(size=3)(h))
    h = L.Tanh()(L.BatchNorm2D()(L.AvgPool2D(2, padding=1)(h)))
    s = L.Sigmoid()(L.GlobalAvgPool2D()(h))
    h = L.Dropout(0.5)(L.ReLU()(L.Dense(16)(L.Flatten()(s))))
    return randomize_weights(dl.Model(x, L.Softmax()(L.Dense(5)(h)), name="every_kind"))


@pytest.mark.parametrize("probabilities", [False, True])
def test_every_node_kind_exports_and_equals_minidl(probabilities):
    pytest.importorskip("onnx")
    model = every_kind()
    x = np.random.default_rng(0).random((7, 3, 12, 12), dtype=np.float32)            # images in [0, 1]
    proto, got = onnx_run(model, x, probabilities)
    compiled = inference.compile(model, device="cpu", probabilities=probabilities)
    assert compiled.stats["add_fused"] == 1
    want = compiled.predict(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    ops = {n.op_type for n in proto.graph.node}
    assert {"Conv", "Relu", "BatchNormalization", "Add", "LeakyRelu", "Pad", "LRN", "MaxPool", "AveragePool",
            "Tanh", "GlobalAveragePool", "Sigmoid", "Flatten", "Gemm"} <= ops
    assert ("Softmax" in ops) == probabilities and "Dropout" not in ops


@pytest.mark.parametrize("size", [1, 2, 3, 4, 6, 9])
def test_lrn_of_every_size_exports_a_file_onnxruntime_runs(size):
    """onnxruntime takes odd LRN sizes only; ONNX defines even ones as minidl computes them (one channel
    more ahead than behind), so an even size is written out as that definition: the same outputs."""
    pytest.importorskip("onnx")
    x = L.Input((6, 5, 5))
    model = dl.Model(x, L.Flatten()(L.LRN(size=size, alpha=0.5, beta=0.75, k=1.0)(x)), device="cpu")
    images = np.random.default_rng(size).random((3, 6, 5, 5), dtype=np.float32) * 3
    proto, got = onnx_run(model, images)
    np.testing.assert_allclose(got, model.forward(images), rtol=1e-5, atol=1e-6)
    assert ("LRN" in {n.op_type for n in proto.graph.node}) == bool(size % 2)


@pytest.mark.parametrize("make", [
    lambda h: L.MaxPool2D(4, stride=3, padding="same")(h), lambda h: L.AvgPool2D(2, stride=1, padding="same")(h),
    lambda h: L.AvgPool2D((2, 3), padding=1)(h), lambda h: L.Conv2D(3, 4, stride=2, padding="same")(h),
    lambda h: L.Conv2D(3, 3, dilation=2, padding="same")(h), lambda h: L.Conv2D(3, 2, padding=(0, 1, 2, 0))(h),
    lambda h: L.Pad2D((2, 0, 1, 3), value=-0.7)(h), lambda h: L.LRN(size=8, alpha=2.0, beta=1.5, k=0.5)(h),
    lambda h: L.BatchNorm2D(activation="relu")(L.MaxPool2D(2)(h)), lambda h: L.Add(activation="relu")(h, h, h)])
def test_hyper_parameters_at_their_edges_export_as_minidl_computes_them(make):
    """Asymmetric 'same' pads of even windows, count_include_pad average pools, dilated and strided 'same'
    convs, valued pads, an LRN window wider than the channels, three-input Adds: onnxruntime's outputs
    are minidl's."""
    pytest.importorskip("onnx")
    x = L.Input((4, 9, 9))
    model = randomize_weights(dl.Model(x, L.Flatten()(make(x)), device="cpu"))
    images = np.random.default_rng(0).random((2, 4, 9, 9), dtype=np.float32)
    np.testing.assert_allclose(onnx_run(model, images)[1], model.forward(images), rtol=1e-5, atol=1e-6)


def test_onnx_value_names_are_one_per_value_whatever_the_layer_names():
    """Layer names become ONNX value names, escaped: 'd/w' is no weight of 'd', 'output' no graph output."""
    from minidl.inference.onnx_export import _value_name
    assert _value_name("d/w", 1, 1) == "d%2Fw" and _value_name("a%2Fb", 1, 1) == "a%252Fb"
    assert _value_name("output", 1, 1) == "%6Futput" and _value_name("input_1", 1, 1) == "input_1"
    assert _value_name("input_1", 2, 1) == "%69nput_1" and _value_name("conv2d", 1, 1) == "conv2d"
    pytest.importorskip("onnx")
    x = L.Input((1, 4, 4))
    try:                                   # names Model may refuse (a check at creation): then nothing to export
        h = L.Dense(6, name="d", activation="relu")(L.Flatten(name="input")(x))
        model = dl.Model(x, L.Dense(3, name="output")(L.Dense(5, name="d/w")(h)), device="cpu")
    except ValueError as e:
        pytest.skip(f"the layer names are refused when the Model is made: {e}")
    model = randomize_weights(model)
    images = np.random.default_rng(0).random((3, 1, 4, 4), dtype=np.float32)
    np.testing.assert_allclose(onnx_run(model, images)[1], model.forward(images), rtol=1e-5, atol=1e-6)


def test_a_layers_weights_are_matched_by_its_exact_name():
    """'d' and 'd/w' are two layers: dropping or exporting the weights of 'd' must not take 'd/w/w'."""
    from types import SimpleNamespace

    from minidl.graph import Graph
    g = Graph([], [], weights={"d/w": 1, "d/b": 2, "d/w/w": 3, "d/w/b": 4, "dd/w": 5})
    g._drop_weights(SimpleNamespace(name="d"))
    assert sorted(g.weights) == ["d/w/b", "d/w/w", "dd/w"]


def test_a_kind_without_onnx_mapping_is_named():
    pytest.importorskip("onnx")
    from minidl.inference.onnx_export import to_onnx

    class Double(L.Layer):
        prefix = "double"

        def build(self, in_shapes, device):
            return in_shapes[0]

        def forward(self, xs, training):
            return 2 * xs[0]

    model = dl.Sequential([L.Flatten(), Double()], (4,))
    with pytest.raises(ValueError, match="double.*kind 'double' has no ONNX mapping"):
        to_onnx(model)

    class Half(L.Sigmoid):                    # an activation of its own whose ONNX operator is not said
        prefix, kernel, onnx_op = "half", None, None

        def f(self, xp, x):
            return 0.5 * x

    model = dl.Sequential([L.Flatten(), Half()], (4,))
    assert model.forward(np.ones((1, 4), np.float32)).tolist() == [[0.5] * 4]
    with pytest.raises(ValueError, match=r"^layer half \(Half\): has no ONNX mapping: give the class an onnx_op"):
        to_onnx(model)


# -- safetensors ---------------------------------------------------------------------------------
def test_torch_names_follow_the_twins_layout():
    names = torch_names.torch_names(models.resnet(18))
    assert names["conv2d/w"] == "1.weight" and names["fbn/running_var"] == "2.running_var"
    assert names["conv2d_1/w"] == "5.body.0.weight"          # first block: identity shortcut
    assert names["conv2d_5/w"] == "7.short.0.weight"          # stage 2: projection shortcut first
    assert names["conv2d_6/w"] == "7.body.1.weight"           # after the explicit Pad2D
    assert names["dense/w"] == "14.weight"
    assert torch_names.torch_names(models.get("lenet-caffe"))["dense_1/b"] == "7.bias"


@pytest.mark.parametrize("name", ["lenet", "resnet18", "simplenet"])
def test_torch_names_are_the_same_with_the_preprocessing_or_without(name):
    """Normalize is no module of the twin's Sequential: safetensors files from before keep their names."""
    assert torch_names.torch_names(models.get(name)) == torch_names.torch_names(models.get(name, preprocess=False))


def test_safetensors_holds_every_tensor_with_torch_names(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    model = randomize_weights(models.resnet(18))
    export.save_safetensors(str(tmp_path / "r.safetensors"), model)
    tensors = st.load_file(str(tmp_path / "r.safetensors"))
    names, weights = torch_names.torch_names(model), model.get_weights()
    n_bn = sum(n.kind == "batchnorm" for n in model.nodes)
    assert len(tensors) == len(weights) + n_bn                 # + each BN's num_batches_tracked
    for k, t in names.items():
        assert tensors[t].dtype == np.float32 and tensors[t].shape == weights[k].shape
        np.testing.assert_array_equal(tensors[t], weights[k].astype(np.float32))
    assert tensors["1.weight"].shape == (64, 1, 7, 7) and tensors["2.num_batches_tracked"].dtype == np.int64


@pytest.mark.parametrize("name", ["lenet", "resnet18", "simplenet", "largenet"])
def test_safetensors_loads_into_the_torch_twin_strictly(name, tmp_path):
    torch = pytest.importorskip("torch")
    st = pytest.importorskip("safetensors.numpy")
    tm = pytest.importorskip("benchmarks.torch_models")
    model = randomize_weights(models.get(name))
    export.save_safetensors(str(tmp_path / "w.safetensors"), model)
    twin = tm.torch_model({"model": "resnet", "depth": 18} if name == "resnet18" else {"model": name},
                          normalize=(MNIST_MEAN, MNIST_STD))      # the zoo's Normalize: the twin applies it too
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in st.load_file(str(tmp_path / "w.safetensors")).items()},
                         strict=True)
    x = np.random.default_rng(0).random((4, 1, 28, 28), dtype=np.float32)          # images in [0, 1]
    with torch.no_grad():
        got = twin.eval()(torch.from_numpy(x)).numpy()
    logits = inference.compile(model, device="cpu", probabilities=False).predict(x)     # the twin has no Softmax
    np.testing.assert_allclose(got, logits, rtol=1e-4, atol=1e-4)


def test_checkpoint_loads_safetensors_weights(tmp_path):
    pytest.importorskip("safetensors")
    model = randomize_weights(models.resnet(18, seed=5))
    path = str(tmp_path / "r.safetensors")
    export.save_safetensors(path, model)
    back = checkpoint.load_model(path, device="cpu")
    fresh = models.resnet(18, seed=6)
    checkpoint.load_weights(path, fresh)
    want = model.get_weights()
    for got in (back.get_weights(), fresh.get_weights()):
        assert got.keys() == want.keys()
        for k, v in want.items():
            np.testing.assert_array_equal(got[k], v)
    with pytest.raises(checkpoint.CheckpointError, match="do not fit the model"):
        checkpoint.load_weights(path, models.lenet5())
    from safetensors.numpy import save_file
    save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(checkpoint.CheckpointError, match="no minidl model"):
        checkpoint.load_model(str(tmp_path / "other.safetensors"))
    (tmp_path / "bad.safetensors").write_bytes(b"garbage")
    with pytest.raises(checkpoint.CheckpointError, match="not a readable"):
        checkpoint.load_weights(str(tmp_path / "bad.safetensors"), models.lenet5())


# -- the command line ----------------------------------------------------------------------------
def test_export_command_writes_both_files(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("safetensors")
    ckpt = str(tmp_path / "lenet.npz")
    checkpoint.save(ckpt, models.lenet5(seed=0))
    o, s = str(tmp_path / "m.onnx"), str(tmp_path / "w.safetensors")
    assert export.main([ckpt, "--onnx", o, "--safetensors", s]) == 0
    assert onnx.load(o).graph.node[-2].op_type == "Softmax"                  # Model.predict's outputs
    assert checkpoint.load_model(s).n_params == 61706
    assert "wrote" in capsys.readouterr().out
    assert export.main([ckpt, "--onnx", o, "--logits"]) == 0
    assert onnx.load(o).graph.node[-2].op_type == "Gemm" and ", logits" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [[], ["--probabilities", "--safetensors", "w.safetensors"],
                                  ["--logits", "--safetensors", "w.safetensors"],
                                  ["--onnx", "m.onnx", "--logits", "--probabilities"],
                                  ["--safetensors", "w.npz"], ["--onnx", "/no/such/folder/m.onnx"]])
def test_export_command_bad_flags_exit_2(argv, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        export.main([str(tmp_path / "missing.npz"), *argv])
    assert e.value.code == 2 and "usage:" in capsys.readouterr().err


def test_export_command_names_a_missing_checkpoint(tmp_path, capsys):
    assert export.main([str(tmp_path / "missing.npz"), "--onnx", str(tmp_path / "m.onnx")]) == 1
    assert "missing.npz: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("flag,out,message", [("--onnx", "/dev/full", "--onnx /dev/full is a character device"),
                                               ("--safetensors", "/dev/null/w.safetensors", "no such folder /dev/null"),
                                               ("--onnx", ".", "is a folder, not a regular file")])
def test_export_refuses_an_output_it_cannot_write_before_reading(flag, out, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        export.main([str(tmp_path / "missing.npz"), flag, out])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err.splitlines()[-1] and "Traceback" not in err


@pytest.mark.skipif(not CAN_UNPRIVILEGE, reason="needs a non-root user (or unshare --user)")
def test_export_safetensors_into_a_read_only_folder_is_one_line(tmp_path):
    pytest.importorskip("safetensors")
    ckpt = checkpoint.save(str(tmp_path / "lenet.npz"), models.lenet5(seed=0))
    (tmp_path / "ro").mkdir(mode=0o555)
    target = str(tmp_path / "ro" / "w.safetensors")
    rc, out, err = as_user(f"import sys; from minidl import export; "
                           f"sys.exit(export.main([{ckpt!r}, '--safetensors', {target!r}]))")
    assert rc == 2 and err.splitlines()[-1].endswith("w.safetensors cannot be written (Permission denied)")
    assert "SafetensorError" not in err and "Traceback" not in err


@pytest.mark.skipif(not CAN_TMPFS, reason="needs unshare and a tmpfs mount in a user namespace")
def test_export_onto_a_full_disk_leaves_the_previous_onnx_whole(tmp_path):
    pytest.importorskip("onnx")
    ckpt = checkpoint.save(str(tmp_path / "r.npz"), models.resnet(18, seed=0))
    disk = tmp_path / "disk"
    disk.mkdir()
    rc, out, err = on_full_disk(disk, f"""
        import sys
        from minidl import checkpoint, export, models
        small = checkpoint.save({str(tmp_path / 'l.npz')!r}, models.lenet5(seed=0))
        assert export.main([small, "--onnx", {str(disk / 'm.onnx')!r}]) == 0
        print(export.main([{ckpt!r}, "--onnx", {str(disk / 'm.onnx')!r}]))    # ResNet-18: 45 MB, 1 MB of disk
        import onnx
        print(len(onnx.load({str(disk / 'm.onnx')!r}).graph.node))
    """, size="1m")
    assert "Traceback" not in err, err
    status, nodes = out.splitlines()[-2:]
    assert status == "1" and int(nodes) > 5                  # the LeNet-5 graph, whole
    assert err.splitlines()[-1] == (f"error: {disk / 'm.onnx'}: no space left on the device while writing it; "
                                    f"{disk / 'm.onnx'} is as it was before")
