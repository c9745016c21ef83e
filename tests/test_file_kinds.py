"""Each command writes only files of its own kind and never the file it reads (issue 38.2), and
checkpoints know their data (issue 39.7): every case refused with one line, exit 2, before any data
is read, the file at the path left byte for byte as it was."""
import os

import numpy as np
import pytest

from minidl import files, models
from minidl.cli import export as export_cli
from minidl.cli import infer as infer_cli
from minidl.cli import plot as plot_cli
from minidl.cli import train as train_cli
from minidl.cli.stops import fresh_name
from minidl import checkpoint
from minidl.checkpoint import checkpoint_data
from minidl.files import kinds
from minidl.files.metrics_log import MetricsError, MetricsLog

RECORD = b'{"step": 100, "epoch": 0, "loss": 0.5, "accuracy": 90.0, "lr": 0.01, "images_per_s": 1.0, "wall_s": 1.0}\n'


def a_checkpoint(path, dataset="mnist"):
    checkpoint.save(path, models.lenet5(), None, {"step": 3, "seed": 0, "plan": {"dataset": dataset}})
    return path.read_bytes()


def refused(main, args, capsys, *words):
    """main(args) exits 2 with one error line holding every word."""
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and err.count("error:") == 1, err
    for w in words:
        assert w in err, err
    return err


