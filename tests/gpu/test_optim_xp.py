"""Every registered optimizer on the GPU, captured, against the CPU: the update rule written once over the
array module (optim/<name>.py's `rule`, through optim/reference.py) runs on CuPy inside a captured CUDA
graph for an optimizer without a fused kernel (Lion), and the fused kernels (kernels/gpu/optim.py FUSED)
still run for the four that have one. Forcing the rule (`fused = None`) checks every rule on CuPy too."""
import subprocess
import sys

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

import minidl as dl  # noqa: E402
from minidl import optim  # noqa: E402
from tests.helpers.control_net import data, net  # noqa: E402
from minidl.kernels.gpu import optim as gpu_optim  # noqa: E402

STEPS = 10
NAMES = sorted(optim.OPTIMIZERS)


def make(name, controls, rule):
    lr = optim.OPTIMIZERS[name].default_lr * 3
    kw = dict(weight_decay=0.05, decoupled_weight_decay=True, clip_norm=0.5) if controls else {}
    opt = optim.get(name, lr=lr, **kw)
    if rule:
        opt.fused = None                       # the xp rule on CuPy, though a fused kernel exists
    return opt


def train(device, name, controls, rule, graph):
    model = net(dl.get_device(device, seed=0))
    if controls:
        model.freeze("conv2d")
    opt = make(name, controls, rule)
    trainer = dl.Trainer(model, opt, seed=0, graph=graph, progress=False, log=lambda s: None)
    before = model.get_weights()
    trainer.fit(data(), steps=STEPS, batch_size=32, monitor=STEPS)
    return before, model.get_weights(), trainer


@pytest.mark.parametrize("controls", [False, True])
@pytest.mark.parametrize("rule", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_captured_gpu_training_matches_the_cpu(name, rule, controls, no_tf32):
    _, w_cpu, _ = train("cpu", name, controls, rule, graph=False)
    b_gpu, w_gpu, trainer = train("cuda", name, controls, rule, graph=True)
    opt = trainer.optimizer
    assert trainer._step._captured, "the captured path did not run"
    fused = not rule and opt.fused in gpu_optim.FUSED
    assert (opt._fused is not None) == fused
    lr = opt.lr
    for k in w_cpu:
        close = np.isclose(w_gpu[k], w_cpu[k], rtol=2e-3, atol=2e-4)
        diff = float(np.abs(w_gpu[k] - w_cpu[k]).max())
        # a sign-based rule (Lion) may flip an element whose update direction is ~0 on one device: a few
        # elements, each off by at most its steps' sizes
        assert (~close).sum() <= max(2, 0.005 * close.size), (k, diff)
        assert diff <= 2.5 * lr * STEPS + 2e-3 * float(np.abs(w_cpu[k]).max()) + 2e-4, (k, diff)
    if controls:
        assert np.array_equal(w_gpu["conv2d/w"], b_gpu["conv2d/w"])       # frozen: bit-identical
    assert not np.array_equal(w_gpu["fc/w"], b_gpu["fc/w"])


@pytest.mark.parametrize("name", NAMES)
def test_a_closed_gate_changes_nothing_on_the_gpu_rule(name):
    model = net(dl.get_device("cuda", seed=0))
    opt = make(name, controls=True, rule=True).setup(model)
    model.grads[...] = cp.asarray(np.random.default_rng(0).standard_normal(model.grads.size), model.grads.dtype)
    opt.step()
    flat, state = cp.asnumpy(model.flat), {k: cp.asnumpy(a) for k, a in opt.state.items()}
    opt.step(gate=cp.zeros((), bool))
    assert opt.t == 1 and np.array_equal(cp.asnumpy(model.flat), flat)
    assert all(np.array_equal(cp.asnumpy(a), state[k]) for k, a in opt.state.items())


SCRIPT = r"""
import sys
import numpy as np
import minidl as dl
from minidl import models, optim
rng = np.random.default_rng(0)
images, labels = rng.integers(0, 256, (96, 28, 28), dtype=np.uint8), rng.integers(0, 10, 96).astype(np.uint8)
for name in sorted(optim.OPTIMIZERS):
    opt = optim.get(name, lr=1e-3)
    opt.fused = None
    dl.Trainer(models.get("lenet", device=dl.get_device("cuda")), opt, progress=False,
               log=lambda s: None).fit((images, labels), steps=3, batch_size=32, monitor=3)
print(sorted(m for m in ("scipy", "scipy.sparse", "cupyx.scipy.sparse") if m in sys.modules))
"""


def test_the_rules_on_cupy_do_not_import_scipy():
    """Numbers meet arrays through ufuncs in the rules (optim/reference.py): no SciPy import at the first step."""
    out = subprocess.run([sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
