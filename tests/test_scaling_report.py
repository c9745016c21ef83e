"""bench_dist's scaling report (benchmarks/scaling.py): speed-up, efficiency and the ratio to PyTorch
DDP from results gathered on machines of several sizes, as a table and a plot, without GPUs."""
import json

import pytest

from benchmarks import bench_dist, scaling


def _result(n, framework, images_s, case="resnet50-b256", precision="fp32"):
    return dict(case=case, precision=precision, ranks=n, framework=framework, images_s=images_s,
                ms_step=1.0, allreduce_ms=0.5 if n > 1 else 0.0, buckets=12 if framework == "minidl" else None)


RESULTS = [_result(1, "minidl", 1000.0), _result(2, "minidl", 1900.0), _result(8, "minidl", 7200.0),
           _result(1, "torch-ddp", 500.0), _result(2, "torch-ddp", 800.0),
           _result(2, "minidl", 1950.0),                      # run again later: this one counts
           _result(4, "minidl", 3000.0, precision="bf16")]    # no N = 1 to compare with


def test_efficiency_and_the_ratio_to_ddp():
    rows = {(r["precision"], r["framework"], r["ranks"]): r for r in scaling.with_scaling(RESULTS)}
    assert len(rows) == 6
    two = rows[("fp32", "minidl", 2)]
    assert two["images_s"] == 1950.0 and two["speedup"] == pytest.approx(1.95)
    assert two["efficiency"] == pytest.approx(0.975) and two["vs_ddp"] == pytest.approx(1950 / 800)
    eight = rows[("fp32", "minidl", 8)]
    assert eight["efficiency"] == pytest.approx(0.9) and eight["vs_ddp"] is None       # DDP not run at 8
    assert rows[("fp32", "torch-ddp", 2)]["efficiency"] == pytest.approx(0.8)
    assert rows[("fp32", "torch-ddp", 2)]["vs_ddp"] is None
    lone = rows[("bf16", "minidl", 4)]
    assert lone["speedup"] is None and lone["efficiency"] is None


def test_from_json_prints_the_table_and_draws_the_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, png = tmp_path / "dist.jsonl", tmp_path / "scaling.png"
    path.write_text("".join(json.dumps(r) + "\n" for r in RESULTS))
    assert bench_dist.main(["--from-json", str(path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| resnet50-b256 | fp32 | minidl | 2 | 1,950 | 1.000 | 1.95 | 98% | 2.44 | 0.500 | - |" in out
    assert "| resnet50-b256 | bf16 | minidl | 4 | 3,000 | 1.000 | - | - | - | 0.500 | - |" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_variants_are_labelled_and_compared_with_the_plain_one_gpu_run_and_their_ddp_twin():
    rows = [_result(1, "minidl", 1000.0), dict(_result(2, "minidl", 1800.0), grad_reduce="bf16", transport="net"),
            dict(_result(2, "torch-ddp", 900.0), grad_reduce="bf16", transport="net")]
    got = {r["label"]: r for r in scaling.with_scaling(rows)}
    assert got["minidl bf16-wire net"]["speedup"] == pytest.approx(1.8)
    assert got["minidl bf16-wire net"]["vs_ddp"] == pytest.approx(2.0)


def test_the_model_grows_the_exposed_all_reduce_as_a_ring_does():
    one, two = _result(1, "minidl", 1000.0), _result(2, "minidl", 1900.0)
    one["ms_step"], two["ms_step"] = 10.0, 11.0          # 1 ms exposed at N = 2
    model = {r["ranks"]: r for r in scaling.model([one, two])}
    assert model[4]["ms_step"] == pytest.approx(11.5) and model[8]["ms_step"] == pytest.approx(11.75)
    assert model[8]["speedup"] == pytest.approx(80 / 11.75)
    assert "| resnet50-b256 | fp32 | minidl | 8 | 11.750 | 6.81 |" in scaling.model_table([one, two])
