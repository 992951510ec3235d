"""The CUDA-core ("simt") family's plans (`sim.plans.simt`): against the Nsight Compute counters
of the shipped sweeps (the plans' constants come from the kernels' code, nothing is read from
these records), against brute-force counts of the tiles and scores, and against the launch
shapes `kernels.simt_fwd` / `kernels.simt_bwd` use."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from ioaware.block_info import BlockInfo, cdiv
from sim.compare import _measured
from sim.plan import price
from sim.plans import CONFIGS, PLANNERS, choose, plan_for, plans_for_record
from sim.plans.simt import (STATIC_SMEM_LIMIT_BYTES, _band_counts, dkdv_smem_bytes,
                            fwd_kernel_smem_bytes, fwd_smem_bytes, record_is_current, simt_backward_configs, simt_backward_plan,
                            simt_forward_plan)
from sim.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = [ROOT / "results" / "h100_sweep_20261122.json", ROOT / "results" / "h200_sweep_20261122.json"]
#: The agreement the plans must reach on every current record with counters.
GLOBAL_BYTES_TOLERANCE = 0.05
FLOPS_TOLERANCE = 0.02


def _simt_records():
    """``[(file, record)]``: the simt records of the sweeps with counters, on today's kernels."""
    out = []
    for path in SWEEPS:
        for rec in json.loads(path.read_text())["records"]:
            if rec["kernel"] != "ioaware-numba" or rec.get("variant", "simt") != "simt":
                continue
            if rec.get("global_load_bytes") is None or not record_is_current(rec):
                continue
            out.append((path.name[:4], rec))
    return out


RECORDS = _simt_records()


def _errors(rec):
    costs = [price(p, "h100") for p in plans_for_record(rec)]
    bytes_err = sum(c.global_bytes for c in costs) / _measured(rec, "global_bytes") - 1
    flops_err = sum(c.flops for c in costs) / _measured(rec, "flops") - 1
    return bytes_err, flops_err


def test_the_sweeps_hold_the_expected_current_records():
    """H100: 88 forwards (80 float32, 8 float16) and 68 backwards (60 + 8) on today's kernels;
    H200: 62 float32 forwards (its backwards ran the thread-per-row delta kernel, and 18 of its
    forwards ``flash_fwd``, both gone)."""
    count = {}
    for gpu, rec in RECORDS:
        key = (gpu, rec["pass"], rec["dtype"])
        count[key] = count.get(key, 0) + 1
    assert count == {("h100", "fwd", "fp32"): 80, ("h100", "fwd", "fp16"): 8,
                     ("h100", "bwd", "fp32"): 60, ("h100", "bwd", "fp16"): 8,
                     ("h200", "fwd", "fp32"): 62}


@pytest.mark.parametrize("gpu,rec", RECORDS, ids=[f"{g}-{r['pass']}-{r['dtype']}-d{r['head_dim']}-"
                                                  f"{r['block_q']}x{r['block_k']}-"
                                                  f"{'causal' if r['causal'] else 'full'}-{r['seq_len_q']}"
                                                  for g, r in RECORDS])
def test_plan_against_the_sweeps_counters(gpu, rec):
    """Global bytes (loads + stores + atomics) within 5 % and FLOPs (2 FFMA + FADD + FMUL of
    float32, `sim.compare._measured`) within 2 % of Nsight Compute's, for every launch of the
    record's call (the torch fill and conversion kernels included)."""
    bytes_err, flops_err = _errors(rec)
    assert abs(bytes_err) < GLOBAL_BYTES_TOLERANCE, bytes_err
    assert abs(flops_err) < FLOPS_TOLERANCE, flops_err


def test_agreement_summary(capsys):
    """Median and worst relative error per GPU, pass and dtype (printed with ``-s``); today the
    bytes agree to 0.4 % and the FLOPs to 0.02 % at worst."""
    groups = {}
    for gpu, rec in RECORDS:
        groups.setdefault((gpu, rec["pass"], rec["dtype"]), []).append(_errors(rec))
    for key, errs in sorted(groups.items()):
        b = [e[0] for e in errs]
        f = [e[1] for e in errs]
        print(f"{' '.join(key)}: {len(errs)} records, global bytes median {statistics.median(b):+.4%} "
              f"worst {max(map(abs, b)):.4%}; FLOPs median {statistics.median(f):+.5%} "
              f"worst {max(map(abs, f)):.5%}")
        assert max(map(abs, b)) < 0.005 and max(map(abs, f)) < 0.0005


