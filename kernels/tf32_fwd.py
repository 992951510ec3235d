"""Tensor-core FlashAttention-2 forward for float32 CUDA inputs with 3xTF32 (Numba + inline PTX).

This is the ``tf32`` family's forward. Every float32 operand x is split (`kernels.ptx.split_tf32`)
into ``big`` (x truncated to TF32) and ``small`` (x - big, read by the tensor core rounded to
TF32) and each product is computed as ``A_small B_big + A_big B_small + A_big B_big`` on the TF32
tensor cores with float32 accumulation (CUTLASS's ``OpMultiplyAddFastF32`` with its fast
rounding, as SDPA EFFICIENT's float32 kernels): the dropped ``A_small B_small`` and the rounding
of ``small`` are at most ~2**-19 of each product's ``|a| |b|``, so the result has float32-level
accuracy.

The algorithm is FlashAttention-2, structured as `kernels.mma_fwd`:

* one thread block per (Q tile of ``block_q = 16 * num_warps`` rows, batch * head), longest
  causal tiles first (of all heads: `kernels.tile_scheduler`); each warp owns 16 query rows,
  with the running max ``m_i``, running sum ``l_i`` and O accumulator in registers;
* each K/V tile lands raw by ``cp.async`` in one stage (V copied so a thread holds key pairs
  2p, 2p + 1); each thread splits the 16-byte chunks it copied (visible to it after its own
  wait) into a big/small shared stage laid out as the B fragments (K: per key and (k-step, t)
  16 bytes big2|small2; V: per key pair and dim 16 bytes big2|small2; XOR-swizzled,
  conflict-free 128-bit loads), one ``__syncthreads``, then the next tile's copy is issued and
  the warps run both products with one 128-bit load per B fragment and no conversion. Q's
  big/small fragments sit in shared memory too, 32 bytes per thread and k-step that only that
  thread reads back, which keeps the kernel at 178 registers (d=128; 134 at d=64) without
  spills. With 32-key stages there is one split stage (a second barrier after the products);
  with 16-key stages two, used alternately. Default tiles 128 x 32 at both head dims (8 warps,
  dynamic shared memory through `kernels.host.launch`, 224 KiB at d=128);
* the tail tile is zero-filled by the copy itself;
* S = Q K^T and O += P V with ``mma.sync.m16n8k8`` tf32, three mma per product tile; the k index
  of both products is permuted (`kernels.fragments_tf32.k_perm`) so that the C fragment of the
  scores *is* P's A fragment (no shared memory round trip for P);
* online softmax with exp2 and ``log2(e)`` folded into the scale; one rescale at the end; O and
  the float32 natural-log logsumexp written once;
* the visited K/V tiles come from `ioaware.block_info.BlockInfo.kv_schedule()` (causal and
  block-sparse skipping), elementwise masks only on tiles that need them; dropout regenerates the
  keep bits of `ioaware.dropout` on the fly; GQA/MQA through ``h // (Hq // Hkv)``.

Supported: head_dim 64 and 128, float32, on a real GPU of compute capability 8.0 or later, tiles
whose copy assignment the split layout can use (`presplit_ok`). `supports` says why it refuses
anything else, and the registry then runs the CUDA-core family. The design notes (what the
register-split, raw-Q and two-accumulator variants measured before they were dropped) are in
docs/kernels.md.
"""
from __future__ import annotations

import math

from . import compile_cache, host, tile_scheduler
from .config import requested_tiles
from .dropout import dropout_constants, fmix_device
from .mask import band_arguments, score_mask

__all__ = ["forward", "prepare", "plan", "supports", "tiles", "default_blocks", "smem_bytes", "presplit_ok",
           "get_kernel", "SUPPORTED_HEAD_DIMS", "BLOCK_Q_CHOICES", "BLOCK_K_CHOICES"]

from sim.plans.tensor_core_fwd import TF32_BLOCK_K_CHOICES as BLOCK_K_CHOICES
from sim.plans.tensor_core_fwd import TF32_BLOCK_Q_CHOICES as BLOCK_Q_CHOICES
from sim.plans.tensor_core_fwd import TF32_DEFAULT_BLOCKS as DEFAULT_BLOCKS
from sim.plans.tensor_core_fwd import TF32_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from sim.plans.tensor_core_fwd import tf32_presplit_ok as presplit_ok
from sim.plans.tensor_core_fwd import tf32_smem_bytes as smem_bytes

