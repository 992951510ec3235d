"""Hopper attention backward (family ``wgmma``): TMA loads, ``wgmma`` products, two kernels (or
dQ by atomics: one, between a pre-pass and a conversion).

This module owns the ``wgmma`` family's backward for sm_90a (H100, H200): its two kernels'
builder, its `supports` refusals, its plan (`sim.plans.wgmma_bwd`, which the launcher reads)
and the host side. It returns what `kernels.mma_bwd` returns (dQ, dK, dV in the input dtype, dK
and dV summed over the query heads of each GQA group). The registry tries it before the
``mma`` family for every backward it takes on a GPU of compute capability 9.0 or more;
``KernelConfig(family="mma")`` pins the older backward.

The structure is the ``mma`` family's two-kernel backward (seven matmul-sized passes, no
atomics: deterministic), each kernel built like the Hopper forward (`kernels.wgmma_fwd`): one
program per tile of ``rows`` = 64 or 128 rows, a consumer warpgroup (128 threads) per 64 rows,
then a producer (a warp; with two consumer warpgroups a warpgroup that hands its registers to
the consumers by ``setmaxnreg``). The producer loads the program's two *resident* operands once
and streams two operands tile by tile into a ring of two shared-memory stages by TMA (full /
empty mbarriers, the forward's protocol). Every product is a ``wgmma`` with 16-bit operands;
"A . B^T" products take both operands K-major from shared memory, "A . B" products take A
from registers (the accumulator fragment of a k16 slice is the A fragment,
`kernels.hopper.wgmma_p_from_d`) and B MN-major from shared memory (``imm-trans-b = 1``):

* **dQ kernel** (runs first), grid (query tiles, B * Hq): resident Q and dO; before its loop a
  consumer thread computes delta = rowsum(dO * O) for its two rows from O and dO read as
  fragment words and writes it for the second kernel. Streamed: the K and V tiles of
  `BlockInfo.kv_schedule()` (``cols`` keys a stage). Per tile: S = Q K^T and dP = dO V^T (two
  groups), P = exp2(S * scale * log2(e) - lse * log2(e)) with the masks, dS = P (dP - delta),
  dQ += dS K. dQ = scale * dQ at the end.
* **dK/dV kernel**, grid (key tiles, B * Hkv): resident K and V; over the query heads of its
  GQA group and the Q tiles of `BlockInfo.q_schedule()` (each head's in turn),
  the producer streams the Q and dO tiles (``cols`` queries a stage); a consumer thread reads
  the lse and delta of its columns' queries from global memory (lse as log2: +inf past the
  queries and for rows with no allowed key, so that P = 0). Per tile: S^T = K Q^T and dP^T = V dO^T, P^T
  (computed while dP^T's product runs), dS^T = P^T (dP^T - delta), dV += P^T dO and dK +=
  dS^T Q. At 64 queries a stage dV's product is issued first and dS^T computed while it runs;
  at 128 dS^T goes into dP^T's registers and the two products are issued back to back, so that
  at most S^T, dP^T and the accumulators are live (with P^T's 16-bit copy beside the float32
  scores, ptxas serialised the products for want of registers).
  dK = scale * dK at the end.

P and dS are rounded to the input dtype before their products (as FlashAttention-2 does); every
product accumulates in float32. Takes float16 and bfloat16, head dims 64 and 128, causal
(top-left) or not, a sliding window (`kernels.mask.band_arguments`), Nq != Nk, any lengths, GQA;
refuses (`supports`) masks, biases, block masks, dropout, other head dims and GPUs below
compute capability 9.0.

**dQ by atomics** (``KernelConfig(backward_dq="atomic")``; `dq_mode`, the default being the dQ
kernel, measured faster or even: `sim.plans.wgmma_bwd.wgmma_default_dq_mode`): FlashAttention-3's
five products. The `kernels.mma_bwd` pre-pass writes delta and zeroes a float32 accumulator;
the dK/dV kernel (128 key rows) stores each warpgroup's dS^T words in shared memory
(`ds_word_offset`: the MN-major A operand, two alternating buffers), and after a named barrier
over both warpgroups each issues its share of dQ = dS K (`sim.plans.wgmma_bwd.wgmma_bwd_dq_split`)
with both operands MN-major from shared memory (`kernels.hopper.tile_product_mn`; B the
resident K), stages it in float32 (`dq_stage_offset`) and one of its threads adds it to the
accumulator by TMA (``cp.reduce.async.bulk.tensor``); the `kernels.mma_bwd` conversion writes
dQ = scale * accumulator.
"""
from __future__ import annotations

import math
import sys

from numba.cuda.cudadrv import driver    # device_pointer (on a real GPU)

from ioaware.launch_order import launch_head_group
from sim.plans.wgmma_bwd import (WGMMA_BWD_BARRIER_BYTES, WGMMA_BWD_HEAD_DIMS,
                                 WGMMA_BWD_KERNEL_NAMES, WGMMA_BWD_REGISTERS, WGMMA_BWD_STAGES,
                                 launch_of, wgmma_bwd_dq_split, wgmma_bwd_ds_bytes,
                                 wgmma_bwd_ds_under_dv, wgmma_bwd_producer_warpgroup,
                                 wgmma_bwd_smem_bytes, wgmma_bwd_threads,
                                 wgmma_default_dq_mode)
from sim.plans.wgmma_fwd import BOX_COLUMNS, ROWS_PER_WARPGROUP, WARPGROUP_THREADS

from . import compile_cache, host, tile_scheduler
from .mask import band_arguments, tile_needs_mask, wgmma_tile_mask
from .softmax import LOG2E
from .wgmma_fwd import (BOX_BYTES, _capturing, _hopper_refusal, _needs_copy, _operand_layout,
                        maps_for, problem_refusal, warm_map_writer)

__all__ = ["backward", "prepare", "plan", "supports", "get_kernel", "DTYPES",
           "SUPPORTED_HEAD_DIMS", "TAKES_WINDOW"]

DTYPES = ("float16", "bfloat16")
SUPPORTED_HEAD_DIMS = WGMMA_BWD_HEAD_DIMS
#: This backward takes a sliding window (`kernels.mask.band_arguments`).
TAKES_WINDOW = True


