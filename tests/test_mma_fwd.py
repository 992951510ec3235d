"""GPU exactness tests of the tensor-core forward (`kernels.mma_fwd`, the ``mma`` family).

Marked ``gpu``: the CUDA simulator cannot execute inline PTX. Each case draws fresh random
half-precision inputs, runs `kernels.forward` with the family forced
(``KernelConfig(family="mma")``: a problem the family cannot run raises instead of running on
another family) and compares against a float64 softmax(Q K^T * scale) V computed from the same
(already rounded) half values.

Tolerances, by dtype. The kernel's own rounding is (a) P rounded to half before P V and (b) the
output rounded to half; the logits and all sums are float32. With |v| <= ~4.5 (normal draws),
(a) costs at most u * max|v| per output on average-weighted rows and (b) u * |o|, so
``atol = 4 * u * max|v|`` with u = 2**-11 (float16) or 2**-8 (bfloat16). The logsumexp only
sees float32 error: ``atol = 1e-4 * (1 + |lse|)``.
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
from kernels import KernelConfig  # noqa: E402

from .helpers import (default_half_forward, dense_attention_reference, kernel_problem,  # noqa: E402
                      kernels_forward)

UNIT = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def forward(q, k, v, *, block_q=None, block_k=None, launch_order=None, **kw):
    """`kernels.forward` on the ``mma`` family with these kernel tiles and launch order (with
    a ``block_mask``, ``block_q``/``block_k`` are its tiles and the family chooses its own)."""
    if kw.get("block_mask") is not None:
        kw.update(block_q=block_q, block_k=block_k)
        block_q = block_k = None
    config = KernelConfig(family="mma", block_q=block_q, block_k=block_k,
                          launch_order=launch_order)
    return kernels_forward(q, k, v, config=config, **kw)


def reference(q, k, v, scale, causal=False, mask=None, block_allowed=None, dropout_p=0.0,
              seed=0):
    """float64 attention on the half inputs (`tests.helpers.dense_attention_reference`);
    returns (out, lse) as NumPy arrays."""
    r = dense_attention_reference(q, k, v, scale=scale, causal=causal, mask=mask,
                                  block_allowed=block_allowed, dropout_p=dropout_p, seed=seed)
    return r["out"], r["lse"]


def _inputs(shape_q, shape_kv, dtype, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(shape_q, device="cuda", generator=g) * q_scale).to(dtype)
    k = torch.randn(shape_kv, device="cuda", generator=g).to(dtype)
    v = torch.randn(shape_kv, device="cuda", generator=g).to(dtype)
    return q, k, v


def _check(q, k, v, out, lse, **ref_kw):
    want_out, want_lse = reference(q, k, v, **ref_kw)
    got_out = out.double().cpu().numpy()
    got_lse = lse.cpu().numpy().astype(np.float64)
    atol = 4 * UNIT[q.dtype] * float(v.abs().max())
    assert np.isfinite(got_out).all()
    np.testing.assert_allclose(got_out, want_out, rtol=0, atol=atol)
    fin = np.isfinite(want_lse)
    assert (np.isfinite(got_lse) == fin).all()
    np.testing.assert_allclose(got_lse[fin], want_lse[fin], rtol=0,
                               atol=1e-4 * (1 + np.abs(want_lse[fin]).max()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_float64(dtype, head_dim, causal):
    # Nq != Nk, neither a multiple of the tiles, GQA 4 query heads on 2 kv heads
    q, k, v = _inputs((2, 4, 200, head_dim), (2, 2, 333, head_dim), dtype, seed=head_dim + causal)
    scale = 1 / math.sqrt(head_dim)
    assert (kernels.family_for(kernel_problem(q, k, v, scale=scale, causal=causal))
            == default_half_forward())
    out, lse = forward(q, k, v, scale=scale, causal=causal)
    assert out.dtype == dtype and out.shape == q.shape and lse.dtype == torch.float32
    _check(q, k, v, out, lse, scale=scale, causal=causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("blocks", [(None, None), (64, 64)])
def test_large_logits_and_long_rows(dtype, blocks):
    # adversarial: logits up to ~+-100 (online max must rescale), 1100 keys; both d=64 tilings
    q, k, v = _inputs((1, 2, 130, 64), (1, 2, 1100, 64), dtype, seed=7, q_scale=12.0)
    out, lse = forward(q, k, v, scale=0.125, causal=False, block_q=blocks[0], block_k=blocks[1])
    _check(q, k, v, out, lse, scale=0.125)


@pytest.mark.parametrize("blocks", [(64, 64), (128, 64), (128, 32)])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_128_larger_tiles_in_dynamic_shared_memory(blocks, causal):
    # 64-key K/V buffers at d=128 need 69,632 bytes of shared memory (the opt-in above 48 KiB)
    q, k, v = _inputs((2, 4, 333, 128), (2, 2, 290, 128), torch.float16, seed=21 + causal)
    out, lse = forward(q, k, v, scale=0.09, causal=causal, block_q=blocks[0], block_k=blocks[1])
    _check(q, k, v, out, lse, scale=0.09, causal=causal)


def test_problem_tiles_are_the_kernel_tiles():
    # without a block mask, the problem's block_q / block_k (what ioaware.attention passes on)
    # are the kernel's tiles, as KernelConfig's would be
    q, k, v = _inputs((1, 2, 150, 64), (1, 2, 170, 64), torch.float16, seed=8)
    out, lse = kernels_forward(q, k, v, scale=0.125, causal=True, block_q=64, block_k=32)
    pinned = forward(q, k, v, scale=0.125, causal=True, block_q=64, block_k=32)
    assert torch.equal(out, pinned[0]) and torch.equal(lse, pinned[1])
    _check(q, k, v, out, lse, scale=0.125, causal=True)


def test_boolean_mask_with_fully_masked_rows():
    q, k, v = _inputs((2, 2, 150, 64), (2, 2, 170, 64), torch.float16, seed=11)
    g = torch.Generator(device="cuda").manual_seed(3)
    mask = torch.rand((2, 1, 150, 170), device="cuda", generator=g) > 0.3
    mask[:, :, 5] = False  # rows with no allowed key: out 0, lse -inf
    out, lse = forward(q, k, v, scale=0.125, causal=True, mask=mask)
    _check(q, k, v, out, lse, scale=0.125, causal=True, mask=mask)
    assert float(out[:, :, 5].abs().max()) == 0.0


def test_block_sparse_and_dropout():
    q, k, v = _inputs((1, 2, 256, 128), (1, 2, 256, 128), torch.float16, seed=5)
    bq, bk = 64, 32
    rng = np.random.default_rng(0)
    block_mask = rng.random((1, 2, 256 // bq, 256 // bk)) > 0.4
    allowed = np.repeat(np.repeat(block_mask, bq, axis=2), bk, axis=3)
    out, lse = forward(q, k, v, scale=0.09, block_mask=block_mask, block_q=bq, block_k=bk,
                       dropout_p=0.2, seed=1234)
    _check(q, k, v, out, lse, scale=0.09, block_allowed=allowed, dropout_p=0.2, seed=1234)


def test_numpy_float16_and_block_q_128():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 3, 300, 64)).astype(np.float16)
    k = rng.standard_normal((1, 1, 257, 64)).astype(np.float16)
    v = rng.standard_normal((1, 1, 257, 64)).astype(np.float16)
    out, lse = forward(q, k, v, scale=0.125, causal=True, block_q=128)
    assert isinstance(out, np.ndarray) and out.dtype == np.float16
    assert isinstance(lse, np.ndarray) and lse.dtype == np.float32
    qt, kt, vt = (torch.from_numpy(x) for x in (q, k, v))
    _check(qt, kt, vt, torch.from_numpy(out), torch.from_numpy(lse), scale=0.125, causal=True)
    # the same kernel on torch CUDA tensors gives the same bits
    out_t, lse_t = forward(*(x.cuda() for x in (qt, kt, vt)), scale=0.125, causal=True,
                           block_q=128)
    np.testing.assert_array_equal(out_t.cpu().numpy(), out)
    np.testing.assert_array_equal(lse_t.cpu().numpy(), lse)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("order", ["heads", "tiles", 4])
def test_launch_orders_give_the_same_bits(head_dim, causal, order):
    # each launch order (kernels.tile_scheduler: heads first, tiles first, groups of 4 heads)
    # forced; GQA, Nq != Nk; a tile's arithmetic does not depend on which block runs it
    q, k, v = _inputs((3, 6, 261, head_dim), (3, 2, 397, head_dim), torch.float16,
                      seed=head_dim + 5)
    scale = 1 / math.sqrt(head_dim)
    out, lse = forward(q, k, v, scale=scale, causal=causal, launch_order=order)
    _check(q, k, v, out, lse, scale=scale, causal=causal)
    want_out, want_lse = forward(q, k, v, scale=scale, causal=causal)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_numba_launch_path_gives_the_same_bits():
    # KernelConfig(fast_launch=False): Numba's own launch instead of kernels.host's cached path
    q, k, v = _inputs((2, 4, 200, 64), (2, 2, 333, 64), torch.float16, seed=31)
    fast = forward(q, k, v, scale=0.125, causal=True)
    slow = kernels_forward(q, k, v, config=KernelConfig(family="mma", fast_launch=False),
                           scale=0.125, causal=True)
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])


def test_problems_the_family_refuses():
    q, k, v = _inputs((1, 1, 32, 96), (1, 1, 32, 96), torch.float16, seed=0)
    pb = kernel_problem(q, k, v, scale=0.1)
    assert "head_dim" in kernels.mma_fwd.supports(pb, KernelConfig())
    with pytest.raises(ValueError, match="head_dim"):
        forward(q, k, v, scale=0.1)
    assert kernels.family_for(pb) == "simt"            # the registry runs the CUDA cores
    q, k, v = _inputs((1, 1, 32, 128), (1, 1, 32, 128), torch.float16, seed=0)
    with pytest.raises(ValueError, match="block_k"):
        forward(q, k, v, scale=0.1, block_k=16)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        forward(q.float(), k.float(), v.float(), scale=0.1)


WINDOW_CASES = [  # (Nq, Nk, window_size, causal): bands that skip tiles and cut others
    (300, 300, (64, 0), True),
    (200, 333, (40, 17), False),
    (150, 150, (0, 0), False),
    (90, 400, (10, -1), "bottom_right"),
    (400, 90, (5, 3), False),            # the first rows see no key: zeros, lse -inf
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_q, n_k, window, causal", WINDOW_CASES)
def test_sliding_window_matches_float64(dtype, head_dim, n_q, n_k, window, causal):
    """The band test in the tensor-core forward against float64 with the window written out
    as a boolean mask (tests/test_window.py's rule)."""
    from .test_window import window_rule
    q, k, v = _inputs((1, 4, n_q, head_dim), (1, 2, n_k, head_dim), dtype, seed=n_q + n_k)
    scale = 1 / math.sqrt(head_dim)
    pb = kernel_problem(q, k, v, scale=scale, causal=causal, window_size=window)
    assert kernels.family_for(pb) == default_half_forward()
    assert kernels.family_for(pb, None, "bwd") == "mma"
    out, lse = forward(q, k, v, scale=scale, causal=causal, window_size=window)
    rule = window_rule(n_q, n_k, window, bool(causal))
    _check(q, k, v, out, lse, scale=scale, mask=rule[None, None])
    if not rule.any(1).all():
        assert bool((out[:, :, ~rule.any(1)] == 0).all())
