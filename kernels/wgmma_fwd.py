"""Hopper attention forward (family ``wgmma``): TMA loads, ``wgmma`` products, FlashAttention-3 style.

This module owns the forward-only ``wgmma`` kernel family for sm_90a (H100, H200): its kernel
builder, its `supports` refusals, its plan (`sim.plans.wgmma_fwd`, which the launcher reads)
and the host side that makes the TMA tensor maps. It returns what `kernels.mma_fwd` returns
(O in the input dtype, the float32 natural-log logsumexp, -inf and a zero row where no key is
allowed). The registry runs it, before the ``mma`` family, for every forward it takes on a GPU
of compute capability 9.0 or more; ``KernelConfig(family="mma")`` pins the older forward.

The algorithm (FlashAttention-3's structure without its overlaps and ping-pong):

* one program per (Q tile of ``block_q`` = 64 or 128 rows, batch * head), launch order of
  `kernels.tile_scheduler` (longest causal tiles first); ``block_q / 64`` *consumer
  warpgroups* (128 threads, 64 query rows each), then one *producer warp*;
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
not, Nq != Nk, any lengths, GQA; refuses (`supports`) masks, biases, block masks, dropout,
sliding windows, cache lengths, other head dims and GPUs below compute capability 9.0.
"""
from __future__ import annotations

import functools
import math

from numba import cuda

from sim.plans.wgmma_fwd import (BARRIER_BYTES, BOX_COLUMNS, ROWS_PER_WARPGROUP,
                                 WARPGROUP_THREADS, WGMMA_BLOCK_K_CHOICES,
                                 WGMMA_BLOCK_Q_CHOICES, WGMMA_HEAD_DIMS, wgmma_default_blocks,
                                 wgmma_smem_bytes, wgmma_threads)

from . import compile_cache, host, tile_scheduler
from .config import requested_tiles

__all__ = ["forward", "prepare", "plan", "supports", "tiles", "get_kernel", "tensor_maps",
           "stage_of", "full_parity", "empty_parity",
           "DTYPES", "SUPPORTED_HEAD_DIMS", "BLOCK_Q_CHOICES", "BLOCK_K_CHOICES",
           "kernel_constants"]

DTYPES = ("float16", "bfloat16")
SUPPORTED_HEAD_DIMS = WGMMA_HEAD_DIMS
BLOCK_Q_CHOICES = WGMMA_BLOCK_Q_CHOICES
BLOCK_K_CHOICES = WGMMA_BLOCK_K_CHOICES
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
BOX_BYTES = ROWS_PER_WARPGROUP * BOX_COLUMNS * 2      # one 64 x 64 16-bit box: 8,192 bytes
SWIZZLE_ROW_BYTES = BOX_COLUMNS * 2                   # 128


