"""One writer for every file minidl writes: checkpoints, artifacts, exports, plots, metrics.

    why = problem("checkpoints/lenet5.npz")            # None, or why it cannot be written
    hold("checkpoints/lenet5.npz")                       # this process's until it exits
    write_atomic("checkpoints/lenet5.npz", lambda f: np.savez(f, **arrays))

What a careful user expects of a file minidl writes:
- regular files only: a device node, FIFO, socket or folder at the path is refused, never replaced
  (a save onto /dev/null must not replace the machine's /dev/null);
- a symlink is written through: its target gets the new contents, the link stays;
- atomic: a temporary file beside the target (its name fits the folder's NAME_MAX however long the
  target's name), fsync, rename, so readers see the old file or the new one, never a part;
- of its kind (`files.kinds`): a write says what it writes (`kind_written="checkpoint"`, "metrics", ...);
  a name that is another kind's, an existing file of another kind or unknown, and a file the same
  command reads (`reads=`) are refused, so `--metrics ck.npz` or `--onnx ck.npz` cannot destroy ck.npz;
- advisory locks (`files.locks`; filelock, fcntl.flock: released by the kernel when the process
  dies), on a hidden file beside the target and one keyed by the target's absolute path in a per-user folder that no
  `rm -rf` of the target's folder removes ($MINIDL_LOCK_DIR, else $XDG_RUNTIME_DIR/minidl-locks, else
  <tmp>/minidl-locks-<uid>); a run holds both from its start, so a second run on the same file is
  refused at once with "in use by pid N", even after the folder was deleted and made again; before
  each write the lock beside the file is checked to be still there (taken again, or the write
  refused, where it went with its folder); leftovers of a killed save are cleared only when their
  process is gone;
- a full disk (or any refusal of the OS) is one WriteError naming the file and saying what was kept.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import warnings
from typing import IO, Any, Callable, Iterable

from .base import WriteError, _name_max, _stem, _unlink, cache_dir, kind, target  # noqa: F401
from .kinds import clash
from .locks import exclusive, hold, holder, holds, key_lock_path, lock_path, release, still_held  # noqa: F401

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _temp_prefix(folder, base):
    return "." + _stem(folder, base, 1 + 1 + 10 + 4) + "."     # "." stem "." pid ".tmp"


def problem(path: str | os.PathLike, kind_written: str | None = None,
            reads: Iterable[str | os.PathLike | None] = ()) -> str | None:
    """Why a file cannot be written at `path` (the folder is created where missing), or None.

    kind_written: the kind of file the write makes (files.kinds.KINDS): a name or an existing file
    of another kind is refused (nothing is created then). reads: the files the same command reads;
    `path` naming one of them is refused. Then tried for real: the folder is made and a temporary
    file of the name the write will use is created and removed, so a long name, a read-only folder
    or a full inode table is found now.
    """
    path = os.fspath(path)
    what = kind(path)
    if what:
        return f"is {what}, not a regular file"
    real = target(path)
    if any(r is not None and target(r) == real for r in reads):
        return "is a file this command reads: it is not replaced (write to another name)"
    why = clash(path, kind_written) if kind_written else None
    if why:
        return why
    folder = os.path.dirname(real)
    parent = folder
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"cannot be written ({parent} is a file, not a folder)"
    if len(os.fsencode(os.path.basename(real))) > _name_max(parent or "/"):
        return f"cannot be written (its name is longer than the {_name_max(parent or '/')} bytes a file name may have)"
    try:
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, _temp_prefix(folder, os.path.basename(real)) + f"{os.getpid()}.tmp")
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(tmp)
        if os.path.exists(real) and not os.access(real, os.W_OK) and os.geteuid() != 0:
            return "cannot be written (it is read-only)"
    except OSError as e:
        return f"cannot be written ({e.strerror or e})"
    return None


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(folder, prefix):
    """Temp files of this target whose process is gone (a save killed before its rename); another
    live process's temp file is its own business."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.tmp")
    for name in os.listdir(folder):
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            _unlink(os.path.join(folder, name))


