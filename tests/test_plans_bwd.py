"""The tensor-core backwards' plans (`sim.plans.tensor_core_bwd`; CPU only).

* The launch is the plan: what `kernels.mma_bwd.prepare` / `kernels.tf32_bwd.prepare` hand to
  `kernels.host.prepare_tensor_core_backward` (grids, threads, dynamic shared memory, tiles,
  unrolling) is the plan's, and equals what the launcher computed from the tiles before the plan
  existed; the compiled kernels' own threads and shared memory (built without the simulator,
  in a child process) are the plan's.
* Counts against closed forms written here independently: dense and GQA byte totals, whole-tile
  matmul FLOPs, tf32 = 3 x the mma-equivalent products, the causal case against `BlockInfo`.
* Both backwards' dQ by atomics (``dq_mode="atomic"``): pre-pass, dK/dV kernel, conversion,
  launched as the plan says, with five products per tile and the float32 accumulator's traffic.
* `sim.plan.price` prices both plans; bad configurations raise ValueError naming the argument.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ioaware.block_info import BlockInfo, cdiv
from kernels import KernelConfig, host, mma_bwd, tf32_bwd, tile_scheduler
from sim.plan import price
from sim.plans import plan_for
from sim.plans import tensor_core_bwd as P
from sim.profiles import load_profile
from sim.workload import Workload

from .helpers import kernel_problem

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = {"mma": (mma_bwd, np.float16), "tf32": (tf32_bwd, np.float32)}

#: (batch, Hq, Hkv, Nq, Nk, d, kwargs of kernel_problem)
PROBLEMS = [
    (1, 2, 2, 64, 64, 64, {}),
    (2, 8, 2, 1000, 777, 128, {"causal": True}),                       # GQA, odd lengths
    (1, 4, 1, 333, 333, 64, {"causal": True}),                         # MQA
    (1, 2, 2, 300, 300, 128, {"window_size": (64, 0), "causal": True}),
    (1, 2, 1, 200, 333, 64, {"window_size": (40, 17)}),
    (1, 2, 2, 90, 400, 128, {"window_size": (10, -1), "causal": "bottom_right"}),
    (2, 2, 2, 130, 250, 128, {"dropout_p": 0.2, "seed": 3}),
    (2, 2, 2, 130, 250, 64, {"mask_rows": True}),
    (1, 2, 2, 300, 300, 64, {"block_mask": (10, 5), "block_q": 32, "block_k": 64}),
]


def _problem(dtype, B, Hq, Hkv, Nq, Nk, d, kw):
    kw = dict(kw)
    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
    if kw.pop("mask_rows", False):
        kw["mask"] = np.ones((B, 1, Nq, Nk), bool)
    if "block_mask" in kw:
        kw["block_mask"] = np.random.default_rng(0).random((1, Hq, *kw["block_mask"])) < 0.6
    return kernel_problem(z(B, Hq, Nq, d), z(B, Hkv, Nk, d), z(B, Hkv, Nk, d), **kw)


def _prepared_arguments(monkeypatch, module, pb, config):
    """What ``module.prepare`` hands to `host.prepare_tensor_core_backward`, and the arguments
    it builds its two kernels with (kernels and schedules are not built)."""
    seen = {}

    class Fake:
        def __init__(self, kind, args, kw):
            self.kind, self.args, self.kw = kind, args, kw

    monkeypatch.setattr(module, "get_dq_kernel", lambda *a, **kw: Fake("dq", a, kw))
    monkeypatch.setattr(module, "get_dkdv_kernel", lambda *a, **kw: Fake("dkdv", a, kw))
    monkeypatch.setattr(module, "get_prepass_kernel", lambda *a, **kw: Fake("pre", a, kw))
    monkeypatch.setattr(module, "get_convert_kernel", lambda *a, **kw: Fake("convert", a, kw))
    monkeypatch.setattr(tile_scheduler, "device_schedule",
                        lambda pb_, tq, tk, which: (tq, tk, which))

    def capture(problem, config, dq_kernel, dq_launch, kv_schedule, dkdv_kernel, kv_launch,
                q_schedule, drop, words, band, dq_acc=None):
        seen.update(dq_kernel=dq_kernel, dq_launch=dq_launch, kv_schedule=kv_schedule,
                    dkdv_kernel=dkdv_kernel, kv_launch=kv_launch, q_schedule=q_schedule,
                    dq_acc=dq_acc)
        return "run"
    monkeypatch.setattr(host, "prepare_tensor_core_backward", capture)
    assert module.prepare(pb, config) == "run"
    return seen


@pytest.mark.parametrize("family", ["mma", "tf32"])
@pytest.mark.parametrize("B, Hq, Hkv, Nq, Nk, d, kw", PROBLEMS)
def test_prepare_launches_the_plan(monkeypatch, family, B, Hq, Hkv, Nq, Nk, d, kw):
    module, dtype = FAMILIES[family]
    pb = _problem(dtype, B, Hq, Hkv, Nq, Nk, d, kw)
    config = KernelConfig(launch_order="heads")
    plan = module.plan(pb, config)
    got = _prepared_arguments(monkeypatch, module, pb, config)
    assert got["dq_launch"] == P.launch_of(plan, "dq")
    assert got["kv_launch"] == P.launch_of(plan, "dkdv")
    # the launch the launcher computed from the tiles before the plan existed
    (dq_q, dq_k), (kv_k, kv_q) = module.tiles(pb)
    if family == "tf32":
        kv_q = tf32_bwd.dkdv_dropout_config(d, kv_q, pb.dropout_p > 0).get("block_q", kv_q)
    assert got["dq_launch"][0] == (cdiv(Nq, dq_q), B * Hq)
    assert got["kv_launch"][0] == (cdiv(Nk, kv_k), B * Hkv)
    assert got["dq_launch"][1] == 32 * dq_q // 16 and got["kv_launch"][1] == 32 * kv_k // 16
    assert got["kv_schedule"] == (dq_q, dq_k, "kv") and got["q_schedule"] == (kv_q, kv_k, "q")
    assert got["dq_kernel"].args[1:3] == (dq_q, dq_k)
    assert got["dkdv_kernel"].args[1:3] == (kv_k, kv_q)
    dq_kernel, kv_kernel = plan.kernels
    assert (dq_kernel.phase, kv_kernel.phase) == ("bwd.dq", "bwd.main")   # launch order
    if family == "mma":
        assert dq_kernel.shared_bytes == mma_bwd.dq_smem_bytes(d, dq_k)
        assert kv_kernel.shared_bytes == mma_bwd.dkdv_smem_bytes(d, kv_q, kv_k)
        assert got["dq_launch"][2] == got["kv_launch"][2] == 0          # static shared memory
    else:
        assert dq_kernel.shared_bytes == tf32_bwd.dq_smem_bytes(d, dq_k)
        assert kv_kernel.shared_bytes == tf32_bwd.dkdv_smem_bytes(d, kv_q)
        unroll = tf32_bwd.dkdv_dropout_config(d, 32, pb.dropout_p > 0).get(
            "unroll", tf32_bwd.default_config(d)["unroll"])
        assert got["dkdv_kernel"].kw == {"unroll": unroll}
        assert got["dq_kernel"].kw == {"unroll": tf32_bwd.default_config(d)["unroll"]}
    assert plan.config["launch_order"] == "heads"
    assert got["dq_acc"] == "unused"
    assert "dq_mode" not in plan.config      # on the CPU the mma default is the dQ kernel


@pytest.mark.parametrize("family", ["mma", "tf32"])
@pytest.mark.parametrize("B, Hq, Hkv, Nq, Nk, d, kw", PROBLEMS)
def test_atomic_dq_prepare_launches_the_plan(monkeypatch, family, B, Hq, Hkv, Nq, Nk, d, kw):
    module, dtype = FAMILIES[family]
    pb = _problem(dtype, B, Hq, Hkv, Nq, Nk, d, kw)
    config = KernelConfig(launch_order="heads", backward_dq="atomic")
    plan = module.plan(pb, config)
    assert plan.config["dq_mode"] == "atomic"
    got = _prepared_arguments(monkeypatch, module, pb, config)
    assert got["dq_kernel"] is None and got["dq_launch"] is None
    assert got["kv_launch"] == P.launch_of(plan, "dkdv")
    (pre, pre_launch), (convert, convert_launch) = got["dq_acc"]
    assert pre_launch == P.launch_of(plan, "pre") and convert_launch == P.launch_of(plan, "convert")
    elem = "float16" if family == "mma" else "float32"
    assert pre.args == (d, elem) and convert.args == (d, elem)
    # the dK/dV kernel at the family's atomic tiles (or those dividing the block mask's)
    (_dq, (kv_k, kv_q)) = module.tiles(pb, config)
    if family == "tf32":
        kv_q = tf32_bwd.dkdv_dropout_config(d, kv_q, pb.dropout_p > 0).get("block_q", kv_q)
    if "block_mask" not in kw and family == "mma":
        assert (kv_k, kv_q) == mma_bwd.default_tiles(d)["dkdv_atomic"]
    assert got["dkdv_kernel"].args[1:3] == (kv_k, kv_q)
    assert got["dkdv_kernel"].kw["dq_atomic"] == "scalar"        # no sm_90 here
    assert got["q_schedule"] == (kv_q, kv_k, "q")
    rows = cdiv(Nq, P.ROW_KERNEL_WARPS)
    assert pre_launch == convert_launch == ((rows, B * Hq), 32 * P.ROW_KERNEL_WARPS, 0)
    smem = (P.mma_dkdv_atomic_dynamic_smem_bytes if family == "mma"
            else P.tf32_dkdv_atomic_dynamic_smem_bytes)(d, kv_q, kv_k)
    assert got["kv_launch"] == ((cdiv(Nk, kv_k), B * Hkv), 2 * kv_k, smem)
    assert [k.phase for k in plan.kernels] == ["bwd.pre", "bwd.main", "bwd.post"]


class _RecordingKernel:
    """A stand-in for a compiled kernel under the CUDA simulator (`kernels.host.launch` calls
    ``kern[grid, block, stream, sharedmem](*args)``): records each launch in ``log``."""

    def __init__(self, name, launch, log):
        self.name, self.log = name, log
        _grid, self.threads, self.smem_bytes = launch

    def __getitem__(self, config):
        grid, block, _stream, sharedmem = config
        return lambda *args: self.log.append((self.name, tuple(grid), block, sharedmem, args))


@pytest.mark.parametrize("family, dq_mode", [("mma", "kernel"), ("mma", "atomic"),
                                             ("tf32", "kernel"), ("tf32", "atomic")])
def test_prepared_backward_launches_its_kernels_in_order(monkeypatch, family, dq_mode):
    """`kernels.host.prepare_tensor_core_backward` as the backwards prepare it, run with
    recording kernels: the plan's kernels in launch order with its grids, threads and shared
    memory; the mma dK/dV kernel's float32 dQ accumulator argument a placeholder with the dQ
    kernel, the accumulator the pre-pass zeroes and the conversion reads with atomics (both
    families)."""
    if not host.simulator():
        pytest.skip("the recording kernels stand in for kernels under the CUDA simulator")
    module, dtype = FAMILIES[family]
    B, H, Hkv, N, d = 1, 2, 1, 100, 64
    pb = _problem(dtype, B, H, Hkv, N, N, d, {"causal": True})
    config = KernelConfig(backward_dq=dq_mode)
    plan = module.plan(pb, config)
    log = []
    names = ("pre", "dkdv", "convert") if dq_mode == "atomic" else ("dq", "dkdv")
    fakes = {k: _RecordingKernel(k, P.launch_of(plan, k), log) for k in names}
    monkeypatch.setattr(module, "get_dkdv_kernel", lambda *a, **kw: fakes["dkdv"])
    if dq_mode == "atomic":
        monkeypatch.setattr(module, "get_prepass_kernel", lambda *a, **kw: fakes["pre"])
        monkeypatch.setattr(module, "get_convert_kernel", lambda *a, **kw: fakes["convert"])
    else:
        monkeypatch.setattr(module, "get_dq_kernel", lambda *a, **kw: fakes["dq"])
    run = module.prepare(pb, config)
    z = lambda *shape: np.zeros(shape, dtype)  # noqa: E731
    dq, dk, dv = run(z(B, H, N, d), z(B, Hkv, N, d), z(B, Hkv, N, d), z(B, H, N, d),
                     np.zeros((B, H, N), np.float32), z(B, H, N, d))
    assert dq.shape == (B, H, N, d) and dk.shape == dv.shape == (B, Hkv, N, d)
    assert [entry[0] for entry in log] == list(names)
    for name, grid, block, sharedmem, _args in log:
        assert (grid, block, sharedmem) == P.launch_of(plan, name), name
    kv_args = log[names.index("dkdv")][4]
    acc = kv_args[8]                       # after q, k, v, dO, lse, delta, dK, dV
    if dq_mode == "atomic":
        pre_args, cvt_args = log[0][4], log[2][4]
        assert acc.shape == (B, H, N, d) and acc.dtype == np.float32
        assert pre_args[3] is acc and cvt_args[0] is acc and pre_args[2] is kv_args[5]
        assert cvt_args[2:] == (N, np.float32(pb.scale))
    else:
        assert acc.shape == (1, 1, 1, 1)
        assert log[0][4][6] is kv_args[5]   # the dQ kernel writes the delta dK/dV reads


_BUILD_CHILD = """
import json, sys
from kernels import mma_bwd, tf32_bwd
out = []
for family, d, dq, kv, dropout in json.loads(sys.argv[1]):
    if family == "mma":
        a = mma_bwd.get_dq_kernel(d, dq[0], dq[1], False, True, False, dropout, 4)
        b = mma_bwd.get_dkdv_kernel(d, kv[1], kv[0], False, True, False, dropout, 4)
    else:
        a = tf32_bwd.get_dq_kernel(d, dq[0], dq[1], True, False, dropout, 4, unroll=dq[2])
        b = tf32_bwd.get_dkdv_kernel(d, kv[1], kv[0], True, False, dropout, 4, unroll=kv[2])
    out.append([[a.threads, a.smem_bytes], [b.threads, b.smem_bytes]])