def kernel_constants(head_dim: int, block_q: int, block_k: int) -> dict:
    """The layout of one configuration, in bytes from the 1024-aligned base of dynamic shared
    memory, and the register counts (plain Python; the kernel is built from these):
    ``q_bytes`` (Q: box (warpgroup w, column chunk c) at ``(w * chunks + c) * 8192``),
    ``kv_bytes`` (one K or V tile; chunk c at ``c * block_k * 128``; stage s holds K at
    ``q_bytes + 2 s kv_bytes`` and V ``kv_bytes`` further), ``bar_offset`` (q_full, full[0],
    full[1], empty[0], empty[1], 8 bytes each), the descriptor templates ``k_template``
    (K-major, Q and K) and ``v_template`` (MN-major, V), and the per-thread register arrays:
    ``s_regs`` (S: 32 per 64 keys), ``o_regs`` (O: 32 per 64 columns), ``p_regs`` (P: 4 per
    16 keys)."""
    from .hopper import encode_wgmma_descriptor, kmajor_strides, mnmajor_strides
    chunks = head_dim // BOX_COLUMNS
    q_bytes = block_q * head_dim * 2
    kv_bytes = block_k * head_dim * 2
    lbo_k, sbo_k, step_k = kmajor_strides("128B", BOX_COLUMNS)
    lbo_v, sbo_v, step_v = mnmajor_strides("128B", block_k)
    return dict(chunks=chunks, q_bytes=q_bytes, kv_bytes=kv_bytes,
                bar_offset=q_bytes + 4 * kv_bytes,
                k_template=encode_wgmma_descriptor(0, lbo_k, sbo_k, "128B"), k_step=step_k,
                v_template=encode_wgmma_descriptor(0, lbo_v, sbo_v, "128B"), v_step=step_v,
                s_regs=32 * (block_k // 64), o_regs=32 * chunks, p_regs=4 * (block_k // 16),
                consumers=block_q // ROWS_PER_WARPGROUP)


def stage_of(tile: int) -> int:
    """The shared-memory stage (0 or 1) of the ``tile``-th K/V tile a program visits."""
    return tile & 1


def full_parity(tile: int) -> int:
    """The parity consumers wait for on the *full* barrier of `stage_of` (``tile``): the
    ``tile // 2``-th phase of that stage's barrier."""
    return (tile >> 1) & 1


def empty_parity(tile: int) -> int:
    """The parity the producer waits for on the *empty* barrier of `stage_of` (``tile``) before
    loading ``tile`` (>= 2) into it: the phase the consumers completed releasing ``tile - 2``."""
    return ((tile >> 1) - 1) & 1


def get_kernel(head_dim, block_q, block_k, is_bf16, causal, head_group):
    """The compiled-on-first-launch kernel for one configuration (cached per process and on
    disk by `kernels.compile_cache`); ``head_group``: the launch order
    (`kernels.tile_scheduler`)."""
    key = (int(head_dim), int(block_q), int(block_k), bool(is_bf16), bool(causal),
           int(head_group))
    return compile_cache.built(_build_kernel, *key)


def _build_kernel(head_dim, block_q, block_k, is_bf16, causal, head_group):
    """The kernel for one configuration. Signature::

        kernel(maps, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               scale_log2)

    ``maps``: uint64 [3, 16], the tensor maps of Q, K and V (`tensor_maps`); ``out``: int16
    [B, H, Nq, d] (16-bit words); ``lse``: float32 [B, H, Nq]; the ``"kv"`` CSR schedule of
    `kernels.tile_scheduler.device_schedule`; ``group`` = Hq / Hkv."""
    from numba import cuda, float32, int64, uint8, uint32, uint64

    from . import hopper as hp
    from . import ptx

    D, BQ, BK = head_dim, block_q, block_k
    c = kernel_constants(D, BQ, BK)
    DC = c["chunks"]                      # 64-column chunks of a row of Q, K, V, O
    W = c["consumers"]                    # consumer warpgroups
    THREADS = wgmma_threads(BQ)
    PRODUCER_WARP = 4 * W
    CONSUMER_THREADS = WARPGROUP_THREADS * W
    KS = D // 16                          # k16 steps of S = Q K^T
    NB = BK // 64                         # n64 blocks of S
    PS = BK // 16                         # k16 steps of O += P V
    S_REGS, O_REGS, P_REGS = c["s_regs"], c["o_regs"], c["p_regs"]
    Q_BYTES, KV_BYTES, BAR = c["q_bytes"], c["kv_bytes"], c["bar_offset"]
    K_TMPL, V_TMPL = c["k_template"], c["v_template"]
    K_STEP, V_STEP = c["k_step"], c["v_step"]
    CHUNK_BYTES = BK * SWIZZLE_ROW_BYTES  # one 64-column chunk of a K or V tile
    SMEM = wgmma_smem_bytes(D, BQ, BK)
    CAUSAL = causal
    NEG_INF = float32(-math.inf)
    mma_ss = hp.wgmma_ss_bf16 if is_bf16 else hp.wgmma_ss_f16
    mma_rs = hp.wgmma_rs_mn_bf16 if is_bf16 else hp.wgmma_rs_mn_f16
    pack = ptx.pack_bf16x2 if is_bf16 else ptx.pack_f16x2
    tile_and_head = tile_scheduler.device_tile_and_head(head_group)
    stage = cuda.jit(device=True, inline=True)(stage_of)
    full_phase = cuda.jit(device=True, inline=True)(full_parity)
    empty_phase = cuda.jit(device=True, inline=True)(empty_parity)
    assert BAR + BARRIER_BYTES + 1024 == SMEM

    @cuda.jit(launch_bounds=(THREADS, 1), lineinfo=False)
    def kernel(maps, out, lse, offsets, kv_index, sched_b, sched_h, group, n_q, n_k,
               scale_log2):
        smem = cuda.shared.array(0, dtype=uint8)         # dynamic: kernel.smem_bytes
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        tile, bh, n_blocks_q = tile_and_head()
        m_blk = n_blocks_q - 1 - tile                       # longest (causal) tiles first
        n_heads = out.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        hk = h // group
        s = b * sched_b + h * sched_h
        start = offsets[s, m_blk]
        stop = offsets[s, m_blk + 1]
        # shared memory from a 1024-byte boundary (the 128-byte swizzle's repeat): Q | stage 0
        # K, V | stage 1 K, V | barriers
        raw = int64(ptx.shared_addr(smem, 0))
        base = (raw + 1023) & ~int64(1023)
        q_s = base
        kv_s = base + Q_BYTES
        q_full = base + BAR
        full0 = q_full + 8
        empty0 = q_full + 24
        if tid == 0:
            hp.mbarrier_init(q_full, 1)
            for st in range(2):
                hp.mbarrier_init(full0 + 8 * st, 1)
                hp.mbarrier_init(empty0 + 8 * st, CONSUMER_THREADS)
            hp.fence_mbarrier_init()
        cuda.syncthreads()       # the last CTA-wide barrier: the roles part here

        if warp == PRODUCER_WARP:
            if lane == 0:
                # -- producer: Q once, then K and V tile by tile into the two stages --
                g = hp.array_addr(maps)                         # Q, K, V maps: 128 bytes
                g_k = g + uint64(128)
                g_v = g + uint64(256)
                hp.fence_proxy_tensormap_acquire(g)
                hp.fence_proxy_tensormap_acquire(g_k)
                hp.fence_proxy_tensormap_acquire(g_v)
                row0 = m_blk * BQ
                q_boxes = 0
                for wg in range(W):
                    if row0 + ROWS_PER_WARPGROUP * wg < n_q:   # a box past the end: not issued
                        q_boxes += DC
                hp.mbarrier_arrive_expect_tx(q_full, q_boxes * BOX_BYTES)
                for wg in range(W):
                    if row0 + ROWS_PER_WARPGROUP * wg < n_q:
                        for cc in range(DC):
                            hp.cp_async_bulk_tensor_4d_g2s(q_s + (wg * DC + cc) * BOX_BYTES, g,
                                                           BOX_COLUMNS * cc,
                                                           row0 + ROWS_PER_WARPGROUP * wg, h, b,
                                                           q_full)
                for it in range(start, stop):
                    i = it - start
                    st = stage(i)
                    if i >= 2:      # stage st was last used by tile i - 2: wait until released
                        hp.mbarrier_wait_parity(empty0 + 8 * st, empty_phase(i))
                    key0 = kv_index[it] * BK
                    k_st = kv_s + st * 2 * KV_BYTES
                    hp.mbarrier_arrive_expect_tx(full0 + 8 * st, 2 * KV_BYTES)
                    for cc in range(DC):
                        hp.cp_async_bulk_tensor_4d_g2s(k_st + cc * CHUNK_BYTES, g_k,
                                                       BOX_COLUMNS * cc, key0, hk, b,
                                                       full0 + 8 * st)
                        hp.cp_async_bulk_tensor_4d_g2s(k_st + KV_BYTES + cc * CHUNK_BYTES,
                                                       g_v, BOX_COLUMNS * cc, key0, hk, b,
                                                       full0 + 8 * st)
            return

        # -- consumers: warpgroup wg owns query rows m_blk * BQ + 64 wg .. + 63 --
        wg = warp // 4
        gid = lane // 4
        tig = lane % 4
        row_first = m_blk * BQ + ROWS_PER_WARPGROUP * wg
        row_a = row_first + 16 * (warp % 4) + gid         # this thread's rows: row_a, row_a + 8
        q_wg = q_s + wg * DC * BOX_BYTES
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        o_reg = cuda.local.array(O_REGS, dtype=float32)
        pa = cuda.local.array(P_REGS, dtype=uint32)
        m_i = cuda.local.array(2, dtype=float32)
        l_i = cuda.local.array(2, dtype=float32)
        for r in range(O_REGS):
            o_reg[r] = float32(0.0)
        for hr in range(2):
            m_i[hr] = NEG_INF
            l_i[hr] = float32(0.0)
        hp.mbarrier_wait_parity(q_full, 0)

        for it in range(start, stop):
            i = it - start
            st = stage(i)
            key0 = kv_index[it] * BK
            k_st = kv_s + st * 2 * KV_BYTES
            v_st = k_st + KV_BYTES
            hp.mbarrier_wait_parity(full0 + 8 * st, full_phase(i))

            # -- compute qk: S = Q K^T, d / 16 k-steps x block_k / 64 n-blocks --
            hp.wgmma_fence()
            for kk in range(KS):
                cc = kk // 4
                da = hp.smem_descriptor(K_TMPL, q_wg + cc * BOX_BYTES + (kk % 4) * K_STEP)
                for nb in range(NB):
                    db = hp.smem_descriptor(K_TMPL, k_st + cc * CHUNK_BYTES + nb * BOX_BYTES
                                            + (kk % 4) * K_STEP)
                    mma_ss(s_reg, 32 * nb, da, db, uint32(1 if kk > 0 else 0))
            hp.wgmma_commit_group()
            hp.wgmma_wait_group(0)
            hp.wgmma_fence_operands(s_reg, 0, S_REGS)

            # -- masks: keys past the end, the causal diagonal (only tiles that need them) --
            needs = key0 + BK > n_k
            if CAUSAL:
                needs = needs or key0 + BK - 1 > row_first
            if needs:
                for nb in range(NB):
                    for j in range(8):
                        for hr in range(2):
                            for e in range(2):
                                col = key0 + 64 * nb + 8 * j + 2 * tig + e
                                bad = col >= n_k
                                if CAUSAL:
                                    bad = bad or col > row_a + 8 * hr
                                if bad:
                                    s_reg[32 * nb + 4 * j + 2 * hr + e] = NEG_INF

            # -- update m_i and l_i (row half hr: registers with (r >> 1) & 1 == hr) --
            for hr in range(2):
                mx = NEG_INF
                for nb in range(NB):
                    for j in range(8):
                        r = 32 * nb + 4 * j + 2 * hr
                        mx = max(mx, max(s_reg[r], s_reg[r + 1]))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 1))
                mx = max(mx, cuda.shfl_xor_sync(0xFFFFFFFF, mx, 2))
                m_new = max(m_i[hr], mx * scale_log2)
                m_use = m_new if m_new != NEG_INF else float32(0.0)
                alpha = ptx.ex2(m_i[hr] - m_use)
                row_sum = float32(0.0)
                for nb in range(NB):
                    for j in range(8):
                        for e in range(2):
                            r = 32 * nb + 4 * j + 2 * hr + e
                            p = ptx.ex2(s_reg[r] * scale_log2 - m_use)
                            row_sum += p
                            s_reg[r] = p
                l_i[hr] = l_i[hr] * alpha + row_sum
                m_i[hr] = m_new
                for dc in range(DC):
                    for j in range(8):
                        for e in range(2):
                            o_reg[32 * dc + 4 * j + 2 * hr + e] *= alpha

            # -- P to 16 bits in registers: the accumulator of k16 slice kc is its A fragment --
            for kc in range(PS):
                for q in range(4):
                    r = 32 * (kc // 4) + 8 * (kc % 4) + 2 * q
                    pa[4 * kc + q] = pack(s_reg[r], s_reg[r + 1])

            # -- O += P V: A = P from registers, B = V (keys x d, d contiguous: MN-major) --
            hp.wgmma_fence()
            for kc in range(PS):
                for dc in range(DC):
                    db = hp.smem_descriptor(V_TMPL, v_st + dc * CHUNK_BYTES + kc * V_STEP)
                    mma_rs(o_reg, 32 * dc, pa[4 * kc], pa[4 * kc + 1], pa[4 * kc + 2],
                           pa[4 * kc + 3], db, uint32(1))
            hp.wgmma_commit_group()
            hp.wgmma_wait_group(0)
            hp.wgmma_fence_operands(o_reg, 0, O_REGS)
            hp.mbarrier_arrive(empty0 + 8 * st)      # this stage may be refilled

        # -- epilogue: one rescale, O as packed 16-bit pairs, logsumexp (natural log) --
        for hr in range(2):
            l_tot = l_i[hr]
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 1)
            l_tot += cuda.shfl_xor_sync(0xFFFFFFFF, l_tot, 2)
            row = row_a + 8 * hr
            inv = float32(1.0) / l_tot if l_tot > float32(0.0) else float32(0.0)
            if row < n_q:
                for dc in range(DC):
                    for j in range(8):
                        r = 32 * dc + 4 * j + 2 * hr
                        word = pack(o_reg[r] * inv, o_reg[r + 1] * inv)
                        ptx.st_global_u32(ptx.global_addr(out, b, h, row, 64 * dc + 8 * j
                                                          + 2 * tig), word)
                if tig == 0:
                    if l_tot > float32(0.0):
                        lse[b, h, row] = m_i[hr] * float32(LN2) + math.log(l_tot)
                    else:
                        lse[b, h, row] = NEG_INF

    kernel.threads = THREADS
    kernel.smem_bytes = SMEM
    return kernel


