"""Tests of the tensor-core half-precision backward (`kernels.mma_bwd`, the ``mma`` family).

GPU tests (marked ``gpu``; the CUDA simulator cannot execute inline PTX) draw fresh random
half-precision inputs, run our forward for ``out`` and ``lse`` and our backward, both with the
family forced (``KernelConfig(family="mma")``: a problem the family cannot run raises instead of
running on another family), and compare the gradients against float64 gradients computed from
the same (already rounded) half inputs, under both ways of computing dQ
(``KernelConfig.backward_dq``: "kernel", a dQ kernel; "atomic", dS K added into a float32
accumulator by the dK/dV kernel, with two floats per ``red`` on sm_90 and, forced, one). The CPU
tests at the end cover the host-side tile choice (`kernels.mma_bwd.tiles`) and the default mode.

Tolerances, by dtype, element by element (u = 2**-11 for float16, 2**-8 for bfloat16). The
kernel rounds four things to the input dtype: P before dV = (P Z)^T dO, dS before dK = dS^T Q
and dQ = dS K, the forward's output O (which enters delta = rowsum(dO O)), and the gradients
themselves. Logits, exponentials and every sum are float32 (relative error ~1e-6, far below
u). With M = P (|dP Z| + |delta| + rowsum|dO O|), the first-order bound of the error of dS is
u M (its rounding plus delta's error), so per element::

    |dV - dV64| <= 4 u ((P Z)^T |dO|)         + 2 u |dV64| + atol
    |dK - dK64| <= 4 u scale (M^T |Q|)        + 2 u |dK64| + atol
    |dQ - dQ64| <= 4 u scale (M |K|)          + 2 u |dQ64| + atol

with the factor 4 over the first-order constant 1-2 as headroom and ``atol = 1e-5`` for float32
accumulation noise around exact zeros. These bounds scale with the terms actually summed, so
they stay tight for long rows, large logits and cancellation in dS (which sums to zero per row).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import kernels
from kernels import KernelConfig, mma_bwd as bwd_mod

from .helpers import (assert_deterministic_backward, dense_attention_reference, kernel_problem,
                      kernels_backward, kernels_forward)

gpu = pytest.mark.gpu
MMA = KernelConfig(family="mma")


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # pragma: no cover - CPU-only torch
        pytest.skip("torch has no CUDA here")
    return torch


def reference_grads(q, k, v, dout, scale, causal=False, mask=None, block_allowed=None,
                    dropout_p=0.0, seed=0):
    """float64 gradients on the half inputs and the per-element error bounds' magnitudes
    (`tests.helpers.dense_attention_reference`): dq, dk, dv (dk/dv summed over each GQA group),
    the bound terms ``ev``, ``ek``, ``eq`` (see the module docstring), out and lse."""
    return dense_attention_reference(q, k, v, dout, scale=scale, causal=causal, mask=mask,
                                     block_allowed=block_allowed, dropout_p=dropout_p, seed=seed)


def _unit(dtype):
    torch = _torch_cuda()
    return {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]


def _inputs(shape_q, shape_kv, dtype, seed, q_scale=1.0):
    torch = _torch_cuda()
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(shape_q, device="cuda", generator=g) * q_scale).to(dtype)
    k = torch.randn(shape_kv, device="cuda", generator=g).to(dtype)
    v = torch.randn(shape_kv, device="cuda", generator=g).to(dtype)
    dout = torch.randn(shape_q, device="cuda", generator=g).to(dtype)
    return q, k, v, dout


def _check_grads(got, want, dtype):
    """dq, dk, dv (any array kind) within the module docstring's per-element bounds."""
    u = _unit(dtype)
    for name, g, bound in zip(("dq", "dk", "dv"), got, ("eq", "ek", "ev")):
        g = g.double().cpu().numpy() if hasattr(g, "double") else np.asarray(g, np.float64)
        w = want[name]
        assert np.isfinite(g).all(), f"{name} has non-finite values"
        tol = 4 * u * want[bound] + 2 * u * np.abs(w) + 1e-5
        err = np.abs(g - w)
        worst = np.unravel_index(np.argmax(err - tol), err.shape)
        assert (err <= tol).all(), (f"{name}: {int((err > tol).sum())} elements out of bounds, "
                                    f"worst at {worst}: got {g[worst]}, want {w[worst]}, "
                                    f"tol {tol[worst]}")


