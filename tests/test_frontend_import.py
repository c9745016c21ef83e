"""minidl.kernels.gpu.frontend imports the cuDNN Frontend without letting it import torch (a
stand-in `cudnn` package here, which records what `import torch` gave it, as cudnn.wrapper does)."""
import sys
import types

import pytest

from minidl.kernels.gpu import frontend

STAND_IN = "try:\n    import torch\nexcept ImportError:\n    torch = None\n"


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    (tmp_path / "cudnn").mkdir()
    (tmp_path / "cudnn" / "__init__.py").write_text(STAND_IN)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = {name: sys.modules.pop(name) for name in ("cudnn", "torch") if name in sys.modules}
    yield
    sys.modules.pop("cudnn", None)
    sys.modules.pop("torch", None)
    sys.modules.update(saved)


def test_the_frontend_is_imported_without_torch(stand_in):
    fe = frontend.load()
    assert fe.__name__ == "cudnn" and fe.torch is None
    assert "torch" not in sys.modules                     # the block is lifted: torch can be imported later
    assert frontend.load() is fe


def test_a_process_that_imported_torch_keeps_it(stand_in):
    torch = sys.modules["torch"] = types.ModuleType("torch")
    assert frontend.load().torch is torch
