"""Every backend's kernel families implement the written contract (minidl/kernels/contract.py): the
same function names with the same parameters (names, order, kinds, defaults) on the CPU and the GPU.

The GPU modules cannot be imported without CuPy, so they are read from their source (ast): a
family's functions are those its module defines or imports (followed through sibling modules and
kernels/shapes.py to their definition). The CPU modules are imported and compared by
inspect.signature, and so are the GPU's where CuPy is installed.
"""
import ast
import importlib
import inspect
import json
import pathlib
import subprocess
import sys

import pytest

from minidl.kernels.families import FAMILIES, HOOKS, KERNEL_FAMILIES

KERNELS = pathlib.Path(__file__).resolve().parents[1] / "minidl" / "kernels"
BACKENDS = ("cpu", "gpu")
_KIND = {"posonlyargs": inspect.Parameter.POSITIONAL_ONLY, "args": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "kwonlyargs": inspect.Parameter.KEYWORD_ONLY}
_EMPTY = "<none>"


def _norm(value):
    """A default as source text, the same whether read by ast or by inspect."""
    return _EMPTY if value is inspect.Parameter.empty else ast.unparse(ast.parse(repr(value), mode="eval"))


def _from_signature(fn, drop_self=False):
    params = list(inspect.signature(fn).parameters.values())[1 if drop_self else 0:]
    return tuple((p.name, p.kind, _norm(p.default)) for p in params)


def _from_ast(node):
    a, out = node.args, []
    positional = [("posonlyargs", x) for x in a.posonlyargs] + [("args", x) for x in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for (kind, arg), d in zip(positional, defaults):
        out.append((arg.arg, _KIND[kind], _EMPTY if d is None else ast.unparse(d)))
    if a.vararg:
        out.append((a.vararg.arg, inspect.Parameter.VAR_POSITIONAL, _EMPTY))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, inspect.Parameter.KEYWORD_ONLY, _EMPTY if d is None else ast.unparse(d)))
    if a.kwarg:
        out.append((a.kwarg.arg, inspect.Parameter.VAR_KEYWORD, _EMPTY))
    out = [(n, k, d) if d == _EMPTY else (n, k, ast.unparse(ast.parse(d, mode="eval"))) for n, k, d in out]
    return tuple(out[1:] if out and out[0][0] == "self" else out)


def contract(family):
    """{function: parameters} of the family's Protocol (methods without self)."""
    proto = FAMILIES[family].protocol
    return {n: _from_signature(f, drop_self=True) for n, f in vars(proto).items()
            if inspect.isfunction(f) and not n.startswith("_")}


# -- the GPU's (and CPU's) source, read without importing ------------------------------------------
def _source(path, module, level):
    """The file a relative ImportFrom in `path` names (a sibling at level 1, a parent's module above)."""
    base = path.parent
    for _ in range(level - 1):
        base = base.parent
    target = base / f"{module.replace('.', '/')}.py" if module else None
    return target if target is not None and target.exists() else None


def _resolve(path, name, seen=()):
    """The FunctionDef or ClassDef `name` means in file `path`, followed through imports; None for constants."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node, path
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level in (1, 2, 3):
            for alias in node.names:
                if (alias.asname or alias.name) == name and (src := _source(path, node.module, node.level)):
                    if (src, alias.name) not in seen:
                        return _resolve(src, alias.name, seen + ((src, alias.name),))
    return None


def _exported(path):
    """The names a family module offers: its __all__, or everything it defines or imports at top level."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value)), set(ast.literal_eval(node.value))
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.level for a in n.names}
    return sorted(defined | imported), defined


def read_family(backend, family):
    """({function: parameters} a backend's family offers, the names it must account for in the contract)."""
    path = KERNELS / backend / f"{family}.py"
    names, own = _exported(path)
    if family == "collectives":
        cls, where = _resolve(path, "Communicator")
        return _methods(cls, where), set()
    found = {}
    for name in names:
        hit = _resolve(path, name)
        if hit and isinstance(hit[0], ast.FunctionDef) and not name.startswith("_"):
            found[name] = _from_ast(hit[0])
    return found, {n for n in own if n in found}


