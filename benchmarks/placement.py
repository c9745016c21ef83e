"""python benchmarks/placement.py [--junk-mib N] [--precision bf16] [--steps 200]: one process's captured
ResNet-50 b256 step, and where its memory lies.

Why: on an H200 the same bf16 step took 3.000 ms in a process that chose its cuDNN engines by timing
them and 2.837 ms in the next process, which loaded them (docs/results.md, 2026-11-27 evening); a
Trainer made after others were released was as slow. The suspect is placement: where the model's
arenas and the captured graph's arena land after a process has allocated and freed other memory.
This prints the step beside each arena's address (and its offset in a 2 MiB page), so a fast and a
slow process can be compared; --junk-mib first allocates and frees that much, through CuPy's pool
and through cudaMalloc, to make a process with a history on purpose. Run it three times in one call:
on an empty MINIDL_CACHE, again on that cache, and on that cache with --junk-mib 4096.
"""
import argparse
import json
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

PAGE = 2 << 20


def where(name, array_or_memory):
    ptr, size = ((array_or_memory.data.ptr, array_or_memory.nbytes) if hasattr(array_or_memory, "data")
                 else (array_or_memory.ptr, array_or_memory.size))
    return {"name": name, "ptr": hex(ptr), "offset_in_2mib": ptr % PAGE, "mib": round(size / 2 ** 20, 1)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/placement.py", description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--junk-mib", type=int, default=0, help="allocate and free this much first (pool and cudaMalloc)")
    args = p.parse_args(argv)
    import cupy as cp
    import minidl as dl
    from minidl import models, optim
    dev = dl.get_device("cuda")
    if args.junk_mib:
        pooled = cp.empty(args.junk_mib << 20, cp.uint8)
        direct = cp.cuda.memory.Memory(args.junk_mib << 20)
        del pooled, direct
    model = models.get("resnet", depth=50, device=dev, seed=0)
    trainer = dl.Trainer(model, optim.get("momentum", lr=0.05, momentum=0.9), progress=False, log=lambda s: None,
                         precision=args.precision)
    train = dl.data.load("mnist", "train")
    trainer.fit(train, more_steps=5, batch_size=256, monitor=10 ** 9)
    trainer.fit(train, more_steps=args.steps, batch_size=256, monitor=10 ** 9)
    _, call = next(iter(trainer._step._captured.values()))
    arenas = [where("model.flat", model.flat), where("model.grads", model.grads),
              where("model.state_flat", model.state_flat), where("graph arena", call.memory.arena)]
    cache = os.environ.get("MINIDL_CACHE", "")
    remembered = os.path.exists(os.path.join(cache, "cudnn-engines.json")) if cache else None
    print(json.dumps({"precision": args.precision, "junk_mib": args.junk_mib, "ms_step": trainer.timing["steady_ms"],
                      "engines_remembered_at_exit": remembered, "arenas": arenas}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
