"""Input checking and canonical layouts for :mod:`ioaware.attention`.

Everything a user can get wrong is checked here, up front, with an error that names the
argument and what was expected. Nothing is silently reshaped: leading dimensions must match
exactly, masks must broadcast by NumPy's rules.

Canonical layout: ``q [B, Hq, Nq, E]``, ``k [B, Hkv, Nk, E]``, ``v [B, Hkv, Nk, Ev]`` where B is
the product of the query's leading (batch) dimensions; masks ``[Bm, Hm, Mq, Nk]`` with each of
Bm, Hm, Mq either 1 or full; block masks NumPy ``[Bb, Hb, n_blocks_q, n_blocks_k]``. Any size
may be 0.

Order of the checks: types and dtypes, shapes, scalars, then the cost (:mod:`ioaware._cost`:
memory and time estimated from the shapes, before any mask is broadcast or input copied), then
the masks. Checks that read values (:func:`check_values`: NaN and infinity in CPU inputs) are
separate, so that a traced call (``torch.compile``) runs them inside the operator, not in the
graph.

:func:`sdpa_arguments` translates ``torch.nn.functional.scaled_dot_product_attention``'s
arguments (broadcasting, ``enable_gqa``, boolean / float / ``CausalBias`` masks) into these.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ._cost import check_cost
from .block_info import CAUSAL_ALIGNMENTS, band_offsets, cdiv, check_window_size
from .tiled import DEFAULT_BLOCK_K, DEFAULT_BLOCK_Q

__all__ = ["BlockMask", "Problem", "SdpaArguments", "check_inputs", "check_values", "sdpa_arguments", "parse_causal",
           "is_torch", "torch_or_none", "lse_dtype", "check_cache_seqlens"]


def torch_or_none():
    """The torch module if it is importable, else None (torch is an optional dependency)."""
    try:
        import torch
    except ImportError:  # pragma: no cover - exercised only without torch
        return None
    return torch


def is_torch(x) -> bool:
    """Whether ``x`` is a torch tensor (False without torch)."""
    tensor = _TENSOR_TYPE[0]
    if tensor is None:
        torch = torch_or_none()
        tensor = _TENSOR_TYPE[0] = () if torch is None else torch.Tensor   # () matches nothing
    return isinstance(x, tensor)


_TENSOR_TYPE: list = [None]     # torch.Tensor once looked up, () without torch


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


_FLOAT_NAMES = {"numpy": ("float16", "float32", "float64"),
                "torch": ("float16", "bfloat16", "float32", "float64")}


def _to_numpy(x):
    if is_torch(x):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _dtype_name(x) -> str:
    return str(x.dtype).replace("torch.", "")


def lse_dtype(dtype_name: str) -> str:
    """The logsumexp's dtype for inputs of ``dtype_name``: float64 for float64, float32 otherwise."""
    return "float64" if dtype_name == "float64" else "float32"


