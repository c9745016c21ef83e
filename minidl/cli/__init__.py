"""minidl COMMAND [ARGS]: the console script and `python -m minidl`, one door to the command lines.

Each command is a module with a `main(argv)` that also runs as `python -m minidl.<command>`; this
dispatcher only picks the module, so a flag means the same through either door. A command's usage
line names it as it was invoked (`prog`): `minidl train`, `python -m minidl train`, `python -m minidl.train`.
"""
from __future__ import annotations

import importlib
import sys
from typing import Sequence

# command -> one line of help; the module is minidl.cli.<command> (docs/architecture.md: "a command")
COMMANDS = {
    "train": "train a zoo net (LeNet-5, ResNets, the study's nets) on MNIST or Fashion-MNIST, then test it",
    "infer": "run a checkpoint's inference lowering: accuracy, latency, throughput",
    "export": "write a checkpoint as an ONNX graph and/or PyTorch-named safetensors",
    "plot": "draw loss and accuracy curves from --metrics JSON lines",
    "warmup": "fill the GPU caches (compiled kernels, cuDNN engine choices) for a model ahead of time",
    "completion": "print a shell completion script for minidl (minidl completion bash)",
}


_door: list[str] = []         # how the dispatcher was invoked, while it runs a command


def prog(command: str) -> str:
    """The command's name as invoked, for its usage line: through the dispatcher `minidl train` (or
    `python -m minidl train`), else its own door, `python -m minidl.train`."""
    return f"{_door[-1]} {command}" if _door else f"python -m minidl.{command}"


def usage() -> str:
    """The help text: the commands and where each one's flags are described."""
    width = max(map(len, COMMANDS))
    lines = ["usage: minidl COMMAND [ARGS]   (also: python -m minidl COMMAND [ARGS])", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()]
    lines += ["", "minidl COMMAND -h shows a command's flags; minidl --version the version."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, invoked: str = "minidl") -> int:
    """Dispatch argv[0] to minidl.cli.<command>.main(argv[1:]); returns the exit status.

    invoked: how this dispatcher was invoked (the console script; minidl/__main__.py says
    `python -m minidl`), which the command's usage line names."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--version":
        from minidl import __version__
        print(f"minidl {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"minidl: unknown command {command!r}; the commands are {', '.join(COMMANDS)} (minidl -h)",
              file=sys.stderr)
        return 2
    _door.append(invoked)
    try:
        return importlib.import_module(f"minidl.cli.{command}").main(rest)
    finally:
        _door.pop()

