"""sim.plans.flash3: FlashAttention-3's forward plan, its overlap model, the weighted serial
groups of sim.plan it uses, the design study and the command line (CPU only)."""
from __future__ import annotations

import io
import itertools
import json
import random
from contextlib import redirect_stdout

import pytest

import sim
from sim.cli import main
from sim.counts import tile_stats_closed
from sim.plan import KernelPlan, Plan, price, serial_parts
from sim.plans import plan_for
from sim.plans.flash3 import (ABLATION_STEPS, PAPER_FP16_FORWARD_TFLOPS, PAPER_PIPELINING_ABLATION,
                              ablation, compare_with_paper, compare_with_records, fa3_tiles,
                              flash2_hopper_baseline_plan, flash3_forward_plan, overlap_report,
                              overlap_serial, paper_workload, tflops)

WORKLOADS = [
    sim.Workload(batch=2, heads=4, seq_len_q=1000, head_dim=128, causal=True),
    sim.Workload(batch=1, heads=8, heads_kv=2, seq_len_q=777, seq_len_k=1500, head_dim=64),
    sim.Workload(batch=3, heads=2, seq_len_q=2048, head_dim=256, window_size=(300, 0)),
    sim.Workload(batch=1, heads=3, seq_len_q=4096, head_dim=128, dtype="bf16"),
]


def _bytes(plan):
    return {a.tensor: a.bytes for a in plan.kernels[0].accesses}


@pytest.mark.parametrize("w", WORKLOADS)
@pytest.mark.parametrize("dtype", [None, "fp8"])
def test_bytes_and_counts_equal_the_closed_form(w, dtype):
    """Q and O once per row, K and V once per visited tile (tile_stats_closed), the float32
    logsumexp once per row; 4 d FLOPs and one ex2 per score of a visited tile, one ex2 per row
    per visited tile and two per row at the end; FP8 reads 1-byte inputs and writes BF16."""
    plan = flash3_forward_plan(w, dtype=dtype, cluster_m=1)
    cfg = plan.config
    st = tile_stats_closed(w.seq_len_q, w.seq_len_k, cfg["block_q"], cfg["block_k"], w.causal, w.window_size)
    slices = w.batch * w.heads
    e_in, e_out = (1, 2) if dtype == "fp8" else (2, 2)
    d = w.head_dim
    assert _bytes(plan) == {"Q": slices * w.seq_len_q * d * e_in, "K": slices * st.C * d * e_in,
                            "V": slices * st.C * d * e_in, "O": slices * w.seq_len_q * d * e_out,
                            "lse": slices * w.seq_len_q * 4}
    k = plan.kernels[0]
    assert k.matmuls[0].flops == slices * 4 * d * st.A
    assert k.matmuls[0].unit == ("wgmma.fp8" if dtype == "fp8" else f"wgmma.{'bf16' if w.dtype == 'bf16' else 'f16'}")
    assert k.mufu_ops == slices * (st.A + st.R + 2 * w.seq_len_q)
    assert k.grid == (st.nq, w.heads, w.batch)
    assert all(a.how in ("ld", "st") for a in k.accesses)     # TMA: whole tiles, counted as moved


def test_multicast_halves_the_kv_bytes_and_follows_fa3s_rule():
    w = sim.Workload(batch=1, heads=4, seq_len_q=4096, head_dim=128)
    one, two = flash3_forward_plan(w, cluster_m=1), flash3_forward_plan(w)
    assert two.config["cluster_m"] == 2          # FP16, d >= 128, not causal, even Q tiles
    assert _bytes(two)["K"] * 2 == _bytes(one)["K"] and _bytes(two)["Q"] == _bytes(one)["Q"]
    assert flash3_forward_plan(w.replace(causal=True)).config["cluster_m"] == 1
    assert flash3_forward_plan(w, dtype="fp8").config["cluster_m"] == 1
    assert flash3_forward_plan(w.replace(head_dim=64)).config["cluster_m"] == 1
    with pytest.raises(ValueError, match="cluster_m"):
        flash3_forward_plan(w.replace(seq_len_q=128 * 3), cluster_m=2)


