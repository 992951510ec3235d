"""The FP8 (e4m3) Hopper forward (`kernels.wgmma_fwd.forward_fp8`, family ``wgmma_fp8``).

* CPU, every run: the 8-bit A fragment of ``wgmma.m64nNk32`` (`kernels.hopper.wgmma_a8_elem`)
  is a bijection onto the 64 x 32 tile; P built in place from the accumulator
  (`wgmma_p8_from_d`) holds, at K position k, the score of key `fp8_key_order` (k) of the same
  row; emulated over a whole 64 x 128 tile, P (in that key order) times V^T (permuted the same
  way, as `v_transpose_kernel` writes it) equals P V; the transpose kernel itself on the CUDA
  simulator; the plan's fields against their formulas and the plan's refusals; `fp8_supports`.
* CPU, compile only (skipped without ptxas or NVVM): the FP8 kernels compile for ``sm_90a`` and
  assemble with ptxas without spills; the ``wgmma`` instructions are the e4m3 k32 forms.
* GPU (``gpu``, compute capability 9.0): O against float64 attention of the dequantised inputs
  within the error bound of rounding P to e4m3 (each probability off by at most 2**-4 of itself,
  plus e4m3's smallest step after the scaling by 256) and of the FP8 products' accumulation
  (`S_ERROR`), the logsumexp within the latter; causal or not,
  N in {1, 200, 1000}, Nq != Nk, GQA, both query tiles, large logits,
  strided operands; the transpose against NumPy.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kernels import hopper as hp
from kernels import wgmma_fwd as wf
from sim.plans import plan_for
from sim.plans.wgmma_fwd import FP8_TRANSPOSE_THREADS, wgmma_smem_bytes, wgmma_threads
from sim.workload import Workload

from .helpers import assemble_sm90a, compile_sm90a_in_child, need_hopper_torch



# ------------------------------------------------------------------------------------------------
# CPU: layouts
# ------------------------------------------------------------------------------------------------
def test_a8_fragment_is_a_bijection_and_owner_inverts_it():
    seen = {}
    for t in range(128):
        for reg in range(4):
            for byte in range(4):
                row, k = hp.wgmma_a8_elem(t, reg, byte)
                assert 0 <= row < 64 and 0 <= k < 32
                assert (row, k) not in seen
                seen[(row, k)] = (t, reg, byte)
                assert hp.wgmma_a8_owner(row, k) == (t, reg, byte)
    assert len(seen) == 64 * 32
    # the PTX ISA's figure: thread 0 holds row 0, k 0..3 in a0..a3 and k 16..19 in a8..a11
    assert [hp.wgmma_a8_elem(0, 0, b) for b in range(4)] == [(0, k) for k in range(4)]
    assert [hp.wgmma_a8_elem(0, 2, b) for b in range(4)] == [(0, k) for k in range(16, 20)]
    assert hp.wgmma_a8_elem(5, 1, 3) == (9, 7)


def test_key_order_is_a_permutation_within_32():
    order = [hp.fp8_key_order(p) for p in range(32)]
    assert sorted(order) == list(range(32))
    assert order != list(range(32))
    for bad in (-1, 32):
        with pytest.raises(ValueError, match="position"):
            hp.fp8_key_order(bad)


@pytest.mark.parametrize("kc", [0, 1, 2, 3])
def test_p_from_accumulator_holds_the_permuted_key_of_the_same_row(kc):
    for t in range(128):
        for reg in range(4):
            for byte in range(4):
                row, k = hp.wgmma_a8_elem(t, reg, byte)
                acc = hp.wgmma_p8_from_d(kc, reg, byte)
                d_row, d_col = hp.wgmma_d_elem(t, acc, 128)
                assert d_row == row
                assert d_col == 32 * kc + hp.fp8_key_order(k)


def test_whole_tile_emulation_p_vt_equals_p_v():
    """One 64 x 128 score tile through the kernel's index arithmetic: the accumulator layout,
    the pack of `_build_kernel` (registers r, r+1, r+4, r+5 with r = 16 kc + 8 (q >> 1) +
    2 (q & 1)), the A fragment, and V^T as the transpose kernel permutes it."""
    rng = np.random.default_rng(1)
    s = rng.random((64, 128))
    v = rng.standard_normal((128, 128))
    order = np.array([hp.fp8_key_order(p) for p in range(32)])
    vt = np.concatenate([v[32 * t + order].T for t in range(4)], axis=1)   # [d, keys]
    acc = np.zeros((128, 64))
    for t in range(128):
        for r in range(64):
            row, col = hp.wgmma_d_elem(t, r, 128)
            acc[t, r] = s[row, col]
    got = np.zeros((64, 128))
    for kc in range(4):
        a = np.zeros((64, 32))
        for t in range(128):
            for q in range(4):
                base = 16 * kc + 8 * (q >> 1) + 2 * (q & 1)
                vals = (acc[t, base], acc[t, base + 1], acc[t, base + 4], acc[t, base + 5])
                for byte, val in enumerate(vals):
                    assert hp.wgmma_p8_from_d(kc, q, byte) == base + (byte & 1) + 4 * (byte >> 1)
                    row, k = hp.wgmma_a8_elem(t, q, byte)
                    a[row, k] = val
        got += a @ vt[:, 32 * kc: 32 * kc + 32].T
    np.testing.assert_allclose(got, s @ v, rtol=1e-12, atol=1e-12)


def test_transpose_kernel_on_the_simulator():
    from numba import config
    if not config.ENABLE_CUDASIM:
        pytest.skip("runs under the CUDA simulator (the GPU run is test_transpose_on_the_gpu)")
    rng = np.random.default_rng(2)
    B, H, Nk, D = 1, 2, 45, 128
    v = rng.integers(0, 256, size=(B, H, Nk, D), dtype=np.uint8)
    keys = 64                     # two programs of 32 keys (the forward pads to whole tiles)
    vt = np.full((B, H, D, keys), 7, np.uint8)
    grid = (keys // wf.V_TRANSPOSE_TILE, B * H)
    wf.v_transpose_kernel()[grid, FP8_TRANSPOSE_THREADS](v.view(np.int32), vt.view(np.int32), Nk)
    np.testing.assert_array_equal(vt, _transpose_reference(v, keys))


def _transpose_reference(v, keys):
    B, H, Nk, D = v.shape
    order = np.array([hp.fp8_key_order(p) for p in range(32)])
    padded = np.zeros((B, H, keys, D), v.dtype)
    padded[:, :, :Nk] = v
    perm = np.concatenate([32 * t + order for t in range(keys // 32)])
    return np.ascontiguousarray(padded[:, :, perm].transpose(0, 1, 3, 2))


# ------------------------------------------------------------------------------------------------
# CPU: the plan and the refusals
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_q", [128, 64])
def test_plan_fields_equal_the_formulas(causal, block_q):
    B, H, Hkv, Nq, Nk, D = 2, 8, 2, 1000, 777, 128
    w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=Nq, seq_len_k=Nk, head_dim=D,
                 dtype="bf16", causal=causal)
    p = plan_for("wgmma_fp8", "fwd", w, block_q=block_q, block_k=128)
    tr, k = p.kernels
    keys = wf.v_transpose_keys(Nk)
    assert keys == 896
    assert tr.grid == (keys // 32, B * Hkv) and tr.threads == 256
    acc = {(a.tensor, a.op): a.bytes for a in tr.accesses}
    assert acc == {("V", "load"): B * Hkv * Nk * D, ("V^T", "store"): B * Hkv * keys * D}
    n_blocks = -(-Nq // block_q)
    tiles = sum(
        (min(-(-Nk // 128), (m * block_q + block_q - 1) // 128 + 1) if causal else -(-Nk // 128))
        for m in range(n_blocks)) * B * H
    assert k.grid == (n_blocks, B * H)
    # the default schedule: ping-pong and the intra-warpgroup overlap at block_q = 128 (three
    # stages, a producer warpgroup), serial at 64
    overlap = block_q == 128
    assert p.config["overlap"] is overlap and p.config["pingpong"] is overlap
    assert k.threads == wgmma_threads(block_q, overlap)
    assert k.shared_bytes == wgmma_smem_bytes(D, block_q, 128, 1, 3 if overlap else 2)
    (mm,) = k.matmuls
    assert mm.unit == "wgmma.fp8" and mm.flops == tiles * 4 * D * block_q * 128
    acc = {(a.tensor, a.op): a.bytes for a in k.accesses}
    assert acc[("Q", "load")] == B * H * Nq * D
    assert acc[("V^T", "load")] == tiles * 128 * D
    assert acc[("O", "store")] == B * H * Nq * D * 2
    c = wf.kernel_constants(D, block_q, 128, fp8=True, stages=3 if overlap else 2)
    assert c["bar_offset"] + 64 + 1024 == k.shared_bytes
    assert {(a.tensor, a.op) for a in k.accesses if a.how == "tma"} == {
        ("Q", "load"), ("K", "load"), ("V^T", "load")}


def test_plan_refusals():
    w = Workload(batch=1, heads=2, seq_len_q=64, head_dim=128, dtype="bf16")
    for change, word in ((dict(head_dim=64), "head_dim"), (dict(dtype="fp16"), "dtype")):
        ww = Workload(**{**dict(batch=1, heads=2, seq_len_q=64, head_dim=128, dtype="bf16"),
                         **change})
        with pytest.raises(ValueError, match=word):
            plan_for("wgmma_fp8", "fwd", ww)
    with pytest.raises(ValueError, match="block_k"):
        plan_for("wgmma_fp8", "fwd", w, block_k=64)
    with pytest.raises(ValueError, match="block_q"):
        plan_for("wgmma_fp8", "fwd", w, block_q=32)


@pytest.mark.parametrize("args, word", [
    (dict(head_dim=64), "head_dim"), (dict(heads_kv=3), "heads_q"), (dict(seqlen_q=0), "seqlen_q"),
    (dict(block_q=32), "block_q")])
def test_fp8_supports_names_what_it_refuses(args, word):
    base = dict(batch=1, heads_q=4, heads_kv=2, seqlen_q=10, seqlen_k=10, head_dim=128,
                causal=False)
    why = wf.fp8_supports(**{**base, **args})
    assert why and word in why


def test_fp8_supports_checks_the_hardware_last():
    why = wf.fp8_supports(1, 4, 2, 10, 10, 128, True)
    from kernels import host
    if not host.real_gpu():
        assert "GPU" in why
    elif host.compute_capability(host.current_device_id()) < (9, 0):
        assert "compute capability" in why
    else:
        assert why is None


# ------------------------------------------------------------------------------------------------
# CPU, compile only
# ------------------------------------------------------------------------------------------------
SIGNATURE = ("void(uint64[:, ::1], int16[:, :, :, ::1], float32[:, :, ::1], int32[:, ::1], "
             "int32[::1], int64, int64, int64, int64, int64, float32, float32[:, ::1], "
             "float32[:, ::1], float32[:, ::1], int64, int64)")
COMPILED = [(128, 128, False), (64, 128, True)]    # (block_q, head_dim, causal)


def _schedule(bq, d):
    """The plan's (so the launcher's) schedule of this FP8 kernel: pingpong and overlap."""
    w = Workload(batch=1, heads=1, seq_len_q=64, head_dim=d, dtype="bf16")
    cfg = plan_for("wgmma_fp8", "fwd", w, block_q=bq).config
    return {"pingpong": cfg["pingpong"], "overlap": cfg["overlap"]}


def compile_fp8(outdir) -> dict:
    """Compile the `COMPILED` FP8 kernels for sm_90a into ``outdir`` (a process without the
    CUDA simulator); returns name -> (threads, smem_bytes)."""
    from numba import cuda

    from benchmarks.common import allow_offline_compile
    allow_offline_compile()
    launch = {}
    for bq, d, causal in COMPILED:
        kern = wf._build_kernel(d, bq, 128, True, causal, 1, True, **_schedule(bq, d))
        text, _ = cuda.compile_ptx(kern.py_func, SIGNATURE, cc=(9, 0, "a"),
                                   launch_bounds=(kern.threads, 1))
        name = f"wgmma_fp8_{bq}_{d}_{'causal' if causal else 'full'}"
        Path(outdir, name + ".ptx").write_text(text)
        launch[name] = (kern.threads, kern.smem_bytes)
    return launch


def test_fp8_kernels_compile_and_assemble(tmp_path):
    ptxas, launch = compile_sm90a_in_child("tests.test_wgmma_fp8", "compile_fp8", tmp_path,
                                           timeout=900)
    for bq, d, causal in COMPILED:
        name = f"wgmma_fp8_{bq}_{d}_{'causal' if causal else 'full'}"
        text = (tmp_path / f"{name}.ptx").read_text()
        assert ".target sm_90a" in text
        wg = [ln for ln in text.splitlines() if "wgmma.mma_async" in ln]
        # the default schedule with two consumer warpgroups: ping-pong and the intra-warpgroup
        # overlap (S = Q K^T issued for the first tile and in the loop, O += P V in the loop
        # and for the last tile; P packed after the first tile's softmax and in the loop)
        sched = _schedule(bq, d)
        assert sched == {"pingpong": bq == 128, "overlap": bq == 128}
        copies = 2 if bq == 128 else 1
        # S: d / 32 k-steps of one m64n128 product (block_k = 128); O += P V: 4 k32 steps of
        # one m64n{d} product (kernels.hopper.product_blocks)
        assert len(wg) == copies * (d // 32 + 4)
        assert sum("m64n128k32.f32.e4m3.e4m3" in ln for ln in wg) == copies * d // 32 + (
            copies * 4 if d == 128 else 0)
        assert sum(f"m64n{d}k32.f32.e4m3.e4m3" in ln for ln in wg) >= copies * 4
        assert text.count("cvt.rn.satfinite.e4m3x2.f32") == copies * 2 * 4 * 4
        # ping-pong: warpgroup 1's first hand-over and the hand-over after each turn's issue
        # (first tile, loop); warpgroup 0's last wait, each turn's wait and syncthreads' bar.sync 0
        assert text.count("bar.arrive") == (3 if bq == 128 else 0)
        assert text.count("bar.sync") == (4 if bq == 128 else 1)
        assert text.count("setmaxnreg.") == (2 if bq == 128 else 0)
        p = plan_for("wgmma_fp8", "fwd", Workload(batch=1, heads=1, seq_len_q=64, head_dim=d,
                                                  dtype="bf16", causal=causal), block_q=bq)
        assert tuple(launch[name]) == (p.kernels[1].threads, p.kernels[1].shared_bytes)
        entry, _ = assemble_sm90a(ptxas, tmp_path / f"{name}.ptx")      # no wgmma serialised
        assert entry["spill_store_bytes"] == 0 and entry["stack_frame_bytes"] == 0, entry


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
_need_hopper = need_hopper_torch


def _quantized(torch, shape, seed, spread=1.0):
    """e4m3 values with a per-(batch, head) descale, from N(0, spread^2) floats."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(shape, device="cuda", generator=g) * spread
    amax = x.abs().amax(dim=(-2, -1)).clamp_min(1e-6)
    descale = (amax / 448.0).float().contiguous()
    return (x / descale[..., None, None]).to(torch.float8_e4m3fn), descale