def _check_block(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive integer, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def _scalar(name, value, what="a float"):
    """A Python number, or a 0-d NumPy array / torch tensor (as PyTorch accepts), as a float."""
    if is_torch(value) or isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise TypeError(f"{name} must be {what} or a 0-d tensor, got a tensor of shape {tuple(value.shape)}")
        if str(value.dtype) in ("bool", "torch.bool"):
            raise TypeError(f"{name} must be {what}, got a boolean tensor")
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    return float(value)


def parse_causal(causal) -> tuple[bool, str]:
    """``causal`` as ``(is_causal, alignment)``: False, True (top-left), "top_left" or "bottom_right"."""
    if isinstance(causal, (bool, np.bool_)):
        return bool(causal), "top_left"
    if isinstance(causal, str) and causal in CAUSAL_ALIGNMENTS:
        return True, causal
    raise TypeError(f"causal must be a bool, 'top_left' or 'bottom_right', got {causal!r}")


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
    kv_shape: tuple             # the keys' original shape, to restore dk
    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int               # E: of q and k
    scale: float
    causal: bool
    mask: Any                   # None or [Bm, Hm, Mq, Nk] bool, same kind/device as q
    bias: Any                   # None or [Bm, Hm, Mq, Nk] float (additive)
    block_mask: np.ndarray | None   # None or NumPy bool [Bb, Hb, nbq, nbk]
    block_q: int | None
    block_k: int | None
    dropout_p: float
    seed: int
    causal_alignment: str = "top_left"   # "top_left" or "bottom_right" (see ioaware.block_info)
    value_dim: int | None = None         # Ev: of v (None: equal to head_dim)
    v_shape: tuple | None = None         # the values' original shape, to restore dv (None: kv_shape)
    window_size: tuple | None = None     # (left, right) sliding window, or None (see ioaware.block_info)
    cache_seqlens: Any = None            # None, or int32 [B] valid key lengths (NumPy, or torch on q's device)

    def __post_init__(self):
        if self.value_dim is None:
            self.value_dim = self.head_dim
        if self.v_shape is None:
            self.v_shape = self.kv_shape

    @property
    def group(self) -> int:
        """Query heads per KV head (1 unless GQA/MQA)."""
        return self.heads_q // self.heads_kv if self.heads_kv else 1

    @property
    def dtype_name(self) -> str:
        return _dtype_name(self)

    @property
    def out_shape(self) -> tuple:
        """The output's shape: the query's with the value head dimension last."""
        return tuple(self.q_shape[:-1]) + (self.value_dim,)

    @property
    def trivial(self) -> bool:
        """Whether there is nothing to compute: no query row (empty outputs), or no key (output
        zeros, logsumexp -inf)."""
        return self.batch * self.heads_q * self.seqlen_q == 0 or self.seqlen_k == 0

    def restore_q(self, x):
        """Reshape a ``[B, Hq, Nq, Ev]`` output (or ``[B, Hq, Nq, E]`` dq) to the user's shape."""
        return x.reshape(tuple(self.q_shape[:-1]) + (x.shape[-1],))

    def restore_lse(self, x):
        return x.reshape(self.q_shape[:-1])

    def restore_kv(self, x):
        """Reshape a canonical dk to the keys' shape."""
        return x.reshape(self.kv_shape)

    def restore_v(self, x):
        """Reshape a canonical dv to the values' shape."""
        return x.reshape(self.v_shape)


def _canonical(x):
    """[..., H, N, d] -> [B, H, N, d] (a view when possible)."""
    shape = tuple(x.shape)
    if len(shape) == 2:
        return x.reshape((1, 1) + shape)
    if len(shape) == 3:
        return x.reshape((1,) + shape)
    b = math.prod(shape[:-3])
    return x.reshape((b,) + shape[-3:])


def _check_broadcast(name, shape, target):
    """Raise unless ``shape`` broadcasts to ``target`` ([..., Hq, Nq, Nk]); return it left-padded."""
    shape = tuple(shape)
    if len(shape) > len(target):
        raise ValueError(f"{name} has shape {shape}, which does not broadcast to {tuple(target)}")
    padded = (1,) * (len(target) - len(shape)) + shape
    for have, want in zip(padded, target):
        if have not in (1, want):
            raise ValueError(f"{name} has shape {shape}, which does not broadcast to {tuple(target)}"
                             f" ([..., heads, Nq, Nk] of the query)")
    return padded


def _broadcast_elements(padded, target):
    """Elements of the canonical ``[Bm, Hm, Mq, Nk]`` array :func:`_broadcast_mask` makes."""
    lead = padded[:-3]
    b = 1 if all(s == 1 for s in lead) else math.prod(target[:-3])
    return b * math.prod(padded[-3:-1]) * target[-1]


def _broadcast_mask(name, mask, target, kind, torch):
    """Check ``mask`` broadcasts to ``target`` ([..., Hq, Nq, Nk]); return [Bm, Hm, Mq, Nk]."""
    padded = _check_broadcast(name, mask.shape, target)
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


def _is_contiguous(x) -> bool:
    if is_torch(x):
        return x.is_contiguous()
    return bool(x.flags.c_contiguous)


def check_inputs(q, k, v, *, causal=False, mask=None, bias=None, block_mask=None, scale=None,
                 dropout_p=0.0, seed=None, block_q=None, block_k=None, window_size=None,
                 backend=None) -> Problem:
    """Validate user inputs and bring them to the canonical layout. Raises TypeError/ValueError.

    ``window_size`` is FlashAttention-2's ``(left, right)`` sliding window, bottom-right
    aligned (:mod:`ioaware.block_info`); None or ``(-1, -1)`` is no window. With a window,
    top-left causal masking (``causal=True`` or ``"top_left"``) and ``Nq != Nk`` is refused:
    the two rules would be aligned differently.

    ``backend`` (a resolved backend name) turns on the cost check of :mod:`ioaware._cost`
    (``MemoryError`` / :class:`~ioaware._cost.PerformanceWarning`), made before any mask is
    broadcast or input copied. Values are not read here: see :func:`check_values`.
    """
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
    allowed = _FLOAT_NAMES[kind]
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
    if tuple(k.shape[:-1]) != tuple(v.shape[:-1]):
        raise ValueError(f"k and v must have the same shape except the last (head) dimension, got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dimension, got {q.shape[-1]} and {k.shape[-1]}")
    if q.ndim >= 4 and tuple(q.shape[:-3]) != tuple(k.shape[:-3]):
        raise ValueError(f"q and k must have the same batch dimensions, got {tuple(q.shape[:-3])} "
                         f"and {tuple(k.shape[:-3])}")
    if q.ndim == 2:
        heads_q = heads_kv = 1
    else:
        heads_q, heads_kv = int(q.shape[-3]), int(k.shape[-3])
        if (heads_kv == 0 and heads_q != 0) or (heads_kv and heads_q % heads_kv != 0):
            raise ValueError(f"the number of query heads ({heads_q}) must be a multiple of the number "
                             f"of key/value heads ({heads_kv})")
    seqlen_q, head_dim = int(q.shape[-2]), int(q.shape[-1])
    seqlen_k, value_dim = int(k.shape[-2]), int(v.shape[-1])
    batch = int(math.prod(q.shape[:-3])) if q.ndim >= 4 else 1

    # -- scalars --
    scale = (1.0 / math.sqrt(head_dim) if head_dim else 1.0) if scale is None else _scalar("scale", scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    dropout_p = _scalar("dropout_p", dropout_p, "a float in [0, 1]")
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"dropout_p must be in [0, 1], got {dropout_p}")
    seed = _check_seed(seed, dropout_p, kind, torch)
    block_q = _check_block("block_q", block_q)
    block_k = _check_block("block_k", block_k)
    is_causal, alignment = parse_causal(causal)
    window_size = check_window_size(window_size)
    if window_size is not None and is_causal and alignment == "top_left" and seqlen_q != seqlen_k:
        raise ValueError(
            f"window_size={window_size} with causal={causal!r} (top-left) and Nq={seqlen_q} != "
            f"Nk={seqlen_k} would mix two alignments: the window is bottom-right aligned "
            f"(FlashAttention-2's), the causal mask top-left; pass causal='bottom_right' (the "
            f"queries are the last Nq positions) or put the top-left pattern into mask")
    band = band_offsets(seqlen_q, seqlen_k, is_causal, alignment, window_size)

    target = tuple(q.shape[:-1]) + (seqlen_k,)

    # -- masks: types and shapes (nothing broadcast yet) --
    if mask is not None:
        _check_mask_type("mask", mask, kind, device, torch, boolean=True)
        mask_padded = _check_broadcast("mask", mask.shape, target)
    if bias is not None:
        _check_mask_type("attn_mask", bias, kind, device, torch, boolean=False)
        bias_padded = _check_broadcast("attn_mask", bias.shape, target)
    if block_mask is not None:
        block_mask, block_q, block_k = _block_mask_parts(block_mask, block_q, block_k)

    # -- cost, from the shapes alone --
    if backend is not None:
        n_groups = 1 if block_mask is None else math.prod(block_mask.shape[:-2])
        check_cost(
            backend=backend, kind=kind, device=device, batch=batch, heads_q=heads_q, heads_kv=heads_kv,
            seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, value_dim=value_dim,
            itemsize=q.element_size() if kind == "torch" else q.itemsize,
            compute_itemsize=8 if dtypes[0] == "float64" else 4,
            band=band,
            block_q=block_q or DEFAULT_BLOCK_Q, block_k=block_k or DEFAULT_BLOCK_K, n_block_groups=n_groups,
            copied_inputs=[math.prod(x.shape) for x in (q, k, v)                # bfloat16 becomes float32
                           if not _is_contiguous(x) or dtypes[0] == "bfloat16"],
            mask_elements=_broadcast_elements(mask_padded, target) if mask is not None else 0,
            bias_elements=_broadcast_elements(bias_padded, target) if bias is not None else 0,
            q_shape=tuple(q.shape), k_shape=tuple(k.shape))

    # -- masks: broadcast to the canonical layout --
    mask4 = _broadcast_mask("mask", mask, target, kind, torch) if mask is not None else None
    bias4 = _broadcast_mask("attn_mask", bias, target, kind, torch) if bias is not None else None
    bm4 = None
    if block_mask is not None:
        if 0 in (seqlen_q, seqlen_k):
            raise ValueError("block_mask needs non-empty q and k sequences")
        btarget = tuple(q.shape[:-2]) + (cdiv(seqlen_q, block_q), cdiv(seqlen_k, block_k))
        bm4 = _broadcast_mask("block_mask", block_mask, btarget, "numpy", None)

    return Problem(
        q=_canonical(q), k=_canonical(k), v=_canonical(v),
        kind=kind, device=device, dtype=q.dtype, q_shape=tuple(q.shape), kv_shape=tuple(k.shape),
        batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q, seqlen_k=seqlen_k,
        head_dim=head_dim, scale=scale, causal=is_causal, mask=mask4, bias=bias4,
        block_mask=bm4, block_q=block_q, block_k=block_k, dropout_p=dropout_p, seed=seed,
        causal_alignment=alignment, value_dim=value_dim, v_shape=tuple(v.shape), window_size=window_size,
    )


def _check_seed(seed, dropout_p, kind, torch) -> int:
    if seed is None:
        if dropout_p == 0.0:
            return 0                                   # unused: no random numbers are drawn
        if kind == "torch":
            return int(torch.randint(0, 2**62, ()).item())
        return int(np.random.default_rng().integers(0, 2**62))
    if is_torch(seed) or isinstance(seed, np.ndarray):
        if seed.ndim != 0 or str(seed.dtype).replace("torch.", "") not in ("int64", "int32", "uint64", "uint32"):
            raise ValueError(f"seed must be an integer in [0, 2**64) or a 0-d integer tensor, got {seed!r}")
        seed = int(seed.item())
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


def _check_mask_type(name, mask, kind, device, torch, *, boolean):
    if kind == "torch":
        if not is_torch(mask):
            raise TypeError(f"{name} must be a torch tensor when q, k, v are torch tensors")
        if str(mask.device) != device:
            raise ValueError(f"{name} is on {mask.device} but q is on {device}")
        is_bool, is_float = mask.dtype == torch.bool, mask.dtype.is_floating_point
    else:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"{name} must be a NumPy array when q, k, v are NumPy arrays, got {type(mask).__name__}")
        is_bool, is_float = mask.dtype == np.bool_, mask.dtype.kind == "f"
    if boolean and not is_bool:
        raise TypeError(f"{name} must be boolean (True = may attend), got {mask.dtype}")
    if not boolean and not is_float:
        raise TypeError(f"{name} must be a floating-point additive mask, got {mask.dtype}")


