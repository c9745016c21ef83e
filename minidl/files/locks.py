"""The advisory locks of minidl.files' writer: a run holds each file it writes from its start.

    hold("checkpoints/lenet5.npz")        # WriteError "... is in use by pid N" where another run holds it
    release("checkpoints/lenet5.npz")     # or at exit

Two locks a file (filelock, fcntl.flock: released by the kernel when the process dies), each a small
file holding its holder's pid: one beside the target (hidden; seen by every user and host that sees
the file), and one named by a hash of the target's absolute path in a per-user folder
($MINIDL_LOCK_DIR, else $XDG_RUNTIME_DIR/minidl-locks, else <tmp>/minidl-locks-<uid>), which no
`rm -rf` of the target's folder removes: a second run on the same path is refused even after the
folder was deleted and made again. Before each write under a lock held since earlier, the lock
beside the file is checked to be the one locked (`still_held`): taken again where it went with its
folder, the write refused where another process has taken it since.

    with exclusive(cache + ".lock"):      # waits for another process's turn, then merges and writes

`exclusive` is the other kind: a short section that processes of one host take in turn (ranks
merging a cache file, compiles into one cache), waiting rather than refused.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import os
import stat
import tempfile
from typing import IO, Iterator

from filelock import FileLock, Timeout

from .base import WriteError, _stem, _unlink, target

try:
    import fcntl
except ImportError:            # not on POSIX: `exclusive` runs its block unlocked
    fcntl = None               # type: ignore[assignment]

_held: dict[str, list[FileLock]] = {}         # target -> the FileLocks this process holds for it (key, beside)
_inodes: dict[str, int] = {}                  # lock file -> the inode this process locked


def holds(real: str) -> bool:
    """Whether this process holds the locks of the target path `real`."""
    return real in _held


def lock_path(path: str | os.PathLike) -> str:
    """The lock file of `path`'s target: hidden, beside it."""
    folder, base = os.path.split(target(path))
    return os.path.join(folder, "." + _stem(folder, base, 1 + 5) + ".lock")


def _lock_dir():
    """The per-user folder of the locks keyed by path (mode 0700, ours, not a symlink), or None where
    the default one cannot be made. A $MINIDL_LOCK_DIR that cannot serve is a WriteError naming it:
    skipping it silently would drop the lock that outlives the target's folder (issue 38.3)."""
    chosen = os.environ.get("MINIDL_LOCK_DIR")
    folder = chosen or (
        os.path.join(os.environ["XDG_RUNTIME_DIR"], "minidl-locks") if os.environ.get("XDG_RUNTIME_DIR")
        else os.path.join(tempfile.gettempdir(), f"minidl-locks-{os.getuid()}"))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        st = os.lstat(folder)
        why = None if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() else "not a folder of this user's"
    except OSError as e:
        why = ("not a folder" if os.path.lexists(folder) and not os.path.isdir(folder) else
               e.strerror or type(e).__name__)
    if why is None:
        return folder
    if chosen:
        raise WriteError(f"$MINIDL_LOCK_DIR is {chosen}: {why}; it must name a folder of yours for the file "
                         "locks (or be unset)")
    return None


def key_lock_path(path: str | os.PathLike) -> str | None:
    """The lock of `path`'s target that outlives its folder: in the per-user lock folder, named by a
    hash of the target's absolute path; None where no such folder can be made."""
    folder = _lock_dir()
    digest = hashlib.sha256(os.fsencode(target(path))).hexdigest()[:32]
    return os.path.join(folder, f"{digest}.lock") if folder else None


def _pid_in(lock_file):
    try:
        with open(lock_file) as f:
            text = f.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def holder(path: str | os.PathLike) -> int | None:
    """The pid recorded in `path`'s lock files (the keyed one first), or None."""
    key = key_lock_path(path)
    return (_pid_in(key) if key else None) or _pid_in(lock_path(path))


def _recorder(lock_file):
    """on_acquired for filelock: the lock must be on the file now at the lock's path (a holder
    unlinks it before releasing, so a lock taken on the unlinked inode is no lock), then the pid."""
    def record(fd):
        ino = os.fstat(fd).st_ino
        if ino != os.stat(lock_file).st_ino:
            raise OSError(errno.EAGAIN, "lock file replaced while locking")
        _inodes[lock_file] = ino
        os.ftruncate(fd, 0)
        try:
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:            # a full disk: the lock holds all the same, its holder is unnamed
            pass
    return record


