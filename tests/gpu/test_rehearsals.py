"""`_cuda.ahead` rehearsals run on one stream a GPU, made once and kept: a process that has made and
destroyed streams that ran kernels replays its CUDA graphs slower (benchmarks/graph_churn.py)."""
import pytest

cp = pytest.importorskip("cupy")

import minidl as dl  # noqa: E402
from minidl.kernels.gpu import _cuda  # noqa: E402


def test_rehearsals_share_one_kept_stream():
    dl.get_device("cuda")
    if not _cuda._pool or _cuda._workers:
        pytest.skip("no compile pool here, or compile worker processes rehearse instead")
    seen = []
    for _ in range(3):
        _cuda.ahead(lambda: seen.append(cp.cuda.get_current_stream().ptr))
    _cuda.wait_ahead()
    assert len(seen) == 3 and len(set(seen)) == 1 and seen[0] != 0
    assert _cuda._rehearsal_streams[_cuda._pool_device[0]].ptr == seen[0]
