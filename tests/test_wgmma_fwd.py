"""The Hopper forward (`kernels.wgmma_fwd`, family ``wgmma``): CPU checks of what can be checked
without a GPU, and GPU exactness tests.

* CPU, every run: `supports` refuses what the kernel does not do and names it (masks,
  dropout, cache lengths, head dims, dtypes, tiles; then the hardware; a window is taken); the registry
  tries it after ``split_kv`` and before the families, whatever the config asks; the plan's fields against their formulas;
  the data path of one program emulated in NumPy from the kernel's own constants (shared-memory
  offsets, descriptor templates, k-step advances) with operands read through the PTX ISA's
  canonical layouts and the TMA swizzle, the P registers rebuilt from the accumulator layout;
  the full/empty barrier protocol stepped in random interleavings against a model of mbarrier
  phases.
* CPU, compile only (skipped without ptxas or NVVM): kernels of every tile configuration compile
  for ``sm_90a`` and assemble with ``ptxas -v -arch=sm_90a``: instruction counts, launch bounds,
  threads and shared memory equal to the plan's, registers equal to the plan's table, no spills
  at d = 64 nor in the d = 128 default.
* GPU (``gpu``, compute capability 9.0): O and the logsumexp against float64 for float16 and
  bfloat16, d 64 and 128, causal or not, N in {1, 63, 200, 1000}, Nq != Nk with GQA, sliding
  windows (the rule written out as a mask, tests/test_window.py), large logits, every tile configuration, launch orders, NumPy and strided torch operands, a smoke run.
  Tolerances as tests/test_mma_fwd.py; a failure names the worst element.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

import kernels
from kernels import KernelConfig
from kernels import hopper as hp
from kernels import wgmma_fwd as wf
from sim.plan import price
from sim.plans import plan_for
from sim.plans.wgmma_fwd import (WGMMA_FWD_WAITS_PER_TILE, WGMMA_PRODUCER_SPILL_BYTES,
                                 WGMMA_REGISTERS, WGMMA_SPILLING,
                                 wgmma_default_blocks, wgmma_forward_configs, wgmma_smem_bytes,
                                 overlap_registers, WGMMA_THREE_WARPGROUPS_FROM,
                                 wgmma_threads)
from sim.workload import Workload

from .helpers import (assemble_sm90a, compile_sm90a_in_child, kernel_problem,
                      need_hopper_torch)

WGMMA = KernelConfig(family="wgmma")


def _np_problem(nq=64, nk=64, d=64, dtype=np.float16, hq=2, hkv=2, **kw):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, hq, nq, d)).astype(dtype)
    k = rng.standard_normal((1, hkv, nk, d)).astype(dtype)
    v = rng.standard_normal((1, hkv, nk, d)).astype(dtype)
    return kernel_problem(q, k, v, **kw)


# ------------------------------------------------------------------------------------------------
# CPU: refusals and the registry
# ------------------------------------------------------------------------------------------------
def test_the_registry_tries_it_after_split_kv_and_before_the_families():
    pb = _np_problem()
    assert list(kernels.FORWARD_ONLY) == ["split_kv", "wgmma"] == list(kernels.config.FORWARD_ONLY_NAMES)
    # unpinned, the answer depends only on the problem and the hardware, never on the config
    assert wf.supports(pb, KernelConfig()) == wf.supports(pb, WGMMA)
    from kernels import host
    on_hopper = host.real_gpu() and host.compute_capability(host.current_device_id()) >= (9, 0)
    assert (kernels.family_for(pb) == "wgmma") == on_hopper
    # pinning another family runs that family
    if host.real_gpu():
        assert kernels.family_for(pb, KernelConfig(family="mma")) == "mma"


@pytest.mark.parametrize("change, word", [
    (dict(mask=np.ones((1, 1, 64, 64), bool)), "mask"),
    (dict(block_mask=np.ones((1, 1, 1, 1), bool), block_q=64, block_k=64), "block_mask"),
    (dict(dropout_p=0.1, seed=1), "dropout"),
    (dict(d=96), "head_dim"),
    (dict(d=32), "head_dim"),
    (dict(dtype=np.float32), "dtype"),
    (dict(block_k=32), "block_k"),
    (dict(block_q=32), "block_q"),
])
def test_refusals_name_what_is_refused(change, word):
    pb = _np_problem(**change)
    why = wf.supports(pb, WGMMA)
    assert why is not None and word in why, why


def test_refusals_of_fields_the_helpers_do_not_set():
    pb = _np_problem()
    why = wf.supports(dataclasses.replace(pb, cache_seqlens=np.array([10], np.int32)), WGMMA)
    assert "cache_seqlens" in why
    pb2 = _np_problem(nq=40, nk=64, causal=True)
    why = wf.supports(dataclasses.replace(pb2, causal_alignment="bottom_right"), WGMMA)
    assert "causal_alignment" in why
    why = wf.supports(dataclasses.replace(pb, value_dim=32), WGMMA)
    assert "value_dim" in why


def test_a_window_is_taken_bottom_right_aligned_included():
    # the band (causal rule included, bottom-right aligned with Nq != Nk) is the kernel's; only
    # the hardware is left to refuse it on this machine
    from kernels import host
    for nq, nk, window, causal in ((64, 64, (8, 0), True), (40, 64, (8, 3), "bottom_right"),
                                   (64, 40, (0, 0), False)):
        pb = _np_problem(nq=nq, nk=nk, window_size=window, causal=causal)
        why = wf.supports(pb, WGMMA)
        if not host.real_gpu():
            assert "real CUDA GPU" in why and "window" not in why, why
        w = Workload(batch=1, heads=2, seq_len_q=nq, seq_len_k=nk, head_dim=64, dtype="fp16",
                     causal=bool(causal) and nq == nk, window_size=window)
        assert not plan_for("wgmma", "fwd", w).kernels[0].lockstep
    w = Workload(batch=1, heads=1, seq_len_q=256, head_dim=128, dtype="bf16", window_size=(8, 0))
    with pytest.raises(ValueError, match="window"):
        plan_for("wgmma_fp8", "fwd", w)


def test_plan_window_visits_the_band_tiles():
    # only the tiles BlockInfo lists for the band are multiplied and loaded
    from ioaware.block_info import BlockInfo
    w = Workload(batch=1, heads=2, seq_len_q=1000, seq_len_k=1000, head_dim=64, dtype="fp16",
                 causal=True, window_size=(200, 0))
    (k,) = plan_for("wgmma", "fwd", w, block_q=128, block_k=64).kernels
    tiles = len(BlockInfo(1000, 1000, 128, 64, True, window_size=(200, 0)).tiles())
    full = len(BlockInfo(1000, 1000, 128, 64, True).tiles())
    assert tiles < full
    assert k.matmuls[0].flops == 2 * tiles * 4 * 64 * 128 * 64
    assert {a.tensor: a for a in k.accesses}["K"].bytes <= 2 * tiles * 64 * 64 * 2


def test_the_hardware_is_checked_last():
    # a problem the kernel takes is refused on this machine only for want of a Hopper GPU
    from kernels import host
    pb = _np_problem(nq=200, nk=333, d=128, causal=True, hq=4, hkv=2)
    why = wf.supports(pb, WGMMA)
    if not host.real_gpu():
        assert "real CUDA GPU" in why
        with pytest.raises(ValueError, match="wgmma"):
            kernels.family_for(pb, WGMMA)
    elif host.compute_capability(host.current_device_id()) < (9, 0):
        assert "compute capability 9.0" in why
    else:
        assert why is None
        assert kernels.family_for(pb, WGMMA) == "wgmma"
    # the family has a backward too (`kernels.wgmma_bwd`): pinned, it runs or says why not
    if why is None:
        assert kernels.family_for(pb, WGMMA, "bwd") == "wgmma"
    else:
        with pytest.raises(ValueError, match="wgmma"):
            kernels.family_for(pb, WGMMA, "bwd")


# ------------------------------------------------------------------------------------------------
# CPU: the plan
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_plan_fields_equal_the_formulas(d, dtype):
    B, H, Hkv = 2, 4, 2
    for bq, bk, overlap in itertools.product((128, 64), (128, 64), (False, True)):
        # whole tiles, not causal: every tile visited
        nq, nk = 4 * bq, 2 * bk * (128 // bk)
        w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=nq, seq_len_k=nk, head_dim=d,
                     dtype=dtype)
        plan = plan_for("wgmma", "fwd", w, block_q=bq, block_k=bk, overlap=overlap)
        (k,) = plan.kernels
        assert plan.family == "wgmma" and plan.pass_ == "fwd"
        assert k.grid == (nq // bq, B * H)
        # overlap: three stages; with two consumer warpgroups a producer warpgroup
        producer = 128 if overlap and bq == 128 else 32
        stages = 3 if overlap else 2
        assert k.threads == 128 * (bq // 64) + producer == wgmma_threads(bq, overlap)
        assert k.shared_bytes == 1024 + bq * d * 2 + 2 * stages * bk * d * 2 + 64
        assert plan.config["stages"] == stages and plan.config["overlap"] is overlap
        (mm,) = k.matmuls
        assert mm.unit == ("wgmma.bf16" if dtype == "bf16" else "wgmma.f16")
        assert mm.flops == 4 * B * H * nq * nk * d
        by = {a.tensor: a for a in k.accesses}
        assert by["Q"].bytes == by["O"].bytes == B * H * nq * d * 2
        assert by["K"].bytes == by["V"].bytes == B * H * (nq // bq) * nk * d * 2
        assert by["lse"].bytes == B * H * nq * 4
        assert by["K"].how == "tma" and by["O"].how == "fragment"
        assert k.mufu_ops >= B * H * nq * nk            # one ex2 per score at least
        if producer == 128:     # setmaxnreg moves the launch's even share: 65536 / 384
            assert k.registers == 168
        elif not overlap:
            assert k.registers == WGMMA_REGISTERS[(d, bq, bk)]
        assert plan.config["block_q"] == bq and plan.config["block_k"] == bk


def test_plan_causal_and_tails():
    # causal top-left, Nq != Nk, lengths not multiples of the tiles: tiles as BlockInfo says
    from ioaware.block_info import BlockInfo
    w = Workload(batch=1, heads=2, seq_len_q=200, seq_len_k=333, head_dim=64, dtype="fp16",
                 causal=True)
    plan = plan_for("wgmma", "fwd", w, block_q=128, block_k=64)
    tiles = len(BlockInfo(200, 333, 128, 64, True).tiles())
    (k,) = plan.kernels
    assert k.grid == (2, 2)
    assert k.matmuls[0].flops == 2 * tiles * 4 * 64 * 128 * 64
    assert {a.tensor for a in k.accesses} == {"schedule", "Q", "K", "V", "O", "lse"}


def test_plan_counts_each_consumer_warpgroups_waits():
    """``group_waits``: two per visited tile and consumer warpgroup (the "wait" level), which
    lengthens the chain only with a measured wait latency."""
    w = Workload(batch=2, heads=3, seq_len_q=300, head_dim=64, dtype="fp16")
    for bq, bk in ((128, 128), (64, 64)):
        (k,) = plan_for("wgmma", "fwd", w, block_q=bq, block_k=bk).kernels
        tiles = 2 * 3 * -(-300 // bq) * -(-300 // bk)            # not causal: every tile
        assert k.group_waits == tiles * (bq // 64) * WGMMA_FWD_WAITS_PER_TILE
        assert k.waiters_per_program == bq // 64
        assert price(plan_for("wgmma", "fwd", w, block_q=bq, block_k=bk),
                     "h200").kernels[0].level_s["wait"] == 0


def test_plan_defaults_refusals_and_configs():
    w = Workload(batch=1, heads=1, seq_len_q=256, head_dim=128, dtype="bf16")
    plan = plan_for("wgmma", "fwd", w)
    assert (plan.config["block_q"], plan.config["block_k"]) == wgmma_default_blocks(128)
    # the default schedule at two consumer warpgroups: turns and the intra-warpgroup overlap
    assert plan.config["pingpong"] and plan.config["overlap"]
    # (WGMMA_SPILLING lists serial kernels; the default runs the overlap, spill-free)
    assert plan.config["overlap"] and plan.config["persistent"]
    serial = plan_for("wgmma", "fwd", w, block_q=64)
    assert not serial.config["pingpong"] and not serial.config["overlap"]
    sizes = dict(batch=1, heads=1, seq_len_q=256, head_dim=128, dtype="bf16")
    for bad, word in ((dict(dtype="fp32"), "dtype"), (dict(head_dim=96), "head_dim"),
                      (dict(dropout=True), "dropout")):
        with pytest.raises(ValueError, match=word):
            plan_for("wgmma", "fwd", Workload(**{**sizes, **bad}))
    with pytest.raises(ValueError, match="block_k"):
        plan_for("wgmma", "fwd", w, block_k=32)
    cfgs = wgmma_forward_configs(w)
    # three consumer warpgroups (block_q = 192) run the overlap's three stages: 192 x 128 does
    # not fit at d = 128, and is refused by the plan, naming the tiles
    assert {(c["block_q"], c["block_k"]) for c in cfgs} == (
        set(itertools.product((128, 64), (128, 64))) | {(192, 64)})
    assert all(wgmma_smem_bytes(128, c["block_q"], c["block_k"], 2, 3) <= 227 * 1024
               for c in cfgs)
    with pytest.raises(ValueError, match="block_q=192, block_k=128 at head_dim=128"):
        plan_for("wgmma", "fwd", w, block_q=192, block_k=128)
    w64 = Workload(**{**sizes, "head_dim": 64})
    assert {(c["block_q"], c["block_k"]) for c in wgmma_forward_configs(w64)} == set(
        itertools.product((128, 64, 192), (128, 64)))
    three = plan_for("wgmma", "fwd", w64, block_q=192, block_k=128)
    (k,) = three.kernels
    assert three.config["overlap"] and not three.config["pingpong"]
    assert three.config["consumer_warpgroups"] == 3 and three.config["stages"] == 3
    assert k.threads == 512 and k.registers == 128      # 65536 / 512 at launch
    assert overlap_registers(192) == (32, 160) and overlap_registers(128) == (40, 232)
    for bq in (128, 192):       # the split fits the register file at the launch's threads
        producer, consumer = overlap_registers(bq)
        assert producer * 128 + consumer * 128 * (bq // 64) <= 65536
        assert wgmma_threads(bq, True) == 128 * (bq // 64 + 1)
    # persistent where a program fills its SM (a producer warpgroup), refused elsewhere
    assert three.config["persistent"] and k.persistent and plan.config["persistent"]
    assert not serial.config["persistent"] and not serial.kernels[0].persistent
    assert not plan_for("wgmma", "fwd", w, persistent=False).kernels[0].persistent
    with pytest.raises(ValueError, match="persistent=True needs one program per SM"):
        plan_for("wgmma", "fwd", w, block_q=64, persistent=True)
    # the default tile: 192 x 128 at d = 64 from WGMMA_THREE_WARPGROUPS_FROM queries on
    n3 = WGMMA_THREE_WARPGROUPS_FROM
    assert wgmma_default_blocks(64, True, n3) == (192, 128)
    assert wgmma_default_blocks(64, False, n3 - 1) == wgmma_default_blocks(64) == (128, 128)
    assert wgmma_default_blocks(128, False, 8 * n3) == (128, 128)
    w_big = Workload(**{**sizes, "head_dim": 64, "seq_len_q": n3})
    big = plan_for("wgmma", "fwd", w_big)
    assert (big.config["block_q"], big.config["block_k"]) == (192, 128)
    # a schedule three warpgroups cannot run, asked for without tiles: two warpgroups' default
    for schedule in (dict(pingpong=True), dict(overlap=False), dict(pingpong=True, overlap=False)):
        p2 = plan_for("wgmma", "fwd", w_big, **schedule)
        assert (p2.config["block_q"], p2.config["block_k"]) == (128, 128)
        pb = _np_problem(nq=n3, nk=n3, d=64, causal=True)
        assert wf.tiles(pb, KernelConfig(family="wgmma", **schedule)) == (128, 128)
    assert wf.tiles(_np_problem(nq=n3, nk=n3, d=64, causal=True), WGMMA) == (192, 128)
    # the model's pick under a fixed serial schedule (a file timed before the schedules) leaves
    # out the tiles that cannot run it; with the defaults it ranks them all
    from sim.plans import choose
    ranked = [c for _t, c in choose("wgmma", "fwd", w_big, "h200")[2]]
    serial_ranked = [c for _t, c in choose("wgmma", "fwd", w_big, "h200", pingpong=False,
                                           overlap=False)[2]]
    assert {c["block_q"] for c in ranked} == {64, 128, 192}
    assert {c["block_q"] for c in serial_ranked} == {64, 128}
    for bad, word in ((dict(overlap=False), "overlap=False"), (dict(pingpong=True), "pingpong")):
        with pytest.raises(ValueError, match=word):
            plan_for("wgmma", "fwd", w64, block_q=192, block_k=128, **bad)


def test_the_module_plan_is_the_registered_plan():
    pb = _np_problem(nq=300, nk=200, d=128, causal=True)
    plan = wf.plan(pb, WGMMA)
    from kernels.host import plan_workload
    assert plan == plan_for("wgmma", "fwd", plan_workload(pb, "fwd"), block_q=128, block_k=128,
                            launch_order=None, pingpong=None, overlap=None, persistent=None)


def test_sim_plan_command(capsys):
    from sim.cli import main
    assert main(["plan", "--family", "wgmma", "--seq-len", "1000", "--head-dim", "128",
                 "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    # the default schedule at block_q = 128: two consumer warpgroups and a producer warpgroup
    assert d["family"] == "wgmma" and d["kernels_plan"][0]["threads"] == 384
    assert main(["plan", "--family", "wgmma", "--seq-len", "2048", "--causal", "--choose"]) == 0
    # --schedule prices one schedule's plan (threads, stages), for the wgmma forwards only
    capsys.readouterr()
    assert main(["plan", "--family", "wgmma", "--seq-len", "1000", "--head-dim", "128",
                 "--schedule", "serial", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kernels_plan"][0]["threads"] == 288
    assert main(["plan", "--family", "wgmma", "--seq-len", "1000", "--head-dim", "128",
                 "--schedule", "overlap"]) == 0
    assert "overlap on, 3 stages" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="only the wgmma forwards"):
        main(["plan", "--family", "mma", "--seq-len", "1000", "--schedule", "serial"])


# ------------------------------------------------------------------------------------------------
# CPU: one program's data path, emulated from the kernel's constants
# ------------------------------------------------------------------------------------------------
def _swizzled(byte_addr):
    return hp.swizzle_offset(int(byte_addr), "128B")


def _tma_box(img, dst, box):
    """What a TMA copy of ``box`` (rows x 64 16-bit values) with the 128-byte swizzle writes at
    shared byte address ``dst`` (1024-aligned): row r, column c at swizzle(dst + 128 r + 2 c)."""
    for r, c in itertools.product(range(box.shape[0]), range(box.shape[1])):
        img[_swizzled(dst + 128 * r + 2 * c) // 2] = box[r, c]


def _fields(desc):
    f = hp.decode_wgmma_descriptor(int(desc))
    assert f.swizzle == "128B" and f.base_offset == 0
    return f


def _read_kmajor(img, desc):
    """The 64 x 16 operand (rows M or N, columns K) a K-major 128B-swizzled descriptor names:
    PTX ISA canonical layout ((8, m), (T, 2k)) : ((8T, SBO), (1, T)), T = 8 elements."""
    f = _fields(desc)
    out = np.zeros((64, 16), img.dtype)
    for mn, k in itertools.product(range(64), range(16)):
        elems = (mn % 8) * 64 + (k % 8) + (k // 8) * 8
        addr = f.start_address + 2 * elems + (mn // 8) * f.stride_byte_offset
        out[mn, k] = img[_swizzled(addr) // 2]
    return out


def _read_mnmajor(img, desc):
    """The 16 x 64 operand (rows K, columns N) an MN-major 128B-swizzled descriptor names:
    canonical layout ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))."""
    f = _fields(desc)
    out = np.zeros((16, 64), img.dtype)
    for k, n in itertools.product(range(16), range(64)):
        elems = (n % 8) + 8 * ((n // 8) % 8) + 64 * (k % 8)
        addr = (f.start_address + 2 * elems + (n // 64) * f.leading_byte_offset
                + (k // 8) * f.stride_byte_offset)
        out[k, n] = img[_swizzled(addr) // 2]
    return out


def _desc(template, addr):
    return template | ((addr & 0x3FFFF) >> 4)          # hopper.smem_descriptor


@pytest.mark.parametrize("d, bq, bk", [(64, 128, 128), (64, 64, 64), (128, 128, 64),
                                       (128, 64, 128)])
def test_one_program_emulated_from_the_kernels_constants(d, bq, bk):
    """S = Q K^T and O = P V of one K/V tile, each warpgroup's operands read the way the
    kernel's descriptors name them (templates, chunk offsets and k-steps of
    `kernels.wgmma_fwd.kernel_constants`, addresses as the kernel computes them), from a shared
    memory image laid out as the kernel's TMA copies write it; P handed to the second product
    as the kernel packs it (accumulator registers -> A registers), checked element by element
    against the ISA's A layout. Equal to NumPy's products (float64 of the same values)."""
    c = wf.kernel_constants(d, bq, bk)
    rng = np.random.default_rng(d + bq + bk)
    q = rng.standard_normal((bq, d))
    kt = rng.standard_normal((bk, d))
    v = rng.standard_normal((bk, d))
    img = np.zeros(wgmma_smem_bytes(d, bq, bk) // 2)
    dc_n, kv, q_bytes = c["chunks"], c["kv_bytes"], c["q_bytes"]
    for wg, cc in itertools.product(range(c["consumers"]), range(dc_n)):
        _tma_box(img, (wg * dc_n + cc) * 8192, q[64 * wg:64 * wg + 64, 64 * cc:64 * cc + 64])
    stage = 1                                  # the second stage: the offsets of both count
    k_st = q_bytes + stage * 2 * kv
    v_st = k_st + kv
    for cc in range(dc_n):
        _tma_box(img, k_st + cc * bk * 128, kt[:, 64 * cc:64 * cc + 64])
        _tma_box(img, v_st + cc * bk * 128, v[:, 64 * cc:64 * cc + 64])
    for wg in range(c["consumers"]):
        q_wg = wg * dc_n * 8192
        # -- compute qk --
        s = np.zeros((64, bk))
        for kk in range(d // 16):
            cc = kk // 4
            a = _read_kmajor(img, _desc(c["k_template"], q_wg + cc * 8192 + (kk % 4) * c["k_step"]))
            for nb in range(bk // 64):
                b = _read_kmajor(img, _desc(c["k_template"], k_st + cc * bk * 128 + nb * 8192
                                            + (kk % 4) * c["k_step"]))
                s[:, 64 * nb:64 * nb + 64] += a @ b.T
        np.testing.assert_allclose(s, q[64 * wg:64 * wg + 64] @ kt.T, rtol=1e-12, atol=1e-12)
        # the accumulator as registers: s_reg[t][32 nb + i] = S[wgmma_d_elem(t, i)] (+ 64 nb)
        p = rng.standard_normal((64, bk))
        regs = np.zeros((128, c["s_regs"]))
        for t, r in itertools.product(range(128), range(c["s_regs"])):
            row, col = hp.wgmma_d_elem(t, r % 32)
            regs[t, r] = p[row, col + 64 * (r // 32)]
        # -- O += P V, P packed as the kernel packs it --
        o = np.zeros((64, d))
        for kc in range(bk // 16):
            a = np.zeros((64, 16))
            for t, qq, half in itertools.product(range(128), range(4), range(2)):
                r = 32 * (kc // 4) + 8 * (kc % 4) + 2 * qq          # the kernel's packing
                assert r % 32 + half == hp.wgmma_p_from_d(kc % 4, qq, half)
                row, k = hp.wgmma_a_elem(t, qq, half)
                a[row, k] = regs[t, r + half]
            np.testing.assert_array_equal(a, p[:, 16 * kc:16 * kc + 16])
            for dcc in range(dc_n):
                b = _read_mnmajor(img, _desc(c["v_template"], v_st + dcc * bk * 128
                                             + kc * c["v_step"]))
                o[:, 64 * dcc:64 * dcc + 64] += a @ b
        np.testing.assert_allclose(o, p @ v, rtol=1e-12, atol=1e-12)


def test_epilogue_and_mask_indices_follow_the_accumulator_layout():
    # the kernel's register index 32 blk + 4 j + 2 hr + e is (row 16 w + gid + 8 hr,
    # column 64 blk + 8 j + 2 tig + e) for thread 32 w + 4 gid + tig
    for t, j, hr, e in itertools.product(range(128), range(8), range(2), range(2)):
        w, lane = divmod(t, 32)
        gid, tig = divmod(lane, 4)
        assert hp.wgmma_d_elem(t, 4 * j + 2 * hr + e) == (16 * w + gid + 8 * hr, 8 * j + 2 * tig + e)


# ------------------------------------------------------------------------------------------------
# CPU: the barrier protocol
# ------------------------------------------------------------------------------------------------
class _MBarrier:
    """An mbarrier as the PTX ISA describes it: a phase completes when its pending arrivals and
    transaction bytes reach zero; ``try_wait.parity(p)`` is true when the phase of parity p has
    completed, i.e. when the current (incomplete) phase's parity is not p."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, expect_tx=0):
        self.tx += expect_tx
        self.pending -= 1
        self._maybe_complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._maybe_complete()

    def _maybe_complete(self):
        assert self.pending >= 0
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def try_wait(self, parity):
        return (self.phase & 1) != parity