def _take(lock_file, path):
    """A FileLock on `lock_file`, taken without blocking; WriteError naming the holder where taken."""
    lock = FileLock(lock_file, on_acquired=_recorder(lock_file))
    try:
        lock.acquire(blocking=False)
    except (Timeout, FileNotFoundError):
        pid = _pid_in(lock_file)
        raise WriteError(f"{path} is in use by {f'pid {pid}' if pid else 'another process'} "
                         f"(another minidl run writes it)") from None
    return lock


def _drop(lock):
    _unlink(lock.lock_file)
    _inodes.pop(lock.lock_file, None)
    lock.release()


def hold(path: str | os.PathLike) -> str:
    """Take `path`'s advisory locks for this process (until release(path) or its exit).

    Another process holding either: WriteError "... is in use by pid N". Returns the target path.
    """
    real = target(path)
    if real in _held:
        return real
    os.makedirs(os.path.dirname(real), exist_ok=True)
    locks: list[FileLock] = []
    try:
        key = key_lock_path(real)
        if key:
            locks.append(_take(key, path))
        locks.append(_take(lock_path(real), path))
    except WriteError:
        for lock in reversed(locks):
            _drop(lock)
        raise
    except OSError as e:
        for lock in reversed(locks):
            _drop(lock)
        kept = f"{path} is as it was" if os.path.exists(real) else "nothing was written"
        raise WriteError(f"{path} cannot be written ({e.strerror or e}, making its lock file); {kept}") from None
    _held[real] = locks
    return real


def still_held(real: str, path: str | os.PathLike) -> None:
    """Before a write under a lock held since earlier: the lock file beside `real` is the one locked.
    Where it went (its folder was removed, say) it is taken again; where another process has taken
    it since, WriteError: that run's file is not replaced."""
    beside = _held[real][-1]
    try:
        same = os.stat(beside.lock_file).st_ino == _inodes.get(beside.lock_file)
    except OSError:
        same = False
    if same:
        return
    _inodes.pop(beside.lock_file, None)
    beside.release()
    os.makedirs(os.path.dirname(real), exist_ok=True)
    try:
        _held[real][-1] = _take(lock_path(real), path)
    except WriteError as e:
        _held[real].pop()
        raise WriteError(f"{e}, which took it after this run's lock went with its folder: not replaced") from None


def release(path: str | os.PathLike) -> None:
    """Give `path`'s locks back, each lock file removed first (no one waits on them: every lock here
    is taken without blocking, and a lock on a removed file is refused by its inode)."""
    for lock in reversed(_held.pop(target(path), [])):
        _drop(lock)


@atexit.register
def _release_all():
    for path in list(_held):
        release(path)




def _flocked(lock_file: str) -> IO[str] | None:
    """`lock_file` opened (its folder made) and flock'ed exclusively, waiting; None where it cannot be."""
    if fcntl is None:
        return None
    f = None
    try:
        os.makedirs(os.path.dirname(lock_file) or ".", exist_ok=True)
        f = open(lock_file, "a")
        fcntl.flock(f, fcntl.LOCK_EX)
        return f
    except OSError:
        if f is not None:
            f.close()
        return None


@contextlib.contextmanager
def exclusive(lock_file: str | os.PathLike) -> Iterator[bool]:
    """An exclusive lock on `lock_file` for the with block, waiting while another process holds it.

    For short sections processes of one host take in turn (ranks merging a cache file, compiles into
    one cache): where `hold` refuses a second holder, this waits for it. The lock (fcntl.flock, released
    by the kernel when the process dies) is on the file as each call opens it, so threads of one
    process wait for each other too; the lock file stays (a waiter may hold it open). Yields True
    where locked, False where no lock can be had (a read-only folder, no flock on this OS): the block
    then runs unlocked, which suits a cache whose races cost only time.
    """
    f = _flocked(os.fspath(lock_file))
    try:
        yield f is not None
    finally:
        if f is not None:
            f.close()                   # closing releases the flock
