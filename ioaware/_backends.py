"""Running a checked attention problem on a backend: the layer below the public functions.

* :func:`_resolve_backend` and :func:`_problem`: the backend that will run, and every check of a
  call (shapes and dtypes, the cost estimate, what the backend cannot compute exactly, the NaN
  scan of CPU inputs), in that order, before any work;
* :func:`_run_forward` / :func:`_run_backward`: the canonical forward and backward, with the
  cases no backend needs to see (nothing to compute, ``dropout_p = 1``);
* the backends themselves: ``"numpy"`` (the tiled algorithm of :mod:`ioaware.tiled`, in the
  grouped GQA layout of :class:`_Grouped`), ``"reference"`` (:mod:`ioaware.reference`) and
  ``"numba"`` (the ``kernels`` package, given the problem as the kernels take it:
  :func:`_kernel_problem`).

:mod:`ioaware.attention` (the public functions) and :mod:`ioaware._torch_ops` (the torch
operators and their autograd formula) both stand on this module.
"""
from __future__ import annotations

import dataclasses
import functools
import sys

import numpy as np

from . import kernel_cache
from ._inputs import (BlockMask, Problem, _canonical, check_cache_seqlens, check_inputs, check_values, is_torch,
                      lse_dtype, parse_causal, torch_or_none)
from .block_info import BlockInfo
from .reference import reference_backward, reference_forward
from .tiled import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q, compute_dtype, tiled_backward, tiled_forward


#: Backends: "auto" resolves to "numba" for CUDA tensors and "numpy" otherwise.
BACKENDS = ("auto", "numpy", "reference", "numba")
#: Input dtypes the numba backend (the CUDA kernels) takes.
NUMBA_DTYPES = ("float16", "bfloat16", "float32")


