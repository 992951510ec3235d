"""The public attention API: exact attention, forward and backward, on NumPy arrays and torch tensors.

* :func:`attention` — FlashAttention-style attention with causal, boolean and block-sparse masks,
  dropout, GQA/MQA and cross attention; differentiable for torch tensors.
* :func:`attention_backward` — the gradients ``(dq, dk, dv)`` from ``(q, k, v, out, lse, dout)``.
* :func:`scaled_dot_product_attention` — a drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

Backends: ``"numpy"`` (the tiled algorithm of :mod:`ioaware.tiled`, on the CPU), ``"reference"``
(the materialised float64 computation of :mod:`ioaware.reference`), ``"numba"`` (the fused CUDA
kernels of the ``kernels`` package) and ``"auto"`` (``"numba"`` for CUDA tensors, ``"numpy"``
otherwise). Inputs come back as they came in: same type, device and dtype.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ._inputs import BlockMask, Problem, check_inputs, is_torch, torch_or_none
from .block_info import BlockInfo
from .reference import reference_backward, reference_forward
from .tiled import tiled_backward, tiled_forward

__all__ = ["attention", "attention_backward", "scaled_dot_product_attention", "BlockMask",
           "BACKENDS", "DEFAULT_BLOCK_Q", "DEFAULT_BLOCK_K"]

BACKENDS = ("auto", "numpy", "reference", "numba")
DEFAULT_BLOCK_Q = 64   # tile sizes of the NumPy path when none are given
DEFAULT_BLOCK_K = 64


# ------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------
def attention(q, k, v, *, causal=False, mask=None, block_mask=None, scale=None, dropout_p=0.0,
              seed=None, return_lse=False, block_q=None, block_k=None, backend="auto"):
    """Exact scaled dot-product attention, computed tile by tile without materialising ``QK^T``.

    Parameters
    ----------
    q : array ``[..., Hq, Nq, d]`` (also ``[Nq, d]`` and ``[Hq, Nq, d]``); NumPy float16/float32
        or torch float16/bfloat16/float32. Arithmetic accumulates in float32.
    k, v : arrays ``[..., Hkv, Nk, d]`` with the same leading dimensions and dtype as ``q``;
        ``Hq`` must be a multiple of ``Hkv`` (GQA/MQA: query head h uses KV head
        ``h // (Hq // Hkv)``). ``Nk`` may differ from ``Nq`` (cross attention).
    causal : top-left aligned causal mask, as ``torch.nn.functional.scaled_dot_product_attention``:
        query row i attends to key columns j <= i.
    mask : boolean array broadcastable to ``[..., Hq, Nq, Nk]``; True = may attend.
    block_mask : :class:`BlockMask` (or ``(mask, (block_q, block_k))``, or a boolean array with
        ``block_q``/``block_k`` given): tiles marked False are never computed.
    scale : multiplier of ``QK^T``; default ``1 / sqrt(d)``.
    dropout_p, seed : dropout on the attention probabilities. The keep mask is a hash of
        ``(seed, batch-head, row, column)`` (see :mod:`ioaware.dropout`), so the same seed gives
        the same mask on every backend and in the backward. ``seed=None`` draws one at random.
    return_lse : also return the float32 logsumexp ``[..., Hq, Nq]`` of the scaled, masked logits.
    block_q, block_k : tile sizes (rows of Q, columns of K per tile).
    backend : ``"auto"``, ``"numpy"``, ``"reference"`` or ``"numba"``.

    Returns
    -------
    ``out`` (like ``q``), or ``(out, lse)`` with ``return_lse=True``.

    A query row that may attend to no key at all returns zeros and logsumexp ``-inf``, never NaN.
    Torch tensors that require grad get gradients through a ``torch.autograd.Function`` that saves
    ``q, k, v, out, lse`` only.
    """
    backend = _resolve_backend(backend, q)
    pb = check_inputs(q, k, v, causal=causal, mask=mask, block_mask=block_mask, scale=scale,
                      dropout_p=dropout_p, seed=seed, block_q=block_q, block_k=block_k)
    out, lse = _apply(pb, q, k, v, backend)
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, out, lse, dout, *, causal=False, mask=None, block_mask=None,
                       scale=None, dropout_p=0.0, seed=None, block_q=None, block_k=None, backend="auto"):
    """Gradients of :func:`attention`: returns ``(dq, dk, dv)`` shaped like ``q, k, v``.

    ``out`` and ``lse`` are what the forward returned (``return_lse=True``); ``dout`` is the
    gradient of the loss with respect to ``out``. The keyword arguments must be the forward's
    (with dropout, the same ``seed``). ``S`` and ``P`` are recomputed tile by tile from ``lse``.
    """
    backend = _resolve_backend(backend, q)
    if dropout_p and seed is None:
        raise ValueError("attention_backward with dropout needs the forward's seed")
    pb = check_inputs(q, k, v, causal=causal, mask=mask, block_mask=block_mask, scale=scale,
                      dropout_p=dropout_p, seed=seed, block_q=block_q, block_k=block_k)
    _check_like("out", out, q, tuple(q.shape))
    _check_like("dout", dout, q, tuple(q.shape))
    _check_like("lse", lse, q, tuple(q.shape[:-1]))
    return _backward(pb, out, lse, dout, backend)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` with the same semantics.

    ``attn_mask`` is boolean (True = may attend) or a float tensor added to the scaled scores.
    ``enable_gqa=True`` allows fewer key/value heads than query heads. Differences from PyTorch:
    a row with no allowed key returns zeros (not NaN); gradients do not flow into a float
    ``attn_mask``; the dropout mask comes from :mod:`ioaware.dropout` (a fresh seed per call,
    drawn from torch's generator so ``torch.manual_seed`` makes it reproducible).
    """
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal cannot both be set (as in PyTorch)")
    if query.ndim >= 3 and key.ndim >= 3 and query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise ValueError(f"query has {query.shape[-3]} heads but key has {key.shape[-3]}; "
                         "pass enable_gqa=True for grouped-query attention")
    mask = bias = None
    if attn_mask is not None:
        if str(attn_mask.dtype) in ("bool", "torch.bool"):
            mask = attn_mask
        else:
            if getattr(attn_mask, "requires_grad", False):
                raise ValueError("attn_mask requires grad, but gradients do not flow into attn_mask here")
            bias = attn_mask
    backend = _resolve_backend("auto", query)
    if bias is not None and backend == "numba":
        mask, bias = _bias_as_mask(bias), None
    pb = check_inputs(query, key, value, causal=is_causal, mask=mask, bias=bias, scale=scale,
                      dropout_p=dropout_p, seed=None)
    out, _ = _apply(pb, query, key, value, backend)
    return out


# ------------------------------------------------------------------------------------------------
# dispatch
# ------------------------------------------------------------------------------------------------
def _resolve_backend(backend, q):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        on_cuda = is_torch(q) and q.device.type == "cuda"
        return "numba" if on_cuda else "numpy"
    return backend


def _check_like(name, x, q, shape):
    if is_torch(x) != is_torch(q):
        raise TypeError(f"{name} must be the same type as q ({type(q).__name__}), got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")


def _bias_as_mask(bias):
    """A float mask whose entries are all 0 or -inf, as a boolean mask (the kernels take no bias)."""
    torch = torch_or_none()
    finite = torch.isfinite(bias)
    if not bool(((bias == 0) | (~finite & (bias < 0))).all()):
        raise NotImplementedError("the numba backend supports boolean masks and float masks of 0/-inf only; "
                                  "use backend='numpy' for a general additive attn_mask")
    return finite


def _apply(pb: Problem, q, k, v, backend):
    """Forward, through autograd when a torch input requires grad."""
    torch = torch_or_none()
    if pb.kind == "torch" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        meta = dataclasses.replace(pb, q=None, k=None, v=None)
        return _attention_function().apply(q, k, v, meta, backend)
    out4, lse3 = _forward(pb, backend)
    return pb.restore_q(out4), pb.restore_lse(lse3)


def _forward(pb: Problem, backend):
    """Canonical forward: ``(out [B,Hq,Nq,d], lse [B,Hq,Nq])`` in the inputs' type and device."""
    if backend == "numba":
        if pb.bias is not None:
            raise NotImplementedError("the numba backend takes boolean masks, not an additive bias")
        import kernels
        out, lse = kernels.forward(_kernel_problem(pb))
        return _from_device(pb, out), _from_device(pb, lse, lse=True)
    q, k, v = (_host(x) for x in (pb.q, pb.k, pb.v))
    g = _Grouped(pb, q, k, v)
    if backend == "reference":
        out, lse = reference_forward(g.q, g.k, g.v, scale=pb.scale, allowed=g.allowed_full(),
                                     bias=g.bias, bh=g.bh, dropout_p=pb.dropout_p, seed=pb.seed)
    else:
        out = np.empty(g.q.shape, dtype=np.float32)
        lse = np.empty(g.q.shape[:-1], dtype=np.float32)
        for sel, info in g.groups():
            o, l_ = tiled_forward(g.q[sel], g.k[sel[:2]], g.v[sel[:2]], scale=pb.scale, info=info,
                                  allowed=_sel(g.allowed, sel), bias=_sel(g.bias, sel), bh=g.bh[sel],
                                  dropout_p=pb.dropout_p, seed=pb.seed)
            out[sel], lse[sel] = o, l_
    return _to_user(pb, out.reshape(pb.q.shape)), _to_user(pb, lse.reshape(pb.q.shape[:-1]), lse=True)


def _backward(pb: Problem, out, lse, dout, backend):
    """Gradients in the user's layout from user-shaped ``out``, ``lse``, ``dout``."""
    shape4, shape3 = tuple(pb.q.shape), tuple(pb.q.shape[:-1])
    if backend == "numba":
        import kernels
        o, l_, do = (_device_input(pb, x.reshape(s)) for x, s in ((out, shape4), (lse, shape3), (dout, shape4)))
        dq, dk, dv = kernels.backward(_kernel_problem(pb), o, l_, do)
        dq, dk, dv = (_from_device(pb, x) for x in (dq, dk, dv))
    else:
        q, k, v = (_host(x) for x in (pb.q, pb.k, pb.v))
        o, l_, do = _host(out.reshape(shape4)), _host(lse.reshape(shape3)), _host(dout.reshape(shape4))
        g = _Grouped(pb, q, k, v)
        o5, do5 = g.as_q(o), g.as_q(do)
        l5 = l_.reshape(g.q.shape[:-1])
        if backend == "reference":
            dq, dk, dv = reference_backward(g.q, g.k, g.v, do5, scale=pb.scale, allowed=g.allowed_full(),
                                            bias=g.bias, bh=g.bh, dropout_p=pb.dropout_p, seed=pb.seed)
        else:
            dq = np.zeros(g.q.shape, dtype=np.float32)
            dk = np.zeros(g.k.shape, dtype=np.float32)
            dv = np.zeros(g.v.shape, dtype=np.float32)
            for sel, info in g.groups():
                kv = sel[:2]
                dq_, dk_, dv_ = tiled_backward(g.q[sel], g.k[kv], g.v[kv], o5[sel], l5[sel], do5[sel],
                                               scale=pb.scale, info=info, allowed=_sel(g.allowed, sel),
                                               bias=_sel(g.bias, sel), bh=g.bh[sel],
                                               dropout_p=pb.dropout_p, seed=pb.seed)
                dq[sel] = dq_
                dk[kv] += dk_
                dv[kv] += dv_
        dq = _to_user(pb, dq.reshape(shape4))
        dk, dv = (_to_user(pb, x.reshape(pb.k.shape)) for x in (dk, dv))
    return pb.restore_q(dq), pb.restore_kv(dk), pb.restore_kv(dv)


def _kernel_problem(pb: Problem) -> Problem:
    """The problem as the kernels take it: torch CUDA tensors as they are; anything else as
    NumPy arrays (bfloat16 as float32), which the kernels copy to the device and back."""
    if pb.kind == "torch" and pb.device.startswith("cuda"):
        return pb
    q, k, v = (_host(x) for x in (pb.q, pb.k, pb.v))
    return dataclasses.replace(pb, q=q, k=k, v=v, mask=_host(pb.mask), kind="numpy",
                               device="cpu", dtype=q.dtype)


def _device_input(pb: Problem, x):
    """What the kernels take: torch CUDA tensors as they are, anything else as NumPy."""
    if pb.kind == "torch" and pb.device.startswith("cuda"):
        return x
    return _host(x)


def _from_device(pb: Problem, x, lse=False):
    if pb.kind == "torch" and pb.device.startswith("cuda"):
        return x
    return _to_user(pb, np.asarray(x), lse=lse)


def _host(x):
    """A NumPy view/copy of an array for the host paths (bfloat16 becomes float32)."""
    if x is None or isinstance(x, np.ndarray):
        return x
    torch = torch_or_none()
    x = x.detach().cpu()
    if x.dtype == torch.bfloat16:
        x = x.float()
    return x.numpy()


def _to_user(pb: Problem, x, lse=False):
    """Cast a host result to the user's type, device and dtype (logsumexp stays float32)."""
    if pb.kind == "numpy":
        return x.astype(np.float32 if lse else pb.dtype, copy=False)
    torch = torch_or_none()
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    return t.to(device=pb.device, dtype=torch.float32 if lse else pb.dtype)


class _Grouped:
    """Host arrays in the grouped GQA layout ``[B, G, R, N, d]`` used by the tiled and reference paths."""

    def __init__(self, pb: Problem, q, k, v):
        self.pb = pb
        b, g, r = pb.batch, pb.heads_kv, pb.group
        self.q = q.reshape(b, g, r, pb.seqlen_q, pb.head_dim)
        self.k = k.reshape(b, g, 1, pb.seqlen_k, pb.head_dim)
        self.v = v.reshape(b, g, 1, pb.seqlen_k, pb.head_dim)
        self.bh = np.arange(b * pb.heads_q, dtype=np.int64).reshape(b, g, r)
        self.allowed = self._as5(_host(pb.mask))
        self.bias = self._as5(_host(pb.bias))
        if self.bias is not None:
            self.bias = self.bias.astype(np.float32, copy=False)

    def as_q(self, x):
        return x.reshape(self.q.shape)

    def _as5(self, x4):
        if x4 is None:
            return None
        bm, hm, mq, nk = x4.shape
        if hm == 1:
            return x4.reshape(bm, 1, 1, mq, nk)
        return x4.reshape(bm, self.pb.heads_kv, self.pb.group, mq, nk)

    def _info(self, block_mask2d=None):
        pb = self.pb
        return BlockInfo.with_block_mask(pb.seqlen_q, pb.seqlen_k, pb.block_q or DEFAULT_BLOCK_Q,
                                         pb.block_k or DEFAULT_BLOCK_K, pb.causal, block_mask2d)

    def groups(self):
        """``(selector, BlockInfo)`` pairs: one per distinct block-mask slice (one if none)."""
        bm = self.pb.block_mask
        if bm is None:
            yield (slice(None),) * 3, self._info()
            return
        nb, nh = bm.shape[:2]
        for ib in range(nb):
            for ih in range(nh):
                sb = slice(ib, ib + 1) if nb > 1 else slice(None)
                if nh > 1:
                    ig, ir = divmod(ih, self.pb.group)
                    sg, sr = slice(ig, ig + 1), slice(ir, ir + 1)
                else:
                    sg = sr = slice(None)
                yield (sb, sg, sr), self._info(bm[ib, ih])

    def allowed_full(self):
        """Every mask as one elementwise boolean array (for the reference), or None."""
        pb = self.pb
        allowed = self.allowed
        if pb.causal:
            c = np.arange(pb.seqlen_k)[None, :] <= np.arange(pb.seqlen_q)[:, None]
            allowed = c if allowed is None else (allowed & c)
        if pb.block_mask is not None:
            expanded = BlockMask(pb.block_mask, pb.block_q, pb.block_k).expand(pb.seqlen_q, pb.seqlen_k)
            e5 = self._as5(expanded)
            allowed = e5 if allowed is None else (allowed & e5)
        return allowed


def _sel(x, sel):
    """Apply a ``(batch, group, row-head)`` selector to an array whose size-1 dims broadcast."""
    if x is None:
        return None
    return x[tuple(s if x.shape[i] != 1 else slice(None) for i, s in enumerate(sel))]


# ------------------------------------------------------------------------------------------------
# autograd
# ------------------------------------------------------------------------------------------------
@functools.cache
def _attention_function():
    """The ``torch.autograd.Function``, built on first use so that importing ioaware needs no torch."""
    torch = torch_or_none()

    class AttentionFunction(torch.autograd.Function):
        """Saves ``q, k, v, out, lse`` only; the backward recomputes S and P from ``lse``."""

        @staticmethod
        def forward(ctx, q, k, v, meta, backend):
            pb = dataclasses.replace(meta, q=_meta_view(q, meta), k=_meta_view(k, meta, kv=True),
                                     v=_meta_view(v, meta, kv=True))
            out4, lse3 = _forward(pb, backend)
            out, lse = meta.restore_q(out4), meta.restore_lse(lse3)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.meta, ctx.backend = meta, backend
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, dout, _dlse):
            q, k, v, out, lse = ctx.saved_tensors
            meta = ctx.meta
            pb = dataclasses.replace(meta, q=_meta_view(q, meta), k=_meta_view(k, meta, kv=True),
                                     v=_meta_view(v, meta, kv=True))
            dq, dk, dv = _backward(pb, out, lse, dout.contiguous(), ctx.backend)
            return dq, dk, dv, None, None

    return AttentionFunction


def _meta_view(x, meta: Problem, kv=False):
    """The canonical ``[B, H, N, d]`` view of a user tensor described by ``meta``."""
    heads = meta.heads_kv if kv else meta.heads_q
    n = meta.seqlen_k if kv else meta.seqlen_q
    return x.detach().reshape(meta.batch, heads, n, meta.head_dim)

