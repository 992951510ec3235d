"""The tiled FlashAttention-2 algorithm in NumPy: forward and backward, exact, vectorised over heads.

This is the algorithm stated once, in code meant to be read next to the paper:

* forward — outer loop over Q blocks, K/V blocks streamed through the inner loop, an online
  softmax (running row max ``m_i`` and row sum ``l_i``, the accumulator rescaled as each block
  arrives), one division by ``l_i`` at the end; only ``O`` and the logsumexp are produced;
* backward — outer loop over K/V blocks, inner over the Q blocks that visited them; ``S`` and
  ``P`` are recomputed from the saved logsumexp, ``delta = rowsum(dO * O)`` replaces the softmax
  Jacobian, ``dQ`` is accumulated across K/V blocks (the kernel does this with atomics).

Which tiles are visited comes from :class:`ioaware.block_info.BlockInfo` alone (causal and
block-sparse skipping). All arithmetic is float32 whatever the input dtype.

Layout (shared with :mod:`ioaware.reference`): ``q [B, G, R, Nq, d]``, ``k, v [B, G, 1, Nk, d]``
with G = KV heads and R = query heads per KV head (GQA); ``allowed`` bool and ``bias`` float,
each None or broadcastable to ``[B, G, R, Nq, Nk]``; ``bh [B, G, R]`` flat batch-head indices
used by the dropout hash.
"""
from __future__ import annotations

import numpy as np

from .block_info import BlockInfo
from .dropout import keep_mask

__all__ = ["tiled_forward", "tiled_backward"]

F32 = np.float32


def _tile(x, rows, cols):
    """Slice an optional broadcastable ``[..., Nq|1, Nk|1]`` array to a tile."""
    if x is None:
        return None
    r = rows if x.shape[-2] != 1 else slice(None)
    c = cols if x.shape[-1] != 1 else slice(None)
    return x[..., r, c]


def _scores(qi_scaled, kj, info, m, n, rows, cols, allowed, bias):
    """S tile with every mask applied (masked entries are -inf)."""
    # -- compute qk --
    s = qi_scaled @ np.swapaxes(kj, -1, -2)
    # -- apply additive bias and masks --
    if bias is not None:
        s = s + _tile(bias, rows, cols).astype(F32)
    keep = None
    if info.tile_needs_mask(m, n):
        keep = np.arange(cols.start, cols.stop)[None, :] <= np.arange(rows.start, rows.stop)[:, None]
    if allowed is not None:
        a = _tile(allowed, rows, cols)
        keep = a if keep is None else (keep & a)
    if keep is not None:
        s = np.where(keep, s, -np.inf).astype(F32, copy=False)
    return s


def _dropout_scale(bh, rows, cols, dropout_p, seed):
    keep = keep_mask(seed, dropout_p, bh[..., None, None],
                     np.arange(rows.start, rows.stop)[:, None], np.arange(cols.start, cols.stop)[None, :])
    return keep.astype(F32) * F32(1.0 / (1.0 - dropout_p))