def _resolve_backend(backend, q):
    """The backend that will run: ``"auto"`` resolved, and refused if it cannot run here."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        on_cuda = is_torch(q) and q.device.type == "cuda"
        backend = "numba" if on_cuda else "numpy"
    if backend == "numba":
        _check_numba_available()
    return backend


@functools.cache
def _numba_cuda_status() -> str | None:
    """None if Numba can run CUDA kernels here (a GPU, or its simulator), else why not."""
    try:
        from numba import cuda
    except ImportError as exc:  # pragma: no cover - numba is a dependency
        return f"numba.cuda cannot be imported ({exc})"
    if cuda.is_available():
        return None
    reason = ""
    try:
        cuda.current_context()
    except Exception as exc:  # noqa: BLE001 - numba raises several kinds here
        reason = ": " + " ".join(str(exc).split()).rstrip(": ")
    return f"numba.cuda.is_available() is False{reason}"


def _check_numba_available():
    status = _numba_cuda_status()
    if status is not None:
        raise RuntimeError(f"backend='numba' needs a CUDA GPU, and Numba finds none ({status}). Use "
                           f"backend='numpy' on the CPU, or set NUMBA_ENABLE_CUDASIM=1 before importing "
                           f"numba to run the kernels in Numba's CUDA simulator.")


def _check_backend_supports(pb: Problem, backend):
    """Refuse, before dispatch, what ``backend`` cannot compute exactly (each error names the argument)."""
    if backend != "numba" or pb.trivial:
        return
    if pb.dtype_name not in NUMBA_DTYPES:
        raise TypeError(f"q, k and v have dtype {pb.dtype_name}; backend 'numba' takes {', '.join(NUMBA_DTYPES)} "
                        f"(float64 runs on backend='numpy' or 'reference', with CPU inputs)")
    if pb.value_dim != pb.head_dim:
        raise ValueError(f"v has head dimension {pb.value_dim} but q and k have {pb.head_dim}; backend 'numba' "
                         f"needs them equal (backend='numpy' takes them different, with CPU inputs)")
    if pb.head_dim == 0:
        raise ValueError("q and k have head dimension 0, which backend 'numba' does not take")
    if pb.causal and pb.causal_alignment == "bottom_right" and pb.seqlen_q != pb.seqlen_k \
            and pb.window_size is None:
        # (with a window the kernels take the band, causal rule included, bottom-right aligned)
        raise ValueError(f"causal='bottom_right' (or attn_mask=causal_lower_right(...)) with Nq={pb.seqlen_q} != "
                         f"Nk={pb.seqlen_k} is not supported by backend 'numba' (its kernels align causal "
                         f"masks top-left); pass the pattern as a boolean mask, or use backend='numpy'")


def _problem(q, k, v, backend, *, cost, values, **kwargs) -> Problem:
    """``check_inputs`` (with the cost check when ``cost``), the backend's refusals, and the value
    scan when ``values``: every check, in that order, before any work."""
    pb = check_inputs(q, k, v, backend=backend if cost else None, **kwargs)
    _check_backend_supports(pb, backend)
    if values:
        check_values(pb)
    return pb


def _cache_problem(q, k, v, backend, cache_seqlens, *, causal, window_size, mask, block_mask, scale,
                   dropout_p, block_q, block_k):
    """Every check of a call with per-sequence cache lengths, before any work: ``(problem,
    lengths on the host)`` (None for lengths on q's CUDA device, which are not read here: see
    `check_cache_seqlens`). The cache lengths are for decoding (inference): no dropout, no
    block mask, and a causal rule only aligned to the end of each sequence (bottom-right)."""
    if dropout_p not in (0, 0.0):
        raise ValueError("dropout_p must be 0 with cache_seqlens (decoding with a KV cache is inference)")
    if block_mask is not None:
        raise ValueError("block_mask cannot be combined with cache_seqlens (the tiles would move with each "
                         "sequence's length); pass a boolean mask")
    is_causal, alignment = parse_causal(causal)
    if is_causal and alignment == "top_left":
        raise ValueError("causal=True (top-left) with cache_seqlens: the queries are the last positions of each "
                         "cached sequence, so the causal rule is aligned to its end; pass causal='bottom_right' "
                         "(as flash_attn_with_kvcache(causal=True) aligns it)")
    pb = check_inputs(q, k, v, causal=causal, window_size=window_size, mask=mask, scale=scale,
                      block_q=block_q, block_k=block_k, backend=backend)
    host, lengths = check_cache_seqlens(cache_seqlens, pb)
    _check_backend_supports(dataclasses.replace(pb, causal=False), backend)
    check_values(pb)
    return dataclasses.replace(pb, cache_seqlens=lengths), host


def _run_forward_with_cache(pb: Problem, lengths, backend):
    """Canonical forward of a problem whose batch row b sees only its first ``lengths[b]`` keys:
    the split-KV decoding kernel where it takes the problem (backend ``"numba"``), otherwise
    batch row by batch row on the keys that exist (any backend), which is the definition.
    ``lengths`` is None when they are on q's CUDA device and unread: the kernel checks them,
    and the other paths read and check them here."""
    if backend == "numba" and not pb.trivial:
        kernels = kernel_cache.kernels()
        kp = _kernel_problem(pb)
        if kp is not pb:
            kp = dataclasses.replace(kp, cache_seqlens=np.asarray(lengths, dtype=np.int32))
        try:
            family = kernels.family_for(kp, None, "fwd")
        except ValueError:
            family = None
        if family == "split_kv":
            out, lse = kernels.forward(kp)
            return _from_device(pb, out), _from_device(pb, lse, lse=True)
    if lengths is None:          # on the device and unread so far: the paths below need them
        lengths, _ = check_cache_seqlens(pb.cache_seqlens.cpu(), pb)
    subs = [_batch_row(pb, b, int(n)) for b, n in enumerate(lengths)]
    if backend == "numba":
        for sub in subs:                                   # refuse before computing any row
            _check_backend_supports(sub, backend)
    if not subs:
        return _run_forward(dataclasses.replace(pb, cache_seqlens=None), backend)
    parts = [_run_forward(sub, backend) for sub in subs]
    cat = np.concatenate if pb.kind == "numpy" else torch_or_none().cat
    return cat([o for o, _ in parts], 0), cat([l_ for _, l_ in parts], 0)


def _batch_row(pb: Problem, b: int, length: int) -> Problem:
    """Batch row ``b`` of ``pb`` with its first ``length`` keys (and the mask's columns)."""
    mask = pb.mask
    if mask is not None:
        row = b if mask.shape[0] > 1 else 0
        mask = mask[row:row + 1, :, :, :length]
    return dataclasses.replace(
        pb, q=pb.q[b:b + 1], k=pb.k[b:b + 1, :, :length], v=pb.v[b:b + 1, :, :length], batch=1,
        seqlen_k=length, mask=mask, cache_seqlens=None, q_shape=(1,) + tuple(pb.q.shape[1:]),
        kv_shape=(1, pb.heads_kv, length, pb.head_dim), v_shape=(1, pb.heads_kv, length, pb.value_dim))


def _bias_as_mask(bias):
    """A float mask whose entries are all 0 or -inf, as a boolean mask (the kernels take no bias)."""
    torch = torch_or_none()
    finite = torch.isfinite(bias)
    if not bool(((bias == 0) | (~finite & (bias < 0))).all()):
        raise NotImplementedError("the numba backend supports boolean masks and float masks of 0/-inf only; "
                                  "use backend='numpy' for a general additive attn_mask")
    return finite


def _run_forward(pb: Problem, backend):
    """Canonical forward with the cases no backend needs to see: nothing to compute (no query
    row, or no key: zeros and ``lse = -inf``) and ``dropout_p = 1`` (zeros; the logsumexp of the
    logits as without dropout)."""
    if pb.trivial:
        return _zeros(pb, _canonical_shape(pb, pb.value_dim)), _full(pb, _canonical_shape(pb), -np.inf, lse=True)
    if pb.dropout_p >= 1.0:
        _, lse = _forward(dataclasses.replace(pb, dropout_p=0.0), backend)
        return _zeros(pb, _canonical_shape(pb, pb.value_dim)), lse
    return _forward(pb, backend)


#: Prepared calls of torch CUDA tensors: `prepared_key` -> `Prepared`, or None where the kernels
#: prepare nothing (such calls take the full path every time).
_PREPARED: dict = {}
#: How many prepared calls are kept (the dictionary is emptied when it would hold more).
MAX_PREPARED = 256


def prepared_key(q, k, v, mask, bias, block_mask, dropout_p, flags):
    """The key under which a call on torch CUDA tensors is checked and prepared once and then
    repeated without its checks: everything the checks and the kernels' choices read (shapes,
    strides, dtypes, devices, the current device, and ``flags``: scale, causal rule, window,
    tiles, backend) and whether torch's deterministic algorithms are on (they choose the
    backward's deterministic dQ, `kernels.mma_bwd.dq_mode`, `kernels.tf32_bwd.dq_mode`). None for calls with a mask, bias,
    block mask or dropout, which always take the full path."""
    if mask is not None or bias is not None or block_mask is not None or dropout_p != 0.0:
        return None
    if not (is_torch(q) and is_torch(k) and is_torch(v) and q.is_cuda):
        return None
    torch = sys.modules["torch"]
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype,
            v.dtype, q.device, k.device, v.device, torch.cuda.current_device(),
            torch.are_deterministic_algorithms_enabled(), flags)


