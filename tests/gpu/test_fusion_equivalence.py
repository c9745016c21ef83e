"""The fusion-equivalence test on the GPU (issue 38.1): the generated nets of tests/helpers/fusion_nets.py,
compiled for cuda (the direct kernels, the chain kernel at small batches, cuDNN, CUDA graphs), give the
CPU model's Model.forward outputs: fp32 (TF32 off) to a tight tolerance, bf16 within bf16's rounding."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl import inference, precision  # noqa: E402
from minidl.inference import schedule  # noqa: E402
from tests.helpers import fusion_nets  # noqa: E402

SEEDS = range(64)
FP32_TOL = 1e-4          # max |GPU - CPU| / max |CPU|: cuDNN's engines and the direct kernels sum in other orders
BF16_TOL = 8e-2          # bf16 keeps 8 bits of mantissa: a few layers of rounding, relative to the largest output
                         # (the CPU's bf16 storage: 3.1% at worst over these nets, tests/test_fusion_equivalence.py)


def _host(m, ys):
    m.device.sync()                          # predict returns before the captured graph has run
    return [cp.asnumpy(y) for y in (ys if isinstance(ys, list) else [ys])]


def _close(got, want, tol):
    want = want if isinstance(want, list) else [want]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        err, scale = float(np.abs(g - w).max()), max(float(np.abs(w).max()), 1e-3)
        assert err <= tol * scale, f"max error {err:.3g} is more than {tol:g} of max |y| {scale:.3g}"


@pytest.fixture(scope="module")
def seen():
    """The rules the nets below ran (the Softmax kept: the model's outputs), read by the last test."""
    return set()


@pytest.mark.parametrize("seed", SEEDS)
def test_fp32_on_the_gpu_equals_the_cpu_model(no_tf32, seed, seen, monkeypatch):
    model = fusion_nets.net(seed)
    x = fusion_nets.images(model, 5, seed)
    want = model.forward(x)
    m = inference.compile(model, device="cuda", probabilities=True)
    assert m.precision == "fp32"
    seen.update(fusion_nets.rules(m))
    _close(_host(m, m.predict(x)), want, FP32_TOL)               # the chain kernel where the model is one
    m.cuda_graphs = False
    _close(_host(m, m.predict(x)), want, FP32_TOL)               # eager: the same kernels
    if m.chain is not None:                                      # the fused steps of large batches
        monkeypatch.setattr(schedule, "CHAIN_MAX_BATCH", 0)
        big = inference.compile(model, device="cuda", probabilities=True)
        _close(_host(big, big.predict(x)), want, FP32_TOL)
    plain = inference.compile(model, device="cuda", probabilities=True, direct=False)
    _close(_host(plain, plain.predict(x)), want, FP32_TOL)


@pytest.mark.parametrize("seed", SEEDS)
def test_bf16_on_the_gpu_is_within_bf16_of_the_cpu_model(seed):
    model = fusion_nets.net(seed)
    x = fusion_nets.images(model, 5, seed)
    m = inference.compile(model, device="cuda", probabilities=True, precision=precision.policy("bf16", always=True))
    assert m.precision == "bf16"
    _close(_host(m, m.predict(x)), model.forward(x), BF16_TOL)


def test_every_schedule_rule_ran_on_the_gpu(seen):
    if not seen:
        pytest.skip("run with the equivalence tests above")
    import minidl as dl
    staged = getattr(schedule.direct_family(dl.get_device("cuda")), "X_AFFINE", False)
    other = {"normalize,chain"} if staged else {"chain+normalize", "normalize+conv_pool"}   # the family's one way
    missing = set(fusion_nets.SCHEDULE_RULES + fusion_nets.PASS_RULES) - seen - other - {"softmax_removed"}
    assert not missing, f"no generated net exercised {sorted(missing)} on the GPU"
