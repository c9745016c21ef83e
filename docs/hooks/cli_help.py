"""mkdocs hook: a line `<!-- cli-help: train -->` in a page becomes `python -m minidl.train --help`.

The command-line reference is then each command's own help text at build time, so it cannot drift
from the parsers (minidl/cli/train.py, cli/infer.py, cli/export.py, cli/plot.py, cli/warmup.py).
"""
import contextlib
import importlib
import io
import os
import re

MARKER = re.compile(r"^<!-- cli-help: ([a-z_]+) -->$", re.M)


def _help(command):
    """The --help text of minidl.<command>, as a terminal 100 columns wide would show it."""
    os.environ["COLUMNS"] = "100"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        importlib.import_module(f"minidl.{command}").main(["--help"])
    text = out.getvalue().strip()
    if not text.startswith("usage:"):
        raise RuntimeError(f"minidl.{command} --help printed no usage line: {text[:200]!r}")
    return text


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: f"```text\n{_help(m.group(1))}\n```", markdown)
