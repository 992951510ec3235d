"""Tensor-core FlashAttention-2 forward for float16/bfloat16 CUDA inputs (Numba + inline PTX).

The ``mma`` family's forward. The algorithm is FlashAttention-2:

* one thread block per (Q tile of ``block_q = 16 * num_warps`` rows, batch * head), longest
  causal tiles first (of all heads: `kernels.tile_scheduler`); each warp owns 16 query rows
  and keeps its Q fragments, running max ``m_i``, running sum ``l_i`` and output accumulator
  in registers for the whole K/V sweep;
* K/V tiles of ``block_k`` keys stream through shared memory with ``cp.async`` into two
  buffers (tile j + 1 loads while tile j computes); rows padded by 16 bytes so that ``ldmatrix``
  reads are free of bank conflicts; the tail tile is zero-filled by the copy itself;
* S = Q K^T and O += P V on the tensor cores (``mma.sync.m16n8k16``, float32 accumulation);
  the softmax is exp2-based with ``log2(e)`` folded into the scale; P is rounded to half in
  registers and used directly as the A operand of the second mma (the C fragments of two
  16x8 score tiles are the A fragment of a 16x16 tile, see `kernels.fragments`);
* the visited K/V tiles come from `ioaware.block_info.BlockInfo.kv_schedule()` (causal and
  block-sparse skipping), elementwise masks only on tiles that need them; dropout regenerates the
  keep bits of `ioaware.dropout` on the fly; GQA/MQA through ``h // (Hq // Hkv)``;
* O is normalised once at the end and written as packed halves, with the float32 natural-log
  logsumexp.

This is the ``mma`` family's forward: head_dim 64 and 128, float16 (NumPy or torch arrays) and
bfloat16 (torch), on a real GPU of compute capability 8.0 or later (the CUDA simulator cannot
run inline PTX); `supports` says why it refuses anything else, and the registry then runs the
CUDA-core family.
"""
from __future__ import annotations

import math

from . import compile_cache, host, tile_scheduler
from .config import requested_tiles
from .dropout import dropout_constants, fmix_device
from .mask import band_arguments, score_mask

__all__ = ["forward", "prepare", "plan", "supports", "tiles", "default_blocks", "smem_bytes",
           "get_kernel",
           "SUPPORTED_HEAD_DIMS", "BLOCK_Q_CHOICES", "BLOCK_K_CHOICES"]

from sim.plans.tensor_core_fwd import MMA_BLOCK_K_CHOICES as BLOCK_K_CHOICES
from sim.plans.tensor_core_fwd import MMA_BLOCK_Q_CHOICES as BLOCK_Q_CHOICES
from sim.plans.tensor_core_fwd import MMA_HEAD_DIMS as SUPPORTED_HEAD_DIMS
from sim.plans.tensor_core_fwd import mma_default_blocks as default_blocks
from sim.plans.tensor_core_fwd import mma_smem_bytes as smem_bytes
from sim.plans.tensor_core_fwd import mma_warp_m_tiles as warp_m_tiles

#: The layout facts above (tiles, shared memory, warps) are the plan's (`sim.plans`): the
#: launcher and the cost model read the same ones. The K/V buffers are dynamic shared memory,
#: opted in above the 48 KiB default by `kernels.host.launch` (a device with less than
#: ``SMEM_LIMIT_BYTES`` is refused at launch with an error naming its limit).
DTYPES = ("float16", "bfloat16")
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

#: This forward takes a sliding window (the band test in `kernels.mask.score_mask`).
TAKES_WINDOW = True


def get_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout, head_group,
               window=False):
    """The compiled-on-first-launch kernel for one configuration (cached); ``head_group`` is
    the launch order (`kernels.tile_scheduler`); ``window``: the sliding window's band test
    (`kernels.mask.band_arguments`)."""
    key = (head_dim, block_q, block_k, bool(is_bf16), bool(causal), bool(has_mask),
           bool(has_dropout), int(head_group), bool(window))
    return compile_cache.built(_build_kernel, *key)


