"""sim.plans.sdpa: PyTorch's SDPA backends (FLASH, EFFICIENT, CUDNN) as the plans of the kernels
they launch on sm_90: the cited tiles, the bytes against closed forms, the backward's kernels
and atomics, the records `sim.plans.plans_for_record` prices, and refusals (CPU only)."""
from __future__ import annotations

import pytest

import sim
from sim.counts import tile_stats_closed
from sim.plan import price
from sim.plans import PLANNERS, plan_for, plans_for_record
from sim.plans.flash3 import flash3_forward_plan
from sim.plans.sdpa import (efficient_backward_kernel, efficient_forward_tiles, efficient_num_splits_key,
                            flash_backward_tiles, flash_forward_tiles, flash_num_splits)

H100 = {"gpu": "NVIDIA H100 80GB HBM3"}


def _bytes(kernel):
    out = {}
    for a in kernel.accesses:
        out[(a.tensor, a.op)] = out.get((a.tensor, a.op), 0) + a.bytes
    return out


def _record(kernel, pass_="fwd", dtype="fp16", head_dim=64, seq_len=1024, causal=False, **prov):
    return {"kernel": kernel, "pass": pass_, "dtype": dtype, "batch": 2, "heads": 8, "heads_kv": 8,
            "seq_len_q": seq_len, "seq_len_k": seq_len, "head_dim": head_dim, "causal": causal,
            "block_q": None, "block_k": None, "time_ms": 1.0, "provenance": prov or H100}


