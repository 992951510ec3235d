"""Context-parallel (ring) attention over ``torch.distributed``: :func:`ring_attention`, :func:`shard`
and :func:`unshard`.

FlashAttention makes attention's memory O(N); its time stays O(N^2), so at long contexts the
sequence is split over P processes (one per GPU). Every rank holds a shard of Q, K and V; the
K/V shards travel around the ring of ranks (rank r sends to r + 1 and receives from r - 1), and
at each of the P steps a rank computes its Q shard against the K/V shard it holds with
:func:`ioaware.attention` (``return_lse=True``), then merges the partial result into its running
one with the online-softmax rule::

    out <- out - sigmoid(lse_b - lse) * (out - out_b)
    lse <- logaddexp(lse, lse_b)      # = lse - log sigmoid(lse - lse_b)

Which tokens a rank holds (the layout) and which part of each (Q shard, K/V shard) pair is
computed under a causal mask (full, causal, or skipped) is :mod:`ioaware.ring_plan`'s. The next
K/V shard is sent (``torch.distributed.batch_isend_irecv``) before the current one's attention
starts, so the transfer overlaps the computation: with NCCL the sends and receives run on
NCCL's own communication stream, which waits for the compute stream only when they are issued,
and ``wait()`` makes the compute stream (not the host) wait for them; with gloo (CPU tensors)
they run on gloo's threads while this one computes.

The backward pass (a ``torch.autograd.Function``) turns the ring again: each rank recomputes its
pairs with :func:`ioaware.attention_backward` from the global ``out`` and ``lse``, accumulates
dQ locally, and adds its dK/dV contributions to buffers that travel with the K/V shard; after P
steps those buffers reach the shard's owner — the forward's transpose. Gradients flow through
``lse`` as well (``return_lse=True``).

Accumulators (out, lse, dQ, and the travelling dK/dV) are float32 (float64 for float64 inputs);
outputs come back in the inputs' dtype, the logsumexp in float32 (float64). Everything a caller
can get wrong is checked before the first transfer, on every rank together: one
``all_gather`` of a few integers per call (shapes, dtype, layout, causal, scale) makes every
rank raise the same error instead of one rank raising while the others wait for it.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from ._inputs import parse_causal
from .attention import _problem, _resolve_backend, attention, attention_backward
from .ring_plan import LAYOUTS, PairBlock, check_layout, kv_source, pair_blocks, shard_length, shard_positions

__all__ = ["ring_attention", "shard", "unshard", "LAYOUTS"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: Tags of the two kinds of transfer in flight at once in the backward (gloo matches sends to
#: receives by tag; NCCL ignores tags and matches them in issue order, the same on every rank).
_KV_TAG, _DKV_TAG = 0, 2
#: Integers per rank in the agreement check (room for the shape of any tensor up to 64 dimensions).
_ROW_WIDTH = 72


# ------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------
def ring_attention(q, k, v, *, group=None, causal=False, scale=None, layout="zigzag", return_lse=False,
                   backend="auto"):
    """Attention of this rank's query shard against the whole sequence, whose K/V shards are spread
    over the ranks of ``group``: context parallelism by a ring of P2P transfers.

    Parameters
    ----------
    q : torch tensor ``[B, Hq, n, E]``: this rank's shard of the queries, ``n = N / P`` tokens of
        a sequence of N split over the P ranks of ``group`` as ``layout`` says
        (:func:`shard` makes it from the full sequence).
    k, v : ``[B, Hkv, n, E]`` and ``[B, Hkv, n, Ev]``: this rank's shards of the keys and values,
        same layout. ``Hq`` must be a multiple of ``Hkv`` (GQA/MQA).
    group : the ``torch.distributed`` process group of the ring (default: the world). Gloo for
        CPU tensors, NCCL for CUDA tensors.
    causal : ``False`` or ``True`` (position i attends to positions ``j <= i`` of the whole
        sequence; ``"top_left"`` and ``"bottom_right"`` mean the same here: Nq = Nk).
    scale : multiplier of ``QK^T``; default ``1 / sqrt(E)``.
    layout : ``"zigzag"`` (default: rank r holds chunks r and 2P-1-r of 2P, which balances causal
        work), ``"contiguous"`` (rank r holds chunk r) or ``"striped"`` (every P-th token); see
        :mod:`ioaware.ring_plan`.
    return_lse : also return the logsumexp ``[B, Hq, n]`` over the whole sequence (float32;
        float64 for float64 inputs). Gradients flow through it too (its gradient enters the
        pairs' backward in the inputs' dtype: rounded to bfloat16 for bfloat16 inputs).
    backend : the backend of each pair's :func:`ioaware.attention` call (``"auto"``: the Numba
        kernels for CUDA tensors, the NumPy tiled path otherwise).

    Returns
    -------
    ``out`` ``[B, Hq, n, Ev]`` for this rank's queries (same layout), or ``(out, lse)``.

    Every rank of ``group`` must call it with equal shard shapes and the same ``causal``,
    ``scale`` and ``layout``; otherwise every rank raises ``ValueError`` / ``TypeError`` naming
    the argument before anything is sent (``layout="zigzag"`` also needs an even shard length:
    N divisible by 2P). Differentiable: the backward is another turn of the ring, which every
    rank must take (call ``backward`` on every rank).
    """
    ring = _setup_ring(q, k, v, group=group, causal=causal, scale=scale, layout=layout, backend=backend)
    out, lse = _RingAttention.apply(q, k, v, ring)
    return (out, lse) if return_lse else out


def shard(x, rank, world_size, layout, dim=-2):
    """Rank ``rank``'s shard of the full sequence ``x`` along dimension ``dim`` under ``layout``, as
    a new contiguous tensor (or NumPy array): the tokens :func:`ioaware.ring_plan.shard_positions`
    names, in that order.

    Raises ValueError naming ``x`` when its length along ``dim`` cannot be split into equal
    shards (divisible by P, or by 2P for ``"zigzag"``).
    """
    import numpy as np
    if not isinstance(x, (torch.Tensor, np.ndarray)):
        raise TypeError(f"x must be a torch tensor or a NumPy array, got {type(x).__name__}")
    dim = _check_dim("dim", dim, x.ndim)
    seq_len = int(x.shape[dim])
    shard_length(seq_len, world_size, layout, name=f"x.shape[{dim}]")
    positions = shard_positions(layout, rank, world_size, seq_len)
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(np.take(x, np.concatenate([np.asarray(r) for r in positions]), axis=dim))
    index = torch.cat([torch.arange(r.start, r.stop, r.step) for r in positions]).to(x.device)
    return x.index_select(dim, index)


def unshard(local, group, layout, dim=-2):
    """The full sequence from every rank's shard ``local`` (an ``all_gather`` over ``group``, then
    the tokens put back in order): the inverse of :func:`shard`. Every rank of ``group`` must call
    it, with equal shapes; every rank gets the whole tensor.

    Values only: a ``local`` that requires grad (with grad mode on) is refused, since no gradient
    would flow back through the gather; compute the loss on the shards, or pass
    ``local.detach()``.
    """
    if not isinstance(local, torch.Tensor):
        raise TypeError(f"local must be a torch tensor, got {type(local).__name__}")
    check_layout(layout)
    dim = _check_dim("dim", dim, local.dim())
    if local.requires_grad and torch.is_grad_enabled():
        raise ValueError("local requires grad, but unshard gathers values only (no gradient flows back "
                         "through it): compute the loss on the shards, or pass local.detach()")
    group, rank, world = _group_rank_world(group)
    error = None
    try:
        shard_length(int(local.shape[dim]) * world, world, layout, name=f"local.shape[{dim}] * world_size")
    except ValueError as exc:
        error = exc
    dtype_code = _DTYPES.index(local.dtype) if local.dtype in _DTYPES else -2
    rows = _gather_rows(group, world, local.device, error, [local.dim(), dtype_code] + list(local.shape))
    if len({tuple(r) for r in rows}) != 1:
        raise ValueError(f"local must have the same shape and dtype on every rank of the group; got shapes "
                         f"{[tuple(r[2:]) for r in rows]} on ranks 0..{world - 1}")
    local = local.contiguous()
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local, group=group)
    in_rank_order = torch.cat(parts, dim=dim)
    seq_len = in_rank_order.shape[dim]
    order = torch.cat([torch.arange(r.start, r.stop, r.step) for p in range(world)
                       for r in shard_positions(layout, p, world, seq_len)])
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(seq_len)
    return in_rank_order.index_select(dim, inverse.to(local.device))


# ------------------------------------------------------------------------------------------------
# checks, once, on every rank together
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Ring:
    """A checked ring: the group, this rank's place in it (peers as global ranks), the arguments."""

    group: object
    rank: int
    world_size: int
    next_peer: int
    prev_peer: int
    layout: str
    causal: bool
    scale: float
    backend: str
    shard_len: int

    def blocks(self, step: int) -> tuple[PairBlock, ...]:
        """The attention calls of this rank's Q shard against the K/V shard it holds at ``step``."""
        return pair_blocks(self.layout, self.rank, kv_source(self.rank, step, self.world_size),
                           self.world_size, self.shard_len, self.causal)


