"""python -m minidl.bench train|infer: minidl and PyTorch side by side, in one process, on one GPU.

Both frameworks train the same architecture on the same MNIST batches (the minidl loader's
seeded order), with the same optimizer; PyTorch runs eagerly and with its whole step captured
in a CUDA graph. Prints a table of ms/step, ratios, peak GPU memory and test accuracy; --json
writes the figures.
"""
import argparse
import json
import sys
import time

import numpy as np

TRAIN_CASES = {
    "resnet50": dict(model="resnet", depth=50, batch=32, steps=500, optimizer="momentum", lr=0.01),
    "lenet-b32": dict(model="lenet", depth=None, batch=32, epochs=1, optimizer="adam", lr=1e-3),
    "lenet-b256": dict(model="lenet", depth=None, batch=256, epochs=1, optimizer="adam", lr=1e-3),
}
WARMUP = 10          # steps run before the clock starts (capture, cuDNN plans, autotuning)


# -- minidl -----------------------------------------------------------------------------------
def minidl_train(case, train, test, graph=True, seed=0):
    import minidl as dl
    from minidl import models, optim
    dev = dl.get_device("cuda", seed=seed)
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=seed)
    opt = optim.get(case["optimizer"], lr=case["lr"], **({"momentum": 0.9} if case["optimizer"] == "momentum" else {}))
    trainer = dl.Trainer(model, opt, seed=seed, graph=graph, progress=False, log=lambda s: None)
    loader = dl.data.Loader(*train, case["batch"], dev, seed=seed)
    steps = case.get("steps") or case["epochs"] * len(loader)
    trainer.fit(loader, steps=WARMUP, monitor=10 ** 9)
    dev.sync()
    t0 = time.perf_counter()
    trainer.fit(loader, steps=steps - WARMUP, monitor=10 ** 9)
    dev.sync()
    ms = (time.perf_counter() - t0) / (steps - WARMUP) * 1e3
    _, acc = trainer.evaluate(test, batch_size=1000)
    return {"ms_per_step": ms, "test_accuracy": acc, "peak_mem_mb": _cupy_reserved_mb(), "steps": steps}


def _cupy_reserved_mb():
    import cupy as cp
    from minidl import cudagraph
    pools = [cp.get_default_memory_pool()] + list(getattr(cudagraph, "POOLS", []))
    return sum(p.total_bytes() for p in pools) / 2 ** 20


# -- PyTorch ----------------------------------------------------------------------------------
def torch_model(case):
    import torch.nn as nn
    if case["model"] == "lenet":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    return _torch_resnet(case["depth"])


