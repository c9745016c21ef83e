"""Scaling figures from bench_dist's results, and a model of N GPUs fed by the parts measured.

A result is one JSON line of `bench_dist.py --json`: case, precision, ranks, framework, images_s,
ms_step, and where measured: grad_reduce (the wire: fp32, bf16), transport (nvlink, net),
collectives (False: minidl's step with its collectives skipped), shard (minidl's sharded optimizer),
allreduce_ms (the all-reduce alone over the bytes the wire carries, in the step's buckets), rs_ag_ms
(reduce-scatter + all-gather alone, the sharded optimizer's collectives), wire_mib, buckets, seconds.
Older files (`grad_reduce: none` for the step without collectives) read the same. Runs on machines of
different sizes can go into one file and be read back together (`bench_dist.py --from-json FILE`).

`table`: images/s, ms/step with and without collectives, speed-up and efficiency against the same
framework's one GPU, the fraction of the all-reduce hidden behind backward, minidl over PyTorch DDP.
`net_table`: the two-host stand-in (NCCL over sockets), minidl beside DDP for each wire.

`model`: the step of N GPUs from measured parts at n GPUs (`Parts`: one GPU's step, the step
without collectives, the step with them, the collectives alone, the bytes a rank sends).
    ring (all-reduce, and the sharded optimizer's reduce-scatter + all-gather: the same bytes):
        comm(N) = f(N) * S / B + calls * 2 * log2(hosts) * latency,   f(N) = 2 (N - 1) / N
    one host: B is the bus bandwidth the parts show, f(n) S / alone(n); nothing is added per call
    several hosts of G GPUs: B = min(that, the NICs' line rate x efficiency), and each collective
        adds the latency of NCCL's tree between hosts, 2 log2(hosts) hops (Net)
    step(N) = without + e * comm(N),   e = (with - without) / alone at n (the exposed fraction)
    efficiency(N) = t1 / step(N),   speed-up = N x efficiency
The exposed fraction is measured at n and kept at every N (1 - e, clipped to [0, 1], is the fraction
hidden); the step without collectives is n's at every N (the work a GPU does does not change with
N). For the sharded optimizer without a measured sharded step, the reduce-scatter is hidden as the
all-reduce is and the all-gather, after the update, not at all.

    python benchmarks/scaling.py results.jsonl [--gpus-per-host 8] [--net 4x400 8x400]
    python benchmarks/scaling.py --parts t1=3.167 without=3.054 with=3.400 alone=0.340 mib=89.7 n=2 buckets=12
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass

NS = (4, 8, 16, 32, 64)


def read(path):
    """The results in a JSON-lines file, in order."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def normalise(r):
    """r with every key the table reads: wire (grad_reduce), transport, collectives, shard. An older
    line's `grad_reduce: none` is the float32 step with its collectives skipped."""
    wire = r.get("grad_reduce") or "fp32"
    collectives = r.get("collectives", wire != "none")
    return dict(r, grad_reduce="fp32" if wire == "none" else wire, transport=r.get("transport") or "nvlink",
                collectives=collectives, shard=bool(r.get("shard")))


def label(r):
    """The framework and how its gradients travelled: 'minidl', 'minidl sharded bf16-wire net', ..."""
    r = normalise(r)
    extra = [x for x, on in (("sharded", r["shard"]), ("bf16-wire", r["grad_reduce"] == "bf16"),
                             ("net", r["transport"] == "net"), ("no-reduce", not r["collectives"])) if on]
    return " ".join([r["framework"], *extra])


def hidden(alone, with_ms, without_ms):
    """(raw, clipped): the fraction of the collectives' time alone that the step did not add,
    (alone - (with - without)) / alone. Raw below 0: the collectives cost the step more than their own
    length (their kernels slow backward's); above 1: the step with them measured faster (noise).
    Clipped to [0, 1]. (None, None) where a part is missing."""
    if alone is None or with_ms is None or without_ms is None or alone <= 0:
        return None, None
    raw = (alone - (with_ms - without_ms)) / alone
    return raw, min(max(raw, 0.0), 1.0)


def _key(r):
    return r["case"], r["precision"], label(r), r["ranks"]


