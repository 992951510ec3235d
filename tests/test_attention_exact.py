"""The tiled NumPy attention equals the float64 reference: forward, backward, every feature.

Tolerances are in tests/helpers.py, stated and justified by dtype.
"""
import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from ioaware import BlockMask, attention, attention_backward
from ioaware.block_info import BlockInfo
from ioaware.reference import reference_backward, reference_forward
from ioaware.tiled import tiled_forward

from .helpers import ATOL, RTOL, grads_close, random_qkv


@st.composite
def problems(draw, max_n=300, max_d=128):
    heads_kv = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    batch = draw(st.sampled_from([0, 1, 2]))          # 0: no batch dimension ([H, N, d])
    nq, nk = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    d = draw(st.sampled_from([1, 3, 8, 16, 33, 64, max_d]))
    bq, bk = draw(st.integers(1, 128)), draw(st.integers(1, 128))
    assume(-(-nq // bq) * -(-nk // bk) <= 300)        # bound the Python-level tile loop
    assume((batch or 1) * heads_kv * group * nq * nk * d <= 3_000_000)
    causal = draw(st.booleans())
    mask_kind = draw(st.sampled_from(["none", "full", "key_padding"]))
    dtype = draw(st.sampled_from([np.float32, np.float32, np.float16]))
    seed = draw(st.integers(0, 2**32 - 1))
    return dict(batch=batch, heads_q=heads_kv * group, heads_kv=heads_kv, nq=nq, nk=nk, d=d, bq=bq, bk=bk,
                causal=causal, mask_kind=mask_kind, dtype=dtype, seed=seed)


def _make(pr):
    rng = np.random.default_rng(pr["seed"])
    q, k, v = random_qkv(rng, pr["batch"], pr["heads_q"], pr["heads_kv"], pr["nq"], pr["nk"], pr["d"], pr["dtype"])
    mask = None
    lead = q.shape[:-2]
    if pr["mask_kind"] == "full":
        mask = rng.random(lead + (pr["nq"], pr["nk"])) > 0.3
        mask[..., 0, :] = False                        # always one fully masked row
    elif pr["mask_kind"] == "key_padding":
        lengths = rng.integers(0, pr["nk"] + 1, size=lead[:-1] + (1, 1, 1))
        mask = np.arange(pr["nk"]) < lengths          # [..., 1, 1, Nk], length 0 masks everything
    return q, k, v, mask


def _check_close(got, want, dtype):
    assert np.all(np.isfinite(got) | np.isneginf(want))
    np.testing.assert_allclose(np.asarray(got, np.float64), want, atol=ATOL[dtype], rtol=RTOL[dtype])


@given(problems())
def test_forward_equals_float64_reference(pr):
    q, k, v, mask = _make(pr)
    kw = dict(causal=pr["causal"], mask=mask)
    out, lse = attention(q, k, v, **kw, block_q=pr["bq"], block_k=pr["bk"], backend="numpy", return_lse=True)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == np.float32
    ref_out, ref_lse = _reference(q, k, v, **kw)
    _check_close(out, ref_out, pr["dtype"])
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isneginf(lse), ~finite)   # no allowed key <=> lse = -inf
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=1e-4, rtol=1e-5)
    assert np.all(out[~finite] == 0)


@given(problems(max_n=120, max_d=64))
def test_backward_equals_float64_reference(pr):
    q, k, v, mask = _make(pr)
    kw = dict(causal=pr["causal"], mask=mask, block_q=pr["bq"], block_k=pr["bk"])
    out, lse = attention(q, k, v, **kw, backend="numpy", return_lse=True)
    dout = np.random.default_rng(pr["seed"] + 1).standard_normal(q.shape).astype(q.dtype)
    grads = attention_backward(q, k, v, out, lse, dout, **kw, backend="numpy")
    want = attention_backward(q, k, v, out, lse, dout, **kw, backend="reference")
    for g, w, x in zip(grads, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype and np.all(np.isfinite(g))
        assert grads_close(g, w, pr["dtype"])


def _reference(q, k, v, **kw):
    """float64 reference in the user's layout (float16 inputs are upcast exactly)."""
    from ioaware._inputs import check_inputs
    from ioaware._backends import _Grouped
    pb = check_inputs(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), **kw)
    g = _Grouped(pb, pb.q, pb.k, pb.v)
    out, lse = reference_forward(g.q, g.k, g.v, scale=pb.scale, allowed=g.allowed_full(), bh=g.bh,
                                 dropout_p=pb.dropout_p, seed=pb.seed)
    return out.reshape(q.shape), lse.reshape(q.shape[:-1])


