"""Exactness of the Numba CUDA kernels (`kernels.forward` / `kernels.backward`) and the family
registry.

Under Numba's CUDA simulator (CI, no GPU) the same kernels run on small shapes, small tiles and
few threads against a float64 materialised reference written here; tests marked ``gpu`` run on
a real GPU with bigger shapes, torch CUDA tensors, bfloat16, strided inputs and streams.

Tolerances: float32 inputs with float32 accumulation over at most a few hundred keys give
errors of a few float32 ulps of the output scale, so we use rtol/atol 2e-4 relative to the
largest reference magnitude; float16 inputs round q, k, v to 11 bits before the (exact, fp32)
computation, so the reference is computed from the *rounded* inputs and the only extra error is
the fp16 output rounding (2**-11 relative) -> 2e-3.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kernels
from ioaware.dropout import keep_mask
from kernels import KernelConfig

from .helpers import default_half_forward, kernel_problem, kernels_backward, kernels_forward

# -- float64 reference -----------------------------------------------------------------------------


def ref_attention(q, k, v, dout=None, *, scale, causal=False, mask=None, block_mask=None,
                  block_q=None, block_k=None, dropout_p=0.0, seed=0, window_size=None):
    """Materialised float64 attention: (out, lse) and, with dout, (dq, dk, dv). ``causal``:
    True (top-left, j <= i) or "bottom_right" (j <= i + Nk - Nq); ``window_size=(left,
    right)``: i + Nk - Nq - left <= j <= i + Nk - Nq + right, -1 = unbounded side."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    g = Hq // Hkv
    kk = np.repeat(k, g, axis=1)
    vv = np.repeat(v, g, axis=1)
    allowed = np.ones((B, Hq, Nq, Nk), bool)
    rows, cols = np.arange(Nq)[:, None], np.arange(Nk)[None, :]
    if causal:
        allowed &= cols <= rows + (Nk - Nq if causal == "bottom_right" else 0)
    if window_size is not None:
        left, right = window_size
        if left >= 0:
            allowed &= cols >= rows + Nk - Nq - left
        if right >= 0:
            allowed &= cols <= rows + Nk - Nq + right
    if mask is not None:
        allowed &= np.asarray(mask, bool)
    if block_mask is not None:
        bm = np.asarray(block_mask, bool)
        full = np.repeat(np.repeat(bm, block_q, axis=2), block_k, axis=3)[:, :, :Nq, :Nk]
        allowed &= full
    s = np.einsum("bhid,bhjd->bhij", q, kk) * scale
    s = np.where(allowed, s, -np.inf)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isneginf(mx), 0.0, mx)
    e = np.exp(s - mx)
    l = e.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(l > 0, e / np.where(l > 0, l, 1), 0.0)
        lse = np.where(l[..., 0] > 0, mx[..., 0] + np.log(l[..., 0]), -np.inf)
    if dropout_p > 0:
        bh = np.arange(B * Hq).reshape(B, Hq, 1, 1)
        z = keep_mask(seed, dropout_p, bh, np.arange(Nq)[:, None], np.arange(Nk)[None, :])
        z = z / (1.0 - dropout_p)
    else:
        z = np.ones_like(p)
    out = np.einsum("bhij,bhjd->bhid", p * z, vv)
    if dout is None:
        return out, lse
    do = np.asarray(dout, np.float64)
    dvv = np.einsum("bhij,bhid->bhjd", p * z, do)
    dp = np.einsum("bhid,bhjd->bhij", do, vv) * z
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = np.einsum("bhij,bhjd->bhid", ds, kk) * scale
    dkk = np.einsum("bhij,bhid->bhjd", ds, q) * scale
    dk = dkk.reshape(B, Hkv, g, Nk, D).sum(2)
    dv = dvv.reshape(B, Hkv, g, Nk, D).sum(2)
    return out, lse, dq, dk, dv


def assert_close(got, want, tol, name):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    assert np.isfinite(got).all(), f"{name}: non-finite values"
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    err = float(np.abs(got - want).max()) if want.size else 0.0
    assert err <= tol * scale, f"{name}: max abs error {err:.3g} > {tol} * {scale:.3g}"


def assert_lse(got, want, tol):
    got = np.asarray(got, np.float64)
    assert np.array_equal(np.isneginf(got), np.isneginf(want)), "lse: -inf rows differ"
    fin = ~np.isneginf(want)
    if fin.any():
        assert np.abs(got[fin] - want[fin]).max() <= tol * max(1.0, np.abs(want[fin]).max())


