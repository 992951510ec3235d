"""The tiled FlashAttention-2 algorithm in NumPy: forward and backward, exact, vectorised over heads.

This is the algorithm stated once, in code meant to be read next to the paper:

* forward — outer loop over Q blocks, K/V blocks streamed through the inner loop, an online
  softmax (running row max ``m_i`` and row sum ``l_i``, the accumulator rescaled as each block
  arrives), one division by ``l_i`` at the end; only ``O`` and the logsumexp are produced;
* backward — outer loop over K/V blocks, inner over the Q blocks that visited them; ``S`` and
  ``P`` are recomputed from the saved logsumexp, ``delta = rowsum(dO * O)`` replaces the softmax
  Jacobian, ``dQ`` is accumulated across K/V blocks (the kernel does this with atomics).

Which tiles are visited, and the positional mask inside a tile (causal, sliding window), come
from :class:`ioaware.block_info.BlockInfo` alone (causal skipping in either alignment, window
skipping, block-sparse skipping). Arithmetic is float32 for float16/float32 inputs and float64
for float64 inputs (:func:`compute_dtype`).

Layout (shared with :mod:`ioaware.reference`): ``q [B, G, R, Nq, d]``, ``k [B, G, 1, Nk, d]``,
``v [B, G, 1, Nk, dv]`` (``dv`` may differ from ``d``) with G = KV heads and R = query heads per KV head (GQA); ``allowed`` bool and ``bias`` float,
each None or broadcastable to ``[B, G, R, Nq, Nk]``; ``bh [B, G, R]`` flat batch-head indices
used by the dropout hash.
"""
from __future__ import annotations

import numpy as np

from .block_info import BlockInfo
from .dropout import keep_mask

__all__ = ["tiled_forward", "tiled_backward", "compute_dtype", "DEFAULT_BLOCK_Q", "DEFAULT_BLOCK_K"]

DEFAULT_BLOCK_Q = 64   # tile sizes of the NumPy path when none are given
DEFAULT_BLOCK_K = 64


