"""The dtype support table: each kernel family declares the dtypes it computes in (`DTYPES`, and the
GPU conv family also asks cuDNN), and Device.dtype_problem is the one place that reads it, for layers
at build, optimizers at setup and the inference schedule.

The GPU families are read from their source here (no CuPy needed; a DTYPES named from
kernels/gpu/_dtypes.py is looked up there); the refusals are shown on a CPU device whose families
declare a smaller table and whose backend words its messages as the GPU's, the stand-in for a GPU
without float64 kernels.
tests/gpu/test_float64.py runs the real table on the device.
"""
import ast
import pathlib
import types

import numpy as np
import pytest

import minidl as dl
from minidl import inference, layers as L, models, optim
from minidl.backend import KERNEL_FAMILIES, Device, DtypeError
from minidl.backends.cpu import CPU
from minidl.inference import schedule
from minidl.kernels.families import FAMILIES
from minidl.kernels.gpu import _dtypes
from minidl.cli.train import run_cli

KERNELS = pathlib.Path(__file__).resolve().parents[1] / "minidl" / "kernels"
BOTH = ("float32", "float64")
HALF = BOTH + ("float16", "bfloat16")      # the families a precision policy's compute region calls
# the table: the dtypes the contract says the library calls each family in (a new family brings its row)
GPU_TABLE = {f: FAMILIES[f].dtypes for f in KERNEL_FAMILIES}