def test_tiles_per_head_dim_are_the_cited_constants():
    """FlashAttention-2's launch templates (sm_90, no dropout) and the first CUTLASS kernels of
    the sm80 dispatch lists that hold the head dim."""
    assert flash_forward_tiles(64) == (128, 128, 4) and flash_forward_tiles(128) == (128, 64, 4)
    assert flash_backward_tiles(64) == (128, 128, 8, 4, 4, 4)
    assert flash_backward_tiles(128) == (64, 128, 8, 2, 4, 2)
    assert efficient_forward_tiles(64) == (64, 64) and efficient_forward_tiles(128) == (64, 128)
    for dtype, d, tiles, name in (("fp16", 64, (64, 64), "fmha_cutlassB_f16_aligned_64x64_k64_seqaligned_sm80"),
                                  ("bf16", 128, (128, 128), "fmha_cutlassB_bf16_aligned_128x128_k128_seqaligned_sm80"),
                                  ("fp32", 64, (64, 64), "fmha_cutlassB_f32_aligned_64x64_k64_sm80"),
                                  ("fp32", 128, (128, 64), "fmha_cutlassB_f32_aligned_128x64_k128_sm80")):
        k = efficient_backward_kernel(sim.Workload(batch=1, heads=1, seq_len_q=1024, head_dim=d, dtype=dtype))
        assert (k["block_i"], k["block_j"]) == tiles and k["name"] == name
    # a length that is not a multiple of the tiles takes the kernel without "seqaligned"
    k = efficient_backward_kernel(sim.Workload(batch=1, heads=1, seq_len_q=1000, head_dim=64))
    assert k["name"] == "fmha_cutlassB_f16_aligned_64x64_k64_sm80"
    for d, (bq, bk, warps) in ((64, (128, 128, 4)), (128, (128, 64, 4))):
        w = sim.Workload(batch=2, heads=8, seq_len_q=1024, head_dim=d)
        (k,) = plan_for("sdpa-flash", "fwd", w).kernels
        assert k.threads == 32 * warps and k.shared_bytes == (bq + 2 * bk) * d * 2
        assert k.grid == (1024 // bq, 2, 8)
        main = plan_for("sdpa-flash", "bwd", w).kernel("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel")
        assert main.threads == 256 and main.shared_bytes == 144 * 1024      # kSmemSize1colblock
    (k,) = plan_for("sdpa-efficient", "fwd", sim.Workload(batch=3, heads=2, seq_len_q=1024, head_dim=128)).kernels
    assert k.name == "fmha_cutlassF_f16_aligned_64x128_rf_sm80" and k.threads == 256 and k.grid == (16, 2, 3)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
def test_flash_forward_bytes_equal_the_closed_form_dense(dtype, d):
    """Dense, lengths a multiple of the tiles: Q, O and lse once per row, K and V once per Q tile
    (B H Nq / 64 >= 0.8 x 2 x 132: no split-KV)."""
    B, H, N = 2, 8, 1024
    w = sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=d, dtype=dtype)
    plan = plan_for("sdpa-flash", "fwd", w)
    bq, bk = plan.config["block_q"], plan.config["block_k"]
    (k,) = plan.kernels
    io = B * H * N * d * 2
    assert _bytes(k) == {("Q", "load"): io, ("K", "load"): io * (N // bq), ("V", "load"): io * (N // bq),
                         ("O", "store"): io, ("lse", "store"): B * H * N * 4}
    assert {a.tensor: a.how for a in k.accesses}["K"] == "cp.async"
    assert k.matmuls[0].flops == 4 * B * H * N * N * d and k.matmuls[0].unit == f"mma.{'bf16' if dtype == 'bf16' else 'f16'}"
    assert k.mufu_ops >= B * H * N * N                                  # an ex2 per score at least
    causal = plan_for("sdpa-flash", "fwd", sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=d, causal=True))
    st = tile_stats_closed(N, N, bq, bk, True)
    assert _bytes(causal.kernels[0])[("K", "load")] == B * H * st.C * d * 2 < io * (N // bq)


def test_efficient_forward_reads_q_per_key_tile_and_writes_lse_only_for_autograd():
    """EFFICIENT builds its Q K^T product inside the key loop: Q once per visited tile, K and V
    once per visited tile, O once per row; the logsumexp (rows padded to 32) only with
    ``logsumexp=True``; float32 runs 3xTF32."""
    B, H, N, d = 2, 2, 1000, 64
    w = sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=d)
    bq, bk = efficient_forward_tiles(d)
    st = tile_stats_closed(N, N, bq, bk, False)
    (k,) = plan_for("sdpa-efficient", "fwd", w).kernels
    assert _bytes(k) == {("Q", "load"): B * H * st.R * d * 2, ("K", "load"): B * H * st.C * d * 2,
                         ("V", "load"): B * H * st.C * d * 2, ("O", "store"): B * H * N * d * 2}
    assert st.R == N * st.nk and st.C == N * st.nq                     # dense: Q per K tile, K/V per Q tile
    (k,) = plan_for("sdpa-efficient", "fwd", w, logsumexp=True).kernels
    assert _bytes(k)[("lse", "store")] == B * H * 1024 * 4
    (k,) = plan_for("sdpa-efficient", "fwd", sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=d, dtype="fp32")).kernels
    assert (k.matmuls[0].unit, k.matmuls[0].passes) == ("mma.tf32", 3)


@pytest.mark.parametrize("d", [64, 128])
def test_flash_backward_launches_its_three_kernels_in_order_with_the_atomics(d):
    """After PyTorch's two contiguous() copies: the delta pre-pass, which zeroes dq_accum, the
    dK/dV kernel, which adds dQ into it by float32 atomics on whole tiles, and the conversion."""
    B, H, N = 2, 3, 1024
    w = sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=d, pass_="bwd")
    plan = plan_for("sdpa-flash", "bwd", w)
    assert [k.name for k in plan.kernels] == ["copy_dO_contiguous", "copy_O_contiguous",
                                              "flash_bwd_dot_do_o_kernel",
                                              "flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
                                              "flash_bwd_convert_dq_kernel"]
    assert [k.phase for k in plan.kernels] == ["bwd.pre", "bwd.pre", "bwd.pre", "bwd.main", "bwd.post"]
    bq, bk = plan.config["block_q"], plan.config["block_k"]
    nq, nk = N // bq, N // bk
    dot, main, conv = plan.kernels[2:]
    accum = B * H * nq * bq * d * 4
    assert dot.grid == conv.grid == (nq, B, H) and main.grid == (nk, B, H)
    assert _bytes(dot)[("dQaccum", "store")] == accum == _bytes(conv)[("dQaccum", "load")]
    (atomic,) = [a for a in main.accesses if a.op == "atomic"]
    assert atomic.tensor == "dQaccum" and atomic.how == "atomic" and atomic.bytes == B * H * nq * nk * bq * d * 4
    io = B * H * N * d * 2
    mb = _bytes(main)
    assert mb[("K", "load")] == mb[("V", "load")] == io                 # once per program
    assert mb[("Q", "load")] == mb[("dO", "load")] == io * nk           # once per visited tile
    assert mb[("dK", "store")] == mb[("dV", "store")] == _bytes(conv)[("dQ", "store")] == io
    assert main.matmuls[0].flops == 10 * B * H * N * N * d
    cost = price(plan, "h100")
    assert [c.name for c in cost.kernels] == [k.name for k in plan.kernels] and cost.time_s > 0


