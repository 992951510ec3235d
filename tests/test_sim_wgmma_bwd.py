"""The Hopper backward's plan (`sim.plans.wgmma_bwd`, family ``wgmma``, pass ``bwd``; CPU only).

* Counts against `ioaware.block_info.BlockInfo`'s schedules, walked here tile by tile (the plan
  takes its tiles from `sim.counts.tile_stats_closed`): three products per visited tile in the
  dQ kernel and four per (query head, Q tile) item in the dK/dV kernel, on whole tiles; the dQ
  kernel's K and V bytes (the keys of each visited tile inside the problem), the dK/dV kernel's
  Q, dO, lse and delta bytes (the queries of each item inside the problem); dense, causal,
  windowed, odd lengths, GQA (Hypothesis and fixed cases).
* Row traffic written out: K and V read once by the dK/dV kernel, Q once and dO twice (TMA and
  fragment) by the dQ kernel, every gradient written once; element-wise work and shared memory
  moved of one problem from the counts the module docstring states.
* The launch: grid, threads, dynamic shared memory (`launch_of`), registers with a producer
  warpgroup; every configuration `wgmma_backward_configs` lists (its tuning space, less the
  kernels ptxas serialises) fits 227 KiB, builds and
  prices.
* Refusals name the argument; the plan is registered (`plan_for`, `plans_for_record`,
  ``python -m sim plan``) and `sim.plan.price` prices it on the h100 and h200 profiles.
"""
from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ioaware.block_info import BlockInfo
from sim.cli import main
from sim.plan import price
from sim.plans import PLANNERS, plan_for, plans_for_record
from sim.plans import wgmma_bwd as P
from sim.workload import Workload

DQ_NAME, DKDV_NAME = "flash_wgmma_bwd_dq", "flash_wgmma_bwd_dkdv"
ROWS, COLS = (64, 128), (64, 128)
DQ_TILES = [(r, c) for r in ROWS for c in COLS]           # (query rows, keys per stage)
KV_TILES = [(c, r) for r in ROWS for c in COLS]           # (queries per stage, key rows)

#: (batch, Hq, Hkv, Nq, Nk, d, causal, window)
PROBLEMS = [
    (1, 2, 2, 64, 64, 64, False, None),
    (2, 8, 2, 1000, 777, 128, True, None),               # GQA, odd lengths, Nq != Nk
    (1, 4, 1, 333, 333, 64, True, None),                 # MQA
    (1, 2, 2, 300, 300, 128, True, (64, 0)),
    (1, 2, 1, 200, 333, 64, False, (40, 17)),
    (1, 2, 2, 90, 400, 128, False, (10, -1)),
    (3, 1, 1, 1, 129, 64, False, None),                  # one query row
]


def _workload(B, Hq, Hkv, Nq, Nk, d, causal, window, dtype="fp16"):
    return Workload(batch=B, heads=Hq, heads_kv=Hkv, seq_len_q=Nq, seq_len_k=Nk, head_dim=d,
                    dtype=dtype, causal=causal, window_size=window, pass_="bwd")


def _access(kernel, tensor, op="load", how=None):
    """Bytes of ``kernel``'s accesses of ``tensor`` (those of one ``how`` if given)."""
    return sum(a.bytes for a in kernel.accesses
               if a.tensor == tensor and a.op == op and (how is None or a.how == how))