#: Hopper's FP8 tensor cores add the e4m3 products with fewer bits than float32 (reported, e.g.,
#: in DeepSeek-V3's technical report); the scores' error is bounded by this fraction of
#: ``scale * sum_i |q_i k_i|`` per row (the largest over its keys).
S_ERROR = 2.0**-11


def _reference(torch, q8, k8, v8, dq, dk, dv, scale, causal):
    """float64 O, lse, the error scale ``sum_j p_ij |v_jc|`` of the dequantised inputs and the
    bound of each row's score error (`S_ERROR`)."""
    q = q8.double() * dq.double()[..., None, None]
    k = k8.double() * dk.double()[..., None, None]
    v = v8.double() * dv.double()[..., None, None]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    ds = S_ERROR * abs(scale) * (q.abs() @ k.abs().transpose(-1, -2)).amax(-1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        nq, nk = s.shape[-2:]
        allowed = torch.ones(nq, nk, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~allowed, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0)[..., None])
    p = torch.where(torch.isfinite(lse)[..., None], p, 0)
    return p @ v, lse, p @ v.abs(), ds


def _check_fp8(torch, out, lse, q8, k8, v8, dq, dk, dv, scale, causal):
    want, want_lse, mag, ds = _reference(torch, q8, k8, v8, dq, dk, dv, scale, causal)
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape
    got = out.double()
    assert torch.isfinite(got).all()
    # P rounded to e4m3 (relative 2**-4 at most; after the scaling by 256, probabilities below
    # 2**-14 are subnormal with steps of 2**-17), each p off by a factor up to exp(2 ds) from
    # the scores' error, O rounded to bfloat16 (2**-8 relative)
    vmax = float((v8.double().abs() * dv.double()[..., None, None]).max())
    bound = ((2.0**-4 + 2 * ds[..., None]) * mag + 2.0**-8 * want.abs()
             + k8.shape[2] * 2.0**-18 * vmax + 1e-6)
    err = (got - want).abs()
    worst = torch.argmax((err - bound).flatten())
    idx = np.unravel_index(int(worst), err.shape)
    assert bool((err <= bound).all()), (f"O at (b, h, row, col) {idx}: got {got[idx]:.6g}, want "
                                       f"{want[idx]:.6g}, bound {bound[idx]:.3g}")
    fin = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), fin)
    assert bool((got[~fin] == 0).all())
    if fin.any():     # the scores' error, and ex2 / log in float32
        d = (lse.double()[fin] - want_lse[fin]).abs()
        tol = ds[fin] + 1e-5 * (1 + want_lse[fin].abs())
        assert bool((d <= tol).all()), float((d - tol).max())
    # a wrong permutation or scale would be far outside the bound: the typical error is small
    rel = float(err.pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-30))
    assert rel < 0.05, rel


