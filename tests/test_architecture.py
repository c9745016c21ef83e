"""The structure docs/architecture.md promises: no import circle, GPU libraries named in the GPU
kernels and the cuda backend only, backends that are plug-ins (no switch on a device's name), GPU
kernels that do not lean on the CPU's, layers that reach kernels through the device only, files that
read in one sitting."""
import ast
import io
import pathlib
import re
import tokenize

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "minidl"


def _module(path, pkg=PKG):
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_only(tree):
    """The import statements under `if TYPE_CHECKING:`: read by type checkers only, never run."""
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    return {id(m) for b in blocks for s in b.body for m in ast.walk(s)}


def _imports(path, pkg=PKG, hints=False):
    """Modules of `pkg` imported anywhere in the file (functions included), relative ones resolved;
    type-only imports (`if TYPE_CHECKING:`, for hints) only with `hints`: they never run, but a reader
    follows them as any other (an annotation names what the module knows of)."""
    mod = _module(path, pkg)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    skipped = set() if hints else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            stem = (base + "." + node.module if node.module else base) if node.level else node.module
            found.add(stem)
            found |= {f"{stem}.{a.name}" for a in node.names}
    files = {_module(p, pkg) for p in pkg.rglob("*.py")}
    return {m for m in found if m in files and m != mod}


def _module_graph(pkg=PKG, hints=False):
    """{module: the modules of `pkg` it imports} (with `hints`, its type-only imports too)."""
    return {_module(p, pkg): _imports(p, pkg, hints) for p in pkg.rglob("*.py")}


def _child_of(m, n):
    """A package's __init__ re-exports its children: the edge parent -> child is no dependency of the
    child on the parent, so the circle rules do not follow it."""
    return n.startswith(m + ".")


def _no_circle(graph, what, skip=lambda a, b: False):
    """Fail naming the first circle of `graph` ({node: nodes it depends on}), found depth first; an edge
    a -> b that skip(a, b) names is not followed."""
    state, stack = {}, []

    def visit(a):
        state[a] = "open"
        stack.append(a)
        for b in sorted(graph.get(a, ())):
            if skip(a, b):
                continue
            if state.get(b) == "open":
                pytest.fail(f"{what}: " + " -> ".join(stack[stack.index(b):] + [b]))
            if b not in state:
                visit(b)
        stack.pop()
        state[a] = "done"

    for a in sorted(graph):
        if a not in state:
            visit(a)


def _tangles(graph, skip=_child_of):
    """The sets of two or more modules of `graph` that all reach each other (its strongly connected
    components, Tarjan's): every circle lies inside one; frozensets, so they compare as sets."""
    index, low, stack, out = {}, {}, [], set()

    def visit(a):
        index[a] = low[a] = len(index)
        stack.append(a)
        for b in graph.get(a, ()):
            if skip(a, b) or b not in graph:
                continue
            if b not in index:
                visit(b)
                low[a] = min(low[a], low[b])
            elif b in stack:
                low[a] = min(low[a], index[b])
        if low[a] == index[a]:
            part = set()
            while True:
                b = stack.pop()
                part.add(b)
                if b == a:
                    break
            if len(part) > 1:
                out.add(frozenset(part))

    for a in sorted(graph):
        if a not in index:
            visit(a)
    return out


def test_no_import_circle_in_the_package():
    """No circle of imports that run (at a module's top or inside a function): what an import runs, runs
    one way."""
    _no_circle(_module_graph(), "import circle", skip=_child_of)


# The circles a reader still meets when type-only imports count (a module that names another in an
# annotation knows of it): the ones left, each with why. A new one fails; one that goes must leave here.
KNOWN_TANGLES = {
    frozenset({"minidl.layers.base", "minidl.layers.node"}):
        "layer(x) makes a Node, and a Node holds its Layer (typed): the two halves of one symbolic call",
}


def test_no_new_circle_even_through_type_only_imports():
    found = _tangles(_module_graph(hints=True))
    new = [" <-> ".join(sorted(t)) for t in found - set(KNOWN_TANGLES)]
    gone = [" <-> ".join(sorted(t)) for t in set(KNOWN_TANGLES) - found]
    assert not new, f"modules that import each other (type-only imports counted): {new}"
    assert not gone, f"no longer a circle: strike it from KNOWN_TANGLES: {gone}"