class Prepared:
    """What the first checked call of a key leaves for the next ones: the kernels' prepared
    forward (`kernels.prepare_forward`), the checked problem without its tensors, and its
    prepared backward (`kernels.prepare_backward`, made on the first backward). Inputs and
    outputs are in the caller's shapes."""
    __slots__ = ("problem", "_forward", "_backward", "_four_d")

    def __init__(self, problem, forward):
        self.problem, self._forward, self._backward = problem, forward, None
        # operands given as [B, H, N, d] are already canonical: no reshapes in or out
        self._four_d = len(problem.q_shape) == len(problem.kv_shape) == len(problem.v_shape) == 4

    def forward(self, q, k, v, **run_kw):
        """``(out, lse)`` of new operands with this key (which holds their shapes, strides,
        dtypes and device: the kernels' prepared forward checks only their alignment);
        ``run_kw`` goes to that forward as it is."""
        if self._four_d:
            return self._forward(q, k, v, layout_known=True, **run_kw)
        pb = self.problem
        out, lse = self._forward(_canonical(q), _canonical(k), _canonical(v), layout_known=True,
                                 **run_kw)
        return pb.restore_q(out), pb.restore_lse(lse)

    def backward(self, q, k, v, out, lse, dout):
        """``(dq, dk, dv)``, or None when the kernels prepare no backward for this problem."""
        if self._backward is None:
            run = kernel_cache.kernels().prepare_backward(self.problem)
            self._backward = False if run is None else run
        if self._backward is False:
            return None
        if self._four_d:
            return self._backward(q, k, v, out, lse, dout)
        pb = self.problem
        shape4 = (pb.batch, pb.heads_q, pb.seqlen_q, pb.head_dim)
        dq, dk, dv = self._backward(_canonical(q), _canonical(k), _canonical(v),
                                    out.reshape(shape4), lse.reshape(shape4[:3]),
                                    dout.reshape(shape4))
        return pb.restore_q(dq), pb.restore_kv(dk), pb.restore_v(dv)