@pytest.mark.parametrize("n_tiles, consumers", [(1, 1), (2, 2), (3, 1), (7, 2), (16, 2)])
@pytest.mark.parametrize("stages, overlap", [(2, False), (3, True), (2, True)])
def test_full_empty_protocol_in_random_interleavings(n_tiles, consumers, stages, overlap):
    """The producer and the consumer warpgroups (one actor each: a warpgroup's threads arrive
    together; the empty barrier counts warpgroups here instead of threads) stepped in random
    order, copies completing at random later times: every consumer reads each tile from its
    stage exactly once and in order, no copy lands in a stage a consumer is still reading, and
    everything finishes. The parities are the kernel's (`stage_of`, `full_parity`,
    `empty_parity`, for ``stages``). Serially a consumer releases a tile before it waits for
    the next; with ``overlap`` it holds tile i - 1 (its O += P V) until it has waited for tile
    i, and releases the last tile at the end (the kernel's three stages; two also finish, with
    no loading ahead)."""
    for seed in range(200):
        rnd = random.Random(seed)
        full = [_MBarrier(1) for _ in range(stages)]
        empty = [_MBarrier(consumers) for _ in range(stages)]
        content = [None] * stages            # which tile each stage holds
        reading = [set() for _ in range(stages)]   # consumers holding a stage
        inflight = []                      # (stage, tile) copies not landed yet
        prod_i = 0
        cons_i = [0] * consumers           # the next tile each consumer waits for
        held = [[] for _ in range(consumers)]       # tiles a consumer holds, oldest first
        seen = [[] for _ in range(consumers)]
        for _step in range(100000):
            actions = []
            if prod_i < n_tiles:
                st = wf.stage_of(prod_i, stages)
                if prod_i < stages or empty[st].try_wait(wf.empty_parity(prod_i, stages)):
                    actions.append("produce")
            if inflight:
                actions.append("land")
            for ci in range(consumers):
                limit = 2 if overlap else 1
                if cons_i[ci] < n_tiles and len(held[ci]) < limit:
                    st = wf.stage_of(cons_i[ci], stages)
                    if full[st].try_wait(wf.full_parity(cons_i[ci], stages)):
                        actions.append(("acquire", ci))
                if held[ci] and (len(held[ci]) == limit or cons_i[ci] == n_tiles):
                    actions.append(("release", ci))
            if not actions:
                break
            act = rnd.choice(actions)
            if act == "produce":
                st = wf.stage_of(prod_i, stages)
                assert not reading[st], f"tile {prod_i} refills stage {st} while it is read"
                full[st].arrive(expect_tx=2)
                inflight.append((st, prod_i))
                prod_i += 1
            elif act == "land":
                st, tile = inflight.pop(rnd.randrange(len(inflight)))
                assert not reading[st]
                content[st] = tile
                full[st].complete_tx(2)
            elif act[0] == "acquire":
                ci = act[1]
                st = wf.stage_of(cons_i[ci], stages)
                reading[st].add(ci)
                seen[ci].append(content[st])
                held[ci].append(cons_i[ci])
                cons_i[ci] += 1
            else:
                ci = act[1]
                st = wf.stage_of(held[ci].pop(0), stages)
                reading[st].discard(ci)      # done: the empty arrival
                empty[st].arrive()
        assert prod_i == n_tiles and all(i == n_tiles for i in cons_i), seed
        assert not any(held), seed
        assert all(s == list(range(n_tiles)) for s in seen), (seed, seen)