def get_kernel(kind, head_dim, rows, cols, is_bf16, causal, head_group, window=False,
               dq_atomic=False):
    """The compiled-on-first-launch kernel ``kind`` ("dq" or "dkdv") for one configuration
    (cached per process and on disk by `kernels.compile_cache`): ``rows`` per program,
    ``cols`` streamed rows a stage; ``head_group``: the launch order
    (`kernels.tile_scheduler`); ``window``: the band test (causal then off: the band carries
    it); ``dq_atomic`` ("dkdv" only): it also adds dQ = dS K to a float32 accumulator."""
    key = (str(kind), int(head_dim), int(rows), int(cols), bool(is_bf16), bool(causal),
           int(head_group), bool(window), bool(dq_atomic) and kind == "dkdv")
    return compile_cache.built(_build_kernel, *key)


def ds_word_offset(nb, j, hr, wg, warp_in_wg, gid, tig, rows):
    """Byte offset, in the atomic dK/dV kernel's dS^T buffer, of the 32-bit word (two adjacent
    queries of one key row) that thread (``warp_in_wg``, ``gid`` = lane // 4, ``tig`` = lane %
    4) of consumer warpgroup ``wg`` holds at accumulator position (``nb``, ``j``, ``hr``)
    (`kernels.hopper.wgmma_d_elem`: key row 64 wg + 16 warp + gid + 8 hr, queries 64 nb + 8 j
    + 2 tig and + 1): the buffer is ``rows`` key rows of 128 bytes per block of 64 queries,
    128-byte swizzled (the 16-byte unit ``j`` of a row moved to ``j ^ (row % 8)``, and row % 8
    = gid), which is `kernels.hopper.mnmajor_offset` (k = key row, n = query) of an MN-major
    operand of ``rows`` K rows: the A operand of dQ = dS K. A warp's 32 stores hit 32 banks."""
    row = 64 * wg + 16 * warp_in_wg + gid + 8 * hr
    return nb * rows * 128 + row * 128 + ((j ^ gid) << 4) + 4 * tig


def dq_stage_offset(nb, j, hr, warp_in_wg, gid, tig):
    """Byte offset, in a consumer warpgroup's dQ staging of the atomic dK/dV kernel, of the two
    floats (columns 64 nb + 8 j + 2 tig and + 1 of row 16 warp + gid + 8 hr) a thread holds at
    accumulator position (``nb``, ``j``, ``hr``) (`kernels.hopper.wgmma_d_elem`): boxes of 64
    rows x 32 float32 columns (8 KiB) one after another, each as TMA reads a box with the
    128-byte swizzle (`kernels.hopper.swizzle_offset` of row x 128 + 4 x column: the 16-byte
    unit 2 (j % 4) + tig // 2 of a row moved to its xor with row % 8 = gid)."""
    row = 16 * warp_in_wg + gid + 8 * hr
    box = 2 * nb + j // 4
    unit = 2 * (j % 4) + tig // 2
    return box * 64 * 128 + row * 128 + ((unit ^ gid) << 4) + 8 * (tig % 2)


