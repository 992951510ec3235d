"""Tensor-core FlashAttention-2 backward for float16/bfloat16 CUDA inputs (Numba + inline PTX).

This module owns the half-precision backward kernels and their host entry point `backward`,
which has the signature of the package's `kernels.backward` contract. Two kernels, each shaped
like the forward of `kernels.flash_mma_fwd` (operands in registers, no shared-memory round trip
of P or dS, no atomics):

* **dQ kernel** (runs first), grid (n_blocks_q, B * Hq): each warp owns 16 query rows and keeps
  the Q and dO fragments (A operands) and its dQ accumulator in registers. In its prologue it
  computes delta_i = sum_c dO_ic O_ic for its rows (the pre-pass, fused: O is read once) and
  writes it for the second kernel. It then streams the K/V tiles of
  `BlockInfo.kv_schedule()` through double-buffered shared memory (``cp.async``) and, per tile:
  S = Q K^T, P = exp2(S * scale * log2(e) - lse * log2(e)), dP = dO V^T (B from V,
  ``ldmatrix`` non-transposed), dS = P * (dP * Z - delta), dQ += dS K (dS rounded to half in
  registers as the A operand, B from K via ``ldmatrix.trans``). dQ = scale * dQ at the end.
* **dK/dV kernel**, grid (n_blocks_k, B * Hkv): each warp owns 16 key rows and keeps the K and
  V fragments and its dK and dV accumulators in registers, in the transposed orientation. It
  loops over the query heads of the GQA group and, for each, over the Q tiles of
  `BlockInfo.q_schedule()`; Q and dO tiles (double-buffered, ``cp.async``) are consumed in
  16-query steps: S^T = K Q^T, P^T (as above, lse / delta per query column), dV += (P^T * Z) dO,
  dP^T = V dO^T, dS^T = P^T * (dP^T * Z - delta), dK += dS^T Q; dK = scale * dK at the end.

Both grids are (tiles, batch*heads); which block works on which (tile, head) is the launch order
of `kernels.tile_order`: tiles first, or, under a causal mask, heads first within groups of
four heads (`tile_order.DEFAULT_HEAD_GROUP`, measured by `python -m kernels.tune_order`).

Here Z = keep / (1 - p) is the dropout factor regenerated from the `ioaware.dropout` hash
(Z = 1 without dropout) and delta = rowsum(dO * O) with O the dropped-out output, so
delta = rowsum(P * dP * Z). The two kernels recompute S and P (and dP) each: seven matmul-sized
passes instead of FlashAttention-2's five, the price of writing dQ without float32 atomics.
All products accumulate in float32; P and dS are rounded to the input dtype before their mma
(as FlashAttention-2 does); dQ, dK, dV are written in the input dtype.

Supported: head_dim 64 and 128, float16 (NumPy, Numba or torch arrays) and bfloat16 (torch),
causal, boolean masks, block-sparse masks whose tiles are multiples of 16, dropout, GQA/MQA,
Nq != Nk. `accepts` says False for everything else (and under the CUDA simulator, which runs no
inline PTX), so `kernels.backward` keeps those on the float32 CUDA-core kernels.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ioaware.block_info import BlockInfo, cdiv

from . import fastlaunch, tile_order
from .flash_mma_fwd import (_device_const, _device_helpers, _kind, _score_mask, check_problem,
                            dropout_constants, mask_on_device)

__all__ = ["backward", "accepts", "SUPPORTED_HEAD_DIMS", "default_tiles", "kernel_tiles",
           "refine_block_mask", "dq_smem_bytes", "dkdv_smem_bytes", "get_dq_kernel",
           "get_dkdv_kernel"]

SUPPORTED_HEAD_DIMS = (64, 128)
SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory per block without opt-in
LOG2E = 1.4426950408889634


def default_tiles(head_dim: int) -> dict:
    """Default kernel tiles: ``dq`` = (query rows per block, keys per stage) of the dQ kernel,
    ``dkdv`` = (key rows per block, queries per stage) of the dK/dV kernel. 16 rows per warp;
    the stage sizes keep two buffers of two tiles within 48 KiB of static shared memory."""
    if head_dim <= 64:
        return {"dq": (64, 64), "dkdv": (64, 64)}
    return {"dq": (64, 32), "dkdv": (64, 16)}


def dq_smem_bytes(head_dim: int, block_k: int) -> int:
    """Shared memory of one dQ block: K and V, two buffers each, rows padded by 8 halves."""
    return 4 * block_k * (head_dim + 8) * 2


def k_in_shared(head_dim: int) -> bool:
    """Whether the dK/dV kernel reads K from shared memory (d=128: K and V fragments plus the
    dK and dV accumulators in registers would spill) instead of holding its fragments."""
    return head_dim > 64


def dkdv_smem_bytes(head_dim: int, block_q: int, block_k: int = 64) -> int:
    """Shared memory of one dK/dV block: Q and dO, two buffers each (and the K tile where
    `k_in_shared`), rows padded by 8 halves, plus lse / delta of two stages."""
    rows = 4 * block_q + (block_k if k_in_shared(head_dim) else 0)
    return rows * (head_dim + 8) * 2 + 16 * block_q


def kernel_tiles(head_dim: int, block_q=None, block_k=None, has_block_mask=False):
    """The (dq, dkdv) tiles for a call, or None when no tiling fits.

    Without a block mask, ``block_q``/``block_k`` do not change the result and the defaults are
    used. With one, every kernel tile must divide the mask's tile (block_q, block_k) so that a
    kernel tile lies inside one mask tile: the largest of 64 / 32 / 16 (no larger than the
    default) that divides it is taken.
    """
    return tiles_for_block_mask(default_tiles, SUPPORTED_HEAD_DIMS, head_dim, block_q, block_k,
                                has_block_mask)


def tiles_for_block_mask(default_tiles, head_dims, head_dim, block_q, block_k, has_block_mask):
    """`kernel_tiles` for a backward whose default tiles are ``default_tiles(head_dim)`` (a dict
    with "dq" and "dkdv") and whose head dims are ``head_dims``; shared by both tensor-core
    backwards."""
    if head_dim not in head_dims:
        return None
    dflt = default_tiles(head_dim)
    if not has_block_mask:
        return dflt["dq"], dflt["dkdv"]
    if block_q is None or block_k is None:
        return None

    def pick(limit, block):
        for t in (64, 32, 16):
            if t <= limit and block % t == 0:
                return t
        return None

    dq = (pick(dflt["dq"][0], block_q), pick(dflt["dq"][1], block_k))
    kv = (pick(dflt["dkdv"][0], block_k), pick(dflt["dkdv"][1], block_q))
    if None in dq or None in kv:
        return None
    return dq, kv


def refine_block_mask(block_mask, block_q, block_k, n_q, n_k, tile_q, tile_k):
    """The block mask [Bb, Hb, cdiv(n_q, block_q), cdiv(n_k, block_k)] at the finer tiles
    (tile_q, tile_k), which must divide (block_q, block_k): a fine tile is computed iff the
    coarse tile it lies in is."""
    bm = np.asarray(block_mask, dtype=bool)
    if block_q % tile_q or block_k % tile_k:
        raise ValueError(f"tiles ({tile_q}, {tile_k}) must divide the block mask's tiles "
                         f"({block_q}, {block_k})")
    iq = (np.arange(cdiv(n_q, tile_q)) * tile_q) // block_q
    ik = (np.arange(cdiv(n_k, tile_k)) * tile_k) // block_k
    return bm[:, :, iq][:, :, :, ik]


_KERNELS: dict = {}


def get_dq_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
                  head_group=None):
    """The compiled-on-first-launch dQ kernel for one configuration (cached); ``head_group``
    (the launch order, `kernels.tile_order`) defaults to `tile_order.head_group`."""
    if head_group is None:
        head_group = tile_order.head_group(causal, "bwd")
    key = ("dq", head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
           int(head_group))
    if key not in _KERNELS:
        _KERNELS[key] = _build_dq_kernel(*key[1:])
    return _KERNELS[key]


def get_dkdv_kernel(head_dim, block_k, block_q, is_bf16, causal, has_mask, has_dropout,
                    head_group=None):
    """The compiled-on-first-launch dK/dV kernel (``block_k`` key rows per block, ``block_q``
    queries per stage) for one configuration (cached); as `get_dq_kernel`."""
    if head_group is None:
        head_group = tile_order.head_group(causal, "bwd")
    key = ("dkdv", head_dim, block_k, block_q, is_bf16, causal, has_mask, has_dropout,
           int(head_group))
    if key not in _KERNELS:
        _KERNELS[key] = _build_dkdv_kernel(*key[1:])
    return _KERNELS[key]


def _dq_row_stats(has_dropout):
    """``dq_row_stats``: the dQ kernels' per-row values for a thread's two rows (``row0``,
    ``row0 + 8``): delta = rowsum(dO * O) reduced over the row's four threads from the partial
    sums ``dsum`` (and written to ``delta`` by thread 0 of the four), lse as log2 (+inf
    outside [0, n_q) and for fully masked rows, so that P = 0), and the rows' dropout hashes."""
    from numba import cuda, float32, uint64
    HAS_DROPOUT = has_dropout
    NEG_INF = float32(-math.inf)
    POS_INF = float32(math.inf)
    fmix = _device_helpers()

    @cuda.jit(device=True, inline=True)
    def dq_row_stats(dsum, delta_r, lse2_r, h_row, row0, tig, b, h, bh, n_q, lse, delta,
                     seed_hash):
        h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
        for r in range(2):
            t = dsum[r]
            t += cuda.shfl_xor_sync(0xFFFFFFFF, t, 1)
            t += cuda.shfl_xor_sync(0xFFFFFFFF, t, 2)
            delta_r[r] = t
            row = row0 + 8 * r
            l2 = POS_INF                                     # P = 0 outside [0, n_q)
            if row < n_q:
                if tig == 0:
                    delta[b, h, row] = t
                lv = lse[b, h, row]
                if lv != NEG_INF:                            # fully masked row: P = 0
                    l2 = lv * float32(LOG2E)
            lse2_r[r] = l2
            h_row[r] = uint64(0)
            if HAS_DROPOUT:
                h_row[r] = fmix(h_bh ^ uint64(row))

    return dq_row_stats


