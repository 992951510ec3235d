"""Hopper attention forward (family ``wgmma``): TMA loads, ``wgmma`` products, FlashAttention-3 style.

This module owns the forward-only ``wgmma`` kernel family for sm_90a (H100, H200): its kernel
builder, its `supports` refusals, its plan (`sim.plans.wgmma_fwd`, which the launcher reads)
and the host side that makes the TMA tensor maps. It returns what `kernels.mma_fwd` returns
(O in the input dtype, the float32 natural-log logsumexp, -inf and a zero row where no key is
allowed). The registry runs it, before the ``mma`` family, for every forward it takes on a GPU
of compute capability 9.0 or more; ``KernelConfig(family="mma")`` pins the older forward.

The algorithm (FlashAttention-3's structure; its two overlaps, ping-pong and the
intra-warpgroup overlap, are the default schedule at ``block_q`` = 128 and are described in
`_build_kernel`; below, the serial kernel):

* a work item per (Q tile of ``block_q`` = 64, 128 or 192 rows, batch * head), in the launch
  order of `kernels.tile_scheduler` (longest causal tiles first); one program per item, or,
  persistent (the default where a program fills its SM: the plan's ``persistent``), one per SM
  taking every P-th item, each item's Q loaded once its predecessor's S = Q K^T are done (a
  ``q_empty`` mbarrier), the K/V ring carried on; ``block_q / 64`` *consumer warpgroups* (128
  threads, 64 query rows each), then one *producer warp* (a producer warpgroup with the
  overlap and two or three consumer warpgroups);
* the producer (its lane 0) loads Q once and streams the K and V tiles of
  ``BlockInfo.kv_schedule()`` (``block_k`` = 64 or 128 keys) into a ring of two shared-memory
  stages by TMA (``cp.async.bulk.tensor.4d`` from [B, H, N, d] tensor maps made on the host,
  128-byte swizzle, a d = 128 row as two 64-column boxes; rows past the end zero-filled). Each
  stage has a *full* mbarrier (one arrival with the expected bytes, completed by the copies)
  and an *empty* mbarrier (every consumer thread arrives when done with the stage). Tile ``i``
  uses stage ``i % 2`` for the ``i // 2``-th time: consumers wait on *full* with parity
  ``(i // 2) & 1``; the producer, before refilling a stage for tile ``i >= 2``, waits on its
  *empty* with parity ``(i // 2 - 1) & 1``;
* a consumer warpgroup computes S = Q K^T with ``wgmma.m64n64k16`` (A = its 64 Q rows, B = the
  K tile, both K-major from shared memory), the online softmax on the accumulator fragment
  (`kernels.hopper.wgmma_d_elem`: a thread holds 2 rows; row max and sum over the 4 threads of
  a quad by shuffles; ``exp2`` with ``log2(e) * scale`` folded in, as `kernels.mma_fwd`), P
  rounded to 16 bits in registers (`kernels.hopper.wgmma_p_from_d`: the accumulator of a k16
  slice is the A fragment) and O += P V with A from registers and V MN-major from shared
  memory (``imm-trans-b = 1``); each product is waited for before its result is read;
* O is normalised once at the end and stored as packed 16-bit pairs from the fragment, with the
  logsumexp.

Takes float16 and bfloat16, head dims 64 and 128, causal (top-left, as `kernels.mma_fwd`) or
not, a sliding window (the band of `kernels.mask.band_arguments`: tiles outside it are never
visited, tiles it cuts are masked per element), Nq != Nk, any lengths, GQA; refuses
(`supports`) masks, biases, block masks, dropout, cache lengths, other head dims and GPUs below
compute capability 9.0.
"""
from __future__ import annotations

import functools
import math

from numba import cuda
from numba.cuda.cudadrv import driver    # device_pointer (on a real GPU)

from sim.plans.wgmma_fwd import (BARRIER_BYTES, BOX_COLUMNS, FP8_BLOCK_K, FP8_DEFAULT_BLOCK_Q,
                                 FP8_HEAD_DIM, FP8_TRANSPOSE_THREADS, FP8_TRANSPOSE_TILE,
                                 FP8_BLOCK_Q_CHOICES, ROWS_PER_WARPGROUP, fp8_transpose_grid,
                                 fp8_transpose_keys, overlap_registers, producer_warpgroup,
                                 WARPGROUP_THREADS, WGMMA_BLOCK_K_CHOICES,
                                 WGMMA_BLOCK_Q_CHOICES, WGMMA_HEAD_DIMS, schedule_refusal, smem_refusal,
                                 schedule_default_blocks, wgmma_smem_bytes,
                                 wgmma_threads)

from . import compile_cache, host, tile_scheduler
from .config import requested_tiles
from .mask import UNBOUNDED, band_arguments, tile_needs_mask, wgmma_tile_mask

__all__ = ["forward", "prepare", "plan", "supports", "tiles", "get_kernel", "tensor_maps",
           "stage_of", "full_parity", "empty_parity", "forward_fp8", "fp8_supports", "fp8_plan",
           "v_transpose", "v_transpose_kernel", "v_transpose_keys", "FP8_HEAD_DIMS",
           "FP8_BLOCK_Q_CHOICES", "FP8_BLOCK_K", "P_SCALE_LOG2",
           "DTYPES", "SUPPORTED_HEAD_DIMS", "BLOCK_Q_CHOICES", "BLOCK_K_CHOICES",
           "kernel_constants", "TAKES_WINDOW", "maps_for", "problem_refusal"]

DTYPES = ("float16", "bfloat16")
SUPPORTED_HEAD_DIMS = WGMMA_HEAD_DIMS
BLOCK_Q_CHOICES = WGMMA_BLOCK_Q_CHOICES
BLOCK_K_CHOICES = WGMMA_BLOCK_K_CHOICES
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
BOX_BYTES = ROWS_PER_WARPGROUP * BOX_COLUMNS * 2      # one 64 x 64 16-bit box: 8,192 bytes
SWIZZLE_ROW_BYTES = BOX_COLUMNS * 2                   # 128
#: The FP8 forward scales P by 2**8 = 256 before rounding it to e4m3 (largest value 448), so
#: that probabilities down to 2**-17 stay above e4m3's smallest subnormal (2**-9); the row
#: sum carries the same factor, which cancels in O / l.
P_SCALE_LOG2 = 8.0
#: This forward takes a sliding window (`kernels.mask.band_arguments`; the FP8 forward does not).
TAKES_WINDOW = True


