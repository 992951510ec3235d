"""ioaware.fp8 on the CPU: quantisation, incoherent processing, the reference forward, dispatch.

Tolerances, stated where they are used:

* quantize: ``x_fp8 * descale`` is within half an e4m3 ulp of ``x``: ``2**-4 |x|`` for
  normal values, ``2**-10 * descale`` below e4m3's smallest normal (``2**-6``), plus
  ``2**-20 |x|`` for the float32 division before the cast (relative ``2**-24``).
* attention: the reference is float64 attention of the dequantised inputs
  (``x.float() * descale``, the function's stated semantics). The output is the float32
  result rounded to bfloat16, so ``|out - ref| <= 2**-8 |ref| + E``: ``2**-8`` is bfloat16's
  unit roundoff (8 significant bits), and ``E = max|v| (2e-5 + 2 delta)`` the float32 error
  carried through the rounding: ``2e-5 max|v|`` is the float32 tolerance of
  tests/helpers.py (values of order 1), and ``delta = d 2**-24 scale max_ij sum_c |q_ic k_jc|``
  bounds the float32 error of a logit, which moves the softmax-weighted sum by at most
  ``2 delta max|v|``. The logsumexp: ``|lse - ref| <= 1e-5 (1 + |ref|) + delta``.
"""
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ioaware
import ioaware.fp8 as fp8

FP8 = torch.float8_e4m3fn