def test_efficient_backward_structure():
    """Half kernels: one program per key tile, delta recomputed by every program over all rows,
    Q and dO twice and V once per tile, K kept across a key tile's Q tiles at d = 64, the dQ
    workspace read every visit and written back but at the last; float32: PyTorch's delta
    kernels, dK/dV accumulated in global memory, dQ in two column blocks at d = 128."""
    B, H, N, d = 2, 2, 1024, 64
    w = sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=d, pass_="bwd")
    plan = plan_for("sdpa-efficient", "bwd", w)
    assert [k.name for k in plan.kernels] == ["copy_dO_contiguous", "zero_workspace",
                                              "fmha_cutlassB_f16_aligned_64x64_k64_seqaligned_sm80"]
    main = plan.kernels[-1]
    splits = efficient_num_splits_key(w, 64)
    assert splits == N // 64 and main.grid == (splits, H, B) and main.threads == 128
    io, nt = B * H * N * d * 2, N // 64
    tiles = B * H * nt * nt
    mb = _bytes(main)
    assert mb[("O", "load")] == splits * io
    assert mb[("dO", "load")] == splits * io + 2 * io * nt
    assert mb[("Q", "load")] == 2 * io * nt and mb[("V", "load")] == io * nt
    assert mb[("K", "load")] == io * nt + io                          # dQ += dS K per tile; Q K^T once
    assert mb[("workspace", "load")] == tiles * 64 * 64 * 4
    assert mb[("workspace", "store")] == (tiles - B * H * nt) * 64 * 64 * 4
    assert mb[("dQ", "store")] == mb[("dK", "store")] == mb[("dV", "store")] == io
    w32 = sim.Workload(batch=B, heads=H, seq_len_q=N, head_dim=128, dtype="fp32", pass_="bwd")
    p32 = plan_for("sdpa-efficient", "bwd", w32)
    assert [k.name for k in p32.kernels][:4] == ["copy_dO_contiguous", "delta_mul", "delta_sum", "delta_transpose"]
    m32 = _bytes(p32.kernels[-1])
    io32, nq32, nk32 = B * H * N * 128 * 4, N // 128, N // 64
    assert ("O", "load") not in m32                                    # delta came from PyTorch
    assert m32[("K", "load")] == 2 * io32 * nq32                       # reloaded every tile (x3 stages < kMaxK)
    assert m32[("dK", "store")] == io32 * nq32 and m32[("dK", "load")] == io32 * (nq32 - 1)
    assert m32[("workspace", "load")] == B * H * nq32 * nk32 * 2 * 128 * 64 * 4
    assert p32.kernels[-1].matmuls[0].passes == 3


def test_cudnn_forward_is_flash3s_plan_and_its_backward_is_not_modelled():
    w = sim.Workload(batch=2, heads=4, seq_len_q=2048, head_dim=128, causal=True)
    plan = plan_for("sdpa-cudnn", "fwd", w)
    fa3 = flash3_forward_plan(w)
    assert plan.family == "sdpa-cudnn" and plan.kernels == fa3.kernels
    assert "FlashAttention-3" in plan.config["modelled_as"]
    assert ("sdpa-cudnn", "bwd") not in PLANNERS
    with pytest.raises(ValueError, match="pass_="):
        plan_for("sdpa-cudnn", "bwd", w)


