"""Parity with ``torch.nn.functional.scaled_dot_product_attention`` for every input it accepts.

The reference is PyTorch's own math backend (``sdpa_kernel(SDPBackend.MATH)``) on float64 copies
of the inputs, outputs and gradients, with the same arguments (the same ``CausalBias`` object,
the same masks). Hypothesis draws the inputs: dtypes float64/float32/float16/bfloat16,
broadcast leading dimensions, ``enable_gqa`` with key and value head counts that divide the
query's, zero-size dimensions, a value head dimension different from the query's, boolean /
float32 / query-dtype masks (with fully masked rows), ``is_causal``, ``causal_upper_left`` and
``causal_lower_right`` (Nq below, equal to and above Nk), ``scale`` and ``dropout_p`` as numbers
or 0-d tensors, ``dropout_p`` 0 or 1, and logits up to ~1e3 (float32/float64).

Tolerances, ours (in the input dtype) against float64 on the same rounded inputs:

* outputs, ``|ours - ref| <= tol (1 + |ref|)``: float64 1e-10 (float64 accumulation over at
  most a few hundred terms); float32 2e-5 (float32 accumulation, ~1e-6 relative); float16 4e-3
  and bfloat16 3e-2 (one rounding of the output to the dtype: 2**-11 and 2**-8 relative). With
  large logits the float32 rounding of a logit of size L shifts probabilities by ~L * 6e-8
  relative, so float32 gets 1e-3 there.
* gradients, relative Frobenius error plus an absolute floor per element (exact zeros, e.g. a
  single key): float64 1e-9; float32 2e-4; float16 1e-2; bfloat16 6e-2 (the backward reads the
  output and dout rounded to bfloat16, and ``delta = rowsum(dO * O)`` inherits their 2**-8).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import CausalBias, causal_lower_right, causal_upper_left

from ioaware import attention, scaled_dot_product_attention

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
OUT_TOL = {torch.float64: 1e-10, torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
OUT_TOL_LARGE = {torch.float64: 1e-9, torch.float32: 1e-3}
GRAD_TOL = {torch.float64: 1e-9, torch.float32: 2e-4, torch.float16: 1e-2, torch.bfloat16: 6e-2}
GRAD_TOL_LARGE = {torch.float64: 1e-8, torch.float32: 2e-2}

pytestmark = pytest.mark.filterwarnings("ignore:Lower right causal bias will produce NaNs")


def math_sdpa(q, k, v, **kw):
    """PyTorch's math backend in float64, differentiable with respect to the float64 copies."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    mask = kw.get("attn_mask")
    if isinstance(mask, torch.Tensor) and not isinstance(mask, CausalBias) and mask.is_floating_point():
        kw = {**kw, "attn_mask": mask.double()}
    for name in ("scale", "dropout_p"):
        if isinstance(kw.get(name), torch.Tensor):
            kw = {**kw, name: float(kw[name])}
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(q64, k64, v64, **kw)
    return out, (q64, k64, v64)


def assert_out_close(got, want, tol):
    assert got.shape == want.shape
    got64 = got.detach().double()
    assert torch.isfinite(got64).all() and torch.isfinite(want).all()
    err = (got64 - want).abs() - tol * (1 + want.abs())
    assert err.numel() == 0 or err.max() <= 0, f"max excess {err.max().item():.3e}"


def assert_grads_close(got, want, tol):
    for g, w in zip(got, want):
        assert g.shape == w.shape
        g64, w64 = g.double(), w.detach()
        assert torch.isfinite(g64).all()
        err = (g64 - w64).norm()
        assert err <= tol * w64.norm() + tol * np.sqrt(max(w64.numel(), 1)), \
            f"gradient error {err.item():.3e} vs norm {w64.norm().item():.3e}"


def _fill(draw, shape, dtype, magnitude):
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * magnitude).to(dtype).requires_grad_()


