"""Sliding-window (local) attention: ``window_size=(left, right)`` with FlashAttention-2's
semantics, on the NumPy tiled path and the float64 reference, forward and backward.

The window is written out here, independently of `ioaware.block_info`: with ``off = Nk - Nq``
query i sees key j iff ``i + off - left <= j <= i + off + right`` (-1: that side unbounded),
and causal adds ``j <= i + off`` (bottom-right, or top-left with Nq == Nk). Every windowed
result is compared with the float64 reference run on that rule given as a boolean ``mask``.

Tolerances are tests/helpers.py's, per dtype (float32: atol 2e-5, rtol 1e-4; float16: 4e-3;
gradients by relative Frobenius norm 2e-4 / 1e-2). A float16 gradient may instead meet, element
by element, the bound of tests/test_mma_bwd.py, which scales with the terms each element sums
(u = 2**-11): a gradient whose exact value cancels to zero (a single visible key makes dS = 0)
still carries the rounding of the float16 output inside delta = rowsum(dO O), which a norm
relative to zero cannot allow for.
"""
import inspect

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.autograd import gradcheck

from ioaware import attention, attention_backward, scaled_dot_product_attention
from ioaware._cost import band_pairs
from ioaware.block_info import BlockInfo, band_offsets
from ioaware.tiled import tiled_forward

from .helpers import ATOL, RTOL, dense_attention_reference, grads_close, random_qkv


def window_rule(nq, nk, window, causal=False):
    """The allowed [Nq, Nk] pairs of a window (and causal rule), written out."""
    off = nk - nq
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    allowed = np.ones((nq, nk), dtype=bool)
    left, right = window
    if left >= 0:
        allowed &= j >= i + off - left
    if right >= 0:
        allowed &= j <= i + off + right
    if causal:
        allowed &= j <= i + off          # bottom-right; top-left is the same when Nq == Nk
    return allowed


def _reference_with_rule(q, k, v, dout, *, window, causal, mask=None, **kw):
    """Forward (out, lse) and gradients of the float64 reference with the rule as a mask."""
    rule = window_rule(q.shape[-2], k.shape[-2], window, causal)
    allowed = rule if mask is None else (mask & rule)
    out, lse = attention(q, k, v, mask=allowed, backend="reference", return_lse=True, **kw)
    grads = attention_backward(q, k, v, out, lse, dout, mask=allowed, backend="reference", **kw)
    return out, lse, grads


def within_half_bounds(grads, q, k, v, dout, *, window, causal, mask=None, dropout_p=0.0, seed=0):
    """Float16 dq, dk, dv within the element-wise bounds 4u (summed magnitudes) + 2u |exact| + 1e-5."""
    rule = window_rule(q.shape[-2], k.shape[-2], window, causal)
    allowed = rule if mask is None else (mask & rule)
    want = dense_attention_reference(q, k, v, dout, scale=q.shape[-1] ** -0.5, mask=allowed,
                                     dropout_p=dropout_p, seed=seed)
    u = 2.0 ** -11
    for g, name, bound in zip(grads, ("dq", "dk", "dv"), ("eq", "ek", "ev")):
        tol = 4 * u * want[bound] + 2 * u * np.abs(want[name]) + 1e-5
        if not (np.abs(np.asarray(g, np.float64) - want[name]) <= tol).all():
            return False
    return True


sides = st.one_of(st.just(-1), st.just(0), st.integers(0, 12), st.integers(0, 400))


