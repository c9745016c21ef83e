"""Every way a `python -m minidl.train` run ends, tried as an unlucky user would: signals at each
phase, a checkpoint it was not asked to write, files in use, device nodes, FIFOs, symlinks, long
names, a bad test file, crafted checkpoints, a full disk. Each ends with one line and its exit code."""
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from minidl import checkpoint
from minidl import files, models
from tests.test_files import CAN_TMPFS, CAN_UNPRIVILEGE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("MINIDL_DATA")
needs_mnist = pytest.mark.skipif(not (DATA and os.path.isdir(os.path.join(DATA, "mnist"))),
                                 reason="real MNIST not found: $MINIDL_DATA/mnist/ is missing")
FAST = ("-n", "4", "-m", "2", "-y", "1", "-x", "100", "--device", "cpu")


def env():
    return dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1")


def train(*args, cwd, prefix=(), code=None):
    """Run the command line (or Python `code` that runs it) in `cwd`; the CompletedProcess."""
    cmd = ([sys.executable, "-c", textwrap.dedent(code), *args] if code
           else [sys.executable, "-m", "minidl.train", *args])
    return subprocess.run([*prefix, *cmd], cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)


def one_line(p):
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


def signal_when(args, cwd, sig, line_starts, nth=1):
    """Start a run, send `sig` once the `nth` stdout line starting with `line_starts` appears."""
    p = subprocess.Popen([sys.executable, "-m", "minidl.train", *args], cwd=cwd, env=env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = 0
    for line in p.stdout:
        seen += line.startswith(line_starts)
        if seen == nth:
            p.send_signal(sig)
            break
    out, err = p.communicate(timeout=300)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def lenet_checkpoint(path, edit=None, meta=True):
    """A real LeNet-5 checkpoint at `path`; edit(info, arrays) may damage it first."""
    model = models.lenet5()
    checkpoint.save(path, model, None, {"step": 3, "seed": 0} if meta else None)
    info, arrays = checkpoint.read_npz(path)
    if edit:
        edit(info, arrays)
    if not meta:
        info.pop("meta")
    checkpoint.write_npz(path, arrays, info)
    return path


# -- 1. a checkpoint the run was not asked to write is never replaced ----------------------------------
@needs_mnist
def test_ctrl_c_without_s_keeps_a_finished_checkpoint_and_saves_beside_it(tmp_path):
    old = lenet_checkpoint(tmp_path / "checkpoints" / "lenet5.npz")
    before = old.read_bytes()
    p = signal_when(("-n", "100000", "-m", "5", "--device", "cpu"), tmp_path, signal.SIGINT, "step:")
    assert p.returncode == 130
    line = one_line(p)
    assert line == ("SIGINT: stopped at step " + line.split("step ")[1].split(";")[0] + "; saved "
                    "checkpoints/lenet5.stopped.npz (checkpoints/lenet5.npz was left as it was): the same command "
                    "with --checkpoint checkpoints/lenet5.stopped.npz --resume continues it")
    assert old.read_bytes() == before
    assert checkpoint.read(tmp_path / "checkpoints" / "lenet5.stopped.npz")[0]["meta"]["step"] > 0
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["lenet5.npz", "lenet5.stopped.npz"]   # no lock left


# -- 2. device nodes, symlinks, long names, FIFOs ------------------------------------------------------------
@needs_mnist
def test_save_onto_a_device_node_or_fifo_is_refused_before_any_data(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for flags, named in ((("-s", "--checkpoint", "/dev/null"), "cannot save to /dev/null: it is a character device"),
                         (("--metrics", "fifo"), "fifo is a FIFO (named pipe), not a regular file"),
                         (("--metrics", "/dev/full"), "/dev/full is a character device")):
        p = train(*FAST, *flags, cwd=tmp_path)
        assert p.returncode == 2 and named in p.stderr.splitlines()[-1] and "loading" not in p.stdout, p.stderr
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


@needs_mnist
def test_save_through_a_symlink_and_with_a_255_byte_name(tmp_path):
    (tmp_path / "real.npz").write_bytes(b"")
    os.symlink("real.npz", tmp_path / "link.npz")
    long = "c" * 251 + ".npz"
    for name in ("link.npz", long):
        p = train(*FAST, "-s", "--checkpoint", name, cwd=tmp_path)
        assert p.returncode == 0, p.stderr
    assert os.path.islink(tmp_path / "link.npz")
    assert checkpoint.read(tmp_path / "real.npz")[0]["meta"]["step"] == 4
    assert checkpoint.read(tmp_path / long)[0]["meta"]["step"] == 4
    assert sorted(os.listdir(tmp_path)) == sorted([long, "link.npz", "real.npz"])


# -- 3. two runs on one checkpoint -----------------------------------------------------------------------------
@needs_mnist
def test_a_checkpoint_in_use_by_another_run_is_refused_at_start(tmp_path):
    files.hold(tmp_path / "c.npz")                        # this process plays the other run
    files.hold(tmp_path / "m.jsonl")
    try:
        cases = ((("-s",), "c.npz"), (("--save-every", "2"), "c.npz"), (("--metrics", "m.jsonl"), "m.jsonl"))
        for flags, held in cases:
            p = train(*FAST, "--checkpoint", "c.npz", *flags, cwd=tmp_path)
            assert p.returncode == 1 and "loading" not in p.stdout
            assert one_line(p) == f"error: {held} is in use by pid {os.getpid()} (another minidl run writes it)"
    finally:
        files.release(tmp_path / "c.npz")
        files.release(tmp_path / "m.jsonl")
    assert not (tmp_path / "c.npz").exists() and not (tmp_path / "m.jsonl").exists()


# -- 4. found before training ---------------------------------------------------------------------------------
@needs_mnist
@pytest.mark.parametrize("damage", ["truncated", "wrong"])
def test_a_bad_test_file_is_found_before_training(damage, tmp_path):
    data = tmp_path / "data" / "mnist"
    shutil.copytree(os.path.join(DATA, "mnist"), data)
    test = data / "t10k-labels-idx1-ubyte.gz"
    if damage == "truncated":
        test.write_bytes(test.read_bytes()[:200])
    else:
        shutil.copy(data / "train-labels-idx1-ubyte.gz", test)
    p = train(*FAST, "-s", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert p.returncode == 1 and "step:" not in p.stdout
    assert "t10k-labels-idx1-ubyte" in one_line(p)
    assert not (tmp_path / "checkpoints" / "lenet5.npz").exists()


@needs_mnist
def test_threads_above_the_cpus_is_refused(tmp_path):
    p = train(*FAST, "--threads", "1000", cwd=tmp_path)
    assert p.returncode == 2 and "argument --threads: 1000 is more than the" in p.stderr.splitlines()[-1]


@needs_mnist
@pytest.mark.skipif(not CAN_TMPFS, reason="needs unshare and a tmpfs mount in a user namespace")
def test_a_full_disk_at_the_save_names_the_file_and_a_full_metrics_disk_only_warns(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    code = f"""
        import subprocess, sys
        try:                                                  # the disk is full from the start
            with open("{disk}/filler", "wb") as f:
                while True:
                    f.write(b"x" * 4096)
                    f.flush()
        except OSError:
            pass
        sys.exit(subprocess.run([sys.executable, "-m", "minidl.train", *sys.argv[1:]]).returncode)
    """
    script = f"mount -t tmpfs -o size=200k none {disk} && exec {sys.executable} -c \"$0\" \"$@\""
    p = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, textwrap.dedent(code),
                        *FAST, "-s", "--checkpoint", f"{disk}/c.npz", "--metrics", f"{disk}/m.jsonl"],
                       cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    assert "step:    4" in p.stdout                          # training went on past the metrics failure
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and "Traceback" not in p.stderr, p.stderr
    assert lines[0].startswith(f"warning: metrics file {disk}/m.jsonl cannot be written (No space left on device)")
    assert lines[1] == f"error: {disk}/c.npz: no space left on the device while writing it; no c.npz was written"


# -- 5. non-finite tensors, 9. checkpoint contents --------------------------------------------------------------
def _nan(info, arrays):
    arrays["param/conv2d_1/w"][0, 0, 0, 0] = np.nan


def _int8(info, arrays):
    arrays["param/dense/b"] = arrays["param/dense/b"].astype(np.int8)


def _tanh(info, arrays):                                      # same tensors, another architecture
    layer = next(spec for spec in info["model"]["layers"] if spec["class"] == "Dense")
    layer["config"]["activation"] = "tanh" if "activation" in layer["config"] else None
    layer["config"]["use_bias_typo"] = True


@needs_mnist
@pytest.mark.parametrize("edit,meta,flag,message", [
    (_nan, True, "-l", "tensor param/conv2d_1/w holds 1 non-finite value(s) (NaN or infinity) of 2400: refused"),
    (_nan, True, "--resume", "tensor param/conv2d_1/w holds 1 non-finite value(s)"),
    (_int8, True, "-l", "tensor param/dense/b is int8, expected floating point"),
    (_tanh, True, "-l", "was saved from another model: layer"),
    (None, False, "--resume", "has no meta record (step, seed, rng): it cannot be resumed"),
])
def test_crafted_checkpoints_are_refused_naming_what_is_wrong(edit, meta, flag, message, tmp_path):
    lenet_checkpoint(tmp_path / "c.npz", edit, meta)
    p = train(*FAST, flag, "--checkpoint", "c.npz", cwd=tmp_path)
    assert p.returncode == 1 and "step:" not in p.stdout
    line = one_line(p)
    assert line.startswith("error: checkpoint c.npz") and message in line, line


def test_infer_and_export_refuse_a_nan_checkpoint(tmp_path):
    lenet_checkpoint(tmp_path / "c.npz", _nan)
    for cmd in (("minidl.infer", "--checkpoint", "c.npz", "--device", "cpu"),
                ("minidl.export", "c.npz", "--safetensors", "c.safetensors")):
        p = subprocess.run([sys.executable, "-m", *cmd], cwd=tmp_path, env=env(), capture_output=True, text=True)
        assert p.returncode == 1 and "param/conv2d_1/w holds 1 non-finite" in one_line(p)
    assert not (tmp_path / "c.safetensors").exists()


@pytest.mark.skipif(not CAN_UNPRIVILEGE, reason="needs a non-root user (or unshare --user)")
def test_an_unreadable_checkpoint_for_resume_is_one_line_before_any_data(tmp_path):
    lenet_checkpoint(tmp_path / "c.npz").chmod(0)
    tmp_path.chmod(0o777)
    p = train(*FAST, "--resume", "--checkpoint", "c.npz", cwd=tmp_path,
              prefix=["unshare", "--user"] if os.geteuid() == 0 else [])
    assert p.returncode == 2 and "loading" not in p.stdout
    assert p.stderr.splitlines()[-1].endswith("argument --resume: checkpoint c.npz cannot be read (Permission denied)")


# -- 8. signals --------------------------------------------------------------------------------------------------
@needs_mnist
def test_sighup_saves_and_exits_as_sigterm_does(tmp_path):
    p = signal_when(("-n", "100000", "-m", "5", "-s", "--checkpoint", "c.npz", "--device", "cpu"), tmp_path,
                    signal.SIGHUP, "step:")
    assert p.returncode == 129
    assert one_line(p).endswith("; saved c.npz: the same command with --resume continues it")
    assert checkpoint.read(tmp_path / "c.npz")[0]["meta"]["step"] >= 5


@needs_mnist
def test_a_stop_during_the_final_save_is_honoured_after_it(tmp_path):
    code = """
        import os, signal, sys
        from minidl import files, train
        real = files.write_atomic
        def slow(path, fill, replace=True, **kw):       # SIGTERM arrives while the final save writes
            os.kill(os.getpid(), signal.SIGTERM)
            return real(path, fill, replace, **kw)
        files.write_atomic = slow
        sys.exit(train.main(sys.argv[1:]))
    """
    p = train(*FAST, "-s", "--checkpoint", "c.npz", cwd=tmp_path, code=code)
    assert p.returncode == 143
    assert one_line(p) == "SIGTERM: stopped after training, at step 4; the trained weights are in c.npz"
    assert checkpoint.read(tmp_path / "c.npz")[0]["meta"]["step"] == 4
    assert "[INFERENCE]" not in p.stdout


@needs_mnist
def test_ctrl_c_during_evaluation_without_s_keeps_the_trained_weights(tmp_path):
    p = signal_when(("-r", "18", "-n", "2", "-b", "4", "-m", "1", "-x", "100", "-y", "100", "--device", "cpu"),
                    tmp_path, signal.SIGINT, "loaded 10000 items")
    assert p.returncode == 130
    assert one_line(p) == ("SIGINT: stopped after training, at step 2; the trained weights are in "
                           "checkpoints/resnet18.npz")
    assert checkpoint.read(tmp_path / "checkpoints" / "resnet18.npz")[0]["meta"]["step"] == 2


# -- 7. a resumed run and a metrics file whose last line was cut ------------------------------------------------
@needs_mnist
def test_a_metrics_file_with_a_cut_last_line_is_repaired_before_appending(tmp_path):
    from minidl.files import metrics_log
    (tmp_path / "m.jsonl").write_text('{"step": 2, "epoch": 0, "loss": 1.0}\n{"step": 4, "ep')
    p = train(*FAST, "--metrics", "m.jsonl", cwd=tmp_path)
    assert p.returncode == 0
    assert one_line(p) == ("warning: m.jsonl: its last line was cut short (15 bytes, a run stopped mid-write); "
                           "dropped it")
    intervals, evaluations = metrics_log.read(tmp_path / "m.jsonl")
    assert [r["step"] for r in intervals] == [2, 2, 4] and len(evaluations) == 1


# -- issue 38.8: what a careful user is told ---------------------------------------------------------------------
@needs_mnist
def test_save_every_longer_than_the_run_still_saves_at_its_end(tmp_path):
    """--save-every implies -s: a run shorter than N steps ends in its checkpoint, and says so."""
    p = train(*FAST, "--save-every", "100", "--checkpoint", "c.npz", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "saved c.npz" in p.stdout and checkpoint.read(tmp_path / "c.npz")[0]["meta"]["step"] == 4


@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # NaN images: NumPy says so, the test means it
@pytest.mark.parametrize("exists", [False, True])
def test_the_nan_stop_says_what_is_at_the_checkpoint(tmp_path, exists):
    import minidl as dl
    model = models.lenet5()
    if exists:
        checkpoint.save(tmp_path / "w.npz", model)
    before = (tmp_path / "w.npz").read_bytes() if exists else None
    x = np.full((32, 28, 28), np.nan, np.float32)
    y = np.zeros(32, np.uint8)
    trainer = dl.Trainer(model, dl.optim.SGD(lr=0.1), device="cpu", progress=False, log=lambda *a, **k: None)
    with pytest.raises(dl.TrainingDiverged) as e:
        trainer.fit((x, y), steps=4, batch_size=16, monitor=2, save_to=tmp_path / "w.npz")
    said = str(e.value)
    if exists:
        assert said.endswith("w.npz was not overwritten") and (tmp_path / "w.npz").read_bytes() == before
    else:
        assert said.endswith(f"nothing was saved to {tmp_path / 'w.npz'}") and not (tmp_path / "w.npz").exists()
