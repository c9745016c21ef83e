"""python benchmarks/graph_churn.py ACTIVITY [-n 1100] [--precision bf16]: a captured ResNet-50 b256
training step replayed before and after the process does ACTIVITY n times.

Why: a process that had chosen its cuDNN engines by timing them (each candidate then captured as a CUDA
graph on a stream of its own) replayed its training step 5.6% slower for the rest of its life
(docs/results.md). The activities take that apart: `streams` (a stream made, used once and destroyed),
`side-once` (one kernel, once, on a second stream), `main-eager` and `null-eager` (a kernel launched on
minidl's stream, on the legacy stream), `graphs` (a graph captured on one stream, launched and
destroyed), `graphs-kept` (the same, kept alive), `events` (two events made, recorded and destroyed),
`capture-only` (a graph recorded and destroyed, never instantiated), `queued` (kernels/gpu/timing.py's
timing of a candidate), `nccl-init` (a one-rank NCCL communicator made), `nccl` (and an all-reduce on a
second stream), `none`. Under an MPI launcher of N ranks, each rank on its GPU, the ranks' own: `ranks-init`
(an N-rank NCCL communicator made, one all-reduce), `ranks` (n all-reduces), `ranks-destroy` (made, one
all-reduce, destroyed), `minidl-comm` (minidl's Communicator made, one all-reduce), `peer` (peer
access to every other GPU enabled, no NCCL), `minidl-start` (minidl's Communicator, n uncaptured
`start` + `wait`: the reduction stream's path outside a capture, which slowed the ranks until it moved
onto the compute stream, docs/distributed.md).
One line of JSON: the step's GPU time before and after (the best of 3 x 100 replays), every rank's.
"""
import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

ACTIVITIES = ("none", "streams", "side-once", "main-eager", "null-eager", "graphs", "graphs-kept", "events",
              "capture-only", "queued", "nccl-init", "nccl", "ranks-init", "ranks", "ranks-destroy", "minidl-comm",
              "minidl-start", "peer")


def churn(activity, n, cp, world):
    from minidl.kernels.gpu import record, timing
    x = cp.zeros(1 << 16, cp.float32)

    def tiny():
        x.__iadd__(1)

    one = cp.cuda.Stream(non_blocking=True)
    kept = []
    for _ in range(n):
        if activity == "streams":
            s = cp.cuda.Stream(non_blocking=True)
            with s:
                tiny()
            s.synchronize()
        elif activity == "side-once":
            if not kept:
                with one:
                    tiny()
                one.synchronize()
                kept.append(one)
        elif activity == "main-eager":
            tiny()
        elif activity == "null-eager":
            with cp.cuda.Stream.null:
                tiny()
        elif activity in ("graphs", "graphs-kept"):
            with one:
                one.begin_capture()
                tiny()
                g = one.end_capture()
                g.launch(one)
            if activity == "graphs-kept":
                kept.append(g)
        elif activity == "events":
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(one), b.record(one)
            b.synchronize()
        elif activity == "capture-only":
            record.record_once(tiny, one)
        elif activity == "queued":
            timing.time_queued(tiny, 10)
        elif activity.startswith("ranks"):
            from cupy.cuda import nccl
            if not kept:
                uid = world.comm.bcast(nccl.get_unique_id() if world.main else None, root=0)
                kept.append(nccl.NcclCommunicator(world.size, uid, world.rank))
            kept[0].allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, one.ptr)
            one.synchronize()
            if activity == "ranks-destroy":
                kept.pop().destroy()
            if activity != "ranks":
                break
        elif activity == "minidl-comm":          # kept: its close() would release the step's graph too
            from minidl.kernels.gpu.collectives import Communicator
            kept.append(Communicator(world.comm))
            kept[0].allreduce(x, "sum")
            break
        elif activity == "minidl-start":
            from minidl.kernels.gpu.collectives import Communicator
            if not kept:
                kept.append(Communicator(world.comm))
            kept[0].start(x, "sum")
            kept[0].wait()
        elif activity == "peer":
            for d in range(cp.cuda.runtime.getDeviceCount()):
                if d != cp.cuda.Device().id:
                    cp.cuda.runtime.deviceEnablePeerAccess(d)
            break
        elif activity.startswith("nccl"):
            if not kept:
                from cupy.cuda import nccl
                kept.append(nccl.NcclCommunicator(1, nccl.get_unique_id(), 0))
            if activity == "nccl":
                kept[0].allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, one.ptr)
                one.synchronize()
    cp.cuda.Device().synchronize()
    return kept + [one]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/graph_churn.py", description=__doc__.splitlines()[0])
    p.add_argument("activity", choices=ACTIVITIES)
    p.add_argument("-n", type=int, default=1100, help="times the activity is done (default 1100)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    args = p.parse_args(argv)
    import cupy as cp
    import minidl as dl
    from benchmarks.placement import one_trainer
    from minidl import distributed
    world = distributed.init()
    dev = dl.get_device("cuda", gpu=world.local_rank if world.size > 1 else None)
    _, (trainer, call) = one_trainer(dl, dev, dl.data.load("mnist", "train"), args.precision, 20)

    def best_ms():
        return round(min(dev.elapsed_ms(call.replay, 100) for _ in range(3)), 4)

    before = best_ms()
    kept = churn(args.activity, args.n, cp, world)
    after = best_ms()
    ranks = world.comm.gather((before, after), root=0) if world.comm else [(before, after)]
    if world.main:
        print(json.dumps({"activity": args.activity, "n": args.n, "precision": args.precision, "ranks": world.size,
                          "step_ms_before": [b for b, _ in ranks], "step_ms_after": [a for _, a in ranks],
                          "kept": len(kept)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