@st.composite
def windowed_problems(draw, max_n=160):
    heads_kv = draw(st.integers(1, 2))
    group = draw(st.integers(1, 3))
    nq, nk = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    bq, bk = draw(st.integers(1, 64)), draw(st.integers(1, 64))
    assume(-(-nq // bq) * -(-nk // bk) <= 200)
    window = (draw(sides), draw(sides))
    causal = draw(st.sampled_from([False, "bottom_right"] + ([True] if nq == nk else [])))
    return dict(heads_kv=heads_kv, heads_q=heads_kv * group, nq=nq, nk=nk, bq=bq, bk=bk, window=window,
                causal=causal, d=draw(st.sampled_from([4, 16, 33])),
                dtype=draw(st.sampled_from([np.float32, np.float32, np.float16])),
                mask=draw(st.sampled_from(["none", "random", "key_padding"])),
                dropout_p=draw(st.sampled_from([0.0, 0.0, 0.3])), seed=draw(st.integers(0, 2**31)))


def _make(pr):
    rng = np.random.default_rng(pr["seed"])
    q, k, v = random_qkv(rng, 2, pr["heads_q"], pr["heads_kv"], pr["nq"], pr["nk"], pr["d"], pr["dtype"])
    dout = rng.standard_normal(q.shape).astype(q.dtype)
    mask = None
    if pr["mask"] == "random":
        mask = rng.random((2, pr["heads_q"], pr["nq"], pr["nk"])) > 0.3
    elif pr["mask"] == "key_padding":
        mask = np.arange(pr["nk"]) < rng.integers(0, pr["nk"] + 1, size=(2, 1, 1, 1))
    return q, k, v, dout, mask


@given(windowed_problems())
def test_windowed_forward_and_backward_equal_the_float64_rule(pr):
    q, k, v, dout, mask = _make(pr)
    kw = dict(causal=pr["causal"], dropout_p=pr["dropout_p"], seed=7)
    out, lse = attention(q, k, v, window_size=pr["window"], mask=mask, block_q=pr["bq"], block_k=pr["bk"],
                         backend="numpy", return_lse=True, **kw)
    grads = attention_backward(q, k, v, out, lse, dout, window_size=pr["window"], mask=mask, block_q=pr["bq"],
                               block_k=pr["bk"], backend="numpy", **kw)
    ref_out, ref_lse, ref_grads = _reference_with_rule(q, k, v, dout, window=pr["window"], mask=mask, **kw)
    dt = pr["dtype"]
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=ATOL[dt], rtol=RTOL[dt])
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))      # no key in the window <=> -inf
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], atol=1e-4, rtol=1e-5)
    assert np.all(out[~finite] == 0)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype and np.all(np.isfinite(g))
    assert (all(grads_close(g, want, dt) for g, want in zip(grads, ref_grads))
            or (dt == np.float16 and within_half_bounds(grads, q, k, v, dout, window=pr["window"], mask=mask,
                                                        **kw)))


@given(windowed_problems(max_n=60))
def test_the_reference_backend_applies_the_window_as_the_rule(pr):
    """backend="reference" with window_size is bit for bit the reference with the rule as a mask."""
    q, k, v, dout, mask = _make(pr)
    kw = dict(causal=pr["causal"], dropout_p=pr["dropout_p"], seed=3)
    out, lse = attention(q, k, v, window_size=pr["window"], mask=mask, backend="reference", return_lse=True, **kw)
    grads = attention_backward(q, k, v, out, lse, dout, window_size=pr["window"], mask=mask, backend="reference",
                               **kw)
    ref_out, ref_lse, ref_grads = _reference_with_rule(q, k, v, dout, window=pr["window"], mask=mask, **kw)
    assert np.array_equal(out, ref_out) and np.array_equal(lse, ref_lse)
    assert all(np.array_equal(a, b) for a, b in zip(grads, ref_grads))


# -- adversarial cases ------------------------------------------------------------------------------
CASES = [  # (Nq, Nk, window, causal)
    (40, 40, (0, 0), False),           # each query sees exactly its own key
    (40, 40, (0, 0), True),
    (40, 40, (0, -1), False),          # one-sided: everything from the diagonal on
    (40, 40, (-1, 0), False),          # = bottom-right causal
    (40, 40, (3, 5), True),            # causal: right is effectively 0
    (33, 50, (100, 100), False),       # wider than N both ways: no window at all
    (50, 33, (7, 2), "bottom_right"),  # Nq > Nk: the first Nq - Nk - 2 rows see no key
    (50, 33, (0, 0), False),           # Nq > Nk, one key per row for the last 33 rows
    (1, 97, (16, 0), "bottom_right"),  # decoding: the last query, a 17-key window
    (97, 1, (5, 5), False),            # one key
    (20, 64, (-1, 3), False),          # Nq < Nk, left unbounded
]


@pytest.mark.parametrize("nq, nk, window, causal", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_adversarial_windows(nq, nk, window, causal, dtype):
    rng = np.random.default_rng(nq * 1000 + nk)
    q, k, v = random_qkv(rng, 2, 4, 2, nq, nk, 16, dtype)                 # GQA
    dout = rng.standard_normal(q.shape).astype(dtype)
    kw = dict(causal=causal)
    out, lse = attention(q, k, v, window_size=window, block_q=8, block_k=16, backend="numpy", return_lse=True, **kw)
    grads = attention_backward(q, k, v, out, lse, dout, window_size=window, block_q=8, block_k=16, backend="numpy",
                               **kw)
    ref_out, ref_lse, ref_grads = _reference_with_rule(q, k, v, dout, window=window, **kw)
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=ATOL[dtype], rtol=RTOL[dtype])
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    for g, want in zip(grads, ref_grads):
        assert grads_close(g, want, dtype)
    empty = ~window_rule(nq, nk, window, causal).any(axis=1)
    assert np.all(out[..., empty, :] == 0) and np.all(np.isneginf(lse[..., empty]))
    assert np.all(grads[0][..., empty, :] == 0)                         # dq of an empty row


