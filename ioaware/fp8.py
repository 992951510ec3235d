"""FP8 attention forward, FlashAttention-3 style: e4m3 inputs with per-(batch, head) descales.

This module owns the user side of FP8 attention: quantising Q, K and V to
``torch.float8_e4m3fn`` with their descales (:func:`quantize`), FlashAttention-3's incoherent
processing (:func:`incoherent`, :func:`incoherent_rotation`), the forward itself
(:func:`attention`: the Hopper kernel ``kernels.wgmma_fwd.forward_fp8`` where it applies, an
exact float32 reference otherwise), and the pieces of FlashAttention-3's numerical-error
experiment (:func:`outlier_inputs`, :func:`rmse`). Layout is PyTorch SDPA's: q
``[B, Hq, Nq, d]``, k and v ``[B, Hkv, Nk, d]``, ``Hq`` a multiple of ``Hkv`` (GQA: query head
h reads KV head ``h // (Hq // Hkv)``).

FP8 attention in FlashAttention-3 (Shah et al., arXiv 2407.08608, §3.3 and §4.3)
---------------------------------------------------------------------------------
* **Inputs.** Q, K and V are stored as float8 e4m3 (4 exponent bits, 3 mantissa bits, largest
  finite value :data:`E4M3_MAX` = 448, no infinities), each with one float32 *descale* per
  (batch, head): the float value is ``x_fp8 * descale``. :func:`quantize` picks
  ``descale = amax|x[b, h]| / 448`` so each slice uses e4m3's whole range; rounding then costs
  at most half a unit in the last place, ``2**-4`` of an element's magnitude (``2**-10 *
  descale`` below e4m3's smallest normal, ``2**-6``). FP8 ``wgmma`` (m64nNk32) doubles the
  tensor-core rate of 16-bit inputs; it takes both operands K-major, so FlashAttention-3
  transposes V in shared memory and permutes P's accumulator registers to form the next
  product's A operand (§3.3). The kernel here instead transposes V once per call, by a small
  kernel that also permutes its keys into the order in which P leaves the accumulator, so P
  needs no exchange between threads (docs/kernels.md, the FP8 forward).
* **P in FP8.** The second product, ``O += P V``, also runs in e4m3, so the probabilities P
  are rounded to e4m3 inside the kernel. P lies in ``[0, 1]``, where e4m3 resolves little:
  the kernel multiplies P by 256 before the cast (so small probabilities stay normal numbers
  instead of underflowing to zero) and divides the factor out with the final normalisation.
  The reference path of :func:`attention` keeps P in float32, so the two paths differ by this
  rounding, not only by summation order.
* **Block quantisation versus per-head scales.** FlashAttention-3 keeps one scale per block
  of a tensor (a block of rows of Q, K or V), so a large value only coarsens its own block.
  This module takes one scale per (batch, head) (``per="head"``) or one per tensor
  (``per="tensor"``), the scalings the kernel's descale arguments express; the paper's
  ablation finds that block quantisation contributes little on its inputs (below).
* **Incoherent processing.** Outlier features (a few entries far larger than the rest) force
  a large scale on their slice and flush its other entries to coarse values. Multiplying Q
  and K by the same random orthogonal matrix M leaves ``Q K^T = (Q M)(K M)^T`` unchanged and
  spreads each outlier over the whole head dimension. FlashAttention-3 takes M as a
  Hadamard matrix with random signs (applied in ``O(d log d)``); :func:`incoherent` uses
  ``M = diag(s) H_d / sqrt(d)``, ``s`` a seeded vector of ±1.
* **The numerical-error experiment.** Q, K and V have entries N(0, 1) plus, on 0.1 % of the
  entries, an independent N(0, 10**2) term (:func:`outlier_inputs`); the error is the RMSE
  of the output against an FP64 reference (:func:`rmse`). The paper's Table 3 reports: a
  baseline FP8 attention (per-tensor scales, no incoherent processing) 2.4e-2;
  FlashAttention-3 FP8 9.1e-3; without block quantisation 9.3e-3; without incoherent
  processing 2.4e-2. These are the paper's figures, not ones this module measures.

:func:`attention` runs the kernel when q is on a CUDA GPU of compute capability 9.0 or more
and ``kernels.wgmma_fwd.fp8_supports`` accepts the shape; otherwise it dequantises to float32
and runs the exact :func:`ioaware.attention` (warning once per reason, with
:class:`ioaware.PerformanceWarning`, when a CUDA call falls back).
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from ._cost import PerformanceWarning

__all__ = ["E4M3_MAX", "quantize", "incoherent", "incoherent_rotation", "attention", "rmse",
           "outlier_inputs"]

E4M3_MAX = 448.0                        # largest finite torch.float8_e4m3fn value
QUANTIZE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
QUANTIZE_PER = ("head", "tensor")
FP8_DTYPE = torch.float8_e4m3fn
MIN_CAPABILITY = (9, 0)                 # FP8 wgmma: sm_90a (H100, H200)

_warned_reasons: set[str] = set()       # fallback reasons already warned about in this process


# ------------------------------------------------------------------------------------------------
# quantisation
# ------------------------------------------------------------------------------------------------
def quantize(x, *, per="head"):
    """``x`` as float8 e4m3 and the float32 descales that restore it: ``(x_fp8, descale)``.

    Parameters
    ----------
    x : torch tensor ``[B, H, N, d]``, float16, bfloat16 or float32, finite.
    per : ``"head"``: one scale per (batch, head), ``descale[b, h] = amax|x[b, h]| / 448``;
        ``"tensor"``: one amax over the whole tensor, returned as a ``[B, H]`` tensor filled
        with that value (the shape :func:`attention` takes either way). A slice (or tensor)
        whose amax is 0 gets descale 1.0.

    Returns
    -------
    ``x_fp8``: ``(x / descale[..., None, None])`` computed in float32 and rounded to
    ``torch.float8_e4m3fn`` (round to nearest even), same shape and device as ``x``;
    ``descale``: float32 ``[B, H]`` on ``x``'s device. ``x_fp8.float() * descale`` differs from
    ``x`` by at most ``2**-4 * |x| + 2**-10 * descale`` per element (half an e4m3 ulp; the
    second term below e4m3's smallest normal), plus float32 rounding.

    Raises ``TypeError`` for a non-tensor or a dtype other than the three above, ``ValueError``
    for a rank other than 4, an unknown ``per``, or NaN / infinite values in ``x`` (found by
    the amax scan, before the float32 copy is made).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch tensor, got {type(x).__name__}")
    if x.dtype not in QUANTIZE_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; quantize takes float16, bfloat16 or float32")
    if x.ndim != 4:
        raise ValueError(f"x must have shape [B, H, N, d], got {tuple(x.shape)}")
    if per not in QUANTIZE_PER:
        raise ValueError(f"per must be 'head' or 'tensor', got {per!r}")
    x = x.detach()                          # rounding to e4m3 is not differentiable
    batch, heads = x.shape[:2]
    if x.numel() == 0:
        return x.to(FP8_DTYPE), torch.ones(batch, heads, dtype=torch.float32, device=x.device)
    amax = torch.linalg.vector_norm(x, float("inf"), dim=(-2, -1), dtype=torch.float32)  # [B, H]
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("x contains NaN or infinite values")
    if per == "tensor":
        amax = amax.amax().expand(batch, heads)
    descale = amax / E4M3_MAX
    # all-zero slices, and float32 amaxes so small that amax / 448 underflows, get descale 1
    descale = torch.where(descale > 0, descale, torch.ones_like(descale)).contiguous()
    scaled = x.to(torch.float32, copy=True)
    scaled /= descale[..., None, None]
    scaled.clamp_(-E4M3_MAX, E4M3_MAX)     # amax / (amax / 448) may round just above 448
    return scaled.to(FP8_DTYPE), descale


# ------------------------------------------------------------------------------------------------
# incoherent processing
# ------------------------------------------------------------------------------------------------
def _sylvester_hadamard(d: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix ``H_d`` (entries ±1, ``H_d H_d^T = d I``), float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def incoherent_rotation(d, *, seed=0) -> torch.Tensor:
    """The orthogonal ``[d, d]`` float64 CPU matrix ``M = diag(s) H_d / sqrt(d)`` of
    :func:`incoherent`: ``H_d`` the Sylvester Hadamard matrix, ``s`` a vector of ±1 drawn from
    ``torch.Generator().manual_seed(seed)``. ``d`` (the head dim) must be a power of two."""
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"head dim must be an int, got {d!r}")
    if d < 1 or d & (d - 1):
        raise ValueError(f"head dim must be a power of two for a Hadamard rotation, got {d}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    generator = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=generator, dtype=torch.int64) * 2 - 1
    return signs.to(torch.float64)[:, None] * _sylvester_hadamard(d) / math.sqrt(d)


def incoherent(q, k, *, seed=0):
    """FlashAttention-3's incoherent processing: ``(q @ M, k @ M)`` for the random orthogonal
    ``M`` of :func:`incoherent_rotation` (one matrix for both, so ``q_rot k_rot^T = q k^T`` in
    real arithmetic; outliers are spread over the head dimension, which lowers the error of
    quantising the rotated tensors to FP8).

    ``q`` and ``k``: torch floating-point tensors (any leading dimensions; ``[B, H, N, d]`` in
    this module's layout) with the same last dimension ``d``, a power of two, on one device.
    The products are computed in float32 (float64 for float64 inputs) and returned in each
    input's dtype. V is not rotated: the output ``softmax(q k^T) v`` is unchanged.
    """
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
        if not x.dtype.is_floating_point or x.dtype.itemsize < 2:
            raise TypeError(f"{name} has dtype {x.dtype}; incoherent takes float16, bfloat16, float32 "
                            f"or float64 (rotate before quantize)")
        if x.ndim < 1:
            raise ValueError(f"{name} must have a last (head) dimension, got a 0-d tensor")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim, got {q.shape[-1]} and {k.shape[-1]}")
    if q.device != k.device:
        raise ValueError(f"q and k must be on the same device, got {q.device} and {k.device}")
    rotation = incoherent_rotation(q.shape[-1], seed=seed)

    def rotate(x):
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        return (x.to(compute) @ rotation.to(device=x.device, dtype=compute)).to(x.dtype)

    return rotate(q), rotate(k)


# ------------------------------------------------------------------------------------------------
# attention
# ------------------------------------------------------------------------------------------------
def _check_fp8(name, x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch tensor, got {type(x).__name__}")
    if x.dtype != FP8_DTYPE:
        raise TypeError(f"{name} has dtype {x.dtype}; FP8 attention takes torch.float8_e4m3fn "
                        f"(make it with ioaware.fp8.quantize)")
    if x.ndim != 4:
        raise ValueError(f"{name} must have shape [B, H, N, d], got {tuple(x.shape)}")
    if x.requires_grad:
        raise ValueError(f"{name} requires grad, but FP8 attention is forward only; detach it")


def _descale(name, value, batch, heads, device) -> torch.Tensor:
    """``value`` (None, a number, a 0-d tensor or a tensor broadcastable to ``[batch, heads]``)
    as a contiguous float32 ``[batch, heads]`` tensor on ``device``, finite and positive."""
    if value is None:
        return torch.ones(batch, heads, dtype=torch.float32, device=device)
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            raise ValueError(f"{name} requires grad, but FP8 attention is forward only; detach it")
        if not value.dtype.is_floating_point:
            raise TypeError(f"{name} has dtype {value.dtype}; expected a floating-point tensor")
        try:
            broadcast = torch.broadcast_shapes(value.shape, (batch, heads))
        except RuntimeError:
            broadcast = None
        if broadcast != (batch, heads):
            raise ValueError(f"{name} has shape {tuple(value.shape)}, which does not broadcast to "
                             f"[B, H] = [{batch}, {heads}]")
        if value.device != device:
            raise ValueError(f"{name} is on {value.device} but q is on {device}")
        tensor = value.to(torch.float32)
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        tensor = torch.tensor(float(value), dtype=torch.float32, device=device)
    else:
        raise TypeError(f"{name} must be None, a number or a torch tensor, got {value!r} "
                        f"({type(value).__name__})")
    # a tensor on a GPU is used as given: reading its values back would make every call wait
    # for the device (a zero, negative or non-finite descale still defines the result
    # softmax(scale (q dq) (k dk)^T) (v dv); it is never silently replaced)
    if tensor.device.type == "cpu" and not bool(((tensor > 0) & torch.isfinite(tensor)).all()):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return tensor.expand(batch, heads).contiguous()


def _import_fp8_kernels():
    """``kernels.wgmma_fwd`` with its FP8 entry points (ImportError / AttributeError if absent)."""
    from kernels import wgmma_fwd
    for attribute in ("fp8_supports", "forward_fp8"):
        getattr(wgmma_fwd, attribute)
    return wgmma_fwd


def _kernel_path(capability, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal):
    """The kernel module that runs this problem and why not: ``(module, None)`` or
    ``(None, reason)``; ``(None, None)`` off CUDA (``capability`` None), where the reference
    path is the intended one."""
    if capability is None:
        return None, None
    if tuple(capability) < MIN_CAPABILITY:
        return None, (f"compute capability {capability[0]}.{capability[1]} is below "
                      f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (FP8 wgmma)")
    try:
        module = _import_fp8_kernels()
    except (ImportError, AttributeError) as exc:
        return None, f"kernels.wgmma_fwd has no FP8 forward ({exc})"
    reason = module.fp8_supports(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
    return (module, None) if reason is None else (None, reason)


def _warn_fallback(reason: str) -> None:
    if reason in _warned_reasons:
        return
    _warned_reasons.add(reason)
    warnings.warn(f"ioaware.fp8.attention: the FP8 kernel was not used ({reason}); running the "
                  f"float32 reference on dequantised inputs instead", PerformanceWarning, stacklevel=3)


def attention(q, k, v, *, descale_q=None, descale_k=None, descale_v=None, causal=False, scale=None,
              return_lse=False):
    """FP8 attention forward: ``softmax(scale * (q dq) (k dk)^T) (v dv)`` for e4m3 inputs.

    Parameters
    ----------
    q : ``torch.float8_e4m3fn`` ``[B, Hq, Nq, d]`` (from :func:`quantize`).
    k, v : ``torch.float8_e4m3fn`` ``[B, Hkv, Nk, d]``, ``Hq`` a multiple of ``Hkv``; v's head
        dim equals q's. All three on one device.
    descale_q : the factor that dequantises q, broadcastable to ``[B, Hq]``: None (1), a
        number, a 0-d tensor or a ``[B, Hq]`` tensor on q's device; finite and > 0 (numbers
        and CPU tensors are checked; a CUDA tensor's values are not read back, which would
        make the call wait for the GPU).
    descale_k, descale_v : the same for k and v, broadcastable to ``[B, Hkv]``.
    causal : bool; True is top-left (query i sees keys ``j <= i``, as SDPA's ``is_causal``).
    scale : multiplier of the scores (a number or 0-d tensor); default ``1 / sqrt(d)``.
    return_lse : also return the logsumexp.

    The dequantised inputs are ``x.float() * descale[b, h]`` (float32). Returns ``out``,
    bfloat16 ``[B, Hq, Nq, d]`` on q's device, or ``(out, lse)``: float32 ``[B, Hq, Nq]``,
    the natural-log logsumexp of the scaled scores, ``-inf`` (and a zero ``out`` row) where a
    row may attend to no key: only when ``Nk = 0``, as top-left causal always allows key 0.

    On CUDA with compute capability 9.0 or more, where ``kernels.wgmma_fwd.fp8_supports``
    accepts the shape, ``kernels.wgmma_fwd.forward_fp8`` computes it (P rounded to e4m3 in the
    kernel, see the module docstring). Elsewhere the inputs are dequantised to float32 and
    :func:`ioaware.attention` computes the exact attention of them, rounded to bfloat16 at the
    end; on CUDA this fallback is announced once per reason with a
    :class:`ioaware.PerformanceWarning`.

    Errors, raised before anything is allocated: ``TypeError`` / ``ValueError`` naming the
    argument (dtype other than float8_e4m3fn, rank, mismatched sizes, devices, descales that
    do not broadcast or are not finite and positive, anything that requires grad).
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_fp8(name, x)
    batch, heads_q, seqlen_q, head_dim = q.shape
    _, heads_kv, seqlen_k, _ = k.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"q, k and v must have the same batch size, got {batch}, {k.shape[0]} and "
                         f"{v.shape[0]}")
    if k.shape[-1] != head_dim:
        raise ValueError(f"k's head dim ({k.shape[-1]}) differs from q's ({head_dim})")
    if v.shape[-1] != head_dim:
        raise ValueError(f"v's head dim ({v.shape[-1]}) differs from q's ({head_dim})")
    if v.shape[1] != heads_kv or v.shape[2] != seqlen_k:
        raise ValueError(f"k and v must have the same heads and length, got k {tuple(k.shape)} and "
                         f"v {tuple(v.shape)}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of k's and v's heads ({heads_kv})")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k and v must be on the same device, got {q.device}, {k.device} and "
                         f"{v.device}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool (True: top-left), got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    elif isinstance(scale, torch.Tensor) and scale.ndim == 0 and not scale.requires_grad \
            and scale.dtype != torch.bool:
        scale = float(scale.item())
    elif isinstance(scale, numbers.Real) and not isinstance(scale, bool):
        scale = float(scale)
    else:
        raise TypeError(f"scale must be a number or a 0-d tensor, got {scale!r}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    dq = _descale("descale_q", descale_q, batch, heads_q, q.device)
    dk = _descale("descale_k", descale_k, batch, heads_kv, q.device)
    dv = _descale("descale_v", descale_v, batch, heads_kv, q.device)

    capability = torch.cuda.get_device_capability(q.device) if q.is_cuda else None
    module, reason = _kernel_path(capability, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                                  causal)
    if module is not None:
        out, lse = module.forward_fp8(q, k, v, dq, dk, dv, causal=causal, scale=scale)
    else:
        if reason is not None:
            _warn_fallback(reason)
        out, lse = _reference_forward(q, k, v, dq, dk, dv, causal=causal, scale=scale)
    return (out, lse) if return_lse else out


def _reference_forward(q, k, v, dq, dk, dv, *, causal, scale):
    """Exact float32 attention of the dequantised inputs (``ioaware.attention``): bfloat16 out,
    float32 lse."""
    from .attention import attention as exact_attention
    qf = q.to(torch.float32).mul_(dq[:, :, None, None])
    kf = k.to(torch.float32).mul_(dk[:, :, None, None])
    vf = v.to(torch.float32).mul_(dv[:, :, None, None])
    out, lse = exact_attention(qf, kf, vf, causal=causal, scale=scale, return_lse=True)
    return out.to(torch.bfloat16), lse.to(torch.float32)


# ------------------------------------------------------------------------------------------------
# the numerical-error experiment
# ------------------------------------------------------------------------------------------------
def rmse(out, reference) -> float:
    """Root mean square of ``out - reference``, computed in float64 (FlashAttention-3's error
    measure). Torch tensors on any device (or NumPy arrays) of the same shape, not empty."""
    for name, x in (("out", out), ("reference", reference)):
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            raise TypeError(f"{name} must be a torch tensor or a NumPy array, got {type(x).__name__}")
    if tuple(out.shape) != tuple(reference.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} but reference has {tuple(reference.shape)}")
    if math.prod(out.shape) == 0:
        raise ValueError("out is empty: its RMSE is undefined")

    def float64(x):
        x = x.detach() if isinstance(x, torch.Tensor) else torch.as_tensor(x)
        return x.to(device="cpu", dtype=torch.float64)

    return float(torch.sqrt(torch.mean((float64(out) - float64(reference)) ** 2)))


def outlier_inputs(shape, *, seed, outlier_fraction=0.001, outlier_std=10.0, device="cpu",
                   dtype=torch.float32) -> torch.Tensor:
    """FlashAttention-3's numerical-error inputs: N(0, 1) entries plus, on a Bernoulli(
    ``outlier_fraction``) subset, an added N(0, ``outlier_std``**2) term.

    Drawn in float32 on the CPU from ``torch.Generator().manual_seed(seed)`` (so a seed gives
    the same values on every device), then converted to ``dtype`` on ``device``.
    """
    if isinstance(shape, int):
        shape = (shape,)
    try:
        shape = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of ints, got {shape!r}") from None
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise ValueError(f"shape must be non-negative ints, got {shape}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r}")
    if not (isinstance(outlier_fraction, (int, float)) and 0.0 <= outlier_fraction <= 1.0):
        raise ValueError(f"outlier_fraction must be in [0, 1], got {outlier_fraction!r}")
    if not (isinstance(outlier_std, (int, float)) and math.isfinite(outlier_std) and outlier_std >= 0):
        raise ValueError(f"outlier_std must be finite and >= 0, got {outlier_std!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a torch floating-point dtype, got {dtype!r}")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator, dtype=torch.float32)
    outliers = torch.rand(shape, generator=generator) < outlier_fraction
    count = int(outliers.sum())
    x[outliers] += torch.randn(count, generator=generator, dtype=torch.float32) * float(outlier_std)
    return x.to(device=device, dtype=dtype)