def _torch_resnet(depth):
    """minidl's zoo ResNet in PyTorch: the same layers, explicit pads before strided 3x3 convs."""
    import torch.nn as nn
    from minidl.models.resnet import RESNET_DEPTHS
    block, counts = RESNET_DEPTHS[depth]

    def conv_bn(cin, cout, k, stride=1, pad=0):
        layers = [nn.ZeroPad2d(pad)] if stride > 1 and k == 3 else []
        layers += [nn.Conv2d(cin, cout, k, stride, 0 if layers else pad, bias=False), nn.BatchNorm2d(cout)]
        return layers

    class Block(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            if block == "bottleneck":
                cout = width * 4
                body = conv_bn(cin, width, 1) + [nn.ReLU()] + conv_bn(width, width, 3, stride, 1) + \
                    [nn.ReLU()] + conv_bn(width, cout, 1)
            else:
                cout = width
                body = conv_bn(cin, width, 3, stride, 1) + [nn.ReLU()] + conv_bn(width, width, 3, 1, 1)
            self.body = nn.Sequential(*body)
            self.short = nn.Sequential(*conv_bn(cin, cout, 1, stride)) if stride > 1 or cin != cout else nn.Identity()
            self.relu, self.cout = nn.ReLU(), cout

        def forward(self, x):
            return self.relu(self.short(x) + self.body(x))

    layers = [nn.ZeroPad2d(3), nn.Conv2d(1, 64, 7, 2, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, (n, width) in enumerate(zip(counts, (64, 128, 256, 512))):
        for j in range(n):
            b = Block(cin, width, 2 if (i > 0 and j == 0) else 1)
            layers.append(b)
            cin = b.cout
    layers += [nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


def torch_train(case, train, test, graph, seed=0):
    import torch
    import torch.nn.functional as F
    import minidl as dl
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    model = torch_model(case).to(dev).to(memory_format=torch.contiguous_format)
    if case["optimizer"] == "momentum":
        opt = torch.optim.SGD(model.parameters(), lr=case["lr"], momentum=0.9)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=case["lr"], capturable=graph)
    x_all = ((torch.tensor(train[0], device=dev).float() / 255 - 0.1307) / 0.3081).unsqueeze(1)
    y_all = torch.tensor(train[1], device=dev).long()
    order = dl.data.Loader(*train, case["batch"], dl.get_device("cpu"), seed=seed)   # the same batches
    B, per_epoch = case["batch"], len(order)
    steps = case.get("steps") or case["epochs"] * per_epoch
    perms = {}

    def indices(step):
        e, k = divmod(step, per_epoch)
        if e not in perms:
            perms[e] = torch.tensor(order.order(e), device=dev)
        return perms[e][k * B:(k + 1) * B]

    sx, sy = torch.empty((B, 1, 28, 28), device=dev), torch.empty(B, dtype=torch.long, device=dev)
    loss_sum, hits = torch.zeros((), device=dev), torch.zeros((), device=dev, dtype=torch.long)

    def step_fn():
        opt.zero_grad(set_to_none=False)
        out = model(sx)
        loss = F.cross_entropy(out, sy)
        loss.backward()
        opt.step()
        loss_sum.add_(loss.detach())
        hits.add_((out.argmax(1) == sy).sum())

    model.train()
    run = step_fn
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for s in range(3):
                torch.index_select(x_all, 0, indices(s), out=sx)
                torch.index_select(y_all, 0, indices(s), out=sy)
                step_fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step_fn()
        run = g.replay
    torch.cuda.reset_peak_memory_stats()
    t0 = None
    for s in range(3 if graph else 0, steps):
        if s == WARMUP:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        torch.index_select(x_all, 0, indices(s), out=sx)
        torch.index_select(y_all, 0, indices(s), out=sy)
        run()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / (steps - WARMUP) * 1e3
    model.eval()
    xt = ((torch.tensor(test[0], device=dev).float() / 255 - 0.1307) / 0.3081).unsqueeze(1)
    yt = torch.tensor(test[1], device=dev).long()
    with torch.no_grad():
        correct = sum(int((model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum()) for i in range(0, len(yt), 1000))
    return {"ms_per_step": ms, "test_accuracy": 100.0 * correct / len(yt),
            "peak_mem_mb": torch.cuda.max_memory_reserved() / 2 ** 20, "steps": steps}


# -- driver -----------------------------------------------------------------------------------
def bench_train(names, out=print):
    import minidl as dl
    train, test = dl.data.mnist("train"), dl.data.mnist("test")
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
        out("PyTorch is not installed: minidl figures only")
    results = {}
    for name in names:
        case = TRAIN_CASES[name]
        r = {"minidl": minidl_train(case, train, test, graph=True),
             "minidl_eager": minidl_train(case, train, test, graph=False)}
        if have_torch:
            r["torch_eager"] = torch_train(case, train, test, graph=False)
            r["torch_graph"] = torch_train(case, train, test, graph=True)
        results[name] = r
        out(f"{name}: " + ", ".join(f"{k} {v['ms_per_step']:.3f} ms/step {v['test_accuracy']:.2f}%" for k, v in r.items()))
    print_table(results, out)
    return results


def print_table(results, out=print):
    out(f"{'case':<12} {'runner':<13} {'ms/step':>9} {'vs torch eager':>15} {'vs torch graph':>15} "
        f"{'peak MiB':>9} {'test acc':>9}")
    for name, r in results.items():
        te, tg = r.get("torch_eager"), r.get("torch_graph")
        for runner, v in r.items():
            ratio = lambda ref: f"{ref['ms_per_step'] / v['ms_per_step']:.2f}x" if ref else "-"
            out(f"{name:<12} {runner:<13} {v['ms_per_step']:>9.3f} {ratio(te):>15} {ratio(tg):>15} "
                f"{v['peak_mem_mb']:>9.0f} {v['test_accuracy']:>8.2f}%")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minidl.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train", help="training speed against PyTorch eager and CUDA-graph")
    t.add_argument("--cases", default=",".join(TRAIN_CASES), help="comma-separated: " + ", ".join(TRAIN_CASES))
    t.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    names = args.cases.split(",")
    bad = [n for n in names if n not in TRAIN_CASES]
    if bad:
        p.error(f"unknown case(s) {', '.join(bad)}: expected {', '.join(TRAIN_CASES)}")
    results = bench_train(names)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
