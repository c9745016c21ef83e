"""The optimizer's schedule, evaluated on the device (one fused kernel) inside captured steps,
gives the CPU's learning rates: SGD over a few steps on the GPU equals the CPU, and the NaN
guard leaves weights and state untouched."""
import numpy as np
import pytest

cp = pytest.importorskip("cupy")

import minidl as dl  # noqa: E402
from minidl import layers as L, optim  # noqa: E402
from minidl.optim import schedules  # noqa: E402


def model(device):
    x = L.Input((6,))
    return dl.Model(x, L.Dense(3)(L.ReLU()(L.Dense(8)(x))), device=device, seed=0)


@pytest.mark.parametrize("sched", [schedules.cosine(5, min_lr=0.01), schedules.step_decay(2, 0.5),
                                   schedules.inverse_time(0.3), schedules.constant()])
def test_device_schedule_steps_equal_the_cpu(sched):
    out = {}
    for name in ("cpu", "cuda"):
        m = model(name)
        opt = optim.SGD(0.1, schedule=sched).setup(m)
        g = np.random.default_rng(1).standard_normal(m.grads.shape).astype(np.float32)
        m.grads[...] = m.device.asarray(g)
        for _ in range(6):
            opt.step()
        out[name] = m.device.to_host(m.flat)
        assert opt.t == 6 and opt.current_lr == pytest.approx(sched(0.1, 5))
    np.testing.assert_allclose(out["cuda"], out["cpu"], rtol=1e-6, atol=1e-7)


def test_gate_false_changes_nothing_on_the_gpu():
    m = model("cuda")
    opt = optim.Adam(1e-2, weight_decay=0.1).setup(m)
    m.grads[...] = 1.0
    opt.step()
    before = [cp.asnumpy(a) for a in (m.flat, opt.state["m"], opt.state["v"])]
    m.grads[...] = cp.nan
    opt.step(gate=cp.zeros((), bool))
    for b, a in zip(before, (m.flat, opt.state["m"], opt.state["v"])):
        np.testing.assert_array_equal(cp.asnumpy(a), b)