def test_the_circle_rules_find_a_circle(tmp_path):
    """The two rules above on a package made to hold circles: a runtime pair, a pair tied inside a
    function, a pair tied by a type-only import, and a one-way pair that is none."""
    pkg = tmp_path / "cyclic"
    pkg.mkdir()
    files = {"__init__.py": "from . import a\n",
             "a.py": "from . import b\n", "b.py": "from .a import X\n",
             "f.py": "def g():\n    from . import h\n", "h.py": "from . import f\n",
             "c.py": "from .d import Y\n",
             "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import Z\n",
             "e.py": "from .c import Z\n"}
    for name, text in files.items():
        (pkg / name).write_text(text)
    with pytest.raises(pytest.fail.Exception, match=r"cyclic\.a -> cyclic\.b -> cyclic\.a"):
        _no_circle(_module_graph(pkg), "import circle", skip=_child_of)
    runs = _tangles(_module_graph(pkg))
    assert runs == {frozenset({"cyclic.a", "cyclic.b"}), frozenset({"cyclic.f", "cyclic.h"})}
    read = _tangles(_module_graph(pkg, hints=True))
    assert read == runs | {frozenset({"cyclic.c", "cyclic.d"})}
    (pkg / "b.py").write_text("X = 1\n")                    # the pair made one way: no circle left there
    assert frozenset({"cyclic.a", "cyclic.b"}) not in _tangles(_module_graph(pkg, hints=True))


def test_cupy_and_cudnn_are_named_only_in_kernels_gpu_and_the_cuda_backend():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel.startswith("kernels/gpu/") or rel == "backends/cuda.py":
            continue
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        mods = _imports_raw(path)
        assert not {"cupy", "cudnn", "cp"} & (names | mods), rel


def _imports_raw(path):
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and "gpu" in node.module.split("."):
            out.add("cupy")                  # a relative import of kernels.gpu from outside it
    return out


def _backend_names():
    from minidl import backends
    return {a for n in backends.names() for a in (n, *backends.find(n).aliases)}


def _names_compared(tree):
    """Each comparison with a backend's name ("cpu", "cuda", "gpu"): a switch on a device's name."""
    out, names = [], _backend_names()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value in names for s in sides):
                out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def test_devices_delegate_to_their_backend_and_switch_on_no_name():
    """backend.py and minidl/backends/ never ask which backend they are (`self.name == "cuda"`), and
    Device never asks an array's type: a backend answers, and an array finds its backend in the registry."""
    for path in [PKG / "backend.py", *sorted((PKG / "backends").glob("*.py"))]:
        tree = ast.parse(path.read_text())
        assert not _names_compared(tree), (path.name, _names_compared(tree))
    device = ast.parse((PKG / "backend.py").read_text())
    typed = [ast.unparse(n) for n in ast.walk(device) if isinstance(n, ast.Call) and getattr(n.func, "id", "") ==
             "isinstance" and "Device" not in ast.unparse(n.args[1])]
    assert not typed, typed
    assert _names_compared(ast.parse('if self.name == "cuda": pass'))
    assert _names_compared(ast.parse('x = spec != "cpu"'))


# The one GPU module that reads the CPU's kernels, inside a function and why: cuDNN's float64
# convolutions are checked once per GPU against the CPU's float64 reference before a model is built.
GPU_READS_CPU = {"kernels/gpu/conv.py": "_try_float64"}