# ------------------------------------------------------------------------------------------------
# CPU, compile only: sm_90a PTX and ptxas
# ------------------------------------------------------------------------------------------------
SIGNATURE = ("void(uint64[:, ::1], int16[:, :, :, ::1], float32[:, :, ::1], int32[:, ::1], "
             "int32[::1], int64, int64, int64, int64, int64, float32, float32[:, ::1], "
             "float32[:, ::1], float32[:, ::1], int64, int64)")
#: (head_dim, block_q, block_k, bfloat16, causal, window, overlap): serial kernels, then the
#: default schedule (turns and the intra-warpgroup overlap: ``overlap`` True at block_q = 128
#: means ping-pong too) and the overlap with one consumer warpgroup
COMPILED = [(64, 128, 128, False, True, False, False), (64, 128, 128, True, False, False, False),
            (64, 64, 64, False, False, False, False), (64, 128, 64, True, True, False, False),
            (128, 128, 64, False, True, False, False), (128, 128, 64, True, False, False, False),
            (128, 64, 128, False, False, False, False), (128, 128, 128, False, False, False, False),
            (64, 128, 128, False, False, True, False), (128, 128, 64, True, False, True, False),
            (128, 128, 128, False, False, False, True), (64, 128, 128, True, True, False, True),
            (128, 128, 128, True, False, True, True), (64, 64, 128, False, False, False, True),
            (64, 192, 128, True, True, False, True), (128, 192, 64, False, False, True, True)]


