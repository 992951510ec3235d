"""The public attention API: exact attention, forward and backward, on NumPy arrays and torch tensors.

* :func:`attention` — FlashAttention-style attention with causal (top-left or bottom-right),
  sliding-window (local), boolean and block-sparse masks, dropout, GQA/MQA and cross attention;
  differentiable for torch tensors.
* :func:`attention_backward` — the gradients ``(dq, dk, dv)`` from ``(q, k, v, out, lse, dout)``.
* :func:`scaled_dot_product_attention` — a drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

Backends: ``"numpy"`` (the tiled algorithm of :mod:`ioaware.tiled`, on the CPU), ``"reference"``
(the materialised float64 computation of :mod:`ioaware.reference`), ``"numba"`` (the fused CUDA
kernels of the ``kernels`` package) and ``"auto"`` (``"numba"`` for CUDA tensors, ``"numpy"``
otherwise). Inputs come back as they came in: same type, device and dtype.

Torch tensors go through two operators, ``torch.ops.ioaware.attention_fwd`` and
``torch.ops.ioaware.attention_bwd`` (:mod:`ioaware._torch_ops`), with fake implementations and
an autograd formula, so ``torch.compile(fullgraph=True)`` traces a model that calls them without
graph breaks.
"""
from __future__ import annotations

import functools

import numpy as np

from . import _backends
from ._backends import (_PREPARED, BACKENDS, _cache_problem, _problem, _resolve_backend, _run_backward,
                        _run_forward, _run_forward_with_cache, prepare_cache)
from ._inputs import (BlockMask, _block_mask_parts, _check_seed, _scalar, check_inputs, is_torch,
                      parse_causal, sdpa_arguments, torch_or_none)
from .block_info import check_window_size
from .tiled import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q

__all__ = ["attention", "attention_backward", "scaled_dot_product_attention", "BlockMask",
           "BACKENDS", "DEFAULT_BLOCK_Q", "DEFAULT_BLOCK_K"]