def test_rows_outside_every_window_get_zeros_minus_inf_and_zero_gradients():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, 1, 2, 2, 30, 10, 8)                      # off = -20
    window = (1, 3)                                                      # row i sees i - 21 .. i - 17
    out, lse = attention(q, k, v, window_size=window, block_q=8, block_k=4, backend="numpy", return_lse=True)
    empty = ~window_rule(30, 10, window).any(axis=1)
    assert empty[:17].all() and not empty[17:].any()
    assert np.all(out[..., :17, :] == 0) and np.all(np.isneginf(lse[..., :17]))
    dq, dk, dv = attention_backward(q, k, v, out, lse, np.ones_like(out), window_size=window, block_q=8,
                                    block_k=4, backend="numpy")
    assert np.all(dq[..., :17, :] == 0) and all(np.isfinite(g).all() for g in (dq, dk, dv))


def test_no_window_and_a_window_wider_than_the_sequence_agree_exactly():
    rng = np.random.default_rng(2)
    q, k, v = random_qkv(rng, 1, 2, 1, 37, 41, 16)
    plain = attention(q, k, v, causal="bottom_right", block_q=8, block_k=8, backend="numpy")
    for window in (None, (-1, -1), (41, 41), (-1, 0), (500, 2)):
        got = attention(q, k, v, causal="bottom_right", window_size=window, block_q=8, block_k=8, backend="numpy")
        assert np.array_equal(got, plain), window


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_large_logits_in_a_window(dtype):
    """Logits of order 1e4: the online softmax stays finite inside the band, as without one."""
    rng = np.random.default_rng(3)
    q, k, v = random_qkv(rng, 1, 2, 2, 70, 90, 4, dtype)
    q, k = (q * 50).astype(dtype), (k * 50).astype(dtype)
    out, lse = attention(q, k, v, scale=1.0, window_size=(9, 4), block_q=16, block_k=16, backend="numpy",
                         return_lse=True)
    ref, ref_lse, _ = _reference_with_rule(q, k, v, np.zeros_like(q), window=(9, 4), causal=False, scale=1.0)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse))
    # as test_attention_exact.test_large_logits_do_not_overflow: float32 rounding of a 1e4 logit
    np.testing.assert_allclose(out.astype(np.float64), ref, atol=2e-2)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5)


