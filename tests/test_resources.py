"""benchmarks.resources: the configuration list, ptxas parsing (CPU, always), the shipped table
against today's kernels and the shipped sweeps, and the command on one small configuration
(needs ptxas; skipped without it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import resources as R
from benchmarks.common import KERNEL_NAMES, find_ptxas, parse_ptxas
from sim.resources import RESOURCES_PATH, load_resources, resource_key

ROOT = Path(__file__).resolve().parents[1]

# the shape of `ptxas -v` output (CUDA 13.0), with made-up figures
PTXAS_TEXT = """ptxas info    : 8 bytes gmem
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'
ptxas info    : Function properties for _Z3fooPf
    16 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 97 registers, used 1 barriers, 4352 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 1.000 ms
ptxas info    : Compiling entry function '_Z3barv' for 'sm_90'
ptxas info    : Function properties for _Z3barv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 360 bytes cmem[0]
"""


def test_parse_ptxas():
    a, b = parse_ptxas(PTXAS_TEXT)
    assert a == {"function": "_Z3fooPf", "registers_per_thread": 97, "stack_frame_bytes": 16,
                 "spill_store_bytes": 12, "spill_load_bytes": 8, "static_smem_bytes": 4352,
                 "barriers": 1}
    assert (b["function"], b["registers_per_thread"], b["static_smem_bytes"], b["barriers"]) == \
        ("_Z3barv", 12, 0, 0)
    with pytest.raises(ValueError, match="Used N registers"):
        parse_ptxas("ptxas info    : 8 bytes gmem\n")
    with pytest.raises(TypeError, match="text"):
        parse_ptxas(None)


def test_sweep_configs_follow_the_launch_rule():
    from kernels.config import choose_tiles
    configs = R.sweep_configs(tensor_core_defaults=False)
    cfgs = {c["key"]: c for c in configs}
    assert len(cfgs) == len(configs)                                   # deduplicated
    assert {c["kernel"] for c in configs} == {"flash_fwd_v2", "flash_bwd_delta_v2",
                                              "flash_bwd_dkdv_v2", "flash_mma_fwd"}
    # the forward: the pinned micro-tile (kernels.config.FWD_TILES) and choose_tiles'
    assert "flash_fwd_v2/d64/fp32/full/64x32/t8x4" in cfgs
    auto = choose_tiles(64, 32, 64, 128)
    assert resource_key("flash_fwd_v2", 64, "fp32", False, block_m=64, block_n=32,
                        tile=(auto.tm, auto.tn)) in cfgs
    # the backward: dK/dV over (block_k, block_q) with dQ by atomics, 128 target threads
    kv = choose_tiles(8, 16, 128, 128)
    assert resource_key("flash_bwd_dkdv_v2", 128, "fp32", True, block_m=8, block_n=16,
                        tile=(kv.tm, kv.tn), dq_atomic=True) in cfgs
    assert all(c["dq_atomic"] for c in configs if c["kernel"] == "flash_bwd_dkdv_v2")
    assert {c["key"] for c in configs if c["kernel"] == "flash_bwd_delta_v2"} == {
        f"flash_bwd_delta_v2/d{d}/{dt}/full" for d in (64, 128) for dt in ("fp32", "fp16")}


def test_shipped_table_is_todays_kernels_with_provenance():
    """The shipped table holds exactly the configurations `sweep_configs` lists (today's
    kernels only), each entry with the figures the model reads."""
    raw = json.loads(RESOURCES_PATH.read_text())
    prov = raw["provenance"]
    assert prov["arch"] == "sm_90" and prov["ptxas"]
    assert prov["command"].startswith("python -m benchmarks resources")
    for key in ("numba", "numba_cuda", "date", "code_version", "kernels_sha"):
        assert prov[key], key
    keys = [e["key"] for e in raw["kernels"]]
    assert sorted(keys) == sorted(c["key"] for c in R.sweep_configs())
    assert {e["kernel"] for e in raw["kernels"]} <= set(KERNEL_NAMES.values())
    for e in raw["kernels"]:
        assert 0 < e["registers_per_thread"] <= 255 and e["threads_per_block"] > 0, e["key"]


def _profiled(rec):
    """The Numba kernels ncu saw for a record (names without module and template)."""
    return {k["name"].split("::")[-1].split("[")[0] for k in rec.get("ncu_kernels") or []}


def test_shipped_table_covers_the_shipped_records_of_todays_kernels():
    """Every record of our kernel in the shipped sweeps that ran today's kernels finds its
    registers (the comparison's rule, sim.compare.record_registers); records of deleted
    kernels (the first CUDA-core forward and dK/dV kernels, the separate dQ kernel) are
    "missing", never given another kernel's figures."""
    from sim.compare import record_registers
    table = load_resources(RESOURCES_PATH)
    deleted = {"flash_fwd", "flash_bwd_dkdv", "flash_bwd_dq"}
    found = missing = 0
    for name in ("h100_sweep_20261122.json", "h200_sweep_20261122.json"):
        data = json.loads((ROOT / "results" / name).read_text())
        for rec in data["records"]:
            if rec["kernel"] != "ioaware-numba":
                continue
            rec = dict(rec, provenance=data["provenance"])
            regs, regs_kv, status = record_registers(rec, table, dq_mode="atomic")
            if _profiled(rec) & deleted:
                assert status == "missing", (name, rec["pass"], _profiled(rec))
                missing += 1
            else:
                assert status == "found", (name, rec["pass"], rec["block_q"], rec["block_k"])
                assert (regs or regs_kv) > 0
                found += 1
            if rec["pass"] == "bwd":       # the separate dQ kernel is gone
                assert record_registers(rec, table, dq_mode="kernel")[2] == "missing"
    assert found >= 250 and missing >= 30


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not available")
def test_command_on_one_small_configuration(tmp_path):
    # a fresh process: the test session runs Numba's CUDA simulator, which cannot emit PTX
    import subprocess
    import sys
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "resources", "--out", str(out),
                        "--only", "flash_bwd_delta_v2/d64/fp32/", "--no-tensor-core-defaults"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    (e,) = data["kernels"]
    assert e["key"] == "flash_bwd_delta_v2/d64/fp32/full"
    assert e["threads_per_block"] == 256 and 0 < e["registers_per_thread"] <= 255
    assert e["spill_store_bytes"] == 0
    assert data["provenance"]["ptxas"] and data["provenance"]["numba"]
    assert data["provenance"]["command"].endswith("--no-tensor-core-defaults")
    assert "flash_bwd_delta_v2/d64/fp32/full" in r.stdout
    shipped = load_resources(RESOURCES_PATH)[e["key"]]
    assert e["registers_per_thread"] == shipped["registers_per_thread"]


def test_ptxas_registers_equal_what_ncu_saw_on_the_h100_sweep():
    """The H100 sweep's single-kernel records (forward): the table's registers for the kernel
    and tiles the record ran equal Nsight Compute's ``launch__registers_per_thread``."""
    from sim.compare import record_registers
    table = load_resources(RESOURCES_PATH)
    data = json.loads((ROOT / "results" / "h100_sweep_20261122.json").read_text())
    n = 0
    for rec in data["records"]:
        if rec["kernel"] != "ioaware-numba" or rec.get("ncu_launches") != 1:
            continue
        regs, _, status = record_registers(dict(rec, provenance=data["provenance"]), table)
        assert regs == rec["ncu_launch__registers_per_thread"], (rec["head_dim"], rec["block_q"],
                                                                 rec["block_k"], rec["causal"])
        n += 1
    assert n >= 90
