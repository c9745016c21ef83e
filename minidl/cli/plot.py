"""python -m minidl.plot: loss and accuracy against training steps for one or more runs.

    python -m minidl.plot run.jsonl [more.jsonl ...] -o curves.png

Reads metrics files written by minidl.files.metrics_log.MetricsLog; draws training loss and accuracy
(lines) and test loss and accuracy (markers) with one colour per run, in two panels, to a PNG
(matplotlib, Agg backend: no display needed), in the format its extension names (.png, .pdf, .svg,
...), through minidl.files' writer. A missing or bad file, an unknown extension or an -o that cannot
be written (a file of another kind, one of the runs it reads) is one `error:` line, exit 2, before
anything is drawn; a bad record is named by its file and line.

The files are read a record at a time and each curve keeps at most MAX_POINTS points (every k-th,
k doubling as the run grows): a metrics file of any size is drawn in bounded memory, and a curve of
more points than the image has pixels loses nothing a reader can see.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .. import cli, files
from ..install_hint import install_hint
from ..files.metrics_log import MetricsError, records

MAX_POINTS = 10_000                 # per curve: several points per pixel of the widest image drawn
CURVES = ("loss", "accuracy", "test_loss", "test_accuracy")


class Curve:
    """(step, value) points of one curve, at most `cap` of them: every `stride`-th point seen is kept,
    and when `cap` are kept every other one goes and the stride doubles."""

    def __init__(self, cap: int = MAX_POINTS) -> None:
        self.cap, self.stride, self.seen = cap, 1, 0
        self.steps: list[float] = []
        self.values: list[float] = []

    def add(self, step: int, value: float) -> None:
        if self.seen % self.stride == 0:
            self.steps.append(float(step))
            self.values.append(float(value))
            if len(self.steps) > self.cap:
                del self.steps[1::2], self.values[1::2]
                self.stride *= 2
        self.seen += 1


def read_curves(path: str | os.PathLike, cap: int = MAX_POINTS) -> tuple[dict[str, Curve], int]:
    """({curve name: Curve}, records read) of a metrics file, streamed (bounded memory):
    loss and accuracy of the training intervals, test_loss and test_accuracy of the evaluations."""
    curves, n = {key: Curve(cap) for key in CURVES}, 0
    for record in records(path):
        n += 1
        for key in (CURVES[2:] if "eval" in record else CURVES[:2]):
            if record.get(key) is not None:
                curves[key].add(record["step"], record[key])
    return curves, n


def _shown(path):
    """A path as text that prints and draws: bytes that are not UTF-8 shown as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def plot(runs: dict[str, dict[str, Curve]], out: str, title: str | None = None) -> str:
    """Draw {label: {curve name: Curve}} (read_curves) to the image `out`; returns out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, curves) in enumerate(runs.items()):
        colour = f"C{i % 10}"
        for ax, train_key, test_key in ((ax_loss, "loss", "test_loss"), (ax_acc, "accuracy", "test_accuracy")):
            train = curves[train_key]
            ax.plot(train.steps, train.values, color=colour, label=f"{label} train")
            test = curves[test_key]
            if test.steps:
                ax.plot(test.steps, test.values, "o--", color=colour, markersize=4, label=f"{label} test")
    ax_loss.set(xlabel="step", ylabel="loss", yscale="log", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy (%)", title="accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fmt = os.path.splitext(out)[1][1:].lower()
    try:
        files.write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=120), kind_written="image")
    finally:
        plt.close(fig)
    return out


def formats() -> list[str]:
    """The file extensions matplotlib's Agg canvas can write ('png', 'pdf', 'svg', ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    return sorted(FigureCanvasAgg.get_supported_filetypes())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=cli.prog("plot"),
                                description="Plot loss and accuracy against steps from metrics JSONL files.")
    p.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="metrics files (python -m minidl.train --metrics)")
    p.add_argument("-o", "--output", default="curves.png", metavar="PNG", help="the image to write (curves.png)")
    p.add_argument("--title", help="a title over both panels")
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return _fail(f"plotting needs matplotlib ({install_hint('plot', 'matplotlib')})")
    output = _shown(args.output)
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        return _fail(f"-o {output}: no such folder {_shown(folder)}")
    ext = os.path.splitext(args.output)[1][1:].lower()
    if ext not in formats():
        return _fail(f"-o {output}: unknown image format {'.' + _shown(ext) if ext else '(no extension)'}; "
                     f"use one of {', '.join('.' + f for f in formats())}")
    why = files.problem(args.output, "image", reads=args.runs)
    if why:
        return _fail(f"-o {output} {why}")
    runs: dict[str, dict[str, Curve]] = {}
    for path in args.runs:
        try:
            curves, n = read_curves(path)
        except MetricsError as e:
            return _fail(_shown(str(e)))
        if not n:
            return _fail(f"{_shown(path)}: no metrics in it")
        label = _shown(os.path.splitext(os.path.basename(path))[0])
        runs[label if label not in runs else _shown(path)] = curves
    try:
        plot(runs, args.output, _shown(args.title) if args.title else None)
    except files.WriteError as e:
        return _fail(_shown(str(e)), 1)
    print(f"wrote {output}: {len(runs)} run(s)")
    return 0


def _fail(message, status=2):
    print(f"error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