def prepare(key, pb: Problem, backend):
    """After a checked call of ``pb`` ran in full, keep a `Prepared` for ``key`` (or None where
    the kernels prepare no forward), so that the next call with the same key skips the checks
    and the choices."""
    entry = None
    if backend == "numba" and pb.kind == "torch" and pb.device.startswith("cuda") \
            and not pb.trivial and pb.dropout_p == 0.0 and pb.bias is None and pb.mask is None:
        forward = kernel_cache.kernels().prepare_forward(pb)
        if forward is not None:
            entry = Prepared(dataclasses.replace(pb, q=None, k=None, v=None), forward)
    _keep(key, entry)


def _keep(key, entry) -> None:
    """``_PREPARED[key] = entry``, the dictionary emptied first where it holds `MAX_PREPARED`."""
    if len(_PREPARED) >= MAX_PREPARED:
        _PREPARED.clear()
    _PREPARED[key] = entry


def cache_key(q, k, v, mask, block_mask, dropout_p, cache_seqlens, flags):
    """The `prepared_key` of a decoding call (`ioaware.attention` with ``cache_seqlens``) whose
    lengths are a torch integer tensor on q's CUDA device, which no check reads (the split-KV
    kernel checks each length), plus the lengths' dtype and shape; None for any other call."""
    if not (is_torch(cache_seqlens) and is_torch(q) and q.is_cuda and cache_seqlens.is_cuda
            and cache_seqlens.device == q.device):
        return None
    key = prepared_key(q, k, v, mask, None, block_mask, dropout_p, flags)
    if key is None:
        return None
    key = key + (cache_seqlens.dtype, tuple(cache_seqlens.shape))
    try:
        hash(key)
    except TypeError:                   # an argument that cannot be a key: the full path
        return None
    return key


class PreparedDecode(Prepared):
    """What the first checked decoding call of a `cache_key` leaves for the next ones: the
    split-KV forward prepared (`kernels.prepare_forward`), run with each call's cache lengths
    (a `Prepared` whose forward takes them; decoding is forward only). Inputs and outputs are in the
    caller's shapes."""
    __slots__ = ()

    def forward(self, q, k, v, cache_seqlens):
        """``(out, lse)`` of new operands and lengths with this key (int32 on the device as the
        kernel takes them: a contiguous int32 tensor is passed as it is)."""
        torch = sys.modules["torch"]
        lengths = cache_seqlens.detach()
        if lengths.dtype != torch.int32 or not lengths.is_contiguous():
            lengths = lengths.to(torch.int32).contiguous()
        return super().forward(q, k, v, cache_seqlens=lengths)


