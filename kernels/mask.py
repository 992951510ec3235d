"""Masking of score tiles in the tensor-core kernels: the key tail, the causal diagonal, the
sliding window's band and the boolean mask, set to -inf in the C fragments of a warp's score
tile, only on tiles that need it; and `band_arguments`, the band as every kernel takes it.

* `score_mask`: a warp's 16 x block_k tile of S = Q K^T (the forwards and the dQ kernels);
* `transposed_score_mask`: a warp's tile of S^T = K Q^T (the dK/dV kernels).

Which tiles are visited at all (causal and block-sparse skipping) is
`ioaware.block_info.BlockInfo`'s answer, through `kernels.tile_scheduler`; these functions mask
elements inside visited tiles.
"""
from __future__ import annotations

import math

from ioaware.block_info import band_offsets

__all__ = ["score_mask", "transposed_score_mask", "band_arguments", "tile_needs_mask",
           "UNBOUNDED"]

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