def compute_dtype(dtype) -> type:
    """The accumulation dtype for inputs of ``dtype``: float64 for float64, float32 otherwise."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def _tile(x, rows, cols):
    """Slice an optional broadcastable ``[..., Nq|1, Nk|1]`` array to a tile."""
    if x is None:
        return None
    r = rows if x.shape[-2] != 1 else slice(None)
    c = cols if x.shape[-1] != 1 else slice(None)
    return x[..., r, c]


def _scores(qi_scaled, kj, info, m, n, rows, cols, allowed, bias):
    """S tile with every mask applied (masked entries are -inf)."""
    acc = qi_scaled.dtype
    # -- compute qk --
    s = qi_scaled @ np.swapaxes(kj, -1, -2)
    # -- apply additive bias and masks --
    if bias is not None:
        s = s + _tile(bias, rows, cols).astype(acc, copy=False)
    keep = info.tile_position_mask(m, n)       # causal diagonal, window edges
    if allowed is not None:
        a = _tile(allowed, rows, cols)
        keep = a if keep is None else (keep & a)
    if keep is not None:
        s = np.where(keep, s, -np.inf).astype(acc, copy=False)
    return s


def _dropout_scale(bh, rows, cols, dropout_p, seed, acc):
    """Kept entries scaled by ``1 / (1 - p)``, dropped ones 0 (all 0 for ``p = 1``)."""
    if dropout_p >= 1.0:
        return np.zeros(bh.shape + (rows.stop - rows.start, cols.stop - cols.start), dtype=acc)
    keep = keep_mask(seed, dropout_p, bh[..., None, None],
                     np.arange(rows.start, rows.stop)[:, None], np.arange(cols.start, cols.stop)[None, :])
    return keep.astype(acc) * acc(1.0 / (1.0 - dropout_p))


def tiled_forward(q, k, v, *, scale, info: BlockInfo, allowed=None, bias=None, bh=None,
                  dropout_p=0.0, seed=0):
    """FlashAttention-2 forward. Returns ``(out [B,G,R,Nq,dv], lse [B,G,R,Nq])`` in
    :func:`compute_dtype` of ``q``.

    A row with no allowed key in any visited tile gets ``out = 0`` and ``lse = -inf``.
    """
    F = compute_dtype(q.dtype)
    lead = q.shape[:-2]
    nq = q.shape[-2]
    out = np.empty(lead + (nq, v.shape[-1]), dtype=F)
    lse = np.empty(lead + (nq,), dtype=F)
    for m in range(info.n_blocks_q):
        rows = slice(*info.q_range(m))
        qi = q[..., rows, :].astype(F) * F(scale)
        n_rows = rows.stop - rows.start
        m_i = np.full(lead + (n_rows,), -np.inf, dtype=F)
        l_i = np.zeros(lead + (n_rows,), dtype=F)
        acc = np.zeros(lead + (n_rows, v.shape[-1]), dtype=F)
        for n in info.k_blocks(m):
            cols = slice(*info.k_range(n))
            kj = k[..., cols, :].astype(F)
            vj = v[..., cols, :].astype(F)
            s = _scores(qi, kj, info, m, n, rows, cols, allowed, bias)
            # -- update m_i and l_i --
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_safe = np.where(np.isneginf(m_new), F(0), m_new)
            p = np.exp(s - m_safe[..., None])
            alpha = np.exp(m_i - m_safe)
            l_i = l_i * alpha + p.sum(axis=-1)
            # -- dropout: the normaliser l_i counts every probability, the output only kept ones --
            if dropout_p > 0.0:
                p = p * _dropout_scale(bh, rows, cols, dropout_p, seed, F)
            # -- update output accumulator --
            acc = acc * alpha[..., None] + p @ vj
            m_i = m_new
        # -- epilogue: one rescale, logsumexp --
        empty = l_i == 0
        l_safe = np.where(empty, F(1), l_i)
        out[..., rows, :] = np.where(empty[..., None], F(0), acc / l_safe[..., None])
        lse[..., rows] = np.where(empty, F(-np.inf), m_i + np.log(l_safe))
    return out, lse


def tiled_backward(q, k, v, out, lse, dout, *, scale, info: BlockInfo, allowed=None, bias=None,
                   bh=None, dropout_p=0.0, seed=0):
    """FlashAttention-2 backward with recomputation. Returns ``(dq, dk, dv)`` in
    :func:`compute_dtype` of ``q``.

    ``dk``/``dv`` have the KV layout ``[B, G, 1, Nk, d]``: contributions of the R query heads
    sharing a KV head are summed.
    """
    F = compute_dtype(q.dtype)
    cast = lambda x: x.astype(F, copy=False)  # noqa: E731
    delta = np.sum(cast(dout) * cast(out), axis=-1)          # rowsum(dO * O)  [B,G,R,Nq]
    lse_safe = np.where(np.isneginf(lse), F(0), cast(lse))
    dq = np.zeros(q.shape, dtype=F)
    dk = np.zeros(k.shape, dtype=F)
    dv = np.zeros(v.shape, dtype=F)
    for n in range(info.n_blocks_k):
        cols = slice(*info.k_range(n))
        kj = cast(k[..., cols, :])
        vj = cast(v[..., cols, :])
        dk_j = np.zeros(kj.shape, dtype=F)
        dv_j = np.zeros(vj.shape, dtype=F)
        for m in info.q_blocks(n):
            rows = slice(*info.q_range(m))
            qi = cast(q[..., rows, :])
            doi = cast(dout[..., rows, :])
            # -- recompute S and P from the logsumexp --
            s = _scores(qi * F(scale), kj, info, m, n, rows, cols, allowed, bias)
            p = np.exp(s - lse_safe[..., rows, None])
            drop = _dropout_scale(bh, rows, cols, dropout_p, seed, F) if dropout_p > 0.0 else None
            z = p if drop is None else p * drop
            # -- dV += Z^T dO  (summed over the query heads sharing this KV head) --
            dv_j += np.sum(np.swapaxes(z, -1, -2) @ doi, axis=-3, keepdims=True)
            # -- dP = dO V^T, dS = P * (dP - delta) --
            dp = doi @ np.swapaxes(vj, -1, -2)
            if drop is not None:
                dp = dp * drop
            ds = p * (dp - delta[..., rows, None])
            # -- dQ += scale * dS K ; dK += scale * dS^T Q --
            dq[..., rows, :] += F(scale) * (ds @ kj)
            dk_j += F(scale) * np.sum(np.swapaxes(ds, -1, -2) @ qi, axis=-3, keepdims=True)
        dk[..., cols, :] = dk_j
        dv[..., cols, :] = dv_j
    return dq, dk, dv
