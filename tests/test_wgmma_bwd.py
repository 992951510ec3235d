"""Tests of the Hopper backward (`kernels.wgmma_bwd`, the ``wgmma`` family's backward).

GPU tests (marked ``gpu``, on compute capability 9.0: wgmma and TMA; the CUDA simulator runs
neither) draw fresh random half-precision inputs, run our forward for ``out`` and ``lse`` and
the wgmma backward with the family forced (``KernelConfig(family="wgmma")``: a problem it
cannot run raises instead of running on another family), and compare the gradients against
float64 gradients of the same (already rounded) inputs, element by element, within the bounds
of `tests.test_mma_bwd` (its module docstring derives them: the kernel rounds P, dS, O and the
gradients to the input dtype as the ``mma`` backward does; u = 2**-11 for float16, 2**-8 for
bfloat16). Shapes are odd lengths, Nq != Nk, GQA, causal, sliding windows with rows that see
no key, and large logits. The CPU tests cover the refusals and the registry's order.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from numba import cuda   # a global, which the CUDA simulator replaces inside kernels

import kernels
from kernels import KernelConfig, wgmma_bwd as bwd_mod

from .helpers import kernel_problem, kernels_backward, kernels_forward
from .test_mma_bwd import _check_grads, _inputs, _torch_cuda, reference_grads

gpu = pytest.mark.gpu
WGMMA = KernelConfig(family="wgmma")
#: dQ by its own kernel and by atomics from the dK/dV kernel, each pinned.
DQ_MODES = {"kernel": KernelConfig(family="wgmma", backward_dq="kernel"),
            "atomic": KernelConfig(family="wgmma", backward_dq="atomic")}


def _hopper():
    torch = _torch_cuda()
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wgmma backward needs compute capability 9.0")
    return torch


def _run_and_check(q, k, v, dout, *, causal=False, window_size=None, float64_forward=False,
                   config=WGMMA):
    """Our wgmma backward (under ``config``) on ``out``/``lse`` from our forward (or,
    ``float64_forward``, from the float64 reference rounded), checked against float64
    gradients."""
    torch = _hopper()
    d = q.shape[-1]
    scale = d ** -0.5
    kw = dict(scale=scale, causal=causal, window_size=window_size)
    want = reference_grads(q, k, v, dout, scale, causal=causal,
                           mask=_window_mask(q, k, causal, window_size))
    if float64_forward:
        out = torch.from_numpy(want["out"]).to(device="cuda", dtype=q.dtype)
        lse = torch.from_numpy(want["lse"]).to(device="cuda", dtype=torch.float32)
    else:
        out, lse = kernels_forward(q, k, v, **kw)
    assert kernels.family_for(kernel_problem(q, k, v, **kw), config, "bwd") == "wgmma"
    dq, dk, dv = kernels_backward(q, k, v, out, lse, dout, config=config, **kw)
    assert dq.dtype == q.dtype and dk.dtype == q.dtype and dv.dtype == q.dtype
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    _check_grads((dq, dk, dv), want, q.dtype)
    return dq, dk, dv


def _window_mask(q, k, causal, window_size):
    """The sliding window (with causal, bottom-right aligned as `ioaware.attention`'s rule) as a
    boolean mask [Nq, Nk] for the float64 reference; None without a window."""
    if window_size is None:
        return None
    import numpy as np
    nq, nk = q.shape[-2], k.shape[-2]
    left, right = window_size
    rel = np.arange(nk)[None, :] - (np.arange(nq)[:, None] + nk - nq)
    allowed = np.ones((nq, nk), bool)
    if left >= 0:
        allowed &= rel >= -left
    if right >= 0:
        allowed &= rel <= right
    if causal:
        allowed &= rel <= 0
    return allowed


@gpu
@pytest.mark.parametrize("dq_mode", list(DQ_MODES))
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_float64(dtype_name, head_dim, causal, dq_mode):
    torch = _hopper()
    dtype = getattr(torch, dtype_name)
    q, k, v, dout = _inputs((2, 3, 333, head_dim), (2, 3, 333, head_dim), dtype, seed=11)
    _run_and_check(q, k, v, dout, causal=causal, config=DQ_MODES[dq_mode])


@gpu
@pytest.mark.parametrize("dq_mode", list(DQ_MODES))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("nq,nk,causal", [(200, 77, False), (77, 300, False), (300, 130, True),
                                          (129, 1000, True), (1, 64, False)])
def test_gqa_and_unequal_lengths(head_dim, nq, nk, causal, dq_mode):
    """GQA 6/2, Nq != Nk (top-left causal), lengths that are not multiples of the tiles."""
    torch = _hopper()
    q, k, v, dout = _inputs((2, 6, nq, head_dim), (2, 2, nk, head_dim), torch.float16, seed=nq)
    _run_and_check(q, k, v, dout, causal=causal, config=DQ_MODES[dq_mode])


@gpu
@pytest.mark.parametrize("dq_mode", list(DQ_MODES))
@pytest.mark.parametrize("window_size,causal", [((32, 0), True), ((100, 17), False),
                                                ((0, 0), False), ((-1, 40), False)])
def test_sliding_window(window_size, causal, dq_mode):
    """Windows with partial tiles, a window of 0 (one key a row) and one side unbounded; with
    Nq > Nk some rows see no key (their gradient is zero)."""
    torch = _hopper()
    for nq, nk in ((257, 257), (300, 190)):
        if causal and nq != nk:
            continue
        q, k, v, dout = _inputs((1, 4, nq, 128), (1, 2, nk, 128), torch.bfloat16, seed=nk)
        _run_and_check(q, k, v, dout, causal=causal, window_size=window_size,
                       config=DQ_MODES[dq_mode])


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_atomic_dq_matches_the_dq_kernel(head_dim):
    """dQ by atomics against dQ by its own kernel, bfloat16, causal, GQA 8/2 over several key
    tiles and query tiles: all three within the bounds against float64 (each run checks them;
    dK and dV differ in the last bits, delta coming from the pre-pass, summed in another
    order), and within a few roundings of each other; the atomic dQ repeated within a few
    float32 roundings of itself (the reductions add the key tiles' float32 partial sums in a
    varying order)."""
    torch = _hopper()
    q, k, v, dout = _inputs((2, 8, 700, head_dim), (2, 2, 700, head_dim), torch.bfloat16,
                            seed=head_dim + 1)
    by_kernel = _run_and_check(q, k, v, dout, causal=True, config=DQ_MODES["kernel"])
    by_atomics = _run_and_check(q, k, v, dout, causal=True, config=DQ_MODES["atomic"])
    for a, b in zip(by_kernel, by_atomics):
        assert torch.allclose(a.float(), b.float(), rtol=2 ** -6, atol=2e-3)
    again = kernels_backward(q, k, v, *kernels_forward(q, k, v, causal=True), dout,
                             config=DQ_MODES["atomic"], causal=True)[0]
    assert torch.allclose(again.float(), by_atomics[0].float(), rtol=2 ** -7, atol=1e-3)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_every_legal_tile_pair_matches_float64(head_dim):
    """Every (dq_tile, kv_tile) of `sim.plans.wgmma_bwd.wgmma_backward_configs` pinned through
    `KernelConfig` (as ``python -m benchmarks pick`` times them): odd lengths, causal, GQA."""
    torch = _hopper()
    from sim import Workload
    from sim.plans.wgmma_bwd import wgmma_backward_configs
    q, k, v, dout = _inputs((1, 4, 333, head_dim), (1, 2, 333, head_dim), torch.bfloat16,
                            seed=head_dim)
    w = Workload(batch=1, heads=4, heads_kv=2, seq_len_q=333, head_dim=head_dim,
                 dtype="bf16", causal=True)
    configs = wgmma_backward_configs(w, serialised=True)
    assert len(configs) == 16
    for cfg in configs:
        _run_and_check(q, k, v, dout, causal=True,
                       config=KernelConfig(family="wgmma", **cfg))


@gpu
def test_large_logits_and_float64_forward():
    """Logits of size ~30 (q scaled by 8): the exponentials stay exact against the logsumexp,
    from our forward and from the float64 one."""
    torch = _hopper()
    q, k, v, dout = _inputs((1, 2, 515, 64), (1, 2, 515, 64), torch.float16, seed=5, q_scale=8.0)
    _run_and_check(q, k, v, dout, causal=True)
    _run_and_check(q, k, v, dout, causal=False, float64_forward=True)


@gpu
def test_deterministic_and_default_family():
    """No atomics: two calls give the same bits; on Hopper the registry's default backward is
    this one, and it agrees with the mma family's within the bounds of both."""
    torch = _hopper()
    q, k, v, dout = _inputs((2, 4, 640, 128), (2, 4, 640, 128), torch.bfloat16, seed=3)
    pb = kernel_problem(q, k, v, causal=True)
    assert kernels.family_for(pb, None, "bwd") == "wgmma"
    out, lse = kernels.forward(pb)
    first = kernels.backward(pb, out, lse, dout)
    second = kernels.backward(pb, out, lse, dout)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@gpu
def test_heads_second_operands_keep_their_layout():
    """q, k, v, out and dO as [B, N, H, d] tensors viewed as [B, H, N, d] (as a Hugging Face
    model passes them): read in place, the gradients in their operands' layouts, the same bits
    as from contiguous copies; through autograd, three calls (the third repeats the recorded
    launches)."""
    torch = _hopper()
    import ioaware
    g = torch.Generator(device="cuda").manual_seed(6)
    shapes = ((2, 200, 8, 64), (2, 200, 2, 64), (2, 200, 2, 64), (2, 200, 8, 64))
    q, k, v, dout = (torch.randn(s, device="cuda", generator=g).to(torch.bfloat16)
                     .transpose(1, 2) for s in shapes)
    out, lse = kernels_forward(q, k, v, causal=True)
    got = kernels_backward(q, k, v, out, lse, dout, config=WGMMA, causal=True)
    want = kernels_backward(*(x.contiguous() for x in (q, k, v, out)), lse, dout.contiguous(),
                            config=WGMMA, causal=True)
    for a, b, x in zip(got, want, (q, k, v)):
        assert a.stride() == x.stride() and torch.equal(a, b)
    for _ in range(3):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        o = ioaware.attention(*leaves, causal=True)
        assert o.stride() == q.stride()
        o.backward(dout)
        for leaf, b in zip(leaves, want):
            assert leaf.grad.stride() == leaf.stride() and torch.equal(leaf.grad, b)


@gpu
def test_autograd_through_attention():
    """``ioaware.attention`` with autograd runs this backward on Hopper and matches float64."""
    torch = _hopper()
    import ioaware
    q, k, v, dout = _inputs((2, 4, 300, 64), (2, 2, 300, 64), torch.float16, seed=9)
    want = reference_grads(q, k, v, dout, 64 ** -0.5, causal=True)
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = ioaware.attention(*leaves, causal=True)
    out.backward(dout)
    _check_grads(tuple(x.grad for x in leaves), want, torch.float16)


# -- CPU: refusals and the registry --------------------------------------------------------------
class _Problem:
    """The attributes `supports` reads, without arrays."""

    def __init__(self, **kw):
        self.mask = self.bias = self.block_mask = self.cache_seqlens = None
        self.dropout_p = 0.0
        self.value_dim = None
        self.causal = False
        self.causal_alignment = "top_left"
        self.window_size = None
        self.seqlen_q = self.seqlen_k = 128
        self.head_dim = 64
        self.dtype = "torch.float16"
        self.__dict__.update(kw)


@pytest.mark.parametrize("change,word", [
    (dict(dropout_p=0.1), "dropout"), (dict(mask=True), "mask"), (dict(bias=True), "bias"),
    (dict(block_mask=True), "block_mask"), (dict(head_dim=96), "head_dim"),
    (dict(dtype="torch.float32"), "dtype"), (dict(value_dim=32), "value_dim"),
    (dict(causal=True, seqlen_q=10, causal_alignment="bottom_right"), "causal_alignment")])
def test_refusals_name_what_is_refused(change, word):
    assert word in bwd_mod.supports(_Problem(**change), KernelConfig())


@pytest.mark.parametrize("config,word", [(KernelConfig(block_q=64), "block_q")])
def test_refusals_of_configs(config, word):
    assert word in bwd_mod.supports(_Problem(), config)


@pytest.mark.parametrize("config,word", [
    (KernelConfig(backward_dq="atomic", dq_tile=(64, 64)), "dq_tile"),
    (KernelConfig(backward_dq="atomic", kv_tile=(64, 64)), "kv_tile"),
    (KernelConfig(backward_dq="atomic", kv_tile=(64, 128)), "kv_tile")])
def test_atomic_dq_refuses_what_it_cannot_share(config, word):
    """dQ by atomics: no dQ kernel to pin tiles of; key tiles of one consumer warpgroup, and 64
    queries a stage at d = 64 (each warpgroup's share would be 32 columns), refused by name;
    the default tiles taken."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float16) for _ in range(3))
    pb = kernel_problem(q, k, v)
    assert word in bwd_mod.supports(pb, config)
    assert bwd_mod.plan(pb, KernelConfig(backward_dq="atomic")).config["kv_tile"] == (128, 128)


def test_atomic_dq_plan_prices_five_products_and_the_adds():
    """dQ by atomics: the pre-pass, the dK/dV kernel with a fifth product per item and dQ's
    float32 additions, the conversion; 5/7 of the two-kernel plan's matmul FLOPs at equal tiles
    of the dK/dV kernel (whole tiles of both); dS^T's two buffers in the shared memory; the
    launcher's kernels and the plan's kernels the same."""
    from sim import Workload
    from sim.plans.wgmma_bwd import (WGMMA_BWD_KERNEL_NAMES, launch_of, wgmma_backward_plan,
                                     wgmma_bwd_smem_bytes)
    w = Workload(batch=2, heads=4, heads_kv=2, seq_len_q=512, head_dim=64, dtype="bf16",
                 pass_="bwd")
    by_kernel = wgmma_backward_plan(w, dq_tile=(128, 128), kv_tile=(128, 128), dq_mode="kernel")
    atomic = wgmma_backward_plan(w, kv_tile=(128, 128), dq_mode="atomic")
    names = [k.name for k in atomic.kernels]
    assert names == [WGMMA_BWD_KERNEL_NAMES[k] for k in ("pre", "dkdv", "convert")]
    flops = [sum(m.flops for k in p.kernels for m in k.matmuls) for p in (by_kernel, atomic)]
    assert flops[1] * 7 == flops[0] * 5
    dkdv = atomic.kernel(WGMMA_BWD_KERNEL_NAMES["dkdv"])
    adds = [a for a in dkdv.accesses if a.tensor == "dQ_acc"]
    # each of the 4 key tiles adds dQ of every query of every head: B H Nq d floats
    assert len(adds) == 1 and adds[0].op == "atomic" and adds[0].how == "tma"
    assert adds[0].bytes == 4 * (2 * 4 * 512 * 64) * 4
    assert launch_of(atomic, "dkdv")[2] == wgmma_bwd_smem_bytes("dkdv", 64, 128, 128,
                                                                dq_atomic=True)
    # two dS^T buffers (16-bit) and the dQ staging (float32, 128 queries x d)
    assert (wgmma_bwd_smem_bytes("dkdv", 64, 128, 128, dq_atomic=True)
            - wgmma_bwd_smem_bytes("dkdv", 64, 128, 128)) == 2 * 128 * 128 * 2 + 128 * 64 * 4
    assert (wgmma_bwd_smem_bytes("dkdv", 128, 128, 64, dq_atomic=True)
            - wgmma_bwd_smem_bytes("dkdv", 128, 128, 64)) == 2 * 128 * 64 * 2 + 64 * 128 * 4
    assert atomic.config["dq_tile"] is None and atomic.config["dq_mode"] == "atomic"
    with pytest.raises(ValueError, match="dq_tile"):
        wgmma_backward_plan(w, dq_tile=(64, 64), dq_mode="atomic")
    with pytest.raises(ValueError, match="dq_mode"):
        wgmma_backward_plan(w, dq_mode="atomics")


def _accumulator_pairs(columns):
    """Every float pair of a warpgroup's m64 x ``columns`` accumulator: ``(thread, warp, gid,
    tig, nb, j, hr, reg)``, the pair being registers ``reg`` and ``reg + 1`` of ``thread``."""
    for thread in range(128):
        warp, lane = divmod(thread, 32)
        gid, tig = divmod(lane, 4)
        for nb in range(columns // 64):
            for j in range(8):
                for hr in range(2):
                    yield thread, warp, gid, tig, nb, j, hr, 32 * nb + 4 * j + 2 * hr


def test_ds_words_land_where_the_mn_major_product_reads_them():
    """`kernels.wgmma_bwd.ds_word_offset`, where each consumer thread stores its dS^T words, is
    the MN-major layout the dQ product's A descriptor describes (`kernels.hopper.mnmajor_offset`,
    k = key row, n = query) for both elements of every word, every word of a buffer written
    once, and a warp's 32 stores of one word position fall in 32 distinct banks."""
    from kernels.hopper import mnmajor_offset, wgmma_d_elem
    rows, cols = 128, 128
    seen = set()
    for wg in range(rows // 64):
        for thread, warp, gid, tig, nb, j, hr, r in _accumulator_pairs(cols):
            off = bwd_mod.ds_word_offset(nb, j, hr, wg, warp, gid, tig, rows)
            for e in range(2):
                key, query = wgmma_d_elem(thread, r + e, n=cols)
                assert off + 2 * e == mnmajor_offset(64 * wg + key, query, "128B", rows)
            seen.add(off)
    assert seen == set(range(0, rows * cols * 2, 4))
    for nb, j, hr in ((0, 0, 0), (1, 5, 1)):
        banks = {bwd_mod.ds_word_offset(nb, j, hr, 0, 1, lane // 4, lane % 4, rows) // 4 % 32
                 for lane in range(32)}
        assert len(banks) == 32


@pytest.mark.parametrize("columns", [64, 128])
def test_dq_staging_is_the_box_layout_tma_reads(columns):
    """`kernels.wgmma_bwd.dq_stage_offset`, where each consumer thread stores its float pairs
    of dQ, is the 128-byte swizzled layout of boxes of 64 rows x 32 float32 columns one after
    another (`kernels.hopper.swizzle_offset`), every float of the share once; a warp's 8-byte
    stores of one position use each bank at most twice (two wavefronts, the least for 256
    bytes)."""
    from kernels.hopper import swizzle_offset, wgmma_d_elem
    seen = set()
    for thread, warp, gid, tig, nb, j, hr, r in _accumulator_pairs(columns):
        off = bwd_mod.dq_stage_offset(nb, j, hr, warp, gid, tig)
        row, col = wgmma_d_elem(thread, r, n=columns)
        assert off == (col // 32) * 64 * 128 + swizzle_offset(row * 128 + 4 * (col % 32), "128B")
        seen.update((off, off + 4))
    assert seen == set(range(0, 64 * columns * 4, 4))
    for nb, j, hr in ((0, 0, 0), (0, 6, 1)):
        words = [bwd_mod.dq_stage_offset(nb, j, hr, 2, lane // 4, lane % 4) // 4
                 for lane in range(32)]
        banks = [w % 32 for w in words] + [(w + 1) % 32 for w in words]
        assert max(banks.count(b) for b in set(banks)) == 2


def test_pinned_tiles_are_checked_and_never_dropped():
    """``KernelConfig.dq_tile`` / ``kv_tile``: pairs of positive ints, refused by name
    otherwise; tiles the plan does not take are the wgmma backward's refusal; a backward that
    pins them runs on the wgmma backward or raises, never on a family that would ignore them."""
    np = pytest.importorskip("numpy")
    assert KernelConfig(dq_tile=[128, 64]).dq_tile == (128, 64)
    for bad in ((64,), (64, 0), (64.0, 64), (True, 64), "64x64"):
        with pytest.raises(ValueError, match="kv_tile"):
            KernelConfig(kv_tile=bad)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 100, 64)).astype(np.float16) for _ in range(3))
    pb = kernel_problem(q, k, v)
    assert "dq_tile" in bwd_mod.supports(pb, KernelConfig(dq_tile=(32, 64)))
    assert "kv_tile" in bwd_mod.supports(pb, KernelConfig(kv_tile=(64, 256)))
    legal = KernelConfig(dq_tile=(128, 64), kv_tile=(64, 64))
    assert bwd_mod.plan(pb, legal).config["dq_tile"] == (128, 64)
    assert bwd_mod.plan(pb, legal).config["kv_tile"] == (64, 64)
    for family in ("mma", "simt"):
        with pytest.raises(ValueError, match="dq_tile"):
            kernels.family_for(pb, KernelConfig(family=family, dq_tile=(128, 64)), "bwd")
    # a forward has no backward tiles to drop: the same config runs its forward
    assert kernels.family_for(pb, KernelConfig(family="simt", dq_tile=(128, 64)), "fwd") == "simt"
    from kernels import host
    if not (host.real_gpu() and host.compute_capability(host.current_device_id()) >= (9, 0)):
        with pytest.raises(ValueError, match="pin its tiles"):    # no silent fallback
            kernels.family_for(pb, legal, "bwd")
        assert kernels.family_for(pb, None, "bwd") != "wgmma"


def compile_wgmma_bwd(outdir) -> dict:
    """The default-tile dQ and dK/dV kernels at d = 64, the d = 128 default dK/dV kernel (64
    queries a stage) and the kernels of `WGMMA_BWD_SERIALISED` (float16, not causal) compiled
    for sm_90a into ``outdir/<name>.ptx`` (run in a process without the CUDA simulator);
    returns {name: (kind, d, rows, cols)}."""
    from numba import cuda

    from benchmarks.common import allow_offline_compile
    from sim.plans.wgmma_bwd import wgmma_bwd_default_tiles
    allow_offline_compile()
    i16 = "int16[:, :, :, ::1]"
    sig = (f"void(uint64[:, ::1], {i16}, {i16}, float32[:, :, ::1], float32[:, :, ::1], {i16}, "
           f"{i16}, uint64[:, ::1], int32[:, ::1], int32[::1], int64, int64, int64, "
           f"int64, int64, float32, float32, int64, int64)")
    from sim.plans.wgmma_bwd import WGMMA_BWD_SERIALISED
    t64, t128 = wgmma_bwd_default_tiles(64), wgmma_bwd_default_tiles(128)
    shapes = {"dq": ("dq", 64, *t64["dq"]), "dkdv": ("dkdv", 64, *t64["dkdv"][::-1]),
              "dkdv_d128": ("dkdv", 128, *t128["dkdv"][::-1]),     # (kind, d, rows, cols)
              "dkdv_atomic": ("dkdv", 64, *t64["dkdv"][::-1], True)}     # ... dQ by atomics
    shapes.update({"serialised_" + "_".join(map(str, key)): key for key in WGMMA_BWD_SERIALISED})
    for name, (kind, d, rows, cols, *atomic) in shapes.items():
        kern = bwd_mod._build_kernel(kind, d, rows, cols, False, False, 1, False, bool(atomic))
        text, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0, "a"),
                                   launch_bounds=(kern.threads, 1))
        (Path(outdir) / f"{name}.ptx").write_text(text)
    return {k: list(v) for k, v in shapes.items()}