# ------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------
def attention(q, k, v, *, causal=False, window_size=None, mask=None, block_mask=None, scale=None,
              dropout_p=0.0, seed=None, return_lse=False, block_q=None, block_k=None, backend="auto",
              cache_seqlens=None):
    """Exact scaled dot-product attention, computed tile by tile without materialising ``QK^T``.

    Parameters
    ----------
    q : array ``[..., Hq, Nq, E]`` (also ``[Nq, E]`` and ``[Hq, Nq, E]``); NumPy float16/float32/
        float64 or torch float16/bfloat16/float32/float64. Arithmetic accumulates in float32
        (float64 for float64 inputs).
    k, v : arrays ``[..., Hkv, Nk, E]`` and ``[..., Hkv, Nk, Ev]`` with the same leading
        dimensions and dtype as ``q``; the value head dimension ``Ev`` may differ from ``E``.
        ``Hq`` must be a multiple of ``Hkv`` (GQA/MQA: query head h uses KV head
        ``h // (Hq // Hkv)``). ``Nk`` may differ from ``Nq`` (cross attention). Any size may be
        0: the output is then empty, or all zeros when ``Nk = 0``.
    causal : ``False``, ``True`` or ``"top_left"`` (query row i attends to key columns
        ``j <= i``, as ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``), or
        ``"bottom_right"`` (``j <= i + Nk - Nq``: FlashAttention-2's convention and
        ``torch.nn.attention.bias.causal_lower_right``; the queries are the last Nq positions,
        as when decoding with a KV cache). The two agree when ``Nq == Nk``.
    window_size : ``(left, right)``, FlashAttention-2's sliding (local) window: with
        ``off = Nk - Nq`` (bottom-right aligned, as FlashAttention-2 always aligns it), query
        row i attends to key columns ``i + off - left <= j <= i + off + right``; ``-1`` leaves
        that side unbounded; None or ``(-1, -1)`` is no window. With ``causal`` the rule
        ``j <= i + off`` is added (``right`` is then effectively 0): ``"bottom_right"`` always,
        ``True`` / ``"top_left"`` only when ``Nq == Nk`` (otherwise it is refused: the two rules
        would be aligned differently). K/V tiles outside the window are never computed.
    mask : boolean array broadcastable to ``[..., Hq, Nq, Nk]``; True = may attend.
    block_mask : :class:`BlockMask` (or ``(mask, (block_q, block_k))``, or a boolean array with
        ``block_q``/``block_k`` given): tiles marked False are never computed.
    scale : multiplier of ``QK^T`` (a number or a 0-d tensor); default ``1 / sqrt(E)``.
    dropout_p, seed : dropout on the attention probabilities, ``0 <= dropout_p <= 1``
        (``dropout_p = 1`` gives zeros, as PyTorch). The keep mask is a hash of
        ``(seed, batch-head, row, column)`` (see :mod:`ioaware.dropout`), so the same seed gives
        the same mask on every backend and in the backward. ``seed=None`` draws one at random
        (from torch's generator for torch tensors, so ``torch.manual_seed`` reproduces it).
    return_lse : also return the logsumexp ``[..., Hq, Nq]`` of the scaled, masked logits
        (float32; float64 for float64 inputs).
    block_q, block_k : tile sizes (rows of Q, columns of K per tile).
    backend : ``"auto"``, ``"numpy"``, ``"reference"`` or ``"numba"``.
    cache_seqlens : decoding with a KV cache (as ``flash_attn_with_kvcache``): an int, or an
        integer array / tensor ``[B]`` (one per batch row, B the product of q's leading
        dimensions) of valid key lengths in ``[0, Nk]``. Batch row b attends only to its first
        ``cache_seqlens[b]`` keys, which are the only ones read, with the window and
        ``causal="bottom_right"`` aligned to that length (the queries are the sequence's last
        Nq positions); top-left ``causal=True`` is refused. Forward only (inputs may not
        require grad), without dropout or ``block_mask``. On CUDA, 1 to 16 queries run the
        split-KV decoding kernel (``kernels.decode_fwd``), which reads each KV head once for
        all the query heads of its GQA group. Lengths given as an int, a NumPy array or a CPU
        tensor are checked on the host; a tensor on q's CUDA device is never read by the host
        (no synchronisation: the call can be captured in a CUDA graph and the tensor updated
        in place between replays): the kernel checks each length, and a batch row whose
        length lies outside ``[0, Nk]`` comes out NaN (``out`` and ``lse``).

    Returns
    -------
    ``out`` ``[..., Hq, Nq, Ev]`` (type, device and dtype of ``q``), or ``(out, lse)`` with
    ``return_lse=True``.

    A query row that may attend to no key at all returns zeros and logsumexp ``-inf``, never NaN.
    Torch tensors that require grad get gradients through the ``ioaware::attention_fwd`` operator's
    autograd formula, which saves ``q, k, v, out, lse`` (and references to the masks and seed).

    Errors, raised before anything large is allocated or scanned: ``TypeError`` / ``ValueError``
    naming the argument; ``MemoryError`` when the estimated host memory exceeds what is
    available; ``RuntimeError`` when ``backend="numba"`` has no CUDA device. A
    :class:`ioaware.PerformanceWarning` says when the CPU backends would take over a minute.
    NaN and infinite values in CPU inputs are refused (``ValueError``), which PyTorch does not
    do; CUDA inputs are not scanned.
    """
    if cache_seqlens is not None:
        torch = torch_or_none()
        if is_torch(q) and torch.is_grad_enabled() and any(is_torch(x) and x.requires_grad for x in (q, k, v)):
            raise ValueError("cache_seqlens is for decoding (forward only), but q, k or v requires grad; call "
                             "under torch.no_grad() or torch.inference_mode(), or detach the inputs")
        # a decoding step like one checked before (lengths on the GPU): its prepared kernel
        key = None
        if is_torch(q) and not torch.compiler.is_compiling():
            window = tuple(window_size) if isinstance(window_size, list) else window_size
            flags = ("cache", causal, window, None if scale is None else _scalar("scale", scale),
                     block_q, block_k, backend)
            key = _backends.cache_key(q, k, v, mask, block_mask, dropout_p, cache_seqlens, flags)
        entry = _PREPARED.get(key) if key is not None else None
        if entry is not None:
            out, lse = entry.forward(q, k, v, cache_seqlens)
            return (out, lse) if return_lse else out
        backend = _resolve_backend(backend, q)
        pb, lengths = _cache_problem(q, k, v, backend, cache_seqlens, causal=causal, window_size=window_size,
                                     mask=mask, block_mask=block_mask, scale=scale, dropout_p=dropout_p,
                                     block_q=block_q, block_k=block_k)
        out4, lse3 = _run_forward_with_cache(pb, lengths, backend)
        out, lse = pb.restore_q(out4), pb.restore_lse(lse3)
        if key is not None and key not in _PREPARED:
            prepare_cache(key, pb, backend)
    elif is_torch(q):
        out, lse = _torch_attention(q, k, v, causal=causal, window_size=window_size, mask=mask, bias=None,
                                    block_mask=block_mask, scale=scale, dropout_p=dropout_p, seed=seed,
                                    block_q=block_q, block_k=block_k, backend=backend)
    else:
        backend = _resolve_backend(backend, q)
        pb = _problem(q, k, v, backend, cost=True, values=True, causal=causal, window_size=window_size,
                      mask=mask, block_mask=block_mask, scale=scale, dropout_p=dropout_p, seed=seed,
                      block_q=block_q, block_k=block_k)
        out4, lse3 = _run_forward(pb, backend)
        out, lse = pb.restore_q(out4), pb.restore_lse(lse3)
    return (out, lse) if return_lse else out


