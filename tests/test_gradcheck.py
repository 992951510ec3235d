"""``torch.autograd.gradcheck`` at float64 on the CPU: the analytic gradients of the operator's
autograd formula (the tiled backward, recomputing S and P) against finite differences of the
tiled forward, which runs in float64 for float64 inputs.

gradcheck's defaults: eps 1e-6, atol 1e-5, rtol 1e-3 — a float32 computation would fail them
(finite differences of float32 results carry ~1e-7 / 1e-6 = 0.1 relative error)."""
import importlib

import pytest
import torch
from torch.autograd import gradcheck
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from ioaware import attention, scaled_dot_product_attention


def _inputs(seed, shape_q, shape_k, value_dim=None):
    g = torch.Generator().manual_seed(seed)
    shape_v = shape_k[:-1] + (value_dim or shape_k[-1],)
    return tuple(torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
                 for s in (shape_q, shape_k, shape_v))


@pytest.mark.parametrize("causal", [False, True, "bottom_right"])
@pytest.mark.parametrize("nq, nk", [(5, 5), (3, 7), (7, 3)])
def test_attention_gradcheck(causal, nq, nk):
    q, k, v = _inputs(nq * 10 + nk, (1, 4, nq, 6), (1, 2, nk, 6), value_dim=5)   # GQA, Ev != E
    mask = torch.rand(1, 1, nq, nk, generator=torch.Generator().manual_seed(1)) > 0.3
    for m in (None, mask):
        assert gradcheck(lambda q_, k_, v_: attention(q_, k_, v_, causal=causal, mask=m, block_q=2, block_k=3),
                         (q, k, v))


@pytest.mark.parametrize("attn_mask", ["none", "is_causal", "bool", "float", "upper_left", "lower_right"])
def test_sdpa_gradcheck(attn_mask):
    nq, nk = 4, 6
    q, k, v = _inputs(3, (2, 4, nq, 5), (2, 2, nk, 5))
    g = torch.Generator().manual_seed(4)
    kw = {"enable_gqa": True, "scale": 0.7}
    if attn_mask == "is_causal":
        kw["is_causal"] = True
    elif attn_mask == "bool":
        kw["attn_mask"] = torch.rand(nq, nk, generator=g) > 0.4
    elif attn_mask == "float":
        kw["attn_mask"] = torch.randn(2, 1, nq, nk, generator=g, dtype=torch.float64)
    elif attn_mask in ("upper_left", "lower_right"):
        kw["attn_mask"] = (causal_upper_left if attn_mask == "upper_left" else causal_lower_right)(nq, nk)
    assert gradcheck(lambda q_, k_, v_: scaled_dot_product_attention(q_, k_, v_, **kw), (q, k, v))


def test_gradcheck_would_catch_a_wrong_backward(monkeypatch):
    """The check above can fail: scale dq by 1.01 in the backward (gradcheck allows 1e-3) and gradcheck refuses it."""
    module = importlib.import_module("ioaware._backends")
    q, k, v = _inputs(5, (1, 1, 4, 3), (1, 1, 5, 3))
    original = module._backward

    def off_by_a_little(*args, **kwargs):
        dq, dk, dv = original(*args, **kwargs)
        return dq * 1.01, dk, dv
    monkeypatch.setattr(module, "_backward", off_by_a_little)
    assert not gradcheck(lambda *x: attention(*x), (q, k, v), raise_exception=False)


@pytest.mark.parametrize("causal", [False, "bottom_right"])
def test_gradients_through_the_logsumexp(causal):
    """A loss that uses the logsumexp (alone, or with the output) gets its gradient: the lse's
    own path, not zeros."""
    q, k, v = _inputs(11, (1, 4, 4, 5), (1, 2, 6, 5))
    mask = torch.rand(1, 1, 4, 6, generator=torch.Generator().manual_seed(2)) > 0.3
    kw = dict(causal=causal, mask=mask, scale=0.8, block_q=2, block_k=4, return_lse=True)
    assert gradcheck(lambda q_, k_, v_: attention(q_, k_, v_, **kw), (q, k, v))
    assert gradcheck(lambda q_, k_: attention(q_, k_, v.detach(), **kw)[1], (q, k))
    lse = attention(q, k, v, **kw)[1]
    dq, dk = torch.autograd.grad(lse.sum(), (q, k))
    assert dq.abs().max() > 0 and dk.abs().max() > 0
