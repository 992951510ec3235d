"""Plans (`sim.plan`, `sim.plans`): what the tensor-core forwards launch, as data, priced by one
pure function; checked against the kernels' own launch shapes, closed forms, and the hardware
counters of the shipped sweeps (which the plans are not fitted on: their constants come from
the kernels' code)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ioaware.block_info import cdiv
from sim.plan import Access, KernelPlan, Matmul, Plan, price
from sim.plans import plan_for
from sim.plans.tensor_core_fwd import (MMA_BLOCK_K_CHOICES, MMA_BLOCK_Q_CHOICES, TF32_BLOCK_K_CHOICES,
                                       TF32_BLOCK_Q_CHOICES, mma_threads, tf32_presplit_ok)
from sim.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = [ROOT / "results" / "h100_sweep_20261122.json", ROOT / "results" / "h200_sweep_20261122.json"]


def _mma_records():
    out = []
    for path in SWEEPS:
        for rec in json.loads(path.read_text())["records"]:
            if rec["kernel"] == "ioaware-numba" and rec.get("variant") == "mma" and rec["pass"] == "fwd" \
                    and rec.get("global_load_bytes") is not None:
                out.append((path.name, rec))
    return out


@pytest.mark.parametrize("family,dtype,choices", [
    ("mma", "fp16", [(q, k) for q in MMA_BLOCK_Q_CHOICES for k in MMA_BLOCK_K_CHOICES]),
    ("tf32", "fp32", [(q, k) for q in TF32_BLOCK_Q_CHOICES for k in TF32_BLOCK_K_CHOICES]),
])
@pytest.mark.parametrize("d", [64, 128])
def test_forward_plan_bytes_equal_closed_forms(family, dtype, choices, d):
    """Dense problem, lengths no multiple of a tile, GQA: Q and O once per row, K and V once per
    Q tile of the slice, lse once; grid one program per (Q tile, batch * head)."""
    B, H, Hkv, Nq, Nk = 2, 4, 2, 300, 200
    w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=Nq, seq_len_k=Nk, head_dim=d, dtype=dtype)
    e = w.dtype_bytes
    for bq, bk in choices:
        if family == "tf32" and not tf32_presplit_ok(d, bq, bk):
            continue
        plan = plan_for(family, "fwd", w, block_q=bq, block_k=bk)
        (kern,) = plan.kernels
        nq = cdiv(Nq, bq)
        assert kern.grid == (nq, B * H)
        got = {(a.tensor, a.op): a.bytes for a in kern.accesses if a.tensor != "schedule"}
        (sched,) = [a for a in kern.accesses if a.tensor == "schedule"]
        assert sched.bytes == 4 * kern.warps * (2 * nq * B * H + 2 * nq * cdiv(Nk, bk) * B * H)
        q_rows = B * H * (nq * bq if family == "tf32" else Nq)   # tf32 loads its tail rows clamped
        assert got == {("Q", "load"): q_rows * d * e, ("K", "load"): B * H * nq * Nk * d * e,
                       ("V", "load"): B * H * nq * Nk * d * e, ("O", "store"): B * H * Nq * d * e,
                       ("lse", "store"): B * H * Nq * 4}
        (mm,) = kern.matmuls
        assert mm.flops == 4 * d * bq * bk * nq * cdiv(Nk, bk) * B * H
        assert mm.passes == (3 if family == "tf32" else 1)
        assert plan.config["block_q"] == bq and plan.config["block_k"] == bk


def test_causal_plan_visits_fewer_tiles_and_its_programs_do_not_walk_in_step():
    w = Workload(batch=1, heads=2, seq_len_q=1024, head_dim=64, dtype="fp16")
    dense = plan_for("mma", "fwd", w, block_q=128, block_k=64)
    causal = plan_for("mma", "fwd", w.replace(causal=True), block_q=128, block_k=64)
    k_dense = next(a.bytes for a in dense.kernels[0].accesses if a.tensor == "K")
    k_causal = next(a.bytes for a in causal.kernels[0].accesses if a.tensor == "K")
    # causal 1024 x 1024 at 128 x 64: Q tile m visits 2 (m + 1) K tiles of 64 keys
    assert k_causal == 2 * sum(2 * (m + 1) * 64 for m in range(8)) * 64 * 2
    assert k_dense == 2 * 8 * 1024 * 64 * 2
    assert dense.kernels[0].lockstep and causal.kernels[0].lockstep   # same start tile (0)
    windowed = plan_for("mma", "fwd", w.replace(window_size=(128, 0)), block_q=128, block_k=64)
    assert not windowed.kernels[0].lockstep


@pytest.mark.parametrize("name,rec", _mma_records(), ids=lambda x: x if isinstance(x, str) else "")
def test_mma_forward_plan_against_the_sweeps_counters(name, rec):
    """The mma forward's plan against Nsight Compute's counters of the shipped sweeps: global
    bytes within 0.1 % (the tile schedule's warp-uniform loads included), FP32 FLOPs (all
    FLOPs less the tensor ones) within 1 %, tensor FLOPs exact. Nothing in the plan is read
    from these records."""
    w = Workload.from_record(rec)
    cost = price(plan_for("mma", "fwd", w, block_q=rec["block_q"], block_k=rec["block_k"]), "h100")
    (k,) = cost.kernels
    measured = rec["global_load_bytes"] + rec["global_store_bytes"] + (rec.get("global_atomic_bytes") or 0)
    assert abs(cost.global_bytes / measured - 1) < 0.001
    tensor = 2 * 16 * 8 * 16 * rec["ncu_tensor_inst"]          # m16n8k16 per HMMA instruction
    assert k.matmul_flops == tensor
    assert abs(k.fp32_flops / (rec["flops_executed"] - tensor) - 1) < 0.01


def test_kernel_families_plan_what_they_launch():
    """`kernels.mma_fwd.plan` / `kernels.tf32_fwd.plan` build the plan from the same tiles and
    problem their launcher uses (the launcher then reads its grid, threads, shared memory)."""
    from ioaware._inputs import check_inputs
    from kernels import mma_fwd, tf32_fwd
    from kernels.config import KernelConfig

    rng = np.random.default_rng(0)
    for module, dtype, d in ((mma_fwd, np.float16, 64), (tf32_fwd, np.float32, 128)):
        q = rng.standard_normal((2, 4, 333, d)).astype(dtype)
        kv = rng.standard_normal((2, 2, 333, d)).astype(dtype)
        pb = check_inputs(q, kv, kv, causal=True)
        plan = module.plan(pb, KernelConfig())
        bq, bk = module.tiles(pb, KernelConfig())
        (kern,) = plan.kernels
        assert kern.grid == (cdiv(333, bq), 8)
        assert (plan.config["block_q"], plan.config["block_k"]) == (bq, bk)
        assert plan.workload.heads_kv == 2 and plan.workload.causal
        # K and V double-buffered, rows padded by 8 halves (mma); one raw K/V stage, one split
        # stage at 32 keys (two at 16) and Q's big and small halves (tf32)
        smem = (4 * bk * (d + 8) * 2 if module is mma_fwd
                else d * (2 * bk + (2 if bk <= 16 else 1) * 4 * bk + 2 * bq) * 4)
        assert kern.shared_bytes == smem
    assert mma_threads(64, 128) == 128 and mma_threads(128, 64) == 128


def test_price_reads_the_profile_rates_and_the_serial_groups():
    w = Workload(batch=4, heads=8, seq_len_q=2048, head_dim=128, dtype="fp16")
    plan = plan_for("mma", "fwd", w)
    cost = price(plan, "h100")
    (k,) = cost.kernels
    assert cost.time_s > 0 and set(k.level_s) == {"dram", "l2", "smem", "matmul", "fp32", "mufu",
                                                  "wait"}
    assert k.level_s["wait"] == 0          # no wgmma waits, and no measured wait latency
    assert k.time_s == pytest.approx(max(k.level_s.values()))
    assert set(cost.rate_sources.values()) == {"datasheet"}
    serial = Plan(plan.family, plan.pass_, w, (_replace(plan.kernels[0], serial=(("matmul", "fp32", "mufu"),)),),
                  plan.config, plan.tensor_bytes)
    (ks,) = price(serial, "h100").kernels
    compute = ks.level_s["matmul"] + ks.level_s["fp32"] + ks.level_s["mufu"]
    assert ks.time_s == pytest.approx(max(compute, ks.level_s["smem"], ks.level_s["l2"], ks.level_s["dram"]))
    tf32 = price(plan_for("tf32", "fwd", w.replace(dtype="fp32")), "h100").kernels[0]
    assert tf32.matmul_flops == 3 * k.matmul_flops   # three TF32 products per float32 one


def test_serial_chains_of_resident_programs_overlap():
    """``serial_per_program``: each resident program runs its own chain, so a group's sum is
    divided by the programs resident per SM (every level alone still bounds the time); the
    wgmma forward declares its S-softmax-PV chain that way."""
    from sim.plan import serial_parts
    levels = {"matmul": 2.0, "mufu": 1.5, "l2": 0.5}
    assert serial_parts(levels, (("matmul", "mufu"),), 2)[-1] == ("(matmul + mufu) / 2", 1.75)
    assert max(v for _, v in serial_parts(levels, (("matmul", "mufu"),), 3)) == 2.0
    with pytest.raises(ValueError, match="programs"):
        serial_parts(levels, (), 0)
    w = Workload(batch=2, heads=16, seq_len_q=8192, head_dim=64, dtype="fp16")
    plan = plan_for("wgmma", "fwd", w, block_q=64, block_k=64)
    (k,) = plan.kernels
    assert k.serial and k.serial_per_program
    (c,) = price(plan, "h100").kernels
    assert c.resident_per_sm >= 2
    lv = c.level_s
    chain = max(lv["matmul"] + lv["mufu"], lv["matmul"] + lv["fp32"]) / c.resident_per_sm
    launch = c.time_s - max(max(lv.values()), chain)
    assert 0 <= launch < 1e-5
    one = Plan(plan.family, plan.pass_, w, (_replace(k, serial_per_program=False),), plan.config,
               plan.tensor_bytes)
    (c1,) = price(one, "h100").kernels
    assert c1.time_s - launch == pytest.approx(max(max(lv.values()), chain * c.resident_per_sm))
    # registers unknown: the resident count would ignore the register file, so no division
    unknown = Plan(plan.family, plan.pass_, w, (_replace(k, registers=None),), plan.config,
                   plan.tensor_bytes)
    (cu,) = price(unknown, "h100").kernels
    lu = cu.level_s
    assert cu.time_s - launch == pytest.approx(max(max(lu.values()), lu["matmul"] + lu["mufu"],
                                                   lu["matmul"] + lu["fp32"]))


def _replace(kernel, **changes):
    import dataclasses
    return dataclasses.replace(kernel, **changes)


def test_bad_arguments_name_themselves():
    w = Workload(batch=1, heads=1, seq_len_q=128, head_dim=64, dtype="fp16")
    with pytest.raises(ValueError, match="family="):
        plan_for("nope", "fwd", w)
    with pytest.raises(ValueError, match="block_q"):
        plan_for("mma", "fwd", w, block_q=96)
    with pytest.raises(ValueError, match="workload.dtype"):
        plan_for("mma", "fwd", w.replace(dtype="fp32"))
    with pytest.raises(ValueError, match="head_dim"):
        plan_for("tf32", "fwd", w.replace(dtype="fp32", head_dim=32))
    with pytest.raises(ValueError, match="Access.how"):
        Access("Q", "load", 1, "texture")
    with pytest.raises(ValueError, match="Matmul.unit"):
        Matmul("wgmma", 1)
    bad = KernelPlan("k", "fwd", (1,), 128, 10 ** 7, ())
    with pytest.raises(ValueError, match="do not fit"):
        price(Plan("x", "fwd", w, (bad,)), "h100")
    with pytest.raises(ValueError, match="unknown level"):
        price(Plan("x", "fwd", w, (_replace(bad, shared_bytes=0, serial=(("tensor",),)),)), "h100")


def test_choose_prices_every_legal_configuration():
    from sim.plans import choose
    w = Workload(batch=2, heads=8, seq_len_q=2048, head_dim=128, dtype="fp32", causal=True)
    cfg, cost, ranked = choose("tf32", "fwd", w, "h100")
    assert ranked[0][1] == cfg and cost.time_s == ranked[0][0]
    assert [t for t, _c in ranked] == sorted(t for t, _c in ranked)
    assert len(ranked) == sum(tf32_presplit_ok(128, q, k) for q in TF32_BLOCK_Q_CHOICES
                              for k in TF32_BLOCK_K_CHOICES)
    with pytest.raises(ValueError, match="family="):
        choose("flash3", "fwd", w)


def test_compare_prices_records_of_families_with_plans_from_their_plans():
    """`sim.compare` takes a tensor-core forward record's counts and raw time from the plan the
    record names (family, problem, tiles), and says so in ``model_source``."""
    from sim.compare import compare
    from sim.plans import plans_for_record
    recs = [rec for _name, rec in _mma_records()[:2]]
    df = compare(recs, "h100", l2="analytic", workers=1)
    assert list(df["model_source"]) == ["plan", "plan"]
    for (_i, row), rec in zip(df.iterrows(), recs):
        (plan,) = plans_for_record(rec)
        cost = price(plan, "h100")
        assert row["predicted_flops"] == pytest.approx(cost.flops)
        assert row["predicted_global_bytes"] == pytest.approx(cost.global_bytes)
        assert row["predicted_time_raw"] == pytest.approx(cost.time_ms)
    assert plans_for_record(dict(recs[0], kernel="triton")) is None


def test_measured_rates_replace_the_datasheet_ones():
    """A profile given measured rates (explicitly) prices with them; without, the datasheet."""
    import dataclasses
    from sim.plan import rates_of
    from sim.profiles import load_profile
    prof = load_profile("h100")
    w = Workload(batch=2, heads=8, seq_len_q=2048, head_dim=64, dtype="fp16")
    plan = plan_for("mma", "fwd", w)
    base = price(plan, prof)
    slow = dataclasses.replace(prof, measured_rates={"smem_read_bytes_per_s_per_sm": 1e9,
                                                     "kernel_launch_s": 5e-6})
    rates, sources = rates_of(slow)
    assert rates["smem_bytes_per_s"] == 1e9 * prof.num_sms and sources["smem_bytes_per_s"] == "measured"
    assert sources["dram_bytes_per_s"] == "datasheet"
    cost = price(plan, slow)
    (k,) = cost.kernels
    assert k.bound == "smem" and cost.time_s > base.time_s
    assert k.time_s == pytest.approx(5e-6 + k.level_s["smem"])


def test_compare_takes_measured_rates_from_the_file_of_the_records_gpu(tmp_path):
    """``compare(..., rates=FILES)``: a plan-priced record uses the rates measured on its GPU;
    ``rel_error_time`` is that time's error; a file of another GPU is not used."""
    from sim.compare import compare
    recs = [rec for name, rec in _mma_records() if name.startswith("h100")][:1]
    prov = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-24", "command": "test"}
    fast = {"schema": "ioaware.rates/1", "provenance": prov,
            "rates": {"smem_read_bytes_per_s_per_sm": {"value": 1e15, "unit": "bytes/s"}}}
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(fast))
    other = tmp_path / "rates_h200.json"
    other.write_text(json.dumps(dict(fast, provenance=dict(prov, gpu="NVIDIA H200"))))
    base = compare(recs, "h100", l2="analytic", workers=1)
    rated = compare(recs, "h100", l2="analytic", workers=1, rates=[str(other), str(path)])
    assert base["rates"].iloc[0] == "datasheet" and rated["rates"].iloc[0] == "measured"
    assert rated["predicted_time"].iloc[0] != base["predicted_time"].iloc[0]
    assert rated["rel_error_time"].iloc[0] == pytest.approx(
        rated["predicted_time"].iloc[0] / rated["measured_time"].iloc[0] - 1)
    h200_only = compare(recs, "h100", l2="analytic", workers=1, rates=[str(other)])
    assert h200_only["rates"].iloc[0] == "datasheet"


