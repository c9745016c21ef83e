"""The command lines' one argument module (issue 28, point 5): shared flags defined once in
minidl.cli.flags, choices taken from the library, no command importing another, check_args told
what it needs instead of guessing."""
import ast
import contextlib
import importlib
import math
import pathlib

import pytest

from minidl import cli, data, distributed, models, optim, precision
from minidl.cli import flags, recipes

PACKAGE = pathlib.Path(flags.__file__).resolve().parents[1]          # minidl/
COMMANDS = tuple(cli.COMMANDS)                     # train, infer, export, plot, warmup
PARSED = ("train", "infer", "warmup")             # the commands that take the shared flags
SHARED = ("device", "precision", "dataset", "data_dir", "threads", "checkpoint")


def parser_of(command):
    return importlib.import_module(f"minidl.cli.{command}").parser()


def actions(p):
    return {a.dest: a for a in p._actions}


@pytest.mark.parametrize("dest", SHARED)
def test_shared_flags_have_one_definition_in_train_infer_and_warmup(dest):
    found = [actions(parser_of(c))[dest] for c in PARSED]
    assert {tuple(a.option_strings) for a in found} == {(f"--{dest.replace('_', '-')}",)}
    assert len({None if a.choices is None else tuple(a.choices) for a in found}) == 1
    assert len({a.type for a in found}) == 1
    if dest in ("device", "threads"):                # same help and default everywhere
        assert len({(a.help, a.default) for a in found}) == 1
    if dest == "dataset":                            # infer's default is the checkpoint's own (issue 39.7)
        assert {a.default for a in found} == {"mnist", None}


def test_train_and_warmup_take_the_same_flags():
    train, warmup = (actions(parser_of(c)) for c in ("train", "warmup"))
    assert train.keys() == warmup.keys()
    for dest, a in train.items():
        b = warmup[dest]
        assert (a.option_strings, a.choices, a.default, a.type, a.help) == \
               (b.option_strings, b.choices, b.default, b.type, b.help), dest


def test_choices_are_the_librarys_lists():
    a = actions(parser_of("train"))
    assert tuple(a["optimizer"].choices) == tuple(optim.OPTIMIZERS)
    assert tuple(a["precision"].choices) == tuple(precision.NAMES)
    assert tuple(a["dataset"].choices) == data.DATASETS
    assert tuple(a["model"].choices) == models.names()
    assert tuple(a["depth"].choices) == tuple(models.RESNET_DEPTHS)
    assert tuple(a["grad_reduce"].choices) == distributed.GRAD_REDUCE
    assert tuple(a["schedule"].choices) == recipes.SCHEDULES
    assert tuple(a["device"].choices) == flags.DEVICES


def test_every_listed_choice_is_one_the_library_takes():
    from minidl.backend import DeviceError, get_device
    for name in precision.NAMES:
        assert precision.policy(name).name == name
    p = flags.training_parser()
    for name in recipes.SCHEDULES:                 # each builds a schedule over the run
        fn = recipes.plan(p.parse_args(["--schedule", name, "-n", "30"])).schedule_fn(optim.schedules, 10)
        assert math.isfinite(float(fn(0.1, 0)))
    for spec in flags.DEVICES:
        with contextlib.suppress(DeviceError):     # cuda without a usable GPU: a DeviceError, not "unknown"
            assert get_device(spec).name in ("cpu", "cuda")


def test_parser_notes_the_option_string_of_each_dest_groups_too():
    p = parser_of("train")
    assert p.options["batch_size"] == "-b" and p.options["depth"] == "-r" and p.options["lr"] == "--lr"
    assert p.options["tf32"] == "--tf32"            # a mutually exclusive group's flag
    q = parser_of("infer")
    assert q.options["checkpoint"] == "--checkpoint" and q.options["artifact"] == "--artifact"
    for parser in (p, q, parser_of("warmup")):      # each dest's first option string, as argparse lists them
        first = {}
        for a in parser._actions:
            if a.option_strings:
                first.setdefault(a.dest, a.option_strings[0])
        assert parser.options == first


def test_check_args_is_told_whether_the_command_trains(tmp_path, capsys):
    p = parser_of("infer")
    missing = str(tmp_path / "none.npz")
    with pytest.raises(SystemExit) as e:
        flags.check_args(p, p.parse_args(["--checkpoint", missing]), trains=False)
    assert e.value.code == 2
    assert f"argument --checkpoint: {missing} does not exist" in capsys.readouterr().err
    p = parser_of("train")                        # a training run writes the checkpoint: no read check
    assert flags.check_args(p, p.parse_args(["--checkpoint", missing])).checkpoint == missing


def test_check_args_reads_no_private_argparse_state_and_guesses_no_caller():
    src = (PACKAGE / "cli/flags.py").read_text()
    tree = ast.parse(src)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "_actions"]
    assert '"resume" in a' not in src and "'resume' in a" not in src


def _command(dotted):
    """minidl.train, minidl.cli.train and minidl.cli.train.x all name the command train."""
    parts = dotted.split(".")[1:]
    return parts[1] if parts[0] == "cli" and len(parts) > 1 else parts[0]


def _imported_modules(path):
    """The minidl modules `path` (a module of the package's top level) imports, by name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_command(a.name) for a in node.names if a.name.startswith("minidl.")}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 1 or module in ("minidl", "minidl.cli") or module.startswith("minidl."):
                base = _command(module) if module.startswith("minidl.") and module != "minidl.cli" else \
                    module.split(".")[0] if node.level == 1 and module else None
                found |= {base} if base else {a.name for a in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and str(arg.value).startswith("minidl."):
                found.add(_command(str(arg.value)))
    return found


@pytest.mark.parametrize("command", COMMANDS)
def test_no_command_imports_another_command(command):
    others = set(COMMANDS) - {command}
    assert not _imported_modules(PACKAGE / "cli" / f"{command}.py") & others
    assert "flags" not in COMMANDS


def test_the_import_check_sees_every_form(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import minidl.train\nfrom minidl import infer\nfrom minidl.plot import x\nfrom . import export\n"
                    "from .warmup import y\nimportlib.import_module('minidl.cli')\nfrom .flags import z\n")
    assert _imported_modules(path) == {"train", "infer", "plot", "export", "warmup", "cli", "flags"}


def test_no_choices_in_the_package_is_a_literal_list():
    literals = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "choices" and \
                    isinstance(node.value, (ast.Tuple, ast.List, ast.Set)) and \
                    all(isinstance(e, ast.Constant) for e in node.value.elts):
                literals.append(f"{path.relative_to(PACKAGE)}:{node.value.lineno}")
    assert not literals, f"choices copied instead of taken from the library: {literals}"
