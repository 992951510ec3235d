"""CUDA-core FlashAttention-2 forward (the ``simt`` family), float32 accumulation.

One thread block computes one (batch*head, Q tile), heaviest causal tiles first. The Q tile
(pre-multiplied by the softmax scale) is staged once in shared memory; K and V tiles stream
through shared memory in the order given by `BlockInfo.kv_schedule()` (causal, sliding-window
and block-sparse skipping live there, so skipped tiles are never loaded). Each thread owns a ``TM x TN`` register
micro-tile of S = Q K^T (rows ``ty + NTM*i``, columns ``tx + NTN*j``, interleaved so that a
warp's shared-memory reads hit distinct banks) and the matching ``TM x D/NTN`` slice of the
output accumulator. The row max is reduced across the NTN threads of a row group (warp shuffles
on a GPU); the row sum is kept as per-thread partial sums and reduced once at the end, with the
one final rescale. O and the logsumexp are written once.

All sizes (block_m, block_n, TM, TN, head_dim) and the feature switches (causal, mask,
dropout, window) are compile-time constants of a kernel built by `make_forward_kernel`. With a
sliding window the kernel takes the band ``lo <= col - row <= hi`` (`BlockInfo.band`: the window
and the causal rule together, bottom-right aligned) as two int64 arguments and masks per element
only the tiles whose corners fall outside it; without one that code is not compiled. This family
takes every float dtype (bfloat16 staged as float32) and head dims up to 256, and it is what
runs under Numba's CUDA simulator.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from sim.plans.simt import (FWD_KERNEL, GPU_TARGET_THREADS, MAX_HEAD_DIM, SIMULATOR_TARGET_THREADS,
                            fwd_kernel_smem_bytes)

from . import compile_cache, host, tile_scheduler
from .config import (FWD_TILES, STATIC_SMEM_LIMIT_BYTES, TileConfig, choose_tiles,
                     default_blocks, fwd_smem_bytes, requested_tiles)
from .dropout import dropout_constants, keep_bit, row_hash
from .mask import band_arguments

__all__ = ["forward", "plan", "supports", "tiles", "make_forward_kernel", "get_kernel",
           "TAKES_WINDOW", "band_arguments", "MAX_HEAD_DIM"]

NEG_INF = float32(-np.inf)
U64 = np.uint64
I64 = np.int64
#: This family's kernels take a sliding window (`kernels.family_for` asks).
TAKES_WINDOW = True


def make_forward_kernel(cfg: TileConfig, head_dim: int, causal: bool, has_mask: bool,
                        dropout: bool, use_shfl: bool, window: bool = False):
    """The forward kernel for one tiling and feature set (compiled on first launch).

    Numba indexes with signed 64-bit integers and fixes up negative indices at every access;
    with uint64 row/column indices precomputed per thread (and 2-D views of q, k, v, out for the
    block's head) the hot loops carry no wraparound selects and fewer 64-bit multiplies. The
    kernel keeps the name ``flash_fwd_v2`` by which profiles and the resource table know it.

    Kernel signature::

        kernel(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
               n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale, band_lo, band_hi)

    grid = (n_blocks_q, B * Hq), block = cfg.threads. ``band_lo``, ``band_hi`` (int64) are read
    only when ``window``: key ``col`` is allowed for query ``row`` iff
    ``band_lo <= col - row <= band_hi`` (`band_arguments`).
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
    CAUSAL, HAS_MASK, DROPOUT, SHFL, WINDOW = causal, has_mask, dropout, use_shfl, window

    @cuda.jit
    def flash_fwd_v2(q, k, v, out, lse, mask, kv_off, kv_idx, sched_sb, sched_sh, group,
                  n_blocks_q, sm_scale, seed_prefix, keep_threshold, keep_scale, band_lo,
                  band_hi):
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

            # -- mask: bounds, causal, window (tiles the band cuts), boolean mask --
            band_cut = False
            if WINDOW:
                band_cut = (I64(col0) + I64(BN - 1) - I64(row0) > band_hi
                            or I64(col0) - I64(row0) - I64(BM - 1) < band_lo)
            for i in range(TM):
                row = row0 + rows[i]
                for j in range(TN):
                    col = col0 + cols[j]
                    ok = col < seqlen_k
                    if CAUSAL:
                        ok = ok and col <= row
                    if WINDOW:
                        if ok and band_cut:
                            diff = I64(col) - I64(row)
                            ok = diff >= band_lo and diff <= band_hi
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


# -- host side -----------------------------------------------------------------------------------

def get_kernel(cfg: TileConfig, head_dim, causal, has_mask, dropout, use_shfl, window=False):
    """The compiled-on-first-launch forward kernel for one configuration (cached)."""
    key = (cfg, head_dim, bool(causal), bool(has_mask), bool(dropout), bool(use_shfl),
           bool(window))
    return compile_cache.built(make_forward_kernel, *key)


def target_threads() -> int:
    """Threads per block the tile split aims at (16 under the simulator, 128 on a GPU:
    `sim.plans.simt`)."""
    return SIMULATOR_TARGET_THREADS if host.simulator() else GPU_TARGET_THREADS


def tiles(problem, config) -> TileConfig:
    """The forward's `TileConfig` for a problem: ``config``'s block sizes, else the problem's
    requested ones, else the default; with a block mask, the default where it divides the
    mask's tiles, else the mask's tiles; ``config.micro_tile``, else the tuned micro-tile of
    `kernels.config.FWD_TILES`, else `choose_tiles`."""
    d = problem.head_dim
    sim = host.simulator()
    bq, bk = requested_tiles(problem, config, default_blocks(d, False, sim))
    micro = config.micro_tile
    if micro is None and not sim:
        micro = FWD_TILES.get((d, bq, bk))
    cfg = (choose_tiles(bq, bk, d, target_threads()) if micro is None
           else TileConfig(bq, bk, int(micro[0]), int(micro[1])))
    return cfg


def supports(problem, config):
    """Why this family's forward cannot run ``problem`` (a string), or None: a head dim over
    256, tiles that do not divide the block mask's, or a tiling over the 48 KiB of static
    shared memory."""
    d = problem.head_dim
    if d > MAX_HEAD_DIM:
        return f"head_dim must be <= {MAX_HEAD_DIM} for the CUDA-core kernels, got {d}"
    if config.launch_order not in (None, "tiles", 1):
        return "the CUDA-core kernels are launched tiles first (launch_order 'tiles' or None)"
    try:
        cfg = tiles(problem, config)
        cfg.validate(d)
    except ValueError as exc:
        return str(exc)
    return check_tiles(problem, cfg.block_m, cfg.block_n, fwd_smem_bytes(cfg, d))


def check_tiles(problem, rows, cols, smem_bytes):
    """The refusals both CUDA-core passes share: kernel tiles of ``rows`` queries by ``cols``
    keys that do not divide the block mask's tiles, or ``smem_bytes`` of static shared memory
    over the per-block limit."""
    if problem.block_mask is not None and (problem.block_q % rows or problem.block_k % cols):
        return (f"the kernel tiles ({rows}, {cols}) must divide the block mask's tiles "
                f"({problem.block_q}, {problem.block_k})")
    if smem_bytes > STATIC_SMEM_LIMIT_BYTES:
        return (f"tiles block_q={rows}, block_k={cols} with head_dim={problem.head_dim} need "
                f"{smem_bytes} bytes of static shared memory per block, over the "
                f"{STATIC_SMEM_LIMIT_BYTES}-byte limit; choose smaller block_q/block_k")
    return None


def plan(problem, config):
    """The `sim.plan.Plan` this forward launches for ``problem`` (`sim.plans.simt`): its grid,
    threads and shared memory are what `forward` launches; its counts are what
    `sim.plan.price` prices."""
    return _plan(problem, tiles(problem, config))


def _plan(problem, cfg: TileConfig):
    return host.family_plan("simt", "fwd", problem, block_q=cfg.block_m, block_k=cfg.block_n,
                            micro_tile=(cfg.tm, cfg.tn),
                            arrays="torch" if problem.kind == "torch" else "numpy")


def launch_of(the_plan, name: str, threads: int, smem_bytes: int):
    """The `sim.plan.KernelPlan` ``name`` of ``the_plan``, checked against the threads and
    static shared memory of the kernel compiled for it (a kernel and its plan out of step: a
    bug, never the caller's)."""
    launch = the_plan.kernel(name)
    host.check_launch(name, (launch.threads, launch.shared_bytes), (threads, smem_bytes))
    return launch


def forward(problem, config):
    """Forward on the CUDA cores: ``(out, lse)`` in the problem's kind of array (see
    `kernels.forward`), launched as `plan` says."""
    pb = problem
    cfg = tiles(pb, config)
    launch = launch_of(_plan(pb, cfg), FWD_KERNEL, cfg.threads,
                       fwd_kernel_smem_bytes(cfg, pb.head_dim, cfg.threads % 32 == 0))
    B, Hq, Nq, D = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim
    call = host.Call(pb, stage_bfloat16=True)
    drop = dropout_constants(pb.seed, pb.dropout_p)
    maskd = call.mask()[0]
    kv_off, kv_idx, sb, sh = tile_scheduler.device_schedule(pb, cfg.block_m, cfg.block_n, "kv")
    q, k, v = call.input(pb.q), call.input(pb.k), call.input(pb.v)
    out = call.output((B, Hq, Nq, D))
    lse = call.output((B, Hq, Nq), float32=True)
    use_shfl = not host.simulator() and cfg.threads % 32 == 0
    causal, window, band_lo, band_hi = band_arguments(pb)
    kern = get_kernel(cfg, D, causal, pb.mask is not None, drop.enabled, use_shfl, window)
    nbq = launch.grid[0]
    host.launch(kern, launch.grid, launch.threads, call.stream, (
        q, k, v, out.arg, lse.arg, maskd, kv_off, kv_idx, sb, sh, Hq // pb.heads_kv, nbq,
        np.float32(pb.scale), np.uint64(drop.seed_hash), np.uint64(drop.threshold),
        np.float32(drop.inv_keep), band_lo, band_hi), fast=config.fast_launch)
    return out.value(), lse.value()