def _randn(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# ------------------------------------------------------------------------------------------------
# quantize
# ------------------------------------------------------------------------------------------------
def _assert_round_trip(x, x_fp8, descale):
    x64 = x.double()
    back = x_fp8.double() * descale.double()[..., None, None]
    bound = 2**-4 * x64.abs() + 2**-10 * descale.double()[..., None, None] + 2**-20 * x64.abs()
    excess = (back - x64).abs() - bound
    assert excess.max() <= 0, f"round trip exceeds half an e4m3 ulp by {excess.max().item():.3g}"


@given(batch=st.integers(1, 2), heads=st.integers(1, 3), n=st.integers(1, 20), d=st.integers(1, 16),
       dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
       per=st.sampled_from(["head", "tensor"]), exponent=st.integers(-12, 8),
       outlier=st.booleans(), seed=st.integers(0, 2**31))
def test_quantize_round_trip_is_within_half_an_e4m3_ulp(batch, heads, n, d, dtype, per, exponent, outlier, seed):
    x = _randn((batch, heads, n, d), seed) * 2.0**exponent
    if outlier:
        x[0, 0, 0, 0] *= 16.0                  # float16 keeps 2**8 * 16 * |N(0, 1)| finite
    x = x.to(dtype)
    x_fp8, descale = fp8.quantize(x, per=per)
    assert x_fp8.dtype == FP8 and x_fp8.shape == x.shape
    assert descale.dtype == torch.float32 and descale.shape == (batch, heads)
    amax = x.float().abs().amax(dim=(-2, -1))
    if per == "tensor":
        amax = amax.max().expand(batch, heads)
    torch.testing.assert_close(descale, amax / 448.0, rtol=0, atol=0)
    _assert_round_trip(x, x_fp8, descale)
    # the largest magnitude uses e4m3's whole range: it lands on 448
    used = x_fp8.float().abs().amax(dim=(-2, -1))
    if per == "head":
        assert torch.all(used == 448.0)
    else:
        assert used.max() == 448.0


def test_quantize_all_zero_slice_gets_descale_one():
    x = _randn((2, 3, 5, 8), 1)
    x[1, 2] = 0.0
    x_fp8, descale = fp8.quantize(x)
    assert descale[1, 2] == 1.0 and torch.all(x_fp8[1, 2].float() == 0)
    assert torch.all(descale[0] != 1.0)
    _assert_round_trip(x, x_fp8, descale)
    zeros_fp8, zeros_descale = fp8.quantize(torch.zeros(1, 2, 3, 4), per="tensor")
    assert torch.all(zeros_descale == 1.0) and torch.all(zeros_fp8.float() == 0)


def test_quantize_per_tensor_shares_one_descale():
    x = _randn((2, 3, 7, 8), 2)
    x[0, 1] *= 50.0
    x_fp8, descale = fp8.quantize(x, per="tensor")
    assert descale.shape == (2, 3) and torch.all(descale == x.abs().max() / 448.0)
    _assert_round_trip(x, x_fp8, descale)
    # the small heads lose resolution against per-head scales
    per_head_fp8, per_head = fp8.quantize(x)
    err_tensor = (x_fp8.double() * descale.double()[..., None, None] - x).abs()[1].max()
    err_head = (per_head_fp8.double() * per_head.double()[..., None, None] - x).abs()[1].max()
    assert err_head < err_tensor


def test_quantize_empty_tensor():
    x_fp8, descale = fp8.quantize(torch.zeros(2, 3, 0, 8))
    assert x_fp8.shape == (2, 3, 0, 8) and x_fp8.dtype == FP8
    assert torch.equal(descale, torch.ones(2, 3))


@pytest.mark.parametrize("x, error, match", [
    (np.zeros((1, 1, 2, 2), np.float32), TypeError, "x must be a torch tensor"),
    (torch.zeros(1, 1, 2, 2, dtype=torch.int32), TypeError, "x has dtype torch.int32"),
    (torch.zeros(1, 1, 2, 2, dtype=torch.float64), TypeError, "x has dtype torch.float64"),
    (torch.zeros(1, 2, 2), ValueError, r"x must have shape \[B, H, N, d\]"),
    (torch.tensor([[[[1.0, float("nan")]]]]), ValueError, "x contains NaN or infinite"),
    (torch.tensor([[[[1.0, float("-inf")]]]], dtype=torch.float16), ValueError, "x contains NaN or infinite"),
])
def test_quantize_refusals(x, error, match):
    with pytest.raises(error, match=match):
        fp8.quantize(x)


def test_quantize_refuses_unknown_per():
    with pytest.raises(ValueError, match="per must be 'head' or 'tensor'"):
        fp8.quantize(torch.ones(1, 1, 2, 2), per="block")


# ------------------------------------------------------------------------------------------------
# incoherent processing
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [1, 2, 4, 16, 64, 128, 256])
def test_rotation_is_orthogonal_and_a_signed_hadamard(d):
    m = fp8.incoherent_rotation(d, seed=3)
    assert m.dtype == torch.float64 and m.shape == (d, d)
    torch.testing.assert_close(m @ m.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    # Sylvester's H_d has entries (-1)^popcount(i & j); M = diag(s) H_d / sqrt(d), s in {-1, 1}^d
    i, j = np.meshgrid(np.arange(d), np.arange(d), indexing="ij")
    hadamard = torch.from_numpy((-1.0) ** np.vectorize(lambda a: bin(a).count("1"))(i & j))
    signs = m * math.sqrt(d) / hadamard
    torch.testing.assert_close(signs, signs[:, :1].expand(d, d), rtol=0, atol=1e-12)
    assert torch.all(signs[:, 0].abs().sub(1).abs() < 1e-12)


@given(lead=st.lists(st.integers(1, 3), min_size=1, max_size=3), log_d=st.integers(0, 7),
       nq=st.integers(1, 9), nk=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_incoherent_preserves_q_k_transpose(lead, log_d, nq, nk, seed):
    d = 2**log_d
    q = _randn((*lead, nq, d), seed, torch.float64)
    k = _randn((*lead, nk, d), seed + 1, torch.float64) * 5.0
    q_rot, k_rot = fp8.incoherent(q, k, seed=seed)
    assert q_rot.dtype == torch.float64 and q_rot.shape == q.shape and k_rot.shape == k.shape
    torch.testing.assert_close(q_rot @ k_rot.transpose(-1, -2), q @ k.transpose(-1, -2), rtol=0, atol=1e-10)
    assert not torch.allclose(q_rot, q) or d == 1      # it did rotate


def test_incoherent_is_determined_by_the_seed():
    q, k = _randn((1, 2, 5, 64), 0), _randn((1, 2, 7, 64), 1)
    first, again, other = fp8.incoherent(q, k, seed=7), fp8.incoherent(q, k, seed=7), fp8.incoherent(q, k, seed=8)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    assert torch.equal(fp8.incoherent_rotation(64, seed=7), fp8.incoherent_rotation(64, seed=7))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_incoherent_keeps_the_dtype_and_rounds_once(dtype):
    q, k = _randn((2, 2, 6, 32), 3, dtype), _randn((2, 1, 4, 32), 4, dtype)
    q_rot, k_rot = fp8.incoherent(q, k, seed=1)
    assert q_rot.dtype == dtype and k_rot.dtype == dtype
    m = fp8.incoherent_rotation(32, seed=1)
    for got, x in ((q_rot, q), (k_rot, k)):
        want = x.double() @ m                          # products in float32, one final rounding
        eps = torch.finfo(dtype).eps
        assert torch.all((got.double() - want).abs() <= eps * want.abs() + 1e-5 * want.abs().max())


def test_incoherent_spreads_an_outlier():
    q = torch.zeros(1, 1, 1, 64)
    q[..., 5] = 100.0
    q_rot, _ = fp8.incoherent(q, q, seed=0)
    torch.testing.assert_close(q_rot.abs(), torch.full_like(q_rot, 100.0 / 8.0))


@pytest.mark.parametrize("q, k, error, match", [
    (torch.zeros(1, 1, 2, 48), torch.zeros(1, 1, 2, 48), ValueError, "head dim must be a power of two"),
    (torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 16), ValueError, "q and k must have the same head dim"),
    (torch.zeros(1, 1, 2, 8, dtype=torch.int64), torch.zeros(1, 1, 2, 8), TypeError, "q has dtype"),
    (torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8).to(FP8), TypeError, "k has dtype"),
    (torch.zeros(1, 1, 2, 8), np.zeros((1, 1, 2, 8)), TypeError, "k must be a torch tensor"),
])
def test_incoherent_refusals(q, k, error, match):
    with pytest.raises(error, match=match):
        fp8.incoherent(q, k)


