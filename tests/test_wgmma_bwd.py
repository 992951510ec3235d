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
@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_float64(dtype_name, head_dim, causal):
    torch = _hopper()
    dtype = getattr(torch, dtype_name)
    q, k, v, dout = _inputs((2, 3, 333, head_dim), (2, 3, 333, head_dim), dtype, seed=11)
    _run_and_check(q, k, v, dout, causal=causal)


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("nq,nk,causal", [(200, 77, False), (77, 300, False), (300, 130, True),
                                          (129, 1000, True), (1, 64, False)])
def test_gqa_and_unequal_lengths(head_dim, nq, nk, causal):
    """GQA 6/2, Nq != Nk (top-left causal), lengths that are not multiples of the tiles."""
    torch = _hopper()
    q, k, v, dout = _inputs((2, 6, nq, head_dim), (2, 2, nk, head_dim), torch.float16, seed=nq)
    _run_and_check(q, k, v, dout, causal=causal)


@gpu
@pytest.mark.parametrize("window_size,causal", [((32, 0), True), ((100, 17), False),
                                                ((0, 0), False), ((-1, 40), False)])
def test_sliding_window(window_size, causal):
    """Windows with partial tiles, a window of 0 (one key a row) and one side unbounded; with
    Nq > Nk some rows see no key (their gradient is zero)."""
    torch = _hopper()
    for nq, nk in ((257, 257), (300, 190)):
        if causal and nq != nk:
            continue
        q, k, v, dout = _inputs((1, 4, nq, 128), (1, 2, nk, 128), torch.bfloat16, seed=nk)
        _run_and_check(q, k, v, dout, causal=causal, window_size=window_size)


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


@pytest.mark.parametrize("config,word", [(KernelConfig(block_q=64), "block_q"),
                                         (KernelConfig(backward_dq="atomic"), "backward_dq")])
def test_refusals_of_configs(config, word):
    assert word in bwd_mod.supports(_Problem(), config)


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
           f"{i16}, int32[:, ::1], int32[::1], int64, int64, int64, int64, int64, float32, "
           f"float32, int64, int64)")
    from sim.plans.wgmma_bwd import WGMMA_BWD_SERIALISED
    t64, t128 = wgmma_bwd_default_tiles(64), wgmma_bwd_default_tiles(128)
    shapes = {"dq": ("dq", 64, *t64["dq"]), "dkdv": ("dkdv", 64, *t64["dkdv"][::-1]),
              "dkdv_d128": ("dkdv", 128, *t128["dkdv"][::-1])}     # (kind, d, rows, cols)
    shapes.update({"serialised_" + "_".join(map(str, key)): key for key in WGMMA_BWD_SERIALISED})
    for name, (kind, d, rows, cols) in shapes.items():
        kern = bwd_mod._build_kernel(kind, d, rows, cols, False, False, 1, False)
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
    for name, (kind, _d, _rows, cols) in shapes.items():
        path = tmp_path / f"{name}.ptx"
        text = path.read_text()
        assert text.count("wgmma.wait_group.sync.aligned") == wgmma_bwd_waits_per_tile(kind, cols), name
        assert text.count("wgmma.commit_group.sync.aligned") == products[kind], name
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