def _expected(w: Workload, dq_tile, kv_tile) -> dict:
    """What the kernels do, walked over BlockInfo's CSR schedules (the ones the kernels read)."""
    d, e = w.head_dim, w.dtype_bytes
    (R_dq, C_dq), (C_kv, R_kv) = dq_tile, kv_tile
    # dQ kernel: each Q tile walks kv_schedule's K/V tiles
    bi = BlockInfo(w.seq_len_q, w.seq_len_k, R_dq, C_dq, w.causal, window_size=w.window_size)
    _offsets, kv_index = bi.kv_schedule()
    dq_tiles = len(kv_index)
    dq_keys = sum(bi.k_range(int(n))[1] - bi.k_range(int(n))[0] for n in kv_index)
    # dK/dV kernel: each K/V tile walks, for every query head of its group, q_schedule's Q tiles
    bk = BlockInfo(w.seq_len_q, w.seq_len_k, C_kv, R_kv, w.causal, window_size=w.window_size)
    _offsets, q_index = bk.q_schedule()
    heads = w.batch * w.heads_kv * (w.heads // w.heads_kv)
    kv_items = len(q_index)
    kv_queries = sum(bk.q_range(int(m))[1] - bk.q_range(int(m))[0] for m in q_index)
    return {
        "dq_flops": w.batch * w.heads * dq_tiles * 3 * 2 * R_dq * C_dq * d,
        "dq_scores": w.batch * w.heads * dq_tiles * R_dq * C_dq,
        "dq_kv_bytes": w.batch * w.heads * dq_keys * d * e,
        "dq_tiles": w.batch * w.heads * dq_tiles,
        "kv_flops": heads * kv_items * 4 * 2 * C_kv * R_kv * d,
        "kv_scores": heads * kv_items * C_kv * R_kv,
        "kv_q_bytes": heads * kv_queries * d * e,
        "kv_stat_bytes": heads * kv_queries * 4 * (R_kv // 64),    # each consumer warpgroup
        "kv_items": heads * kv_items,
    }


def _check_counts(w: Workload, dq_tile, kv_tile):
    plan = P.wgmma_backward_plan(w, dq_tile=dq_tile, kv_tile=kv_tile)
    dq, kv = plan.kernel(DQ_NAME), plan.kernel(DKDV_NAME)
    x = _expected(w, dq_tile, kv_tile)
    unit = "wgmma.bf16" if w.dtype == "bf16" else "wgmma.f16"
    assert [(m.unit, m.flops, m.passes) for m in dq.matmuls] == [(unit, x["dq_flops"], 1)]
    assert [(m.unit, m.flops, m.passes) for m in kv.matmuls] == [(unit, x["kv_flops"], 1)]
    assert dq.mufu_ops == x["dq_scores"] and kv.mufu_ops == x["kv_scores"]
    for tensor in ("K", "V"):
        assert _access(dq, tensor, how="tma") == _access(dq, tensor) == x["dq_kv_bytes"]
    for tensor in ("Q", "dO"):
        assert _access(kv, tensor, how="tma") == _access(kv, tensor) == x["kv_q_bytes"]
    for tensor in ("lse", "delta"):
        assert _access(kv, tensor) == x["kv_stat_bytes"]
    return plan, x


@st.composite
def workloads(draw):
    nq = draw(st.integers(1, 700))
    nk = nq if draw(st.booleans()) else draw(st.integers(1, 700))
    causal = draw(st.booleans())
    window = draw(st.one_of(st.none(), st.tuples(st.integers(-1, 300), st.integers(-1, 300))))
    if window is not None and causal and nq != nk:
        causal = False          # a top-left causal rule with a window needs Nq == Nk
    hkv = draw(st.sampled_from((1, 2)))
    return _workload(draw(st.integers(1, 2)), hkv * draw(st.sampled_from((1, 2, 4))), hkv, nq,
                     nk, draw(st.sampled_from((64, 128))), causal, window,
                     draw(st.sampled_from(("fp16", "bf16"))))


@settings(max_examples=40, deadline=None)
@given(w=workloads(), dq_tile=st.sampled_from(DQ_TILES), kv_tile=st.sampled_from(KV_TILES))
def test_products_and_streamed_bytes_follow_blockinfo(w, dq_tile, kv_tile):
    _check_counts(w, dq_tile, kv_tile)


@pytest.mark.parametrize("problem", PROBLEMS)
@pytest.mark.parametrize("tiles", [((128, 64), (64, 128)), ((64, 128), (128, 64))])
def test_fixed_problems_follow_blockinfo(problem, tiles):
    _check_counts(_workload(*problem), *tiles)


def test_causal_visits_fewer_tiles_than_dense():
    """The counts can tell causal from dense: 8 x 8 tiles of 64, causal visits 36 of 64."""
    dense = _workload(1, 1, 1, 512, 512, 64, False, None)
    causal = _workload(1, 1, 1, 512, 512, 64, True, None)
    flops = [P.wgmma_backward_plan(w, dq_tile=(64, 64), kv_tile=(64, 64)).kernel(DQ_NAME)
             .matmuls[0].flops for w in (dense, causal)]
    assert flops == [64 * 3 * 2 * 64 * 64 * 64, 36 * 3 * 2 * 64 * 64 * 64]


@pytest.mark.parametrize("problem", PROBLEMS)
def test_row_traffic_each_tensor_once(problem):
    """The dK/dV kernel reads K and V once (TMA) and writes dK and dV once; the dQ kernel reads Q
    once (TMA), dO twice (TMA, and the fragment for delta), O and lse once, writes delta and dQ
    once."""
    w = _workload(*problem)
    B, Hq, Hkv, Nq, Nk, d, _c, _w = problem
    q_bytes, kv_bytes = B * Hq * Nq * d * 2, B * Hkv * Nk * d * 2
    plan = P.wgmma_backward_plan(w)
    dq, kv = plan.kernel(DQ_NAME), plan.kernel(DKDV_NAME)
    for tensor in ("K", "V"):
        assert [(a.bytes, a.how) for a in kv.accesses if a.tensor == tensor] == [(kv_bytes, "tma")]
    for tensor in ("dK", "dV"):
        assert [(a.op, a.bytes, a.how, a.segment_bytes) for a in kv.accesses
                if a.tensor == tensor] == [("store", kv_bytes, "fragment", 16)]
    assert [(a.bytes, a.how) for a in dq.accesses if a.tensor == "Q"] == [(q_bytes, "tma")]
    assert sorted((a.bytes, a.how) for a in dq.accesses if a.tensor == "dO") == [
        (q_bytes, "fragment"), (q_bytes, "tma")]
    assert [(a.bytes, a.how) for a in dq.accesses if a.tensor == "O"] == [(q_bytes, "fragment")]
    assert _access(dq, "lse") == _access(dq, "delta", "store") == B * Hq * Nq * 4
    assert _access(dq, "dQ", "store", "fragment") == q_bytes
    assert not any(a.op == "atomic" for k in plan.kernels for a in k.accesses)
    assert {a.tensor for a in dq.accesses} == {"schedule", "Q", "dO", "O", "lse", "K", "V",
                                               "delta", "dQ"}
    assert {a.tensor for a in kv.accesses} == {"schedule", "K", "V", "Q", "dO", "lse", "delta",
                                               "dK", "dV"}
    # TMA: Q, dO, K and V (resident or streamed); the dQ kernel reads dO again by plain
    # fragment loads for delta, which the LSU counters see
    for k in (dq, kv):
        assert {a.tensor for a in k.accesses if a.how == "tma"} == {"Q", "dO", "K", "V"}
        assert all(a.op == "load" for a in k.accesses if a.how == "tma")
    assert [a.how for a in dq.accesses if a.tensor == "dO"] == ["tma", "fragment"]


def test_element_wise_work_shared_memory_and_schedule_of_one_problem():
    """B=1, H=2, Hkv=1, N=200 dense, d=64, tiles dq (128, 64), kv (64, 128): written out from
    the module docstring's counts with this problem's numbers."""
    w = _workload(1, 2, 1, 200, 200, 64, False, None)
    plan = P.wgmma_backward_plan(w, dq_tile=(128, 64), kv_tile=(64, 128))
    dq, kv = plan.kernel(DQ_NAME), plan.kernel(DKDV_NAME)
    # dQ kernel: 2 Q tiles x 4 K tiles per head, 2 heads; 400 rows, 256 held a head
    tiles, rows, held = 2 * 4 * 2, 2 * 200, 2 * 256
    scores = tiles * 128 * 64
    assert dq.fp32_flops == (4 * scores + 2 * rows * 64 + 4 * 2 * held + 4 * 1 * rows
                             + rows * 64)
    box_bytes = 2 * 4 * 64 * 64 * 2                  # two heads of four 64-row boxes
    assert dq.shared_bytes_moved == 2 * box_bytes + tiles * 2 * 64 * 64 * 2
    # 8 consumer warps and the producer warp read start and stop per program (2 programs x 2
    # heads) and an index per visited tile; the producer warpgroup's other 3 warps read nothing
    assert _access(dq, "schedule") == 4 * 9 * (2 * 2 * 2 + tiles)
    # dK/dV kernel: 2 K tiles x 4 Q tiles per query head, both heads in the one KV program set
    items, queries = 2 * 4 * 2, 2 * 2 * 200
    # lse * log2(e): each of the 256 consumer threads for its 16 of the item's 64 queries
    assert kv.fp32_flops == 4 * items * 64 * 128 + items * 256 * 16 + 200 * 64
    # each of the two consumer warpgroups loads its item's lse and delta
    assert _access(kv, "lse") == _access(kv, "delta") == 2 * queries * 4
    kv_boxes = 4 * 64 * 64 * 2
    assert kv.shared_bytes_moved == 2 * kv_boxes + items * 2 * 64 * 64 * 2
    # 2 programs, each reads start and stop for both query heads of its group
    assert _access(kv, "schedule") == 4 * 9 * (2 * 2 * 2 + items)
    assert plan.tensor_bytes["schedule"] == 4 * ((2 + 1 + 8) + (2 + 1 + 8))


@pytest.mark.parametrize("d", (64, 128))
@pytest.mark.parametrize("dq_tile", DQ_TILES)
@pytest.mark.parametrize("kv_tile", KV_TILES)
def test_launch_grid_threads_shared_memory_registers(d, dq_tile, kv_tile):
    w = _workload(2, 6, 3, 1000, 300, d, True, None)
    plan = P.wgmma_backward_plan(w, dq_tile=dq_tile, kv_tile=kv_tile, launch_order="heads")
    threads = {128: 384, 64: 160}          # consumer warpgroups + producer warpgroup / warp
    registers = {128: 168, 64: None}       # 65536 / 384 rounded down to 8; not known
    (R_dq, C_dq), (C_kv, R_kv) = dq_tile, kv_tile
    dq_smem = 1024 + 2 * R_dq * d * 2 + 2 * (2 * C_dq * d * 2) + 64
    kv_smem = 1024 + 2 * R_kv * d * 2 + 2 * (2 * C_kv * d * 2) + R_kv // 64 * 2 * C_kv * 8 + 64
    assert P.launch_of(plan, "dq") == ((math.ceil(1000 / R_dq), 12), threads[R_dq], dq_smem)
    assert P.launch_of(plan, "dkdv") == ((math.ceil(300 / R_kv), 6), threads[R_kv], kv_smem)
    dq, kv = plan.kernels
    assert (dq.name, dq.phase, kv.name, kv.phase) == (DQ_NAME, "bwd.dq", DKDV_NAME, "bwd.main")
    assert (dq.shared_bytes, kv.shared_bytes) == (dq_smem, kv_smem)
    assert (dq.registers, kv.registers) == (registers[R_dq], registers[R_kv])
    assert dq.serial_per_program and kv.serial_per_program and dq.serial and kv.serial
    assert plan.config["consumer_warpgroups"] == {"dq": R_dq // 64, "dkdv": R_kv // 64}
    assert (plan.config["dq_tile"], plan.config["kv_tile"]) == (dq_tile, kv_tile)
    assert plan.config["launch_order"] == "heads" and plan.config["stages"] == 2
    given = P.wgmma_backward_plan(w, dq_tile=dq_tile, kv_tile=kv_tile, registers=(200, None))
    assert [k.registers for k in given.kernels] == [200, registers[R_kv]]


@pytest.mark.parametrize("d,n,dq_tile,kv_tile", [
    (64, 256, (64, 64), (128, 128)), (64, P.WGMMA_BWD_WIDE_DQ_FROM - 1, (64, 64), (128, 128)),
    (64, P.WGMMA_BWD_WIDE_DQ_FROM, (128, 128), (128, 128)),
    (128, 256, (128, 128), (64, 128)), (128, 16384, (128, 128), (64, 128))])
def test_defaults_are_the_picked_tiles(d, n, dq_tile, kv_tile):
    # from `benchmarks pick --family wgmma --pass bwd` on an H200 (the plan's docstring)
    w = _workload(1, 2, 2, n, n, d, False, None)
    plan = P.wgmma_backward_plan(w)
    assert (plan.config["dq_tile"], plan.config["kv_tile"]) == (dq_tile, kv_tile)
    assert P.wgmma_bwd_default_tiles(d, n) == {"dq": dq_tile, "dkdv": kv_tile}


@pytest.mark.parametrize("d", (64, 128))
def test_every_listed_configuration_fits_and_builds(d):
    w = _workload(1, 2, 2, 512, 512, d, True, None)
    every = P.wgmma_backward_configs(w, serialised=True)
    assert {(c["dq_tile"], c["kv_tile"]) for c in every} == {
        (q, k) for q in DQ_TILES for k in KV_TILES}
    # the tuning space: less the kernels ptxas serialises (d = 128, 128 queries a stage)
    configs = P.wgmma_backward_configs(w)
    assert len(configs) == (16 if d == 64 else 8)
    assert all(c["kv_tile"][0] == 64 or d == 64 for c in configs)
    for cfg in every:
        plan = plan_for("wgmma", "bwd", w, **cfg)
        assert all(k.shared_bytes <= 227 * 1024 for k in plan.kernels)
        assert price(plan, "h100").time_s > 0


@pytest.mark.parametrize("change, word", [
    (dict(dropout=True), "dropout"),
    (dict(block_density=0.5), "block"),
    (dict(key_lengths=(100,)), "key_lengths"),
    (dict(dtype="fp32"), "dtype"),
    (dict(head_dim=96), "head_dim"),
    (dict(pass_="fwd"), "pass_"),
])
def test_workload_refusals_name_the_field(change, word):
    w = _workload(1, 2, 2, 256, 256, 64, False, None).replace(**change)
    with pytest.raises(ValueError, match=word):
        P.wgmma_backward_plan(w)


@pytest.mark.parametrize("kwargs, word", [
    (dict(dq_tile=(32, 64)), "dq_tile"),
    (dict(dq_tile=(128, 256)), "dq_tile"),
    (dict(dq_tile=(64, 128, 1)), "dq_tile"),
    (dict(kv_tile=(128, 32)), "kv_tile"),
    (dict(kv_tile=(256, 64)), "kv_tile"),
    (dict(kv_tile=(True, 64)), "kv_tile"),
    (dict(registers=(0, 128)), "registers"),
    (dict(registers=(128,)), "registers"),
])
def test_argument_refusals_name_the_argument(kwargs, word):
    w = _workload(1, 2, 2, 256, 256, 64, False, None)
    with pytest.raises(ValueError, match=word):
        P.wgmma_backward_plan(w, **kwargs)
    with pytest.raises(ValueError, match="kernel"):
        P.launch_of(P.wgmma_backward_plan(w), "pre")


def test_registered_for_plan_for_and_records():
    assert PLANNERS[("wgmma", "bwd")] == "sim.plans.wgmma_bwd:wgmma_backward_plan"
    w = _workload(2, 8, 2, 1000, 777, 128, True, None)
    registered = plan_for("wgmma", "bwd", w, kv_tile=(128, 64))
    direct = P.wgmma_backward_plan(w, kv_tile=(128, 64))
    assert (registered.family, registered.pass_) == ("wgmma", "bwd")
    assert registered.kernels == direct.kernels and registered.config == direct.config
    rec = {"kernel": "ioaware-numba", "variant": "wgmma", "pass": "fwd+bwd", "batch": 2,
           "heads": 8, "heads_kv": 2, "seq_len_q": 1024, "seq_len_k": 1024, "head_dim": 128,
           "dtype": "bf16", "causal": True, "block_q": 128, "block_k": 128}
    fwd, bwd = plans_for_record(rec)
    assert (fwd.pass_, bwd.family, bwd.pass_) == ("fwd", "wgmma", "bwd")
    assert [k.name for k in bwd.kernels] == [DQ_NAME, DKDV_NAME]
    assert bwd.kernels[0].matmuls[0].unit == "wgmma.bf16"
    (only,) = plans_for_record(dict(rec, **{"pass": "bwd"}))
    assert only.kernels == bwd.kernels


@pytest.mark.parametrize("profile", ("h100", "h200"))
@pytest.mark.parametrize("problem", PROBLEMS[:4])
def test_price_is_positive(profile, problem):
    cost = price(P.wgmma_backward_plan(_workload(*problem)), profile)
    assert cost.time_s > 0 and all(k.time_s > 0 and k.resident_per_sm >= 1 for k in cost.kernels)
    assert [k.phase for k in cost.kernels] == ["bwd.dq", "bwd.main"]


def test_sim_plan_command_prints_the_backward():
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["plan", "--family", "wgmma", "--pass", "bwd", "--seq-len", "512",
                   "--head-dim", "64", "--causal", "--json"])
    d = json.loads(buf.getvalue())
    assert rc == 0 and d["family"] == "wgmma" and d["pass"] == "bwd" and d["time_ms"] > 0
    assert [k["name"] for k in d["kernels_plan"]] == [DQ_NAME, DKDV_NAME]
    with pytest.raises(SystemExit, match="--schedule"):
        main(["plan", "--family", "wgmma", "--pass", "bwd", "--seq-len", "512",
              "--schedule", "serial"])


def test_a_record_is_priced_at_the_tiles_it_ran():
    from sim.plans import plans_for_record
    rec = {"kernel": "ioaware-numba", "variant": "wgmma", "pass": "bwd", "dtype": "fp16",
           "batch": 2, "heads": 4, "heads_kv": 4, "seq_len_q": 1500, "seq_len_k": 1500,
           "head_dim": 64, "causal": True}
    # a record from before records named them ran the defaults of then
    (plan,) = plans_for_record(rec)
    assert (plan.config["dq_tile"], plan.config["kv_tile"]) == ((64, 64), (64, 128))
    assert P.record_config(dict(rec, head_dim=128)) == {"dq_tile": (128, 128),
                                                        "kv_tile": (64, 128), "launch_order": 4}
    # ... in the launch order it names (or its pass's default), unbalanced, as kernels before
    # the balancing ran; a record marked launch_balanced ran the balanced order
    assert plan.config["launch_order"] == 4
    assert P.record_config(dict(rec, launch_head_group=1))["launch_order"] == 1
    assert P.record_config(dict(rec, launch_balanced=True))["launch_order"] is None
    # what the benchmarks write for today's kernels reads back as their defaults, balanced
    assert P.record_config(dict(rec, **P.record_fields(64, 4096))) == {
        "dq_tile": (128, 128), "kv_tile": (128, 128), "launch_order": None}
    # a record that names them (JSON lists) is priced at those
    (plan,) = plans_for_record(dict(rec, dq_tile=[64, 64], kv_tile=[128, 128]))
    assert (plan.config["dq_tile"], plan.config["kv_tile"]) == ((64, 64), (128, 128))
    # the benchmark's forward + backward record: the backward's plan takes them
    both = plans_for_record(dict(rec, **{"pass": "fwd+bwd", "variant_bwd": "wgmma",
                                         "dq_tile": [128, 128], "kv_tile": [128, 128]}))
    assert both[1].config["kv_tile"] == (128, 128)
