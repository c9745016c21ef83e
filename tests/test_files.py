"""minidl.files, the one writer: real symlinks, device nodes, FIFOs, long names, locks held by
another process, a read-only folder and a full disk (a tiny tmpfs in a user namespace)."""
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from minidl import files
from minidl.files import WriteError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _can(cmd):
    return shutil.which("unshare") and subprocess.run(cmd, capture_output=True).returncode == 0


# root reads and writes through permission bits: a user namespace without a mapping does not
CAN_UNPRIVILEGE = os.geteuid() != 0 or _can(["unshare", "--user", "true"])
CAN_TMPFS = _can(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", "mount -t tmpfs none /mnt"])


def as_user(code, **kw):
    """Run Python `code` where permission bits hold (not as root); (returncode, stdout, stderr)."""
    cmd = [sys.executable, "-c", textwrap.dedent(code)]
    if os.geteuid() == 0:
        cmd = ["unshare", "--user"] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), **kw)
    return p.returncode, p.stdout, p.stderr


def on_full_disk(folder, code, size="96k"):
    """Run Python `code` with a `size` tmpfs mounted on `folder` (a private mount namespace)."""
    script = f"mount -t tmpfs -o size={size} none {folder} && exec {sys.executable} -c \"$0\""
    p = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, textwrap.dedent(code)],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    return p.returncode, p.stdout, p.stderr


def test_a_write_goes_through_a_symlink_to_its_target(tmp_path):
    (tmp_path / "real.bin").write_bytes(b"old")
    os.symlink("real.bin", tmp_path / "link.bin")
    files.write_atomic(tmp_path / "link.bin", lambda f: f.write(b"new"))
    assert os.path.islink(tmp_path / "link.bin")
    assert (tmp_path / "real.bin").read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["link.bin", "real.bin"]


@pytest.mark.parametrize("dev", ["/dev/null", "/dev/full"])
def test_a_device_node_is_refused_never_replaced(dev, tmp_path):
    assert files.problem(dev) == "is a character device, not a regular file"
    with pytest.raises(WriteError, match=f"{dev} is a character device"):
        files.write_atomic(dev, lambda f: f.write(b"x"))
    os.symlink(dev, tmp_path / "link")                       # through a link too
    with pytest.raises(WriteError, match="character device"):
        files.write_atomic(tmp_path / "link", lambda f: f.write(b"x"))
    assert stat.S_ISCHR(os.stat(dev).st_mode)


def test_a_fifo_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "FIFO" in files.problem(fifo)
    t0 = time.perf_counter()
    with pytest.raises(WriteError, match="pipe"):
        files.open_append(fifo)                             # no reader: a blocking open would hang
    with pytest.raises(WriteError, match="FIFO"):
        files.write_atomic(fifo, lambda f: f.write(b"x"))
    assert time.perf_counter() - t0 < 5


def test_a_folder_at_the_path_is_refused(tmp_path):
    assert files.problem(tmp_path) == "is a folder, not a regular file"


@pytest.mark.parametrize("n", [238, 250, 255])
def test_a_name_up_to_name_max_gets_a_temp_and_lock_name_that_fits(n, tmp_path):
    path = tmp_path / ("c" * (n - 4) + ".npz")
    assert files.problem(path) is None
    files.write_atomic(path, lambda f: f.write(b"x"))
    assert path.read_bytes() == b"x" and os.listdir(tmp_path) == [path.name]
    assert "longer than" in files.problem(tmp_path / ("c" * 256))


def test_replace_false_never_replaces_an_existing_file(tmp_path):
    path = tmp_path / "c.npz"
    path.write_bytes(b"theirs")
    with pytest.raises(WriteError, match="not replaced"):
        files.write_atomic(path, lambda f: f.write(b"mine"), replace=False)
    assert path.read_bytes() == b"theirs" and os.listdir(tmp_path) == ["c.npz"]


