"""FlashAttention-3's forward on Hopper as a `sim.plan.Plan`, with an explicit overlap model.

Owns: :func:`flash3_forward_plan` (FlashAttention-3's forward: a producer warp loading Q, K, V
by TMA into an ``stages``-deep shared-memory ring, consumer warpgroups running ``wgmma`` from
shared memory, ping-pong between the consumer warpgroups, softmax/GEMM overlap inside each
warpgroup) and :func:`flash2_hopper_baseline_plan` (the same kernel with those three ideas off,
the ablation's baseline); FlashAttention-3's tile choices (:func:`fa3_tiles`,
:func:`fa3_cluster_m`); the overlap model (:func:`overlap_serial`); and the design study that
uses them: :func:`ablation` (what each idea buys over head dims, lengths, masks, FP16 and FP8),
:func:`compare_with_paper` (the paper's published figures, :data:`PAPER_FP16_FORWARD_TFLOPS`
and :data:`PAPER_PIPELINING_ABLATION`) and :func:`compare_with_records` (measured records of
FlashAttention-2 and cuDNN). Nothing is fitted on any of these.

What the plan counts, from FlashAttention-3's code (Dao-AILab/flash-attention, ``hopper/`` at
commit 0251105a; line numbers of that commit):

* **Tiles** (``tile_size.h`` lines 10-53, ``tile_size_fwd_sm90``): FP16/BF16 d <= 64: 192 x 192
  (192 x 128 causal or local); d <= 128: 128 x 176 (128 x 128 causal or local); d <= 256:
  128 x 80 (64 local); FP8 d <= 64: 192 x 160; d <= 128: 128 x 224; d <= 256: 128 x 128 (64
  local). ``kStages = 2`` (``flash_fwd_launch_template.h`` line 47). One consumer warpgroup per
  64 query rows (``mainloop_fwd_sm90_tma_gmma_ws.hpp`` lines 89-124: ``AtomLayoutQK`` is
  ``kBlockM / 64`` warpgroups) plus one producer warpgroup (``flash_fwd_kernel_sm90.h`` lines
  74-83); the kernel is compiled for one block per SM.
* **Bytes** (all by TMA, whole tiles: counted as moved, ``Access.how = "ld"``/``"st"``): Q once
  per program (mainloop line 820); K and V once per visited tile (``load_K`` / ``load_V``, lines
  749-771), the visited tiles being `sim.counts.workload_tile_stats`'s; with a cluster of two
  CTAs (FP16/BF16, d >= 128, not causal or local, an even number of Q tiles:
  ``flash_fwd_launch_template.h`` lines 212-218) one multicast load serves both CTAs, so the L2
  sends each K/V tile once per cluster (the bytes here are halved); O (``Use_TMA_O``,
  ``epilogue_fwd.hpp`` line 37) and the float32 logsumexp (lines 281-306) once per row. FP8
  inputs write a BF16 output (``flash_api.cpp`` line 859).
* **Products** on whole visited tiles: ``4 d`` FLOPs per score (S = Q K^T and O += P V) on
  ``wgmma`` (unit ``wgmma.f16`` / ``wgmma.bf16`` / ``wgmma.fp8``).
* **MUFU**: one ``ex2`` per score of a visited tile (``scale_apply_exp2``, ``softmax.h`` lines
  66-86; masked scores too), one per row per visited tile (the rescale factor,
  ``max_get_scale`` line 119) and two per row at the end (``1 / sum`` and ``__logf``,
  ``finalize`` lines 137-152).
* **FP32** (FFMA = 2, FADD = FMUL = MAX = 1, as `sim.counts.flop_costs` with ``exp_flops=0``):
  4 per score (the FFMA of scale and max, the running max, the row sum), 1 per masked score, per
  row per visited tile ``d`` (``rescale_o``, lines 157-165) plus 3, and ``d + 2`` per row at the
  end. The FP8 path's byte permutes and in-kernel V transpose are not FLOPs and are not priced.

The overlap model (:func:`overlap_serial`), per SM, in the throughput terms of `sim.plan.price`
(``M`` the matmul time, ``S`` the softmax's time on the MUFU or on the FP32 pipe, whichever
level; ``L`` the load time of the DRAM or L2 level; ``W`` consumer warpgroups): the softmax of a
tile depends on its first product and feeds its second, so a warpgroup alone runs GEMM0,
softmax, GEMM1 one after the other.

* neither ping-pong nor intra-warpgroup overlap: the warpgroups, started together on equal
  work, stay in step: ``t = M + S`` (the upper bound: the warp schedulers may interleave them);
* intra-warpgroup overlap (FlashAttention-3 Algorithm 2): the softmax of tile j runs while the
  warpgroup's other product is in flight, but one product per tile is waited for:
  ``t = M/2 + max(M/2, S) = max(M, M/2 + S)``;
* ping-pong (a named barrier orders the warpgroups' GEMMs): while one warpgroup multiplies, the
  others run their softmax; a warpgroup's cycle is ``m + s`` and the tensor cores' ``W m``, so
  ``t = max(M, S, (M + S) / W) = max(M, S)`` for ``W >= 2`` (with or without intra overlap);
* loads overlap the compute when a producer warp runs ahead into a free stage (warp
  specialisation with ``stages >= 2``); otherwise the compute warps issue each tile's loads and
  wait for them: ``L`` adds to the compute's critical path (the synchronous kernel: the upper
  bound of what asynchronous loading buys).

Not modelled: latencies (``wgmma`` issue to completion, barrier waits, the first product and the
last of each program, which nothing overlaps), instruction issue slots shared by the softmax
and ``wgmma``, register pressure, the shared-memory reads of ``wgmma`` (the ``smem`` level
prices LSU traffic only), the persistent scheduler's load balance (programs are priced as equal
work), and clocks: the profile's ``wgmma`` peak is the datasheet's (989.4 TFLOP/s dense FP16, at
the 1830 MHz the FlashAttention-3 paper locks) while its MUFU rate is 16 per clock per SM at the
profile's 1980 MHz, so MUFU is 8 % faster relative to the matmuls than at one clock (the paper's
ratio is 256, ours 236.6).
"""
from __future__ import annotations

