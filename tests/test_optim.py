"""Optimizers against their update formulas written out per parameter; schedules; state round trip."""
import json
import math
import types

import numpy as np
import pytest

import minidl as dl
from minidl import optim
from minidl.backend import Device
from minidl.optim import schedules

SHAPES = {"conv/w": (3, 2, 2, 2), "conv/b": (3,), "dense/w": (4, 5)}
STEPS = 7


def fake_model(seed=0):
    """What an optimizer reads of a Model: flat, grads, device, and the weights' places in flat (params)."""
    dev = Device("cpu", dtype="float64")
    n = sum(math.prod(s) for s in SHAPES.values())
    flat = np.random.default_rng(seed).standard_normal(n)
    params, i = {}, 0
    for k, s in SHAPES.items():
        params[k] = types.SimpleNamespace(offset=i, size=math.prod(s), shape=s, weight=True, frozen=False,
                                          data=flat[i:i + math.prod(s)])
        i += math.prod(s)
    return types.SimpleNamespace(flat=flat, grads=np.zeros_like(flat), device=dev, params=params, layers=[],
                                 name="fake")


def split(flat):
    out, i = {}, 0
    for k, s in SHAPES.items():
        out[k] = flat[i:i + math.prod(s)].reshape(s).copy()
        i += math.prod(s)
    return out


def grad_stream(seed=1):
    rng = np.random.default_rng(seed)
    while True:
        yield {k: rng.standard_normal(s) for k, s in SHAPES.items()}


def flatten(d):
    return np.concatenate([d[k].ravel() for k in SHAPES])


# -- references: torch.optim's formulas, one parameter at a time ------------------------------

def ref_sgd(params, grads, st, lr, t, wd=0.0):
    for k in params:
        d = grads[k] + wd * params[k]
        params[k] = params[k] - lr * d


def ref_momentum(params, grads, st, lr, t, mu=0.9, nesterov=False, wd=0.0):
    for k in params:
        d = grads[k] + wd * params[k]
        v = st.setdefault(k, np.zeros_like(d))
        v = mu * v + d
        st[k] = v
        params[k] = params[k] - lr * (d + mu * v if nesterov else v)


def ref_adam(params, grads, st, lr, t, b1=0.9, b2=0.999, eps=1e-8, wd=0.0):
    for k in params:
        d = grads[k] + wd * params[k]
        m, v = st.get(k, (np.zeros_like(d), np.zeros_like(d)))
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d * d
        st[k] = (m, v)
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        params[k] = params[k] - lr * m_hat / (np.sqrt(v_hat) + eps)


def ref_rmsprop(params, grads, st, lr, t, rho=0.99, eps=1e-8, wd=0.0):
    for k in params:
        d = grads[k] + wd * params[k]
        s = rho * st.get(k, np.zeros_like(d)) + (1 - rho) * d * d
        st[k] = s
        params[k] = params[k] - lr * d / (np.sqrt(s) + eps)