def _setup_ring(q, k, v, *, group, causal, scale, layout, backend) -> _Ring:
    group, rank, world = _group_rank_world(group)
    error, fields, resolved = None, None, None
    try:
        is_causal, scale, resolved = _check_local(q, k, v, group, causal, scale, layout, backend)
        fields = (list(q.shape) + [k.shape[1], v.shape[-1], _DTYPES.index(q.dtype), int(is_causal),
                                   LAYOUTS.index(layout), _float_bits(scale)])
    except (TypeError, ValueError, MemoryError, RuntimeError, NotImplementedError) as exc:
        error = exc
    device = q.device if isinstance(q, torch.Tensor) else _collective_device(group)
    rows = _gather_rows(group, world, device, error, fields)
    _check_agreement(rows, world)
    n = int(q.shape[2])
    if layout == "zigzag" and n % 2:
        raise ValueError(f"q: layout='zigzag' gives each rank 2 of 2P equal chunks, so the shard length must "
                         f"be even; got {n} (N = {n * world} is not divisible by 2P = {2 * world})")
    return _Ring(group, rank, world, dist.get_global_rank(group, (rank + 1) % world),
                 dist.get_global_rank(group, (rank - 1) % world), layout, is_causal, scale, resolved, n)


def _check_local(q, k, v, group, causal, scale, layout, backend):
    """What one rank can check alone (raises TypeError/ValueError naming the argument); returns
    ``(causal, scale, backend)`` resolved."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D shard [B, H, N/P, d], got shape {tuple(x.shape)}")
        if 0 in x.shape:
            raise ValueError(f"{name} has a zero-size dimension (shape {tuple(x.shape)}); ring_attention needs "
                             f"non-empty shards")
    check_layout(layout)
    is_causal, _ = parse_causal(causal)
    for name, x in (("k", k), ("v", v)):
        if x.shape[2] != q.shape[2]:
            raise ValueError(f"{name} has shard length {x.shape[2]} but q has {q.shape[2]}: ring_attention is "
                             f"self-attention over one sequence, sharded alike")
    backend = _resolve_backend(backend, q)
    # the largest call a ring step makes (a whole pair): types, dtypes, devices, GQA, the
    # backend's refusals, the cost, NaN/Inf in CPU inputs
    pb = _problem(q, k, v, backend, cost=True, values=True, causal=False, scale=scale)
    kind = str(dist.get_backend(group)).lower()
    if q.device.type == "cuda" and kind == "gloo":
        raise ValueError("group uses gloo, which does not send CUDA tensors: use an NCCL group for q on "
                         f"{q.device}")
    if q.device.type == "cpu" and kind == "nccl":
        raise ValueError("group uses NCCL, which sends CUDA tensors only: move q, k, v to the GPU, or use a "
                         "gloo group")
    return is_causal, float(pb.scale), backend


def _check_agreement(rows, world):
    """Every rank's fields side by side; the same error on every rank where they disagree."""
    table = rows
    lengths = [t[2] for t in table]
    if len(set(lengths)) > 1:
        raise ValueError(f"q, k, v: every rank must hold an equal shard of the sequence, but the shard "
                         f"lengths (dim 2) are {lengths} on ranks 0..{world - 1}; split the sequence with "
                         f"ioaware.distributed.shard(x, rank, world_size, layout), which refuses a length it "
                         f"cannot split equally")
    names = ("B", "Hq", "n", "E", "Hkv", "Ev")
    shapes = [dict(zip(names, t[:6])) for t in table]
    if any(s != shapes[0] for s in shapes):
        raise ValueError(f"q, k, v must have the same shapes on every rank; got {shapes} on ranks 0..{world - 1}")
    for i, (name, show) in enumerate((("q.dtype", lambda c: str(_DTYPES[c]).replace("torch.", "")),
                                      ("causal", bool), ("layout", lambda c: LAYOUTS[c]),
                                      ("scale", _bits_float)), start=6):
        values = [t[i] for t in table]
        if len(set(values)) > 1:
            err = TypeError if name == "q.dtype" else ValueError
            raise err(f"{name} must be the same on every rank, got {[show(x) for x in values]} on ranks "
                      f"0..{world - 1}")