def prepare_cache(key, pb: Problem, backend):
    """After a checked decoding call of ``pb`` (lengths on q's CUDA device) ran in full, keep a
    `PreparedDecode` for ``key`` where the split-KV kernel runs it (else None: such calls take
    the full path every time)."""
    entry = None
    if backend == "numba" and pb.kind == "torch" and pb.device.startswith("cuda") \
            and not pb.trivial and pb.mask is None:
        kernels = kernel_cache.kernels()
        try:
            family = kernels.family_for(pb, None, "fwd")
        except ValueError:
            family = None
        if family == "split_kv":
            entry = PreparedDecode(dataclasses.replace(pb, q=None, k=None, v=None),
                                   kernels.prepare_forward(pb))
    _keep(key, entry)


def _run_backward(pb: Problem, out, lse, dout, backend):
    """Gradients, zero where the forward's output does not depend on the inputs (see :func:`_run_forward`)."""
    if pb.trivial or pb.dropout_p >= 1.0:
        dq = _zeros(pb, _canonical_shape(pb, pb.head_dim))
        dk = _zeros(pb, (pb.batch, pb.heads_kv, pb.seqlen_k, pb.head_dim))
        dv = _zeros(pb, (pb.batch, pb.heads_kv, pb.seqlen_k, pb.value_dim))
        return pb.restore_q(dq), pb.restore_kv(dk), pb.restore_v(dv)
    return _backward(pb, out, lse, dout, backend)


def _canonical_shape(pb: Problem, last=None):
    lead = (pb.batch, pb.heads_q, pb.seqlen_q)
    return lead if last is None else lead + (last,)


def _full(pb: Problem, shape, value, lse=False):
    """A new array/tensor of ``shape`` filled with ``value``, in the user's type, device and dtype."""
    if pb.kind == "numpy":
        return np.full(shape, value, dtype=lse_dtype(pb.dtype_name) if lse else pb.dtype)
    torch = torch_or_none()
    dtype = getattr(torch, lse_dtype(pb.dtype_name)) if lse else pb.dtype
    return torch.full(shape, value, dtype=dtype, device=pb.device)


def _zeros(pb: Problem, shape):
    return _full(pb, shape, 0.0)


def _forward(pb: Problem, backend):
    """Canonical forward: ``(out [B,Hq,Nq,Ev], lse [B,Hq,Nq])`` in the inputs' type and device."""
    if backend == "numba":
        if pb.bias is not None:
            raise NotImplementedError("the numba backend takes boolean masks, not an additive bias")
        kernels = kernel_cache.kernels()
        out, lse = kernels.forward(_kernel_problem(pb))
        return _from_device(pb, out), _from_device(pb, lse, lse=True)
    q, k, v = (_host(x) for x in (pb.q, pb.k, pb.v))
    g = _Grouped(pb, q, k, v)
    if backend == "reference":
        out, lse = reference_forward(g.q, g.k, g.v, scale=pb.scale, allowed=g.allowed_full(),
                                     bias=g.bias, bh=g.bh, dropout_p=pb.dropout_p, seed=pb.seed)
    else:
        acc = compute_dtype(g.q.dtype)
        out = np.empty(g.q.shape[:-1] + (pb.value_dim,), dtype=acc)
        lse = np.empty(g.q.shape[:-1], dtype=acc)
        for sel, info in g.groups():
            o, l_ = tiled_forward(g.q[sel], g.k[sel[:2]], g.v[sel[:2]], scale=pb.scale, info=info,
                                  allowed=_sel(g.allowed, sel), bias=_sel(g.bias, sel), bh=g.bh[sel],
                                  dropout_p=pb.dropout_p, seed=pb.seed)
            out[sel], lse[sel] = o, l_
    out_shape = tuple(pb.q.shape[:-1]) + (pb.value_dim,)
    return _to_user(pb, out.reshape(out_shape)), _to_user(pb, lse.reshape(pb.q.shape[:-1]), lse=True)


