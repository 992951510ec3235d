"""The public API as users call it: types, shapes, dtypes, the SDPA drop-in, and every bad input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import ioaware
from ioaware import BlockMask, attention, attention_backward, scaled_dot_product_attention

from .helpers import ATOL, RTOL, grads_close


def _qkv(shape_q=(2, 4, 10, 8), shape_kv=(2, 4, 12, 8), dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape_q).astype(dtype), rng.standard_normal(shape_kv).astype(dtype),
            rng.standard_normal(shape_kv).astype(dtype))


@pytest.mark.parametrize("shape_q, shape_kv", [
    ((10, 8), (12, 8)),                       # [N, d]
    ((4, 10, 8), (2, 12, 8)),                 # [H, N, d], GQA
    ((2, 4, 10, 8), (2, 1, 12, 8)),           # [B, H, N, d], MQA
    ((3, 2, 4, 10, 8), (3, 2, 2, 12, 8)),     # extra leading dims
])
def test_shapes_come_back_as_they_went_in(shape_q, shape_kv):
    q, k, v = _qkv(shape_q, shape_kv)
    out, lse = attention(q, k, v, return_lse=True, block_q=4, block_k=5)
    assert out.shape == q.shape and lse.shape == q.shape[:-1] and isinstance(out, np.ndarray)
    ref = attention(q, k, v, backend="reference")
    np.testing.assert_allclose(out, ref, atol=ATOL[np.float32], rtol=RTOL[np.float32])
    dq, dk, dv = attention_backward(q, k, v, out, lse, np.ones_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_in_torch_out_same_dtype(dtype):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 19, 16, generator=g).to(dtype) for _ in range(3))
    out, lse = attention(q, k, v, causal=True, return_lse=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and lse.dtype == torch.float32
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    # one rounding of the output to the input dtype: 2**-8 relative for bfloat16, 2**-11 for float16
    tol = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out.double(), want, atol=tol, rtol=tol)


def test_autograd_through_attention_in_half_precision():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 17, 8, generator=g).half().requires_grad_() for _ in range(3))
    attention(q, k, v).float().sum().backward()
    assert q.grad.dtype == torch.float16 and torch.isfinite(q.grad).all()
    q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
    F.scaled_dot_product_attention(q2, k2, v2).sum().backward()
    for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        assert grads_close(a.double().numpy(), b.numpy(), np.float16)


@pytest.mark.parametrize("backend", ["auto", "numba"])
def test_autograd_with_operands_and_gradient_in_heads_second_layout(backend):
    """The Hugging Face layout: q, k, v and the output's gradient are [B, N, H, d] tensors
    viewed as [B, H, N, d]. The gradient is read in place (`_dense`: a dense view is not
    copied; an expanded one is) and the gradients equal those of contiguous copies."""
    from ioaware._torch_ops import _dense
    g = torch.Generator().manual_seed(4)
    base = [torch.randn(1, 12, 2, 8, generator=g) for _ in range(4)]
    strided = [x.transpose(1, 2) for x in base]
    assert _dense(strided[3]) is strided[3]
    expanded = torch.randn(1, 2, 1, 8, generator=g).expand(1, 2, 12, 8)
    assert _dense(expanded).is_contiguous()
    grads = []
    for ops in (strided, [x.contiguous() for x in strided]):
        leaves = [x.detach().clone().requires_grad_() for x in ops[:3]]
        kw = dict(block_q=8, block_k=8) if backend == "numba" else {}
        attention(*leaves, causal=True, backend=backend, **kw).backward(ops[3])
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_autograd_saves_only_q_k_v_out_lse_besides_references_to_the_inputs():
    """Nothing of the size of S or P is saved: besides out and lse, only the caller's own
    tensors (q, k, v, the mask) and the 0-d dropout seed."""
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    mask = torch.rand(9, 9) > 0.5
    out, lse = attention(q, k, v, mask=mask, return_lse=True)
    saved = [t for t in out.grad_fn.saved_tensors if t is not None]
    assert saved[0] is q and saved[1] is k and saved[2] is v and any(t is mask for t in saved)
    new = [t for t in saved if not any(t is x for x in (q, k, v, mask))]
    assert sorted(tuple(t.shape) for t in new) == sorted([(), tuple(out.shape), tuple(lse.shape)])


@given(st.integers(1, 40), st.integers(1, 40), st.booleans(), st.sampled_from(["none", "bool", "float"]),
       st.integers(1, 2), st.integers(0, 2**31))
def test_drop_in_matches_torch_sdpa(nq, nk, causal, mask_kind, heads_kv, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, nq, 16, generator=g)
    k, v = (torch.randn(2, heads_kv, nk, 16, generator=g) for _ in range(2))
    attn_mask = None
    if mask_kind == "bool":
        attn_mask = torch.rand(nq, nk, generator=g) > 0.3
        attn_mask[:, 0] = True                      # torch returns NaN for empty rows; we return 0
    elif mask_kind == "float":
        attn_mask = torch.randn(1, 4, nq, nk, generator=g)
    if attn_mask is not None:
        causal = False
    kw = dict(attn_mask=attn_mask, is_causal=causal, enable_gqa=heads_kv != 4, scale=0.3)
    got = scaled_dot_product_attention(q, k, v, **kw)
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_drop_in_refuses_what_torch_refuses():
    q, k, v = (torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8))
    with pytest.raises(ValueError, match="enable_gqa"):
        scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="is_causal"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(5, 5, dtype=torch.bool),
                                     is_causal=True, enable_gqa=True)


def test_block_mask_forms_are_equivalent():
    q, k, v = _qkv((1, 2, 20, 8), (1, 2, 20, 8))
    bm = np.random.default_rng(2).random((3, 4)) > 0.4
    a = attention(q, k, v, block_mask=BlockMask(bm, 7, 5))
    b = attention(q, k, v, block_mask=(bm, (7, 5)))
    c = attention(q, k, v, block_mask=bm, block_q=7, block_k=5)
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_numba_backend_through_the_cuda_simulator_or_gpu():
    """backend='numba' on NumPy inputs copies to the device (the simulator in CI) and back."""
    q, k, v = _qkv((1, 2, 12, 8), (1, 1, 10, 8))
    out, lse = attention(q, k, v, causal=True, backend="numba", block_q=8, block_k=8, return_lse=True)
    ref, ref_lse = attention(q, k, v, causal=True, backend="reference", return_lse=True)
    np.testing.assert_allclose(out, ref, atol=ATOL[np.float32], rtol=RTOL[np.float32])
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5)


# ---- bad input -------------------------------------------------------------------------------
def _raises(exc, match, *args, **kw):
    with pytest.raises(exc, match=match):
        attention(*args, **kw)


def test_errors_name_the_argument_and_what_was_expected():
    q, k, v = _qkv()
    _raises(TypeError, "q must be a NumPy array or a torch tensor", q.tolist(), k, v)
    _raises(TypeError, "all be NumPy arrays or all torch tensors", torch.from_numpy(q), k, v)
    _raises(TypeError, "dtype int32", q.astype(np.int32), k, v)
    _raises(TypeError, "same dtype", q.astype(np.float64), k, v)
    _raises(TypeError, "same dtype", q, k.astype(np.float16), v)
    _raises(ValueError, "at least 2 dimensions", q[0, 0, 0], k, v)
    _raises(ValueError, "same number of dimensions", q[0], k, v)
    _raises(ValueError, "k and v must have the same shape except the last", q, k, v[..., :5, :])
    _raises(ValueError, "same head dimension", q[..., :4], k, v)
    _raises(ValueError, "same batch dimensions", q, k[:1], v[:1])
    _raises(ValueError, r"multiple of the number of key/value heads \(3\)", q, k[:, :3], v[:, :3])
    _raises(TypeError, "block_q must be a positive integer", q, k, v, block_q=16.0)
    _raises(ValueError, "block_k must be a positive integer", q, k, v, block_k=0)
    _raises(TypeError, "block_q", q, k, v, block_q=True)
    _raises(TypeError, "mask must be boolean", q, k, v, mask=np.ones((10, 12)))
    _raises(ValueError, "mask has shape .* does not broadcast", q, k, v, mask=np.ones((10, 11), bool))
    _raises(ValueError, "mask has shape .* does not broadcast", q, k, v, mask=np.ones((3, 4, 10, 12), bool))
    _raises(ValueError, "dropout_p must be in", q, k, v, dropout_p=1.5)
    _raises(TypeError, "dropout_p must be a float", q, k, v, dropout_p=np.ones(2))
    _raises(TypeError, "causal must be a bool, 'top_left' or 'bottom_right'", q, k, v, causal="lower")
    _raises(ValueError, "seed must be an integer", q, k, v, dropout_p=0.1, seed=-3)
    _raises(ValueError, "scale must be finite", q, k, v, scale=float("nan"))
    _raises(ValueError, "backend must be one of", q, k, v, backend="cuda")
    _raises(ValueError, "block_mask needs its block shape", q, k, v, block_mask=np.ones((3, 3), bool))
    _raises(ValueError, "block_mask has shape", q, k, v, block_mask=BlockMask(np.ones((2, 2), bool), 4, 4))
    _raises(ValueError, "differ from the block mask's block shape", q, k, v,
            block_mask=BlockMask(np.ones((3, 3), bool), 4, 4), block_q=8)
    bad = q.copy()
    bad[0, 0, 0, 0] = np.nan
    _raises(ValueError, "q contains NaN", bad, k, v)
    with pytest.raises(ValueError, match="dout must have shape"):
        attention_backward(q, k, v, q, q[..., 0], q[..., :4])
    with pytest.raises(ValueError, match="needs the forward's seed"):
        attention_backward(q, k, v, q, q[..., 0], q, dropout_p=0.5)


def test_torch_errors():
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    _raises(TypeError, "mask must be a torch tensor", q, k, v, mask=np.ones((5, 5), bool))
    _raises(TypeError, "mask must be boolean", q, k, v, mask=torch.ones(5, 5))
    _raises(TypeError, "dtype int32", q.int(), k.int(), v.int())
    _raises(TypeError, "mask must be boolean", q, k, v, mask=torch.ones(5, 5, dtype=torch.uint8))
    if torch.cuda.is_available():  # pragma: no cover - GPU only
        _raises(ValueError, "same device", q.cuda(), k, v)


def test_public_names():
    assert ioaware.attention is attention
    for name in ("attention", "attention_backward", "scaled_dot_product_attention", "BlockMask", "BlockInfo"):
        assert getattr(ioaware, name).__doc__


def test_autograd_after_an_inference_mode_call():
    """Calls without dropout share one seed tensor; made by a call under inference mode, it must
    still be one autograd can save."""
    torch = pytest.importorskip("torch")
    import sys
    sys.modules["ioaware.attention"]._zero_seed.cache_clear()
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    with torch.inference_mode():
        attention(q, k, v)
    q.requires_grad_(True)
    attention(q, k, v).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