def _block_mask_parts(block_mask, block_q, block_k):
    """``(NumPy bool mask, block_q, block_k)`` from any accepted block-mask form."""
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
    return arr, block_q, block_k


def _stored_elements(x):
    """The elements ``x`` really stores: stride-0 (broadcast) dimensions taken once."""
    strides = x.stride() if is_torch(x) else x.strides
    return x[tuple(slice(0, 1) if st == 0 else slice(None) for st in strides)]


def check_values(pb: Problem, names=("q", "k", "v")) -> None:
    """Refuse NaN or infinite values in CPU inputs (CUDA inputs are not scanned: that would
    synchronise the device). Broadcast (stride-0) inputs are scanned once per stored element."""
    if pb.device != "cpu":
        return
    for name, x in zip(names, (pb.q, pb.k, pb.v)):
        x = _stored_elements(x)
        finite = bool(x.isfinite().all()) if pb.kind == "torch" else bool(np.isfinite(x).all())
        if not finite:
            raise ValueError(f"{name} contains NaN or infinite values")


# ------------------------------------------------------------------------------------------------
# torch.nn.functional.scaled_dot_product_attention's arguments
# ------------------------------------------------------------------------------------------------
def _causal_bias_class(torch):
    try:
        from torch.nn.attention.bias import CausalBias
    except ImportError:  # pragma: no cover - torch < 2.2
        return None
    return CausalBias


