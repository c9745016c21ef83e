"""benchmarks/bench_rows.py's half-precision check (issue 30: bf16 never slower than fp32 on a bench row)."""
from benchmarks import bench_rows


def test_a_half_row_slower_than_its_fp32_row_is_named() -> None:
    result = {"lenet-b32": {"fp32": 0.175, "bf16": 0.206}, "resnet50": {"fp32": 2.8, "bf16": 1.9},
              "lenet-10k": {"fp32": 0.314, "bf16": 0.320}}
    bad = bench_rows.slower_half(result, tolerance=0.03)
    assert len(bad) == 1 and bad[0].startswith("lenet-b32 bf16: 0.2060 ms")     # 0.320 is within 3% of 0.314
    assert bench_rows.slower_half(result, tolerance=0.2) == []


def test_rows_without_fp32_are_not_judged() -> None:
    assert bench_rows.slower_half({"resnet50": {"bf16": 9.0}}, tolerance=0.0) == []


def test_the_rows_are_the_bench_cases() -> None:
    assert set(bench_rows.ROWS) <= set(bench_rows.TRAIN_CASES) | set(bench_rows.INFER_CASES)