def _maybe_one(draw, sizes):
    """Each size may become 1 (broadcast), and leading dimensions may be dropped."""
    sizes = [1 if draw(st.booleans()) and draw(st.booleans()) else s for s in sizes]
    drop = draw(st.integers(0, len(sizes))) if draw(st.booleans()) else 0
    return sizes[drop:]


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def sdpa_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    large = dtype in OUT_TOL_LARGE and draw(st.integers(0, 4)) == 0
    empty = draw(st.sampled_from([None] * 6 + ["batch", "heads", "nq", "nk", "e", "ev"]))
    size = lambda name, lo, hi: 0 if empty == name else draw(st.integers(lo, hi))  # noqa: E731
    nq, nk = size("nq", 1, 17), size("nk", 1, 17)
    e = size("e", 1, 16)
    ev = size("ev", 1, 16) if draw(st.booleans()) else (e if empty != "ev" else 0)
    gqa = draw(st.booleans())
    batch = [size("batch", 1, 3) for _ in range(draw(st.integers(0, 2)))]
    if gqa:
        hq = 0 if empty == "heads" else draw(st.sampled_from([1, 2, 4, 6]))
        hk, hv = (draw(st.sampled_from(_divisors(hq))) for _ in range(2)) if hq else (0, 0)
        lead_q, lead_k, lead_v = (_maybe_one(draw, batch) + [h] for h in (hq, hk, hv))
    else:
        heads = [size("heads", 1, 3)] if (batch or draw(st.booleans())) else []
        lead_q, lead_k, lead_v = (_maybe_one(draw, batch + heads) for _ in range(3))
    magnitude = 20.0 if large else 1.0
    q = _fill(draw, lead_q + [nq, e], dtype, magnitude)
    k = _fill(draw, lead_k + [nk, e], dtype, magnitude)
    v = _fill(draw, lead_v + [nk, ev], dtype, 1.0)
    # the scores' leading dimensions (PyTorch adds the mask to q @ k^T in place, before v broadcasts)
    score_lead = list(torch.broadcast_shapes(tuple(lead_q), tuple(lead_k))) if not gqa else \
        list(torch.broadcast_shapes(tuple(lead_q[:-1]), tuple(lead_k[:-1]))) + lead_q[-1:]

    kw = {"enable_gqa": gqa} if gqa else {}
    kind = draw(st.sampled_from(["none", "is_causal", "bool", "float32", "float_q", "upper_left", "lower_right"]))
    if kind == "is_causal":
        kw["is_causal"] = True
    elif kind in ("upper_left", "lower_right"):
        kw["attn_mask"] = (causal_upper_left if kind == "upper_left" else causal_lower_right)(nq, nk)
    elif kind != "none":
        shape = _maybe_one(draw, score_lead + [nq, nk])
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
        allowed = torch.rand(shape, generator=g) > draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
        if kind == "bool":
            kw["attn_mask"] = allowed
        else:
            bias = torch.randn(shape, generator=g, dtype=torch.float64) * 2
            bias = bias.masked_fill(~allowed, float("-inf"))
            kw["attn_mask"] = bias.to(torch.float32 if kind == "float32" else dtype)
    scale = draw(st.sampled_from([None, "float", "tensor"]))
    if scale is not None:
        value = draw(st.floats(-1.0, 1.5, allow_nan=False))
        kw["scale"] = value if scale == "float" else torch.tensor(value)
    dropout = draw(st.sampled_from([None, 0.0, 1.0, "tensor0", "tensor1"]))
    if dropout is not None:
        kw["dropout_p"] = torch.tensor(float(dropout[-1])) if isinstance(dropout, str) else dropout
    return q, k, v, kw, large


@settings(max_examples=120)
@given(sdpa_cases(), st.integers(0, 2**31))
def test_sdpa_matches_pytorch_math_backend_in_float64(case, seed):
    q, k, v, kw, large = case
    dtype = q.dtype
    out = scaled_dot_product_attention(q, k, v, **kw)
    want, inputs64 = math_sdpa(q, k, v, **kw)
    assert out.dtype == dtype
    assert_out_close(out, want, (OUT_TOL_LARGE if large else OUT_TOL)[dtype])
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), dout.to(dtype), allow_unused=True)
    got = [torch.zeros_like(x) if g is None else g for g, x in zip(got, (q, k, v))]
    ref = torch.autograd.grad(want, inputs64, dout, allow_unused=True)
    ref = [torch.zeros_like(x) if r is None else r for r, x in zip(ref, inputs64)]
    assert_grads_close(got, ref, (GRAD_TOL_LARGE if large else GRAD_TOL)[dtype])