def _schedule(cfg) -> dict:
    """The kernel's schedule: ``overlap``, with ping-pong where there are two warpgroups."""
    d, bq, bk, bf16, causal, window, overlap = cfg
    return {"pingpong": bool(overlap and bq == 128), "overlap": overlap}


def compile_configs(outdir) -> dict:
    """Compile the `COMPILED` kernels for ``sm_90a`` into ``outdir`` (run in a process without
    the CUDA simulator); returns name -> the built kernel's (threads, smem_bytes)."""
    from numba import cuda

    from benchmarks.common import allow_offline_compile
    allow_offline_compile()
    launch = {}
    for cfg in COMPILED:
        d, bq, bk, bf16, causal, window, overlap = cfg
        kern = wf._build_kernel(d, bq, bk, bf16, causal, 1, window=window, **_schedule(cfg))
        text, _ = cuda.compile_ptx(kern.py_func, SIGNATURE, cc=(9, 0, "a"),
                                   launch_bounds=(kern.threads, 1))
        name = _name(cfg)
        Path(outdir, name + ".ptx").write_text(text)
        launch[name] = (kern.threads, kern.smem_bytes)
    return launch


def _name(cfg):
    d, bq, bk, bf16, causal, window, overlap = cfg
    return "wgmma_fwd_{}_{}_{}_{}_{}{}".format(d, bq, bk, "bf16" if bf16 else "f16",
                                               "window" if window else
                                               "causal" if causal else "full",
                                               "_overlap" if overlap else "")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("wgmma_fwd")
    ptxas, launch = compile_sm90a_in_child("tests.test_wgmma_fwd", "compile_configs", out)
    return out, ptxas, launch