def test_waits_per_tile_are_the_kernels_own(tmp_path):
    """The plan's `WGMMA_BWD_WAITS_PER_TILE` (its "wait" level) is what each kernel's tile loop
    issues per tile (the dK/dV kernel waits for its last two products' commit groups at once;
    CPU: NVVM, ptxas, with no ``wgmma`` serialised), and the plan counts them per consumer
    warpgroup and visited tile."""
    from sim import Workload
    from sim.plans.wgmma_bwd import (wgmma_backward_plan, wgmma_bwd_ds_under_dv,
                                     wgmma_bwd_waits_per_tile)
    from .helpers import assemble_sm90a, compile_sm90a_in_child, run_ptxas_sm90a
    ptxas, shapes = compile_sm90a_in_child("tests.test_wgmma_bwd", "compile_wgmma_bwd", tmp_path)
    # both dK/dV tile loops: dS^T under dV's product (64 queries a stage) and back to back (128)
    assert {wgmma_bwd_ds_under_dv(shapes[n][3]) for n in ("dkdv", "dkdv_d128")} == {True, False}
    products = {"dq": 3, "dkdv": 4}          # one commit group per product of a tile
    for name in [n for n in shapes if n.startswith("serialised_")]:
        # the tuning space leaves these out: ptxas serialises their products (C7512)
        r = run_ptxas_sm90a(ptxas, tmp_path / f"{name}.ptx")
        assert r.returncode == 0 and "C7512" in r.stderr, name
        del shapes[name]
    for name, (kind, _d, _rows, cols, *atomic) in shapes.items():
        path = tmp_path / f"{name}.ptx"
        text = path.read_text()
        assert text.count("wgmma.wait_group.sync.aligned") == wgmma_bwd_waits_per_tile(kind, cols), name
        # dQ by atomics: a fifth product (both operands MN-major), in the same last wait, and
        # its TMA reductions into the accumulator (two boxes of 32 columns at d = 64)
        assert text.count("wgmma.commit_group.sync.aligned") == products[kind] + len(atomic), name
        assert text.count("cp.reduce.async.bulk.tensor") == 2 * len(atomic), name
        assert ("p, 1, 1, 1, 1;" in text) == bool(atomic), name
        assemble_sm90a(ptxas, path)
    w = Workload(batch=2, heads=4, heads_kv=2, seq_len_q=300, head_dim=64, dtype="fp16",
                 pass_="bwd")
    dq, kv = wgmma_backward_plan(w, dq_tile=(128, 64), kv_tile=(64, 128)).kernels
    # dQ: 2 x 4 slices x 3 Q tiles x 5 K tiles, two consumer warpgroups; dK/dV: 2 x 2 slices x
    # 3 key tiles x 2 query heads x 5 query tiles, two consumer warpgroups
    assert (dq.group_waits, dq.waiters_per_program) == (8 * 3 * 5 * 2 * 3, 2)
    assert (kv.group_waits, kv.waiters_per_program) == (4 * 3 * 2 * 5 * 2 * 4, 2)
    # 128 queries a stage: 3 Q tiles, three waits a tile
    kv = wgmma_backward_plan(w, dq_tile=(128, 64), kv_tile=(128, 128)).kernels[1]
    assert (kv.group_waits, kv.waiters_per_program) == (4 * 3 * 2 * 3 * 2 * 3, 2)


