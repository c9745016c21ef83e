"""benchmarks/roofline.py: each bench row's arithmetic and least memory traffic, counted by hand here, and the
limits it prints without a GPU."""
from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import roofline
from minidl import layers as L
from minidl import models
from minidl.graph import Model, Sequential

H100 = roofline.PEAKS[roofline.DEFAULT_DEVICE]


def _tiny() -> Model:
    """conv 4@3x3 (pad 1) + ReLU on (2, 6, 6), Flatten, Dense 5: 72 + 4 + 720 + 5 = 801 parameters."""
    return Sequential([L.Conv2D(4, 3, padding=1), L.ReLU(), L.Flatten(), L.Dense(5)], (2, 6, 6), device="cpu")


def test_tiny_net_inference_flops_and_bytes_by_hand() -> None:
    N = 3
    w = roofline.count(roofline.lower(_tiny(), training=False), N, "fp32", training=False)
    assert w.flops == {"conv2d": 2 * N * 4 * 6 * 6 * 2 * 3 * 3, "dense": 2 * N * 5 * 144}
    x, conv, dense, weights = N * 72 * 4, N * 144 * 4, N * 5 * 4, 801 * 4    # the ReLU is fused into the conv
    assert w.bytes == x + 2 * conv + 2 * dense + weights
    assert w.eltwise == 0


def test_tiny_net_training_skips_the_first_dgrad_and_counts_the_update() -> None:
    N = 3
    w = roofline.count(roofline.lower(_tiny(), training=True), N, "fp32", training=True, slots=2)   # Adam: m, v
    conv, dense = 2 * N * 4 * 36 * 18, 2 * N * 5 * 144
    assert w.flops == {"conv2d": 2 * conv, "dense": 3 * dense}    # fprop + wgrad; the dense layer also dgrad
    x, act, relu, out, P = N * 72 * 4, N * 144 * 4, N * 144 * 4, N * 5 * 4, 801
    # forward: write + read; backward: gradient write + read, the activation read again; x read by wgrad
    moved = 2 * x + 5 * act + 5 * relu + 5 * out + 4 * (2 * P + P + P * (3 + 2 * 2))
    assert w.bytes == moved
    assert w.eltwise == 5 * relu


def test_bf16_halves_activations_but_not_the_float32_master() -> None:
    net = roofline.lower(_tiny(), training=True)
    fp32, bf16 = (roofline.count(net, 2, p, training=True, slots=1) for p in ("fp32", "bf16"))
    assert fp32.flops == bf16.flops
    act = 2 * 144 * 5 + 2 * 144 * 5 + 2 * 5 * 5                  # conv, relu, dense values (elements x passes)
    assert fp32.bytes - bf16.bytes == 2 * act


def test_lenet_first_conv_and_a_dense_layer() -> None:
    net = roofline.lower(models.get("lenet", device="cpu"), training=False)
    conv, dense = [n for n in net.nodes if n.kind == "conv2d"][0], [n for n in net.nodes if n.kind == "dense"][0]
    assert roofline.gemm_flops(conv, 1) == 2 * 6 * 28 * 28 * (1 * 5 * 5)
    assert roofline.gemm_flops(dense, 1) == 2 * 120 * 400
    assert roofline.gemm_flops(conv, 10000) == 10000 * 2 * 6 * 28 * 28 * 25


def _resnet50_macs(H: int = 28) -> int:
    """ResNet-50 at batch 1 from its definition, by stage: stem 7x7 s2 on the padded image, pool 3 s2 p1,
    bottlenecks (1x1, 3x3 stride s, 1x1 to 4 width; a 1x1 stride s projection where the shape changes), dense."""
    out = lambda h, k, s, p: (h + 2 * p - k) // s + 1     # noqa: E731
    h = out(H, 7, 2, 3)
    macs = 64 * 1 * 49 * h * h
    h, C = out(h, 3, 2, 1), 64
    for stage, (width, n) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3))):
        for i in range(n):
            s = 2 if stage > 0 and i == 0 else 1
            o = out(h, 3, s, 1)
            macs += h * h * C * width + o * o * width * width * 9 + o * o * width * 4 * width
            if C != 4 * width or s != 1:
                macs += o * o * C * 4 * width
            h, C = o, 4 * width
    return macs + C * h * h * 10