def _run(torch, shape_q, shape_kv, causal, seed, block_q=None, spread=1.0, scale=None):
    q8, dq = _quantized(torch, shape_q, seed, spread)
    k8, dk = _quantized(torch, shape_kv, seed + 1)
    v8, dv = _quantized(torch, shape_kv, seed + 2)
    scale = 1 / math.sqrt(shape_q[-1]) if scale is None else scale
    out, lse = wf.forward_fp8(q8, k8, v8, dq, dk, dv, causal=causal, scale=scale, block_q=block_q)
    _check_fp8(torch, out, lse, q8, k8, v8, dq, dk, dv, scale, causal)
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("block_q", [128, 64])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n", [1, 200, 1000])
def test_forward_matches_float64_of_the_dequantised_inputs(n, causal, block_q):
    torch = _need_hopper()
    _run(torch, (2, 4, n, 128), (2, 2, n, 128), causal, seed=n + block_q, block_q=block_q)


@pytest.mark.gpu
@pytest.mark.parametrize("n_q, n_k", [(200, 333), (333, 200), (1, 500), (1000, 63), (64, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_nq_differs_from_nk(n_q, n_k, causal):
    torch = _need_hopper()
    _run(torch, (1, 4, n_q, 128), (1, 2, n_k, 128), causal, seed=n_q * 7 + n_k)


@pytest.mark.gpu
def test_large_logits():
    torch = _need_hopper()
    _run(torch, (1, 2, 130, 128), (1, 2, 1100, 128), False, seed=7, spread=12.0, scale=0.125)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_pingpong_gives_the_same_bits(causal):
    """The warpgroups' turns order when the products are issued, not what they compute."""
    torch = _need_hopper()
    q8, dq = _quantized(torch, (2, 4, 777, 128), 21)
    k8, dk = _quantized(torch, (2, 2, 1031, 128), 22)
    v8, dv = _quantized(torch, (2, 2, 1031, 128), 23)
    a = wf.forward_fp8(q8, k8, v8, dq, dk, dv, causal=causal, pingpong=True, overlap=False)
    b = wf.forward_fp8(q8, k8, v8, dq, dk, dv, causal=causal, pingpong=False, overlap=False)
    _check_fp8(torch, *a, q8, k8, v8, dq, dk, dv, 1 / math.sqrt(128), causal)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="pingpong"):
        wf.forward_fp8(q8, k8, v8, dq, dk, dv, block_q=64, pingpong=True)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_overlap_gives_the_same_output(causal):
    """The intra-warpgroup overlap (the default with ping-pong at block_q = 128; without it;
    with one warpgroup) orders when the products run, not what they compute: O bit for bit,
    the logsumexp to the last bit of its terms (two builds may fuse ``m ln 2 + log l``
    differently)."""
    torch = _need_hopper()
    q8, dq = _quantized(torch, (2, 4, 777, 128), 31)
    k8, dk = _quantized(torch, (2, 2, 1031, 128), 32)
    v8, dv = _quantized(torch, (2, 2, 1031, 128), 33)
    for block_q, pingpong in ((128, True), (128, False), (64, False)):
        serial = wf.forward_fp8(q8, k8, v8, dq, dk, dv, causal=causal, block_q=block_q,
                                pingpong=False, overlap=False)
        ov = wf.forward_fp8(q8, k8, v8, dq, dk, dv, causal=causal, block_q=block_q,
                            pingpong=pingpong, overlap=True)
        _check_fp8(torch, *ov, q8, k8, v8, dq, dk, dv, 1 / math.sqrt(128), causal)
        assert torch.equal(ov[0], serial[0])
        # lse = (m - 8) ln 2 + log l, two terms of up to ~16 that cancel: a last-bit difference
        # of either is up to 2**-23 * 16 absolute
        torch.testing.assert_close(ov[1], serial[1], rtol=2 * 2.0**-23, atol=4e-6)


@pytest.mark.gpu
def test_strided_operands_give_the_same_bits():
    torch = _need_hopper()
    q8, dq = _quantized(torch, (2, 4, 300, 128), 11)
    k8, dk = _quantized(torch, (2, 2, 300, 128), 12)
    v8, dv = _quantized(torch, (2, 2, 300, 128), 13)
    a = wf.forward_fp8(q8, k8, v8, dq, dk, dv, causal=True)
    qs, ks, vs = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q8, k8, v8))
    assert not qs.is_contiguous()
    b = wf.forward_fp8(qs, ks, vs, dq, dk, dv, causal=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
def test_transpose_on_the_gpu():
    torch = _need_hopper()
    g = torch.Generator(device="cuda").manual_seed(4)
    v = torch.randint(0, 256, (2, 3, 301, 128), generator=g, device="cuda", dtype=torch.uint8)
    vt = wf.v_transpose(v.view(torch.float8_e4m3fn))
    np.testing.assert_array_equal(vt.cpu().numpy(),
                                  _transpose_reference(v.cpu().numpy(), wf.v_transpose_keys(301)))
