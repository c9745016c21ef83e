"""Half precision where it pays (issue 30): a model too small for tensor cores runs in fp32 under a half
policy on a device that says so, and fp32 models large enough for them go channels-last on the GPU."""
import pytest

import minidl as dl
from minidl import backends, inference, models, optim, precision
from minidl.backend import Device
from minidl.graph import passes


def test_macs_per_image_counts_every_convolution_and_dense_layer() -> None:
    lenet = models.lenet5(device="cpu")
    # conv 6x28x28 from 1x5x5, conv 16x10x10 from 6x5x5, dense 400-120-84-10
    convs = 6 * 28 * 28 * 25 + 16 * 10 * 10 * 6 * 25
    assert passes.macs_per_image(lenet.nodes) == convs + 400 * 120 + 120 * 84 + 84 * 10


def test_the_gpu_backend_weighs_the_model_and_the_cpu_keeps_the_policy() -> None:
    cuda, cpu = backends.find("cuda"), backends.find("cpu")
    lenet, resnet = 416520.0, passes.macs_per_image(models.get("resnet", depth=18, device="cpu").nodes)
    assert not cuda.half_pays(lenet) and cuda.half_pays(resnet) and cpu.half_pays(lenet)
    assert cuda.channels_last("float32", None, resnet) and not cuda.channels_last("float32", None, lenet)
    assert cuda.channels_last("bfloat16", None, lenet)                  # a half model (always=True): NHWC kernels
    assert not cuda.channels_last("float32", False, resnet) and cuda.channels_last("float32", True, lenet)
    assert not cpu.channels_last("float32", None, resnet)


def test_where_it_pays_keeps_the_policy_unless_the_device_says_no() -> None:
    bf16, always = precision.policy("bf16"), precision.policy("bf16", always=True)
    assert precision.where_it_pays(bf16, True) is bf16
    assert precision.where_it_pays(bf16, False).name == "fp32"
    assert precision.where_it_pays(always, False) is always
    fp16 = precision.policy("fp16")
    assert precision.where_it_pays(fp16, False).loss_scale is None     # fp32: nothing to scale


@pytest.fixture
def small_pays_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU device answering as the GPU does (the CPU itself keeps every policy)."""
    monkeypatch.setattr(Device, "half_pays", lambda self, macs: backends.find("cuda").half_pays(macs))


def test_a_small_model_trains_and_infers_in_fp32_and_says_so(small_pays_nothing: None) -> None:
    said: list[str] = []
    trainer = dl.Trainer(models.lenet5(device="cpu"), optim.Adam(lr=1e-3), precision="bf16", log=said.append,
                         progress=False)
    assert trainer.precision.name == "fp32" and not trainer.precision.mixed
    assert len(said) == 1 and said[0].startswith("precision bf16: ") and "computes in fp32" in said[0]
    assert inference.compile(models.lenet5(device="cpu"), precision="bf16").precision == "fp32"


def test_always_insists_and_a_large_model_keeps_half(small_pays_nothing: None) -> None:
    said: list[str] = []
    forced = dl.Trainer(models.lenet5(device="cpu"), optim.Adam(lr=1e-3), log=said.append, progress=False,
                        precision=precision.policy("bf16", always=True))
    assert forced.precision.name == "bf16" and said == []
    net = models.get("resnet", depth=18, device="cpu")
    assert inference.compile(net, precision="bf16").precision == "bf16"
