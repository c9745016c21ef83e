"""The parts of a data-parallel gradient exchange, timed alone on the GPU with CUDA events, under an
MPI launcher with one GPU per rank:

    NCCL_NVLS_ENABLE=0 mpirun -n 2 python benchmarks/bench_allreduce.py [--mib 89.7 8]

For each size: NCCL all-reduce of that many float32 bytes, of the same count of bfloat16 values,
reduce-scatter + all-gather of the float32 bytes (the sharded optimizer's pair: the same bytes on
the wire as one all-reduce), and the two casts a bfloat16 wire adds (float32 -> bfloat16 before,
back after), through minidl's own collectives and cast kernels, so bench_dist's step times can be
split into their parts (benchmarks/scaling.py's model takes them).
"""
import argparse
import sys


def main(argv=None):
    p = argparse.ArgumentParser(prog="bench_allreduce.py", description=__doc__.splitlines()[0])
    p.add_argument("--mib", nargs="+", type=float, default=[89.7, 8.0], help="float32 sizes in MiB")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    import cupy as cp
    import minidl as dl
    from minidl import distributed
    from cupy.cuda import nccl
    from minidl.kernels.gpu.cast import cast_copy
    from minidl.precision import BFLOAT16
    world = distributed.init()
    dev = dl.get_device("cuda", gpu=world.local_rank)
    coll = dev.communicator(world.comm)

    def ms(fn):
        fn()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for _ in range(args.reps):
            fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(start, end) / args.reps
    for mib in args.mib:
        n = int(mib * 2 ** 20) // 4 // (4 * world.size) * (4 * world.size)
        a, w = cp.ones(n, cp.float32), cp.ones(n, BFLOAT16)
        shard = cp.ones(n // world.size, cp.float32)

        def rs_ag():
            raw, stream = coll._ready(), cp.cuda.get_current_stream().ptr
            raw.reduceScatter(a.data.ptr, shard.data.ptr, shard.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream)
            raw.allGather(shard.data.ptr, a.data.ptr, shard.size, nccl.NCCL_FLOAT32, stream)
        parts = {"all-reduce fp32": ms(lambda: coll.allreduce(a, "sum")),
                 "all-reduce bf16": ms(lambda: coll.allreduce(w, "sum")),
                 "reduce-scatter + all-gather fp32": ms(rs_ag),
                 "cast fp32->bf16": ms(lambda: cast_copy(w, a)),
                 "cast bf16->fp32": ms(lambda: cp.copyto(a, w, casting="unsafe"))}
        if world.main:
            print(f"{mib:6.1f} MiB  " + "  ".join(f"{k} {v:.3f} ms" for k, v in parts.items()), flush=True)
    coll.close()


if __name__ == "__main__":
    sys.exit(main())
