"""bench_dist's scaling report (benchmarks/scaling.py) without GPUs: speed-up, efficiency, the ratio
to PyTorch DDP and the fraction of the all-reduce hidden, from results gathered on machines of several
sizes (a table and a plot); and the model of N GPUs against cases computed by hand."""
import json
import math

import pytest

from benchmarks import bench_dist, scaling
from benchmarks.scaling import Net, Parts


def _result(n, framework, images_s, case="resnet50-b256", precision="fp32", **kw):
    return dict(case=case, precision=precision, ranks=n, framework=framework, images_s=images_s,
                ms_step=1.0, allreduce_ms=0.5 if n > 1 else 0.0, buckets=12 if framework == "minidl" else None, **kw)


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


@pytest.mark.parametrize("alone,with_ms,without,raw,clipped", [
    (0.4, 3.3, 3.0, 0.25, 0.25),          # 0.3 of the 0.4 ms added: a quarter hidden
    (0.34, 3.400, 3.054, -0.0176, 0.0),   # docs/distributed.md's 2 H100s: costs more than alone
    (0.2, 2.9, 3.0, 1.5, 1.0),            # faster with its collectives: noise
    (0.0, 3.0, 3.0, None, None), (0.4, 3.3, None, None, None)])
def test_the_hidden_fraction_is_what_the_step_did_not_add_clipped_to_0_1(alone, with_ms, without, raw, clipped):
    got = scaling.hidden(alone, with_ms, without)
    assert got == ((pytest.approx(raw, abs=1e-4), pytest.approx(clipped)) if raw is not None else (None, None))


def test_the_step_without_collectives_is_a_column_and_the_hidden_fraction_is_computed_from_it():
    rows = [_result(1, "minidl", 1000.0, seconds=12.0),
            dict(_result(2, "minidl", 1800.0), ms_step=3.3, allreduce_ms=0.4, rs_ag_ms=0.5, wire_mib=89.7,
                 seconds=20.0),
            dict(_result(2, "minidl", 1950.0), ms_step=3.0, collectives=False),
            dict(_result(2, "minidl", 1850.0), ms_step=3.2, allreduce_ms=0.4, rs_ag_ms=0.5, shard=True),
            dict(_result(4, "minidl", 3000.0), ms_step=3.0, grad_reduce="none")]     # an older line: no twin
    got = {r["label"]: r for r in scaling.with_scaling(rows) if r["ranks"] > 1}
    assert sorted(got) == ["minidl", "minidl no-reduce", "minidl sharded"]
    assert got["minidl"]["without_ms"] == 3.0 and got["minidl"]["hidden"] == pytest.approx(0.25)
    assert got["minidl sharded"]["without_ms"] == 3.0                  # the plain step without collectives
    assert got["minidl sharded"]["hidden"] == pytest.approx((0.5 - 0.2) / 0.5)      # RS + AG alone
    twin_measured = {r["label"]: r for r in scaling.with_scaling([dict(x) for x in rows[:3]] + [
        {k: v for k, v in rows[3].items() if k not in ("allreduce_ms", "rs_ag_ms")}])}
    assert twin_measured["minidl sharded"]["alone_ms"] == 0.5      # the plain launch measured RS + AG
    assert got["minidl sharded"]["speedup"] == pytest.approx(1.85)     # against plain minidl on one GPU
    assert got["minidl no-reduce"]["ranks"] == 4 and got["minidl no-reduce"]["grad_reduce"] == "fp32"
    table = scaling.table(rows)
    assert "| resnet50-b256 | fp32 | minidl | 2 | 1,800 | 3.300 | 3.000 | 0.400 | 25% | 1.80 | 90% | - | 89.7 | 20 |" \
        in table
    assert "| minidl sharded | 2 | 1,850 | 3.200 | 3.000 | 0.500 | 60% |" in table
    clipped = scaling.table([rows[0], dict(rows[1], ms_step=3.5), rows[2]])
    assert "| 0.400 | 0%* |" in clipped


