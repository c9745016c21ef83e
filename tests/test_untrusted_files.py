"""Checkpoints and artifacts read as untrusted files: one clear error, nothing allocated beyond the file."""
import json
import os
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from minidl import checkpoint
from minidl import inference, models, optim
from minidl.checkpoint import CheckpointError


def saved(tmp_path, opt=None):
    model = models.lenet5()
    if opt is not None:
        opt.setup(model)
    return model, checkpoint.save(tmp_path / "m.npz", model, opt, {"step": 3, "seed": 0})


def rewrite(path, out, info=None, arrays=None, compress=False):
    """The checkpoint at `path` with its JSON record or tensors replaced."""
    i, a = checkpoint.read_npz(path)
    i = info(i) if info else i
    a = arrays(a) if arrays else a
    a["__meta__"] = np.frombuffer(json.dumps(i).encode(), np.uint8)
    (np.savez_compressed if compress else np.savez)(out, **a)
    return out


@pytest.mark.parametrize("change", [
    lambda c: c["layers"][0]["config"].update(filters=10**9),           # 317 GiB asked of the config
    lambda c: c.update(inputs=[[1, 10**6, 10**6]]),
    lambda c: c["layers"][0]["config"].update(stride=0),
    lambda c: c["layers"][0]["config"].update(ksize="big"),
    lambda c: c["layers"][0].update(inputs=[7]),
    lambda c: c["layers"][0].update({"class": "Pickle"}),
    lambda c: c.pop("layers"),
    lambda c: c.update(outputs="all"),
])
def test_crafted_configs_fail_in_one_line_before_allocating(tmp_path, change):
    _, path = saved(tmp_path)

    def edit(info):
        change(info["model"])
        return info
    bad = rewrite(path, tmp_path / "bad.npz", info=edit)
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError, match="bad.npz") as e:
        checkpoint.load_model(bad)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "\n" not in str(e.value) and time.perf_counter() - t0 < 1.0
    assert peak < 50 * 2**20                                  # the file is 250 kB; nothing like GiBs


@pytest.mark.parametrize("arrays", [
    lambda a: {**a, "param/conv2d/w": a["param/conv2d/w"][:2]},             # wrong shape
    lambda a: {k: v for k, v in a.items() if k != "param/dense/b"},          # missing
    lambda a: {**a, "param/conv2d/w": a["param/conv2d/w"].astype(np.complex64)},
])
def test_tensors_of_the_wrong_shape_or_dtype_are_named(tmp_path, arrays):
    _, path = saved(tmp_path)
    bad = rewrite(path, tmp_path / "bad.npz", arrays=arrays)
    with pytest.raises(CheckpointError, match=r"bad.npz.*(conv2d/w|dense/b)"):
        checkpoint.load_model(bad)


def test_text_file_and_compressed_members_are_rejected_without_pickle_advice(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("hello\n")
    with pytest.raises(CheckpointError, match="notes.npz.*not an .npz") as e:
        checkpoint.load_model(text)
    assert "pickle" not in str(e.value)
    _, path = saved(tmp_path)
    with pytest.raises(CheckpointError, match="compressed"):
        checkpoint.load_model(rewrite(path, tmp_path / "zip.npz", compress=True))


def test_resume_with_another_model_names_the_layer_and_changes_nothing(tmp_path):
    _, path = saved(tmp_path, optim.Adam())
    other = models.resnet(18)
    before = other.get_weights()
    with pytest.raises(CheckpointError, match="m.npz does not fit the model.*conv2d"):
        checkpoint.load(path, other, optim.Adam().setup(other))
    for k, v in other.get_weights().items():
        np.testing.assert_array_equal(v, before[k])


@pytest.mark.parametrize("field,value", [("t", -1), ("t", "3"), ("config", {"lr": "0.1"}),
                                         ("config", {"b1": float("nan")}), ("name", "sgd")])
def test_bad_optimizer_state_is_one_error_and_changes_nothing(tmp_path, field, value):
    model, path = saved(tmp_path, optim.Adam())

    def edit(info):
        if field == "config":
            info["optimizer"]["config"].update(value)
        else:
            info["optimizer"][field] = value
        return info
    bad = rewrite(path, tmp_path / "bad.npz", info=edit)
    opt = optim.Adam().setup(model)
    before = model.get_weights()
    with pytest.raises(CheckpointError, match="bad.npz"):
        checkpoint.load(bad, model, opt)
    assert opt.t == 0 and opt.lr == 1e-3
    for k, v in model.get_weights().items():
        np.testing.assert_array_equal(v, before[k])


def test_a_save_removes_stale_temporary_files_of_its_target_but_not_a_live_process_s(tmp_path):
    model, path = saved(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".m.npz.{int(dead.stdout)}.tmp"   # what a kill -9 mid-save leaves: its process is gone
    stale.write_bytes(b"x" * 1000)
    live = tmp_path / f".m.npz.{os.getppid()}.tmp"        # another run's save in progress: left alone
    live.write_bytes(b"x")
    other = tmp_path / f".o.npz.{int(dead.stdout)}.tmp"   # another target's: left alone
    other.write_bytes(b"x")
    checkpoint.save(path, model)
    assert not stale.exists() and live.exists() and other.exists()


def test_artifact_with_object_arrays_or_zero_stride_is_rejected_fast(tmp_path):
    path = tmp_path / "a.npz"
    inference.compile(models.lenet5()).save(path)
    info, arrays = checkpoint.read_npz(path, "artifact")
    info["model"]["layers"][1]["config"]["stride"] = 0          # the first conv (after the Normalize)
    arrays["__meta__"] = np.frombuffer(json.dumps(info).encode(), np.uint8)
    np.savez(tmp_path / "stride.npz", **arrays)
    t0 = time.perf_counter()
    with pytest.raises(inference.ArtifactError, match="stride.npz.*stride must be positive"):
        inference.load(tmp_path / "stride.npz", device="cpu")
    with zipfile.ZipFile(tmp_path / "obj.npz", "w") as z:    # an object array: np.save with pickle
        with z.open("x.npy", "w") as f:
            np.lib.format.write_array(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(inference.ArtifactError, match="obj.npz"):
        inference.load(tmp_path / "obj.npz", device="cpu")
    assert time.perf_counter() - t0 < 1.0