@given(st.integers(1, 150), st.integers(1, 150), st.integers(1, 40), st.integers(1, 40),
       st.integers(0, 2**31), st.floats(0.05, 0.95))
def test_block_sparse_equals_the_expanded_elementwise_mask(nq, nk, bq, bk, seed, density):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 2, 4, 2, nq, nk, 16)
    bm = rng.random((2, 4, -(-nq // bq), -(-nk // bk))) < density
    block_mask = BlockMask(bm, bq, bk)
    out, lse = attention(q, k, v, block_mask=block_mask, causal=True, backend="numpy", return_lse=True)
    dense, dense_lse = attention(q, k, v, mask=block_mask.expand(nq, nk), causal=True, backend="numpy",
                                 block_q=bq, block_k=bk, return_lse=True)
    np.testing.assert_allclose(out, dense, atol=ATOL[np.float32], rtol=RTOL[np.float32])
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(dense_lse))


def test_skipped_tiles_are_never_read():
    """Poison a K/V block that no Q block visits: a tile that were read would turn the output NaN."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 32, 8)).astype(np.float32) for _ in range(3))
    v[..., 16:24, :] = np.nan                               # K block 2 (block_k = 8)
    bm = np.ones((4, 4), dtype=bool)
    bm[:, 2] = False
    info = BlockInfo.with_block_mask(32, 32, 8, 8, False, bm)
    out, _ = tiled_forward(q[:, :, None], k[:, :, None], v[:, :, None], scale=0.3, info=info,
                           bh=np.zeros((1, 1, 1), dtype=np.int64))
    assert np.all(np.isfinite(out))
    dense = np.repeat(np.repeat(bm, 8, 0), 8, 1)
    out_masked, _ = tiled_forward(q[:, :, None], k[:, :, None], v[:, :, None], scale=0.3,
                                  info=BlockInfo(32, 32, 8, 8), allowed=dense,
                                  bh=np.zeros((1, 1, 1), dtype=np.int64))
    assert np.isnan(out_masked).any()                       # masking alone would still read it


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_large_logits_do_not_overflow(dtype):
    """Logits up to +-1e4 after scaling: the online softmax's running max keeps exp() in range."""
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 2, 2, 70, 90, 4, dtype)
    q = (q * 50).astype(dtype)
    k = (k * 50).astype(dtype)
    out, lse = attention(q, k, v, scale=1.0, block_q=16, block_k=16, backend="numpy", return_lse=True)
    logits = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64))
    assert np.abs(logits).max() > 5e3
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    ref, ref_lse = _reference(q, k, v, scale=1.0)
    # float32 rounding of a logit of size 1e4 is ~1e-3 absolute, so probabilities carry ~1e-3
    # relative error; outputs (convex combinations of |v| <= ~4) are compared at 2e-2.
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=2e-2)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)


def test_fully_masked_rows_give_zeros_and_minus_inf_and_zero_gradients():
    rng = np.random.default_rng(4)
    q, k, v = random_qkv(rng, 1, 2, 2, 20, 30, 8)
    mask = rng.random((1, 2, 20, 30)) > 0.5
    mask[..., [0, 7, 19], :] = False
    out, lse = attention(q, k, v, mask=mask, block_q=8, block_k=8, backend="numpy", return_lse=True)
    assert np.all(out[..., [0, 7, 19], :] == 0) and np.all(np.isneginf(lse[..., [0, 7, 19]]))
    assert np.all(np.isfinite(out))
    dq, dk, dv = attention_backward(q, k, v, out, lse, np.ones_like(out), mask=mask, block_q=8, block_k=8,
                                    backend="numpy")
    assert all(np.all(np.isfinite(g)) for g in (dq, dk, dv))
    assert np.all(dq[..., [0, 7, 19], :] == 0)


