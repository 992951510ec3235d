"""Numba CUDA fused attention kernels (FlashAttention-2 order), float32 accumulation.

``forward(problem, config=None)`` and ``backward(problem, out, lse, dout, config=None)`` run a
problem that `ioaware` has already validated (`ioaware.check_inputs`: canonical
``[B, H, N, d]`` arrays, masks, scale, dropout); they return arrays of the problem's kind
(torch CUDA tensors in, torch tensors out on torch's current stream; NumPy arrays are copied to
the device and back). The kernels trust the problem and check nothing that `ioaware` checks.

Three kernel families, each a forward module and a backward module; the registry below runs a
problem on the first family, in this order, that takes it (`family_for`):

* ``mma`` (`kernels.mma_fwd`, `kernels.mma_bwd`): tensor-core float16/bfloat16,
  ``mma.sync.m16n8k16``, head dims 64 and 128, compute capability 8.0 or later;
* ``tf32`` (`kernels.tf32_fwd`, `kernels.tf32_bwd`): 3xTF32 tensor-core float32 (float32
  accuracy from three TF32 products), head dims 64 and 128;
* ``simt`` (`kernels.simt_fwd`, `kernels.simt_bwd`): CUDA-core float32 arithmetic for every
  float dtype and head dims up to 256; the only family Numba's CUDA simulator runs
  (``NUMBA_ENABLE_CUDASIM=1``), which is how CI tests the kernels.

Every family takes a sliding window (``window_size``), forward and backward: the band of
`kernels.mask.band_arguments`.

Two kernels come before the families for a forward:

* ``split_kv`` (`kernels.decode_fwd`): split-KV decoding ("flash-decoding") for 1 to 16 query
  rows against a long KV cache, every float dtype but float64, GQA read once per KV head,
  causal and window bands, per-sequence cache lengths (``problem.cache_seqlens``); its plan is
  `sim.decode.SplitKVPlan`. It takes a problem by itself from 256 keys on.
* ``wgmma`` (`kernels.wgmma_fwd`): the Hopper forward (sm_90a: TMA loads into a ring of
  shared-memory stages with mbarriers, a producer warp or warpgroup, ``wgmma`` products, by
  default FlashAttention-3's ping-pong and intra-warpgroup overlap), float16/bfloat16, head dims 64 and 128,
  causal or not, sliding windows, no masks or dropout; its plan is `sim.plans.wgmma_fwd`. Tried after
  ``split_kv`` and before the families: on Hopper it is the forward of every problem it takes
  (faster than ``mma`` in every measured case: docs/kernels.md). Its backward
  (`kernels.wgmma_bwd`, `FIRST_BACKWARDS`: the ``mma`` family's two kernels built on TMA and
  ``wgmma``; plan `sim.plans.wgmma_bwd`) is tried before the families for a backward.

A family takes a windowed problem only if its modules say so (``TAKES_WINDOW = True``), and a
problem with cache lengths only if they say ``TAKES_CACHE_SEQLENS = True``; the registry
refuses the others whatever their ``supports`` answers, so a family that has not learnt the
window or the cache lengths can never run one.

A `KernelConfig` pins what the registry and the families would otherwise choose (family, tiles,
micro-tile, launch order, launch path): the variants the benchmarks measure.
"""
from __future__ import annotations

from . import (decode_fwd, mma_bwd, mma_fwd, simt_bwd, simt_fwd, tf32_bwd, tf32_fwd, wgmma_bwd,
               wgmma_fwd)
from .config import FAMILY_NAMES, FORWARD_ONLY_NAMES, KernelConfig

__all__ = ["forward", "backward", "prepare_forward", "prepare_backward", "family_for",
           "KernelConfig", "FAMILIES", "FAMILY_NAMES", "FORWARD_ONLY", "FIRST_BACKWARDS"]

