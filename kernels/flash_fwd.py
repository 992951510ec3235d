"""The fused attention forward kernel (FlashAttention-2 order), float32 accumulation on CUDA cores.

One thread block computes one (batch*head, Q tile). The Q tile is staged once in shared memory;
K and V tiles stream through shared memory in the order given by `BlockInfo.kv_schedule()`
(causal and block-sparse skipping live there, so skipped tiles are never loaded). Each thread
owns a ``TM x TN`` register micro-tile of S = Q K^T (rows ``ty + NTM*i``, columns
``tx + NTN*j``, interleaved so that a warp's shared-memory reads hit distinct banks) and the
matching ``TM x D/NTN`` slice of the output accumulator. The row max is reduced across the NTN
threads of a row group (warp shuffles on a GPU); the row sum is kept as per-thread partial sums
and reduced once at the end, with the one final rescale. O and the logsumexp are written once.

All sizes (block_m, block_n, TM, TN, head_dim) and the feature switches (causal, mask,
dropout) are compile-time constants of a kernel built by `make_forward_kernel`.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from ._device import keep_bit, row_hash
from .config import TileConfig

NEG_INF = float32(-np.inf)
U64 = np.uint64


def make_forward_kernel(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                        dropout: bool, use_shfl: bool):
    """Build the forward kernel for one configuration (cached by `kernels.launch`).

    Kernel signature::

        kernel(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
               n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale)

    grid = (n_blocks_q, B * Hq), block = cfg.threads.
    """
    BM, BN, TM, TN = cfg.block_m, cfg.block_n, cfg.tm, cfg.tn
    D = head_dim
    NTM, NTN = BM // TM, BN // TN
    NTHREADS = NTM * NTN
    DN = D // NTN
    DPAD = D + 1                      # odd row stride: column reads hit distinct banks
    PPAD = BN + NTN                   # P rows: the NTN-wide row groups of a warp land apart
    LOAD_Q = (BM * D + NTHREADS - 1) // NTHREADS
    LOAD_KV = (BN * D + NTHREADS - 1) // NTHREADS
    CAUSAL, HAS_MASK, DROPOUT, SHFL = causal, has_mask, dropout, use_shfl

    @cuda.jit
    def flash_fwd(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
                  n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale):
        tid = cuda.threadIdx.x
        tx = tid % NTN
        ty = tid // NTN
        bh = cuda.blockIdx.y
        n_heads = q.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        m_blk = n_blocks_q - 1 - cuda.blockIdx.x       # heaviest causal tiles first
        row0 = m_blk * BM
        seqlen_q = q.shape[2]
        seqlen_k = k.shape[2]
        mb = b if mask.shape[0] > 1 else 0
        mh = h if mask.shape[1] > 1 else 0
        mrow_bcast = mask.shape[2] == 1

        q_s = cuda.shared.array((BM, DPAD), float32)
        k_s = cuda.shared.array((BN, DPAD), float32)
        v_s = cuda.shared.array((BN, DPAD), float32)
        p_s = cuda.shared.array((BM, PPAD), float32)
        red_s = cuda.shared.array((BM, NTN), float32)

        # -- load the Q tile, pre-multiplied by the softmax scale --
        for it in range(LOAD_Q):
            e = tid + it * NTHREADS
            if e < BM * D:
                r = e // D
                c = e % D
                val = float32(0.0)
                if row0 + r < seqlen_q:
                    val = float32(q[b, h, row0 + r, c]) * sm_scale
                q_s[r, c] = val

        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)          # per-thread partial row sums
        acc = cuda.local.array((TM, DN), float32)
        s = cuda.local.array((TM, TN), float32)
        a_r = cuda.local.array(TM, float32)
        b_r = cuda.local.array(TN, float32)
        v_r = cuda.local.array(DN, float32)
        h_row = cuda.local.array(TM, np.uint64)
        for i in range(TM):
            m_i[i] = NEG_INF
            l_i[i] = float32(0.0)
            for c in range(DN):
                acc[i, c] = float32(0.0)
            if DROPOUT:
                h_row[i] = row_hash(seed_prefix, bh, row0 + ty + NTM * i)

        sched = b * sched_sb + h * sched_sh
        t0 = kv_off[sched, m_blk]
        t1 = kv_off[sched, m_blk + 1]
        for t in range(t0, t1):
            col0 = kv_idx[t] * BN
            cuda.syncthreads()                         # previous tile fully consumed
            # -- load K and V tiles --
            for it in range(LOAD_KV):
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

            # -- compute qk --
            for i in range(TM):
                for j in range(TN):
                    s[i, j] = float32(0.0)
            for kk in range(D):
                for i in range(TM):
                    a_r[i] = q_s[ty + NTM * i, kk]
                for j in range(TN):
                    b_r[j] = k_s[tx + NTN * j, kk]
                for i in range(TM):
                    for j in range(TN):
                        s[i, j] += a_r[i] * b_r[j]

            # -- mask: bounds, causal, boolean mask --
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
                    if not ok:
                        s[i, j] = NEG_INF

            # -- row max across the row group --
            for i in range(TM):
                mx = s[i, 0]
                for j in range(1, TN):
                    mx = max(mx, s[i, j])
                a_r[i] = mx
            if SHFL:
                for i in range(TM):
                    mx = a_r[i]
                    off = NTN // 2
                    while off > 0:
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, off))
                        off //= 2
                    a_r[i] = mx
            else:
                for i in range(TM):
                    red_s[ty + NTM * i, tx] = a_r[i]
                cuda.syncthreads()
                for i in range(TM):
                    mx = red_s[ty + NTM * i, 0]
                    for u in range(1, NTN):
                        mx = max(mx, red_s[ty + NTM * i, u])
                    a_r[i] = mx
                cuda.syncthreads()

            # -- update m_i and l_i, rescale acc --
            for i in range(TM):
                m_new = max(m_i[i], a_r[i])
                m_use = float32(0.0) if m_new == NEG_INF else m_new
                alpha = math.exp(m_i[i] - m_use)
                rs = float32(0.0)
                for j in range(TN):
                    p = math.exp(s[i, j] - m_use)
                    s[i, j] = p
                    rs += p
                l_i[i] = l_i[i] * alpha + rs
                m_i[i] = m_new
                for c in range(DN):
                    acc[i, c] *= alpha

            # -- dropout on P (normaliser l_i stays undropped) --
            if DROPOUT:
                for i in range(TM):
                    for j in range(TN):
                        if keep_bit(h_row[i], col0 + tx + NTN * j, keep_threshold):
                            s[i, j] *= keep_scale
                        else:
                            s[i, j] = float32(0.0)

            for i in range(TM):
                for j in range(TN):
                    p_s[ty + NTM * i, tx + NTN * j] = s[i, j]
            cuda.syncthreads()

            # -- acc += P V --
            for jj in range(BN):
                for i in range(TM):
                    a_r[i] = p_s[ty + NTM * i, jj]
                for c in range(DN):
                    v_r[c] = v_s[jj, tx + NTN * c]
                for i in range(TM):
                    for c in range(DN):
                        acc[i, c] += a_r[i] * v_r[c]

        # -- reduce the partial row sums, one rescale, write O and lse --
        if SHFL:
            for i in range(TM):
                ls = l_i[i]
                off = NTN // 2
                while off > 0:
                    ls += cuda.shfl_xor_sync(0xFFFFFFFF, ls, off)
                    off //= 2
                l_i[i] = ls
        else:
            cuda.syncthreads()
            for i in range(TM):
                red_s[ty + NTM * i, tx] = l_i[i]
            cuda.syncthreads()
            for i in range(TM):
                ls = float32(0.0)
                for u in range(NTN):
                    ls += red_s[ty + NTM * i, u]
                l_i[i] = ls
        for i in range(TM):
            row = row0 + ty + NTM * i
            if row < seqlen_q:
                ls = l_i[i]
                inv = float32(0.0)
                row_lse = NEG_INF
                if ls > float32(0.0):
                    inv = float32(1.0) / ls
                    row_lse = m_i[i] + math.log(ls)
                for c in range(DN):
                    out[b, h, row, tx + NTN * c] = acc[i, c] * inv
                if tx == 0:
                    lse[b, h, row] = row_lse

    return flash_fwd


def make_forward_kernel_v2(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                        dropout: bool, use_shfl: bool):
    """`make_forward_kernel` with unsigned 64-bit tile indices and per-head 2-D views.

    Numba indexes with signed 64-bit integers and fixes up negative indices at every access;
    with uint64 row/column indices precomputed per thread (and 2-D views of q, k, v, out for the
    block's head) the hot loops carry no wraparound selects and fewer 64-bit multiplies.

    Kernel signature::

        kernel(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
               n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale)

    grid = (n_blocks_q, B * Hq), block = cfg.threads.
    """
    BM, BN, TM, TN = cfg.block_m, cfg.block_n, cfg.tm, cfg.tn
    D = head_dim
    NTM, NTN = BM // TM, BN // TN
    NTHREADS = NTM * NTN
    DN = D // NTN
    DPAD = D + 1                      # odd row stride: column reads hit distinct banks
    PPAD = BN + NTN                   # P rows: the NTN-wide row groups of a warp land apart
    LOAD_Q = (BM * D + NTHREADS - 1) // NTHREADS
    LOAD_KV = (BN * D + NTHREADS - 1) // NTHREADS
    CAUSAL, HAS_MASK, DROPOUT, SHFL = causal, has_mask, dropout, use_shfl

    @cuda.jit
    def flash_fwd_v2(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
                  n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale):
        tid = U64(cuda.threadIdx.x)
        tx = tid % U64(NTN)
        ty = tid // U64(NTN)
        bh = cuda.blockIdx.y
        n_heads = q.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        m_blk = n_blocks_q - 1 - cuda.blockIdx.x       # heaviest causal tiles first
        row0 = U64(m_blk) * U64(BM)
        seqlen_q = U64(q.shape[2])
        seqlen_k = U64(k.shape[2])
        qh = q[b, h]
        kh = k[b, hk]
        vh = v[b, hk]
        oh = out[b, h]
        mb = b if mask.shape[0] > 1 else 0
        mh = h if mask.shape[1] > 1 else 0
        mrow_bcast = mask.shape[2] == 1

        q_s = cuda.shared.array((BM, DPAD), float32)
        k_s = cuda.shared.array((BN, DPAD), float32)
        v_s = cuda.shared.array((BN, DPAD), float32)
        p_s = cuda.shared.array((BM, PPAD), float32)
        red_s = cuda.shared.array((BM, NTN), float32)

        # -- load the Q tile, pre-multiplied by the softmax scale --
        for it in range(LOAD_Q):
            e = tid + U64(it * NTHREADS)
            if e < U64(BM * D):
                r = e // U64(D)
                c = e % U64(D)
                val = float32(0.0)
                if row0 + r < seqlen_q:
                    val = float32(qh[row0 + r, c]) * sm_scale
                q_s[r, c] = val

        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)          # per-thread partial row sums
        acc = cuda.local.array((TM, DN), float32)
        s = cuda.local.array((TM, TN), float32)
        a_r = cuda.local.array(TM, float32)
        b_r = cuda.local.array(TN, float32)
        v_r = cuda.local.array(DN, float32)
        h_row = cuda.local.array(TM, np.uint64)
        rows = cuda.local.array(TM, np.uint64)        # this thread's tile rows
        cols = cuda.local.array(TN, np.uint64)        # ... tile columns of S
        dcols = cuda.local.array(DN, np.uint64)       # ... columns of O
        for i in range(TM):
            rows[i] = ty + U64(NTM * i)
        for j in range(TN):
            cols[j] = tx + U64(NTN * j)
        for c in range(DN):
            dcols[c] = tx + U64(NTN * c)
        for i in range(TM):
            m_i[i] = NEG_INF
            l_i[i] = float32(0.0)
            for c in range(DN):
                acc[i, c] = float32(0.0)
            if DROPOUT:
                h_row[i] = row_hash(seed_prefix, bh, row0 + rows[i])

        sched = b * sched_sb + h * sched_sh
        t0 = kv_off[sched, m_blk]
        t1 = kv_off[sched, m_blk + 1]
        for t in range(t0, t1):
            col0 = U64(kv_idx[t]) * U64(BN)
            cuda.syncthreads()                         # previous tile fully consumed
            # -- load K and V tiles --
            for it in range(LOAD_KV):
                e = tid + U64(it * NTHREADS)
                if e < U64(BN * D):
                    r = e // U64(D)
                    c = e % U64(D)
                    kv = float32(0.0)
                    vv = float32(0.0)
                    if col0 + r < seqlen_k:
                        kv = float32(kh[col0 + r, c])
                        vv = float32(vh[col0 + r, c])
                    k_s[r, c] = kv
                    v_s[r, c] = vv
            cuda.syncthreads()

            # -- compute qk --
            for i in range(TM):
                for j in range(TN):
                    s[i, j] = float32(0.0)
            for kk in range(D):
                for i in range(TM):
                    a_r[i] = q_s[rows[i], kk]
                for j in range(TN):
                    b_r[j] = k_s[cols[j], kk]
                for i in range(TM):
                    for j in range(TN):
                        s[i, j] += a_r[i] * b_r[j]

            # -- mask: bounds, causal, boolean mask --
            for i in range(TM):
                row = row0 + rows[i]
                for j in range(TN):
                    col = col0 + cols[j]
                    ok = col < seqlen_k
                    if CAUSAL:
                        ok = ok and col <= row
                    if HAS_MASK:
                        if ok and row < seqlen_q:
                            mr = U64(0) if mrow_bcast else row
                            ok = mask[mb, mh, mr, col] != 0
                    if not ok:
                        s[i, j] = NEG_INF

            # -- row max across the row group --
            for i in range(TM):
                mx = s[i, 0]
                for j in range(1, TN):
                    mx = max(mx, s[i, j])
                a_r[i] = mx
            if SHFL:
                for i in range(TM):
                    mx = a_r[i]
                    off = NTN // 2
                    while off > 0:
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, off))
                        off //= 2
                    a_r[i] = mx
            else:
                for i in range(TM):
                    red_s[rows[i], tx] = a_r[i]
                cuda.syncthreads()
                for i in range(TM):
                    mx = red_s[rows[i], 0]
                    for u in range(1, NTN):
                        mx = max(mx, red_s[rows[i], u])
                    a_r[i] = mx
                cuda.syncthreads()

            # -- update m_i and l_i, rescale acc --
            for i in range(TM):
                m_new = max(m_i[i], a_r[i])
                m_use = float32(0.0) if m_new == NEG_INF else m_new
                alpha = math.exp(m_i[i] - m_use)
                rs = float32(0.0)
                for j in range(TN):
                    p = math.exp(s[i, j] - m_use)
                    s[i, j] = p
                    rs += p
                l_i[i] = l_i[i] * alpha + rs
                m_i[i] = m_new
                for c in range(DN):
                    acc[i, c] *= alpha

            # -- dropout on P (normaliser l_i stays undropped) --
            if DROPOUT:
                for i in range(TM):
                    for j in range(TN):
                        if keep_bit(h_row[i], col0 + cols[j], keep_threshold):
                            s[i, j] *= keep_scale
                        else:
                            s[i, j] = float32(0.0)

            for i in range(TM):
                for j in range(TN):
                    p_s[rows[i], cols[j]] = s[i, j]
            cuda.syncthreads()

            # -- acc += P V --
            for jj in range(BN):
                for i in range(TM):
                    a_r[i] = p_s[rows[i], jj]
                for c in range(DN):
                    v_r[c] = v_s[jj, dcols[c]]
                for i in range(TM):
                    for c in range(DN):
                        acc[i, c] += a_r[i] * v_r[c]

        # -- reduce the partial row sums, one rescale, write O and lse --
        if SHFL:
            for i in range(TM):
                ls = l_i[i]
                off = NTN // 2
                while off > 0:
                    ls += cuda.shfl_xor_sync(0xFFFFFFFF, ls, off)
                    off //= 2
                l_i[i] = ls
        else:
            cuda.syncthreads()
            for i in range(TM):
                red_s[rows[i], tx] = l_i[i]
            cuda.syncthreads()
            for i in range(TM):
                ls = float32(0.0)
                for u in range(NTN):
                    ls += red_s[rows[i], u]
                l_i[i] = ls
        for i in range(TM):
            row = row0 + rows[i]
            if row < seqlen_q:
                ls = l_i[i]
                inv = float32(0.0)
                row_lse = NEG_INF
                if ls > float32(0.0):
                    inv = float32(1.0) / ls
                    row_lse = m_i[i] + math.log(ls)
                for c in range(DN):
                    oh[row, dcols[c]] = acc[i, c] * inv
                if tx == U64(0):
                    lse[b, h, row] = row_lse

    return flash_fwd_v2


def make_forward_kernel_v3(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                           dropout: bool, use_shfl: bool):
    """`make_forward_kernel_v2` with flattened shared-memory tiles and hoisted offsets.

    Q, K, V and P live in 1-D shared arrays; each thread computes the base offsets of its
    micro-tile rows and columns once (``row * stride``, unsigned), so an inner-loop shared
    access is ``base + kk`` instead of a 2-D index with a multiply per access. The Q.K^T and
    P.V loops over the head dim and the K tile are split into an outer loop and an inner
    loop of compile-time trip count ``UNROLL`` (fully unrolled by the compiler), so the inner
    accesses use immediate offsets from one per-iteration base.

    Kernel signature and grid as `make_forward_kernel`.
    """
    BM, BN, TM, TN = cfg.block_m, cfg.block_n, cfg.tm, cfg.tn
    D = head_dim
    NTM, NTN = BM // TM, BN // TN
    NTHREADS = NTM * NTN
    DN = D // NTN
    DPAD = D + 1                      # odd row stride: column reads hit distinct banks
    PPAD = BN + NTN                   # P rows: the NTN-wide row groups of a warp land apart
    LOAD_Q = (BM * D + NTHREADS - 1) // NTHREADS
    LOAD_KV = (BN * D + NTHREADS - 1) // NTHREADS
    UK = 8 if D % 8 == 0 else 1       # inner unroll of the head-dim loop (Q.K^T)
    UJ = 8 if BN % 8 == 0 else 1      # inner unroll of the key loop (P.V)
    # shared-array lengths: closure constants (a product computed inside the kernel is not one)
    Q_LEN, KV_LEN, P_LEN, RED_LEN = BM * DPAD, BN * DPAD, BM * PPAD, BM * NTN
    CAUSAL, HAS_MASK, DROPOUT, SHFL = causal, has_mask, dropout, use_shfl

    @cuda.jit
    def flash_fwd_v3(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
                     n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale):
        tid = U64(cuda.threadIdx.x)
        tx = tid % U64(NTN)
        ty = tid // U64(NTN)
        bh = cuda.blockIdx.y
        n_heads = q.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        m_blk = n_blocks_q - 1 - cuda.blockIdx.x       # heaviest causal tiles first
        row0 = U64(m_blk) * U64(BM)
        seqlen_q = U64(q.shape[2])
        seqlen_k = U64(k.shape[2])
        qh = q[b, h]
        kh = k[b, hk]
        vh = v[b, hk]
        oh = out[b, h]
        mb = b if mask.shape[0] > 1 else 0
        mh = h if mask.shape[1] > 1 else 0
        mrow_bcast = mask.shape[2] == 1

        q_s = cuda.shared.array(Q_LEN, float32)
        k_s = cuda.shared.array(KV_LEN, float32)
        v_s = cuda.shared.array(KV_LEN, float32)
        p_s = cuda.shared.array(P_LEN, float32)
        red_s = cuda.shared.array(RED_LEN, float32)

        # -- load the Q tile, pre-multiplied by the softmax scale --
        for it in range(LOAD_Q):
            e = tid + U64(it * NTHREADS)
            if e < U64(BM * D):
                r = e // U64(D)
                c = e % U64(D)
                val = float32(0.0)
                if row0 + r < seqlen_q:
                    val = float32(qh[row0 + r, c]) * sm_scale
                q_s[r * U64(DPAD) + c] = val

        m_i = cuda.local.array(TM, float32)
        l_i = cuda.local.array(TM, float32)          # per-thread partial row sums
        acc = cuda.local.array((TM, DN), float32)
        s = cuda.local.array((TM, TN), float32)
        a_r = cuda.local.array(TM, float32)
        b_r = cuda.local.array(TN, float32)
        v_r = cuda.local.array(DN, float32)
        h_row = cuda.local.array(TM, np.uint64)
        rows = cuda.local.array(TM, np.uint64)        # this thread's tile rows
        cols = cuda.local.array(TN, np.uint64)        # ... tile columns of S
        qb = cuda.local.array(TM, np.uint64)          # q_s offsets of its rows
        kb = cuda.local.array(TN, np.uint64)          # k_s offsets of its columns' keys
        pb = cuda.local.array(TM, np.uint64)          # p_s offsets of its rows
        for i in range(TM):
            rows[i] = ty + U64(NTM * i)
            qb[i] = rows[i] * U64(DPAD)
            pb[i] = rows[i] * U64(PPAD)
        for j in range(TN):
            cols[j] = tx + U64(NTN * j)
            kb[j] = cols[j] * U64(DPAD)
        for i in range(TM):
            m_i[i] = NEG_INF
            l_i[i] = float32(0.0)
            for c in range(DN):
                acc[i, c] = float32(0.0)
            if DROPOUT:
                h_row[i] = row_hash(seed_prefix, bh, row0 + rows[i])

        sched = b * sched_sb + h * sched_sh
        t0 = kv_off[sched, m_blk]
        t1 = kv_off[sched, m_blk + 1]
        for t in range(t0, t1):
            col0 = U64(kv_idx[t]) * U64(BN)
            cuda.syncthreads()                         # previous tile fully consumed
            # -- load K and V tiles --
            for it in range(LOAD_KV):
                e = tid + U64(it * NTHREADS)
                if e < U64(BN * D):
                    r = e // U64(D)
                    c = e % U64(D)
                    kv = float32(0.0)
                    vv = float32(0.0)
                    if col0 + r < seqlen_k:
                        kv = float32(kh[col0 + r, c])
                        vv = float32(vh[col0 + r, c])
                    k_s[r * U64(DPAD) + c] = kv
                    v_s[r * U64(DPAD) + c] = vv
            cuda.syncthreads()

            # -- compute qk --
            for i in range(TM):
                for j in range(TN):
                    s[i, j] = float32(0.0)
            for k0 in range(0, D, UK):
                for u in range(UK):
                    kk = U64(k0 + u)
                    for i in range(TM):
                        a_r[i] = q_s[qb[i] + kk]
                    for j in range(TN):
                        b_r[j] = k_s[kb[j] + kk]
                    for i in range(TM):
                        for j in range(TN):
                            s[i, j] += a_r[i] * b_r[j]

            # -- mask: bounds, causal, boolean mask --
            for i in range(TM):
                row = row0 + rows[i]
                for j in range(TN):
                    col = col0 + cols[j]
                    ok = col < seqlen_k
                    if CAUSAL:
                        ok = ok and col <= row
                    if HAS_MASK:
                        if ok and row < seqlen_q:
                            mr = U64(0) if mrow_bcast else row
                            ok = mask[mb, mh, mr, col] != 0
                    if not ok:
                        s[i, j] = NEG_INF

            # -- row max across the row group --
            for i in range(TM):
                mx = s[i, 0]
                for j in range(1, TN):
                    mx = max(mx, s[i, j])
                a_r[i] = mx
            if SHFL:
                for i in range(TM):
                    mx = a_r[i]
                    off = NTN // 2
                    while off > 0:
                        mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, off))
                        off //= 2
                    a_r[i] = mx
            else:
                for i in range(TM):
                    red_s[rows[i] * U64(NTN) + tx] = a_r[i]
                cuda.syncthreads()
                for i in range(TM):
                    mx = red_s[rows[i] * U64(NTN)]
                    for u in range(1, NTN):
                        mx = max(mx, red_s[rows[i] * U64(NTN) + U64(u)])
                    a_r[i] = mx
                cuda.syncthreads()

            # -- update m_i and l_i, rescale acc --
            for i in range(TM):
                m_new = max(m_i[i], a_r[i])
                m_use = float32(0.0) if m_new == NEG_INF else m_new
                alpha = math.exp(m_i[i] - m_use)
                rs = float32(0.0)
                for j in range(TN):
                    p = math.exp(s[i, j] - m_use)
                    s[i, j] = p
                    rs += p
                l_i[i] = l_i[i] * alpha + rs
                m_i[i] = m_new
                for c in range(DN):
                    acc[i, c] *= alpha

            # -- dropout on P (normaliser l_i stays undropped) --
            if DROPOUT:
                for i in range(TM):
                    for j in range(TN):
                        if keep_bit(h_row[i], col0 + cols[j], keep_threshold):
                            s[i, j] *= keep_scale
                        else:
                            s[i, j] = float32(0.0)

            for i in range(TM):
                for j in range(TN):
                    p_s[pb[i] + cols[j]] = s[i, j]
            cuda.syncthreads()

            # -- acc += P V --
            for j0 in range(0, BN, UJ):
                for u in range(UJ):
                    jj = U64(j0 + u)
                    for i in range(TM):
                        a_r[i] = p_s[pb[i] + jj]
                    vb = jj * U64(DPAD) + tx
                    for c in range(DN):
                        v_r[c] = v_s[vb + U64(NTN * c)]
                    for i in range(TM):
                        for c in range(DN):
                            acc[i, c] += a_r[i] * v_r[c]

        # -- reduce the partial row sums, one rescale, write O and lse --
        if SHFL:
            for i in range(TM):
                ls = l_i[i]
                off = NTN // 2
                while off > 0:
                    ls += cuda.shfl_xor_sync(0xFFFFFFFF, ls, off)
                    off //= 2
                l_i[i] = ls
        else:
            cuda.syncthreads()
            for i in range(TM):
                red_s[rows[i] * U64(NTN) + tx] = l_i[i]
            cuda.syncthreads()
            for i in range(TM):
                ls = float32(0.0)
                for u in range(NTN):
                    ls += red_s[rows[i] * U64(NTN) + U64(u)]
                l_i[i] = ls
        for i in range(TM):
            row = row0 + rows[i]
            if row < seqlen_q:
                ls = l_i[i]
                inv = float32(0.0)
                row_lse = NEG_INF
                if ls > float32(0.0):
                    inv = float32(1.0) / ls
                    row_lse = m_i[i] + math.log(ls)
                for c in range(DN):
                    oh[row, tx + U64(NTN * c)] = acc[i, c] * inv
                if tx == U64(0):
                    lse[b, h, row] = row_lse

    return flash_fwd_v3