def _run_and_check(q, k, v, dout, *, scale, causal=False, mask=None, block_mask=None,
                   block_q=None, block_k=None, dropout_p=0.0, seed=0, block_allowed=None,
                   float64_forward=False, launch_order=None, backward_dq=None):
    """Our backward on ``out``/``lse`` from our forward (or, with ``float64_forward``, from the
    float64 reference rounded to the input dtype / float32), checked against float64.
    ``block_q``/``block_k`` are the block mask's tiles; ``backward_dq``: the dQ mode (None: the
    default of `kernels.mma_bwd.dq_mode`)."""
    config = KernelConfig(family="mma", launch_order=launch_order, backward_dq=backward_dq)
    kw = dict(scale=scale, causal=causal, mask=mask, block_mask=block_mask, block_q=block_q,
              block_k=block_k, dropout_p=dropout_p, seed=seed)
    want = reference_grads(q, k, v, dout, scale, causal=causal, mask=mask,
                           block_allowed=block_allowed, dropout_p=dropout_p, seed=seed)
    if float64_forward:
        torch = _torch_cuda()
        out = torch.from_numpy(want["out"]).to(device="cuda", dtype=q.dtype)
        lse = torch.from_numpy(want["lse"]).to(device="cuda", dtype=torch.float32)
    else:
        out, lse = kernels_forward(q, k, v, config=MMA, **kw)
    dq, dk, dv = kernels_backward(q, k, v, out, lse, dout, config=config, **kw)
    assert dq.dtype == q.dtype and dk.dtype == q.dtype and dv.dtype == q.dtype
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    _check_grads((dq, dk, dv), want, q.dtype)
    return dq, dk, dv


@gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("backward_dq", ["kernel", "atomic"])
def test_backward_matches_float64(dtype_name, head_dim, causal, backward_dq):
    torch = _torch_cuda()
    dtype = getattr(torch, dtype_name)
    # Nq != Nk, neither a multiple of the tiles, GQA 4 query heads on 2 kv heads
    q, k, v, dout = _inputs((2, 4, 200, head_dim), (2, 2, 333, head_dim), dtype,
                            seed=head_dim + causal)
    assert kernels.family_for(kernel_problem(q, k, v, causal=causal), None, "bwd") == "mma"
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=causal,
                   backward_dq=backward_dq)


@gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("backward_dq", ["kernel", "atomic"])
def test_large_logits_and_long_rows(dtype_name, backward_dq):
    torch = _torch_cuda()
    # logits up to ~+-100, 1100 keys, MQA (one kv head for three query heads)
    q, k, v, dout = _inputs((1, 3, 130, 64), (1, 1, 1100, 64), getattr(torch, dtype_name),
                            seed=7, q_scale=12.0)
    _run_and_check(q, k, v, dout, scale=0.125, backward_dq=backward_dq)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("backward_dq", ["kernel", "atomic"])
def test_boolean_mask_with_fully_masked_rows_and_columns(head_dim, backward_dq):
    torch = _torch_cuda()
    q, k, v, dout = _inputs((2, 2, 150, head_dim), (2, 2, 170, head_dim), torch.float16, seed=11)
    g = torch.Generator(device="cuda").manual_seed(3)
    mask = torch.rand((2, 1, 150, 170), device="cuda", generator=g) > 0.3
    mask[:, :, 5] = False          # a query row with no allowed key: dq row 0, no NaN
    mask[:, :, :, 9] = False       # a key no query may see: dk, dv rows 0
    dq, dk, dv = _run_and_check(q, k, v, dout, scale=0.125, causal=True, mask=mask,
                                backward_dq=backward_dq)
    assert float(dq[:, :, 5].abs().max()) == 0.0
    assert float(dk[:, :, 9].abs().max()) == 0.0 and float(dv[:, :, 9].abs().max()) == 0.0


@gpu
@pytest.mark.parametrize("head_dim,blocks", [(128, (64, 32)), (64, (128, 64)), (64, (48, 16)),
                                             (128, (128, 128))])