#: name -> (forward module, backward module), in the order the registry tries them.
FAMILIES = {"mma": (mma_fwd, mma_bwd), "tf32": (tf32_fwd, tf32_bwd), "simt": (simt_fwd, simt_bwd)}
assert tuple(FAMILIES) == FAMILY_NAMES
#: name -> forward module of the forward-only kernels, tried first for a forward.
FORWARD_ONLY = {"split_kv": decode_fwd, "wgmma": wgmma_fwd}
assert tuple(FORWARD_ONLY) == FORWARD_ONLY_NAMES
#: name -> backward module of the families of `FORWARD_ONLY` that have a backward too, tried
#: first for a backward (the Hopper backward, before the ``mma`` family's).
FIRST_BACKWARDS = {"wgmma": wgmma_bwd}


def family_for(problem, config=None, pass_="fwd") -> str:
    """The family that runs ``problem``'s ``pass_`` ("fwd" or "bwd") under ``config``: the
    first of `FAMILIES` whose `supports` finds no reason to refuse it, or ``config.family``
    (a ValueError saying why, when that family cannot run it)."""
    config = config or KernelConfig()
    which = 0 if pass_ == "fwd" else 1
    if config.family in FORWARD_ONLY and pass_ != "fwd" and config.family not in FIRST_BACKWARDS:
        raise ValueError(f"KernelConfig(family={config.family!r}) is a forward only; the "
                         f"backward runs on one of {FAMILY_NAMES + tuple(FIRST_BACKWARDS)}")
    pinned = [f"{n}={getattr(config, n)!r}" for n in ("dq_tile", "kv_tile")
              if getattr(config, n) is not None]
    if pass_ != "fwd" and pinned and config.family not in (None, "wgmma"):
        raise ValueError(f"KernelConfig.{', '.join(pinned)} pin the wgmma backward's tiles; "
                         f"KernelConfig(family={config.family!r}) has none")
    if pass_ != "fwd" and config.family in (None,) + tuple(FIRST_BACKWARDS):
        for name, module in FIRST_BACKWARDS.items():
            if config.family not in (None, name):
                continue
            why = (_refusal(problem) or _feature_refusal(module, problem)
                   or module.supports(problem, config))
            if why is None:
                return name
            if config.family == name or pinned:
                raise ValueError(f"KernelConfig(family={name!r}) cannot run this problem: {why}"
                                 + (f" (KernelConfig.{', '.join(pinned)} pin its tiles)"
                                    if pinned else ""))
    if pass_ == "fwd" and config.family in (None,) + FORWARD_ONLY_NAMES:
        for name, module in FORWARD_ONLY.items():
            if config.family not in (None, name):
                continue
            why = (_refusal(problem, bottom_right=True) or _feature_refusal(module, problem)
                   or module.supports(problem, config))
            if why is None:
                return name
            if config.family == name:
                raise ValueError(f"KernelConfig(family={name!r}) cannot run this problem: {why}")
    why = _refusal(problem)
    if why:
        raise ValueError(f"no kernel family runs this problem: {why}")
    if config.family is not None:
        module = FAMILIES[config.family][which]
        why = _feature_refusal(module, problem) or module.supports(problem, config)
        if why:
            raise ValueError(f"KernelConfig(family={config.family!r}) cannot run this problem: "
                             f"{why}")
        return config.family
    reasons = []
    for name, modules in FAMILIES.items():
        why = _feature_refusal(modules[which], problem) or modules[which].supports(problem, config)
        if why is None:
            return name
        reasons.append(f"{name}: {why}")
    raise ValueError("no kernel family runs this problem (" + "; ".join(reasons) + ")")


def _feature_refusal(module, problem):
    """Why ``module`` (a family's forward or backward) cannot run ``problem``'s sliding window
    or cache lengths: it does not declare ``TAKES_WINDOW`` / ``TAKES_CACHE_SEQLENS``. None when
    the problem has neither, or the module takes what it has."""
    window = getattr(problem, "window_size", None)
    if window is not None and not getattr(module, "TAKES_WINDOW", False):
        return (f"window_size={tuple(window)}: this family's kernels have no sliding window yet "
                f"(the simt family and the split_kv forward take it)")
    if getattr(problem, "cache_seqlens", None) is not None \
            and not getattr(module, "TAKES_CACHE_SEQLENS", False):
        return "cache_seqlens: only the split_kv forward takes per-sequence cache lengths"
    return None