def write_atomic(path: str | os.PathLike, fill: Callable[[IO[bytes]], Any], replace: bool = True,
                 kind_written: str | None = None) -> str | os.PathLike:
    """Write the file at `path` through `fill(f)` (a binary file object): temp file, fsync, rename.

    kind_written: what the file is (files.kinds.KINDS: "checkpoint", "onnx", ...): a name or an
    existing file of another kind is a WriteError, nothing written. replace=False: an existing file
    is never replaced (the rename is a link, which fails where a file appeared meanwhile):
    WriteError. Takes the file's locks for the write unless this process holds them already.
    Returns `path`.
    """
    given, path = path, os.fspath(path)
    why = kind(path)
    if why:
        raise WriteError(f"{path} is {why}, not a regular file: not written")
    why = clash(path, kind_written) if kind_written else None
    if why:
        raise WriteError(f"{path} {why}")
    real = target(path)
    folder, base = os.path.split(real)
    mine, existed = not holds(real), os.path.exists(real)
    try:
        os.makedirs(folder, exist_ok=True)
        if mine:
            hold(real)
        else:
            still_held(real, path)
        prefix = _temp_prefix(folder, base)
        _remove_stale(folder, prefix)
        tmp = os.path.join(folder, f"{prefix}{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)   # the umask applies
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, real)            # atomic on POSIX: readers see the old file or the new one
            else:
                os.link(tmp, real)               # EEXIST where a file is there: nothing replaced
                os.unlink(tmp)
        except BaseException:
            _unlink(tmp)
            raise
        _sync_folder(folder)
    except OSError as e:
        raise WriteError(_failure(path, e, existed)) from None
    finally:
        if mine:
            release(real)
    return given          # as given: a Path stays a Path


def _failure(path, e, existed):
    kept = f"{path} is as it was before" if existed else f"no {os.path.basename(path)} was written"
    if e.errno in _FULL:
        return f"{path}: no space left on the device while writing it; {kept}"
    if e.errno == errno.EEXIST:
        return f"{path} appeared while it was written: left as it is (not replaced)"
    return f"{path} cannot be written ({e.strerror or e}); {kept}"


def _sync_folder(folder):
    """fsync the folder so the rename itself survives a power cut (where the OS allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_append(path: str | os.PathLike, kind_written: str | None = None) -> IO[str]:
    """A text file at `path` opened for appending, refused unless it is a regular file (and, given
    `kind_written`, one of that kind or empty: files.kinds).

    Opened without blocking, so a FIFO that appeared after the checks cannot hang the run.
    """
    path = os.fspath(path)
    why = clash(path, kind_written) if kind_written and not kind(path) else None
    if why:
        raise WriteError(f"{path} {why}")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    except OSError as e:
        raise WriteError(f"{path} cannot be written ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WriteError(f"{path} is {kind(path) or 'not a regular file'}, not a regular file: not written")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", buffering=1, encoding="utf-8")


def warn_once(log: Any, what: str, e: BaseException) -> None:
    """A log that cannot be written says so once (a RuntimeWarning: its records are lost until the user
    frees the disk) and stops writing: training goes on."""
    if not log.failed:
        log.failed = True
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        warnings.warn(f"{what} cannot be written ({why}): no more records go to it; training goes on",
                      RuntimeWarning, stacklevel=3)


def unreadable(path: str, kind_read: str | None = None) -> str | None:
    """Why the file at `path` cannot be read (missing, not a regular file, permission) as a file of
    `kind_read` (files.kinds.KINDS; None: any): another kind minidl writes is named ("is a minidl
    inference artifact, not a minidl checkpoint"), before a command reads its data. Files of no
    kind known here pass: their reader names what is wrong with them."""
    if not os.path.exists(path):
        return ("does not exist (set --checkpoint, or train with -s first)" if path.endswith(".npz")
                else "does not exist")
    if not os.path.isfile(path):
        return f"is {kind(path)}, not a regular file"
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    return other_kind(path, kind_read) if kind_read else None


def other_kind(path: str | os.PathLike, kind_read: str) -> str | None:
    """"is X, not Y" where the file at `path` is another kind of file minidl knows than `kind_read`, or None.
    A checkpoint is read from a minidl checkpoint or a .safetensors export."""
    from .kinds import KINDS, sniff
    found, what = sniff(path)
    fits = {"checkpoint": ("checkpoint", "safetensors")}.get(kind_read, (kind_read,))
    if found in (None, "empty") or found in fits:
        return None
    return f"is {what}, not {KINDS[kind_read][0]}"
