"""sim stands on its own: it imports nothing from `kernels` or `benchmarks` (the layering is
ioaware -> kernels -> sim), and it reads the kernel resources table and chooses the CUDA-core
micro-tiles itself (`sim.resources`, `sim.tiles`)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim import resources as SR
from sim.tiles import TileConfig, choose_tiles

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("kernels", "benchmarks")


def _imports(path: Path):
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant)):
            yield node.lineno, str(node.args[0].value)


def test_no_sim_module_imports_kernels_or_benchmarks():
    files = sorted((ROOT / "sim").rglob("*.py"))
    assert len(files) >= 10
    bad = [f"{f.relative_to(ROOT)}:{line}: {mod}" for f in files for line, mod in _imports(f)
           if mod.split(".")[0] in FORBIDDEN]
    assert not bad, bad


def test_sim_models_shipped_records_with_kernels_unimportable():
    """Registers and micro-tiles of our kernel's records, and a calibrated prediction, with
    `kernels` and `benchmarks` blocked: nothing on these paths reaches for them."""
    code = """
import sys
sys.modules["kernels"] = None
sys.modules["benchmarks"] = None
import sim, sim.cli, sim.compare as C
from sim.results import load_results
recs = [r for r in load_results("results/h100_sweep_20261122.json") if r["kernel"] == "ioaware-numba"]
seen = set()
for r in recs:
    regs, regs_kv, status = C.record_registers(r)
    seen.add((r["pass"], r.get("variant"), status))
    sim.model.record_micro_tiles(r)
    C.model_for_record(r)
assert ("fwd", "simt", "found") in seen and ("bwd", "simt", "found") in seen, seen
w = sim.Workload(seq_len_q=1024, head_dim=64, dtype="fp32")
p = sim.predict(w, sim.Schedule("flash2", 64, 32, matmul_unit="cuda", micro_tile=(4, 4)), "h100",
                l2="none", calibration="results/h100_sweep_20261122.json")
assert p.predicted_ms_calibrated is not None
assert not [m for m in sys.modules if m.split(".")[0] in ("kernels", "benchmarks")
            and sys.modules[m] is not None]
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


# -- sim.resources: the registers table -------------------------------------------------------------
def test_resource_key_is_unique_and_checked():
    k = SR.resource_key("flash_fwd_v2", 64, "fp32", False, block_m=64, block_n=32, tile=(8, 4))
    assert k == "flash_fwd_v2/d64/fp32/full/64x32/t8x4"
    kv = dict(block_m=8, block_n=16, tile=(1, 2))
    atomic = SR.resource_key("flash_bwd_dkdv_v2", 128, "fp32", True, dq_atomic=True, **kv)
    assert atomic == "flash_bwd_dkdv_v2/d128/fp32/causal/8x16/t1x2/dq_atomic"
    assert atomic != SR.resource_key("flash_bwd_dkdv_v2", 128, "fp32", True, dq_atomic=False, **kv)
    assert SR.resource_key("flash_mma_fwd", 64, "fp16", False, mask=True, dropout=True) == \
        "flash_mma_fwd/d64/fp16/full/mask/dropout"
    for args, kw, msg in ((("flash_fwd", 64, "fp64", False), {}, "dtype"),
                          (("flash_fwd", 64, "fp32", False), {"block_m": 64}, "block_m"),
                          (("", 64, "fp32", False), {}, "kernel"),
                          (("flash_fwd", 0, "fp32", False), {}, "head_dim"),
                          (("flash_fwd", 64, "fp32", False), {"tile": (1, 2, 3)}, "tile")):
        with pytest.raises(ValueError, match=msg):
            SR.resource_key(*args, **kw)


def test_shipped_table_reads_and_looks_up_every_entry():
    raw = json.loads(SR.RESOURCES_PATH.read_text())["kernels"]
    table = SR.load_resources()
    assert len(table) == len(raw) > 0
    for e in raw:
        kw = {k: e.get(k) for k in ("block_m", "block_n", "tile", "dq_atomic")}
        found = SR.lookup(table, e["kernel"], e["head_dim"], e["dtype"], e["causal"], **kw)
        assert found is not None and found["registers_per_thread"] == e["registers_per_thread"]
    assert SR.lookup(table, "flash_fwd_v2", 64, "fp32", False, block_m=3, block_n=5) is None


