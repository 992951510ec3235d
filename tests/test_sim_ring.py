"""sim.ring: the ring's counts (bytes, steps, transfers), its composition from sim.predict and the
interconnect, the crossover's direction with bandwidth and latency, the profiles' interconnect
figures and their sources, and ``python -m sim ring``. No fitted numbers: every expectation is
recomputed from the model's own parts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import sim
from ioaware.ring_plan import kv_source, pair_blocks
from sim.ring import (Interconnect, crossover_shard_len, interconnect_for, kv_shard_bytes, load_interconnect,
                      pair_workload, predict_ring)

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(batch=2, heads=8, heads_kv=2, head_dim=64, dtype="bf16")
LINK = Interconnect(100e9, 5e-6, "test")


def test_kv_shard_bytes_is_two_tensors_of_the_shard():
    assert kv_shard_bytes(2, 2, 4096, 64, "bf16") == 2 * 2 * 2 * 4096 * 64 * 2
    assert kv_shard_bytes(1, 8, 1000, 128, "fp32") == 2 * 8 * 1000 * 128 * 4
    r = predict_ring(seq_len=8192, world_size=4, profile="h100", interconnect=LINK, crossover=False, **SHAPE)
    assert r.shard_len == 2048 and r.kv_shard_bytes == kv_shard_bytes(2, 2, 2048, 64, "bf16")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_steps_and_transfers_count_the_ring(world):
    fwd = predict_ring(seq_len=4096, world_size=world, pass_="fwd", interconnect=LINK, crossover=False, **SHAPE)
    assert len(fwd.steps) == world and [s.index for s in fwd.steps] == list(range(world))
    # the forward sends P - 1 K/V shards, each while a step computes; the last step sends nothing
    assert [s.transfer_bytes for s in fwd.steps] == [fwd.kv_shard_bytes] * (world - 1) + [0]
    assert fwd.transfers == world - 1 and fwd.exposed_transfer_ms == 0
    both = predict_ring(seq_len=4096, world_size=world, pass_="fwd+bwd", interconnect=LINK, crossover=False, **SHAPE)
    bwd = [s for s in both.steps if s.pass_ == "bwd"]
    assert len(both.steps) == 2 * world
    # the backward: P - 1 K/V shards and P dK/dV buffers (float32), the last one after the ring
    dkv = 2 * SHAPE["batch"] * SHAPE["heads_kv"] * both.shard_len * SHAPE["head_dim"] * 4
    if world > 1:
        assert sum(s.transfer_bytes for s in bwd) == (world - 1) * both.kv_shard_bytes + (world - 1) * dkv
        assert both.exposed_transfer_ms == pytest.approx(LINK.transfer_ms(dkv))
    else:
        assert all(s.transfer_bytes == 0 for s in bwd) and both.exposed_transfer_ms == 0


def test_step_time_is_the_overlap_plus_what_does_not_overlap():
    r = predict_ring(seq_len=16384, world_size=4, pass_="fwd+bwd", interconnect=LINK, crossover=False, **SHAPE)
    for s in r.steps:
        # one transfer in flight (the forward's K/V; the backward's first K/V and last dK/dV), or two
        transfers = 0 if not s.transfer_bytes else 1 if s.pass_ == "fwd" or s.index in (0, 3) else 2
        want = 1e3 * (transfers * LINK.latency_s + s.transfer_bytes / LINK.bandwidth_bytes_per_s)
        assert s.transfer_ms == pytest.approx(want)
        assert s.step_ms == pytest.approx(max(s.compute_ms, s.transfer_ms) + s.merge_ms)
        assert s.merge_ms > 0
    assert r.total_ms == pytest.approx(sum(s.step_ms for s in r.steps) + r.exposed_transfer_ms)
    assert r.scaling_efficiency == pytest.approx(r.single_gpu_ms / (4 * r.total_ms))


def test_transfer_time_is_latency_plus_bytes_over_bandwidth():
    assert LINK.transfer_ms(10**9) == pytest.approx(1e3 * (5e-6 + 10**9 / 100e9))
    assert LINK.transfer_ms(0) == 0
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        Interconnect(0, 1e-6)
    with pytest.raises(ValueError, match="latency_s"):
        Interconnect(1e9, -1)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous", "striped"])
def test_compute_is_sim_predict_of_each_ranks_pair(layout):
    world, n = 4, 1024
    r = predict_ring(seq_len=world * n, world_size=world, layout=layout, causal=True, interconnect=LINK,
                     crossover=False, **SHAPE)
    for s in r.steps:
        for rank, got in enumerate(s.compute_ms_per_rank):
            want = sum(sim.predict(pair_workload(b, pass_="fwd", **SHAPE), sim.Schedule("flash2"), "h100",
                                   l2="analytic").predicted_ms
                       for b in pair_blocks(layout, rank, kv_source(rank, s.index, world), world, n, True))
            assert got == pytest.approx(want)


def _pair_flops(layout, rank, step, world, n):
    return sum(sim.predict(pair_workload(b, pass_="fwd", **SHAPE), "flash2", "h100", l2="none").matmul_flops
               for b in pair_blocks(layout, rank, kv_source(rank, step, world), world, n, True))


def test_zigzag_steps_are_balanced_and_contiguous_waits_for_its_last_rank():
    kw = dict(seq_len=65536, world_size=4, causal=True, interconnect=LINK, crossover=False, **SHAPE)
    for step in range(1, 4):     # equal FLOPs (the predicted times differ by the pairs' shapes: c x 2c, 2c x c)
        assert len({_pair_flops("zigzag", rank, step, 4, 4096) for rank in range(4)}) == 1
    zig = predict_ring(layout="zigzag", **kw)
    con = predict_ring(layout="contiguous", **kw)
    for s in con.steps[1:]:
        assert s.compute_ms_per_rank[0] == 0          # rank 0's queries see no later key
    assert con.total_ms > zig.total_ms


def test_crossover_moves_the_right_way():
    kw = dict(world_size=2, causal=True, pass_="fwd", **SHAPE)
    slow = crossover_shard_len(interconnect=Interconnect(25e9, 5e-6), **kw)
    fast = crossover_shard_len(interconnect=Interconnect(400e9, 5e-6), **kw)
    laggy = crossover_shard_len(interconnect=Interconnect(400e9, 200e-6), **kw)
    assert slow > fast and laggy > fast
    assert slow % 2 == 0                               # zigzag shards are even
    assert crossover_shard_len(world_size=1, interconnect=LINK) is None
    # on each side of the crossover, as the prediction computes it
    below = predict_ring(seq_len=2 * (slow - 2), world_size=2, causal=True, interconnect=Interconnect(25e9, 5e-6),
                         crossover=False, **SHAPE)
    at = predict_ring(seq_len=2 * slow, world_size=2, causal=True, interconnect=Interconnect(25e9, 5e-6),
                      crossover=False, **SHAPE)
    assert any(s.communication_bound for s in below.steps)
    assert not any(s.communication_bound for s in at.steps)


def test_profiles_carry_sourced_interconnect_figures():
    for name in ("h100", "h200"):
        prof = sim.PROFILES[name]
        assert prof.interconnect_bandwidth_bytes_per_s == 450e9
        assert prof.sources["interconnect_bandwidth_bytes_per_s"].startswith("DATASHEET")
        assert "900 GB/s" in prof.sources["interconnect_bandwidth_bytes_per_s"]
        assert prof.sources["interconnect_latency_s"].startswith("ESTIMATE")
        assert "--p2p" in prof.sources["interconnect_latency_s"]
    with pytest.raises(ValueError, match="interconnect_bandwidth_bytes_per_s"):
        interconnect_for("t4")
    assert interconnect_for("t4", 10e9, 1e-5).bandwidth_bytes_per_s == 10e9
    with pytest.raises(ValueError, match="interconnect_latency_s"):
        sim.GPUProfile(name="x", hbm_bandwidth_bytes_per_s=1e12, l2_bytes=2**22, num_sms=10,
                       smem_bytes_per_sm=2**16, smem_bytes_per_block=2**16, fp32_flops_per_s=1e12,
                       interconnect_latency_s=-1.0)


def test_measured_interconnect_file_is_read(tmp_path):
    path = tmp_path / "p2p.json"
    path.write_text(json.dumps({"interconnect_bandwidth_bytes_per_s": 3e11, "interconnect_latency_s": 2e-5,
                                "sources": {"interconnect_bandwidth_bytes_per_s": "MEASURED here"}}))
    link = load_interconnect(path)
    assert (link.bandwidth_bytes_per_s, link.latency_s) == (3e11, 2e-5) and "MEASURED here" in link.source
    path.write_text(json.dumps({"interconnect_latency_s": 2e-5}))
    with pytest.raises(ValueError, match="interconnect_bandwidth_bytes_per_s"):
        load_interconnect(path)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sim", "ring", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_ring_prints_json_and_refuses_clearly(tmp_path):
    r = _cli("--seq-len", "32k", "--world-size", "2", "--device", "h100", "--causal", "--pass", "fwd+bwd", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["seq_len"] == 32768 and d["shard_len"] == 16384 and len(d["steps"]) == 4
    assert d["crossover_shard_len"] > 0 and 0 < d["scaling_efficiency"]
    r = _cli("--seq-len", "32k", "--world-size", "2")
    assert r.returncode == 0 and "scaling efficiency" in r.stdout and "DATASHEET" in r.stdout
    r = _cli("--seq-len", "1000", "--world-size", "8")
    assert r.returncode == 2 and "--seq-len = 1000" in r.stderr and "divisible by 16" in r.stderr
    r = _cli("--seq-len", "4096", "--world-size", "2", "--device", "t4")
    assert r.returncode == 2 and "interconnect_bandwidth_bytes_per_s" in r.stderr
    path = tmp_path / "p2p.json"
    path.write_text(json.dumps({"interconnect_bandwidth_bytes_per_s": 1e11, "interconnect_latency_s": 1e-5}))
    r = _cli("--seq-len", "4096", "--world-size", "2", "--device", "t4", "--interconnect", str(path), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["interconnect"]["bandwidth_bytes_per_s"] == 1e11