def with_scaling(results):
    """One row per (case, precision, label, N), a later result winning, with `speedup` and
    `efficiency` (images/s over the same framework's plain one-GPU run, and that over N), `vs_ddp`
    (minidl over PyTorch DDP with the same wire and transport at the same N), and for minidl with
    collectives `without_ms` (the step without them, same wire and transport), `alone_ms` (the
    collectives alone: the all-reduce, or for a sharded row reduce-scatter + all-gather, its own or
    its plain twin's), `hidden` and `hidden_raw` (`hidden`). A step without collectives is a column
    of its twin, a row only where that is missing. None where a reference is missing."""
    last = {_key(r): normalise(r) for r in results}
    rows = []
    for (case, precision, name, n), r in last.items():
        plain = dict(r, shard=False, collectives=True)
        if not r["collectives"] and _key(plain) in last:
            continue                                   # shown as its twin's column
        one = last.get((case, precision, name, 1)) or last.get((case, precision, r["framework"], 1))
        ddp = last.get(_key(dict(plain, framework="torch-ddp"))) if r["framework"] == "minidl" else None
        without = last.get(_key(dict(plain, collectives=False))) if r["collectives"] and n > 1 else None
        without_ms = without["ms_step"] if without and r["framework"] == "minidl" else None
        alone = r.get("allreduce_ms")
        if r["shard"]:                                 # measured beside the plain step, in the same launch
            alone = r.get("rs_ag_ms") or (last.get(_key(plain)) or {}).get("rs_ag_ms")
        raw, clipped = hidden(alone, r.get("ms_step"), without_ms)
        speedup = r["images_s"] / one["images_s"] if one else None
        rows.append(dict(r, label=name, speedup=speedup, efficiency=speedup / n if speedup else None,
                         vs_ddp=r["images_s"] / ddp["images_s"] if ddp else None, without_ms=without_ms,
                         alone_ms=alone, hidden=clipped, hidden_raw=raw))
    return sorted(rows, key=lambda r: (r["case"], r["precision"], r["label"], r["ranks"]))


def _fmt(v, f):
    return "-" if v is None else format(v, f)


def _hidden_cell(r):
    """The clipped fraction, starred where clipping changed it."""
    if r["hidden"] is None:
        return "-"
    return f"{r['hidden']:.0%}" + ("*" if r["hidden_raw"] != r["hidden"] else "")


HIDDEN_NOTE = ("hidden: (alone - (with - without)) / alone, the share of the collectives' time alone that the step "
               "did not add; * clipped to [0, 1] (below 0: the collectives slowed backward's kernels by more than "
               "their own length; above 1: noise). alone: sharded rows, reduce-scatter + all-gather.")