@st.composite
def attention_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    empty = draw(st.sampled_from([None] * 6 + ["batch", "heads", "nq", "nk", "e", "ev"]))
    size = lambda name, lo, hi: 0 if empty == name else draw(st.integers(lo, hi))  # noqa: E731
    batch, hkv = size("batch", 1, 2), size("heads", 1, 2)
    hq = hkv * draw(st.integers(1, 3))
    nq, nk, e = size("nq", 1, 40), size("nk", 1, 40), size("e", 1, 16)
    ev = size("ev", 1, 16) if draw(st.booleans()) else (e if empty != "ev" else 0)
    q = _fill(draw, [batch, hq, nq, e], dtype, 1.0)
    k = _fill(draw, [batch, hkv, nk, e], dtype, 1.0)
    v = _fill(draw, [batch, hkv, nk, ev], dtype, 1.0)
    causal = draw(st.sampled_from([False, True, "top_left", "bottom_right"]))
    mask = None
    if draw(st.booleans()):
        g = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
        shape = _maybe_one(draw, [batch, hq, nq, nk])
        mask = torch.rand(shape, generator=g) > draw(st.sampled_from([0.0, 0.3, 1.0]))
    blocks = dict(block_q=draw(st.integers(1, 20)), block_k=draw(st.integers(1, 20)))
    dropout_p = draw(st.sampled_from([0.0, 1.0]))
    return q, k, v, dict(causal=causal, mask=mask, dropout_p=dropout_p, **blocks)


@settings(max_examples=80)
@given(attention_cases(), st.integers(0, 2**31))
def test_attention_matches_pytorch_math_backend_in_float64(case, seed):
    """ioaware.attention (top-left and bottom-right causal, boolean masks, GQA, Ev != E, empty sizes,
    float64) against the same attention expressed for PyTorch's math backend."""
    q, k, v, kw = case
    dtype = q.dtype
    out, lse = attention(q, k, v, return_lse=True, **kw)
    nq, nk = q.shape[-2], k.shape[-2]
    causal, mask = kw["causal"], kw["mask"]
    ref_kw = {"enable_gqa": True, "dropout_p": kw["dropout_p"]}
    pattern = None
    if causal:
        shift = nk - nq if causal == "bottom_right" else 0
        pattern = torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=shift)
    if mask is not None and pattern is not None:
        ref_kw["attn_mask"] = mask & pattern
    elif mask is not None or pattern is not None:
        ref_kw["attn_mask"] = mask if mask is not None else (
            causal_lower_right(nq, nk) if causal == "bottom_right" else causal_upper_left(nq, nk))
    want, inputs64 = math_sdpa(q, k, v, **ref_kw)
    assert out.dtype == dtype and lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert_out_close(out, want, OUT_TOL[dtype])
    # the logsumexp of the scaled, masked logits (-inf exactly where a row sees no key)
    s = (inputs64[0].detach() @ inputs64[1].detach().repeat_interleave(q.shape[1] // max(k.shape[1], 1), 1)
         .transpose(-1, -2) if q.shape[1] else torch.zeros(lse.shape + (nk,), dtype=torch.float64))
    s = s * (1 / np.sqrt(q.shape[-1]) if q.shape[-1] else 1.0)
    allowed = torch.ones(s.shape, dtype=torch.bool)
    for m in (pattern, mask):
        if m is not None:
            allowed = allowed & m
    lse_ref = torch.logsumexp(s.masked_fill(~allowed, float("-inf")), -1)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(lse_ref))
    finite = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse.double()[finite], lse_ref[finite], atol=1e-2 if dtype != torch.float64 else 1e-10,
                               rtol=1e-4 if dtype != torch.float64 else 1e-10)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), dout.to(dtype))
    ref = torch.autograd.grad(want, inputs64, dout, allow_unused=True)
    ref = [torch.zeros_like(x) if r is None else r for r, x in zip(ref, inputs64)]
    assert_grads_close(got, ref, GRAD_TOL[dtype])


# ---- the inputs that gave silently wrong answers ------------------------------------------
@pytest.mark.parametrize("mask", [torch.tensor([[1, 1, 1, 0, 0, 0]]), torch.tensor([[1, 1, 1, 0, 0, 0]], dtype=torch.uint8),
                                  torch.ones(4, 6, dtype=torch.int32), torch.zeros(4, 6, dtype=torch.float64),
                                  torch.zeros(4, 6, dtype=torch.float16)])