def _transposed_score_mask(n_tiles, causal, has_mask):
    """``mask_scores_t``: -inf on the dK/dV kernels' transposed score tiles S^T (``n_tiles``
    16x8 C fragments in ``st``; keys ``key0`` and ``key0 + 8`` down, queries from ``qc0``
    across) above the causal diagonal or on a False of the boolean mask."""
    from numba import cuda, float32
    NT, CAUSAL, HAS_MASK = n_tiles, causal, has_mask
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline=True)
    def mask_scores_t(st, qc0, key0, b, h, n_q, n_k, mask, mask_b, mask_h, mask_q):
        for nt in range(NT):
            for i in range(4):
                qcol = qc0 + 8 * nt + (i & 1)
                key = key0 + 8 * (i >> 1)
                bad = False
                if CAUSAL:
                    bad = key > qcol
                if HAS_MASK:
                    if not bad and qcol < n_q and key < n_k:
                        bad = mask[b * mask_b, h * mask_h, qcol * mask_q, key] == 0
                if bad:
                    st[nt * 4 + i] = NEG_INF

    return mask_scores_t


def _dkdv_row_helpers(block_q, threads):
    """Device functions of the dK/dV kernels (half-precision and 3xTF32): ``stage_rows`` puts a
    Q tile's lse (as log2, +inf outside [0, n_q) and for fully masked rows, so that P = 0) and
    delta into shared memory; ``locate`` maps item t of the sweep over (query head of the GQA
    group, Q tile) to (h, m_blk)."""
    from numba import cuda, float32, int32
    BQ, THREADS = block_q, threads
    NEG_INF = float32(-math.inf)
    POS_INF = float32(math.inf)

    @cuda.jit(device=True, inline=True)
    def stage_rows(lse, delta, b, h, row_start, nq, rowv, base, tid):
        # -- lse2 (+inf outside [0, n_q) and for fully masked rows: P = 0) and delta --
        for r in range(tid, BQ, THREADS):
            row = row_start + r
            l2 = POS_INF
            dl = float32(0.0)
            if row < nq:
                lv = lse[b, h, row]
                if lv != NEG_INF:
                    l2 = lv * float32(LOG2E)
                dl = delta[b, h, row]
            rowv[base + r] = l2
            rowv[base + BQ + r] = dl

    @cuda.jit(device=True, inline=True)
    def locate(t, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk):
        # -- item t of the sweep over (query head of the group, Q tile) -> (h, m_blk) --
        h_out = int32(-1)
        m_out = int32(0)
        for g in range(group):
            h = hk * group + g
            s = b * sched_b + h * sched_h
            lo = offsets[s, n_blk]
            cnt = offsets[s, n_blk + 1] - lo
            if h_out < 0:
                if t < cnt:
                    h_out = h
                    m_out = q_index[lo + t]
                else:
                    t -= cnt
        return h_out, m_out

    return stage_rows, locate


