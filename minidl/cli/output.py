"""What a command line shows of the library's diagnostics: each log record and each warning as one line.

The library logs through `logging.getLogger("minidl.<module>")` (a NullHandler on "minidl": silent unless
the application configures logging) and warns through `warnings.warn` (what the user should act on). A
command shows, while it runs (`shown`), the INFO records on stdout as they are ("device: cpu (...)") and
the WARNING records and the warnings on stderr as "warning: ..." lines, the form its other lines have.
Lines go through tqdm.write, so a line printed while the progress bar runs lands above the bar on a
line of its own instead of being written over it.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from typing import Iterator


class _Lines(logging.Handler):
    """A record as one line: INFO and below on stdout as it is, WARNING and above on stderr after its level."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:                       # noqa: BLE001  a record that cannot be formatted
            self.handleError(record)
            return
        if record.levelno >= logging.WARNING:
            _line(f"{record.levelname.lower()}: {text}", sys.stderr)
        else:
            _line(text, sys.stdout)


def _line(text: str, file) -> None:
    """text as one line of `file`, above tqdm's bar when one is drawn."""
    from tqdm import tqdm
    tqdm.write(text, file=file)
    file.flush()


def _one_line(message, category, filename, lineno, line=None):
    """warnings.formatwarning for a command line: writes "warning: ..." itself (through _line, above the
    bar) and gives the default showwarning nothing more to write; where and what category is no news
    to its user. A test's record of warnings (catch_warnings(record=True)) formats nothing: it is left
    as it is."""
    _line(f"warning: {message}", sys.stderr)
    return ""


@contextlib.contextmanager
def shown(level: int = logging.INFO) -> Iterator[None]:
    """For the with block: minidl's records of `level` and above, and warnings, shown as lines."""
    logger, handler = logging.getLogger("minidl"), _Lines()
    before, formatwarning = logger.level, warnings.formatwarning
    logger.addHandler(handler)
    logger.setLevel(level)
    warnings.formatwarning = _one_line
    try:
        yield
    finally:
        warnings.formatwarning = formatwarning
        logger.setLevel(before)
        logger.removeHandler(handler)