def _gather_rows(group, world, device, error, fields) -> list[list[int]]:
    """All ranks' integer ``fields`` side by side (one ``all_gather`` of :data:`_ROW_WIDTH`
    integers). A rank that raised ``error`` sends a row marked 0 and re-raises it; the others
    raise a ValueError saying which ranks refused, so that every rank stops before any transfer."""
    row = torch.zeros(_ROW_WIDTH, dtype=torch.int64, device=device)
    if error is None:
        if len(fields) >= _ROW_WIDTH:
            raise ValueError(f"tensors of {len(fields) - 1} dimensions are more than this check takes")
        row[0] = 1
        row[1:1 + len(fields)] = torch.tensor(fields, dtype=torch.int64)
    rows = [torch.empty_like(row) for _ in range(world)]
    dist.all_gather(rows, row, group=group)
    if error is not None:
        raise error
    rows = [r.tolist() for r in rows]
    bad = [r for r, row in enumerate(rows) if row[0] == 0]
    if bad:
        raise ValueError(f"rank(s) {bad} of the group refused their inputs (their own errors name the "
                         f"argument); nothing was sent")
    return [row[1:1 + len(fields)] for row in rows]


def _group_rank_world(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention, shard's inverse unshard and their checks need torch.distributed "
                           "initialised: call torch.distributed.init_process_group (torchrun sets up its "
                           "environment) on every rank first")
    group = dist.group.WORLD if group is None else group
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("group: this process is not a member of the group it was given")
    return group, rank, dist.get_world_size(group)


