"""Metrics as JSON Lines (one object per line, appended, strict JSON) and the curves command."""
import json
import math
import os
import warnings

import pytest

from minidl.files import metrics_log
from minidl.cli import plot
from minidl.files.metrics_log import MetricsError, MetricsLog


def write_run(path, steps=(100, 200, 300), offset=0.0):
    with MetricsLog(path) as log:
        for i, s in enumerate(steps):
            log.interval(step=s, epoch=i // 2, loss=1.0 / (i + 1) + offset, accuracy=80 + i, lr=0.01,
                         images_per_s=5e4, wall_s=0.5 * (i + 1))
        log.evaluation(step=steps[-1], epoch=1, test_loss=0.2, test_accuracy=95.5)
    return path


def test_each_record_is_one_json_line_with_its_fields(tmp_path):
    path = write_run(tmp_path / "run.jsonl")
    lines = path.read_text().splitlines()
    assert len(lines) == 4
    first = json.loads(lines[0])
    assert first == {"step": 100, "epoch": 0, "loss": 1.0, "accuracy": 80.0, "lr": 0.01, "images_per_s": 5e4,
                     "wall_s": 0.5}
    last = json.loads(lines[-1])
    assert last["eval"] == "test" and last["test_loss"] == 0.2 and last["test_accuracy"] == 95.5
    assert last["step"] == 300 and isinstance(last["wall_s"], float)


def test_log_appends_flushes_each_line_and_writes_non_finite_as_null(tmp_path):
    path = tmp_path / "run.jsonl"
    write_run(path)
    log = MetricsLog(path)
    log.interval(step=400, epoch=2, loss=math.nan, accuracy=math.inf, lr=0.01, images_per_s=1.0)
    assert len(path.read_text().splitlines()) == 5           # on disk before close: line-buffered
    log.close()
    intervals, evaluations = metrics_log.read(path)
    assert [r["step"] for r in intervals] == [100, 200, 300, 400] and len(evaluations) == 1
    assert intervals[-1]["loss"] is None and intervals[-1]["accuracy"] is None


def test_read_names_bad_lines_and_skips_a_torn_last_line(tmp_path):
    path = write_run(tmp_path / "run.jsonl")
    with open(path, "a") as f:
        f.write('{"step": 40')                                # killed mid-write
    assert len(metrics_log.read(path)[0]) == 3
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(MetricsError, match=r"bad.jsonl:2: not a JSON line"):
        metrics_log.read(bad)
    bad.write_text('[1, 2]\n')
    with pytest.raises(MetricsError, match="integer step"):
        metrics_log.read(bad)
    with pytest.raises(MetricsError, match="no such file"):
        metrics_log.read(tmp_path / "missing.jsonl")


def test_plot_draws_several_runs_to_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a, b = write_run(tmp_path / "a.jsonl"), write_run(tmp_path / "b.jsonl", offset=0.1)
    out = tmp_path / "curves.png"
    assert plot.main([str(a), str(b), "-o", str(out), "--title", "two runs"]) == 0
    assert out.stat().st_size > 1000 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "2 run(s)" in capsys.readouterr().out


@pytest.mark.parametrize("content,message", [(None, "no such file"), ("garbage\n{}\n", "not a JSON line"),
                                             ("", "no metrics in it")])