def _build_kernel(head_dim, block_q, block_k, is_bf16, causal, has_mask, has_dropout,
                  head_group, window=False):
    from numba import cuda, float32, uint16, uint32, uint64

    from . import ptx

    D = head_dim
    BQ = block_q
    BK = block_k
    MT = warp_m_tiles(D, BQ)             # 16-row m-tiles per warp
    WARP_ROWS = 16 * MT
    NUM_WARPS = BQ // WARP_ROWS
    THREADS = 32 * NUM_WARPS
    STRIDE = D + 8                      # halves per shared row (16-byte pad)
    TILE = BK * STRIDE                  # halves per K or V buffer
    SMEM_HALVES = 4 * TILE              # K0 | V0 | K1 | V1
    CHUNKS = D // 8                     # 16-byte chunks per row
    LOADS = BK * CHUNKS // THREADS      # cp.async per thread per K (or V) tile
    KC = D // 16                        # k-steps of S = Q K^T
    NT_S = BK // 8                      # 16x8 score tiles per warp
    KC_P = BK // 16                     # k-steps of O += P V
    NT_O = D // 8                       # 16x8 output tiles per warp
    Q_REGS, S_REGS, O_REGS = MT * KC * 4, MT * NT_S * 4, MT * NT_O * 4   # register arrays
    QS, SS, OS = KC * 4, NT_S * 4, NT_O * 4   # per m-tile strides in them
    ROWS = 2 * MT                       # rows a thread owns
    P_REGS = 4 * MT                     # A registers of P for one k-step
    assert BK * CHUNKS % THREADS == 0 and BQ % 16 == 0 and BK % 16 == 0
    NEG_INF = float32(-math.inf)
    mma_op = ptx.mma_bf16 if is_bf16 else ptx.mma_f16
    mma_x2 = ptx.mma_pair(mma_op)                 # two products of one A fragment
    pack = ptx.pack_bf16x2 if is_bf16 else ptx.pack_f16x2
    CAUSAL, HAS_MASK, HAS_DROPOUT = causal, has_mask, has_dropout

    fmix = fmix_device()
    mask_scores = score_mask(BQ, BK, NT_S, CAUSAL, HAS_MASK, window)

    @cuda.jit(device=True, inline=True)
    def load_tile(src, b, hk, key0, nk, smem, base, tid):
        # -- cp.async one K or V tile: BK rows x D halves, 16 bytes a thread a step --
        for i in range(LOADS):
            c = tid + i * THREADS
            r = c // CHUNKS
            ch = c % CHUNKS
            key = key0 + r
            ok = key < nk
            g = ptx.global_addr(src, b, hk, key if ok else 0, ch * 8)
            ptx.cp_async_16(ptx.shared_addr(smem, base + r * STRIDE + ch * 8), g,
                          uint32(16) if ok else uint32(0))

    tile_and_head = tile_scheduler.device_tile_and_head(head_group)

    @cuda.jit(lineinfo=False)
    def kernel(q, k, v, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               mask, mask_b, mask_h, mask_q, scale_log2, seed_hash, threshold, inv_keep,
               band_lo, band_hi):
        smem = cuda.shared.array(0, dtype=uint16)        # dynamic: kernel.smem_bytes
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
        # thread owns rows row0 + 8 * r, r < ROWS (m-tile mt = r // 2 covers rows +16 * mt)
        row0 = m_blk * BQ + warp * WARP_ROWS + gid

        # -- Q fragments (A operand) straight from global memory into registers --
        qf = cuda.local.array(Q_REGS, dtype=uint32)
        for mt in range(MT):
            for kc in range(KC):
                for r in range(4):
                    row = row0 + 16 * mt + 8 * (r & 1)
                    col = kc * 16 + 2 * tig + 8 * (r >> 1)
                    val = uint32(0)
                    if row < n_q:
                        val = ptx.ld_global_u32(ptx.global_addr(q, b, h, row, col))
                    qf[mt * QS + kc * 4 + r] = val

        acc = cuda.local.array(O_REGS, dtype=float32)
        for i in range(O_REGS):
            acc[i] = float32(0.0)
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        m_i = cuda.local.array(ROWS, dtype=float32)
        l_i = cuda.local.array(ROWS, dtype=float32)
        h_row = cuda.local.array(ROWS, dtype=uint64)
        for r in range(ROWS):
            m_i[r] = NEG_INF
            l_i[r] = float32(0.0)
            h_row[r] = uint64(0)
        if HAS_DROPOUT:
            h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
            for r in range(ROWS):
                h_row[r] = fmix(h_bh ^ uint64(row0 + 8 * r))

        # per-lane ldmatrix offsets (halves) inside a K / V buffer (see kernels.fragments)
        k_lane = (lane % 8 + 8 * (lane // 16)) * STRIDE + 8 * ((lane // 8) % 2)
        v_lane = (lane % 8 + 8 * ((lane // 8) % 2)) * STRIDE + 8 * (lane // 16)

        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        if start < stop:
            n0 = kv_index[start]
            load_tile(k, b, hk, n0 * BK, n_k, smem, 0, tid)
            load_tile(v, b, hk, n0 * BK, n_k, smem, TILE, tid)
            ptx.cp_async_commit()

        for it in range(start, stop):
            buf = ((it - start) & 1) * 2 * TILE
            n_blk = kv_index[it]
            if it + 1 < stop:
                nxt = kv_index[it + 1]
                nbuf = 2 * TILE - buf
                load_tile(k, b, hk, nxt * BK, n_k, smem, nbuf, tid)
                load_tile(v, b, hk, nxt * BK, n_k, smem, nbuf + TILE, tid)
                ptx.cp_async_commit()
                ptx.cp_async_wait_1()
            else:
                ptx.cp_async_wait_all()
            cuda.syncthreads()

            # -- compute qk: one ldmatrix of K feeds 2 * MT mma --
            for i in range(S_REGS):
                s_reg[i] = float32(0.0)
            k_addr = ptx.shared_addr(smem, buf + k_lane)
            for kc in range(KC):
                for ntp in range(NT_S // 2):
                    bk = ptx.ldmatrix_x4(k_addr + 2 * (16 * ntp * STRIDE + 16 * kc))
                    for mt in range(MT):
                        a = mt * QS + kc * 4
                        j = mt * SS + 8 * ntp
                        mma_x2(qf[a], qf[a + 1], qf[a + 2], qf[a + 3], bk, s_reg, j)

            # -- masks: key tail, causal diagonal, boolean mask (only where a tile needs one) --
            col_base = n_blk * BK + 2 * tig
            for mt in range(MT):
                mask_scores(s_reg, mt * SS, row0 + 16 * mt, n_blk, m_blk, col_base, b, h, n_q,
                            n_k, mask, mask_b, mask_h, mask_q, band_lo, band_hi)

            # -- update m_i and l_i (row r: m-tile r // 2, half r % 2) --
            for r in range(ROWS):
                base = (r // 2) * SS + 2 * (r % 2)
                mx = NEG_INF
                for nt in range(NT_S):
                    mx = max(mx, max(s_reg[base + nt * 4], s_reg[base + nt * 4 + 1]))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                m_new = max(m_i[r], mx * scale_log2)
                m_use = m_new if m_new != NEG_INF else float32(0.0)
                alpha = ptx.ex2(m_i[r] - m_use)
                row_sum = float32(0.0)
                for nt in range(NT_S):
                    for c in range(2):
                        p = ptx.ex2(s_reg[base + nt * 4 + c] * scale_log2 - m_use)
                        row_sum += p
                        s_reg[base + nt * 4 + c] = p
                l_i[r] = l_i[r] * alpha + row_sum
                m_i[r] = m_new
                obase = (r // 2) * OS + 2 * (r % 2)
                for nt in range(NT_O):
                    acc[obase + nt * 4] *= alpha
                    acc[obase + nt * 4 + 1] *= alpha

            if HAS_DROPOUT:
                for mt in range(MT):
                    for nt in range(NT_S):
                        for i in range(4):
                            col = col_base + nt * 8 + (i & 1)
                            keep = fmix(h_row[2 * mt + (i >> 1)] ^ uint64(col)) >= uint64(threshold)
                            e = mt * SS + nt * 4 + i
                            s_reg[e] = s_reg[e] * inv_keep if keep else float32(0.0)

            # -- P to half in registers, O += P V: one ldmatrix of V feeds 2 * MT mma --
            v_addr = ptx.shared_addr(smem, buf + TILE + v_lane)
            pa = cuda.local.array(P_REGS, dtype=uint32)
            for kcp in range(KC_P):
                for mt in range(MT):
                    j = mt * SS + 8 * kcp
                    for i in range(4):
                        pa[4 * mt + i] = pack(s_reg[j + 2 * i], s_reg[j + 2 * i + 1])
                for ntp in range(NT_O // 2):
                    bv = ptx.ldmatrix_x4_trans(v_addr + 2 * (16 * kcp * STRIDE + 16 * ntp))
                    for mt in range(MT):
                        o = mt * OS + 8 * ntp
                        a = 4 * mt
                        mma_x2(pa[a], pa[a + 1], pa[a + 2], pa[a + 3], bv, acc, o)
            cuda.syncthreads()   # this buffer is refilled by the next iteration's prefetch

        # -- epilogue: one rescale, O as packed halves, logsumexp (natural log) --
        for r in range(ROWS):
            l_tot = l_i[r]
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 1)
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 2)
            row = row0 + 8 * r
            obase = (r // 2) * OS + 2 * (r % 2)
            inv = float32(1.0) / l_tot if l_tot > float32(0.0) else float32(0.0)
            if row < n_q:
                for nt in range(NT_O):
                    word = pack(acc[obase + nt * 4] * inv, acc[obase + nt * 4 + 1] * inv)
                    ptx.st_global_u32(ptx.global_addr(out, b, h, row, nt * 8 + 2 * tig), word)
                if tig == 0:
                    if l_tot > float32(0.0):
                        lse[b, h, row] = m_i[r] * float32(LN2) + math.log(l_tot)
                    else:
                        lse[b, h, row] = NEG_INF

    kernel.threads = THREADS
    kernel.smem_bytes = 2 * SMEM_HALVES
    return kernel


# -- host side -----------------------------------------------------------------------------------
def tiles(problem, config):
    """``(block_q, block_k)`` for a problem (`kernels.config.requested_tiles`: ``config``'s, the
    problem's, `default_blocks`, or with a block mask the largest legal tiles dividing its)."""
    return requested_tiles(problem, config, default_blocks(problem.head_dim, problem.causal),
                           BLOCK_Q_CHOICES, BLOCK_K_CHOICES)


def supports(problem, config):
    """Why this forward cannot run ``problem`` (a string), or None."""
    why = host.tensor_core_refusal(problem, "the mma family", DTYPES, SUPPORTED_HEAD_DIMS,
                                   window=True)
    if why:
        return why
    bq, bk = tiles(problem, config)
    if bq not in BLOCK_Q_CHOICES or bk not in BLOCK_K_CHOICES:
        return (f"the mma forward takes block_q in {BLOCK_Q_CHOICES} and block_k in "
                f"{BLOCK_K_CHOICES}, got {bq} x {bk}")
    if problem.block_mask is not None and (problem.block_q % bq or problem.block_k % bk):
        return (f"the mma forward's tiles ({bq}, {bk}) must divide the block mask's tiles "
                f"({problem.block_q}, {problem.block_k})")
    return None


def forward(problem, config):
    """Half-precision tensor-core forward: ``(out, lse)`` in the problem's kind of array (see
    `kernels.forward`)."""
    return prepare(problem, config)(problem.q, problem.k, problem.v)


def plan(problem, config):
    """The `sim.plan.Plan` this forward launches for ``problem`` (`sim.plans.tensor_core_fwd`):
    its grid, threads and shared memory are what `prepare` launches; its counts are what
    `sim.plan.price` prices."""
    block_q, block_k = tiles(problem, config)
    return host.family_plan("mma", "fwd", problem, block_q=block_q, block_k=block_k,
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
    is_bf16 = str(pb.dtype).endswith("bfloat16")
    causal, window, band_lo, band_hi = band_arguments(pb)
    kern = get_kernel(pb.head_dim, block_q, block_k, is_bf16, causal, pb.mask is not None,
                      drop.enabled, group, window)
    schedule = tile_scheduler.device_schedule(pb, block_q, block_k, "kv")
    return host.prepare_tensor_core_forward(pb, config, kern, launch, schedule, drop, words=True,
                                            band=(band_lo, band_hi))