def test_gpu_kernels_import_no_cpu_kernels():
    """Shape maths both need lives in kernels/shapes.py (and padding.py); a kernels/gpu module imports
    kernels/cpu nowhere, but for GPU_READS_CPU's function."""
    for path in sorted((PKG / "kernels" / "gpu").glob("*.py")):
        rel, tree = path.relative_to(PKG).as_posix(), ast.parse(path.read_text())
        allowed = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == GPU_READS_CPU.get(rel)]
        exempt = {id(m) for f in allowed for m in ast.walk(f)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and id(node) not in exempt:
                module = ("." * node.level) + (node.module or "")
                assert not (module.startswith("..cpu") or "kernels.cpu" in module), (rel, node.lineno, module)
            elif isinstance(node, ast.Import):
                assert not any("kernels.cpu" in a.name for a in node.names), (rel, node.lineno)


def test_benchmarks_import_nothing_from_the_tests():
    """The tools run one way: tests -> benchmarks -> minidl. A helper both need lives in benchmarks/
    (graph_nodes, old_step_ops) or in minidl.testing (randomize_weights), never in tests/."""
    found = [f"{path.name}:{node.lineno}" for path in sorted((PKG.parent / "benchmarks").glob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests")
             or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tests" for a in node.names))]
    assert not found, found


def test_layers_import_no_kernels():
    """A layer reaches kernels through device.kernels only (Layer.kernel_families)."""
    for path in sorted((PKG / "layers").glob("*.py")):
        found = sorted(m for m in _imports(path) if m.startswith("minidl.kernels"))
        assert not found, (path.name, found)


def test_files_read_in_one_sitting():
    long = {p.relative_to(PKG).as_posix(): n for p in PKG.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 310}      # ~300: a file read in one sitting
    assert not long, long


_DATE = re.compile(r"20\d\d-\d\d-\d\d")
_GPU, _TIME = r"\b(?:H100|H200|A100)\b", r"\d\s?(?:us|µs|ms|s|GB/s|TFLOPS)\b"
_GPU_TIMING = re.compile(rf"{_GPU}.{{0,160}}?{_TIME}|{_TIME}.{{0,160}}?{_GPU}", re.S)


def _prose(path):
    """(line, text) of every docstring and comment block (comments on consecutive lines) in the file."""
    text = path.read_text()
    out: list[tuple[int, str]] = []
    for t in tokenize.generate_tokens(io.StringIO(text).readline):
        if t.type == tokenize.COMMENT:
            if out and out[-1][0] + out[-1][1].count("\n") == t.start[0] - 1:
                out[-1] = (out[-1][0], out[-1][1] + "\n" + t.string)
            else:
                out.append((t.start[0], t.string))
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def test_no_measurements_with_dates_or_gpus_in_docstrings_and_comments():
    # Docstrings say what and why; a figure with its device and date goes to docs/results.md or
    # docs/kernels.md (Notes from the code). No allow-list.
    assert _GPU_TIMING.search("3x slower (H200: an add of 12.8 MB, 69 us strided)")
    assert _GPU_TIMING.search("0.44 s on the H200\nmachine") and _DATE.search("(2026-11-24)")
    found = [f"{p.relative_to(PKG).as_posix()}:{line}: {m.group(0)!r}" for p in sorted(PKG.rglob("*.py"))
             for line, s in _prose(p) for m in [_DATE.search(s) or _GPU_TIMING.search(s)] if m]
    assert not found, "\n".join(found)


# The folders (docs/architecture.md, The rooms): the top level of minidl/ holds the ground every room
# stands on and the doors of `python -m minidl.<command>`; every other room is a folder.
ABOVE_THE_GROUND = {"layers", "graph", "optim", "data", "models", "distributed", "files", "checkpoint", "training",
                    "inference", "cli"}


def _unit(module):
    """The room of minidl/'s top level a module counts in: its folder, or itself beside the folders."""
    return module.split(".")[1]


def test_the_one_writer_imports_no_other_room():
    """minidl.files (the writes, their locks, the kinds of file, the metrics logs) imports no other room (the
    ground only), so every room may import it, the kernels' caches and the datasets' downloads too; the
    checkpoints, which read models, are a room of their own (minidl/checkpoint/)."""
    for path in sorted((PKG / "files").glob("*.py")):
        outside = {m for m in _imports(path) if m != "minidl"      # "minidl": `from .. import files`
                   and _unit(m) in ABOVE_THE_GROUND - {"files"}}
        assert not outside, (path.name, sorted(outside))


def test_no_two_folders_import_each_other():
    graph = {}
    for p in PKG.rglob("*.py"):
        if _module(p) != "minidl":            # the package's face imports what it hands on
            graph.setdefault(_unit(_module(p)), set()).update(
                _unit(n) for n in _imports(p) if n != "minidl" and _unit(n) != _unit(_module(p)))
    _no_circle(graph, "folders in a circle")


def test_the_top_level_holds_the_ground_and_the_doors():
    from minidl import cli
    for name in cli.COMMANDS:
        assert (PKG / "cli" / f"{name}.py").is_file(), f"the command {name} lives in minidl/cli/"
    for p in sorted(PKG.glob("*.py")):
        if p.stem in ("__init__", "__main__"):
            continue
        if p.stem in cli.COMMANDS:            # a door: runs minidl.cli.<command>.main, nothing else
            assert _imports(p) == {f"minidl.cli.{p.stem}"} and len(p.read_text().splitlines()) <= 10, p.name
        else:
            above = {_unit(n) for n in _imports(p) if n != "minidl"} & ABOVE_THE_GROUND
            assert not above, f"{p.name} stands on the ground floor but imports {sorted(above)}: give it a folder"