from ..counts import flop_costs, workload_tile_stats
from ..plan import Access, KernelPlan, Matmul, Plan, price, serial_parts
from ..workload import STAT_BYTES, Workload

__all__ = ["flash3_forward_plan", "flash2_hopper_baseline_plan", "fa3_tiles", "fa3_cluster_m",
           "fa3_ships_pingpong",
           "fa3_smem_bytes", "overlap_serial", "overlap_report", "tflops", "ABLATION_STEPS",
           "ablation", "paper_workload", "compare_with_paper", "compare_with_records",
           "PAPER_FP16_FORWARD_TFLOPS", "PAPER_PIPELINING_ABLATION", "PAPER_SETTING", "FA3_SOURCE",
           "COMPARED_MODELS", "RECORD_MODELS", "INTRA_ONLY", "pipe_shares", "PIPE_METRICS",
           "TENSOR_PIPE_METRICS",
           "FA3_DTYPES", "SOFTMAX_LEVELS", "LOAD_LEVELS"]

#: The FlashAttention-3 source the plan follows.
FA3_SOURCE = "Dao-AILab/flash-attention hopper/ at commit 0251105a2fb19d2957484b7f023cd8c115286ced"
#: Input dtypes of FlashAttention-3's forward: bytes in, bytes of O out, the ``wgmma`` unit.
FA3_DTYPES = {"fp16": (2, 2, "wgmma.f16"), "bf16": (2, 2, "wgmma.bf16"), "fp8": (1, 2, "wgmma.fp8")}
#: Levels of the softmax (separate pipes: they overlap each other) and of the loads.
SOFTMAX_LEVELS = ("fp32", "mufu")
LOAD_LEVELS = ("dram", "l2")
#: Threads of a warpgroup, rows of a ``wgmma`` M tile per consumer warpgroup.
WARPGROUP_THREADS = 128
ROWS_PER_CONSUMER_WARPGROUP = 64
#: The register file of one Hopper SM (32-bit registers), which FlashAttention-3's launch bounds
#: (one block per SM) share among the block's threads.
REGISTERS_PER_SM = 65536


# -- FlashAttention-3's choices ----------------------------------------------------------------
def fa3_tiles(head_dim: int, *, causal: bool = False, local: bool = False, dtype: str = "fp16"):
    """``(block_q, block_k, pv_from_registers)`` of ``tile_size_fwd_sm90`` (``tile_size.h``
    lines 10-53) for a head dim without a separate V head dim, paging or softcap.
    ``pv_from_registers``: the P V product reads P from registers (RS); False: P is written to
    shared memory first (SS; FP16 d <= 64 with 192-wide K tiles)."""
    d, short = int(head_dim), bool(causal) or bool(local)
    if dtype == "fp8":
        if d <= 64:
            return 192, 160, True
        if d <= 96:
            return 192, 128, True
        if d <= 128:
            return 128, 224, True
        if d <= 192:
            return 128, 160, True
        return 128, 64 if local else 128, True
    if d <= 64:
        return 192, 128 if short else 192, short
    if d <= 96:
        return 192, 128 if local else 144, False
    if d <= 128:
        return 128, 128 if short else 176, True
    if d <= 192:
        return 128, 96 if local else 128, True
    return 128, 64 if local else 80, True


def fa3_cluster_m(head_dim: int, *, causal: bool, local: bool, dtype: str, n_blocks_q: int) -> int:
    """CTAs per cluster along the Q tiles (``flash_fwd_launch_template.h`` lines 212-218): 2
    for FP16/BF16 with d >= 128 (FP8: d == 192), neither causal nor local, and an even number
    of Q tiles; else 1."""
    enabled = (head_dim >= 128 if dtype != "fp8" else head_dim == 192) and not causal and not local
    return 2 if enabled and n_blocks_q % 2 == 0 else 1


