"""sim: the closed form and the event trace agree exactly; tile statistics agree with BlockInfo
(causal, sliding windows, block masks, key padding)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import sim
from ioaware.block_info import BlockInfo, cdiv
from sim.counts import closed_form, summarise, tile_stats_arrays, tile_stats_blockinfo, tile_stats_closed


window_sides = st.one_of(st.just(-1), st.integers(0, 8), st.integers(0, 400))


@given(Nq=st.integers(1, 300), Nk=st.integers(1, 300), bq=st.integers(1, 80), bk=st.integers(1, 80),
       causal=st.booleans(), window=st.one_of(st.none(), st.tuples(window_sides, window_sides)))
def test_closed_tile_stats_equal_blockinfo(Nq, Nk, bq, bk, causal, window):
    if window is not None and Nq != Nk:
        causal = False                 # Workload.causal is top-left: refused with a window there
    closed = tile_stats_closed(Nq, Nk, bq, bk, causal, window).as_tuple()
    walked = tile_stats_blockinfo(BlockInfo(Nq, Nk, bq, bk, causal, window_size=window)).as_tuple()
    assert closed == walked


@st.composite
def workloads(draw):
    hkv = draw(st.sampled_from([1, 2]))
    heads = hkv * draw(st.sampled_from([1, 2]))
    batch = draw(st.integers(1, 2))
    Nq = draw(st.integers(1, 90))
    Nk = draw(st.one_of(st.just(Nq), st.integers(1, 90)))
    bq = draw(st.sampled_from([1, 7, 16, 32, 33]))
    bk = draw(st.sampled_from([1, 5, 16, 32, 40]))
    mask_kind = draw(st.sampled_from(["none", "density", "explicit", "key_padding"]))
    kw = {}
    if mask_kind == "density":
        kw = dict(block_density=draw(st.floats(0.05, 1.0)), block_mask_seed=draw(st.integers(0, 5)))
    elif mask_kind == "explicit":
        shape = (draw(st.sampled_from([1, batch])), draw(st.sampled_from([1, heads])), cdiv(Nq, bq), cdiv(Nk, bk))
        seed = draw(st.integers(0, 1000))
        kw = dict(block_mask=np.random.default_rng(seed).random(shape) < 0.5)
    elif mask_kind == "key_padding":
        kw = dict(key_lengths=tuple(draw(st.integers(0, Nk)) for _ in range(batch)))
    causal = draw(st.booleans())
    if draw(st.booleans()):
        kw["window_size"] = (draw(window_sides), draw(window_sides))
        causal = causal and Nq == Nk
    w = sim.Workload(batch=batch, heads=heads, heads_kv=hkv, seq_len_q=Nq, seq_len_k=Nk,
                     head_dim=draw(st.sampled_from([8, 16, 24])), dtype=draw(st.sampled_from(["fp16", "fp32"])),
                     causal=causal, dropout=draw(st.booleans()),
                     pass_=draw(st.sampled_from(["fwd", "bwd", "fwd+bwd"])), **kw)
    return w, bq, bk


@pytest.mark.parametrize("name", ["flash1", "flash2", "flash2-simt", "naive"])
@settings(max_examples=30)
@given(case=workloads(), fused=st.booleans(), exp_flops=st.sampled_from([1, 5, 10]),
       dq_mode=st.sampled_from(["atomic", "kernel"]), delta=st.sampled_from(["warp", "thread"]),
       tile=st.sampled_from([(1, 1), (2, 4), (4, 1)]))
def test_closed_form_equals_trace(name, case, fused, exp_flops, dq_mode, delta, tile):
    w, bq, bk = case
    kw = {}
    if name == "flash2-simt":     # our CUDA-core kernels' FLOP terms (a micro-tile given)
        name, kw = "flash2", dict(micro_tile=tile, micro_tile_kv=tile[::-1])
    if name == "flash2":
        kw["delta_kernel"] = delta
        kw["qo_segment_bytes"] = 16 if exp_flops == 5 else None
    sched = sim.Schedule(name, None if name == "naive" else bq, None if name == "naive" else bk,
                         fused_softmax=fused, exp_flops=exp_flops, dq_mode=dq_mode, **kw)
    tr = sim.trace(w, sched, block_q=bq, block_k=bk)
    cf_bytes, cf_flops = closed_form(w, sched, None if name == "naive" else bq, None if name == "naive" else bk)
    tr_bytes, tr_flops = tr.totals()
    assert {k: v for k, v in cf_bytes.items() if v} == {k: v for k, v in tr_bytes.items() if v}
    assert {k: v for k, v in cf_flops.items() if any(v)} == {k: v for k, v in tr_flops.items() if any(v)}


def test_trace_skips_exactly_the_blocks_blockinfo_skips():
    w = sim.Workload(batch=1, heads=1, seq_len_q=200, seq_len_k=170, head_dim=16, causal=True,
                     block_density=0.4, block_mask_seed=3)
    tr = sim.trace(w, sim.Schedule("flash2", 32, 48))
    loaded = {(ev.m, ev.n) for ev in tr if ev.op == "compute" and ev.n >= 0}
    (_mult, bi, _kl, _members), = sim.workload.block_infos(w, 32, 48)
    assert loaded == set(bi.tiles())
    k_loads = [ev for ev in tr if ev.tensor == "K"]
    assert len(k_loads) == bi.n_tiles
    assert all(ev.row_stop - ev.row_start == bi.k_range(ev.n)[1] - bi.k_range(ev.n)[0] for ev in k_loads)


@pytest.mark.parametrize("window, causal", [((20, 0), True), ((0, 30), False), ((45, 45), False)])
def test_trace_and_counts_visit_only_the_windows_tiles(window, causal):
    """The trace loads exactly the K/V tiles BlockInfo visits under a window, and the closed form
    and the trace agree on them (FLOP for FLOP, byte for byte)."""
    w = sim.Workload(batch=1, heads=2, seq_len_q=200, seq_len_k=200, head_dim=16, causal=causal,
                     window_size=window, pass_="fwd+bwd")
    sched = sim.Schedule("flash2", 32, 16)
    tr = sim.trace(w, sched)
    (_mult, bi, _kl, _members), = sim.workload.block_infos(w, 32, 16)
    assert bi.window_size == window and bi.n_tiles < bi.n_blocks_q * bi.n_blocks_k
    fwd = {(ev.m, ev.n) for ev in tr if ev.op == "compute" and ev.phase == "fwd" and ev.n >= 0}
    assert fwd == set(bi.tiles())
    assert sum(1 for ev in tr if ev.tensor == "K" and ev.phase == "fwd") == 2 * bi.n_tiles
    cf_bytes, cf_flops = closed_form(w, sched, 32, 16)
    tr_bytes, tr_flops = tr.totals()
    assert {k: v for k, v in cf_bytes.items() if v} == {k: v for k, v in tr_bytes.items() if v}
    assert cf_flops == tr_flops


def test_a_4096_key_window_at_32k_costs_its_band():
    """N = 32768, d = 64, fp16, 128 x 128 tiles, causal, window (4095, 0) (4096 keys per query,
    itself included), against causal alone. Counted by hand: 256 Q and K blocks; causal, Q block
    m visits K blocks 0..m: T_causal = 256 * 257 / 2 = 32896 tiles; the window's first column
    128 m - 4095 lies in K block m - 32, so Q block m visits min(m, 32) + 1 blocks:
    T_window = (1 + ... + 32) + 224 * 33 = 7920. Every tile is full, so the matmul FLOPs
    (forward 4 d, backward 10 d per score) are in the exact ratio 7920 / 32896 = 0.2408; the
    forward reads Q once and K, V once per visited tile, and writes O and lse once, so its
    global bytes are 2 N d e + 4 N + 2 T 128 d e. The band holds ~N W pairs against the causal
    triangle's N^2 / 2: about 2 W / N = 0.25 of causal (W / N = 0.125 of full attention)."""
    N, d, e = 32768, 64, 2
    t_causal, t_window = 256 * 257 // 2, sum(range(1, 33)) + 224 * 33
    assert (t_causal, t_window) == (32896, 7920)
    sched = sim.Schedule("flash2", 128, 128)
    for pass_ in ("fwd", "fwd+bwd"):
        causal, window = (sim.predict(sim.Workload(seq_len_q=N, heads=1, head_dim=d, causal=True, pass_=pass_,
                                                   window_size=ws), sched, "h100", l2="none")
                          for ws in (None, (4095, 0)))
        assert window.matmul_flops * t_causal == causal.matmul_flops * t_window
        assert window.matmul_flops == (4 + (10 if pass_ == "fwd+bwd" else 0)) * d * t_window * 128 * 128
        assert abs(window.flops / causal.flops - t_window / t_causal) < 1e-3   # other FLOPs follow the tiles
    fwd = {ws: sim.predict(sim.Workload(seq_len_q=N, heads=1, head_dim=d, causal=True, window_size=ws), sched,
                           "h100", l2="none") for ws in (None, (4095, 0))}
    for ws, tiles in ((None, t_causal), ((4095, 0), t_window)):
        assert fwd[ws].hbm_read_bytes == N * d * e + 2 * tiles * 128 * d * e
        assert fwd[ws].hbm_write_bytes == N * d * e + 4 * N
    ratio = ((fwd[(4095, 0)].hbm_read_bytes + fwd[(4095, 0)].hbm_write_bytes)
             / (fwd[None].hbm_read_bytes + fwd[None].hbm_write_bytes))
    assert ratio == pytest.approx((2 * N * d * e + 4 * N + 2 * t_window * 128 * d * e)
                                  / (2 * N * d * e + 4 * N + 2 * t_causal * 128 * d * e))
    assert 0.24 < ratio < 0.25                # = 0.2467: Q, O and lse do not shrink with the window