def table(results):
    """Markdown rows: images/s, ms/step with and without collectives, the collectives alone, the
    fraction hidden, speed-up and efficiency, vs PyTorch DDP, MiB on the wire, seconds the case took."""
    lines = ["| case | precision | framework | N | images/s | ms/step | without collectives | collectives alone ms | "
             "hidden | speed-up | efficiency | vs PyTorch DDP | wire MiB | s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in with_scaling(results):
        alone = r["alone_ms"]
        lines.append(f"| {r['case']} | {r['precision']} | {r['label']} | {r['ranks']} | {r['images_s']:,.0f} | "
                     f"{_fmt(r.get('ms_step'), '.3f')} | {_fmt(r['without_ms'], '.3f')} | {_fmt(alone, '.3f')} | "
                     f"{_hidden_cell(r)} | {_fmt(r['speedup'], '.2f')} | {_fmt(r['efficiency'], '.0%')} | "
                     f"{_fmt(r['vs_ddp'], '.2f')} | {_fmt(r.get('wire_mib'), '.1f')} | "
                     f"{_fmt(r.get('seconds'), '.0f')} |")
    return "\n".join(lines)


def net_table(results):
    """Markdown rows of the two-host stand-in (transport net): per wire, minidl's and PyTorch DDP's
    step (DDP's bf16_compress_hook for a bf16 wire), DDP's over minidl's (above 1: minidl is faster),
    and the fraction of minidl's all-reduce hidden. Empty where no net result is present."""
    rows = [r for r in with_scaling(results) if r["transport"] == "net" and r["collectives"] and not r["shard"]]
    pairs = {}
    for r in rows:
        pairs.setdefault((r["case"], r["precision"], r["ranks"], r["grad_reduce"]), {})[r["framework"]] = r
    if not pairs:
        return ""
    lines = ["| case | precision | N | gradients sent as | MiB a step | minidl ms/step | PyTorch DDP ms/step | "
             "DDP / minidl | minidl hidden |", "|---|---|---|---|---|---|---|---|---|"]
    for (case, precision, n, wire), p in sorted(pairs.items()):
        mine, ddp = p.get("minidl"), p.get("torch-ddp")
        ratio = ddp["ms_step"] / mine["ms_step"] if mine and ddp else None
        mib = (mine or ddp).get("wire_mib")
        lines.append(f"| {case} | {precision} | {n} | {wire} | {_fmt(mib, '.1f')} | "
                     f"{_fmt(mine and mine['ms_step'], '.1f')} | {_fmt(ddp and ddp['ms_step'], '.1f')} | "
                     f"{_fmt(ratio, '.2f')} | {_hidden_cell(mine) if mine else '-'} |")
    return "\n".join(lines)


# -- the model ---------------------------------------------------------------------------------------
@dataclass
class Parts:
    """What the model is fed, measured on one host at `n` GPUs: one GPU's step `t1`, the step
    `without` its collectives and `with_ms` them, ms; `mib` the bytes a rank's gradients take on the
    wire, MiB; `alone` the all-reduce alone, ms, in `buckets` collectives; optionally `rs_ag` the
    reduce-scatter + all-gather alone and `with_shard` the sharded optimizer's step, ms."""
    name: str
    t1: float
    without: float
    with_ms: float
    alone: float
    mib: float
    n: int
    buckets: int = 1
    rs_ag: float | None = None
    with_shard: float | None = None

    @property
    def exposed(self):
        """e: the step's cost of the collectives as a fraction of their time alone, >= 0."""
        return max(self.with_ms - self.without, 0.0) / self.alone


@dataclass
class Net:
    """The network between hosts: `nics` per host of `gbps` Gb/s each, of which NCCL's ring reaches
    `efficiency`, and `latency_us` for each hop of NCCL's tree between hosts."""
    nics: int
    gbps: float
    efficiency: float = 0.9
    latency_us: float = 10.0

    @property
    def mib_per_ms(self):
        """The ring's bus bandwidth through the NICs, MiB/ms: nics x Gb/s / 8 x efficiency."""
        return self.nics * self.gbps * 1e9 / 8 * self.efficiency / 2 ** 20 / 1e3

    def __str__(self):
        return f"{self.nics}x{self.gbps:g} Gb/s"


def ring_factor(n):
    """The share of the data each rank sends in a ring all-reduce (and in reduce-scatter + all-gather): 2(N-1)/N."""
    return 2 * (n - 1) / n


def comm_ms(parts, N, gpus_per_host=8, net=None, sharded=False):
    """The collectives of one step alone at N GPUs, ms: one host while N <= gpus_per_host (or without
    `net`), else N / gpus_per_host hosts joined by `net`. None where the part is not measured."""
    alone = parts.rs_ag if sharded else parts.alone
    if alone is None:
        return None
    host = ring_factor(parts.n) * parts.mib / alone          # the bus bandwidth measured, MiB/ms
    if N <= gpus_per_host or net is None:
        return ring_factor(N) * parts.mib / host
    hosts = math.ceil(N / gpus_per_host)
    calls = parts.buckets * (2 if sharded else 1)
    return (ring_factor(N) * parts.mib / min(host, net.mib_per_ms)
            + calls * 2 * math.log2(hosts) * net.latency_us / 1e3)


def step_ms(parts, N, gpus_per_host=8, net=None, sharded=False):
    """The predicted step at N GPUs, ms (see the module's docstring); None where a part is missing."""
    comm = comm_ms(parts, N, gpus_per_host, net, sharded)
    if comm is None:
        return None
    if not sharded:
        return parts.without + parts.exposed * comm
    if parts.with_shard is not None:                         # the sharded step's own exposed fraction
        return parts.without + max(parts.with_shard - parts.without, 0.0) / parts.rs_ag * comm
    return parts.without + parts.exposed * comm / 2 + comm / 2     # the all-gather follows the update


def efficiency(parts, N, **kw):
    """t1 / step(N): the images/s of N GPUs over N times one GPU's. None where a part is missing."""
    s = step_ms(parts, N, **kw)
    return None if s is None else parts.t1 / s


def parts_from_results(results):
    """One Parts per (case, precision, wire) of minidl over NVLink, at the largest N where the step
    with collectives, the step without, the all-reduce alone and one GPU's step were all measured."""
    rows = with_scaling(results)
    one = {(r["case"], r["precision"]): r["ms_step"] for r in rows
           if r["framework"] == "minidl" and r["ranks"] == 1 and r["collectives"] and not r["shard"]}
    shard = {(r["case"], r["precision"], r["grad_reduce"], r["ranks"]): r["ms_step"] for r in rows
             if r["framework"] == "minidl" and r["shard"] and r["transport"] == "nvlink"}
    best = {}
    for r in rows:
        k = (r["case"], r["precision"])
        if (r["framework"] != "minidl" or r["shard"] or r["transport"] != "nvlink" or r["ranks"] < 2 or
                r["without_ms"] is None or not r.get("allreduce_ms") or not r.get("wire_mib") or k not in one):
            continue
        name = f"{r['case']} {r['precision']}" + (" bf16-wire" if r["grad_reduce"] == "bf16" else "")
        if name not in best or r["ranks"] > best[name].n:
            best[name] = Parts(name, one[k], r["without_ms"], r["ms_step"], r["allreduce_ms"], r["wire_mib"],
                               r["ranks"], r.get("buckets") or 1, r.get("rs_ag_ms"),
                               shard.get((*k, r["grad_reduce"], r["ranks"])))
    return list(best.values())


def parts_table(parts):
    """Markdown rows of the model's inputs and the bus bandwidth they imply."""
    lines = ["| parts | n | 1 GPU ms | without ms | with ms | all-reduce alone ms | bus GB/s | exposed | MiB | "
             "buckets | RS + AG alone ms | sharded step ms |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in parts:
        bus = ring_factor(p.n) * p.mib * 2 ** 20 / (p.alone * 1e-3) / 1e9
        lines.append(f"| {p.name} | {p.n} | {p.t1:.3f} | {p.without:.3f} | {p.with_ms:.3f} | {p.alone:.3f} | "
                     f"{bus:.0f} | {p.exposed:.2f} | {p.mib:.1f} | {p.buckets} | {_fmt(p.rs_ag, '.3f')} | "
                     f"{_fmt(p.with_shard, '.3f')} |")
    return "\n".join(lines)


def model_table(parts, ns=NS, gpus_per_host=8, nets=(Net(4, 400), Net(8, 400))):
    """Markdown rows of the predicted efficiency at each N: one host over NVLink (N <= gpus_per_host),
    and N / gpus_per_host hosts over each of `nets`; ring (all-reduce) and sharded (RS + AG)."""
    head = ["| parts | collectives | N | hosts | one host (NVLink) |", "|---|---|---|---|---|"]
    head[0] += "".join(f" {n} a host |" for n in nets)
    head[1] += "---|" * len(nets)
    lines = list(head)
    for p in parts:
        for sharded in (False, True):
            if sharded and p.rs_ag is None:
                continue
            for N in ns:
                one = efficiency(p, N, gpus_per_host=gpus_per_host, sharded=sharded) if N <= gpus_per_host else None
                many = [efficiency(p, N, gpus_per_host=gpus_per_host, net=net, sharded=sharded)
                        if N > gpus_per_host else None for net in nets]
                lines.append(f"| {p.name} | {'RS + AG' if sharded else 'all-reduce'} | {N} | "
                             f"{max(1, math.ceil(N / gpus_per_host))} | {_fmt(one, '.0%')} |"
                             + "".join(f" {_fmt(e, '.0%')} |" for e in many))
    return "\n".join(lines)


def assumptions(gpus_per_host, nets):
    """The model's stated inputs, one line."""
    return (f"model: {gpus_per_host} GPUs a host; between hosts the ring runs at the lesser of the host's measured "
            "bus bandwidth and the NICs' line rate x efficiency (" +
            ", ".join(f"{n}: {n.mib_per_ms * 2 ** 20 * 1e3 / 1e9:.0f} GB/s, {n.latency_us:g} us a tree hop"
                      for n in nets) +
            "); the step without collectives and the exposed fraction as measured at n.")


def plot(results, path):
    """One panel per (case, precision): images/s against N for each framework, and minidl's ideal
    (N times its one-GPU figure) dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in with_scaling(results) if r["collectives"]]
    panels = sorted({(r["case"], r["precision"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (case, precision) in zip(axes[0], panels):
        mine = [r for r in rows if (r["case"], r["precision"]) == (case, precision)]
        for framework in sorted({r["label"] for r in mine}):
            pts = [(r["ranks"], r["images_s"]) for r in mine if r["label"] == framework]
            ax.plot(*zip(*pts), marker="o", label=framework)
        one = [r["images_s"] for r in mine if r["label"] == "minidl" and r["ranks"] == 1]
        ns = sorted({r["ranks"] for r in mine})
        if one:
            ax.plot(ns, [n * one[0] for n in ns], "k--", lw=1, label="ideal (minidl)")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="GPUs", ylabel="images/s", title=f"{case} {precision}")
        ax.set_xticks(ns, labels=[str(n) for n in ns])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- the command line --------------------------------------------------------------------------------
def _net(text):
    """'4x400' -> Net(4, 400): NICs a host x Gb/s each."""
    try:
        nics, gbps = text.lower().split("x")
        net = Net(int(nics), float(gbps))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a network is NICSxGBPS (4x400: four 400 Gb/s NICs a host), got {text!r}")
    if net.nics < 1 or net.gbps <= 0:
        raise argparse.ArgumentTypeError(f"a network needs at least one NIC of positive speed, got {text!r}")
    return net


_PART_KEYS = {"t1": float, "without": float, "with": float, "alone": float, "mib": float, "n": int,
              "buckets": int, "rs_ag": float, "with_shard": float}


def parse_parts(items, name="parts"):
    """['t1=3.1', 'without=3.0', ...] -> Parts (t1, without, with, alone, mib, n required)."""
    given = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in _PART_KEYS:
            raise ValueError(f"--parts: unknown part {key!r} (known: {', '.join(_PART_KEYS)})")
        try:
            given[key] = _PART_KEYS[key](value)
        except ValueError:
            raise ValueError(f"--parts: {key} must be a number, got {value!r}") from None
    missing = [k for k in ("t1", "without", "with", "alone", "mib", "n") if k not in given]
    if missing:
        raise ValueError(f"--parts: missing {', '.join(missing)}")
    if given["alone"] <= 0 or given["n"] < 2:
        raise ValueError("--parts: alone must be > 0 ms and n >= 2 GPUs")
    return Parts(name, given["t1"], given["without"], given["with"], given["alone"], given["mib"], given["n"],
                 given.get("buckets", 1), given.get("rs_ag"), given.get("with_shard"))


def report(parts, ns=NS, gpus_per_host=8, nets=(Net(4, 400), Net(8, 400)), out=print):
    """Print the parts, the model's assumptions and its table."""
    if not parts:
        out("model: no parts (needs minidl at N >= 2 with and without collectives, the all-reduce alone, and N = 1)")
        return
    out(parts_table(parts))
    out(assumptions(gpus_per_host, nets))
    out(model_table(parts, ns, gpus_per_host, nets))


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/scaling.py", description=__doc__.splitlines()[0])
    p.add_argument("results", nargs="?", help="bench_dist.py --json results (JSON lines)")
    p.add_argument("--parts", nargs="+", metavar="KEY=VALUE",
                   help="one case's parts instead: t1 without with alone mib n [buckets rs_ag with_shard] (ms, MiB)")
    p.add_argument("--ns", nargs="+", type=int, default=list(NS), help="GPUs to predict (default 4 8 16 32 64)")
    p.add_argument("--gpus-per-host", type=int, default=8)
    p.add_argument("--net", nargs="+", type=_net, default=[Net(4, 400), Net(8, 400)],
                   help="NICs a host x Gb/s each (default 4x400 8x400: InfiniBand NDR)")
    p.add_argument("--net-efficiency", type=float, default=0.9, help="the line rate NCCL's ring reaches (0.9)")
    p.add_argument("--latency-us", type=float, default=10.0, help="a hop of NCCL's tree between hosts (10 us)")
    args = p.parse_args(argv)
    if (args.results is None) == (args.parts is None):
        p.error("give a results file or --parts, one of the two")
    if args.gpus_per_host < 1 or any(n < 2 for n in args.ns):
        p.error("--gpus-per-host must be >= 1 and every --ns >= 2")
    nets = [Net(n.nics, n.gbps, args.net_efficiency, args.latency_us) for n in args.net]
    try:
        parts = [parse_parts(args.parts)] if args.parts else parts_from_results(read(args.results))
    except (ValueError, OSError) as e:
        print(f"scaling: {e}", file=sys.stderr)
        return 2
    report(parts, args.ns, args.gpus_per_host, nets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
