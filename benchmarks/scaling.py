"""Scaling figures from bench_dist's results: speed-up and efficiency against one GPU, the ratio to
PyTorch DDP at the same N, and a plot of images/s against N.

A result is one JSON line of `bench_dist.py --json` (case, precision, ranks, framework, images_s,
ms_step, allreduce_ms, buckets); runs on machines of different sizes can be appended to one file
and read back together (`bench_dist.py --from-json FILE --plot scaling.png`).
"""
import json


def read(path):
    """The results in a JSON-lines file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def with_scaling(results):
    """Each result with `speedup` and `efficiency` (images/s over the same framework's at N = 1, and
    that over N) and, for minidl, `vs_ddp` (over PyTorch DDP's at the same N); None where the
    reference is missing. A later result of the same (case, precision, framework, N) wins."""
    last = {(r["case"], r["precision"], r["framework"], r["ranks"]): r for r in results}
    rows = []
    for (case, precision, framework, n), r in last.items():
        one = last.get((case, precision, framework, 1))
        ddp = last.get((case, precision, "torch-ddp", n)) if framework == "minidl" else None
        speedup = r["images_s"] / one["images_s"] if one else None
        rows.append(dict(r, speedup=speedup, efficiency=speedup / n if speedup else None,
                         vs_ddp=r["images_s"] / ddp["images_s"] if ddp else None))
    return sorted(rows, key=lambda r: (r["case"], r["precision"], r["framework"], r["ranks"]))


def table(results):
    """Markdown rows: case, precision, framework, N, images/s, speed-up, efficiency, vs DDP, all-reduce ms."""
    fmt = lambda v, f: "-" if v is None else format(v, f)      # noqa: E731
    lines = ["| case | precision | framework | N | images/s | speed-up | efficiency | vs PyTorch DDP | all-reduce ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in with_scaling(results):
        lines.append(f"| {r['case']} | {r['precision']} | {r['framework']} | {r['ranks']} | {r['images_s']:,.0f} | "
                     f"{fmt(r['speedup'], '.2f')} | {fmt(r['efficiency'], '.0%')} | {fmt(r['vs_ddp'], '.2f')} | "
                     f"{fmt(r.get('allreduce_ms'), '.3f')} |")
    return "\n".join(lines)


def plot(results, path):
    """One panel per (case, precision): images/s against N for each framework, and minidl's ideal
    (N times its one-GPU figure) dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = with_scaling(results)
    panels = sorted({(r["case"], r["precision"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (case, precision) in zip(axes[0], panels):
        mine = [r for r in rows if (r["case"], r["precision"]) == (case, precision)]
        for framework in sorted({r["framework"] for r in mine}):
            pts = [(r["ranks"], r["images_s"]) for r in mine if r["framework"] == framework]
            ax.plot(*zip(*pts), marker="o", label=framework)
        one = [r["images_s"] for r in mine if r["framework"] == "minidl" and r["ranks"] == 1]
        if one:
            ns = sorted({r["ranks"] for r in mine})
            ax.plot(ns, [n * one[0] for n in ns], "k--", lw=1, label="ideal (minidl)")
        ns = sorted({r["ranks"] for r in mine})
        ax.set_xscale("log", base=2)
        ax.set(xlabel="GPUs", ylabel="images/s", title=f"{case} {precision}")
        ax.set_xticks(ns, labels=[str(n) for n in ns])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
