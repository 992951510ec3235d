"""benchmarks.measure and benchmarks.ncu: the pure parts (configurations, the KernelConfig of a
record, resume, provenance, record schema, ncu CSV parsing and attribution) without a GPU; the
timing itself is marked ``gpu``."""
from __future__ import annotations

import json

import pytest

from benchmarks import common, measure, ncu


def _cfg(**kw):
    base = {"kernel": "ioaware-numba", "pass": "fwd", "dtype": "fp32", "batch": 2, "heads": 4,
            "seq_len_q": 256, "head_dim": 64, "causal": False}
    base.update(kw)
    return base


# -- configurations ----------------------------------------------------------------------------

def test_normalize_fills_defaults_and_resolves_our_blocks():
    from kernels.config import default_blocks
    c = measure.normalize_config(_cfg())
    assert c["heads_kv"] == 4 and c["seq_len_k"] == 256 and c["variant"] == "simt"
    assert (c["block_q"], c["block_k"]) == default_blocks(64, False, False)
    b = measure.normalize_config(_cfg(**{"pass": "bwd"}))
    assert (b["block_q"], b["block_k"]) == default_blocks(64, True, False)
    assert c["schedule"] == "flash2"
    m = measure.normalize_config(_cfg(kernel="sdpa-math"))
    assert m["block_q"] is None and m["variant"] is None and m["schedule"] == "naive"


@pytest.mark.parametrize("bad, exc, word", [
    ({"kernel": "nope"}, ValueError, "kernel"),
    ({"pass": "fwd2"}, ValueError, "pass"),
    ({"dtype": "fp8"}, ValueError, "dtype"),
    ({"batch": 0}, ValueError, "batch"),
    ({"head_dim": 64.0}, TypeError, "head_dim"),
    ({"causal": 1}, TypeError, "causal"),
    ({"heads": 6, "heads_kv": 4}, ValueError, "heads_kv"),
    ({"block_q": 32}, ValueError, "block_k"),
    ({"kernel": "sdpa-math", "block_q": 32, "block_k": 32}, ValueError, "block_q"),
    ({"variant": "mma"}, ValueError, "mma"),
])
def test_normalize_rejects_bad_fields_naming_them(bad, exc, word):
    with pytest.raises(exc, match=word):
        measure.normalize_config(_cfg(**bad))


def test_unsupported_reasons():
    assert measure.unsupported_reason(measure.normalize_config(_cfg(kernel="sdpa-flash")))
    assert measure.unsupported_reason(measure.normalize_config(_cfg(kernel="sdpa-cudnn")))
    assert measure.unsupported_reason(measure.normalize_config(_cfg(kernel="sdpa-flash", dtype="fp16"))) is None
    too_big = measure.normalize_config(_cfg(block_q=128, block_k=128))
    assert "shared memory" in measure.unsupported_reason(too_big)
    for (d, p), blocks in measure.SWEEP_BLOCKS.items():
        for bq, bk in blocks:
            c = measure.normalize_config(_cfg(head_dim=d, block_q=bq, block_k=bk, **{"pass": p}))
            assert measure.unsupported_reason(c) is None, (d, p, bq, bk)


def test_expand_grid_is_the_cross_product_minus_unsupported():
    cfgs = measure.expand_grid(kernels=measure.KERNELS, seq_lens=[512, 1024], head_dims=[64],
                               dtypes=["fp32", "fp16"], causal=[False, True], passes=["fwd", "bwd"],
                               heads=8, tokens=4096)
    keys = [measure.config_key(c) for c in cfgs]
    assert len(keys) == len(set(keys))
    # per (N, causal, pass): fp32 has 4 kernels (no flash/cudnn), fp16 all 6
    assert len(cfgs) == 2 * 2 * 2 * (4 + 6)
    assert {c["batch"] for c in cfgs if c["seq_len_q"] == 512} == {8}
    assert {c["batch"] for c in cfgs if c["seq_len_q"] == 1024} == {4}


def test_standard_sweep_has_enough_of_our_kernel_and_every_baseline():
    cfgs = measure.standard_sweep()
    ours = [c for c in cfgs if c["kernel"] == "ioaware-numba"]
    assert len(ours) >= 40
    assert {c["seq_len_q"] for c in ours} >= {512, 1024, 2048, 4096, 8192}
    assert {c["head_dim"] for c in ours} == {64, 128}
    assert {(c["block_q"], c["block_k"]) for c in ours if c["head_dim"] == 64} >= {(64, 32), (32, 32)}
    for k in measure.KERNELS:
        assert any(c["kernel"] == k for c in cfgs), k
    assert all(measure.unsupported_reason(c) is None for c in cfgs)