def test_tiles_are_flashattention3s():
    assert fa3_tiles(64) == (192, 192, False) and fa3_tiles(64, causal=True)[:2] == (192, 128)
    assert fa3_tiles(128)[:2] == (128, 176) and fa3_tiles(128, causal=True)[:2] == (128, 128)
    assert fa3_tiles(256)[:2] == (128, 80)
    assert [fa3_tiles(d, dtype="fp8")[:2] for d in (64, 128, 256)] == [(192, 160), (128, 224), (128, 128)]
    plan = flash3_forward_plan(sim.Workload(seq_len_q=1024, head_dim=64))
    assert plan.kernels[0].threads == 4 * 128 and plan.config["consumer_warpgroups"] == 3
    assert plan_for("flash3", "fwd", sim.Workload(seq_len_q=1024)).config == plan.config


GRID = [(d, n, causal, dtype) for d in (64, 128, 256) for n in (512, 2048, 8192)
        for causal in (False, True) for dtype in ("fp16", "fp8")]


@pytest.mark.parametrize("d,n,causal,dtype", GRID)
def test_each_idea_never_makes_the_time_worse(d, n, causal, dtype):
    w = paper_workload(n, d, causal)
    times = {}
    for ws, pp, intra in itertools.product((False, True), repeat=3):
        times[ws, pp, intra] = price(flash3_forward_plan(w, dtype=dtype, warp_specialised=ws, pingpong=pp,
                                                         intra_overlap=intra), "h100").time_s
    for flags, t in times.items():
        for i in range(3):
            if not flags[i]:
                on = tuple(True if j == i else f for j, f in enumerate(flags))
                assert times[on] <= t * (1 + 1e-12), (flags, on)
    assert times[True, True, True] <= price(flash2_hopper_baseline_plan(w, dtype=dtype), "h100").time_s
    two = price(flash3_forward_plan(w, dtype=dtype, stages=2), "h100").time_s
    one = price(flash3_forward_plan(w, dtype=dtype, stages=1), "h100").time_s
    assert two <= one


def test_the_overlap_model_in_symbols():
    """M matmul, E MUFU, F FP32, L2 / DRAM loads: the model's time of each configuration."""
    lv = {"dram": 0.1, "l2": 0.4, "smem": 0.0, "matmul": 1.0, "fp32": 0.2, "mufu": 0.7}

    def t(**flags):
        flags.setdefault("stages", 2)
        return max(v for _l, v in serial_parts(lv, overlap_serial(**flags)))

    assert t(warp_specialised=True, pingpong=True, intra_overlap=True) == pytest.approx(1.0)
    assert t(warp_specialised=True, pingpong=True, intra_overlap=False) == pytest.approx(1.0)
    assert t(warp_specialised=True, pingpong=False, intra_overlap=True) == pytest.approx(0.5 + 0.7)
    assert t(warp_specialised=True, pingpong=False, intra_overlap=False) == pytest.approx(1.7)
    assert t(warp_specialised=False, pingpong=False, intra_overlap=False) == pytest.approx(0.4 + 1.7)
    assert t(warp_specialised=True, stages=1, pingpong=True, intra_overlap=True) == pytest.approx(1.4)
    lv["mufu"] = 1.8       # the exponentials outlast the products: MUFU bounds even with ping-pong
    assert t(warp_specialised=True, pingpong=True, intra_overlap=True) == pytest.approx(1.8)
    with pytest.raises(ValueError, match="pingpong"):
        overlap_serial(warp_specialised=True, stages=2, pingpong=True, intra_overlap=True, consumer_warpgroups=1)


def test_mufu_bounds_fp8_at_d64_and_never_fp16_from_d128():
    """Full FlashAttention-3 with datasheet rates: ex2 outlasts the FP8 products at d = 64
    (MUFU/matmul = 4 d R_mufu / R_fp8 < 1), not the FP16 products at d >= 128."""
    for n, causal in itertools.product((1024, 4096, 16384), (False, True)):
        r = {(d, dt): ablation("h100", (d,), (n,), (causal,), (dt,))[0] for d in (64, 128, 256)
             for dt in ("fp16", "fp8")}
        assert r[64, "fp8"]["critical_path"] == "mufu" and r[64, "fp8"]["mufu_bound"]
        assert r[64, "fp8"]["mufu_over_matmul"] > 1.5
        for d in (128, 256):
            assert not r[d, "fp16"]["mufu_bound"] and r[d, "fp16"]["mufu_over_matmul"] < 0.5
        assert 0.8 < r[64, "fp16"]["mufu_over_matmul"] < 1.0     # close to the bound, under it


