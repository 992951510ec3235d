"""The host side of the tensor-core families, on the CPU: the dropout constants (`kernels.dropout`)
against `ioaware.dropout`'s own hash, finished on the device by the kernels' hash chain (under
Numba's CUDA simulator); the boolean mask on the device with its broadcast flags
(`kernels.host.Call.mask`); device constants and the kernels' CSR schedules on the device
(`kernels.host.device_const`, `kernels.tile_scheduler.device_schedule`); which problems the
tensor-core families refuse and why (`supports`, `kernels.family_for`; a sliding window among
them), with `ioaware` refusing invalid problems before any kernel is reached; and the SASS loop
scan of `benchmarks.check`."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numba import cuda   # a global, which the CUDA simulator replaces inside kernels

import kernels
from ioaware.block_info import BlockInfo
from ioaware.dropout import fmix32, keep_mask
from kernels import KernelConfig, host, mma_bwd, mma_fwd, tf32_bwd, tf32_fwd, tile_scheduler
from kernels.dropout import DropoutConstants, dropout_constants, fmix_device

from .helpers import default_half_forward, kernel_problem


@pytest.mark.parametrize("seed,p", [(0, 0.1), (3, 0.25), (2**40 + 7, 0.5), (5, 0.0)])
def test_dropout_constants_regenerate_the_keep_mask(seed, p):
    consts = dropout_constants(seed, p)
    assert isinstance(consts, DropoutConstants)
    has_dropout, seed_hash, threshold, inv_keep = consts
    assert has_dropout == (p > 0) and inv_keep == pytest.approx(1 / (1 - p))
    if not has_dropout:
        assert threshold == 0
        return
    bh, rows, cols = 3, np.arange(40)[:, None], np.arange(50)[None, :]
    # what the kernels compute from the constants: three more fmix32 rounds, then >= threshold
    h = fmix32(fmix32(fmix32(np.uint32(seed_hash) ^ np.uint32(bh)) ^ rows.astype(np.uint32))
               ^ cols.astype(np.uint32))
    np.testing.assert_array_equal(h >= np.uint32(threshold), keep_mask(seed, p, bh, rows, cols))


def test_tensor_core_hash_chain_on_the_device_is_the_keep_mask():
    """The tensor-core kernels' chain, ``fmix(fmix(fmix(seed_hash ^ bh) ^ row) ^ col) >=
    threshold`` with `fmix_device`, run as a kernel (under the simulator on a CPU)."""
    from numba import uint64
    fmix = fmix_device()

    @cuda.jit
    def keep_bits(seed_hash, threshold, bh, out):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            h_row = fmix(fmix(uint64(seed_hash) ^ uint64(bh)) ^ uint64(i))
            out[i, j] = fmix(h_row ^ uint64(j)) >= uint64(threshold)

    for seed, p, bh in ((3, 0.25, 5), (2**40 + 7, 0.5, 0), (11, 0.9, 17)):
        c = dropout_constants(seed, p)
        out = np.zeros((20, 30), np.uint8)
        keep_bits[(3, 4), (8, 8)](c.seed_hash, c.threshold, bh, out)
        want = keep_mask(seed, p, bh, np.arange(20)[:, None], np.arange(30)[None, :])
        np.testing.assert_array_equal(out.astype(bool), want)


def _problem(mask=None, b=2, h=4, n_q=5, n_k=7, d=64, dtype=np.float16, **kw):
    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
    return kernel_problem(z(b, h, n_q, d), z(b, h, n_k, d), z(b, h, n_k, d), mask=mask, **kw)


def test_mask_on_device_broadcast_flags_and_values():
    mask = np.random.default_rng(0).random((2, 1, 5, 7)) < 0.5
    maskd, mb, mh, mq = host.Call(_problem(mask)).mask()
    assert (mb, mh, mq) == (1, 0, 1)
    np.testing.assert_array_equal(maskd.copy_to_host(), mask.astype(np.uint8))
    key_pad = mask[:, :, :1]                       # [B, 1, 1, Nk]: a key-padding mask
    maskd, *flags = host.Call(_problem(key_pad)).mask()
    assert flags == [1, 0, 0]
    np.testing.assert_array_equal(maskd.copy_to_host(), key_pad.astype(np.uint8))
    per_head = np.random.default_rng(1).random((4, 5, 7)) < 0.5     # [H, Nq, Nk]
    maskd, *flags = host.Call(_problem(per_head)).mask()
    assert flags == [0, 1, 1]
    np.testing.assert_array_equal(maskd.copy_to_host(), per_head[None].astype(np.uint8))
    dummy, *flags = host.Call(_problem()).mask()
    assert flags == [0, 0, 0] and dummy.copy_to_host().shape == (1, 1, 1, 1)


def test_bad_masks_are_refused_before_the_kernels():
    mask = np.ones((2, 1, 5, 7), bool)
    with pytest.raises(ValueError, match="does not broadcast"):
        _problem(mask[..., :6])
    with pytest.raises(TypeError, match="mask must be boolean"):
        _problem(mask.astype(np.uint8))


def test_device_const_builds_once_per_key():
    calls = []

    def make():
        calls.append(1)
        return np.arange(6, dtype=np.int32), 7

    key = ("test_tc_host", "device_const")
    arr, seven = host.device_const(key, make)
    again = host.device_const(key, make)
    assert len(calls) == 1 and again[0] is arr and seven == 7
    np.testing.assert_array_equal(arr.copy_to_host(), np.arange(6))
    one = host.device_const(key + ("array",), lambda: np.ones(3, np.float32))
    np.testing.assert_array_equal(one.copy_to_host(), np.ones(3, np.float32))


@pytest.mark.parametrize("causal", [False, True])
def test_device_schedules_are_the_kernels_csr_schedules(causal):
    """`tile_scheduler.device_schedule` (a problem's schedule on the device, under the simulator
    here) holds `csr_schedule`'s arrays, at the dQ and the dK/dV kernels' tiles, with and
    without a block mask; it is built once per configuration."""
    rng = np.random.default_rng(1)
    block_mask = rng.random((1, 2, 3, 4)) > 0.3
    for bm in (None, block_mask):
        pb = _problem(b=1, h=2, n_q=150, n_k=120, causal=causal, block_mask=bm, block_q=64,
                      block_k=32)
        for which, tile_q, tile_k in (("kv", 64, 32), ("q", 16, 32), ("kv", 32, 16)):
            got = tile_scheduler.device_schedule(pb, tile_q, tile_k, which)
            want = tile_scheduler.csr_schedule(150, 120, tile_q, tile_k, causal, which, bm,
                                               None if bm is None else (64, 32))
            assert np.array_equal(got[0].copy_to_host(), want[0])
            assert np.array_equal(got[1].copy_to_host(), want[1])
            assert got[2:] == want[2:]
            assert tile_scheduler.device_schedule(pb, tile_q, tile_k, which)[0] is got[0]


def test_device_schedules_carry_the_window():
    """The window is part of the schedule's cache key: problems that differ only in it get
    their own schedules (BlockInfo's, tiles outside the band left out), on the device."""
    plain = _problem(b=1, h=1, n_q=96, n_k=96, dtype=np.float32)
    schedules = {}
    for window in (None, (16, 0), (0, 16), (16, 16)):
        pb = dataclasses.replace(plain, window_size=window)
        for which in ("kv", "q"):
            offs, idx, *_ = tile_scheduler.device_schedule(pb, 16, 16, which)
            info = BlockInfo(96, 96, 16, 16, window_size=window)
            want = info.kv_schedule() if which == "kv" else info.q_schedule()
            assert np.array_equal(offs.copy_to_host()[0], want[0])
            assert np.array_equal(idx.copy_to_host(), want[1])
            schedules.setdefault(which, set()).add(str(idx.copy_to_host().tolist()))
    assert all(len(v) == 4 for v in schedules.values())          # four windows, four schedules
    # bottom-right causal with a window and Nq != Nk: the schedule is the band's
    pb = _problem(b=1, h=1, n_q=20, n_k=96, dtype=np.float32, causal="bottom_right",
                  window_size=(10, 0))
    offs, idx, *_ = tile_scheduler.device_schedule(pb, 16, 16, "kv")
    assert idx.copy_to_host().tolist() == [4, 5, 5]      # rows 0-15 see keys 66-91, 16-19 82-95


# -- which problems the tensor-core families take ------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_ioaware_refuses_bad_problems_before_the_kernels(monkeypatch, dtype, pass_):
    """Validation happens once, in `ioaware`: the numba backend refuses an invalid problem
    before `kernels.forward` / `kernels.backward` is reached."""
    import ioaware

    def unreachable(*args, **kwargs):
        raise AssertionError("an invalid problem reached the kernels")

    monkeypatch.setattr(kernels, "forward", unreachable)
    monkeypatch.setattr(kernels, "backward", unreachable)
    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731

    def call(q, k, v, **kw):
        if pass_ == "fwd":
            return ioaware.attention(q, k, v, backend="numba", **kw)
        out = kw.pop("out", np.zeros_like(q))
        lse = kw.pop("lse", np.zeros(q.shape[:-1], np.float32))
        dout = kw.pop("dout", np.zeros_like(q))
        return ioaware.attention_backward(q, k, v, out, lse, dout, backend="numba", **kw)

    q, kv = z(1, 4, 8, 64), z(1, 2, 8, 64)
    with pytest.raises(ValueError, match="same number of keys|sequence length|shape"):
        call(q, kv, z(1, 2, 9, 64))
    with pytest.raises(ValueError, match="backend 'numba' needs them equal"):
        call(q, kv, z(1, 2, 8, 32))                     # Ev != E
    with pytest.raises(ValueError, match="multiple of the number of key/value heads"):
        call(z(1, 3, 8, 64), kv, kv)
    with pytest.raises(ValueError, match="same head dimension"):
        call(z(1, 4, 8, 80), kv, kv)
    with pytest.raises(ValueError, match="scale must be finite"):
        call(q, kv, kv, scale=float("inf"))
    with pytest.raises(ValueError, match="dropout_p"):
        call(q, kv, kv, dropout_p=1.5, seed=0)
    with pytest.raises(TypeError):
        call(q, kv, kv.tolist())
    with pytest.raises(ValueError, match="block_mask needs its block shape"):
        call(q, kv, kv, block_mask=np.ones((1, 1, 1, 1), bool))
    if pass_ == "bwd":
        with pytest.raises(ValueError, match="lse must have shape"):
            call(q, kv, kv, lse=np.zeros((1, 4, 9), np.float32))
        with pytest.raises(ValueError, match="dout must have shape"):
            call(q, kv, kv, dout=z(1, 4, 8, 32))


@pytest.fixture
def as_if_on_gpu(monkeypatch):
    """Pretend a GPU of compute capability 9.0 is present, so that the tensor-core families'
    `supports` reaches its checks of the problem on the CPU (nothing here launches)."""
    monkeypatch.setattr(host, "real_gpu", lambda: True)
    monkeypatch.setattr(host, "compute_capability", lambda device_id=0: (9, 0))
    monkeypatch.setattr(host, "current_device_id", lambda: 0)


#: family name -> (its forward and backward modules, the dtype it takes, one it does not)
TC_FAMILIES = {"mma": (mma_fwd, mma_bwd, np.float16, np.float32),
               "tf32": (tf32_fwd, tf32_bwd, np.float32, np.float16)}


@pytest.mark.parametrize("family", ["mma", "tf32"])
def test_tensor_core_families_take_their_problems(as_if_on_gpu, family):
    fwd, bwd, dtype, _ = TC_FAMILIES[family]
    for d in (64, 128):
        for causal in (False, True):
            pb = _problem(b=2, h=4, n_q=200, n_k=333, d=d, dtype=dtype, causal=causal)
            assert fwd.supports(pb, KernelConfig()) is None
            assert bwd.supports(pb, KernelConfig()) is None
            # on compute capability 9.0 the wgmma forward and backward come first for half
            # precision
            forward = "wgmma" if family == "mma" else family
            assert kernels.family_for(pb) == forward
            assert kernels.family_for(pb, None, "bwd") == forward
            for order in ("tiles", "heads", 4):
                assert kernels.family_for(pb, KernelConfig(launch_order=order)) == forward


@pytest.mark.parametrize("family", ["mma", "tf32"])
def test_tensor_core_families_say_why_they_refuse(as_if_on_gpu, family):
    fwd, bwd, dtype, other = TC_FAMILIES[family]
    forced = KernelConfig(family=family)

    def refused(pb, match, config=KernelConfig(), passes=("fwd", "bwd")):
        """Each pass of the family refuses ``pb`` with a reason matching ``match``; forcing
        the family raises that reason; the registry runs another family."""
        for pass_ in passes:
            mod = fwd if pass_ == "fwd" else bwd
            why = mod.supports(pb, config)
            assert why is not None and match in why, (pass_, why)
            with pytest.raises(ValueError, match=match):
                kernels.family_for(pb, dataclasses.replace(config, family=family), pass_)
            try:
                assert kernels.family_for(pb, config, pass_) != family
            except ValueError:          # no family runs it (e.g. a forced launch order)
                pass

    refused(_problem(d=96, dtype=dtype), "head_dim")
    refused(_problem(d=32, dtype=dtype), "head_dim")
    refused(_problem(dtype=other), "inputs, got")
    # the tensor-core backwards choose their own tiles
    refused(_problem(dtype=dtype), "chooses its own tiles", KernelConfig(block_q=64),
            passes=("bwd",))
    # block-mask tiles the tensor-core backwards cannot tile (not multiples of 16)
    refused(_problem(n_q=64, n_k=64, dtype=dtype, block_mask=np.ones((1, 1, 8, 8), bool),
                     block_q=8, block_k=8), "multiples of 16", passes=("bwd",))
    # forward tiles it is not built for
    refused(_problem(d=128, dtype=dtype), "block_k", KernelConfig(block_k=8), passes=("fwd",))
    refused(_problem(d=64, dtype=dtype, n_q=96, n_k=64,
                     block_mask=np.ones((1, 1, 2, 1), bool), block_q=48, block_k=64),
            "block_q", passes=("fwd",))
    # the mask's tiles at the backward's tiling: 48 = 3 x 16 is fine there
    pb = _problem(d=64, dtype=dtype, n_q=96, n_k=64, block_mask=np.ones((1, 1, 2, 1), bool),
                  block_q=48, block_k=64)
    assert bwd.supports(pb, KernelConfig()) is None
    assert kernels.family_for(pb, forced, "bwd") == family
    if family == "tf32":
        # tiles whose copy assignment the split layout cannot use
        assert not tf32_fwd.presplit_ok(128, 32, 16)
        refused(_problem(d=128, dtype=dtype), "presplit_ok",
                KernelConfig(block_q=32, block_k=16), passes=("fwd",))


@pytest.mark.parametrize("family", ["mma", "tf32"])
def test_tensor_core_families_take_a_window(as_if_on_gpu, family):
    """On a (faked) sm_90 the problem they would take, with a sliding window: both passes take
    it, bottom-right causal with Nq != Nk included (the band holds the causal rule)."""
    fwd, bwd, dtype, _ = TC_FAMILIES[family]
    # a half-precision forward goes to the Hopper forward first, which takes the window too
    forward_family = default_half_forward() if family == "mma" else family
    for causal in (False, True):
        pb = _problem(n_q=64, n_k=64, dtype=dtype, causal=causal, window_size=(16, 0))
        assert fwd.supports(pb, KernelConfig()) is None and bwd.supports(pb, KernelConfig()) is None
        assert kernels.family_for(pb) == forward_family
        assert kernels.family_for(pb, None, "bwd") == forward_family   # (wgmma's on Hopper)
    pb = _problem(n_q=5, n_k=70, dtype=dtype, causal="bottom_right", window_size=(8, -1))
    assert kernels.family_for(pb) == forward_family
    assert kernels.family_for(pb, None, "bwd") == forward_family


def test_the_registry_refuses_a_window_to_a_module_that_does_not_declare_it(as_if_on_gpu,
                                                                           monkeypatch):
    """Even a module whose `supports` takes a windowed problem is refused it unless it declares
    ``TAKES_WINDOW``: a kernel that has not learnt the window cannot run one."""
    pb = _problem(n_q=64, n_k=64, dtype=np.float16, window_size=(4, 4))
    monkeypatch.setattr(kernels.wgmma_fwd, "TAKES_WINDOW", False)
    monkeypatch.setattr(kernels.wgmma_bwd, "TAKES_WINDOW", False)
    for mod, pass_ in ((mma_fwd, "fwd"), (mma_bwd, "bwd")):
        monkeypatch.setattr(mod, "TAKES_WINDOW", False)
        assert kernels.family_for(pb, None, pass_) == "simt"
        with pytest.raises(ValueError, match="window_size=\\(4, 4\\): this family's kernels have "
                                             "no sliding window"):
            kernels.family_for(pb, KernelConfig(family="mma"), pass_)
    assert kernels.family_for(_problem(n_q=64, n_k=64, dtype=np.float16)) == default_half_forward()


def test_direct_callers_get_windows_the_kernels_cannot_align_refused():
    """`kernels.family_for` guards callers that bypass `ioaware`: bottom-right causal with
    Nq != Nk needs a window (the simt band), a window needs the bottom-right alignment."""
    q, k = np.zeros((1, 1, 5, 8), np.float32), np.zeros((1, 1, 9, 8), np.float32)
    pb = kernel_problem(q, k, k, causal="bottom_right")
    with pytest.raises(ValueError, match="bottom-right causal alignment"):
        kernels.family_for(pb)
    assert kernels.family_for(dataclasses.replace(pb, window_size=(-1, 0))) == "simt"
    top_left = dataclasses.replace(pb, causal_alignment="top_left", window_size=(2, 0))
    with pytest.raises(ValueError, match="window_size with top-left causal alignment"):
        kernels.family_for(top_left)


@pytest.mark.parametrize("family", ["mma", "tf32"])
def test_tensor_core_families_need_compute_capability_8(as_if_on_gpu, monkeypatch, family):
    fwd, bwd, dtype, _ = TC_FAMILIES[family]
    monkeypatch.setattr(host, "compute_capability", lambda device_id=0: (7, 5))
    pb = _problem(dtype=dtype)
    for mod in (fwd, bwd):
        assert "compute capability 8.0" in mod.supports(pb, KernelConfig())
    assert kernels.family_for(pb) == "simt" and kernels.family_for(pb, None, "bwd") == "simt"


@pytest.mark.parametrize("family", ["mma", "tf32"])
def test_tensor_core_families_take_nothing_under_the_simulator(family):
    if not host.simulator():
        pytest.skip("a real GPU runs the kernels")
    fwd, bwd, dtype, _ = TC_FAMILIES[family]
    pb = _problem(dtype=dtype)
    for mod, pass_ in ((fwd, "fwd"), (bwd, "bwd")):
        assert "real CUDA GPU" in mod.supports(pb, KernelConfig())
        assert kernels.family_for(pb, None, pass_) == "simt"
        with pytest.raises(ValueError, match="real CUDA GPU"):
            kernels.family_for(pb, KernelConfig(family=family), pass_)


# -- benchmarks.check ----------------------------------------------------------------------------
def test_local_memory_inside_loops_of_a_sass_listing():
    """`benchmarks.check.local_in_loops` counts LDL/STL between a label and a later branch back
    to it, and not those before the loop or after a forward branch."""
    local_in_loops = pytest.importorskip("benchmarks.check").local_in_loops
    sass = "\n".join([
        "        /*0000*/   STL [R1], R2 ;",            # before any loop
        ".L_x_1:",
        "        /*0010*/   LDL R3, [R1] ;",            # inside loop 1
        "        /*0020*/   HMMA.16816.F32 R4, R8, R10, R4 ;",
        "        /*0030*/   @P0 BRA `(.L_x_1) ;",       # back edge of loop 1
        "        /*0040*/   BRA `(.L_x_2) ;",           # forward branch: no loop
        "        /*0050*/   STL [R1+0x4], R5 ;",
        ".L_x_2:",
        "        /*0060*/   LDL.LU R6, [R1+0x4] ;",
        "        /*0070*/   EXIT ;",
    ])
    assert local_in_loops(sass) == 1
    # a back edge at the end makes everything after .L_x_1 one loop
    assert local_in_loops(sass.replace("EXIT ;", "BRA `(.L_x_1) ;")) == 3


def test_sass_opcodes_of_a_listing():
    """`benchmarks.check.sass_opcodes`: the opcode of each instruction line, predicated or not,
    without modifiers; NOPs and the encoding lines are not instructions."""
    check = pytest.importorskip("benchmarks.check")
    sass = "\n".join([
        "        /*0170*/                   VIADD R7, R4.reuse, 0x1000 ;   /* 0x0000100004077836 */",
        "                                                                  /* 0x044fe20000000000 */",
        "        /*0180*/                   FSETP.GEU.AND P0, PT, |R4|, +INF , PT ;",
        "        /*01f0*/              @!P0 IMAD.IADD.U32 R0, R0, 0x1, R13 ;",
        "        /*0200*/               @P1 LOP3.LUT R7, R7, 0xffffe000, RZ, 0xc0, !PT ;",
        "        /*0210*/                   LOP3.LUT R0, R0, 0xffffe000, RZ, 0xc0, !PT ;",
        "        /*0220*/                   HMMA.1688.F32.TF32 R4, R8, R10, R4 ;",
        "        /*0230*/                   NOP ;",
    ])
    assert check.sass_opcodes(sass) == {"VIADD": 1, "FSETP": 1, "IMAD": 1, "LOP3": 2, "HMMA": 1}
    texts = check.sass_instructions(sass)
    assert texts[0] == ("VIADD", "VIADD R7, R4.reuse, 0x1000")
    assert texts[2] == ("IMAD", "@!P0 IMAD.IADD.U32 R0, R0, 0x1, R13")
    assert [op for op, _t in texts] == ["VIADD", "FSETP", "IMAD", "LOP3", "LOP3", "HMMA"]
    assert check.sass_opcode_sequence(sass) == [op for op, _t in texts]


def test_innermost_mma_loops_of_a_ptx_listing():
    """`benchmarks.check.ptx_mma_loops` reports each innermost loop holding an ``mma.sync``:
    its instructions (not labels, comments or braces) and its mma; an outer loop around it, a
    loop without mma and straight-line mma are not reported."""
    ptx_mma_loops = pytest.importorskip("benchmarks.check").ptx_mma_loops
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, {%r5,%r6}, {%f1,%f2,%f3,%f4};"
    ptx = "\n".join([
        "\t" + mma,                                   # straight line: no loop
        "$L__BB0_1:",                                 # outer loop
        "\tadd.s32 \t%r7, %r7, 1;",
        "$L__BB0_2:",                                 # inner loop: 2 mma, 5 instructions
        "\t// begin inline asm",
        "\t" + mma,
        "\t// end inline asm",
        "\t" + mma,
        "\tadd.s32 \t%r8, %r8, 1;",
        "\tsetp.lt.s32 \t%p1, %r8, 4;",
        "\t@%p1 bra \t$L__BB0_2;",
        "\tsetp.lt.s32 \t%p2, %r7, 9;",
        "\t@%p2 bra \t$L__BB0_1;",
        "$L__BB0_3:",                                 # a loop without mma
        "\tadd.s32 \t%r9, %r9, 1;",
        "\t@%p3 bra \t$L__BB0_3;",
        "$L__BB0_4:",                                 # a second innermost mma loop
        "\t" + mma,
        "\tbra.uni \t$L__BB0_4;",
        "\tret;",
    ])
    assert ptx_mma_loops(ptx) == [(5, 2), (2, 1)]
    assert ptx_mma_loops("\t" + mma + "\n\tret;") == []