@pytest.mark.parametrize("causal,window,block_mask,key_len", [
    (False, None, None, None), (True, None, None, None), (False, (7, 3), None, None),
    (True, (9, 0), None, None), (False, None, "random", None), (True, None, "random", None),
    (False, None, None, 29), (True, (5, 0), "random", 31)])
@pytest.mark.parametrize("nq,nk,bq,bk", [(45, 45, 8, 16), (37, 53, 16, 8), (64, 64, 16, 16)])
def test_band_counts_equal_a_walk_over_every_score(causal, window, block_mask, key_len, nq, nk, bq, bk):
    """The dK/dV kernel's ``ok`` scores (key inside the problem and the band; all rows of a Q
    tile, padding too; a key-padding mask only on rows inside the problem) and the rows with an
    allowed key, against a walk over every score of every visited tile."""
    if window is not None and causal and nq != nk:
        pytest.skip("a window with causal needs nq == nk")
    bm = None
    if block_mask == "random":
        bm = np.random.default_rng(nq * nk + bq).random((cdiv(nq, bq), cdiv(nk, bk))) < 0.6
    bi = BlockInfo.with_block_mask(nq, nk, bq, bk, causal, bm,
                                   "bottom_right" if (window and nq != nk) else "top_left", window)
    lo, hi = bi.band
    allowed = 0
    rows_with_keys = set()
    for m in range(bi.n_blocks_q):
        for n in bi.k_blocks(m):
            for r in range(m * bq, (m + 1) * bq):
                for c in range(n * bk, min((n + 1) * bk, nk)):
                    ok = (lo is None or c - r >= lo) and (hi is None or c - r <= hi)
                    if key_len is not None and r < nq:
                        ok = ok and c < key_len
                    if ok:
                        allowed += 1
                        if r < nq:
                            rows_with_keys.add(r)
    assert _band_counts(bi, key_len) == (allowed, len(rows_with_keys))


def test_plans_count_what_the_kernels_move_on_a_gqa_problem():
    """Lengths no multiple of a tile, GQA, float16: the forward reads Q and writes O once per row,
    K and V once per Q tile of the slice; the dK/dV kernel reads K and V once per KV head, Q and
    dO once per (query head, K tile), adds dQ by atomics as often, writes dK and dV once per KV
    head (no reduction kernel)."""
    B, H, Hkv, Nq, Nk, d = 2, 4, 2, 300, 200, 64
    w = Workload(batch=B, heads=H, heads_kv=Hkv, seq_len_q=Nq, seq_len_k=Nk, head_dim=d, dtype="fp16")
    fwd = simt_forward_plan(w, block_q=32, block_k=16, micro_tile=(4, 2))
    (k,) = fwd.kernels
    got = {(a.tensor, a.op): a.bytes for a in k.accesses}
    nq, nk = cdiv(Nq, 32), cdiv(Nk, 16)
    assert k.grid == (nq, B * H) and k.threads == 8 * 8
    assert got[("Q", "load")] == B * H * Nq * d * 2 and got[("O", "store")] == B * H * Nq * d * 2
    assert got[("K", "load")] == got[("V", "load")] == B * H * nq * Nk * d * 2
    assert got[("lse", "store")] == B * H * Nq * 4
    # O: 8 threads of a row write 16 bytes of it per warp instruction
    (o,) = [a for a in k.accesses if a.tensor == "O"]
    assert (o.how, o.segment_bytes) == ("fragment", 16)
    assert k.matmuls[0].flops == 4 * d * 32 * 16 * nq * nk * B * H

    bwd = simt_backward_plan(w.replace(pass_="bwd"), block_q=16, block_k=32)
    names = [k.name for k in bwd.kernels]
    assert names == ["flash_bwd_delta_v2", "torch fill (dQ_acc)", "flash_bwd_dkdv_v2",
                     "torch copy fp32->fp16 (dQ)"]
    main = bwd.kernel("flash_bwd_dkdv_v2")
    got = {(a.tensor, a.op): a.bytes for a in main.accesses}
    kq = cdiv(Nk, 32)
    assert main.grid == (kq, B * Hkv)
    assert got[("K", "load")] == got[("V", "load")] == B * Hkv * Nk * d * 2
    assert got[("Q", "load")] == got[("dO", "load")] == B * H * kq * Nq * d * 2
    assert got[("dQ_acc", "atomic")] == B * H * kq * Nq * d * 4
    assert got[("dK", "store")] == got[("dV", "store")] == B * Hkv * Nk * d * 2
    delta = bwd.kernel("flash_bwd_delta_v2")
    assert delta.grid == (cdiv(Nq, 8), B * H) and delta.threads == 256
    # float32: dQ is the accumulator itself; NumPy float16: cast4, no fill kernel
    assert [k.name for k in simt_backward_plan(w.replace(pass_="bwd", dtype="fp32")).kernels] == [
        "flash_bwd_delta_v2", "torch fill (dQ_acc)", "flash_bwd_dkdv_v2"]
    assert [k.name for k in simt_backward_plan(w.replace(pass_="bwd"), arrays="numpy").kernels] == [
        "flash_bwd_delta_v2", "flash_bwd_dkdv_v2", "cast4"]
    # bfloat16 is staged as float32: 3 + 1 conversions around the forward, 5 + 3 around the backward
    assert len(simt_forward_plan(w.replace(dtype="bf16")).kernels) == 5
    bf = simt_backward_plan(w.replace(dtype="bf16", pass_="bwd"))
    assert len(bf.kernels) == 11 and sum(k.name.startswith("torch copy") for k in bf.kernels) == 8


