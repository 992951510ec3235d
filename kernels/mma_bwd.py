"""Tensor-core FlashAttention-2 backward for float16/bfloat16 CUDA inputs (Numba + inline PTX).

This is the ``mma`` family's backward, in one of two structures (``KernelConfig.backward_dq``,
default `dq_mode`: "atomic" at d = 128 on compute capability 9.0 and later unless torch's
deterministic algorithms are on, else "kernel").

**"kernel"**: two kernels, each shaped like the forward of `kernels.mma_fwd` (operands in
registers, no shared-memory round trip of P or dS, no atomics):

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

**"atomic"** (FlashAttention-2's structure, five matmul passes): a pre-pass (`_row_warp_kernel`:
delta and a zeroed float32 dQ accumulator, a warp per query row), the dK/dV kernel above with
its K tile in shared memory, which after dK += dS^T Q of each 16-query step writes dS (queries x
keys, halves) to shared memory and, once per Q tile, adds the tile's dQ = dS K, its warps in the
grid of `sim.plans.tensor_core_bwd.mma_dq_atomic_layout`, with ``red.global.add.v2.f32``
(``red.global.add.f32`` before sm_90), and a conversion
(dQ = scale * accumulator in the input dtype). dQ's summation order then varies from run to run.

Both grids are (tiles, batch*heads); which block works on which (tile, head) is the launch order
of `kernels.tile_scheduler`: tiles first, or, under a causal mask, heads first within groups of
four heads (`tile_scheduler.DEFAULT_HEAD_GROUP`, measured with ``python -m benchmarks tune``).

Here Z = keep / (1 - p) is the dropout factor regenerated from the `ioaware.dropout` hash
(Z = 1 without dropout) and delta = rowsum(dO * O) with O the dropped-out output, so
delta = rowsum(P * dP * Z). The two kernels recompute S and P (and dP) each: seven matmul-sized
passes instead of FlashAttention-2's five, the price of writing dQ without float32 atomics.
All products accumulate in float32; P and dS are rounded to the input dtype before their mma
(as FlashAttention-2 does); dQ, dK, dV are written in the input dtype.

This is the ``mma`` family's backward: head_dim 64 and 128, float16 (NumPy or torch arrays) and
bfloat16 (torch), causal, boolean masks, block-sparse masks whose tiles are multiples of 16,
dropout, GQA/MQA, Nq != Nk. `supports` says why it refuses anything else (and under the CUDA
simulator, which runs no inline PTX), and the registry then runs the CUDA-core family.
"""
from __future__ import annotations

import sys

from sim.plans.tensor_core_bwd import MMA_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from sim.plans.tensor_core_bwd import STATIC_SMEM_LIMIT_BYTES as SMEM_LIMIT_BYTES
from sim.plans import plan_for
from sim.plans.tensor_core_bwd import launch_of
from sim.plans.tensor_core_bwd import mma_default_tiles as default_tiles
from sim.plans.tensor_core_bwd import mma_dq_atomic_layout as dq_atomic_layout
from sim.plans.tensor_core_bwd import mma_default_dq_mode as default_dq_mode
from sim.plans.tensor_core_bwd import red_adds_pairs
from sim.plans.tensor_core_bwd import mma_dkdv_smem_bytes as dkdv_smem_bytes
from sim.plans.tensor_core_bwd import mma_dq_smem_bytes as dq_smem_bytes
from sim.plans.tensor_core_bwd import mma_k_in_shared as k_in_shared
from sim.plans.tensor_core_bwd import ROW_KERNEL_WARPS as ROW_WARPS

from . import compile_cache, host, softmax, tile_scheduler
from .config import backward_tiles
from .copy import tile_loader
from .dropout import dropout_constants, fmix_device
from .mask import band_arguments, score_mask, tile_needs_mask, transposed_score_mask

__all__ = ["backward", "prepare", "plan", "backward_plan", "supports", "tiles", "default_tiles",
           "dq_mode", "dq_mode_by", "get_prepass_kernel", "get_convert_kernel", "dq_red_adder",
           "dq_smem_bytes", "dkdv_smem_bytes", "k_in_shared", "get_dq_kernel", "get_dkdv_kernel",
           "SUPPORTED_HEAD_DIMS", "SMEM_LIMIT_BYTES"]

#: The layout facts imported above (default tiles, shared memory, K in shared memory at d=128)
#: are the plan's (`sim.plans.tensor_core_bwd`): the launcher and the cost model read the same
#: ones. Both kernels declare static shared memory only (at most ``SMEM_LIMIT_BYTES``).
DTYPES = ("float16", "bfloat16")
LOG2E = softmax.LOG2E

#: These kernels take a sliding window (the band in `kernels.mask`).
TAKES_WINDOW = True


def get_dq_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
                  head_group, window=False):
    """The compiled-on-first-launch dQ kernel for one configuration (cached); ``head_group``
    is the launch order (`kernels.tile_scheduler`); ``window``: the band test
    (`kernels.mask.band_arguments`)."""
    key = ("dq", head_dim, block_q, block_k, bool(is_bf16), bool(causal), bool(has_mask),
           bool(has_dropout), int(head_group), bool(window))
    return compile_cache.built(_build_dq_kernel, *key[1:])