def fa3_ships_pingpong(head_dim: int, *, dtype: str, consumer_warpgroups: int) -> bool:
    """Whether FlashAttention-3 orders its warpgroups' GEMMs by a named barrier (ping-pong,
    ``UseSchedulerBarrier``, ``mainloop_fwd_sm90_tma_gmma_ws.hpp`` lines 352-355, with intra
    overlap on): two or more consumer warpgroups and d <= 128 (FP16/BF16) or d >= 128 (FP8).
    The plan's ``pingpong`` defaults to on regardless; this says where the shipped kernel
    differs (FP16 d = 256, FP8 d = 64)."""
    if consumer_warpgroups < 2:
        return False
    return head_dim >= 128 if dtype == "fp8" else head_dim <= 128


def fa3_smem_bytes(block_q: int, block_k: int, head_dim: int, stages: int, in_bytes: int,
                   out_bytes: int, pv_from_registers: bool) -> int:
    """Shared memory of one block (``flash_fwd_kernel_sm90.h`` lines 89-104 and the mainloop's
    ``TensorStorage``): the Q tile, ``stages`` K and V tiles, P when the P V product reads it
    from shared memory, and O's epilogue tile laid over V (padded when larger). The pipeline
    barriers (under 1 KiB) are not counted."""
    q = block_q * head_dim * in_bytes
    kv = stages * block_k * head_dim * in_bytes
    p = 0 if pv_from_registers else block_q * block_k * in_bytes
    o_padding = max(0, block_q * head_dim * out_bytes - kv)
    return q + 2 * kv + p + o_padding


# -- the overlap model ---------------------------------------------------------------------------
def overlap_serial(*, warp_specialised: bool, stages: int, pingpong: bool, intra_overlap: bool,
                   consumer_warpgroups: int = 2, waits: bool = False) -> tuple:
    """The ``KernelPlan.serial`` groups of the overlap model (module docstring): which levels
    add up on a chain instead of overlapping. Every level's own time stays a bound
    (`sim.plan.serial_parts`). ``waits``: a consumer warpgroup's waits for its ``wgmma`` groups
    are on its chain too (the "wait" level, `sim.plan.KernelPlan.group_waits`), where no other
    warpgroup's turn hides them (no ping-pong)."""
    if pingpong and consumer_warpgroups < 2:
        raise ValueError(f"pingpong needs at least two consumer warpgroups (block_q >= 128), got "
                         f"{consumer_warpgroups}")
    if pingpong:
        # t = max(M, S, (M + S) / W) = max(M, S) for W >= 2: the levels alone
        compute_chains = []
    elif intra_overlap:
        compute_chains = [(("matmul", 0.5), s) for s in SOFTMAX_LEVELS]
    else:
        compute_chains = [("matmul", s) for s in SOFTMAX_LEVELS]
    if waits and not pingpong:
        compute_chains = [tuple(c) + ("wait",) for c in compute_chains]
    if warp_specialised and stages >= 2:
        return tuple(compute_chains)
    compute_terms = [("matmul",), ("fp32",), ("mufu",)] + [tuple(c) for c in compute_chains]
    return tuple((load,) + term for load in LOAD_LEVELS for term in compute_terms)


def _pos(name, v, multiple=1, largest=None):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or v % multiple:
        raise ValueError(f"{name} must be a positive integer" + (f" multiple of {multiple}" if multiple > 1
                                                                  else "") + f", got {v!r}")
    if largest is not None and v > largest:
        raise ValueError(f"{name} must be at most {largest}, got {v!r}")
    return v


