"""Input checking and canonical layouts for :mod:`ioaware.attention`.

Everything a user can get wrong is checked here, up front, with an error that names the
argument and what was expected. Nothing is silently reshaped: leading dimensions must match
exactly, masks must broadcast by NumPy's rules.

Canonical layout: ``q [B, Hq, Nq, d]``, ``k, v [B, Hkv, Nk, d]`` where B is the product of the
query's leading (batch) dimensions; masks ``[Bm, Hm, Mq, Nk]`` with each of Bm, Hm, Mq either
1 or full; block masks NumPy ``[Bb, Hb, n_blocks_q, n_blocks_k]``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .block_info import cdiv

__all__ = ["BlockMask", "Problem", "check_inputs", "is_torch", "torch_or_none"]


def torch_or_none():
    """The torch module if it is importable, else None (torch is an optional dependency)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        return None
    return torch


def is_torch(x) -> bool:
    torch = torch_or_none()
    return torch is not None and isinstance(x, torch.Tensor)


@dataclass(frozen=True)
class BlockMask:
    """A block-sparsity pattern: ``mask[..., m, n]`` says whether Q block m attends to K block n.

    ``mask`` is a boolean array (NumPy or torch) whose last two dimensions are
    ``(ceil(Nq / block_q), ceil(Nk / block_k))`` and whose leading dimensions broadcast to the
    query's ``[..., Hq]``. Tiles marked False are never computed; the result equals attention
    with the block mask expanded to an elementwise mask.
    """

    mask: Any
    block_q: int
    block_k: int

    def expand(self, seqlen_q: int, seqlen_k: int) -> np.ndarray:
        """The equivalent elementwise boolean mask ``[..., seqlen_q, seqlen_k]`` (NumPy)."""
        m = _to_numpy(self.mask).astype(bool)
        m = np.repeat(np.repeat(m, self.block_q, axis=-2), self.block_k, axis=-1)
        return m[..., :seqlen_q, :seqlen_k]


_FLOAT_NUMPY = (np.float16, np.float32, np.float64)


