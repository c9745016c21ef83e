"""The GPU update kernels' controlled twins (kernels/gpu/optim.py: frozen elements, per-element lr and
decay, clipping, decoupled decay), checked without a GPU: each generated kernel body is compiled as
C++ over float (the CUDA source is C++ with T = float) and run against the optimizers' own rules
(tests/helpers/optim_rules.py). The device itself runs them in tests/gpu/test_training_controls.py."""
import ast
import ctypes
import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from minidl.kernels.contract import Controls
from tests.helpers import optim_rules as rules

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = (ROOT / "minidl" / "kernels" / "gpu" / "optim.py").read_text()
ARRAYS = {"g", "lrs", "wds"}              # per element; every other input is a scalar


def _controlled_bodies():
    """{update: (params, outs, body)} of the controlled twins, built by the module's own _controlled."""
    ns = {"re": re}
    fn = next(n for n in ast.parse(SRC).body if isinstance(n, ast.FunctionDef) and n.name == "_controlled")
    exec(compile(ast.Module([fn], []), "optim.py", "exec"), ns)
    out = {}
    for name in ("sgd", "momentum", "adam", "rmsprop"):
        call = re.search(rf"_{name} = _kernels\((.*?)\"minidl_{name}\"\)", SRC, re.S).group(1)
        params, outs, body = ast.literal_eval("(" + call + ")")[:3]
        lr = "lr_" if "lr_" in params else "lr"
        out[name] = (params + ", T lrs, T wds, float64 gmul, T clip, bool dec", outs, ns["_controlled"](body, lr))
    return out


def _compile(tmp_path):
    code = ["#include <cmath>\n#include <algorithm>\nusing std::min; using std::max; using std::sqrt; using std::pow;"
            "\ntypedef float T;"]
    for name, (params, outs, body) in _controlled_bodies().items():
        args, pre = ["int n"], []
        for ty, nm in (p.split() for p in params.split(",")):
            if nm in ARRAYS:
                args.append(f"const float* {nm}_a")
                pre.append(f"T {nm} = {nm}_a[i];")
            else:
                args.append({"T": "float", "float64": "double", "bool": "bool"}[ty] + f" {nm}")
        for nm in (p.split()[1] for p in outs.split(",")):
            args.append(f"float* {nm}_a")
            pre.append(f"T& {nm} = {nm}_a[i];")
        # a lambda per element: the body's `return` leaves that element, as in the CUDA loop
        code.append(f'extern "C" void {name}({", ".join(args)}) {{ for (int i = 0; i < n; i++) {{ '
                    f'{" ".join(pre)} [&]() {{ {body}; }}(); }} }}')
    (tmp_path / "k.cpp").write_text("\n".join(code))
    subprocess.run([shutil.which("g++"), "-O1", "-shared", "-fPIC", "-o", str(tmp_path / "k.so"),
                    str(tmp_path / "k.cpp")], check=True, capture_output=True)
    return ctypes.CDLL(str(tmp_path / "k.so"))


F, D, B = ctypes.c_float, ctypes.c_double, ctypes.c_bool
HYPER = {"sgd": (0, lambda t: dict(wd=0.01), lambda t: [F(0.01), B(True)]),
         "momentum": (1, lambda t: dict(mu=0.9, wd=0.01, nesterov=True), lambda t: [F(0.9), F(0.01), B(True), B(True)]),
         "adam": (2, lambda t: dict(b1=0.9, b2=0.999, eps=1e-8, wd=0.01, t=t),
                  lambda t: [F(0.9), F(0.999), F(1e-8), F(0.01), D(t), B(True)]),
         "rmsprop": (1, lambda t: dict(rho=0.99, eps=1e-8, wd=0.01), lambda t: [F(0.99), F(1e-8), F(0.01), B(True)])}


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_the_controlled_cuda_bodies_compute_what_the_rules_do(tmp_path):
    lib, rng, P = _compile(tmp_path), np.random.default_rng(0), 1001
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)      # noqa: E731
    for name, (slots, cpu_kw, c_args) in HYPER.items():
        for decoupled in (False, True):
            lrs = rng.choice([0.0, 1.0, 0.1], P).astype(np.float32)      # a third frozen
            wds = rng.choice([0.0, 0.05], P).astype(np.float32)
            p0 = rng.standard_normal(P).astype(np.float32)
            ref = [p0.copy()] + [np.abs(rng.standard_normal(P)).astype(np.float32) for _ in range(slots)]
            got = [a.copy() for a in ref]
            for t in range(1, 5):
                g = (3 * rng.standard_normal(P)).astype(np.float32)
                getattr(rules, f"{name}_update")(ref[0], g, *ref[1:], 0.01, **cpu_kw(t),
                                               ctl=Controls(lrs, wds, np.float64(0.37), 0.4, decoupled))
                getattr(lib, f"{name}")(ctypes.c_int(P), ptr(g), D(0.01), *c_args(t), ptr(lrs), ptr(wds), D(0.37),
                                        F(0.4), B(decoupled), *[ptr(a) for a in got])
            frozen = lrs == 0
            for r, a in zip(ref, got):
                np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-6, err_msg=f"{name} decoupled={decoupled}")
                assert np.array_equal(a[frozen], r[frozen])
            assert np.array_equal(got[0][frozen], p0[frozen]) and not np.array_equal(got[0], p0)
