"""Tests of the 3xTF32 tensor-core float32 backward (`kernels.tf32_bwd`, the ``tf32`` family).

GPU tests (marked ``gpu``; the CUDA simulator cannot execute inline PTX) draw fresh random
float32 inputs, run the 3xTF32 forward for ``out`` and ``lse`` (or, for tiles it has not, take
them from the float64 reference) and the backward, both with the family forced
(``KernelConfig(family="tf32")``: a problem the family cannot run raises instead of running on
another family), and compare dq, dk, dv with float64 gradients of the same float32 inputs. The
CPU tests at the end cover the host-side tile choice and configuration.

Tolerance: the float32 CUDA-core kernel's for gradients (`tests/test_kernels.py`): max abs
error <= 5 x 2e-4 relative to max(1, the largest reference magnitude), per gradient.
Justification: with the 3xTF32 split every product carries ~2**-21 relative error (the dropped
small * small term and the rounding of the small halves, ~2**-22 each), the order of float32
rounding; all sums, exponentials (``ex2.approx``, ~2**-22) and delta are float32, as in the
CUDA-core kernel. The errors that remain are those of a float32 backward: the logit error
(|s| * ~2**-21) enters P relatively, the forward's lse and O enter P and delta, and dS = P (dP -
delta) cancels per row, so gradient errors are a few float32 ulps of |P| (|dP| + |delta|) times
the row length's square root -- ~1e-5 relative here, far inside 1e-3 even for the large-logit
case (logits up to ~+-50), where the float32 logit error is ~50 * 2**-21 ~ 2e-5.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import kernels
from kernels import KernelConfig, host, tf32_fwd
from kernels import tf32_bwd as bwd_mod

from .helpers import (assert_deterministic_backward, dense_attention_reference, kernel_problem,
                      kernels_backward, kernels_forward)

gpu = pytest.mark.gpu
TOL = 5 * 2e-4
TF32 = KernelConfig(family="tf32")
#: Both ways of computing dQ (``KernelConfig.backward_dq``): the dQ kernel, and the dK/dV kernel
#: adding dS K by float32 atomics between a pre-pass and a conversion.
DQ_MODES = ["kernel", "atomic"]


def _torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # pragma: no cover - CPU-only torch
        pytest.skip("torch has no CUDA here")
    return torch


def reference_grads(q, k, v, dout, scale, causal=False, mask=None, block_allowed=None,
                    dropout_p=0.0, seed=0):
    """float64 gradients (dk/dv summed over each GQA group), out and lse, as NumPy float64
    (`tests.helpers.dense_attention_reference`)."""
    return dense_attention_reference(q, k, v, dout, scale=scale, causal=causal, mask=mask,
                                     block_allowed=block_allowed, dropout_p=dropout_p, seed=seed)


def _inputs(shape_q, shape_kv, seed, q_scale=1.0):
    torch = _torch_cuda()
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(shape_q, device="cuda", generator=g) * q_scale
    k = torch.randn(shape_kv, device="cuda", generator=g)
    v = torch.randn(shape_kv, device="cuda", generator=g)
    dout = torch.randn(shape_q, device="cuda", generator=g)
    return q, k, v, dout


def _assert_grads(got, want):
    """Each of dq, dk, dv within TOL of float64 (relative to max(1, max |reference|)); prints
    the max abs errors for the record."""
    errs = {}
    for name, g in zip(("dq", "dk", "dv"), got):
        g = np.asarray(g.double().cpu().numpy() if hasattr(g, "double") else g, np.float64)
        w = want[name]
        assert g.shape == w.shape, (name, g.shape, w.shape)
        assert np.isfinite(g).all(), f"{name} has non-finite values"
        err = float(np.abs(g - w).max()) if w.size else 0.0
        ref = max(1.0, float(np.abs(w).max()) if w.size else 1.0)
        assert err <= TOL * ref, f"{name}: max abs error {err:.3g} > {TOL} * {ref:.3g}"
        errs[name] = err
    print("max abs error vs float64: " + ", ".join(f"{k} {v:.3g}" for k, v in errs.items()))
    return errs


def _run_and_check(q, k, v, dout, *, scale, causal=False, mask=None, block_mask=None,
                   block_q=None, block_k=None, dropout_p=0.0, seed=0, block_allowed=None,
                   launch_order=None, dq_mode=None):
    """Our backward on ``out``/``lse`` from the 3xTF32 forward (from the float64 reference,
    rounded to float32, where the forward has no tiles for the block mask's), checked against
    float64. ``block_q``/``block_k`` are the block mask's tiles; ``dq_mode``: how dQ is computed
    (None: the default)."""
    torch = _torch_cuda()
    config = KernelConfig(family="tf32", launch_order=launch_order, backward_dq=dq_mode)
    kw = dict(scale=scale, causal=causal, mask=mask, block_mask=block_mask, block_q=block_q,
              block_k=block_k, dropout_p=dropout_p, seed=seed)
    want = reference_grads(q, k, v, dout, scale, causal=causal, mask=mask,
                           block_allowed=block_allowed, dropout_p=dropout_p, seed=seed)
    if tf32_fwd.supports(kernel_problem(q, k, v, **kw), config) is None:
        out, lse = kernels_forward(q, k, v, config=config, **kw)
    else:
        out = torch.from_numpy(want["out"]).to(device="cuda", dtype=torch.float32)
        lse = torch.from_numpy(want["lse"]).to(device="cuda", dtype=torch.float32)
    dq, dk, dv = kernels_backward(q, k, v, out, lse, dout, config=config, **kw)
    for x in (dq, dk, dv):
        assert x.dtype == torch.float32
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    _assert_grads((dq, dk, dv), want)
    return dq, dk, dv


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_backward_matches_float64(head_dim, causal, dq_mode):
    # Nq != Nk, neither a multiple of the tiles, GQA 4 query heads on 2 kv heads
    q, k, v, dout = _inputs((2, 4, 200, head_dim), (2, 2, 333, head_dim), seed=head_dim + causal)
    assert kernels.family_for(kernel_problem(q, k, v, causal=causal), None, "bwd") == "tf32"
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=causal, dq_mode=dq_mode)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_large_logits_and_long_rows(head_dim, dq_mode):
    # logits up to ~+-50, 1100 keys, MQA (one kv head for three query heads)
    q, k, v, dout = _inputs((1, 3, 130, head_dim), (1, 1, 1100, head_dim), seed=7, q_scale=12.0)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), dq_mode=dq_mode)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_boolean_mask_with_fully_masked_rows_and_columns(head_dim, dq_mode):
    torch = _torch_cuda()
    q, k, v, dout = _inputs((2, 2, 150, head_dim), (2, 2, 170, head_dim), seed=11)
    g = torch.Generator(device="cuda").manual_seed(3)
    mask = torch.rand((2, 1, 150, 170), device="cuda", generator=g) > 0.3
    mask[:, :, 5] = False          # a query row with no allowed key: dq row 0, no NaN
    mask[:, :, :, 9] = False       # a key no query may see: dk, dv rows 0
    dq, dk, dv = _run_and_check(q, k, v, dout, scale=0.125, causal=True, mask=mask,
                                dq_mode=dq_mode)
    assert float(dq[:, :, 5].abs().max()) == 0.0
    assert float(dk[:, :, 9].abs().max()) == 0.0 and float(dv[:, :, 9].abs().max()) == 0.0


@gpu
@pytest.mark.parametrize("head_dim,blocks", [(128, (64, 32)), (64, (128, 64)), (64, (48, 16)),
                                             (128, (64, 64))])
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_block_sparse(head_dim, blocks, dq_mode):
    q, k, v, dout = _inputs((1, 4, 256, head_dim), (1, 2, 256, head_dim), seed=5)
    bq, bk = blocks
    rng = np.random.default_rng(0)
    block_mask = rng.random((1, 4, -(-256 // bq), 256 // bk)) > 0.4
    allowed = np.repeat(np.repeat(block_mask, bq, axis=2)[:, :, :256], bk, axis=3)
    _run_and_check(q, k, v, dout, scale=0.09, block_mask=block_mask, block_q=bq, block_k=bk,
                   block_allowed=allowed, causal=True, dq_mode=dq_mode)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_dropout(head_dim, dq_mode):
    q, k, v, dout = _inputs((2, 4, 190, head_dim), (2, 2, 210, head_dim), seed=21)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=head_dim == 64,
                   dropout_p=0.2, seed=1234, dq_mode=dq_mode)


@gpu
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_d128_mask_and_dropout_together(dq_mode):
    # d=128 with dropout takes the 16-query dK/dV kernel (`dkdv_dropout_config`); here with a
    # boolean mask and causal as well
    torch = _torch_cuda()
    q, k, v, dout = _inputs((1, 2, 150, 128), (1, 2, 170, 128), seed=12)
    g = torch.Generator(device="cuda").manual_seed(4)
    mask = torch.rand((1, 1, 150, 170), device="cuda", generator=g) > 0.3
    _run_and_check(q, k, v, dout, scale=0.09, causal=True, mask=mask, dropout_p=0.1, seed=9,
                   dq_mode=dq_mode)


@gpu
def test_numpy_float32_inputs():
    torch = _torch_cuda()
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 3, 300, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, 257, 64)).astype(np.float32)
    v = rng.standard_normal((1, 1, 257, 64)).astype(np.float32)
    dout = rng.standard_normal((1, 3, 300, 64)).astype(np.float32)
    assert kernels.family_for(kernel_problem(q, k, v), None, "bwd") == "tf32"
    out, lse = kernels_forward(q, k, v, config=TF32, scale=0.125, causal=True)
    dq, dk, dv = kernels_backward(q, k, v, out, lse, dout, config=TF32, scale=0.125, causal=True)
    assert isinstance(dq, np.ndarray) and dq.dtype == np.float32 and dk.shape == k.shape
    want = reference_grads(*(torch.from_numpy(x) for x in (q, k, v, dout)), 0.125, causal=True)
    _assert_grads((dq, dk, dv), want)
    # the same kernels on torch CUDA tensors give the same bits
    qt, kt, vt, ot, lt, dot = (torch.from_numpy(x).cuda() for x in (q, k, v, out, lse, dout))
    got = kernels_backward(qt, kt, vt, ot, lt, dot, config=TF32, scale=0.125, causal=True)
    for a, b in zip(got, (dq, dk, dv)):
        np.testing.assert_array_equal(a.cpu().numpy(), b)


@gpu
def test_autograd_through_attention_uses_tensor_cores(monkeypatch):
    """ioaware.attention(backend="numba") on float32 CUDA tensors with requires_grad: the
    backward dispatches here and matches float64."""
    import ioaware
    q, k, v, dout = _inputs((2, 4, 160, 64), (2, 2, 150, 64), seed=3)
    calls = []
    real = bwd_mod.backward
    monkeypatch.setattr(bwd_mod, "backward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = ioaware.attention(qg, kg, vg, causal=True, backend="numba")
    out.backward(dout)
    assert calls, "kernels.backward did not dispatch to the 3xTF32 backward"
    want = reference_grads(q, k, v, dout, 1 / 8, causal=True)
    for g in (qg.grad, kg.grad, vg.grad):
        assert g.dtype == q.dtype
    _assert_grads((qg.grad, kg.grad, vg.grad), want)


@gpu
def test_problems_the_family_refuses():
    torch = _torch_cuda()
    import ioaware
    q, k, v, dout = _inputs((1, 1, 32, 80), (1, 1, 32, 80), seed=0)
    lse = torch.zeros((1, 1, 32), device="cuda")
    assert "head_dim" in bwd_mod.supports(kernel_problem(q, k, v), KernelConfig())
    with pytest.raises(ValueError, match="head_dim"):
        kernels_backward(q, k, v, q, lse, dout, config=TF32, scale=0.1)
    q, k, v, dout = _inputs((1, 1, 32, 64), (1, 1, 32, 64), seed=0)
    assert bwd_mod.supports(kernel_problem(q, k, v), KernelConfig()) is None
    half = kernel_problem(q.half(), k.half(), v.half())
    assert "float32" in bwd_mod.supports(half, KernelConfig())
    assert kernels.family_for(half, None, "bwd") == "mma"
    # the shapes of out, lse and dout are checked by ioaware, before the kernels
    with pytest.raises(ValueError, match="lse"):
        ioaware.attention_backward(q, k, v, q, lse[:, :, :8], dout, scale=0.1, backend="numba")
    with pytest.raises(ValueError, match="multiples of 16"):
        kernels_backward(q, k, v, q, lse, dout, config=TF32, scale=0.1,
                         block_mask=np.ones((1, 1, 4, 4), bool), block_q=8, block_k=8)
    with pytest.raises(ValueError, match="chooses its own tiles"):
        kernels_backward(q, k, v, q, lse, dout, scale=0.1,
                         config=KernelConfig(family="tf32", block_k=32))


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("order", ["heads", "tiles", 4])
def test_launch_orders(head_dim, causal, order):
    # each launch order (kernels.tile_scheduler: heads first, tiles first, groups of 4 heads)
    # forced, forward and backward; more tiles than one wave would need and more heads than
    # tiles, GQA, Nq != Nk
    q, k, v, dout = _inputs((3, 6, 261, head_dim), (3, 2, 397, head_dim), seed=head_dim + 5)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=causal,
                   launch_order=order)


# -- CPU: tile choice and configuration ----------------------------------------------------------
def _problem(d, n_q=64, n_k=64, dtype=np.float32, **kw):
    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
    return kernel_problem(z(1, 1, n_q, d), z(1, 1, n_k, d), z(1, 1, n_k, d), **kw)


def test_kernel_tiles_divide_the_block_mask_tiles_and_fit():
    assert bwd_mod.tiles(_problem(64)) == ((64, 32), (64, 32))
    assert bwd_mod.tiles(_problem(128)) == ((64, 32), (64, 32))
    # without a block mask the problem's block_q / block_k do not change the tiles
    assert bwd_mod.tiles(_problem(128, block_q=7, block_k=9)) == ((64, 32), (64, 32))
    for d in (64, 128):
        for bq in (16, 32, 48, 64, 128, 192):
            for bk in (16, 32, 64, 96, 128):
                pb = _problem(d, 200, 333, block_mask=np.ones((1, 1, 1, 1), bool), block_q=bq,
                              block_k=bk)
                (dq_q, dq_k), (kv_k, kv_q) = bwd_mod.tiles(pb)
                assert bq % dq_q == 0 and bq % kv_q == 0 and bk % dq_k == 0 and bk % kv_k == 0
                # d=64: static (48 KiB); d=128: dynamic, three blocks of four warps per SM
                limit = bwd_mod.SMEM_LIMIT_BYTES if d == 64 else 228 * 1024 // 3
                # with dropout at d=128 the dK/dV kernel takes 16-query stages
                kv_qs = {kv_q, bwd_mod.dkdv_dropout_config(d, kv_q, True).get("block_q", kv_q)}
                assert bwd_mod.dq_smem_bytes(d, dq_k) <= limit
                assert all(bwd_mod.dkdv_smem_bytes(d, s) <= limit for s in kv_qs)
                # the cp.async tile copies divide evenly among the threads
                for rows, stage in [(dq_q, dq_k)] + [(kv_k, s) for s in kv_qs]:
                    threads, chunks = 2 * rows, d // 4
                    assert stage * chunks % threads == 0 and threads % chunks == 0
    pb = _problem(64, block_mask=np.ones((1, 1, 1, 1), bool), block_q=24, block_k=64)
    assert bwd_mod.tiles(pb) is None


def test_default_config():
    assert bwd_mod.default_config(64) == {"dq": (64, 32), "dkdv": (64, 32), "unroll": 1}
    assert bwd_mod.default_config(128) == {"dq": (64, 32), "dkdv": (64, 32), "unroll": 2}
    for d in (64, 128):
        cfg = bwd_mod.default_config(d)
        assert bwd_mod.default_tiles(d) == {"dq": cfg["dq"], "dkdv": cfg["dkdv"],
                                            "dkdv_atomic": cfg["dkdv"]}
        cfg["dq"] = None                                         # a copy
        assert bwd_mod.default_config(d)["dq"] == (64, 32)
    assert bwd_mod.dq_smem_bytes(64, 32) == 4 * 32 * 68 * 4          # static
    assert bwd_mod.dq_smem_bytes(128, 32) == 4 * 32 * 132 * 4        # dynamic (> 48 KiB)
    assert bwd_mod.dkdv_smem_bytes(64, 32) == 4 * 32 * 68 * 4 + 16 * 32
    assert bwd_mod.dkdv_smem_bytes(128, 16) == 4 * 16 * 132 * 4 + 16 * 16


def test_dkdv_dropout_config():
    # d=128 with dropout: the spill-free 16-query dK/dV kernel; otherwise the defaults
    assert bwd_mod.dkdv_dropout_config(128, 32, True) == {"block_q": 16, "unroll": 1}
    assert bwd_mod.dkdv_dropout_config(128, 16, True) == {}
    assert bwd_mod.dkdv_dropout_config(128, 32, False) == {}
    assert bwd_mod.dkdv_dropout_config(64, 32, True) == {}


def test_operands_in_registers():
    assert bwd_mod.operands_in_registers("dq", 64) == (True, True)
    assert bwd_mod.operands_in_registers("dkdv", 64) == (False, False)
    assert bwd_mod.operands_in_registers("dq", 128) == (False, False)


def test_nothing_runs_here_under_the_simulator():
    if not host.simulator():
        pytest.skip("a real GPU runs the kernels")
    pb = _problem(64)
    assert "real CUDA GPU" in bwd_mod.supports(pb, KernelConfig())
    assert kernels.family_for(pb, None, "bwd") == "simt"


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_q, n_k, window, causal", [
    (300, 300, (64, 0), True), (200, 333, (40, 17), False), (150, 150, (0, 0), False),
    (90, 400, (10, -1), "bottom_right"), (400, 90, (5, 3), False)])
@pytest.mark.parametrize("dq_mode", DQ_MODES)
def test_sliding_window_matches_float64(head_dim, n_q, n_k, window, causal, dq_mode):
    """The band in the 3xTF32 dQ and dK/dV kernels against float64 with the window written out
    as a boolean mask (tests/test_window.py's rule)."""
    from .test_window import window_rule
    q, k, v, dout = _inputs((1, 4, n_q, head_dim), (1, 2, n_k, head_dim), seed=n_q + n_k)
    kw = dict(scale=1 / math.sqrt(head_dim), causal=causal, window_size=window)
    config = KernelConfig(family="tf32", backward_dq=dq_mode)
    assert kernels.family_for(kernel_problem(q, k, v, **kw), None, "bwd") == "tf32"
    out, lse = kernels_forward(q, k, v, config=config, **kw)
    got = kernels_backward(q, k, v, out, lse, dout, config=config, **kw)
    rule = window_rule(n_q, n_k, window, bool(causal))[None, None]
    _assert_grads(got, reference_grads(q, k, v, dout, kw["scale"], mask=rule))


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_atomic_dq_one_float_per_red(head_dim, monkeypatch):
    """dQ by atomics with one float per ``red.global.add.f32`` (what runs before sm_90), forced
    on this GPU."""
    monkeypatch.setattr(bwd_mod, "_red_width", lambda: "scalar")
    q, k, v, dout = _inputs((2, 4, 200, head_dim), (2, 2, 333, head_dim), seed=head_dim + 5)
    _run_and_check(q, k, v, dout, scale=1 / math.sqrt(head_dim), causal=True, dq_mode="atomic")


@gpu
def test_default_dq_mode_and_deterministic_algorithms():
    """sm_90 and later: dQ by atomics by default at d = 64 and 128; under torch's deterministic
    algorithms the dQ kernel, whose repeated calls give the same bits."""
    from sim.plans.tensor_core_bwd import ATOMIC_DQ_FROM_CC
    torch = _torch_cuda()
    cc = torch.cuda.get_device_capability()
    for d in (64, 128):
        q, k, v, dout = _inputs((1, 4, 300, d), (1, 4, 300, d), seed=9)
        pb = kernel_problem(q, k, v, causal=True)
        want = "atomic" if cc >= ATOMIC_DQ_FROM_CC else "kernel"
        assert bwd_mod.dq_mode(pb, KernelConfig()) == want
        assert bwd_mod.plan(pb, KernelConfig()).config.get("dq_mode", "kernel") == want
    out, lse = kernels_forward(q, k, v, config=TF32, scale=0.125, causal=True)
    assert_deterministic_backward(torch, bwd_mod, q, k, v, out, lse, dout, config=TF32,
                                  scale=0.125, causal=True)


def test_dq_mode_follows_the_plan_rule_and_the_config():
    """Without a GPU (no compute capability) the default is the dQ kernel; the config's
    ``backward_dq`` wins; the plan the launcher builds carries the mode it runs."""
    pb = kernel_problem(np.zeros((1, 2, 70, 64), np.float32), np.zeros((1, 1, 90, 64), np.float32),
                        np.zeros((1, 1, 90, 64), np.float32), causal=True)
    if host.real_gpu():
        pytest.skip("the default depends on this GPU (test_default_dq_mode_and_deterministic_algorithms)")
    assert bwd_mod.dq_mode(pb, KernelConfig()) == "kernel"
    assert "dq_mode" not in bwd_mod.plan(pb, KernelConfig()).config
    atomic = bwd_mod.plan(pb, KernelConfig(backward_dq="atomic"))
    assert atomic.config["dq_mode"] == "atomic"
    assert [k.phase for k in atomic.kernels] == ["bwd.pre", "bwd.main", "bwd.post"]
    assert bwd_mod.dq_mode(pb, KernelConfig(backward_dq="kernel")) == "kernel"


def compile_d128_backward_kernels(outdir) -> list:
    """`benchmarks.check` reports of the 3xTF32 dQ, dK/dV and atomic-dQ dK/dV kernels at
    d = 128, causal, at their default tiles (PTX for sm_90, then ptxas): the causal kernels
    hold everything the unmasked ones do and the mask's code besides, so they are the ones to
    spill first (the unmasked ones compiled here too until the suite's time asked for less;
    `python -m benchmarks check` covers both on a GPU machine). Run in a process without the
    CUDA simulator."""
    from benchmarks.check import check_one
    from benchmarks.common import allow_offline_compile, find_ptxas
    allow_offline_compile()
    return [check_one("tf32", kernel, 128, "fp32", True, workdir=str(outdir), ptxas=find_ptxas())
            for kernel in ("dq", "dkdv", "dkdv_atomic")]


def test_d128_backward_kernels_keep_their_fragments_in_registers(tmp_path):
    """No local memory, stack frame or spills: the dQ += dS K and dV, dK products unroll their
    k-steps (`_c_times_shared_b`), so the score fragments stay in registers (left to the
    compiler they went to a 64-byte and a 128-byte stack frame); the same for the dK/dV kernel
    that adds dQ by atomics (`_shared_a_times_shared_b`)."""
    from .helpers import compile_sm90a_in_child
    _ptxas, reports = compile_sm90a_in_child("tests.test_tf32_bwd", "compile_d128_backward_kernels",
                                             tmp_path, timeout=900)
    for rep in reports:
        where = f"{rep['kernel']} causal={rep['causal']}"
        assert rep["ptx_local_decl"] == 0 and rep["ptx_ld_st_local"] == 0, where
        assert tuple(rep["stack_spill_st_ld"]) == (0, 0, 0), where
        assert rep["ptx_mma"] > 0 and not rep.get("ptxas_error") and not rep.get("sass_ldl_stl"), where
