"""The typed path from a layer to its kernel (issue 40): `device.kernels` is a `Kernels`
(minidl/kernels/families.py) whose fields are the contract's Protocols, and a layer's kernel attributes are
annotated with them, so mypy follows `layer.kern.conv2d_fprop` and `device.kernels.conv.conv2d_fprop` to
`Conv.conv2d_fprop`. The first test asks mypy itself, and fails if either falls back to Any."""
import importlib.util
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import minidl as dl
from minidl import layers as L
from minidl.backend import Device
from minidl.kernels.families import FAMILIES, KERNEL_FAMILIES, Kernels
from minidl.layers import registry

ROOT = pathlib.Path(__file__).resolve().parents[1]

SNIPPET = """
import numpy as np
from minidl import layers as L
from minidl.backend import Device, kernels_for

dev = Device("cpu")
reveal_type(dev.kernels)
reveal_type(dev.kernels.conv)
reveal_type(dev.kernels.direct)
reveal_type(kernels_for(np.zeros(2)).softmax)
reveal_type(L.Conv2D(4, 3).kern)
reveal_type(L.Dense(4).kern)
dev.kernels.conv.conv2d_fprop(None, 1)
"""
REVEALED = ["minidl.kernels.families.Kernels", "minidl.kernels.contract.Conv",
            "minidl.kernels.contract.Direct | None", "minidl.kernels.contract.Softmax",
            "minidl.kernels.contract.Conv", "minidl.kernels.contract.Dense"]


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the test extra has it)")
def test_mypy_sees_the_contracts_protocols_through_device_kernels_and_the_layers(tmp_path):
    (tmp_path / "snippet.py").write_text(SNIPPET)
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / "build" / ".mypy_cache"),
                        "--follow-imports=silent", str(tmp_path / "snippet.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    revealed = re.findall(r'Revealed type is "(.*)"', r.stdout)
    assert revealed == REVEALED, r.stdout[-3000:] + r.stderr[-1000:]
    # a call against the contract is refused: the checker reads Conv.conv2d_fprop's signature
    errors = [line for line in r.stdout.splitlines() if ": error:" in line]
    assert errors and all('"conv2d_fprop" of "Conv"' in e for e in errors), r.stdout[-3000:]


def _kernel_fields(cls):
    """{attribute: family} a layer class declares (`kern: contract.Conv`), from its annotations (strings)."""
    by_protocol = {f.protocol.__name__: name for name, f in FAMILIES.items()}
    out = {}
    for klass in reversed(cls.__mro__):
        for attr, hint in vars(klass).get("__annotations__", {}).items():
            if m := re.fullmatch(r"contract\.(\w+)(?: \| None)?", str(hint)):
                out[attr] = by_protocol[m.group(1)]
    return out


def _every_kernel_layer(device):
    x = L.Input((3, 8, 8))
    h = L.Conv2D(4, 3, padding=1)(L.Normalize((0.5, 0.4, 0.3), (0.2, 0.2, 0.2))(x))
    h = L.Pad2D(1)(L.LRN(3)(L.BatchNorm2D()(h)))
    a, b = L.MaxPool2D(2)(h), L.AvgPool2D(2)(h)
    h = L.GlobalAvgPool2D()(L.Add()(a, b))
    y = L.Softmax()(L.Dropout(0.2)(L.Dense(5)(L.Flatten()(h))))
    return dl.Model(x, y, device=device)


def test_each_layers_annotated_kernels_are_the_families_it_binds():
    """The annotation a checker reads is what build binds: `kern: contract.Pool` holds device.kernels.pool, and
    every family a layer keeps is annotated. Every layer class that declares kernels is built here, so a new
    one fails until it is covered."""
    dev = Device("cpu")
    model = _every_kernel_layer(dev)
    seen, families = set(), {id(getattr(dev.kernels, n)) for n in KERNEL_FAMILIES}
    for layer in model.layers:
        fields, name = _kernel_fields(type(layer)), type(layer).__name__
        held = {a for a, v in vars(layer).items() if id(v) in families}      # a family kept: annotated
        assert held <= set(fields), (name, held - set(fields))
        for attr, family in fields.items():
            assert getattr(layer, attr) is getattr(dev.kernels, family), (name, attr, family)
            seen.add(type(layer))
    declaring = {c for c in map(L.__dict__.get, registry.defined_in("minidl.layers")) if _kernel_fields(c)}
    assert declaring and declaring <= seen, sorted(c.__name__ for c in declaring - seen)
    assert _kernel_fields(L.Conv2D) == {"kern": "conv", "dense": "dense", "act": "activation", "merge": "merge"}


def test_kernels_hold_every_required_family_and_none_for_a_missing_optional_one():
    dev = Device("cpu")
    assert FAMILIES["direct"].optional and FAMILIES["direct"].protocol.__name__ == "Direct"
    assert [n for n in KERNEL_FAMILIES if FAMILIES[n].optional] == ["direct"]
    assert "collectives" in FAMILIES and "collectives" not in KERNEL_FAMILIES    # loaded on demand
    without = Kernels(**{n: getattr(dev.kernels, n) for n in KERNEL_FAMILIES if n != "direct"})
    assert without.direct is None and without.conv is dev.kernels.conv
    dev.kernels = without
    assert not dev.has("direct") and dev.has("conv")
    with pytest.raises(TypeError, match=r"^kernel families: no dense, softmax; unknown tpu \(minidl/kernels/"):
        Kernels(**{n: getattr(without, n) for n in KERNEL_FAMILIES if n not in ("dense", "softmax")}, tpu=np)