def test_windowed_workloads_are_checked():
    with pytest.raises(ValueError, match=r"Workload.window_size=\(5, 0\) with causal=True and seq_len_q=10 "
                                         r"!= seq_len_k=20 would mix two alignments"):
        sim.Workload(seq_len_q=10, seq_len_k=20, causal=True, window_size=(5, 0))
    with pytest.raises(ValueError, match="Workload.window_size must be a pair"):
        sim.Workload(window_size=(-4, 0))
    assert sim.Workload(window_size=(-1, -1)).window_size is None
    w = sim.Workload(seq_len_q=64, window_size=[3, 0])
    assert w.window_size == (3, 0) and w.masked and w.to_dict()["window_size"] == [3, 0]
    assert sim.Workload.from_record({**w.to_dict(), "pass": "fwd"}).window_size == (3, 0)
    with pytest.raises(ValueError, match="sliding window"):
        sim.predict(w, sim.Schedule("naive", variant="math"), "h100")


def test_naive_reads_the_window_as_a_mask_and_computes_every_score():
    dense, windowed = (sim.predict(sim.Workload(seq_len_q=256, head_dim=32, window_size=ws), sim.Schedule("naive"),
                                   "h100", l2="none") for ws in (None, (8, 8)))
    assert windowed.matmul_flops == dense.matmul_flops
    assert windowed.hbm_read_bytes - dense.hbm_read_bytes == 256 * 256      # the 1-byte mask, read once