def attention_backward(q, k, v, out, lse, dout, *, causal=False, window_size=None, mask=None,
                       block_mask=None, scale=None, dropout_p=0.0, seed=None, block_q=None, block_k=None,
                       backend="auto"):
    """Gradients of :func:`attention`: returns ``(dq, dk, dv)`` shaped like ``q, k, v``.

    ``out`` and ``lse`` are what the forward returned (``return_lse=True``); ``dout`` is the
    gradient of the loss with respect to ``out``. The keyword arguments must be the forward's
    (with dropout, the same ``seed``). ``S`` and ``P`` are recomputed tile by tile from ``lse``.
    """
    backend = _resolve_backend(backend, q)
    if dropout_p and seed is None:
        raise ValueError("attention_backward with dropout needs the forward's seed")
    pb = _problem(q, k, v, backend, cost=True, values=True, causal=causal, window_size=window_size, mask=mask,
                  block_mask=block_mask, scale=scale, dropout_p=dropout_p, seed=seed, block_q=block_q,
                  block_k=block_k)
    lse_dtype = "float64" if pb.dtype_name == "float64" else "float32"
    _check_like("out", out, q, pb.out_shape, pb.dtype_name)
    _check_like("dout", dout, q, pb.out_shape, pb.dtype_name)
    _check_like("lse", lse, q, tuple(q.shape[:-1]), lse_dtype)
    return _run_backward(pb, out, lse, dout, backend)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None, enable_gqa=False):
    """A drop-in for ``torch.nn.functional.scaled_dot_product_attention``, with its semantics.

    ``query [..., Hq, L, E]``, ``key [..., Hk, S, E]``, ``value [..., Hv, S, Ev]`` with leading
    dimensions broadcast against each other as PyTorch does; returns ``[..., Hq, L, Ev]``.
    ``attn_mask`` is boolean (True = may attend), a float tensor (float32 or the query's dtype)
    added to the scaled scores, or a ``torch.nn.attention.bias.CausalBias``
    (``causal_upper_left`` / ``causal_lower_right``, understood natively, never materialised);
    other dtypes are refused with PyTorch's message. ``is_causal=True`` is top-left aligned.
    ``enable_gqa=True`` lets key/value have fewer heads than the query (their head counts must
    divide the query's); without it a single key/value head is broadcast, as PyTorch does.
    ``dropout_p`` and ``scale`` may be numbers or 0-d tensors; ``dropout_p = 1`` gives zeros.

    Differences from PyTorch (docs/sdpa.md lists them all): dropout draws its mask from
    :mod:`ioaware.dropout` (a fresh seed per call from torch's generator, so
    ``torch.manual_seed`` reproduces it, but not PyTorch's mask); gradients do not flow into a
    float ``attn_mask`` (one that requires grad is refused); ``attn_mask`` together with
    ``is_causal=True`` is refused (PyTorch documents that as an error, though its CPU kernel
    accepts it); NaN or infinite CPU inputs are refused rather than propagated; errors are
    ``TypeError`` / ``ValueError`` rather than ``RuntimeError``; on the ``numba`` backend (CUDA
    tensors) a float ``attn_mask`` may hold only 0 and ``-inf``, and float64, ``Ev != E`` and
    bottom-right causal masks with ``L != S`` are refused. There is no sliding window here
    (PyTorch's function has none): :func:`attention` takes ``window_size``.
    """
    a = sdpa_arguments(query, key, value, attn_mask, is_causal, enable_gqa)
    if a.zeros_shape is not None:
        return _sdpa_zeros(query, key, value, a.zeros_shape)
    if is_torch(a.q):
        out, _ = _torch_attention(a.q, a.k, a.v, causal=a.causal, window_size=None, mask=a.mask, bias=a.bias,
                                  block_mask=None, scale=scale, dropout_p=dropout_p, seed=None, block_q=None,
                                  block_k=None, backend="auto")
        return out
    backend = _resolve_backend("auto", a.q)
    pb = _problem(a.q, a.k, a.v, backend, cost=True, values=True, causal=a.causal, mask=a.mask, bias=a.bias,
                  scale=scale, dropout_p=dropout_p)
    out4, _ = _run_forward(pb, backend)
    return pb.restore_q(out4)


def _sdpa_zeros(query, key, value, shape):
    """PyTorch's result for an empty query sequence or an empty value: zeros, with (zero) gradients
    flowing to the inputs that require them."""
    if not is_torch(query):
        return np.zeros(shape, dtype=query.dtype)
    out = query.new_zeros(shape)
    inputs = [x for x in (query, key, value) if x.requires_grad]
    if inputs and torch_or_none().is_grad_enabled():
        out = out + sum(x.flatten()[:0].sum() for x in inputs)      # sums of nothing: exactly 0
    return out