def _backward(pb: Problem, out, lse, dout, backend):
    """Gradients in the user's layout from user-shaped ``out``, ``lse``, ``dout``."""
    shape4, shape3 = tuple(pb.q.shape), tuple(pb.q.shape[:-1])
    shape_out = shape3 + (pb.value_dim,)
    if backend == "numba":
        kernels = kernel_cache.kernels()
        o, l_, do = (_device_input(pb, x.reshape(s)) for x, s in ((out, shape4), (lse, shape3), (dout, shape4)))
        dq, dk, dv = kernels.backward(_kernel_problem(pb), o, l_, do)
        dq, dk, dv = (_from_device(pb, x) for x in (dq, dk, dv))
    else:
        q, k, v = (_host(x) for x in (pb.q, pb.k, pb.v))
        o, l_, do = _host(out.reshape(shape_out)), _host(lse.reshape(shape3)), _host(dout.reshape(shape_out))
        g = _Grouped(pb, q, k, v)
        o5, do5 = g.as_out(o), g.as_out(do)
        l5 = l_.reshape(g.q.shape[:-1])
        if backend == "reference":
            dq, dk, dv = reference_backward(g.q, g.k, g.v, do5, scale=pb.scale, allowed=g.allowed_full(),
                                            bias=g.bias, bh=g.bh, dropout_p=pb.dropout_p, seed=pb.seed)
        else:
            acc = compute_dtype(g.q.dtype)
            dq = np.zeros(g.q.shape, dtype=acc)
            dk = np.zeros(g.k.shape, dtype=acc)
            dv = np.zeros(g.v.shape, dtype=acc)
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
        dk, dv = _to_user(pb, dk.reshape(pb.k.shape)), _to_user(pb, dv.reshape(pb.v.shape))
    return pb.restore_q(dq), pb.restore_kv(dk), pb.restore_v(dv)


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
    """Cast a host result to the user's type, device and dtype (the logsumexp stays float32, or
    float64 for float64 inputs)."""
    lse_dt = lse_dtype(pb.dtype_name)
    if pb.kind == "numpy":
        return x.astype(lse_dt if lse else pb.dtype, copy=False)
    torch = torch_or_none()
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64 if pb.dtype_name == "float64" else np.float32))
    return t.to(device=pb.device, dtype=getattr(torch, lse_dt) if lse else pb.dtype)


class _Grouped:
    """Host arrays in the grouped GQA layout ``[B, G, R, N, d]`` used by the tiled and reference paths."""

    def __init__(self, pb: Problem, q, k, v):
        self.pb = pb
        b, g, r = pb.batch, pb.heads_kv, pb.group
        self.q = q.reshape(b, g, r, pb.seqlen_q, pb.head_dim)
        self.k = k.reshape(b, g, 1, pb.seqlen_k, pb.head_dim)
        self.v = v.reshape(b, g, 1, pb.seqlen_k, pb.value_dim)
        self.bh = np.arange(b * pb.heads_q, dtype=np.int64).reshape(b, g, r)
        self.allowed = self._as5(_host(pb.mask))
        self.bias = self._as5(_host(pb.bias))
        if self.bias is not None:
            self.bias = self.bias.astype(compute_dtype(self.q.dtype), copy=False)

    def as_out(self, x):
        """An output-shaped ``[B, Hq, Nq, Ev]`` array in the grouped layout."""
        return x.reshape(self.q.shape[:-1] + (self.pb.value_dim,))

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
                                         pb.block_k or DEFAULT_BLOCK_K, pb.causal, block_mask2d,
                                         pb.causal_alignment, pb.window_size)

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
        if pb.causal or pb.window_size is not None:
            c = self._info().position_pattern()          # the causal rule and the window
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