# -- host side -----------------------------------------------------------------------------------
def tiles(problem, config):
    """``(block_q, block_k)`` for a problem: ``config``'s, else the problem's requested tiles,
    else `sim.plans.wgmma_fwd.wgmma_default_blocks`."""
    return requested_tiles(problem, config, wgmma_default_blocks(problem.head_dim, problem.causal),
                           BLOCK_Q_CHOICES, BLOCK_K_CHOICES)


def supports(problem, config):
    """Why this forward cannot run ``problem`` under ``config`` (a string naming what it
    refuses), or None. Checked in this order: the problem's
    features (mask, bias, block mask, dropout, window, cache lengths, value head dim,
    bottom-right causal with Nq != Nk, dtype, head dim, tiles); then the hardware (a real
    GPU of compute capability 9.0 or more). The registry tries it before the ``mma`` family
    for every forward it takes (measured faster on an H100 and an H200: docs/kernels.md)."""
    pb = problem
    for name, what in (("mask", "a boolean mask"), ("bias", "an additive bias"),
                       ("block_mask", "a block mask")):
        if getattr(pb, name, None) is not None:
            return f"the wgmma forward takes no {name} ({what})"
    if pb.dropout_p > 0:
        return f"the wgmma forward has no dropout (dropout_p={pb.dropout_p})"
    window = getattr(pb, "window_size", None)
    if window is not None:
        return f"the wgmma forward has no sliding window (window_size={tuple(window)})"
    if getattr(pb, "cache_seqlens", None) is not None:
        return "the wgmma forward takes no cache_seqlens"
    if getattr(pb, "value_dim", None) not in (None, pb.head_dim):
        return f"the wgmma forward needs value_dim == head_dim, got {pb.value_dim}"
    if (pb.causal and pb.seqlen_q != pb.seqlen_k
            and getattr(pb, "causal_alignment", "top_left") != "top_left"):
        return "the wgmma forward aligns causal masks top-left only (causal_alignment with Nq != Nk)"
    dtype = str(pb.dtype).replace("torch.", "")
    if dtype not in DTYPES:
        return f"the wgmma forward takes dtype float16 or bfloat16, got {dtype}"
    if pb.head_dim not in SUPPORTED_HEAD_DIMS:
        return f"the wgmma forward takes head_dim in {SUPPORTED_HEAD_DIMS}, got {pb.head_dim}"
    bq, bk = tiles(pb, config)
    if bq not in BLOCK_Q_CHOICES or bk not in BLOCK_K_CHOICES:
        return (f"the wgmma forward takes block_q in {BLOCK_Q_CHOICES} and block_k in "
                f"{BLOCK_K_CHOICES}, got block_q={bq}, block_k={bk}")
    why = host.tensor_core_refusal(pb, "the wgmma family", DTYPES, SUPPORTED_HEAD_DIMS)
    if why:
        return why
    cc = host.compute_capability(host.current_device_id())
    if cc < (9, 0):
        return (f"the wgmma family needs compute capability 9.0 (sm_90a: wgmma, TMA), this GPU "
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
                            launch_order=config.launch_order)


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