def _collective_device(group):
    """The device a small collective on ``group`` uses: the current CUDA device for NCCL."""
    if "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_dim(name, dim, ndim):
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise ValueError(f"{name} must be an integer in [-{ndim}, {ndim}), got {dim!r}")
    return dim % ndim


def _float_bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def _bits_float(b: int) -> float:
    return struct.unpack("<d", struct.pack("<q", b))[0]


# ------------------------------------------------------------------------------------------------
# the ring
# ------------------------------------------------------------------------------------------------
class _Rotation:
    """``tensors`` sent to the next rank while as many arrive from the previous one, started on
    construction; :meth:`wait` returns the received tensors."""

    def __init__(self, ring: _Ring, tensors, tag: int):
        self.sent = tuple(tensors)                 # kept alive until the sends complete
        self.received = tuple(torch.empty_like(t) for t in self.sent)
        ops = [dist.P2POp(dist.isend, t, ring.next_peer, ring.group, tag + i) for i, t in enumerate(self.sent)]
        ops += [dist.P2POp(dist.irecv, t, ring.prev_peer, ring.group, tag + i)
                for i, t in enumerate(self.received)]
        self.works = dist.batch_isend_irecv(ops)

    def wait(self):
        for w in self.works:
            w.wait()
        return self.received


def _accumulator_dtype(x):
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _merge(out, lse, out_b, lse_b):
    """Merge a partial result ``(out_b, lse_b)`` into ``(out, lse)`` in place (online softmax).

    A block that saw no key for a row (``lse_b = -inf``) changes nothing; a row that had seen no
    key yet (``lse = -inf``) takes the block's result as it is; no NaN either way.
    """
    lse_b = lse_b.to(lse.dtype)
    weight = torch.sigmoid(lse_b - lse)                       # exp(lse_b) / (exp(lse) + exp(lse_b))
    weight = torch.where(torch.isneginf(lse_b), torch.zeros_like(weight), weight)
    out.sub_(weight.unsqueeze(-1) * (out - out_b.to(out.dtype)))
    lse.copy_(torch.logaddexp(lse, lse_b))