def test_a_file_another_process_holds_is_in_use_by_its_pid(tmp_path):
    path = tmp_path / "c.npz"
    holder = subprocess.Popen([sys.executable, "-c", f"import sys, time; from minidl import files; "
                               f"files.hold({str(path)!r}); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(WriteError, match=rf"c\.npz is in use by pid {holder.pid}\b"):
            files.hold(path)
        with pytest.raises(WriteError, match=f"in use by pid {holder.pid}"):
            files.write_atomic(path, lambda f: f.write(b"x"))
        assert not path.exists()
    finally:
        holder.send_signal(signal.SIGKILL)                  # the kernel lets go of the lock
        holder.wait()
    files.write_atomic(path, lambda f: f.write(b"x"))
    assert path.read_bytes() == b"x"


@pytest.mark.skipif(not CAN_UNPRIVILEGE, reason="needs a non-root user (or unshare --user)")
def test_a_read_only_folder_is_named(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    rc, out, err = as_user(f"""
        from minidl import files
        print(files.problem({str(folder / 'c.npz')!r}))
        try:
            files.write_atomic({str(folder / 'c.npz')!r}, lambda f: f.write(b"x"))
        except files.WriteError as e:
            print(e)
    """)
    assert rc == 0, err
    first, second = out.splitlines()
    assert first == "cannot be written (Permission denied)"
    assert second.startswith(f"{folder / 'c.npz'} cannot be written (Permission denied")
    assert second.endswith("nothing was written")


@pytest.mark.skipif(not CAN_TMPFS, reason="needs unshare and a tmpfs mount in a user namespace")
def test_a_full_disk_names_the_file_and_keeps_the_previous_one(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    rc, out, err = on_full_disk(disk, f"""
        import os
        from minidl import files
        path = {str(disk / 'c.npz')!r}
        files.write_atomic(path, lambda f: f.write(b"old" * 1000))
        try:
            files.write_atomic(path, lambda f: f.write(os.urandom(1 << 20)))
        except files.WriteError as e:
            print(e)
        print(open(path, "rb").read() == b"old" * 1000, sorted(os.listdir({str(disk)!r})))
    """)
    assert rc == 0, err
    msg, state = out.splitlines()
    assert msg == (f"{disk / 'c.npz'}: no space left on the device while writing it; "
                   f"{disk / 'c.npz'} is as it was before")
    assert state == "True ['c.npz']"                        # the old file, no temp file left


def _holder(path, content, env=None):
    """A process holding `path`'s locks as a run does from its start; a line on its stdin makes it save
    `content` there (it says "saved" or exits 1 with the error), a second line ends it."""
    code = f"""if True:
        import sys
        from minidl import files
        files.hold({str(path)!r})
        print("held", flush=True)
        sys.stdin.readline()
        try:
            files.write_atomic({str(path)!r}, lambda f: f.write({content!r}))
        except files.WriteError as e:
            sys.exit(str(e))
        print("saved", flush=True)
        sys.stdin.readline()
    """
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT, **(env or {})))
    assert p.stdout.readline().strip() == "held", p.stderr.read()
    return p


def _save(p):
    p.stdin.write("\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def _end(*procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


def test_the_lock_survives_its_folder(tmp_path):
    """Run A holds ck/run.npz; `rm -rf ck`; run B on the same path is refused at once, and A's next
    save writes its file (issue 38.3)."""
    path = tmp_path / "ck" / "run.npz"
    a = _holder(path, b"A")
    try:
        shutil.rmtree(tmp_path / "ck")
        b = subprocess.run([sys.executable, "-c", f"from minidl import files; files.hold({str(path)!r})"],
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        assert b.returncode == 1 and f"run.npz is in use by pid {a.pid}" in b.stderr.splitlines()[-1]
        assert _save(a) == "saved" and path.read_bytes() == b"A"      # its folder made again
    finally:
        _end(a)


def test_a_save_after_the_lock_went_with_its_folder_does_not_replace_anothers_file(tmp_path):
    """Where the keyed lock is not shared (another user's lock folder), B can take the lock beside
    the file once A's went with the folder: then A's next save is refused and B's file stays."""
    path = tmp_path / "ck" / "run.npz"
    a = _holder(path, b"A", {"MINIDL_LOCK_DIR": str(tmp_path / "locks-a")})
    b = None
    try:
        shutil.rmtree(tmp_path / "ck")
        b = _holder(path, b"B", {"MINIDL_LOCK_DIR": str(tmp_path / "locks-b")})
        assert _save(b) == "saved"
        assert _save(a) == ""
        a.wait(timeout=60)
        err = a.stderr.read()
        assert a.returncode == 1 and f"run.npz is in use by pid {b.pid}" in err and "not replaced" in err, err
        assert path.read_bytes() == b"B"
    finally:
        _end(a, *([b] if b else []))


@pytest.mark.parametrize("kind", ["file", "missing parent"])
def test_a_lock_folder_named_by_the_user_that_cannot_serve_is_refused_naming_the_variable(tmp_path, monkeypatch, kind):
    """$MINIDL_LOCK_DIR naming a file (or a folder that cannot be made) was skipped silently, and with it
    the lock that outlives the target's folder: a second run after `rm -rf` was no longer refused."""
    bad = tmp_path / "locks"
    if kind == "file":
        bad.write_text("not a folder\n")
    else:
        bad = bad / "under-a-file" / "locks"
        (tmp_path / "locks").write_text("x\n")
    monkeypatch.setenv("MINIDL_LOCK_DIR", str(bad))
    with pytest.raises(WriteError, match=r"^\$MINIDL_LOCK_DIR is .*locks.*: .*; it must name a folder of yours"):
        files.hold(tmp_path / "run.npz")
    assert not files.holds(str(tmp_path / "run.npz"))
    if kind == "file":
        assert "not a folder" in str(pytest.raises(WriteError, files.hold, tmp_path / "run.npz").value)