@pytest.mark.parametrize("cfg", COMPILED, ids=_name)
def test_compiles_and_assembles_for_sm90a(compiled, cfg):
    outdir, ptxas, launch = compiled
    d, bq, bk, bf16, causal, window, overlap = cfg
    name = _name(cfg)
    text = (outdir / f"{name}.ptx").read_text()
    assert ".target sm_90a" in text
    threads = wgmma_threads(bq, overlap)
    assert f".maxntid {threads}, 1, 1" in text and ".minnctapersm 1" in text
    ty = "bf16" if bf16 else "f16"
    # S: d/16 k-steps of one m64n{bk} product (A, B descriptors, both K-major); PV: bk/16 k-steps
    # of one m64n{d} product with A from four registers and B MN-major (imm-trans-b = 1): each
    # product as wide as its output tile (kernels.hopper.product_blocks)
    # (overlap: S = Q K^T issued for the first tile and in the loop, O += P V in the loop and
    # for the last tile)
    n_s, n_pv = d // 16, bk // 16
    copies = 2 if overlap else 1
    s_instr = f"wgmma.mma_async.sync.aligned.m64n{bk}k16.f32.{ty}.{ty}"
    pv_instr = f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.{ty}.{ty}"
    if bk == d:
        assert text.count(s_instr) == copies * (n_s + n_pv)
    else:
        assert text.count(s_instr) == copies * n_s and text.count(pv_instr) == copies * n_pv
    assert "m64n64k16" not in text or 64 in (bk, d)
    assert text.count(", p, 1, 1, 0, 0;") == copies * n_s
    assert text.count(", p, 1, 1, 1;") == copies * n_pv
    assert ("wgmma.wait_group.sync.aligned 1" in text) == overlap
    # the plan's waits a tile (its "wait" level): one per commit group, two a tile (overlap: the
    # loop's two, and the peeled first S = Q K^T's and last O += P V's)
    assert text.count("wgmma.wait_group.sync.aligned") == copies * WGMMA_FWD_WAITS_PER_TILE
    assert text.count("wgmma.commit_group.sync.aligned") == copies * WGMMA_FWD_WAITS_PER_TILE
    # a producer warpgroup gives its registers to the consumers (two or three consumer
    # warpgroups)
    assert text.count("setmaxnreg.") == (2 if overlap and bq >= 128 else 0)
    if overlap and bq == 192:
        assert "setmaxnreg.inc.sync.aligned.u32 160" in text
        assert "setmaxnreg.dec.sync.aligned.u32 32" in text
    # ping-pong: warpgroup 1's first hand-over and the hand-over after each turn's issue (the
    # first tile, the loop)
    assert text.count("bar.arrive") == (3 if overlap and bq == 128 else 0)
    assert text.count("cp.async.bulk.tensor.4d") >= 3          # Q, K, V (loops may unroll)
    for instr in ("mbarrier.init.shared::cta.b64", "mbarrier.arrive.expect_tx",
                  "mbarrier.try_wait.parity", "mbarrier.arrive.shared::cta.b64",
                  "fence.proxy.tensormap::generic.acquire.gpu", "wgmma.fence.sync.aligned",
                  "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
                  "shfl.sync.bfly", "ex2.approx.ftz.f32"):
        assert instr in text, instr
    assert "ld.local" not in text and "st.local" not in text     # arrays kept in registers
    # the launch the plan makes is the kernel's own
    w = Workload(batch=1, heads=1, seq_len_q=4 * bq, seq_len_k=4 * bk, head_dim=d,
                 dtype="bf16" if bf16 else "fp16", causal=causal)
    k = plan_for("wgmma", "fwd", w, block_q=bq, block_k=bk, **_schedule(cfg)).kernels[0]
    assert (k.threads, k.shared_bytes) == tuple(launch[name])
    # ptxas would serialise every wgmma (C7520 and kin) if one were issued on a divergent path
    entry, stderr = assemble_sm90a(ptxas, outdir / f"{name}.ptx")
    print(name, entry)
    assert "ignored" not in stderr, stderr      # (C7508) setmaxnreg ignored
    if overlap:
        assert entry["registers_per_thread"] <= {128: 168, 192: 128}.get(bq, 255), entry
        # three consumer warpgroups: their producer's 32 registers may spill a little
        allowed = WGMMA_PRODUCER_SPILL_BYTES if bq == 192 else 0
        assert entry["spill_store_bytes"] <= allowed, entry
        assert entry["stack_frame_bytes"] <= allowed, entry
        return
    assert abs(entry["registers_per_thread"] - WGMMA_REGISTERS[(d, bq, bk)]) <= 8, entry
    if (d, bq, bk) in WGMMA_SPILLING:
        assert entry["spill_store_bytes"] > 0, entry      # the table says so; still true?
    else:
        assert entry["spill_store_bytes"] == 0 and entry["stack_frame_bytes"] == 0, entry


#: (head_dim, block_q, block_k, bfloat16, causal) compiled with ping-pong
PINGPONG_COMPILED = [(128, 128, 64, False, False), (64, 128, 128, True, True)]


