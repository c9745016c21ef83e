"""What a command line shows of the library's diagnostics: each log record and each warning as one line.

The library logs through `logging.getLogger("minidl.<module>")` (a NullHandler on "minidl": silent unless
the application configures logging) and warns through `warnings.warn` (what the user should act on). A
command shows, while it runs (`shown`), the INFO records on stdout as they are ("device: cpu (...)") and
the WARNING records and the warnings on stderr as "warning: ..." lines, the form its other lines have.
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
            print(f"{record.levelname.lower()}: {text}", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stdout, flush=True)


def _one_line(message, category, filename, lineno, line=None):
    """warnings.formatwarning for a command line: "warning: ..." (where and what category is no news
    to its user); a test's record of warnings is left as it is."""
    return f"warning: {message}\n"


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