# -- the kinds, by name and by content ----------------------------------------------------------------------
def test_sniff_tells_each_kind_minidl_writes(tmp_path):
    a_checkpoint(tmp_path / "c.npz")
    (tmp_path / "m.jsonl").write_bytes(RECORD)
    (tmp_path / "torn.jsonl").write_bytes(RECORD[:20])               # a first record cut short: a log still
    (tmp_path / "p.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(20))
    (tmp_path / "w.safetensors").write_bytes(np.uint64(2).tobytes() + b"{}")
    (tmp_path / "notes.txt").write_text("hello\n")
    (tmp_path / "e.jsonl").write_bytes(b"")
    found = {name: kinds.sniff(tmp_path / name)[0] for name in os.listdir(tmp_path)}
    assert found == {"c.npz": "checkpoint", "m.jsonl": "metrics", "torn.jsonl": "metrics", "p.png": "image",
                     "w.safetensors": "safetensors", "notes.txt": None, "e.jsonl": "empty"}


@pytest.mark.parametrize("name,kind,words", [
    ("c.npz", "metrics", "is a minidl checkpoint, not a metrics log"),
    ("c.npz", "artifact", "is a minidl checkpoint, not a minidl inference artifact"),
    ("c.npz", "onnx", "is a minidl checkpoint, not an ONNX model"),
    ("w.safetensors", "checkpoint", "is no name for a minidl checkpoint: its name must end in .npz"),
    ("new.onnx", "checkpoint", "must end in .npz"),
    ("new.ckpt", "checkpoint", "must end in .npz"),
    ("new.npz", "metrics", "must end in .jsonl, .ndjson or .json"),
])
def test_a_write_of_one_kind_is_refused_over_another_kind_or_name(tmp_path, name, kind, words):
    before = a_checkpoint(tmp_path / "c.npz")
    assert words in kinds.clash(tmp_path / name, kind)
    assert words in files.problem(tmp_path / name, kind)
    with pytest.raises(files.WriteError, match=words):
        files.write_atomic(tmp_path / name, lambda f: f.write(b"x"), kind_written=kind)
    assert (tmp_path / "c.npz").read_bytes() == before and not (tmp_path / "new.onnx").exists()
    assert kinds.clash(tmp_path / "c.npz", "checkpoint") is None        # its own kind: replaced as asked


def test_the_python_api_writes_its_kinds_only(tmp_path):
    (tmp_path / "m.jsonl").write_bytes(RECORD)
    with pytest.raises(files.WriteError, match="m.jsonl is a metrics log"):
        checkpoint.save(tmp_path / "m.jsonl", models.lenet5())
    with pytest.raises(files.WriteError, match="must end in .npz"):
        checkpoint.save(tmp_path / "model.ckpt", models.lenet5())
    before = a_checkpoint(tmp_path / "c.npz")
    with pytest.raises(files.WriteError, match="c.npz is a minidl checkpoint, not a metrics log"):
        MetricsLog(tmp_path / "c.npz")
    assert (tmp_path / "c.npz").read_bytes() == before and (tmp_path / "m.jsonl").read_bytes() == RECORD


# -- a metrics log touches only its own lines ----------------------------------------------------------------
def test_a_metrics_log_refuses_a_file_that_is_no_metrics_log(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_bytes(b"my notes\nno newline at the end")
    with pytest.raises(files.WriteError, match=r"notes.jsonl is a text file \(its first line: 'my notes'\)"):
        MetricsLog(path)
    assert path.read_bytes() == b"my notes\nno newline at the end"


@pytest.mark.parametrize("last,kept", [
    (RECORD[:-1], RECORD),                    # a whole record without its newline: kept, the newline added
    (RECORD[:30], b""),                       # the start of a record cut short by a killed run: dropped
])
def test_a_last_line_without_newline_is_mended_only_when_it_is_the_logs_own(tmp_path, last, kept):
    path = tmp_path / "m.jsonl"
    path.write_bytes(RECORD + last)
    with MetricsLog(path) as log:
        log.evaluation(step=200, epoch=1, test_loss=0.1, test_accuracy=97.0)
    lines = path.read_bytes().splitlines(keepends=True)
    assert b"".join(lines[:-1]) == RECORD + kept and lines[-1].startswith(b'{"eval": "test", "step": 200')


def test_a_foreign_last_line_is_never_cut(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(RECORD + b"a line someone else wrote")
    with pytest.raises(MetricsError, match="has no newline and is no metrics record"):
        MetricsLog(path)
    assert path.read_bytes() == RECORD + b"a line someone else wrote"


# -- the command lines: exit 2 before any data, nothing replaced ----------------------------------------------
def test_train_metrics_onto_a_checkpoint_is_refused(no_data, capsys):
    before = a_checkpoint(no_data / "ck.npz")
    refused(train_cli.main, ["--metrics", "ck.npz"], capsys, "argument --metrics: ck.npz is a minidl checkpoint")
    assert (no_data / "ck.npz").read_bytes() == before


def test_train_save_into_a_safetensors_name_or_file_is_refused(no_data, capsys):
    refused(train_cli.main, ["-s", "--checkpoint", "w.safetensors"], capsys, "argument --checkpoint",
            "-s cannot save to w.safetensors", "must end in .npz")
    assert not (no_data / "w.safetensors").exists()
    a_checkpoint(no_data / "c.npz")
    assert export_cli.main(["c.npz", "--safetensors", "w.safetensors"]) == 0
    before = (no_data / "w.safetensors").read_bytes()
    for flags in (["-l", "-s"], ["--save-every", "5"]):
        refused(train_cli.main, [*flags, "--checkpoint", "w.safetensors"], capsys,
                "cannot save to w.safetensors: it is a .safetensors weights file, not a minidl checkpoint")
    assert (no_data / "w.safetensors").read_bytes() == before


def test_export_onto_its_own_checkpoint_is_refused(no_data, capsys):
    before = a_checkpoint(no_data / "a.npz")
    refused(export_cli.main, ["a.npz", "--onnx", "a.npz"], capsys, "--onnx a.npz is a file this command reads")
    refused(export_cli.main, ["a.npz", "--onnx", "a.onnx.npz"], capsys, "must end in .onnx")
    assert (no_data / "a.npz").read_bytes() == before


def test_infer_save_artifact_onto_a_checkpoint_or_its_input_is_refused(no_data, capsys):
    before = a_checkpoint(no_data / "c.npz")
    a_checkpoint(no_data / "other.npz")
    refused(infer_cli.main, ["--checkpoint", "c.npz", "--save-artifact", "c.npz"], capsys,
            "argument --save-artifact: c.npz is a file this command reads")
    refused(infer_cli.main, ["--checkpoint", "c.npz", "--save-artifact", "other.npz"], capsys,
            "other.npz is a minidl checkpoint, not a minidl inference artifact")
    refused(infer_cli.main, ["--checkpoint", "c.npz", "--save-artifact", "c.onnx"], capsys, "must end in .npz")
    assert (no_data / "c.npz").read_bytes() == before


def test_an_artifact_where_a_checkpoint_is_read_is_named_before_data(no_data, capsys):
    from minidl import inference
    a_checkpoint(no_data / "c.npz")
    inference.compile(models.lenet5()).save(no_data / "a.npz")
    for main, args, words in (
            (export_cli.main, ["a.npz", "--onnx", "a.onnx"], "a.npz is a minidl inference artifact, not a minidl "
                                                              "checkpoint: export the checkpoint it was made from"),
            (train_cli.main, ["-l", "--checkpoint", "a.npz"], "argument -l: checkpoint a.npz is a minidl inference "
                                                               "artifact, not a minidl checkpoint"),
            (train_cli.main, ["--resume", "--checkpoint", "a.npz"], "argument --resume: checkpoint a.npz is a minidl "
                                                                     "inference artifact"),
            (infer_cli.main, ["--checkpoint", "a.npz"], "argument --checkpoint: a.npz is a minidl inference artifact"),
            (infer_cli.main, ["--artifact", "c.npz"], "argument --artifact: c.npz is a minidl checkpoint, not a "
                                                      "minidl inference artifact")):
        refused(main, args, capsys, words)
    assert not (no_data / "a.onnx").exists()


def test_plot_onto_a_checkpoint_or_its_input_is_refused(no_data, capsys):
    pytest.importorskip("matplotlib")
    before = a_checkpoint(no_data / "c.npz")
    os.rename(no_data / "c.npz", no_data / "c.png")              # a checkpoint under an image's name
    (no_data / "run.svg").write_bytes(RECORD)                    # a metrics log under an image's name
    for args, words in ((["run.svg", "-o", "c.png"], "-o c.png is a minidl checkpoint, not an image"),
                        (["run.svg", "-o", "run.svg"], "-o run.svg is a file this command reads")):
        assert plot_cli.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert (no_data / "c.png").read_bytes() == before and (no_data / "run.svg").read_bytes() == RECORD


def test_a_stop_of_a_run_loading_exported_weights_saves_a_checkpoint_name(tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"x")
    assert fresh_name(str(tmp_path / "w.safetensors")) == str(tmp_path / "w.stopped.npz")
    assert fresh_name(str(tmp_path / "new.npz")) == str(tmp_path / "new.npz")
    files.release(tmp_path / "w.stopped.npz")
    files.release(tmp_path / "new.npz")


# -- checkpoints that know their data (issue 39.7) ------------------------------------------------------------
def test_checkpoints_record_dataset_shape_and_classes(tmp_path):
    a_checkpoint(tmp_path / "c.npz", "fashion-mnist")
    info = checkpoint_data.read_info(tmp_path / "c.npz")
    assert info["data"] == {"dataset": "fashion-mnist", "input_shape": [1, 28, 28], "classes": 10}
    assert checkpoint_data.dataset_of(info) == "fashion-mnist"
    old = {"format": checkpoint.FORMAT, "meta": {"step": 3}}          # from before: no data record, no plan
    assert checkpoint_data.dataset_of(old) is None


def test_train_on_another_dataset_keeps_the_mnist_checkpoint(no_data, capsys):
    from minidl.cli.flags import checkpoint_path, check_args
    p = train_cli.parser()
    assert checkpoint_path(check_args(p, p.parse_args(["--dataset", "fashion-mnist"]))) == \
        os.path.join("checkpoints", "lenet5-fashion-mnist.npz")
    assert checkpoint_path(check_args(p, p.parse_args([]))) == os.path.join("checkpoints", "lenet5.npz")
    os.makedirs("checkpoints")
    before = a_checkpoint(no_data / "checkpoints" / "lenet5.npz", "mnist")
    refused(train_cli.main, ["--dataset", "fashion-mnist", "-s", "--checkpoint", "checkpoints/lenet5.npz"], capsys,
            "argument --dataset: -s would replace checkpoints/lenet5.npz, a run on mnist, with a run on fashion-mnist")
    assert (no_data / "checkpoints" / "lenet5.npz").read_bytes() == before


def test_infer_takes_the_checkpoints_dataset_and_refuses_another(no_data, capsys):
    from minidl.cli.flags import check_args
    a_checkpoint(no_data / "f.npz", "fashion-mnist")
    p = infer_cli.parser()
    args = check_args(p, p.parse_args(["--checkpoint", "f.npz"]), trains=False)
    assert args.dataset == "fashion-mnist" and args.dataset_note is None
    refused(infer_cli.main, ["--checkpoint", "f.npz", "--dataset", "mnist"], capsys,
            "argument --dataset: mnist is not the dataset f.npz was trained on (fashion-mnist)")
    checkpoint.save(no_data / "old.npz", models.lenet5(), None, {"step": 3, "seed": 0})     # says no dataset
    args = check_args(p, p.parse_args(["--checkpoint", "old.npz"]), trains=False)
    assert args.dataset == "mnist" and "old.npz does not say which dataset" in args.dataset_note
    args = check_args(p, p.parse_args(["--checkpoint", "old.npz", "--dataset", "fashion-mnist"]), trains=False)
    assert args.dataset == "fashion-mnist" and args.dataset_note is None


def test_an_artifact_keeps_its_checkpoints_dataset_and_infer_uses_it(no_data, capsys):
    from minidl import inference
    from minidl.cli.flags import check_args
    a_checkpoint(no_data / "f.npz", "fashion-mnist")
    compiled = inference.compile(no_data / "f.npz", device="cpu")
    assert compiled.dataset == "fashion-mnist"
    compiled.save(no_data / "fa.npz")
    assert inference.load(no_data / "fa.npz", device="cpu").dataset == "fashion-mnist"
    p = infer_cli.parser()
    args = check_args(p, p.parse_args(["--artifact", "fa.npz"]), trains=False)
    assert args.dataset == "fashion-mnist" and args.dataset_note is None
    refused(infer_cli.main, ["--artifact", "fa.npz", "--dataset", "mnist"], capsys,
            "argument --dataset: mnist is not the dataset fa.npz was trained on (fashion-mnist)")
    inference.compile(models.lenet5()).save(no_data / "plain.npz")         # a Model's: no dataset known
    args = check_args(p, p.parse_args(["--artifact", "plain.npz"]), trains=False)
    assert args.dataset == "mnist" and "plain.npz does not say which dataset" in args.dataset_note
