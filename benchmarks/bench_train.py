"""Training speed: minidl and PyTorch train the same architecture on the same MNIST batches.

Both use the minidl loader's seeded order and the same optimizer; PyTorch runs eagerly and with its
whole step captured in a CUDA graph. Peak memory: minidl's is CuPy's pool's reserve plus the most its
captured steps held (Device.memory_bytes: warm-ups, the planned arena, anything that missed it);
PyTorch's is torch.cuda.max_memory_reserved / _allocated.

`precision` (fp32, bf16, fp16): minidl trains under that policy (float32 master weights); PyTorch
runs its best configuration for it: fp32 as it is, bf16 and fp16 under torch.autocast with the model
and the batches channels-last. fp16 scales the loss: eagerly with a GradScaler; captured with a static
scale of 2^10 (the GradScaler decides on the host, which a CUDA graph cannot replay).
"""
import gc
import importlib.util
import time

TRAIN_CASES = {
    "resnet50": dict(model="resnet", depth=50, batch=32, steps=500, optimizer="momentum", lr=0.01),
    "resnet50-b256": dict(model="resnet", depth=50, batch=256, steps=60, optimizer="momentum", lr=0.01),
    "lenet-b32": dict(model="lenet", depth=None, batch=32, epochs=1, optimizer="adam", lr=1e-3),
    "lenet-b256": dict(model="lenet", depth=None, batch=256, epochs=1, optimizer="adam", lr=1e-3),
}
WARMUP = 10          # steps run before the clock starts (capture, cuDNN plans, autotuning)


# -- minidl -----------------------------------------------------------------------------------
def minidl_train(case, train, test, graph=True, seed=0, precision="fp32", channels_last=None):
    import minidl as dl
    from minidl import models, optim
    gc.collect()                                  # the previous run's graphs and buffers go now
    dev = dl.get_device("cuda", seed=seed)
    dev.free_memory()                             # so the pools' reserve is this run's peak
    model = models.get(case["model"], depth=case["depth"], device=dev, seed=seed)
    opt = optim.get(case["optimizer"], lr=case["lr"], **({"momentum": 0.9} if case["optimizer"] == "momentum" else {}))
    trainer = dl.Trainer(model, opt, seed=seed, graph=graph, progress=False, log=lambda s: None, precision=precision,
                         channels_last=channels_last)
    loader = dl.data.Loader(*train, case["batch"], dev, seed=seed)
    steps = case.get("steps") or case["epochs"] * len(loader)
    trainer.fit(loader, steps=WARMUP, monitor=10 ** 9)
    dev.sync()
    t0 = time.perf_counter()
    trainer.fit(loader, more_steps=steps - WARMUP, monitor=10 ** 9)
    dev.sync()
    ms = (time.perf_counter() - t0) / (steps - WARMUP) * 1e3
    mem = dev.memory_bytes()                      # before evaluating: the training step's memory
    acc = trainer.evaluate(test, batch_size=1000).percent       # the JSON keeps percent
    plans = [call.memory.describe() for _, call in trainer._step._captured.values()]
    return {"ms_per_step": ms, "test_accuracy": acc, "steps": steps, "memory_plan": "; ".join(plans),
            "peak_reserved_mb": mem.reserved / 2 ** 20, "in_use_mb": mem.used / 2 ** 20}


# -- PyTorch ----------------------------------------------------------------------------------
def torch_train(case, train, test, graph, seed=0, precision="fp32"):
    import torch
    import torch.nn.functional as F
    import minidl as dl
    from benchmarks.torch_models import torch_model
    torch.manual_seed(seed)
    gc.collect()
    torch.cuda.empty_cache()
    dev = torch.device("cuda")
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    layout = torch.channels_last if half else torch.contiguous_format
    model = torch_model(case).to(dev).to(memory_format=layout)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" and not graph else None
    static_scale = 2.0 ** 10 if precision == "fp16" and graph else None
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

    sx = torch.empty((B, 1, 28, 28), device=dev).to(memory_format=layout)
    sy = torch.empty(B, dtype=torch.long, device=dev)
    loss_sum, hits = torch.zeros((), device=dev), torch.zeros((), device=dev, dtype=torch.long)

    def step_fn():
        opt.zero_grad(set_to_none=False)
        # no cast cache under capture (PyTorch's CUDA-graph notes): the graph must cast the weights of each step
        with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None, cache_enabled=not graph):
            out = model(sx)
            loss = F.cross_entropy(out, sy)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        elif static_scale is not None:
            (loss * static_scale).backward()
            torch._foreach_div_([p.grad for p in model.parameters()], static_scale)
            opt.step()
        else:
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
            "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2 ** 20,
            "in_use_mb": torch.cuda.max_memory_allocated() / 2 ** 20, "steps": steps}


# -- driver -----------------------------------------------------------------------------------
def bench_train(names, out=print, precision="fp32", channels_last=None):
    """Train each case with minidl (graphed, eager) and PyTorch (eager, graphed) under `precision`; print and
    return the figures."""
    import minidl as dl
    train, test = dl.data.mnist("train"), dl.data.mnist("test")
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        out("PyTorch is not installed: minidl figures only")
    results = {}
    for name in names:
        case = TRAIN_CASES[name]
        r = {"minidl": minidl_train(case, train, test, graph=True, precision=precision, channels_last=channels_last),
             "minidl_eager": minidl_train(case, train, test, graph=False, precision=precision,
                                          channels_last=channels_last)}
        if have_torch:
            r["torch_eager"] = torch_train(case, train, test, graph=False, precision=precision)
            r["torch_graph"] = torch_train(case, train, test, graph=True, precision=precision)
        results[name] = r
        out(f"{name} [{precision}]: " + ", ".join(f"{k} {v['ms_per_step']:.3f} ms/step {v['test_accuracy']:.2f}%"
                                                    for k, v in r.items()))
    print_table(results, out)
    return results


def print_table(results, out=print):
    """One row per case and runner: ms/step, ratios to PyTorch, memory, test accuracy."""
    out(f"{'case':<12} {'runner':<13} {'ms/step':>9} {'vs torch eager':>15} {'vs torch graph':>15} "
        f"{'reserved MiB':>13} {'in use MiB':>11} {'test acc':>9}")
    for name, r in results.items():
        te, tg = r.get("torch_eager"), r.get("torch_graph")
        for runner, v in r.items():
            vs_te, vs_tg = (f"{ref['ms_per_step'] / v['ms_per_step']:.2f}x" if ref else "-" for ref in (te, tg))
            out(f"{name:<12} {runner:<13} {v['ms_per_step']:>9.3f} {vs_te:>15} {vs_tg:>15} "
                f"{v['peak_reserved_mb']:>13.0f} {v['in_use_mb']:>11.0f} {v['test_accuracy']:>8.2f}%")
    out("reserved: peak memory held by the allocator (minidl: CuPy's pool and the captured steps' memory, warm-ups "
        "and planned arena); in use: minidl's live arrays after training, PyTorch's peak allocated")
    for name, r in results.items():
        if r.get("minidl", {}).get("memory_plan"):
            out(f"{name}: {r['minidl']['memory_plan']}")