def _build_kernel(kind, head_dim, rows, cols, is_bf16, causal, head_group, window=False,
                  dq_atomic=False):
    """The kernel ``kind`` for one configuration. Signature (both kernels)::

        kernel(maps, out, dout, lse, delta, grad_a, grad_b, acc_map, offsets, index, sched_b,
               sched_h, group, n_q, n_k, scale_log2, scale, band_lo, band_hi)

    ``maps``: uint64 [4, 16], the tensor maps of the two resident operands (boxes of 64 rows x
    64 columns) and the two streamed ones (boxes of ``cols`` rows x 64 columns): Q, dO, K, V
    for "dq", K, V, Q, dO for "dkdv"; ``out``, ``dout``: int16 [B, Hq, Nq, d] (read by "dq",
    for delta); ``lse``: float32 [B, Hq, Nq]; ``delta``: float32 [B, Hq, Nq] (written by "dq",
    read by "dkdv"); ``grad_a``, ``grad_b``: int16 words, dQ [B, Hq, Nq, d] (and again, unused)
    for "dq", dK and dV [B, Hkv, Nk, d] for "dkdv"; ``acc_map``: uint64 [1, 16], the tensor
    map (float32, boxes of 64 rows x 32 columns, 128-byte swizzle) of the float32 [B, Hq, Nq, d]
    dQ accumulator the atomic dK/dV kernel adds to (zeroed by the pre-pass; unread by the other
    kernels); the ``"kv"`` ("dq") or ``"q"`` ("dkdv") CSR
    schedule of `kernels.tile_scheduler.device_schedule`; ``group`` = Hq / Hkv; ``band_lo``,
    ``band_hi`` (int64) are read only with ``window``: key ``col`` is allowed for query ``row``
    iff ``band_lo <= col - row <= band_hi``."""
    from numba import cuda, float32, uint8, uint32, uint64

    from . import hopper as hp
    from . import ptx

    DQ = kind == "dq"
    ATOMIC = bool(dq_atomic) and not DQ          # dQ += dS K here, by float32 atomics
    D, R, C = head_dim, rows, cols
    # dK/dV: where dS^T is computed (`sim.plans.wgmma_bwd.wgmma_bwd_ds_under_dv`)
    DS_UNDER_DV = not DQ and wgmma_bwd_ds_under_dv(C)
    W = R // ROWS_PER_WARPGROUP               # consumer warpgroups
    THREADS = wgmma_bwd_threads(R)
    PRODUCER_WARP = 4 * W
    REALLOC = wgmma_bwd_producer_warpgroup(R)
    PRODUCER_REGS, CONSUMER_REGS = WGMMA_BWD_REGISTERS
    CONSUMER_THREADS = WARPGROUP_THREADS * W
    STAGES = WGMMA_BWD_STAGES
    DC = D // 64                              # 128-byte column chunks of a row
    KS = DC * 4                               # k16 steps of A . B^T (d)
    NB = C // 64                              # n64 blocks of a score tile
    PS = C // 16                              # k16 steps of A . B (the streamed rows)
    OB = D // 64                              # n64 blocks of a gradient
    S_REGS, O_REGS, P_REGS = 32 * NB, 32 * OB, 4 * PS
    RES_BYTES = R * D * 2                     # one resident operand
    TILE_BYTES = C * D * 2                    # one streamed operand tile
    CHUNK_BYTES = C * 128                     # one 64-column chunk of a streamed tile
    RING = 2 * RES_BYTES
    DS = RING + STAGES * 2 * TILE_BYTES      # atomic: dS^T, two buffers of R keys x C queries
    DS_BUF = R * C * 2
    DS_BLOCK = R * 128                       # ... 64 queries of R key rows, 128-byte rows
    STAGE = DS + 2 * DS_BUF                  # atomic: each warpgroup's dQ share, float32
    STAGE_BOX = ROWS_PER_WARPGROUP * 128     # ... in boxes of 64 rows x 32 columns
    STATS = DS + wgmma_bwd_ds_bytes(kind, D, R, C, ATOMIC)   # dK/dV: per warpgroup and
    STATS_BYTES = C * 8                                      # stage, C (lse2, delta)
    BAR = STATS + (0 if DQ else W * STAGES * STATS_BYTES)
    SMEM = wgmma_bwd_smem_bytes(kind, D, R, C, STAGES, dq_atomic=ATOMIC)
    assert BAR + WGMMA_BWD_BARRIER_BYTES + 1024 == SMEM
    lbo_k, sbo_k, K_STEP = hp.kmajor_strides("128B", BOX_COLUMNS)
    K_TMPL = hp.encode_wgmma_descriptor(0, lbo_k, sbo_k, "128B")
    lbo_v, sbo_v, V_STEP = hp.mnmajor_strides("128B", C)
    V_TMPL = hp.encode_wgmma_descriptor(0, lbo_v, sbo_v, "128B")
    CAUSAL = causal
    WINDOW = bool(window)
    POS_INF = float32(math.inf)
    NEG_INF = float32(-math.inf)
    operands = "bf16" if is_bf16 else "f16"
    pack = ptx.pack_bf16x2 if is_bf16 else ptx.pack_f16x2
    unpack = ptx.unpack_bf16x2 if is_bf16 else ptx.unpack_f16x2
    tile_and_head = tile_scheduler.device_tile_and_head(head_group)
    if DQ:      # a warpgroup's 64 query rows against a tile of C keys
        tile_needs = tile_needs_mask(ROWS_PER_WARPGROUP, C, CAUSAL, False, WINDOW)
    else:       # a tile of C queries against a warpgroup's 64 key rows
        tile_needs = tile_needs_mask(C, ROWS_PER_WARPGROUP, CAUSAL, False, WINDOW)
    mask_tile = wgmma_tile_mask(NB, CAUSAL, WINDOW, keys_are_rows=not DQ, rows_inner=True)
    # -- acc = A B^T: A = a warpgroup's 64 resident rows, B = the streamed tile, both K-major;
    # acc += A B: A from registers (C streamed rows as k), B = the streamed tile, MN-major --
    issue_abt = hp.tile_product_abt(operands, KS, NB, K_TMPL, K_STEP, CHUNK_BYTES, BOX_BYTES)
    issue_ab = hp.tile_product_ab(operands, PS, OB, V_TMPL, V_STEP, CHUNK_BYTES)
    if ATOMIC:
        # -- dQ = dS K: A = dS^T as the warpgroups stored it (MN-major, R key rows), B = the
        # resident K (MN-major: 64-row boxes, a region per warpgroup); a warpgroup's share --
        split, DQ_N = wgmma_bwd_dq_split(D, R, C)
        BY_QUERIES = split == "queries"
        DQ_REGS = DQ_N // 2
        DS_BARRIER = 1 + W                      # after the statistics' barriers 1 .. W
        STAGE_BARRIER = 2 + W                   # then one per warpgroup: its dQ staging
        lbo_a, sbo_a, _ = hp.mnmajor_strides("128B", R)
        lbo_kb, sbo_kb, _ = hp.mnmajor_strides("128B", ROWS_PER_WARPGROUP)
        issue_dq = hp.tile_product_mn(operands, R // 16, DQ_N // 64,
                                      hp.encode_wgmma_descriptor(0, lbo_a, sbo_a, "128B"),
                                      hp.encode_wgmma_descriptor(0, lbo_kb, sbo_kb, "128B"),
                                      DC * BOX_BYTES, BOX_BYTES)
    else:
        BY_QUERIES, DQ_N, DQ_REGS, DS_BARRIER, STAGE_BARRIER = True, 64, 1, 0, 0
    ds_word = cuda.jit(device=True, inline=True)(ds_word_offset)
    stage_off = cuda.jit(device=True, inline=True)(dq_stage_offset)

    @cuda.jit(device=True, inline=True)
    def store_ds(ds_buf, words, wg, warp_in_wg, gid, tig):
        """-- atomic: this thread's dS^T words (the A fragment of dK's product) into the dS^T
        buffer, then the async proxy fence (wgmma reads them) --"""
        for kc in range(PS):
            for q in range(4):
                off = ds_word(kc // 4, 2 * (kc % 4) + q // 2, q % 2, wg, warp_in_wg, gid, tig, R)
                ptx.st_shared_b32(uint32(ds_buf + off), words[4 * kc + q])
        hp.fence_proxy_async()

    @cuda.jit(device=True, inline=True)
    def stage_dq(stage, dq_reg, warp_in_wg, gid, tig):
        """-- atomic: this thread's dQ partial sums (the warpgroup's 64 query rows x DQ_N
        columns) into its staging, boxes of 32 columns as TMA reads them, then the async proxy
        fence (TMA reads them) --"""
        for nb in range(DQ_N // 64):
            for j in range(8):
                for hr in range(2):
                    r = 32 * nb + 4 * j + 2 * hr
                    off = stage_off(nb, j, hr, warp_in_wg, gid, tig)
                    ptx.st_shared_v2_f32(uint32(stage + off), dq_reg[r], dq_reg[r + 1])
        hp.fence_proxy_async()

    @cuda.jit(device=True, inline=True)
    def to_a(pa, s_reg):
        """A score tile in registers, rounded to 16 bits, as the A fragment of acc += A B: the
        accumulator of k16 slice kc is its A fragment."""
        for kc in range(PS):
            for q in range(4):
                r = 32 * (kc // 4) + 8 * (kc % 4) + 2 * q
                pa[4 * kc + q] = pack(s_reg[r], s_reg[r + 1])

    @cuda.jit(device=True, inline=True)
    def load_resident(g_a, g_b, res_a, res_b, res_full, row0, n_rows, head, b):
        """-- producer: this program's rows of the two resident operands, once (a box starting
        past the end is not issued) --"""
        boxes = 0
        for wg in range(W):
            if row0 + ROWS_PER_WARPGROUP * wg < n_rows:
                boxes += 2 * DC
        hp.mbarrier_arrive_expect_tx(res_full, boxes * BOX_BYTES)
        for wg in range(W):
            if row0 + ROWS_PER_WARPGROUP * wg < n_rows:
                for cc in range(DC):
                    off = (wg * DC + cc) * BOX_BYTES
                    hp.cp_async_bulk_tensor_4d_g2s(res_a + off, g_a, BOX_COLUMNS * cc,
                                                   row0 + ROWS_PER_WARPGROUP * wg, head, b,
                                                   res_full)
                    hp.cp_async_bulk_tensor_4d_g2s(res_b + off, g_b, BOX_COLUMNS * cc,
                                                   row0 + ROWS_PER_WARPGROUP * wg, head, b,
                                                   res_full)

    @cuda.jit(device=True, inline=True)
    def load_stream(g_a, g_b, st_a, full, row0, head, b):
        """-- producer: one stage's two streamed tiles (rows past the end zero-filled) --"""
        hp.mbarrier_arrive_expect_tx(full, 2 * TILE_BYTES)
        for cc in range(DC):
            hp.cp_async_bulk_tensor_4d_g2s(st_a + cc * CHUNK_BYTES, g_a, BOX_COLUMNS * cc, row0,
                                           head, b, full)
            hp.cp_async_bulk_tensor_4d_g2s(st_a + TILE_BYTES + cc * CHUNK_BYTES, g_b,
                                           BOX_COLUMNS * cc, row0, head, b, full)

    @cuda.jit(launch_bounds=(THREADS, 1), lineinfo=False)
    def kernel(maps, out, dout, lse, delta, grad_a, grad_b, acc_map, offsets, index, sched_b,
               sched_h, group, n_q, n_k, scale_log2, scale, band_lo, band_hi):
        smem = cuda.shared.array(0, dtype=uint8)         # dynamic: kernel.smem_bytes
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        tile, bh, n_blocks = tile_and_head()
        if DQ:
            blk = n_blocks - 1 - tile                   # longest (causal) query tiles first
            n_heads = grad_a.shape[1]
            b = bh // n_heads
            h = bh % n_heads
            hk = h // group
            res_head = h
            n_rows = n_q
        else:
            blk = tile                                  # key tile 0 (causal: longest) first
            n_heads_kv = grad_a.shape[1]
            b = bh // n_heads_kv
            hk = bh % n_heads_kv
            h = hk * group
            res_head = hk
            n_rows = n_k
        row0 = blk * R
        # shared memory from a 1024-byte boundary: resident A | resident B | stages (A, B
        # tiles) | (atomic) two dS^T buffers | (dK/dV) each warpgroup's row statistics per
        # stage | barriers
        base = hp.aligned_shared_base(smem)
        res_a = base
        res_b = base + RES_BYTES
        ring = base + RING
        ds0 = base + DS
        stage0 = base + STAGE
        stats = base + STATS
        res_full = base + BAR
        full0 = res_full + 8
        empty0 = full0 + 8 * STAGES
        if tid == 0:
            hp.init_ring_barriers(res_full, STAGES, CONSUMER_THREADS)
        cuda.syncthreads()       # the last CTA-wide barrier: the roles part here

        # the work items, in order: "dq", the K/V tiles of the kv schedule of (b, h); "dkdv",
        # for each query head of the GQA group, the Q tiles of its q schedule
        n_groups = 1 if DQ else group

        if REALLOC and warp >= PRODUCER_WARP:
            hp.setmaxnreg_dec(PRODUCER_REGS)        # the producer warpgroup's, all four warps
        if warp == PRODUCER_WARP:
            # -- producer: the resident operands once, then the streamed tiles stage by stage --
            gm = hp.array_addr(maps)
            if lane == 0:
                for m in range(4):
                    hp.fence_proxy_tensormap_acquire(gm + uint64(128 * m))
                load_resident(gm, gm + uint64(128), res_a, res_b, res_full, row0, n_rows,
                              res_head, b)
            i = 0
            for g in range(n_groups):
                t_head = hk if DQ else hk * group + g
                s = b * sched_b + (h if DQ else t_head) * sched_h
                for it in range(offsets[s, blk], offsets[s, blk + 1]):
                    st = i % STAGES
                    if i >= STAGES:     # stage st last held item i - STAGES: wait for its release
                        hp.mbarrier_wait_parity(empty0 + 8 * st, (i // STAGES - 1) & 1)
                    t_row0 = index[it] * C
                    if lane == 0:
                        load_stream(gm + uint64(256), gm + uint64(384), ring + st * 2 * TILE_BYTES,
                                    full0 + 8 * st, t_row0, t_head, b)
                    i += 1
            return
        if REALLOC:
            if warp > PRODUCER_WARP:
                return
            hp.setmaxnreg_inc(CONSUMER_REGS)

        # -- consumers: warpgroup wg owns rows row0 + 64 wg .. + 63 --
        wg = warp // 4
        gid = lane // 4
        tig = lane % 4
        row_first = row0 + ROWS_PER_WARPGROUP * wg
        row_a = row_first + 16 * (warp % 4) + gid         # this thread's rows: row_a, row_a + 8
        a_wg = res_a + wg * DC * BOX_BYTES
        b_wg = res_b + wg * DC * BOX_BYTES
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        dp_reg = cuda.local.array(S_REGS, dtype=float32)
        acc_a = cuda.local.array(O_REGS, dtype=float32)   # dQ, or dK
        acc_b = cuda.local.array(O_REGS, dtype=float32)   # dV (dK/dV)
        pa = cuda.local.array(P_REGS, dtype=uint32)
        pa2 = cuda.local.array(1 if DQ or DS_UNDER_DV else P_REGS, dtype=uint32)   # dS^T's
        dq_reg = cuda.local.array(DQ_REGS, dtype=float32)  # atomic: this tile's dQ share
        # atomic: this warpgroup's share of dQ = dS K -- the dS^T block (64 queries) it reads
        # as A, the first of K's column chunks it reads as B, and where its rows and columns lie
        q_block = wg if BY_QUERIES else 0
        k_cols = res_a + (0 if BY_QUERIES else wg * BOX_BYTES)
        dq_col0 = 0 if BY_QUERIES else 64 * wg
        stage_wg = stage0 + wg * (DQ_N // 32) * STAGE_BOX
        elected = ATOMIC and tid % WARPGROUP_THREADS == 0    # issues the reductions
        gm_acc = hp.array_addr(acc_map)
        if elected:
            hp.fence_proxy_tensormap_acquire(gm_acc)
        lse2_r = cuda.local.array(2, dtype=float32)
        delta_r = cuda.local.array(2, dtype=float32)
        for r in range(O_REGS):
            acc_a[r] = float32(0.0)
            if not DQ:
                acc_b[r] = float32(0.0)
        if DQ:
            # -- delta = rowsum(dO * O) of this thread's rows, from fragment words; lse2 --
            for hr in range(2):
                row = row_a + 8 * hr
                part = float32(0.0)
                if row < n_q:
                    for dc in range(OB):
                        for j in range(8):
                            col = 64 * dc + 8 * j + 2 * tig
                            o2 = unpack(ptx.ld_global_u32(ptx.global_addr(out, b, h, row, col)))
                            d2 = unpack(ptx.ld_global_u32(ptx.global_addr(dout, b, h, row,
                                                                          col)))
                            part += o2[0] * d2[0] + o2[1] * d2[1]
                part += cuda.shfl_xor_sync(0xFFFFFFFF, part, 1)
                part += cuda.shfl_xor_sync(0xFFFFFFFF, part, 2)
                delta_r[hr] = part
                l2 = POS_INF                                 # P = 0 past the queries
                if row < n_q:
                    if tig == 0:
                        delta[b, h, row] = part
                    lv = lse[b, h, row]
                    if lv != NEG_INF:                        # no allowed key: P = 0
                        l2 = lv * float32(LOG2E)
                lse2_r[hr] = l2
        sl = scale_log2
        hp.mbarrier_wait_parity(res_full, 0)

        i = 0
        for g in range(n_groups):
            t_head = h if DQ else hk * group + g           # the item's query head
            s = b * sched_b + t_head * sched_h
            for it in range(offsets[s, blk], offsets[s, blk + 1]):
                st = i % STAGES
                st_a = ring + st * 2 * TILE_BYTES          # Q (dkdv) or K (dq) tile
                st_b = st_a + TILE_BYTES                   # dO (dkdv) or V (dq) tile
                t_idx = index[it]
                col0 = t_idx * C
                if not DQ:
                    st_stats = stats + (wg * STAGES + st) * STATS_BYTES
                    # -- this warpgroup stages the tile's lse (log2; +inf past the queries and
                    # for rows with no allowed key: P = 0) and delta, (lse2, delta) pairs; the
                    # named barrier orders the stores before every read (and, with two
                    # buffers, every read of item i - 2 before a store of item i) --
                    tw = tid - WARPGROUP_THREADS * wg
                    if tw < C:
                        l2 = POS_INF
                        dl = float32(0.0)
                        if col0 + tw < n_q:
                            lv = lse[b, t_head, col0 + tw]
                            dl = delta[b, t_head, col0 + tw]
                            if lv != NEG_INF:
                                l2 = lv * float32(LOG2E)
                        ptx.st_shared_v2_f32(uint32(st_stats + 8 * tw), l2, dl)
                    hp.named_barrier_sync(uint32(1 + wg), uint32(WARPGROUP_THREADS))
                hp.mbarrier_wait_parity(full0 + 8 * st, (i // STAGES) & 1)
                # -- compute S = Q K^T and dP = dO V^T (dK/dV: S^T = K Q^T, dP^T = V dO^T) --
                hp.wgmma_fence()
                issue_abt(s_reg, a_wg, st_a)
                issue_abt(dp_reg, b_wg, st_b)
                hp.wgmma_wait_group(1)
                hp.wgmma_fence_operands(s_reg, 0, S_REGS)
                # -- the masks on tiles that need them, then P = exp2(S * scale * log2(e) -
                # lse2) (a masked score gives P = 0) --
                if DQ:
                    need = col0 + C > n_k or tile_needs(row_first // ROWS_PER_WARPGROUP, t_idx,
                                                        band_lo, band_hi)
                else:
                    need = tile_needs(t_idx, row_first // ROWS_PER_WARPGROUP, band_lo, band_hi)
                if need:
                    mask_tile(s_reg, row_a, tig, col0, n_k, band_lo, band_hi)
                for nb in range(NB):
                    for j in range(8):
                        for e in range(2):
                            l2c = POS_INF
                            if not DQ:
                                l2c = ptx.ld_shared_f32(uint32(st_stats + 8 * (64 * nb + 8 * j
                                                                               + 2 * tig + e)))
                            for hr in range(2):
                                r = 32 * nb + 4 * j + 2 * hr + e
                                l2 = lse2_r[hr] if DQ else l2c
                                s_reg[r] = ptx.ex2(s_reg[r] * sl - l2)
                if DS_UNDER_DV:
                    # -- dV += P^T dO: issued, then dS^T computed while it runs --
                    to_a(pa, s_reg)
                    hp.wgmma_fence()
                    issue_ab(acc_b, pa, st_b)
                    hp.wgmma_wait_group(1)
                else:
                    hp.wgmma_wait_group(0)
                hp.wgmma_fence_operands(dp_reg, 0, S_REGS)
                # -- dS = P (dP - delta) (dK/dV at 128 queries a stage: dS^T into dP^T's
                # registers, P^T kept for dV's product) --
                for nb in range(NB):
                    for j in range(8):
                        for e in range(2):
                            c = 64 * nb + 8 * j + 2 * tig + e
                            dlc = float32(0.0)
                            if not DQ:
                                dlc = ptx.ld_shared_f32(uint32(st_stats + 8 * c + 4))
                            for hr in range(2):
                                r = 32 * nb + 4 * j + 2 * hr + e
                                if DQ or DS_UNDER_DV:
                                    dl = delta_r[hr] if DQ else dlc
                                    s_reg[r] = s_reg[r] * (dp_reg[r] - dl)
                                else:
                                    dp_reg[r] = s_reg[r] * (dp_reg[r] - dlc)
                ds_buf = ds0 + (i % 2) * DS_BUF             # atomic: this tile's dS^T
                if DQ or DS_UNDER_DV:
                    if DS_UNDER_DV:
                        hp.wgmma_wait_group(0)                 # dV's product: pa is free
                        hp.wgmma_fence_operands(acc_b, 0, O_REGS)
                    # -- dQ += dS K (dK/dV: dK += dS^T Q) --
                    to_a(pa, s_reg)
                    if ATOMIC:
                        store_ds(ds_buf, pa, wg, warp % 4, gid, tig)
                    hp.wgmma_fence()
                    issue_ab(acc_a, pa, st_a)
                else:
                    # -- dV += P^T dO and dK += dS^T Q, issued back to back: the float32
                    # scores are dead once packed (at most S^T, dP^T and the two accumulators
                    # live) --
                    to_a(pa, s_reg)
                    to_a(pa2, dp_reg)
                    if ATOMIC:
                        store_ds(ds_buf, pa2, wg, warp % 4, gid, tig)
                    hp.wgmma_fence()
                    issue_ab(acc_b, pa, st_b)
                    issue_ab(acc_a, pa2, st_a)
                if ATOMIC:
                    # -- atomic: once every warpgroup's dS^T is stored, this warpgroup's share
                    # of dQ = dS K over the program's keys (the buffer alternates: the barrier
                    # also orders the other warpgroup's reads of the tile before last, and
                    # follows each first thread's wait for its last reduction's reads of the
                    # dQ staging) --
                    if elected:
                        hp.cp_async_bulk_wait_group_read()
                    hp.named_barrier_sync(uint32(DS_BARRIER), uint32(CONSUMER_THREADS))
                    issue_dq(dq_reg, ds_buf + q_block * DS_BLOCK, k_cols)
                hp.wgmma_wait_group(0)
                if not (DQ or DS_UNDER_DV):
                    hp.wgmma_fence_operands(acc_b, 0, O_REGS)
                hp.wgmma_fence_operands(acc_a, 0, O_REGS)
                if ATOMIC:
                    hp.wgmma_fence_operands(dq_reg, 0, DQ_REGS)
                    # -- atomic: this warpgroup's share of dQ staged, then added to the
                    # accumulator by TMA (rows past the queries skipped) by its first thread --
                    stage_dq(stage_wg, dq_reg, warp % 4, gid, tig)
                    hp.named_barrier_sync(uint32(STAGE_BARRIER + wg), uint32(WARPGROUP_THREADS))
                    if elected:
                        for bx in range(DQ_N // 32):
                            hp.cp_reduce_async_bulk_tensor_4d_add(
                                gm_acc, uint32(dq_col0 + 32 * bx), uint32(col0 + 64 * q_block),
                                uint32(t_head), uint32(b), uint32(stage_wg + bx * STAGE_BOX))
                        hp.cp_async_bulk_commit_group()
                hp.mbarrier_arrive(empty0 + 8 * st)            # this stage may be refilled
                i += 1

        if elected:
            hp.cp_async_bulk_wait_group()        # the staging is read before the program ends
        # -- epilogue: dQ = scale * acc (dK/dV: dK = scale * acc, dV) as packed 16-bit pairs --
        head = h if DQ else hk
        for hr in range(2):
            row = row_a + 8 * hr
            if row < n_rows:
                for dc in range(OB):
                    for j in range(8):
                        r = 32 * dc + 4 * j + 2 * hr
                        col = 64 * dc + 8 * j + 2 * tig
                        ptx.st_global_u32(ptx.global_addr(grad_a, b, head, row, col),
                                          pack(acc_a[r] * scale, acc_a[r + 1] * scale))
                        if not DQ:
                            ptx.st_global_u32(ptx.global_addr(grad_b, b, head, row, col),
                                              pack(acc_b[r], acc_b[r + 1]))

    kernel.threads = THREADS
    kernel.smem_bytes = SMEM
    return kernel


# -- host side -----------------------------------------------------------------------------------
def supports(problem, config):
    """Why this backward cannot run ``problem`` under ``config`` (a string naming what it
    refuses), or None. Checked in this order: the problem's features (mask, bias, block mask,
    dropout, cache lengths, value head dim, bottom-right causal with Nq != Nk and no window,
    dtype, head dim), ``block_q`` / ``block_k`` pinned by ``config`` (this backward's tiles are
    ``dq_tile`` and ``kv_tile``), pinned ``dq_tile`` / ``kv_tile`` its plan does not take (with
    dQ by atomics: a ``dq_tile`` at all, and ``kv_tile`` the atomic dK/dV kernel cannot share,
    `sim.plans.wgmma_bwd.wgmma_bwd_dq_refusal`); then the hardware (a real GPU of compute
    capability 9.0 or more)."""
    pb = problem
    why = problem_refusal(pb, "the wgmma backward")
    if why:
        return why
    if config.block_q is not None or config.block_k is not None:
        return "the wgmma backward chooses its own tiles (KernelConfig.block_q/block_k must be None)"
    if config.dq_tile is not None or config.kv_tile is not None or config.backward_dq == "atomic":
        try:                                    # tiles the plan does not take
            plan(pb, config)
        except ValueError as exc:
            return str(exc)
    why = host.tensor_core_refusal(pb, "the wgmma family", DTYPES, SUPPORTED_HEAD_DIMS,
                                   window=True)
    return why or _hopper_refusal("the wgmma backward")


def dq_mode(problem, config) -> str:
    """How this backward computes dQ for ``problem``: ``config.backward_dq``; else "kernel"
    (deterministic) while torch's deterministic algorithms are on
    (``torch.use_deterministic_algorithms(True)``), as PyTorch's own backwards do; else the
    plan's rule (`sim.plans.wgmma_bwd.wgmma_default_dq_mode`)."""
    if config.backward_dq is not None:
        return config.backward_dq
    torch = sys.modules.get("torch")
    deterministic = torch is not None and torch.are_deterministic_algorithms_enabled()
    return wgmma_default_dq_mode(problem.head_dim, problem.seqlen_q, deterministic)


def plan(problem, config):
    """The `sim.plan.Plan` this backward launches for ``problem`` (`sim.plans.wgmma_bwd`): its
    grids, threads and shared memory are what `prepare` launches; its tiles ``config.dq_tile``
    and ``config.kv_tile`` (None: the plan's defaults), its dQ mode `dq_mode`'s."""
    tiles = {name: getattr(config, name) for name in ("dq_tile", "kv_tile")
             if getattr(config, name) is not None}
    return host.family_plan("wgmma", "bwd", problem, launch_order=config.launch_order,
                            dq_mode=dq_mode(problem, config), **tiles)


def backward(problem, out, lse, dout, config):
    """``(dq, dk, dv)`` in the problem's kind of array and dtype (see `kernels.backward`)."""
    return prepare(problem, config)(problem.q, problem.k, problem.v, out, lse, dout)


#: The box of the atomic dK/dV kernel's reductions into the float32 dQ accumulator: 64 query
#: rows x 32 columns (128 bytes, the 128-byte swizzle's width), of one (batch, head).
ACC_BOXES = ((1, 1, ROWS_PER_WARPGROUP, 32),)


def _dense_layout(address, shape, itemsize):
    """`_operand_layout` of a dense (contiguous) 4-D array at ``address``."""
    class _Dense:
        def __init__(self):
            self.shape = shape

        def data_ptr(self):
            return address

        def stride(self):
            return (shape[1] * shape[2] * shape[3], shape[2] * shape[3], shape[3], 1)
    return _operand_layout(_Dense(), itemsize=itemsize)


def prepare(problem, config):
    """The backward of ``problem`` with its plan, kernels, tile schedules and constants chosen
    once: ``run(q, k, v, out, lse, dout) -> (dq, dk, dv)`` for operands of its shapes, dtype
    and device, launched as `plan` says (grids, threads, dynamic shared memory; checked against
    the compiled kernels' own by `kernels.host.check_launch`): the dQ kernel (which writes
    delta), then the dK/dV kernel; with dQ by atomics (`dq_mode`) the pre-pass (delta, the
    zeroed float32 accumulator: `kernels.mma_bwd`'s), the dK/dV kernel (adding dS K), then the
    conversion dQ = scale * accumulator (`kernels.mma_bwd`'s)."""
    import numpy as np

    from .mma_bwd import get_convert_kernel, get_prepass_kernel
    pb = problem
    the_plan = plan(pb, config)
    atomic = the_plan.config["dq_mode"] == "atomic"
    kv_cols, kv_rows = the_plan.config["kv_tile"]
    is_bf16 = str(pb.dtype).endswith("bfloat16")
    causal, window, band_lo, band_hi = band_arguments(pb)
    tma_kinds = ("dkdv",) if atomic else ("dq", "dkdv")      # the kernels fed by TMA
    kinds = ("pre", "dkdv", "convert") if atomic else tma_kinds
    launches = {kind: launch_of(the_plan, kind) for kind in kinds}
    # each TMA kernel's launch order: its plan's, balanced on this GPU's SMs as `sim` prices it
    groups = {}
    for kind in tma_kinds:
        k = the_plan.kernel(WGMMA_BWD_KERNEL_NAMES[kind])
        groups[kind] = launch_head_group(k.tile_work, k.grid[1], k.head_group,
                                         k.default_head_group, host.sm_count())
    kerns = {"dkdv": get_kernel("dkdv", pb.head_dim, kv_rows, kv_cols, is_bf16, causal,
                                groups["dkdv"], window, dq_atomic=atomic)}
    schedules = {"dkdv": tile_scheduler.device_schedule(pb, kv_cols, kv_rows, "q")}
    boxes = {"dkdv": ((1, 1, ROWS_PER_WARPGROUP, BOX_COLUMNS),) * 2
             + ((1, 1, kv_cols, BOX_COLUMNS),) * 2}
    if atomic:
        dtype = "bfloat16" if is_bf16 else "float16"
        kerns["pre"] = get_prepass_kernel(pb.head_dim, dtype)
        kerns["convert"] = get_convert_kernel(pb.head_dim, dtype)
    else:
        dq_rows, dq_cols = the_plan.config["dq_tile"]
        kerns["dq"] = get_kernel("dq", pb.head_dim, dq_rows, dq_cols, is_bf16, causal,
                                 groups["dq"], window)
        schedules["dq"] = tile_scheduler.device_schedule(pb, dq_rows, dq_cols, "kv")
        boxes["dq"] = (((1, 1, ROWS_PER_WARPGROUP, BOX_COLUMNS),) * 2
                       + ((1, 1, dq_cols, BOX_COLUMNS),) * 2)
    for kind in kinds:
        host.check_launch(WGMMA_BWD_KERNEL_NAMES[kind], launches[kind][1:],
                          (kerns[kind].threads, kerns[kind].smem_bytes))
    B, H, Nq, D, Hkv, Nk = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim, pb.heads_kv, pb.seqlen_k
    template = host._without_operands(pb)
    tail = (H // Hkv, Nq, Nk, np.float32(pb.scale * LOG2E), np.float32(pb.scale),
            np.int64(band_lo), np.int64(band_hi))
    n_q, scale = np.int64(Nq), np.float32(pb.scale)
    if pb.kind == "torch" and host.real_gpu():
        warm_map_writer(host.current_device_id())
    plans: dict = {kind: {} for kind in kinds}
    repeat = host.Repeat(template, config)
    shapes_strides: list = []       # the recorded TMA operands' (shape, strides): q, k, v, dout
    map_pointers: dict = {}         # operands' data pointers -> (maps' addresses, the maps)

    def tma_maps(x, operands, stream):
        """The tensor maps of each TMA kernel: {kind: maps} (Q, dO, K, V for "dq"; K, V, Q,
        dO for "dkdv"; ``operands`` = the layouts of q, k, v, dout)."""
        lq, lk, lv, ldo = operands
        order = {"dq": (lq, ldo, lk, lv), "dkdv": (lk, lv, lq, ldo)}
        return {kind: maps_for(x, order[kind], boxes[kind], stream) for kind in tma_kinds}

    def run(q, k, v, out, lse, dout):
        ptrs = repeat.pointers((q, k, v, out, lse, dout))
        if ptrs is not None:            # -- the operands' layout of the recorded call: repeat it --
            p_q, p_k, p_v, p_out, p_lse, p_dout = ptrs
            key = (p_q, p_k, p_v, p_dout)
            hit = map_pointers.get(key)
            if hit is None or _capturing(q):
                maps = tma_maps(q, [(ptr, *rest) for ptr, rest in zip(key, shapes_strides)],
                                host.launch_stream(q))
                if len(map_pointers) > 16:
                    map_pointers.clear()
                hit = map_pointers[key] = ({kind: driver.device_pointer(m)
                                            for kind, m in maps.items()}, maps)
            dq, dk, dv = repeat.like_layout(q), repeat.like_layout(k), repeat.like_layout(v)
            stream = host.stream_handle(q)
            # (delta, and the float32 dQ accumulator by atomics: kept until the launches are
            # enqueued; torch's allocator orders its reuse)
            if atomic:
                work, (p_delta, p_acc) = repeat.scratch(q, B * H * Nq, B * H * Nq * D)
                acc_map = maps_for(q, [_dense_layout(p_acc, (B, H, Nq, D), 4)], ACC_BOXES,
                                   host.launch_stream(q), dtype="float32")
                pre, dkdv, convert = repeat.launches[:3]
                pre(stream, p_out, p_dout, p_delta, p_acc)
                dkdv(stream, hit[0]["dkdv"], p_out, p_dout, p_lse, p_delta, dk.data_ptr(),
                     dv.data_ptr(), driver.device_pointer(acc_map))
                convert(stream, p_acc, dq.data_ptr())
            else:
                work, (p_delta,) = repeat.scratch(q, B * H * Nq)
                first, second = repeat.launches[:2]
                first(stream, hit[0]["dq"], p_out, p_dout, p_lse, p_delta, dq.data_ptr(),
                      dq.data_ptr())
                second(stream, hit[0]["dkdv"], p_out, p_dout, p_lse, p_delta, dk.data_ptr(),
                       dv.data_ptr())
            return dq, dk, dv
        call = host.Call(template, q=q)
        ops = [call.input(x, words=True, aligned=True) for x in (q, k, v, out, dout)]
        layouts = [_operand_layout(x) for x in ops]
        for i in (0, 1, 2, 4):          # the operands read by TMA
            x = ops[i]
            if hasattr(x, "contiguous") and _needs_copy(x, layout=layouts[i]):
                ops[i] = host.aligned_copy(x)
                layouts[i] = _operand_layout(ops[i])
        qi, ki, vi, oi, doi = ops
        li = call.input(lse)
        # -- the gradients in their operands' layouts (a dense [B, N, H, d] view stays one) --
        dq = call.output((B, H, Nq, D), words=True, like=q)
        dk = call.output((B, Hkv, Nk, D), words=True, like=k)
        dv = call.output((B, Hkv, Nk, D), words=True, like=v)
        delta = call.output((B, H, Nq), float32=True)
        maps = tma_maps(qi, [layouts[i] for i in (0, 1, 2, 4)], call.stream)
        # each launch: (kind, arguments, how many leading arguments its plan is looked up by
        # and are this call's arrays)
        if atomic:
            # -- delta and the zeroed accumulator, then dK/dV (adding dS K), then dQ --
            acc = call.output((B, H, Nq, D), float32=True).arg
            acc_map = maps_for(qi, [_operand_layout(acc, itemsize=4)], ACC_BOXES, call.stream,
                               dtype="float32")
            args = [("pre", (oi, doi, delta.arg, acc, n_q), 4),
                    ("dkdv", (maps["dkdv"], oi, doi, li, delta.arg, dk.arg, dv.arg, acc_map,
                              *schedules["dkdv"], *tail), 8),
                    ("convert", (acc, dq.arg, n_q, scale), 2)]
        else:
            # -- dQ (and delta) first, then dK/dV, which reads delta --
            unused = host.device_const("wgmma backward: no dQ accumulator map",
                                       lambda: np.zeros((1, 16), np.uint64))
            args = [("dq", (maps["dq"], oi, doi, li, delta.arg, dq.arg, dq.arg, unused,
                            *schedules["dq"], *tail), 7),
                    ("dkdv", (maps["dkdv"], oi, doi, li, delta.arg, dk.arg, dv.arg, unused,
                              *schedules["dkdv"], *tail), 7)]
        for kind, a, arrays in args:
            grid, threads, smem = launches[kind]
            host.relaunch(plans[kind], a[:arrays], kerns[kind], grid, threads, call.stream, a,
                          sharedmem=smem, fast=config.fast_launch)
        if repeat.launches is None:
            shapes_strides[:] = [layouts[i][1:] for i in (0, 1, 2, 4)]
            repeat.record((q, k, v, out, lse, dout), (qi, ki, vi, oi, li, doi), lambda: [
                host.pointer_launch(kerns[kind], *launches[kind], a, range(arrays))
                for kind, a, arrays in args])
        result = dq.value(), dk.value(), dv.value()
        del ops
        return result
    return run
