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
- an advisory lock (filelock, fcntl.flock: released by the kernel when the process dies) on a hidden
  file beside the target, removed again on release; a run holds it from its start, so a second run
  on the same file is refused at once with "in use by pid N", and leftovers of a killed save are
  cleared only when their process is gone;
- a full disk (or any refusal of the OS) is one WriteError naming the file and saying what was kept.
"""
from __future__ import annotations

import atexit
import errno
import hashlib
import os
import re
import stat
import sys
from typing import IO, Any, Callable

from filelock import FileLock, Timeout

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_held: dict[str, FileLock] = {}               # target -> FileLock held by this process


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
    if len(base.encode()) <= limit:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:12]
    cut = base.encode()[:max(limit - 13, 1)].decode(errors="ignore")
    return f"{cut}~{digest}"


def _temp_prefix(folder, base):
    return "." + _stem(folder, base, 1 + 1 + 10 + 4) + "."     # "." stem "." pid ".tmp"


def lock_path(path: str | os.PathLike) -> str:
    """The lock file of `path`'s target: hidden, beside it."""
    folder, base = os.path.split(target(path))
    return os.path.join(folder, "." + _stem(folder, base, 1 + 5) + ".lock")


def problem(path: str | os.PathLike) -> str | None:
    """Why a file cannot be written at `path` (the folder is created where missing), or None.

    Tried for real: the folder is made and a temporary file of the name the write will use is
    created and removed, so a long name, a read-only folder or a full inode table is found now.
    """
    path = os.fspath(path)
    what = kind(path)
    if what:
        return f"is {what}, not a regular file"
    real = target(path)
    folder = os.path.dirname(real)
    parent = folder
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"cannot be written ({parent} is a file, not a folder)"
    if len(os.path.basename(real).encode()) > _name_max(parent or "/"):
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


def holder(path: str | os.PathLike) -> int | None:
    """The pid recorded in `path`'s lock file, or None."""
    try:
        with open(lock_path(path)) as f:
            text = f.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _recorder(lock_file):
    """on_acquired for filelock: the lock must be on the file now at the lock's path (a holder
    unlinks it before releasing, so a lock taken on the unlinked inode is no lock), then the pid."""
    def record(fd):
        if os.fstat(fd).st_ino != os.stat(lock_file).st_ino:
            raise OSError(errno.EAGAIN, "lock file replaced while locking")
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:            # a full disk: the lock holds all the same, its holder is unnamed
            pass
    return record


def hold(path: str | os.PathLike) -> str:
    """Take `path`'s advisory lock for this process (until release(path) or its exit).

    Another process holding it: WriteError "... is in use by pid N". Returns the target path.
    """
    real = target(path)
    if real in _held:
        return real
    os.makedirs(os.path.dirname(real), exist_ok=True)
    lock = FileLock(lock_path(real), on_acquired=_recorder(lock_path(real)))
    try:
        lock.acquire(blocking=False)
    except (Timeout, FileNotFoundError):
        pid = holder(real)
        raise WriteError(f"{path} is in use by {f'pid {pid}' if pid else 'another process'} "
                         f"(another minidl run writes it)") from None
    except OSError as e:
        kept = f"{path} is as it was" if os.path.exists(real) else "nothing was written"
        raise WriteError(f"{path} cannot be written ({e.strerror or e}, making its lock file); {kept}") from None
    _held[real] = lock
    return real


def release(path: str | os.PathLike) -> None:
    """Give `path`'s lock back, its lock file removed first (no one waits on it: every lock here is
    taken without blocking, and a lock on the removed file is refused by its inode)."""
    lock = _held.pop(target(path), None)
    if lock is not None:
        _unlink(lock.lock_file)
        lock.release()


@atexit.register
def _release_all():
    for path in list(_held):
        release(path)


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


def write_atomic(path: str | os.PathLike, fill: Callable[[IO[bytes]], Any], replace: bool = True) -> str | os.PathLike:
    """Write the file at `path` through `fill(f)` (a binary file object): temp file, fsync, rename.

    replace=False: an existing file is never replaced (the rename is a link, which fails where a
    file appeared meanwhile): WriteError. Takes the file's lock for the write unless this process
    holds it already. Returns `path`.
    """
    given, path = path, os.fspath(path)
    why = kind(path)
    if why:
        raise WriteError(f"{path} is {why}, not a regular file: not written")
    real = target(path)
    folder, base = os.path.split(real)
    mine, existed = real not in _held, os.path.exists(real)
    try:
        os.makedirs(folder, exist_ok=True)
        if mine:
            hold(real)
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


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass


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


def open_append(path: str | os.PathLike) -> IO[str]:
    """A text file at `path` opened for appending, refused unless it is a regular file.

    Opened without blocking, so a FIFO that appeared after the checks cannot hang the run.
    """
    path = os.fspath(path)
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
    """A log that cannot be written says so once, on stderr, and stops writing: training goes on."""
    if not log.failed:
        log.failed = True
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        print(f"warning: {what} cannot be written ({why}): no more records go to it; training goes on",
              file=sys.stderr)


def unreadable(path: str) -> str | None:
    """Why the file at `path` cannot be read (missing, not a regular file, permission), or None."""
    if not os.path.exists(path):
        return ("does not exist (set --checkpoint, or train with -s first)" if path.endswith(".npz")
                else "does not exist")
    if not os.path.isfile(path):
        return f"is {kind(path)}, not a regular file"
    try:
        with open(path, "rb"):
            return None
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