def ref_adamw(params, grads, st, lr, t, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    """torch.optim.AdamW: p -= lr wd p, then Adam on the undecayed gradient."""
    for k in params:
        params[k] = params[k] - lr * wd * params[k]
    ref_adam(params, grads, st, lr, t, b1, b2, eps)


def ref_lion(params, grads, st, lr, t, b1=0.9, b2=0.99, wd=0.0):
    """Chen et al. 2023, Program 1: p -= lr (sign(b1 m + (1-b1) g) + wd p);  m = b2 m + (1-b2) g."""
    for k in params:
        m = st.get(k, np.zeros_like(grads[k]))
        params[k] = params[k] - lr * (np.sign(b1 * m + (1 - b1) * grads[k]) + wd * params[k])
        st[k] = b2 * m + (1 - b2) * grads[k]


CASES = {
    "sgd": (lambda: optim.SGD(0.1), ref_sgd, {}),
    "sgd_wd": (lambda: optim.SGD(0.1, weight_decay=0.05), ref_sgd, {"wd": 0.05}),
    "momentum": (lambda: optim.Momentum(0.05), ref_momentum, {}),
    "momentum_wd": (lambda: optim.Momentum(0.05, momentum=0.8, weight_decay=0.01), ref_momentum,
                    {"mu": 0.8, "wd": 0.01}),
    "nesterov": (lambda: optim.Momentum(0.05, nesterov=True), ref_momentum, {"nesterov": True}),
    "nesterov_wd": (lambda: optim.Momentum(0.05, nesterov=True, weight_decay=0.02), ref_momentum,
                    {"nesterov": True, "wd": 0.02}),
    "adam": (lambda: optim.Adam(0.01), ref_adam, {}),
    "adam_wd": (lambda: optim.Adam(0.01, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1), ref_adam,
                {"b1": 0.8, "b2": 0.99, "eps": 1e-6, "wd": 0.1}),
    "rmsprop": (lambda: optim.RMSprop(0.01), ref_rmsprop, {}),
    "rmsprop_wd": (lambda: optim.RMSprop(0.01, rho=0.9, weight_decay=0.03), ref_rmsprop,
                   {"rho": 0.9, "wd": 0.03}),
    "adamw": (lambda: optim.AdamW(0.01, betas=(0.8, 0.99), weight_decay=0.1), ref_adamw,
              {"b1": 0.8, "b2": 0.99, "wd": 0.1}),
    "lion": (lambda: optim.Lion(1e-3), ref_lion, {}),
    "lion_wd": (lambda: optim.Lion(3e-3, b1=0.8, b2=0.95, weight_decay=0.5), ref_lion,
                {"b1": 0.8, "b2": 0.95, "wd": 0.5}),
}
COVERED = {make().name for make, _, _ in CASES.values()}


def test_every_registered_optimizer_has_its_formula_written_out_here():
    """A new optimizer (one file in minidl/optim/) fails here until its formula is a case of CASES."""
    missing = sorted(set(optim.OPTIMIZERS) - COVERED)
    assert not missing, f"no formula in tests/test_optim.py CASES for the registered optimizers {missing}"


def run_both(opt, ref, kw, steps=STEPS, schedule=lambda lr, step: lr, seed=0):
    """Step `opt` and the reference side by side on the same gradients; compare every step."""
    model = fake_model(seed)
    flat, ptr = model.flat, model.flat.ctypes.data
    state_ptrs = {k: a.ctypes.data for k, a in opt.setup(model).state.items()}
    params, st, grads = split(model.flat), {}, grad_stream(seed + 1)
    for t in range(1, steps + 1):
        g = next(grads)
        model.grads[...] = flatten(g)
        opt.step()
        ref(params, g, st, schedule(opt.lr, t - 1), t, **kw)
        np.testing.assert_allclose(model.flat, flatten(params), rtol=1e-12, atol=1e-14, err_msg=f"step {t}")
        np.testing.assert_array_equal(model.grads, flatten(g))      # the gradient is only read
    assert model.flat is flat and model.flat.ctypes.data == ptr     # updated in place
    assert {k: a.ctypes.data for k, a in opt.state.items()} == state_ptrs
    return model, opt


@pytest.mark.parametrize("case", CASES)
def test_matches_reference(case):
    make, ref, kw = CASES[case]
    model, opt = run_both(make(), ref, kw)
    assert opt.t == STEPS and len(opt.state) == len(opt.slots)


@pytest.mark.parametrize("case,sched,fn", [
    ("momentum", schedules.inverse_time(0.5), lambda lr, s: lr / (1 + 0.5 * s)),
    ("adam_wd", schedules.step_decay(3, gamma=0.5), lambda lr, s: lr * 0.5 ** (s // 3)),
    ("rmsprop", schedules.cosine(5, min_lr=1e-4),
     lambda lr, s: 1e-4 + (lr - 1e-4) * (1 + math.cos(math.pi * min(s, 5) / 5)) / 2),
    ("sgd_wd", schedules.inverse_time(0.1), lambda lr, s: lr / (1 + 0.1 * s)),
])
def test_schedule_drives_the_update(case, sched, fn):
    make, ref, kw = CASES[case]
    opt = make()
    opt.schedule = sched
    _, opt = run_both(opt, ref, kw, schedule=fn)
    assert opt.current_lr == pytest.approx(fn(opt.lr, STEPS - 1))


def test_schedule_values():
    assert [schedules.constant()(0.1, s) for s in (0, 5, 100)] == [0.1, 0.1, 0.1]
    inv = schedules.inverse_time(0.01)
    assert [inv(0.1, s) for s in (0, 1, 100)] == pytest.approx([0.1, 0.1 / 1.01, 0.05])
    sd = schedules.step_decay(10, gamma=0.1)
    assert [sd(1.0, s) for s in (0, 9, 10, 19, 20, 35)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.001])
    cos = schedules.cosine(100, min_lr=0.01)
    assert [cos(1.0, s) for s in (0, 50, 100, 150)] == pytest.approx([1.0, 0.505, 0.01, 0.01])
    assert schedules.get("step_decay", step_size=2)(1.0, 2) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="unknown schedule 'linear'"):
        schedules.get("linear")


def test_first_step_uses_base_lr_and_lr_is_settable():
    model = fake_model()
    opt = optim.SGD(0.5, schedule=schedules.inverse_time(1.0)).setup(model)
    model.grads[...] = 1.0
    p0 = model.flat.copy()
    opt.step()                                     # t = 1, schedule step 0: lr = 0.5
    np.testing.assert_allclose(model.flat, p0 - 0.5)
    opt.step()                                     # t = 2: 0.5 / 2
    np.testing.assert_allclose(model.flat, p0 - 0.75)
    opt.lr = 0.02                                  # takes effect at the next step, still scheduled
    opt.step()                                     # t = 3: 0.02 / 3
    np.testing.assert_allclose(model.flat, p0 - 0.75 - 0.02 / 3)
    assert opt.current_lr == pytest.approx(0.02 / 3)


def test_current_lr_reads_the_device_only_for_a_schedule_that_reads_the_step(monkeypatch):
    """A read of the step count waits for every step queued on a GPU: a constant lr needs none."""
    reads = []
    for schedule, lr in ((None, 0.5), (schedules.inverse_time(1.0), 0.5 / 2)):
        opt = optim.SGD(0.5, schedule=schedule).setup(fake_model())
        opt.step()
        opt.step()
        monkeypatch.setattr(opt.device, "to_host", lambda a, name=opt.schedule.__name__: reads.append(name) or a.copy())
        assert opt.current_lr == pytest.approx(lr)
    assert reads == ["inverse_time"]


def test_changing_lr_between_steps_matches_reference():
    model = fake_model()
    opt = optim.Adam(0.01).setup(model)
    params, st, grads = split(model.flat), {}, grad_stream()
    for t, lr in enumerate([0.01, 0.01, 0.003, 0.003, 0.05, 0.0], start=1):
        opt.lr = lr
        g = next(grads)
        model.grads[...] = flatten(g)
        opt.step()
        ref_adam(params, g, st, lr, t)
        np.testing.assert_allclose(model.flat, flatten(params), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", ["sgd", "nesterov_wd", "adam_wd", "rmsprop"])
def test_state_dict_round_trip_continues_identically(case):
    make, _, _ = CASES[case]
    a, b = fake_model(), fake_model()
    opt_a, grads = make().setup(a), grad_stream()
    for _ in range(3):
        a.grads[...] = flatten(next(grads))
        opt_a.step()
    opt_a.lr *= 0.5                                # a changed lr is part of the state
    sd = opt_a.state_dict()
    restored = json.loads(json.dumps({k: v for k, v in sd.items() if k != "arrays"}))
    restored["arrays"] = {k: v.copy() for k, v in sd["arrays"].items()}
    assert all(type(v) is np.ndarray for v in sd["arrays"].values())
    b.flat[...] = a.flat
    opt_b = optim.get(sd["name"], **restored["config"]).setup(b)
    ptrs = {k: v.ctypes.data for k, v in opt_b.state.items()}
    opt_b.load_state_dict(restored)
    assert {k: v.ctypes.data for k, v in opt_b.state.items()} == ptrs   # copied in, not rebound
    assert opt_b.t == 3 and opt_b.lr == opt_a.lr
    for _ in range(4):
        g = flatten(next(grads))
        a.grads[...] = g
        b.grads[...] = g
        opt_a.step()
        opt_b.step()
    np.testing.assert_array_equal(a.flat, b.flat)


def test_load_before_setup_and_state_is_a_host_copy():
    model = fake_model()
    opt = optim.Adam(0.01).setup(model)
    model.grads[...] = 1.0
    opt.step()
    sd = opt.state_dict()
    sd["arrays"]["m"][...] = 123.0                 # a copy: the device state is untouched
    assert not np.any(opt.state["m"] == 123.0)
    late = optim.Adam(0.01)
    late.load_state_dict(opt.state_dict())
    late.setup(fake_model())
    assert late.t == 1
    np.testing.assert_array_equal(late.state["v"], opt.state["v"])


def test_load_state_dict_errors():
    opt = optim.Adam().setup(fake_model())
    sd = opt.state_dict()
    with pytest.raises(ValueError, match="for 'adam', not 'rmsprop'"):
        optim.RMSprop().setup(fake_model()).load_state_dict(sd)
    with pytest.raises(ValueError, match="must be"):
        opt.load_state_dict({**sd, "arrays": {"m": sd["arrays"]["m"]}})
    with pytest.raises(ValueError, match="has 3 values"):
        opt.load_state_dict({**sd, "arrays": {"m": np.zeros(3), "v": np.zeros(3)}})


def test_get_and_config():
    assert isinstance(optim.get("momentum", lr=0.1, nesterov=True), optim.Momentum)
    with pytest.raises(ValueError, match=r"unknown optimizer 'adagrad'.*sgd, momentum, adam, adamw, lion, rmsprop"):
        optim.get("adagrad", lr=0.1)
    opt = optim.RMSprop(schedule=schedules.cosine(10))
    assert opt.config() == {"lr": 0.01, "weight_decay": 0.0, "rho": 0.99, "eps": 1e-8,
                            "schedule": {"name": "cosine", "total_steps": 10, "min_lr": 0.0}}
    assert optim.get("rmsprop", **json.loads(json.dumps(opt.config()))).config() == opt.config()
    assert optim.Adam().config()["lr"] == 1e-3
    with pytest.raises(ValueError):
        optim.SGD(-1.0)
    with pytest.raises(RuntimeError, match="before setup"):
        optim.SGD(0.1).step()


def test_setup_again_keeps_state():
    model = fake_model()
    opt = optim.Momentum(0.1).setup(model)
    model.grads[...] = 1.0
    opt.step()
    v = opt.state["v"]
    assert opt.setup(model).state["v"] is v and opt.t == 1        # same buffers: nothing moves
    model.flat, model.grads = model.flat.copy(), model.grads.copy()   # as model.to(device) does
    opt.setup(model)
    assert opt.state["v"] is not v and opt.t == 1 and opt.flat is model.flat
    np.testing.assert_array_equal(opt.state["v"], v)
    opt.setup(fake_model())                                        # another model: fresh state
    assert opt.t == 0 and not opt.state["v"].any()


@pytest.mark.parametrize("case", ["sgd_wd", "nesterov_wd", "adam_wd", "rmsprop_wd"])
def test_float32_buffers_stay_float32(case):
    model = fake_model()
    model.flat, model.grads = model.flat.astype(np.float32), np.ones(model.flat.size, np.float32)
    opt = CASES[case][0]().setup(model)
    opt.step()
    assert model.flat.dtype == np.float32 and all(a.dtype == np.float32 for a in opt.state.values())


def test_a_tabulated_schedule_follows_lr_changes_in_place():
    from minidl import layers as L
    x = L.Input((3,))
    model = dl.Model(x, L.Dense(2)(x))
    opt = optim.SGD(0.5, schedule=schedules.cosine(4)).setup(model)
    opt.step()
    table = opt._lr_table
    opt.lr = 0.25                                   # a captured step keeps reading the same table
    opt.step()
    assert opt._lr_table is table and float(table[2]) == pytest.approx(schedules.cosine(4)(0.25, 1))
    for _ in range(5):                              # past the horizon: the last value
        opt.step()
    assert opt.current_lr == pytest.approx(0.0, abs=1e-12)


def test_a_constant_schedule_is_lr_itself_with_no_step_arithmetic(monkeypatch):
    """t - 1 is one launch a captured step on the GPU: a schedule that reads no step gets none, and lr
    is the device's own 0-d array (a captured step reads what the optimizer last wrote there)."""
    from minidl import layers as L
    x = L.Input((3,))
    model = dl.Model(x, L.Dense(2)(x))
    opt = optim.SGD(0.5).setup(model)
    called = []
    monkeypatch.setattr(np, "subtract", lambda *a, **k: called.append(a))
    lr = opt._lr_at()(opt._lr_dev, opt._t_dev)
    assert lr is opt._lr_dev and called == []
    monkeypatch.undo()
    opt.lr = 0.25                                   # a later lr is read from the same array
    opt.step()
    assert opt.current_lr == 0.25 and float(opt._lr_at()(opt._lr_dev, opt._t_dev)) == 0.25
    assert schedules.constant().reads_step is False and getattr(schedules.cosine(4), "reads_step", True)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("scale", [0.5, 1 / 3])
def test_grad_scale_is_the_update_of_the_scaled_gradient(case, scale):
    """Data-parallel ranks fold 1/N into the update: grad_scale s on g is g*s, and g is left as it was."""
    a, b = fake_model(), fake_model()
    for m in (a, b):
        m.flat, m.grads = m.flat.astype(np.float32), m.grads.astype(np.float32)
    scaled, plain = CASES[case][0]().setup(a, grad_scale=scale), CASES[case][0]().setup(b)
    assert scaled.grad_scale == scale and plain.grad_scale == 1.0
    for g in (np.random.default_rng(t).standard_normal(a.flat.size).astype(np.float32) for t in range(STEPS)):
        a.grads[...], b.grads[...] = g, g * np.float32(scale)
        scaled.step()
        plain.step()
        np.testing.assert_array_equal(a.flat, b.flat)
        np.testing.assert_array_equal(a.grads, g)
    assert all(np.array_equal(scaled.state[k], plain.state[k]) for k in scaled.state)


def test_a_grad_scale_of_one_multiplies_nothing():
    """One process: scale 1 hands the rule the gradient arena itself, so the update rounds as it always did."""
    seen = []

    class Spy(optim.SGD, register=False):
        def rule(self, xp, p, g, state, lr, t):
            seen.append(g)
            return super().rule(xp, p, g, state, lr, t)
    model = fake_model()
    model.grads[...] = np.random.default_rng(2).standard_normal(model.flat.size)
    Spy(0.1).setup(model).step()
    Spy(0.1).setup(model, grad_scale=0.25).step()
    p = model.flat.copy()
    Spy(0.1, weight_decay=0.01).setup(model).step()
    assert seen[0] is model.grads
    np.testing.assert_array_equal(seen[1], model.grads * 0.25)
    np.testing.assert_array_equal(seen[2], model.grads + 0.01 * p)         # coupled decay: g + wd p


# -- every registered optimizer: what the base promises around its rule ------------------------------
FIRST_CASE = {}
for _case, (_make, _, _) in CASES.items():
    FIRST_CASE.setdefault(_make().name, _case)
REGISTERED = sorted(optim.OPTIMIZERS)


def controlled(name, **kw):
    """The registered optimizer `name` at its default lr with every control on (decoupled decay, clipping)."""
    return optim.get(name, lr=optim.OPTIMIZERS[name].default_lr, weight_decay=0.05, decoupled_weight_decay=True,
                     clip_norm=1.0, clip_value=0.5, **kw)


@pytest.mark.parametrize("name", REGISTERED)
@pytest.mark.parametrize("controls", [False, True])
def test_a_closed_gate_changes_nothing(name, controls):
    """The trainer's NaN guard: gate False leaves weights, state and t as they were (NaN gradients too)."""
    model = fake_model()
    opt = (controlled(name) if controls else optim.get(name, lr=optim.OPTIMIZERS[name].default_lr)).setup(model)
    model.grads[...] = np.random.default_rng(3).standard_normal(model.flat.size)
    opt.step()
    before = model.flat.copy(), {k: a.copy() for k, a in opt.state.items()}
    model.grads[::7] = np.nan
    opt.step(gate=np.asarray(False))
    assert opt.t == 1 and np.array_equal(model.flat, before[0])
    assert all(np.array_equal(a, before[1][k]) for k, a in opt.state.items())
    model.grads[...] = 1.0
    opt.step(gate=np.asarray(True))
    assert opt.t == 2 and not np.array_equal(model.flat, before[0])


class HostRead(AssertionError):
    pass


class Device0(np.ndarray):
    """NumPy arrays standing in for device ones: whatever reads a value to the host raises, as a captured
    CUDA graph cannot (no `if array`, float(), .item())."""
    def __array_wrap__(self, arr, context=None, return_scalar=False):
        return np.asarray(arr).view(Device0)          # 0-d results stay arrays, so their reads are caught too

    def _read(self, *a, **k):
        raise HostRead("a host read inside the update")
    __bool__ = __float__ = __int__ = __index__ = item = tolist = _read


@pytest.mark.parametrize("name", REGISTERED)
@pytest.mark.parametrize("controls", [False, True])
def test_every_rule_is_capture_safe_it_reads_nothing_to_the_host(name, controls):
    model = fake_model()
    opt = (controlled(name) if controls else optim.get(name, lr=0.01)).setup(model)
    assert opt._fused is None                          # the CPU runs every rule (its kernels declare no FUSED)
    opt.flat, opt.grads = model.flat.view(Device0), np.ones_like(model.flat).view(Device0)
    opt.state = {k: a.view(Device0) for k, a in opt.state.items()}
    if opt._controls.on:
        c = opt._controls
        c.lrs, c.wds = c.lrs.view(Device0), c.wds.view(Device0)
    ptrs = [a.ctypes.data for a in (model.flat, *opt.state.values())]
    p0 = model.flat.copy()
    with pytest.raises(HostRead):                     # the stand-in catches a read
        bool(opt.flat[:1] > 0)
    lr, t = np.asarray(0.01).view(Device0), np.asarray(3.0).view(Device0)
    opt.update(lr, t, np.asarray(True).view(Device0))
    assert not np.array_equal(model.flat, p0)          # it did update, in place
    assert [a.ctypes.data for a in (model.flat, *opt.state.values())] == ptrs


@pytest.mark.parametrize("name", REGISTERED)
def test_every_registered_optimizer_round_trips_its_state_and_keeps_float32(name):
    test_state_dict_round_trip_continues_identically(FIRST_CASE[name])
    test_float32_buffers_stay_float32(FIRST_CASE[name])


@pytest.mark.parametrize("case", [c for c in CASES if CASES[c][0]().fused])
def test_a_backends_fused_kernel_overrides_the_rule(case, monkeypatch):
    """Where the optim family lists an optimizer's kernel in FUSED, the optimizer calls it instead of its
    rule (the GPU's four), with the contract's arguments: here a kernel of that signature over a fresh
    optimizer's rule (tests/helpers/optim_rules.py), listed for the test, gives the formula."""
    from minidl.kernels.cpu import optim as cpu_optim
    from tests.helpers import optim_rules
    make, ref, kw = CASES[case]
    calls = []
    kernel = getattr(optim_rules, make().fused)
    monkeypatch.setattr(cpu_optim, "FUSED", (make().fused,))
    monkeypatch.setattr(cpu_optim, make().fused, lambda *a, **k: calls.append(1) or kernel(*a, **k), raising=False)
    opt = make()
    opt.rule = None                                    # the rule is not run
    run_both(opt, ref, kw)
    assert len(calls) == STEPS


def test_registering_an_optimizer():
    class Halve(optim.Optimizer):
        """p -= lr g / 2: a user's optimizer, registered by its name."""
        name, default_lr = "test-halve", 0.5

        def __init__(self, lr=0.5, weight_decay=0.0, schedule=None, **controls):
            super().__init__(lr, weight_decay, schedule, **controls)

        def rule(self, xp, p, g, state, lr, t):
            return xp.subtract(p, xp.multiply(xp.multiply(lr, g), 0.5))
    try:
        assert optim.OPTIMIZERS["test-halve"] is Halve and optim.get("test-halve").lr == 0.5
        model = fake_model()
        model.grads[...] = 1.0
        p0 = model.flat.copy()
        optim.get("test-halve").setup(model).step()
        np.testing.assert_allclose(model.flat, p0 - 0.25)
        with pytest.raises(TypeError, match=r"name 'test-halve' is .*Halve's; give another name, or register=False"):
            type("Other", (optim.Optimizer,), {"name": "test-halve", "default_lr": 0.1})
        with pytest.raises(TypeError, match=r"optimizer NoLr: a registered optimizer declares default_lr"):
            type("NoLr", (optim.Optimizer,), {"name": "test-nolr"})

        class Private(optim.SGD, register=False):
            name = "test-private"
        assert "test-private" not in optim.OPTIMIZERS and "test-nolr" not in optim.OPTIMIZERS
    finally:
        optim.OPTIMIZERS.pop("test-halve", None)