def test_registry_configurations_and_records():
    w = Workload(batch=2, heads=8, seq_len_q=1024, head_dim=64, dtype="fp32", causal=True)
    assert ("simt", "fwd") in PLANNERS and ("simt", "bwd") in CONFIGS
    assert plan_for("simt", "fwd", w).config["block_q"] == 64          # the default tiles
    cfg, cost, ranked = choose("simt", "bwd", w.replace(pass_="bwd"), "h100")
    assert cost.time_s == ranked[0][0] and ranked[0][1] == cfg
    assert len(ranked) == len(simt_backward_configs(w)) > 1
    for _t, c in ranked:                      # every listed configuration fits 48 KiB
        plan = plan_for("simt", "bwd", w.replace(pass_="bwd"), **c)
        assert plan.kernel("flash_bwd_dkdv_v2").shared_bytes <= STATIC_SMEM_LIMIT_BYTES
    gpu, rec = next((g, r) for g, r in RECORDS if r["pass"] == "bwd")
    unnamed = {k: v for k, v in rec.items() if k != "variant"}
    assert [p.family for p in plans_for_record(unnamed)] == ["simt"]
    old = dict(rec, ncu_kernels=[{"name": "make_delta_kernel::flash_bwd_delta[v1]"},
                                 {"name": "make_dkdv_kernel::flash_bwd_dkdv[v1]"},
                                 {"name": "make_dq_kernel::flash_bwd_dq[v1]"}])
    assert plans_for_record(old) is None
    both = plans_for_record(dict(rec, **{"pass": "fwd+bwd", "micro_tile": [2, 4]}))
    assert [p.pass_ for p in both] == ["fwd", "bwd"] and both[0].config["micro_tile"] == (2, 4)