def _refusal(problem, bottom_right=False):
    """What no family computes (`ioaware` refuses these before dispatch; this guards direct
    callers): bottom-right causal alignment with Nq != Nk without a window (with one the
    ``simt`` kernels take the band, causal rule included; ``bottom_right=True``: allowed, for a
    kernel that aligns to the cache's end), a window with top-left causal alignment and
    Nq != Nk (two alignments), a value head dim other than the query's, or an additive bias."""
    alignment = getattr(problem, "causal_alignment", "top_left")
    window = getattr(problem, "window_size", None)
    if problem.causal and problem.seqlen_q != problem.seqlen_k:
        if window is None and alignment != "top_left" and not bottom_right:
            return "bottom-right causal alignment with seqlen_q != seqlen_k"
        if window is not None and alignment == "top_left":
            return "a window_size with top-left causal alignment and seqlen_q != seqlen_k"
    if getattr(problem, "value_dim", problem.head_dim) != problem.head_dim:
        return "a value head dim different from the query's"
    if getattr(problem, "bias", None) is not None:
        return "an additive bias (the kernels take boolean masks)"
    return None


def forward(problem, config=None):
    """Fused attention forward of a validated problem: ``(out, lse)``, out like q, lse float32
    [B, Hq, Nq] (natural-log logsumexp of the scaled, masked logits; -inf for a row with no
    allowed key, whose out row is 0)."""
    config = config or KernelConfig()
    name = family_for(problem, config, "fwd")
    module = FORWARD_ONLY[name] if name in FORWARD_ONLY else FAMILIES[name][0]
    return module.forward(problem, config)


def prepare_forward(problem, config=None):
    """``run(q, k, v, layout_known=False) -> (out, lse)``: ``problem``'s forward on new operands
    of the same shapes, strides, dtype and device, with every per-problem choice (family, tiles,
    kernel, tile schedule, constants) made here, once; None when the family that runs it
    prepares nothing (``simt``). The problem's mask and cache lengths, if any, are kept. From
    its third call ``run`` repeats its second call's launches where the operands have that
    call's layout (`kernels.host.Repeat`); ``layout_known=True`` says the caller has checked
    the shapes, strides, dtypes and device already (`ioaware._backends.Prepared`), so only the
    operands' alignment is. The ``split_kv`` forward's ``run`` also takes ``cache_seqlens``,
    the call's own cache lengths (an int32 tensor on q's device) in place of the problem's
    (`ioaware._backends.PreparedDecode`)."""
    config = config or KernelConfig()
    name = family_for(problem, config, "fwd")
    module = FORWARD_ONLY[name] if name in FORWARD_ONLY else FAMILIES[name][0]
    prepare = getattr(module, "prepare", None)
    return None if prepare is None else prepare(problem, config)


def prepare_backward(problem, config=None):
    """``run(q, k, v, out, lse, dout) -> (dq, dk, dv)``: ``problem``'s backward on new operands
    of the same shapes, strides, dtype and device (canonical, as `backward` takes them), with
    every per-problem choice made here, once; None when the family that runs it prepares
    nothing (``simt``)."""
    config = config or KernelConfig()
    prepare = getattr(_backward_module(family_for(problem, config, "bwd")), "prepare", None)
    return None if prepare is None else prepare(problem, config)


def backward(problem, out, lse, dout, config=None):
    """Fused attention backward from the forward's ``out`` and ``lse`` and the gradient
    ``dout`` (canonical [B, Hq, Nq, d], [B, Hq, Nq], [B, Hq, Nq, d]): ``(dq, dk, dv)`` in the
    problem's dtype, dk and dv summed over the query heads of each GQA group."""
    config = config or KernelConfig()
    return _backward_module(family_for(problem, config, "bwd")).backward(problem, out, lse, dout,
                                                                          config)


def _backward_module(name):
    """The backward module of family ``name`` (`FIRST_BACKWARDS`, else `FAMILIES`)."""
    return FIRST_BACKWARDS[name] if name in FIRST_BACKWARDS else FAMILIES[name][1]
