"""`minidl completion bash`: the script is derived from the parsers, and bash completes with it as it should."""
import shlex
import shutil
import subprocess

import pytest

from minidl import cli
from minidl.cli import completion

bash = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")


@pytest.fixture(scope="module")
def script():
    return completion.bash_script()


def _complete(script, words):
    """What the script offers for the command line `words` (the last one being completed) -> sorted list."""
    cword = len(words) - 1
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    driver = f"{script}\nCOMP_WORDS=({quoted}); COMP_CWORD={cword}; _minidl; printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    r = subprocess.run(["bash", "--norc", "--noprofile"], input=driver, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return sorted(w for w in r.stdout.splitlines() if w)


def test_every_command_and_every_flag_of_its_parser_is_in_the_script(script):
    parsers = completion.parsers()
    assert list(parsers) == list(cli.COMMANDS)
    for name, parser in parsers.items():
        flags = [o for a in parser._actions for o in a.option_strings]
        assert len(flags) > 2 or name == "completion", name        # more than -h/--help: a real parser
        branch = script.split(f"\n        {name})\n", 1)[1]
        offer = next(line for line in branch.splitlines() if "_minidl_offer" in line)
        assert shlex.split(offer)[1].split() == flags, name


@bash
def test_the_script_is_valid_bash(script, tmp_path):
    path = tmp_path / "minidl.bash"
    path.write_text(script)
    r = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@bash
@pytest.mark.parametrize("words, offered", [
    (["minidl", ""], sorted([*cli.COMMANDS, "-h", "--help", "--version"])),
    (["minidl", "tr"], ["train"]),
    (["minidl", "train", "--mod"], ["--model"]),
    (["minidl", "train", "--device", ""], ["auto", "cpu", "cuda"]),
    (["minidl", "train", "-b", "32", "--optimizer", "a"], ["adam", "adamw"]),     # the optimizers of optim.OPTIMIZERS
    (["minidl", "infer", "--pre"], ["--precision"]),
    (["minidl", "plot", "--o"], ["--output"]),
    (["minidl", "completion", ""], ["bash"]),
    (["minidl", "train", "--checkpoint", ""], []),         # a path: left to bash's file names
    (["minidl", "export", ""], []),                        # the checkpoint positional: file names
])
def test_bash_completes_commands_flags_and_choices(script, words, offered):
    assert _complete(script, words) == offered


def test_the_dispatcher_prints_the_script_and_refuses_an_unknown_shell(capsys):
    assert cli.main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# bash completion for minidl") and "complete -o default -F _minidl minidl" in out
    with pytest.raises(SystemExit) as e:
        cli.main(["completion", "fish"])
    assert e.value.code == 2 and "invalid choice: 'fish'" in capsys.readouterr().err


def test_a_command_without_a_parser_function_gives_its_parser_through_main():
    """plot builds its parser inside main(): completion takes it at parse_args, running nothing after."""
    import argparse
    original, ran = argparse.ArgumentParser.parse_args, []

    def main(argv):
        p = argparse.ArgumentParser(prog="x")
        p.add_argument("--flag", choices=["a", "b"])
        p.parse_args(argv)
        ran.append(True)
        return 0

    p = completion._caught(main)
    assert [a.option_strings for a in p._actions] == [["-h", "--help"], ["--flag"]] and ran == []
    assert argparse.ArgumentParser.parse_args is original          # put back