def tiled_forward(q, k, v, *, scale, info: BlockInfo, allowed=None, bias=None, bh=None,
                  dropout_p=0.0, seed=0):
    """FlashAttention-2 forward. Returns ``(out float32 [B,G,R,Nq,d], lse float32 [B,G,R,Nq])``.

    A row with no allowed key in any visited tile gets ``out = 0`` and ``lse = -inf``.
    """
    lead = q.shape[:-2]
    nq, d = q.shape[-2:]
    out = np.empty(lead + (nq, v.shape[-1]), dtype=F32)
    lse = np.empty(lead + (nq,), dtype=F32)
    for m in range(info.n_blocks_q):
        rows = slice(*info.q_range(m))
        qi = q[..., rows, :].astype(F32) * F32(scale)
        n_rows = rows.stop - rows.start
        m_i = np.full(lead + (n_rows,), -np.inf, dtype=F32)
        l_i = np.zeros(lead + (n_rows,), dtype=F32)
        acc = np.zeros(lead + (n_rows, v.shape[-1]), dtype=F32)
        for n in info.k_blocks(m):
            cols = slice(*info.k_range(n))
            kj = k[..., cols, :].astype(F32)
            vj = v[..., cols, :].astype(F32)
            s = _scores(qi, kj, info, m, n, rows, cols, allowed, bias)
            # -- update m_i and l_i --
            m_new = np.maximum(m_i, s.max(axis=-1))
            m_safe = np.where(np.isneginf(m_new), F32(0), m_new)
            p = np.exp(s - m_safe[..., None])
            alpha = np.exp(m_i - m_safe)
            l_i = l_i * alpha + p.sum(axis=-1)
            # -- dropout: the normaliser l_i counts every probability, the output only kept ones --
            if dropout_p > 0.0:
                p = p * _dropout_scale(bh, rows, cols, dropout_p, seed)
            # -- update output accumulator --
            acc = acc * alpha[..., None] + p @ vj
            m_i = m_new
        # -- epilogue: one rescale, logsumexp --
        empty = l_i == 0
        l_safe = np.where(empty, F32(1), l_i)
        out[..., rows, :] = np.where(empty[..., None], F32(0), acc / l_safe[..., None])
        lse[..., rows] = np.where(empty, F32(-np.inf), m_i + np.log(l_safe))
    return out, lse


def tiled_backward(q, k, v, out, lse, dout, *, scale, info: BlockInfo, allowed=None, bias=None,
                   bh=None, dropout_p=0.0, seed=0):
    """FlashAttention-2 backward with recomputation. Returns float32 ``(dq, dk, dv)``.

    ``dk``/``dv`` have the KV layout ``[B, G, 1, Nk, d]``: contributions of the R query heads
    sharing a KV head are summed.
    """
    f32 = lambda x: x.astype(F32, copy=False)  # noqa: E731
    delta = np.sum(f32(dout) * f32(out), axis=-1)            # rowsum(dO * O)  [B,G,R,Nq]
    lse_safe = np.where(np.isneginf(lse), F32(0), f32(lse))
    dq = np.zeros(q.shape, dtype=F32)
    dk = np.zeros(k.shape, dtype=F32)
    dv = np.zeros(v.shape, dtype=F32)
    for n in range(info.n_blocks_k):
        cols = slice(*info.k_range(n))
        kj = f32(k[..., cols, :])
        vj = f32(v[..., cols, :])
        dk_j = np.zeros(kj.shape, dtype=F32)
        dv_j = np.zeros(vj.shape, dtype=F32)
        for m in info.q_blocks(n):
            rows = slice(*info.q_range(m))
            qi = f32(q[..., rows, :])
            doi = f32(dout[..., rows, :])
            # -- recompute S and P from the logsumexp --
            s = _scores(qi * F32(scale), kj, info, m, n, rows, cols, allowed, bias)
            p = np.exp(s - lse_safe[..., rows, None])
            drop = _dropout_scale(bh, rows, cols, dropout_p, seed) if dropout_p > 0.0 else None
            z = p if drop is None else p * drop
            # -- dV += Z^T dO  (summed over the query heads sharing this KV head) --
            dv_j += np.sum(np.swapaxes(z, -1, -2) @ doi, axis=-3, keepdims=True)
            # -- dP = dO V^T, dS = P * (dP - delta) --
            dp = doi @ np.swapaxes(vj, -1, -2)
            if drop is not None:
                dp = dp * drop
            ds = p * (dp - delta[..., rows, None])
            # -- dQ += scale * dS K ; dK += scale * dS^T Q --
            dq[..., rows, :] += F32(scale) * (ds @ kj)
            dk_j += F32(scale) * np.sum(np.swapaxes(ds, -1, -2) @ qi, axis=-3, keepdims=True)
        dk[..., cols, :] = dk_j
        dv[..., cols, :] = dv_j
    return dq, dk, dv