def test_trace_events_are_well_formed():
    w = sim.Workload(batch=2, heads=2, seq_len_q=70, head_dim=16, pass_="fwd+bwd")
    tr = sim.trace(w, sim.Schedule("flash2", 32, 32))
    ev = tr[0]
    assert (ev.phase, ev.op, ev.tensor, ev.level, ev.m, ev.step) == ("fwd", "load", "Q", "hbm", 0, 0)
    assert ev.bytes == 32 * 16 * 2
    last = tr[-1]
    assert last.phase == "bwd.post" and last.tensor == "dQ" and last.op == "store"
    recs = tr.to_records(0, 5)
    assert len(recs) == 5 and recs[0]["tensor"] == "Q"
    # programs of one phase do not overlap in address ranges of their stores (each writes its own rows)
    stores = [(e.addr, e.addr + e.bytes) for e in tr if e.phase == "fwd" and e.op == "store" and e.tensor == "O"]
    stores.sort()
    assert all(a1 <= b0 for (_a0, a1), (b0, _b1) in zip(stores, stores[1:]))


@settings(max_examples=15)
@given(N=st.lists(st.integers(1, 400), min_size=1, max_size=3), d=st.lists(st.sampled_from([16, 64, 96]), min_size=1, max_size=2),
       bq=st.lists(st.sampled_from([16, 33, 64]), min_size=1, max_size=2), bk=st.lists(st.sampled_from([16, 40, 128]), min_size=1, max_size=2),
       causal=st.booleans(), name=st.sampled_from(["flash1", "flash2", "naive"]), pass_=st.sampled_from(["fwd", "bwd", "fwd+bwd"]),
       hkv=st.sampled_from([None, 2]))
