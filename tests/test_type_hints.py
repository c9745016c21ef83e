"""Type hints on every public function and class of minidl (issue 29), and mypy passing on the package.

Public: a function or method whose name does not start with `_`, in a module and class whose names
do not either; `__init__` counts as public for its parameters (its return is None by definition).
"""
import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PKG = ROOT / "minidl"


def _public_module(path):
    return not any(part.startswith("_") and part != "__init__.py" for part in path.relative_to(PKG).parts)


def _missing(fn):
    """What `fn` lacks: unannotated parameters (self/cls excepted) and, but for __init__, the return."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    if positional and positional[0].arg in ("self", "cls"):
        positional = positional[1:]
    params = [*positional, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
    out = [p.arg for p in params if p.annotation is None]
    if fn.returns is None and fn.name != "__init__":
        out.append("return")
    return out


def _offenders(tree, prefix=""):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name.startswith("_") and node.name != "__init__":
                continue
            missing = _missing(node)
            if missing:
                yield f"{prefix}{node.name} ({node.lineno}): {', '.join(missing)}"
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            yield from _offenders(node, f"{prefix}{node.name}.")


def test_every_public_function_has_type_hints():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if _public_module(path):
            rel = path.relative_to(ROOT).as_posix()
            offenders += [f"{rel}: {o}" for o in _offenders(ast.parse(path.read_text()))]
    assert not offenders, f"{len(offenders)} public definitions without full hints:\n" + "\n".join(offenders)


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the test extra has it)")
def test_mypy_passes_on_the_package():
    # the settings are pyproject.toml's [tool.mypy]; the cache stays out of the checkout's way in build/
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / "build" / ".mypy_cache")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
