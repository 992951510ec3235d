"""The torch operators behind :func:`ioaware.attention` for torch tensors.

``torch.ops.ioaware.attention_fwd(q, k, v, mask, bias, block_mask, seed, scale, causal,
causal_alignment, window_left, window_right, dropout_p, block_q, block_k, backend) -> (out, lse)``
and
``torch.ops.ioaware.attention_bwd(q, k, v, out, lse, dout, <the same arguments>) -> (dq, dk, dv)``
are ``torch.library.custom_op`` operators:

* their implementations check the inputs once (:func:`ioaware.attention._problem`: shapes,
  dtypes, cost, the backend's refusals, then the NaN/Inf scan of CPU inputs) and run the chosen
  backend; to ``torch.compile`` they are opaque, so the data-dependent checks and the seed's
  conversion to a Python integer happen at run time, not in the traced graph;
* their fake implementations run the same shape checks on fake tensors (errors appear when
  the graph is traced) and give the output shapes and dtypes;
* the forward's autograd formula saves ``q, k, v, out, lse`` and the mask, block mask and seed
  inputs (references, not copies) and calls ``attention_bwd``, which recomputes S and P; when
  the loss also uses the logsumexp, its gradient is added (`_lse_gradients`).

``attention_fwd_impl`` is the forward operator's implementation as a plain function: eager calls
that need no gradient call it directly, without the dispatcher's overhead; eager calls that need
one go through `EagerAttention`, a plain ``torch.autograd.Function`` with the same formula that
keeps the checked problem for its backward (no dispatch, no second check); ``ioaware.attention``
hands it the prepared entry of a call whose key it already looked up. Only a traced call
(``torch.compile``) goes through the operators.

``seed`` is a 0-d int64 tensor (seeds of 2**63 and above wrap to negative values and back), so
a fresh seed can be drawn with ``torch.randint`` inside a compiled graph. The sliding window
travels as two ints, ``window_left`` and ``window_right`` (``window_size=(left, right)``; -1 =
unbounded side, both -1 = no window). Gradients do not flow into ``mask``, ``bias`` or
``block_mask``.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._inputs import lse_dtype

from . import _backends

__all__ = ["attention_fwd", "attention_bwd", "attention_fwd_impl", "EagerAttention"]


def _dense(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself where its elements are dense and do not overlap (the gradient of a
    [B, N, H, d] tensor viewed as [B, H, N, d] stays one: the kernels read through strides),
    else a contiguous copy (an expanded gradient, with a stride of 0)."""
    if x.is_contiguous():
        return x
    expect = 1
    for dim in sorted(range(x.dim()), key=x.stride):
        if x.shape[dim] == 1:
            continue
        if x.stride(dim) != expect:
            return x.contiguous()
        expect *= x.shape[dim]
    return x


def _seed(seed: torch.Tensor) -> int:
    return int(seed.item()) % 2**64


def _kwargs(mask, bias, block_mask, scale, causal, causal_alignment, window_left, window_right, dropout_p,
            block_q, block_k):
    return dict(causal=causal_alignment if causal else False, mask=mask, bias=bias, block_mask=block_mask,
                scale=scale, window_size=(window_left, window_right), dropout_p=dropout_p, block_q=block_q,
                block_k=block_k)


def _numba_mask(backend, mask, bias):
    """The kernels take no additive bias: a float mask of 0 / -inf becomes a boolean mask."""
    if backend == "numba" and bias is not None:
        allowed = _backends._bias_as_mask(bias)
        return (allowed if mask is None else mask & allowed), None
    return mask, bias


def _prepared_key(q, k, v, mask, bias, block_mask, seed, scale, causal, causal_alignment, window_left,
                  window_right, dropout_p, block_q, block_k, backend):
    """`ioaware._backends.prepared_key` of a call with the operators' arguments (the seed is
    not part of it: a call with a key has no dropout)."""
    return _backends.prepared_key(q, k, v, mask, bias, block_mask, dropout_p,
                                  (scale, causal, causal_alignment, window_left, window_right, block_q,
                                   block_k, backend))


