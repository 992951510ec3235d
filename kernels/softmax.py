"""The softmax's row statistics in the tensor-core backwards.

The forward keeps only the logsumexp of each row; the backward recomputes P = exp(S - lse) tile
by tile, with exp2 and ``log2(e)`` folded in, and needs delta = rowsum(dO * O):

* `dq_row_stats`: the dQ kernels' per-row values for a thread's two rows: delta reduced over the
  row's four threads (and written for the dK/dV kernel), lse as log2 (+inf outside the rows and
  for fully masked rows, so that P = 0), and the rows' dropout hashes;
* `stage_rows`: the dK/dV kernels stage a Q tile's lse (as log2) and delta in shared memory.
"""
from __future__ import annotations

import math

from .dropout import fmix_device

__all__ = ["dq_row_stats", "stage_rows", "LOG2E"]

LOG2E = 1.4426950408889634


def dq_row_stats(has_dropout):
    """``dq_row_stats``: the dQ kernels' per-row values for a thread's two rows (``row0``,
    ``row0 + 8``): delta = rowsum(dO * O) reduced over the row's four threads from the partial
    sums ``dsum`` (and written to ``delta`` by thread 0 of the four), lse as log2 (+inf
    outside [0, n_q) and for fully masked rows, so that P = 0), and the rows' dropout hashes."""
    from numba import cuda, float32, uint64
    HAS_DROPOUT = has_dropout
    NEG_INF = float32(-math.inf)
    POS_INF = float32(math.inf)
    fmix = fmix_device()

    @cuda.jit(device=True, inline=True)
    def dq_row_stats(dsum, delta_r, lse2_r, h_row, row0, tig, b, h, bh, n_q, lse, delta,
                     seed_hash):
        h_bh = fmix(uint64(seed_hash) ^ uint64(bh))
        for r in range(2):
            t = dsum[r]
            t += cuda.shfl_xor_sync(0xFFFFFFFF, t, 1)
            t += cuda.shfl_xor_sync(0xFFFFFFFF, t, 2)
            delta_r[r] = t
            row = row0 + 8 * r
            l2 = POS_INF                                     # P = 0 outside [0, n_q)
            if row < n_q:
                if tig == 0:
                    delta[b, h, row] = t
                lv = lse[b, h, row]
                if lv != NEG_INF:                            # fully masked row: P = 0
                    l2 = lv * float32(LOG2E)
            lse2_r[r] = l2
            h_row[r] = uint64(0)
            if HAS_DROPOUT:
                h_row[r] = fmix(h_bh ^ uint64(row))

    return dq_row_stats


def stage_rows(block_q, threads):
    """``stage_rows``: the dK/dV kernels (half-precision and 3xTF32) put a Q tile's lse (as
    log2, +inf outside [0, n_q) and for fully masked rows, so that P = 0) and delta into shared
    memory, ``block_q`` rows by ``threads`` threads."""
    from numba import cuda, float32
    BQ, THREADS = block_q, threads
    ROUNDS = -(-BQ // THREADS)
    NEG_INF = float32(-math.inf)
    POS_INF = float32(math.inf)

    @cuda.jit(device=True, inline=True)
    def stage_rows(lse, delta, b, h, row_start, nq, rowv, base, tid):
        # -- lse2 (+inf outside [0, n_q) and for fully masked rows: P = 0) and delta --
        for i in range(ROUNDS):
            r = tid + i * THREADS
            if r < BQ:
                row = row_start + r
                l2 = POS_INF
                dl = float32(0.0)
                if row < nq:
                    lv = lse[b, h, row]
                    if lv != NEG_INF:
                        l2 = lv * float32(LOG2E)
                    dl = delta[b, h, row]
                rowv[base + r] = l2
                rowv[base + BQ + r] = dl

    return stage_rows