def test_vectorised_sweep_equals_closed_form(N, d, bq, bk, causal, name, pass_, hkv):
    cols = sim.sweep(schedule=name, seq_len=N, head_dim=d, block_q=bq, block_k=bk, batch=[2], heads=[4],
                     heads_kv=[hkv] if hkv else None, causal=causal, pass_=pass_, profile="h100")
    for i in range(len(cols["flops"])):
        w = sim.Workload(batch=2, heads=4, heads_kv=hkv, seq_len_q=int(cols["seq_len_q"][i]),
                         head_dim=int(cols["head_dim"][i]), causal=causal, pass_=pass_)
        s = summarise(*closed_form(w, sim.Schedule(name), int(cols["block_q"][i]) or None, int(cols["block_k"][i]) or None))
        assert int(cols["hbm_read_bytes"][i]) == s["hbm_read_bytes"]
        assert int(cols["hbm_write_bytes"][i]) == s["hbm_write_bytes"]
        assert int(cols["flops"][i]) == s["matmul_flops"] + s["other_flops"]


def test_tile_stats_arrays_match_scalar():
    st_ = tile_stats_arrays(np.array([100, 257]), np.array([100, 300]), np.array([16, 64]), np.array([32, 7]), True)
    assert (int(st_.A[1]), int(st_.T[0])) == (tile_stats_closed(257, 300, 64, 7, True).A, tile_stats_closed(100, 100, 16, 32, True).T)


def test_predict_counts_are_the_closed_form():
    w = sim.Workload(batch=2, heads=4, seq_len_q=300, head_dim=32, causal=True, pass_="fwd+bwd")
    p = sim.predict(w, sim.Schedule("flash2", 64, 64), "a100-40gb", l2="none")
    s = summarise(*closed_form(w, sim.Schedule("flash2"), 64, 64))
    assert (p.hbm_read_bytes, p.hbm_write_bytes, p.matmul_flops) == (s["hbm_read_bytes"], s["hbm_write_bytes"], s["matmul_flops"])
    assert p.flops == s["matmul_flops"] + s["other_flops"]


@pytest.mark.parametrize("name,pass_", [("flash2", "fwd"), ("flash2", "bwd"), ("flash1", "fwd"),
                                        ("flash1", "bwd"), ("naive", "fwd"), ("naive", "bwd")])
def test_exp_is_priced_at_exp_flops_once_per_exp(name, pass_):
    # dense, no dropout: one exp per score in every forward and tiled backward (P recomputed;
    # the naive backward reads the stored P), plus the tiled forward's per-row per-tile
    # alpha = exp(m_old - m_new) (FlashAttention-1: two of them)
    Nq, Nk, d, bq, bk = 200, 168, 32, 32, 48
    w = sim.Workload(batch=1, heads=2, seq_len_q=Nq, seq_len_k=Nk, head_dim=d, pass_=pass_)
    blocks = (None, None) if name == "naive" else (bq, bk)
    other = {x: summarise(*closed_form(w, sim.Schedule(name, exp_flops=x), *blocks))["other_flops"]
             for x in (1, 5)}
    n_exp = 0 if (name, pass_) == ("naive", "bwd") else Nq * Nk
    if name != "naive" and pass_ == "fwd":
        n_exp += Nq * cdiv(Nk, bk) * (2 if name == "flash1" else 1)
    assert other[5] - other[1] == 2 * 4 * n_exp
    # libdevice expf: 4 FFMA + FADD + FMUL (sim.workload.EXP_FLOPS)
    assert sim.Schedule().exp_flops == sim.workload.EXP_FLOPS == 2 * 4 + 1 + 1