def kernel_constants(head_dim: int, block_q: int, block_k: int, fp8: bool = False,
                     stages: int = 2) -> dict:
    """The layout of one configuration, in bytes from the 1024-aligned base of dynamic shared
    memory, and the register counts (plain Python; the kernel is built from these):
    ``chunks`` (128-byte column chunks of a Q or K row: 64 16-bit or 128 e4m3 elements),
    ``q_bytes`` (Q: box (warpgroup w, column chunk c) at ``(w * chunks + c) * 8192``),
    ``kv_bytes`` (one K or V tile; chunk c at ``c * block_k * 128``; stage s of ``stages``
    holds K at ``q_bytes + 2 s kv_bytes`` and V ``kv_bytes`` further), ``bar_offset``
    (q_full, full[0 .. stages - 1], empty[0 .. stages - 1], 8 bytes each), the descriptor
    templates ``k_template``
    (K-major, Q and K; with ``fp8`` also V, held transposed: d rows of ``block_k`` keys) and
    ``v_template`` (16-bit: MN-major, V as loaded), and the per-thread register arrays:
    ``s_regs`` (S: 32 per 64 keys), ``o_regs`` (O: 32 per 64 columns), ``p_regs`` (P: 4 per
    16 keys, or with ``fp8`` 4 per 32 keys)."""
    from .hopper import encode_wgmma_descriptor, kmajor_strides, mnmajor_strides
    elem = 1 if fp8 else 2
    chunks = head_dim * elem // SWIZZLE_ROW_BYTES
    q_bytes = block_q * head_dim * elem
    kv_bytes = block_k * head_dim * elem
    # a 128-byte swizzled K-major row: 64 16-bit elements (one k16 step = 32 bytes), or 128
    # e4m3 elements (one k32 step = 32 bytes): the same strides
    lbo_k, sbo_k, step_k = kmajor_strides("128B", BOX_COLUMNS)
    k_template = encode_wgmma_descriptor(0, lbo_k, sbo_k, "128B")
    if fp8:
        v_template, step_v = k_template, step_k
    else:
        lbo_v, sbo_v, step_v = mnmajor_strides("128B", block_k)
        v_template = encode_wgmma_descriptor(0, lbo_v, sbo_v, "128B")
    return dict(chunks=chunks, q_bytes=q_bytes, kv_bytes=kv_bytes,
                bar_offset=q_bytes + 2 * stages * kv_bytes,
                k_template=k_template, k_step=step_k, v_template=v_template, v_step=step_v,
                s_regs=32 * (block_k // 64), o_regs=32 * (head_dim // 64),
                p_regs=4 * (block_k // (32 if fp8 else 16)),
                consumers=block_q // ROWS_PER_WARPGROUP)


def stage_of(tile: int, stages: int = 2) -> int:
    """The shared-memory stage (0 .. ``stages`` - 1) of the ``tile``-th K/V tile a program
    visits."""
    return tile % stages


def full_parity(tile: int, stages: int = 2) -> int:
    """The parity consumers wait for on the *full* barrier of `stage_of` (``tile``): the
    ``tile // stages``-th phase of that stage's barrier."""
    return (tile // stages) & 1


def empty_parity(tile: int, stages: int = 2) -> int:
    """The parity the producer waits for on the *empty* barrier of `stage_of` (``tile``) before
    loading ``tile`` (>= ``stages``) into it: the phase the consumers completed releasing
    ``tile - stages``."""
    return (tile // stages - 1) & 1


def get_kernel(head_dim, block_q, block_k, is_bf16, causal, head_group, fp8=False,
               window=False, pingpong=False, overlap=False):
    """The compiled-on-first-launch kernel for one configuration (cached per process and on
    disk by `kernels.compile_cache`); ``head_group``: the launch order
    (`kernels.tile_scheduler`); ``fp8``: e4m3 Q, K, V with descales, O in bfloat16
    (``is_bf16`` is then ignored); ``window``: the band test of a sliding window (causal then
    off: the band carries it, `kernels.mask.band_arguments`); ``pingpong``: the two consumer
    warpgroups take turns issuing S = Q K^T (``block_q`` = 128 only; `_build_kernel`);
    ``overlap``: each warpgroup's softmax of tile i runs while its O += P V of tile i - 1 is
    on the tensor cores (three stages; `_build_kernel`)."""
    key = (int(head_dim), int(block_q), int(block_k), bool(is_bf16) or bool(fp8), bool(causal),
           int(head_group), bool(fp8), bool(window), bool(pingpong), bool(overlap))
    return compile_cache.built(_build_kernel, *key)


def _build_kernel(head_dim, block_q, block_k, is_bf16, causal, head_group, fp8=False,
                  window=False, pingpong=False, overlap=False):
    """The kernel for one configuration. Signature::

        kernel(maps, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               scale_log2, descale_q, descale_k, descale_v, band_lo, band_hi)

    ``maps``: uint64 [3, 16], the tensor maps of Q, K and V (`tensor_maps`); ``out``: int16
    [B, H, Nq, d] (16-bit words); ``lse``: float32 [B, H, Nq]; the ``"kv"`` CSR schedule of
    `kernels.tile_scheduler.device_schedule`; ``group`` = Hq / Hkv; the descales (float32
    [B, Hq], [B, Hkv], [B, Hkv]) are read only with ``fp8``: then Q and K are e4m3 [B, H, N, d],
    V is e4m3 transposed and key-permuted (`v_transpose_kernel`), the scores are scaled by
    ``descale_q[b, h] * descale_k[b, hk]``, P is rounded to e4m3 after a scaling by 256
    (`P_SCALE_LOG2`, divided out by the row sum, which carries it too), O is multiplied by
    ``descale_v[b, hk]`` and written in bfloat16. ``band_lo``, ``band_hi`` (int64) are read
    only with ``window``: key ``col`` is allowed for query ``row`` iff ``band_lo <= col - row <=
    band_hi``. With ``pingpong`` (two consumer warpgroups) the warpgroups take turns issuing
    S = Q K^T (FlashAttention-3's scheduler barrier, named barriers 1 and 2): warpgroup w waits
    for its turn, issues its product and hands the turn over, so that each one's softmax runs
    while the other's first product holds the tensor cores; O += P V is issued outside the
    turns. With ``overlap`` (FlashAttention-3's intra-warpgroup overlap) the K/V ring has three
    stages and a warpgroup issues tile i's S = Q K^T and then tile i - 1's O += P V, waits for
    the first only, runs tile i's softmax while the second is on the tensor cores, and then
    waits for it, releases tile i - 1's stage and rescales O; the first tile's product and the
    last tile's O += P V are peeled off the loop, so that every product is issued on a
    straight-line path (ptxas serialises every ``wgmma`` of a kernel that issues one under a
    branch inside the loop). With both, a turn covers the two products of an iteration."""
    from numba import cuda, float32, int32, uint8, uint32, uint64

    from . import hopper as hp
    from . import ptx

    D, BQ, BK = head_dim, block_q, block_k
    FP8 = bool(fp8)
    OVERLAP = bool(overlap)
    STAGES = 3 if OVERLAP else 2
    c = kernel_constants(D, BQ, BK, FP8, STAGES)
    DC = c["chunks"]                      # 128-byte column chunks of a row of Q and K (and V)
    OB = D // 64                          # n64 blocks of O
    W = c["consumers"]                    # consumer warpgroups
    THREADS = wgmma_threads(BQ, OVERLAP)
    PRODUCER_WARP = 4 * W
    REALLOC = producer_warpgroup(BQ, OVERLAP)    # a producer warpgroup gives its registers
    # a program walks several work items only where one fills its SM (the plan refuses
    # `persistent` elsewhere): the other kernels are built for one item, without the item loop
    # and the lane-0 broadcasts (which cost them 14-20 registers, ptxas 13.0)
    PERSISTABLE = REALLOC
    PRODUCER_REGS, CONSUMER_REGS = overlap_registers(BQ) if REALLOC else (0, 0)
    CONSUMER_THREADS = WARPGROUP_THREADS * W
    KS = DC * 4                           # k steps of S = Q K^T (32 bytes of a row each)
    NB = BK // 64                         # n64 blocks of S
    PS = BK // 32 if FP8 else BK // 16    # k32 (e4m3) or k16 steps of O += P V
    BOX_ELEMS = BOX_COLUMNS * 2 if FP8 else BOX_COLUMNS   # elements of a 128-byte box row
    P_SHIFT = float32(P_SCALE_LOG2)
    S_REGS, O_REGS, P_REGS = c["s_regs"], c["o_regs"], c["p_regs"]
    Q_BYTES, KV_BYTES, BAR = c["q_bytes"], c["kv_bytes"], c["bar_offset"]
    K_TMPL, V_TMPL = c["k_template"], c["v_template"]
    K_STEP, V_STEP = c["k_step"], c["v_step"]
    CHUNK_BYTES = BK * SWIZZLE_ROW_BYTES  # one 64-column chunk of a K or V tile
    SMEM = wgmma_smem_bytes(D, BQ, BK, 1 if FP8 else 2, STAGES)
    CAUSAL = causal
    WINDOW = bool(window)
    NEG_INF = float32(-math.inf)
    if FP8:
        operands, pack = "e4m3", ptx.pack_bf16x2
    else:
        operands = "bf16" if is_bf16 else "f16"
        pack = ptx.pack_bf16x2 if is_bf16 else ptx.pack_f16x2
    pack8 = hp.pack_e4m3x4
    work_item = tile_scheduler.device_work_item(head_group)
    tile_needs = tile_needs_mask(ROWS_PER_WARPGROUP, BK, CAUSAL, False, WINDOW)
    mask_tile = wgmma_tile_mask(NB, CAUSAL, WINDOW)
    issue_qk = hp.tile_product_abt(operands, KS, NB, K_TMPL, K_STEP, CHUNK_BYTES, BOX_BYTES)
    issue_pv = hp.tile_product_ab(operands, PS, OB, V_TMPL, V_STEP,
                                  64 * BK if FP8 else CHUNK_BYTES)   # FP8 V^T: d rows of keys
    @cuda.jit(device=True, inline=True)
    def next_stage(st, ph):
        """-- the ring's next position: stage ``st`` + 1 (`stage_of`), its phase bit ``ph``
        flipped at each lap (`full_parity`; a refill waits for the release's phase ``ph ^ 1``,
        `empty_parity`) --"""
        st += int32(1)
        if st == STAGES:
            return int32(0), ph ^ int32(1)
        return st, ph

    @cuda.jit(device=True, inline=True)
    def item_slice(m_blk, bh, n_heads, group, offsets, sched_b, sched_h):
        """-- a work item's (batch, head, KV head) and its schedule entries [start, stop) --"""
        b = bh // n_heads
        h = bh - b * n_heads
        s = b * sched_b + h * sched_h
        return b, h, h // group, offsets[s, m_blk], offsets[s, m_blk + 1]

    assert BAR + BARRIER_BYTES + 1024 == SMEM
    why = schedule_refusal(pingpong, overlap, BQ)
    if why:
        raise ValueError(why)
    PINGPONG = bool(pingpong)
    PP_BAR = uint32(1)                    # named barriers 1 and 2: warpgroup 0's and 1's turn
    PP_THREADS = uint32(2 * WARPGROUP_THREADS)

    @cuda.jit(device=True, inline=True)
    def take_turn(wg):
        """-- ping-pong: wait for this warpgroup's turn on the tensor cores --"""
        if PINGPONG:
            hp.named_barrier_sync(PP_BAR + uint32(wg), PP_THREADS)

    @cuda.jit(device=True, inline=True)
    def hand_over(wg):
        """-- ping-pong: the other warpgroup's turn while this one runs its softmax --"""
        if PINGPONG:
            hp.named_barrier_arrive(PP_BAR + uint32(1 - wg), PP_THREADS)

    @cuda.jit(device=True, inline=True)
    def softmax(s_reg, m_i, l_i, alpha, kv_tile, row_first, row_a, tig, n_k, sl, band_lo,
                band_hi):
        """The online softmax of one tile of scores in ``s_reg`` (its probabilities replace
        them), the running max ``m_i`` and sum ``l_i`` updated, O's factor in ``alpha``."""
        key0 = kv_tile * BK
        # -- masks: keys past the end, the causal diagonal, the window's band (only tiles
        # that need them: this warpgroup's 64 x block_k tile) --
        if key0 + BK > n_k or tile_needs(row_first // ROWS_PER_WARPGROUP, kv_tile,
                                         band_lo, band_hi):
            mask_tile(s_reg, row_a, tig, key0, n_k, band_lo, band_hi)
        # -- update m_i and l_i (row half hr: registers with (r >> 1) & 1 == hr) --
        for hr in range(2):
            mx = NEG_INF
            for nb in range(NB):
                for j in range(8):
                    r = 32 * nb + 4 * j + 2 * hr
                    mx = max(mx, max(s_reg[r], s_reg[r + 1]))
            mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
            mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
            m_new = max(m_i[hr], mx * sl)
            m_use = m_new if m_new != NEG_INF else float32(0.0)
            alpha[hr] = ptx.ex2(m_i[hr] - m_use)
            m_sub = m_use
            if FP8:
                m_sub = m_use - P_SHIFT     # P (and the row sum) scaled by 2**P_SHIFT
            row_sum = float32(0.0)
            for nb in range(NB):
                for j in range(8):
                    for e in range(2):
                        r = 32 * nb + 4 * j + 2 * hr + e
                        p = ptx.ex2(s_reg[r] * sl - m_sub)
                        row_sum += p
                        s_reg[r] = p
            l_i[hr] = l_i[hr] * alpha[hr] + row_sum
            m_i[hr] = m_new

    @cuda.jit(device=True, inline=True)
    def rescale(o_reg, alpha):
        """O's rows times their factor from the last softmax."""
        for hr in range(2):
            for dc in range(OB):
                for j in range(8):
                    for e in range(2):
                        o_reg[32 * dc + 4 * j + 2 * hr + e] *= alpha[hr]

    @cuda.jit(device=True, inline=True)
    def to_p(pa, s_reg):
        """P in registers as the A fragment of O += P V."""
        if FP8:
            # -- P to e4m3, keys of each k32 slice in `fp8_key_order` --
            for kc in range(PS):
                for q in range(4):
                    r = 16 * kc + 8 * (q >> 1) + 2 * (q & 1)
                    pa[4 * kc + q] = pack8(s_reg[r], s_reg[r + 1], s_reg[r + 4], s_reg[r + 5])
        else:
            # -- P to 16 bits: the accumulator of k16 slice kc is its A fragment --
            for kc in range(PS):
                for q in range(4):
                    r = 32 * (kc // 4) + 8 * (kc % 4) + 2 * q
                    pa[4 * kc + q] = pack(s_reg[r], s_reg[r + 1])

    @cuda.jit(device=True, inline=True)
    def score_tile(s_reg, q_wg, kv_s, st, wg, m_i, l_i, alpha, kv_index, it, row_first, row_a,
                   tig, n_k, sl, band_lo, band_hi):
        """-- S = Q K^T of one tile alone (in this warpgroup's turn; K in ring stage st), then
        the softmax of key tile kv_index[it] (read once the product is done) --"""
        take_turn(wg)
        hp.wgmma_fence()
        issue_qk(s_reg, q_wg, kv_s + st * 2 * KV_BYTES)
        hand_over(wg)
        hp.wgmma_wait_group(0)
        hp.wgmma_fence_operands(s_reg, 0, S_REGS)
        softmax(s_reg, m_i, l_i, alpha, kv_index[it], row_first, row_a, tig, n_k, sl, band_lo,
                band_hi)

    @cuda.jit(device=True, inline=True)
    def pv_tile(o_reg, pa, v_st):
        """-- O += P V of one tile alone, waited for --"""
        hp.wgmma_fence()
        issue_pv(o_reg, pa, v_st)
        hp.wgmma_wait_group(0)
        hp.wgmma_fence_operands(o_reg, 0, O_REGS)

    @cuda.jit(launch_bounds=(THREADS, 1), lineinfo=False)
    def kernel(maps, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               scale_log2, descale_q, descale_k, descale_v, band_lo, band_hi):
        smem = cuda.shared.array(0, dtype=uint8)         # dynamic: kernel.smem_bytes
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        # -- the work items this program takes: dispatch positions first, first + step, ... of
        # the grid (Q tiles, batch * heads) (one each on that grid; a persistent launch has
        # fewer programs, one per SM) --
        n_heads = int32(out.shape[1])      # 32-bit: the item decode's divisions inline
        group32 = int32(group)
        n_blocks_q = int32((n_q + BQ - 1) // BQ)
        n_bh = int32(out.shape[0]) * n_heads
        n_work = n_blocks_q * n_bh
        first = int32(cuda.blockIdx.x + cuda.gridDim.x * cuda.blockIdx.y)
        step = int32(cuda.gridDim.x * cuda.gridDim.y) if PERSISTABLE else int32(1)
        end = n_work if PERSISTABLE else first + int32(1)
        # shared memory from a 1024-byte boundary (the 128-byte swizzle's repeat): Q | stage 0
        # K, V | stage 1 K, V | (stage 2 K, V) | barriers
        base = hp.aligned_shared_base(smem)
        q_s = base
        kv_s = base + Q_BYTES
        q_full = base + BAR
        full0 = q_full + 8
        empty0 = full0 + 8 * STAGES
        q_empty = empty0 + 8 * STAGES      # every consumer thread is done with Q's S products
        if tid == 0:
            hp.mbarrier_init(q_empty, CONSUMER_THREADS)
            hp.init_ring_barriers(q_full, STAGES, CONSUMER_THREADS)
        cuda.syncthreads()       # the last CTA-wide barrier: the roles part here

        if REALLOC and warp >= PRODUCER_WARP:
            hp.setmaxnreg_dec(PRODUCER_REGS)        # the producer warpgroup's, all four warps
        if warp == PRODUCER_WARP:
            if lane == 0:
                # -- producer: per work item Q once, then K and V tile by tile into the stages
                # (tile i of the program's stream uses stage i % STAGES) --
                g = hp.array_addr(maps)                         # Q, K, V maps: 128 bytes
                g_k = g + uint64(128)
                g_v = g + uint64(256)
                hp.fence_proxy_tensormap_acquire(g)
                hp.fence_proxy_tensormap_acquire(g_k)
                hp.fence_proxy_tensormap_acquire(g_v)
                st = int32(0)               # the ring: next stage, its phase, whether it
                ph = int32(0)               # went round once (then a stage is refilled only
                lapped = int32(0)           # after its release)
                done = int32(0)             # the program's earlier work items
                for lin in range(first, end, step):
                    tile, bh = work_item(lin, n_blocks_q, n_bh)
                    m_blk = n_blocks_q - 1 - tile           # longest (causal) tiles first
                    b, h, hk, start, stop = item_slice(m_blk, bh, n_heads, group32, offsets,
                                                       sched_b, sched_h)
                    row0 = m_blk * BQ
                    if done > 0:        # Q's buffer: the last item's S products are done
                        hp.mbarrier_wait_parity(q_empty, (done - 1) & 1)
                    q_boxes = 0
                    for wg in range(W):
                        if row0 + ROWS_PER_WARPGROUP * wg < n_q:   # past the end: not issued
                            q_boxes += DC
                    hp.mbarrier_arrive_expect_tx(q_full, q_boxes * BOX_BYTES)
                    for wg in range(W):
                        if row0 + ROWS_PER_WARPGROUP * wg < n_q:
                            for cc in range(DC):
                                hp.cp_async_bulk_tensor_4d_g2s(
                                    q_s + (wg * DC + cc) * BOX_BYTES, g, BOX_ELEMS * cc,
                                    row0 + ROWS_PER_WARPGROUP * wg, h, b, q_full)
                    for it in range(start, stop):
                        if lapped:      # stage st last held the tile STAGES before: its release
                            hp.mbarrier_wait_parity(empty0 + 8 * st, ph ^ int32(1))
                        key0 = kv_index[it] * BK
                        k_st = kv_s + st * 2 * KV_BYTES
                        hp.mbarrier_arrive_expect_tx(full0 + 8 * st, 2 * KV_BYTES)
                        for cc in range(DC):
                            hp.cp_async_bulk_tensor_4d_g2s(k_st + cc * CHUNK_BYTES, g_k,
                                                           BOX_ELEMS * cc, key0, hk, b,
                                                           full0 + 8 * st)
                            if not FP8:
                                hp.cp_async_bulk_tensor_4d_g2s(
                                    k_st + KV_BYTES + cc * CHUNK_BYTES, g_v, BOX_COLUMNS * cc,
                                    key0, hk, b, full0 + 8 * st)
                        if FP8:         # V^T: one box of d rows x block_k keys
                            hp.cp_async_bulk_tensor_4d_g2s(k_st + KV_BYTES, g_v, key0, 0, hk,
                                                           b, full0 + 8 * st)
                        st, ph = next_stage(st, ph)
                        if st == 0:
                            lapped = int32(1)
                    done += 1
            return
        if REALLOC:
            if warp > PRODUCER_WARP:
                return
            hp.setmaxnreg_inc(CONSUMER_REGS)

        # -- consumers: warpgroup wg owns query rows m_blk * BQ + 64 wg .. + 63 of each item --
        wg = warp // 4
        gid = lane // 4
        tig = lane % 4
        q_wg = q_s + wg * DC * BOX_BYTES
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        o_reg = cuda.local.array(O_REGS, dtype=float32)
        pa = cuda.local.array(P_REGS, dtype=uint32)
        m_i = cuda.local.array(2, dtype=float32)
        l_i = cuda.local.array(2, dtype=float32)
        alpha = cuda.local.array(2, dtype=float32)
        if PINGPONG and wg == 1:
            hp.named_barrier_arrive(PP_BAR, PP_THREADS)     # warpgroup 0 multiplies first
        st = int32(0)           # the ring as the producer fills it (`next_stage`)
        ph = int32(0)
        done = int32(0)
        for lin in range(first, end, step):
            tile, bh = work_item(lin, n_blocks_q, n_bh)
            # the item and its schedule entries, broadcast from lane 0: known warp-uniform, so
            # that ptxas keeps the tile loop's ring, descriptors and mask tests in uniform
            # registers (computed per thread, they cost 3-8 % at d = 64)
            m_blk = n_blocks_q - 1 - tile
            if PERSISTABLE:
                m_blk = cuda.shfl_sync(0xFFFFFFFF, m_blk, 0)
                bh = cuda.shfl_sync(0xFFFFFFFF, bh, 0)
            b, h, hk, start, stop = item_slice(m_blk, bh, n_heads, group32, offsets, sched_b,
                                               sched_h)
            if PERSISTABLE:
                start = cuda.shfl_sync(0xFFFFFFFF, start, 0)
                stop = cuda.shfl_sync(0xFFFFFFFF, stop, 0)
            row_first = m_blk * BQ + ROWS_PER_WARPGROUP * wg
            row_a = row_first + 16 * (warp % 4) + gid     # this thread's rows: row_a, row_a + 8
            for r in range(O_REGS):
                o_reg[r] = float32(0.0)
            for hr in range(2):
                m_i[hr] = NEG_INF
                l_i[hr] = float32(0.0)
            sl = scale_log2
            if FP8:
                sl = scale_log2 * descale_q[b, h] * descale_k[b, hk]
            hp.mbarrier_wait_parity(q_full, done & 1)

            if not OVERLAP:
                for it in range(start, stop):
                    k_st = kv_s + st * 2 * KV_BYTES
                    hp.mbarrier_wait_parity(full0 + 8 * st, ph)
                    score_tile(s_reg, q_wg, kv_s, st, wg, m_i, l_i, alpha, kv_index, it,
                               row_first, row_a, tig, n_k, sl, band_lo, band_hi)
                    rescale(o_reg, alpha)
                    to_p(pa, s_reg)
                    pv_tile(o_reg, pa, k_st + KV_BYTES)
                    hp.mbarrier_arrive(empty0 + 8 * st)      # this stage may be refilled
                    st, ph = next_stage(st, ph)
                hp.mbarrier_arrive(q_empty)             # Q may be refilled
            elif start < stop:
                # -- tile 0: S = Q K^T and its softmax (O is still zero: no rescale) --
                hp.mbarrier_wait_parity(full0 + 8 * st, ph)
                score_tile(s_reg, q_wg, kv_s, st, wg, m_i, l_i, alpha, kv_index, start,
                           row_first, row_a, tig, n_k, sl, band_lo, band_hi)
                to_p(pa, s_reg)
                st_prev = st
                st, ph = next_stage(st, ph)
                for it in range(start + 1, stop):
                    k_st = kv_s + st * 2 * KV_BYTES
                    v_prev = kv_s + st_prev * 2 * KV_BYTES + KV_BYTES
                    hp.mbarrier_wait_parity(full0 + 8 * st, ph)
                    # -- issue S = Q K^T of tile i, then O += P V of tile i - 1 --
                    take_turn(wg)
                    hp.wgmma_fence()
                    issue_qk(s_reg, q_wg, k_st)
                    issue_pv(o_reg, pa, v_prev)
                    hand_over(wg)
                    # -- softmax of tile i while O += P V runs --
                    hp.wgmma_wait_group(1)
                    hp.wgmma_fence_operands(s_reg, 0, S_REGS)
                    softmax(s_reg, m_i, l_i, alpha, kv_index[it], row_first, row_a, tig, n_k,
                            sl, band_lo, band_hi)
                    hp.wgmma_wait_group(0)
                    hp.wgmma_fence_operands(o_reg, 0, O_REGS)
                    hp.mbarrier_arrive(empty0 + 8 * st_prev)    # tile i - 1's stage is free
                    rescale(o_reg, alpha)
                    to_p(pa, s_reg)
                    st_prev = st
                    st, ph = next_stage(st, ph)
                # -- every S = Q K^T of the item is done: Q may be refilled; the last tile's
                # O += P V --
                hp.mbarrier_arrive(q_empty)
                pv_tile(o_reg, pa, kv_s + st_prev * 2 * KV_BYTES + KV_BYTES)
                hp.mbarrier_arrive(empty0 + 8 * st_prev)
            else:
                hp.mbarrier_arrive(q_empty)             # no tile: Q is not read

            # -- epilogue: one rescale, O as packed 16-bit pairs, logsumexp (natural log) --
            for hr in range(2):
                l_tot = l_i[hr]
                l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 1)
                l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 2)
                row = row_a + 8 * hr
                inv = float32(1.0) / l_tot if l_tot > float32(0.0) else float32(0.0)
                if FP8:
                    inv *= descale_v[b, hk]
                if row < n_q:
                    for dc in range(OB):
                        for j in range(8):
                            r = 32 * dc + 4 * j + 2 * hr
                            word = pack(o_reg[r] * inv, o_reg[r + 1] * inv)
                            ptx.st_global_u32(ptx.global_addr(out, b, h, row, 64 * dc + 8 * j
                                                              + 2 * tig), word)
                    if tig == 0:
                        if l_tot > float32(0.0):
                            m_row = m_i[hr]
                            if FP8:
                                m_row -= P_SHIFT
                            lse[b, h, row] = m_row * float32(LN2) + math.log(l_tot)
                        else:
                            lse[b, h, row] = NEG_INF
            done += 1
        if PINGPONG and wg == 0:    # the other warpgroup's last turn signal
            hp.named_barrier_sync(PP_BAR, PP_THREADS)

    kernel.threads = THREADS
    kernel.smem_bytes = SMEM
    return kernel


# -- host side -----------------------------------------------------------------------------------
def tiles(problem, config):
    """``(block_q, block_k)`` for a problem: ``config``'s, else the problem's requested tiles,
    else `sim.plans.wgmma_fwd.schedule_default_blocks` (the default tile of ``config``'s
    schedule)."""
    default = schedule_default_blocks(problem.head_dim, problem.causal, problem.seqlen_q,
                                      config.pingpong, config.overlap)
    return requested_tiles(problem, config, default, BLOCK_Q_CHOICES, BLOCK_K_CHOICES)


def supports(problem, config):
    """Why this forward cannot run ``problem`` under ``config`` (a string naming what it
    refuses), or None. Checked in this order: the problem's
    features (mask, bias, block mask, dropout, cache lengths, value head dim, bottom-right
    causal with Nq != Nk and no window, dtype, head dim, tiles; a window is taken, bottom-right
    aligned as `BlockInfo.band` says); then the hardware (a real
    GPU of compute capability 9.0 or more). The registry tries it before the ``mma`` family
    for every forward it takes (measured faster on an H100 and an H200: docs/kernels.md)."""
    pb = problem
    why = problem_refusal(pb, "the wgmma forward")
    if why:
        return why
    bq, bk = tiles(pb, config)
    if bq not in BLOCK_Q_CHOICES or bk not in BLOCK_K_CHOICES:
        return (f"the wgmma forward takes block_q in {BLOCK_Q_CHOICES} and block_k in "
                f"{BLOCK_K_CHOICES}, got block_q={bq}, block_k={bk}")
    why = (schedule_refusal(config.pingpong, config.overlap, bq)
           or smem_refusal(pb.head_dim, bq, bk, config.overlap))
    if why:
        return why
    why = host.tensor_core_refusal(pb, "the wgmma family", DTYPES, SUPPORTED_HEAD_DIMS,
                                   window=True)
    return why or _hopper_refusal("the wgmma family")


def problem_refusal(problem, what: str) -> str | None:
    """Why a wgmma kernel (``what``: "the wgmma forward", "the wgmma backward") cannot run
    ``problem``'s features, or None; in this order: a mask, bias or block mask, dropout, cache
    lengths, a value head dim other than the query's, bottom-right causal with Nq != Nk and no
    window, a dtype other than float16/bfloat16, a head dim other than 64 or 128."""
    pb = problem
    for name, desc in (("mask", "a boolean mask"), ("bias", "an additive bias"),
                       ("block_mask", "a block mask")):
        if getattr(pb, name, None) is not None:
            return f"{what} takes no {name} ({desc})"
    if pb.dropout_p > 0:
        return f"{what} has no dropout (dropout_p={pb.dropout_p})"
    if getattr(pb, "cache_seqlens", None) is not None:
        return f"{what} takes no cache_seqlens"
    if getattr(pb, "value_dim", None) not in (None, pb.head_dim):
        return f"{what} needs value_dim == head_dim, got {pb.value_dim}"
    if (pb.causal and pb.seqlen_q != pb.seqlen_k and getattr(pb, "window_size", None) is None
            and getattr(pb, "causal_alignment", "top_left") != "top_left"):
        return f"{what} aligns causal masks top-left only (causal_alignment with Nq != Nk)"
    dtype = str(pb.dtype).replace("torch.", "")
    if dtype not in DTYPES:
        return f"{what} takes dtype float16 or bfloat16, got {dtype}"
    if pb.head_dim not in SUPPORTED_HEAD_DIMS:
        return f"{what} takes head_dim in {SUPPORTED_HEAD_DIMS}, got {pb.head_dim}"
    return None


def _hopper_refusal(what: str) -> str | None:
    """Why ``what`` cannot run on this machine's current device (no real GPU, or compute
    capability below 9.0: sm_90a's wgmma and TMA), or None."""
    if not host.real_gpu():
        return f"{what} needs a GPU (wgmma, TMA): the CUDA simulator runs neither"
    cc = host.compute_capability(host.current_device_id())
    if cc < (9, 0):
        return (f"{what} needs compute capability 9.0 (sm_90a: wgmma, TMA), this GPU "
                f"has {cc[0]}.{cc[1]}")
    return None


def forward(problem, config):
    """``(out, lse)`` in the problem's kind of array (see `kernels.forward`)."""
    return prepare(problem, config)(problem.q, problem.k, problem.v)


def plan(problem, config):
    """The `sim.plan.Plan` this forward launches for ``problem`` (`sim.plans.wgmma_fwd`): its
    grid, threads and shared memory are what `prepare` launches."""
    block_q, block_k = tiles(problem, config)
    return host.family_plan("wgmma", "fwd", problem, block_q=block_q, block_k=block_k,
                            launch_order=config.launch_order, pingpong=config.pingpong,
                            overlap=config.overlap, persistent=config.persistent)


def _operand_layout(x, itemsize=2):
    """``(address, shape, strides_bytes)`` of a 4-D device operand (torch tensor or Numba
    device array), strides of extent-1 dimensions replaced by packed values (any value is
    legal there, the tensor map wants multiples of 16)."""
    if hasattr(x, "data_ptr"):
        addr, shape = int(x.data_ptr()), tuple(int(n) for n in x.shape)
        strides = [int(s) * itemsize for s in x.stride()]
    else:
        addr, shape = int(x.__cuda_array_interface__["data"][0]), tuple(int(n) for n in x.shape)
        strides = [int(s) for s in x.strides]
    packed = itemsize
    for dim in range(3, -1, -1):
        if shape[dim] == 1:
            strides[dim] = packed
        packed = max(packed, strides[dim] * shape[dim])
    return addr, shape, tuple(strides)


def _needs_copy(x, itemsize=2, layout=None) -> bool:
    """Whether an operand must be made contiguous for a tensor map: a zero or non-16-byte
    stride on a dimension of extent > 1, an unaligned start, or a strided last dimension
    (``layout``: its `_operand_layout`, when the caller has it)."""
    addr, shape, strides = layout or _operand_layout(x, itemsize)
    return (addr % 16 != 0 or strides[3] != itemsize
            or any(n > 1 and (s == 0 or s % 16) for n, s in zip(shape[:3], strides[:3])))


_MAPS: dict = {}        # (device, layouts, boxes, dtype) -> device uint64 [n, 16]
_MAP_BUFFERS: dict = {}  # the same keys -> the torch buffer holding a map (torch operands)
#: Maps written while a CUDA graph was being captured: a captured kernel reads them at every
#: replay, so they are kept for the life of the process (384 bytes each), never evicted.
_CAPTURED_MAPS: list = []
MAP_WORDS = 3 * 16


def _build_map_writer():
    """The kernel of `map_writer`: ``store_words(dst, w0, ..., w47)``, one scalar uint64
    parameter per word (so that `kernels.host.launch` packs them and the kernel goes through
    the on-disk cache; the source is generated because a kernel's parameters are named)."""
    params = ", ".join(f"w{i}" for i in range(MAP_WORDS))
    body = "".join(f"        dst[{i}] = w{i}\n" for i in range(MAP_WORDS))
    namespace = {"cuda": cuda}
    exec(f"def store_words(dst, {params}):\n    if cuda.grid(1) == 0:\n{body}", namespace)
    return cuda.jit(namespace["store_words"])


def map_writer():
    """``store_words(dst, *words)``: one thread stores the 48 uint64 ``words`` (passed by value
    as kernel parameters) into ``dst`` (uint64 [48]). How tensor maps reach the device during
    CUDA graph capture, where no memory may be allocated and no host buffer copied: the words
    become part of the captured launch. Built once per process and compiled once per machine
    (`kernels.compile_cache`), so a process that finds it on disk compiles nothing."""
    return compile_cache.built(_build_map_writer)


def _write_words(dst, words, stream) -> None:
    """Launch `map_writer` on ``stream``: ``words`` (48 integers) into ``dst`` (uint64 [48])."""
    import numpy as np
    host.launch(map_writer(), 1, 32, stream, (dst, *(np.uint64(w) for w in words)))


def _capturing(x) -> bool:
    """Whether ``x`` is a torch CUDA tensor and torch's current stream is capturing a graph."""
    if not host._is_torch(x):
        return False
    import torch
    return torch.cuda.is_current_stream_capturing()


def tensor_maps(q, k, v, block_k, stream=0, fp8=False, layouts=None):
    """The tensor maps of Q (boxes of 64 rows x 64 columns), K and V (``block_k`` rows x 64
    columns), 128-byte swizzle, 16-bit elements, as one device array uint64 [3, 16]
    (`maps_for`; operands as `kernels.host.Call.input` gives them, 16-bit words). With
    ``fp8``: bytes, Q in boxes of 64 rows x 128 columns, K of ``block_k`` rows x 128 columns and
    ``v`` the transposed V [B, Hkv, d, keys] of `v_transpose` in boxes of d rows x ``block_k``
    keys. ``layouts``: the operands' `_operand_layout`, when the caller has them."""
    itemsize = 1 if fp8 else 2
    if layouts is None:
        layouts = tuple(_operand_layout(x, itemsize) for x in (q, k, v))
    if fp8:
        cols = 2 * BOX_COLUMNS
        boxes = ((1, 1, ROWS_PER_WARPGROUP, cols), (1, 1, block_k, cols),
                 (1, 1, layouts[2][1][2], block_k))
    else:
        boxes = ((1, 1, ROWS_PER_WARPGROUP, BOX_COLUMNS), (1, 1, block_k, BOX_COLUMNS),
                 (1, 1, block_k, BOX_COLUMNS))
    return maps_for(q, layouts, boxes, stream, "uint8" if fp8 else "uint16")


def maps_for(like, layouts, boxes, stream=0, dtype="uint16"):
    """The tensor maps (128-byte swizzle, elements ``dtype``) of operands with ``layouts``
    (`_operand_layout` each) in ``boxes`` (one 4-D box each), as one device array uint64
    [n, 16], built and copied once per device, layouts and boxes; for torch operands (``like``,
    one of them) into torch memory by an asynchronous copy on ``stream``, so that a call never
    waits for the device. Under CUDA graph capture (``stream`` the capturing stream as
    `kernels.host.launch_stream` gives it), a new map goes to memory from torch's allocator
    (the graph's pool) by one-thread launches of `map_writer` on ``stream``, the words as their
    parameters, and is kept for good (`_CAPTURED_MAPS`)."""
    key = (host.current_device_id(), tuple(layouts), tuple(boxes), dtype)
    hit = _MAPS.get(key)
    n = len(layouts)
    if hit is None:
        import numpy as np
        from numba import cuda

        from .hopper import encode_tensor_map_4d
        cuda.current_context()      # this thread's (torch's autograd thread has none of its own)
        words = np.stack([encode_tensor_map_4d(addr, shape, strides[:3], box, dtype, "128B")
                          for (addr, shape, strides), box in zip(layouts, boxes)])
        words = words.astype(np.uint64).ravel()
        if len(_MAPS) > 64:
            _MAPS.clear()
            _MAP_BUFFERS.clear()
        if host._is_torch(like):
            # in torch memory, written in stream order: a synchronous copy would make the host
            # wait for every kernel queued before it (each call with new operands in a training
            # step), and freeing Numba's memory synchronises the device
            import torch
            buf = torch.empty(n * 16, dtype=torch.int64, device=like.device)
            flat = cuda.as_cuda_array(buf, sync=False).view(np.uint64)
            if _capturing(like):
                # `map_writer` stores MAP_WORDS words a launch: windows covering all of them
                for first in sorted({min(i, len(words) - MAP_WORDS)
                                     for i in range(0, len(words), MAP_WORDS)}):
                    _write_words(flat[first:first + MAP_WORDS],
                                 words[first:first + MAP_WORDS], stream)
                _CAPTURED_MAPS.append(buf)
            else:       # from pageable memory: staged at once, no wait for the device
                flat.copy_to_device(words, stream=stream)
            _MAP_BUFFERS[key] = buf
            hit = flat.reshape(n, 16)
        else:
            hit = cuda.to_device(words.reshape(n, 16))
        _MAPS[key] = hit
    elif _capturing(like):
        _CAPTURED_MAPS.append(hit)          # a captured launch reads it: never to be freed
    return hit


_WARMED: set = set()     # devices where `map_writer` has run once


def warm_map_writer(device_index: int) -> None:
    """Load `map_writer` now (from the disk cache, or compiled), outside any graph capture (a
    launch on a scratch buffer), so that a capture later only launches it; once per device (not during a
    capture, which is tried again at the next prepare)."""
    if device_index in _WARMED:
        return
    import numpy as np
    import torch
    from numba import cuda
    if torch.cuda.is_current_stream_capturing():
        return
    _WARMED.add(device_index)
    buf = torch.empty(MAP_WORDS, dtype=torch.int64, device=f"cuda:{device_index}")
    stream = host.launch_stream(buf)
    _write_words(cuda.as_cuda_array(buf, sync=False).view(np.uint64), range(MAP_WORDS), stream)


def prepare(problem, config):
    """The forward of ``problem`` with its per-problem choices made once (plan, kernel, tile
    schedule, constants): ``run(q, k, v) -> (out, lse)`` for operands of its shapes, dtype and
    device, launched as `plan` says (grid, threads, dynamic shared memory; checked against the
    compiled kernel's own by `kernels.host.check_launch`)."""
    import numpy as np
    pb = problem
    the_plan = plan(pb, config)
    launch = the_plan.kernels[0]
    block_q, block_k = the_plan.config["block_q"], the_plan.config["block_k"]
    group = tile_scheduler.head_group(config.launch_order, pb.causal, "fwd")
    is_bf16 = str(pb.dtype).endswith("bfloat16")
    causal, window, band_lo, band_hi = band_arguments(pb)
    kern = get_kernel(pb.head_dim, block_q, block_k, is_bf16, causal, group, window=window,
                      pingpong=the_plan.config["pingpong"], overlap=the_plan.config["overlap"])
    host.check_launch(launch.name, (launch.threads, launch.shared_bytes),
                      (kern.threads, kern.smem_bytes))
    grid = host.launch_grid(launch)
    offsets, index, sched_b, sched_h = tile_scheduler.device_schedule(pb, block_q, block_k, "kv")
    B, H, Nq, D, Nk = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim, pb.seqlen_k
    template = host._without_operands(pb)
    ones = _unit_descales()
    tail = (offsets, index, sched_b, sched_h, H // pb.heads_kv, Nq, Nk,
            np.float32(pb.scale * LOG2E), ones, ones, ones, np.int64(band_lo), np.int64(band_hi))
    plans: dict = {}
    if pb.kind == "torch" and host.real_gpu():
        warm_map_writer(host.current_device_id())
    repeat = host.Repeat(template, config)
    shapes_strides: list = []       # the recorded operands' (shape, strides) in their tensor maps
    map_pointers: dict = {}         # operands' data pointers -> (address of their maps, the maps)

    def run(q, k, v, layout_known=False):
        ptrs = repeat.pointers((q, k, v), layout_known)
        if ptrs is not None:            # -- the operands' layout of the recorded call: repeat it --
            # the operands' tensor maps: by their pointers, from the last calls' (a map
            # made while a graph is captured is kept for good: `tensor_maps` does that)
            key = tuple(ptrs)
            hit = map_pointers.get(key)
            if hit is None or _capturing(q):
                maps = tensor_maps(q, k, v, block_k, host.launch_stream(q), layouts=tuple(
                    (ptr, *rest) for ptr, rest in zip(ptrs, shapes_strides)))
                if len(map_pointers) > 16:
                    map_pointers.clear()
                hit = map_pointers[key] = (driver.device_pointer(maps), maps)   # (kept alive)
            p_maps = hit[0]
            out = repeat.like_layout(q)             # [B, H, Nq, D], in q's layout
            lse = repeat.empty(q, (B, H, Nq), repeat.float32)
            repeat.launches[0](host.stream_handle(q), p_maps, out.data_ptr(), lse.data_ptr())
            return out, lse
        call = host.Call(template, q=q)
        ops = [call.input(x, words=True, aligned=True) for x in (q, k, v)]
        layouts = [_operand_layout(x) for x in ops]
        for i, (x, layout) in enumerate(zip(ops, layouts)):
            if hasattr(x, "contiguous") and _needs_copy(x, layout=layout):
                ops[i] = host.aligned_copy(x)
                layouts[i] = _operand_layout(ops[i])
        maps = tensor_maps(*ops, block_k, call.stream, layouts=tuple(layouts))
        out = call.output((B, H, Nq, D), words=True, like=q)     # in q's layout (dense q)
        lse = call.output((B, H, Nq), float32=True)
        args = (maps, out.arg, lse.arg, *tail)
        host.relaunch(plans, (out.arg, lse.arg), kern, grid, launch.threads, call.stream,
                      args, sharedmem=launch.shared_bytes, fast=config.fast_launch)
        if repeat.launches is None:
            shapes_strides[:] = [layout[1:] for layout in layouts]
            repeat.record((q, k, v), ops, lambda: [host.pointer_launch(
                kern, grid, launch.threads, launch.shared_bytes, args, range(3))])
        result = out.value(), lse.value()   # (NumPy: copied back while ops are still alive)
        del ops
        return result
    return run


def _unit_descales():
    """The descale arguments of a 16-bit launch (never read: float32 [1, 1] ones, one per
    device)."""
    import numpy as np
    return host.device_const(("wgmma_unit_descales",), lambda: np.ones((1, 1), np.float32))


# -- the FP8 (e4m3) forward ----------------------------------------------------------------------
#: Head dims of the FP8 forward (`sim.plans.wgmma_fwd`: a 128-byte swizzled row is 128 e4m3
#: elements); its query tiles are the wgmma forward's, its key tile `FP8_BLOCK_K`.
FP8_HEAD_DIMS = (FP8_HEAD_DIM,)


def fp8_supports(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal,
                 block_q=None):
    """Why the FP8 forward cannot run this problem (a string naming the argument), or None.
    Top-left causal or none, GQA, any lengths; head_dim 128; a GPU of compute capability 9.0
    or more."""
    for name, v in (("batch", batch), ("heads_q", heads_q), ("heads_kv", heads_kv),
                    ("seqlen_q", seqlen_q), ("seqlen_k", seqlen_k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"the FP8 forward needs {name} >= 1, got {v!r}"
    if heads_q % heads_kv:
        return f"the FP8 forward needs heads_q ({heads_q}) a multiple of heads_kv ({heads_kv})"
    if head_dim not in FP8_HEAD_DIMS:
        return f"the FP8 forward takes head_dim in {FP8_HEAD_DIMS}, got {head_dim}"
    if block_q is not None and block_q not in FP8_BLOCK_Q_CHOICES:
        return f"the FP8 forward takes block_q in {FP8_BLOCK_Q_CHOICES}, got {block_q}"
    return _hopper_refusal("the FP8 forward")


#: Keys of the transposed V (`v_transpose_kernel`): ``n_k`` rounded up to whole key tiles.
v_transpose_keys = fp8_transpose_keys
#: Keys per program of the transpose.
V_TRANSPOSE_TILE = FP8_TRANSPOSE_TILE


@functools.lru_cache(maxsize=None)
def v_transpose_kernel():
    """``transpose(v, vt, n_k)``: V (the e4m3 bytes of [B, Hkv, Nk, 128] seen as int32 words
    [B, Hkv, Nk, 32], rows contiguous) into ``vt`` (int32 words of the bytes [B, Hkv, 128,
    Nk_pad], contiguous): byte ``vt[b, h, c, 32 t + p] = v[b, h, 32 t + fp8_key_order(p), c]``,
    zero for keys >= ``n_k``. Launched on the grid (Nk_pad / 32, B * Hkv) of 256 threads; each
    program moves 32 keys x 128 columns through shared memory as 4-byte words (loads along a
    key's row, stores along a column's keys). The FP8 forward's B operand of P V must be
    K-major (8-bit ``wgmma`` has no transposed form), and its keys follow the order in which P
    leaves the accumulator (`kernels.hopper.fp8_key_order`)."""
    import numpy as np
    from numba import int32, int64

    from .hopper import fp8_key_order
    order_array = np.array([fp8_key_order(p) for p in range(32)], dtype=np.int32)
    T = FP8_TRANSPOSE_TILE
    THREADS = FP8_TRANSPOSE_THREADS
    D = FP8_HEAD_DIM
    DW = D // 4                  # words of a key's row
    KW = T // 4                  # words of a column's 32 keys
    TILE = (T, DW + 1)           # a padded row: column c's words of 32 keys in 32 banks

    @cuda.jit
    def transpose(v, vt, n_k):
        tile = cuda.shared.array(TILE, dtype=int32)
        perm = cuda.const.array_like(order_array)
        tid = cuda.threadIdx.x
        key0 = cuda.blockIdx.x * T
        bh = cuda.blockIdx.y
        heads = v.shape[1]
        b = bh // heads
        h = bh % heads
        for idx in range(tid, T * DW, THREADS):     # -- load: 32 keys x 32 words, along the rows
            kk = idx // DW
            w = idx % DW
            tile[kk, w] = v[b, h, key0 + kk, w] if key0 + kk < n_k else int32(0)
        cuda.syncthreads()
        for idx in range(tid, D * KW, THREADS):     # -- store: 128 columns x 8 words of 4 keys
            c = idx // KW
            kw = idx % KW
            word = int64(0)
            for i in range(4):
                byte = (int64(tile[perm[4 * kw + i], c >> 2]) >> (8 * (c & 3))) & 0xFF
                word |= byte << (8 * i)
            vt[b, h, c, key0 // 4 + kw] = int32(word if word < 0x80000000 else word - 0x100000000)

    return transpose


def v_transpose(v8, stream=None, plans=None):
    """The transposed, key-permuted V of the FP8 forward (`v_transpose_kernel`) for a torch
    e4m3 V [B, Hkv, Nk, 128] on the GPU: a new uint8 tensor [B, Hkv, 128, `v_transpose_keys`]
    (V is copied first if its rows are not 4-byte words), launched on the plan's grid
    (`sim.plans.wgmma_fwd.fp8_transpose_grid`) on ``stream`` (None: torch's current one);
    ``plans``: a caller's `kernels.host.relaunch` plans (None: `kernels.host.launch`)."""
    import torch
    B, Hkv, Nk, D = (int(n) for n in v8.shape)
    if D not in FP8_HEAD_DIMS:
        raise ValueError(f"v_transpose takes head dim {FP8_HEAD_DIMS}, got {D}")
    v = v8.view(torch.uint8)
    if v.stride(3) != 1 or any(s % 4 for s in v.stride()[:3]) or v.data_ptr() % 4:
        v = host.aligned_copy(v)
    vt = torch.empty((B, Hkv, D, v_transpose_keys(Nk)), dtype=torch.uint8, device=v8.device)
    stream = host.launch_stream(v8) if stream is None else stream
    args = (v.view(torch.int32), vt.view(torch.int32), Nk)
    grid = fp8_transpose_grid(B, Hkv, Nk)
    if plans is None:
        host.launch(v_transpose_kernel(), grid, FP8_TRANSPOSE_THREADS, stream, args)
    else:
        host.relaunch(plans, args[:2], v_transpose_kernel(), grid, FP8_TRANSPOSE_THREADS,
                      stream, args)
    return vt


def fp8_plan(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, block_q=None,
             launch_order=None, pingpong=None, overlap=None, persistent=None):
    """The `sim.plan.Plan` `forward_fp8` launches (`sim.plans.wgmma_fwd.wgmma_fp8_forward_plan`:
    the V transpose, then the attention kernel; ``pingpong``, ``overlap`` None: the plan's
    defaults)."""
    from sim.plans import plan_for
    from sim.workload import Workload
    w = Workload(batch=batch, heads=heads_q, heads_kv=heads_kv, seq_len_q=seqlen_q,
                 seq_len_k=seqlen_k, head_dim=head_dim, dtype="bf16", causal=bool(causal))
    return plan_for("wgmma_fp8", "fwd", w, block_q=block_q or FP8_DEFAULT_BLOCK_Q,
                    block_k=FP8_BLOCK_K, launch_order=launch_order, pingpong=pingpong,
                    overlap=overlap, persistent=persistent)


#: (shapes, causal, scale, block_q, launch order, ping-pong, overlap, persistent, device) ->
#: _Fp8Launch
_FP8_PREPARED: dict = {}


class _Fp8Launch:
    """What `forward_fp8` decides once per configuration: the attention kernel's launch from the
    plan (the transpose's grid is `v_transpose`'s, from the same `sim` function), the compiled
    kernel, the tile schedule and the constant arguments; ``plans`` and ``transpose_plans``:
    the launch plans `kernels.host.relaunch` keeps per argument layout."""

    def __init__(self, B, H, Hkv, Nq, Nk, D, causal, scale, block_q, launch_order, pingpong,
                 overlap, persistent=None):
        import numpy as np
        from types import SimpleNamespace
        the_plan = fp8_plan(B, H, Hkv, Nq, Nk, D, causal, block_q, launch_order, pingpong,
                            overlap, persistent)
        _transpose, self.launch = the_plan.kernels      # the transpose: `v_transpose`
        bq, bk = the_plan.config["block_q"], the_plan.config["block_k"]
        group = tile_scheduler.head_group(launch_order, causal, "fwd")
        self.kern = get_kernel(D, bq, bk, True, causal, group, fp8=True,
                               pingpong=the_plan.config["pingpong"],
                               overlap=the_plan.config["overlap"])
        host.check_launch(self.launch.name, (self.launch.threads, self.launch.shared_bytes),
                          (self.kern.threads, self.kern.smem_bytes))
        self.grid = host.launch_grid(self.launch)
        shape = SimpleNamespace(seqlen_q=Nq, seqlen_k=Nk, causal=bool(causal), block_mask=None,
                                block_q=None, block_k=None)
        offsets, index, sched_b, sched_h = tile_scheduler.device_schedule(shape, bq, bk, "kv")
        self.tail = (offsets, index, sched_b, sched_h, H // Hkv, Nq, Nk,
                     np.float32(scale * LOG2E))
        self.band = (np.int64(-UNBOUNDED), np.int64(UNBOUNDED))    # (no window: not read)
        self.block_k = bk
        self.out_shape, self.lse_shape = (B, H, Nq, D), (B, H, Nq)
        self.plans: dict = {}
        self.transpose_plans: dict = {}


def forward_fp8(q, k, v, descale_q, descale_k, descale_v, *, causal=False, scale=None,
                block_q=None, launch_order=None, pingpong=None, overlap=None, persistent=None):
    """FlashAttention-3's FP8 forward: ``(out, lse)`` for torch float8_e4m3fn Q [B, Hq, Nq, d],
    K and V [B, Hkv, Nk, d] on a GPU of compute capability 9.0 (`fp8_supports`), with float32
    descales [B, Hq], [B, Hkv], [B, Hkv] (contiguous; the scores are ``scale * (q descale_q)
    (k descale_k)^T``, V is ``v descale_v``): O in bfloat16, the float32 natural-log
    logsumexp (-inf and a zero row where no key is allowed). Top-left causal. ``pingpong``: the
    warpgroups take turns issuing S = Q K^T (None: the plan's default, on at ``block_q`` = 128;
    True at ``block_q`` = 64 is a ValueError); ``overlap``: a tile's softmax runs while the
    O += P V of the tile before is on the tensor cores (None: the plan's default);
    ``persistent``: one program per SM walks the work items (None: the plan's default). The plan, kernel
    and schedule are chosen once per configuration (`_Fp8Launch`); a call allocates V^T, O and
    the logsumexp and makes two launches. The user-facing entry, with its checks, is
    `ioaware.fp8.attention`."""
    import torch
    B, H, Nq, D = (int(n) for n in q.shape)
    Hkv, Nk = int(k.shape[1]), int(k.shape[2])
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    key = (B, H, Hkv, Nq, Nk, D, bool(causal), scale, block_q, launch_order, pingpong, overlap,
           persistent, q.device.index)
    prep = _FP8_PREPARED.get(key)
    if prep is None:
        why = fp8_supports(B, H, Hkv, Nq, Nk, D, causal, block_q)
        if why:
            raise ValueError(why)
        if len(_FP8_PREPARED) > 64:
            _FP8_PREPARED.clear()
        prep = _FP8_PREPARED[key] = _Fp8Launch(B, H, Hkv, Nq, Nk, D, causal, scale, block_q,
                                               launch_order, pingpong, overlap, persistent)
    stream = host.launch_stream(q)
    ops = [x.view(torch.uint8) for x in (q, k)]
    ops = [host.aligned_copy(x) if _needs_copy(x, 1) else x for x in ops]
    # -- V^T: transposed, keys permuted as P leaves the accumulator --
    vt = v_transpose(v, stream, prep.transpose_plans)
    # -- the attention kernel --
    maps = tensor_maps(ops[0], ops[1], vt, prep.block_k, stream, fp8=True)
    out = torch.empty(prep.out_shape, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(prep.lse_shape, dtype=torch.float32, device=q.device)
    out16 = out.view(torch.int16)
    launch = prep.launch
    host.relaunch(prep.plans, (maps, out16, lse, descale_q, descale_k, descale_v), prep.kern,
                  prep.grid, launch.threads, stream,
                  (maps, out16, lse, *prep.tail, descale_q, descale_k, descale_v, *prep.band),
                  sharedmem=launch.shared_bytes)
    del ops
    return out, lse