@pytest.mark.parametrize("backward_dq", ["kernel", "atomic"])
def test_block_sparse(head_dim, blocks, backward_dq):
    torch = _torch_cuda()
    q, k, v, dout = _inputs((1, 4, 256, head_dim), (1, 2, 256, head_dim), torch.float16, seed=5)
    bq, bk = blocks
    rng = np.random.default_rng(0)
    block_mask = rng.random((1, 4, -(-256 // bq), 256 // bk)) > 0.4
    allowed = np.repeat(np.repeat(block_mask, bq, axis=2)[:, :, :256], bk, axis=3)
    # the forward has no tiles dividing 48 x 16: that case takes out / lse from the float64
    # reference
    _run_and_check(q, k, v, dout, scale=0.09, block_mask=block_mask, block_q=bq, block_k=bk,
                   block_allowed=allowed, causal=True, float64_forward=blocks == (48, 16),
                   backward_dq=backward_dq)


@gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("backward_dq", ["kernel", "atomic"])
def test_dropout(dtype_name, head_dim, backward_dq):
    torch = _torch_cuda()
    q, k, v, dout = _inputs((2, 4, 190, head_dim), (2, 2, 210, head_dim),
                            getattr(torch, dtype_name), seed=21)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=head_dim == 64,
                   dropout_p=0.2, seed=1234, backward_dq=backward_dq)


@gpu
def test_numpy_float16_inputs():
    torch = _torch_cuda()
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 3, 300, 64)).astype(np.float16)
    k = rng.standard_normal((1, 1, 257, 64)).astype(np.float16)
    v = rng.standard_normal((1, 1, 257, 64)).astype(np.float16)
    dout = rng.standard_normal((1, 3, 300, 64)).astype(np.float16)
    out, lse = kernels_forward(q, k, v, config=MMA, scale=0.125, causal=True)
    dq, dk, dv = kernels_backward(q, k, v, out, lse, dout, config=MMA, scale=0.125, causal=True)
    assert isinstance(dq, np.ndarray) and dq.dtype == np.float16 and dk.shape == k.shape
    want = reference_grads(*(torch.from_numpy(x) for x in (q, k, v, dout)), 0.125, causal=True)
    _check_grads((dq, dk, dv), want, torch.float16)
    # the same kernels on torch CUDA tensors give the same bits (dQ by its own kernel:
    # deterministic)
    det = KernelConfig(family="mma", backward_dq="kernel")
    want_bits = kernels_backward(q, k, v, out, lse, dout, config=det, scale=0.125, causal=True)
    qt, kt, vt, ot, lt, dot = (torch.from_numpy(x).cuda() for x in (q, k, v, out, lse, dout))
    got = kernels_backward(qt, kt, vt, ot, lt, dot, config=det, scale=0.125, causal=True)
    for a, b in zip(got, want_bits):
        np.testing.assert_array_equal(a.cpu().numpy(), b)


@gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_autograd_through_attention_uses_tensor_cores(dtype_name, monkeypatch):
    torch = _torch_cuda()
    import ioaware
    dtype = getattr(torch, dtype_name)
    q, k, v, dout = _inputs((2, 4, 160, 64), (2, 2, 160, 64), dtype, seed=3)
    calls = []
    real = bwd_mod.backward
    monkeypatch.setattr(bwd_mod, "backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = ioaware.attention(qg, kg, vg, causal=True, backend="numba")
    out.backward(dout)
    assert calls, "kernels.backward did not dispatch to the tensor-core backward"
    want = reference_grads(q, k, v, dout, 1 / 8, causal=True)
    for got in (qg.grad, kg.grad, vg.grad):
        assert got.dtype == dtype
    _check_grads((qg.grad, kg.grad, vg.grad), want, dtype)


@gpu
def test_problems_the_family_refuses():
    torch = _torch_cuda()
    import ioaware
    q, k, v, dout = _inputs((1, 1, 32, 96), (1, 1, 32, 96), torch.float16, seed=0)
    lse = torch.zeros((1, 1, 32), device="cuda")
    with pytest.raises(ValueError, match="head_dim"):
        kernels_backward(q, k, v, q, lse, dout, config=MMA, scale=0.1)
    assert kernels.family_for(kernel_problem(q, k, v), None, "bwd") == "simt"
    q, k, v, dout = _inputs((1, 1, 32, 64), (1, 1, 32, 64), torch.float16, seed=0)
    # the shapes of out, lse and dout are checked by ioaware, before the kernels
    with pytest.raises(ValueError, match="lse"):
        ioaware.attention_backward(q, k, v, q, lse[:, :, :8], dout, scale=0.1, backend="numba")
    with pytest.raises(ValueError, match="multiples of 16"):
        kernels_backward(q, k, v, q, lse, dout, config=MMA, scale=0.1,
                         block_mask=np.ones((1, 1, 4, 4), bool), block_q=8, block_k=8)
    with pytest.raises(ValueError, match="chooses its own tiles"):
        kernels_backward(q, k, v, q, lse, dout, scale=0.1,
                         config=KernelConfig(family="mma", block_q=64))
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        kernels_backward(q.float(), k.float(), v.float(), q.float(), lse, dout.float(),
                         config=MMA, scale=0.1)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_atomic_dq_one_float_per_red(head_dim, causal, monkeypatch):
    """dQ by atomics with one float per ``red.global.add.f32`` (what runs before sm_90), forced
    on this GPU."""
    torch = _torch_cuda()
    monkeypatch.setattr(bwd_mod, "_red_width", lambda: "scalar")
    q, k, v, dout = _inputs((2, 4, 200, head_dim), (2, 2, 333, head_dim), torch.float16,
                            seed=head_dim + 3)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=causal,
                   backward_dq="atomic")


