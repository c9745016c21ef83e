"""Scaling figures from bench_dist's results: speed-up and efficiency against one GPU, the ratio to
PyTorch DDP at the same N, and a plot of images/s against N.

A result is one JSON line of `bench_dist.py --json` (case, precision, ranks, framework, images_s,
ms_step, allreduce_ms, buckets, and optionally grad_reduce, transport, wire_mib); runs on machines of
different sizes can be appended to one file and read back together (`bench_dist.py --from-json FILE
--plot scaling.png`). A run with gradients sent as bf16 or over the network transport is labelled
so ("minidl bf16-wire net"); its one-GPU reference is the framework's plain one-GPU run.

`model` extends measured 1- and 2-GPU steps to N GPUs: a ring all-reduce sends 2(N-1)/N of the
gradient per rank at the link's bus bandwidth, so the all-reduce of N GPUs takes 2(N-1)/N times
that of 2, and the part of it backward did not hide at N = 2 is taken to grow in proportion.
"""
import json


def read(path):
    """The results in a JSON-lines file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def label(r):
    """The framework and how its gradients travelled: 'minidl', 'minidl bf16-wire net', ..."""
    extra = [x for x, on in (("bf16-wire", r.get("grad_reduce") == "bf16"),
                             ("no-reduce", r.get("grad_reduce") == "none"),
                             ("net", r.get("transport") == "net")) if on]
    return " ".join([r["framework"], *extra])


def with_scaling(results):
    """Each result with `speedup` and `efficiency` (images/s over the same framework's at N = 1, and
    that over N) and, for minidl, `vs_ddp` (over PyTorch DDP's at the same N); None where the
    reference is missing. A later result of the same (case, precision, framework, N) wins."""
    last = {(r["case"], r["precision"], label(r), r["ranks"]): r for r in results}
    rows = []
    for (case, precision, name, n), r in last.items():
        one = last.get((case, precision, name, 1)) or last.get((case, precision, r["framework"], 1))
        twin = name.replace("minidl", "torch-ddp", 1)
        ddp = last.get((case, precision, twin, n)) if r["framework"] == "minidl" else None
        speedup = r["images_s"] / one["images_s"] if one else None
        rows.append(dict(r, label=name, speedup=speedup, efficiency=speedup / n if speedup else None,
                         vs_ddp=r["images_s"] / ddp["images_s"] if ddp else None))
    return sorted(rows, key=lambda r: (r["case"], r["precision"], r["label"], r["ranks"]))


def table(results):
    """Markdown rows: case, precision, framework, N, images/s, speed-up, efficiency, vs DDP, all-reduce ms."""
    fmt = lambda v, f: "-" if v is None else format(v, f)      # noqa: E731
    lines = ["| case | precision | framework | N | images/s | ms/step | speed-up | efficiency | vs PyTorch DDP | "
             "all-reduce ms | wire MiB |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in with_scaling(results):
        lines.append(f"| {r['case']} | {r['precision']} | {r['label']} | {r['ranks']} | {r['images_s']:,.0f} | "
                     f"{fmt(r.get('ms_step'), '.3f')} | {fmt(r['speedup'], '.2f')} | {fmt(r['efficiency'], '.0%')} | "
                     f"{fmt(r['vs_ddp'], '.2f')} | {fmt(r.get('allreduce_ms'), '.3f')} | "
                     f"{fmt(r.get('wire_mib'), '.1f')} |")
    return "\n".join(lines)


def model(results, ns=(4, 8)):
    """Predicted rows for N in `ns` from each (case, precision, label) measured at N = 1 and 2:
    ms(N) = ms(1) + (ms(2) - ms(1)) x (2(N-1)/N), the exposed all-reduce scaled as a ring's bytes.
    Each row: case, precision, label, ranks, ms_step, speedup."""
    rows = {(r["case"], r["precision"], r["label"], r["ranks"]): r for r in with_scaling(results)}
    out = []
    for (case, precision, name, n), two in rows.items():
        one = rows.get((case, precision, name, 1)) or rows.get((case, precision, two["framework"], 1))
        if n != 2 or one is None:
            continue
        exposed = max(two["ms_step"] - one["ms_step"], 0.0)
        for N in ns:
            ms = one["ms_step"] + exposed * 2 * (N - 1) / N
            out.append(dict(case=case, precision=precision, label=name, ranks=N, ms_step=ms,
                            speedup=N * one["ms_step"] / ms))
    return out


def model_table(results, ns=(4, 8)):
    """Markdown rows of model(results): the predicted step and speed-up of 4 and 8 GPUs."""
    lines = ["| case | precision | framework | N (model) | ms/step | speed-up |", "|---|---|---|---|---|---|"]
    for r in model(results, ns):
        lines.append(f"| {r['case']} | {r['precision']} | {r['label']} | {r['ranks']} | {r['ms_step']:.3f} | "
                     f"{r['speedup']:.2f} |")
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
        for framework in sorted({r["label"] for r in mine}):
            pts = [(r["ranks"], r["images_s"]) for r in mine if r["label"] == framework]
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
