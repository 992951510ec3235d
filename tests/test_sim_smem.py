"""sim: the shared-memory level of our CUDA-core kernels (register micro-tiles as schedule data),
the kernels' executed FLOP terms, the delta pre-pass's loads, and records mapped to them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sim
from ioaware.block_info import BlockInfo
from sim.counts import closed_form, summarise, tile_stats_closed
from sim.model import record_delta_kernel, record_micro_tiles
from sim.smem import kernel_launch_shape, smem_bytes_by_phase, tile_smem_elems


# -- a thread-by-thread walk of the kernels' loops (kernels/flash_fwd.py, kernels/flash_bwd.py) --
def _walk_fwd_tile(bm, bn, d, tm, tn):
    """Shared loads and stores of one visited tile of the forward, thread by thread."""
    ntm, ntn = bm // tm, bn // tn
    dn = d // ntn
    loads = stores = 0
    stores += 2 * bn * d                       # K and V tiles
    for _t in range(ntm * ntn):
        for _kk in range(d):                   # S = Q K^T
            loads += tm + tn
        stores += tm * tn                      # P
        for _jj in range(bn):                  # O += P V
            loads += tm + dn
    return loads, stores


def _walk_dkdv_tile(bq, bk, d, tk, tq, atomic):
    ntk, ntq = bk // tk, bq // tq
    dn = d // ntq
    loads = stores = 0
    stores += 2 * bq * d + 2 * bq              # Q, dO tiles; lse, delta
    for _t in range(ntk * ntq):
        for _kk in range(d):                   # S^T, dP^T
            loads += 2 * tk + 2 * tq
        loads += 2 * tq                        # lse_s, delta_s per column
        stores += 2 * tk * tq                  # P^T, dS^T
        for _mm in range(bq):                  # dV, dK
            loads += 2 * tk + 2 * dn
    if atomic:
        for _e in range(bq * d):               # dQ += dS K, one output element per thread slot
            loads += 2 * bk
    return loads, stores


@settings(max_examples=40, deadline=None)
@given(bm=st.sampled_from([8, 16, 32, 64]), bn=st.sampled_from([8, 16, 32, 64]),
       d=st.sampled_from([16, 32, 64]), tm=st.sampled_from([1, 2, 4]), tn=st.sampled_from([1, 2, 4, 8]),
       atomic=st.booleans())
def test_tile_counts_equal_a_thread_walk_of_the_kernel_loops(bm, bn, d, tm, tn, atomic):
    if bm % tm or bn % tn or d % (bn // tn) or bn // tn > 32:
        return
    c = tile_smem_elems("fwd", bm, bn, d, (tm, tn))
    assert (c["tile_loads"], c["tile_stores"]) == _walk_fwd_tile(bm, bn, d, tm, tn)
    # the dK/dV kernel's tile is block_k x block_q: here bk = bm rows, bq = bn columns
    kv = tile_smem_elems("bwd.main", bn, bm, d, (tm, tn), dq_atomic=atomic)
    assert (kv["tile_loads"], kv["tile_stores"]) == _walk_dkdv_tile(bn, bm, d, tm, tn, atomic)


@settings(max_examples=25, deadline=None)
@given(Nq=st.integers(1, 200), Nk=st.integers(1, 200), causal=st.booleans(),
       blocks=st.sampled_from([(16, 16), (32, 16), (16, 32), (64, 32)]),
       pass_=st.sampled_from(["fwd", "bwd", "fwd+bwd"]), dq_mode=st.sampled_from(["atomic", "kernel"]))
def test_smem_bytes_sum_the_visited_tiles_of_blockinfo(Nq, Nk, causal, blocks, pass_, dq_mode):
    bq, bk = blocks
    d = 32
    w = sim.Workload(batch=2, heads=3, seq_len_q=Nq, seq_len_k=Nk, head_dim=d, dtype="fp32",
                     causal=causal, pass_=pass_)
    sched = sim.Schedule("flash2", bq, bk, micro_tile=(2, 2), micro_tile_kv=(2, 2), dq_mode=dq_mode)
    got = smem_bytes_by_phase(w, sched, bq, bk)
    bi = BlockInfo(Nq, Nk, bq, bk, causal)
    want = {}
    for ph, per in (("fwd", bi.n_blocks_q), ("bwd.main", bi.n_blocks_k), ("bwd.dq", bi.n_blocks_q)):
        c = tile_smem_elems(ph, bq, bk, d, (2, 2), dq_atomic=dq_mode == "atomic")
        ld = sum(c["tile_loads"] for _ in bi.tiles())
        stv = sum(c["tile_stores"] for _ in bi.tiles()) + per * c["program_stores"]
        want[ph] = {"smem_load_bytes": 6 * 4 * ld, "smem_store_bytes": 6 * 4 * stv}
    expect = {}
    if "fwd" in w.passes:
        expect["fwd"] = want["fwd"]
    if "bwd" in w.passes:
        expect["bwd.main"] = want["bwd.main"]
        if dq_mode == "kernel":
            expect["bwd.dq"] = want["bwd.dq"]
    assert got == expect


def test_loads_per_score_follow_the_micro_tile():
    # forward: d (1/tm + 1/tn) for S = Q K^T plus bk/tn + d/tm for O += P V, per score
    d, bq, bk = 64, 64, 32
    for tm, tn in ((4, 4), (2, 4), (8, 4), (4, 2)):
        c = tile_smem_elems("fwd", bq, bk, d, (tm, tn))
        assert c["tile_loads"] == bq * bk * (d / tm + d / tn + bk / tn + d / tm)
    # a 4x4 micro-tile loads less per score than 1x8 (the measured order of 64x32 and 16x64)
    per_score = lambda bq, bk, t: tile_smem_elems("fwd", bq, bk, d, t)["tile_loads"] / (bq * bk)  # noqa: E731
    assert per_score(64, 32, (4, 4)) < per_score(64, 16, (4, 2)) < per_score(32, 32, (2, 4)) < per_score(16, 64, (1, 8))


def test_smem_level_prices_the_micro_tile_and_binds_the_fp32_forward():
    w = sim.Workload(batch=2, heads=16, seq_len_q=4096, head_dim=64, dtype="fp32")
    plain = sim.predict(w, sim.Schedule("flash2", 64, 32, matmul_unit="cuda"), "h200", l2="none",
                        calibration=None)
    simt = sim.predict(w, sim.Schedule("flash2", 64, 32, matmul_unit="cuda", micro_tile=(4, 4)),
                       "h200", l2="none", calibration=None)
    assert plain.times_ms["smem"] == 0.0 and simt.times_ms["smem"] > 0
    assert simt.bound == "smem"
    prof = sim.load_profile("h200")
    b = simt.smem["smem_load_bytes"] + simt.smem["smem_store_bytes"]
    util = simt.phases["fwd"]["sm_utilisation"]
    assert simt.times_ms["smem"] == pytest.approx(b / prof.smem_bandwidth_bytes_per_s * 1e3 / util)
    assert prof.smem_bandwidth_bytes_per_s == 128 * 132 * 1.98e9


def test_profiles_cite_their_shared_memory_figures():
    for prof in sim.PROFILES.values():
        assert prof.smem_bytes_per_clk_per_sm == 128 and prof.sm_clock_hz > 1e9
        for f in ("smem_bytes_per_clk_per_sm", "sm_clock_hz"):
            assert prof.sources.get(f), (prof.name, f)
    with pytest.raises(ValueError, match="sm_clock_hz"):
        sim.GPUProfile(**dict(sim.load_profile("h100").to_dict(), sm_clock_hz=-1))


def test_schedule_rejects_bad_micro_tiles_and_delta_kernels():
    with pytest.raises(ValueError, match="micro_tile"):
        sim.Schedule("flash2", 64, 32, micro_tile=(0, 4))
    with pytest.raises(ValueError, match="micro_tile_kv"):
        sim.Schedule("flash1", 64, 32, micro_tile_kv=(2, 2))
    with pytest.raises(ValueError, match="delta_kernel"):
        sim.Schedule("flash2", delta_kernel="block")
    with pytest.raises(ValueError, match="must divide"):
        sim.predict(sim.Workload(seq_len_q=256, head_dim=64, dtype="fp32"),
                    sim.Schedule("flash2", 64, 32, micro_tile=(3, 4)), "h100", l2="none")


def test_kernel_launch_shape_is_the_kernels_tile_layout():
    # (the separate dQ kernel, "bwd.dq", is gone from kernels/: sim still models the records
    # that ran it, and nothing here compares its launch shape)
    from kernels.config import TileConfig, dkdv_smem_bytes, fwd_smem_bytes
    for bq, bk, d, t in ((64, 32, 64, (4, 4)), (32, 16, 128, (2, 2)), (16, 64, 64, (1, 8))):
        cfg = TileConfig(bq, bk, *t)
        assert kernel_launch_shape("fwd", bq, bk, d, t) == (cfg.threads, fwd_smem_bytes(cfg, d))
        kv = TileConfig(bk, bq, *t)
        if bq % t[1] == 0 and bk % t[0] == 0:
            assert kernel_launch_shape("bwd.main", bq, bk, d, t) == (kv.threads, dkdv_smem_bytes(kv, d))


# -- FLOPs: the terms the CUDA-core kernels execute ------------------------------------------------
def test_forward_bookkeeping_runs_once_per_thread_of_a_row():
    Nq = Nk = 256
    d, bq, bk = 64, 64, 32
    w = sim.Workload(seq_len_q=Nq, head_dim=d, dtype="fp32")
    C = sim.counts.flop_costs(sim.workload.EXP_FLOPS)
    other = {}
    for tn in (1, 4):
        s = sim.Schedule("flash2", bq, bk, micro_tile=(4, tn))
        other[tn] = summarise(*closed_form(w, s, bq, bk))["other_flops"]
    ntn = {1: bk, 4: bk // 4}
    st_ = tile_stats_closed(Nq, Nk, bq, bk, False)
    end = lambda n: n * (int(np.log2(n)) + C["simt_fwd_per_row_thread_end"])  # noqa: E731
    assert other[1] - other[4] == (st_.R * (ntn[1] - ntn[4]) * C["simt_fwd_per_row_thread_tile"]
                                   + Nq * (end(ntn[1]) - end(ntn[4])))
    # per score: s - m, exp, row-sum add (the scale is folded into Q, the max is not arithmetic)
    assert C["simt_fwd_per_score"] == 2 + sim.workload.EXP_FLOPS


def test_backward_simt_terms_and_delta_pre_pass():
    d, N = 64, 256
    for dtype, e in (("fp32", 4), ("fp16", 2)):
        w = sim.Workload(batch=2, heads=2, seq_len_q=N, head_dim=d, dtype=dtype, pass_="bwd")
        warp, wf = closed_form(w, sim.Schedule("flash2", 32, 32), 32, 32)
        thread, tf = closed_form(w, sim.Schedule("flash2", 32, 32, delta_kernel="thread"), 32, 32)
        # one thread per row: every element read is its own 32-byte sector
        assert thread[("bwd.pre", "O", "load")] == (32 // e) * warp[("bwd.pre", "O", "load")]
        assert thread[("bwd.pre", "dO", "load")] == 4 * N * d * 32
        simt, sf = closed_form(w, sim.Schedule("flash2", 32, 32, micro_tile=(2, 4), micro_tile_kv=(2, 4)), 32, 32)
        # the warp-per-row pre-pass reduces 32 lanes in 5 shuffle-add rounds; dK is scaled once
        assert sf["bwd.pre"][1] - wf["bwd.pre"][1] == 4 * N * 5 * 32
        assert sf["bwd.main"][1] - wf["bwd.main"][1] == 4 * N * d
    # DRAM: the repeated sector requests hit the lines the first one brought in
    w = sim.Workload(batch=1, heads=2, seq_len_q=128, head_dim=32, dtype="fp32", pass_="bwd")
    a = sim.predict(w, sim.Schedule("flash2", 32, 32), "h100", l2="trace", calibration=None)
    b = sim.predict(w, sim.Schedule("flash2", 32, 32, delta_kernel="thread"), "h100", l2="trace",
                    calibration=None)
    assert b.hbm_read_bytes > a.hbm_read_bytes and b.dram_read_bytes == a.dram_read_bytes


# -- records --------------------------------------------------------------------------------------
def test_records_carry_the_launch_micro_tiles_and_delta_kernel():
    from sim.tiles import choose_tiles
    base = {"kernel": "ioaware-numba", "variant": "simt", "pass": "fwd", "head_dim": 64,
            "block_q": 64, "block_k": 32}
    c = choose_tiles(64, 32, 64, 128)
    assert record_micro_tiles(base)[0] == (c.tm, c.tn) == (4, 4)
    assert record_micro_tiles(dict(base, micro_tile=[8, 4]))[0] == (8, 4)      # pinned by measure
    bwd = dict(base, **{"pass": "bwd", "block_q": 16, "block_k": 32})
    fwd_t, kv_t = record_micro_tiles(bwd)
    assert fwd_t == (choose_tiles(16, 32, 64, 128).tm, choose_tiles(16, 32, 64, 128).tn)
    assert kv_t == (choose_tiles(32, 16, 64, 128).tm, choose_tiles(32, 16, 64, 128).tn)
    assert record_micro_tiles(dict(base, variant="mma")) == (None, None)
    names = lambda *n: [{"name": x} for x in n]  # noqa: E731
    assert record_delta_kernel({"ncu_kernels": names("make_delta_kernel::flash_bwd_delta[v6]")}) == "thread"
    assert record_delta_kernel({"ncu_kernels": names("make_delta_kernel_v2::flash_bwd_delta_v2[v1]")}) == "warp"
    assert record_delta_kernel({}) is None
    s = sim.schedule_for_record(dict(bwd, ncu_kernels=names("make_delta_kernel::flash_bwd_delta[v6]")))
    assert s.delta_kernel == "thread" and s.micro_tile_kv == kv_t


def test_simt_flops_are_compared_without_half_instructions():
    from sim import compare as C
    rec = {"kernel": "ioaware-numba", "variant": "simt", "flops_executed": 110,
           "ncu_smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 40,
           "ncu_smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 5,
           "ncu_smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": 5,
           "ncu_smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": 10}
    assert C._measured(rec, "flops") == 90.0
    assert C._measured(dict(rec, kernel="sdpa-math", variant=None), "flops") == 110.0


def test_half_outputs_are_stored_in_whole_sectors_without_more_dram():
    from sim.counts import store_sector_amplification
    # 8 threads per row: float32 writes 32 bytes per row per warp store, float16 16 (a half sector)
    assert store_sector_amplification(8, 4) == 1 and store_sector_amplification(8, 2) == 2
    assert store_sector_amplification(4, 2) == 4 and store_sector_amplification(32, 2) == 1
    w = sim.Workload(batch=1, heads=2, seq_len_q=128, head_dim=64, dtype="fp16")
    plain = sim.Schedule("flash2", 64, 32)
    simt = sim.Schedule("flash2", 64, 32, micro_tile=(4, 4))      # 8 threads per row
    a, _ = closed_form(w, plain, 64, 32)
    b, _ = closed_form(w, simt, 64, 32)
    assert b[("fwd", "O", "store")] == 2 * a[("fwd", "O", "store")]
    pa = sim.predict(w, plain, "h100", l2="trace", calibration=None)
    pb = sim.predict(w, simt, "h100", l2="trace", calibration=None)
    assert pb.hbm_write_bytes > pa.hbm_write_bytes and pb.dram_write_bytes == pa.dram_write_bytes
    tr = sim.trace(w, simt, block_q=64, block_k=32)
    o = [ev for ev in tr if ev.tensor == "O"]
    assert all(ev.bytes == 2 * (ev.row_stop - ev.row_start) * 64 * 2 for ev in o)


def test_tensor_core_forward_records_price_exp_as_ex2():
    from sim import compare as C
    rec = {"kernel": "ioaware-numba", "variant": "mma", "schedule": "flash2", "pass": "fwd",
           "dtype": "fp16", "batch": 1, "heads": 2, "heads_kv": 2, "seq_len_q": 256, "seq_len_k": 256,
           "head_dim": 64, "causal": False, "block_q": 128, "block_k": 32}
    assert C.model_for_record(rec)[1].exp_flops == 0 == sim.schedule_for_record(rec).exp_flops
    # Q and O in fragments: 16 bytes of a row per warp access, a 32-byte sector each
    s = C.model_for_record(rec)[1]
    assert s.qo_segment_bytes == 16 == sim.schedule_for_record(rec).qo_segment_bytes
    w = sim.Workload.from_record(rec)
    frag, _ = closed_form(w, s, 128, 32)
    rows, _ = closed_form(w, sim.Schedule("flash2", 128, 32), 128, 32)
    assert frag[("fwd", "Q", "load")] == 2 * rows[("fwd", "Q", "load")]
    assert frag[("fwd", "O", "store")] == 2 * rows[("fwd", "O", "store")]
    assert frag[("fwd", "K", "load")] == rows[("fwd", "K", "load")]
    assert C.model_for_record(dict(rec, variant="simt", dtype="fp32"))[1].exp_flops == sim.workload.EXP_FLOPS
