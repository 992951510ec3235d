"""The fused attention backward kernels (FlashAttention-2), recomputing P from the logsumexp.

* `make_delta_kernel`: delta_i = sum_c dO_ic * O_ic (one thread per query row).
* `make_dkdv_kernel`: one thread block per (batch*kv_head, K tile), parallel over K/V tiles.
  K and V stay in shared memory; the Q tiles that visit this K tile (`BlockInfo.q_schedule()`,
  for every query head of the GQA group) stream through. Each thread owns a micro-tile of
  S^T = K Q^T and dP^T = V dO^T, and the matching rows of the dK and dV accumulators, written
  once at the end. With ``dq_atomic`` it also adds dS K into a float32 dQ buffer with atomics.
* `make_dq_kernel`: one thread block per (batch*head, Q tile), parallel over Q tiles, streaming
  the K/V tiles of `BlockInfo.kv_schedule()`; dQ accumulates in registers and is written once.

Dropout: with Z = keep / (1 - p), dV = (P*Z)^T dO, dP = (dO V^T) * Z, dS = P * (dP - delta),
where delta = rowsum(dO * O) and O is the dropped-out output (so delta = rowsum(P * dP)).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from ._device import keep_bit, row_hash
from .config import TileConfig

POS_INF = float32(np.inf)
NEG_INF = float32(-np.inf)
U64 = np.uint64


def make_delta_kernel(head_dim: int):
    """delta[b, h, i] = sum_c dout[b, h, i, c] * out[b, h, i, c]; grid (cdiv(Nq, 128), B*Hq),
    block 128."""
    D = head_dim

    @cuda.jit
    def flash_bwd_delta(out, dout, delta):
        row = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        bh = cuda.blockIdx.y
        n_heads = out.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        if row < out.shape[2]:
            acc = float32(0.0)
            for c in range(D):
                acc += float32(out[b, h, row, c]) * float32(dout[b, h, row, c])
            delta[b, h, row] = acc

    return flash_bwd_delta


#: Rows of the delta pre-pass per thread block (one warp of 32 lanes per row).
DELTA_ROWS = 8


def make_delta_kernel_v2(head_dim: int, use_shfl: bool):
    """Coalesced delta pre-pass: one warp per row, lanes along d.

    delta[b, h, i] = sum_c dout[b, h, i, c] * out[b, h, i, c]. Lane ``l`` of the row's warp
    reads columns ``l, l+32, ...`` so each warp load is one contiguous row segment (the
    one-thread-per-row `make_delta_kernel` strides by d between neighbouring threads). The 32
    partial sums are reduced by warp shuffles on a GPU, through shared memory under the
    simulator. grid (cdiv(Nq, DELTA_ROWS), B*Hq), block 32 * DELTA_ROWS.
    """
    D = head_dim
    ROWS = DELTA_ROWS
    NCOL = (D + 31) // 32
    SHFL = use_shfl

    @cuda.jit
    def flash_bwd_delta_v2(out, dout, delta):
        lane = cuda.threadIdx.x % 32
        wrow = cuda.threadIdx.x // 32
        row = cuda.blockIdx.x * ROWS + wrow
        bh = cuda.blockIdx.y
        n_heads = out.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        red_s = cuda.shared.array((ROWS, 32), float32)
        acc = float32(0.0)
        if row < out.shape[2]:
            for u in range(NCOL):
                c = lane + 32 * u
                if c < D:
                    acc += float32(out[b, h, row, c]) * float32(dout[b, h, row, c])
        if SHFL:
            off = 16
            while off > 0:
                acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, off)
                off //= 2
        else:
            red_s[wrow, lane] = acc
            cuda.syncthreads()
            off = 16
            while off > 0:
                if lane < off:
                    red_s[wrow, lane] += red_s[wrow, lane + off]
                cuda.syncthreads()
                off //= 2
            acc = red_s[wrow, 0]
        if lane == 0 and row < out.shape[2]:
            delta[b, h, row] = acc

    return flash_bwd_delta_v2


def make_dkdv_kernel(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                     dropout: bool, dq_atomic: bool):
    """dK/dV kernel; ``cfg.block_m`` = K tile rows, ``cfg.block_n`` = Q tile rows.

    Signature::

        kernel(q, k, v, dout, lse, delta, dk, dv, dq_acc, mask, q_off, q_idx, sched_sb,
               sched_sh, group, sm_scale, seed_prefix, keep_threshold, keep_scale)

    grid = (n_blocks_k, B * Hkv), block = cfg.threads. dq_acc (float32, zeroed) is only
    written when ``dq_atomic``.
    """
    BK, BQ, TK, TQ = cfg.block_m, cfg.block_n, cfg.tm, cfg.tn
    D = head_dim
    NTK, NTQ = BK // TK, BQ // TQ
    NTHREADS = NTK * NTQ
    DN = D // NTQ
    DPAD = D + 1
    PPAD = BQ + NTQ
    LOAD_K = (BK * D + NTHREADS - 1) // NTHREADS
    LOAD_Q = (BQ * D + NTHREADS - 1) // NTHREADS
    LOAD_DQ = (BQ * D + NTHREADS - 1) // NTHREADS
    CAUSAL, HAS_MASK, DROPOUT, DQ_ATOMIC = causal, has_mask, dropout, dq_atomic

    @cuda.jit
    def flash_bwd_dkdv(q, k, v, dout, lse, delta, dk, dv, dq_acc, mask, q_off, q_idx,
                       sched_sb, sched_sh, group, sm_scale, seed_prefix, keep_threshold,
                       keep_scale):
        tid = cuda.threadIdx.x
        tx = tid % NTQ
        ty = tid // NTQ
        bhk = cuda.blockIdx.y
        n_kv_heads = k.shape[1]
        n_heads = q.shape[1]
        b = bhk // n_kv_heads
        hk = bhk % n_kv_heads
        n_blk = cuda.blockIdx.x
        col0 = n_blk * BK                                # first key row of this tile
        seqlen_q = q.shape[2]
        seqlen_k = k.shape[2]
        mb = b if mask.shape[0] > 1 else 0
        mrow_bcast = mask.shape[2] == 1

        k_s = cuda.shared.array((BK, DPAD), float32)
        v_s = cuda.shared.array((BK, DPAD), float32)
        q_s = cuda.shared.array((BQ, DPAD), float32)
        do_s = cuda.shared.array((BQ, DPAD), float32)
        pt_s = cuda.shared.array((BK, PPAD), float32)   # (P * Z)^T
        dst_s = cuda.shared.array((BK, PPAD), float32)  # dS^T
        lse_s = cuda.shared.array(BQ, float32)
        delta_s = cuda.shared.array(BQ, float32)

        # -- load the K and V tiles once --
        for it in range(LOAD_K):
            e = tid + it * NTHREADS
            if e < BK * D:
                r = e // D
                c = e % D
                kv = float32(0.0)
                vv = float32(0.0)
                if col0 + r < seqlen_k:
                    kv = float32(k[b, hk, col0 + r, c])
                    vv = float32(v[b, hk, col0 + r, c])
                k_s[r, c] = kv
                v_s[r, c] = vv

        dk_acc = cuda.local.array((TK, DN), float32)
        dv_acc = cuda.local.array((TK, DN), float32)
        s = cuda.local.array((TK, TQ), float32)
        dp = cuda.local.array((TK, TQ), float32)
        ak = cuda.local.array(TK, float32)
        av = cuda.local.array(TK, float32)
        bq = cuda.local.array(TQ, float32)
        bdo = cuda.local.array(TQ, float32)
        cq = cuda.local.array(DN, float32)
        cdo = cuda.local.array(DN, float32)
        for i in range(TK):
            for c in range(DN):
                dk_acc[i, c] = float32(0.0)
                dv_acc[i, c] = float32(0.0)

        for g in range(group):
            h = hk * group + g
            mh = h if mask.shape[1] > 1 else 0
            bh = b * n_heads + h
            sched = b * sched_sb + h * sched_sh
            t0 = q_off[sched, n_blk]
            t1 = q_off[sched, n_blk + 1]
            for t in range(t0, t1):
                row0 = q_idx[t] * BQ
                cuda.syncthreads()                      # previous Q tile fully consumed
                # -- load Q, dO, lse, delta --
                for it in range(LOAD_Q):
                    e = tid + it * NTHREADS
                    if e < BQ * D:
                        r = e // D
                        c = e % D
                        qv = float32(0.0)
                        dov = float32(0.0)
                        if row0 + r < seqlen_q:
                            qv = float32(q[b, h, row0 + r, c])
                            dov = float32(dout[b, h, row0 + r, c])
                        q_s[r, c] = qv
                        do_s[r, c] = dov
                for r in range(tid, BQ, NTHREADS):
                    lv = POS_INF                          # p = exp(s - inf) = 0
                    dl = float32(0.0)
                    if row0 + r < seqlen_q:
                        lv = lse[b, h, row0 + r]
                        dl = delta[b, h, row0 + r]
                        if lv == NEG_INF:
                            lv = POS_INF
                    lse_s[r] = lv
                    delta_s[r] = dl
                cuda.syncthreads()

                # -- recompute s^T = K Q^T and dp^T = V dO^T --
                for i in range(TK):
                    for j in range(TQ):
                        s[i, j] = float32(0.0)
                        dp[i, j] = float32(0.0)
                for kk in range(D):
                    for i in range(TK):
                        ak[i] = k_s[ty + NTK * i, kk]
                        av[i] = v_s[ty + NTK * i, kk]
                    for j in range(TQ):
                        bq[j] = q_s[tx + NTQ * j, kk]
                        bdo[j] = do_s[tx + NTQ * j, kk]
                    for i in range(TK):
                        for j in range(TQ):
                            s[i, j] += ak[i] * bq[j]
                            dp[i, j] += av[i] * bdo[j]

                # -- p, dropout, ds --
                for j in range(TQ):
                    jl = tx + NTQ * j
                    row = row0 + jl
                    lse_j = lse_s[jl]
                    delta_j = delta_s[jl]
                    hrow = np.uint64(0)
                    if DROPOUT:
                        hrow = row_hash(seed_prefix, bh, row)
                    for i in range(TK):
                        col = col0 + ty + NTK * i
                        ok = col < seqlen_k
                        if CAUSAL:
                            ok = ok and col <= row
                        if HAS_MASK:
                            if ok and row < seqlen_q:
                                mr = 0 if mrow_bcast else row
                                ok = mask[mb, mh, mr, col] != 0
                        p = float32(0.0)
                        if ok:
                            p = math.exp(s[i, j] * sm_scale - lse_j)
                        dpz = dp[i, j]
                        pz = p
                        if DROPOUT:
                            if keep_bit(hrow, col, keep_threshold):
                                dpz *= keep_scale
                                pz *= keep_scale
                            else:
                                dpz = float32(0.0)
                                pz = float32(0.0)
                        pt_s[ty + NTK * i, jl] = pz
                        dst_s[ty + NTK * i, jl] = p * (dpz - delta_j)
                cuda.syncthreads()

                # -- dv += (P Z)^T dO ; dk += dS^T Q --
                for mm in range(BQ):
                    for i in range(TK):
                        ak[i] = pt_s[ty + NTK * i, mm]
                        av[i] = dst_s[ty + NTK * i, mm]
                    for c in range(DN):
                        cdo[c] = do_s[mm, tx + NTQ * c]
                        cq[c] = q_s[mm, tx + NTQ * c]
                    for i in range(TK):
                        for c in range(DN):
                            dv_acc[i, c] += ak[i] * cdo[c]
                            dk_acc[i, c] += av[i] * cq[c]

                # -- dq += scale * dS K (atomics) --
                if DQ_ATOMIC:
                    for it in range(LOAD_DQ):
                        e = tid + it * NTHREADS
                        if e < BQ * D:
                            r = e // D
                            c = e % D
                            if row0 + r < seqlen_q:
                                acc = float32(0.0)
                                for n in range(BK):
                                    acc += dst_s[n, r] * k_s[n, c]
                                cuda.atomic.add(dq_acc, (b, h, row0 + r, c), acc * sm_scale)

        # -- write dK, dV once --
        for i in range(TK):
            col = col0 + ty + NTK * i
            if col < seqlen_k:
                for c in range(DN):
                    dk[b, hk, col, tx + NTQ * c] = dk_acc[i, c] * sm_scale
                    dv[b, hk, col, tx + NTQ * c] = dv_acc[i, c]

    return flash_bwd_dkdv


def make_dkdv_kernel_v2(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                     dropout: bool, dq_atomic: bool):
    """`make_dkdv_kernel` with unsigned 64-bit tile indices and per-head 2-D views (no
    wraparound fix-ups in the hot loops); ``cfg.block_m`` = K tile rows, ``cfg.block_n`` = Q tile rows.

    Signature::

        kernel(q, k, v, dout, lse, delta, dk, dv, dq_acc, mask, q_off, q_idx, sched_sb,
               sched_sh, group, sm_scale, seed_prefix, keep_threshold, keep_scale)

    grid = (n_blocks_k, B * Hkv), block = cfg.threads. dq_acc (float32, zeroed) is only
    written when ``dq_atomic``.
    """
    BK, BQ, TK, TQ = cfg.block_m, cfg.block_n, cfg.tm, cfg.tn
    D = head_dim
    NTK, NTQ = BK // TK, BQ // TQ
    NTHREADS = NTK * NTQ
    DN = D // NTQ
    DPAD = D + 1
    PPAD = BQ + NTQ
    LOAD_K = (BK * D + NTHREADS - 1) // NTHREADS
    LOAD_Q = (BQ * D + NTHREADS - 1) // NTHREADS
    LOAD_DQ = (BQ * D + NTHREADS - 1) // NTHREADS
    LOAD_L = (BQ + NTHREADS - 1) // NTHREADS
    CAUSAL, HAS_MASK, DROPOUT, DQ_ATOMIC = causal, has_mask, dropout, dq_atomic

    @cuda.jit
    def flash_bwd_dkdv_v2(q, k, v, dout, lse, delta, dk, dv, dq_acc, mask, q_off, q_idx,
                       sched_sb, sched_sh, group, sm_scale, seed_prefix, keep_threshold,
                       keep_scale):
        tid = U64(cuda.threadIdx.x)
        tx = tid % U64(NTQ)
        ty = tid // U64(NTQ)
        bhk = cuda.blockIdx.y
        n_kv_heads = k.shape[1]
        n_heads = q.shape[1]
        b = bhk // n_kv_heads
        hk = bhk % n_kv_heads
        n_blk = cuda.blockIdx.x
        col0 = U64(n_blk) * U64(BK)                      # first key row of this tile
        seqlen_q = U64(q.shape[2])
        seqlen_k = U64(k.shape[2])
        kh = k[b, hk]
        vh = v[b, hk]
        mb = b if mask.shape[0] > 1 else 0
        mrow_bcast = mask.shape[2] == 1

        k_s = cuda.shared.array((BK, DPAD), float32)
        v_s = cuda.shared.array((BK, DPAD), float32)
        q_s = cuda.shared.array((BQ, DPAD), float32)
        do_s = cuda.shared.array((BQ, DPAD), float32)
        pt_s = cuda.shared.array((BK, PPAD), float32)   # (P * Z)^T
        dst_s = cuda.shared.array((BK, PPAD), float32)  # dS^T
        lse_s = cuda.shared.array(BQ, float32)
        delta_s = cuda.shared.array(BQ, float32)

        # -- load the K and V tiles once --
        for it in range(LOAD_K):
            e = tid + U64(it * NTHREADS)
            if e < U64(BK * D):
                r = e // U64(D)
                c = e % U64(D)
                kv = float32(0.0)
                vv = float32(0.0)
                if col0 + r < seqlen_k:
                    kv = float32(kh[col0 + r, c])
                    vv = float32(vh[col0 + r, c])
                k_s[r, c] = kv
                v_s[r, c] = vv

        dk_acc = cuda.local.array((TK, DN), float32)
        dv_acc = cuda.local.array((TK, DN), float32)
        s = cuda.local.array((TK, TQ), float32)
        dp = cuda.local.array((TK, TQ), float32)
        ak = cuda.local.array(TK, float32)
        av = cuda.local.array(TK, float32)
        bq = cuda.local.array(TQ, float32)
        bdo = cuda.local.array(TQ, float32)
        cq = cuda.local.array(DN, float32)
        cdo = cuda.local.array(DN, float32)
        krows = cuda.local.array(TK, np.uint64)
        qcols = cuda.local.array(TQ, np.uint64)
        dcols = cuda.local.array(DN, np.uint64)
        for i in range(TK):
            krows[i] = ty + U64(NTK * i)
        for j in range(TQ):
            qcols[j] = tx + U64(NTQ * j)
        for c in range(DN):
            dcols[c] = tx + U64(NTQ * c)
        for i in range(TK):
            for c in range(DN):
                dk_acc[i, c] = float32(0.0)
                dv_acc[i, c] = float32(0.0)

        for g in range(group):
            h = hk * group + g
            mh = h if mask.shape[1] > 1 else 0
            bh = b * n_heads + h
            sched = b * sched_sb + h * sched_sh
            qh = q[b, h]
            doh = dout[b, h]
            dqh = dq_acc[b if DQ_ATOMIC else 0, h if DQ_ATOMIC else 0]
            t0 = q_off[sched, n_blk]
            t1 = q_off[sched, n_blk + 1]
            for t in range(t0, t1):
                row0 = U64(q_idx[t]) * U64(BQ)
                cuda.syncthreads()                      # previous Q tile fully consumed
                # -- load Q, dO, lse, delta --
                for it in range(LOAD_Q):
                    e = tid + U64(it * NTHREADS)
                    if e < U64(BQ * D):
                        r = e // U64(D)
                        c = e % U64(D)
                        qv = float32(0.0)
                        dov = float32(0.0)
                        if row0 + r < seqlen_q:
                            qv = float32(qh[row0 + r, c])
                            dov = float32(doh[row0 + r, c])
                        q_s[r, c] = qv
                        do_s[r, c] = dov
                for it in range(LOAD_L):
                    r = tid + U64(it * NTHREADS)
                    if r >= U64(BQ):
                        continue
                    lv = POS_INF                          # p = exp(s - inf) = 0
                    dl = float32(0.0)
                    if row0 + r < seqlen_q:
                        lv = lse[b, h, row0 + r]
                        dl = delta[b, h, row0 + r]
                        if lv == NEG_INF:
                            lv = POS_INF
                    lse_s[r] = lv
                    delta_s[r] = dl
                cuda.syncthreads()

                # -- recompute s^T = K Q^T and dp^T = V dO^T --
                for i in range(TK):
                    for j in range(TQ):
                        s[i, j] = float32(0.0)
                        dp[i, j] = float32(0.0)
                for kk in range(D):
                    for i in range(TK):
                        ak[i] = k_s[krows[i], kk]
                        av[i] = v_s[krows[i], kk]
                    for j in range(TQ):
                        bq[j] = q_s[qcols[j], kk]
                        bdo[j] = do_s[qcols[j], kk]
                    for i in range(TK):
                        for j in range(TQ):
                            s[i, j] += ak[i] * bq[j]
                            dp[i, j] += av[i] * bdo[j]

                # -- p, dropout, ds --
                for j in range(TQ):
                    jl = qcols[j]
                    row = row0 + jl
                    lse_j = lse_s[jl]
                    delta_j = delta_s[jl]
                    hrow = np.uint64(0)
                    if DROPOUT:
                        hrow = row_hash(seed_prefix, bh, row)
                    for i in range(TK):
                        col = col0 + krows[i]
                        ok = col < seqlen_k
                        if CAUSAL:
                            ok = ok and col <= row
                        if HAS_MASK:
                            if ok and row < seqlen_q:
                                mr = U64(0) if mrow_bcast else row
                                ok = mask[mb, mh, mr, col] != 0
                        p = float32(0.0)
                        if ok:
                            p = math.exp(s[i, j] * sm_scale - lse_j)
                        dpz = dp[i, j]
                        pz = p
                        if DROPOUT:
                            if keep_bit(hrow, col, keep_threshold):
                                dpz *= keep_scale
                                pz *= keep_scale
                            else:
                                dpz = float32(0.0)
                                pz = float32(0.0)
                        pt_s[krows[i], jl] = pz
                        dst_s[krows[i], jl] = p * (dpz - delta_j)
                cuda.syncthreads()

                # -- dv += (P Z)^T dO ; dk += dS^T Q --
                for mm in range(BQ):
                    for i in range(TK):
                        ak[i] = pt_s[krows[i], mm]
                        av[i] = dst_s[krows[i], mm]
                    for c in range(DN):
                        cdo[c] = do_s[mm, dcols[c]]
                        cq[c] = q_s[mm, dcols[c]]
                    for i in range(TK):
                        for c in range(DN):
                            dv_acc[i, c] += ak[i] * cdo[c]
                            dk_acc[i, c] += av[i] * cq[c]

                # -- dq += scale * dS K (atomics) --
                if DQ_ATOMIC:
                    for it in range(LOAD_DQ):
                        e = tid + U64(it * NTHREADS)
                        if e < U64(BQ * D):
                            r = e // U64(D)
                            c = e % U64(D)
                            if row0 + r < seqlen_q:
                                acc = float32(0.0)
                                for n in range(BK):
                                    acc += dst_s[n, r] * k_s[n, c]
                                cuda.atomic.add(dqh, (row0 + r, c), acc * sm_scale)

        # -- write dK, dV once --
        dkh = dk[b, hk]
        dvh = dv[b, hk]
        for i in range(TK):
            col = col0 + krows[i]
            if col < seqlen_k:
                for c in range(DN):
                    dkh[col, dcols[c]] = dk_acc[i, c] * sm_scale
                    dvh[col, dcols[c]] = dv_acc[i, c]

    return flash_bwd_dkdv_v2


def make_dq_kernel(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                   dropout: bool):
    """dQ kernel; ``cfg.block_m`` = Q tile rows, ``cfg.block_n`` = K tile rows.

    Signature::

        kernel(q, k, v, dout, lse, delta, dq, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
               sm_scale, seed_prefix, keep_threshold, keep_scale)

    grid = (n_blocks_q, B * Hq), block = cfg.threads.
    """
    BM, BN, TM, TN = cfg.block_m, cfg.block_n, cfg.tm, cfg.tn
    D = head_dim
    NTM, NTN = BM // TM, BN // TN
    NTHREADS = NTM * NTN
    DN = D // NTN
    DPAD = D + 1
    PPAD = BN + NTN
    LOAD_Q = (BM * D + NTHREADS - 1) // NTHREADS
    LOAD_K = (BN * D + NTHREADS - 1) // NTHREADS
    CAUSAL, HAS_MASK, DROPOUT = causal, has_mask, dropout

    @cuda.jit
    def flash_bwd_dq(q, k, v, dout, lse, delta, dq, mask, kv_off, kv_idx, sched_sb, sched_sh,
                     group, sm_scale, seed_prefix, keep_threshold, keep_scale):
        tid = cuda.threadIdx.x
        tx = tid % NTN
        ty = tid // NTN
        bh = cuda.blockIdx.y
        n_heads = q.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        m_blk = cuda.gridDim.x - 1 - cuda.blockIdx.x
        row0 = m_blk * BM
        seqlen_q = q.shape[2]
        seqlen_k = k.shape[2]
        mb = b if mask.shape[0] > 1 else 0
        mh = h if mask.shape[1] > 1 else 0
        mrow_bcast = mask.shape[2] == 1

        q_s = cuda.shared.array((BM, DPAD), float32)
        do_s = cuda.shared.array((BM, DPAD), float32)
        k_s = cuda.shared.array((BN, DPAD), float32)
        v_s = cuda.shared.array((BN, DPAD), float32)
        ds_s = cuda.shared.array((BM, PPAD), float32)

        for it in range(LOAD_Q):
            e = tid + it * NTHREADS
            if e < BM * D:
                r = e // D
                c = e % D
                qv = float32(0.0)
                dov = float32(0.0)
                if row0 + r < seqlen_q:
                    qv = float32(q[b, h, row0 + r, c])
                    dov = float32(dout[b, h, row0 + r, c])
                q_s[r, c] = qv
                do_s[r, c] = dov

        dq_acc = cuda.local.array((TM, DN), float32)
        s = cuda.local.array((TM, TN), float32)
        dp = cuda.local.array((TM, TN), float32)
        aq = cuda.local.array(TM, float32)
        ado = cuda.local.array(TM, float32)
        bk = cuda.local.array(TN, float32)
        bv = cuda.local.array(TN, float32)
        ck = cuda.local.array(DN, float32)
        lse_r = cuda.local.array(TM, float32)
        delta_r = cuda.local.array(TM, float32)
        h_row = cuda.local.array(TM, np.uint64)
        for i in range(TM):
            row = row0 + ty + NTM * i
            lv = POS_INF
            dl = float32(0.0)
            if row < seqlen_q:
                lv = lse[b, h, row]
                dl = delta[b, h, row]
                if lv == NEG_INF:
                    lv = POS_INF
            lse_r[i] = lv
            delta_r[i] = dl
            if DROPOUT:
                h_row[i] = row_hash(seed_prefix, bh, row)
            for c in range(DN):
                dq_acc[i, c] = float32(0.0)

        sched = b * sched_sb + h * sched_sh
        t0 = kv_off[sched, m_blk]
        t1 = kv_off[sched, m_blk + 1]
        for t in range(t0, t1):
            col0 = kv_idx[t] * BN
            cuda.syncthreads()
            for it in range(LOAD_K):
                e = tid + it * NTHREADS
                if e < BN * D:
                    r = e // D
                    c = e % D
                    kv = float32(0.0)
                    vv = float32(0.0)
                    if col0 + r < seqlen_k:
                        kv = float32(k[b, hk, col0 + r, c])
                        vv = float32(v[b, hk, col0 + r, c])
                    k_s[r, c] = kv
                    v_s[r, c] = vv
            cuda.syncthreads()

            # -- recompute s = Q K^T and dp = dO V^T --
            for i in range(TM):
                for j in range(TN):
                    s[i, j] = float32(0.0)
                    dp[i, j] = float32(0.0)
            for kk in range(D):
                for i in range(TM):
                    aq[i] = q_s[ty + NTM * i, kk]
                    ado[i] = do_s[ty + NTM * i, kk]
                for j in range(TN):
                    bk[j] = k_s[tx + NTN * j, kk]
                    bv[j] = v_s[tx + NTN * j, kk]
                for i in range(TM):
                    for j in range(TN):
                        s[i, j] += aq[i] * bk[j]
                        dp[i, j] += ado[i] * bv[j]

            # -- ds = p * (dp * z - delta) --
            for i in range(TM):
                row = row0 + ty + NTM * i
                for j in range(TN):
                    col = col0 + tx + NTN * j
                    ok = col < seqlen_k
                    if CAUSAL:
                        ok = ok and col <= row
                    if HAS_MASK:
                        if ok and row < seqlen_q:
                            mr = 0 if mrow_bcast else row
                            ok = mask[mb, mh, mr, col] != 0
                    p = float32(0.0)
                    if ok:
                        p = math.exp(s[i, j] * sm_scale - lse_r[i])
                    dpz = dp[i, j]
                    if DROPOUT:
                        if keep_bit(h_row[i], col, keep_threshold):
                            dpz *= keep_scale
                        else:
                            dpz = float32(0.0)
                    ds_s[ty + NTM * i, tx + NTN * j] = p * (dpz - delta_r[i])
            cuda.syncthreads()

            # -- dq += dS K --
            for jj in range(BN):
                for i in range(TM):
                    aq[i] = ds_s[ty + NTM * i, jj]
                for c in range(DN):
                    ck[c] = k_s[jj, tx + NTN * c]
                for i in range(TM):
                    for c in range(DN):
                        dq_acc[i, c] += aq[i] * ck[c]

        for i in range(TM):
            row = row0 + ty + NTM * i
            if row < seqlen_q:
                for c in range(DN):
                    dq[b, h, row, tx + NTN * c] = dq_acc[i, c] * sm_scale

    return flash_bwd_dq
