"""minidl against PyTorch on the cuDNN-vs-PyTorch study's nets: the same GPU, the same initial
weights, the same batches; test accuracy and training time after each listed epoch.

    python -m benchmarks.compare --epochs 1 5 15 30 45 [--models simplenet lenet-caffe relunet largenet]
                                 [--datasets mnist fashion-mnist] [--out compare_results]

SGD (lr 0.01, no momentum), batch 64, inputs normalised with mean 0.1307 and std 0.3081 (the
study's, for both datasets). Both
frameworks start from minidl's seeded initial weights (copied into the PyTorch twin by
minidl.checkpoint.torch_names) and visit the minidl loader's seeded batch order. Writes compare.md (one
Markdown table) and one PNG per model and dataset (accuracy and time against epochs). Without a usable GPU it
prints one line and exits 2. The pieces that need no GPU (copy_weights, markdown_table) are
importable on their own.

Each framework runs in a process of its own (`--framework`, which writes its points as JSON), so
each pays its own start-up once, in its first model's first epoch: the two load the same cuDNN and
cuBLAS, and in one process the second to run would find the kernels the first had loaded (on an
H200, SimpleNet's first minidl epoch took 0.154 s after PyTorch's run and 0.241 s alone; PyTorch's
1.05-1.17 s after minidl's and 1.32-1.58 s alone). Both set up cuBLAS before their timers:
minidl's Device does when it is made (a 1x1 GEMM of each form a dense layer runs), and run_torch
runs the same three GEMMs first.
"""
import argparse
import json
import os
import subprocess
import sys
import time

MODELS = ("simplenet", "lenet-caffe", "relunet", "largenet")
FRAMEWORKS = ("minidl", "PyTorch")


def copy_weights(model, twin):
    """Load minidl `model`'s weights into its PyTorch `twin` (strict: every name and shape)."""
    import torch
    from minidl.checkpoint.torch_names import to_torch
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in to_torch(model).items()}, strict=True)
    return twin


