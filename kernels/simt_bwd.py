"""CUDA-core FlashAttention-2 backward (the ``simt`` family), recomputing P from the logsumexp.

* `make_delta_kernel`: delta_i = sum_c dO_ic * O_ic, one warp per query row (coalesced: O and dO
  are read once).
* `make_dkdv_kernel`: one thread block per (batch*kv_head, K tile), parallel over K/V tiles.
  K and V stay in shared memory; the Q tiles that visit this K tile (`BlockInfo.q_schedule()`,
  for every query head of the GQA group; causal, window and block-sparse skipping live there)
  stream through. With a sliding window the band is masked per element on the tiles it cuts
  (`kernels.simt_fwd.band_arguments`), as in the forward. Each thread owns a micro-tile of
  S^T = K Q^T and dP^T = V dO^T, and the matching rows of the dK and dV accumulators, written
  once at the end; it adds dS K into a float32 dQ buffer with atomics (dQ's summation order is
  therefore not deterministic).
* a cast kernel turns the float32 dQ buffer into float16 for NumPy float16 inputs.

Dropout: with Z = keep / (1 - p), dV = (P*Z)^T dO, dP = (dO V^T) * Z, dS = P * (dP - delta),
where delta = rowsum(dO * O) and O is the dropped-out output (so delta = rowsum(P * dP)).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from sim.plans.simt import (CAST_KERNEL, CAST_THREADS, DELTA_KERNEL, DELTA_ROWS, DELTA_THREADS,
                            DKDV_KERNEL)

from . import compile_cache, host, tile_scheduler
from .config import TileConfig, choose_tiles, default_blocks, dkdv_smem_bytes, requested_tiles
from .dropout import dropout_constants, keep_bit, row_hash
from .simt_fwd import band_arguments, launch_of

__all__ = ["backward", "plan", "supports", "tiles", "make_delta_kernel", "make_dkdv_kernel",
           "DELTA_ROWS", "TAKES_WINDOW"]

POS_INF = float32(np.inf)
NEG_INF = float32(-np.inf)
U64 = np.uint64
I64 = np.int64
#: This family's kernels take a sliding window (`kernels.family_for` asks).
TAKES_WINDOW = True


def make_delta_kernel(head_dim: int, use_shfl: bool):
    """Coalesced delta pre-pass: one warp per row, lanes along d.

    delta[b, h, i] = sum_c dout[b, h, i, c] * out[b, h, i, c]. Lane ``l`` of the row's warp
    reads columns ``l, l+32, ...`` so each warp load is one contiguous row segment (one thread
    per row would stride by d between neighbouring threads and read O and dO ~8x over in
    32-byte sectors). The 32 partial sums are reduced by warp shuffles on a GPU, through
    shared memory under the
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
                     dropout: bool, dq_atomic: bool = True, window: bool = False):
    """The dK/dV kernel for one tiling and feature set, with unsigned 64-bit tile indices and
    per-head 2-D views (no wraparound fix-ups in the hot loops); ``cfg.block_m`` = K tile rows,
    ``cfg.block_n`` = Q tile rows. It keeps the name ``flash_bwd_dkdv_v2`` by which profiles
    and the resource table know it.

    Signature::

        kernel(q, k, v, dout, lse, delta, dk, dv, dq_acc, mask, q_off, q_idx, sched_sb,
               sched_sh, group, sm_scale, seed_prefix, keep_threshold, keep_scale, band_lo,
               band_hi)

    grid = (n_blocks_k, B * Hkv), block = cfg.threads. dq_acc (float32, zeroed) is only
    written when ``dq_atomic``. ``band_lo``, ``band_hi`` (int64) are read only when ``window``
    (key ``col`` allowed for query ``row`` iff ``band_lo <= col - row <= band_hi``).
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
    CAUSAL, HAS_MASK, DROPOUT, DQ_ATOMIC, WINDOW = causal, has_mask, dropout, dq_atomic, window

    @cuda.jit
    def flash_bwd_dkdv_v2(q, k, v, dout, lse, delta, dk, dv, dq_acc, mask, q_off, q_idx,
                       sched_sb, sched_sh, group, sm_scale, seed_prefix, keep_threshold,
                       keep_scale, band_lo, band_hi):
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

                # -- p, dropout, ds (the window masked on tiles the band cuts) --
                band_cut = False
                if WINDOW:
                    band_cut = (I64(col0) + I64(BK - 1) - I64(row0) > band_hi
                                or I64(col0) - I64(row0) - I64(BQ - 1) < band_lo)
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
                        if WINDOW:
                            if ok and band_cut:
                                diff = I64(col) - I64(row)
                                ok = diff >= band_lo and diff <= band_hi
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


def make_cast_kernel():
    """dst[b, h, r, c] = src[b, h, r, c] (float32 dQ to the output dtype), one thread per
    element of a (batch, head) slice; grid (cdiv(N * d, 256), B * H)."""
    @cuda.jit
    def cast4(src, dst):
        bh = cuda.blockIdx.y
        n_heads = src.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n = src.shape[2] * src.shape[3]
        if i < n:
            r = i // src.shape[3]
            c = i % src.shape[3]
            dst[b, h, r, c] = src[b, h, r, c]
    return cast4


# -- host side -----------------------------------------------------------------------------------

def _kernel(make, *key):
    return compile_cache.built(make, *key)


def tiles(problem, config) -> TileConfig:
    """The dK/dV kernel's `TileConfig` (K rows on m, Q rows on n) for a problem: ``config``'s
    block sizes, else the problem's requested ones, else the backward default (with a block
    mask: the default where it divides the mask's tiles, else the mask's tiles)."""
    from .simt_fwd import target_threads
    d = problem.head_dim
    bq, bk = requested_tiles(problem, config, default_blocks(d, True, host.simulator()))
    return choose_tiles(bk, bq, d, target_threads())


def supports(problem, config):
    """Why this family's backward cannot run ``problem`` (a string), or None (as
    `kernels.simt_fwd.supports`)."""
    from .simt_fwd import MAX_HEAD_DIM, check_tiles
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
    return check_tiles(problem, cfg.block_n, cfg.block_m, dkdv_smem_bytes(cfg, d))


def plan(problem, config):
    """The `sim.plan.Plan` this backward launches for ``problem`` (`sim.plans.simt`): the delta
    pre-pass, the dK/dV kernel and (NumPy float16) the dQ cast are launched with its grids,
    threads and shared memory; the torch fill and conversions it lists are what ``torch.zeros``
    and ``.to`` launch."""
    return _plan(problem, tiles(problem, config))


def _plan(problem, cfg: TileConfig):
    return host.family_plan("simt", "bwd", problem, block_q=cfg.block_n, block_k=cfg.block_m,
                            micro_tile_kv=(cfg.tm, cfg.tn),
                            arrays="torch" if problem.kind == "torch" else "numpy")


def backward(problem, out, lse, dout, config):
    """Backward on the CUDA cores: ``(dq, dk, dv)`` in the problem's kind of array and dtype
    (see `kernels.backward`), launched as `plan` says."""
    pb = problem
    cfg = tiles(pb, config)
    the_plan = _plan(pb, cfg)
    delta_launch = launch_of(the_plan, DELTA_KERNEL, DELTA_THREADS, 0)
    dkdv_launch = launch_of(the_plan, DKDV_KERNEL, cfg.threads, dkdv_smem_bytes(cfg, pb.head_dim))
    B, Hq, Nq, D, Hkv, Nk = pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim, pb.heads_kv, pb.seqlen_k
    call = host.Call(pb, stage_bfloat16=True)
    drop = dropout_constants(pb.seed, pb.dropout_p)
    maskd = call.mask()[0]
    q, k, v = call.input(pb.q), call.input(pb.k), call.input(pb.v)
    o, do, l_ = call.input(out), call.input(dout), call.input(lse)
    sim = host.simulator()

    delta = call.output((B, Hq, Nq), float32=True)
    host.launch(_kernel(make_delta_kernel, D, not sim), delta_launch.grid, delta_launch.threads,
                call.stream, (o, do, delta.arg), fast=config.fast_launch)

    dk = call.output((B, Hkv, Nk, D))
    dv = call.output((B, Hkv, Nk, D))
    dq_acc = call.output((B, Hq, Nq, D), float32=True, zeros=True)
    q_off, q_idx, sb, sh = tile_scheduler.device_schedule(pb, cfg.block_n, cfg.block_m, "q")
    causal, window, band_lo, band_hi = band_arguments(pb)
    kern = _kernel(make_dkdv_kernel, cfg, D, causal, pb.mask is not None, drop.enabled, True,
                   window)
    host.launch(kern, dkdv_launch.grid, dkdv_launch.threads, call.stream, (
        q, k, v, do, l_, delta.arg, dk.arg, dv.arg, dq_acc.arg, maskd, q_off, q_idx, sb, sh,
        Hq // Hkv, np.float32(pb.scale), np.uint64(drop.seed_hash), np.uint64(drop.threshold),
        np.float32(drop.inv_keep), band_lo, band_hi), fast=config.fast_launch)

    if call.torch:
        dq = dq_acc.value(dtype=pb.dtype)
    elif np.dtype(pb.dtype) == np.float32:
        dq = dq_acc.value()
    else:
        dq16 = call.output((B, Hq, Nq, D))
        cast_launch = launch_of(the_plan, CAST_KERNEL, CAST_THREADS, 0)
        host.launch(_kernel(make_cast_kernel), cast_launch.grid, cast_launch.threads, call.stream,
                    (dq_acc.arg, dq16.arg), fast=config.fast_launch)
        dq = dq16.value()
    return dq, dk.value(), dv.value()
