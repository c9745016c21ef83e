"""python -m minidl.bench train|infer: minidl and PyTorch side by side, in one process, on one GPU.

train: both frameworks train the same architecture on the same MNIST batches (the minidl loader's
seeded order), with the same optimizer; PyTorch runs eagerly and with its whole step captured
in a CUDA graph. Prints a table of ms/step, ratios, peak GPU memory and test accuracy.

infer: minidl's compiled inference model (BN folded, fused kernels, a CUDA graph per batch size)
against PyTorch eager and PyTorch with the forward captured in a CUDA graph (eval mode, no_grad),
on the same weights (minidl's, randomly initialised with non-trivial BN statistics, copied into
the PyTorch model by layer): batch-1 latency (median and p99 over --runs calls, input already on
the device, each call launched and waited for) and ms per call for large batches; the outputs'
largest difference is reported. --json writes the figures.
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
INFER_CASES = {
    "lenet-b1": dict(model="lenet", depth=None, batch=1),
    "lenet-10k": dict(model="lenet", depth=None, batch=10000),
    "resnet50-b1": dict(model="resnet", depth=50, batch=1),
    "resnet50-b1000": dict(model="resnet", depth=50, batch=1000),
}


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


# -- inference --------------------------------------------------------------------------------
def randomize_weights(model, seed=0):
    """Non-trivial BN statistics, gamma, beta and biases on a freshly initialised minidl model."""
    rng = np.random.default_rng(seed)
    w = model.get_weights()
    draw = {"gamma": lambda n: rng.uniform(0.5, 1.5, n), "beta": lambda n: rng.normal(0, 0.2, n),
            "running_mean": lambda n: rng.normal(0, 0.2, n), "running_var": lambda n: rng.uniform(0.5, 2.0, n),
            "b": lambda n: rng.normal(0, 0.1, n)}
    for k, v in w.items():
        f = draw.get(k.rsplit("/", 1)[1])
        if f is not None:
            w[k] = f(v.shape)
    model.set_weights(w)
    return model


def _torch_param_modules(tmodel):
    """The conv, BN and linear modules of a torch_model() in minidl's layer order (in a residual
    block minidl orders the projection shortcut first, then the branch)."""
    import torch.nn as nn
    kinds = (nn.Conv2d, nn.BatchNorm2d, nn.Linear)
    for child in tmodel.children():
        if hasattr(child, "short") and hasattr(child, "body"):
            for part in (child.short, child.body):
                yield from (m for m in part.modules() if isinstance(m, kinds))
        elif isinstance(child, kinds):
            yield child


def torch_from_minidl(case, model, device="cuda"):
    """torch_model(case) holding `model`'s weights (matched by layer order, checked by shape), eval mode."""
    import torch
    import torch.nn as nn
    from minidl import layers as L
    tmodel = torch_model(case)
    src = [layer for layer in model.layers if isinstance(layer, (L.Conv2D, L.BatchNorm2D, L.Dense))]
    dst = list(_torch_param_modules(tmodel))
    if len(src) != len(dst):
        raise ValueError(f"{model.name}: {len(src)} minidl layers with weights, {len(dst)} PyTorch modules")
    w = model.get_weights()

    def put(param, key):
        a = torch.from_numpy(np.ascontiguousarray(w[key], dtype=np.float32))
        if tuple(param.shape) != tuple(a.shape):
            raise ValueError(f"{key}: minidl {tuple(a.shape)} vs PyTorch {tuple(param.shape)}")
        param.copy_(a)

    with torch.no_grad():
        for layer, mod in zip(src, dst):
            n = layer.name
            if isinstance(layer, L.BatchNorm2D) != isinstance(mod, nn.BatchNorm2d):
                raise ValueError(f"layer {n} ({type(layer).__name__}) meets PyTorch {type(mod).__name__}")
            if isinstance(layer, L.BatchNorm2D):
                for key, param in (("gamma", mod.weight), ("beta", mod.bias), ("running_mean", mod.running_mean),
                                   ("running_var", mod.running_var)):
                    put(param, f"{n}/{key}")
                mod.eps = layer.eps
            else:
                put(mod.weight, f"{n}/w")
                if f"{n}/b" in w:
                    put(mod.bias, f"{n}/b")
                elif mod.bias is not None:
                    mod.bias.zero_()
    return tmodel.to(device).eval()