def test_incoherent_rotation_refuses_bad_head_dims():
    for d in (0, 3, 96):
        with pytest.raises(ValueError, match="head dim must be a power of two"):
            fp8.incoherent_rotation(d)
    with pytest.raises(TypeError, match="head dim must be an int"):
        fp8.incoherent_rotation(64.0)


# ------------------------------------------------------------------------------------------------
# attention: the reference path against float64
# ------------------------------------------------------------------------------------------------
def _dequantised(x_fp8, descale):
    return x_fp8.float() * descale[:, :, None, None]


def _float64_attention(qf, kf, vf, *, scale, causal):
    """Materialised float64 attention, [B, H, N, d] layout, GQA by repeating K/V heads,
    top-left causal (query i sees keys j <= i); -inf lse and zero rows where no key is allowed."""
    q, k, v = (x.double() for x in (qf, kf, vf))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = scale * (q @ k.transpose(-1, -2))
    if causal:
        allowed = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
        s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, dim=-1) if s.shape[-1] else torch.full(s.shape[:-1], -math.inf, dtype=torch.float64)
    finite = torch.isfinite(lse)[..., None]
    p = torch.where(finite, torch.exp(s - torch.where(finite, lse[..., None], 0.0)), 0.0)
    return p @ v, lse


def _check_against_float64(out, lse, qf, kf, vf, *, scale, causal):
    ref_out, ref_lse = _float64_attention(qf, kf, vf, scale=scale, causal=causal)
    assert out.dtype == torch.bfloat16 and out.shape == qf.shape
    assert lse.dtype == torch.float32 and lse.shape == qf.shape[:-1]
    group = qf.shape[1] // kf.shape[1]
    mag = qf.double().abs() @ kf.double().abs().repeat_interleave(group, dim=1).transpose(-1, -2)
    delta = qf.shape[-1] * 2**-24 * abs(scale) * mag.max().item()      # float32 logit error bound
    vmax = vf.abs().max().item()
    bound = 2**-8 * ref_out.abs() + vmax * (2e-5 + 2 * delta)
    excess = (out.double() - ref_out).abs() - bound
    assert excess.max() <= 0, f"out exceeds its bound by {excess.max().item():.3g}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    lse_excess = (lse.double() - ref_lse)[finite].abs() - (1e-5 * (1 + ref_lse[finite].abs()) + delta)
    assert lse_excess.numel() == 0 or lse_excess.max() <= 0, f"lse exceeds its bound by {lse_excess.max():.3g}"