def _methods(cls, path):
    """Public methods of a class, its bases in the same file included."""
    out = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and (hit := _resolve(path, base.id)) and isinstance(hit[0], ast.ClassDef):
            out.update(_methods(*hit))
    out.update({n.name: _from_ast(n) for n in cls.body
                if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")})
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_backends_family_implements_its_contract(backend, family):
    want, spec = contract(family), FAMILIES[family]
    path = KERNELS / backend / f"{family}.py"
    if not path.exists():
        assert spec.optional, f"{backend} has no {family} family, which the contract does not make optional"
        return
    got, own = read_family(backend, family)
    missing = set(want) - set(got) - set(spec.extras)
    assert not missing, f"kernels/{backend}/{family}.py lacks {sorted(missing)}"
    undeclared = own - set(want) - set(HOOKS)
    assert not undeclared, f"kernels/{backend}/{family}.py offers {sorted(undeclared)}, not in the contract"
    for name in set(want) & set(got):
        assert got[name] == want[name], f"kernels/{backend}/{family}.py: {name} differs from the contract"


def test_the_cpu_and_gpu_families_have_the_same_functions_and_signatures():
    for family in FAMILIES:
        (cpu, cpu_own), (gpu, gpu_own) = read_family("cpu", family), read_family("gpu", family)
        shared = (set(contract(family)) | cpu_own | gpu_own) - set(FAMILIES[family].extras) - set(HOOKS)
        assert {n: cpu.get(n) for n in shared} == {n: gpu.get(n) for n in shared}, family


def _imported_family(backend, family):
    module = importlib.import_module(f"minidl.kernels.{backend}.{family}")
    if family == "collectives":
        cls = module.Communicator
        return {n: _from_signature(f, drop_self=True) for n, f in inspect.getmembers(cls, inspect.isfunction)
                if not n.startswith("_")}
    return {n: _from_signature(getattr(module, n)) for n in contract(family) if hasattr(module, n)}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_imported_cpu_families_match_the_contract_by_signature(family):
    if family == "collectives":
        pytest.importorskip("mpi4py")
    got, want = _imported_family("cpu", family), contract(family)
    assert set(want) - set(got) <= set(FAMILIES[family].extras)
    assert {n: got[n] for n in got} == {n: want[n] for n in got}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_imported_gpu_families_match_the_contract_by_signature(family):
    pytest.importorskip("cupy")
    pytest.importorskip("cudnn")
    got, want = _imported_family("gpu", family), contract(family)
    assert set(want) - set(got) <= set(FAMILIES[family].extras)
    assert {n: got[n] for n in got} == {n: want[n] for n in got}


_STAND_IN = """
import json, pkgutil, sys
from unittest import mock
for name in ("cupy", "cupy.cuda", "cupy.cuda.nccl", "cupy.cublas", "cudnn"):
    sys.modules[name] = mock.MagicMock(name=name)      # module-level calls return stand-ins
import minidl.kernels.gpu as gpu
sys.path.insert(0, sys.argv[1])
import test_kernel_contract as t
failed = {}
for m in pkgutil.iter_modules(gpu.__path__):
    try:
        __import__(f"minidl.kernels.gpu.{m.name}")
    except Exception as e:
        failed[m.name] = f"{type(e).__name__}: {e}"
sigs = {f: {n: [[p[0], int(p[1]), p[2]] for p in ps] for n, ps in t._imported_family("gpu", f).items()}
        for f in t.FAMILIES if f not in failed}
print(json.dumps({"failed": failed, "sigs": sigs}))
"""


def test_every_gpu_module_imports_and_matches_the_contract_with_a_stand_in_cupy():
    """Without a GPU: every kernels/gpu module imports with CuPy and cuDNN replaced by stand-ins (in a
    child process, so no other test sees them), which catches a name moved away from a GPU module, and
    its families' signatures, read by inspect, are the contract's."""
    run = subprocess.run([sys.executable, "-c", _STAND_IN, str(pathlib.Path(__file__).parent)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["failed"] == {}
    for family, got in out["sigs"].items():
        want = contract(family)
        assert set(want) - set(got) <= set(FAMILIES[family].extras), family
        assert {n: [list(p) for p in want[n]] for n in got} == {n: [[a, k, d] for a, k, d in ps] for n, ps in
                                                               got.items()}, family


def test_the_device_loads_the_contracts_families_and_declares_the_optional_ones():
    from minidl.backend import KERNEL_FAMILIES as loaded, Device
    assert loaded == KERNEL_FAMILIES and "collectives" not in loaded
    dev = Device("cpu")
    assert all(dev.has(f) for f in KERNEL_FAMILIES)
    assert not dev.has("conv", "conv2d_bias_relu_fprop")      # the GPU's extra: Conv2D asks, never probes
    assert dev.has("direct", "supported_chain") and not dev.has("tensor_cores")


def test_the_gpu_tests_reference_updates_take_the_contracts_arguments():
    """tests/helpers/optim_rules.py stands in the GPU tests for the fused updates (the CPU has none): each of
    its functions, the optimizer's rule behind it, takes the contract's arguments in the contract's order."""
    from tests.helpers import optim_rules
    extras = FAMILIES["optim"].extras
    assert extras and {n: _from_signature(getattr(optim_rules, n)) for n in extras} == {
        n: contract("optim")[n] for n in extras}