def get_dkdv_kernel(head_dim, block_k, block_q, is_bf16, causal, has_mask, has_dropout,
                    head_group, window=False, dq_atomic=False):
    """The compiled-on-first-launch dK/dV kernel (``block_k`` key rows per block, ``block_q``
    queries per stage) for one configuration (cached); as `get_dq_kernel`; ``dq_atomic``: it
    also adds dS K into the float32 dQ accumulator."""
    key = ("dkdv", head_dim, block_k, block_q, bool(is_bf16), bool(causal), bool(has_mask),
           bool(has_dropout), int(head_group), bool(window), dq_atomic)
    return compile_cache.built(_build_dkdv_kernel, *key[1:])


def _build_dq_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
                     head_group, window=False):
    from numba import cuda, float32, uint16, uint32, uint64

    from . import ptx

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + 8                      # halves per shared row (16-byte pad)
    TILE = BK * STRIDE                  # halves per K or V buffer
    SMEM_HALVES = 4 * TILE              # K0 | V0 | K1 | V1
    CHUNKS = D // 8                     # 16-byte chunks per row
    KC = D // 16                        # k-steps over the head dim
    NT_S = BK // 8                      # 16x8 score tiles per warp
    KC_P = BK // 16                     # k-steps of dQ += dS K
    NT_O = D // 8                       # 16x8 dQ tiles per warp
    A_REGS, S_REGS, O_REGS = KC * 4, NT_S * 4, NT_O * 4
    assert BQ % 16 == 0 and BK % 16 == 0 and D % 16 == 0
    mma_op = ptx.mma_bf16 if is_bf16 else ptx.mma_f16
    mma_x2 = ptx.mma_pair(mma_op)                 # two products of one A fragment
    pack = ptx.pack_bf16x2 if is_bf16 else ptx.pack_f16x2
    unpack = ptx.unpack_bf16x2 if is_bf16 else ptx.unpack_f16x2
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    fmix = fmix_device()
    mask_scores = score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK, window)
    dq_row_stats = softmax.dq_row_stats(HAS_DROPOUT)

    load_tile = tile_loader(BK, CHUNKS, THREADS, 2 * STRIDE)   # one K or V tile

    tile_and_head = tile_scheduler.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, dout, lse, delta, dq, offsets, kv_index, sched_b, sched_h, group,
               n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash, threshold,
               inv_keep, band_lo, band_hi):
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
                    qv = ptx.ld_global_u32(ptx.global_addr(q, b, h, row, col))
                    dv = ptx.ld_global_u32(ptx.global_addr(dout, b, h, row, col))
                    ov = ptx.ld_global_u32(ptx.global_addr(out, b, h, row, col))
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

        # this thread's cp.async chunks: rows r_copy + i * (THREADS // CHUNKS), one column chunk
        r_copy = tid // CHUNKS
        ch = tid % CHUNKS
        k_head = ptx.global_addr(k, b, hk, 0, ch * 8)
        v_head = ptx.global_addr(v, b, hk, 0, ch * 8)
        k_row_bytes = uint64(k.strides[2])
        v_row_bytes = uint64(v.strides[2])
        k_copy = ptx.shared_addr(smem, r_copy * STRIDE + ch * 8)
        v_copy = k_copy + uint32(2 * TILE)

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k_head, k_row_bytes, n0 * BK + r_copy, n_k, k_copy, r_copy)
            load_tile(v_head, v_row_bytes, n0 * BK + r_copy, n_k, v_copy, r_copy)
            ptx.cp_async_commit()

        for it in range(start, stop):
            buf = ((it - start) & 1) * 2 * TILE
            n_blk = kv_index[it]
            if it + 1 < stop:
                nxt = kv_index[it + 1]
                nbuf = uint32(2 * (2 * TILE - buf))
                load_tile(k_head, k_row_bytes, nxt * BK + r_copy, n_k, k_copy + nbuf, r_copy)
                load_tile(v_head, v_row_bytes, nxt * BK + r_copy, n_k, v_copy + nbuf, r_copy)
                ptx.cp_async_commit()
                ptx.cp_async_wait_1()
            else:
                ptx.cp_async_wait_all()
            cuda.syncthreads()

            # -- compute qk and dO V^T: one ldmatrix of K (V) feeds two mma --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
                dp_reg[i] = float32(0.0)
            k_addr = ptx.shared_addr(smem, buf + b_lane)
            v_addr = ptx.shared_addr(smem, buf + TILE + b_lane)
            for kc in range(KC):
                a = kc * 4
                for ntp in range(NT_S // 2):
                    j = 8 * ntp
                    off = 2 * (16 * ntp * STRIDE + 16 * kc)
                    bk = ptx.ldmatrix_x4(k_addr + off)
                    mma_x2(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk, s_reg, j)
                    bv = ptx.ldmatrix_x4(v_addr + off)
                    mma_x2(dof[a], dof[a + 1], dof[a + 2], dof[a + 3], bv, dp_reg, j)

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            mask_scores(s_reg, 0, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                        mask_h, mask_q, band_lo, band_hi)

            # -- P = exp2(S * scale * log2e - lse2), dS = P * (dP * Z - delta) --
            for nt in range(NT_S):
                for i in range(4):
                    e = nt * 4 + i
                    r = i >> 1
                    p = ptx.ex2(s_reg[e] * scale_log2 - lse2_r[r])
                    dpv = dp_reg[e]
                    if HAS_DROPOUT:
                        col = col_base + nt * 8 + (i & 1)
                        keep = fmix(h_row[r] ^ uint64(col)) >= uint64(threshold)
                        dpv = dpv * inv_keep if keep else float32(0.0)
                    s_reg[e] = p * (dpv - delta_r[r])

            # -- dS to half in registers, dQ += dS K: one ldmatrix.trans of K feeds two mma --
            kt_addr = ptx.shared_addr(smem, buf + t_lane)
            for kcp in range(KC_P):
                j = 8 * kcp
                a0 = pack(s_reg[j], s_reg[j + 1])
                a1 = pack(s_reg[j + 2], s_reg[j + 3])
                a2 = pack(s_reg[j + 4], s_reg[j + 5])
                a3 = pack(s_reg[j + 6], s_reg[j + 7])
                for ntp in range(NT_O // 2):
                    bk = ptx.ldmatrix_x4_trans(kt_addr + 2 * (16 * kcp * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    mma_x2(a0, a1, a2, a3, bk, acc, o)
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        # -- epilogue: dQ = scale * acc as packed halves --
        for r in range(2):
            row = row0 + 8 * r
            if row < n_q:
                for nt in range(NT_O):
                    word = pack(acc[nt * 4 + 2 * r] * scale, acc[nt * 4 + 2 * r + 1] * scale)
                    ptx.st_global_u32(ptx.global_addr(dq, b, h, row, nt * 8 + 2 * tig), word)

    kernel.threads = THREADS
    kernel.smem_bytes = 0                                # static shared memory only
    return kernel


def _build_dkdv_kernel(head_dim, block_k, block_q, is_bf16, causal, has_mask, has_dropout,
                       head_group, window=False, dq_atomic=False):
    from numba import cuda, float32, uint16, uint32, uint64

    from . import ptx

    D = head_dim
    BK = block_k                        # key rows per block (16 per warp)
    BQ = block_q                        # queries per shared stage
    NUM_WARPS = BK // 16
    THREADS = 32 * NUM_WARPS
    STRIDE = D + 8
    TILE = BQ * STRIDE                  # halves per Q or dO buffer
    KSMEM = k_in_shared(D)              # K fragments re-read from shared memory
    ATOMIC = bool(dq_atomic)            # dQ += dS K here, by float32 atomics
    RED_V2 = dq_atomic == "v2"          # ... two floats per red instruction (sm_90)
    KTILE = KSMEM or ATOMIC             # the block's K tile in shared memory
    K_HALVES = BK * STRIDE if KTILE else 0
    DS_STRIDE = BK + 8                  # halves per row of dS (queries x keys)
    DS_TILE = BQ * DS_STRIDE            # dS of a visited tile (atomic)
    DS_BASE = 4 * TILE + K_HALVES
    SMEM_HALVES = DS_BASE + (DS_TILE if ATOMIC else 0)      # Q0|dO0|Q1|dO1 (|K) (|dS)
    SMEM_DECL = 0 if ATOMIC else SMEM_HALVES                # atomic: dynamic shared memory
    # atomic: dQ = dS K once per tile, warps in a WQ x WD grid, each QW rows x DW columns in
    # DQ_PASSES passes of DC columns (the plan's layout)
    WQ, WD, DQ_PASSES = dq_atomic_layout(D, BQ, BK) if ATOMIC else (1, 1, 1)
    QW, DW, DC, MT_Q, NT_Q, DQ_REGS = dq_warp_tiles(D, BQ, WQ, WD, DQ_PASSES)
    DA_REGS = 4 * MT_Q                  # dS A fragments of one 16-key step
    ROWV = 4 * BQ                       # floats: lse2 | delta, two buffers
    CHUNKS = D // 8
    KC = D // 16                        # k-steps over the head dim
    STEPS = BQ // 16                    # 16-query steps per stage
    NT_O = D // 8                       # 16x8 dK / dV tiles per warp
    A_REGS, O_REGS = KC * 4, NT_O * 4
    KF_REGS = 4 if KSMEM else A_REGS
    assert BQ % 16 == 0 and BK % 16 == 0 and D % 16 == 0
    mma_op = ptx.mma_bf16 if is_bf16 else ptx.mma_f16
    mma_x2 = ptx.mma_pair(mma_op)                 # two products of one A fragment
    pack = ptx.pack_bf16x2 if is_bf16 else ptx.pack_f16x2
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout
    fmix = fmix_device()

    load_tile = tile_loader(BQ, CHUNKS, THREADS, 2 * STRIDE)   # one Q or dO tile
    load_k_tile = tile_loader(BK, CHUNKS, THREADS, 2 * STRIDE)
    add_dq = dq_red_adder(MT_Q, NT_Q, RED_V2)
    stage_rows = softmax.stage_rows(BQ, THREADS)
    cursor_start, cursor_advance = tile_scheduler.gqa_cursor()
    mask_scores_t = transposed_score_mask(2, CAUSAL, HAS_MASK, window)
    needs_mask_at = tile_needs_mask(BQ, BK, CAUSAL, HAS_MASK, window)

    tile_and_head = tile_scheduler.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, dout, lse, delta, dk, dv, dq_acc, offsets, q_index, sched_b, sched_h,
               group, n_q, n_k, mask, mask_b, mask_h, mask_q, scale_log2, scale, seed_hash,
               threshold, inv_keep, band_lo, band_hi):
        smem = cuda.shared.array(SMEM_DECL, dtype=uint16, alignment=16)
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
                        kv_ = ptx.ld_global_u32(ptx.global_addr(k, b, hk, key, col))
                    vv = ptx.ld_global_u32(ptx.global_addr(v, b, hk, key, col))
                if not KSMEM:
                    kf[kc * 4 + r] = kv_
                vf[kc * 4 + r] = vv
        # this thread's cp.async chunks: rows r_copy + i * (THREADS // CHUNKS), one column chunk
        r_copy = tid // CHUNKS
        ch = tid % CHUNKS
        q_row_bytes = uint64(q.strides[2])
        do_row_bytes = uint64(dout.strides[2])
        q_copy = ptx.shared_addr(smem, r_copy * STRIDE + ch * 8)
        do_copy = q_copy + uint32(2 * TILE)
        if KTILE:
            # -- the block's K tile into shared memory (first cp.async group) --
            load_k_tile(ptx.global_addr(k, b, hk, 0, ch * 8), uint64(k.strides[2]),
                        n_blk * BK + r_copy, n_k, q_copy + uint32(2 * 4 * TILE), r_copy)

        dk_acc = cuda.local.array(O_REGS, dtype=float32)
        dv_acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            dk_acc[i] = float32(0.0)
            dv_acc[i] = float32(0.0)
        st = cuda.local.array(8, dtype=float32)      # S^T, then P^T * Z: 16 keys x 16 queries
        dpt = cuda.local.array(8, dtype=float32)     # dP^T, then dS^T
        hash_c = cuda.local.array(4, dtype=uint64)   # dropout row hash per query column
        # per stage: lse * log2(e) (+inf where P = 0) and delta of its BQ queries
        # buf 0: lse2 | delta, buf 1: same (aligned: read as float pairs, ld.shared.v2.f32)
        rowv = cuda.shared.array(ROWV, dtype=float32, alignment=16)

        b_lane = (lane % 8 + 8 * (lane // 16)) * STRIDE + 8 * ((lane // 8) % 2)
        t_row = lane % 8 + 8 * ((lane // 8) % 2)         # the t_lane pattern's row and column
        t_col = 8 * (lane // 16)
        t_lane = t_row * STRIDE + t_col
        # A fragments of this warp's 16 K rows (the Q pattern of kernels.fragments)
        k_addr = ptx.shared_addr(smem, 4 * TILE + warp * 16 * STRIDE + t_lane)
        # atomic: B fragments of K for this warp's dQ columns, A fragments of its dS rows
        wq = warp // WD
        wd = warp % WD
        kq_addr = ptx.shared_addr(smem, 4 * TILE + wd * DW + t_lane)
        ds_addr = ptx.shared_addr(smem, DS_BASE + wq * QW * DS_STRIDE + t_row * DS_STRIDE + t_col)
        # this thread's dS^T elements (keys warp*16 + gid (+ 8), queries 2 tig (+ 1)) in dS
        ds_st_addr = ptx.shared_addr(smem, DS_BASE + 2 * tig * DS_STRIDE + warp * 16 + gid)
        # lse2 and delta of this thread's query columns 2 tig, 2 tig + 1 (buffer 0, step 0)
        rowv_addr = ptx.shared_addr(rowv, 2 * tig)
        dq_part = cuda.local.array(DQ_REGS, dtype=float32)
        da = cuda.local.array(DA_REGS, dtype=uint32)
        dq_row_bytes = uint64(dq_acc.strides[2])

        # the sweep over (query head of the group, Q tile): a cursor (head g_c, its schedule
        # entries lo_c .. lo_c + cnt_c, entry j_c) at the item being prefetched
        n_items, g_c, lo_c, cnt_c = cursor_start(offsets, b, hk, group, sched_b, sched_h, n_blk)
        j_c = 0
        h_n = hk * group + g_c
        m_n = 0
        if n_items > 0:
            m_n = q_index[lo_c]
            load_tile(ptx.global_addr(q, b, h_n, 0, ch * 8), q_row_bytes, m_n * BQ + r_copy, n_q,
                      q_copy, r_copy)
            load_tile(ptx.global_addr(dout, b, h_n, 0, ch * 8), do_row_bytes,
                      m_n * BQ + r_copy, n_q, do_copy, r_copy)
            ptx.cp_async_commit()
            stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 0, tid)

        for t in range(n_items):
            buf = (t & 1) * 2 * TILE
            rbuf = (t & 1) * 2 * BQ
            h = h_n
            m_blk = m_n
            if t + 1 < n_items:
                # -- advance the cursor to item t + 1 and prefetch its Q, dO, lse and delta --
                g_c, lo_c, cnt_c, j_c = cursor_advance(g_c, lo_c, cnt_c, j_c, offsets, b, hk,
                                                       group, sched_b, sched_h, n_blk)
                h_n = hk * group + g_c
                m_n = q_index[lo_c + j_c]
                nbuf = uint32(2 * (2 * TILE - buf))
                load_tile(ptx.global_addr(q, b, h_n, 0, ch * 8), q_row_bytes, m_n * BQ + r_copy,
                          n_q, q_copy + nbuf, r_copy)
                load_tile(ptx.global_addr(dout, b, h_n, 0, ch * 8), do_row_bytes,
                          m_n * BQ + r_copy, n_q, do_copy + nbuf, r_copy)
                ptx.cp_async_commit()
                stage_rows(lse, delta, b, h_n, m_n * BQ, n_q, rowv, 2 * BQ - rbuf, tid)
                ptx.cp_async_wait_1()
            else:
                ptx.cp_async_wait_all()
            cuda.syncthreads()

            bh = b * n_heads + h
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            needs_mask = needs_mask_at(m_blk, n_blk, band_lo, band_hi)
            q_addr = ptx.shared_addr(smem, buf + b_lane)
            qt_addr = ptx.shared_addr(smem, buf + t_lane)
            do_addr = ptx.shared_addr(smem, buf + TILE + b_lane)
            dot_addr = ptx.shared_addr(smem, buf + TILE + t_lane)
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
                        ka = ptx.ldmatrix_x4(k_addr + 2 * 16 * kc)
                        for i in range(4):
                            kf[i] = ka[i]
                        a = 0
                    bq = ptx.ldmatrix_x4(q_addr + off)
                    mma_x2(kf[a], kf[a + 1], kf[a + 2], kf[a + 3], bq, st, 0)
                    a = kc * 4
                    bo = ptx.ldmatrix_x4(do_addr + off)
                    mma_x2(vf[a], vf[a + 1], vf[a + 2], vf[a + 3], bo, dpt, 0)

                # -- masks (causal diagonal, boolean mask) on S^T --
                if needs_mask:
                    mask_scores_t(st, qc0, key0, b, h, n_q, n_k, mask, mask_b, mask_h, mask_q,
                                  band_lo, band_hi)

                # -- P^T = exp2(S^T * scale * log2e - lse2), Z from the dropout hash,
                #    dS^T = P^T * (dP^T * Z - delta) --
                rv = rowv_addr + uint32(4 * (rbuf + 16 * c))
                for nt in range(2):
                    lse2 = ptx.ld_shared_f32x2(rv + uint32(32 * nt))
                    dlt = ptx.ld_shared_f32x2(rv + uint32(4 * BQ + 32 * nt))
                    for i in range(4):
                        e = nt * 4 + i
                        u = 2 * nt + (i & 1)
                        p = ptx.ex2(st[e] * scale_log2 - lse2[i & 1])
                        z = float32(1.0)
                        if HAS_DROPOUT:
                            key = key0 + 8 * (i >> 1)
                            keep = fmix(hash_c[u] ^ uint64(key)) >= uint64(threshold)
                            z = inv_keep if keep else float32(0.0)
                        st[e] = p * z
                        dpt[e] = p * (dpt[e] * z - dlt[i & 1])

                # -- dV += (P^T Z) dO: A = P^T in registers, B = dO via ldmatrix.trans --
                a0 = pack(st[0], st[1])
                a1 = pack(st[2], st[3])
                a2 = pack(st[4], st[5])
                a3 = pack(st[6], st[7])
                for ntp in range(NT_O // 2):
                    bo = ptx.ldmatrix_x4_trans(dot_addr + 2 * (16 * c * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    mma_x2(a0, a1, a2, a3, bo, dv_acc, o)

                # -- dK += dS^T Q: A = dS^T in registers, B = Q via ldmatrix.trans --
                a0 = pack(dpt[0], dpt[1])
                a1 = pack(dpt[2], dpt[3])
                a2 = pack(dpt[4], dpt[5])
                a3 = pack(dpt[6], dpt[7])
                if ATOMIC:
                    # keys past n_k (their K rows are zero-filled) add nothing to dQ
                    if key0 >= n_k:
                        a0 = uint32(0)
                        a2 = uint32(0)
                    if key0 + 8 >= n_k:
                        a1 = uint32(0)
                        a3 = uint32(0)
                    # -- dS (16 queries x BK keys) to shared memory, queries as rows --
                    qa = ds_st_addr + uint32(2 * 16 * DS_STRIDE * c)
                    ptx.st_shared_b16(qa, a0)
                    ptx.st_shared_b16(qa + uint32(2 * DS_STRIDE), a0 >> 16)
                    ptx.st_shared_b16(qa + uint32(2 * 8), a1)
                    ptx.st_shared_b16(qa + uint32(2 * (DS_STRIDE + 8)), a1 >> 16)
                    ptx.st_shared_b16(qa + uint32(2 * 8 * DS_STRIDE), a2)
                    ptx.st_shared_b16(qa + uint32(2 * 9 * DS_STRIDE), a2 >> 16)
                    ptx.st_shared_b16(qa + uint32(2 * (8 * DS_STRIDE + 8)), a3)
                    ptx.st_shared_b16(qa + uint32(2 * (9 * DS_STRIDE + 8)), a3 >> 16)
                for ntp in range(NT_O // 2):
                    bq = ptx.ldmatrix_x4_trans(qt_addr + 2 * (16 * c * STRIDE + 16 * ntp))
                    o = 8 * ntp
                    mma_x2(a0, a1, a2, a3, bq, dk_acc, o)

            if ATOMIC:
                # -- dQ of the tile's queries += dS K (dS of every warp, hence the barrier):
                #    this warp's QW rows x DW columns, DC columns a pass, over the BK keys --
                cuda.syncthreads()
                for cp in range(DQ_PASSES):
                    col0 = wd * DW + cp * DC
                    for i in range(DQ_REGS):
                        dq_part[i] = float32(0.0)
                    for kcp in range(BK // 16):
                        for mt in range(MT_Q):
                            a4 = ptx.ldmatrix_x4(ds_addr + 2 * (16 * mt * DS_STRIDE + 16 * kcp))
                            for i in range(4):
                                da[4 * mt + i] = a4[i]
                        for ntp in range(NT_Q // 2):
                            bk = ptx.ldmatrix_x4_trans(
                                kq_addr + 2 * (16 * kcp * STRIDE + cp * DC + 16 * ntp))
                            for mt in range(MT_Q):
                                o = (mt * NT_Q + 2 * ntp) * 4
                                a = 4 * mt
                                mma_x2(da[a], da[a + 1], da[a + 2], da[a + 3], bk, dq_part,
                                       o)
                    # -- red.global.add of the float32 partial dQ (scaled in the conversion) --
                    row_first = m_blk * BQ + wq * QW + gid
                    add_dq(dq_part, ptx.global_addr(dq_acc, b, h, row_first, col0 + 2 * tig),
                           row_first, n_q, dq_row_bytes)
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch
        ptx.cp_async_wait_all()    # (a block with no Q tile to visit still issued its K copy)

        # -- epilogue: dK = scale * dK_acc and dV as packed halves --
        for r in range(2):
            key = key0 + 8 * r
            if key < n_k:
                for nt in range(NT_O):
                    e = nt * 4 + 2 * r
                    col = nt * 8 + 2 * tig
                    ptx.st_global_u32(ptx.global_addr(dk, b, hk, key, col),
                                    pack(dk_acc[e] * scale, dk_acc[e + 1] * scale))
                    ptx.st_global_u32(ptx.global_addr(dv, b, hk, key, col),
                                    pack(dv_acc[e], dv_acc[e + 1]))

    kernel.threads = THREADS
    kernel.smem_bytes = 2 * SMEM_HALVES if ATOMIC else 0   # atomic: dynamic shared memory
    return kernel


def dq_warp_tiles(head_dim, block_q, warps_q, warps_d, passes):
    """What one warp of an atomic dK/dV kernel computes of dQ = dS K in a ``warps_q x warps_d``
    grid with ``passes`` column passes (`sim.plans.tensor_core_bwd`'s layouts): ``(rows,
    columns, columns per pass, 16-row A fragments of dS, 8-column dQ tiles per pass, float32
    accumulators per thread)``."""
    rows = block_q // warps_q
    cols = head_dim // warps_d
    per_pass = cols // passes
    m_tiles, n_tiles = rows // 16, per_pass // 8
    return rows, cols, per_pass, m_tiles, n_tiles, 4 * m_tiles * n_tiles


def dq_red_adder(m_tiles, n_tiles, pairs):
    """``add_dq(dq_part, g_first, row_first, n_q, row_bytes)``: add a warp's float32 partial dQ
    (``m_tiles`` x ``n_tiles`` 16x8 C fragments, m-tile major, in ``dq_part``) to the float32
    accumulator with ``red.global.add`` -- two floats per instruction (``.v2``, sm_90 on) where
    ``pairs``, else one. ``g_first``: the address of this lane's first element (row
    ``row_first``, its first column); rows ``row_bytes`` apart, rows at or past ``n_q`` skipped.
    The atomic-dQ dK/dV kernels of both tensor-core backwards."""
    from numba import cuda, uint64

    from . import ptx
    MT, NT, V2 = m_tiles, n_tiles, bool(pairs)

    @cuda.jit(device=True, inline=True)
    def add_dq(dq_part, g_first, row_first, n_q, row_bytes):
        for mt in range(MT):
            for r in range(2):
                row = row_first + 16 * mt + 8 * r
                if row < n_q:
                    g_row = g_first + uint64(16 * mt + 8 * r) * row_bytes
                    for nt in range(NT):
                        e = (mt * NT + nt) * 4 + 2 * r
                        ga = g_row + uint64(4 * 8 * nt)
                        if V2:
                            ptx.red_global_add_v2_f32(ga, dq_part[e], dq_part[e + 1])
                        else:
                            ptx.red_global_add_f32(ga, dq_part[e])
                            ptx.red_global_add_f32(ga + uint64(4), dq_part[e + 1])

    return add_dq


def get_prepass_kernel(head_dim, dtype):
    """The compiled-on-first-launch pre-pass of the atomic-dQ backward (cached) for inputs of
    ``dtype`` ("float16", "bfloat16" or "float32": the 3xTF32 backward's): `_build_prepass_kernel`."""
    return compile_cache.built(_build_prepass_kernel, head_dim, _row_dtype(dtype))


def get_convert_kernel(head_dim, dtype):
    """The compiled-on-first-launch dQ conversion of the atomic-dQ backward (cached), dQ in
    ``dtype``: `_build_convert_kernel`."""
    return compile_cache.built(_build_convert_kernel, head_dim, _row_dtype(dtype))


def _row_dtype(dtype) -> str:
    dtype = str(dtype).rsplit(".", 1)[-1]
    if dtype not in ("float16", "bfloat16", "float32"):
        raise ValueError(f"dtype must be float16, bfloat16 or float32, got {dtype!r}")
    return dtype


def _build_prepass_kernel(head_dim, dtype):
    """delta = rowsum(dO * O) and a zeroed float32 dQ accumulator, grid
    (cdiv(Nq, ROW_WARPS), B * Hq): a warp per query row, lanes along the head dim (coalesced
    32-bit loads: packed halves, or floats; products in float32)."""
    return _row_warp_kernel(head_dim, "prepass", dtype)


def _build_convert_kernel(head_dim, dtype):
    """dQ = scale * dQ_acc in the input dtype (packed halves, or floats), grid as the pre-pass."""
    return _row_warp_kernel(head_dim, "convert", dtype)


def _row_warp_kernel(head_dim, job, dtype="float16"):
    from numba import cuda, float32

    from . import ptx

    D = head_dim
    F32 = dtype == "float32"
    WORDS = D // 64                     # 32-bit words (two halves) per lane
    ZEROS = D // 32                     # float32 accumulator elements per lane
    THREADS = 32 * ROW_WARPS
    pack = ptx.pack_bf16x2 if dtype == "bfloat16" else ptx.pack_f16x2
    unpack = ptx.unpack_bf16x2 if dtype == "bfloat16" else ptx.unpack_f16x2
    assert D % 64 == 0

    @cuda.jit(device=True, inline=True)
    def warp_row(n_heads):
        # -- this warp's query row and (batch, head), and the thread's lane --
        bh = cuda.blockIdx.y
        return (cuda.threadIdx.x % 32, cuda.blockIdx.x * ROW_WARPS + cuda.threadIdx.x // 32,
                bh // n_heads, bh % n_heads)

    if job == "prepass":
        @cuda.jit(lineinfo=False)
        def kernel(out, dout, delta, dq_acc, n_q):
            lane, row, b, h = warp_row(dq_acc.shape[1])
            if row < n_q:
                # -- delta = rowsum(dO * O): two halves a lane a word (or a float a lane a
                #    pass), a shuffle reduction --
                acc = float32(0.0)
                if F32:
                    for j in range(ZEROS):
                        col = lane + 32 * j
                        acc += out[b, h, row, col] * dout[b, h, row, col]
                else:
                    for j in range(WORDS):
                        col = 2 * (lane + 32 * j)
                        ow = ptx.ld_global_u32(ptx.global_addr(out, b, h, row, col))
                        gw = ptx.ld_global_u32(ptx.global_addr(dout, b, h, row, col))
                        o2 = unpack(ow)
                        g2 = unpack(gw)
                        acc += o2[0] * g2[0] + o2[1] * g2[1]
                for off in (16, 8, 4, 2, 1):
                    acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, off)
                if lane == 0:
                    delta[b, h, row] = acc
                # -- the dQ accumulator's row, zeroed --
                for j in range(ZEROS):
                    dq_acc[b, h, row, lane + 32 * j] = float32(0.0)
    else:
        @cuda.jit(lineinfo=False)
        def kernel(dq_acc, dq, n_q, scale):
            lane, row, b, h = warp_row(dq_acc.shape[1])
            if row < n_q:
                if F32:
                    # -- dQ = scale * dQ_acc, a float a lane a pass --
                    for j in range(ZEROS):
                        col = lane + 32 * j
                        dq[b, h, row, col] = dq_acc[b, h, row, col] * scale
                else:
                    # -- dQ = scale * dQ_acc, rounded to the input dtype, two elements a lane --
                    for j in range(WORDS):
                        col = 2 * (lane + 32 * j)
                        w = pack(dq_acc[b, h, row, col] * scale,
                                 dq_acc[b, h, row, col + 1] * scale)
                        ptx.st_global_u32(ptx.global_addr(dq, b, h, row, col), w)

    kernel.threads = THREADS
    kernel.smem_bytes = 0
    return kernel


# -- host side -----------------------------------------------------------------------------------
def _cc_here():
    """This process's current GPU's compute capability, None without a real GPU."""
    return host.compute_capability(host.current_device_id()) if host.real_gpu() else None


def _red_width() -> str:
    """The dK/dV kernel's atomics: "v2" (two floats a ``red``, sm_90 on) or "scalar"."""
    return "v2" if red_adds_pairs(_cc_here()) else "scalar"


def dq_mode(problem, config, head_dim=None) -> str:
    """How this backward computes dQ for ``problem`` (of which only the head dim is read; or
    None and ``head_dim`` given): ``config.backward_dq``; else "kernel"
    (deterministic) while torch's deterministic algorithms are on
    (``torch.use_deterministic_algorithms(True)``), as PyTorch's own backwards do; else the
    plan's rule for this GPU and head dim (`sim.plans.tensor_core_bwd.mma_default_dq_mode`:
    "atomic" from compute capability `sim.plans.tensor_core_bwd.ATOMIC_DQ_FROM_CC` on at
    d = 128, "kernel" otherwise)."""
    return dq_mode_by(default_dq_mode, problem, config, head_dim)


def dq_mode_by(rule, problem, config, head_dim=None) -> str:
    """A tensor-core backward's dQ mode (`dq_mode`, `kernels.tf32_bwd.dq_mode`):
    ``config.backward_dq``; else ``rule(compute capability, deterministic, head_dim=...)``, the
    family's plan rule, with this process's GPU and whether torch's deterministic algorithms
    are on."""
    if config.backward_dq is not None:
        return config.backward_dq
    torch = sys.modules.get("torch")
    deterministic = torch is not None and torch.are_deterministic_algorithms_enabled()
    d = problem.head_dim if head_dim is None else head_dim
    return rule(_cc_here(), deterministic, head_dim=d)


def tiles(problem, config=None, mode=None):
    """``(dq, dkdv)`` kernel tiles for a problem (`kernels.config.backward_tiles` of
    `default_tiles`; dQ by atomics: its own dK/dV tiles), or None when the block mask's tiles
    admit none; ``mode``: the dQ mode when the caller has it (else `dq_mode`'s for ``config``;
    without a config, the dQ kernel's)."""
    if mode is None and config is not None:
        mode = dq_mode(problem, config)
    defaults = default_tiles(problem.head_dim)
    if mode == "atomic":
        defaults = dict(defaults, dkdv=defaults["dkdv_atomic"])
    return backward_tiles(defaults, problem)


def supports(problem, config):
    """Why this backward cannot run ``problem`` (a string), or None."""
    return host.tensor_core_backward_refusal(problem, config, "the mma family", DTYPES,
                                             SUPPORTED_HEAD_DIMS, tiles(problem, config))


def backward(problem, out, lse, dout, config):
    """Half-precision tensor-core backward: ``(dq, dk, dv)`` in the problem's kind of array and
    dtype (see `kernels.backward`)."""
    return prepare(problem, config)(problem.q, problem.k, problem.v, out, lse, dout)


def plan(problem, config):
    """The `sim.plan.Plan` this backward launches for ``problem`` (`sim.plans.tensor_core_bwd`):
    its grids, threads and shared memory are what `prepare` launches; its counts are what
    `sim.plan.price` prices."""
    mode = dq_mode(problem, config)
    return backward_plan("mma", problem, config, tiles(problem, config, mode), dq_mode=mode)


def backward_plan(family: str, problem, config, tiles_, **options):
    """The plan of a tensor-core backward (``family`` "mma" or "tf32") for a kernel problem at
    the family's ``tiles_`` (``((dq_bq, dq_bk), (kv_bk, kv_bq))``, None: the block mask admits
    none, a ValueError): `sim.plans.plan_for` on the `sim.workload.Workload` of
    `kernels.host.plan_workload` with the problem's block mask, the boolean mask's shape
    (``mask_shape``) and the tiles the block mask is laid out on (``block_mask_tiles``);
    ``options``: the family's own (``dq_mode``)."""
    if tiles_ is None:
        raise ValueError(f"the block mask's tiles ({problem.block_q}, {problem.block_k}) admit no "
                         f"tiles of the {family} family's backward")
    (dq_bq, dq_bk), (kv_bk, kv_bq) = tiles_
    workload = host.plan_workload(problem, "bwd")
    block_mask_tiles = None
    if problem.block_mask is not None:
        workload = workload.replace(block_mask=problem.block_mask)
        block_mask_tiles = (problem.block_q, problem.block_k)
    return plan_for(family, "bwd", workload, dq_tile=(dq_bq, dq_bk), kv_tile=(kv_bq, kv_bk),
                    launch_order=config.launch_order,
                    mask_shape=None if problem.mask is None else tuple(problem.mask.shape),
                    block_mask_tiles=block_mask_tiles, **options)


def prepare(problem, config):
    """The backward of ``problem`` with its plan, kernels, tile schedules and constants chosen
    once: ``run(q, k, v, out, lse, dout) -> (dq, dk, dv)``
    (`kernels.host.prepare_tensor_core_backward`), launched as `plan` says."""
    pb = problem
    the_plan = plan(pb, config)
    (dq_bq, dq_bk), (kv_bq, kv_bk) = the_plan.config["dq_tile"], the_plan.config["kv_tile"]
    drop = dropout_constants(pb.seed, pb.dropout_p)
    group = tile_scheduler.head_group(config.launch_order, pb.causal, "bwd")
    causal, window, band_lo, band_hi = band_arguments(pb)
    dtype = "bfloat16" if str(pb.dtype).endswith("bfloat16") else "float16"
    features = (dtype == "bfloat16", causal, pb.mask is not None, drop.enabled, group, window)
    if the_plan.config.get("dq_mode") == "atomic":
        return host.prepare_tensor_core_backward(
            pb, config, None, None, None,
            get_dkdv_kernel(pb.head_dim, kv_bk, kv_bq, *features, dq_atomic=_red_width()),
            launch_of(the_plan, "dkdv"), tile_scheduler.device_schedule(pb, kv_bq, kv_bk, "q"),
            drop, words=True, band=(band_lo, band_hi),
            dq_acc=((get_prepass_kernel(pb.head_dim, dtype), launch_of(the_plan, "pre")),
                    (get_convert_kernel(pb.head_dim, dtype),
                     launch_of(the_plan, "convert"))))
    return host.prepare_tensor_core_backward(
        pb, config,
        get_dq_kernel(pb.head_dim, dq_bq, dq_bk, *features), launch_of(the_plan, "dq"),
        tile_scheduler.device_schedule(pb, dq_bq, dq_bk, "kv"),
        get_dkdv_kernel(pb.head_dim, kv_bk, kv_bq, *features), launch_of(the_plan, "dkdv"),
        tile_scheduler.device_schedule(pb, kv_bq, kv_bk, "q"), drop, words=True,
        band=(band_lo, band_hi), dq_acc="unused")
