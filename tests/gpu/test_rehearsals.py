"""`_cuda.ahead` rehearsals are recorded on kept streams (one a GPU and compile-pool thread) into graphs
that never run: a process whose other streams ran kernels outside a graph replays its CUDA graphs slower
(benchmarks/graph_churn.py, docs/distributed.md)."""
import pytest

cp = pytest.importorskip("cupy")

import minidl as dl  # noqa: E402
from minidl.kernels.gpu import _cuda  # noqa: E402


def test_rehearsals_at_once_each_record_on_a_kept_stream_of_their_thread():
    dl.get_device("cuda")
    if not _cuda._pool or _cuda._workers:
        pytest.skip("no compile pool here, or compile worker processes rehearse instead")
    seen = []
    for _ in range(8):      # more than the pool's threads: some record at once, some one after another
        _cuda.ahead(lambda: seen.append((cp.cuda.get_current_stream().ptr,
                                         cp.cuda.get_current_stream().is_capturing())))
    _cuda.wait_ahead()
    assert len(seen) == 8 and all(capturing for _, capturing in seen)     # none dropped, each recorded
    kept = {s.ptr for s in _cuda._rehearsal_streams.values()}
    assert {ptr for ptr, _ in seen} <= kept and len(kept) <= _cuda._pool[0]._max_workers


def test_a_rehearsal_compiles_its_kernels_and_runs_none_of_them():
    dl.get_device("cuda")
    if not _cuda._pool or _cuda._workers:
        pytest.skip("no compile pool here, or compile worker processes rehearse instead")
    a = cp.zeros(4, cp.float32)
    capturing = []
    kernel = cp.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", "minidl_test_rehearsed_once")

    def rehearsal():
        capturing.append(cp.cuda.get_current_stream().is_capturing())
        kernel(a, a)
    _cuda.ahead(rehearsal)
    _cuda.wait_ahead()
    cp.cuda.Device().synchronize()
    assert capturing == [True] and not a.any()         # recorded, never run
    kernel(a, a)                                        # compiled and loaded by the rehearsal
    assert a.tolist() == [1.0] * 4