for family, d, kv in json.loads(sys.argv[2]):
    if family == "mma":
        b = mma_bwd.get_dkdv_kernel(d, kv[1], kv[0], False, True, False, False, 4, dq_atomic="v2")
        pre, cvt = mma_bwd.get_prepass_kernel(d, "float16"), mma_bwd.get_convert_kernel(d, "bfloat16")
    else:
        b = tf32_bwd.get_dkdv_kernel(d, kv[1], kv[0], True, False, False, 4, dq_atomic="v2")
        pre, cvt = mma_bwd.get_prepass_kernel(d, "float32"), mma_bwd.get_convert_kernel(d, "float32")
    out.append([[pre.threads, pre.smem_bytes], [b.threads, b.smem_bytes],
                [cvt.threads, cvt.smem_bytes]])
print(json.dumps(out))
"""


def test_compiled_kernels_have_the_plans_threads_and_shared_memory():
    """The kernels as their builders make them (Numba without the simulator, nothing compiled:
    the builders set ``threads`` and ``smem_bytes``) against the plans' launches."""
    cases, plans = [], []
    for family, dtype in (("mma", "fp16"), ("tf32", "fp32")):
        for d in (64, 128):
            for dq, kv, dropout in (((None, None), (None, None), False),
                                    ((32, 16), (16, 32), False), ((16, 32), (32, 16), True)):
                w = Workload(batch=1, heads=2, seq_len_q=100, head_dim=d, dtype=dtype,
                             causal=True, dropout=dropout, pass_="bwd")
                tiles = {} if dq[0] is None else {"dq_tile": dq, "kv_tile": kv}
                plan = plan_for(family, "bwd", w, **tiles)
                u = plan.config.get("unroll", {"dq": None, "dkdv": None})
                cases.append([family, d, [*plan.config["dq_tile"], u["dq"]],
                              [*plan.config["kv_tile"], u["dkdv"]], dropout])
                plans.append(plan)
    atomic_cases, atomic_plans = [], []
    for family, dtype in (("mma", "fp16"), ("tf32", "fp32")):
        for d in (64, 128):
            for kv in (None, (16, 64), (64, 32)):
                w = Workload(batch=1, heads=2, seq_len_q=100, head_dim=d, dtype=dtype,
                             causal=True, pass_="bwd")
                plan = plan_for(family, "bwd", w, dq_mode="atomic",
                                **({} if kv is None else {"kv_tile": kv}))
                atomic_cases.append([family, d, list(plan.config["kv_tile"])])
                atomic_plans.append(plan)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    res = subprocess.run([sys.executable, "-c", _BUILD_CHILD, json.dumps(cases),
                          json.dumps(atomic_cases)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    if res.returncode:
        pytest.skip(f"Numba cannot build CUDA kernels here without the simulator: "
                    f"{res.stderr.strip()[-300:]}")
    built = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(built) == len(plans) + len(atomic_plans)
    for plan, case, kernels_ in zip(plans, cases, built):
        for which, (threads, smem) in zip(("dq", "dkdv"), kernels_):
            _grid, plan_threads, plan_smem = P.launch_of(plan, which)
            assert (threads, smem) == (plan_threads, plan_smem), (case, which)
    for plan, case, kernels_ in zip(atomic_plans, atomic_cases, built[len(plans):]):
        for which, (threads, smem) in zip(("pre", "dkdv", "convert"), kernels_):
            _grid, plan_threads, plan_smem = P.launch_of(plan, which)
            assert (threads, smem) == (plan_threads, plan_smem), (case, which)


# -- counts against closed forms ------------------------------------------------------------------
def _access(kernel, tensor):
    (a,) = [a for a in kernel.accesses if a.tensor == tensor]
    return a


@pytest.mark.parametrize("d", [64, 128])
def test_dense_mma_bytes_and_flops(d):
    B, H, Hkv, N, e = 2, 8, 2, 1000, 2
    w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=N, head_dim=d, dtype="fp16",
                 pass_="bwd")
    plan = plan_for("mma", "bwd", w)
    (dq_q, dq_k), (kv_q, kv_k) = plan.config["dq_tile"], plan.config["kv_tile"]
    dq_kernel, kv_kernel = plan.kernels
    nq, nk = cdiv(N, dq_q), cdiv(N, kv_k)
    rows = B * H * N * d * e                         # Q, dO, O, dQ: each row once
    for t in ("Q", "dO", "O"):
        assert _access(dq_kernel, t).bytes == rows and _access(dq_kernel, t).how == "fragment"
    assert _access(dq_kernel, "dQ").bytes == rows
    # every Q tile of every query head streams all N keys of its KV head
    assert _access(dq_kernel, "K").bytes == _access(dq_kernel, "V").bytes == B * H * nq * N * d * e
    assert _access(dq_kernel, "lse").bytes == _access(dq_kernel, "delta").bytes == B * H * N * 4
    # every K tile of every KV head streams all N query rows of the group's query heads
    for t in ("Q", "dO"):
        assert _access(kv_kernel, t).bytes == B * H * cdiv(N, kv_k) * N * d * e
    assert _access(kv_kernel, "lse").bytes == _access(kv_kernel, "delta").bytes \
        == B * H * nk * N * 4
    for t in ("K", "V", "dK", "dV"):                  # once per KV head, no GQA reduction
        assert _access(kv_kernel, t).bytes == B * Hkv * N * d * e
    assert _access(kv_kernel, "K").how == ("cp.async" if d == 128 else "fragment")
    assert not any(a.tensor.startswith("dQacc") or a.op == "atomic"
                   for k in plan.kernels for a in k.accesses)
    # whole tiles: 3 products per dQ tile, 4 per dK/dV tile
    dq_tiles, kv_tiles = B * H * nq * cdiv(N, dq_k), B * H * cdiv(N, kv_q) * nk
    assert dq_kernel.matmuls[0].executed_flops == dq_tiles * 3 * 2 * dq_q * dq_k * d
    assert kv_kernel.matmuls[0].executed_flops == kv_tiles * 4 * 2 * kv_q * kv_k * d
    assert dq_kernel.mufu_ops == B * H * nq * cdiv(N, dq_k) * dq_q * dq_k
    assert kv_kernel.grid == (nk, B * Hkv) and dq_kernel.grid == (nq, B * H)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tf32_atomic_dq_counts(d, causal):
    """The 3xTF32 backward's dQ by atomics against its dQ-kernel plan at the same dK/dV tiles:
    five 3xTF32 products per tile instead of four in the dK/dV kernel (none in a dQ kernel), K
    re-read from L1 as before and its tile landed once by cp.async, 4 bytes per element of each
    visited tile's query rows added to the accumulator, the dQ phase's splits (each warp splits
    all of the stage's dS once and its quarter of K's columns once), float32 pre-pass and
    conversion reading and writing whole rows."""
    B, H, Hkv, N, e = 2, 8, 2, 1000, 4
    w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=N, head_dim=d, dtype="fp32",
                 causal=causal, pass_="bwd")
    ref = plan_for("tf32", "bwd", w)
    atomic = plan_for("tf32", "bwd", w, dq_mode="atomic")
    assert atomic.config["kv_tile"] == ref.config["kv_tile"] == (32, 64)
    pre, kv_kernel, convert = atomic.kernels
    _dq_ref, kv_ref = ref.kernels
    assert kv_kernel.matmuls[0].executed_flops * 4 == kv_ref.matmuls[0].executed_flops * 5
    assert kv_kernel.matmuls[0].passes == 3
    visited_rows = _access(kv_ref, "Q").bytes // (d * e)
    visits = B * H * BlockInfo(N, N, 32, 64, causal=causal).n_tiles        # whole tiles
    assert _access(kv_kernel, "dQ_acc").bytes == visited_rows * d * 4
    k_loads = {a.how: a.bytes for a in kv_kernel.accesses if a.tensor == "K"}
    assert k_loads["cp.async"] == B * Hkv * N * d * e
    assert k_loads["fragment"] == _access(kv_ref, "K").bytes          # the L1 re-reads as before
    # splits: the reference's, plus per visited tile 4 warps x (32 x 64 dS) + 64 x d of K
    assert kv_kernel.matmuls[0].flops == visits * 5 * 2 * 32 * 64 * d
    extra = visits * (4 * 32 * 64 + 64 * d)
    assert kv_kernel.fp32_flops - kv_ref.fp32_flops == extra * P.TF32_SPLIT_FLOPS
    # one warp of 16 key rows at d = 128: 32 x 128 dQ in four passes of 32 columns, each
    # re-splitting the stage's dS (32 x 16), K split once
    assert P.tf32_dq_atomic_layout(128, 32, 16) == (1, 1, 4)
    if d == 128:
        one = plan_for("tf32", "bwd", w, dq_mode="atomic", kv_tile=(32, 16)).kernels[1]
        one_ref = plan_for("tf32", "bwd", w, kv_tile=(32, 16)).kernels[1]
        visits16 = B * H * BlockInfo(N, N, 32, 16, causal=causal).n_tiles
        assert one.fp32_flops - one_ref.fp32_flops == visits16 * (4 * 32 * 16 + 16 * 128)
    assert P.tf32_dq_atomic_layout(d, 32, 64) == (1, 4, 1)
    for t in ("O", "dO"):
        assert _access(pre, t).bytes == B * H * N * d * e and _access(pre, t).how == "ld"
    assert _access(convert, "dQ_acc").how == "ld" and _access(convert, "dQ").bytes == B * H * N * d * e
    assert [k.name for k in atomic.kernels] == [P.KERNEL_NAMES[("tf32", k)]
                                                for k in ("pre", "dkdv", "convert")]
    assert P.launch_of(atomic, "dkdv")[2] == P.tf32_dkdv_atomic_dynamic_smem_bytes(d, 32, 64) \
        == 4 * (4 * 32 * (d + 4) + 64 * (d + 8) + 32 * (64 + 4))
    assert price(atomic, "h100").time_s > 0


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_atomic_dq_counts(d, causal):
    """dQ by atomics against the dQ-kernel plan at the same dK/dV tiles: no dQ kernel; the dK/dV
    kernel does five products per tile (dQ += dS K added), reads K by cp.async (its tile is the
    B operand of dQ), adds 4 bytes per element of each visited tile's query rows to the float32
    accumulator; the pre-pass reads O and dO and writes delta and the zeroed accumulator, the
    conversion reads it and writes dQ."""
    B, H, Hkv, N, e = 2, 8, 2, 1000, 2
    w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=N, head_dim=d, dtype="fp16",
                 causal=causal, pass_="bwd")
    kv_tile = P.mma_default_tiles(d)["dkdv_atomic"][::-1]
    atomic = plan_for("mma", "bwd", w, dq_mode="atomic")
    assert atomic.config["kv_tile"] == kv_tile and atomic.config["dq_mode"] == "atomic"
    pre, kv_kernel, convert = atomic.kernels
    # compared at tiles both structures take (the dQ-kernel structure's dK/dV kernel has static
    # shared memory: 64 keys, and at d = 128 16 queries, per stage)
    kv_tile = (16, 64) if d == 128 else (64, 64)
    ref = plan_for("mma", "bwd", w, kv_tile=kv_tile)
    atomic = plan_for("mma", "bwd", w, dq_mode="atomic", kv_tile=kv_tile)
    pre, kv_kernel, convert = atomic.kernels
    _dq_ref, kv_ref = ref.kernels
    assert kv_kernel.matmuls[0].executed_flops * 4 == kv_ref.matmuls[0].executed_flops * 5
    rows = B * H * N
    kv_q, kv_k = kv_tile
    visited_rows = _access(kv_ref, "Q").bytes // (d * e)           # query rows, visited tiles
    assert _access(kv_kernel, "dQ_acc").bytes == visited_rows * d * 4
    assert _access(kv_kernel, "dQ_acc").op == "atomic"
    if not causal:
        assert visited_rows == B * H * cdiv(N, kv_k) * N
    k_loads = [a for a in kv_kernel.accesses if a.tensor == "K"]
    assert {a.how for a in k_loads} == ({"cp.async"} if d == 128 else {"cp.async", "fragment"})
    assert all(a.bytes == B * Hkv * N * d * e for a in k_loads)
    for t in ("O", "dO"):
        assert _access(pre, t).bytes == rows * d * e
    assert _access(pre, "delta").bytes == rows * 4 and _access(pre, "dQ_acc").bytes == rows * d * 4
    assert _access(convert, "dQ_acc").bytes == rows * d * 4
    assert _access(convert, "dQ").bytes == rows * d * e
    assert atomic.tensor_bytes["dQ_acc"] == rows * d * 4
    assert [k.name for k in atomic.kernels] == [P.KERNEL_NAMES[("mma", k)]
                                                for k in ("pre", "dkdv", "convert")]
    cost = price(atomic, "h100")
    assert cost.time_s > 0 and [k.name for k in cost.kernels] == [k.name for k in atomic.kernels]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("family, dq_mode", [("mma", "kernel"), ("mma", "atomic"),
                                             ("tf32", "kernel"), ("tf32", "atomic")])