def attention_fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], block_mask: Optional[torch.Tensor], seed: torch.Tensor,
                  scale: Optional[float], causal: bool, causal_alignment: str, window_left: int,
                  window_right: int, dropout_p: float, block_q: Optional[int], block_k: Optional[int],
                  backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward: ``(out [..., Hq, Nq, Ev], lse [..., Hq, Nq])``. A torch CUDA call
    without mask, bias, block mask or dropout is checked and prepared once per key
    (`ioaware._backends.prepared_key`: shapes, strides, dtypes, devices, flags); later calls
    with that key run the prepared kernels directly."""
    key = _prepared_key(q, k, v, mask, bias, block_mask, seed, scale, causal, causal_alignment, window_left,
                        window_right, dropout_p, block_q, block_k, backend)
    if key is not None:
        entry = _backends._PREPARED.get(key)
        if entry is not None:
            return entry.forward(q, k, v)
    backend = _backends._resolve_backend(backend, q)
    mask, bias = _numba_mask(backend, mask, bias)
    pb = _backends._problem(q, k, v, backend, cost=True, values=True, seed=_seed(seed),
                             **_kwargs(mask, bias, block_mask, scale, causal, causal_alignment, window_left,
                                       window_right, dropout_p, block_q, block_k))
    out4, lse3 = _backends._run_forward(pb, backend)
    if key is not None and key not in _backends._PREPARED:
        _backends.prepare(key, pb, backend)
    return pb.restore_q(out4), pb.restore_lse(lse3)


#: The operators launch Numba kernels whose first call compiles and copies tile schedules to the
#: device, which a CUDA graph capture cannot hold: inductor keeps them out of its CUDA graphs.
_TAGS = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)
attention_fwd = torch.library.custom_op("ioaware::attention_fwd", mutates_args=(),
                                        tags=_TAGS)(attention_fwd_impl)


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, mask, bias, block_mask, seed, scale, causal, causal_alignment, window_left,
                        window_right, dropout_p, block_q, block_k, backend):
    backend = _backends._resolve_backend(backend, q)
    # the block mask's values are not available here; it is checked when the operator runs
    pb = _backends._problem(q, k, v, backend, cost=False, values=False, seed=0,
                             **_kwargs(mask, bias, None, scale, causal, causal_alignment, window_left,
                                       window_right, dropout_p, block_q, block_k))
    lse_dt = getattr(torch, lse_dtype(pb.dtype_name))
    return q.new_empty(pb.out_shape), q.new_empty(tuple(q.shape[:-1]), dtype=lse_dt)


@torch.library.custom_op("ioaware::attention_bwd", mutates_args=(), tags=_TAGS)
def attention_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                  dout: torch.Tensor, mask: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  block_mask: Optional[torch.Tensor], seed: torch.Tensor, scale: Optional[float], causal: bool,
                  causal_alignment: str, window_left: int, window_right: int, dropout_p: float,
                  block_q: Optional[int], block_k: Optional[int],
                  backend: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention backward: ``(dq, dk, dv)`` shaped like ``q, k, v``."""
    backend = _backends._resolve_backend(backend, q)
    mask, bias = _numba_mask(backend, mask, bias)
    pb = _backends._problem(q, k, v, backend, cost=False, values=False, seed=_seed(seed),
                             **_kwargs(mask, bias, block_mask, scale, causal, causal_alignment, window_left,
                                       window_right, dropout_p, block_q, block_k))
    return _backends._run_backward(pb, out, lse, _dense(dout), backend)


@attention_bwd.register_fake
def _attention_bwd_fake(q, k, v, out, lse, dout, mask, bias, block_mask, seed, scale, causal, causal_alignment,
                        window_left, window_right, dropout_p, block_q, block_k, backend):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, mask, bias, block_mask, seed, *args = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, mask, bias, block_mask, seed)
    ctx.args = tuple(args)
    ctx.set_materialize_grads(False)     # an unused output's gradient arrives as None


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, mask, bias, block_mask, seed = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = attention_bwd(q, k, v, out, lse, dout, mask, bias, block_mask, seed, *ctx.args)
    if dlse is not None:
        dq_lse, dk_lse = _lse_gradients(q, k, lse, dlse, mask, bias, block_mask, seed, ctx.args)
        dq, dk = dq + dq_lse, dk + dk_lse
    return (dq, dk, dv) + (None,) * 13


