"""kernels.resources: the configuration list, the key, ptxas parsing (CPU, always) and the
command on one small configuration (needs ptxas; skipped without it)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernels import resources as R

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
    a, b = R.parse_ptxas(PTXAS_TEXT)
    assert a == {"function": "_Z3fooPf", "registers_per_thread": 97, "stack_frame_bytes": 16,
                 "spill_store_bytes": 12, "spill_load_bytes": 8, "static_smem_bytes": 4352,
                 "barriers": 1}
    assert (b["function"], b["registers_per_thread"], b["static_smem_bytes"], b["barriers"]) == \
        ("_Z3barv", 12, 0, 0)
    with pytest.raises(ValueError, match="Used N registers"):
        R.parse_ptxas("ptxas info    : 8 bytes gmem\n")
    with pytest.raises(TypeError, match="text"):
        R.parse_ptxas(None)


def test_resource_key_is_unique_and_checked():
    k = R.resource_key("flash_fwd_v2", 64, "fp32", False, block_m=64, block_n=32, tile=(8, 4))
    assert k == "flash_fwd_v2/d64/fp32/full/64x32/t8x4"
    kv = R.resource_key("flash_bwd_dkdv_v2", 128, "fp32", True, block_m=8, block_n=16,
                        tile=(1, 2), dq_atomic=True)
    assert kv == "flash_bwd_dkdv_v2/d128/fp32/causal/8x16/t1x2/dq_atomic"
    assert kv != R.resource_key("flash_bwd_dkdv_v2", 128, "fp32", True, block_m=8, block_n=16,
                                tile=(1, 2), dq_atomic=False)
    with pytest.raises(ValueError, match="dtype"):
        R.resource_key("flash_fwd", 64, "fp64", False)
    with pytest.raises(ValueError, match="block_m"):
        R.resource_key("flash_fwd", 64, "fp32", False, block_m=64)
    with pytest.raises(ValueError, match="kernel"):
        R.resource_key("", 64, "fp32", False)
    with pytest.raises(ValueError, match="head_dim"):
        R.resource_key("flash_fwd", 0, "fp32", False)


def test_sweep_configs_follow_the_launch_rule():
    from kernels.config import choose_tiles
    cfgs = {c["key"]: c for c in R.sweep_configs(extra_tensor_core=False)}
    assert len(cfgs) == len(R.sweep_configs(extra_tensor_core=False))     # deduplicated
    # the forward's pinned micro-tile (kernels.config.FWD_TILES via kernels.measure)
    f = cfgs["flash_fwd_v2/d64/fp32/full/64x32/t8x4"]
    assert f["threads_per_block"] == 64
    # backward: dK/dV over (block_k, block_q), dQ over (block_q, block_k), 128 target threads
    ckv, cq = choose_tiles(8, 16, 128, 128), choose_tiles(16, 8, 128, 128)
    kv = cfgs[R.resource_key("flash_bwd_dkdv_v2", 128, "fp32", True, block_m=8, block_n=16,
                             tile=(ckv.tm, ckv.tn), dq_atomic=True)]
    assert kv["threads_per_block"] == ckv.threads
    assert R.resource_key("flash_bwd_dq", 128, "fp32", True, block_m=16, block_n=8,
                          tile=(cq.tm, cq.tn)) in cfgs
    assert cfgs["flash_bwd_delta_v2/d64/fp16/full"]["threads_per_block"] == 256


def test_shipped_table_covers_every_record_of_our_kernels():
    """Every CUDA-core and tensor-core record of our kernel in the shipped sweeps finds its
    registers (the comparison's rule, sim.compare.record_registers)."""
    from sim.compare import RESOURCES_PATH, record_registers
    table = R.load_resources(RESOURCES_PATH)
    prov = json.loads(RESOURCES_PATH.read_text())["provenance"]
    assert prov["arch"] == "sm_90" and "ptxas" in prov and prov["command"].startswith("python -m kernels.resources")
    for name in ("h100_sweep_20261122.json", "h200_sweep_20261122.json"):
        data = json.loads((ROOT / "results" / name).read_text())
        for rec in data["records"]:
            if rec["kernel"] != "ioaware-numba":
                continue
            rec = dict(rec, provenance=data["provenance"])
            for mode in (None, "kernel", "atomic"):
                regs, regs_kv, status = record_registers(rec, table, dq_mode=mode)
                assert status == "found", (name, rec["pass"], rec["block_q"], rec["block_k"], mode)
                assert (regs or regs_kv) > 0


def test_load_resources_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="kernels"):
        R.load_resources(p)


@pytest.mark.skipif(R.find_ptxas() is None, reason="ptxas (CUDA toolkit) not available")
def test_command_on_one_small_configuration(tmp_path):
    # a fresh process: the test session runs Numba's CUDA simulator, which cannot emit PTX
    import os
    import subprocess
    import sys
    out = tmp_path / "res.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    r = subprocess.run([sys.executable, "-m", "kernels.resources", "--out", str(out), "--only",
                        "flash_bwd_delta_v2/d64/fp32/", "--no-tensor-core"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    data = json.loads(out.read_text())
    (e,) = data["kernels"]
    assert e["key"] == "flash_bwd_delta_v2/d64/fp32/full"
    assert e["threads_per_block"] == 256 and 0 < e["registers_per_thread"] <= 255
    assert e["spill_store_bytes"] == 0
    assert data["provenance"]["ptxas"] and data["provenance"]["numba"]
    assert "flash_bwd_delta_v2/d64/fp32/full" in r.stdout


def test_ptxas_registers_equal_what_ncu_saw_on_the_h100_sweep():
    """The H100 sweep's single-kernel records (forward): the table's registers for the kernel
    and tiles the record ran equal Nsight Compute's ``launch__registers_per_thread``."""
    from sim.compare import RESOURCES_PATH, record_registers
    table = R.load_resources(RESOURCES_PATH)
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