def test_tiles_outside_the_window_are_never_read():
    """Poison the K/V blocks the first two Q blocks' windows do not reach: a tile that were read
    would turn their rows NaN (0 * NaN); masking alone (the control) does."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 1, 1, 64, 8)).astype(np.float32) for _ in range(3))
    info = BlockInfo(64, 64, 8, 8, window_size=(4, 4))
    assert info.k_blocks(0) == (0, 1) and info.k_blocks(1) == (0, 1, 2)
    v[..., 24:, :] = np.nan                                  # K blocks 3..7
    bh = np.zeros((1, 1, 1), dtype=np.int64)
    out, _ = tiled_forward(q, k, v, scale=0.3, info=info, bh=bh)
    assert np.all(np.isfinite(out[..., :16, :]))
    masked, _ = tiled_forward(q, k, v, scale=0.3, info=BlockInfo(64, 64, 8, 8), bh=bh,
                              allowed=window_rule(64, 64, (4, 4)))
    assert np.isnan(masked[..., :16, :]).any()


# -- torch: autograd, gradcheck, the operators ---------------------------------------------------------
def _inputs(seed, shape_q, shape_k, value_dim=None):
    g = torch.Generator().manual_seed(seed)
    shape_v = shape_k[:-1] + (value_dim or shape_k[-1],)
    return tuple(torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True)
                 for s in (shape_q, shape_k, shape_v))


@pytest.mark.parametrize("window, causal, nq, nk", [((1, 1), False, 6, 6), ((2, 0), True, 6, 6),
                                                    ((1, -1), False, 4, 7), ((2, 1), "bottom_right", 7, 4),
                                                    ((0, 0), False, 5, 5)])
def test_windowed_gradcheck_at_float64(window, causal, nq, nk):
    """torch.autograd.gradcheck (eps 1e-6, atol 1e-5, rtol 1e-3) through the operators' formula,
    GQA with Ev != E, with a boolean mask, and with the logsumexp in the loss where no row is
    empty (finite differences of an lse of -inf are NaN)."""
    q, k, v = _inputs(nq * 10 + nk, (1, 4, nq, 6), (1, 2, nk, 6), value_dim=5)
    mask = torch.rand(1, 1, nq, nk, generator=torch.Generator().manual_seed(1)) > 0.3
    for m in (None, mask):
        kw = dict(causal=causal, window_size=window, mask=m, block_q=2, block_k=3)
        assert gradcheck(lambda q_, k_, v_: attention(q_, k_, v_, **kw), (q, k, v))
    if window_rule(nq, nk, window, causal).any(axis=1).all():   # (an empty row's lse is -inf)
        kw = dict(causal=causal, window_size=window, block_q=2, block_k=3, return_lse=True)
        assert gradcheck(lambda q_, k_, v_: attention(q_, k_, v_, **kw), (q, k, v))


def test_torch_autograd_equals_attention_backward_with_a_window():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, n, 16, generator=g) for n in (33, 45, 45))
    k, v = k[:, :2], v[:, :2]
    kw = dict(causal="bottom_right", window_size=(6, 2), dropout_p=0.2, seed=11, block_q=8, block_k=8)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attention(*leaves, return_lse=True, **kw)
    dout = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, leaves, dout)
    want = attention_backward(q.numpy(), k.numpy(), v.numpy(), out.detach().numpy(), lse.detach().numpy(),
                              dout.numpy(), backend="reference", **kw)
    for a, b in zip(got, want):
        assert grads_close(a.numpy(), b)


def test_window_through_torch_compile_fullgraph():
    """The window travels through the operators' schema: aot_eager traces it without a break and
    gives the eager result."""
    q, k, v = (torch.randn(1, 2, 24, 8, generator=torch.Generator().manual_seed(s)) for s in (1, 2, 3))

    def f(q_, k_, v_):
        return attention(q_, k_, v_, window_size=(3, 1), block_q=8, block_k=8)
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, k, v), f(q, k, v))
    assert not torch.equal(f(q, k, v), attention(q, k, v, block_q=8, block_k=8))


# -- arguments -----------------------------------------------------------------------------------------
def test_bad_window_sizes_are_refused_naming_the_argument():
    q = np.zeros((1, 2, 6, 8), np.float32)
    for bad in (4, (1,), (1, 2, 3), (1.5, 2), (True, 1), "4,0", {1: 2}):
        for x in (q, torch.from_numpy(q)):
            with pytest.raises(TypeError, match="window_size"):
                attention(x, x, x, window_size=bad)
    with pytest.raises(ValueError, match="window_size must be a pair .* its right entry is -3"):
        attention(q, q, q, window_size=(2, -3))
    with pytest.raises(ValueError, match="window_size"):
        attention_backward(q, q, q, q, q[..., 0], q, window_size=(-5, 0))


def test_top_left_causal_with_a_window_and_unequal_lengths_is_refused():
    q, k = np.zeros((1, 1, 5, 8), np.float32), np.zeros((1, 1, 9, 8), np.float32)
    for causal in (True, "top_left"):
        for x, y in ((q, k), (torch.from_numpy(q), torch.from_numpy(k))):
            with pytest.raises(ValueError, match=r"window_size=\(2, 0\) with causal=.* \(top-left\) and Nq=5 != "
                                                 r"Nk=9 would mix two alignments.*causal='bottom_right'"):
                attention(x, y, y, causal=causal, window_size=(2, 0))
    attention(q, k, k, causal="bottom_right", window_size=(2, 0))     # the window's own alignment
    attention(q, q, q, causal=True, window_size=(2, 0))               # equal lengths: one alignment


def test_sdpa_has_no_window():
    assert "window_size" not in inspect.signature(scaled_dot_product_attention).parameters
    assert "window_size" in inspect.signature(attention).parameters
    assert "window_size" in inspect.signature(attention_backward).parameters


@given(st.integers(0, 60), st.integers(0, 60), sides, sides, st.sampled_from([False, True]))
def test_the_cost_estimate_counts_the_band(nq, nk, left, right, causal):
    """`ioaware._cost.band_pairs` (the CPU time estimate) counts the rule's pairs exactly."""
    want = int(window_rule(nq, nk, (left, right), causal).sum()) if nq and nk else 0
    band = band_offsets(nq, nk, causal, "bottom_right", None if (left, right) == (-1, -1) else (left, right))
    assert band_pairs(nq, nk, band) == want