def test_rotation_sets_exceed_twice_the_l2():
    l2 = 50 * 2**20
    for set_b in (2**20, 7 * 2**20, 50 * 2**20, 300 * 2**20):
        n = measure.rotation_sets(set_b, l2, max_sets=10**6)
        assert n >= 2 and (n - 1) * set_b >= 2 * l2
        assert n == 2 or (n - 2) * set_b < 2 * l2
    assert measure.rotation_sets(1, l2, max_sets=64) == 64
    with pytest.raises(ValueError, match="set_bytes"):
        measure.rotation_sets(0, l2)


# -- resume and the file -------------------------------------------------------------------------

def test_resume_skips_configurations_already_measured(tmp_path):
    cfgs = measure.expand_grid(kernels=["ioaware-numba", "sdpa-math"], seq_lens=[256, 512],
                               head_dims=[64], dtypes=["fp32"], causal=[False], passes=["fwd"])
    res = measure.new_results(common.provenance("cmd", gpu="G", driver="D", cuda="C"))
    rec = measure.empty_record(cfgs[1])
    rec["time_ms"] = 1.0
    res["records"].append(rec)
    path = tmp_path / "r.json"
    common.write_json(res, path)
    again = measure.load_existing(path)
    todo = measure.pending_configs(cfgs, again["records"])
    assert [measure.config_key(c) for c in todo] == [measure.config_key(c) for c in cfgs if c is not cfgs[1]]
    assert measure.load_existing(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ValueError, match="schema"):
        measure.load_existing(tmp_path / "bad.json")


def test_record_schema_matches_the_results_contract():
    rec = measure.empty_record(measure.normalize_config(_cfg()))
    contract = {"kernel", "schedule", "pass", "dtype", "batch", "heads", "heads_kv", "seq_len_q",
                "seq_len_k", "head_dim", "causal", "block_q", "block_k", "time_ms", "time_ms_p10",
                "time_ms_p90", "peak_extra_bytes", "dram_read_bytes", "dram_write_bytes",
                "l2_bytes", "global_load_bytes", "global_store_bytes", "flops_executed"}
    assert contract <= set(rec)
    assert all(rec[f] is None for f in measure.TIME_FIELDS + measure.COUNTER_FIELDS)
    res = measure.new_results(common.provenance("python -m benchmarks measure --x", gpu="G",
                                                driver="D", cuda="C"))
    rec.update(time_ms=1.0, time_ms_p10=0.9, time_ms_p90=1.1, peak_extra_bytes=1024)
    res["records"].append(rec)
    try:
        from sim.results import load_results
    except ImportError:
        pytest.skip("sim.results not available yet")
    import io
    assert len(load_results(io.StringIO(json.dumps(res)))) == 1