def _ring_forward(ring: _Ring, q, k, v):
    acc = _accumulator_dtype(q)
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=acc, device=q.device)
    lse = torch.full(q.shape[:-1], -math.inf, dtype=acc, device=q.device)
    kv = (k.contiguous(), v.contiguous())
    for step in range(ring.world_size):
        rotation = _Rotation(ring, kv, _KV_TAG) if step < ring.world_size - 1 else None
        for b in ring.blocks(step):
            out_b, lse_b = attention(q[:, :, b.q_rows], kv[0][:, :, b.k_rows], kv[1][:, :, b.k_rows],
                                     causal=b.causal, scale=ring.scale, return_lse=True, backend=ring.backend)
            _merge(out[:, :, b.q_rows], lse[:, :, b.q_rows], out_b, lse_b)
        if rotation is not None:
            kv = rotation.wait()
    return out.to(q.dtype), lse


def _ring_backward(ring: _Ring, q, k, v, out, lse, dout, dlse):
    """``(dq, dk, dv)``; ``dout`` or ``dlse`` may be None (no gradient arrives through it)."""
    acc = _accumulator_dtype(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = (k.contiguous(), v.contiguous())
    dout = dout.contiguous() if dout is not None else None
    carried = None           # brings the dK/dV accumulated so far for the K/V shard now held
    dk = dv = None
    for step in range(ring.world_size):
        rotation = _Rotation(ring, kv, _KV_TAG) if step < ring.world_size - 1 else None
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for b in ring.blocks(step):
            _pair_backward(ring, b, q, kv, out, lse, dout, dlse, dq, dk, dv)
        if carried is not None:
            dk_in, dv_in = carried.wait()
            dk += dk_in
            dv += dv_in
        if ring.world_size > 1:          # to the next rank; after the last step, to the shard's owner
            carried = _Rotation(ring, (dk, dv), _DKV_TAG)
        if rotation is not None:
            kv = rotation.wait()
    if carried is not None:
        dk, dv = carried.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _pair_backward(ring: _Ring, b: PairBlock, q, kv, out, lse, dout, dlse, dq, dk, dv):
    """Add one block's gradients into ``dq``, ``dk``, ``dv`` (recomputed from the global out and lse)."""
    q_b, k_b, v_b = q[:, :, b.q_rows], kv[0][:, :, b.k_rows], kv[1][:, :, b.k_rows]
    lse_b = lse[:, :, b.q_rows]
    kwargs = dict(causal=b.causal, scale=ring.scale, backend=ring.backend)
    if dout is not None:
        dq_b, dk_b, dv_b = attention_backward(q_b, k_b, v_b, out[:, :, b.q_rows], lse_b, dout[:, :, b.q_rows],
                                              **kwargs)
        dq[:, :, b.q_rows] += dq_b
        dk[:, :, b.k_rows] += dk_b
        dv[:, :, b.k_rows] += dv_b
    if dlse is not None:
        # d lse_i / d s_ij = P_ij: the backward's dS = P * (dP - D) with dP = 0 (zero values) and
        # D = rowsum(dO * O) = -dlse (O = -dlse in column 0, dO = 1 there) gives dS = P * dlse.
        out_l = torch.zeros_like(out[:, :, b.q_rows])
        out_l[..., 0] = -dlse[:, :, b.q_rows]
        dout_l = torch.zeros_like(out_l)
        dout_l[..., 0] = 1
        dq_b, dk_b, _ = attention_backward(q_b, k_b, torch.zeros_like(v_b), out_l, lse_b, dout_l, **kwargs)
        dq[:, :, b.q_rows] += dq_b
        dk[:, :, b.k_rows] += dk_b


class _RingAttention(torch.autograd.Function):
    """``(out, lse)`` of the ring forward; the backward turns the ring again."""

    @staticmethod
    def forward(ctx, q, k, v, ring):
        out, lse = _ring_forward(ring, q, k, v)
        ctx.ring = ring
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # every rank turns the ring, whether or not a gradient reached its outputs
        dq, dk, dv = _ring_backward(ctx.ring, q, k, v, out, lse, dout, dlse)
        return dq, dk, dv, None
