"""On the GPU, half precision and channels-last where they pay (issue 30): LeNet-5 under bf16 trains and infers
in fp32 NCHW (its direct kernels), a ResNet keeps bf16, and fp32 ResNets go channels-last by default."""
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import inference, models, optim  # noqa: E402


def _trainer(model, precision):
    return dl.Trainer(model, optim.Momentum(lr=0.01), precision=precision, log=lambda s: None, progress=False)


def test_lenet_under_bf16_runs_in_fp32_nchw_and_a_resnet_in_bf16():
    dev = dl.get_device("cuda")
    lenet = _trainer(models.lenet5(device=dev), "bf16")
    assert lenet.precision.name == "fp32" and not lenet.channels_last
    assert inference.compile(models.lenet5(device=dev), precision="bf16").precision == "fp32"
    resnet = _trainer(models.get("resnet", depth=18, device=dev), "bf16")
    assert resnet.precision.name == "bf16" and resnet.channels_last


def test_fp32_resnets_go_channels_last_and_lenet_stays_nchw():
    dev = dl.get_device("cuda")
    assert _trainer(models.get("resnet", depth=18, device=dev), "fp32").channels_last
    assert not _trainer(models.lenet5(device=dev), "fp32").channels_last
