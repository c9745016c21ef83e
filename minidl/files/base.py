"""What minidl.files' writer, its locks and its readers share: the errors, the target of a path,
what is at a path, helper files' names that fit NAME_MAX, a check that a file can be read, and the
folder of minidl's caches."""
from __future__ import annotations

import hashlib
import os
import stat

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit the model."""


class WriteError(ValueError):
    """A file cannot be written; the message names it and says what is left at the path."""


def target(path: str | os.PathLike) -> str:
    """The file a write to `path` changes: symlinks followed to their target, as an absolute path."""
    return os.path.realpath(os.fspath(path))


def kind(path: str | os.PathLike) -> str | None:
    """'a folder', 'a character device', ... for what is at `path` (symlinks followed) when it is
    not a regular file; None for a regular file or nothing at all."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in _KINDS if test(mode)), None)


def _name_max(folder):
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _stem(folder, base, room):
    """The part of a helper file's name (temp, lock) standing for `base`: base itself where the name
    fits NAME_MAX with `room` more characters, else a cut base and a hash of the whole name."""
    limit = _name_max(folder) - room
    raw = os.fsencode(base)              # a name that is not UTF-8 holds surrogates: its own bytes count
    if len(raw) <= limit:
        return base
    digest = hashlib.sha256(raw).hexdigest()[:12]
    cut = os.fsdecode(raw[:max(limit - 13, 1)].decode(errors="ignore").encode())
    return f"{cut}~{digest}"


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


def check_readable(path: str, what: str, error: type[ValueError]) -> None:
    """A regular file this process may read, else `error` naming it (not a PermissionError traceback)."""
    if not os.path.exists(path):
        raise error(f"{what} {path}: no such file")
    if not os.path.isfile(path):
        raise error(f"{what} {path} is {kind(path)}, not a regular file")
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise error(f"{what} {path} cannot be read ({e.strerror or e})") from None


def cache_dir() -> str:
    """The folder of minidl's caches (the cuDNN engine choices): $MINIDL_CACHE, else
    $XDG_CACHE_HOME/minidl (the XDG Base Directory rule: an absolute path, a relative one ignored), else
    ~/.cache/minidl."""
    if os.environ.get("MINIDL_CACHE"):
        return os.environ["MINIDL_CACHE"]
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    root = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "minidl")