def _needs_copy(x, itemsize=2) -> bool:
    """Whether an operand must be made contiguous for a tensor map: a zero or non-16-byte
    stride on a dimension of extent > 1, an unaligned start, or a strided last dimension."""
    addr, shape, strides = _operand_layout(x, itemsize)
    return (addr % 16 != 0 or strides[3] != itemsize
            or any(n > 1 and (s == 0 or s % 16) for n, s in zip(shape[:3], strides[:3])))


_MAPS: dict = {}        # (device, layouts, boxes) -> device uint64 [3, 16]
#: Maps written while a CUDA graph was being captured: a captured kernel reads them at every
#: replay, so they are kept for the life of the process (384 bytes each), never evicted.
_CAPTURED_MAPS: list = []
MAP_WORDS = 3 * 16


@functools.lru_cache(maxsize=None)
def map_writer():
    """``store_words(dst, words)``: one thread stores the 48 uint64 ``words`` (a tuple, passed
    by value as kernel parameters) into ``dst`` (uint64 [48]). How tensor maps reach the
    device during CUDA graph capture, where no memory may be allocated and no host buffer
    copied: the words become part of the captured launch."""
    @cuda.jit
    def store_words(dst, words):
        if cuda.grid(1) == 0:
            for i in range(MAP_WORDS):
                dst[i] = words[i]
    return store_words