TOL = {np.float32: 2e-4, np.float16: 2e-3}


def make(rng, B, Hq, Hkv, Nq, Nk, D, dtype=np.float32, scale=1.0):
    q = (rng.standard_normal((B, Hq, Nq, D)) * scale).astype(dtype)
    k = (rng.standard_normal((B, Hkv, Nk, D)) * scale).astype(dtype)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(dtype)
    do = rng.standard_normal((B, Hq, Nq, D)).astype(dtype)
    return q, k, v, do


def run_both(q, k, v, do, *, check_bwd=True, tol=None, config=None, **kw):
    """Run the kernels and compare with the float64 reference (computed from the same, possibly
    fp16-rounded, inputs)."""
    D = q.shape[-1]
    scale = kw.pop("scale", 1.0 / np.sqrt(D))
    tol = tol or TOL[q.dtype.type]
    out, lse = kernels_forward(q, k, v, scale=scale, config=config, **kw)
    assert out.dtype == q.dtype and lse.dtype == np.float32
    ref_kw = {key: kw[key] for key in ("causal", "mask", "block_mask", "block_q", "block_k",
                                       "dropout_p", "seed", "window_size") if key in kw}
    r_out, r_lse, r_dq, r_dk, r_dv = ref_attention(q, k, v, do, scale=scale, **ref_kw)
    assert_close(out, r_out, tol, "out")
    assert_lse(lse, r_lse, tol)
    if check_bwd:
        dq, dk, dv = kernels_backward(q, k, v, out, lse, do, scale=scale, config=config, **kw)
        assert dq.dtype == q.dtype and dk.shape == k.shape and dv.shape == v.shape
        assert_close(dq, r_dq, tol * 5, "dq")
        assert_close(dk, r_dk, tol * 5, "dk")
        assert_close(dv, r_dv, tol * 5, "dv")
    return out, lse


# -- simulator tests (small shapes, tiles 8..16) ---------------------------------------------------


def test_dense_partial_tiles():
    rng = np.random.default_rng(0)
    q, k, v, do = make(rng, 1, 2, 2, 21, 19, 8)
    run_both(q, k, v, do, block_q=8, block_k=8)


def test_causal_cross_lengths_and_gqa():
    rng = np.random.default_rng(1)
    q, k, v, do = make(rng, 2, 4, 2, 17, 26, 16)
    run_both(q, k, v, do, causal=True, block_q=8, block_k=16)


def test_gqa_causal_dq_atomics_agree_with_reference():
    rng = np.random.default_rng(2)
    q, k, v, do = make(rng, 1, 2, 1, 20, 20, 8)
    run_both(q, k, v, do, causal=True, block_q=8, block_k=8)


def test_boolean_mask_and_fully_masked_rows():
    rng = np.random.default_rng(3)
    q, k, v, do = make(rng, 2, 2, 2, 12, 15, 8)
    mask = rng.random((2, 2, 12, 15)) < 0.6
    mask[0, 1, 3, :] = False          # a fully masked row: out 0, lse -inf, grads 0
    mask[1, :, 7, :] = False
    out, lse = run_both(q, k, v, do, mask=mask, block_q=8, block_k=8)
    assert np.isneginf(lse[0, 1, 3]) and not np.any(out[0, 1, 3])


def test_key_padding_mask_broadcast():
    rng = np.random.default_rng(4)
    q, k, v, do = make(rng, 2, 2, 2, 10, 13, 8)
    mask = np.ones((2, 1, 1, 13), bool)
    mask[0, ..., 9:] = False
    mask[1, ..., 4:] = False
    run_both(q, k, v, do, mask=mask, block_q=8, block_k=8)


def test_block_sparse_skips_tiles_and_matches():
    rng = np.random.default_rng(5)
    q, k, v, do = make(rng, 1, 2, 2, 24, 24, 8)
    bm = np.array([[[[1, 0, 1], [0, 1, 0], [1, 1, 0]],
                    [[0, 0, 1], [1, 0, 0], [0, 1, 1]]]], bool)
    run_both(q, k, v, do, block_mask=bm, block_q=8, block_k=8)
    run_both(q, k, v, do, block_mask=bm[:, :1], block_q=8, block_k=8, causal=True)