def test_plans_for_record_gives_the_backends_plans():
    (fwd,) = plans_for_record(_record("sdpa-flash"))
    assert (fwd.family, fwd.pass_, fwd.config["block_q"], fwd.config["block_k"]) == ("sdpa-flash", "fwd", 128, 128)
    fwd, bwd = plans_for_record(_record("sdpa-flash", "fwd+bwd", head_dim=128))
    assert (fwd.pass_, bwd.pass_) == ("fwd", "bwd") and bwd.config["block_q"] == 64
    assert fwd.workload.pass_ == "fwd" and bwd.workload.pass_ == "bwd"
    (eff,) = plans_for_record(_record("sdpa-efficient", dtype="fp32"))
    assert eff.config["logsumexp"] is False
    eff_f, eff_b = plans_for_record(_record("sdpa-efficient", "fwd+bwd"))
    assert eff_f.config["logsumexp"] is True and eff_b.pass_ == "bwd"
    (cud,) = plans_for_record(_record("sdpa-cudnn"))
    assert cud.family == "sdpa-cudnn"
    assert plans_for_record(_record("sdpa-cudnn", "fwd+bwd")) is None           # backward not modelled
    assert plans_for_record(_record("sdpa-flash", dtype="fp32")) is None        # FLASH refuses float32
    assert plans_for_record(_record("sdpa-flash", head_dim=96)) is None         # head dim not modelled
    assert plans_for_record(_record("sdpa-flash", gpu="NVIDIA A100-SXM4-80GB")) is None   # not sm_90
    assert plans_for_record(_record("sdpa-flash", compute_capability="9.0", gpu="?")) is not None
    (math_plan,) = plans_for_record(_record("sdpa-math"))           # its kernel sequence
    assert math_plan.family == "sdpa-math"
    assert plans_for_record(_record("triton")) is None


def test_compare_prices_sdpa_records_from_their_plans():
    from sim.compare import compare
    recs = [_record("sdpa-flash", "fwd+bwd"), _record("sdpa-efficient"), _record("sdpa-cudnn", "fwd+bwd")]
    df = compare(recs, "h100", l2="analytic", workers=1, calibrate_time=False)
    assert list(df["model_source"]) == ["plan", "plan", "schedule"]
    for (_i, row), rec in zip(list(df.iterrows())[:2], recs):
        plans = plans_for_record(rec)
        assert row["predicted_time_raw"] == pytest.approx(sum(price(p, "h100").time_ms for p in plans))


def test_bad_input_raises_value_error_naming_the_argument():
    w = sim.Workload(batch=1, heads=2, seq_len_q=1024, head_dim=512)
    for family in ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn"):
        with pytest.raises(ValueError, match="head_dim"):
            plan_for(family, "fwd", w)
    with pytest.raises(ValueError, match="head_dim=512"):
        flash_forward_tiles(512)
    with pytest.raises(ValueError, match="dtype"):
        plan_for("sdpa-flash", "fwd", sim.Workload(batch=1, heads=2, seq_len_q=1024, head_dim=64, dtype="fp32"))
    with pytest.raises(ValueError, match="dropout"):
        plan_for("sdpa-efficient", "fwd", sim.Workload(batch=1, heads=2, seq_len_q=1024, head_dim=64, dropout=True))
    with pytest.raises(ValueError, match="heads_kv"):
        plan_for("sdpa-flash", "bwd", sim.Workload(batch=1, heads=4, heads_kv=2, seq_len_q=1024, head_dim=64))
    small = sim.Workload(batch=1, heads=2, seq_len_q=4096, head_dim=64)
    assert flash_num_splits(small) > 1
    with pytest.raises(ValueError, match="split-KV"):
        plan_for("sdpa-flash", "fwd", small)
    with pytest.raises(ValueError, match="logsumexp"):
        plan_for("sdpa-efficient", "fwd", sim.Workload(batch=1, heads=2, seq_len_q=1024, head_dim=64), logsumexp=1)
    with pytest.raises(TypeError, match="workload"):
        plan_for("sdpa-flash", "fwd", {"head_dim": 64})