def markdown_table(results, epochs):
    """One row per model and listed epoch: test accuracy, the time per epoch since the row before
    (the first row: since the start, capture and plans included), minidl's speed-up there (PyTorch's
    time per epoch over minidl's) and the cumulative training time of each framework.

    results: {model: {framework: [{"epoch", "test_accuracy", "train_s"}, ...]}}.
    """
    head = (["model", "epochs"] + [f"{f} accuracy (%)" for f in FRAMEWORKS] + [f"{f} s/epoch" for f in FRAMEWORKS]
            + ["speed-up"] + [f"{f} total (s)" for f in FRAMEWORKS])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model, runs in results.items():
        by_epoch = {f: {r["epoch"]: r for r in runs.get(f, [])} for f in FRAMEWORKS}
        for prev, e in zip([0] + list(epochs), epochs):
            per_epoch = {}
            for f in FRAMEWORKS:
                now, before = by_epoch[f].get(e), by_epoch[f].get(prev, {"train_s": 0.0} if prev == 0 else None)
                if now and before:
                    per_epoch[f] = (now["train_s"] - before["train_s"]) / (e - prev)
            cells = [model, str(e)]
            cells += ["{:.2f}".format(by_epoch[f][e]["test_accuracy"]) if e in by_epoch[f] else "-" for f in FRAMEWORKS]
            cells += ["{:.3f}".format(per_epoch[f]) if f in per_epoch else "-" for f in FRAMEWORKS]
            cells.append("{:.1f}x".format(per_epoch["PyTorch"] / per_epoch["minidl"]) if len(per_epoch) == 2 else "-")
            cells += ["{:.2f}".format(by_epoch[f][e]["train_s"]) if e in by_epoch[f] else "-" for f in FRAMEWORKS]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def plot_model(name, runs, out):
    """Accuracy and cumulative training time against epochs for one model, both frameworks."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_acc, ax_time) = plt.subplots(1, 2, figsize=(10, 3.8))
    for f in FRAMEWORKS:
        pts = runs.get(f, [])
        ax_acc.plot([p["epoch"] for p in pts], [p["test_accuracy"] for p in pts], "o-", label=f)
        ax_time.plot([p["epoch"] for p in pts], [p["train_s"] for p in pts], "o-", label=f)
    ax_acc.set(xlabel="epoch", ylabel="test accuracy (%)", title=f"{name}: accuracy")
    ax_time.set(xlabel="epoch", ylabel="training time (s)", title=f"{name}: time")
    for ax in (ax_acc, ax_time):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


# -- the runs (GPU only) ----------------------------------------------------------------------------
def run_minidl(name, epochs, train, test, args):
    import minidl as dl
    from minidl import models, optim
    dev = dl.get_device("cuda", seed=args.seed)
    trainer = dl.Trainer(models.get(name, device=dev, seed=args.seed), optim.SGD(lr=args.lr), seed=args.seed,
                         progress=False, log=lambda s: None)
    loader = dl.data.Loader(*train, args.batch, dev, seed=args.seed)
    points, train_s = [], 0.0
    for e in epochs:
        dev.sync()
        t0 = time.perf_counter()
        trainer.fit(loader, epochs=e, monitor=10 ** 9)      # epochs in all
        dev.sync()
        train_s += time.perf_counter() - t0
        loss, acc = trainer.evaluate(test, batch_size=1000)
        points.append({"epoch": e, "test_accuracy": 100 * acc, "test_loss": loss, "train_s": train_s})
    return points


def run_torch(name, epochs, train, test, args):
    import torch
    import torch.nn.functional as F
    import minidl as dl
    from minidl import models
    from benchmarks.torch_models import torch_model
    dev = torch.device("cuda")
    twin = copy_weights(models.get(name, seed=args.seed), torch_model({"model": name})).to(dev)
    opt = torch.optim.SGD(twin.parameters(), lr=args.lr)

    def tensors(images, labels):
        x = ((torch.tensor(images, device=dev).float() / 255 - 0.1307) / 0.3081).unsqueeze(1)   # (N, 1, 28, 28)
        return x, torch.tensor(labels, device=dev).long()

    (x, y), (tx, ty) = tensors(*train), tensors(*test)
    one = torch.ones(1, 1, device=dev)          # cuBLAS set up before the timer, as minidl's Device does
    for a, b in ((one, one), (one, one.t()), (one.t(), one)):
        torch.mm(a, b)
    order = dl.data.Loader(*train, args.batch, dl.get_device("cpu"), seed=args.seed)       # the same batches
    points, done, train_s = [], 0, 0.0
    for e in epochs:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        twin.train()
        for epoch in range(done, e):
            perm = torch.tensor(order.order(epoch), device=dev)
            for k in range(len(order)):
                idx = perm[k * args.batch:(k + 1) * args.batch]
                opt.zero_grad(set_to_none=False)
                F.cross_entropy(twin(x[idx]), y[idx]).backward()
                opt.step()
        torch.cuda.synchronize()
        train_s += time.perf_counter() - t0
        twin.eval()
        with torch.no_grad():
            logits = torch.cat([twin(tx[i:i + 1000]) for i in range(0, len(tx), 1000)])
            loss = float(F.cross_entropy(logits, ty))
            acc = float((logits.argmax(1) == ty).float().mean()) * 100
        points.append({"epoch": e, "test_accuracy": acc, "test_loss": loss, "train_s": train_s})
        done = e
    return points


def gpu_problem():
    """None when minidl's CUDA path and PyTorch's CUDA are both usable, else why not."""
    from minidl.backend import cuda_status
    ok, why = cuda_status()
    if not ok:
        return why
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    return None if torch.cuda.is_available() else "PyTorch sees no CUDA device"


def parser():
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare", description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, nargs="+", default=[1, 5, 15, 30, 45], help="epochs to report at")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--datasets", nargs="+", default=["mnist", "fashion-mnist"], choices=("mnist", "fashion-mnist"))
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="compare_results", help="folder for compare.md and the PNGs")
    p.add_argument("--framework", choices=FRAMEWORKS,
                   help="run this framework only and write its points to --json (one process per framework)")
    p.add_argument("--json", help="with --framework: where its points go")
    return p


def run_one(framework, args):
    """{model (dataset): points} of one framework over every dataset and model, in this process."""
    from minidl.data import load
    run = run_minidl if framework == "minidl" else run_torch
    points = {}
    for dataset in args.datasets:
        train, test = load(dataset, "train"), load(dataset, "test")
        for name in args.models:
            points[f"{name} ({dataset})"] = run(name, sorted(set(args.epochs)), train, test, args)
    return points


def run_apart(framework, argv, out):
    """run_one in a fresh process (`--framework`); its points, or None when it failed."""
    path = os.path.join(out, f"{framework}.json")
    cmd = [sys.executable, "-m", "benchmarks.compare", *argv, "--framework", framework, "--json", path]
    if subprocess.run(cmd, check=False).returncode != 0:
        return None
    with open(path) as f:
        return json.load(f)


def main(argv=None):
    p = parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    epochs = sorted(set(args.epochs))
    if epochs[0] < 1:
        p.error(f"--epochs must be positive, got {args.epochs}")
    if args.framework and not args.json:
        p.error("--framework needs --json PATH")
    problem = gpu_problem()
    if problem:
        print(f"compare: minidl against PyTorch needs a GPU: {problem}", file=sys.stderr)
        return 2
    if args.framework:
        points = run_one(args.framework, args)
        with open(args.json, "w") as f:
            json.dump(points, f)
        return 0
    os.makedirs(args.out, exist_ok=True)
    points = {f: run_apart(f, argv, args.out) for f in FRAMEWORKS}
    failed = [f for f, pts in points.items() if pts is None]
    if failed:
        print(f"compare: the {' and '.join(failed)} run{'s' * (len(failed) > 1)} failed (the error is above)",
              file=sys.stderr)
        return 1
    results = {key: {f: points[f][key] for f in FRAMEWORKS} for key in points["minidl"]}
    for key, runs in results.items():
        name, dataset = key.split(" (")
        plot_model(key, runs, os.path.join(args.out, f"{name}-{dataset.rstrip(')')}.png"))
        print(key, {f: [round(p["test_accuracy"], 2) for p in r] for f, r in runs.items()}, flush=True)
    table = markdown_table(results, epochs)
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(f"SGD lr {args.lr}, batch {args.batch}, seed {args.seed}; time: training only, cumulative; "
                "each framework in its own process.\n\n")
        f.write(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