def test_flash2_forward_output_rescale_once_per_visited_tile_per_row():
    # acc *= alpha: d FLOPs per row per visited K tile, so other FLOPs grow as d / block_k
    Nq = Nk = 256
    for d in (64, 128):
        w = sim.Workload(seq_len_q=Nq, head_dim=d, dtype="fp32")
        other = {bk: summarise(*closed_form(w, sim.Schedule("flash2"), 64, bk))["other_flops"]
                 for bk in (16, 64)}
        extra_rows_tiles = Nq * (Nk // 16 - Nk // 64)
        x = sim.workload.EXP_FLOPS
        assert other[16] - other[64] == extra_rows_tiles * (d + 3 + x)
        # causal: only visited tiles are rescaled
        wc = w.replace(causal=True)
        st_ = tile_stats_closed(Nq, Nk, 64, 16, True)
        base = summarise(*closed_form(wc, sim.Schedule("flash2", exp_flops=0), 64, 16))["other_flops"]
        assert base == 4 * st_.A + st_.Am + st_.R * (d + 3) + Nq * (d + 2)


def test_flash2_backward_dq_modes():
    Nq = Nk = 256
    d, bq, bk = 64, 64, 32
    for dtype, e in (("fp16", 2), ("fp32", 4)):
        w = sim.Workload(batch=2, heads=3, seq_len_q=Nq, head_dim=d, dtype=dtype, pass_="bwd")
        BH, A = 6, Nq * Nk
        at, at_f = closed_form(w, sim.Schedule("flash2", dq_mode="atomic"), bq, bk)
        kn, kn_f = closed_form(w, sim.Schedule("flash2", dq_mode="kernel"), bq, bk)
        # matmul FLOPs: 10 d per score (S, dP, dV, dK, dQ) vs 8 d + 6 d (S and dP recomputed)
        assert sum(v[0] for v in at_f.values()) == 10 * d * A * BH
        assert sum(v[0] for v in kn_f.values()) == 14 * d * A * BH
        assert kn_f["bwd.main"][0] == 8 * d * A * BH and kn_f["bwd.dq"][0] == 6 * d * A * BH
        # kernel: no atomics, no accumulator; the dQ kernel re-reads K and V once per Q tile
        assert not any(op == "atomic" for (_p, _t, op) in kn)
        assert kn[("bwd.dq", "K", "load")] == kn[("bwd.dq", "V", "load")] == BH * (Nq // bq) * Nk * d * e
        assert kn[("bwd.dq", "Q", "load")] == kn[("bwd.dq", "dQ", "store")] == BH * Nq * d * e
        assert ("bwd.pre", "dQacc", "store") not in kn
        # atomic: float32 accumulation; a post pass only for half inputs
        phases = {p for (p, _t, _o) in at}
        if dtype == "fp32":
            assert "bwd.post" not in phases and ("bwd.main", "dQ", "atomic") in at
            assert at[("bwd.pre", "dQ", "store")] == BH * Nq * d * 4
        else:
            assert at[("bwd.post", "dQ", "store")] == BH * Nq * d * 2
            assert at[("bwd.main", "dQacc", "atomic")] == BH * (Nk // bk) * Nq * d * 4
        p = sim.predict(w, sim.Schedule("flash2", bq, bk, dq_mode="kernel"), "h100", l2="none",
                        calibration=None)
        assert p.phases["bwd.dq"]["programs"] == BH * (Nq // bq)
    with pytest.raises(ValueError, match="dq_mode"):
        sim.Schedule(dq_mode="post")


def test_schedule_for_record_reads_dq_mode():
    from sim.model import record_dq_mode
    base = {"kernel": "ioaware-numba", "schedule": "flash2", "pass": "bwd", "block_q": 32, "block_k": 32}
    v1 = dict(base, ncu_kernels=[{"name": "make_delta_kernel::flash_bwd_delta[abi:v1]"},
                                 {"name": "make_dkdv_kernel::flash_bwd_dkdv[abi:v1]"},
                                 {"name": "make_dq_kernel::flash_bwd_dq[abi:v1]"}])
    v2 = dict(base, ncu_kernels=[{"name": "make_delta_kernel::flash_bwd_delta"},
                                 {"name": "void at::vectorized_elementwise_kernel<4, FillFunctor>"},
                                 {"name": "make_dkdv_kernel_v2::flash_bwd_dkdv_v2[abi:v2]"}])
    assert record_dq_mode(v1) == sim.schedule_for_record(v1).dq_mode == "kernel"
    assert record_dq_mode(v2) == sim.schedule_for_record(v2).dq_mode == "atomic"
    assert record_dq_mode(base) is None and sim.schedule_for_record(base).dq_mode == "atomic"
    assert sim.schedule_for_record(dict(v2, dq_mode="kernel")).dq_mode == "kernel"


@settings(max_examples=25)
@given(variant=st.sampled_from(["math", "eager"]), Nq=st.integers(1, 70), Nk=st.integers(1, 70),
       batch=st.integers(1, 2), heads=st.integers(1, 3), d=st.sampled_from([8, 64]),
       dtype=st.sampled_from(["fp16", "bf16", "fp32"]), causal=st.booleans(),
       pass_=st.sampled_from(["fwd", "bwd", "fwd+bwd"]), exp_flops=st.sampled_from([1, 5]))
def test_naive_variants_closed_form_equals_trace(variant, Nq, Nk, batch, heads, d, dtype, causal, pass_, exp_flops):
    w = sim.Workload(batch=batch, heads=heads, seq_len_q=Nq, seq_len_k=Nk, head_dim=d, dtype=dtype,
                     causal=causal, pass_=pass_)
    sched = sim.Schedule("naive", variant=variant, exp_flops=exp_flops)
    cf_bytes, cf_flops = closed_form(w, sched)
    tr_bytes, tr_flops = sim.trace(w, sched).totals()
    assert {k: v for k, v in cf_bytes.items() if v} == {k: v for k, v in tr_bytes.items() if v}
    assert {k: v for k, v in cf_flops.items() if any(v)} == {k: v for k, v in tr_flops.items() if any(v)}


def test_naive_variants_bytes_per_score_follow_the_kernel_lists():
    # per score at N = 1024, d = 64 (O(N d) terms add d-proportional bytes / N): the pass list
    # of docs/model.md — MATH fp32 forward: S w 4, softmax r 4 w 4, isneginf r 4 w 1,
    # all r 1, where r 4 w 4, P V r 4 = 30 per score plus the O(N d) q/k scaling and GEMM
    # operands (32 bytes per element of Q, K, V, O) and the row flag (w 1, r 1 per row)
    N, d, BH = 1024, 64, 2
    SS = BH * N * N

    def per_score(variant, dtype, causal, pass_):
        w = sim.Workload(batch=1, heads=BH, seq_len_q=N, head_dim=d, dtype=dtype, causal=causal, pass_=pass_)
        s = summarise(*closed_form(w, sim.Schedule("naive", variant=variant)))
        return s, (s["hbm_read_bytes"] + s["hbm_write_bytes"]) / SS

    s, b = per_score("math", "fp32", False, "fwd")
    assert b == pytest.approx(30 + 32 * d / N + 2 / N)
    assert s["matmul_flops"] == 2 * 2 * d * SS
    _, bc = per_score("math", "fp32", True, "fwd")
    assert bc - b == pytest.approx(12 + 6 / BH)   # S + mask r 8 w 4; masks built once: w 1, r 1 w 4
    _, bh = per_score("math", "fp16", False, "fwd")
    assert bh - b == pytest.approx(6 + 24 * d / N)  # P downcast r 4 w 2; Q K V up r 2 w 4, O down r 4 w 2
    _, be = per_score("eager", "fp32", False, "fwd")
    assert be == pytest.approx(24 + 4 * 4 * d / N)
    _, bec = per_score("eager", "fp32", True, "fwd")
    assert bec - be == pytest.approx(9)                  # masked_fill: r S 4 + mask 1, w S 4
    _, bb = per_score("math", "fp32", False, "bwd")
    assert bb == pytest.approx(40 + 12 * 4 * d / N)
    with pytest.raises(ValueError, match="variant"):
        sim.Schedule("flash2", variant="math")
    with pytest.raises(ValueError, match="dropout"):
        closed_form(sim.Workload(dropout=True), sim.Schedule("naive", variant="eager"))