def _to_numpy(x):
    if is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def _check_block(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


@dataclass
class Problem:
    """A checked attention problem in canonical layout (see the module docstring)."""

    q: Any
    k: Any
    v: Any
    kind: str                   # "numpy" or "torch"
    device: str                 # "cpu" or e.g. "cuda:0"
    dtype: Any                  # the inputs' (common) dtype
    q_shape: tuple              # the query's original shape, to restore the output
    kv_shape: tuple             # the keys' original shape, to restore dk/dv
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    scale: float
    causal: bool
    mask: Any                   # None or [Bm, Hm, Mq, Nk] bool, same kind/device as q
    bias: Any                   # None or [Bm, Hm, Mq, Nk] float32 (additive)
    block_mask: np.ndarray | None   # None or NumPy bool [Bb, Hb, nbq, nbk]
    block_q: int | None
    block_k: int | None
    dropout_p: float
    seed: int

    @property
    def group(self) -> int:
        """Query heads per KV head (1 unless GQA/MQA)."""
        return self.heads_q // self.heads_kv

    def restore_q(self, x):
        """Reshape a ``[B, Hq, Nq, d]`` result to the query's original shape."""
        return x.reshape(self.q_shape)

    def restore_lse(self, x):
        return x.reshape(self.q_shape[:-1])

    def restore_kv(self, x):
        return x.reshape(self.kv_shape)


def _canonical(x):
    """[..., H, N, d] -> [B, H, N, d] (a view when possible)."""
    shape = tuple(x.shape)
    if len(shape) == 2:
        return x.reshape((1, 1) + shape)
    if len(shape) == 3:
        return x.reshape((1,) + shape)
    b = math.prod(shape[:-3])
    return x.reshape((b,) + shape[-3:])


def _broadcast_mask(name, mask, target, kind, torch):
    """Check ``mask`` broadcasts to ``target`` ([..., Hq, Nq, Nk]); return [Bm, Hm, Mq, Nk]."""
    shape = tuple(mask.shape)
    if len(shape) > len(target):
        raise ValueError(f"{name} has shape {shape}, which does not broadcast to {tuple(target)}")
    padded = (1,) * (len(target) - len(shape)) + shape
    for have, want in zip(padded, target):
        if have not in (1, want):
            raise ValueError(f"{name} has shape {shape}, which does not broadcast to {tuple(target)}"
                             f" ([..., heads, Nq, Nk] of the query)")
    x = mask.reshape(padded)
    if len(padded) == 2:
        x = x.reshape((1, 1) + padded)
    elif len(padded) == 3:
        x = x.reshape((1,) + padded)
    else:
        lead = padded[:-3]
        if all(s == 1 for s in lead):
            x = x.reshape((1,) + padded[-3:])
        else:
            full = tuple(target[:-3]) + padded[-3:]
            x = (x.expand(full) if kind == "torch" else np.broadcast_to(x, full))
            x = x.reshape((math.prod(full[:-3]),) + padded[-3:])
    if x.shape[-1] == 1 and target[-1] != 1:
        full = tuple(x.shape[:-1]) + (target[-1],)
        x = x.expand(full) if kind == "torch" else np.broadcast_to(x, full)
    return x.contiguous() if kind == "torch" else np.ascontiguousarray(x)


def check_inputs(q, k, v, *, causal=False, mask=None, bias=None, block_mask=None, scale=None,
                 dropout_p=0.0, seed=None, block_q=None, block_k=None, check_finite=True) -> Problem:
    """Validate user inputs and bring them to the canonical layout. Raises TypeError/ValueError."""
    torch = torch_or_none()
    # -- types, devices, dtypes --
    kinds = ["torch" if is_torch(x) else "numpy" if isinstance(x, np.ndarray) else None for x in (q, k, v)]
    for name, x, kind in zip("qkv", (q, k, v), kinds):
        if kind is None:
            raise TypeError(f"{name} must be a NumPy array or a torch tensor, got {type(x).__name__}")
    if len(set(kinds)) != 1:
        raise TypeError(f"q, k and v must all be NumPy arrays or all torch tensors, got {kinds}")
    kind = kinds[0]
    dtypes = [_dtype_name(x) for x in (q, k, v)]
    allowed = ("float16", "float32", "bfloat16") if kind == "torch" else ("float16", "float32")
    for name, dt in zip("qkv", dtypes):
        if dt not in allowed:
            raise TypeError(f"{name} has dtype {dt}; expected one of {', '.join(allowed)}")
    if len(set(dtypes)) != 1:
        raise TypeError(f"q, k and v must have the same dtype, got {dtypes}")
    device = "cpu"
    if kind == "torch":
        devices = [str(x.device) for x in (q, k, v)]
        if len(set(devices)) != 1:
            raise ValueError(f"q, k and v must be on the same device, got {devices}")
        device = devices[0]

    # -- shapes --
    for name, x in zip("qkv", (q, k, v)):
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape [..., N, d] with at least 2 dimensions, got {tuple(x.shape)}")
    if not (q.ndim == k.ndim == v.ndim):
        raise ValueError(f"q, k and v must have the same number of dimensions, got shapes "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dimension, got {q.shape[-1]} and {k.shape[-1]}")
    if q.ndim >= 4 and tuple(q.shape[:-3]) != tuple(k.shape[:-3]):
        raise ValueError(f"q and k must have the same batch dimensions, got {tuple(q.shape[:-3])} "
                         f"and {tuple(k.shape[:-3])}")
    if q.ndim == 2:
        heads_q = heads_kv = 1
    else:
        heads_q, heads_kv = q.shape[-3], k.shape[-3]
        if heads_kv == 0 or heads_q % heads_kv != 0:
            raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                             f"of key/value heads ({heads_kv})")
    seqlen_q, head_dim = q.shape[-2], q.shape[-1]
    seqlen_k = k.shape[-2]
    for name, value in (("q's sequence length", seqlen_q), ("k's sequence length", seqlen_k),
                        ("the head dimension", head_dim)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if any(s == 0 for s in q.shape[:-2]):
        raise ValueError(f"q has an empty leading dimension: {tuple(q.shape)}")

    # -- scalars --
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float, np.floating)):
        raise TypeError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    dropout_p = float(dropout_p)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    if seed is None:
        seed = (int(torch.randint(0, 2**62, ()).item()) if kind == "torch"
                else int(np.random.default_rng().integers(0, 2**62)))
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    block_q = _check_block("block_q", block_q)
    block_k = _check_block("block_k", block_k)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {causal!r}")

    target = tuple(q.shape[:-1]) + (seqlen_k,)

    # -- elementwise mask --
    mask4 = None
    if mask is not None:
        if kind == "torch":
            if not is_torch(mask):
                raise TypeError("mask must be a torch tensor when q, k, v are torch tensors")
            if str(mask.device) != device:
                raise ValueError(f"mask is on {mask.device} but q is on {device}")
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
        else:
            if not isinstance(mask, np.ndarray):
                raise TypeError(f"mask must be a NumPy array when q, k, v are NumPy arrays, got {type(mask).__name__}")
            if mask.dtype != np.bool_:
                raise TypeError(f"mask must be boolean (True = may attend), got {mask.dtype}")
        mask4 = _broadcast_mask("mask", mask, target, kind, torch)
    bias4 = None
    if bias is not None:
        bias4 = _broadcast_mask("attn_mask", bias, target, kind, torch)

    # -- block mask --
    bm4 = None
    if block_mask is not None:
        if isinstance(block_mask, tuple) and len(block_mask) == 2 and isinstance(block_mask[1], tuple):
            block_mask = BlockMask(block_mask[0], *block_mask[1])
        if isinstance(block_mask, BlockMask):
            bq = _check_block("block_mask.block_q", block_mask.block_q)
            bk = _check_block("block_mask.block_k", block_mask.block_k)
            if (block_q not in (None, bq)) or (block_k not in (None, bk)):
                raise ValueError(f"block_q/block_k ({block_q}, {block_k}) differ from the block mask's block "
                                 f"shape ({bq}, {bk}); tiles must be the block mask's blocks")
            block_q, block_k, raw = bq, bk, block_mask.mask
        else:
            if block_q is None or block_k is None:
                raise ValueError("block_mask needs its block shape: pass ioaware.BlockMask(mask, block_q, "
                                 "block_k), a (mask, (block_q, block_k)) tuple, or block_q= and block_k=")
            raw = block_mask
        arr = _to_numpy(raw)
        if arr.dtype != np.bool_:
            raise TypeError(f"block_mask must be boolean, got {arr.dtype}")
        btarget = tuple(q.shape[:-2]) + (cdiv(seqlen_q, block_q), cdiv(seqlen_k, block_k))
        bm4 = _broadcast_mask("block_mask", arr, btarget, "numpy", None)

    # -- values --
    if check_finite and device == "cpu":
        for name, x in zip("qkv", (q, k, v)):
            finite = bool(torch.isfinite(x).all()) if kind == "torch" else bool(np.isfinite(x).all())
            if not finite:
                raise ValueError(f"{name} contains NaN or infinite values")

    return Problem(
        q=_canonical(q), k=_canonical(k), v=_canonical(v),
        kind=kind, device=device, dtype=q.dtype, q_shape=tuple(q.shape), kv_shape=tuple(k.shape),
        batch=int(math.prod(q.shape[:-3])) if q.ndim >= 4 else 1,
        heads_q=int(heads_q), heads_kv=int(heads_kv), seqlen_q=int(seqlen_q), seqlen_k=int(seqlen_k),
        head_dim=int(head_dim), scale=scale, causal=bool(causal), mask=mask4, bias=bias4,
        block_mask=bm4, block_q=block_q, block_k=block_k, dropout_p=dropout_p, seed=int(seed),
    )
