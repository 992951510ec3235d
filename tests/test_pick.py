"""``python -m benchmarks pick`` without a GPU: the grid, the report on hand-made timings and on
the shipped tile sweep, and the refusals (bad arguments, malformed files, no GPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import pick
from benchmarks.pick import Group, grid, pick_report
from sim.plans import CONFIGS, choose
from sim.profiles import RATE_UNITS, RATES_SCHEMA
from tests.conftest import REAL_GPU

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_PICKS = (ROOT / "results" / "pick_h100_2026-11-24.json",
                 ROOT / "results" / "pick_wgmma_h100_2026-11-24.json")
H100 = "NVIDIA H100 80GB HBM3"


def _run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "benchmarks", "pick", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def _doc(records, gpu=H100):
    return {"schema": pick.SCHEMA, "provenance": {"gpu": gpu, "date": "2026-11-25T00:00:00+00:00",
                                                  "command": "python -m benchmarks pick"},
            "records": records, "complete": True}


def _group_records(g: Group, loss: float, *, pick_refused=False):
    """Records of one group: some configuration other than the model's pick is the best
    (1 ms), the pick takes 1 + loss ms (or is refused), every other one 2 ms."""
    cfg, _cost, ranked = choose(g.family, g.pass_, g.workload(), "h100")
    others = [c for _t, c in ranked if c != cfg]
    best = others[0]
    recs = []
    for _t, c in ranked:
        rec = dict(g.fields(), config=c)
        if c == cfg and pick_refused:
            recs.append(dict(rec, refused="not in this test"))
            continue
        recs.append(dict(rec, time_ms=1.0 + loss if c == cfg else 1.0 if c == best else 2.0))
    return recs, cfg, best


# -- the grid ------------------------------------------------------------------------------------

def test_default_grid_has_16_groups_per_family_and_the_stated_shapes():
    groups = grid()
    for key in CONFIGS:
        mine = [g for g in groups if (g.family, g.pass_) == key]
        assert len(mine) >= 16, key
        assert {g.head_dim for g in mine} == {64, 128}
        assert {g.causal for g in mine} == {False, True}
        assert {g.seq_len for g in mine} == {512, 2048, 8192, 16384}
        assert len({g.dtype for g in mine}) == 1
    for g in groups:
        assert g.batch == max(1, pick.TOKENS // g.seq_len)
        assert g.heads * g.head_dim == pick.HEAD_WIDTH.get(g.family, pick.DEFAULT_HEAD_WIDTH)
    assert {g.dtype for g in groups if g.family == "mma"} == {"fp16"}
    assert {g.dtype for g in groups if g.family == "tf32"} == {"fp32"}
    quick = grid(quick=True)
    assert 0 < len(quick) < len(groups) and {g.head_dim for g in quick} == {64}
    assert {g.dtype for g in grid(["mma"], dtypes=["bf16", "fp32"])} == {"bf16"}


def test_estimate_counts_one_compile_per_kernel_not_per_seq_len():
    est = pick.estimate(grid())
    # a kernel depends on (family, dtype, d, causal, tiles), not on N, B or H; the wgmma
    # backward's two kernels each on their own tile (4 dQ + 4 dK/dV tiles for its 16 pairs at
    # d = 64; at d = 128 its tuning space leaves out the two dK/dV tiles ptxas serialises)
    n_configs = sum(len(choose(g.family, g.pass_, g.workload(), "h100")[2])
                    for g in grid() if g.seq_len == 512)
    bwd = [g for g in grid() if (g.family, g.pass_) == ("wgmma", "bwd") and g.seq_len == 512]
    pairs = {g.head_dim: [c for _t, c in choose("wgmma", "bwd", g.workload(), "h100")[2]]
             for g in bwd}
    assert bwd and {d: len(p) for d, p in pairs.items()} == {64: 16, 128: 8}
    saved = sum(len(pairs[g.head_dim]) - len({c["dq_tile"] for c in pairs[g.head_dim]})
                - len({c["kv_tile"] for c in pairs[g.head_dim]}) for g in bwd)
    assert est["configs"] == 4 * n_configs
    assert est["kernels"] == n_configs - saved
    assert est["total_s"] == pytest.approx(est["compile_s"] + est["timing_s"])
    assert 0 < est["timing_s"] < est["compile_s"] < 900


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match=r"^family: unknown 'nope'"):
        grid(["nope"])
    with pytest.raises(ValueError, match=r"^pass: "):
        grid(passes=["sideways"])
    with pytest.raises(ValueError, match=r"^dtypes: "):
        grid(dtypes=["fp8"])
    for args, flag in ((("--family", "nope"), "--family"), (("--dtypes", "fp64"), "--dtypes")):
        r = _run(*args)
        assert r.returncode == 2
        assert flag in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- the report ----------------------------------------------------------------------------------

def test_report_of_hand_made_timings_gives_the_picks_and_losses():
    g1 = Group("mma", "fwd", "fp16", 64, False, 4096, 4, 16)
    g2 = Group("mma", "fwd", "fp16", 128, True, 2048, 8, 8)
    g3 = Group("tf32", "fwd", "fp32", 64, True, 512, 32, 4)
    r1, pick1, best1 = _group_records(g1, 0.03)
    r2, pick2, best2 = _group_records(g2, 0.10)
    r3, pick3, _best3 = _group_records(g3, 0.0, pick_refused=True)
    rep = pick_report(_doc(r1 + r2 + r3))
    by = {(e["family"], e["head_dim"]): e for e in rep["groups"]}
    e1, e2, e3 = by["mma", 64], by["mma", 128], by["tf32", 64]
    assert (e1["pick"], e1["best"], e1["pick_ms"], e1["best_ms"]) == (pick1, best1, 1.03, 1.0)
    assert e1["loss_pct"] == pytest.approx(3.0) and e1["within_5pct"] and e1["pick_rank"] == 2
    assert (e2["pick"], e2["best"]) == (pick2, best2)
    assert e2["loss_pct"] == pytest.approx(10.0) and not e2["within_5pct"]
    assert e3["pick"] == pick3 and e3["pick_ms"] is None and e3["loss_pct"] is None
    assert not e3["within_5pct"] and e3["pick_untimed_why"] == "not in this test"
    mma, tf32 = rep["families"]["mma fwd"], rep["families"]["tf32 fwd"]
    assert (mma["groups"], mma["within_5pct"], mma["share_within_5pct"]) == (2, 1, 0.5)
    assert mma["lost_ms"] == pytest.approx(0.13) and mma["best_ms"] == pytest.approx(2.0)
    assert mma["lost_pct"] == pytest.approx(6.5) and mma["worst_loss_pct"] == pytest.approx(10.0)
    assert not mma["meets_target"]
    assert (tf32["groups"], tf32["within_5pct"], tf32["untimed_picks"]) == (1, 0, 1)
    assert rep["profile"] == "h100" and set(rep["rate_sources"].values()) == {"datasheet"}
    text = pick.format_report(rep)
    assert "1 of 2 groups (50 %; target >= 90 %: not met)" in text and "1 picks not timed" in text


def test_backward_tile_pairs_are_picked_and_read_back_from_json():
    """The wgmma backward's configurations are tile pairs (tuples), which a results file holds as
    lists: the report must still find the pick's and the default's records, and choose must
    rank pairs (ties: larger tiles first, element by element)."""
    import json

    from sim.plans import _larger_first
    assert ("wgmma", "bwd") in CONFIGS
    assert _larger_first({"dq_tile": (128, 64), "kv_tile": (64, 128)}) == (-128, -64, -64, -128)
    g = Group("wgmma", "bwd", "fp16", 128, True, 2048, 8, 8)
    assert g in grid(["wgmma"], passes=["bwd"])
    recs, pick_cfg, best = _group_records(g, 0.02)
    assert all(isinstance(v, tuple) for v in pick_cfg.values())
    rep = pick_report(json.loads(json.dumps(_doc(recs))))
    (e,) = rep["groups"]
    assert (e["pick"], e["best"]) == (pick_cfg, {k: list(v) for k, v in best.items()})
    assert e["pick_ms"] == pytest.approx(1.02) and e["within_5pct"]
    assert e["configs_timed"] == e["configs_legal"] == 8     # d = 128: the unserialised pairs
    from sim.plans.wgmma_bwd import wgmma_bwd_default_tiles
    tiles = wgmma_bwd_default_tiles(128)
    assert e["default"] == {"dq_tile": tiles["dq"], "kv_tile": tiles["dkdv"]}
    assert e["default_ms"] in (1.0, 2.0, 1.02)
    assert "dq_tile=(" in pick.format_report(rep)


def test_report_takes_measured_rates_and_the_profile_of_the_files_gpu():
    g = Group("mma", "fwd", "fp16", 64, False, 4096, 4, 16)
    recs = _group_records(g, 0.0)[0]
    rates = {"schema": RATES_SCHEMA,
             "provenance": {"gpu": H100, "date": "2026-11-24T00:00:00+00:00",
                            "command": "python -m benchmarks rates"},
             "rates": {"mma_fp16_flops_per_s": {"value": 6.5e14,
                                                "unit": RATE_UNITS["mma_fp16_flops_per_s"],
                                                "how": "test"}}}
    rep = pick_report(_doc(recs), rates=rates)
    assert rep["rate_sources"]["mma_f16_flops_per_s"] == "measured"
    assert pick_report(_doc(recs, gpu="NVIDIA H200"), profile=None)["profile"] == "h200"


@pytest.mark.parametrize("path", SHIPPED_PICKS, ids=lambda p: p.name)
def test_report_of_the_shipped_pick_files_recomputes_from_their_records(path):
    doc = json.loads(path.read_text())
    rep = pick_report(path)
    assert rep["schema"] == pick.SCHEMA and not rep["skipped"]
    fields = ("family", "pass", "dtype", "head_dim", "causal", "seq_len", "batch", "heads")
    for e in rep["groups"]:
        times = {(r["config"]["block_q"], r["config"]["block_k"]): r["time_ms"]
                 for r in doc["records"] if all(r[f] == e[f] for f in fields) and "time_ms" in r}
        pick_tiles = (e["pick"]["block_q"], e["pick"]["block_k"])
        assert e["best_ms"] == min(times.values()) and e["configs_timed"] == len(times)
        assert e["loss_pct"] == pytest.approx(100 * (times[pick_tiles] / min(times.values()) - 1))
        assert e["within_5pct"] == (e["loss_pct"] <= 5.0 + 1e-9)
    for name, fam in rep["families"].items():
        groups = [e for e in rep["groups"] if f"{e['family']} {e['pass']}" == name]
        assert fam["groups"] == len(groups) == 16
        assert fam["within_5pct"] == sum(e["within_5pct"] for e in groups)
    r = _run("--report", str(path))
    assert r.returncode == 0, r.stderr
    assert "model's pick within 5 %" in r.stdout


def test_report_reads_the_tile_sweep_format():
    """``ioaware.tune_tc/1`` (the float16 forward's tile sweep of ``benchmarks tune``): rows of
    kernel, head dim, causal, N, tiles and time; one group per (d, causal, N)."""
    rows = [{"kernel": "mma", "head_dim": 64, "causal": False, "seq_len": 4096, "batch": 4,
             "heads": 32, "block_q": bq, "block_k": bk, "time_ms": t}
            for (bq, bk), t in {(128, 64): 1.0, (128, 32): 1.3, (64, 64): 1.5, (64, 32): 2.0}.items()]
    rep = pick_report({"schema": "ioaware.tune_tc/1", "provenance": {"gpu": H100}, "rows": rows})
    (e,) = rep["groups"]
    assert e["dtype"] == "fp16" and e["configs_timed"] == e["configs_legal"] == 4
    assert e["best"] == {"block_q": 128, "block_k": 64} and e["best_ms"] == 1.0
    pick_tiles = (e["pick"]["block_q"], e["pick"]["block_k"])
    want = {(128, 64): 1.0, (128, 32): 1.3, (64, 64): 1.5, (64, 32): 2.0}[pick_tiles]
    assert e["loss_pct"] == pytest.approx(100 * (want - 1.0))


def test_report_reads_tune_family_files_and_skips_families_without_configurations():
    rows = [{"family": "mma", "pass": "fwd", "dtype": "fp16", "head_dim": 64, "causal": False,
             "seq_len": 4096, "batch": 4, "heads": 32, "block_q": bq, "block_k": bk,
             "micro_tile": None, "time_ms": t}
            for (bq, bk), t in {(128, 64): 1.0, (128, 32): 1.2, (64, 64): 1.5}.items()]
    rows.append(dict(rows[0], block_q=64, block_k=32, refused="refused here"))
    rows.append({"family": "flash3", "pass": "fwd", "dtype": "fp32", "head_dim": 64,
                 "causal": False, "seq_len": 4096, "batch": 4, "heads": 32, "block_q": 64,
                 "block_k": 32, "micro_tile": [8, 4], "time_ms": 3.0})
    rep = pick_report({"schema": "ioaware.tune_blocks/1", "provenance": {"gpu": H100},
                       "rows": rows})
    (e,) = rep["groups"]
    assert e["configs_timed"] == 3 and e["best"] == {"block_q": 128, "block_k": 64}
    assert [s["family"] for s in rep["skipped"]] == ["flash3"]
    assert "no configurations listed" in rep["skipped"][0]["why"]


@pytest.mark.parametrize("content, message", [
    ("not json", "is not JSON"),
    (json.dumps([1, 2]), "holds a list"),
    (json.dumps({"schema": "ioaware.results/1", "records": []}), "schema 'ioaware.results/1'"),
    (json.dumps({"schema": pick.SCHEMA}), "has no list of records"),
    (json.dumps(_doc([{"family": "mma"}])), "record 0 lacks 'pass'"),
    (json.dumps(_doc([dict(Group("mma", "fwd", "fp16", 64, False, 512, 32, 16).fields(),
                           config={"block_q": 64, "block_k": 64}, time_ms=-1)])),
     "time_ms must be a positive number"),
    (json.dumps(_doc([dict(Group("mma", "fwd", "fp16", 64, False, 512, 32, 16).fields(),
                           config={"block_q": 64, "block_k": 64}, time_ms=1.0)] * 2)),
     "appears twice"),
])
def test_malformed_files_are_refused_naming_the_file(tmp_path, content, message):
    path = tmp_path / "timings.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"^file {path}: .*{message}"):
        pick_report(path)
    r = _run("--report", str(path))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(path) in r.stderr and message.split("'")[0] in r.stderr
    with pytest.raises(ValueError, match="cannot be read"):
        pick_report(tmp_path / "missing.json")


# -- the command without a GPU -------------------------------------------------------------------

@pytest.mark.skipif(REAL_GPU, reason="needs a machine without a GPU")
@pytest.mark.parametrize("simulator", ["0", "1"])
def test_no_gpu_is_a_one_line_error(tmp_path, simulator):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=simulator)
    r = _run("--quick", "--out", str(tmp_path / "pick.json"), env=env)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "needs a CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "pick.json").exists()


def test_dry_run_prints_the_grid_and_estimate_on_the_cpu():
    r = _run("--dry-run")
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith(f"grid: {len(grid())} groups") and "GPU minutes" in first
    assert len(r.stdout.splitlines()) == 1 + len(grid())


# -- the measuring loop, with the kernels and the timer stood in for -----------------------------

def test_measuring_loop_records_every_configuration_and_its_file_reads_back(tmp_path, monkeypatch):
    """`pick.run` on CPU tensors: `kernels.forward`, `kernels.family_for` and the CUDA-event
    timer replaced; one configuration refused, one failing; the written file is a report's."""
    import torch

    import kernels
    g = Group("mma", "fwd", "fp16", 64, True, 128, 2, 2)
    cfgs = pick.legal_configs(g.family, g.pass_, g.workload())
    refused, failing = cfgs[-1], cfgs[-2]

    def family_for(problem, config=None, pass_="fwd"):
        if (config.block_q, config.block_k) == (refused["block_q"], refused["block_k"]):
            raise ValueError("not these tiles")
        return config.family

    def forward(problem, config=None):
        if config.block_q is not None and (config.block_q, config.block_k) == (
                failing["block_q"], failing["block_k"]):
            raise RuntimeError("launch failed")
        out = torch.zeros(g.batch, g.heads, g.seq_len, g.head_dim)
        return out + (config.block_k or 0) * 1e-3, None

    monkeypatch.setattr(kernels, "family_for", family_for)
    monkeypatch.setattr(kernels, "forward", forward)
    def time_cuda(torch_, fn, timing):
        fn()
        return 0.5, 0.4, 0.6

    monkeypatch.setattr(pick, "time_cuda", time_cuda)
    monkeypatch.setattr(pick, "group_inputs", lambda torch_, grp: tuple(
        torch.randn(grp.batch, grp.heads, grp.seq_len, grp.head_dim) for _ in range(4)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    out = tmp_path / "pick.json"
    doc = {"schema": pick.SCHEMA, "provenance": {"gpu": H100}, "grid": [g.fields()],
           "records": [], "skipped": [], "complete": False}
    lines = []
    pick.run(torch, [g], doc=doc, out=out, progress=lines.append)
    saved = json.loads(out.read_text())
    assert saved["complete"] and len(saved["records"]) == len(cfgs)
    by = {(r["config"]["block_q"], r["config"]["block_k"]): r for r in saved["records"]}
    assert by[refused["block_q"], refused["block_k"]]["refused"] == "not these tiles"
    assert "launch failed" in by[failing["block_q"], failing["block_k"]]["failed"]
    timed = [r for r in saved["records"] if "time_ms" in r]
    assert len(timed) == len(cfgs) - 2
    for r in timed:      # the default configuration (no tiles pinned) gives 0 here
        assert r["time_ms"] == 0.5 and r["timing"] == "device" and r["pass"] == "fwd"
        assert r["max_abs_diff_vs_default"] == pytest.approx(r["config"]["block_k"] * 1e-3)
    assert len(lines) == 1 and lines[0].startswith("[1/1 ") and "refused" in lines[0]
    rep = pick_report(out)
    assert rep["groups"][0]["configs_timed"] == len(cfgs) - 2


def test_malformed_records_are_listed_together_with_their_index():
    """Every bad record of a timings file in one error (up to `MAX_PROBLEMS`, then a count),
    each with its index, so a user fixes the file once."""
    good = dict(Group("mma", "fwd", "fp16", 64, False, 512, 32, 16).fields(),
                config={"block_q": 64, "block_k": 64}, time_ms=1.0)
    recs = [good, {"family": "mma"}, dict(good, time_ms=-1), "x", dict(good, config={})]
    with pytest.raises(ValueError) as err:
        pick.load_timings(_doc(recs))
    msg = str(err.value)
    assert msg.startswith("file <object>: 4 malformed records: ")
    for part in ("record 1 lacks 'pass'", "record 2: time_ms must be a positive number",
                 "record 3 is a str", "record 4: config must be a non-empty object"):
        assert part in msg
    many = [dict(good, time_ms=0)] * (pick.MAX_PROBLEMS + 5)
    with pytest.raises(ValueError, match=r"25 malformed records: .*; and 5 more$"):
        pick.load_timings(_doc(many))