def _lcm(a, b):
    return a * b // math.gcd(a, b)


def _broadcast_shapes(name_shapes):
    """NumPy/torch broadcasting of several shapes, with an error naming the arguments."""
    ndim = max(len(s) for _, s in name_shapes)
    out = []
    for i in range(ndim):
        size = 1
        for _, s in name_shapes:
            j = i - ndim + len(s)
            if j < 0 or s[j] == 1:
                continue
            if size != 1 and s[j] != size:
                desc = ", ".join(f"{n} {tuple(x)}" for n, x in name_shapes)
                raise ValueError(f"the leading (batch and head) dimensions of {desc} do not broadcast")
            size = s[j]
        out.append(size)
    return tuple(out)


class SdpaArguments(NamedTuple):
    """``scaled_dot_product_attention``'s arguments in :func:`check_inputs`' terms (see :func:`sdpa_arguments`)."""

    q: Any
    k: Any
    v: Any
    causal: bool | str          # False, True (top-left) or "bottom_right"
    mask: Any                   # boolean attn_mask, or None
    bias: Any                   # float attn_mask, or None
    zeros_shape: tuple | None   # not None: PyTorch returns zeros of this shape without computing


def sdpa_arguments(query, key, value, attn_mask, is_causal, enable_gqa) -> SdpaArguments:
    """``scaled_dot_product_attention``'s arguments in :func:`check_inputs`' terms.

    ``q, k, v`` are broadcast against each other as PyTorch's math backend does (leading
    dimensions by NumPy's rules, views where possible; with ``enable_gqa`` the key/value head
    counts divide the query's), ``causal`` is False, True or ``"bottom_right"`` (a
    ``causal_lower_right`` mask), and the attention mask is split into a boolean ``mask`` or a
    float ``bias``. As PyTorch 2.13 does, an empty query sequence or an empty ``value`` gives
    zeros of shape ``query.shape[:-1] + (Ev,)`` at once (``zeros_shape``), without broadcasting
    or checking the other shapes.
    """
    torch = torch_or_none()
    is_t = is_torch(query)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not (is_torch(x) or isinstance(x, np.ndarray)):
            raise TypeError(f"{name} must be a torch tensor (or a NumPy array), got {type(x).__name__}")
        if is_torch(x) != is_t:
            raise TypeError(f"query, key and value must all be torch tensors or all NumPy arrays, got "
                            f"{type(query).__name__} query and {type(x).__name__} {name}")
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions ([..., L, E]), got shape {tuple(x.shape)}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool, got {is_causal!r}")
    if not isinstance(enable_gqa, (bool, np.bool_)):
        raise TypeError(f"enable_gqa must be a bool, got {enable_gqa!r}")

    # -- the attention mask: CausalBias, boolean, or float --
    causal, mask, bias = bool(is_causal), None, None
    causal_bias = _causal_bias_class(torch) if is_t else None
    if attn_mask is not None and causal_bias is not None and isinstance(attn_mask, causal_bias):
        if is_causal:
            raise ValueError("attn_mask is a CausalBias and is_causal=True: CausalBias should not be used "
                             "with is_causal=True (as in PyTorch)")
        want = (query.shape[-2], key.shape[-2])
        have = (attn_mask.seq_len_q, attn_mask.seq_len_kv)
        if tuple(have) != tuple(want):
            raise ValueError(f"attn_mask is a CausalBias for (seq_len_q, seq_len_kv) = {have}, but query and key "
                             f"have sequence lengths {want}")
        lower_right = attn_mask.variant.name == "LOWER_RIGHT"
        causal = "bottom_right" if lower_right else True
    elif attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask and is_causal=True cannot both be set (PyTorch documents this as an "
                             "error); put the causal pattern into attn_mask")
        if is_t != is_torch(attn_mask):
            raise TypeError(f"attn_mask must be a {'torch tensor' if is_t else 'NumPy array'} like query, "
                            f"got {type(attn_mask).__name__}")
        dt = attn_mask.dtype
        if dt == (torch.bool if is_t else np.bool_):
            mask = attn_mask
        elif dt == query.dtype or dt == (torch.float32 if is_t else np.float32):
            if getattr(attn_mask, "requires_grad", False):
                raise ValueError("attn_mask requires grad, but gradients do not flow into a float attn_mask here "
                                 "(detach it, or use torch's own scaled_dot_product_attention)")
            bias = attn_mask
        else:
            raise TypeError(f"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                            f"attn_mask.dtype: {dt} and query.dtype: {query.dtype} instead.")

    # -- PyTorch's shortcut for empty inputs --
    if query.shape[-2] == 0 or math.prod(value.shape) == 0:
        return SdpaArguments(query, key, value, causal, mask, bias, tuple(query.shape[:-1]) + (value.shape[-1],))
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(f"key and value must have the same sequence length, got {key.shape[-2]} and {value.shape[-2]}")
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(f"query and key must have the same embedding dimension, got {query.shape[-1]} and "
                         f"{key.shape[-1]}")

    # -- heads (enable_gqa) and broadcasting of the leading dimensions --
    if enable_gqa:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.ndim < 3:
                raise ValueError(f"enable_gqa=True needs a heads dimension ([..., H, L, E]) in {name}, "
                                 f"got shape {tuple(x.shape)}")
        hq, hk, hv = query.shape[-3], key.shape[-3], value.shape[-3]
        if hk == 0 or hv == 0 or hq % hk or hq % hv:
            raise ValueError(f"with enable_gqa=True the number of key heads ({hk}) and value heads ({hv}) must "
                             f"divide the number of query heads ({hq})")
        hkv = _lcm(hk, hv)
        key, value = _repeat_heads(key, hkv // hk, is_t), _repeat_heads(value, hkv // hv, is_t)
        lead = _broadcast_shapes([("query", query.shape[:-3]), ("key", key.shape[:-3]),
                                  ("value", value.shape[:-3])])
        q = _expand(query, lead + tuple(query.shape[-3:]), is_t)
        k = _expand(key, lead + tuple(key.shape[-3:]), is_t)
        v = _expand(value, lead + tuple(value.shape[-3:]), is_t)
        return SdpaArguments(q, k, v, causal, mask, bias, None)
    hq = query.shape[-3] if query.ndim >= 3 else None
    hk = key.shape[-3] if key.ndim >= 3 else None
    hv = value.shape[-3] if value.ndim >= 3 else None
    if hq is not None and hk is not None and hq != hk and 1 not in (hq, hk):
        raise ValueError(f"query has {hq} heads but key has {hk}; pass enable_gqa=True for grouped-query "
                         f"attention")
    lead = _broadcast_shapes([("query", query.shape[:-2]), ("key", key.shape[:-2]), ("value", value.shape[:-2])])
    if not lead:                                         # all [L, E]
        return SdpaArguments(query, key, value, causal, mask, bias, None)
    heads = lead[-1]
    # A single key/value head serves every query head (MQA, without copying); otherwise k and v
    # take the broadcast head count.
    kv_heads = 1 if (hk in (None, 1) and hv in (None, 1)) else heads
    q = _expand(query, lead + tuple(query.shape[-2:]), is_t)
    k = _expand(key, lead[:-1] + (kv_heads,) + tuple(key.shape[-2:]), is_t)
    v = _expand(value, lead[:-1] + (kv_heads,) + tuple(value.shape[-2:]), is_t)
    return SdpaArguments(q, k, v, causal, mask, bias, None)


def _repeat_heads(x, repeats, is_t):
    if repeats == 1:
        return x
    return x.repeat_interleave(repeats, dim=-3) if is_t else np.repeat(x, repeats, axis=-3)


def _expand(x, shape, is_t):
    """A broadcast view of ``x`` with ``shape`` (x itself when it has that shape already)."""
    if tuple(x.shape) == tuple(shape):
        return x
    if is_t:
        return x.expand(shape)
    return np.broadcast_to(x, shape)


def check_cache_seqlens(cache_seqlens, pb: Problem):
    """``cache_seqlens`` (an int, or an integer array / tensor of one length per batch row,
    ``[B]`` with B the product of the query's leading dimensions) as ``(host, lengths)``: the
    lengths as a NumPy int64 array (read once, to check them: a length outside ``[0, Nk]``
    would read past the cache) and as the kernels take them (NumPy int32, or a torch int32
    tensor on q's device). A torch tensor already on q's CUDA device is not read (``host`` is
    None): reading it would make every decoding step wait for the GPU and could not be captured
    in a CUDA graph; the split-KV kernel checks each length itself (a row whose length lies
    outside ``[0, Nk]`` comes out NaN), and the paths without it read the lengths then."""
    torch = torch_or_none()
    if isinstance(cache_seqlens, bool):
        raise TypeError("cache_seqlens must be an int or an integer array of one length per batch row, "
                        "got a bool")
    if isinstance(cache_seqlens, (int, np.integer)):
        host = np.full(pb.batch, int(cache_seqlens), dtype=np.int64)
    elif is_torch(cache_seqlens) or isinstance(cache_seqlens, np.ndarray):
        dt = _dtype_name(cache_seqlens)
        if not (dt.startswith("int") or dt.startswith("uint")):
            raise TypeError(f"cache_seqlens must hold integers, got dtype {dt}")
        if tuple(cache_seqlens.shape) != (pb.batch,):
            raise ValueError(f"cache_seqlens must have shape ({pb.batch},): one length per batch row of q "
                             f"(the product of its leading dimensions), got {tuple(cache_seqlens.shape)}")
        if is_torch(cache_seqlens):
            if pb.kind == "torch" and cache_seqlens.device != pb.q.device and cache_seqlens.device.type != "cpu":
                raise ValueError(f"cache_seqlens is on {cache_seqlens.device} but q is on {pb.q.device}")
            if pb.kind == "torch" and cache_seqlens.device.type == "cuda":
                return None, cache_seqlens.detach().to(torch.int32).contiguous()
            host = cache_seqlens.detach().cpu().numpy().astype(np.int64)
        else:
            host = cache_seqlens.astype(np.int64)
    else:
        raise TypeError(f"cache_seqlens must be an int or an integer array of one length per batch row, got "
                        f"{type(cache_seqlens).__name__}")
    if host.size and (host.min() < 0 or host.max() > pb.seqlen_k):
        bad = host[(host < 0) | (host > pb.seqlen_k)][0]
        raise ValueError(f"cache_seqlens must lie in [0, Nk={pb.seqlen_k}] (keys past Nk do not exist), "
                         f"got {int(bad)}")
    if pb.kind == "torch":
        if is_torch(cache_seqlens) and cache_seqlens.device == pb.q.device:
            lengths = cache_seqlens.to(torch.int32).contiguous()
        else:
            lengths = torch.from_numpy(host.astype(np.int32)).to(pb.q.device)
    else:
        lengths = host.astype(np.int32)
    return host, lengths