def test_provenance_has_every_required_field():
    prov = common.provenance("python -m benchmarks measure --standard", gpu="NVIDIA H100",
                             driver="580", cuda="13.0", extra={"sm_count": 132})
    for key in ("gpu", "driver", "cuda", "torch", "numba", "numba_cuda", "numpy", "date",
                "command", "kernels_sha"):
        assert isinstance(prov[key], str) and prov[key], key
    assert prov["gpu"] == "NVIDIA H100" and prov["sm_count"] == 132
    assert prov["command"].startswith("python -m benchmarks measure")
    import datetime
    datetime.datetime.fromisoformat(prov["date"])
    code = prov["code_version"]
    assert set(code) == {"commit", "dirty"}
    import subprocess
    head = subprocess.run(["git", "-C", str(common.ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    if head.returncode == 0:
        assert code["commit"] == head.stdout.strip() and isinstance(code["dirty"], bool)


def test_kernels_fingerprint_follows_the_kernel_sources(tmp_path, monkeypatch):
    sha = common.kernels_fingerprint()
    assert len(sha) == 12 and sha == common.kernels_fingerprint()
    copy = tmp_path / "kernels"
    copy.mkdir()
    for path in common.KERNELS_DIR.glob("*.py"):
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(common, "KERNELS_DIR", copy)
    assert common.kernels_fingerprint() == sha
    (copy / "host.py").write_text((copy / "host.py").read_text() + "\n# changed\n")
    assert common.kernels_fingerprint() != sha


def test_command_line_quotes_arguments():
    assert common.command_line("measure", ["--out", "a b.json"]) == \
        "python -m benchmarks measure --out 'a b.json'"


def test_cli_lists_configurations(capsys):
    assert measure.main(["--out", "x.json", "--kernels", "ioaware-numba", "--seq-lens", "512",
                         "--head-dims", "64", "--dtypes", "fp32", "--causal", "off",
                         "--passes", "fwd", "--blocks", "32x32,64x32", "--list"]) == 0
    out = capsys.readouterr().out
    assert "2 configurations" in out and "32x32" in out and "64x32" in out


# -- ncu CSV -----------------------------------------------------------------------------------

def _csv(rows):
    metrics = list(ncu.BYTE_METRICS.values()) + list(ncu.FLOP_METRICS) + ["sm__ops_path_tensor_src_fp16.sum"]
    head = ["ID", "Process ID", "Kernel Name"] + metrics
    lines = ["==PROF== Connected to process 1", ",".join(f'"{h}"' for h in head),
             ",".join(['""', '""', '""'] + ['"byte"'] * len(metrics))]
    for i, (name, vals) in enumerate(rows):
        cells = [str(i), "1", name] + [f"{vals.get(m, 0):,}" for m in metrics]
        lines.append(",".join(f'"{c}"' for c in cells))
    return "\n".join(lines) + "\n"


def test_parse_split_aggregate_attributes_launches_by_marker():
    ld, st = ncu.BYTE_METRICS["global_load_bytes"], ncu.BYTE_METRICS["global_store_bytes"]
    ffma = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
    fadd = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"
    text = _csv([
        ("ioaware_ncu_marker", {}),
        ("flash_fwd_v2", {ld: 1_000_000, st: 2000, ffma: 10, fadd: 3}),
        ("ioaware_ncu_marker", {}),
        ("flash_bwd_delta_v2", {ld: 10, st: 1}),
        ("flash_bwd_dkdv_v2", {ld: 100, st: 20, "sm__ops_path_tensor_src_fp16.sum": 50}),
    ])
    rows = ncu.parse_ncu_csv(text)
    assert [r["name"] for r in rows][1] == "flash_fwd_v2" and rows[1]["metrics"][ld] == 1_000_000
    groups = ncu.split_by_marker(rows, 2)
    assert [len(g) for g in groups] == [1, 2]
    a = ncu.aggregate(groups[0])
    assert a["global_load_bytes"] == 1_000_000 and a["global_store_bytes"] == 2000
    assert a["flops_executed"] == 2 * 10 + 3 and a["ncu_launches"] == 1
    b = ncu.aggregate(groups[1], tensor_flops_per_op=2.0)
    assert b["global_load_bytes"] == 110 and b["flops_executed"] == 100 and b["flops_tensor_counted"]
    assert ncu.aggregate(groups[1])["flops_executed"] == 0
    with pytest.raises(ValueError, match="marker"):
        ncu.split_by_marker(rows, 3)


def test_merge_counters_into_matching_records_only():
    cfgs = [measure.normalize_config(_cfg()), measure.normalize_config(_cfg(seq_len_q=512))]
    records = [measure.empty_record(c) for c in cfgs]
    ld = ncu.BYTE_METRICS["global_load_bytes"]
    groups = [[{"id": 1, "name": "k", "metrics": {ld: 64.0}}]]
    assert ncu.merge_counters(records, cfgs[1:], groups) == 1
    assert records[1]["global_load_bytes"] == 64 and records[0]["global_load_bytes"] is None
    assert ncu.needs_counters(records[0]) and not ncu.needs_counters(records[1])


def test_filter_available_metrics():
    out = "dram__bytes_read   Counter byte  # of bytes\nlts__t_bytes Counter byte\n"
    assert ncu.filter_available(["dram__bytes_read.sum", "lts__t_bytes.sum", "nope.sum"], out) == \
        ["dram__bytes_read.sum", "lts__t_bytes.sum"]


def test_ncu_command_uses_clock_control_none_and_replays_the_child():
    cmd = ncu.ncu_command(["dram__bytes_read.sum"], "/tmp/l.csv", "/tmp/c.json")
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert "--profile-from-start" in cmd
    assert cmd[-5:] == ["-m", "benchmarks", "ncu", "--child", "/tmp/c.json"]


# -- on a GPU ----------------------------------------------------------------------------------

@pytest.mark.gpu
def test_run_sweep_on_gpu_writes_valid_records(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    cfgs = measure.expand_grid(kernels=["ioaware-numba", "sdpa-math"], seq_lens=[256],
                               head_dims=[64], dtypes=["fp32"], causal=[False], passes=["fwd"])
    out = tmp_path / "r.json"
    seen = []
    res = measure.run_sweep(cfgs, progress=lambda done, total, rec: seen.append(done),
                            out_path=out, repeats=20)
    assert seen == [1, 2] and len(res["records"]) == 2
    for rec in res["records"]:
        assert rec["time_ms_p10"] <= rec["time_ms"] <= rec["time_ms_p90"]
        assert rec["peak_extra_bytes"] > 0
    assert res["records"][0]["check_rel_err"] < 1e-4
    res2 = measure.run_sweep(cfgs, out_path=out, repeats=20)
    assert len(res2["records"]) == 2  # resumed: nothing re-run


def test_simt_forward_tiles_follow_the_kernels_table_and_fit():
    from kernels import config
    for (d, p), blocks in measure.SWEEP_BLOCKS.items():
        if p != "fwd":
            continue
        for bq, bk in blocks:
            tm, tn = measure.simt_forward_tiles(d, bq, bk)
            cfg = config.TileConfig(bq, bk, tm, tn)
            cfg.validate(d)
            assert config.fwd_smem_bytes(cfg, d) <= config.STATIC_SMEM_LIMIT_BYTES
            if (d, bq, bk) in getattr(config, "FWD_TILES", {}):
                assert (tm, tn) == tuple(config.FWD_TILES[(d, bq, bk)])


def test_tensor_core_variants_normalize_list_and_refuse_what_they_do_not_run():
    from kernels import mma_bwd, tf32_fwd
    tf = measure.normalize_config(_cfg(variant="tf32", dtype="fp32"))
    assert (tf["block_q"], tf["block_k"]) == tf32_fwd.default_blocks(64)
    mb = measure.normalize_config(_cfg(variant="mma", dtype="fp16", **{"pass": "bwd"}))
    assert (mb["block_q"], mb["block_k"]) == mma_bwd.default_tiles(64)["dq"]
    assert measure.normalize_config(dict(mb)) == mb          # a record normalizes to itself
    for bad in (dict(variant="tf32", dtype="fp16"), dict(variant="mma", dtype="fp32"),
                dict(variant="mma", dtype="fp16", head_dim=80),
                dict(variant="tf32", dtype="fp32", block_q=32, block_k=32, **{"pass": "bwd"})):
        with pytest.raises(ValueError, match="variant"):
            measure.normalize_config(_cfg(**bad))
    std = measure.standard_sweep()
    ext = measure.standard_sweep(tensor_core_variants=("mma", "tf32"))
    assert len(std) == 292 and len(ext) == 292 + 24
    added = [c for c in ext if measure.config_key(c) not in {measure.config_key(s) for s in std}]
    assert {(c["variant"], c["pass"], c["dtype"]) for c in added} == {
        ("mma", "bwd", "fp16"), ("tf32", "fwd", "fp32"), ("tf32", "bwd", "fp32")}


def test_kernel_config_pins_the_family_and_the_record_tiles():
    from kernels import KernelConfig
    fwd = measure.normalize_config(_cfg(block_q=64, block_k=32))
    assert measure.kernel_config(fwd, "fwd") == KernelConfig(
        family="simt", block_q=64, block_k=32, micro_tile=measure.simt_forward_tiles(64, 64, 32))
    bwd = measure.normalize_config(_cfg(block_q=16, block_k=32, **{"pass": "bwd"}))
    assert measure.kernel_config(bwd, "bwd") == KernelConfig(family="simt", block_q=16,
                                                             block_k=32)
    both = measure.normalize_config(_cfg(block_q=64, block_k=32, **{"pass": "fwd+bwd"}))
    assert measure.kernel_config(both, "bwd") == KernelConfig(family="simt")  # its defaults
    mma = measure.normalize_config(_cfg(variant="mma", dtype="fp16", block_q=64, block_k=32))
    assert measure.kernel_config(mma, "fwd") == KernelConfig(family="mma", block_q=64, block_k=32)
    tf = measure.normalize_config(_cfg(variant="tf32", **{"pass": "bwd"}))
    assert measure.kernel_config(tf, "bwd") == KernelConfig(family="tf32")   # its own tiles


def test_tensor_core_records_name_their_default_launch_order():
    from kernels import tile_scheduler
    for pass_, causal in (("fwd", False), ("fwd", True), ("bwd", False), ("bwd", True)):
        rec = measure.empty_record(measure.normalize_config(
            _cfg(variant="mma", dtype="fp16", causal=causal, **{"pass": pass_})))
        assert rec["launch_head_group"] == tile_scheduler.DEFAULT_HEAD_GROUP[(pass_, causal)]
    assert "launch_head_group" not in measure.empty_record(measure.normalize_config(_cfg()))


def test_mma_backward_records_name_the_dq_mode_the_launcher_runs_at_their_head_dim(monkeypatch):
    """An mma backward record names the dQ mode of `kernels.mma_bwd.dq_mode` for its head dim
    (on an sm_90 machine: atomics at d = 128, the dQ kernel at d = 64), a tf32 one that of
    `kernels.tf32_bwd.dq_mode` (atomics at both)."""
    from kernels import mma_bwd
    monkeypatch.setattr(mma_bwd, "_cc_here", lambda: (9, 0))
    for d, want in ((64, "kernel"), (128, "atomic")):
        rec = measure.empty_record(measure.normalize_config(
            _cfg(variant="mma", dtype="fp16", head_dim=d, **{"pass": "bwd"})))
        assert rec["dq_mode"] == want
        # the float32 (tf32) backward: atomics at both head dims there
        rec = measure.empty_record(measure.normalize_config(
            _cfg(variant="tf32", dtype="fp32", head_dim=d, **{"pass": "bwd"})))
        assert rec["dq_mode"] == "atomic"
    fwd = measure.empty_record(measure.normalize_config(_cfg(variant="mma", dtype="fp16")))
    assert "dq_mode" not in fwd


def test_replace_puts_remeasured_records_in_place():
    """`benchmarks replace`: each re-measured record takes the place of the one with its
    configuration, the others stay, the provenance gains an entry (appended after an earlier
    one); another GPU, or a record that matches none, writes nothing."""
    import pytest

    from benchmarks.replace import replace_records

    def rec(variant, n, t):
        return {"kernel": "ioaware-numba", "variant": variant, "pass": "bwd", "dtype": "fp16",
                "batch": 4, "heads": 8, "heads_kv": 8, "seq_len_q": n, "seq_len_k": n,
                "head_dim": 64, "causal": False, "time_ms": t}
    into = {"schema": "s", "provenance": {"gpu": "G", "records_replaced": {"records": "older"}},
            "records": [rec("mma", 1500, 1.0), rec("tf32", 1500, 2.0), rec("mma", 3000, 3.0)]}
    new = {"provenance": {"gpu": "G", "command": "measure ...", "ncu": {"command": "ncu ..."},
                          "date": "D", "sources_sha": "abc"},
           "records": [rec("mma", 3000, 0.5), rec("mma", 1500, 0.25)]}
    out = replace_records(into, new, "the mma backward", earlier="git show X:F")
    assert [r["time_ms"] for r in out["records"]] == [0.25, 2.0, 0.5]
    assert into["records"][0]["time_ms"] == 1.0                  # the input is not changed
    entries = out["provenance"]["records_replaced"]
    assert entries[0] == {"records": "older"} and entries[1]["count"] == 2
    assert entries[1]["ncu_command"] == "ncu ..." and entries[1]["earlier"] == "git show X:F"
    with pytest.raises(ValueError, match="measured on"):
        replace_records(into, {**new, "provenance": {"gpu": "H"}}, "x")
    with pytest.raises(ValueError, match="0 records"):
        replace_records(into, {**new, "records": [rec("mma", 999, 1.0)]}, "x")
    # --add: a configuration the file lacks (a family added on the same grid) is appended
    more = {**new, "records": [rec("wgmma", 1500, 0.125), rec("mma", 3000, 0.75)]}
    out = replace_records(into, more, "the wgmma backward", add=True)
    assert [r["time_ms"] for r in out["records"]] == [1.0, 2.0, 0.75, 0.125]
    last = out["provenance"]["records_replaced"][-1]
    assert last["count"] == 1 and last["added"] == 1
    twice = {**out, "records": out["records"] + [rec("wgmma", 1500, 9.0)]}
    with pytest.raises(ValueError, match="2 records"):     # ambiguous even with --add
        replace_records(twice, {**new, "records": [rec("wgmma", 1500, 1.0)]}, "x", add=True)