@given(st.integers(2, 100), st.integers(1, 64), st.integers(0, 2**31))
def test_permuting_keys_and_values_together_leaves_the_output_unchanged(nk, bk, seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 1, 2, 1, 33, nk, 16)
    mask = rng.random((1, 2, 33, nk)) > 0.2
    perm = rng.permutation(nk)
    a = attention(q, k, v, mask=mask, block_k=bk, backend="numpy")
    b = attention(q, k[..., perm, :], v[..., perm, :], mask=mask[..., perm], block_k=bk, backend="numpy")
    np.testing.assert_allclose(a, b, atol=ATOL[np.float32], rtol=RTOL[np.float32])


@given(st.integers(2, 90), st.integers(1, 40), st.integers(1, 40), st.integers(0, 2**31))
def test_causal_row_i_does_not_depend_on_keys_after_i(n, bq, bk, seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 1, 1, 1, n, n, 8)
    j = int(rng.integers(1, n))
    k2, v2 = k.copy(), v.copy()
    k2[..., j:, :] = rng.standard_normal(k2[..., j:, :].shape) * 100
    v2[..., j:, :] = rng.standard_normal(v2[..., j:, :].shape) * 100
    a = attention(q, k, v, causal=True, block_q=bq, block_k=bk, backend="numpy")
    b = attention(q, k2, v2, causal=True, block_q=bq, block_k=bk, backend="numpy")
    assert np.array_equal(a[..., :j, :], b[..., :j, :])    # masked entries contribute exactly 0
    assert not np.array_equal(a[..., j:, :], b[..., j:, :])


@given(st.integers(1, 120), st.integers(1, 120), st.booleans(), st.integers(0, 2**31))
def test_probabilities_from_the_logsumexp_sum_to_one(nq, nk, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v = random_qkv(rng, 1, 2, 2, nq, nk, 16, scale=3.0)
    _, lse = attention(q, k, v, causal=causal, block_q=32, block_k=16, backend="numpy", return_lse=True)
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / 4.0
    if causal:
        s = np.where(np.arange(nk)[None, :] <= np.arange(nq)[:, None], s, -np.inf)
    # lse is float32: rounding it moves exp(s - lse) by up to half an ulp of |lse| (relative), and
    # its float32 computation (m + log l) adds a few more; |lse| reaches ~40 with these logits
    tol = 8 * np.finfo(np.float32).eps * max(1.0, float(np.abs(lse).max()))
    np.testing.assert_allclose(np.exp(s - lse[..., None].astype(np.float64)).sum(-1), 1.0, rtol=tol)


# ---- gradients -------------------------------------------------------------------------------
def _torch_naive(q, k, v, causal, mask, scale):
    s = q @ k.transpose(-1, -2) * scale
    allowed = torch.ones(s.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    if mask is not None:
        allowed = allowed & mask
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.softmax(s, -1) @ v


@given(st.integers(1, 70), st.integers(1, 70), st.booleans(), st.integers(1, 32), st.integers(0, 2**31))
def test_autograd_gradients_equal_torch_autograd_on_a_float64_reference(nq, nk, causal, bq, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for n in (nq, nk, nk))
    mask = torch.rand(2, 3, nq, nk, generator=g) > 0.2
    mask[..., 0] = True                                      # keep every row non-empty for torch's softmax
    q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
    out = attention(q1, k1, v1, causal=causal, mask=mask, block_q=bq, block_k=bq + 3, backend="numpy")
    dout = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, (q1, k1, v1), dout)
    q2, k2, v2 = (x.double().requires_grad_() for x in (q, k, v))
    ref = _torch_naive(q2, k2, v2, causal, mask, 0.25)
    want = torch.autograd.grad(ref, (q2, k2, v2), dout.double())
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), atol=2e-5)
    for a, b in zip(got, want):
        assert a.dtype == torch.float32
        assert grads_close(a.numpy(), b.numpy())