def _latency(fn, sync, runs):
    """(median, p99) seconds of fn() + sync(), after warm-up calls."""
    for _ in range(20):
        fn()
        sync()
    times = np.empty(runs)
    for i in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        times[i] = time.perf_counter() - t0
    return float(np.median(times)), float(np.percentile(times, 99))


def _per_call(fn, sync, min_calls=10, min_seconds=0.5):
    """(median seconds per call of fn() + sync(), calls) over at least min_calls calls and min_seconds."""
    for _ in range(3):
        fn()
        sync()
    times, t_start = [], time.perf_counter()
    while len(times) < min_calls or (time.perf_counter() - t_start < min_seconds and len(times) < 500):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), len(times)


def _gpu_seconds(fn, record, elapsed, reps=100):
    """Seconds of GPU time per call of fn, launched back to back between two events."""
    fn()
    start, end = record(), None
    for _ in range(reps):
        fn()
    end = record()
    return elapsed(start, end) / reps


def _measure(fn, sync, batch, runs, gpu=None):
    r = {"batch": batch}
    if batch == 1:
        med, p99 = _latency(fn, sync, runs)
        r.update(latency_us=1e6 * med, p99_us=1e6 * p99, runs=runs, ms_per_call=1e3 * med)
    else:
        sec, calls = _per_call(fn, sync)
        r.update(ms_per_call=1e3 * sec, calls=calls, images_per_s=batch / sec)
    if gpu is not None:
        r["gpu_us"] = 1e6 * gpu()
    return r


def bench_infer(names, out=print, runs=1000, seed=0):
    import cupy as cp
    import minidl as dl
    from minidl import inference, models
    try:
        import torch
        torch.backends.cudnn.benchmark = True          # PyTorch's fastest cuDNN algorithms (TF32 convs: its default)
    except ImportError:
        torch = None
        out("PyTorch is not installed: minidl figures only")
    dev = dl.get_device("cuda")
    stream = dev.stream
    results, built = {}, {}
    for name in names:
        case = INFER_CASES[name]
        key = (case["model"], case["depth"])
        if key not in built:
            model = randomize_weights(models.get(case["model"], depth=case["depth"], seed=seed), seed)
            built[key] = (model, inference.compile(model, device=dev),
                          torch_from_minidl(case, model) if torch else None)
        model, m, tmodel = built[key]
        N = case["batch"]
        x = np.random.default_rng(seed + N).standard_normal((N, *model.inputs[0].shape[1:])).astype(np.float32)
        r = {}
        buf = m.input_buffer(N)                          # captures the graph for this batch size
        with stream:
            buf[...] = cp.asarray(x)
        stream.synchronize()

        def run_minidl():
            return m.predict(buf)

        def cp_event():
            e = cp.cuda.Event()
            e.record(stream)
            return e

        def cp_elapsed(a, b):
            b.synchronize()
            return cp.cuda.get_elapsed_time(a, b) / 1e3

        y_minidl = cp.asnumpy(run_minidl()).copy()
        r["minidl"] = _measure(run_minidl, stream.synchronize, N, runs,
                               gpu=lambda: _gpu_seconds(run_minidl, cp_event, cp_elapsed))
        r["minidl"]["schedule"] = [st.kind for st in m.schedule(N)[0]]
        if torch is not None:
            xt = torch.from_numpy(x).cuda()
            tstream = torch.cuda.current_stream()

            def t_event():
                e = torch.cuda.Event(enable_timing=True)
                e.record(tstream)
                return e

            def t_elapsed(a, b):
                b.synchronize()
                return a.elapsed_time(b) / 1e3

            with torch.no_grad():
                def run_eager():
                    return tmodel(xt)
                y_torch = run_eager().float().cpu().numpy()
                r["torch_eager"] = _measure(run_eager, tstream.synchronize, N, runs)
                side = torch.cuda.Stream()
                side.wait_stream(tstream)
                with torch.cuda.stream(side):
                    for _ in range(3):
                        tmodel(xt)
                tstream.wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y_static = tmodel(xt)
                graph.replay()
                tstream.synchronize()
                y_graph = y_static.cpu().numpy()
                r["torch_graph"] = _measure(graph.replay, tstream.synchronize, N, runs,
                                            gpu=lambda: _gpu_seconds(graph.replay, t_event, t_elapsed))
                del graph, y_static
            scale = float(np.abs(y_torch).max())
            for runner, y in (("minidl", y_minidl), ("torch_graph", y_graph)):
                err = float(np.abs(y - y_torch).max())
                r[runner].update(max_abs_diff_vs_torch_eager=err, rel_diff=err / scale)
            r["minidl"]["argmax_agreement"] = float((y_minidl.argmax(1) == y_torch.argmax(1)).mean())
        results[name] = r
        out(f"{name}: " + ", ".join(f"{k} {_fmt_time(v)}" for k, v in r.items()))
    print_infer_table(results, out)
    return results