def compile_pingpong(outdir) -> dict:
    """`PINGPONG_COMPILED` for sm_90a with ``pingpong=True`` (a process without the simulator)."""
    from numba import cuda

    from benchmarks.common import allow_offline_compile
    allow_offline_compile()
    for d, bq, bk, bf16, causal in PINGPONG_COMPILED:
        kern = wf._build_kernel(d, bq, bk, bf16, causal, 1, pingpong=True)
        text, _ = cuda.compile_ptx(kern.py_func, SIGNATURE, cc=(9, 0, "a"),
                                   launch_bounds=(kern.threads, 1))
        Path(outdir, f"pingpong_{d}_{bq}_{bk}.ptx").write_text(text)
    return {}


def test_pingpong_compiles_with_its_turns_and_unserialised_products(tmp_path):
    ptxas, _ = compile_sm90a_in_child("tests.test_wgmma_fwd", "compile_pingpong", tmp_path)
    for d, bq, bk, bf16, causal in PINGPONG_COMPILED:
        path = tmp_path / f"pingpong_{d}_{bq}_{bk}.ptx"
        text = path.read_text()
        # warpgroup 1's first hand-over and the hand-over after each S = Q K^T; warpgroup 0's
        # last wait, each turn's wait and syncthreads' bar.sync 0
        assert text.count("bar.arrive") == 2 and text.count("bar.sync") == 3
        entry, _ = assemble_sm90a(ptxas, path)
        assert abs(entry["registers_per_thread"] - WGMMA_REGISTERS[(d, bq, bk)]) <= 8, entry
        assert entry["spill_store_bytes"] == 0, entry


def test_pingpong_needs_two_warpgroups():
    with pytest.raises(ValueError, match="pingpong"):
        wf._build_kernel(128, 64, 64, False, False, 1, pingpong=True)
    w = Workload(batch=1, heads=1, seq_len_q=256, head_dim=128, dtype="fp16")
    with pytest.raises(ValueError, match="pingpong"):
        plan_for("wgmma", "fwd", w, block_q=64, pingpong=True)
    with pytest.raises(ValueError, match="pingpong"):
        plan_for("wgmma", "fwd", w, pingpong="yes")
    with pytest.raises(ValueError, match="pingpong"):
        KernelConfig(pingpong=1)
    pb = _np_problem(nq=300, nk=200, d=128, causal=True)
    why = wf.supports(pb, KernelConfig(family="wgmma", block_q=64, pingpong=True))
    assert why and "pingpong" in why


def test_the_plan_declares_pingpong_and_does_not_price_it():
    w = Workload(batch=2, heads=16, seq_len_q=4096, head_dim=128, dtype="fp16")
    off = plan_for("wgmma", "fwd", w, pingpong=False)
    on = plan_for("wgmma", "fwd", w, pingpong=True)
    assert off.config["pingpong"] is False and on.config["pingpong"] is True
    assert off.kernels == on.kernels
    assert price(on, "h100").time_s == price(off, "h100").time_s
    assert plan_for("wgmma", "fwd", w).config["pingpong"] is True       # the default
    # the intra-warpgroup overlap: declared (stages, threads, shared memory), the same work and
    # the same serial structure priced
    serial = plan_for("wgmma", "fwd", w, pingpong=True, overlap=False)
    ov = plan_for("wgmma", "fwd", w, pingpong=True, overlap=True)
    assert (serial.config["stages"], ov.config["stages"]) == (2, 3)
    (ks,), (ko,) = serial.kernels, ov.kernels
    assert (ks.matmuls, ks.fp32_flops, ks.mufu_ops, ks.serial) == (
        ko.matmuls, ko.fp32_flops, ko.mufu_ops, ko.serial)
    by_s, by_o = ({a.tensor: a for a in k.accesses} for k in (ks, ko))
    assert all(by_s[t] == by_o[t] for t in by_s if t != "schedule")
    # the producer warpgroup's three idle warps read start and stop only
    assert by_o["schedule"].bytes - by_s["schedule"].bytes == 3 * 2 * 4 * ks.grid[0] * ks.grid[1]
    assert (ks.threads, ko.threads) == (288, 384) and ko.shared_bytes > ks.shared_bytes
    with pytest.raises(ValueError, match="overlap"):
        plan_for("wgmma", "fwd", w, overlap="yes")
    with pytest.raises(ValueError, match="overlap"):
        KernelConfig(overlap=1)
    assert plan_for("wgmma_fp8", "fwd", Workload(batch=2, heads=16, seq_len_q=4096, head_dim=128,
                                                 dtype="bf16")).config["pingpong"] is True
    assert plan_for("wgmma_fp8", "fwd", Workload(batch=2, heads=16, seq_len_q=4096, head_dim=128,
                                                 dtype="bf16"), block_q=64).config["pingpong"] is False
    pb = _np_problem(nq=300, nk=200, d=128, causal=True)
    assert wf.plan(pb, KernelConfig(family="wgmma", pingpong=True)).config["pingpong"] is True


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
_need_hopper = need_hopper_torch


def _inputs(torch, shape_q, shape_kv, dtype, seed, q_scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(shape_q, device="cuda", generator=g) * q_scale).to(dtype)
    k = torch.randn(shape_kv, device="cuda", generator=g).to(dtype)
    v = torch.randn(shape_kv, device="cuda", generator=g).to(dtype)
    return q, k, v


def _forward(q, k, v, config=WGMMA, **kw):
    pb = kernel_problem(q, k, v, **kw)
    assert kernels.family_for(pb, config) == "wgmma"
    return kernels.forward(pb, config)


def _worst(got, want):
    err = np.abs(got - want)
    err = np.where(np.isnan(err), np.inf, err)
    idx = np.unravel_index(int(np.argmax(err)), err.shape)
    return float(err[idx]), idx