def flash3_forward_plan(workload: Workload, *, block_q: int | None = None, block_k: int | None = None,
                        stages: int = 2, warp_specialised: bool = True, pingpong: bool = True,
                        intra_overlap: bool = True, dtype: str | None = None,
                        cluster_m: int | None = None) -> Plan:
    """The plan of FlashAttention-3's forward for ``workload`` (module docstring).

    ``block_q`` / ``block_k``: tiles (default FlashAttention-3's, :func:`fa3_tiles`); ``block_q``
    a multiple of 64 up to 192 (one consumer warpgroup per 64 rows), ``block_k`` a multiple of 16
    up to 256. ``stages``: K/V buffers in shared memory. ``warp_specialised``, ``pingpong``,
    ``intra_overlap``: FlashAttention-3's three ideas (all off: :func:`flash2_hopper_baseline_plan`).
    ``dtype``: the inputs' dtype, "fp16", "bf16" or "fp8" (e4m3; O is written in BF16); default
    the workload's. ``cluster_m``: 1 or 2 CTAs sharing K/V loads by TMA multicast (default
    FlashAttention-3's choice, :func:`fa3_cluster_m`). Raises ValueError naming the argument."""
    if not isinstance(workload, Workload):
        raise TypeError(f"workload must be a sim.Workload, got {type(workload).__name__}")
    w = workload
    dtype = w.dtype if dtype is None else dtype
    if dtype not in FA3_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(FA3_DTYPES)} (FlashAttention-3 has no float32 "
                         f"forward), got {dtype!r}")
    for flag, v in (("warp_specialised", warp_specialised), ("pingpong", pingpong),
                    ("intra_overlap", intra_overlap)):
        if not isinstance(v, bool):
            raise ValueError(f"{flag} must be True or False, got {v!r}")
    if w.dropout:
        raise ValueError("workload.dropout: FlashAttention-3's forward has no dropout")
    if w.block_sparse or w.key_lengths is not None:
        raise ValueError("workload: block masks and key lengths are not modelled for flash3 "
                         "(dense, causal and windowed problems only)")
    d = w.head_dim
    if d % 8 or d > 256:
        raise ValueError(f"workload.head_dim must be a multiple of 8 up to 256 for FlashAttention-3, got {d}")
    local = w.window_size is not None
    in_bytes, out_bytes, unit = FA3_DTYPES[dtype]
    tile_q, tile_k, pv_rs = fa3_tiles(d, causal=w.causal, local=local, dtype=dtype)
    bq = tile_q if block_q is None else _pos("block_q", block_q, 64, 192)
    bk = tile_k if block_k is None else _pos("block_k", block_k, 16, 256)
    if block_q is not None or block_k is not None:
        pv_rs = pv_rs if (bq, bk) == (tile_q, tile_k) else True
    _pos("stages", stages)
    consumers = bq // ROWS_PER_CONSUMER_WARPGROUP
    serial = overlap_serial(warp_specialised=warp_specialised, stages=stages, pingpong=pingpong,
                            intra_overlap=intra_overlap, consumer_warpgroups=consumers)

    stats = workload_tile_stats(w, bq, bk)
    nq = stats[0][1].nq
    if cluster_m is None:
        cluster_m = fa3_cluster_m(d, causal=w.causal, local=local, dtype=dtype, n_blocks_q=nq)
    if cluster_m not in (1, 2):
        raise ValueError(f"cluster_m must be 1 or 2, got {cluster_m!r}")
    if cluster_m == 2 and nq % 2:
        raise ValueError(f"cluster_m=2 needs an even number of Q tiles, got {nq} (block_q={bq})")

    nq_rows = w.seq_len_q
    slices = w.batch * w.heads
    kv_bytes = sum(mult * st.C for mult, st in stats) * d * in_bytes     # each of K and V
    scores = sum(mult * st.A for mult, st in stats)
    masked = sum(mult * st.Am for mult, st in stats)
    row_tiles = sum(mult * st.R for mult, st in stats)
    q = slices * nq_rows * d * in_bytes
    o = slices * nq_rows * d * out_bytes
    lse = slices * nq_rows * STAT_BYTES
    costs = flop_costs(exp_flops=0)
    fp32 = (costs["fwd_per_score"] * scores + costs["mask_per_score"] * masked
            + row_tiles * (d + costs["fwd_per_row_tile"]) + slices * nq_rows * (d + 2))
    mufu = scores + row_tiles + 2 * slices * nq_rows
    threads = WARPGROUP_THREADS * (consumers + (1 if warp_specialised else 0))
    registers = min(255, (REGISTERS_PER_SM // threads) // 8 * 8)
    kernel = KernelPlan(
        name="flash3_fwd", phase="fwd", grid=(nq, w.heads, w.batch), threads=threads,
        shared_bytes=fa3_smem_bytes(bq, bk, d, stages, in_bytes, out_bytes, pv_rs),
        accesses=(Access("Q", "load", q), Access("K", "load", kv_bytes // cluster_m),
                  Access("V", "load", kv_bytes // cluster_m), Access("O", "store", o),
                  Access("lse", "store", lse)),
        matmuls=(Matmul(unit, 4 * d * scores),), fp32_flops=int(fp32), mufu_ops=int(mufu),
        registers=registers, programs_per_slice=nq, lockstep=not (w.causal or local), serial=serial)
    kv_heads = w.batch * w.heads_kv * w.seq_len_k * d * in_bytes
    tensor_bytes = {"Q": q, "K": kv_heads, "V": kv_heads, "O": o, "lse": lse}
    config = {"block_q": bq, "block_k": bk, "stages": stages, "warp_specialised": warp_specialised,
              "pingpong": pingpong, "intra_overlap": intra_overlap, "dtype": dtype,
              "cluster_m": cluster_m, "consumer_warpgroups": consumers,
              "pingpong_as_shipped": fa3_ships_pingpong(d, dtype=dtype, consumer_warpgroups=consumers),
              "pv_from_registers": pv_rs, "source": FA3_SOURCE}
    return Plan("flash3", "fwd", w, (kernel,), config, tensor_bytes)


def flash2_hopper_baseline_plan(workload: Workload, **config) -> Plan:
    """The ablation's baseline: FlashAttention-3's kernel (tiles, TMA, ``wgmma``) with warp
    specialisation, ping-pong and intra-warpgroup overlap off, i.e. FlashAttention-2's
    schedule on Hopper's instructions. Not FlashAttention-2 itself, which issues ``mma.sync``
    and ``cp.async`` with its own tiles."""
    for flag in ("warp_specialised", "pingpong", "intra_overlap"):
        if flag in config:
            raise ValueError(f"{flag}: the baseline has the three ideas off; use flash3_forward_plan")
    return flash3_forward_plan(workload, warp_specialised=False, pingpong=False, intra_overlap=False,
                               **config)


# -- reading a price -----------------------------------------------------------------------------
def tflops(workload: Workload, time_s: float) -> float:
    """TFLOP/s as the FlashAttention papers and our benchmarks count them: ``4 N_q N_k d H B``
    FLOPs, halved with a causal mask, over the time."""
    w = workload
    flops = 4 * w.seq_len_q * w.seq_len_k * w.head_dim * w.heads * w.batch / (2 if w.causal else 1)
    return flops / time_s / 1e12


def overlap_report(cost) -> dict:
    """What hides under what in a priced flash3 plan (`sim.plan.PlanCost`): per level its time,
    the chains of the overlap model and their times, the critical path (the largest part) and
    the levels hidden under it (those with time that are not on it)."""
    k_plan, k_cost = cost.plan.kernels[0], cost.kernels[0]
    levels = k_cost.level_s
    parts = serial_parts(levels, k_plan.serial)
    at = max(range(len(parts)), key=lambda i: parts[i][1])
    label, critical = parts[at]
    on_path = ({label} if at < len(levels) else
               {m if isinstance(m, str) else m[0] for m in k_plan.serial[at - len(levels)]})
    return {"critical_path": label, "critical_ms": critical * 1e3,
            "levels_ms": {n: v * 1e3 for n, v in levels.items()},
            "chains_ms": {lab: v * 1e3 for lab, v in parts[len(levels):]},
            "hidden": [n for n, v in levels.items() if v > 0 and n not in on_path],
            "serial": [[list(m) if isinstance(m, tuple) else m for m in g] for g in k_plan.serial],
            "mufu_over_matmul": (k_cost.level_s["mufu"] / k_cost.level_s["matmul"]
                                 if k_cost.level_s["matmul"] else None)}


# -- the design study ----------------------------------------------------------------------------
#: The ablation's steps, each adding one idea: (label, the flags of flash3_forward_plan).
ABLATION_STEPS = (
    ("baseline", {"warp_specialised": False, "pingpong": False, "intra_overlap": False}),
    ("+warp_specialisation", {"warp_specialised": True, "pingpong": False, "intra_overlap": False}),
    ("+pingpong", {"warp_specialised": True, "pingpong": True, "intra_overlap": False}),
    ("+intra_overlap", {"warp_specialised": True, "pingpong": True, "intra_overlap": True}),
)
#: The variant the ablation also prices: intra-warpgroup overlap without ping-pong.
INTRA_ONLY = {"warp_specialised": True, "pingpong": False, "intra_overlap": True}
#: The paper's benchmark setting (FlashAttention-3 paper, section 4.1): batch x length = 16k
#: tokens, hidden dimension 2048 (32, 16, 8 heads of d = 64, 128, 256).
PAPER_SETTING = {"tokens": 16384, "hidden": 2048}


def paper_workload(seq_len: int, head_dim: int, causal: bool, tokens: int = 16384,
                   hidden: int = 2048) -> Workload:
    """The FlashAttention-3 paper's forward benchmark problem (also our benchmark grid's):
    ``batch = tokens / seq_len``, ``heads = hidden / head_dim``, float16."""
    return Workload(batch=max(1, tokens // seq_len), heads=max(1, hidden // head_dim), seq_len_q=seq_len,
                    head_dim=head_dim, causal=causal, dtype="fp16")


def ablation(profile="h100", head_dims=(64, 128, 256), seq_lens=(512, 1024, 2048, 4096, 8192, 16384),
             causals=(False, True), dtypes=("fp16", "fp8")) -> list[dict]:
    """One row per (dtype, head dim, causal, length) of the paper's setting: predicted TFLOP/s
    of each :data:`ABLATION_STEPS` step and of intra overlap without ping-pong, the critical
    path of the full kernel, MUFU time over matmul time, and whether MUFU bounds it."""
    rows = []
    for dtype in dtypes:
        for d in head_dims:
            for causal in causals:
                for n in seq_lens:
                    w = paper_workload(n, d, causal)
                    row = {"dtype": dtype, "head_dim": d, "causal": causal, "seq_len": n,
                           "batch": w.batch, "heads": w.heads, "tflops": {}}
                    for label, flags in ABLATION_STEPS + (("intra_only", INTRA_ONLY),):
                        cost = price(flash3_forward_plan(w, dtype=dtype, **flags), profile)
                        row["tflops"][label] = tflops(w, cost.time_s)
                        if label == "+intra_overlap":
                            rep = overlap_report(cost)
                            row.update(block_q=cost.plan.config["block_q"], block_k=cost.plan.config["block_k"],
                                       critical_path=rep["critical_path"],
                                       mufu_over_matmul=rep["mufu_over_matmul"],
                                       mufu_bound=rep["critical_path"] == "mufu",
                                       time_ms=cost.time_ms)
                    rows.append(row)
    return rows


#: The FlashAttention-3 paper's FP16 forward figure (arXiv:2407.08608, the forward-speed panels
#: (a)-(f) for head dim 64, 128, 256, without and with causal mask, H100 80GB SXM5 at a locked
#: 1830 MHz, batch x length = 16k tokens, hidden 2048), as the bar labels read in
#: Dao-AILab/flash-attention ``assets/flash3_fp16_fwd.png`` (added in commit 7ef24848,
#: 2024-07-11). TFLOP/s at lengths 512, 1k, 2k, 4k, 8k, 16k; None: the label is hidden by the
#: legend. cuDNN 9.1.1, FlashAttention 2.5.8 (paper, appendix C.1).
PAPER_FP16_FORWARD_TFLOPS = {
    (64, False): {"FlashAttention-2": (282, 306, 318, 321, 322, 324), "cuDNN": (335, 373, 395, 408, 412, 413),
                  "FlashAttention-3": (333, 392, 460, 476, 496, 497)},
    (64, True): {"FlashAttention-2": (180, 229, 262, 284, 295, 299), "cuDNN": (225, 288, 334, 363, 379, 388),
                 "FlashAttention-3": (197, 265, 371, 420, 460, 473)},
    (128, False): {"FlashAttention-2": (309, 350, 362, 368, 370, 370), "cuDNN": (497, 574, 617, 609, 600, 595),
                   "FlashAttention-3": (467, 565, 625, 638, 646, 648)},
    (128, True): {"FlashAttention-2": (191, 260, 298, 319, 333, 335), "cuDNN": (315, 410, 484, 518, 529, 539),
                  "FlashAttention-3": (292, 423, 521, 579, 602, 616)},
    (256, False): {"FlashAttention-2": (275, 313, 321, 323, 324, 326), "cuDNN": (470, 546, 580, 581, 580, 581),
                   "FlashAttention-3": (482, None, 707, 736, 746, 756)},
    (256, True): {"FlashAttention-2": (208, 251, 278, 293, 297, 298), "cuDNN": (308, 391, 450, 483, 497, 509),
                  "FlashAttention-3": (286, 427, 537, 612, 628, 642)},
}
PAPER_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)

#: The FlashAttention-3 paper's Table 2 (section 4.2): non-causal FP16 forward, (batch, length,
#: heads, d) = (4, 8448, 16, 128): configuration -> (ms, TFLOP/s), with the flags of
#: flash3_forward_plan each row corresponds to (ping-pong is on in FlashAttention-3 at d = 128).
PAPER_PIPELINING_ABLATION = (
    ("FlashAttention-3", 3.538, 661, {"warp_specialised": True, "pingpong": True, "intra_overlap": True}),
    ("No GEMM-softmax pipelining, warp specialisation", 4.021, 582,
     {"warp_specialised": True, "pingpong": True, "intra_overlap": False}),
    ("GEMM-softmax pipelining, no warp specialisation", 4.105, 570,
     {"warp_specialised": False, "pingpong": True, "intra_overlap": True}),
)


#: The three models the comparisons price: the ablation's baseline, the warp-specialised kernel
#: whose softmax does not overlap its products ("serial_softmax": neither ping-pong nor intra
#: overlap), and FlashAttention-3 with all three ideas.
COMPARED_MODELS = {"baseline": ABLATION_STEPS[0][1], "serial_softmax": ABLATION_STEPS[1][1],
                   "flash3": ABLATION_STEPS[3][1]}


def _error(predicted, measured):
    """(predicted - measured) / measured of a time (None where nothing was measured)."""
    return None if measured is None else (predicted - measured) / measured


def _time_error(predicted_tflops, measured_tflops):
    """The same error of the time, from TFLOP/s of one problem (time is FLOPs / rate)."""
    return None if measured_tflops is None else measured_tflops / predicted_tflops - 1


def compare_with_paper(profile="h100") -> dict:
    """The model against the paper's published FP16 forward figures: per (d, causal, length),
    the predicted TFLOP/s of each of :data:`COMPARED_MODELS`, the paper's FlashAttention-3,
    FlashAttention-2 and cuDNN, the errors of the predicted time ((predicted - paper) / paper)
    of the full kernel and of the serial-softmax kernel against the paper's FlashAttention-3 and
    of the baseline against its FlashAttention-2, and the FA3/FA2 speedups (predicted: full over
    baseline); and Table 2's three configurations, time and TFLOP/s."""
    figure = []
    for (d, causal), series in PAPER_FP16_FORWARD_TFLOPS.items():
        for i, n in enumerate(PAPER_SEQ_LENS):
            w = paper_workload(n, d, causal)
            pred = {m: tflops(w, price(flash3_forward_plan(w, **flags), profile).time_s)
                    for m, flags in COMPARED_MODELS.items()}
            paper3, paper2 = series["FlashAttention-3"][i], series["FlashAttention-2"][i]
            figure.append({"head_dim": d, "causal": causal, "seq_len": n,
                           **{f"predicted_{m}": v for m, v in pred.items()},
                           "paper_fa3": paper3, "paper_fa2": paper2, "paper_cudnn": series["cuDNN"][i],
                           "fa3_error": _time_error(pred["flash3"], paper3),
                           "serial_softmax_error": _time_error(pred["serial_softmax"], paper3),
                           "baseline_error_vs_fa2": _time_error(pred["baseline"], paper2),
                           "predicted_speedup": pred["flash3"] / pred["baseline"],
                           "paper_speedup": None if paper3 is None else paper3 / paper2})
    w = Workload(batch=4, heads=16, seq_len_q=8448, head_dim=128, dtype="fp16")
    table2 = []
    for label, ms, tf, flags in PAPER_PIPELINING_ABLATION:
        cost = price(flash3_forward_plan(w, **flags), profile)
        table2.append({"configuration": label, "flags": flags, "paper_ms": ms, "paper_tflops": tf,
                       "predicted_ms": cost.time_ms, "predicted_tflops": tflops(w, cost.time_s),
                       "critical_path": overlap_report(cost)["critical_path"]})
    return {"figure": figure, "table2": table2}


#: Which model stands for which measured kernel (its ``error``; every model of
#: :data:`COMPARED_MODELS` is priced too): FlashAttention-2 (PyTorch's flash backend) by the
#: baseline, cuDNN's Hopper kernel (warp-specialised, TMA and ``wgmma``) by the full kernel.
RECORD_MODELS = {"sdpa-flash": "baseline", "sdpa-cudnn": "flash3"}


#: Agreement the speedup comparison counts: predicted FA3/FA2 within this of measured cuDNN/FA2.
SPEEDUP_TOLERANCE = 0.20


def speedups_from_rows(rows: list[dict], fa3_model: str = "flash3") -> dict:
    """FlashAttention-3's forward speedup over FlashAttention-2, predicted against measured:
    for every workload (dtype, batch, heads, N, d, mask) with both an ``sdpa-flash`` and an
    ``sdpa-cudnn`` row of :func:`compare_with_records` (one run's records),
    ``measured`` = t_flash / t_cudnn, ``predicted`` = t_baseline / t_fa3 (``fa3_model``, one of
    :data:`COMPARED_MODELS`: "flash3", every overlap of the design, as :data:`RECORD_MODELS`
    reads cuDNN; or "serial_softmax", warp-specialised loads with the softmax between the
    products, the reading of the pipe counters, :func:`pipe_shares`) and ``error`` = predicted
    / measured - 1. Returns ``{"pairs": [...], "within": share of pairs within
    `SPEEDUP_TOLERANCE`, "median_abs_error": ...}`` (None for both without pairs)."""
    if fa3_model not in COMPARED_MODELS:
        raise ValueError(f"fa3_model must be one of {sorted(COMPARED_MODELS)}, got {fa3_model!r}")
    by = {}
    for r in rows:
        key = (r["dtype"], r["batch"], r["heads"], r["seq_len"], r["head_dim"], r["causal"])
        by.setdefault(key, {})[r["kernel"]] = r
    pairs = []
    for (dtype, b, h, n, d, causal), k in sorted(by.items()):
        if "sdpa-flash" not in k or "sdpa-cudnn" not in k:
            continue
        fl, cu = k["sdpa-flash"], k["sdpa-cudnn"]
        measured = fl["measured_ms"] / cu["measured_ms"]
        predicted = fl["predicted_ms_by_model"]["baseline"] / cu["predicted_ms_by_model"][fa3_model]
        pairs.append({"dtype": dtype, "batch": b, "heads": h, "seq_len": n, "head_dim": d,
                      "causal": causal, "measured": measured, "predicted": predicted,
                      "error": predicted / measured - 1})
    return {"pairs": pairs, **speedup_agreement(pairs)}


def speedup_agreement(pairs: list[dict]) -> dict:
    """``{"within": share of ``pairs`` within `SPEEDUP_TOLERANCE`, "median_abs_error": ...}``
    (None for both without pairs)."""
    import statistics
    errs = [abs(p["error"]) for p in pairs]
    return {"within": (sum(e <= SPEEDUP_TOLERANCE for e in errs) / len(errs)) if errs else None,
            "median_abs_error": statistics.median(errs) if errs else None}


def in_paper_setting(pair: dict) -> bool:
    """Whether a speedup pair is at FlashAttention's benchmark shapes (batch x N = 16,384 tokens,
    heads x d = 2048), as the `--seq-len` sweep of ``python -m sim flash3-ablation`` is."""
    return (pair["batch"] * pair["seq_len"] == 16384 and pair["heads"] * pair["head_dim"] == 2048)


#: Nsight Compute metrics of an ``ncu --stalls`` file (short names) that :func:`pipe_shares`
#: reads, each in % of its peak over the kernel's active cycles: the tensor pipe's active
#: cycles (the larger of the HMMA and GMMA counters: on the H100's Nsight Compute 2025 the GMMA
#: one is absent and ``wgmma`` work shows in the HMMA one) and the XU pipe's (MUFU: ``ex2``)
#: executed instructions.
TENSOR_PIPE_METRICS = ("hmma_pipe_pct", "gmma_pipe_pct")
PIPE_METRICS = TENSOR_PIPE_METRICS + ("xu_pipe_pct",)


def pipe_shares(path, profile="h100", kernel: str = "sdpa-cudnn") -> list[dict]:
    """Which overlap the tensor and MUFU pipes of a FlashAttention-3-style kernel show, per
    forward record of ``kernel`` in an ``ncu --stalls`` file (``python -m benchmarks ncu ...
    --stalls``; per launch its pipe metrics, :data:`PIPE_METRICS`): the measured shares of the
    kernel's time the GMMA pipe and the XU pipe are busy, against the model's for the same
    workload (:func:`flash3_forward_plan` with every overlap, priced on ``profile``: M the
    matmul level's time, S the MUFU level's): serial, the softmax between the products, M / (M
    + S) and S / (M + S); overlapped, max(M, S) the critical path, M / max and S / max. Nothing
    is fitted; the file's records are of its own workloads."""
    import json
    from pathlib import Path
    doc = json.loads(Path(path).read_text())
    rows = []
    for rec in doc.get("records", []):
        if rec.get("kernel") != kernel or rec.get("pass") != "fwd":
            continue
        launches = [k for k in rec.get("launches", [])
                    if (k.get("metrics") or {}).get("xu_pipe_pct") is not None
                    and any(k["metrics"].get(m) is not None for m in TENSOR_PIPE_METRICS)]
        if not launches:
            continue
        main = max(launches, key=lambda k: k["metrics"].get("duration_ns") or 0)["metrics"]
        w = Workload(batch=rec["batch"], heads=rec["heads"], heads_kv=rec.get("heads_kv") or rec["heads"],
                     seq_len_q=rec["seq_len_q"], seq_len_k=rec.get("seq_len_k") or rec["seq_len_q"],
                     head_dim=rec["head_dim"], dtype=rec["dtype"], causal=bool(rec.get("causal")))
        levels = price(flash3_forward_plan(w, **COMPARED_MODELS["flash3"]), profile).kernels[0].level_s
        m, s = levels["matmul"], levels["mufu"]
        rows.append({"kernel": kernel, "dtype": w.dtype, "head_dim": w.head_dim,
                     "seq_len": w.seq_len_q, "causal": w.causal,
                     "tensor_pct": max(main.get(m) or 0.0 for m in TENSOR_PIPE_METRICS),
                     "xu_pct": main["xu_pipe_pct"],
                     "serial_tensor_pct": 100 * m / (m + s), "serial_xu_pct": 100 * s / (m + s),
                     "overlap_tensor_pct": 100 * m / max(m, s),
                     "overlap_xu_pct": 100 * s / max(m, s)})
    return rows


def compare_with_records(records, profile="h100") -> list[dict]:
    """Predicted against measured time for the forward records of ``records`` (a list of
    results records, or a results file path) whose kernel is in :data:`RECORD_MODELS`;
    ``error`` = (predicted - measured) / measured. Nothing is fitted on the records."""
    if not isinstance(records, list):
        from ..results import load_results
        records = load_results(records)
    rows = []
    for rec in records:
        model = RECORD_MODELS.get(rec.get("kernel"))
        if model is None or rec.get("pass") != "fwd" or rec.get("dtype") not in ("fp16", "bf16"):
            continue
        w = Workload(batch=rec["batch"], heads=rec["heads"], heads_kv=rec.get("heads_kv") or rec["heads"],
                     seq_len_q=rec["seq_len_q"], seq_len_k=rec.get("seq_len_k") or rec["seq_len_q"],
                     head_dim=rec["head_dim"], dtype=rec["dtype"], causal=bool(rec.get("causal")))
        predicted = {m: price(flash3_forward_plan(w, **flags), profile).time_ms
                     for m, flags in COMPARED_MODELS.items()}
        measured = float(rec["time_ms"])
        rows.append({"kernel": rec["kernel"], "model": model, "batch": w.batch, "heads": w.heads,
                     "seq_len": w.seq_len_q, "head_dim": w.head_dim, "causal": w.causal,
                     "dtype": w.dtype, "measured_ms": measured, "predicted_ms": predicted[model],
                     "predicted_ms_by_model": predicted,
                     "measured_tflops": tflops(w, measured / 1e3),
                     "predicted_tflops": tflops(w, predicted[model] / 1e3),
                     "error": _error(predicted[model], measured),
                     "error_by_model": {m: _error(v, measured) for m, v in predicted.items()}})
    return rows