def test_resnet50_forward_flops_match_an_independent_count() -> None:
    lim = roofline.limit("resnet50-b1", "fp32", H100)
    assert lim.work.total_flops == pytest.approx(2 * _resnet50_macs(), rel=1e-12)
    assert 0.1e9 < lim.work.total_flops < 0.2e9      # 28x28 inputs: ~1/64 of the 224x224 net's 8.2 GFLOP
    train = roofline.limit("resnet50", "fp32", H100)   # batch 32: three passes but the stem's dgrad
    stem = 2 * 64 * 49 * 14 * 14
    assert train.work.total_flops == pytest.approx(32 * (3 * 2 * _resnet50_macs() - stem), rel=1e-12)


def test_the_limit_is_the_slower_of_compute_and_memory() -> None:
    for lim in roofline.limits(H100, rows=("lenet-10k", "resnet50-b1000")):
        assert lim.limit_s == max(lim.compute_s, lim.memory_s)
        math = roofline.MATH[lim.precision]
        assert lim.compute_s == pytest.approx(sum(f / H100[math[g]] for g, f in lim.work.flops.items()))
        assert lim.memory_s == pytest.approx(lim.work.bytes / H100["hbm"])
    w = roofline.Work({"conv2d": 1e12, "dense": 0.0}, 1e6, 0.0)
    assert roofline.Limit("r", "bf16", w, 2.0, 1.0).limit_s == 2.0


def test_h200_differs_in_bandwidth_only() -> None:
    h200 = roofline.peaks_of("nvidia h200")
    assert h200 is not None and h200["hbm"] > H100["hbm"]
    assert {k: v for k, v in h200.items() if k != "hbm"} == {k: v for k, v in H100.items() if k != "hbm"}


def test_table_prints_every_row_and_the_fraction(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "ms.json"
    f.write_text(json.dumps({"lenet-10k": {"fp32": 0.314}}))
    lines: list[str] = []
    assert roofline.main(["--measured", str(f)], out=lines.append) == 0
    rows = [r for r in "\n".join(lines).splitlines() if r.startswith("| ") and "precision" not in r]
    assert len(rows) == len(roofline.ROWS) * len(roofline.PRECISIONS)
    lim = roofline.limit("lenet-10k", "fp32", H100)
    cells = [c.strip() for c in rows[0].split("|")[1:-1]]
    assert cells[:2] == ["lenet-10k", "fp32"] and cells[-2] == "314.0"
    assert cells[-1] == f"{lim.limit_s / 314e-6:.1%}"
    assert all(r.endswith("| - | - |") for r in rows[1:])     # no measurement: the limits alone


def test_bench_json_is_read(tmp_path: pathlib.Path) -> None:
    train, infer = tmp_path / "train.json", tmp_path / "infer.json"
    train.write_text(json.dumps({"lenet-b32": {"minidl": {"ms_per_step": 0.2}, "torch_graph": {"ms_per_step": 1}}}))
    infer.write_text(json.dumps({"cases": {"resnet50-b1": {"minidl": {"ms_per_call": 0.35}}}, "precision": "bf16"}))
    assert roofline.read_measured(f"bf16={train}") == {("lenet-b32", "bf16"): 0.2}
    assert roofline.read_measured(str(train)) == {("lenet-b32", "fp32"): 0.2}
    assert roofline.read_measured(str(infer)) == {("resnet50-b1", "bf16"): 0.35}


def test_gpu_figures_are_read_and_printed(tmp_path: pathlib.Path) -> None:
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"lenet-b32": {"bf16": {"kernels": 39.6, "launch_floor_us": 12.0, "top": []}}}))
    assert roofline.read_gpu(str(gpu)) == {("lenet-b32", "bf16"): roofline.GpuFigures(40, 12e-6)}
    lim = roofline.limit("lenet-b32", "fp32", H100)
    text = roofline.table([lim], gpu={("lenet-b32", "fp32"): roofline.GpuFigures(40, 12e-6)})
    assert text.splitlines()[0].endswith("| kernels | launch floor us |") and "| 40 | 12.0 |" in text


def test_unknown_device_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert roofline.main(["--device", "NVIDIA B300"], out=lambda s: None) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "NVIDIA B300" in err