# ------------------------------------------------------------------------------------------------
# checks and dispatch
# ------------------------------------------------------------------------------------------------
def _check_like(name, x, q, shape, dtype):
    """``x`` (out, dout or lse of a backward) must be q's kind of array, on q's device, with
    ``shape`` and dtype ``dtype`` (a name): a mismatch would be read as the wrong bits."""
    if is_torch(x) != is_torch(q):
        raise TypeError(f"{name} must be the same type as q ({type(q).__name__}), got {type(x).__name__}")
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(x.shape)}")
    got = str(x.dtype).replace("torch.", "")
    if got != dtype:
        raise TypeError(f"{name} must have dtype {dtype} (as the forward returns it for q's dtype), got {got}")
    if is_torch(x) and x.device != q.device:
        raise ValueError(f"{name} is on {x.device} but q is on {q.device}")


@functools.cache
def _zero_seed(torch):
    """The seed tensor of calls without dropout, one per process (never written: the operators
    only read it); made outside inference mode, so that autograd may save it whichever call
    made it first."""
    with torch.inference_mode(False):
        return torch.tensor(0, dtype=torch.int64)


def _torch_attention(q, k, v, *, causal, window_size, mask, bias, block_mask, scale, dropout_p, seed, block_q,
                     block_k, backend):
    """Torch tensors: through the ``ioaware::attention_fwd`` operator (autograd and torch.compile).

    Only what the operator's schema needs is prepared here (this code is traced by
    torch.compile); the operator itself checks everything once, in :func:`_problem`.
    """
    from . import _torch_ops as ops     # (imports torch: only on a torch call)
    torch = ops.torch
    tensor = torch.Tensor
    if not (isinstance(k, tensor) and isinstance(v, tensor)) or not (
            (mask is None or isinstance(mask, tensor)) and (bias is None or isinstance(bias, tensor))):
        check_inputs(q, k, v, mask=mask, bias=bias)     # raises the error that names the argument
        raise TypeError("q, k, v and the masks must all be torch tensors or all NumPy arrays")
    is_causal, alignment = parse_causal(causal)
    window_left, window_right = check_window_size(window_size) or (-1, -1)
    if scale is not None:
        scale = _scalar("scale", scale)
    dropout_p = _scalar("dropout_p", dropout_p, "a float in [0, 1]")
    if (seed is None and dropout_p == 0.0 and mask is None and bias is None and block_mask is None
            and not torch.compiler.is_compiling()):
        # -- a call whose key an earlier call checked and prepared: straight to its kernels --
        key = ops._prepared_key(q, k, v, None, None, None, None, scale, is_causal, alignment, window_left,
                            window_right, 0.0, block_q, block_k, backend)
        entry = _PREPARED.get(key) if key is not None else None
        if entry is not None:
            if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
                return ops.EagerAttention.apply(q, k, v, (None, None, None, _zero_seed(torch), scale, is_causal,
                                                      alignment, window_left, window_right, 0.0, block_q,
                                                      block_k, backend), entry)
            return entry.forward(q, k, v)
    if seed is None and dropout_p > 0.0:
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            raise ValueError("dropout_p > 0 with seed=None while a CUDA graph is being captured: the seed "
                             "is drawn when the graph is captured, so every replay would drop the same "
                             "elements; capture with dropout_p=0, or pass seed= explicitly (then every "
                             "replay uses that seed)")
        seed_t = torch.randint(0, 2**62, (), dtype=torch.int64)
    elif seed is None:                              # unused without dropout: one shared tensor
        seed_t = torch.tensor(0, dtype=torch.int64) if torch.compiler.is_compiling() else _zero_seed(torch)
    else:
        seed_int = _check_seed(seed, dropout_p, "torch", torch)
        seed_t = torch.tensor(seed_int - 2**64 if seed_int >= 2**63 else seed_int, dtype=torch.int64)
    bm = None
    if block_mask is not None:
        arr, block_q, block_k = _block_mask_parts(block_mask, block_q, block_k)
        bm = torch.from_numpy(np.ascontiguousarray(arr))
    args = (q, k, v, mask, bias, bm, seed_t, scale, is_causal, alignment, window_left, window_right, dropout_p,
            block_q, block_k, backend)
    if torch.compiler.is_compiling():
        return ops.attention_fwd(*args)         # the operators: opaque to the tracer
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return ops.EagerAttention.apply(q, k, v, args[3:])   # their formula, without dispatch
    return ops.attention_fwd_impl(*args)        # the operator's own implementation


