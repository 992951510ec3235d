"""Hugging Face ``transformers`` models with ioaware's attention: ``attn_implementation="ioaware"``.

::

    import ioaware.integrations.transformers as ioaware_hf
    from transformers import AutoConfig, AutoModelForCausalLM

    ioaware_hf.register()
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama"), attn_implementation="ioaware")

:func:`register` registers two functions under one name, because transformers needs both:

* :func:`attention_forward` with ``transformers.AttentionInterface`` — the attention itself,
  :func:`ioaware.scaled_dot_product_attention` called as transformers' own ``"sdpa"`` path calls
  PyTorch's: ``is_causal`` derived the same way (``q_len > 1``, no mask, a causal module), GQA
  without repeating the key/value heads, ``dropout`` as the module passes it (its
  ``attention_dropout`` in training, 0 in evaluation). When ``is_causal`` holds and there are
  more keys than queries it uses a bottom-right causal mask (the queries are the last
  positions, as with a KV cache), where PyTorch's ``is_causal=True`` would align top-left;
* :func:`attention_mask` with ``transformers.masking_utils.AttentionMaskInterface`` — without a
  mask function registered under the name, transformers builds no mask at all for it
  (padding and KV-cache offsets would be silently ignored). It builds transformers' boolean
  SDPA masks (``sdpa_mask``: True = may attend, padding included) and leaves the mask out
  (``None``, so :func:`attention_forward` uses ``is_causal``) only where that is exact: no
  padding, a plain causal pattern (no sliding window that bites, no packed sequences), the
  queries being the last positions of the key/value window, and ``q_len == kv_len`` or
  ``q_len == 1``. Transformers' own SDPA mask also skips the mask for a static cache's first
  (prefill) step, where the keys run past the queries into empty cache slots; that case gets a
  materialised mask here.

Not supported (each raises an error that names it): ``softcap``, attention sinks (``s_aux``),
paged caches (continuous batching), and gradients into a learned ``position_bias`` (T5-style
models in training; inference works).
"""
from __future__ import annotations

import logging

import torch

from ..attention import scaled_dot_product_attention

__all__ = ["NAME", "register", "attention_forward", "attention_mask"]

NAME = "ioaware"

_log = logging.getLogger(__name__)


def register(name: str = NAME) -> str:
    """Register :func:`attention_forward` and :func:`attention_mask` with transformers as ``name``.

    Afterwards ``from_pretrained(..., attn_implementation=name)`` / ``from_config(...)`` (or
    ``model.set_attn_implementation(name)``) runs the model's attention on ioaware. Returns ``name``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, attention_mask)
    return name


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, position_bias: torch.Tensor | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """An ``AttentionInterface`` function: ``query [B, H, Lq, E]``, ``key``/``value [B, Hkv, Lk, E|Ev]``
    and the mask :func:`attention_mask` built; returns ``([B, Lq, H, Ev], None)``."""
    if kwargs.get("softcap") is not None:
        raise ValueError("attn_implementation='ioaware' does not support softcap")
    if kwargs.get("s_aux") is not None:
        raise ValueError("attn_implementation='ioaware' does not support attention sinks (s_aux)")
    if kwargs.get("cache") is not None:
        raise NotImplementedError("attn_implementation='ioaware' does not support paged caches (continuous batching)")
    if kwargs.get("output_attentions", False):
        _log.warning("attn_implementation='ioaware' does not return attention weights (output_attentions=True)")

    q_len, kv_len = query.shape[2], key.shape[2]
    enable_gqa = getattr(module, "num_key_value_groups", 1) > 1
    is_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # as transformers' sdpa_attention_forward: a lone query sees every key; a mask says it all
    is_causal = q_len > 1 and attention_mask is None and bool(is_causal)
    attn_mask = attention_mask
    if position_bias is not None:
        attn_mask = _position_bias_mask(position_bias, attention_mask, is_causal, q_len, kv_len)
        is_causal = False
    elif is_causal and kv_len > q_len:
        from torch.nn.attention.bias import causal_lower_right
        attn_mask, is_causal = causal_lower_right(q_len, kv_len), False

    out = scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout,
                                       is_causal=is_causal, scale=scaling, enable_gqa=enable_gqa)
    return out.transpose(1, 2).contiguous(), None


def _position_bias_mask(position_bias, attention_mask, is_causal, q_len, kv_len):
    """A learned additive bias (T5-style) folded with the mask into one float mask, as transformers'
    SDPA path does (masked entries get the dtype's minimum)."""
    if position_bias.requires_grad and torch.is_grad_enabled():
        raise ValueError("attn_implementation='ioaware' does not propagate gradients into position_bias "
                         "(models with a learned relative position bias train with 'sdpa' or 'eager')")
    low = torch.finfo(position_bias.dtype).min
    if attention_mask is None:
        if not is_causal:
            return position_bias
        rows = torch.arange(q_len, device=position_bias.device)[:, None]
        cols = torch.arange(kv_len, device=position_bias.device)[None, :]
        return torch.where(cols <= rows, position_bias, low)
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, position_bias, low)
    return position_bias + attention_mask


def attention_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                   mask_function=None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
                   allow_is_causal_skip: bool = True, **kwargs) -> torch.Tensor | None:
    """An ``AttentionMaskInterface`` function: transformers' boolean SDPA mask
    ``[batch, 1, q_length, kv_length]`` (True = may attend), or None where :func:`attention_forward`'s
    ``is_causal`` gives exactly that pattern (see the module docstring)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if mask_function is None:
        mask_function = causal_mask_function
    if allow_is_causal_skip and _plain_causal_is_exact(q_length, kv_length, q_offset, kv_offset, attention_mask,
                                                       local_size):
        return None
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                     local_size=local_size, allow_is_causal_skip=False, **kwargs)


def _plain_causal_is_exact(q_length, kv_length, q_offset, kv_offset, padding_mask, local_size) -> bool:
    """Whether "no mask" (causal via ``is_causal``, or full for one query) is exactly the causal mask
    of these positions: a decision from sizes and offsets, and from the padding mask only outside
    ``torch.compile`` (reading it there would break the graph; the mask is then materialised)."""
    if q_length != 1 and q_length != kv_length:
        return False
    if isinstance(q_offset, torch.Tensor) or isinstance(kv_offset, torch.Tensor):
        return False                                     # a static cache's offsets: not read here
    if q_offset + q_length != kv_offset + kv_length:
        return False                                     # keys past the last query (empty cache slots)
    if local_size is not None and kv_length >= local_size:
        return False                                     # a sliding window cuts into the keys
    if padding_mask is None:
        return True
    if torch.compiler.is_compiling() or padding_mask.shape[-1] < kv_offset + kv_length:
        return False
    return bool(padding_mask[:, kv_offset:kv_offset + kv_length].all())