#: The layout facts above (tiles, shared memory, the split layout's rule) are the plan's
#: (`sim.plans`): the launcher and the cost model read the same ones.
DTYPES = ("float32",)
S_UNROLL = 2                         # k-steps of S = Q K^T per iteration of its loop as written
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

#: This forward takes a sliding window (the band test in `kernels.mask.score_mask`).
TAKES_WINDOW = True


def default_blocks(head_dim: int) -> tuple[int, int]:
    """Default (block_q, block_k): 128 x 32 for d=64 and d=128, the fastest measured on an
    H100 (docs/kernels.md)."""
    return DEFAULT_BLOCKS


def get_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, head_group,
               window=False):
    """The compiled-on-first-launch kernel for one configuration (cached); ``head_group`` is
    the launch order (`kernels.tile_scheduler`). ``kernel.smem_bytes`` is its dynamic shared
    memory."""
    key = (head_dim, block_q, block_k, bool(causal), bool(has_mask), bool(has_dropout),
           int(head_group), bool(window))
    return compile_cache.built(_build_kernel, *key)


def _build_kernel(head_dim, block_q, block_k, causal, has_mask, has_dropout, head_group,
                  window=False):
    from numba import cuda, float32, uint32, uint64

    from . import ptx

    D = head_dim
    BQ = block_q
    BK = block_k
    NUM_WARPS = BQ // 16
    THREADS = 32 * NUM_WARPS
    SU = S_UNROLL                       # k-steps of S per iteration of its loop as written
    NSPLIT = 2 if block_k <= 16 else 1  # split stages: 2 need one barrier a tile
    CHUNKS = D // 4                     # 16-byte chunks per row
    LOADS = BK * CHUNKS // THREADS      # cp.async per thread per K (or V) tile
    ROW_STEP = THREADS // CHUNKS        # rows between a thread's successive chunks
    K_STRIDE = D                        # raw rows, unpadded (each thread reads its own chunks)
    KS_STRIDE = 2 * D                   # split K row: per (k-step, t) 16 bytes big2 | small2,
    VS_STRIDE = 4 * D                   # split V key pair: per dim 16 bytes big2 | small2
    K_TILE = BK * D                     # (both XOR-swizzled, see presplit_ok)
    STAGE = 2 * BK * D                  # the one raw stage: K | V
    KS_TILE = BK * KS_STRIDE
    SSTAGE = KS_TILE + BK // 2 * VS_STRIDE
    SPLIT0 = STAGE                      # NSPLIT split stages follow the raw stage,
    QS0 = STAGE + NSPLIT * SSTAGE       # then Q's big and small halves, per thread and
                                        # k-step 4 + 4 (only that thread reads them back)
    KC = D // 8                         # k-steps of S = Q K^T
    NT_S = BK // 8                      # 16x8 score tiles per warp (= k-steps of P V)
    NT_O = D // 8                       # 16x8 output tiles per warp
    S_REGS, O_REGS = NT_S * 4, NT_O * 4
    assert BK * CHUNKS % THREADS == 0 and THREADS % CHUNKS == 0 and BQ % 16 == 0 and BK % 8 == 0
    assert presplit_ok(D, BQ, BK) and LOADS % 2 == 0
    assert smem_bytes(D, BK, BQ) == 4 * (QS0 + 2 * BQ * D)
    NEG_INF = float32(-math.inf)
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout

    ld_shared_v4_f32, ld_shared_v4_b32 = ptx.ld_shared_v4_f32, ptx.ld_shared_v4_b32
    st_shared_v4_b32 = ptx.st_shared_v4_b32

    fmix = fmix_device()
    mask_scores = score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK, window)

    @cuda.jit(device=True, inline=True)
    def load_tile(head_addr, row_bytes, key0, nk, s_addr, stride):
        # -- cp.async one K or V tile: BK rows x D floats, 16 bytes a thread a step; this
        #    thread's chunks are rows r0 + i * ROW_STEP, one column chunk (see the caller) --
        for i in range(LOADS):
            key = key0 + i * ROW_STEP
            ok = key < nk
            g = head_addr + uint64(uint32(key if ok else 0) * uint64(row_bytes))
            ptx.cp_async_16(s_addr + uint32(4 * i * ROW_STEP * stride), g,
                          uint32(16) if ok else uint32(0))

    @cuda.jit(device=True, inline=True)
    def load_tile_pairs(head_addr, row_bytes, pair0, nk, s_addr):
        # -- presplit V: this thread's chunks are rows 2 p and 2 p + 1 of the key pairs
        #    p = pair0 + i * ROW_STEP, so that it holds both keys of a B register pair --
        for i in range(LOADS // 2):
            for e in range(2):
                key = 2 * (pair0 + i * ROW_STEP) + e
                ok = key < nk
                g = head_addr + uint64(uint32(key if ok else 0) * uint64(row_bytes))
                ptx.cp_async_16(s_addr + uint32(4 * (2 * i * ROW_STEP + e) * D), g,
                              uint32(16) if ok else uint32(0))

    @cuda.jit(device=True, inline=True)
    def mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1, c0, c1, c2, c3):
        # 3xTF32: small * big, big * small, then big * big, all accumulated in float32
        d = ptx.mma_tf32(as0, as1, as2, as3, bb0, bb1, c0, c1, c2, c3)
        d = ptx.mma_tf32(ab0, ab1, ab2, ab3, bs0, bs1, d[0], d[1], d[2], d[3])
        return ptx.mma_tf32(ab0, ab1, ab2, ab3, bb0, bb1, d[0], d[1], d[2], d[3])

    tile_and_head = tile_scheduler.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               mask, mask_b, mask_h, mask_q, scale_log2, seed_hash, threshold, inv_keep,
               band_lo, band_hi):
        smem = cuda.shared.array(0, dtype=float32, alignment=16)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        gid = lane // 4
        tig = lane % 4
        tile, bh, n_blocks_q = tile_and_head()
        m_blk = n_blocks_q - 1 - tile                       # longest (causal) tiles first
        n_heads = out.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        s = (b * sched_b + h * sched_h)
        # thread owns rows row0 and row0 + 8 of its warp's 16
        row0 = m_blk * BQ + warp * 16 + gid

        # -- Q fragments (A operand, dims permuted: a0/a2 = dims 2t/2t+1), split into big and
        #    small once, to shared memory: 16 + 16 bytes per thread and k-step that only this
        #    thread reads back (conflict-free 128-bit loads, no barrier), which leaves the
        #    registers to O, the S accumulator and the operands --
        smem0 = ptx.shared_addr(smem, 0)
        q_frag = smem0 + uint32(4 * (QS0 + (warp * KC * 64 + lane) * 4))
        for kc in range(KC):
            sp0 = ptx.split_tf32(q[b, h, min(row0, n_q - 1), kc * 8 + 2 * tig])
            sp1 = ptx.split_tf32(q[b, h, min(row0 + 8, n_q - 1), kc * 8 + 2 * tig])
            sp2 = ptx.split_tf32(q[b, h, min(row0, n_q - 1), kc * 8 + 2 * tig + 1])
            sp3 = ptx.split_tf32(q[b, h, min(row0 + 8, n_q - 1), kc * 8 + 2 * tig + 1])
            st_shared_v4_b32(q_frag + uint32(kc * 1024), sp0[0], sp1[0], sp2[0], sp3[0])
            st_shared_v4_b32(q_frag + uint32(kc * 1024 + 512), sp0[1], sp1[1], sp2[1],
                             sp3[1])
        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        m_i = cuda.local.array(2, dtype=float32)
        l_i = cuda.local.array(2, dtype=float32)
        h_row = cuda.local.array(2, dtype=uint64)
        for r in range(2):
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
            h_row[r] = uint64(0)
        if HAS_DROPOUT:
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            for r in range(2):
                h_row[r] = fmix(h_bh ^ uint64(row0 + 8 * r))

        # per-lane float offsets inside a split stage (see kernels.fragments_tf32): split
        # K[key g][16-byte unit 4 kc + t], units XOR 4 on odd keys: one base for even kc (+16
        # floats on odd g) and one for odd kc (-16 floats on odd g); split V[pair t][dim g XOR
        # 2t]: b2 | s2
        k_lane = gid * KS_STRIDE + 4 * tig + 16 * (gid & 1)
        k_lane_o = gid * KS_STRIDE + 4 * tig - 16 * (gid & 1)
        v_lane = KS_TILE + tig * VS_STRIDE + 4 * (gid ^ (2 * tig))
        # this thread's cp.async chunk: rows r0 + i * ROW_STEP, floats 4 ch .. 4 ch + 3
        r0 = tid // CHUNKS
        ch = tid % CHUNKS
        k_head = ptx.global_addr(k, b, hk, 0, ch * 4)
        v_head = ptx.global_addr(v, b, hk, 0, ch * 4)
        k_row_bytes = uint32(k.strides[2])
        v_row_bytes = uint32(v.strides[2])
        k_copy = smem0 + uint32(4 * (r0 * K_STRIDE + ch * 4))
        v_copy = smem0 + uint32(4 * (K_TILE + 2 * r0 * D + ch * 4))

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        # one raw stage: refilled with tile j + 1 once every thread has split its own chunks
        # of tile j (the barrier below), while tile j is computed
        if start < stop:
            n0 = kv_index[start]
            load_tile(k_head, k_row_bytes, n0 * BK + r0, n_k, k_copy, K_STRIDE)
            load_tile_pairs(v_head, v_row_bytes, n0 * (BK // 2) + r0, n_k, v_copy)
            ptx.cp_async_commit()

        for it in range(start, stop):
            n_blk = kv_index[it]
            buf = SPLIT0 + ((it - start) & (NSPLIT - 1)) * SSTAGE
            ptx.cp_async_wait_all()
            # -- split this thread's own chunks (visible to it after the wait) --
            kr = smem0 + uint32(4 * (r0 * D + ch * 4))
            ks = smem0 + uint32(4 * (buf + r0 * KS_STRIDE + 4 * ((2 * ch) ^ (4 * (r0 & 1)))))
            for i in range(LOADS):
                x = ld_shared_v4_f32(kr + uint32(4 * i * ROW_STEP * D))
                e0 = ptx.split_tf32(x[0])
                e1 = ptx.split_tf32(x[1])
                e2 = ptx.split_tf32(x[2])
                e3 = ptx.split_tf32(x[3])
                ka = ks + uint32(4 * i * ROW_STEP * KS_STRIDE)
                st_shared_v4_b32(ka, e0[0], e1[0], e0[1], e1[1])
                st_shared_v4_b32(ka + uint32(16), e2[0], e3[0], e2[1], e3[1])
            vr = smem0 + uint32(4 * (K_TILE + 2 * r0 * D + ch * 4))
            vs = smem0 + uint32(4 * (buf + KS_TILE + r0 * VS_STRIDE))
            sw = 2 * (r0 & 3)
            for i in range(LOADS // 2):
                x = ld_shared_v4_f32(vr + uint32(4 * 2 * i * ROW_STEP * D))
                y = ld_shared_v4_f32(vr + uint32(4 * (2 * i * ROW_STEP + 1) * D))
                va = vs + uint32(4 * i * ROW_STEP * VS_STRIDE)
                for e in range(4):
                    ex = ptx.split_tf32(x[e])
                    ey = ptx.split_tf32(y[e])
                    st_shared_v4_b32(va + uint32(16 * ((4 * ch + e) ^ sw)),
                                     ex[0], ey[0], ex[1], ey[1])
            cuda.syncthreads()
            if it + 1 < stop:
                nxt = kv_index[it + 1]
                load_tile(k_head, k_row_bytes, nxt * BK + r0, n_k, k_copy, K_STRIDE)
                load_tile_pairs(v_head, v_row_bytes, nxt * (BK // 2) + r0, n_k, v_copy)
                ptx.cp_async_commit()

            # -- compute qk: S = Q K^T, three tf32 mma per 16x8x8 step --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
            k_addr = smem0 + uint32(4 * (buf + k_lane))
            k_addr_o = smem0 + uint32(4 * (buf + k_lane_o))
            for kc_o in range(KC // SU):
              for kc_i in range(SU):  # noqa: E111 (the k-step loop, SU steps per iteration)
                kc = kc_o * SU + kc_i
                qbg = ld_shared_v4_b32(q_frag + uint32(kc * 1024))
                qsm = ld_shared_v4_b32(q_frag + uint32(kc * 1024 + 512))
                ab0, ab1, ab2, ab3 = qbg[0], qbg[1], qbg[2], qbg[3]
                as0, as1, as2, as3 = qsm[0], qsm[1], qsm[2], qsm[3]
                for nt in range(NT_S):
                    kb = ld_shared_v4_b32((k_addr if kc % 2 == 0 else k_addr_o)
                                          + 4 * (nt * 8 * KS_STRIDE + kc * 16))
                    bb0, bb1, bs0, bs1 = kb[0], kb[1], kb[2], kb[3]
                    j = nt * 4
                    d = mma3(ab0, ab1, ab2, ab3, as0, as1, as2, as3, bb0, bb1, bs0, bs1,
                             s_reg[j], s_reg[j + 1], s_reg[j + 2], s_reg[j + 3])
                    for i in range(4):
                        s_reg[j + i] = d[i]

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            mask_scores(s_reg, 0, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                        mask_h, mask_q, band_lo, band_hi)

            # -- update m_i and l_i (row r: registers 2r, 2r + 1 of every score tile) --
            for r in range(2):
                mx = NEG_INF
                for nt in range(NT_S):
                    mx = max(mx, max(s_reg[nt * 4 + 2 * r], s_reg[nt * 4 + 2 * r + 1]))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                m_new = max(m_i[r], mx * scale_log2)
                m_use = m_new if m_new != NEG_INF else float32(0.0)
                alpha = ptx.ex2(m_i[r] - m_use)
                row_sum = float32(0.0)
                for nt in range(NT_S):
                    for c in range(2):
                        p = ptx.ex2(s_reg[nt * 4 + 2 * r + c] * scale_log2 - m_use)
                        row_sum += p
                        s_reg[nt * 4 + 2 * r + c] = p
                l_i[r] = l_i[r] * alpha + row_sum
                m_i[r] = m_new
                for nt in range(NT_O):
                    acc[nt * 4 + 2 * r] *= alpha
                    acc[nt * 4 + 2 * r + 1] *= alpha

            if HAS_DROPOUT:
                for nt in range(NT_S):
                    for i in range(4):
                        col = col_base + nt * 8 + (i & 1)
                        keep = fmix(h_row[i >> 1] ^ uint64(col)) >= uint64(threshold)
                        e = nt * 4 + i
                        s_reg[e] = s_reg[e] * inv_keep if keep else float32(0.0)

            # -- O += P V: P's A fragment is the score C fragment (a0, a1, a2, a3 = c0, c2, c1,
            #    c3 under the key permutation); V's B fragment = V[key 2t][g], V[key 2t+1][g] --
            v_addr = smem0 + uint32(4 * (buf + v_lane))
            for kp in range(NT_S):
                j = kp * 4
                p0 = ptx.split_tf32(s_reg[j])
                p1 = ptx.split_tf32(s_reg[j + 2])
                p2 = ptx.split_tf32(s_reg[j + 1])
                p3 = ptx.split_tf32(s_reg[j + 3])
                for nt in range(NT_O):
                    vb = ld_shared_v4_b32(v_addr + 4 * (kp * 4 * VS_STRIDE + nt * 32))
                    bb0, bb1, bs0, bs1 = vb[0], vb[1], vb[2], vb[3]
                    o = nt * 4
                    d = mma3(p0[0], p1[0], p2[0], p3[0], p0[1], p1[1], p2[1], p3[1],
                             bb0, bb1, bs0, bs1, acc[o], acc[o + 1], acc[o + 2], acc[o + 3])
                    for i in range(4):
                        acc[o + i] = d[i]
            if NSPLIT == 1:
                cuda.syncthreads()   # one split stage: re-split by the next iteration

        # -- epilogue: one rescale, O, logsumexp (natural log) --
        for r in range(2):
            l_tot = l_i[r]
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 1)
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 2)
            row = row0 + 8 * r
            inv = float32(1.0) / l_tot if l_tot > float32(0.0) else float32(0.0)
            if row < n_q:
                for nt in range(NT_O):
                    out[b, h, row, nt * 8 + 2 * tig] = acc[nt * 4 + 2 * r] * inv
                    out[b, h, row, nt * 8 + 2 * tig + 1] = acc[nt * 4 + 2 * r + 1] * inv
                if tig == 0:
                    if l_tot > float32(0.0):
                        lse[b, h, row] = m_i[r] * float32(LN2) + math.log(l_tot)
                    else:
                        lse[b, h, row] = NEG_INF

    kernel.threads = THREADS
    kernel.smem_bytes = smem_bytes(D, BK, BQ)
    kernel.config = {"block_q": BQ, "block_k": BK, "s_unroll": SU}
    return kernel


# -- host side -----------------------------------------------------------------------------------
def tiles(problem, config):
    """``(block_q, block_k)`` for a problem (`kernels.config.requested_tiles`: ``config``'s, the
    problem's, `default_blocks`, or with a block mask the largest legal tiles dividing its)."""
    return requested_tiles(problem, config, default_blocks(problem.head_dim), BLOCK_Q_CHOICES,
                           BLOCK_K_CHOICES)


def supports(problem, config):
    """Why this forward cannot run ``problem`` (a string), or None."""
    why = host.tensor_core_refusal(problem, "the tf32 family", DTYPES, SUPPORTED_HEAD_DIMS,
                                   window=True)
    if why:
        return why
    bq, bk = tiles(problem, config)
    if bq not in BLOCK_Q_CHOICES or bk not in BLOCK_K_CHOICES \
            or not presplit_ok(problem.head_dim, bq, bk):
        return (f"the tf32 forward takes block_q in {BLOCK_Q_CHOICES} and block_k in "
                f"{BLOCK_K_CHOICES} that its split layout can use (presplit_ok), got {bq} x {bk}")
    if problem.block_mask is not None and (problem.block_q % bq or problem.block_k % bk):
        return (f"the tf32 forward's tiles ({bq}, {bk}) must divide the block mask's tiles "
                f"({problem.block_q}, {problem.block_k})")
    return None


def forward(problem, config):
    """Float32 3xTF32 tensor-core forward: ``(out, lse)`` in the problem's kind of array (see
    `kernels.forward`)."""
    return prepare(problem, config)(problem.q, problem.k, problem.v)


def plan(problem, config):
    """The `sim.plan.Plan` this forward launches for ``problem`` (`sim.plans.tensor_core_fwd`):
    its grid, threads and shared memory are what `prepare` launches; its counts are what
    `sim.plan.price` prices."""
    block_q, block_k = tiles(problem, config)
    return host.family_plan("tf32", "fwd", problem, block_q=block_q, block_k=block_k,
                            launch_order=config.launch_order)


def prepare(problem, config):
    """The forward of ``problem`` with its per-problem choices made once (plan, kernel, tile
    schedule, constants): ``run(q, k, v) -> (out, lse)`` for operands of its shapes, dtype and
    device (`kernels.host.prepare_tensor_core_forward`), launched as `plan` says."""
    pb = problem
    the_plan = plan(pb, config)
    launch = the_plan.kernels[0]
    block_q, block_k = the_plan.config["block_q"], the_plan.config["block_k"]
    drop = dropout_constants(pb.seed, pb.dropout_p)
    group = tile_scheduler.head_group(config.launch_order, pb.causal, "fwd")
    causal, window, band_lo, band_hi = band_arguments(pb)
    kern = get_kernel(pb.head_dim, block_q, block_k, causal, pb.mask is not None,
                      drop.enabled, group, window)
    schedule = tile_scheduler.device_schedule(pb, block_q, block_k, "kv")
    return host.prepare_tensor_core_forward(pb, config, kern, launch, schedule, drop,
                                            words=False, band=(band_lo, band_hi))
