"""Tests of `kernels.tile_scheduler`: the launch order (the head group a `KernelConfig` asks for,
the device-side map from a block to its (tile, batch*head) for every head group, under Numba's
CUDA simulator on a CPU machine and for real on a GPU, and its host twin), the CSR schedules the
kernels read (one per slice of a block mask, at kernel tiles that refine the mask's), and the
measured launch orders against the cost model (`benchmarks.tune`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import cuda   # a global, which the CUDA simulator replaces inside kernels

from ioaware.block_info import BlockInfo, cdiv
from ioaware.launch_order import block_work
from ioaware.launch_order import DEFAULT_HEAD_GROUP
from kernels import tile_scheduler

DATA = Path(__file__).resolve().parent / "data"


def test_default_and_forced_head_groups():
    for (pas, causal), g in tile_scheduler.DEFAULT_HEAD_GROUP.items():
        assert tile_scheduler.head_group(None, causal, pas) == g
    for value, want in (("tiles", 1), ("heads", 0), ("4", 4), (4, 4), (0, 0), (np.int64(8), 8)):
        assert tile_scheduler.head_group(value, True, "bwd") == want
        assert tile_scheduler.head_group(value, False, "fwd") == want
    for bad in ("rows", "-1", -1, True, 1.5):
        with pytest.raises(ValueError, match="launch_order"):
            tile_scheduler.head_group(bad, True)


def _dispatch_order(n_tiles, n_bh, group):
    """order[bh, tile] = dispatch position of the block working on (tile, bh)."""
    order = np.full((n_bh, n_tiles), -1)
    for by in range(n_bh):
        for bx in range(n_tiles):
            t, bh = block_work(bx, by, n_tiles, n_bh, group)
            assert order[bh, t] == -1, "two blocks on one (tile, head)"
            order[bh, t] = bx + n_tiles * by
    return order


@settings(max_examples=60, deadline=None)
@given(n_tiles=st.integers(1, 9), n_bh=st.integers(1, 11), group=st.integers(0, 12))
def test_host_map_is_a_bijection_in_the_stated_order(n_tiles, n_bh, group):
    order = _dispatch_order(n_tiles, n_bh, group)
    assert sorted(order.ravel()) == list(range(n_tiles * n_bh))
    g = n_bh if group == 0 else group
    for bh in range(n_bh):
        for t in range(n_tiles):
            # within a head, tiles in order; a group's heads interleaved tile by tile; the
            # groups one after another
            if t + 1 < n_tiles:
                assert order[bh, t] < order[bh, t + 1]
            if bh + 1 < n_bh and bh // g == (bh + 1) // g:
                assert order[bh, t] + 1 == order[bh + 1, t] or g == 1
            if bh + 1 < n_bh and bh // g != (bh + 1) // g:
                assert order[bh, -1] < order[bh + 1, 0]
    if group == 1:
        assert (order == np.arange(n_bh)[:, None] * n_tiles + np.arange(n_tiles)).all()
    if group == 0:
        assert (order == np.arange(n_tiles)[None, :] * n_bh + np.arange(n_bh)[:, None]).all()


@pytest.mark.parametrize("group", [1, 0, 2, 3])
def test_device_map_matches_the_host_twin(group):
    n_tiles, n_bh = 5, 7
    tile_and_head = tile_scheduler.device_tile_and_head(group)

    @cuda.jit
    def record(seen, tiles_seen):
        tile, bh, n = tile_and_head()
        if cuda.threadIdx.x == 0:
            seen[bh, tile] = cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y + 1
            tiles_seen[bh, tile] = n

    seen = np.zeros((n_bh, n_tiles), np.int64)
    tiles_seen = np.zeros((n_bh, n_tiles), np.int64)
    record[(n_tiles, n_bh), 1](seen, tiles_seen)
    assert (seen - 1 == _dispatch_order(n_tiles, n_bh, group)).all()
    assert (tiles_seen == n_tiles).all()


@settings(max_examples=40, deadline=None)
@given(n_tiles=st.integers(1, 9), n_bh=st.integers(1, 11), group=st.integers(0, 12))
def test_dispatch_positions_invert_block_work(n_tiles, n_bh, group):
    from ioaware.launch_order import dispatch_positions
    assert (dispatch_positions(n_tiles, n_bh, group) == _dispatch_order(n_tiles, n_bh, group)).all()


# -- CSR schedules -------------------------------------------------------------------------------
def test_refined_block_mask_is_elementwise_the_same():
    rng = np.random.default_rng(4)
    n_q, n_k, bq, bk = 200, 333, 64, 96
    bm = rng.random((2, 3, -(-n_q // bq), -(-n_k // bk))) > 0.5
    fine = tile_scheduler.refine_block_mask(bm, bq, bk, n_q, n_k, 32, 16)
    assert fine.shape == (2, 3, -(-n_q // 32), -(-n_k // 16))
    coarse_el = np.repeat(np.repeat(bm, bq, 2), bk, 3)[:, :, :n_q, :n_k]
    fine_el = np.repeat(np.repeat(fine, 32, 2), 16, 3)[:, :, :n_q, :n_k]
    assert (coarse_el == fine_el).all()
    with pytest.raises(ValueError, match="divide"):
        tile_scheduler.refine_block_mask(bm, bq, bk, n_q, n_k, 48, 16)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("which", ["kv", "q"])
def test_csr_schedule_without_a_block_mask_is_block_infos(causal, which):
    offs, idx, sb, sh = tile_scheduler.csr_schedule(150, 333, 64, 32, causal, which)
    info = BlockInfo(150, 333, 64, 32, causal)
    want_offs, want_idx = info.kv_schedule() if which == "kv" else info.q_schedule()
    assert offs.dtype == np.int32 and idx.dtype == np.int32
    assert offs.shape == (1, len(want_offs)) and (sb, sh) == (0, 0)
    np.testing.assert_array_equal(offs[0], want_offs)
    np.testing.assert_array_equal(idx, want_idx)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("which", ["kv", "q"])
@pytest.mark.parametrize("mask_bh", [(1, 1), (2, 1), (1, 3), (2, 3)])
def test_csr_schedule_slices_of_a_block_mask(causal, which, mask_bh):
    """One CSR row block per (batch, head) slice of the block mask; slice ``b * stride_b +
    h * stride_h`` of every (b, h) of a [2, 3] problem (broadcast dimensions: stride 0) is
    `BlockInfo`'s schedule of that slice's mask refined to the kernel tiles."""
    rng = np.random.default_rng(sum(mask_bh) + 2 * causal)
    n_q, n_k, mask_tiles, tiles = 200, 333, (64, 96), (32, 48)
    bm = rng.random(mask_bh + (cdiv(n_q, 64), cdiv(n_k, 96))) > 0.4
    offs, idx, sb, sh = tile_scheduler.csr_schedule(n_q, n_k, *tiles, causal, which, bm,
                                                    mask_tiles)
    fine = tile_scheduler.refine_block_mask(bm, *mask_tiles, n_q, n_k, *tiles)
    assert offs.shape[0] == mask_bh[0] * mask_bh[1] and offs[0, 0] == 0
    assert offs.dtype == np.int32 and idx.dtype == np.int32
    for b in range(2):
        for h in range(3):
            s = b * sb + h * sh
            info = BlockInfo.with_block_mask(n_q, n_k, *tiles, causal,
                                             fine[b % mask_bh[0], h % mask_bh[1]])
            want_offs, want_idx = info.kv_schedule() if which == "kv" else info.q_schedule()
            np.testing.assert_array_equal(offs[s] - offs[s, 0], want_offs)
            np.testing.assert_array_equal(idx[offs[s, 0]:offs[s, -1]], want_idx)


def test_csr_schedule_of_an_empty_block_mask():
    offs, idx, _, _ = tile_scheduler.csr_schedule(100, 100, 32, 32, False, "kv",
                                                  np.zeros((1, 1, 2, 2), bool), (64, 64))
    assert (offs == 0).all() and len(idx) >= 1     # nothing to visit; a non-empty index array



@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 3])
def test_gqa_cursor_walks_every_head_of_the_group_and_its_q_tiles(causal, group):
    """The dK/dV kernels' sweep over (query head of the GQA group, Q tile) on one K/V tile, walked
    with `gqa_cursor`'s ``start`` and ``advance`` as they walk it, is every head of the group
    with Q tiles on that K/V tile, in order, each with the Q tiles of its ``"q"`` schedule;
    heads without any (a block mask that leaves a head empty on a K/V tile) are skipped."""
    rng = np.random.default_rng(group + 2 * causal)
    B, Hkv, n, tiles = 2, 2, 200, (32, 48)
    bm = rng.random((B, Hkv * group, cdiv(n, 64), cdiv(n, 96))) > 0.5
    bm[:, 0] = False                                 # head 0 (the first of KV group 0): no Q tiles
    offs, idx, sb, sh = tile_scheduler.csr_schedule(n, n, *tiles, causal, "q", bm, (64, 96))
    n_kv = cdiv(n, tiles[1])
    start, advance = tile_scheduler.gqa_cursor()
    most = Hkv * group * cdiv(n, tiles[0])

    @cuda.jit
    def walk(offsets, q_index, out_h, out_m, count):
        n_blk = cuda.blockIdx.x
        b = cuda.blockIdx.y // Hkv
        hk = cuda.blockIdx.y % Hkv
        n_items, g, lo, cnt = start(offsets, b, hk, group, sb, sh, n_blk)
        j = 0
        for t in range(n_items):
            if t > 0:
                g, lo, cnt, j = advance(g, lo, cnt, j, offsets, b, hk, group, sb, sh, n_blk)
            out_h[cuda.blockIdx.y, n_blk, t] = hk * group + g
            out_m[cuda.blockIdx.y, n_blk, t] = q_index[lo + j]
        count[cuda.blockIdx.y, n_blk] = n_items

    out_h = np.full((B * Hkv, n_kv, most), -1, np.int64)
    out_m = np.full((B * Hkv, n_kv, most), -1, np.int64)
    count = np.zeros((B * Hkv, n_kv), np.int64)
    walk[(n_kv, B * Hkv), 1](offs, idx, out_h, out_m, count)
    for b in range(B):
        for hk in range(Hkv):
            for n_blk in range(n_kv):
                want = [(h, int(m)) for h in range(hk * group, (hk + 1) * group)
                        for m in idx[offs[b * sb + h * sh, n_blk]:offs[b * sb + h * sh, n_blk + 1]]]
                got_n = count[b * Hkv + hk, n_blk]
                got = list(zip(out_h[b * Hkv + hk, n_blk, :got_n].tolist(),
                               out_m[b * Hkv + hk, n_blk, :got_n].tolist()))
                assert got == want, (b, hk, n_blk)
    assert count.sum() > 0


# -- the measured orders against the cost model (benchmarks.tune) ------------------------------
def test_show_ncu_prints_the_measured_profile(capsys):
    from benchmarks import tune
    # the run's ncu CSV, embedded in its JSON (`tune --embed-ncu`)
    tune.show_ncu(str(DATA / "ncu_order_fp32_128_causal_1024_h100_2026-11-23.json"))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 + 9
    rows = [ln.split() for ln in lines[1:]]
    assert [r[0] for r in rows] == ["tiles"] * 3 + ["heads"] * 3 + ["4"] * 3
    assert [r[1] for r in rows] == ["forward", "dQ", "dK/dV"] * 3
    hit = {(r[0], r[1]): float(r[4]) for r in rows}
    # heads first loses the backward's L2 sharing; groups of four keep it
    assert hit[("heads", "dK/dV")] < 70 < 80 < hit[("4", "dK/dV")]


def test_model_follows_the_launch_order_on_the_measured_profile():
    # the cost model's DRAM reads against ncu's, per launch order (trace replay at this size):
    # tiles first and heads first differ by 3x in the forward, and the model follows
    from benchmarks import tune
    profile = DATA / "ncu_order_fp32_128_causal_1024_h100_2026-11-23.json"
    rows = {(r["order"], r["kernel"]): r for r in tune.model_vs_ncu(str(profile))}
    assert len(rows) == 9 and all(r["l2_model"] == "trace" for r in rows.values())
    for order in ("tiles", "heads"):
        r = rows[(order, "forward")]
        assert abs(r["predicted_dram_read_bytes"] / r["measured_dram_read_bytes"] - 1) < 0.05
    assert (rows[("heads", "forward")]["predicted_dram_read_bytes"]
            > 3 * rows[("tiles", "forward")]["predicted_dram_read_bytes"])


# -- balancing the launch order (ioaware.launch_order.balanced_head_group) ----------------------
def _greedy_reference(lengths, group, slots):
    """An independent replay: programs in dispatch position order (`block_work`), each onto
    the slot that frees first."""
    n_bh, n_tiles = lengths.shape
    free = np.zeros(min(slots, lengths.size))
    for p in range(n_bh * n_tiles):
        tile, bh = block_work(p % n_tiles, p // n_tiles, n_tiles, n_bh, group)
        i = int(np.argmin(free))
        free[i] += lengths[bh, tile]
    return free.max()


@settings(max_examples=60, deadline=None)
@given(n_bh=st.integers(1, 9), n_tiles=st.integers(1, 9), group=st.integers(0, 5),
       slots=st.integers(1, 20), seed=st.integers(0, 2**16))
def test_dispatch_makespan_is_greedy_dispatch(n_bh, n_tiles, group, slots, seed):
    from ioaware.launch_order import dispatch_makespan
    lengths = np.random.default_rng(seed).integers(1, 50, size=(n_bh, n_tiles)).astype(float)
    got = dispatch_makespan(lengths, group, slots)
    assert got == _greedy_reference(lengths, group, slots)
    # Graham's bounds of greedy list scheduling
    assert max(lengths.max(), lengths.sum() / slots) <= got <= lengths.sum() / slots + lengths.max()


def _plan(n, b=4, h=16, hkv=4, causal=True, d=64, **config):
    from sim import Workload
    from sim.plans.wgmma_bwd import wgmma_backward_plan
    w = Workload(batch=b, heads=h, heads_kv=hkv, seq_len_q=n, head_dim=d, dtype="bf16",
                 pass_="bwd", causal=causal)
    dq, kv = wgmma_backward_plan(w, **config).kernels
    return dq, kv


def test_launch_group_takes_heads_first_where_the_default_leaves_sms_idle():
    from ioaware.launch_order import dispatch_makespan
    from sim.plan import dispatch_utilisation, launch_group
    # the Llama-shaped causal backward's dK/dV kernel (B 4, Hq 16 / Hkv 4, N 2048, 128 key
    # rows a program, 128 queries a stage; one program an SM on 132 SMs): 256 programs whose
    # work falls from 4 x 16 Q tiles to 4 x 1. Groups of four end 1.4x later than heads first
    # (measured on an H200, docs/kernels.md: 0.263 against 0.198 ms)
    dq, kv = _plan(2048)
    assert kv.tile_work == tuple(4 * (16 - t) for t in range(16))
    assert kv.grid == (16, 16) and kv.default_head_group == 4 and kv.head_group is None
    lengths = np.broadcast_to(kv.tile_work, (16, 16))
    assert dispatch_makespan(lengths, 4, 132) > 1.4 * dispatch_makespan(lengths, 0, 132)
    assert launch_group(kv, 132) == 0
    assert dispatch_utilisation(kv, 132) > 0.95
    # the dQ kernel's 2048 programs (longest first, three resident an SM): no change (measured:
    # 0.154 ms in both orders)
    assert dq.tile_work == tuple(range(32, 0, -1))
    assert launch_group(dq, 132) == 4 and dispatch_utilisation(dq, 132) == 1.0
    # pinned orders are kept, and priced as they run
    _dq, kv4 = _plan(2048, launch_order=4)
    assert launch_group(kv4, 132) == 4 and dispatch_utilisation(kv4, 132) < 0.75
    assert launch_group(_plan(2048, launch_order="tiles")[1], 132) == 1
    # without a mask every program has the same work: the default
    _dq, full = _plan(2048, causal=False)
    assert launch_group(full, 132) == DEFAULT_HEAD_GROUP[("bwd", False)] == 1
    # many heads (B 8, H 32, no GQA): 4096 programs, groups of four end within 3 % of heads
    # first, and keep their L2 sharing (heads first measured 10 % slower there)
    _dq, many = _plan(2048, b=8, h=32, hkv=32)
    assert launch_group(many, 132) == 4


def test_the_model_prices_the_order_that_runs():
    from sim import Workload
    from sim.plan import price
    from sim.plans.wgmma_bwd import wgmma_backward_plan
    w = Workload(batch=4, heads=16, heads_kv=4, seq_len_q=2048, head_dim=64, dtype="bf16",
                 pass_="bwd", causal=True)
    t = {lo: [k.time_s for k in price(wgmma_backward_plan(w, launch_order=lo), "h200").kernels]
         for lo in (None, 4)}
    assert t[None][0] == t[4][0]                       # the dQ kernel: groups of four either way
    assert 1.3 < t[4][1] / t[None][1] < 1.5            # the dK/dV kernel's tail


def test_the_orders_command_times_the_gqa_case_the_backward_balances():
    """``tune --orders`` has the Llama shape's GQA cases, whose dK/dV kernel the Hopper backward
    turns to heads first, so the order it launches is timed against the fixed ones."""
    from benchmarks import tune
    gqa = [c for c in tune.ORDER_CASES if len(c) == 5]
    assert gqa and all(c[4] == tune.LLAMA_SHAPE for c in gqa)
    assert any(len(c) == 5 for c in tune.QUICK_ORDER_CASES)
    from sim.plan import launch_group
    for _dt, d, causal, n, shape in gqa:
        _dq, kv = _plan(n, shape["batch"], shape["heads"], shape["heads_kv"], causal, d)
        assert launch_group(kv, 132) == 0 != DEFAULT_HEAD_GROUP[("bwd", causal)]