def _capturing(x) -> bool:
    """Whether ``x`` is a torch CUDA tensor and torch's current stream is capturing a graph."""
    if not host._is_torch(x):
        return False
    import torch
    return torch.cuda.is_current_stream_capturing()


def tensor_maps(q, k, v, block_k, stream=0):
    """The tensor maps of Q (boxes of 64 rows x 64 columns), K and V (``block_k`` rows x 64
    columns), 128-byte swizzle, 16-bit elements, as one device array uint64 [3, 16] (built and
    copied once per device, layouts and tiles; operands as `kernels.host.Call.input` gives
    them, 16-bit words). Under CUDA graph capture (torch operands, ``stream`` the capturing
    stream as `kernels.host.launch_stream` gives it), a new map goes to memory from torch's
    allocator (the graph's pool) by a one-thread launch of `map_writer` on ``stream``, the
    words as its parameters, and is kept for good (`_CAPTURED_MAPS`)."""
    layouts = tuple(_operand_layout(x) for x in (q, k, v))
    key = (host.current_device_id(), layouts, block_k)
    hit = _MAPS.get(key)
    if hit is None:
        import numpy as np
        from numba import cuda

        from .hopper import encode_tensor_map_4d
        words = []
        for (addr, shape, strides), rows in zip(layouts, (ROWS_PER_WARPGROUP, block_k,
                                                          block_k)):
            words.append(encode_tensor_map_4d(addr, shape, strides[:3],
                                              (1, 1, rows, BOX_COLUMNS), "uint16", "128B"))
        words = np.stack(words).astype(np.uint64)
        if _capturing(q):
            import torch
            buf = torch.empty(MAP_WORDS, dtype=torch.int64, device=q.device)
            flat = cuda.as_cuda_array(buf, sync=False).view(np.uint64)
            map_writer()[1, 32, stream](flat, tuple(np.uint64(w) for w in words.ravel()))
            _CAPTURED_MAPS.append(buf)
            hit = flat.reshape(3, 16)
        else:
            if len(_MAPS) > 64:
                _MAPS.clear()
            hit = cuda.to_device(words)
        _MAPS[key] = hit
    elif _capturing(q):
        _CAPTURED_MAPS.append(hit)          # a captured launch reads it: never to be freed
    return hit