def _fmt_time(v):
    if v["batch"] == 1:
        return f"{v['latency_us']:.1f} us (p99 {v['p99_us']:.1f})"
    return f"{v['ms_per_call']:.3f} ms"


def print_infer_table(results, out=print):
    out(f"{'case':<15} {'runner':<12} {'batch':>6} {'median':>10} {'p99':>10} {'GPU time':>10} "
        f"{'vs torch eager':>15} {'vs torch graph':>15} {'max|dy|/max|y|':>15}")
    for name, r in results.items():
        te, tg = r.get("torch_eager"), r.get("torch_graph")
        for runner, v in r.items():
            ratio = (lambda ref: f"{ref['ms_per_call'] / v['ms_per_call']:.2f}x" if ref else "-")
            if v["batch"] == 1:
                med, p99 = f"{v['latency_us']:.1f} us", f"{v['p99_us']:.1f} us"
            else:
                med, p99 = f"{v['ms_per_call']:.3f} ms", "-"
            gpu = f"{v['gpu_us']:.1f} us" if "gpu_us" in v else "-"
            diff = f"{v['rel_diff']:.1e}" if "rel_diff" in v else "-"
            out(f"{name:<15} {runner:<12} {v['batch']:>6} {med:>10} {p99:>10} {gpu:>10} "
                f"{ratio(te):>15} {ratio(tg):>15} {diff:>15}")
    out("ratios: the reference's time over this runner's (above 1: faster than the reference); "
        "max|dy|/max|y|: against PyTorch eager's output")


def _environment():
    env = {}
    try:
        import cupy as cp
        env["gpu"] = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"].decode()
        env["cupy"] = cp.__version__
    except Exception:
        pass
    try:
        from minidl.kernels.gpu import cudnn
        env["cudnn"] = cudnn.version()
    except Exception:
        pass
    try:
        import torch
        env["torch"] = torch.__version__
    except ImportError:
        pass
    return env


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m minidl.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="what", required=True)
    t = sub.add_parser("train", help="training speed against PyTorch eager and CUDA-graph")
    t.add_argument("--cases", default=",".join(TRAIN_CASES), help="comma-separated: " + ", ".join(TRAIN_CASES))
    t.add_argument("--json", help="write the figures to this file")
    i = sub.add_parser("infer", help="inference latency and throughput against PyTorch eager and CUDA-graph")
    i.add_argument("--cases", default=",".join(INFER_CASES), help="comma-separated: " + ", ".join(INFER_CASES))
    i.add_argument("--runs", type=int, default=1000, help="timed batch-1 calls per runner (1000)")
    i.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    table = TRAIN_CASES if args.what == "train" else INFER_CASES
    names = args.cases.split(",")
    bad = [n for n in names if n not in table]
    if bad:
        p.error(f"unknown case(s) {', '.join(bad)}: expected {', '.join(table)}")
    if args.what == "train":
        results = bench_train(names)
    else:
        if args.runs < 1000:
            p.error(f"--runs must be at least 1000 (a p99 needs them), got {args.runs}")
        results = {"cases": bench_infer(names, runs=args.runs), "environment": _environment()}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
