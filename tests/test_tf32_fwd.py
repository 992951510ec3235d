"""GPU exactness tests of the 3xTF32 tensor-core forward (`kernels.tf32_fwd`, the ``tf32`` family).

Marked ``gpu``: the CUDA simulator cannot execute inline PTX. Each case draws fresh random
float32 inputs, runs `kernels.forward` with the family forced (``KernelConfig(family="tf32")``:
a problem the family cannot run raises instead of running on another family) and compares
against float64 softmax(Q K^T * scale) V of the same values.

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

import kernels  # noqa: E402
from kernels import KernelConfig, tf32_fwd, tile_scheduler  # noqa: E402

from .helpers import (default_half_forward, dense_attention_reference, kernel_problem,  # noqa: E402
                      kernels_forward)

TOL = 2e-4


def forward(q, k, v, *, block_q=None, block_k=None, launch_order=None, **kw):
    """`kernels.forward` on the ``tf32`` family with these kernel tiles and launch order (with
    a ``block_mask``, ``block_q``/``block_k`` are its tiles and the family chooses its own)."""
    if kw.get("block_mask") is not None:
        kw.update(block_q=block_q, block_k=block_k)
        block_q = block_k = None
    config = KernelConfig(family="tf32", block_q=block_q, block_k=block_k,
                          launch_order=launch_order)
    return kernels_forward(q, k, v, config=config, **kw)


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
    assert kernels.family_for(kernel_problem(q, k, v, scale=scale, causal=causal)) == "tf32"
    out, lse = forward(q, k, v, scale=scale, causal=causal)
    assert out.dtype == torch.float32 and out.shape == q.shape and lse.dtype == torch.float32
    _check(q, k, v, out, lse, scale=scale, causal=causal)


@pytest.mark.parametrize("head_dim,blocks", [(64, (None, None)), (64, (64, 32)),
                                             (64, (32, 16)), (128, (None, None)),
                                             (128, (64, 16))])
def test_large_logits_and_long_rows(head_dim, blocks):
    # adversarial: scale 10 gives logits up to ~+-300 (online max must rescale), 1100 keys
    q, k, v = _inputs((1, 2, 130, head_dim), (1, 2, 1100, head_dim), seed=7)
    out, lse = forward(q, k, v, scale=10.0, causal=False, block_q=blocks[0], block_k=blocks[1])
    _check(q, k, v, out, lse, scale=10.0)


#: Every (block_q, block_k) of `tf32_fwd.BLOCK_Q_CHOICES` x `BLOCK_K_CHOICES` whose copy
#: assignment the split layout can use (`tf32_fwd.presplit_ok`): 8, 4 or 2 warps; 32-key
#: stages (one split stage) and 16-key stages (two, used alternately)
TILES = [(d, bq, bk) for d in (64, 128) for bq in tf32_fwd.BLOCK_Q_CHOICES
         for bk in tf32_fwd.BLOCK_K_CHOICES if tf32_fwd.presplit_ok(d, bq, bk)]


@pytest.mark.parametrize("head_dim,bq,bk", TILES)
@pytest.mark.parametrize("causal", [False, True])
def test_every_tiling_matches_float64(head_dim, bq, bk, causal):
    # tails (Nq, Nk not multiples of any tile), GQA, causal; the default tiles (128 x 32) among
    # them
    q, k, v = _inputs((2, 4, 300, head_dim), (2, 2, 333, head_dim), seed=head_dim + 3 * causal)
    scale = 1 / math.sqrt(head_dim)
    out, lse = forward(q, k, v, scale=scale, causal=causal, block_q=bq, block_k=bk)
    _check(q, k, v, out, lse, scale=scale, causal=causal)
    kern = tf32_fwd.get_kernel(head_dim, bq, bk, causal, False, False,
                               tile_scheduler.head_group(None, causal, "fwd"))
    print(head_dim, (bq, bk), kern.config, kern.smem_bytes)


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


def test_d128_large_logits_mask_and_dropout():
    # the d=128 default tiles on the adversarial logits, and with a boolean mask and dropout
    # together
    q, k, v = _inputs((1, 2, 130, 128), (1, 2, 1100, 128), seed=17)
    out, lse = forward(q, k, v, scale=10.0)
    _check(q, k, v, out, lse, scale=10.0)
    q, k, v = _inputs((1, 2, 150, 128), (1, 2, 170, 128), seed=19)
    g = torch.Generator(device="cuda").manual_seed(4)
    mask = torch.rand((1, 1, 150, 170), device="cuda", generator=g) > 0.3
    out, lse = forward(q, k, v, scale=0.09, mask=mask, dropout_p=0.2, seed=77)
    _check(q, k, v, out, lse, scale=0.09, mask=mask, dropout_p=0.2, seed=77)


def test_mqa_strided_and_numpy_arrays():
    # one kv head for 3 query heads; q non-contiguous ([B, N, H, d] storage)
    g = torch.Generator(device="cuda").manual_seed(2)
    q = torch.randn(1, 300, 3, 64, device="cuda", generator=g).transpose(1, 2)
    k = torch.randn(1, 1, 257, 64, device="cuda", generator=g)
    v = torch.randn(1, 1, 257, 64, device="cuda", generator=g)
    out, lse = forward(q, k, v, scale=0.125, causal=True)
    _check(q, k, v, out, lse, scale=0.125, causal=True)
    # NumPy arrays (copied to the device and back) run the same kernel: the same bits
    qn, kn, vn = (x.cpu().numpy() for x in (q, k, v))
    assert kernels.family_for(kernel_problem(qn, kn, vn, scale=0.125, causal=True)) == "tf32"
    out_n, lse_n = forward(qn, kn, vn, scale=0.125, causal=True)
    assert isinstance(out_n, np.ndarray) and out_n.dtype == np.float32
    np.testing.assert_array_equal(out_n, out.cpu().numpy())
    np.testing.assert_array_equal(lse_n, lse.cpu().numpy())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("order", ["heads", "tiles", 4])
def test_launch_orders_give_the_same_bits(causal, order):
    # a tile's arithmetic does not depend on which block runs it
    q, k, v = _inputs((3, 6, 261, 128), (3, 2, 397, 128), seed=133)
    scale = 1 / math.sqrt(128)
    out, lse = forward(q, k, v, scale=scale, causal=causal, launch_order=order)
    _check(q, k, v, out, lse, scale=scale, causal=causal)
    want_out, want_lse = forward(q, k, v, scale=scale, causal=causal)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_problems_the_family_refuses():
    q, k, v = _inputs((1, 1, 32, 64), (1, 1, 32, 64), seed=0)
    assert tf32_fwd.supports(kernel_problem(q, k, v), KernelConfig()) is None
    half = kernel_problem(q.half(), k.half(), v.half())
    assert "float32" in tf32_fwd.supports(half, KernelConfig())
    assert kernels.family_for(half) == default_half_forward()
    with pytest.raises(ValueError, match="float32"):
        forward(q.half(), k.half(), v.half(), scale=0.1)
    with pytest.raises(ValueError, match="block_q"):
        forward(q, k, v, scale=0.1, block_q=48)
    q80, k80, v80 = _inputs((1, 1, 32, 80), (1, 1, 32, 80), seed=0)
    assert "head_dim" in tf32_fwd.supports(kernel_problem(q80, k80, v80), KernelConfig())
    assert kernels.family_for(kernel_problem(q80, k80, v80)) == "simt"
    with pytest.raises(ValueError, match="head_dim"):
        forward(q80, k80, v80, scale=0.1)
    q, k, v = _inputs((1, 1, 32, 128), (1, 1, 32, 128), seed=0)
    with pytest.raises(ValueError, match="block_k"):
        forward(q, k, v, scale=0.1, block_k=64)
    # tiles whose copy assignment the split layout cannot use run on the CUDA cores
    assert not tf32_fwd.presplit_ok(128, 32, 16)
    with pytest.raises(ValueError, match="presplit_ok"):
        forward(q, k, v, scale=0.1, block_q=32, block_k=16)
    assert kernels.family_for(kernel_problem(q, k, v),
                              KernelConfig(block_q=32, block_k=16)) != "tf32"


def test_ioaware_attention_numba_backend_float32():
    """ioaware.attention(backend="numba") on float32 CUDA tensors takes this kernel and matches
    float64; ``KernelConfig(family="simt")`` (the CUDA-core kernels) gives a result as exact."""
    from ioaware import attention
    g = torch.Generator(device="cuda").manual_seed(9)
    q = torch.randn(2, 4, 300, 64, device="cuda", generator=g)
    k = torch.randn(2, 2, 280, 64, device="cuda", generator=g)
    v = torch.randn(2, 2, 280, 64, device="cuda", generator=g)
    out, lse = attention(q, k, v, causal=True, backend="numba", return_lse=True)
    _check(q, k, v, out, lse, scale=0.125, causal=True)
    want, _ = forward(q, k, v, scale=0.125, causal=True)
    assert torch.equal(out, want)   # the dispatch took the 3xTF32 kernel
    simt = kernels_forward(q, k, v, config=KernelConfig(family="simt"), scale=0.125,
                           causal=True)
    _check(q, k, v, *simt, scale=0.125, causal=True)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_q, n_k, window, causal", [
    (300, 300, (64, 0), True), (200, 333, (40, 17), False), (150, 150, (0, 0), False),
    (90, 400, (10, -1), "bottom_right"), (400, 90, (5, 3), False)])
def test_sliding_window_matches_float64(head_dim, n_q, n_k, window, causal):
    """The band test in the 3xTF32 forward against float64 with the window written out as a
    boolean mask (tests/test_window.py's rule)."""
    from .test_window import window_rule
    q, k, v = _inputs((1, 4, n_q, head_dim), (1, 2, n_k, head_dim), seed=n_q + n_k)
    scale = 1 / math.sqrt(head_dim)
    pb = kernel_problem(q, k, v, scale=scale, causal=causal, window_size=window)
    assert kernels.family_for(pb) == "tf32" and kernels.family_for(pb, None, "bwd") == "tf32"
    out, lse = forward(q, k, v, scale=scale, causal=causal, window_size=window)
    _check(q, k, v, out, lse, scale=scale, mask=window_rule(n_q, n_k, window, bool(causal))[None, None])
