"""cuDNN engine choice (kernels/gpu/engines.py): timed once per shape, kept on disk, right answers."""
import json

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
pytest.importorskip("cudnn")

from minidl.kernels.cpu import conv as cpu_conv  # noqa: E402
from minidl.kernels.gpu import conv as gpu_conv  # noqa: E402
from minidl.kernels.gpu import cudnn_graphs as cudnn, engines  # noqa: E402

# LeNet-5's second conv at batch 64: heuristics and timing often disagree at such small shapes.
X, W = (64, 20, 12, 12), (50, 20, 5, 5)


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty engine cache on disk and no graphs built in this process (TF32 on, the default:
    FP32 without tensor cores leaves too few engines at these shapes to choose among). Plans are built
    from the engines remembered, not loaded whole (that is tests/gpu/test_plan_cache.py)."""
    monkeypatch.setenv("MINIDL_CACHE", str(tmp_path))
    monkeypatch.setenv("MINIDL_PLAN_CACHE", "0")
    monkeypatch.setattr(engines, "_disk", {})
    monkeypatch.setattr(engines, "_chosen", {})
    monkeypatch.setattr(cudnn, "_graphs", {})
    engines.set_autotune(True)
    yield tmp_path
    engines.set_autotune(True)


def _run_all(x, w, gy):
    plan = gpu_conv.conv2d_plan((None,) + X[1:], W, (1, 1), 0, (1, 1))
    y = gpu_conv.conv2d_fprop(plan, x, w)
    gx = gpu_conv.conv2d_dgrad(plan, gy, w)
    gw = cp.zeros(W, np.float32)
    gpu_conv.conv2d_wgrad(plan, x, gy, gw, accumulate=False)
    return plan, [a.get() for a in (y, gx, gw)]


def _conv_graphs():
    return [g for k, g in cudnn._graphs.items() if k[0].startswith("conv") and g is not None]


def test_timed_choice_is_right_and_kept_on_disk(fresh):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(X, np.float32), rng.standard_normal(W, np.float32) * 0.1
    gy = rng.standard_normal((64, 50, 8, 8), np.float32)
    plan, (y, gx, gw) = _run_all(cp.asarray(x), cp.asarray(w), cp.asarray(gy))
    want_gw = np.zeros(W, np.float32)
    cpu_conv.conv2d_wgrad(plan, x, gy, want_gw, accumulate=False)
    for got, want in ((y, cpu_conv.conv2d_fprop(plan, x, w)), (gx, cpu_conv.conv2d_dgrad(plan, gy, w)), (gw, want_gw)):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=5e-3 * np.abs(want).max())   # TF32
    table = json.loads((fresh / "cudnn-engines.json").read_text())
    tuned = [g for g in _conv_graphs() if g.index is not None]
    assert tuned, [g.index for g in _conv_graphs()]
    assert len(table) == len(tuned), (table, [g.index for g in _conv_graphs()])
    assert all(isinstance(v, str) and v for v in table.values())


def test_second_process_takes_the_cached_engines_without_timing(fresh, monkeypatch):
    rng = np.random.default_rng(1)
    arrays = [cp.asarray(rng.standard_normal(s, np.float32)) for s in (X, W, (64, 50, 8, 8))]
    _, first = _run_all(*arrays)
    chosen = sorted((k, g.index) for k, g in cudnn._graphs.items() if g is not None)
    monkeypatch.setattr(cudnn, "_graphs", {})          # a new process: graphs built again ...
    monkeypatch.setattr(engines, "_disk", {})          # ... and the file read again
    monkeypatch.setattr(engines, "_time", lambda *a: pytest.fail("timed again despite the cache"))
    _, second = _run_all(*arrays)
    assert sorted((k, g.index) for k, g in cudnn._graphs.items() if g is not None) == chosen
    for g in _conv_graphs():                           # only the remembered plan was built
        if g.index is not None:
            built = [i for i in range(g.g.get_execution_plan_count()) if engines._plan(g.g, i) is not None]
            assert built == [g.index], built
    for a, b in zip(first, second):                    # same engines, deterministic: same bits
        np.testing.assert_array_equal(a, b)


def test_autotune_off_runs_the_heuristic_choice(fresh):
    engines.set_autotune(False)
    rng = np.random.default_rng(2)
    arrays = [cp.asarray(rng.standard_normal(s, np.float32)) for s in (X, W, (64, 50, 8, 8))]
    _run_all(*arrays)
    assert _conv_graphs() and all(g.index is None for g in _conv_graphs())
    assert not (fresh / "cudnn-engines.json").exists()


def test_a_damaged_cache_file_is_timed_again(fresh):
    (fresh / "cudnn-engines.json").write_text("{not json")
    rng = np.random.default_rng(3)
    arrays = [cp.asarray(rng.standard_normal(s, np.float32)) for s in (X, W, (64, 50, 8, 8))]
    _run_all(*arrays)
    assert isinstance(json.loads((fresh / "cudnn-engines.json").read_text()), dict)


def test_topk_builds_at_most_k_candidates_and_zero_builds_all(fresh, monkeypatch):
    rng = np.random.default_rng(4)
    arrays = [cp.asarray(rng.standard_normal(s, np.float32)) for s in (X, W, (64, 50, 8, 8))]
    monkeypatch.setenv("MINIDL_AUTOTUNE_TOPK", "2")
    _, first = _run_all(*arrays)
    for g in _conv_graphs():
        built = [i for i in range(g.g.get_execution_plan_count()) if engines._plan(g.g, i) is not None]
        assert 1 <= len(built) <= 2, built
        assert g.built is not None and g.index in (None, *g.built)
    monkeypatch.setenv("MINIDL_AUTOTUNE_TOPK", "0")
    monkeypatch.setattr(cudnn, "_graphs", {})
    monkeypatch.setattr(engines, "_disk", {})
    (fresh / "cudnn-engines.json").unlink()
    _, every = _run_all(*arrays)
    assert all(g.built is None for g in _conv_graphs())
    for a, b in zip(first, every):                     # other engines, same convolution (TF32)
        np.testing.assert_allclose(a, b, rtol=2e-2, atol=5e-3 * np.abs(b).max())


def test_a_choice_another_process_wrote_is_kept_when_this_one_writes(fresh):
    path = fresh / "cudnn-engines.json"
    rng = np.random.default_rng(5)
    arrays = [cp.asarray(rng.standard_normal(s, np.float32)) for s in (X, W, (64, 50, 8, 8))]
    engines._read(str(path))                           # read (empty) before the other process writes
    path.write_text(json.dumps({"another rank's key": "eng0"}))
    _run_all(*arrays)
    table = json.loads(path.read_text())
    assert table.get("another rank's key") == "eng0" and len(table) > 1, table