def _check(q, k, v, out, lse, **ref_kw):
    """O and lse against float64 (tests/test_mma_fwd.py's tolerances), naming the worst
    element (batch, head, row, column) and its values when they differ."""
    from .helpers import dense_attention_reference
    torch = sys.modules["torch"]
    unit = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[q.dtype]
    ref = dense_attention_reference(q, k, v, **ref_kw)
    want_out, want_lse = ref["out"], ref["lse"]
    got_out = out.double().cpu().numpy() if hasattr(out, "double") else out.astype(np.float64)
    got_lse = (lse.cpu().numpy() if hasattr(lse, "cpu") else lse).astype(np.float64)
    atol = 4 * unit * float(v.abs().max())
    assert np.isfinite(got_out).all(), f"non-finite outputs at {np.argwhere(~np.isfinite(got_out))[:5]}"
    e, idx = _worst(got_out, want_out)
    assert e <= atol, (f"O: max |error| {e:.3g} > {atol:.3g} at (b, h, row, col) {idx}: got "
                       f"{got_out[idx]:.6g}, want {want_out[idx]:.6g}")
    fin = np.isfinite(want_lse)
    bad = np.argwhere(np.isfinite(got_lse) != fin)
    assert not len(bad), f"lse finiteness differs at (b, h, row) {bad[:5].tolist()}"
    tol = 1e-4 * (1 + np.abs(want_lse[fin]).max()) if fin.any() else 0
    diff = np.where(fin, np.abs(got_lse - np.where(fin, want_lse, 0)), 0)
    e, idx = _worst(diff, np.zeros_like(diff))
    assert e <= tol, (f"lse: max |error| {e:.3g} > {tol:.3g} at (b, h, row) {idx}: got "
                      f"{got_lse[idx]:.7g}, want {want_lse[idx]:.7g}")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 63, 200, 1000])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_forward_matches_float64(dtype, head_dim, causal, n):
    torch = _need_hopper()
    dt = getattr(torch, dtype)
    q, k, v = _inputs(torch, (2, 4, n, head_dim), (2, 2, n, head_dim), dt, seed=n + head_dim)
    scale = 1 / math.sqrt(head_dim)
    out, lse = _forward(q, k, v, scale=scale, causal=causal)
    assert out.dtype == dt and out.shape == q.shape and lse.dtype == torch.float32
    _check(q, k, v, out, lse, scale=scale, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("n_q, n_k", [(200, 333), (333, 200), (1, 500), (1000, 63), (64, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nq_differs_from_nk(dtype, head_dim, causal, n_q, n_k):
    # top-left causal alignment as kernels.mma_fwd: row i sees keys j <= i; GQA 4 / 2
    torch = _need_hopper()
    q, k, v = _inputs(torch, (1, 4, n_q, head_dim), (1, 2, n_k, head_dim),
                      getattr(torch, dtype), seed=n_q * 7 + n_k)
    out, lse = _forward(q, k, v, scale=0.1, causal=causal)
    _check(q, k, v, out, lse, scale=0.1, causal=causal)


WINDOW_CASES = [  # (Nq, Nk, window_size, causal): bands that skip tiles and cut others
    (300, 300, (64, 0), True),
    (1000, 1000, (200, 0), True),        # tiles of the band cut per warpgroup
    (200, 333, (40, 17), False),
    (150, 150, (0, 0), False),
    (90, 400, (10, -1), "bottom_right"),
    (400, 90, (5, 3), False),            # the first rows see no key: zeros, lse -inf
    (70, 70, (-1, 500), False),          # wider than N
]


@pytest.mark.gpu
@pytest.mark.parametrize("block_q, block_k", [(128, 64), (64, 128), (128, 128), (192, 64)])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("n_q, n_k, window, causal", WINDOW_CASES)
def test_sliding_window_matches_float64(n_q, n_k, window, causal, head_dim, block_q, block_k):
    """The band test against float64 with the window written out as a boolean mask
    (tests/test_window.py's rule); the registry runs this family for it unpinned."""
    from .test_window import window_rule
    torch = _need_hopper()
    dt = torch.bfloat16 if block_k == 128 else torch.float16
    q, k, v = _inputs(torch, (1, 4, n_q, head_dim), (1, 2, n_k, head_dim), dt,
                      seed=n_q + n_k + block_q)
    scale = 1 / math.sqrt(head_dim)
    pb = kernel_problem(q, k, v, scale=scale, causal=causal, window_size=window)
    assert kernels.family_for(pb) == "wgmma"
    cfg = KernelConfig(family="wgmma", block_q=block_q, block_k=block_k)
    out, lse = _forward(q, k, v, config=cfg, scale=scale, causal=causal, window_size=window)
    rule = window_rule(n_q, n_k, window, bool(causal))
    _check(q, k, v, out, lse, scale=scale, mask=rule[None, None])
    if not rule.any(1).all():
        assert bool((out[:, :, torch.from_numpy(~rule.any(1)).cuda()] == 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_large_logits_and_long_rows(dtype, head_dim):
    # logits up to ~+-100: the running max must rescale O and l correctly
    torch = _need_hopper()
    q, k, v = _inputs(torch, (1, 2, 130, head_dim), (1, 2, 1100, head_dim),
                      getattr(torch, dtype), seed=7, q_scale=12.0)
    out, lse = _forward(q, k, v, scale=0.125)
    _check(q, k, v, out, lse, scale=0.125)


@pytest.mark.gpu
@pytest.mark.parametrize("block_q, block_k", list(itertools.product((128, 64, 192), (128, 64))))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_every_tile_configuration(block_q, block_k, head_dim, causal):
    torch = _need_hopper()
    q, k, v = _inputs(torch, (2, 2, 333, head_dim), (2, 2, 290, head_dim), torch.float16,
                      seed=block_q + block_k + causal)
    cfg = KernelConfig(family="wgmma", block_q=block_q, block_k=block_k)
    if (block_q, block_k, head_dim) == (192, 128, 128):     # three stages do not fit
        pb = kernel_problem(q, k, v, scale=0.09, causal=causal)
        assert "shared memory" in wf.supports(pb, cfg)
        return
    out, lse = _forward(q, k, v, config=cfg, scale=0.09, causal=causal)
    _check(q, k, v, out, lse, scale=0.09, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim, block_q", [(64, 128), (64, 192), (128, 128), (128, 192)])
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, (300, 0))])
def test_persistent_programs_walk_many_items(dtype, head_dim, block_q, causal, window):
    """More work items than SMs: each persistent program walks several (Q reloaded after its
    last S = Q K^T, the K/V ring carried on across items, the ping-pong turns too); O and the
    logsumexp as float64's, and the same bits as one program per item."""
    torch = _need_hopper()
    n = 1000
    q, k, v = _inputs(torch, (8, 8, n, head_dim), (8, 4, n, head_dim), getattr(torch, dtype),
                      seed=head_dim + block_q + causal)
    scale = 1 / math.sqrt(head_dim)
    kw = dict(causal=causal, window_size=window) if window else dict(causal=causal)
    block_k = 128 if (head_dim, block_q) != (128, 192) else 64    # (192 x 128: d = 64 only)
    items = 8 * 8 * -(-n // block_q)
    assert items > 2 * torch.cuda.get_device_properties(0).multi_processor_count
    cfg = dict(family="wgmma", block_q=block_q, block_k=block_k)
    on = _forward(q, k, v, config=KernelConfig(**cfg, persistent=True), scale=scale, **kw)
    off = _forward(q, k, v, config=KernelConfig(**cfg, persistent=False), scale=scale, **kw)
    if window:
        from .test_window import window_rule
        _check(q, k, v, *on, scale=scale, mask=window_rule(n, n, window, causal)[None, None])
    else:
        _check(q, k, v, *on, scale=scale, causal=causal)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["heads", "tiles", 4])
def test_launch_orders_give_the_same_bits(order):
    torch = _need_hopper()
    q, k, v = _inputs(torch, (3, 6, 261, 64), (3, 2, 397, 64), torch.bfloat16, seed=5)
    a = _forward(q, k, v, config=KernelConfig(family="wgmma", launch_order=order), scale=0.125,
                 causal=True)
    b = _forward(q, k, v, scale=0.125, causal=True)
    _check(q, k, v, *a, scale=0.125, causal=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim, block_k", [(64, 128), (128, 64)])
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (False, (100, 30))])
def test_pingpong_gives_the_same_bits(dtype, head_dim, block_k, causal, window):
    """The warpgroups' turns order when the products are issued, not what they compute."""
    torch = _need_hopper()
    q, k, v = _inputs(torch, (2, 4, 333, head_dim), (2, 2, 461, head_dim),
                      getattr(torch, dtype), seed=9)
    scale = 1 / math.sqrt(head_dim)
    kw = dict(causal=causal, window_size=window) if window else dict(causal=causal)
    kw["scale"] = scale
    on = _forward(q, k, v, config=KernelConfig(family="wgmma", block_q=128, block_k=block_k,
                                               pingpong=True, overlap=False), **kw)
    off = _forward(q, k, v, config=KernelConfig(family="wgmma", block_q=128, block_k=block_k,
                                                pingpong=False, overlap=False), **kw)
    if window:
        from .test_window import window_rule
        _check(q, k, v, *on, scale=scale, mask=window_rule(333, 461, window, causal)[None, None])
    else:
        _check(q, k, v, *on, scale=scale, causal=causal)
    assert torch.equal(on[0], off[0]) and torch.equal(on[1], off[1])


#: The logsumexp of two builds of the same arithmetic may differ in the last bit of its terms
#: (``m ln 2 + log l``: the compiler may or may not fuse it into one FMA; the terms, of up to
#: ~16, may cancel: `LSE_ATOL`); O may not differ at all.
LSE_ULPS = 2 * 2.0**-23
LSE_ATOL = 4e-6


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim, block_q, block_k", [(64, 128, 128), (128, 128, 128),
                                                        (128, 128, 64), (64, 64, 128)])
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (False, (100, 30))])
def test_overlap_gives_the_same_output(dtype, head_dim, block_q, block_k, causal, window):
    """The intra-warpgroup overlap (with ping-pong where there are two warpgroups, the default,
    and without) orders when the products run, not what they compute: O bit for bit, the
    logsumexp to its last bits (`LSE_ULPS`, `LSE_ATOL`)."""
    torch = _need_hopper()
    q, k, v = _inputs(torch, (2, 4, 333, head_dim), (2, 2, 461, head_dim),
                      getattr(torch, dtype), seed=19)
    scale = 1 / math.sqrt(head_dim)
    kw = dict(causal=causal, window_size=window) if window else dict(causal=causal)
    kw["scale"] = scale
    serial = _forward(q, k, v, config=KernelConfig(family="wgmma", block_q=block_q,
                                                   block_k=block_k, pingpong=False,
                                                   overlap=False), **kw)
    for pingpong in ((True, False) if block_q == 128 else (False,)):
        ov = _forward(q, k, v, config=KernelConfig(family="wgmma", block_q=block_q,
                                                   block_k=block_k, pingpong=pingpong,
                                                   overlap=True), **kw)
        if window:
            from .test_window import window_rule
            _check(q, k, v, *ov, scale=scale,
                   mask=window_rule(333, 461, window, causal)[None, None])
        else:
            _check(q, k, v, *ov, scale=scale, causal=causal)
        assert torch.equal(ov[0], serial[0])
        torch.testing.assert_close(ov[1], serial[1], rtol=LSE_ULPS, atol=LSE_ATOL)