def test_weighted_serial_groups_keep_the_old_pricing():
    """Plain groups price as before (the groups' sums and the levels outside every group);
    weighted members add that share of a level; bad members are refused by name."""
    rng = random.Random(0)
    names = ("dram", "l2", "smem", "matmul", "fp32", "mufu")
    for _ in range(300):
        levels = {n: rng.random() for n in names}
        serial = tuple(tuple(rng.sample(names, rng.randint(1, 4))) for _g in range(rng.randint(0, 3)))
        grouped = {n for g in serial for n in g}
        old = max([sum(levels[n] for n in g) for g in serial] + [v for n, v in levels.items() if n not in grouped])
        assert max(v for _l, v in serial_parts(levels, serial)) == pytest.approx(old)
    levels = {n: 1.0 for n in names}
    assert serial_parts(levels, ((("matmul", 0.5), "mufu"),))[-1] == ("0.5 matmul + mufu", 1.5)
    for bad in (("matmul", -1), ("matmul", "x"), ("tensor", 1.0), 3):
        with pytest.raises(ValueError, match="serial"):
            serial_parts(levels, ((bad,),))


def test_a_plan_with_weighted_groups_prices_through_price():
    w = sim.Workload(batch=1, heads=2, seq_len_q=2048, head_dim=128)
    base = flash3_forward_plan(w, pingpong=False, intra_overlap=True)
    k = base.kernels[0]
    cost = price(base, "h100").kernels[0]
    lv = cost.level_s
    assert cost.time_s == pytest.approx(max(max(lv.values()), 0.5 * lv["matmul"] + lv["mufu"],
                                            0.5 * lv["matmul"] + lv["fp32"]))
    assert isinstance(k, KernelPlan) and isinstance(base, Plan)


def test_fp8_needs_a_profile_with_fp8_tensor_cores():
    plan = flash3_forward_plan(sim.Workload(seq_len_q=1024), dtype="fp8")
    assert price(plan, "h200").time_s > 0
    with pytest.raises(ValueError, match="wgmma.fp8"):
        price(plan, "a100")