@pytest.mark.parametrize("dropout_p", [0.0, 0.4])
def test_analytic_reference_gradients_equal_finite_differences_in_float64(dropout_p):
    """The float64 reference's gradients (which the tiled backward is checked against) are right."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s) for s in ((1, 2, 2, 5, 3), (1, 2, 1, 4, 3), (1, 2, 1, 4, 3)))
    allowed = rng.random((1, 2, 2, 5, 4)) > 0.3
    bh = np.arange(4).reshape(1, 2, 2)
    w = rng.standard_normal(q.shape)
    kw = dict(scale=0.7, allowed=allowed, bh=bh, dropout_p=dropout_p, seed=11)
    loss = lambda q_, k_, v_: float((reference_forward(q_, k_, v_, **kw)[0] * w).sum())  # noqa: E731
    grads = reference_backward(q, k, v, w, **kw)
    eps = 1e-6
    for i, x in enumerate((q, k, v)):
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            xp, xm = x.copy(), x.copy()
            xp[idx] += eps
            xm[idx] -= eps
            args_p = [q, k, v]
            args_m = [q, k, v]
            args_p[i], args_m[i] = xp, xm
            num[idx] = (loss(*args_p) - loss(*args_m)) / (2 * eps)
        np.testing.assert_allclose(grads[i], num, atol=1e-7, rtol=1e-6)


# ---- dropout ---------------------------------------------------------------------------------
def test_dropout_same_seed_same_output_and_backends_agree():
    rng = np.random.default_rng(6)
    q, k, v = random_qkv(rng, 2, 2, 1, 40, 50, 8)
    kw = dict(dropout_p=0.3, seed=1234, causal=True, block_q=16, block_k=8)
    a, lse = attention(q, k, v, backend="numpy", return_lse=True, **kw)
    assert np.array_equal(a, attention(q, k, v, backend="numpy", **kw))
    assert not np.allclose(a, attention(q, k, v, backend="numpy", **{**kw, "seed": 1235}))
    ref = attention(q, k, v, backend="reference", **kw)
    np.testing.assert_allclose(a, ref, atol=ATOL[np.float32], rtol=RTOL[np.float32])
    dout = rng.standard_normal(q.shape).astype(np.float32)
    got = attention_backward(q, k, v, a, lse, dout, backend="numpy", **kw)
    want = attention_backward(q, k, v, a, lse, dout, backend="reference", **kw)
    for x, y in zip(got, want):
        assert grads_close(x, y)


def test_dropout_keeps_one_minus_p_of_the_probabilities():
    """With v = one-hot columns, out = P * keep / (1 - p) exposes the kept fraction."""
    n, p = 256, 0.25
    q = np.zeros((1, 1, n, 8), dtype=np.float32)            # uniform attention: P = 1/n
    k = np.zeros((1, 1, n, 8), dtype=np.float32)
    v = np.eye(n, dtype=np.float32)[None, None, :, :8]
    out = attention(q, k, v, dropout_p=p, seed=99, backend="numpy")
    kept = np.isclose(out * n * (1 - p), 1.0)
    dropped = out == 0
    assert np.all(kept | dropped)
    sigma = np.sqrt(p * (1 - p) / kept.size)
    assert abs(kept.mean() - (1 - p)) < 5 * sigma


def test_autograd_with_dropout_uses_the_forward_mask():
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 24, 8, generator=g, requires_grad=True) for _ in range(3))
    out = attention(q, k, v, dropout_p=0.5, seed=5, block_q=8, block_k=8)
    got = torch.autograd.grad(out.sum(), (q, k, v))
    want = attention_backward(q.detach(), k.detach(), v.detach(), out.detach(),
                              attention(q.detach(), k.detach(), v.detach(), dropout_p=0.5, seed=5,
                                        return_lse=True)[1],
                              torch.ones_like(out), dropout_p=0.5, seed=5, backend="reference")
    for a, b in zip(got, want):
        assert grads_close(a.numpy(), b.numpy())