def test_load_resources_rejects_other_json(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"records": []}))
    with pytest.raises(ValueError, match="kernels"):
        SR.load_resources(p)
    p.write_text(json.dumps({"kernels": [{"key": "a"}]}))
    with pytest.raises(ValueError, match="registers_per_thread"):
        SR.load_resources(p)


def test_compare_reads_the_table_through_sim_resources(tmp_path):
    from sim import compare as C
    assert C.RESOURCES_PATH == SR.RESOURCES_PATH
    assert C.kernel_resources(tmp_path / "absent.json") == {}
    rec = {"kernel": "ioaware-numba", "variant": "simt", "pass": "fwd", "head_dim": 64,
           "dtype": "fp32", "causal": False, "block_q": 64, "block_k": 32, "micro_tile": [8, 4],
           "provenance": {"compute_capability": "9.0"}}
    key = SR.resource_key(C.SIMT_FWD_KERNEL, 64, "fp32", False, block_m=64, block_n=32, tile=(8, 4))
    table = {key: {"key": key, "registers_per_thread": 77}}
    assert C.record_registers(rec, table) == (77, None, "found")
    # a record profiled on the earlier forward names it, and is looked up under that name
    old = dict(rec, ncu_kernels=[{"name": "make_forward_kernel::flash_fwd[v3]"}])
    assert C.record_registers(old, table) == (None, None, "missing")
    old_key = SR.resource_key("flash_fwd", 64, "fp32", False, block_m=64, block_n=32, tile=(8, 4))
    assert C.record_registers(old, {old_key: {"registers_per_thread": 99}}) == (99, None, "found")


# -- sim.tiles: the CUDA-core kernels' micro-tiles --------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(bm=st.sampled_from([8, 16, 32, 64, 128]), bn=st.sampled_from([8, 16, 32, 64, 128]),
       d=st.sampled_from([16, 32, 48, 64, 96, 128, 256]), target=st.sampled_from([32, 64, 128, 256]))
def test_choose_tiles_splits_the_tile_validly(bm, bn, d, target):
    c = choose_tiles(bm, bn, d, target)
    assert isinstance(c, TileConfig) and (c.block_m, c.block_n) == (bm, bn)
    c.validate(d)                              # raises on an invalid split
    assert c.ntn <= 8 and d % c.ntn == 0 and bn % c.ntn == 0
    assert c.threads <= max(target, c.ntn)
    # as many threads along the rows as the target allows (a power of two dividing block_m)
    if c.ntm < bm:
        assert 2 * c.threads > target or bm % (2 * c.ntm)


def test_tile_config_validate_rejects_bad_splits():
    assert TileConfig(64, 32, 4, 4).threads == 16 * 8
    for cfg, d, msg in ((TileConfig(64, 32, 3, 4), 64, "divide"),
                        (TileConfig(64, 48, 4, 2), 64, "power of two"),
                        (TileConfig(64, 32, 4, 4), 36, "multiple"),
                        (TileConfig(1024, 32, 1, 1), 64, "exceeds 1024"),
                        (TileConfig(0, 32, 1, 1), 64, ">= 1")):
        with pytest.raises(ValueError, match=msg):
            cfg.validate(d)


def test_sim_exports_the_tiles():
    assert sim.choose_tiles is choose_tiles and sim.TileConfig is TileConfig


def test_choose_tiles_equals_the_kernels_launch_rule():
    """The kernels launch with these tiles: while `kernels.config` still has its own copy, the
    two agree on every configuration of the shipped sweeps' block sizes."""
    config = pytest.importorskip("kernels.config")
    for bm in (4, 8, 16, 32, 64, 128, 256):
        for bn in (4, 8, 16, 32, 64, 128, 256):
            for d in (16, 32, 64, 96, 128, 256):
                for target in (64, 128, 256):
                    ours, theirs = choose_tiles(bm, bn, d, target), config.choose_tiles(bm, bn, d, target)
                    assert (ours.tm, ours.tn, ours.threads) == (theirs.tm, theirs.tn, theirs.threads)