@gpu
def test_default_dq_mode_and_deterministic_algorithms():
    """sm_90 and later: dQ by atomics by default at d = 128, the dQ kernel at d = 64; under
    torch's deterministic algorithms the dQ kernel, whose repeated calls give the same bits."""
    torch = _torch_cuda()
    cc = torch.cuda.get_device_capability()
    for d in (64, 128):
        q, k, v, dout = _inputs((1, 4, 300, d), (1, 4, 300, d), torch.float16, seed=9)
        pb = kernel_problem(q, k, v, causal=True)
        want = "atomic" if cc >= bwd_mod.ATOMIC_DQ_FROM_CC and d == 128 else "kernel"
        assert bwd_mod.dq_mode(pb, KernelConfig()) == want
        assert bwd_mod.plan(pb, KernelConfig()).config.get("dq_mode", "kernel") == want
    out, lse = kernels_forward(q, k, v, config=MMA, scale=0.125, causal=True)
    assert_deterministic_backward(torch, bwd_mod, q, k, v, out, lse, dout, config=MMA,
                                  scale=0.125, causal=True)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("order", ["heads", "tiles", 4])
def test_launch_orders(head_dim, causal, order):
    # each launch order (kernels.tile_scheduler: heads first, tiles first, groups of 4 heads)
    # forced, forward and backward; GQA, Nq != Nk
    torch = _torch_cuda()
    q, k, v, dout = _inputs((3, 6, 261, head_dim), (3, 2, 397, head_dim), torch.float16,
                            seed=head_dim + 5)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=causal,
                   launch_order=order)


# -- CPU: tile choice ----------------------------------------------------------------------------
def _problem(d, n_q=64, n_k=64, **kw):
    z = lambda *shape: np.zeros(shape, np.float16)  # noqa: E731
    return kernel_problem(z(1, 1, n_q, d), z(1, 1, n_k, d), z(1, 1, n_k, d), **kw)


def test_kernel_tiles_divide_the_block_mask_tiles():
    assert bwd_mod.tiles(_problem(64)) == ((64, 64), (64, 64))
    assert bwd_mod.tiles(_problem(128)) == ((64, 32), (64, 16))
    # without a block mask the problem's block_q / block_k do not change the tiles
    assert bwd_mod.tiles(_problem(128, block_q=7, block_k=9)) == ((64, 32), (64, 16))
    for d in (64, 128):
        for bq in (16, 32, 48, 64, 128, 192):
            for bk in (16, 32, 64, 96, 128):
                pb = _problem(d, 200, 333, block_mask=np.ones((1, 1, 1, 1), bool), block_q=bq,
                              block_k=bk)
                (dq_q, dq_k), (kv_k, kv_q) = bwd_mod.tiles(pb)
                assert bq % dq_q == 0 and bq % kv_q == 0 and bk % dq_k == 0 and bk % kv_k == 0
                assert bwd_mod.dq_smem_bytes(d, dq_k) <= bwd_mod.SMEM_LIMIT_BYTES
                assert bwd_mod.dkdv_smem_bytes(d, kv_q, kv_k) <= bwd_mod.SMEM_LIMIT_BYTES
    pb = _problem(64, block_mask=np.ones((1, 1, 1, 1), bool), block_q=24, block_k=64)
    assert bwd_mod.tiles(pb) is None


WINDOW_CASES = [  # (Nq, Nk, window_size, causal): bands that skip tiles and cut others
    (300, 300, (64, 0), True),
    (200, 333, (40, 17), False),
    (150, 150, (0, 0), False),
    (90, 400, (10, -1), "bottom_right"),
    (400, 90, (5, 3), False),            # the first rows see no key: zero gradients there
]


@gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_q, n_k, window, causal", WINDOW_CASES)
def test_sliding_window_matches_float64(dtype_name, head_dim, n_q, n_k, window, causal):
    """The band in the dQ and dK/dV kernels (forward on the same family) against float64 with
    the window written out as a boolean mask (tests/test_window.py's rule)."""
    from .test_window import window_rule
    torch = _torch_cuda()
    q, k, v, dout = _inputs((1, 4, n_q, head_dim), (1, 2, n_k, head_dim),
                            getattr(torch, dtype_name), seed=n_q + n_k)
    kw = dict(scale=1 / math.sqrt(head_dim), causal=causal, window_size=window)
    assert kernels.family_for(kernel_problem(q, k, v, **kw), None, "bwd") == "mma"
    out, lse = kernels_forward(q, k, v, config=MMA, **kw)
    rule = window_rule(n_q, n_k, window, bool(causal))[None, None]
    want = reference_grads(q, k, v, dout, kw["scale"], mask=rule)
    for mode in ("kernel", "atomic"):
        got = kernels_backward(q, k, v, out, lse, dout,
                               config=KernelConfig(family="mma", backward_dq=mode), **kw)
        _check_grads(got, want, q.dtype)