@pytest.mark.gpu
def test_strided_torch_and_numpy_operands():
    """Operands as [B, N, H, d] transposed views (the tensor maps take their strides as they
    are) and as NumPy arrays (copied to the device); the same bits as contiguous tensors."""
    torch = _need_hopper()
    g = torch.Generator(device="cuda").manual_seed(3)
    base = [torch.randn((2, 150, 4, 128), device="cuda", generator=g).half() for _ in range(3)]
    q, k, v = (x.transpose(1, 2) for x in base)
    assert not q.is_contiguous()
    out, lse = _forward(q, k, v, scale=0.08, causal=True)
    assert out.stride() == q.stride()          # the output in q's layout: its transpose is free
    _check(q, k, v, out, lse, scale=0.08, causal=True)
    out_c, lse_c = _forward(*(x.contiguous() for x in (q, k, v)), scale=0.08, causal=True)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)
    out_n, lse_n = _forward(*(x.contiguous().cpu().numpy() for x in (q, k, v)), scale=0.08,
                            causal=True)
    assert isinstance(out_n, np.ndarray) and out_n.dtype == np.float16
    np.testing.assert_array_equal(out_n, out_c.cpu().numpy())
    np.testing.assert_array_equal(lse_n, lse_c.cpu().numpy())


@pytest.mark.gpu
def test_smoke_prepared_and_repeated():
    """Runs, twice through one prepared forward (tensor maps cached by address), on new
    operands of the same shapes; shapes, dtypes, finiteness, equal bits for equal inputs. No
    timing."""
    torch = _need_hopper()
    q, k, v = _inputs(torch, (1, 8, 512, 128), (1, 8, 512, 128), torch.bfloat16, seed=1)
    pb = kernel_problem(q, k, v, scale=0.1, causal=True)
    run = kernels.prepare_forward(pb, WGMMA)
    o1, l1 = run(q, k, v)
    o2, l2 = run(q.clone(), k.clone(), v.clone())
    torch.cuda.synchronize()
    assert o1.shape == q.shape and o1.dtype == torch.bfloat16 and l1.shape == (1, 8, 512)
    assert torch.isfinite(o1).all() and torch.isfinite(l1).all()
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    # the registry runs this family by default on this problem
    assert kernels.family_for(pb) == "wgmma"


def test_map_writer_stores_the_words_it_is_given():
    """The launch that carries tensor maps to the device under CUDA graph capture: 48 uint64
    words passed by value land in order (here in Numba's CUDA simulator, or on the GPU, through
    `kernels.host.launch` and the on-disk kernel cache as a call makes it)."""
    from numba import cuda
    words = tuple(np.uint64((0x9E3779B97F4A7C15 * (i + 1)) % 2**64) for i in range(wf.MAP_WORDS))
    dst = cuda.to_device(np.zeros(wf.MAP_WORDS, np.uint64))
    wf._write_words(dst, words, 0)
    cuda.synchronize()
    np.testing.assert_array_equal(dst.copy_to_host(), np.array(words, np.uint64))


def test_records_are_priced_with_the_schedule_they_ran():
    """A results record of the wgmma forward names the schedule it ran (`benchmarks measure`
    writes ``pingpong`` and ``overlap``); one that names none predates the schedules and ran
    the serial kernel, which its plan then describes (288 threads, two stages). The pick
    report prices a file whose records name no schedule the same way."""
    from sim.plans import plans_for_record
    from benchmarks.pick import _fixed
    rec = {"kernel": "ioaware-numba", "variant": "wgmma", "pass": "fwd", "dtype": "fp16",
           "batch": 1, "heads": 2, "seq_len_q": 1024, "head_dim": 128, "causal": False,
           "block_q": 128, "block_k": 128}
    (old,) = plans_for_record(rec)
    assert (old.config["pingpong"], old.config["overlap"], old.config["stages"]) == (
        False, False, 2)
    assert old.kernels[0].threads == 288
    (new,) = plans_for_record(dict(rec, pingpong=True, overlap=True))
    assert (new.config["pingpong"], new.config["overlap"], new.config["stages"]) == (
        True, True, 3)
    assert new.kernels[0].threads == 384
    assert _fixed("wgmma", "fwd", {0: {"config": {}}}, False) == {"pingpong": False,
                                                                 "overlap": False,
                                                                 "persistent": False}
    # the backward has no schedule; a file from before its launcher balanced the launch order
    # is priced in the pass's default order, unbalanced
    assert _fixed("wgmma", "bwd", {0: {"config": {}}}, True) == {"launch_order": 4}
    assert _fixed("wgmma", "bwd", {0: {"config": {}, "launch_balanced": True}}, True) == {}
    assert _fixed("wgmma", "fwd", {0: {"config": {}, "schedule": {"pingpong": True,
                                                          "overlap": True}}}, False) == {}
    assert _fixed("mma", "fwd", {0: {"config": {}}}, False) == {}
    # what `benchmarks measure` writes: the schedule the plan runs at the record's tiles
    from benchmarks.measure import empty_record
    cfg = dict(rec, schedule="flash2", heads_kv=2, seq_len_k=1024)
    assert {k: empty_record(cfg)[k] for k in ("pingpong", "overlap")} == {
        "pingpong": True, "overlap": True}
    assert {k: empty_record(dict(cfg, block_q=64))[k] for k in ("pingpong", "overlap")} == {
        "pingpong": False, "overlap": False}