def _problem(batch, heads_q, heads_kv, nq, nk, d, seed, descale_spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (fp8.quantize(torch.randn(batch, h, n, d, generator=gen))[0]
               for h, n in ((heads_q, nq), (heads_kv, nk), (heads_kv, nk)))

    def descale(h):   # per-(batch, head) values, distinct so a wrong index shows
        return (torch.rand(batch, h, generator=gen) * descale_spread + 0.5) / 448.0

    return q, k, v, descale(heads_q), descale(heads_kv), descale(heads_kv)


@given(batch=st.integers(1, 2), heads_kv=st.integers(1, 2), group=st.integers(1, 3), nq=st.integers(1, 40),
       nk=st.integers(1, 40), d=st.sampled_from([1, 5, 8, 16, 33]), causal=st.booleans(),
       scale=st.sampled_from([None, 0.3]), seed=st.integers(0, 2**31))
def test_reference_path_equals_float64_attention(batch, heads_kv, group, nq, nk, d, causal, scale, seed):
    q, k, v, dq, dk, dv = _problem(batch, heads_kv * group, heads_kv, nq, nk, d, seed, descale_spread=4.0)
    out, lse = fp8.attention(q, k, v, descale_q=dq, descale_k=dk, descale_v=dv, causal=causal, scale=scale,
                             return_lse=True)
    _check_against_float64(out, lse, _dequantised(q, dq), _dequantised(k, dk), _dequantised(v, dv),
                           scale=1 / math.sqrt(d) if scale is None else scale, causal=causal)


@pytest.mark.parametrize("heads_q, heads_kv, nq, nk, causal", [
    (2, 2, 37, 53, False), (2, 2, 37, 53, True),     # odd lengths, Nq < Nk
    (2, 2, 53, 37, True),                            # Nq > Nk causal: rows i >= Nk see every key
    (4, 2, 37, 53, True), (4, 1, 29, 29, False),     # GQA, MQA
])
def test_reference_path_shapes(heads_q, heads_kv, nq, nk, causal):
    q, k, v, dq, dk, dv = _problem(2, heads_q, heads_kv, nq, nk, 16, seed=nq * nk + heads_q)
    out, lse = fp8.attention(q, k, v, descale_q=dq, descale_k=dk, descale_v=dv, causal=causal, return_lse=True)
    _check_against_float64(out, lse, _dequantised(q, dq), _dequantised(k, dk), _dequantised(v, dv),
                           scale=0.25, causal=causal)


def test_no_keys_gives_zero_rows_and_minus_infinity():
    q, k, v, *_ = _problem(1, 2, 1, 5, 0, 8, seed=0)
    for causal in (False, True):
        out, lse = fp8.attention(q, k, v, causal=causal, return_lse=True)
        assert out.shape == (1, 2, 5, 8) and torch.all(out == 0)
        assert torch.all(torch.isneginf(lse))


def test_large_logits_stay_finite_and_exact():
    # dequantised q up to 300, k up to 6: logits in the hundreds, past float32 exp's range (~88)
    q, k, v, _, dk, dv = _problem(1, 2, 2, 33, 47, 16, seed=5)
    dq = torch.full((1, 2), 300.0 / 448.0)
    out, lse = fp8.attention(q, k, v, descale_q=dq, descale_k=dk * 4, descale_v=dv, causal=True, return_lse=True)
    assert torch.all(torch.isfinite(out)) and lse.max() > 200
    _check_against_float64(out, lse, _dequantised(q, dq), _dequantised(k, dk * 4), _dequantised(v, dv),
                           scale=0.25, causal=True)


def test_descale_forms_agree():
    q, k, v, *_ = _problem(2, 4, 2, 9, 11, 8, seed=3)
    full = fp8.attention(q, k, v, descale_q=torch.full((2, 4), 0.5), descale_k=torch.full((2, 2), 0.25),
                         descale_v=torch.full((2, 2), 2.0))
    for dq, dk, dv in [(0.5, 0.25, 2), (torch.tensor(0.5), torch.tensor([[0.25]]), torch.full((2, 1), 2.0)),
                       (torch.full((1, 4), 0.5, dtype=torch.float64), torch.full((2,), 0.25), torch.tensor(2.0))]:
        assert torch.equal(fp8.attention(q, k, v, descale_q=dq, descale_k=dk, descale_v=dv), full)
    assert torch.equal(fp8.attention(q, k, v), fp8.attention(q, k, v, descale_q=1.0, descale_k=1.0, descale_v=1.0))
    assert torch.equal(fp8.attention(q, k, v, scale=torch.tensor(0.125)), fp8.attention(q, k, v, scale=0.125))


def test_incoherent_processing_lowers_fp8_error_on_outlier_inputs():
    """FlashAttention-3's experiment on the reference path (P not rounded): N(0, 1) inputs with
    0.1 % outliers of std 10, RMSE against float64 attention of the unquantised inputs. Rotating
    Q and K must lower the error: measured ratios rotated / plain 0.62-0.77 over eight seeds
    at this shape (longer sequences gain more: 0.67-0.88 at Nk = 256); asserted < 0.85."""
    shape = (1, 4, 512, 64)
    for seed in range(4):
        q, k, v = (fp8.outlier_inputs(shape, seed=3 * seed + i) for i in range(3))
        reference, _ = _float64_attention(q, k, v, scale=1 / 8, causal=False)

        def fp8_rmse(q, k):
            (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize(x) for x in (q, k, v))
            return fp8.rmse(fp8.attention(q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv), reference)

        plain, rotated = fp8_rmse(q, k), fp8_rmse(*fp8.incoherent(q, k, seed=seed))
        assert rotated < 0.85 * plain, (seed, plain, rotated)
        assert plain < 0.05


# ------------------------------------------------------------------------------------------------
# attention: refusals
# ------------------------------------------------------------------------------------------------
def _fp8(*shape):
    return torch.zeros(shape).to(FP8)


Q, KV = _fp8(2, 4, 5, 8), _fp8(2, 2, 6, 8)


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((torch.zeros(2, 4, 5, 8), KV, KV), {}, TypeError, r"q has dtype torch.float32.*quantize"),
    ((Q, KV.to(torch.bfloat16), KV), {}, TypeError, r"k has dtype torch.bfloat16.*quantize"),
    ((Q, KV, KV.to(torch.float8_e5m2)), {}, TypeError, r"v has dtype torch.float8_e5m2"),
    ((Q, KV, np.zeros((2, 2, 6, 8))), {}, TypeError, "v must be a torch tensor"),
    ((_fp8(4, 5, 8), KV, KV), {}, ValueError, r"q must have shape \[B, H, N, d\]"),
    ((Q, _fp8(2, 2, 6, 8, 1), KV), {}, ValueError, r"k must have shape \[B, H, N, d\]"),
    ((Q, _fp8(1, 2, 6, 8), KV), {}, ValueError, "same batch size"),
    ((Q, _fp8(2, 2, 6, 16), _fp8(2, 2, 6, 16)), {}, ValueError, r"k's head dim \(16\) differs from q's \(8\)"),
    ((Q, KV, _fp8(2, 2, 6, 16)), {}, ValueError, r"v's head dim \(16\) differs from q's \(8\)"),
    ((Q, KV, _fp8(2, 2, 7, 8)), {}, ValueError, "k and v must have the same heads and length"),
    ((Q, _fp8(2, 3, 6, 8), _fp8(2, 3, 6, 8)), {}, ValueError, r"q's heads \(4\) must be a multiple"),
    ((Q, KV, KV), {"causal": "bottom_right"}, TypeError, "causal must be a bool"),
    ((Q, KV, KV), {"scale": math.inf}, ValueError, "scale must be finite"),
    ((Q, KV, KV), {"scale": "0.1"}, TypeError, "scale must be a number"),
    ((Q, KV, KV), {"descale_q": 0.0}, ValueError, "descale_q must be finite and > 0"),
    ((Q, KV, KV), {"descale_k": torch.tensor([[1.0, math.nan]])}, ValueError, "descale_k must be finite and > 0"),
    ((Q, KV, KV), {"descale_v": -1.0}, ValueError, "descale_v must be finite and > 0"),
    ((Q, KV, KV), {"descale_v": math.inf}, ValueError, "descale_v must be finite and > 0"),
    ((Q, KV, KV), {"descale_k": torch.ones(2, 4)}, ValueError, r"descale_k has shape \(2, 4\).*\[2, 2\]"),
    ((Q, KV, KV), {"descale_q": torch.ones(3, 1)}, ValueError, r"descale_q has shape \(3, 1\)"),
    ((Q, KV, KV), {"descale_q": torch.ones(2, 4, requires_grad=True)}, ValueError, "descale_q requires grad"),
    ((Q, KV, KV), {"descale_q": torch.ones(2, 4, dtype=torch.int32)}, TypeError, "descale_q has dtype"),
    ((Q, KV, KV), {"descale_v": "1"}, TypeError, "descale_v must be None, a number or a torch tensor"),
    ((Q, KV, KV), {"descale_v": True}, TypeError, "descale_v must be None, a number or a torch tensor"),
    ((Q, KV, KV), {"descale_k": torch.ones(2, 2, device="meta")}, ValueError, "descale_k is on meta"),
    ((Q, KV.to("meta"), KV), {}, ValueError, "q, k and v must be on the same device"),
])
def test_attention_refusals(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        fp8.attention(*args, **kwargs)


def test_attention_refuses_inputs_that_require_grad():
    q = _fp8(2, 4, 5, 8).requires_grad_(True)
    with pytest.raises(ValueError, match="q requires grad"):
        fp8.attention(q, KV, KV)


# ------------------------------------------------------------------------------------------------
# dispatch to the kernel
# ------------------------------------------------------------------------------------------------
class _FakeKernels:
    """Stands in for kernels.wgmma_fwd: records its calls, answers with a given refusal."""

    def __init__(self, refusal=None):
        self.refusal, self.supports_calls, self.forward_calls = refusal, [], []

    def fp8_supports(self, *args):
        self.supports_calls.append(args)
        return self.refusal

    def forward_fp8(self, q, k, v, descale_q, descale_k, descale_v, *, causal, scale):
        self.forward_calls.append(dict(q=q, k=k, v=v, descale_q=descale_q, descale_k=descale_k,
                                       descale_v=descale_v, causal=causal, scale=scale))
        self.out = torch.zeros(q.shape, dtype=torch.bfloat16)
        self.lse = torch.zeros(q.shape[:-1])
        return self.out, self.lse


def test_kernel_path_decisions(monkeypatch):
    shape = (2, 4, 2, 37, 53, 128, True)
    assert fp8._kernel_path(None, *shape) == (None, None)           # CPU: reference, no warning
    module, reason = fp8._kernel_path((8, 9), *shape)
    assert module is None and "compute capability 8.9 is below 9.0" in reason
    fake = _FakeKernels()
    monkeypatch.setattr(fp8, "_import_fp8_kernels", lambda: fake)
    assert fp8._kernel_path((9, 0), *shape) == (fake, None)
    assert fake.supports_calls == [shape]
    fake.refusal = "head dim 96 is not 64 or 128"
    assert fp8._kernel_path((10, 0), *shape) == (None, "head dim 96 is not 64 or 128")

    def missing():
        raise AttributeError("module 'kernels.wgmma_fwd' has no attribute 'forward_fp8'")

    monkeypatch.setattr(fp8, "_import_fp8_kernels", missing)
    module, reason = fp8._kernel_path((9, 0), *shape)
    assert module is None and "no FP8 forward" in reason and "forward_fp8" in reason


def test_kernel_receives_expanded_float32_descales(monkeypatch):
    fake = _FakeKernels()
    monkeypatch.setattr(fp8, "_kernel_path", lambda capability, *shape: (fake, None))
    q, k, v = _fp8(2, 4, 5, 64), _fp8(2, 2, 6, 64), _fp8(2, 2, 6, 64)
    out, lse = fp8.attention(q, k, v, descale_q=0.5, descale_k=torch.tensor([[0.25], [0.75]], dtype=torch.float64),
                             descale_v=torch.tensor(2.0), causal=True, return_lse=True)
    assert out is fake.out and lse is fake.lse
    (call,) = fake.forward_calls
    assert call["q"] is q and call["k"] is k and call["v"] is v
    assert call["causal"] is True and call["scale"] == 1 / 8
    for name, shape, want in (("descale_q", (2, 4), 0.5), ("descale_v", (2, 2), 2.0)):
        d = call[name]
        assert d.shape == shape and d.dtype == torch.float32 and d.is_contiguous() and torch.all(d == want)
    dk = call["descale_k"]
    assert dk.shape == (2, 2) and dk.dtype == torch.float32 and dk.is_contiguous()
    assert torch.equal(dk, torch.tensor([[0.25, 0.25], [0.75, 0.75]]))
    assert fp8.attention(q, k, v, scale=0.3) is fake.out and fake.forward_calls[-1]["scale"] == 0.3
    assert torch.all(fake.forward_calls[-1]["descale_q"] == 1.0)


def test_fallback_warns_once_per_reason(monkeypatch):
    reasons = iter(["reason A", "reason A", "reason B", "reason A"])
    monkeypatch.setattr(fp8, "_kernel_path", lambda capability, *shape: (None, next(reasons)))
    monkeypatch.setattr(fp8, "_warned_reasons", set())
    q, k, v, dq, dk, dv = _problem(1, 2, 1, 7, 9, 8, seed=2)
    want = fp8._reference_forward(q, k, v, dq, dk.expand(1, 1), dv, causal=False, scale=8**-0.5)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [fp8.attention(q, k, v, descale_q=dq, descale_k=dk, descale_v=dv) for _ in range(4)]
    messages = [str(w.message) for w in caught if issubclass(w.category, ioaware.PerformanceWarning)]
    assert len(messages) == 2 and "reason A" in messages[0] and "reason B" in messages[1]
    assert all(torch.equal(out, want) for out in outs)


def test_cpu_calls_do_not_warn():
    q, k, v, *_ = _problem(1, 2, 1, 4, 4, 8, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ioaware.PerformanceWarning)
        fp8.attention(q, k, v)


# ------------------------------------------------------------------------------------------------
# rmse and outlier_inputs
# ------------------------------------------------------------------------------------------------
def test_rmse():
    x = _randn((3, 4, 5), 0)
    assert fp8.rmse(x, x.clone()) == 0.0
    assert fp8.rmse(torch.zeros(2, 3), torch.full((2, 3), 3.0)) == pytest.approx(3.0, rel=1e-15)
    assert fp8.rmse(torch.tensor([3.0, 0.0]), np.array([0.0, 4.0])) == pytest.approx(math.sqrt(12.5), rel=1e-15)
    a = torch.ones(1000, dtype=torch.float64)
    assert fp8.rmse(a + 1e-12, a) == pytest.approx(1e-12, rel=1e-3)    # float64, not float32
    assert fp8.rmse(torch.ones(4, dtype=torch.bfloat16), torch.zeros(4)) == 1.0
    with pytest.raises(ValueError, match=r"out has shape \(2, 3\) but reference has \(3, 2\)"):
        fp8.rmse(torch.zeros(2, 3), torch.zeros(3, 2))
    with pytest.raises(ValueError, match="out is empty"):
        fp8.rmse(torch.zeros(0, 3), torch.zeros(0, 3))
    with pytest.raises(TypeError, match="reference must be a torch tensor"):
        fp8.rmse(torch.zeros(2), [0.0, 0.0])


def test_outlier_fraction_is_bernoulli():
    """With std 1e6 almost every outlier lands beyond |x| = 100 (missed with probability
    ~8e-5) and no N(0, 1) entry does, so the count is Binomial(n, 0.001): 1000 +- 31.6 for
    n = 10**6; asserted within 5 standard deviations."""
    x = fp8.outlier_inputs((1000, 1000), seed=0, outlier_std=1e6)
    count = int((x.abs() > 100).sum())
    assert abs(count - 1000) < 5 * math.sqrt(1000 * 0.999)
    y = fp8.outlier_inputs((1000, 1000), seed=1, outlier_fraction=0.01, outlier_std=1e6)
    assert abs(int((y.abs() > 100).sum()) - 10_000) < 5 * math.sqrt(10_000 * 0.99)


def test_outlier_inputs_default_distribution():
    """N(0, 1) + Bernoulli(0.001) N(0, 100): E[x^2] = 1 + 0.1 = 1.1 (its sample mean over
    10**6 entries has standard deviation 0.0057), and P(|x| > 6) = 0.001 P(|N(0, 101)| > 6) =
    5.5e-4 (N(0, 1) alone: 2e-9), a count of 550 +- 23; both asserted within 5 deviations."""
    x = fp8.outlier_inputs((4, 250, 1000), seed=2)
    assert x.dtype == torch.float32 and x.shape == (4, 250, 1000)
    x = x.double()
    assert abs(x.pow(2).mean().item() - 1.1) < 5 * 0.0057
    expected = 1e6 * 0.001 * math.erfc(6 / math.sqrt(2 * 101))
    assert abs(int((x.abs() > 6).sum()) - expected) < 5 * math.sqrt(expected)


def test_outlier_inputs_seed_device_dtype():
    a = fp8.outlier_inputs((3, 5), seed=4)
    assert a.dtype == torch.float32 and a.device.type == "cpu"
    assert torch.equal(a, fp8.outlier_inputs((3, 5), seed=4))
    assert not torch.equal(a, fp8.outlier_inputs((3, 5), seed=5))
    b = fp8.outlier_inputs((3, 5), seed=4, dtype=torch.bfloat16)
    assert b.dtype == torch.bfloat16 and torch.equal(b, a.to(torch.bfloat16))
    assert torch.equal(fp8.outlier_inputs((3, 5), seed=4, outlier_fraction=0.0),
                       torch.randn((3, 5), generator=torch.Generator().manual_seed(4)))
    for kwargs, match in [({"outlier_fraction": 1.5}, "outlier_fraction"), ({"outlier_std": -1.0}, "outlier_std"),
                          ({"outlier_std": math.nan}, "outlier_std")]:
        with pytest.raises(ValueError, match=match):
            fp8.outlier_inputs((3, 5), seed=0, **kwargs)
    with pytest.raises(ValueError, match="shape must be non-negative ints"):
        fp8.outlier_inputs((3, -1), seed=0)
    with pytest.raises(TypeError, match="dtype must be a torch floating-point dtype"):
        fp8.outlier_inputs((3,), seed=0, dtype=torch.int32)