_WARMED: set = set()     # devices where `map_writer` has run once


def warm_map_writer(device_index: int) -> None:
    """Compile and load `map_writer` now, outside any graph capture (a launch on a scratch
    buffer), so that a capture later only launches it; once per device (not during a
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
    map_writer()[1, 32, stream](cuda.as_cuda_array(buf, sync=False).view(np.uint64),
                                tuple(np.uint64(i) for i in range(MAP_WORDS)))


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
    kern = get_kernel(pb.head_dim, block_q, block_k, is_bf16, pb.causal, group)
    host.check_launch(launch.name, (launch.threads, launch.shared_bytes),
                      (kern.threads, kern.smem_bytes))
    offsets, index, sched_b, sched_h = tile_scheduler.device_schedule(pb, block_q, block_k, "kv")
    B, H, Nq, D, Nk = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim, pb.seqlen_k
    template = host._without_operands(pb)
    tail = (offsets, index, sched_b, sched_h, H // pb.heads_kv, Nq, Nk,
            np.float32(pb.scale * LOG2E))
    plans: dict = {}
    if pb.kind == "torch" and host.real_gpu():
        warm_map_writer(host.current_device_id())

    def run(q, k, v):
        call = host.Call(template, q=q)
        ops = [call.input(x, words=True, aligned=True) for x in (q, k, v)]
        ops = [x.contiguous() if hasattr(x, "contiguous") and _needs_copy(x) else x for x in ops]
        maps = tensor_maps(*ops, block_k, call.stream)
        out = call.output((B, H, Nq, D), words=True)
        lse = call.output((B, H, Nq), float32=True)
        host.relaunch(plans, (out.arg, lse.arg), kern, launch.grid, launch.threads, call.stream,
                      (maps, out.arg, lse.arg, *tail), sharedmem=launch.shared_bytes,
                      fast=config.fast_launch)
        result = out.value(), lse.value()   # (NumPy: copied back while ops are still alive)
        del ops
        return result
    return run
