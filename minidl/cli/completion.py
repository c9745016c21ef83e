"""minidl completion bash: print a bash completion script for the `minidl` command.

    minidl completion bash > ~/.local/share/bash-completion/completions/minidl    # or: source <(minidl completion bash)

The script is derived from the commands' own parsers when it is printed (the commands of
minidl/cli/__init__.py's COMMANDS, each one's flags and their choices), so it cannot drift from them;
it is static bash, so a Tab runs no Python. It completes the command after `minidl`, a command's flags
after `-`, a flag's choices after a flag that has them (`--model`, `--device`, ...), and file names
elsewhere (bash's default, for checkpoints, folders and other values). zsh reads it too, after
`autoload -U bashcompinit && bashcompinit`.
"""
from __future__ import annotations

import argparse
import importlib
import re
import shlex
import sys
from typing import Any, Callable, Sequence

SHELLS = ("bash",)
_WORD = re.compile(r"[A-Za-z0-9_.,:+=/@%-]+")       # a word bash's compgen -W offers as it is written


class _Parsed(Exception):
    """Carries the parser out of a command's main(), raised where it would parse its arguments."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _caught(main: Callable[[list[str]], Any]) -> argparse.ArgumentParser:
    """The parser a command's main() builds, taken at its parse_args call (for a command without parser())."""
    def parse_args(self: argparse.ArgumentParser, *args: Any, **kw: Any) -> Any:
        raise _Parsed(self)
    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = parse_args          # type: ignore[method-assign]
    try:
        main([])
    except _Parsed as e:
        return e.parser
    finally:
        argparse.ArgumentParser.parse_args = original        # type: ignore[method-assign]
    raise RuntimeError(f"{main.__module__}.main() returned without parsing its arguments")


def parsers() -> dict[str, argparse.ArgumentParser]:
    """command -> its ArgumentParser, for every command of the dispatcher (minidl.cli.COMMANDS)."""
    from . import COMMANDS
    out = {}
    for name in COMMANDS:
        module = importlib.import_module(f"minidl.cli.{name}")
        out[name] = module.parser() if hasattr(module, "parser") else _caught(module.main)
    return out


def _words(values: Any) -> list[str]:
    """The choices bash can offer as written (a choice with a space or a quote is left to be typed)."""
    return [w for w in map(str, values) if _WORD.fullmatch(w)]


def _command_case(name: str, p: argparse.ArgumentParser) -> list[str]:
    """The script's branch for one command: a flag's choices after it, the flags after `-`, else files."""
    flags: list[str] = []
    positional: list[str] = []
    valued: list[str] = []                          # flags whose value bash completes as a file name
    chosen: list[str] = []                          # `FLAG) offer its choices` lines
    for action in p._actions:                       # argparse keeps its actions here and nowhere public
        if not action.option_strings:
            positional += _words(action.choices or ())
            continue
        flags += action.option_strings
        if action.nargs == 0:                       # a switch: the next word is not its value
            continue
        pattern = "|".join(shlex.quote(o) for o in action.option_strings)
        if action.choices:
            words = shlex.quote(" ".join(_words(action.choices)))
            chosen.append(f'                {pattern}) COMPREPLY=($(compgen -W {words} -- "$cur")); return;;')
        else:
            valued.append(pattern)
    lines = [f"        {shlex.quote(name)})"]
    if chosen or valued:
        lines += ['            case "$prev" in', *chosen]
        if valued:                                  # an empty reply: bash completes file names (-o default)
            lines.append(f"                {'|'.join(valued)}) return;;")
        lines.append("            esac")
    lines.append(f"            _minidl_offer {shlex.quote(' '.join(flags))} {shlex.quote(' '.join(positional))};;")
    return lines


def bash_script(commands: dict[str, argparse.ArgumentParser] | None = None) -> str:
    """The bash completion script for `minidl`: a function _minidl bound to the command by `complete -F`."""
    from minidl import __version__
    from . import COMMANDS
    commands = parsers() if commands is None else commands
    top = " ".join([*COMMANDS, "-h", "--help", "--version"])
    lines = [
        f"# bash completion for minidl {__version__}, printed by `minidl completion bash` from the commands' parsers",
        "# install: minidl completion bash > ~/.local/share/bash-completion/completions/minidl",
        "",
        "_minidl_offer() {   # flags after '-', else the positional choices; nothing: bash completes file names",
        '    if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$1" -- "$cur"));',
        '    elif [ -n "$2" ]; then COMPREPLY=($(compgen -W "$2" -- "$cur")); fi',
        "}",
        "",
        "_minidl() {",
        "    local cur prev",
        '    cur="${COMP_WORDS[COMP_CWORD]}"',
        '    prev="${COMP_WORDS[COMP_CWORD-1]}"',
        "    COMPREPLY=()",
        "    if [ \"$COMP_CWORD\" -eq 1 ]; then",
        f"        COMPREPLY=($(compgen -W {shlex.quote(top)} -- \"$cur\"))",
        "        return",
        "    fi",
        '    case "${COMP_WORDS[1]}" in',
    ]
    for name, p in commands.items():
        lines += _command_case(name, p)
    lines += ["    esac", "}", "", "complete -o default -F _minidl minidl", ""]
    return "\n".join(lines)


SCRIPTS = {"bash": bash_script}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minidl completion",
                                description="Print a shell completion script for the minidl command.")
    p.add_argument("shell", choices=SHELLS, help="the shell the script is for")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sys.stdout.write(SCRIPTS[args.shell]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
