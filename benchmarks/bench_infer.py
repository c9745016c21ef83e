"""Inference speed: minidl's compiled model against PyTorch eager and PyTorch in a CUDA graph.

minidl's inference model (BN folded, fused kernels, a CUDA graph per batch size) and PyTorch (eval
mode, no_grad) run the same weights: minidl's, randomly initialised with non-trivial BN statistics,
copied into the PyTorch model by layer. Batch 1: latency (median and p99 over `runs` calls, input
already on the device, each call launched and waited for); larger batches: ms per call. GPU time
comes from CUDA events around back-to-back calls; the outputs' largest difference is reported, and
the device memory of each framework (minidl: CuPy's pools and the CUDA graphs' pools).

`precision` (fp32, bf16, fp16): minidl compiles under that policy; PyTorch runs its best configuration
for it: bf16 and fp16 under torch.autocast with the model and the input channels-last (its outputs in
the half type, compared in float32).
"""
import gc
import importlib.util
import time

import numpy as np

INFER_CASES = {
    "lenet-b1": dict(model="lenet", depth=None, batch=1),
    "lenet-10k": dict(model="lenet", depth=None, batch=10000),
    "resnet50-b1": dict(model="resnet", depth=50, batch=1),
    "resnet50-b1000": dict(model="resnet", depth=50, batch=1000),
}


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


def _device_seconds(dev, fn, reps=100):
    """Seconds of GPU time per call of fn, launched back to back between two events (after one call)."""
    fn()
    return dev.elapsed_ms(fn, reps) / 1e3


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


def bench_infer(names, out=print, runs=1000, seed=0, precision="fp32"):
    """Time each case with minidl and (where installed) PyTorch eager and graphed under `precision`; print and
    return the figures."""
    import minidl as dl
    from minidl import inference, models
    from minidl.testing import randomize_weights
    torch = half = None
    if importlib.util.find_spec("torch") is not None:
        import torch
        from benchmarks.torch_models import torch_from_minidl
        torch.backends.cudnn.benchmark = True          # PyTorch's fastest cuDNN algorithms (TF32 convs: its default)
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    else:
        out("PyTorch is not installed: minidl figures only")
    gc.collect()
    dev = dl.get_device("cuda")
    dev.free_memory()
    results, built = {}, {}
    for name in names:
        case = INFER_CASES[name]
        key = (case["model"], case["depth"])
        if key not in built:
            model = randomize_weights(models.get(case["model"], depth=case["depth"], seed=seed), seed)
            # logits, as the PyTorch twin (no Softmax) and the published rows
            built[key] = (model, inference.compile(model, device=dev, precision=precision, probabilities=False),
                          torch_from_minidl(case, model) if torch else None)
            if torch is not None and half is not None:
                built[key][2].to(memory_format=torch.channels_last)
        model, m, tmodel = built[key]
        N = case["batch"]
        # images in [0, 1]
        x = np.random.default_rng(seed + N).random((N, *model.inputs[0].shape[1:]), dtype=np.float32)
        r = {}
        buf = m.input_buffer(N)                          # captures the graph for this batch size
        buf[...] = dev.asarray(x)
        dev.sync()

        def run_minidl():
            return m.predict(buf)

        y_minidl = dev.to_host(run_minidl())
        r["minidl"] = _measure(run_minidl, dev.sync, N, runs, gpu=lambda: _device_seconds(dev, run_minidl))
        r["minidl"]["schedule"] = [st.kind for st in m.schedule(N)[0]]
        mem = dev.memory_bytes()                         # every model compiled so far, graphs included
        r["minidl"].update(reserved_mb=mem.reserved / 2 ** 20, in_use_mb=mem.used / 2 ** 20)
        if torch is not None:
            torch.cuda.reset_peak_memory_stats()
            xt = torch.from_numpy(x).cuda().to(memory_format=torch.channels_last if half else torch.contiguous_format)
            tstream = torch.cuda.current_stream()

            def torch_seconds(fn, reps=100):                # CUDA events around back-to-back calls
                fn()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(tstream)
                for _ in range(reps):
                    fn()
                end.record(tstream)
                end.synchronize()
                return start.elapsed_time(end) / 1e3 / reps

            with torch.no_grad(), torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None,
                                                 cache_enabled=False):      # captured below: no cast cache
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
                y_graph = y_static.float().cpu().numpy()
                r["torch_graph"] = _measure(graph.replay, tstream.synchronize, N, runs,
                                            gpu=lambda: torch_seconds(graph.replay))
                del graph, y_static
            for runner in ("torch_eager", "torch_graph"):
                r[runner].update(reserved_mb=torch.cuda.max_memory_reserved() / 2 ** 20,
                                 in_use_mb=torch.cuda.max_memory_allocated() / 2 ** 20)
            scale = float(np.abs(y_torch).max())
            for runner, y in (("minidl", y_minidl), ("torch_graph", y_graph)):
                err = float(np.abs(y - y_torch).max())
                r[runner].update(max_abs_diff_vs_torch_eager=err, rel_diff=err / scale)
            r["minidl"]["argmax_agreement"] = float((y_minidl.argmax(1) == y_torch.argmax(1)).mean())
        results[name] = r
        out(f"{name} [{precision}]: " + ", ".join(f"{k} {_fmt_time(v)}" for k, v in r.items()))
    print_infer_table(results, out)
    return results


def _fmt_time(v):
    if v["batch"] == 1:
        return f"{v['latency_us']:.1f} us (p99 {v['p99_us']:.1f})"
    return f"{v['ms_per_call']:.3f} ms"


def print_infer_table(results, out=print):
    """One row per case and runner: latency or ms per call, GPU time, ratios, memory, output difference."""
    out(f"{'case':<15} {'runner':<12} {'batch':>6} {'median':>10} {'p99':>10} {'GPU time':>10} "
        f"{'vs torch eager':>15} {'vs torch graph':>15} {'reserved MiB':>13} {'max|dy|/max|y|':>15}")
    for name, r in results.items():
        te, tg = r.get("torch_eager"), r.get("torch_graph")
        for runner, v in r.items():
            vs_te, vs_tg = (f"{ref['ms_per_call'] / v['ms_per_call']:.2f}x" if ref else "-" for ref in (te, tg))
            if v["batch"] == 1:
                med, p99 = f"{v['latency_us']:.1f} us", f"{v['p99_us']:.1f} us"
            else:
                med, p99 = f"{v['ms_per_call']:.3f} ms", "-"
            gpu = f"{v['gpu_us']:.1f} us" if "gpu_us" in v else "-"
            diff = f"{v['rel_diff']:.1e}" if "rel_diff" in v else "-"
            out(f"{name:<15} {runner:<12} {v['batch']:>6} {med:>10} {p99:>10} {gpu:>10} "
                f"{vs_te:>15} {vs_tg:>15} {v.get('reserved_mb', 0):>13.0f} {diff:>15}")
    out("ratios: the reference's time over this runner's (above 1: faster than the reference); "
        "max|dy|/max|y|: against PyTorch eager's output; reserved: memory the allocator holds (minidl: CuPy's "
        "pool and the CUDA graphs' pools, every model so far; PyTorch: peak reserved in this case)")