def test_plot_bad_files_are_one_error_line_and_exit_2(tmp_path, capsys, content, message):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.jsonl"
    if content is not None:
        path.write_text(content)
    assert plot.main([str(path), "-o", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "c.png").exists()


def test_open_logs_gives_one_log_for_one_or_both_sinks(tmp_path):
    pytest.importorskip("tensorboardX")
    from minidl.files.tensorboard_log import TensorBoardLog
    assert metrics_log.open_logs() is None
    assert isinstance(metrics_log.open_logs(tmp_path / "a.jsonl"), MetricsLog)
    assert isinstance(metrics_log.open_logs(tensorboard=tmp_path / "tb0"), TensorBoardLog)
    both = metrics_log.open_logs(tmp_path / "b.jsonl", tmp_path / "tb")
    both.interval(step=5, epoch=0, loss=math.nan, accuracy=50.0, lr=0.1, images_per_s=1e3)
    both.evaluation(step=5, epoch=0, test_loss=0.5, test_accuracy=90.0)
    both.close()
    intervals, evals = metrics_log.read(tmp_path / "b.jsonl")
    assert intervals[0]["loss"] is None and evals[0]["test_accuracy"] == 90.0
    from tests.helpers.tensorboard_events import scalars as read_scalars
    scalars = read_scalars(tmp_path / "tb")
    assert "train/loss" not in scalars                          # a diverged loss has no point, as null above
    assert scalars["train/accuracy"] == [(5, 50.0)] and scalars["test/accuracy"] == [(5, 90.0)]


@pytest.mark.parametrize("output,message", [("c.xyz", "unknown image format .xyz; use one of"),
                                            ("c", "unknown image format (no extension)"),
                                            ("/dev/full", "-o /dev/full is a character device, not a regular file"),
                                            ("dir.png", "is a folder, not a regular file")])
def test_plot_refuses_an_output_it_cannot_write_before_drawing(tmp_path, capsys, monkeypatch, output, message):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.png").mkdir()
    if output == "/dev/full":
        output += ".png"
        os.symlink("/dev/full", tmp_path / "full.png")        # a device behind a name that looks right
        output, message = "full.png", "-o full.png is a character device"
    assert plot.main([str(write_run(tmp_path / "a.jsonl")), "-o", output]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and message in err and err.count("\n") == 1 and "wrote" not in out


@pytest.mark.parametrize("line,message", [('{"step": 1, "loss": "abc"}', 'loss is "abc", expected a finite number'),
                                          ('{"step": 1, "accuracy": [1]}', "accuracy is [1]"),
                                          ('{"step": true, "loss": 1}', "an integer step"),
                                          ('{"step": 1, "lr": NaN}', "lr is NaN")])
def test_plot_names_a_value_that_is_not_a_number(tmp_path, capsys, line, message):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.jsonl"
    path.write_text(line + "\n")
    assert plot.main([str(path), "-o", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:1: ") and message in err and err.count("\n") == 1


def test_metrics_log_refuses_a_fifo_and_warns_once_when_writes_fail(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match="pipe"):
        MetricsLog(tmp_path / "pipe")                        # no reader: must not hang
    log = MetricsLog(tmp_path / "m.jsonl")
    log.file.close()
    log.file = open("/dev/full", "a", buffering=1)           # every write now fails: ENOSPC
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")                      # once all the same: the log remembers it failed
        for step in (1, 2, 3):
            log.interval(step=step, epoch=0, loss=1.0, accuracy=50.0, lr=0.1, images_per_s=1.0)
    log.close()
    assert [w.category for w in caught] == [RuntimeWarning]
    assert str(caught[0].message) == (f"metrics file {tmp_path / 'm.jsonl'} cannot be written (No space left on "
                                      f"device): no more records go to it; training goes on")


def _big_log(path, records):
    line = b'{"step": %d, "epoch": 0, "loss": 0.5, "accuracy": 90.0, "lr": 0.01, "images_per_s": 1.0, "wall_s": 1.0}\n'
    with open(path, "wb") as f:
        for start in range(0, records, 10_000):
            f.write(b"".join(line % s for s in range(start, min(start + 10_000, records))))
    return path


def test_plot_reads_a_large_file_in_bounded_memory(tmp_path):
    """Issue 38.6: a metrics file is streamed and each curve keeps at most MAX_POINTS points, so the
    peak memory of reading does not grow with the file (here 40x the points a curve keeps)."""
    import tracemalloc
    cap = 500
    small, large = _big_log(tmp_path / "s.jsonl", 2 * cap), _big_log(tmp_path / "l.jsonl", 40 * cap)
    peaks = []
    for path in (small, large):
        tracemalloc.start()
        curves, n = plot.read_curves(path, cap)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert len(curves["loss"].steps) <= cap and curves["loss"].steps[0] == 0.0
    assert n == 40 * cap and curves["loss"].stride == 64
    # 20,000 records held as dicts would take ~10 MB; read a record at a time, the peak stays put
    assert peaks[1] < 1.5 * peaks[0] and peaks[1] < (1 << 20), peaks


def test_a_curve_keeps_every_kth_point_evenly():
    c = plot.Curve(cap=4)
    for s in range(10):
        c.add(s, float(s))
    assert c.steps == [0.0, 4.0, 8.0] and c.stride == 4


@pytest.mark.parametrize("line,message", [
    (b'{"step": 1' + b"0" * 400 + b', "loss": 1.0}', ":2: step 10000000000000000000... is outside [0, 2^63)"),
    (b'{"step": 2, "loss": 1' + b"0" * 400 + b'}', ":2: loss is 1000000000"),
    (b"[" * 100_000 + b"]" * 100_000, ":2: brackets nested too deeply"),
    (b'{"step": 2, "loss": "\xff"}', ":2: not UTF-8 text"),
    (b'{"step": 2, "x": "' + b"a" * (1 << 20) + b'"}', ":2: a line longer than 1,048,576 bytes"),
])
def test_plot_names_the_line_of_a_hostile_record(tmp_path, capsys, line, message):
    pytest.importorskip("matplotlib")
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 1.0}\n' + line + b"\n")
    assert plot.main([str(path), "-o", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}:2: ") and message in err and err.count("\n") == 1, err


def test_plot_takes_paths_that_are_not_utf8(tmp_path):
    import subprocess
    import sys
    pytest.importorskip("matplotlib")
    folder = os.fsencode(tmp_path)
    write_run(os.fsdecode(folder + b"/r\xff.jsonl"))
    p = subprocess.run([sys.executable, "-m", "minidl.plot", folder + b"/r\xff.jsonl", "-o", folder + b"/c\xfe.png"],
                       capture_output=True)
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    assert p.stdout.endswith(b"c\\xfe.png: 1 run(s)\n") and os.path.getsize(folder + b"/c\xfe.png") > 1000
