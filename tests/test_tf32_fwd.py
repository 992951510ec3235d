"""GPU exactness tests of the 3xTF32 tensor-core forward (`kernels.flash_tf32_fwd.forward`).

Marked ``gpu``: the CUDA simulator cannot execute inline PTX. Each case draws fresh random
float32 inputs and compares against float64 softmax(Q K^T * scale) V of the same values.

Tolerance: the float32 CUDA-core kernel's, 2e-4 relative to the largest reference magnitude
(`tests/test_kernels.py`), for out and lse. Justification: with the 3xTF32 split every product
q*k and p*v carries ~2**-21 relative error (the dropped small*small term and the rounding of the
small halves, each ~2**-22), the same order as a float32 product's 2**-24 rounding times the
few-ulp accumulation error the CUDA-core kernel already has; sums are float32 in both, and
``ex2.approx`` adds ~2**-22. Large logits (scale 10) multiply the logit error by |s| ~ 1e2,
still far inside 2e-4 (the lse tolerance is relative to |lse| as well).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - CPU-only torch
    pytest.skip("torch has no CUDA here", allow_module_level=True)

from .helpers import dense_attention_reference  # noqa: E402
from kernels import flash_tf32_fwd  # noqa: E402
from kernels.flash_tf32_fwd import forward  # noqa: E402

TOL = 2e-4


def reference(q, k, v, scale, causal=False, mask=None, block_allowed=None, dropout_p=0.0,
              seed=0):
    """float64 attention on the float32 inputs (`tests.helpers.dense_attention_reference`);
    returns (out, lse) as NumPy arrays."""
    r = dense_attention_reference(q, k, v, scale=scale, causal=causal, mask=mask,
                                  block_allowed=block_allowed, dropout_p=dropout_p, seed=seed)
    return r["out"], r["lse"]


def _inputs(shape_q, shape_kv, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(shape_q, device="cuda", generator=g) * q_scale
    k = torch.randn(shape_kv, device="cuda", generator=g)
    v = torch.randn(shape_kv, device="cuda", generator=g)
    return q, k, v


def _check(q, k, v, out, lse, **ref_kw):
    """Compare with float64; returns the max abs errors (out, lse) for the record."""
    want_out, want_lse = reference(q, k, v, **ref_kw)
    got_out = out.double().cpu().numpy()
    got_lse = lse.cpu().numpy().astype(np.float64)
    assert np.isfinite(got_out).all()
    err_out = float(np.abs(got_out - want_out).max())
    assert err_out <= TOL * max(1.0, float(np.abs(want_out).max())), err_out
    fin = np.isfinite(want_lse)
    assert (np.isfinite(got_lse) == fin).all()
    err_lse = float(np.abs(got_lse[fin] - want_lse[fin]).max()) if fin.any() else 0.0
    assert err_lse <= TOL * max(1.0, float(np.abs(want_lse[fin]).max())), err_lse
    print(f"max abs error vs float64: out {err_out:.3g}, lse {err_lse:.3g}")
    return err_out, err_lse


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_float64(head_dim, causal):
    # Nq != Nk, neither a multiple of the tiles, GQA 4 query heads on 2 kv heads
    q, k, v = _inputs((2, 4, 200, head_dim), (2, 2, 333, head_dim), seed=head_dim + causal)
    scale = 1 / math.sqrt(head_dim)
    out, lse = forward(q, k, v, scale=scale, causal=causal)
    assert out.dtype == torch.float32 and out.shape == q.shape and lse.dtype == torch.float32
    _check(q, k, v, out, lse, scale=scale, causal=causal)


@pytest.mark.parametrize("head_dim,blocks", [(64, (None, None)), (64, (128, 32)),
                                             (64, (32, 16)), (128, (None, None)),
                                             (128, (32, 16))])
def test_large_logits_and_long_rows(head_dim, blocks):
    # adversarial: scale 10 gives logits up to ~+-300 (online max must rescale), 1100 keys
    q, k, v = _inputs((1, 2, 130, head_dim), (1, 2, 1100, head_dim), seed=7)
    out, lse = forward(q, k, v, scale=10.0, causal=False, block_q=blocks[0], block_k=blocks[1])
    _check(q, k, v, out, lse, scale=10.0)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_boolean_mask_with_fully_masked_rows(head_dim):
    q, k, v = _inputs((2, 2, 150, head_dim), (2, 2, 170, head_dim), seed=11)
    g = torch.Generator(device="cuda").manual_seed(3)
    mask = torch.rand((2, 1, 150, 170), device="cuda", generator=g) > 0.3
    mask[:, :, 5] = False  # rows with no allowed key: out 0, lse -inf
    out, lse = forward(q, k, v, scale=0.125, causal=True, mask=mask)
    _check(q, k, v, out, lse, scale=0.125, causal=True, mask=mask)
    assert float(out[:, :, 5].abs().max()) == 0.0
    assert bool(torch.isneginf(lse[:, :, 5]).all())


@pytest.mark.parametrize("head_dim,bq,bk", [(64, 64, 32), (128, 64, 16)])
def test_block_sparse_and_dropout(head_dim, bq, bk):
    q, k, v = _inputs((1, 2, 256, head_dim), (1, 2, 256, head_dim), seed=5)
    rng = np.random.default_rng(0)
    block_mask = rng.random((1, 2, 256 // bq, 256 // bk)) > 0.4
    allowed = np.repeat(np.repeat(block_mask, bq, axis=2), bk, axis=3)
    out, lse = forward(q, k, v, scale=0.09, block_mask=block_mask, block_q=bq, block_k=bk,
                       dropout_p=0.2, seed=1234)
    _check(q, k, v, out, lse, scale=0.09, block_allowed=allowed, dropout_p=0.2, seed=1234)


def test_mqa_strided_and_numba_arrays():
    from numba import cuda
    # one kv head for 3 query heads; q non-contiguous ([B, N, H, d] storage)
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(1, 300, 3, 64, device="cuda", generator=g).transpose(1, 2)
    k = torch.randn(1, 1, 257, 64, device="cuda", generator=g)
    v = torch.randn(1, 1, 257, 64, device="cuda", generator=g)
    out, lse = forward(q, k, v, scale=0.125, causal=True)
    _check(q, k, v, out, lse, scale=0.125, causal=True)
    qd, kd, vd = (cuda.as_cuda_array(x.contiguous()) for x in (q, k, v))
    assert flash_tf32_fwd.accepts(qd, kd, vd)
    out_d, lse_d = forward(qd, kd, vd, scale=0.125, causal=True)
    np.testing.assert_array_equal(out_d.copy_to_host(), out.cpu().numpy())


def test_accepts_and_bad_inputs():
    q, k, v = _inputs((1, 1, 32, 64), (1, 1, 32, 64), seed=0)
    assert flash_tf32_fwd.accepts(q, k, v)
    assert not flash_tf32_fwd.accepts(q.half(), k.half(), v.half())
    assert not flash_tf32_fwd.accepts(q.cpu().numpy(), k.cpu().numpy(), v.cpu().numpy())
    assert not flash_tf32_fwd.accepts(q, k, v, block_q=48)
    q80, k80, v80 = _inputs((1, 1, 32, 80), (1, 1, 32, 80), seed=0)
    assert not flash_tf32_fwd.accepts(q80, k80, v80)
    with pytest.raises(ValueError, match="head_dim"):
        forward(q80, k80, v80, scale=0.1)
    q, k, v = _inputs((1, 1, 32, 128), (1, 1, 32, 128), seed=0)
    with pytest.raises(ValueError, match="block_k"):
        forward(q, k, v, scale=0.1, block_k=64)
    with pytest.raises(TypeError):
        forward(q.half(), k.half(), v.half(), scale=0.1)


def test_ioaware_attention_numba_backend_float32():
    """ioaware.attention(backend="numba") on float32 CUDA tensors takes this kernel (unless
    KERNELS_FP32_TENSOR_CORES=0) and matches float64."""
    import os

    from ioaware import attention
    g = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn(2, 4, 300, 64, device="cuda", generator=g)
    k = torch.randn(2, 2, 280, 64, device="cuda", generator=g)
    v = torch.randn(2, 2, 280, 64, device="cuda", generator=g)
    out, lse = attention(q, k, v, causal=True, backend="numba", return_lse=True)
    _check(q, k, v, out, lse, scale=0.125, causal=True)
    if os.environ.get("KERNELS_FP32_TENSOR_CORES", "1") != "0":
        want, _ = forward(q, k, v, scale=0.125, causal=True)
        assert torch.equal(out, want)   # the dispatch took the 3xTF32 kernel


# compile-time variants of `flash_tf32_fwd.default_config` (environment override), each against
# float64 on tails, GQA and causal: pre-split K/V stages with 32- and 16-key stages (one or two
# split stages), one or two S accumulators, the S loop unrolled by 2 or not, 4 or 8 warps, and
# the register-split path (the former defaults: presplit=0 with 64 x 16 / 64 x 32 tiles)
VARIANTS = {128: ["", "dual=1", "unroll=1", "bk=16,dual=1", "bq=64,bk=16",
                  "presplit=0,bq=64,bk=16", "presplit=0,bq=128,bk=16"],
            64: ["", "dual=1", "unroll=1", "bk=16,dual=1", "bq=64", "presplit=0,bq=64",
                 "presplit=0"]}


@pytest.mark.parametrize("head_dim,variant", [(d, v) for d in (128, 64) for v in VARIANTS[d]])
@pytest.mark.parametrize("causal", [False, True])
def test_config_variants_match_float64(monkeypatch, head_dim, variant, causal):
    monkeypatch.setenv(f"KERNELS_TF32_FWD_D{head_dim}", variant)
    q, k, v = _inputs((2, 4, 300, head_dim), (2, 2, 333, head_dim), seed=head_dim + 3 * causal)
    scale = 1 / math.sqrt(head_dim)
    out, lse = forward(q, k, v, scale=scale, causal=causal)
    _check(q, k, v, out, lse, scale=scale, causal=causal)
    bq, bk = flash_tf32_fwd.default_blocks(head_dim)
    kern = flash_tf32_fwd.get_kernel(head_dim, bq, bk, causal, False, False)
    print(head_dim, repr(variant), kern.config, kern.smem_bytes)


def test_d128_default_presplit_large_logits_mask_dropout():
    # the d=128 default (pre-split stages) on the adversarial logits, and with a boolean mask
    # and dropout together
    assert flash_tf32_fwd.get_kernel(128, *flash_tf32_fwd.default_blocks(128), False, False,
                                     False).config["presplit"]
    q, k, v = _inputs((1, 2, 130, 128), (1, 2, 1100, 128), seed=17)
    out, lse = forward(q, k, v, scale=10.0)
    _check(q, k, v, out, lse, scale=10.0)
    q, k, v = _inputs((1, 2, 150, 128), (1, 2, 170, 128), seed=19)
    g = torch.Generator(device="cuda").manual_seed(4)
    mask = torch.rand((1, 1, 150, 170), device="cuda", generator=g) > 0.3
    out, lse = forward(q, k, v, scale=0.09, mask=mask, dropout_p=0.2, seed=77)
    _check(q, k, v, out, lse, scale=0.09, mask=mask, dropout_p=0.2, seed=77)