def test_attn_masks_pytorch_refuses_are_refused_with_its_message(mask):
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(RuntimeError, match="Expected attn_mask dtype to be bool or float or to match query dtype"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with pytest.raises(TypeError, match="Expected attn_mask dtype to be bool or float or to match query dtype, "
                                        f"but got attn_mask.dtype: {mask.dtype}"):
        scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("nq, nk", [(5, 9), (9, 5), (6, 6), (1, 7)])
def test_causal_bias_objects_are_understood_without_materialising(monkeypatch, nq, nk):
    g = torch.Generator().manual_seed(nq * 10 + nk)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) for n in (nq, nk, nk))
    wants = {variant: math_sdpa(q, k, v, attn_mask=variant(nq, nk))[0]
             for variant in (causal_lower_right, causal_upper_left)}

    def refuse(*args, **kwargs):
        raise AssertionError("CausalBias was materialised")
    monkeypatch.setattr(CausalBias, "_materialize", refuse)
    for variant, want in wants.items():
        got = scaled_dot_product_attention(q, k, v, attn_mask=variant(nq, nk))
        assert_out_close(got, want, OUT_TOL[torch.float32])
    lower = scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(nq, nk))
    assert torch.equal(lower, attention(q, k, v, causal="bottom_right"))
    if nq != nk:      # the two alignments differ: the test above could tell them apart
        assert not torch.allclose(wants[causal_lower_right], wants[causal_upper_left])


def test_causal_bias_misuse_is_refused():
    q, k, v = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 9, 8), torch.randn(1, 1, 9, 8)
    with pytest.raises(ValueError, match="CausalBias for .* = \\(5, 7\\)"):
        scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 7))
    with pytest.raises(ValueError, match="CausalBias should not be used with is_causal=True"):
        scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(5, 9), is_causal=True)


# ---- inputs PyTorch accepts that were refused ----------------------------------------------
def test_zero_size_dimensions_give_empty_or_zero_outputs_and_zero_gradients():
    base = dict(batch=2, heads=3, nq=4, nk=5, e=8)
    for dim in ("batch", "heads", "nq", "nk", "e"):
        s = {**base, dim: 0}
        q = torch.randn(s["batch"], s["heads"], s["nq"], s["e"], requires_grad=True)
        k = torch.randn(s["batch"], s["heads"], s["nk"], s["e"], requires_grad=True)
        v = torch.randn(s["batch"], s["heads"], s["nk"], 6, requires_grad=True)
        out = scaled_dot_product_attention(q, k, v, is_causal=True)
        want, _ = math_sdpa(q, k, v, is_causal=True)
        assert out.shape == want.shape == (s["batch"], s["heads"], s["nq"], 6)
        assert_out_close(out, want, OUT_TOL[torch.float32])
        out.sum().backward()
        if dim in ("nk", "batch", "heads", "nq"):
            assert all(x.grad is not None and not x.grad.any() for x in (q, k, v))


def test_scalars_as_0d_tensors_and_dropout_one():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    got = scaled_dot_product_attention(q, k, v, scale=torch.tensor(0.3), dropout_p=torch.tensor(0.0))
    assert_out_close(got, math_sdpa(q, k, v, scale=0.3)[0], OUT_TOL[torch.float32])
    q.requires_grad_()
    out = scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    assert out.shape == q.shape and not out.any()
    out.sum().backward()
    assert not q.grad.any()
    with pytest.raises(TypeError, match="scale must be a float or a 0-d tensor, got a tensor of shape \\(1,\\)"):
        scaled_dot_product_attention(q, k, v, scale=torch.tensor([0.3]))
    with pytest.raises(ValueError, match="dropout_p must be in \\[0, 1\\], got 1.5"):
        scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        scaled_dot_product_attention(q, k, v, is_causal=1)