def test_block_sparse_never_loads_skipped_tiles():
    """Poison the K/V rows of skipped tiles with NaN: a loaded skipped tile would show up."""
    rng = np.random.default_rng(6)
    q, k, v, do = make(rng, 1, 1, 1, 16, 24, 8)
    bm = np.array([[[[1, 0, 1], [1, 0, 0]]]], bool)
    k[:, :, 8:16] = np.nan
    v[:, :, 8:16] = np.nan
    kw = dict(scale=0.3, block_mask=bm, block_q=8, block_k=8, check_finite=False)
    out, lse = kernels_forward(q, k, v, **kw)
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    dq, dk, dv = kernels_backward(q, k, v, out, lse, do, **kw)
    assert np.isfinite(dq).all()
    kk = np.nan_to_num(k)
    vv = np.nan_to_num(v)
    r = ref_attention(q, kk, vv, do, scale=0.3, block_mask=bm, block_q=8, block_k=8)
    assert_close(out, r[0], 2e-4, "out")
    assert_close(dq, r[2], 1e-3, "dq")


def test_dropout_matches_hash_bit_for_bit():
    rng = np.random.default_rng(7)
    q, k, v, do = make(rng, 1, 2, 1, 13, 11, 8)
    run_both(q, k, v, do, dropout_p=0.3, seed=2**40 + 17, block_q=8, block_k=8, causal=True)


def test_dropout_keep_pattern_from_identity_values():
    """With v = one-hot columns, out[i, j] / p[i, j] recovers the keep bits exactly."""
    Nq, Nk, p = 9, 8, 0.5
    q = np.zeros((1, 1, Nq, 8), np.float32)
    k = np.zeros((1, 1, Nk, 8), np.float32)
    v = np.eye(Nk, 8, dtype=np.float32)[None, None]
    out, _ = kernels_forward(q, k, v, scale=1.0, dropout_p=p, seed=99, block_q=8, block_k=8)
    keep = keep_mask(99, p, 0, np.arange(Nq)[:, None], np.arange(Nk)[None, :])
    np.testing.assert_array_equal(out[0, 0] > 0, keep)
    np.testing.assert_allclose(out[0, 0][keep], 2.0 / Nk, rtol=1e-6)


def test_large_logits_are_stable():
    rng = np.random.default_rng(8)
    q, k, v, do = make(rng, 1, 1, 1, 16, 16, 8, scale=30.0)
    out, lse = run_both(q, k, v, do, block_q=8, block_k=8, scale=1.0, tol=5e-4)
    assert np.isfinite(lse).all()


def test_float16_inputs():
    rng = np.random.default_rng(9)
    q, k, v, do = make(rng, 1, 2, 2, 18, 18, 16, dtype=np.float16)
    run_both(q, k, v, do, causal=True, block_q=16, block_k=8)


def test_head_dim_32_micro_tiles():
    rng = np.random.default_rng(10)
    q, k, v, do = make(rng, 1, 1, 1, 16, 32, 32)
    run_both(q, k, v, do, block_q=16, block_k=16, config=KernelConfig(micro_tile=(4, 2)))


def test_block_mask_read_at_finer_kernel_tiles():
    """A block mask on 16 x 16 tiles, run with 8 x 8 kernel tiles (the mask refined to them)."""
    rng = np.random.default_rng(11)
    q, k, v, do = make(rng, 1, 2, 2, 30, 35, 8)
    bm = rng.random((1, 2, 2, 3)) < 0.6
    bm[0, 0, 1] = False                 # a Q block with no allowed tile: zeros, -inf lse
    run_both(q, k, v, do, block_mask=bm, block_q=16, block_k=16,
             config=KernelConfig(block_q=8, block_k=8))


@pytest.mark.parametrize("d", [16, 40])
def test_masked_dropout_gqa_partial_tiles(d):
    """Causal GQA with a boolean mask and dropout, partial tiles, and a head dim that is not a
    multiple of 32 (the delta pre-pass's lanes past d idle)."""
    rng = np.random.default_rng(20 + d)
    q, k, v, do = make(rng, 1, 2, 1, 19, 13, d)
    mask = rng.random((1, 2, 19, 13)) < 0.7
    run_both(q, k, v, do, causal=True, mask=mask, dropout_p=0.25, seed=5, block_q=8, block_k=8)


