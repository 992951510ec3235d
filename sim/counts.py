"""Closed-form IO and FLOP counts of each schedule (vectorised over numpy arrays for sweeps).

Every count is a sum over thread-block programs of per-tile terms. The only workload-dependent
inputs are a handful of *tile statistics* of the visited tile set (:class:`TileStats`), taken
either from :class:`ioaware.block_info.BlockInfo` (:func:`tile_stats_blockinfo`: any causal /
window / block-sparse / key-padding pattern) or, for dense, causal and windowed problems, from
:func:`tile_stats_closed` — ``BlockInfo.k_block_range`` written as array arithmetic over the Q
blocks, held equal to BlockInfo by the tests. :mod:`sim.trace` walks the same schedules tile by
tile; the tests hold the two equal, byte for byte and FLOP for FLOP.

Conventions: bytes of Q, K, V, O, dO, dQ, dK, dV, S, P, dP, dS are in the workload dtype;
row statistics (m, l, lse, D) and FlashAttention-2's dQ accumulator are fp32; boolean masks are
1 byte per element. "hbm" = global memory as the FlashAttention papers count it (SM <-> L2
traffic); an ``atomic`` is the fp32 dQ accumulation of FlashAttention-2's backward (the
operand bytes sent to L2, counted as written).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

from ioaware.block_info import BlockInfo, band_offsets, cdiv

from .workload import EXP_FLOPS, LOG_FLOPS, RCP_FLOPS, SECTOR_BYTES, STAT_BYTES, Workload, block_infos

__all__ = ["TileStats", "tile_stats_blockinfo", "tile_stats_closed", "tile_stats_arrays",
           "slice_terms", "closed_form", "FLOP_COSTS", "flop_costs", "summarise",
           "naive_variant_kernels"]

# Non-matmul FLOPs. One per elementwise arithmetic op (max, add, multiply, divide, log, compare),
# except ``exp``, which costs ``exp_flops`` (:data:`sim.workload.EXP_FLOPS`, a field of
# :class:`sim.workload.Schedule`): the GPU does not run exp as one instruction. On sm_90 the
# libdevice ``expf`` our kernels call executes range-reduction FFMAs, ``ex2.approx`` and an FMUL,
# which Nsight Compute counts (2 FFMA + FADD + FMUL) as about 5 FLOPs (docs/model.md).
def flop_costs(exp_flops: int = EXP_FLOPS) -> dict:
    """Non-matmul FLOP costs with ``exp`` priced at ``exp_flops``.

    Per score (per element of S): ``fwd_per_score`` (scale, running max, subtract, exp, running
    sum), ``bwd_per_score`` (recompute P: scale, subtract, exp; dS = P * (dP - D)),
    ``naive_softmax_per_score`` (max, subtract, exp, sum, divide). Per row per visited K tile
    (the online softmax's bookkeeping, on top of the output rescale ``acc *= alpha``, d FLOPs per
    row per tile, which is counted beside it): ``fwd_per_row_tile`` (FlashAttention-2: max of
    maxes, alpha = exp(m_old - m_new), l *= alpha, l += rowsum) and ``flash1_fwd_per_row_tile``
    (FlashAttention-1: new max, two exps, new l, two scalings of its 2 d output update
    counted beside it).

    ``simt_*``: what our CUDA-core kernels (`kernels.flash_fwd`, `kernels.flash_bwd`) execute as
    float32 FFMA/FADD/FMUL, read from their code (a schedule with a micro-tile uses them):
    ``simt_fwd_per_score`` (s - m, exp, row-sum add; the softmax scale is applied to the Q tile
    once at load and the max is FMNMX, not arithmetic); ``simt_fwd_per_row_thread_tile`` (alpha
    = exp(m_old - m_new): 1 + exp; l = l alpha + rs: one FFMA) — executed by each of the
    ``block_k // tn`` threads sharing a row, on top of its d / (block_k // tn) share of the
    output rescale; ``simt_fwd_per_row_thread_end`` (1 / l, log l, m + log l) on top of the
    log2(threads per row) shuffle adds of the row sum; ``simt_delta_warp_per_row`` (the
    one-warp-per-row delta pre-pass: 5 shuffle-add rounds on 32 lanes). The backward's per-score
    cost (s scale - lse: one FFMA; exp; dP - D; P (dP - D)) equals ``bwd_per_score``; the
    kernels' masks are integer compares (no FLOPs).
    """
    x = int(exp_flops)
    return {
        "simt_fwd_per_score": 2 + x,
        "simt_fwd_per_row_thread_tile": 3 + x,
        "simt_fwd_per_row_thread_end": RCP_FLOPS + LOG_FLOPS + 1,
        "simt_delta_warp_per_row": 5 * 32,
        "fwd_per_score": 4 + x,
        "bwd_per_score": 4 + x,
        "mask_per_score": 1,     # elementwise mask, only on tiles that need it
        "dropout_per_score": 2,  # keep-bit test and 1/(1-p) rescale (the hash itself is not counted)
        "naive_softmax_per_score": 4 + x,
        "naive_softmax_bwd_per_score": 4,  # D = rowsum(P * dP), dS = P * (dP - D)
        "naive_scale_per_score": 1,
        "fwd_per_row_tile": 3 + x,
        "flash1_fwd_per_row_tile": 4 + 2 * x,
        "exp": x,
    }


#: The costs at the default ``exp_flops`` (:data:`sim.workload.EXP_FLOPS`).
FLOP_COSTS = flop_costs()


@dataclass(frozen=True)
class TileStats:
    """Sums over the visited tiles (m, n) of one (batch, head) slice; r_m, c_n = rows / columns.

    T = #tiles, A = sum r_m c_n, R = sum r_m, C = sum c_n, Cvis = sum of c_n over K blocks that
    at least one Q block visits, Am = sum r_m c_n over tiles that need an elementwise mask.
    Fields may be numpy arrays (sweeps).
    """

    nq: object
    nk: object
    T: object
    A: object
    R: object
    C: object
    Cvis: object
    Am: object

    def as_tuple(self):
        return tuple(int(getattr(self, f.name)) for f in fields(self))


def tile_stats_blockinfo(bi: BlockInfo, key_len: int | None = None) -> TileStats:
    """Tile statistics straight from BlockInfo (any mask). ``key_len``: key-padding length; tiles
    containing padded columns count as needing the elementwise mask."""
    T = A = R = C = Am = 0
    visited = set()
    for m in range(bi.n_blocks_q):
        q0, q1 = bi.q_range(m)
        r = q1 - q0
        for n in bi.k_blocks(m):
            k0, k1 = bi.k_range(n)
            c = k1 - k0
            T += 1
            A += r * c
            R += r
            C += c
            visited.add(n)
            if bi.tile_needs_mask(m, n) or (key_len is not None and k1 > key_len):
                Am += r * c
    Cvis = sum(bi.k_range(n)[1] - bi.k_range(n)[0] for n in visited)
    return TileStats(bi.n_blocks_q, bi.n_blocks_k, T, A, R, C, Cvis, Am)


@lru_cache(maxsize=65536)
def tile_stats_closed(seqlen_q: int, seqlen_k: int, block_q: int, block_k: int, causal: bool,
                      window_size: tuple | None = None) -> TileStats:
    """Tile statistics of a dense, causal or windowed problem without walking tiles.

    With the band ``lo <= j - i <= hi`` of the causal rule (top-left, as BlockInfo's default)
    and the window (``ioaware.block_info.band_offsets``; either bound may be absent), Q block m
    (rows ``r0 .. r1 - 1``) visits the K blocks ``[klo_m, khi_m)`` that meet the columns
    ``[max(0, r0 + lo), min(Nk - 1, r1 - 1 + hi)]`` (none when that is empty); those wholly
    inside the band (no elementwise mask) are the blocks whose last column is at most
    ``r0 + hi`` and whose first column is at least ``r1 - 1 + lo``. ``Cvis`` sums the K blocks
    covered by some ``[klo_m, khi_m)``.
    """
    Nq, Nk, bq, bk = int(seqlen_q), int(seqlen_k), int(block_q), int(block_k)
    nq, nk = cdiv(Nq, bq), cdiv(Nk, bk)
    lo, hi = band_offsets(Nq, Nk, bool(causal), "top_left", window_size)
    if lo is None and hi is None:
        return TileStats(nq, nk, nq * nk, Nq * Nk, Nq * nk, nq * Nk, Nk, 0)
    m = np.arange(nq, dtype=np.int64)
    first_row = m * bq
    last_row = np.minimum(first_row + bq, Nq) - 1
    rows = last_row - first_row + 1
    first_col = np.zeros(nq, np.int64) if lo is None else np.maximum(0, first_row + lo)
    last_col = np.full(nq, Nk - 1, np.int64) if hi is None else np.minimum(Nk - 1, last_row + hi)
    visits = last_col >= first_col
    klo = np.where(visits, first_col // bk, 0)
    khi = np.where(visits, last_col // bk + 1, 0)

    def cols(a, b):
        """Columns of K blocks [a, b) (0 when b <= a)."""
        return np.where(b > a, np.minimum(b * bk, Nk) - a * bk, 0)

    cols_visited = cols(klo, khi)
    # K blocks no elementwise mask touches: last column <= first_row + hi (K blocks n < nk - 1
    # end at (n + 1) Bc - 1, the last one at Nk - 1), first column >= last_row + lo
    if hi is None:
        u_hi = np.full(nq, nk, np.int64)
    else:
        top = first_row + hi
        u0 = np.clip((top + 1) // bk, 0, nk - 1)
        u_hi = u0 + ((u0 == nk - 1) & (Nk - 1 <= top))
    u_lo = np.zeros(nq, np.int64) if lo is None else np.maximum(0, -(-(last_row + lo) // bk))
    cols_inside = cols(np.maximum(klo, u_lo), np.minimum(khi, u_hi))
    cover = np.zeros(nk + 1, np.int64)
    np.add.at(cover, klo[visits], 1)
    np.add.at(cover, khi[visits], -1)
    covered = np.cumsum(cover[:nk]) > 0
    n = np.arange(nk, dtype=np.int64)
    widths = np.minimum((n + 1) * bk, Nk) - n * bk
    return TileStats(nq, nk, int((khi - klo).sum()), int((rows * cols_visited).sum()),
                     int((rows * (khi - klo)).sum()), int(cols_visited.sum()),
                     int(widths[covered].sum()), int((rows * (cols_visited - cols_inside)).sum()))


def tile_stats_arrays(Nq, Nk, bq, bk, causal, window_size=None) -> TileStats:
    """:func:`tile_stats_closed` over broadcast arrays (evaluated once per distinct problem),
    one ``window_size`` for all."""
    Nq, Nk, bq, bk, causal = np.broadcast_arrays(*(np.asarray(x) for x in (Nq, Nk, bq, bk, causal)))
    keys = np.stack([Nq.ravel(), Nk.ravel(), bq.ravel(), bk.ravel(), causal.ravel().astype(np.int64)], 1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    table = np.array([tile_stats_closed(int(a), int(b), int(c), int(d_), bool(e), window_size).as_tuple()
                      for a, b, c, d_, e in uniq], dtype=np.int64).reshape(len(uniq), 8)
    vals = table[inv.ravel()]
    shape = Nq.shape
    return TileStats(*(vals[:, i].reshape(shape) for i in range(8)))


def delta_load_amplification(delta_kernel: str, d: int, e: int) -> int:
    """Global-load bytes per byte of O and dO the backward's delta pre-pass requests: 1 for the
    coalesced one-warp-per-row kernel; for one thread per row each element read is its own
    ``SECTOR_BYTES`` sector (neighbouring threads are d elements apart), so ``32 / e`` (at most
    d, when rows are shorter than a sector)."""
    if delta_kernel == "warp":
        return 1
    amp = np.maximum(1, np.minimum(SECTOR_BYTES // np.asarray(e), np.asarray(d)))
    return int(amp) if np.ndim(amp) == 0 else amp


def store_sector_amplification(threads_per_row: int, e: int) -> int:
    """Store bytes per byte written by our CUDA-core kernels' output loops (O; dK and dV): the
    ``threads_per_row`` threads of a row store adjacent elements, so one warp store writes
    ``threads_per_row * e`` contiguous bytes per row, a whole 32-byte sector when fewer (float16
    with 8 threads per row: 16 bytes, counted as 32)."""
    return max(1, SECTOR_BYTES // (int(threads_per_row) * int(e)))


def segment_amplification(segment_bytes) -> int:
    """Request bytes per useful byte of accesses that touch ``segment_bytes`` of a row per warp
    instruction (None: whole rows, 1): a 32-byte sector per segment when it is smaller."""
    if segment_bytes is None:
        return 1
    return max(1, SECTOR_BYTES // int(segment_bytes))


def slice_terms(schedule: str, pass_name: str, st: TileStats, Nq, Nk, d, e, *, masked=False,
                dropout=False, fused_softmax=False, gqa=False, exp_flops=EXP_FLOPS,
                dq_mode="atomic", simt=False, threads_per_row=1, delta_kernel="warp",
                store_amp=(1, 1), q_load_amp=1):
    """Per-(batch, head) slice counts of one pass: ``(bytes, flops)``.

    bytes: ``{(phase, tensor, op): n}``; flops: ``{phase: (matmul, other)}``. Arithmetic only, so
    every argument may be a numpy array. ``gqa``: dK/dV go to per-query-head buffers
    (``dK_exp``/``dV_exp``) reduced afterwards (see :func:`closed_form`). ``exp_flops``: FLOPs
    per exp (:func:`flop_costs`). ``dq_mode``: flash2 backward's dQ ("atomic" or "kernel", see
    :class:`sim.workload.Schedule`); float32 (``e == 4``) atomic runs have no ``bwd.post``.

    Per-tile non-matmul terms of the tiled forwards: every visited tile (r rows) costs
    ``r * d`` for the output rescale (``acc *= alpha``, FlashAttention-2; ``2 r d`` for
    FlashAttention-1's update of O from HBM) plus the per-row bookkeeping of :func:`flop_costs`.

    ``simt`` (flash2, our CUDA-core kernels; ``threads_per_row`` = block_k // tn): the per-row
    bookkeeping runs once per thread of the row (``simt_*`` terms of :func:`flop_costs`), the
    Q tile is scaled at load (d per query row), the epilogue reduces the row sum by shuffles and
    takes 1 / l and log l per thread, masks cost no FLOPs, the backward scales dK at the end
    (d per key row). ``delta_kernel``: the pre-pass's loads (:func:`delta_load_amplification`)
    and, with ``simt``, its shuffle reduction and (one warp per row) its one-lane D stores, a
    32-byte sector each. ``store_amp``: (O and the dQ kernel's dQ, dK/dV) store amplification of
    the CUDA-core kernels (:func:`store_sector_amplification`); ``q_load_amp``: the flash2
    forward's Q loads, in fragments (:func:`segment_amplification`).
    """
    f = STAT_BYTES
    b: dict = {}
    fl: dict = {}
    C = flop_costs(exp_flops)
    drop = C["dropout_per_score"] if dropout else 0

    def add(phase, tensor, op, n):
        key = (phase, tensor, op)
        b[key] = b.get(key, 0) + n

    dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")
    mask_cost = 0 if simt else C["mask_per_score"]
    if schedule == "flash2" and pass_name == "fwd":
        add("fwd", "Q", "load", q_load_amp * Nq * d * e)
        add("fwd", "K", "load", st.C * d * e)
        add("fwd", "V", "load", st.C * d * e)
        add("fwd", "O", "store", store_amp[0] * Nq * d * e)
        add("fwd", "lse", "store", Nq * f)
        if simt:
            ntn = int(threads_per_row)
            end = ntn * (ntn.bit_length() - 1 + C["simt_fwd_per_row_thread_end"]) + d
            fl["fwd"] = (4 * d * st.A, (C["simt_fwd_per_score"] + drop) * st.A
                         + st.R * (d + ntn * C["simt_fwd_per_row_thread_tile"]) + Nq * d + Nq * end)
        else:
            fl["fwd"] = (4 * d * st.A, (C["fwd_per_score"] + drop) * st.A + C["mask_per_score"] * st.Am
                         + st.R * (d + C["fwd_per_row_tile"]) + Nq * (d + 2))
    elif schedule == "flash1" and pass_name == "fwd":
        for t, w in (("O", d * e), ("l", f), ("m", f)):
            add("fwd", t, "store", (Nq + st.R) * w)
        add("fwd", "K", "load", st.Cvis * d * e)
        add("fwd", "V", "load", st.Cvis * d * e)
        for t, w in (("Q", d * e), ("O", d * e), ("l", f), ("m", f)):
            add("fwd", t, "load", st.R * w)
        fl["fwd"] = (4 * d * st.A, (C["fwd_per_score"] + drop) * st.A + C["mask_per_score"] * st.Am
                     + st.R * (2 * d + C["flash1_fwd_per_row_tile"]))
    elif schedule == "flash1" and pass_name == "bwd":
        add("bwd.main", "dQ", "store", (Nq + st.R) * d * e)
        add("bwd.main", "K", "load", st.Cvis * d * e)
        add("bwd.main", "V", "load", st.Cvis * d * e)
        for t, w in (("Q", d * e), ("O", d * e), ("dO", d * e), ("dQ", d * e), ("l", f), ("m", f)):
            add("bwd.main", t, "load", st.R * w)
        add("bwd.main", dk, "store", Nk * d * e)
        add("bwd.main", dv, "store", Nk * d * e)
        fl["bwd.main"] = (10 * d * st.A, (C["bwd_per_score"] + drop) * st.A
                          + C["mask_per_score"] * st.Am + st.R * 3 * d)
    elif schedule == "flash2" and pass_name == "bwd":
        atomic = dq_mode == "atomic"
        # float32 inputs: the float32 accumulator is dQ itself (no bwd.post conversion)
        post = atomic and not (np.ndim(e) == 0 and int(e) == f)
        acc = "dQacc" if post else "dQ"
        amp = delta_load_amplification(delta_kernel, d, e)
        add("bwd.pre", "O", "load", amp * Nq * d * e)
        add("bwd.pre", "dO", "load", amp * Nq * d * e)
        # our warp-per-row pre-pass stores each row's D from one lane: a sector per 4-byte store
        d_amp = SECTOR_BYTES // f if (simt and delta_kernel == "warp") else 1
        add("bwd.pre", "D", "store", d_amp * Nq * f)
        if atomic:
            add("bwd.pre", acc, "store", Nq * d * f)
        warp_red = C["simt_delta_warp_per_row"] if (simt and delta_kernel == "warp") else 0
        fl["bwd.pre"] = (0 * d, (2 * d + warp_red) * Nq)
        add("bwd.main", "K", "load", st.Cvis * d * e)
        add("bwd.main", "V", "load", st.Cvis * d * e)
        add("bwd.main", "Q", "load", st.R * d * e)
        add("bwd.main", "dO", "load", st.R * d * e)
        add("bwd.main", "lse", "load", st.R * f)
        add("bwd.main", "D", "load", st.R * f)
        add("bwd.main", dk, "store", store_amp[1] * Nk * d * e)
        add("bwd.main", dv, "store", store_amp[1] * Nk * d * e)
        per_score = (C["bwd_per_score"] + drop) * st.A + mask_cost * st.Am
        dk_scale = Nk * d if simt else 0 * d   # dK *= softmax scale when written
        if atomic:
            add("bwd.main", acc, "atomic", st.R * d * f)
            fl["bwd.main"] = (10 * d * st.A, per_score + st.R * d + dk_scale)
        else:
            # dK/dV kernel: S, dP, dV, dK; dQ kernel: S, dP, dQ (K, V re-read per visited tile)
            fl["bwd.main"] = (8 * d * st.A, per_score + dk_scale)
            for t, w in (("Q", d * e), ("dO", d * e), ("lse", f), ("D", f)):
                add("bwd.dq", t, "load", Nq * w)
            add("bwd.dq", "K", "load", st.C * d * e)
            add("bwd.dq", "V", "load", st.C * d * e)
            add("bwd.dq", "dQ", "store", store_amp[0] * Nq * d * e)   # as the forward's O
            fl["bwd.dq"] = (6 * d * st.A, per_score + Nq * d)
        if post:
            add("bwd.post", "dQacc", "load", Nq * d * f)
            add("bwd.post", "dQ", "store", Nq * d * e)
            fl["bwd.post"] = (0 * d, 0 * d)
    elif schedule == "naive":
        SS = Nq * Nk
        s_bytes, mask_bytes = SS * e, SS * 1
        mflag = 1 if masked else 0
        if pass_name == "fwd":
            add("fwd.qk", "Q", "load", Nq * d * e)
            add("fwd.qk", "K", "load", Nk * d * e)
            add("fwd.qk", "S", "store", s_bytes)
            fl["fwd.qk"] = (2 * d * SS, 0 * SS)
            if not fused_softmax:
                add("fwd.scale_mask", "S", "load", s_bytes)
                if masked:
                    add("fwd.scale_mask", "mask", "load", mask_bytes)
                add("fwd.scale_mask", "S", "store", s_bytes)
                fl["fwd.scale_mask"] = (0 * SS, (C["naive_scale_per_score"] + mflag * C["mask_per_score"]) * SS)
                add("fwd.softmax", "S", "load", s_bytes)
                add("fwd.softmax", "P", "store", s_bytes)
                fl["fwd.softmax"] = (0 * SS, C["naive_softmax_per_score"] * SS)
            else:
                add("fwd.softmax", "S", "load", s_bytes)
                if masked:
                    add("fwd.softmax", "mask", "load", mask_bytes)
                add("fwd.softmax", "P", "store", s_bytes)
                fl["fwd.softmax"] = (0 * SS, (C["naive_softmax_per_score"] + C["naive_scale_per_score"]
                                              + mflag * C["mask_per_score"]) * SS)
            p = "P"
            if dropout:
                add("fwd.dropout", "P", "load", s_bytes)
                add("fwd.dropout", "Pd", "store", s_bytes)
                add("fwd.dropout", "drop_mask", "store", mask_bytes)
                fl["fwd.dropout"] = (0 * SS, C["dropout_per_score"] * SS)
                p = "Pd"
            add("fwd.pv", p, "load", s_bytes)
            add("fwd.pv", "V", "load", Nk * d * e)
            add("fwd.pv", "O", "store", Nq * d * e)
            fl["fwd.pv"] = (2 * d * SS, 0 * SS)
        else:
            p = "Pd" if dropout else "P"
            add("bwd.dv", p, "load", s_bytes)
            add("bwd.dv", "dO", "load", Nq * d * e)
            add("bwd.dv", dv, "store", Nk * d * e)
            fl["bwd.dv"] = (2 * d * SS, 0 * SS)
            add("bwd.dp", "dO", "load", Nq * d * e)
            add("bwd.dp", "V", "load", Nk * d * e)
            add("bwd.dp", "dP", "store", s_bytes)
            fl["bwd.dp"] = (2 * d * SS, 0 * SS)
            if dropout:
                add("bwd.dropout", "dP", "load", s_bytes)
                add("bwd.dropout", "drop_mask", "load", mask_bytes)
                add("bwd.dropout", "dP", "store", s_bytes)
                fl["bwd.dropout"] = (0 * SS, C["dropout_per_score"] * SS)
            add("bwd.softmax", "P", "load", s_bytes)
            add("bwd.softmax", "dP", "load", s_bytes)
            if fused_softmax and masked:
                add("bwd.softmax", "mask", "load", mask_bytes)
            add("bwd.softmax", "dS", "store", s_bytes)
            if not fused_softmax:
                fl["bwd.softmax"] = (0 * SS, C["naive_softmax_bwd_per_score"] * SS)
                add("bwd.scale_mask", "dS", "load", s_bytes)
                if masked:
                    add("bwd.scale_mask", "mask", "load", mask_bytes)
                add("bwd.scale_mask", "dS", "store", s_bytes)
                fl["bwd.scale_mask"] = (0 * SS, (C["naive_scale_per_score"] + mflag * C["mask_per_score"]) * SS)
            else:
                fl["bwd.softmax"] = (0 * SS, (C["naive_softmax_bwd_per_score"] + C["naive_scale_per_score"]
                                              + mflag * C["mask_per_score"]) * SS)
            add("bwd.dq", "dS", "load", s_bytes)
            add("bwd.dq", "K", "load", Nk * d * e)
            add("bwd.dq", "dQ", "store", Nq * d * e)
            fl["bwd.dq"] = (2 * d * SS, 0 * SS)
            add("bwd.dk", "dS", "load", s_bytes)
            add("bwd.dk", "Q", "load", Nq * d * e)
            add("bwd.dk", dk, "store", Nk * d * e)
            fl["bwd.dk"] = (2 * d * SS, 0 * SS)
    else:
        raise ValueError(f"unknown schedule/pass {schedule!r}/{pass_name!r}")
    return b, fl



def naive_variant_kernels(variant: str, pass_name: str, Nq, Nk, d, e, *, causal=False,
                          exp_flops=EXP_FLOPS) -> list:
    """The kernel sequence PyTorch runs for a naive ``variant`` (torch 2.11; from the kernel
    lists Nsight Compute recorded in ``results/h200_sweep_20261122.json``, see docs/model.md).

    Returns ``[(phase, loads, stores, matmul_flops, other_flops, shared), ...]`` per (batch,
    head) slice; ``loads``/``stores`` are ``[(tensor, kind, bytes_per_element)]`` with kind
    "q" (Nq x d), "k" (Nk x d), "s" (Nq x Nk) or "r" (Nq); ``shared`` kernels run once for the
    whole workload (the causal mask, shared by every batch and head).

    "math" (``_scaled_dot_product_attention_math`` + ``_safe_softmax``), everything float32:
    half inputs upcast (``fwd.upcast``: Q, K, V; ``bwd.upcast``: dO) and results downcast
    (``fwd.downcast``: the attention weights P, which SDPA discards, and O; ``bwd.downcast``:
    dQ, dK, dV); q and k scaled by sqrt(scale) (O(N d)); S = Q K^T; causal: a boolean tril mask
    built once, turned into a float additive mask once, added to S; softmax; the fully-masked-row
    fix-up (isneginf(S), all(-1), where(row, 0, P)); O = P V. Backward: dV, dP, a binary
    elementwise pass (the gradient through ``where``), softmax backward, dQ, dK, and the
    sqrt(scale) of dq and dk. The ``where`` reads its row flag broadcast: counted as the Nq-byte
    tensor it is (the LSU counter sees 1 byte per score).

    "eager": S = Q K^T, S *= scale, causal: ``masked_fill`` with a boolean mask, softmax,
    O = P V, in the input dtype. Backward: dV, dP, the binary pass, softmax backward, causal:
    ``masked_fill`` backward, dS *= scale, dQ, dK.
    """
    SS = Nq * Nk
    C = flop_costs(exp_flops)
    ks = []

    def k(phase, loads, stores, mm=0, other=0, shared=False):
        ks.append((phase, loads, stores, mm, other, shared))

    if variant == "math":
        c = 4
        half = e != 4
        q, kk, v = ("Qf", "Kf", "Vf") if half else ("Q", "K", "V")
        if pass_name == "fwd":
            if half:
                k("fwd.upcast", [("Q", "q", e), ("K", "k", e), ("V", "k", e)],
                  [(q, "q", c), (kk, "k", c), (v, "k", c)])
            k("fwd.scale_q", [(q, "q", c)], [("Qs", "q", c)], 0, Nq * d)
            k("fwd.scale_k", [(kk, "k", c)], [("Ks", "k", c)], 0, Nk * d)
            k("fwd.qk", [("Qs", "q", c), ("Ks", "k", c)], [("S", "s", c)], 2 * d * SS)
            if causal:
                k("fwd.mask_build", [], [("mask", "s", 1)], 0, SS, True)
                k("fwd.mask_float", [("mask", "s", 1)], [("mask_f", "s", c)], 0, SS, True)
                k("fwd.add_mask", [("S", "s", c), ("mask_f", "s", c)], [("S", "s", c)], 0, SS)
            k("fwd.softmax", [("S", "s", c)], [("P", "s", c)], 0, C["naive_softmax_per_score"] * SS)
            k("fwd.isneginf", [("S", "s", c)], [("neginf", "s", 1)], 0, SS)
            k("fwd.all", [("neginf", "s", 1)], [("row_all", "r", 1)], 0, SS)
            k("fwd.where", [("P", "s", c), ("row_all", "r", 1)], [("P", "s", c)], 0, SS)
            k("fwd.pv", [("P", "s", c), (v, "k", c)], [("Of" if half else "O", "q", c)], 2 * d * SS)
            if half:
                k("fwd.downcast", [("P", "s", c), ("Of", "q", c)], [("Ph", "s", e), ("O", "q", e)])
        else:
            do = "dOf" if half else "dO"
            if half:
                k("bwd.upcast", [("dO", "q", e)], [(do, "q", c)])
            k("bwd.dv", [("P", "s", c), (do, "q", c)], [("dVf" if half else "dV", "k", c)], 2 * d * SS)
            k("bwd.dp", [(do, "q", c), (v, "k", c)], [("dP", "s", c)], 2 * d * SS)
            k("bwd.binary", [("dP", "s", c), ("P", "s", c)], [("dP", "s", c)], 0, SS)
            k("bwd.softmax", [("P", "s", c), ("dP", "s", c)], [("dS", "s", c)], 0,
              C["naive_softmax_bwd_per_score"] * SS)
            k("bwd.dq", [("dS", "s", c), ("Ks", "k", c)], [("dQs", "q", c)], 2 * d * SS)
            k("bwd.dk", [("dS", "s", c), ("Qs", "q", c)], [("dKs", "k", c)], 2 * d * SS)
            k("bwd.scale_dq", [("dQs", "q", c)], [("dQf" if half else "dQ", "q", c)], 0, Nq * d)
            k("bwd.scale_dk", [("dKs", "k", c)], [("dKf" if half else "dK", "k", c)], 0, Nk * d)
            if half:
                k("bwd.downcast", [("dQf", "q", c), ("dKf", "k", c), ("dVf", "k", c)],
                  [("dQ", "q", e), ("dK", "k", e), ("dV", "k", e)])
    elif variant == "eager":
        if pass_name == "fwd":
            k("fwd.qk", [("Q", "q", e), ("K", "k", e)], [("S", "s", e)], 2 * d * SS)
            k("fwd.scale", [("S", "s", e)], [("S", "s", e)], 0, C["naive_scale_per_score"] * SS)
            if causal:
                k("fwd.masked_fill", [("S", "s", e), ("mask", "s", 1)], [("S", "s", e)], 0,
                  C["mask_per_score"] * SS)
            k("fwd.softmax", [("S", "s", e)], [("P", "s", e)], 0, C["naive_softmax_per_score"] * SS)
            k("fwd.pv", [("P", "s", e), ("V", "k", e)], [("O", "q", e)], 2 * d * SS)
        else:
            k("bwd.dv", [("P", "s", e), ("dO", "q", e)], [("dV", "k", e)], 2 * d * SS)
            k("bwd.dp", [("dO", "q", e), ("V", "k", e)], [("dP", "s", e)], 2 * d * SS)
            k("bwd.binary", [("dP", "s", e), ("P", "s", e)], [("dP", "s", e)], 0, SS)
            k("bwd.softmax", [("P", "s", e), ("dP", "s", e)], [("dS", "s", e)], 0,
              C["naive_softmax_bwd_per_score"] * SS)
            if causal:
                k("bwd.masked_fill", [("dS", "s", e), ("mask", "s", 1)], [("dS", "s", e)], 0,
                  C["mask_per_score"] * SS)
            k("bwd.scale", [("dS", "s", e)], [("dS", "s", e)], 0, C["naive_scale_per_score"] * SS)
            k("bwd.dq", [("dS", "s", e), ("K", "k", e)], [("dQ", "q", e)], 2 * d * SS)
            k("bwd.dk", [("dS", "s", e), ("Q", "q", e)], [("dK", "k", e)], 2 * d * SS)
    else:
        raise ValueError(f"unknown naive variant {variant!r}")
    return ks


def naive_kind_elems(kind, Nq, Nk, d):
    """Elements of a tensor of :func:`naive_variant_kernels` kind "q", "k", "s" or "r"."""
    return {"q": Nq * d, "k": Nk * d, "s": Nq * Nk, "r": Nq}[kind]


def check_naive_variant(w: Workload, variant) -> None:
    """ValueError unless the naive ``variant`` models ``w`` (dense or causal, no dropout, no GQA)."""
    if variant is None:
        return
    if (w.dropout or w.key_lengths is not None or w.block_sparse or w.heads != w.heads_kv
            or w.window_size is not None):
        raise ValueError(f"naive variant {variant!r} models dense or causal attention without "
                         "dropout, key padding, block masks, a sliding window or GQA")

def reduce_terms(batch, heads, heads_kv, Nk, d, e):
    """GQA/MQA: the kernel writes dK/dV per query head; a reduction sums each group (as
    FlashAttention-2's interface does). Zero when heads == heads_kv."""
    b = {("bwd.reduce", "dK_exp", "load"): batch * heads * Nk * d * e,
         ("bwd.reduce", "dV_exp", "load"): batch * heads * Nk * d * e,
         ("bwd.reduce", "dK", "store"): batch * heads_kv * Nk * d * e,
         ("bwd.reduce", "dV", "store"): batch * heads_kv * Nk * d * e}
    return b, {"bwd.reduce": (0 * d, 2 * batch * heads * Nk * d)}


def _accumulate(total_b, total_f, b, fl, mult):
    for k, v in b.items():
        total_b[k] = total_b.get(k, 0) + mult * v
    for k, (mm, ot) in fl.items():
        a, o = total_f.get(k, (0, 0))
        total_f[k] = (a + mult * mm, o + mult * ot)


def workload_tile_stats(w: Workload, block_q: int, block_k: int):
    """[(multiplicity, TileStats)] over all (b, h) slices of a tiled schedule."""
    if w.key_lengths is None and not w.block_sparse:
        return [(w.batch * w.heads, tile_stats_closed(w.seq_len_q, w.seq_len_k, block_q, block_k, w.causal,
                                                      w.window_size))]
    return [(mult, tile_stats_blockinfo(bi, key_len)) for mult, bi, key_len, _ in block_infos(w, block_q, block_k)]


def closed_form(w: Workload, schedule, block_q=None, block_k=None):
    """Exact counts of a workload under a schedule: ``(bytes, flops)`` dicts as :func:`slice_terms`,
    summed over all (batch, head) slices and passes (phases are prefixed fwd/bwd)."""
    name = schedule.name if hasattr(schedule, "name") else schedule
    fused = getattr(schedule, "fused_softmax", False)
    exp_flops = getattr(schedule, "exp_flops", EXP_FLOPS)
    dq_mode = getattr(schedule, "dq_mode", "atomic")
    variant = getattr(schedule, "variant", None)
    simt = bool(getattr(schedule, "simt", False))
    tpr = schedule.threads_per_row(block_k) if simt else 1
    store_amp = (1, 1)
    if simt:
        store_amp = (store_sector_amplification(tpr, w.dtype_bytes) if schedule.micro_tile is not None else 1,
                     store_sector_amplification(schedule.kv_threads_per_row(block_q), w.dtype_bytes)
                     if schedule.micro_tile_kv is not None else 1)
    q_amp = segment_amplification(getattr(schedule, "qo_segment_bytes", None))
    store_amp = (max(store_amp[0], q_amp), store_amp[1])
    delta_kernel = getattr(schedule, "delta_kernel", "warp")
    gqa = w.heads != w.heads_kv
    tb: dict = {}
    tf: dict = {}
    if name == "naive" and variant is not None:
        check_naive_variant(w, variant)
        BH = w.batch * w.heads
        for p in w.passes:
            b, fl = {}, {}
            for phase, loads, stores, mm, other, shared in naive_variant_kernels(
                    variant, p, w.seq_len_q, w.seq_len_k, w.head_dim, w.dtype_bytes,
                    causal=w.causal, exp_flops=exp_flops):
                mult = 1 if shared else BH
                for op, lst in (("load", loads), ("store", stores)):
                    for t, kind, width in lst:
                        key = (phase, t, op)
                        b[key] = b.get(key, 0) + mult * naive_kind_elems(kind, w.seq_len_q, w.seq_len_k, w.head_dim) * width
                fl[phase] = (mult * mm, mult * other)
            _accumulate(tb, tf, b, fl, 1)
        return tb, tf
    if name == "naive":
        groups = [(w.batch * w.heads, None)]
    else:
        if block_q is None or block_k is None:
            raise ValueError("closed_form of a tiled schedule needs block_q and block_k")
        groups = workload_tile_stats(w, block_q, block_k)
    for p in w.passes:
        for mult, st in groups:
            b, fl = slice_terms(name, p, st, w.seq_len_q, w.seq_len_k, w.head_dim, w.dtype_bytes,
                                masked=w.masked, dropout=w.dropout, fused_softmax=fused,
                                gqa=gqa and p == "bwd", exp_flops=exp_flops,
                                dq_mode=dq_mode, simt=simt, threads_per_row=tpr,
                                delta_kernel=delta_kernel, store_amp=store_amp, q_load_amp=q_amp)
            _accumulate(tb, tf, b, fl, mult)
        if p == "bwd" and gqa:
            b, fl = reduce_terms(w.batch, w.heads, w.heads_kv, w.seq_len_k, w.head_dim, w.dtype_bytes)
            _accumulate(tb, tf, b, fl, 1)
    return tb, tf


def summarise(bytes_by_key: dict, flops_by_phase: dict) -> dict:
    """Totals: hbm_read_bytes (loads), hbm_write_bytes (stores + atomics), matmul/other FLOPs, and
    per-phase splits (``phases``: {phase: {hbm_read_bytes, hbm_write_bytes, matmul_flops,
    other_flops}})."""
    phases: dict = {}
    for (phase, _t, op), v in bytes_by_key.items():
        p = phases.setdefault(phase, {"hbm_read_bytes": 0, "hbm_write_bytes": 0, "matmul_flops": 0, "other_flops": 0})
        p["hbm_read_bytes" if op == "load" else "hbm_write_bytes"] += v
    for phase, (mm, ot) in flops_by_phase.items():
        p = phases.setdefault(phase, {"hbm_read_bytes": 0, "hbm_write_bytes": 0, "matmul_flops": 0, "other_flops": 0})
        p["matmul_flops"] += mm
        p["other_flops"] += ot
    tot = {k: sum(p[k] for p in phases.values()) for k in
           ("hbm_read_bytes", "hbm_write_bytes", "matmul_flops", "other_flops")}
    tot["phases"] = phases
    return tot