def test_plan_command(capsys):
    """``python -m sim plan``: the plan and its price as JSON; ``--choose`` ranks every legal
    configuration; a family without a plan is refused by name."""
    from sim.cli import main
    assert main(["plan", "--family", "mma", "--seq-len", "1000", "--head-dim", "128", "--json",
                 "--compact"]) == 0
    d = json.loads(capsys.readouterr().out)
    w = Workload(batch=1, heads=16, seq_len_q=1000, head_dim=128, dtype="fp16")
    assert d["global_bytes"] == pytest.approx(price(plan_for("mma", "fwd", w), "h100").global_bytes)
    assert d["kernels_plan"][0]["grid"] == [cdiv(1000, 64), 16]
    assert main(["plan", "--family", "tf32", "--dtype", "fp32", "--seq-len", "512", "--choose",
                 "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert [r["time_ms"] for r in ranked] == sorted(r["time_ms"] for r in ranked)
    with pytest.raises(SystemExit, match="--family"):
        main(["plan", "--family", "nope", "--seq-len", "64"])
    # the mma backward's dQ by atomics: three kernels, the middle one adding to the accumulator
    assert main(["plan", "--family", "mma", "--pass", "bwd", "--seq-len", "1000", "--head-dim",
                 "128", "--dq-mode", "atomic", "--json", "--compact"]) == 0
    d = json.loads(capsys.readouterr().out)
    wb = w.replace(pass_="bwd")
    assert d["global_bytes"] == pytest.approx(
        price(plan_for("mma", "bwd", wb, dq_mode="atomic"), "h100").global_bytes)
    assert [k["name"] for k in d["kernels_plan"]] == ["flash_mma_bwd_pre", "flash_mma_bwd_dkdv",
                                                      "flash_mma_bwd_convert"]
    assert any(x["op"] == "atomic" for x in d["kernels_plan"][1]["accesses"])
    with pytest.raises(SystemExit, match="--dq-mode"):
        main(["plan", "--family", "tf32", "--pass", "fwd", "--dtype", "fp32", "--seq-len", "64",
              "--dq-mode", "atomic"])
    # the Hopper backward: its dQ kernel by default (the launcher's rule), atomics when asked
    for extra, names in (([], ["flash_wgmma_bwd_dq", "flash_wgmma_bwd_dkdv"]),
                         (["--dq-mode", "atomic"], ["flash_wgmma_bwd_pre", "flash_wgmma_bwd_dkdv",
                                                    "flash_wgmma_bwd_convert"])):
        assert main(["plan", "--family", "wgmma", "--pass", "bwd", "--seq-len", "1000",
                     "--json", "--compact", *extra]) == 0
        assert [k["name"] for k in json.loads(capsys.readouterr().out)["kernels_plan"]] == names
    # the tf32 backward too: atomics by default on the H100 at d 64 and 128, its dQ kernel asked
    for extra, first in (([], "flash_tf32_bwd_pre"), (["--dq-mode", "kernel"], "flash_tf32_bwd_dq")):
        assert main(["plan", "--family", "tf32", "--pass", "bwd", "--dtype", "fp32", "--seq-len",
                     "300", "--head-dim", "64", "--json", "--compact"] + extra) == 0
        assert json.loads(capsys.readouterr().out)["kernels_plan"][0]["name"] == first
    # without --dq-mode: what the launcher runs on --device (atomics from sm_90, the dQ kernel
    # on an A100); --dq-mode overrides it
    names = {}
    for device, extra in (("h100", []), ("a100", []), ("h100", ["--dq-mode", "kernel"])):
        assert main(["plan", "--family", "mma", "--pass", "bwd", "--seq-len", "1000",
                     "--head-dim", "128", "--device", device, "--json", "--compact"] + extra) == 0
        names[(device, bool(extra))] = [k["name"] for k in
                                        json.loads(capsys.readouterr().out)["kernels_plan"]]
    assert names[("h100", False)] == ["flash_mma_bwd_pre", "flash_mma_bwd_dkdv",
                                      "flash_mma_bwd_convert"]
    assert names[("a100", False)] == names[("h100", True)] == ["flash_mma_bwd_dq",
                                                               "flash_mma_bwd_dkdv"]


def test_default_dq_mode_rule_and_profiles():
    """The one rule the launcher and ``sim plan`` share: atomics from compute capability 9.0 at
    d = 128, the dQ kernel at d = 64, before sm_90, where the GPU is unknown and under
    deterministic algorithms; every
    shipped profile names its compute capability."""
    from sim.plans.tensor_core_bwd import ATOMIC_DQ_FROM_CC, mma_default_dq_mode
    from sim.profiles import PROFILES
    assert ATOMIC_DQ_FROM_CC == (9, 0)
    ccs = ((7, 5), (8, 0), (8, 9), (9, 0), (10, 0), None)
    assert [mma_default_dq_mode(cc, head_dim=128) for cc in ccs] \
        == ["kernel", "kernel", "kernel", "atomic", "atomic", "kernel"]
    assert [mma_default_dq_mode(cc, head_dim=64) for cc in ccs] == ["kernel"] * len(ccs)
    assert mma_default_dq_mode((9, 0), deterministic=True, head_dim=128) == "kernel"
    from sim.plans.tensor_core_bwd import tf32_default_dq_mode
    for d in (64, 128):      # the 3xTF32 backward: atomics from sm_90 at both head dims
        assert [tf32_default_dq_mode(cc, head_dim=d) for cc in ccs] \
            == ["kernel", "kernel", "kernel", "atomic", "atomic", "kernel"]
        assert tf32_default_dq_mode((9, 0), deterministic=True, head_dim=d) == "kernel"
    ccs = {name: prof.compute_capability for name, prof in PROFILES.items()}
    assert ccs == {"h100": (9, 0), "h200": (9, 0), "a100-40gb": (8, 0), "a100-80gb": (8, 0),
                   "t4": (7, 5)}
    assert all("compute_capability" in prof.sources for prof in PROFILES.values())


def test_compare_keeps_the_schedule_model_where_the_plan_refuses_the_records_configuration():
    from sim.compare import compare
    rec = dict(_mma_records()[0][1], block_q=96)      # a tile today's mma forward does not take
    df = compare([rec], "h100", l2="analytic", workers=1)
    assert df["model_source"].iloc[0] == "schedule" and "block_q" in df["plan_error"].iloc[0]


def test_search_with_a_family_ranks_its_configurations_by_its_plans(capsys):
    """``python -m sim search --family F``: the same ranking as `sim.plans.choose`."""
    from sim.cli import main
    from sim.plans import choose
    assert main(["search", "--family", "mma", "--seq-len", "2048", "--head-dim", "64", "--causal",
                 "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    w = Workload(batch=1, heads=16, seq_len_q=2048, head_dim=64, dtype="fp16", causal=True)
    assert [r["config"] for r in ranked] == [c for _t, c in choose("mma", "fwd", w, "h100")[2]]


@pytest.mark.parametrize("schedule", ["naive", "flash1", "flash2"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
@pytest.mark.parametrize("causal,window,heads_kv", [(False, None, 4), (True, None, 2), (False, (100, 0), 4)])
def test_textbook_schedules_are_plans_with_the_closed_forms_counts(schedule, pass_, causal, window, heads_kv):
    """`sim.plans.textbook`: the papers' algorithms as plans built by the model itself; their
    global bytes and FLOPs equal `sim.predict`'s closed forms, and (half precision, where no two
    levels share a pipe) so does their time, but for the GQA reduction, which the plan prices
    as a full wave of programs (`sim.predict` as one program per KV head)."""
    from sim.model import predict
    from sim.workload import Schedule
    if schedule != "flash2" and (window is not None or heads_kv != 4):
        pytest.skip("the naive and flash1 schedules take no window or GQA")
    w = Workload(batch=2, heads=4, heads_kv=heads_kv, seq_len_q=700, seq_len_k=900 if not causal else 700,
                 head_dim=64, dtype="fp16", causal=causal, window_size=window, pass_=pass_)
    plan = plan_for(schedule, pass_, w)
    cost = price(plan, "h100", l2="none")
    ref = predict(w, Schedule(schedule), "h100", l2="none")
    assert cost.global_bytes == ref.hbm_read_bytes + ref.hbm_write_bytes
    assert cost.flops == ref.flops
    if heads_kv == w.heads:
        assert cost.time_ms == pytest.approx(ref.predicted_ms, rel=1e-9)
    assert plan.config["block_q"] == ref.block_q and plan.config["block_k"] == ref.block_k
    assert plan_for(schedule, "fwd", w.replace(pass_="fwd+bwd")).pass_ == "fwd"
    # the analytic L2 model sees the same reuse (programs per slice, lockstep, stagger, steps)
    analytic = predict(w, Schedule(schedule), "h100", l2="analytic")
    assert price(plan, "h100").dram_bytes == pytest.approx(
        analytic.dram_read_bytes + analytic.dram_write_bytes, abs=1)


def test_unfused_pytorch_attention_records_are_priced_from_their_kernel_sequences():
    """MATH and eager records: plans of the kernel sequences PyTorch runs, with the counts of
    `sim.predict` on the same naive variant."""
    from sim.model import predict
    from sim.plans import plans_for_record
    from sim.plans.textbook import UNFUSED_SCHEDULES
    recs = [r for r in json.loads(SWEEPS[0].read_text())["records"] if r["kernel"] in ("sdpa-math", "eager")]
    assert recs
    for rec in recs[:6]:
        (plan,) = plans_for_record(rec)
        assert plan.family == rec["kernel"]
        ref = predict(Workload.from_record(rec), UNFUSED_SCHEDULES[rec["kernel"]], "h100", l2="none")
        cost = price(plan, "h100", l2="none")
        assert cost.global_bytes == ref.hbm_read_bytes + ref.hbm_write_bytes and cost.flops == ref.flops


def test_plan_for_builds_a_plan_once_per_workload_value_and_config():
    """Launchers ask for the same plan at every call: equal workloads (built apart) and configs
    give the same plan object; another config, another plan; a block-mask workload (an array)
    is built each time."""
    w1 = Workload(batch=2, heads=4, seq_len_q=512, head_dim=64, dtype="fp16", causal=True)
    w2 = Workload(batch=2, heads=4, seq_len_q=512, head_dim=64, dtype="fp16", causal=True)
    assert plan_for("mma", "fwd", w1, block_q=64) is plan_for("mma", "fwd", w2, block_q=64)
    assert plan_for("mma", "fwd", w1, block_q=128) is not plan_for("mma", "fwd", w1, block_q=64)
    sparse = w1.replace(causal=False, block_mask=np.ones((4, 4), bool))
    assert plan_for("flash2", "fwd", sparse) is not plan_for("flash2", "fwd", sparse)