@settings(max_examples=6)
@given(nq=st.integers(1, 20), nk=st.integers(1, 20), d=st.sampled_from([8, 16]),
       causal=st.booleans(), group=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_random_shapes(nq, nk, d, causal, group, seed):
    rng = np.random.default_rng(seed)
    q, k, v, do = make(rng, 1, 2, 2 // group, nq, nk, d)
    run_both(q, k, v, do, causal=causal, block_q=8, block_k=8)


# -- sliding window (simulator) ---------------------------------------------------------------------


def test_window_causal_gqa_masks_tiles_the_band_cuts():
    """A 6-key causal window over 8 x 8 tiles: tiles wholly outside are skipped, the diagonal
    and left-edge tiles masked per element."""
    rng = np.random.default_rng(30)
    q, k, v, do = make(rng, 1, 4, 2, 26, 26, 8)
    run_both(q, k, v, do, causal=True, window_size=(5, 0), block_q=8, block_k=8)


@pytest.mark.parametrize("nq, nk, window, causal", [
    (9, 30, (4, 2), False),              # Nq < Nk: the band sits at the right end
    (30, 9, (3, 1), "bottom_right"),     # Nq > Nk: the first rows see no key (zeros, -inf)
    (20, 20, (0, 0), False),             # the diagonal alone
    (13, 21, (-1, 0), False),            # bottom-right causal, as a window
    (21, 13, (0, -1), False),            # one-sided: the diagonal and right of it
    (12, 12, (40, 40), False),           # wider than the sequence: every key
])
def test_window_cross_lengths_one_sided_and_empty_rows(nq, nk, window, causal):
    rng = np.random.default_rng(nq * 100 + nk)
    q, k, v, do = make(rng, 1, 2, 1, nq, nk, 8)
    out, lse = run_both(q, k, v, do, causal=causal, window_size=window, block_q=8, block_k=16)
    r_lse = ref_attention(q, k, v, scale=8 ** -0.5, causal=causal, window_size=window)[1]
    empty = np.isneginf(r_lse)
    assert np.all(out[empty] == 0)
    assert empty.any() == (nq == 30)


def test_window_with_mask_dropout_and_float16():
    rng = np.random.default_rng(31)
    q, k, v, do = make(rng, 1, 2, 1, 19, 23, 16)
    mask = rng.random((1, 2, 19, 23)) < 0.7
    run_both(q, k, v, do, window_size=(6, 3), mask=mask, dropout_p=0.25, seed=9, block_q=8,
             block_k=8)
    q, k, v, do = make(rng, 1, 2, 2, 18, 18, 16, dtype=np.float16)
    run_both(q, k, v, do, causal=True, window_size=(4, -1), block_q=16, block_k=8)


def test_window_never_loads_tiles_outside_it():
    """Nq = 8 against Nk = 40: with (3, 0) the rows see keys 29..39 (K blocks 3 and 4), so
    blocks 0-2 are poisoned with NaN; a loaded block would show up, forward or backward."""
    rng = np.random.default_rng(32)
    q, k, v, do = make(rng, 1, 1, 1, 8, 40, 8)
    k[:, :, :24] = np.nan
    v[:, :, :24] = np.nan
    kw = dict(scale=0.3, window_size=(3, 0), block_q=8, block_k=8, check_finite=False)
    out, lse = kernels_forward(q, k, v, **kw)
    dq, dk, dv = kernels_backward(q, k, v, out, lse, do, **kw)
    assert all(np.isfinite(x).all() for x in (out, lse, dq, dk[:, :, 24:], dv[:, :, 24:]))
    kk, vv = np.nan_to_num(k), np.nan_to_num(v)
    r = ref_attention(q, kk, vv, do, scale=0.3, window_size=(3, 0))
    assert_close(out, r[0], 2e-4, "out")
    assert_close(dq, r[2], 1e-3, "dq")


@settings(max_examples=6)
@given(nq=st.integers(1, 24), nk=st.integers(1, 24), left=st.integers(-1, 10),
       right=st.integers(-1, 10), causal=st.booleans(), seed=st.integers(0, 2**31))
@example(nq=1, nk=2, left=-1, right=-1, causal=True, seed=0)
def test_window_random_shapes(nq, nk, left, right, causal, seed):
    rng = np.random.default_rng(seed)
    q, k, v, do = make(rng, 1, 2, 1, nq, nk, 8)
    kw = dict(causal="bottom_right" if causal else False, window_size=(left, right), block_q=8,
              block_k=8)
    if causal and nq != nk and (left, right) == (-1, -1):
        # (-1, -1) is no window: bottom-right alignment with Nq != Nk alone is refused by name
        with pytest.raises(ValueError, match="bottom-right causal alignment"):
            run_both(q, k, v, do, **kw)
        return
    run_both(q, k, v, do, **kw)


def test_window_through_the_public_api_on_backend_numba():
    """ioaware.attention / attention_backward with backend="numba": bottom-right causal with a
    window and Nq != Nk runs (the simt band), equal to the float64 reference backend."""
    from ioaware import attention, attention_backward
    rng = np.random.default_rng(33)
    q, k, v, do = make(rng, 1, 2, 1, 11, 27, 8)
    kw = dict(causal="bottom_right", window_size=(6, 0), block_q=8, block_k=8)
    out, lse = attention(q, k, v, backend="numba", return_lse=True, **kw)
    r_out, r_lse = attention(q, k, v, backend="reference", return_lse=True, **kw)
    assert_close(out, r_out, TOL[np.float32], "out")
    assert_lse(lse, r_lse, TOL[np.float32])
    got = attention_backward(q, k, v, out, lse, do, backend="numba", **kw)
    want = attention_backward(q, k, v, out, lse, do, backend="reference", **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_close(g, w, TOL[np.float32] * 5, name)


def test_windowed_kernels_are_compiled_apart_and_only_simt_takes_a_window():
    """The window is a compile-time switch (a kernel without it is the one without a window);
    the registry hands windowed problems to the simt family."""
    from kernels import simt_fwd
    q = np.zeros((1, 1, 16, 8), np.float32)
    pb = kernel_problem(q, q, q, window_size=(2, 2))
    assert kernels.family_for(pb) == "simt" and kernels.family_for(pb, None, "bwd") == "simt"
    assert simt_fwd.band_arguments(pb) == (False, True, -2, 2)
    assert simt_fwd.band_arguments(kernel_problem(q, q, q, causal=True))[:2] == (True, False)
    cfg = simt_fwd.tiles(pb, KernelConfig())
    assert simt_fwd.get_kernel(cfg, 8, False, False, False, False, True) is not \
        simt_fwd.get_kernel(cfg, 8, False, False, False, False)


# -- errors ------------------------------------------------------------------------------------------


def test_kernel_config_refuses_bad_values():
    with pytest.raises(ValueError, match="family"):
        KernelConfig(family="cutlass")
    with pytest.raises(ValueError, match="block_q"):
        KernelConfig(block_q=0)
    with pytest.raises(ValueError, match="micro_tile"):
        KernelConfig(micro_tile=(4,))
    with pytest.raises(ValueError, match="launch_order"):
        KernelConfig(launch_order="diagonal")
    q = np.zeros((1, 1, 8, 16), np.float32)
    with pytest.raises(ValueError, match="tiles first"):
        kernels_forward(q, q, q, scale=1.0, config=KernelConfig(family="simt", launch_order=0))


def test_registry_names_why_a_forced_family_cannot_run():
    q = np.zeros((1, 1, 8, 96), np.float16)
    pb = kernel_problem(q, q, q, scale=1.0)
    with pytest.raises(ValueError, match=r"family='mma'.*(real CUDA GPU|head_dim)"):
        kernels.family_for(pb, KernelConfig(family="mma"))
    assert kernels.family_for(pb) == "simt"
    assert kernels.family_for(pb, KernelConfig(family="simt"), "bwd") == "simt"


def test_block_mask_tiles_the_kernel_tiles_must_divide():
    q = np.zeros((1, 1, 24, 8), np.float32)
    bm = np.ones((1, 1, 2, 2), bool)
    with pytest.raises(ValueError, match="must divide the block mask's tiles"):
        kernels_forward(q, q, q, scale=1.0, block_mask=bm, block_q=12, block_k=12,
                        config=KernelConfig(block_q=8, block_k=8))


def test_shared_memory_limit_is_named():
    q = np.zeros((1, 1, 8, 128), np.float32)
    with pytest.raises(ValueError, match="49152-byte limit"):
        kernels_forward(q, q, q, scale=1.0, block_q=64, block_k=64)


# -- real GPU ----------------------------------------------------------------------------------------



def _torch():
    import torch as t
    if not t.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return t


def _sdpa_ref(t, q, k, v, do, causal, mask=None):
    """float64 reference via the reference above on host copies."""
    return ref_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                         v.double().cpu().numpy(), do.double().cpu().numpy(),
                         scale=1.0 / np.sqrt(q.shape[-1]), causal=causal,
                         mask=None if mask is None else mask.cpu().numpy())


@pytest.mark.gpu
@pytest.mark.parametrize("family", [None, "simt"])
@pytest.mark.parametrize("d", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_numpy_head_dims(d, causal, family):
    """NumPy inputs on a GPU: the registry's family (tf32 at d 64 and 128) and the CUDA-core
    family forced."""
    rng = np.random.default_rng(d)
    q, k, v, do = make(rng, 2, 4, 2, 300, 257, d)
    run_both(q, k, v, do, causal=causal, config=KernelConfig(family=family))


@pytest.mark.gpu
def test_gpu_gqa_dq_atomics():
    rng = np.random.default_rng(1)
    q, k, v, do = make(rng, 2, 4, 1, 333, 333, 64)
    run_both(q, k, v, do, causal=True, config=KernelConfig(family="simt"))


@pytest.mark.gpu
@pytest.mark.parametrize("family", [None, "simt"])
def test_gpu_masks_dropout_block_sparse(family):
    rng = np.random.default_rng(2)
    q, k, v, do = make(rng, 2, 2, 2, 200, 190, 64)
    mask = rng.random((2, 1, 200, 190)) < 0.7
    mask[1, 0, 5] = False
    config = KernelConfig(family=family)
    run_both(q, k, v, do, mask=mask, dropout_p=0.2, seed=5, config=config)
    nbq, nbk = -(-200 // 32), -(-190 // 32)
    bm = rng.random((1, 2, nbq, nbk)) < 0.5
    run_both(q, k, v, do, block_mask=bm, block_q=32, block_k=32, causal=True, config=config)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_torch_tensors_strided_and_stream(dtype):
    t = _torch()
    dt = getattr(t, dtype)
    g = t.Generator(device="cuda").manual_seed(0)
    B, H, N, D = 2, 4, 257, 64
    # non-contiguous: [B, N, H, D] storage viewed as [B, H, N, D]
    q = t.randn(B, N, H, D, device="cuda", generator=g).to(dt).transpose(1, 2)
    k = t.randn(B, N, H, D, device="cuda", generator=g).to(dt).transpose(1, 2)
    v = t.randn(B, N, H, D, device="cuda", generator=g).to(dt).transpose(1, 2)
    do = t.randn(B, H, N, D, device="cuda", generator=g).to(dt)
    assert not q.is_contiguous()
    s = t.cuda.Stream()
    with t.cuda.stream(s):
        out, lse = kernels_forward(q, k, v, scale=D ** -0.5, causal=True)
        dq, dk, dv = kernels_backward(q, k, v, out, lse, do, scale=D ** -0.5, causal=True)
    s.synchronize()
    assert isinstance(out, t.Tensor) and out.dtype == dt and lse.dtype == t.float32
    r = _sdpa_ref(t, q.float(), k.float(), v.float(), do.float(), True)
    tol = {"float32": 2e-4, "float16": 4e-3, "bfloat16": 3e-2}[dtype]
    assert_close(out.float().cpu().numpy(), r[0], tol, "out")
    assert_close(dq.float().cpu().numpy(), r[2], tol * 5, "dq")
    assert_close(dk.float().cpu().numpy(), r[3], tol * 5, "dk")
    assert_close(dv.float().cpu().numpy(), r[4], tol * 5, "dv")


@pytest.mark.gpu
def test_gpu_torch_zero_copy_output_on_device():
    t = _torch()
    q = t.randn(1, 2, 64, 64, device="cuda")
    out, lse = kernels_forward(q, q, q, scale=0.125)
    assert out.device == q.device and lse.device == q.device
    ref = t.nn.functional.scaled_dot_product_attention(q, q, q)
    assert (out - ref).abs().max().item() < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
def test_gpu_half_precision_attention_takes_the_tensor_core_kernels(dtype_name):
    """ioaware.attention on half-precision CUDA tensors, autograd included: the tensor-core
    forward and backward (`kernels.mma_fwd`, `kernels.mma_bwd`)."""
    import torch

    from ioaware import attention

    dtype = getattr(torch, dtype_name)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 64, device="cuda", generator=g).to(dtype).requires_grad_()
               for _ in range(3))
    pb = kernel_problem(q, k, v, causal=True)
    assert kernels.family_for(pb) == default_half_forward()
    assert kernels.family_for(pb, pass_="bwd") == "mma"
    out = attention(q, k, v, causal=True)
    out.float().square().sum().backward()
    q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    ref.square().sum().backward()
    # one rounding of the output to the input dtype dominates: 2**-11 (fp16), 2**-8 (bf16)
    tol = 4e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)
    for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        err = (a.double() - b).norm() / b.norm()
        assert err < 10 * tol