def _lse_gradients(q, k, lse, dlse, mask, bias, block_mask, seed, args):
    """The gradient that flows through the logsumexp: with P the softmax (no dropout),
    d lse_i / d q_i = scale * (P K)_i and d lse_i / d k_j = scale * sum_i P_ij q_i. Both come
    from the operators themselves: (P K) is the attention output with K as the values, and
    P^T (dlse * Q) is the value gradient of a backward with K as the values and dlse * Q as the
    output gradient (that backward's other outputs are not used). Two more passes, run only when
    the loss uses the logsumexp."""
    scale, causal, alignment, window_left, window_right, _dropout_p, block_q, block_k, backend = args
    args_p = (scale, causal, alignment, window_left, window_right, 0.0, block_q, block_k, backend)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    w = dlse.unsqueeze(-1)
    pk, _ = attention_fwd(q, k, k, mask, bias, block_mask, seed, *args_p)
    _, _, pt_q = attention_bwd(q, k, k, pk, lse, (w * q).to(q.dtype), mask, bias, block_mask,
                               seed, *args_p)
    return (s * w * pk).to(q.dtype), (s * pt_q).to(k.dtype)


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The operators' autograd formula for eager calls: ``apply(q, k, v, args[, entry])`` with ``args``
    the operator's other arguments (mask, bias, block mask, seed, scale, causal, alignment,
    window_left, window_right, dropout_p, block_q, block_k, backend). The forward checks the problem once and keeps it
    (without its tensors) for the backward, which saves the dispatcher and the second check; a call whose key
    (`ioaware._backends.prepared_key`) an earlier call prepared runs the prepared forward and backward instead."""

    @staticmethod
    def forward(ctx, q, k, v, args, entry=None):
        (mask, bias, block_mask, seed, scale, causal, alignment, window_left, window_right, dropout_p, block_q,
         block_k, backend) = args
        ctx.set_materialize_grads(False)     # an unused output's gradient arrives as None
        key = None
        if entry is None:
            key = _prepared_key(q, k, v, *args)
            entry = _backends._PREPARED.get(key) if key is not None else None
        if entry is not None:                # checked and prepared by an earlier call with this key
            out, lse = entry.forward(q, k, v)
            ctx.save_for_backward(q, k, v, out, lse, mask, bias, block_mask, seed)
            ctx.problem, ctx.prepared, ctx.backend, ctx.rest = None, entry, "numba", args[4:]
            return out, lse
        backend = _backends._resolve_backend(backend, q)
        mask_k, bias_k = _numba_mask(backend, mask, bias)
        pb = _backends._problem(q, k, v, backend, cost=True, values=True, seed=_seed(seed),
                                 **_kwargs(mask_k, bias_k, block_mask, scale, causal, alignment, window_left,
                                           window_right, dropout_p, block_q, block_k))
        out4, lse3 = _backends._run_forward(pb, backend)
        out, lse = pb.restore_q(out4), pb.restore_lse(lse3)
        # the caller's tensors, out and lse (what the operator's formula saves); the checked
        # problem keeps views of them, whose versions the saved tensors guard
        ctx.save_for_backward(q, k, v, out, lse, mask, bias, block_mask, seed)
        ctx.problem, ctx.prepared, ctx.backend, ctx.rest = pb, None, backend, args[4:]
        if key is not None and key not in _backends._PREPARED:
            _backends.prepare(key, pb, backend)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, mask, bias, block_mask, seed = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        grads = None
        if ctx.prepared is not None:
            grads = ctx.prepared.backward(q, k, v, out, lse, _dense(dout))
        if grads is None:
            pb = ctx.problem
            if pb is None:                   # a prepared forward whose backward is not prepared
                pb = _backends._problem(q, k, v, ctx.backend, cost=False, values=False, seed=0,
                                        **_kwargs(None, None, None, *ctx.rest[:8]))
            grads = _backends._run_backward(pb, out, lse, _dense(dout), ctx.backend)
        dq, dk, dv = grads
        if dlse is not None:
            dq_lse, dk_lse = _lse_gradients(q.detach(), k.detach(), lse, dlse, mask, bias,
                                            block_mask, seed, tuple(ctx.rest))
            dq, dk = dq + dq_lse, dk + dk_lse
        return dq, dk, dv, None, None
