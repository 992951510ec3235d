"""The naive, materialised attention in float64: the ground truth every other path is tested against.

It builds the full ``[Nq, Nk]`` score matrix, applies every mask at once, and differentiates
analytically. It is slow and memory-hungry on purpose: nothing here is tiled or fused.

Arrays use the grouped layout shared with :mod:`ioaware.tiled`:
``q [B, G, R, Nq, d]``, ``k [B, G, 1, Nk, d]``, ``v [B, G, 1, Nk, dv]`` (G = KV heads, R = query
heads per KV head; ``dv`` may differ from ``d``),
``allowed`` (bool, broadcastable to ``[B, G, R, Nq, Nk]``) or None, ``bias`` (float, same
broadcast) or None, ``bh [B, G, R]`` flat batch-head indices for the dropout hash.
"""
from __future__ import annotations

import numpy as np

from .dropout import keep_mask

__all__ = ["reference_forward", "reference_backward"]


def _probabilities(q, k, *, scale, allowed, bias):
    s = np.einsum("bgrid,bgujd->bgrij", q.astype(np.float64), k.astype(np.float64)) * scale
    if bias is not None:
        s = s + np.asarray(bias, dtype=np.float64)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    row_max = s.max(axis=-1, keepdims=True)
    row_max_safe = np.where(np.isneginf(row_max), 0.0, row_max)
    e = np.exp(s - row_max_safe)
    row_sum = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(row_sum > 0, e / np.where(row_sum > 0, row_sum, 1.0), 0.0)
        lse = np.where(row_sum[..., 0] > 0, row_max_safe[..., 0] + np.log(row_sum[..., 0]), -np.inf)
    return p, lse


def _dropout_factor(p, bh, dropout_p, seed):
    if dropout_p == 0.0:
        return None
    if dropout_p >= 1.0:
        return np.zeros(p.shape[-2:])
    nq, nk = p.shape[-2:]
    keep = keep_mask(seed, dropout_p, bh[..., None, None], np.arange(nq)[:, None], np.arange(nk)[None, :])
    return keep / (1.0 - dropout_p)


def reference_forward(q, k, v, *, scale, allowed=None, bias=None, bh=None, dropout_p=0.0, seed=0):
    """Materialised attention in float64. Returns ``(out float64, lse float64)``.

    A row with no allowed key gets ``out = 0`` and ``lse = -inf``.
    """
    p, lse = _probabilities(q, k, scale=scale, allowed=allowed, bias=bias)
    factor = _dropout_factor(p, bh, dropout_p, seed)
    z = p if factor is None else p * factor
    out = np.einsum("bgrij,bgujd->bgrid", z, v.astype(np.float64))
    return out, lse


def reference_backward(q, k, v, dout, *, scale, allowed=None, bias=None, bh=None, dropout_p=0.0, seed=0):
    """Analytic gradients of :func:`reference_forward` in float64: ``(dq, dk, dv)``.

    ``dk``/``dv`` are summed over the R query heads that share a KV head (GQA).
    """
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, dout))
    p, _ = _probabilities(q64, k64, scale=scale, allowed=allowed, bias=bias)
    factor = _dropout_factor(p, bh, dropout_p, seed)
    z = p if factor is None else p * factor
    dv = np.einsum("bgrij,bgrid->bgjd", z, do64)[:, :, None]
    dz = np.einsum("bgrid,bgujd->bgrij", do64, v64)
    dp = dz if factor is None else dz * factor
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = scale * np.einsum("bgrij,bgujd->bgrid", ds, k64)
    dk = scale * np.einsum("bgrij,bgrid->bgjd", ds, q64)[:, :, None]
    return dq, dk, dv