def declared(backend, family):
    """The DTYPES a kernel family's source assigns at module level (a literal, or a name of
    kernels/gpu/_dtypes.py), or None."""
    tree = ast.parse((KERNELS / backend / f"{family}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DTYPES" for t in node.targets):
            if isinstance(node.value, ast.Name):
                return getattr(_dtypes, node.value.id)
            return ast.literal_eval(node.value)
    return None


def test_every_gpu_family_computes_in_what_the_contract_says_the_library_calls_it_in():
    assert {f: declared("gpu", f) for f in KERNEL_FAMILIES} == GPU_TABLE
    assert GPU_TABLE["conv"] == HALF and GPU_TABLE["norm"] == BOTH and GPU_TABLE["direct"] == ("float32",)


def test_cpu_families_take_any_dtype_but_direct():
    """Nothing changes on the CPU: only the direct family (float32 CUDA's reference) declares a table."""
    assert {f: declared("cpu", f) for f in KERNEL_FAMILIES if declared("cpu", f)} == {"direct": ("float32",)}
    for dtype in ("float32", "float64", "float16"):
        assert Device("cpu", dtype=dtype).dtype_problem([f for f in KERNEL_FAMILIES if f != "direct"]) is None


class _WordedAsGPU(CPU):
    """The CPU backend speaking as the GPU's (label, suggestion) and keeping a device's own families in
    every dtype, as the GPU's take their dtypes themselves."""
    label, elsewhere = "GPU", ", or --device cpu"

    def kernels(self, dtype, current=None):
        return current if current is not None else super().kernels(dtype)


def restricted(dtype="float64", gpu=True, **families):
    """A CPU device whose named families declare the given DTYPES (a tuple) or answer through a
    `dtype_problem` (a callable), as a GPU's would; gpu=True also words its messages as the GPU's."""
    dev = Device("cpu", dtype=dtype)
    kernels = dict(vars(dev.kernels))
    for name, table in families.items():
        extra = {"dtype_problem": table} if callable(table) else {"DTYPES": table}
        kernels[name] = None if table is None else types.SimpleNamespace(**vars(kernels[name]), **extra)
    dev.kernels = types.SimpleNamespace(**{k: v for k, v in kernels.items() if v is not None})
    if gpu:
        dev.backend = _WordedAsGPU()
    return dev


def net(device):
    x = L.Input((1, 8, 8))
    h = L.MaxPool2D(2)(L.ReLU()(L.Conv2D(4, 3, padding=1, name="conv1")(x)))
    return dl.Model(x, L.Softmax()(L.Dense(10, name="fc")(L.Flatten()(h))), device=device)


def test_a_family_without_the_dtype_refuses_the_layer_at_build_in_one_line():
    with pytest.raises(DtypeError) as e:
        net(restricted(conv=("float32",)))
    assert str(e.value) == ("layer conv1 (Conv2D): float64 is not supported on the GPU (the conv kernels compute "
                            "in float32 only); use float32, or --device cpu")
    with pytest.raises(ValueError, match=r"^layer softmax \(Softmax\): float64 is not supported on the CPU \(the "
                                         r"softmax kernels compute in float32 only\); use float32$"):
        net(restricted(gpu=False, softmax=("float32",)))


def test_a_library_verdict_refuses_the_layer_with_its_reason():
    """A family whose support depends on the library (cuDNN's double engines) answers through dtype_problem."""
    said = []

    def no_double(dtype):
        said.append(dtype)
        return "cuDNN 91900 builds no float64 convolution on this GPU: no engine" if dtype == np.float64 else None

    with pytest.raises(ValueError) as e:
        net(restricted(conv=no_double))
    assert str(e.value) == ("layer conv1 (Conv2D): float64 is not supported on the GPU (cuDNN 91900 builds no "
                            "float64 convolution on this GPU: no engine); use float32, or --device cpu")
    assert said == [np.dtype("float64")]
    model = net(restricted("float32", conv=no_double))          # float32: the verdict is None, the model runs
    assert model(np.ones((2, 1, 8, 8), np.float32)).shape == (2, 10)


def test_a_missing_family_is_named():
    with pytest.raises(ValueError, match=r"^layer pool \(MaxPool2D\): float64 is not supported on the GPU "
                                         r"\(no pool kernels on the GPU\)"):
        net(restricted(pool=None))


def test_an_artifact_on_a_device_without_its_dtype_is_refused_by_layer_not_called_inconsistent(tmp_path):
    path = tmp_path / "lenet.npz"
    inference.compile(models.lenet5(dtype="float64"), device="cpu", dtype="float64").save(path)
    with pytest.raises(DtypeError, match=r"^layer conv2d \(Conv2D\): float64 is not supported on the GPU") as e:
        inference.load(path, device=restricted(conv=("float32",)))
    assert not isinstance(e.value, inference.ArtifactError)
    assert inference.load(path, device="cpu").dtype == np.float64


def test_the_command_lines_print_the_refusal_as_one_line(capsys):
    assert run_cli(lambda args: net(restricted(conv=("float32",))), None) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: layer conv1 (Conv2D): float64 is not supported on the GPU")


def test_an_optimizer_asks_its_family_at_setup():
    model = net(restricted(optim=("float32",)))
    with pytest.raises(DtypeError, match=r"^Adam: float64 is not supported on the GPU \(the optim kernels compute "
                                         r"in float32 only\)"):
        optim.Adam(1e-3).setup(model)
    optim.Adam(1e-3).setup(net(Device("cpu", dtype="float64")))


def test_the_inference_schedule_plans_direct_kernels_only_where_the_family_computes():
    cpu32, cpu64 = Device("cpu"), Device("cpu", dtype="float64")
    assert schedule.direct_family(cpu32) is cpu32.kernels.direct
    assert schedule.direct_family(cpu64) is None
    model = models.lenet5(dtype="float64", seed=1)
    x = np.random.default_rng(0).random((3, 1, 28, 28))             # images in [0, 1] (docs/input.md)
    m32 = inference.compile(model, device="cpu")
    m64 = inference.compile(model, device="cpu", dtype="float64", probabilities=False)
    assert m32.chain is not None and {"conv_pool", "mlp"} <= {st.kind for st in m32.steps}
    assert m64.chain is None and not {"conv_pool", "mlp", "add_relu"} & {st.kind for st in m64.steps}
    z = m64.predict(x)                                          # logits: the final Softmax dropped
    p = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(p / p.sum(axis=1, keepdims=True), model(x), rtol=0, atol=1e-12)


def test_a_precision_policy_on_the_gpu_refuses_a_layer_whose_family_has_no_half_kernels():
    """compute_in gives the half device on the GPU too; a compute-region layer (here the max-pool, its family
    declared without bfloat16) is refused at the lowering's build, by name, pointing at --precision fp32."""
    dev = restricted("float32", pool=BOTH)
    assert dev.compute_in("bfloat16").dtype == np.dtype("bfloat16") and dev.compute_in("float32") is dev
    model = net(dev)
    with pytest.raises(DtypeError) as e:
        dl.Trainer(model, optim.SGD(0.1), progress=False, precision="bf16")
    assert str(e.value) == ("layer pool (MaxPool2D): bfloat16 is not supported on the GPU (the pool kernels compute "
                            "in float32 and float64 only); use --precision fp32, or --device cpu")