def test_float64_runs_in_float64():
    """A float32 path would show differences of ~1e-7; float64 inputs agree to ~1e-15."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 33, 16, generator=g, dtype=torch.float64) for _ in range(3))
    out, lse = attention(q, k, v, causal="bottom_right", return_lse=True, block_q=8, block_k=8)
    want, _ = math_sdpa(q, k, v, is_causal=True)
    assert out.dtype == lse.dtype == torch.float64
    assert (out - want).abs().max() < 1e-13


def test_value_head_dim_differs_from_query_head_dim():
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 4, 7, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    v = torch.randn(2, 2, 9, 5, generator=g)
    for x in (q, k, v):
        x.requires_grad_()
    out = scaled_dot_product_attention(q, k, v, enable_gqa=True, is_causal=True)
    want, inputs64 = math_sdpa(q, k, v, enable_gqa=True, is_causal=True)
    assert out.shape == (2, 4, 7, 5)
    assert_out_close(out, want, OUT_TOL[torch.float32])
    dout = torch.randn(out.shape, generator=g)
    assert_grads_close(torch.autograd.grad(out, (q, k, v), dout),
                       torch.autograd.grad(want, inputs64, dout.double()), GRAD_TOL[torch.float32])


def test_broadcast_key_value_and_query_as_pytorch():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(3, 2, 4, 6, 8, generator=g)
    cases = [
        (q, torch.randn(1, 2, 4, 7, 8, generator=g), torch.randn(2, 4, 7, 8, generator=g), {}),   # batch broadcast
        (q[:1], torch.randn(3, 2, 4, 7, 8, generator=g), torch.randn(3, 2, 4, 7, 8, generator=g), {}),  # the query's
        (q, torch.randn(7, 8, generator=g), torch.randn(7, 8, generator=g), {}),                   # [S, E] keys
        (q, torch.randn(3, 2, 1, 7, 8, generator=g), torch.randn(3, 2, 1, 7, 8, generator=g), {}),  # one KV head
        (q, torch.randn(2, 1, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g), {"enable_gqa": True}),
    ]
    for qq, k, v, kw in cases:
        out = scaled_dot_product_attention(qq, k, v, **kw)
        want, _ = math_sdpa(qq, k, v, **kw)
        assert_out_close(out, want, OUT_TOL[torch.float32])
    with pytest.raises(ValueError, match="pass enable_gqa=True"):
        scaled_dot_product_attention(q, torch.randn(3, 2, 2, 7, 8), torch.randn(3, 2, 2, 7, 8))
    with pytest.raises(ValueError, match="must\\s+divide the number of query heads"):
        scaled_dot_product_attention(q, torch.randn(3, 2, 3, 7, 8), torch.randn(3, 2, 3, 7, 8), enable_gqa=True)
    with pytest.raises(ValueError, match="key and value must have the same sequence length"):
        scaled_dot_product_attention(q, torch.randn(7, 8), torch.randn(6, 8))
    with pytest.raises(ValueError, match="do not broadcast"):
        scaled_dot_product_attention(q, torch.randn(2, 2, 4, 7, 8), torch.randn(2, 2, 4, 7, 8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adversarial_rows_large_logits_fully_masked_odd_lengths(dtype):
    g = torch.Generator().manual_seed(6)
    nq, nk = 67, 131
    q = (torch.randn(1, 3, nq, 24, generator=g, dtype=torch.float64) * 40).to(dtype).requires_grad_()
    k = (torch.randn(1, 3, nk, 24, generator=g, dtype=torch.float64) * 40).to(dtype).requires_grad_()
    v = torch.randn(1, 3, nk, 24, generator=g, dtype=dtype).requires_grad_()
    mask = torch.rand(nq, nk, generator=g) > 0.5
    mask[[0, 13, 66]] = False                                    # fully masked rows
    out = scaled_dot_product_attention(q, k, v, attn_mask=mask)
    want, inputs64 = math_sdpa(q, k, v, attn_mask=mask)
    logits = (q.detach().double() @ k.detach().double().transpose(-1, -2)) / np.sqrt(24)
    assert logits.abs().max() > 1e3
    assert_out_close(out, want, OUT_TOL_LARGE[dtype])
    assert not out[..., [0, 13, 66], :].any()
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    assert_grads_close(torch.autograd.grad(out, (q, k, v), dout.to(dtype)),
                       torch.autograd.grad(want, inputs64, dout), GRAD_TOL_LARGE[dtype])
