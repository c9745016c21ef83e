"""Which GPU a rank makes current (minidl/backends/cuda.py `_use_gpu`), with a stand-in CuPy: its
local rank's among the host's GPUs; the one GPU the launcher gave it (CUDA_VISIBLE_DEVICES naming one,
as Slurm's --gpus-per-task=1 does) whatever its local rank; a local rank past what it sees refused."""
from types import SimpleNamespace

import pytest

from minidl.backends import DeviceError
from minidl.backends.cuda import _use_gpu


def _cupy(count, used):
    device = lambda i: SimpleNamespace(use=lambda: used.append(i))             # noqa: E731
    runtime = SimpleNamespace(getDeviceCount=lambda: count)
    return SimpleNamespace(cuda=SimpleNamespace(runtime=runtime, Device=device))


@pytest.mark.parametrize("visible, count, local_rank, want", [
    (None, 8, 3, 3),                     # every GPU of the host visible: the local rank's
    ("0,1,2,3", 4, 3, 3),
    ("3", 1, 3, 0),                      # the launcher's one GPU, whatever the local rank
    ("GPU-5c7d1f0e-77a1-4b1e-9c1a-0d3e2b6a9f10", 1, 1, 0),
    (None, 1, 0, 0),
])
def test_a_rank_takes_its_local_ranks_gpu_or_the_one_it_was_given(monkeypatch, visible, count, local_rank, want):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    used = []
    _use_gpu(_cupy(count, used), local_rank)
    assert used == [want]


@pytest.mark.parametrize("visible, count", [(None, 1), ("0,1", 2), ("", 1)])
def test_a_local_rank_past_the_gpus_it_sees_is_refused_in_one_line(monkeypatch, visible, count):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    used = []
    with pytest.raises(DeviceError, match=rf"^GPU 3 was asked for \(one per rank on a host\), but {count} are visible"):
        _use_gpu(_cupy(count, used), 3)
    assert used == []