@pytest.mark.parametrize("kwargs,name", [
    ({"block_q": 100}, "block_q"), ({"block_q": 256}, "block_q"), ({"block_k": 24}, "block_k"),
    ({"stages": 0}, "stages"), ({"dtype": "fp32"}, "dtype"), ({"cluster_m": 3}, "cluster_m"),
    ({"block_q": 64}, "pingpong"), ({"pingpong": "yes"}, "pingpong"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        flash3_forward_plan(sim.Workload(seq_len_q=1024, head_dim=128), **kwargs)


def test_bad_workloads_and_baseline_flags_are_refused():
    with pytest.raises(ValueError, match="dropout"):
        flash3_forward_plan(sim.Workload(seq_len_q=512, dropout=True))
    with pytest.raises(ValueError, match="head_dim"):
        flash3_forward_plan(sim.Workload(seq_len_q=512, head_dim=300))
    with pytest.raises(ValueError, match="dtype"):
        flash3_forward_plan(sim.Workload(seq_len_q=512, dtype="fp32"))
    with pytest.raises(ValueError, match="block masks"):
        flash3_forward_plan(sim.Workload(seq_len_q=512, block_density=0.5))
    with pytest.raises(ValueError, match="pingpong"):
        flash2_hopper_baseline_plan(sim.Workload(seq_len_q=512), pingpong=True)
    with pytest.raises(TypeError, match="workload"):
        flash3_forward_plan({"seq_len_q": 512})


def test_the_paper_comparison_is_complete_and_read_as_published():
    assert all(len(v) == 6 for series in PAPER_FP16_FORWARD_TFLOPS.values() for v in series.values())
    assert PAPER_FP16_FORWARD_TFLOPS[128, False]["FlashAttention-3"][-1] == 648
    assert [row[2] for row in PAPER_PIPELINING_ABLATION] == [661, 582, 570]
    c = compare_with_paper("h100")
    assert len(c["figure"]) == 36 and len(c["table2"]) == 3
    for f in c["figure"]:
        assert f["predicted_flash3"] >= f["predicted_serial_softmax"] >= f["predicted_baseline"] > 0
        assert f["predicted_speedup"] >= 1
    w = sim.Workload(batch=4, heads=16, seq_len_q=8448, head_dim=128)
    assert c["table2"][0]["predicted_ms"] == pytest.approx(price(flash3_forward_plan(w), "h100").time_ms)


def test_records_are_compared_without_fitting():
    recs = [{"kernel": "sdpa-flash", "pass": "fwd", "dtype": "fp16", "batch": 4, "heads": 16, "heads_kv": 16,
             "seq_len_q": 4096, "seq_len_k": 4096, "head_dim": 128, "causal": False, "time_ms": 2.0},
            {"kernel": "sdpa-cudnn", "pass": "fwd", "dtype": "fp16", "batch": 4, "heads": 16, "heads_kv": 16,
             "seq_len_q": 4096, "seq_len_k": 4096, "head_dim": 128, "causal": True, "time_ms": 1.0},
            {"kernel": "sdpa-math", "pass": "fwd", "dtype": "fp16"},
            {"kernel": "sdpa-flash", "pass": "fwd+bwd", "dtype": "fp16"}]
    rows = compare_with_records(recs, "h100")
    assert [r["model"] for r in rows] == ["baseline", "flash3"]
    w = sim.Workload(batch=4, heads=16, seq_len_q=4096, head_dim=128)
    expect = price(flash2_hopper_baseline_plan(w), "h100").time_ms
    assert rows[0]["predicted_ms"] == pytest.approx(expect)
    assert rows[0]["error"] == pytest.approx((expect - 2.0) / 2.0)
    assert rows[1]["predicted_ms"] == pytest.approx(price(flash3_forward_plan(w.replace(causal=True)), "h100").time_ms)
    assert tflops(w, 1e-3) == pytest.approx(4 * 4096 ** 2 * 128 * 16 * 4 / 1e-3 / 1e12)


def _run(argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


def test_cli_predict_flash3_json_round_trip():
    argv = ["predict", "--schedule", "flash3", "--batch", "2", "--heads", "16", "--seq-len", "4096",
            "--head-dim", "128", "--causal", "--no-pingpong", "--json"]
    rc, out = _run(argv)
    d = json.loads(out)
    w = sim.Workload(batch=2, heads=16, seq_len_q=4096, head_dim=128, causal=True)
    cost = price(flash3_forward_plan(w, pingpong=False), "h100")
    assert rc == 0 and d["schedule"] == "flash3" and d["config"]["pingpong"] is False
    assert d["predicted_ms"] == pytest.approx(cost.time_ms)
    assert d["bound"] == overlap_report(cost)["critical_path"] == d["overlap"]["critical_path"]
    assert set(d["overlap"]["levels_ms"]) >= {"dram", "l2", "matmul", "fp32", "mufu"}
    assert d["kernels"][0]["name"] == "flash3_fwd" and d["tflops"] > 0
    rc, out = _run(["predict", "--schedule", "flash3", "--seq-len", "2048", "--head-dim", "64",
                    "--dtype", "fp8", "--no-warp-specialise", "--json", "--compact"])
    d = json.loads(out)
    assert d["config"]["dtype"] == "fp8" and d["config"]["warp_specialised"] is False
    assert d["workload"]["dtype"] == "fp8" and "\n" not in out.strip()
    rc, out = _run(["predict", "--schedule", "flash3", "--seq-len", "2048"])
    assert rc == 0 and "critical" not in out and "TFLOP/s" in out


@pytest.mark.parametrize("argv,message", [
    (["--schedule", "flash2", "--dtype", "fp8"], "--dtype fp8"),
    (["--schedule", "flash2", "--no-pingpong"], "--no-pingpong"),
    (["--schedule", "flash3", "--dtype", "fp32"], "--dtype fp32"),
    (["--schedule", "flash3", "--pass", "bwd"], "--pass fwd"),
    (["--schedule", "flash3", "--dropout"], "--dropout"),
])
def test_cli_refuses_flags_that_do_not_apply(argv, message):
    with pytest.raises(SystemExit, match=message):
        main(["predict", "--seq-len", "1024"] + argv)


def test_cli_bad_plan_arguments_are_usage_errors(capsys):
    with pytest.raises(SystemExit) as e:
        main(["predict", "--schedule", "flash3", "--seq-len", "1024", "--block-q", "100"])
    assert e.value.code == 2 and "block_q" in capsys.readouterr().err


def test_cli_flash3_ablation_json_and_table():
    rc, out = _run(["flash3-ablation", "--head-dim", "64,128", "--seq-len", "1024,4096", "--mask", "full",
                    "--dtype", "fp16,fp8", "--json"])
    d = json.loads(out)
    assert rc == 0 and len(d["ablation"]) == 2 * 2 * 2 and d["measured"] is None
    assert [k for k in d["ablation"][0]["tflops"]] == [s for s, _f in ABLATION_STEPS] + ["intra_only"]
    assert len(d["paper"]["figure"]) == 36
    rc, out = _run(["flash3-ablation", "--head-dim", "128", "--seq-len", "8192", "--mask", "causal",
                    "--dtype", "fp16"])
    assert rc == 0 and "Table 2" in out and "critical path" in out


def test_cli_flash3_ablation_prices_at_measured_rates_when_given(tmp_path):
    """``--rates FILE``: the ablation prices at the file's rates (here a copy of the shipped H100
    file with a wgmma rate of half the datasheet's: the matmul-bound rows slow down)."""
    from pathlib import Path
    shipped = Path(__file__).resolve().parent.parent / "results" / "rates_h100_2026-11-24.json"
    doc = json.loads(shipped.read_text())
    half = sim.load_profile("h100").tensor_flops_per_s["fp16"] / 2
    doc["rates"]["wgmma_fp16_flops_per_s"] = dict(doc["rates"]["mma_fp16_flops_per_s"], value=half)
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps(doc))
    argv = ["flash3-ablation", "--head-dim", "128", "--seq-len", "8192", "--mask", "full",
            "--dtype", "fp16", "--json"]
    rc, out = _run(argv)
    rc2, out2 = _run(argv + ["--rates", str(rates)])
    assert rc == rc2 == 0
    datasheet, measured = json.loads(out)["ablation"][0], json.loads(out2)["ablation"][0]
    assert measured["tflops"]["+intra_overlap"] < 0.6 * datasheet["tflops"]["+intra_overlap"]


def test_speedups_pair_flash_and_cudnn_records_of_one_workload():
    """FA3/FA2 predicted against measured: a workload counts only with both backends' forward
    records; measured = t_flash / t_cudnn, predicted = the models' t_baseline / t_flash3."""
    from sim.plans.flash3 import SPEEDUP_TOLERANCE, compare_with_records, speedups_from_rows
    base = {"pass": "fwd", "dtype": "fp16", "batch": 2, "heads": 16, "heads_kv": 16,
            "seq_len_q": 4096, "seq_len_k": 4096, "head_dim": 128, "causal": False}
    recs = [dict(base, kernel="sdpa-flash", time_ms=2.0), dict(base, kernel="sdpa-cudnn", time_ms=1.0),
            dict(base, kernel="sdpa-flash", head_dim=64, time_ms=1.0)]       # no cuDNN partner
    rows = compare_with_records(recs, "h100")
    out = speedups_from_rows(rows)
    (p,) = out["pairs"]
    assert p["measured"] == 2.0 and p["head_dim"] == 128
    flash = next(r for r in rows if r["kernel"] == "sdpa-flash" and r["head_dim"] == 128)
    cudnn = next(r for r in rows if r["kernel"] == "sdpa-cudnn")
    want = flash["predicted_ms_by_model"]["baseline"] / cudnn["predicted_ms_by_model"]["flash3"]
    assert p["predicted"] == pytest.approx(want) and p["error"] == pytest.approx(want / 2.0 - 1)
    assert out["within"] == (1.0 if abs(want / 2.0 - 1) <= SPEEDUP_TOLERANCE else 0.0)
    assert speedups_from_rows([]) == {"pairs": [], "within": None, "median_abs_error": None}


def test_speedup_agreement_at_the_benchmark_shapes():
    """`in_paper_setting` keeps the pairs at B*N = 16384 and H*d = 2048 (the file's small shapes
    are not), and `speedup_agreement` counts within the tolerance and takes the median."""
    from sim.plans.flash3 import SPEEDUP_TOLERANCE, in_paper_setting, speedup_agreement
    pair = {"batch": 4, "seq_len": 4096, "heads": 16, "head_dim": 128}
    assert in_paper_setting(pair)
    assert not in_paper_setting(dict(pair, batch=8))            # B*H = 128 at N = 4096
    assert not in_paper_setting(dict(pair, heads=8))
    errs = [0.05, -0.1, SPEEDUP_TOLERANCE + 0.01, -0.5]
    agree = speedup_agreement([{"error": e} for e in errs])
    assert agree == {"within": 0.5, "median_abs_error": pytest.approx((0.1 + 0.21) / 2)}
    assert speedup_agreement([]) == {"within": None, "median_abs_error": None}


def test_pipe_shares_of_the_shipped_profile_read_cudnn_as_serial():
    """`pipe_shares` on the shipped ``ncu --stalls`` profile (held-out grid, N 1500/3000): one row
    per cuDNN forward record, the model's shares computed from the plan's level times (serial:
    M / (M + S); overlapped: M / max(M, S)), and, on every record, cuDNN's measured XU share
    nearer the serial kernel's than the overlapped one's (the reading docs/model.md states)."""
    from pathlib import Path

    from sim.plan import price
    from sim.plans.flash3 import COMPARED_MODELS, flash3_forward_plan, pipe_shares
    from sim.workload import Workload
    path = Path(__file__).resolve().parent.parent / "results" / "ncu_pipes_h100_2026-11-25.json"
    doc = json.loads(path.read_text())
    cudnn = [r for r in doc["records"] if r["kernel"] == "sdpa-cudnn"]
    rows = pipe_shares(path, "h100")
    assert len(rows) == len(cudnn) >= 4
    r0, rec = rows[0], cudnn[0]
    w = Workload(batch=rec["batch"], heads=rec["heads"], seq_len_q=rec["seq_len_q"],
                 head_dim=rec["head_dim"], dtype=rec["dtype"], causal=rec["causal"])
    lv = price(flash3_forward_plan(w, **COMPARED_MODELS["flash3"]), "h100").kernels[0].level_s
    m, s = lv["matmul"], lv["mufu"]
    assert r0["serial_xu_pct"] == pytest.approx(100 * s / (m + s))
    assert r0["overlap_tensor_pct"] == pytest.approx(100 * m / max(m, s))
    for r in rows:
        assert abs(r["xu_pct"] - r["serial_xu_pct"]) < abs(r["xu_pct"] - r["overlap_xu_pct"]), r
        assert abs(r["tensor_pct"] - r["serial_tensor_pct"]) < abs(r["tensor_pct"] - r["overlap_tensor_pct"]), r
    assert pipe_shares(path, "h100", kernel="sdpa-efficient") == []


def test_speedups_take_the_serial_softmax_reading_and_refuse_others():
    from sim.plans.flash3 import compare_with_records, speedups_from_rows
    base = {"pass": "fwd", "dtype": "fp16", "batch": 2, "heads": 16, "heads_kv": 16,
            "seq_len_q": 4096, "seq_len_k": 4096, "head_dim": 128, "causal": False}
    rows = compare_with_records([dict(base, kernel="sdpa-flash", time_ms=2.0),
                                 dict(base, kernel="sdpa-cudnn", time_ms=1.0)], "h100")
    (p,) = speedups_from_rows(rows, "serial_softmax")["pairs"]
    fl = next(r for r in rows if r["kernel"] == "sdpa-flash")
    cu = next(r for r in rows if r["kernel"] == "sdpa-cudnn")
    assert p["predicted"] == pytest.approx(fl["predicted_ms_by_model"]["baseline"]
                                           / cu["predicted_ms_by_model"]["serial_softmax"])
    with pytest.raises(ValueError, match="fa3_model"):
        speedups_from_rows(rows, "pingpong")