def test_from_json_prints_the_table_and_draws_the_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, png = tmp_path / "dist.jsonl", tmp_path / "scaling.png"
    path.write_text("".join(json.dumps(r) + "\n" for r in RESULTS))
    assert bench_dist.main(["--from-json", str(path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "| resnet50-b256 | fp32 | minidl | 2 | 1,950 | 1.000 | - | 0.500 | - | 1.95 | 98% | 2.44 | - | - |" in out
    assert "| resnet50-b256 | bf16 | minidl | 4 | 3,000 | 1.000 | - | 0.500 | - | - | - | - | - | - |" in out
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"


def test_variants_are_labelled_and_compared_with_the_plain_one_gpu_run_and_their_ddp_twin():
    rows = [_result(1, "minidl", 1000.0), dict(_result(2, "minidl", 1800.0), grad_reduce="bf16", transport="net"),
            dict(_result(2, "torch-ddp", 900.0), grad_reduce="bf16", transport="net")]
    got = {r["label"]: r for r in scaling.with_scaling(rows)}
    assert got["minidl bf16-wire net"]["speedup"] == pytest.approx(1.8)
    assert got["minidl bf16-wire net"]["vs_ddp"] == pytest.approx(2.0)


def test_the_two_host_stand_in_puts_ddps_bf16_hook_beside_minidls_bf16_wire():
    net = dict(transport="net", precision="bf16")
    rows = [dict(_result(2, "minidl", 1.0, **net), grad_reduce=w, ms_step=ms, wire_mib=mib, allreduce_ms=alone)
            for w, ms, mib, alone in (("fp32", 235.0, 89.7, 200.0), ("bf16", 159.4, 44.9, 130.0))]
    rows += [dict(_result(2, "torch-ddp", 1.0, **net), grad_reduce=w, ms_step=ms) for w, ms in (("fp32", 267.9),
                                                                                           ("bf16", 134.9))]
    rows += [dict(_result(2, "minidl", 1.0, **net), grad_reduce="bf16", ms_step=40.0, collectives=False)]
    out = scaling.net_table(rows)
    assert "| resnet50-b256 | bf16 | 2 | bf16 | 44.9 | 159.4 | 134.9 | 0.85 | 8%* |" not in out    # never clipped here
    assert "| resnet50-b256 | bf16 | 2 | bf16 | 44.9 | 159.4 | 134.9 | 0.85 | 8% |" in out         # (130-119.4)/130
    assert "| resnet50-b256 | bf16 | 2 | fp32 | 89.7 | 235.0 | 267.9 | 1.14 | - |" in out
    assert scaling.net_table(RESULTS) == ""


# -- the model, against cases computed by hand ----------------------------------------------------------
# t1 10 ms; at n = 2: 10.5 ms without collectives, 10.6 with them, the 100 MiB all-reduce alone 0.2 ms
# in 4 buckets: the bus bandwidth is f(2) * 100 / 0.2 = 500 MiB/ms and the exposed fraction 0.1 / 0.2 = 0.5.
PARTS = Parts("case", t1=10.0, without=10.5, with_ms=10.6, alone=0.2, mib=100.0, n=2, buckets=4, rs_ag=0.25)


def test_one_host_scales_the_all_reduce_by_the_ring_factor():
    assert scaling.ring_factor(2) == 1.0 and scaling.ring_factor(4) == 1.5 and scaling.ring_factor(64) == 126 / 64
    assert PARTS.exposed == pytest.approx(0.5)
    assert scaling.comm_ms(PARTS, 4) == pytest.approx(0.3)            # 1.5 * 100 / 500
    assert scaling.step_ms(PARTS, 4) == pytest.approx(10.65)          # 10.5 + 0.5 * 0.3
    assert scaling.efficiency(PARTS, 8) == pytest.approx(10 / 10.675)  # 10.5 + 0.5 * 1.75 * 0.2
    assert scaling.step_ms(PARTS, 2) == pytest.approx(PARTS.with_ms)  # the model holds where it was measured


def test_several_hosts_take_the_slower_link_and_the_trees_latency():
    ib = Net(4, 400, efficiency=0.9, latency_us=10.0)       # 4 x 400 Gb/s x 0.9 = 180 GB/s
    assert ib.mib_per_ms == pytest.approx(180e9 / 2 ** 20 / 1e3)
    # 64 GPUs = 8 hosts of 8: 126/64 * 100 MiB at 171.66 MiB/ms, + 4 collectives x 2 log2(8) hops x 10 us
    comm = 126 / 64 * 100 / (180e9 / 2 ** 20 / 1e3) + 4 * 2 * 3 * 0.010
    assert comm == pytest.approx(1.3869, abs=1e-4)
    assert scaling.comm_ms(PARTS, 64, gpus_per_host=8, net=ib) == pytest.approx(comm)
    assert scaling.efficiency(PARTS, 64, gpus_per_host=8, net=ib) == pytest.approx(10 / (10.5 + 0.5 * comm))
    fast = Net(64, 400, latency_us=0.0)                     # NICs faster than the host's own links: NVLink bounds
    assert scaling.comm_ms(PARTS, 16, net=fast) == pytest.approx(1.875 * 100 / 500)
    assert scaling.comm_ms(PARTS, 8, net=ib) == scaling.comm_ms(PARTS, 8)     # 8 GPUs: one host


def test_the_sharded_optimizer_hides_its_reduce_scatter_as_the_all_reduce_and_not_its_all_gather():
    comm = scaling.comm_ms(PARTS, 4, sharded=True)
    assert comm == pytest.approx(1.5 * 100 / (100 / 0.25))          # its own bus bandwidth: 400 MiB/ms
    assert scaling.step_ms(PARTS, 4, sharded=True) == pytest.approx(10.5 + 0.5 * comm / 2 + comm / 2)
    measured = Parts(**{**PARTS.__dict__, "with_shard": 10.7})     # exposed (10.7 - 10.5) / 0.25 = 0.8
    assert scaling.step_ms(measured, 4, sharded=True) == pytest.approx(10.5 + 0.8 * comm)
    ib = Net(4, 400, latency_us=10.0)                               # two collectives a bucket
    assert scaling.comm_ms(PARTS, 16, net=ib, sharded=True) == pytest.approx(
        1.875 * 100 / min(400, ib.mib_per_ms) + 8 * 2 * 1 * 0.010)
    assert scaling.step_ms(Parts(**{**PARTS.__dict__, "rs_ag": None}), 4, sharded=True) is None


def test_parts_come_from_the_largest_n_measured_with_and_without_collectives():
    rows = [dict(_result(1, "minidl", 1000.0), ms_step=10.0),
            dict(_result(2, "minidl", 1.0), ms_step=10.4, allreduce_ms=0.2, wire_mib=100.0, rs_ag_ms=0.25),
            dict(_result(2, "minidl", 1.0), ms_step=10.2, collectives=False),
            dict(_result(4, "minidl", 1.0), ms_step=10.6, allreduce_ms=0.3, wire_mib=100.0, buckets=4),
            dict(_result(4, "minidl", 1.0), ms_step=10.5, collectives=False),
            dict(_result(4, "minidl", 1.0), ms_step=10.7, shard=True),
            dict(_result(4, "minidl", 1.0), ms_step=99.0, allreduce_ms=9.0, wire_mib=100.0, transport="net"),
            dict(_result(4, "torch-ddp", 1.0), ms_step=30.0)]
    parts, = scaling.parts_from_results(rows)
    assert parts == Parts("resnet50-b256 fp32", 10.0, 10.5, 10.6, 0.3, 100.0, 4, 4, None, 10.7)
    assert scaling.parts_from_results(rows[:1]) == []


def test_the_model_table_names_its_inputs_and_the_command_line_takes_parts(capsys):
    out = scaling.model_table([PARTS], ns=(4, 16), nets=(Net(4, 400), Net(8, 400)))
    assert "| case | all-reduce | 4 | 1 | 94% | - | - |" in out              # 10 / 10.65
    e16 = 10 / (10.5 + 0.5 * (1.875 * 100 / (180e9 / 2 ** 20 / 1e3) + 4 * 2 * 0.010))
    assert f"| case | all-reduce | 16 | 2 | - | {e16:.0%} |" in out
    assert "| case | RS + AG | 16 | 2 |" in out
    assert scaling.main(["--parts", "t1=10", "without=10.5", "with=10.6", "alone=0.2", "mib=100", "n=2", "buckets=4",
                         "--ns", "4", "--net", "4x400"]) == 0
    out = capsys.readouterr().out
    assert "| parts | all-reduce | 4 | 1 | 94% | - |" in out and "4x400 Gb/s: 180 GB/s, 10 us a tree hop" in out
    assert "| parts | 2 | 10.000 | 10.500 | 10.600 | 0.200 | 524 | 0.50 | 100.0 | 4 | - | - |" in out


@pytest.mark.parametrize("argv,line", [
    (["--parts", "t1=1"], "scaling: --parts: missing without, with, alone, mib, n"),
    (["--parts", "t1=1", "without=1", "with=1", "alone=0", "mib=1", "n=2"], "scaling: --parts: alone must be > 0 ms"),
    (["--parts", "speed=3"], "scaling: --parts: unknown part 'speed'"),
    (["--parts", "t1=x"], "scaling: --parts: t1 must be a number, got 'x'"),
    (["no-such-file.jsonl"], "scaling: [Errno 2] No such file or directory"),
])
def test_bad_parts_are_one_line_and_exit_2(argv, line, capsys):
    assert scaling.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and len(err.strip().splitlines()) == 1


def test_a_bad_network_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as e:
        scaling.main(["--parts", "t1=1", "--net", "four"])
    assert e.value.code == 2 and "a network is NICSxGBPS" in capsys.readouterr().err
    assert math.isclose(scaling._net("8x400").gbps, 400.0)