def test_shared_memory_traffic(d, family, dq_mode):
    """Shared-memory bytes moved (landed by cp.async, read by every warp), dense, against a
    count per program written out here: the dQ kernel lands K and V and each warp reads K twice
    and V once per tile; the dK/dV kernel lands Q, dO (and lse, delta), each warp reads Q and dO
    twice, its K rows once more where the mma kernel re-reads K from shared memory, lse and
    delta once per score; with atomics, dS stored once and, once per tile, read by the warps in
    a 2 x (warps / 2) grid (each row of warps reads all of K, each column of warps all of dS).
    float32 elements for tf32 (its K and V come from L1)."""
    B, H, N = 2, 4, 1024
    e = 4 if family == "tf32" else 2
    w = Workload(batch=B, heads=H, seq_len_q=N, head_dim=d, pass_="bwd",
                 dtype="fp32" if family == "tf32" else "fp16")
    plan = plan_for(family, "bwd", w, **({"dq_mode": "atomic"} if dq_mode == "atomic" else {}))
    (dq_q, dq_k), (kv_q, kv_k) = plan.config["dq_tile"], plan.config["kv_tile"]
    kv = plan.kernel(P.KERNEL_NAMES[(family, "dkdv")])
    per_q_tile = (N // kv_q)             # Q tiles each K-tile program visits, per query head
    programs = B * H * (N // kv_k)
    warps = kv_k // 16
    reread = d > 64 and family == "mma"
    per_tile = (2 * kv_q * d * e + 8 * kv_q
                + warps * (4 + reread) * kv_q * d * e + 8 * kv_q * kv_k)
    k_landed = B * H * N * d * e if (reread or dq_mode == "atomic") else 0
    if dq_mode == "atomic" and family == "tf32":
        # 64 keys, 32-query stages, 4 warps each all 32 queries x d/4 columns in one pass: dS
        # stored once, read once by every warp, K read once
        assert (kv_q, kv_k) == (32, 64) and P.tf32_dq_atomic_layout(d, kv_q, kv_k) == (1, 4, 1)
        per_tile += kv_q * kv_k * e * (1 + warps) + kv_k * d * e
    elif dq_mode == "atomic":
        # default tiles: d=64 (64 keys, 128 queries) 4 warps as 2 x 2, each 64 queries x 32
        # columns in one pass (64 accumulators a thread); d=128 (128 keys, 128 queries) 8 warps
        # as 2 x 4, each 64 x 32 in two passes of 16 columns (at most 32 accumulators)
        assert (kv_q, kv_k) == ((128, 64) if d == 64 else (128, 128))
        passes = P.mma_dq_atomic_layout(d, kv_q, kv_k)[2]
        assert passes == (1 if d == 64 else 2)
        per_tile += kv_q * kv_k * e * (1 + passes * warps // 2) + 2 * kv_k * d * e
    assert kv.shared_bytes_moved == programs * per_q_tile * per_tile + k_landed
    if dq_mode == "kernel":
        dq = plan.kernel(P.KERNEL_NAMES[(family, "dq")])
        tiles = B * H * (N // dq_q) * (N // dq_k)
        assert dq.shared_bytes_moved == tiles * (2 + 3 * dq_q // 16) * dq_k * d * e
    cost = price(plan, "h100")
    assert cost.time_s > 0


def test_causal_counts_follow_block_info():
    w = Workload(batch=1, heads=3, seq_len_q=777, head_dim=64, dtype="bf16", causal=True,
                 pass_="bwd")
    plan = plan_for("mma", "bwd", w)
    dq_kernel, kv_kernel = plan.kernels
    assert dq_kernel.matmuls[0].unit == "mma.bf16"
    bi_dq = BlockInfo(777, 777, *plan.config["dq_tile"], causal=True)
    bi_kv = BlockInfo(777, 777, *plan.config["kv_tile"], causal=True)
    keys = sum(bi_dq.k_range(n)[1] - bi_dq.k_range(n)[0] for _m, n in bi_dq.tiles())
    rows = sum(bi_kv.q_range(m)[1] - bi_kv.q_range(m)[0] for m, _n in bi_kv.tiles())
    assert _access(dq_kernel, "K").bytes == 3 * keys * 64 * 2
    assert _access(kv_kernel, "Q").bytes == 3 * rows * 64 * 2
    assert dq_kernel.mufu_ops == 3 * bi_dq.n_tiles * 64 * 64
    assert dq_kernel.lockstep and not kv_kernel.lockstep     # K tiles start at their diagonal


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_tf32_products_are_three_times_the_mma_equivalent(d, causal):
    shape = dict(batch=2, heads=4, heads_kv=2, seq_len_q=500, seq_len_k=300, head_dim=d,
                 causal=causal, pass_="bwd")
    tf32 = plan_for("tf32", "bwd", Workload(dtype="fp32", **shape))
    mma = plan_for("mma", "bwd", Workload(dtype="fp16", **shape), dq_tile=tf32.config["dq_tile"],
                   kv_tile=tf32.config["kv_tile"]) if d == 64 else None
    for k in tf32.kernels:
        (m,) = k.matmuls
        assert (m.unit, m.passes) == ("mma.tf32", 3) and m.executed_flops == 3 * m.flops
    if mma is not None:
        for kt, km in zip(tf32.kernels, mma.kernels):
            assert kt.matmuls[0].flops == km.matmuls[0].flops
            assert kt.mufu_ops == km.mufu_ops
            assert kt.fp32_flops > km.fp32_flops            # the operand splits


def test_tf32_rereads_the_operands_it_keeps_out_of_registers():
    d, B, H, N = 128, 1, 2, 256
    plan = plan_for("tf32", "bwd", Workload(batch=B, heads=H, seq_len_q=N, head_dim=d,
                                            dtype="fp32", pass_="bwd"))
    dq_kernel, kv_kernel = plan.kernels
    (dq_q, dq_k), (kv_q, kv_k) = plan.config["dq_tile"], plan.config["kv_tile"]
    tiles_dq = cdiv(N, dq_q) * cdiv(N, dq_k)
    # d=128: Q and dO re-read at every k-step of every visited tile (dO once more for delta)
    assert _access(dq_kernel, "Q").bytes == B * H * tiles_dq * dq_q * d * 4
    assert _access(dq_kernel, "dO").bytes == B * H * (tiles_dq * dq_q + N) * d * 4
    # the dK/dV kernel re-reads K and V at every visited tile at both head dims
    tiles_kv = cdiv(N, kv_q) * cdiv(N, kv_k)
    assert _access(kv_kernel, "K").bytes == B * H * tiles_kv * kv_k * d * 4
    d64 = plan_for("tf32", "bwd", Workload(batch=B, heads=H, seq_len_q=N, head_dim=64,
                                           dtype="fp32", pass_="bwd"))
    assert _access(d64.kernels[0], "Q").bytes == B * H * N * 64 * 4


def test_boolean_mask_reads_one_byte_per_allowed_score():
    N = 300
    w = Workload(batch=2, heads=2, seq_len_q=N, head_dim=64, dtype="fp16", causal=True,
                 key_lengths=(100, 300), pass_="bwd")
    plan = plan_for("mma", "bwd", w)
    assert plan.config["mask_shape"] == (2, 1, 1, N)
    allowed = 2 * 2 * N * (N + 1) // 2
    for k in plan.kernels:
        assert _access(k, "mask").bytes == allowed and _access(k, "mask").how == "ld"
    rows = plan_for("mma", "bwd", w.replace(key_lengths=None), mask_shape=(2, 2, N, N))
    assert [_access(k, "mask").segment_bytes for k in rows.kernels] == [4, 8]


def test_dropout_moves_the_tf32_dkdv_kernel_to_16_query_stages():
    w = Workload(batch=1, heads=2, seq_len_q=256, head_dim=128, dtype="fp32", dropout=True,
                 pass_="bwd")
    plan = plan_for("tf32", "bwd", w)
    assert plan.config["kv_tile"] == (16, 64) and plan.config["unroll"] == {"dq": 2, "dkdv": 1}
    assert P.launch_of(plan, "dkdv")[2] == 0                 # 34048 bytes: static
    assert P.launch_of(plan, "dq")[2] == tf32_bwd.dq_smem_bytes(128, 32)


@pytest.mark.parametrize("family, dtype", [("mma", "fp16"), ("tf32", "fp32")])
@pytest.mark.parametrize("causal", [False, True])
def test_price_runs(family, dtype, causal):
    w = Workload(batch=4, heads=8, seq_len_q=3000, head_dim=128, dtype=dtype, causal=causal,
                 pass_="bwd")
    cost = price(plan_for(family, "bwd", w), "h100")
    assert cost.time_s > 0 and cost.global_bytes > 0 and cost.flops > 0
    assert [k.name for k in cost.kernels] == [P.KERNEL_NAMES[(family, "dq")],
                                              P.KERNEL_NAMES[(family, "dkdv")]]
    assert all(k.time_s > 0 and k.resident_per_sm >= 1 for k in cost.kernels)


def test_bad_configurations_raise_naming_the_argument():
    w16 = Workload(batch=1, heads=2, seq_len_q=256, head_dim=128, dtype="fp16", pass_="bwd")
    with pytest.raises(ValueError, match="dq_tile"):
        plan_for("mma", "bwd", w16, dq_tile=(64, 64))          # 69632 bytes of static smem
    with pytest.raises(ValueError, match="kv_tile"):
        plan_for("mma", "bwd", w16, kv_tile=(48, 64))
    with pytest.raises(ValueError, match="dq_tile"):
        plan_for("tf32", "bwd", w16.replace(dtype="fp32"), dq_tile=(64, 128))
    with pytest.raises(ValueError, match="workload.dtype"):
        plan_for("mma", "bwd", w16.replace(dtype="fp32"))
    with pytest.raises(ValueError, match="workload.head_dim"):
        plan_for("tf32", "bwd", w16.replace(dtype="fp32", head_dim=96))
    with pytest.raises(ValueError, match="pass_"):
        plan_for("mma", "bwd", w16.replace(pass_="fwd"))
    with pytest.raises(ValueError, match="block_mask_tiles"):
        plan_for("mma", "bwd", w16.replace(block_density=0.5), block_mask_tiles=(48, 48))
    with pytest.raises(ValueError, match="mask_shape"):
        plan_for("mma", "bwd", w16, mask_shape=(1, 1, 1, 100))
    with pytest.raises(ValueError, match="registers"):
        plan_for("mma", "bwd", w16, registers=(128,))
    with pytest.raises(ValueError, match="dq_mode"):
        plan_for("mma", "bwd", w16, dq_mode="atomics")
    # 8 warps over 16 queries: one row of 8 warps, 8 of dQ's 64 columns each (2 x 4 at 64 queries)
    plan_for("mma", "bwd", w16.replace(head_dim=64), dq_mode="atomic", kv_tile=(64, 128))
    with pytest.raises(ValueError, match="kv_tile"):
        plan_for("mma", "bwd", w16.replace(head_dim=64), dq_mode="atomic", kv_tile=(16, 128))
    with pytest.raises(ValueError, match="KernelConfig.backward_dq"):
        KernelConfig(backward_dq="atomics")


def test_one_tile_counts_equal_the_sass_instruction_counts():
    """One program of 128 threads on one 64-row tile, FLOPs summed from the instructions ptxas
    13.0 makes for sm_90 (per thread: the loop body times its trips, the prologue and the
    epilogue; FFMA = 2, FADD = FMUL = 1)."""
    def one(family, dtype, n_k, **tiles):
        w = Workload(batch=1, heads=1, seq_len_q=64, seq_len_k=n_k, head_dim=64, dtype=dtype,
                     pass_="bwd")
        return plan_for(family, "bwd", w, **tiles).kernels
    dq, kv = one("mma", "fp16", 64)
    # dQ, 1 tile: loop 32 FFMA + 32 FADD + 32 FMUL; prologue 16 FFMA, 20 FADD, 18 FMUL; 32 FMUL
    assert dq.fp32_flops == 128 * ((2 * 32 + 32 + 32) + (2 * 16 + 20 + 18) + 32)
    assert dq.mufu_ops == 128 * 32
    # dK/dV, 4 steps of 8 FFMA + 8 FADD + 8 FMUL; 64 staged rows of 1 FMUL; 32 FMUL
    assert kv.fp32_flops == 128 * (4 * (2 * 8 + 8 + 8) + 32) + 64
    dq, kv = one("tf32", "fp32", 64)
    # dQ, 2 tiles of 32 keys: loop 16 FFMA + 224 FADD + 16 FMUL; prologue 32 FFMA (delta),
    # 68 FADD (the hoisted splits of Q and dO, the shuffles), 2 FMUL; 32 FMUL
    assert dq.fp32_flops == 128 * (2 * (2 * 16 + 224 + 16) + (2 * 32 + 68 + 2) + 32)
    # dK/dV, 2 tiles of 32 queries: k-loops 2 x 8 trips of 12 FADD, dV and dK 2 x 80 FADD,
    # 16 FFMA, 16 FADD, 16 FMUL; 64 staged rows; 32 FMUL
    assert kv.fp32_flops == 128 * (2 * (2 * 8 * 12 + 160 + 2 * 16 + 16 + 16) + 32) + 64


def test_schedule_reads_per_warp():
    w = Workload(batch=1, heads=4, heads_kv=1, seq_len_q=256, head_dim=64, dtype="fp16",
                 causal=True, pass_="bwd")
    plan = plan_for("mma", "bwd", w)
    dq, kv = plan.kernels
    tiles = 4 * (1 + 2 + 3 + 4)                    # 4 query heads, causal 64 x 64 tiles
    assert _access(dq, "schedule").bytes == 4 * 4 * (4 * 4 * 2 + 2 * tiles)
    # the dK/dV programs count their items over the 4 query heads (2 offsets a head), seek each
    # head once (2 more), then read one q_index an item
    assert _access(kv, "schedule").bytes == 4 * 4 * (4 * 4 * 4 + tiles)
    assert _access(kv, "schedule").counted_bytes(load_profile("h100")) \
        == 8 * _access(kv, "schedule").bytes