def test_the_wait_level_prices_the_measured_latency():
    """Without a measured wait latency the "wait" level is 0 (the plan's time unchanged); with
    one, each kernel's chain grows by its waits x latency / (SMs x waiters), divided by the
    resident programs like the rest of the chain."""
    from sim import Workload, load_profile
    from sim.plan import price
    from sim.plans import plan_for
    w = Workload(batch=4, heads=16, seq_len_q=2048, head_dim=64, dtype="bf16", causal=True,
                 pass_="bwd")
    plan = plan_for("wgmma", "bwd", w)
    base = price(plan, "h200")
    assert all(k.level_s["wait"] == 0 for k in base.kernels)
    latency = 300e-9
    rates = {"schema": "ioaware.rates/1", "provenance": {"gpu": "NVIDIA H200"},
             "rates": {"wgmma_wait_latency_s": {"value": latency, "unit": "s"}}}
    prof = load_profile("h200", rates=rates)
    timed = price(plan, prof)
    assert timed.rate_sources["wgmma_wait_s"] == "measured"
    for k, kb, kt in zip(plan.kernels, base.kernels, timed.kernels):
        want = k.group_waits * latency / (prof.num_sms * k.waiters_per_program)
        assert kt.level_s["wait"] == pytest.approx(want / kt.wave_utilisation)
        assert kt.time_s > kb.time_s


