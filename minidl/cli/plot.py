"""python -m minidl.plot: loss and accuracy against training steps for one or more runs.

    python -m minidl.plot run.jsonl [more.jsonl ...] -o curves.png

Reads metrics files written by minidl.files.metrics_log.MetricsLog; draws training loss and accuracy
(lines) and test loss and accuracy (markers) with one colour per run, in two panels, to a PNG
(matplotlib, Agg backend: no display needed), in the format its extension names (.png, .pdf, .svg,
...), through minidl.files' writer. A missing or bad file, an unknown extension or an -o that cannot
be written is one `error:` line, exit 2, before anything is drawn.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Sequence

from ..install_hint import install_hint
from .. import files
from ..files.metrics_log import MetricsError, read


def _series(records, key):
    pts = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot(runs: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]], out: str,
         title: str | None = None) -> str:
    """Draw {label: (intervals, evaluations)} to the PNG `out`; returns out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, (intervals, evaluations)) in enumerate(runs.items()):
        colour = f"C{i % 10}"
        for ax, train_key, test_key in ((ax_loss, "loss", "test_loss"), (ax_acc, "accuracy", "test_accuracy")):
            ax.plot(*_series(intervals, train_key), color=colour, label=f"{label} train")
            steps, values = _series(evaluations, test_key)
            if steps:
                ax.plot(steps, values, "o--", color=colour, markersize=4, label=f"{label} test")
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
        files.write_atomic(out, lambda f: fig.savefig(f, format=fmt, dpi=120))
    finally:
        plt.close(fig)
    return out


def formats() -> list[str]:
    """The file extensions matplotlib's Agg canvas can write ('png', 'pdf', 'svg', ...)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    return sorted(FigureCanvasAgg.get_supported_filetypes())


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minidl.plot",
                                description="Plot loss and accuracy against steps from metrics JSONL files.")
    p.add_argument("runs", nargs="+", metavar="RUN.jsonl", help="metrics files (python -m minidl.train --metrics)")
    p.add_argument("-o", "--output", default="curves.png", metavar="PNG", help="the image to write (curves.png)")
    p.add_argument("--title", help="a title over both panels")
    args = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return _fail(f"plotting needs matplotlib ({install_hint('plot', 'matplotlib')})")
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):
        return _fail(f"-o {args.output}: no such folder {folder}")
    ext = os.path.splitext(args.output)[1][1:].lower()
    if ext not in formats():
        return _fail(f"-o {args.output}: unknown image format {'.' + ext if ext else '(no extension)'}; "
                     f"use one of {', '.join('.' + f for f in formats())}")
    why = files.problem(args.output)
    if why:
        return _fail(f"-o {args.output} {why}")
    runs = {}
    for path in args.runs:
        try:
            intervals, evaluations = read(path)
        except MetricsError as e:
            return _fail(str(e))
        if not intervals and not evaluations:
            return _fail(f"{path}: no metrics in it")
        label = os.path.splitext(os.path.basename(path))[0]
        runs[label if label not in runs else path] = (intervals, evaluations)
    try:
        plot(runs, args.output, args.title)
    except files.WriteError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}: {len(runs)} run(s)")
    return 0


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
