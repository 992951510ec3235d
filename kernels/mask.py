"""Masking of score tiles in the tensor-core kernels: the key tail, the causal diagonal, the
sliding window's band and the boolean mask, set to -inf in the C fragments of a warp's score
tile, only on tiles that need it; and `band_arguments`, the band as every kernel takes it.

* `score_mask`: a warp's 16 x block_k tile of S = Q K^T (the forwards and the dQ kernels);
* `transposed_score_mask`: a warp's tile of S^T = K Q^T (the dK/dV kernels);
* `wgmma_tile_mask`: a thread's part of a warpgroup's ``wgmma`` accumulator tile, S or S^T (the
  Hopper forward and backward).

Which tiles are visited at all (causal and block-sparse skipping) is
`ioaware.block_info.BlockInfo`'s answer, through `kernels.tile_scheduler`; these functions mask
elements inside visited tiles.
"""
from __future__ import annotations

import math

from ioaware.block_info import band_offsets

__all__ = ["score_mask", "transposed_score_mask", "wgmma_tile_mask", "band_arguments",
           "tile_needs_mask", "UNBOUNDED"]

#: An absent band bound, as the kernels take it (no |col - row| comes near it).
UNBOUNDED = 2**62


def band_arguments(problem) -> tuple[bool, bool, int, int]:
    """``(causal, window, lo, hi)`` for the kernels: without a window the problem's causal flag
    (the kernels' own top-left rule) and unused bounds; with one, causal off and the band of
    `BlockInfo.band` (window and causal rule, bottom-right aligned: key ``col`` is allowed for
    query ``row`` iff ``lo <= col - row <= hi``), absent bounds as -+`UNBOUNDED`."""
    window_size = getattr(problem, "window_size", None)
    if window_size is None:
        return bool(problem.causal), False, -UNBOUNDED, UNBOUNDED
    lo, hi = band_offsets(problem.seqlen_q, problem.seqlen_k, problem.causal,
                          problem.causal_alignment, window_size)
    return False, True, -UNBOUNDED if lo is None else lo, UNBOUNDED if hi is None else hi


def tile_needs_mask(block_q, block_k, causal, has_mask, window):
    """``needs_mask(m_blk, n_blk, band_lo, band_hi)``: whether the score tile of query block
    ``m_blk`` (``block_q`` rows) and key block ``n_blk`` (``block_k`` keys) needs an element
    mask: a boolean mask, the causal diagonal through it, or the band cutting it (its corners'
    key - query outside ``[band_lo, band_hi]``). The key tail is the caller's."""
    from numba import cuda
    BQ, BK, CAUSAL, HAS_MASK, WINDOW = block_q, block_k, causal, has_mask, window

    @cuda.jit(device=True, inline=True)
    def needs_mask(m_blk, n_blk, band_lo, band_hi):
        needs = HAS_MASK
        if CAUSAL:
            needs = needs or (n_blk * BK + BK - 1 > m_blk * BQ)
        if WINDOW:
            needs = needs or (n_blk * BK - (m_blk * BQ + BQ - 1) < band_lo) or (
                n_blk * BK + BK - 1 - m_blk * BQ > band_hi)
        return needs

    return needs_mask


def wgmma_tile_mask(n_blocks, causal, window, keys_are_rows=False, rows_inner=False):
    """``mask_tile(s_reg, row_a, tig, col0, n_k, band_lo, band_hi)``: -inf on one thread's
    scores of a warpgroup's ``wgmma`` accumulator tile (64 rows x 64 ``n_blocks`` columns; the
    thread's rows ``row_a`` and ``row_a + 8``, its columns ``col0 + 64 nb + 8 j + 2 tig + e`` in
    register ``32 nb + 4 j + 2 hr + e``) whose key is past ``n_k``, above the causal diagonal
    (key > query) or outside the band ``band_lo <= key - query <= band_hi`` (``window``; the
    band is not read without it). The rows are queries and the columns keys, or with
    ``keys_are_rows`` the other way round (the dK/dV kernel's S^T). Call it only on the tiles
    that need it (`tile_needs_mask`), as its own branch: inside an exponent loop the
    per-element tests become selects that every tile executes. ``rows_inner``: the loop over
    the thread's two rows inside the one over a column pair's two columns (the backward's
    order) instead of outside it (the forward's): the same stores, but the compiled code
    differs with the order, and each kernel keeps the one it was measured with."""
    from numba import cuda, float32
    NB, CAUSAL, WINDOW, KEYS_ARE_ROWS = n_blocks, causal, bool(window), keys_are_rows
    ROWS_INNER = bool(rows_inner)
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline=True)
    def mask_one(s_reg, row_a, tig, col0, n_k, band_lo, band_hi, nb, j, hr, e):
        col = col0 + 64 * nb + 8 * j + 2 * tig + e
        row = row_a + 8 * hr
        if KEYS_ARE_ROWS:
            key = row
            query = col
        else:
            key = col
            query = row
        bad = key >= n_k
        if CAUSAL:
            bad = bad or key > query
        if WINDOW:
            rel = key - query
            bad = bad or rel < band_lo or rel > band_hi
        if bad:
            s_reg[32 * nb + 4 * j + 2 * hr + e] = NEG_INF

    @cuda.jit(device=True, inline=True)
    def mask_tile(s_reg, row_a, tig, col0, n_k, band_lo, band_hi):
        for nb in range(NB):
            for j in range(8):
                if ROWS_INNER:
                    for e in range(2):
                        for hr in range(2):
                            mask_one(s_reg, row_a, tig, col0, n_k, band_lo, band_hi, nb, j,
                                     hr, e)
                else:
                    for hr in range(2):
                        for e in range(2):
                            mask_one(s_reg, row_a, tig, col0, n_k, band_lo, band_hi, nb, j,
                                     hr, e)

    return mask_tile