def test_registry_tries_the_hopper_backward_first():
    assert kernels.FIRST_BACKWARDS == {"wgmma": bwd_mod}
    assert bwd_mod.TAKES_WINDOW


def test_cpu_falls_back_with_a_reason():
    """Without a GPU (the CI machine, the simulator) the wgmma backward refuses, saying why, and
    the registry picks another family; pinning it raises with that reason."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 8, 64)).astype(np.float16) for _ in range(3))
    pb = kernel_problem(q, k, v)
    from kernels import host
    if host.real_gpu() and host.compute_capability(host.current_device_id()) >= (9, 0):
        pytest.skip("a Hopper GPU is here")
    assert bwd_mod.supports(pb, KernelConfig()) is not None
    assert kernels.family_for(pb, None, "bwd") != "wgmma"
    with pytest.raises(ValueError, match="wgmma"):
        kernels.family_for(pb, WGMMA, "bwd")


@pytest.mark.parametrize("n_blocks,causal,window,keys_are_rows,rows_inner", [
    (1, True, False, False, False), (2, True, False, True, True), (1, False, True, True, True),
    (2, False, True, False, True), (1, False, False, True, False)])
def test_wgmma_tile_mask_marks_what_the_rule_marks(n_blocks, causal, window, keys_are_rows,
                                                  rows_inner):
    """`kernels.mask.wgmma_tile_mask` (the Hopper forward's and backward's masks) on a
    warpgroup's accumulator tile, through the thread -> (row, column) map of the ``wgmma``
    accumulator: -inf exactly where the key is past the end, above the diagonal or outside the
    band, rows as queries or (``keys_are_rows``) as keys, in either loop order (under the CUDA
    simulator on a CPU)."""
    import numpy as np
    from numba import float32

    from kernels.mask import wgmma_tile_mask
    mask_tile = wgmma_tile_mask(n_blocks, causal, window, keys_are_rows, rows_inner)
    S_REGS = 32 * n_blocks
    row_first, col0, n_k, lo, hi = 64, 40, 120, -30, 5

    @cuda.jit
    def run(out):
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        gid, tig = lane // 4, lane % 4
        row_a = row_first + 16 * warp + gid
        s_reg = cuda.local.array(S_REGS, dtype=float32)
        for r in range(S_REGS):
            s_reg[r] = float32(1.0)
        mask_tile(s_reg, row_a, tig, col0, n_k, lo, hi)
        for nb in range(n_blocks):
            for j in range(8):
                for hr in range(2):
                    for e in range(2):
                        out[row_a - row_first + 8 * hr, 64 * nb + 8 * j + 2 * tig + e] = \
                            s_reg[32 * nb + 4 * j + 2 * hr + e]

    out = np.zeros((64, 64 * n_blocks), np.float32)
    run[1, 128](out)
    rows = row_first + np.arange(64)[:, None]
    cols = col0 + np.arange(64 * n_blocks)[None, :]
    key, query = (rows, cols) if keys_are_rows else (cols, rows)
    bad = np.broadcast_to(key >= n_k, out.shape).copy()
    if causal:
        bad |= key > query
    if window:
        bad |= (key - query < lo) | (key - query > hi)
    assert bad.any() and (~bad).any()
    assert np.array_equal(out == -np.inf, bad) and (out[~bad] == 1.0).all()
