"""sim: register-limited occupancy (profiles' register file, Schedule.registers_per_thread).

The register limit is checked against what Nsight Compute computed on the GPUs of the shipped
sweeps (``ncu_launch__occupancy_limit_registers`` of every single-launch record)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.workload import occupancy, register_limited_blocks

RESULTS = Path(__file__).resolve().parents[1] / "results"
SWEEPS = ("h100_sweep_20261122.json", "h200_sweep_20261122.json")


@pytest.mark.parametrize("name", sorted(sim.PROFILES))
def test_shipped_profiles_have_a_cited_register_file(name):
    prof = sim.PROFILES[name]
    assert prof.models_registers
    for field in ("registers_per_sm", "register_alloc_unit", "register_sub_partitions",
                  "max_registers_per_thread"):
        assert getattr(prof, field) > 0
        assert prof.sources.get(field), f"{name}: {field} has no source"


def test_register_limit_equals_ncu_occupancy_limit_on_the_shipped_sweeps():
    prof = sim.load_profile("h100")     # same register file as the H200 (sm_90)
    n = 0
    for fname in SWEEPS:
        data = json.loads((RESULTS / fname).read_text())
        for r in data["records"]:
            # per-record ncu fields are sums over launches: single-launch records only
            if r.get("ncu_launches") != 1 or r.get("ncu_launch__registers_per_thread") is None:
                continue
            warps = -(-int(r["ncu_launch__block_size"]) // 32)
            got = register_limited_blocks(prof, int(r["ncu_launch__registers_per_thread"]), warps)
            assert got == r["ncu_launch__occupancy_limit_registers"], (fname, r["block_q"], r["block_k"])
            n += 1
    assert n >= 100


@settings(max_examples=200, deadline=None)
@given(regs=st.integers(1, 255), more=st.integers(0, 254), warps=st.integers(1, 32),
       sram=st.integers(0, 100_000), name=st.sampled_from(sorted(sim.PROFILES)))
def test_more_registers_never_raise_occupancy(regs, more, warps, sram, name):
    prof = sim.PROFILES[name]
    base = occupancy(prof, sram, warps)
    a = occupancy(prof, sram, warps, regs)
    b = occupancy(prof, sram, warps, min(255, regs + more))
    assert b <= a <= base                      # registers only ever lower the limit
    assert occupancy(prof, sram, warps, None) == base
    lim = register_limited_blocks(prof, regs, warps)
    # what is resident fits the register file
    per_warp = -(-regs * 32 // prof.register_alloc_unit) * prof.register_alloc_unit
    assert lim * warps * per_warp <= prof.registers_per_sm
    assert a == min(base, lim)


def test_register_limit_examples_and_errors():
    prof = sim.load_profile("h100")
    # 168 registers x 32 = 5376 = 21 x 256: 3 warps per sub-partition, 12 per SM
    assert register_limited_blocks(prof, 168, 2) == 6
    assert register_limited_blocks(prof, 32, 4) == 16      # 64 warps: the file is not the limit
    assert register_limited_blocks(prof, 256, 1) == 0      # above the per-thread maximum
    for bad in (0, -3, 1.5, True, None):
        with pytest.raises(ValueError, match="registers_per_thread"):
            register_limited_blocks(prof, bad, 4)
    no_regs = dataclasses.replace(prof, registers_per_sm=None, register_alloc_unit=None,
                                  register_sub_partitions=None, max_registers_per_thread=None)
    assert register_limited_blocks(no_regs, 168, 2) is None
    assert occupancy(no_regs, 1000, 2, 168) == occupancy(no_regs, 1000, 2)
    with pytest.raises(ValueError, match="registers_per_sm"):
        dataclasses.replace(prof, registers_per_sm=None)
    with pytest.raises(ValueError, match="register_alloc_unit"):
        dataclasses.replace(prof, register_alloc_unit=0)


def test_schedule_registers_are_validated():
    s = sim.Schedule("flash2", registers_per_thread=168, registers_per_thread_kv=139)
    assert (s.registers_per_thread, s.registers_per_thread_kv) == (168, 139)
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="registers_per_thread"):
            sim.Schedule("flash2", registers_per_thread=bad)
        with pytest.raises(ValueError, match="registers_per_thread_kv"):
            sim.Schedule("flash2", registers_per_thread_kv=bad)


def test_registers_change_only_occupancy_never_counts():
    w = sim.Workload(batch=2, heads=4, seq_len_q=512, head_dim=64, dtype="fp32", pass_="fwd+bwd")
    kw = dict(block_q=64, block_k=32, matmul_unit="cuda", micro_tile=(8, 4), micro_tile_kv=(2, 2))
    a = sim.predict(w, sim.Schedule("flash2", **kw), "h100", l2="none", calibration=None)
    b = sim.predict(w, sim.Schedule("flash2", registers_per_thread=255, registers_per_thread_kv=255,
                                    **kw), "h100", l2="none", calibration=None)
    assert (a.flops, a.hbm_read_bytes, a.hbm_write_bytes) == (b.flops, b.hbm_read_bytes, b.hbm_write_bytes)
    assert a.smem == b.smem
    # 255 registers per thread: the 64-thread forward block fits 4 per SM instead of 5 (shared
    # memory), so the 64 x 32 programs of the forward take more waves
    fwd_a, fwd_b = a.phases["fwd"], b.phases["fwd"]
    assert fwd_a["programs"] == fwd_b["programs"]
    assert fwd_b["sm_utilisation"] != fwd_a["sm_utilisation"] or fwd_a["programs"] <= 4 * 132