def _build_dq_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
                     head_group):
    from numba import cuda, float32, uint16, uint32, uint64

    from kernels import mma as X

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + 8                      # halves per shared row (16-byte pad)
    TILE = BK * STRIDE                  # halves per K or V buffer
    SMEM_HALVES = 4 * TILE              # K0 | V0 | K1 | V1
    CHUNKS = D // 8                     # 16-byte chunks per row
    LOADS = cdiv(BK * CHUNKS, THREADS)  # cp.async per thread per K (or V) tile
    KC = D // 16                        # k-steps over the head dim
    NT_S = BK // 8                      # 16x8 score tiles per warp
    KC_P = BK // 16                     # k-steps of dQ += dS K
    NT_O = D // 8                       # 16x8 dQ tiles per warp
    A_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4
    assert BQ % 16 == 0 and BK % 16 == 0 and D % 16 == 0
    mma_op = X.mma_bf16 if is_bf16 else X.mma_f16
    pack = X.pack_bf16x2 if is_bf16 else X.pack_f16x2
    unpack = X.unpack_bf16x2 if is_bf16 else X.unpack_f16x2
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    fmix = _device_helpers()
    mask_scores = _score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK)
    dq_row_stats = _dq_row_stats(HAS_DROPOUT)

    @cuda.jit(device=True, inline=True)
    def load_tile(src, b, hk, key0, nk, smem, base, tid):
        # -- cp.async one K or V tile: BK rows x D halves, 16 bytes a thread a step --
        for i in range(LOADS):
            c = tid + i * THREADS
            if c < BK * CHUNKS:
                r = c // CHUNKS
                ch = c % CHUNKS
                key = key0 + r
                ok = key < nk
                g = X.global_addr(src, b, hk, key if ok else 0, ch * 8)
                X.cp_async_16(X.shared_addr(smem, base + r * STRIDE + ch * 8), g,
                              uint32(16) if ok else uint32(0))

    tile_and_head = tile_order.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, dout, lse, delta, dq, offsets, kv_index, sched_b, sched_h, group,
               n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash, threshold,
               inv_keep):
        smem = cuda.shared.array(SMEM_HALVES, dtype=uint16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        tile, bh, n_blocks_q = tile_and_head()
        m_blk = n_blocks_q - 1 - tile                       # longest (causal) tiles first
        n_heads = dq.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        s = (b * sched_b + h * sched_h)
        row0 = m_blk * BQ + warp * 16 + gid                  # rows row0 and row0 + 8

        # -- Q and dO fragments (A operands) into registers; delta = rowsum(dO * O) --
        qf = cuda.local.array(A_REGS, dtype=uint32)
        dof = cuda.local.array(A_REGS, dtype=uint32)
        dsum = cuda.local.array(2, dtype=float32)
        dsum[0] = float32(0.0)
        dsum[1] = float32(0.0)
        for kc in range(KC):
            for r in range(4):
                row = row0 + 8 * (r & 1)
                col = kc * 16 + 2 * tig + 8 * (r >> 1)
                qv = uint32(0)
                dv = uint32(0)
                if row < n_q:
                    qv = X.ld_global_u32(X.global_addr(q, b, h, row, col))
                    dv = X.ld_global_u32(X.global_addr(dout, b, h, row, col))
                    ov = X.ld_global_u32(X.global_addr(out, b, h, row, col))
                    o2 = unpack(ov)
                    d2 = unpack(dv)
                    dsum[r & 1] += o2[0] * d2[0] + o2[1] * d2[1]
                qf[kc * 4 + r] = qv
                dof[kc * 4 + r] = dv
        delta_r = cuda.local.array(2, dtype=float32)
        lse2_r = cuda.local.array(2, dtype=float32)
        h_row = cuda.local.array(2, dtype=uint64)
        dq_row_stats(dsum, delta_r, lse2_r, h_row, row0, tig, b, h, bh, n_q, lse, delta,
                     seed_hash)

        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        dp_reg = cuda.local.array(S_REGS, dtype=float32)

        # per-lane ldmatrix offsets (halves): non-transposed rows of K / V, transposed K
        b_lane = (lane % 8 + 8 * (lane // 16)) * STRIDE + 8 * ((lane // 8) % 2)
        t_lane = (lane % 8 + 8 * ((lane // 8) % 2)) * STRIDE + 8 * (lane // 16)

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k, b, hk, n0 * BK, n_k, smem, 0, tid)
            load_tile(v, b, hk, n0 * BK, n_k, smem, TILE, tid)
            X.cp_async_commit()

        for it in range(start, stop):
            buf = ((it - start) & 1) * 2 * TILE
            n_blk = kv_index[it]
            if it + 1 < stop:
                nxt = kv_index[it + 1]
                nbuf = 2 * TILE - buf
                load_tile(k, b, hk, nxt * BK, n_k, smem, nbuf, tid)
                load_tile(v, b, hk, nxt * BK, n_k, smem, nbuf + TILE, tid)
                X.cp_async_commit()
                X.cp_async_wait_1()
            else:
                X.cp_async_wait_all()
            cuda.syncthreads()

            # -- compute qk and dO V^T: one ldmatrix of K (V) feeds two mma --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
                dp_reg[i] = float32(0.0)
            k_addr = X.shared_addr(smem, buf + b_lane)
            v_addr = X.shared_addr(smem, buf + TILE + b_lane)
            for kc in range(KC):
                a = kc * 4
                for ntp in range(NT_S // 2):
                    j = 8 * ntp
                    off = 2 * (16 * ntp * STRIDE + 16 * kc)
                    bk = X.ldmatrix_x4(k_addr + off)
                    d0 = mma_op(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk[0], bk[1],
                                s_reg[j], s_reg[j + 1], s_reg[j + 2], s_reg[j + 3])
                    d1 = mma_op(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk[2], bk[3],
                                s_reg[j + 4], s_reg[j + 5], s_reg[j + 6], s_reg[j + 7])
                    for i in range(4):
                        s_reg[j + i] = d0[i]
                        s_reg[j + 4 + i] = d1[i]
                    bv = X.ldmatrix_x4(v_addr + off)
                    e0 = mma_op(dof[a], dof[a + 1], dof[a + 2], dof[a + 3], bv[0], bv[1],
                                dp_reg[j], dp_reg[j + 1], dp_reg[j + 2], dp_reg[j + 3])
                    e1 = mma_op(dof[a], dof[a + 1], dof[a + 2], dof[a + 3], bv[2], bv[3],
                                dp_reg[j + 4], dp_reg[j + 5], dp_reg[j + 6], dp_reg[j + 7])
                    for i in range(4):
                        dp_reg[j + i] = e0[i]
                        dp_reg[j + 4 + i] = e1[i]

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            mask_scores(s_reg, 0, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                        mask_h, mask_q)

            # -- P = exp2(S * scale * log2e - lse2), dS = P * (dP * Z - delta) --
            for nt in range(NT_S):
                for i in range(4):
                    e = nt * 4 + i
                    r = i >> 1
                    p = X.ex2(s_reg[e] * scale_log2 - lse2_r[r])
                    dpv = dp_reg[e]
                    if HAS_DROPOUT:
                        col = col_base + nt * 8 + (i & 1)
                        keep = fmix(h_row[r] ^ uint64(col)) >= uint64(threshold)
                        dpv = dpv * inv_keep if keep else float32(0.0)
                    s_reg[e] = p * (dpv - delta_r[r])

            # -- dS to half in registers, dQ += dS K: one ldmatrix.trans of K feeds two mma --
            kt_addr = X.shared_addr(smem, buf + t_lane)
            for kcp in range(KC_P):
                j = 8 * kcp
                a0 = pack(s_reg[j], s_reg[j + 1])
                a1 = pack(s_reg[j + 2], s_reg[j + 3])
                a2 = pack(s_reg[j + 4], s_reg[j + 5])
                a3 = pack(s_reg[j + 6], s_reg[j + 7])
                for ntp in range(NT_O // 2):
                    bk = X.ldmatrix_x4_trans(kt_addr + 2 * (16 * kcp * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    d0 = mma_op(a0, a1, a2, a3, bk[0], bk[1],
                                acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                    d1 = mma_op(a0, a1, a2, a3, bk[2], bk[3],
                                acc[o + 4], acc[o + 5], acc[o + 6], acc[o + 7])
                    for i in range(4):
                        acc[o + i] = d0[i]
                        acc[o + 4 + i] = d1[i]
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        # -- epilogue: dQ = scale * acc as packed halves --
        for r in range(2):
            row = row0 + 8 * r
            if row < n_q:
                for nt in range(NT_O):
                    word = pack(acc[nt * 4 + 2 * r] * scale, acc[nt * 4 + 2 * r + 1] * scale)
                    X.st_global_u32(X.global_addr(dq, b, h, row, nt * 8 + 2 * tig), word)

    kernel.threads = THREADS
    return kernel


def _build_dkdv_kernel(head_dim, block_k, block_q, is_bf16, causal, has_mask, has_dropout,
                       head_group):
    from numba import cuda, float32, uint16, uint32, uint64

    from kernels import mma as X

    D = head_dim
    BK = block_k                        # key rows per block (16 per warp)
    BQ = block_q                        # queries per shared stage
    NUM_WARPS = BK // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + 8
    TILE = BQ * STRIDE                  # halves per Q or dO buffer
    KSMEM = k_in_shared(D)              # K fragments re-read from shared memory
    K_HALVES = BK * STRIDE if KSMEM else 0
    SMEM_HALVES = 4 * TILE + K_HALVES   # Q0 | dO0 | Q1 | dO1 (| K)
    ROWV = 4 * BQ                       # floats: lse2 | delta, two buffers
    CHUNKS = D // 8
    LOADS = cdiv(BQ * CHUNKS, THREADS)
    KC = D // 16                        # k-steps over the head dim
    STEPS = BQ // 16                    # 16-query steps per stage
    NT_O = D // 8                       # 16x8 dK / dV tiles per warp
    A_REGS, O_REGS = KC * 4, NT_O * 4
    KF_REGS = 4 if KSMEM else A_REGS
    K_LOADS = cdiv(BK * CHUNKS, THREADS)
    assert BQ % 16 == 0 and BK % 16 == 0 and D % 16 == 0
    mma_op = X.mma_bf16 if is_bf16 else X.mma_f16
    pack = X.pack_bf16x2 if is_bf16 else X.pack_f16x2
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    fmix = _device_helpers()

    @cuda.jit(device=True, inline=True)
    def load_tile(src, b, h, row_start, nq, smem, base, tid):
        # -- cp.async one Q or dO tile: BQ rows x D halves --
        for i in range(LOADS):
            c = tid + i * THREADS
            if c < BQ * CHUNKS:
                r = c // CHUNKS
                ch = c % CHUNKS
                row = row_start + r
                ok = row < nq
                g = X.global_addr(src, b, h, row if ok else 0, ch * 8)
                X.cp_async_16(X.shared_addr(smem, base + r * STRIDE + ch * 8), g,
                              uint32(16) if ok else uint32(0))

    stage_rows, locate = _dkdv_row_helpers(BQ, THREADS)
    mask_scores_t = _transposed_score_mask(2, CAUSAL, HAS_MASK)

    tile_and_head = tile_order.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, dout, lse, delta, dk, dv, offsets, q_index, sched_b, sched_h, group,
               n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash, threshold,
               inv_keep):
        smem = cuda.shared.array(SMEM_HALVES, dtype=uint16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        n_blk, bhk, _ = tile_and_head()                     # K tile 0 (causal: longest) first
        n_heads_kv = dk.shape[1]
        n_heads = n_heads_kv * group
        b = bhk // n_heads_kv
        hk = bhk % n_heads_kv
        key0 = n_blk * BK + warp * 16 + gid                  # key rows key0 and key0 + 8

        # -- K and V fragments (A operands) straight from global memory into registers --
        kf = cuda.local.array(KF_REGS, dtype=uint32)
        vf = cuda.local.array(A_REGS, dtype=uint32)
        for kc in range(KC):
            for r in range(4):
                key = key0 + 8 * (r & 1)
                col = kc * 16 + 2 * tig + 8 * (r >> 1)
                kv_ = uint32(0)
                vv = uint32(0)
                if key < n_k:
                    if not KSMEM:
                        kv_ = X.ld_global_u32(X.global_addr(k, b, hk, key, col))
                    vv = X.ld_global_u32(X.global_addr(v, b, hk, key, col))
                if not KSMEM:
                    kf[kc * 4 + r] = kv_
                vf[kc * 4 + r] = vv
        if KSMEM:
            # -- the block's K tile into shared memory (first cp.async group) --
            for i in range(K_LOADS):
                cidx = tid + i * THREADS
                if cidx < BK * CHUNKS:
                    r = cidx // CHUNKS
                    ch = cidx % CHUNKS
                    key = n_blk * BK + r
                    ok = key < n_k
                    g = X.global_addr(k, b, hk, key if ok else 0, ch * 8)
                    X.cp_async_16(X.shared_addr(smem, 4 * TILE + r * STRIDE + ch * 8), g,
                                  uint32(16) if ok else uint32(0))

        dk_acc = cuda.local.array(O_REGS, dtype=float32)
        dv_acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            dk_acc[i] = float32(0.0)
            dv_acc[i] = float32(0.0)
        st = cuda.local.array(8, dtype=float32)      # S^T, then P^T * Z: 16 keys x 16 queries
        dpt = cuda.local.array(8, dtype=float32)     # dP^T, then dS^T
        hash_c = cuda.local.array(4, dtype=uint64)   # dropout row hash per query column
        # per stage: lse * log2(e) (+inf where P = 0) and delta of its BQ queries
        rowv = cuda.shared.array(ROWV, dtype=float32)   # buf 0: lse2 | delta, buf 1: same

        b_lane = (lane % 8 + 8 * (lane // 16)) * STRIDE + 8 * ((lane // 8) % 2)
        t_lane = (lane % 8 + 8 * ((lane // 8) % 2)) * STRIDE + 8 * (lane // 16)
        # A fragments of this warp's 16 K rows (the Q pattern of kernels.fragments)
        k_addr = X.shared_addr(smem, 4 * TILE + warp * 16 * STRIDE + t_lane)

        n_items = 0
        for g in range(group):
            s = b * sched_b + (hk * group + g) * sched_h
            n_items += offsets[s, n_blk + 1] - offsets[s, n_blk]
        if n_items > 0:
            h, m_blk = locate(0, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk)
            load_tile(q, b, h, m_blk * BQ, n_q, smem, 0, tid)
            load_tile(dout, b, h, m_blk * BQ, n_q, smem, TILE, tid)
            X.cp_async_commit()
            stage_rows(lse, delta, b, h, m_blk * BQ, n_q, rowv, 0, tid)

        for t in range(n_items):
            buf = (t & 1) * 2 * TILE
            rbuf = (t & 1) * 2 * BQ
            h, m_blk = locate(t, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk)
            if t + 1 < n_items:
                h_n, m_n = locate(t + 1, offsets, q_index, b, hk, group, sched_b, sched_h, n_blk)
                nbuf = 2 * TILE - buf
                load_tile(q, b, h_n, m_n * BQ, n_q, smem, nbuf, tid)
                load_tile(dout, b, h_n, m_n * BQ, n_q, smem, nbuf + TILE, tid)
                X.cp_async_commit()
                stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 2 * BQ - rbuf, tid)
                X.cp_async_wait_1()
            else:
                X.cp_async_wait_all()
            cuda.syncthreads()

            bh = b * n_heads + h
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            needs_mask = HAS_MASK
            if CAUSAL:
                needs_mask = needs_mask or (n_blk * BK + BK - 1 > m_blk * BQ)
            q_addr = X.shared_addr(smem, buf + b_lane)
            qt_addr = X.shared_addr(smem, buf + t_lane)
            do_addr = X.shared_addr(smem, buf + TILE + b_lane)
            dot_addr = X.shared_addr(smem, buf + TILE + t_lane)
            for c in range(STEPS):
                qc0 = m_blk * BQ + 16 * c + 2 * tig       # query column of element (nt=0, i=0)
                if HAS_DROPOUT:
                    for u in range(4):
                        hash_c[u] = fmix(h_bh ^ uint64(qc0 + 8 * (u >> 1) + (u & 1)))

                # -- S^T = K Q^T and dP^T = V dO^T (16 keys x 16 queries each) --
                for i in range(8):
                    st[i] = float32(0.0)
                    dpt[i] = float32(0.0)
                for kc in range(KC):
                    a = kc * 4
                    off = 2 * (16 * c * STRIDE + 16 * kc)
                    if KSMEM:
                        ka = X.ldmatrix_x4(k_addr + 2 * 16 * kc)
                        for i in range(4):
                            kf[i] = ka[i]
                        a = 0
                    bq = X.ldmatrix_x4(q_addr + off)
                    d0 = mma_op(kf[a], kf[a + 1], kf[a + 2], kf[a + 3], bq[0], bq[1],
                                st[0], st[1], st[2], st[3])
                    d1 = mma_op(kf[a], kf[a + 1], kf[a + 2], kf[a + 3], bq[2], bq[3],
                                st[4], st[5], st[6], st[7])
                    a = kc * 4
                    bo = X.ldmatrix_x4(do_addr + off)
                    e0 = mma_op(vf[a], vf[a + 1], vf[a + 2], vf[a + 3], bo[0], bo[1],
                                dpt[0], dpt[1], dpt[2], dpt[3])
                    e1 = mma_op(vf[a], vf[a + 1], vf[a + 2], vf[a + 3], bo[2], bo[3],
                                dpt[4], dpt[5], dpt[6], dpt[7])
                    for i in range(4):
                        st[i] = d0[i]
                        st[4 + i] = d1[i]
                        dpt[i] = e0[i]
                        dpt[4 + i] = e1[i]

                # -- masks (causal diagonal, boolean mask) on S^T --
                if needs_mask:
                    mask_scores_t(st, qc0, key0, b, h, n_q, n_k, mask, mask_b, mask_h, mask_q)

                # -- P^T = exp2(S^T * scale * log2e - lse2), Z from the dropout hash,
                #    dS^T = P^T * (dP^T * Z - delta) --
                for nt in range(2):
                    for i in range(4):
                        e = nt * 4 + i
                        u = 2 * nt + (i & 1)
                        col = rbuf + 16 * c + 8 * nt + 2 * tig + (i & 1)
                        p = X.ex2(st[e] * scale_log2 - rowv[col])
                        z = float32(1.0)
                        if HAS_DROPOUT:
                            key = key0 + 8 * (i >> 1)
                            keep = fmix(hash_c[u] ^ uint64(key)) >= uint64(threshold)
                            z = inv_keep if keep else float32(0.0)
                        st[e] = p * z
                        dpt[e] = p * (dpt[e] * z - rowv[col + BQ])

                # -- dV += (P^T Z) dO: A = P^T in registers, B = dO via ldmatrix.trans --
                a0 = pack(st[0], st[1])
                a1 = pack(st[2], st[3])
                a2 = pack(st[4], st[5])
                a3 = pack(st[6], st[7])
                for ntp in range(NT_O // 2):
                    bo = X.ldmatrix_x4_trans(dot_addr + 2 * (16 * c * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    d0 = mma_op(a0, a1, a2, a3, bo[0], bo[1],
                                dv_acc[o], dv_acc[o + 1], dv_acc[o + 2], dv_acc[o + 3])
                    d1 = mma_op(a0, a1, a2, a3, bo[2], bo[3],
                                dv_acc[o + 4], dv_acc[o + 5], dv_acc[o + 6], dv_acc[o + 7])
                    for i in range(4):
                        dv_acc[o + i] = d0[i]
                        dv_acc[o + 4 + i] = d1[i]

                # -- dK += dS^T Q: A = dS^T in registers, B = Q via ldmatrix.trans --
                a0 = pack(dpt[0], dpt[1])
                a1 = pack(dpt[2], dpt[3])
                a2 = pack(dpt[4], dpt[5])
                a3 = pack(dpt[6], dpt[7])
                for ntp in range(NT_O // 2):
                    bq = X.ldmatrix_x4_trans(qt_addr + 2 * (16 * c * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    d0 = mma_op(a0, a1, a2, a3, bq[0], bq[1],
                                dk_acc[o], dk_acc[o + 1], dk_acc[o + 2], dk_acc[o + 3])
                    d1 = mma_op(a0, a1, a2, a3, bq[2], bq[3],
                                dk_acc[o + 4], dk_acc[o + 5], dk_acc[o + 6], dk_acc[o + 7])
                    for i in range(4):
                        dk_acc[o + i] = d0[i]
                        dk_acc[o + 4 + i] = d1[i]
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch
        X.cp_async_wait_all()    # (a block with no Q tile to visit still issued its K copy)

        # -- epilogue: dK = scale * dK_acc and dV as packed halves --
        for r in range(2):
            key = key0 + 8 * r
            if key < n_k:
                for nt in range(NT_O):
                    e = nt * 4 + 2 * r
                    col = nt * 8 + 2 * tig
                    X.st_global_u32(X.global_addr(dk, b, hk, key, col),
                                    pack(dk_acc[e] * scale, dk_acc[e + 1] * scale))
                    X.st_global_u32(X.global_addr(dv, b, hk, key, col),
                                    pack(dv_acc[e], dv_acc[e + 1]))

    kernel.threads = THREADS
    return kernel


# -- host side -----------------------------------------------------------------------------------
def accepts(q, k, v, block_q=None, block_k=None, block_mask=None) -> bool:
    """Whether `backward` takes these inputs: half-precision arrays on a real GPU (torch CUDA
    float16/bfloat16 tensors or Numba float16 device arrays), head_dim in SUPPORTED_HEAD_DIMS,
    and, with a block mask, mask tiles that the kernel tiles divide. For dispatching."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        kind = _kind(q)
    except TypeError:
        return False
    if kind == "torch":
        import torch
        if not (q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
                and k.dtype == q.dtype and v.dtype == q.dtype):
            return False
    elif kind == "numba":
        if {str(np.dtype(x.dtype)) for x in (q, k, v)} != {"float16"}:
            return False
    else:
        return False
    if len(q.shape) != 4:
        return False
    d = int(q.shape[-1])
    return kernel_tiles(d, block_q, block_k, block_mask is not None) is not None


def device_schedules(block_mask, block_q, block_k, n_q, n_k, dq_tile, kv_tile, causal, batch,
                     heads):
    """The two backward kernels' CSR schedules on the device (cached per configuration by
    `_device_const`): ``(kv, q)``, each ``(offsets, index, stride_b, stride_h)`` — the K/V
    tiles each dQ tile ``dq_tile = (rows, keys)`` visits, and the Q tiles each dK/dV tile
    ``kv_tile = (queries, keys)`` visits. Shared by both tensor-core backwards."""
    bm_key = None if block_mask is None else (np.shape(block_mask), block_q, block_k,
                                              np.asarray(block_mask, bool).tobytes())
    (dq_bq, dq_bk), (kv_bq, kv_bk) = dq_tile, kv_tile
    kv = _device_const(
        ("bwd-kv", n_q, n_k, dq_bq, dq_bk, bool(causal), batch, heads, bm_key),
        lambda: _schedules(block_mask, block_q, block_k, n_q, n_k, dq_bq, dq_bk, causal, batch,
                           heads, "kv"))
    q = _device_const(
        ("bwd-q", n_q, n_k, kv_bq, kv_bk, bool(causal), batch, heads, bm_key),
        lambda: _schedules(block_mask, block_q, block_k, n_q, n_k, kv_bq, kv_bk, causal, batch,
                           heads, "q"))
    return kv, q


def _schedules(block_mask, block_q, block_k, n_q, n_k, tile_q, tile_k, causal, batch, heads,
               which):
    """CSR schedules ("kv": K tiles per Q tile, "q": Q tiles per K tile) at the kernel tiles
    (tile_q, tile_k), one per (batch, head) slice of the block mask, stacked."""
    if block_mask is None:
        info = BlockInfo(n_q, n_k, tile_q, tile_k, causal)
        offs, idx = info.kv_schedule() if which == "kv" else info.q_schedule()
        return offs[None, :].astype(np.int32), idx.astype(np.int32), 0, 0
    bm = np.asarray(block_mask, dtype=bool)
    nbq, nbk = cdiv(n_q, block_q), cdiv(n_k, block_k)
    if bm.ndim != 4 or bm.shape[0] not in (1, batch) or bm.shape[1] not in (1, heads) \
            or bm.shape[2:] != (nbq, nbk):
        raise ValueError(f"block_mask must have shape [1 or {batch}, 1 or {heads}, {nbq}, {nbk}] "
                         f"for block_q={block_q}, block_k={block_k}, got {bm.shape}")
    fine = refine_block_mask(bm, block_q, block_k, n_q, n_k, tile_q, tile_k)
    offs_all, idx_all, base = [], [], 0
    for bb in range(fine.shape[0]):
        for hb in range(fine.shape[1]):
            info = BlockInfo.with_block_mask(n_q, n_k, tile_q, tile_k, causal, fine[bb, hb])
            offs, idx = info.kv_schedule() if which == "kv" else info.q_schedule()
            offs_all.append(offs + base)
            idx_all.append(idx)
            base += len(idx)
    idx = np.concatenate(idx_all) if base else np.zeros(1, np.int32)
    return (np.stack(offs_all).astype(np.int32), idx.astype(np.int32),
            fine.shape[1] if fine.shape[0] > 1 else 0, 1 if fine.shape[1] > 1 else 0)


def backward(q, k, v, out, lse, dout, *, scale, causal=False, mask=None, block_mask=None,
             dropout_p=0.0, seed=0, block_q=None, block_k=None):
    """Half-precision tensor-core attention backward: returns ``(dq, dk, dv)``.

    Same contract as `kernels.backward`: q, out, dout [B, Hq, Nq, d], k/v [B, Hkv, Nk, d],
    lse float32 [B, Hq, Nq] from the forward (natural log, -inf for a fully masked row);
    float16 (NumPy / Numba / torch) or bfloat16 (torch), d in {64, 128}. dq, dk, dv have the
    inputs' dtype and kind of memory; dk and dv are summed over the query heads of each GQA
    group. ``block_q``/``block_k`` are the block mask's tile shape (ignored without one: the
    kernels use `default_tiles`); with a block mask they must be multiples of 16.
    """
    from numba import cuda

    kind, batch, heads, n_q, d, heads_kv, n_k, scale = check_problem(
        q, k, v, scale=scale, dropout_p=dropout_p, head_dims=SUPPORTED_HEAD_DIMS,
        kernel_name="tensor-core", out=out, dout=dout, lse=lse)
    if block_mask is not None and (block_q is None or block_k is None):
        raise ValueError("block_mask needs block_q and block_k (its tile shape)")
    tiles = kernel_tiles(d, None if block_q is None else int(block_q),
                         None if block_k is None else int(block_k), block_mask is not None)
    if tiles is None:
        raise ValueError(f"block_q={block_q}, block_k={block_k}: the block mask's tiles must be "
                         f"multiples of 16 for the tensor-core backward")
    (dq_bq, dq_bk), (kv_bk, kv_bq) = tiles

    # -- move / view the operands as 16-bit words on the device --
    stream = fastlaunch.launch_stream()
    if kind == "torch":
        import torch
        dt = q.dtype
        for name, x in (("k", k), ("v", v), ("out", out), ("dout", dout)):
            if x.dtype != dt:
                raise TypeError(f"{name} has dtype {x.dtype}, expected {dt} like q")
        if dt not in (torch.float16, torch.bfloat16):
            raise TypeError(f"q must be float16 or bfloat16, got {dt}")
        if not q.is_cuda:
            raise TypeError("torch tensors must be on a CUDA device")
        is_bf16 = dt == torch.bfloat16

        def prep(t):
            t = t.detach()
            if t.stride(-1) != 1 or t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
                t = t.contiguous()
            return t.view(torch.int16)     # launched in place (kernels.fastlaunch)

        qd, kd, vd, od, dod = (prep(x) for x in (q, k, v, out, dout))
        lsed = lse.detach().to(torch.float32)
        dq_t = torch.empty((batch, heads, n_q, d), dtype=dt, device=q.device)
        dk_t = torch.empty((batch, heads_kv, n_k, d), dtype=dt, device=q.device)
        dv_t = torch.empty((batch, heads_kv, n_k, d), dtype=dt, device=q.device)
        delta_t = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
        dqd, dkd, dvd = (x.view(torch.int16) for x in (dq_t, dk_t, dv_t))
        deltad = delta_t
        stream = fastlaunch.launch_stream(q)      # torch's current stream on q's device
    else:
        dts = {str(np.dtype(x.dtype)) for x in (q, k, v, out, dout)}
        if dts != {"float16"}:
            raise TypeError(f"q, k, v, out, dout must be float16 (bfloat16 only as torch "
                            f"tensors), got {dts}")
        is_bf16 = False

        def prep(a):
            if kind == "numpy":
                return cuda.to_device(np.ascontiguousarray(a).view(np.int16))
            st = a.strides
            if st[-1] != 2 or any(s % 16 for s in st[:-1]):
                a = cuda.to_device(np.ascontiguousarray(a.copy_to_host()))
            return a.view(np.int16)

        qd, kd, vd, od, dod = (prep(x) for x in (q, k, v, out, dout))
        if kind == "numpy":
            lsed = cuda.to_device(np.ascontiguousarray(lse, dtype=np.float32))
        else:
            if str(np.dtype(lse.dtype)) != "float32":
                raise TypeError(f"lse must be float32, got {lse.dtype}")
            lsed = lse
        dqd = cuda.device_array((batch, heads, n_q, d), dtype=np.int16)
        dkd = cuda.device_array((batch, heads_kv, n_k, d), dtype=np.int16)
        dvd = cuda.device_array((batch, heads_kv, n_k, d), dtype=np.int16)
        deltad = cuda.device_array((batch, heads, n_q), dtype=np.float32)

    # -- mask, schedules, dropout constants --
    has_mask = mask is not None
    maskd, mb, mh, mq = mask_on_device(mask, kind, batch, heads, n_q, n_k)
    (kv_off, kv_idx, kv_sb, kv_sh), (q_off, q_idx, q_sb, q_sh) = device_schedules(
        block_mask, block_q, block_k, n_q, n_k, (dq_bq, dq_bk), (kv_bq, kv_bk), causal, batch,
        heads)
    has_dropout, seed_hash, threshold, inv_keep = dropout_constants(seed, dropout_p)
    group = heads // heads_kv
    consts = (maskd, mb, mh, mq, np.float32(scale * LOG2E), np.float32(scale),
              np.uint32(seed_hash), np.uint32(threshold), np.float32(inv_keep))

    # -- dQ (and delta) first, then dK/dV, which reads delta --
    head_group = tile_order.head_group(causal, "bwd")
    kern = get_dq_kernel(d, dq_bq, dq_bk, is_bf16, bool(causal), has_mask, has_dropout,
                         head_group)
    fastlaunch.launch(kern, (cdiv(n_q, dq_bq), batch * heads),
                      kern.threads, stream, (
        qd, kd, vd, od, dod, lsed, deltad, dqd, kv_off, kv_idx, kv_sb, kv_sh, group, n_q, n_k,
        *consts))
    kern = get_dkdv_kernel(d, kv_bk, kv_bq, is_bf16, bool(causal), has_mask, has_dropout,
                           head_group)
    fastlaunch.launch(kern, (cdiv(n_k, kv_bk), batch * heads_kv),
                      kern.threads, stream, (
        qd, kd, vd, dod, lsed, deltad, dkd, dvd, q_off, q_idx, q_sb, q_sh, group, n_q, n_k,
        *consts))

    if kind == "torch":
        return dq_t, dk_t, dv_t
    if kind == "numpy":
        return tuple(x.copy_to_host().view(np.float16) for x in (dqd, dkd, dvd))
    return tuple(x.view(np.float16) for x in (dqd, dkd, dvd))