def test_launch_shapes_equal_the_ptxas_table():
    """Threads, static shared memory and registers of every configuration of the shipped ptxas
    table (`results/kernel_resources_sm90.json`, compiled for sm_90) equal the plans'."""
    from sim.resources import load_resources
    table = load_resources().values()
    checked = 0
    for e in table:
        if e["kernel"] not in ("flash_fwd_v2", "flash_bwd_dkdv_v2", "flash_bwd_delta_v2"):
            continue
        w = Workload(batch=1, heads=2, seq_len_q=256, head_dim=e["head_dim"], dtype=e["dtype"],
                     causal=e["causal"], pass_="fwd" if e["kernel"] == "flash_fwd_v2" else "bwd")
        if e["kernel"] == "flash_fwd_v2":
            k = simt_forward_plan(w, block_q=e["block_m"], block_k=e["block_n"],
                                  micro_tile=tuple(e["tile"])).kernels[0]
        elif e["kernel"] == "flash_bwd_dkdv_v2":
            k = simt_backward_plan(w, block_q=e["block_n"], block_k=e["block_m"],
                                   micro_tile_kv=tuple(e["tile"])).kernel("flash_bwd_dkdv_v2")
        else:
            k = simt_backward_plan(w).kernel("flash_bwd_delta_v2")
        assert (k.threads, k.shared_bytes, k.registers) == (
            e["threads_per_block"], e["static_smem_bytes"], e["registers_per_thread"]), e["key"]
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("kwargs,argument", [
    ({"block_q": 0}, "block_q"), ({"block_k": 12.5}, "block_k"), ({"micro_tile": (3, 3)}, "micro_tile"),
    ({"block_q": 128, "block_k": 64}, "block_q=128, block_k=64"), ({"arrays": "cupy"}, "arrays")])
def test_bad_configuration_names_the_argument(kwargs, argument):
    w = Workload(batch=1, heads=1, seq_len_q=128, head_dim=64, dtype="fp32")
    with pytest.raises(ValueError, match=argument):
        simt_forward_plan(w, **kwargs)
    bwd_kwargs = {("micro_tile_kv" if k == "micro_tile" else k): v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=argument.replace("micro_tile", "micro_tile_kv")):
        simt_backward_plan(w.replace(pass_="bwd"), **bwd_kwargs)
    with pytest.raises(ValueError, match="workload.head_dim"):
        simt_forward_plan(w.replace(head_dim=512))
    with pytest.raises(ValueError, match="arrays"):
        simt_backward_plan(w.replace(dtype="bf16", pass_="bwd"), arrays="numpy")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_launchers_launch_what_their_plans_say(monkeypatch, dtype, causal):
    """`kernels.simt_fwd.plan` / `kernels.simt_bwd.plan` are built from the tiles the launchers
    use, and the launchers launch each of our kernels with its plan's grid and threads (the
    launches are recorded, not run), static shared memory as the kernel's tiles need."""
    from ioaware._inputs import check_inputs
    from kernels import host, simt_bwd, simt_fwd
    from kernels.config import KernelConfig

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 45, 32)).astype(dtype)
    kv = rng.standard_normal((2, 2, 45, 32)).astype(dtype)
    pb = check_inputs(q, kv, kv, causal=causal)
    launched = []
    monkeypatch.setattr(host, "launch", lambda kern, grid, block, *a, **k: launched.append(
        (tuple(grid), block)))

    for config in (KernelConfig(), KernelConfig(block_q=32, block_k=16)):
        launched.clear()
        fplan = simt_fwd.plan(pb, config)
        cfg = simt_fwd.tiles(pb, config)
        (fk,) = fplan.kernels
        assert fk.grid == (cdiv(45, cfg.block_m), 8) and fk.threads == cfg.threads
        assert fk.shared_bytes == fwd_kernel_smem_bytes(cfg, 32, cfg.threads % 32 == 0)
        assert fk.shared_bytes <= fwd_smem_bytes(cfg, 32)       # what `supports` checks
        assert fplan.config["micro_tile"] == (cfg.tm, cfg.tn) and fplan.config["arrays"] == "numpy"
        simt_fwd.forward(pb, config)
        assert launched == [(fk.grid, fk.threads)]

        launched.clear()
        bplan = simt_bwd.plan(pb, config)
        bcfg = simt_bwd.tiles(pb, config)
        main = bplan.kernel("flash_bwd_dkdv_v2")
        assert main.grid == (cdiv(45, bcfg.block_m), 4) and main.threads == bcfg.threads
        assert main.shared_bytes == dkdv_smem_bytes(bcfg, 32)
        lse = np.zeros((2, 4, 45), np.float32)
        simt_bwd.backward(pb, q, lse, q, config)
        ours = [(k.grid, k.threads) for k in bplan.kernels if not k.name.startswith("torch")]
        assert launched == ours
        assert len(ours) == (3 if dtype == np.float16 else 2)