def score_mask(block_q, block_k, nt_s, causal, has_mask, window=False):
    """``mask_scores``: -inf on the scores of one warp's 16 x block_k tile (C fragments from
    ``s_reg[off]``, rows ``row0`` and ``row0 + 8``) that fall past the keys, above the causal
    diagonal, outside the band ``band_lo <= col - row <= band_hi`` (``window``: the sliding
    window, causal rule included, `band_arguments`) or on a False of the boolean mask — only on
    tiles that need it. Shared by the tensor-core forwards and dQ kernels; without ``window``
    the band arguments are not read."""
    from numba import cuda, float32
    BK, NT_S, CAUSAL, HAS_MASK, WINDOW = block_k, nt_s, causal, has_mask, window
    NEG_INF = float32(-math.inf)
    tile_needs = tile_needs_mask(block_q, block_k, causal, has_mask, window)

    @cuda.jit(device=True, inline=True)
    def mask_scores(s_reg, off, row0, n_blk, m_blk, col_base, b, h, n_q, n_k, mask, mask_b,
                    mask_h, mask_q, band_lo, band_hi):
        if (n_blk * BK + BK > n_k) or tile_needs(m_blk, n_blk, band_lo, band_hi):
            for nt in range(NT_S):
                for i in range(4):
                    col = col_base + nt * 8 + (i & 1)
                    row = row0 + 8 * (i >> 1)
                    bad = col >= n_k
                    if CAUSAL:
                        bad = bad or col > row
                    if WINDOW:
                        bad = bad or col - row < band_lo or col - row > band_hi
                    if HAS_MASK:
                        if not bad and row < n_q:
                            bad = mask[b * mask_b, h * mask_h, row * mask_q, col] == 0
                    if bad:
                        s_reg[off + nt * 4 + i] = NEG_INF

    return mask_scores


def transposed_score_mask(n_tiles, causal, has_mask, window=False):
    """``mask_scores_t``: -inf on the dK/dV kernels' transposed score tiles S^T (``n_tiles``
    16x8 C fragments in ``st``; keys ``key0`` and ``key0 + 8`` down, queries from ``qc0``
    across) above the causal diagonal, outside the band ``band_lo <= key - query <= band_hi``
    (``window``) or on a False of the boolean mask. Which tiles need it is the caller's
    `tile_needs_mask`."""
    from numba import cuda, float32
    NT, CAUSAL, HAS_MASK, WINDOW = n_tiles, causal, has_mask, window
    NEG_INF = float32(-math.inf)

    @cuda.jit(device=True, inline=True)
    def mask_scores_t(st, qc0, key0, b, h, n_q, n_k, mask, mask_b, mask_h, mask_q, band_lo,
                      band_hi):
        for nt in range(NT):
            for i in range(4):
                qcol = qc0 + 8 * nt + (i & 1)
                key = key0 + 8 * (i >> 1)
                bad = False
                if CAUSAL:
                    bad = key > qcol
                if WINDOW:
                    bad = bad or key - qcol < band_lo or key - qcol > band_hi
                if HAS_MASK:
                    if not bad and qcol < n_q and key < n_k:
                        bad = mask[b * mask_b, h * mask_h, qcol * mask_q, key] == 0
                if bad:
                    st[nt * 4 + i] = NEG_INF

    return mask_scores_t
