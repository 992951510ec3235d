"""benchmarks.ncu for every kernel of a results file, PyTorch SDPA's backends included, without a
GPU: which records a run selects, the profiled region (exactly one call of the measured pass,
no kernel-name filter), the per-launch rows of an SDPA call summed into one record, the whole
`profile_results` loop with ncu replaced by a fake, and how `sim.compare` reads the counters of
SDPA records (scored on global and DRAM bytes per kernel family; TMA launches leave global
bytes out)."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import common, measure, ncu

LD = ncu.BYTE_METRICS["global_load_bytes"]
ST = ncu.BYTE_METRICS["global_store_bytes"]
DR = ncu.BYTE_METRICS["dram_read_bytes"]
DW = ncu.BYTE_METRICS["dram_write_bytes"]
L2 = ncu.BYTE_METRICS["l2_bytes"]
RED, ATOM = ncu.ATOMIC_METRICS
HMMA_OPS = "sm__ops_path_tensor_src_fp16.sum"
FFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"
TIME = "gpu__time_duration.sum"
SDPA_FUSED = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn")

#: Launches of one call per (kernel, pass), as Nsight Compute names them (PyTorch's vendored
#: FlashAttention-2, xFormers/CUTLASS memory-efficient attention, cuDNN's SDPA graphs), with
#: invented counter values: (name, {metric: value}).
FILL = "void at::vectorized_elementwise_kernel<4, at::FillFunctor<float>, std::array<char *, 1>>(int, T2, T3)"
LAUNCHES = {
    ("sdpa-flash", "fwd"): [
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, "
         "false, cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t>>, false, "
         "false, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)",
         {LD: 5_000_000, ST: 1_000_000, DR: 3_000_000, DW: 1_100_000, L2: 9_000_000,
          HMMA_OPS: 1000, TIME: 50_000}),
    ],
    ("sdpa-flash", "bwd"): [
        ("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64, 128, "
         "128, 8, 2, 4, 2, false, false, cutlass::half_t>>(pytorch_flash::Flash_bwd_params)",
         {LD: 2_000_000, ST: 40_000, DR: 2_000_000, DW: 30_000, L2: 2_100_000, TIME: 8_000}),
        (FILL, {LD: 0, ST: 2_000_000, DR: 4_096, DW: 900_000, L2: 2_000_000, TIME: 4_000}),
        ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_"
         "traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::half_t>, false, false, false, "
         "false, false, false>(pytorch_flash::Flash_bwd_params)",
         {LD: 30_000_000, ST: 2_000_000, RED: 16_000_000, DR: 6_000_000, DW: 4_000_000,
          L2: 50_000_000, HMMA_OPS: 2500, TIME: 300_000}),
        ("void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64, 128, 128, "
         "8, 2, 4, 2, false, false, cutlass::half_t>>(pytorch_flash::Flash_bwd_params, int)",
         {LD: 2_000_000, ST: 1_000_000, DR: 2_000_000, DW: 1_000_000, L2: 3_000_000,
          TIME: 6_000}),
    ],
    ("sdpa-efficient", "fwd"): [
        ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float, "
         "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
         {LD: 9_000_000, ST: 2_000_000, DR: 6_000_000, DW: 2_100_000, L2: 12_000_000,
          FFMA: 4_000, TIME: 90_000}),
    ],
    ("sdpa-efficient", "bwd"): [
        (FILL, {LD: 0, ST: 4_000_000, DR: 4_608, DW: 1_000_000, L2: 4_000_000, TIME: 4_000}),
        ("fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackward"
         "Kernel<cutlass::arch::Sm80, float, true, false, false, 64, 64, 64, false>::Params)",
         {LD: 40_000_000, ST: 6_000_000, DR: 12_000_000, DW: 6_000_000, L2: 60_000_000,
          FFMA: 9_000, TIME: 400_000}),
    ],
    ("sdpa-cudnn", "fwd"): [   # loads by TMA: no LSU load bytes, DRAM reads all the same
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_"
         "kernel0_0", {LD: 0, ST: 1_000_000, DR: 3_000_000, DW: 1_000_000, L2: 5_000_000,
                       HMMA_OPS: 1000, TIME: 30_000}),
    ],
    ("sdpa-cudnn", "bwd"): [
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_dot_do_o_kernel0_0",
         {LD: 2_000_000, ST: 40_000, DR: 2_000_000, DW: 30_000, L2: 2_100_000, TIME: 8_000}),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x1x1_"
         "kernel0_0", {LD: 0, ST: 2_000_000, RED: 8_000_000, DR: 7_000_000, DW: 4_000_000,
                       L2: 40_000_000, HMMA_OPS: 2500, TIME: 200_000}),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_convert_dq_kernel0_0",
         {LD: 2_000_000, ST: 1_000_000, DR: 2_000_000, DW: 1_000_000, L2: 3_000_000,
          TIME: 5_000}),
    ],
}
METRICS = [LD, ST, RED, ATOM, DR, DW, L2, FFMA, HMMA_OPS, TIME]


def _csv(rows) -> str:
    """``ncu --csv --page raw --print-units base`` output of the launches ``rows``."""
    head = ["ID", "Process ID", "Process Name", "Kernel Name"] + METRICS
    lines = ["==PROF== Connected to process 4242 (python3)",
             ",".join(f'"{h}"' for h in head),
             ",".join(['""'] * 4 + ['"byte"'] * len(METRICS))]
    for i, (name, vals) in enumerate(rows):
        cells = [str(i), "4242", "python3", name] + [f"{vals.get(m, 0):,}" for m in METRICS]
        lines.append(",".join(f'"{c}"' for c in cells))
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


def _cfg(kernel, pass_="fwd", dtype="fp16", **kw):
    return measure.normalize_config({"kernel": kernel, "pass": pass_, "dtype": dtype, "batch": 2,
                                     "heads": 4, "seq_len_q": 1024, "head_dim": 64,
                                     "causal": False, **kw})


def _marker():
    return ("ioaware_ncu_marker[abi:v1,cw51cXTLSUwv1sDUaKthqaNgoKmjgOR3W3CgA9duC0hkwnNGiHEk]"
            "(Array<int, 1, C, mutable, aligned>)", {DR: 1_024})


def _sum(rows, metric):
    return sum(v.get(metric, 0) for _, v in rows)


# -- which records, which launches ------------------------------------------------------------

def test_every_kernel_is_selected_by_the_profiled_region_not_by_its_name():
    """One command line for every kernel: the child's cudaProfilerStart/Stop region selects the
    launches (--profile-from-start off), with no kernel-name, NVTX or launch-count filter that
    could leave PyTorch's kernels out."""
    cmd = ncu.ncu_command(ncu.wanted_metrics(), "/tmp/l.csv", "/tmp/c.json")
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert cmd[cmd.index("--target-processes") + 1] == "all"
    for option in ("--kernel-name", "-k", "--kernel-regex", "--kernel-name-base", "--nvtx",
                   "--nvtx-include", "--launch-skip", "-s", "--launch-count", "-c",
                   "--kernel-id"):
        assert option not in cmd
    assert cmd[-5:] == ["-m", "benchmarks", "ncu", "--child", "/tmp/c.json"]


def test_profiled_call_holds_the_marker_and_exactly_one_call():
    events = []

    def run(i):
        events.append(f"run({i})")
        return "result"
    res = ncu.profiled_call(run, lambda: events.append("marker"),
                            lambda: events.append("sync"), lambda: events.append("start"),
                            lambda: events.append("stop"))
    assert res == "result"
    # warm-up (compilation, cuDNN plans) outside; inside: the marker, one call, a synchronize
    # (so that a backward's launches from the autograd thread are in) before the region closes
    assert events == ["run(0)", "sync", "start", "marker", "run(0)", "sync", "stop"]


def _records():
    recs = []
    for k in measure.KERNELS:
        for p in ("fwd", "bwd"):
            rec = measure.empty_record(_cfg(k, p, dtype="fp32" if k == "ioaware-numba" else "fp16"))
            rec.update(time_ms=1.0, time_ms_p10=0.99, time_ms_p90=1.01, peak_extra_bytes=0)
            recs.append(rec)
    return recs


def test_records_to_profile_takes_every_kernel_without_counters():
    recs = _records()
    ours = [r for r in recs if r["kernel"] == "ioaware-numba"]
    ours[0]["global_load_bytes"] = 1            # already profiled
    recs[-1]["ncu_error"] = "child failed (rc=1)"
    todo = ncu.records_to_profile(recs)
    kernels = [r["kernel"] for r in todo]
    for k in SDPA_FUSED + ("sdpa-math",):
        assert kernels.count(k) == 2
    assert ours[0] not in todo and recs[-1] not in todo
    assert [r["kernel"] for r in ncu.records_to_profile(recs, list(SDPA_FUSED))] == [
        r["kernel"] for r in recs if r["kernel"] in SDPA_FUSED]
    assert len(ncu.records_to_profile(recs, limit=3)) == 3
    with pytest.raises(ValueError, match="sdpa_flash"):
        ncu.records_to_profile(recs, ["sdpa_flash"])


def test_the_command_refuses_an_unknown_kernel_before_profiling(capsys):
    with pytest.raises(SystemExit):
        ncu.main(["results.json", "--kernels", "sdpa-flash,sdpa_cudnn"])
    assert "sdpa_cudnn" in capsys.readouterr().err


# -- one record from many launches -------------------------------------------------------------

@pytest.mark.parametrize("kernel", SDPA_FUSED)
def test_an_sdpa_call_s_launches_are_summed_into_its_record(kernel):
    """Forward and backward records of one backend in one child: every launch between a marker
    and the next (the backward's preprocessing, the dQ accumulator's fill, the main kernel, the
    dQ conversion) is summed into the record's fields, each kept by name in ncu_kernels."""
    cfgs = [_cfg(kernel, "fwd"), _cfg(kernel, "bwd")]
    records = [measure.empty_record(c) for c in cfgs]
    fwd, bwd = LAUNCHES[(kernel, "fwd")], LAUNCHES[(kernel, "bwd")]
    rows = ncu.parse_ncu_csv(_csv([_marker(), *fwd, _marker(), *bwd]))
    groups = ncu.split_by_marker(rows, 2)
    assert [len(g) for g in groups] == [len(fwd), len(bwd)]
    assert ncu.merge_counters(records, cfgs, groups, tensor_flops_per_op=512.0,
                              kernels_sha="abc", torch_version="2.13.0") == 2
    for rec, launches in zip(records, (fwd, bwd)):
        assert rec["global_load_bytes"] == _sum(launches, LD)
        assert rec["global_store_bytes"] == _sum(launches, ST)
        assert rec["global_atomic_bytes"] == _sum(launches, RED) + _sum(launches, ATOM)
        assert rec["dram_read_bytes"] == _sum(launches, DR)
        assert rec["dram_write_bytes"] == _sum(launches, DW)
        assert rec["l2_bytes"] == _sum(launches, L2)
        assert rec["flops_executed"] == 2 * _sum(launches, FFMA) + 512 * _sum(launches, HMMA_OPS)
        assert rec["ncu_launches"] == len(launches)
        assert [k["name"] for k in rec["ncu_kernels"]] == [n[:160] for n, _ in launches]
        assert [k["global_atomic_bytes"] for k in rec["ncu_kernels"]] == [
            v.get(RED, 0) + v.get(ATOM, 0) for _, v in launches]
        assert [k["time_ns"] for k in rec["ncu_kernels"]] == [v[TIME] for _, v in launches]
        assert rec["ncu_kernels_sha"] == "abc" and rec["ncu_torch"] == "2.13.0"
        assert not ncu.needs_counters(rec)
        assert not ncu.backend_kernel_missing(kernel, groups[records.index(rec)])


def test_a_record_whose_launches_miss_its_backend_is_kept_with_a_warning(capsys):
    cfg = _cfg("sdpa-flash")
    rec = measure.empty_record(cfg)
    rows = ncu.parse_ncu_csv(_csv([_marker(), *LAUNCHES[("sdpa-efficient", "fwd")]]))
    group = ncu.split_by_marker(rows, 1)[0]
    assert ncu.backend_kernel_missing("sdpa-flash", group)
    assert not ncu.backend_kernel_missing("sdpa-efficient", group)
    assert not ncu.backend_kernel_missing("eager", group)   # no expectation for the others
    assert ncu.merge_counters([rec], [cfg], [group]) == 1
    assert rec["global_load_bytes"] == _sum(LAUNCHES[("sdpa-efficient", "fwd")], LD)
    assert "none of its 1 launches names a sdpa-flash kernel" in capsys.readouterr().err


def test_a_configuration_with_no_launch_is_marked_not_left_for_ever():
    cfgs = [_cfg("sdpa-cudnn"), _cfg("sdpa-flash")]
    records = [measure.empty_record(c) for c in cfgs]
    rows = ncu.parse_ncu_csv(_csv([_marker(), _marker(), *LAUNCHES[("sdpa-flash", "fwd")]]))
    assert ncu.merge_counters(records, cfgs, ncu.split_by_marker(rows, 2)) == 1
    assert records[0]["global_load_bytes"] is None and "no kernel launch" in records[0]["ncu_error"]
    assert not ncu.needs_counters(records[0]) and records[1]["global_load_bytes"] is not None


# -- the whole run, ncu replaced by a fake ------------------------------------------------------

def _fake_replay(calls):
    def replay(configs, metrics, ncu_cmd="ncu", keep_logs=None, timeout=None):
        calls.append([c["kernel"] for c in configs])
        rows = []
        for c in configs:
            p = "bwd" if c["pass"] != "fwd" else "fwd"
            rows += [_marker(), *LAUNCHES.get((c["kernel"], p), [(FILL, {ST: 64, DR: 4096})])]
        return ncu.parse_ncu_csv(_csv(rows)), 0
    return replay


@pytest.fixture()
def sweep_file(tmp_path, monkeypatch):
    prov = common.provenance("python -m benchmarks measure --out sweep.json",
                             gpu="NVIDIA H100 80GB HBM3", driver="test", cuda="13.0")
    prov["ncu"] = {"version": "earlier", "command": "python -m benchmarks ncu sweep.json "
                                                   "--kernels ioaware-numba"}
    recs = _records()
    for r in recs:
        if r["kernel"] == "ioaware-numba":
            r.update(global_load_bytes=10, global_store_bytes=1, ncu_kernels=[{"name": "ours"}])
    path = tmp_path / "sweep.json"
    common.write_json({"schema": common.SCHEMA, "provenance": prov, "records": recs,
                       "skipped": []}, path)
    calls = []
    monkeypatch.setattr(ncu.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(ncu, "query_available", lambda cmd="ncu": ncu.wanted_metrics())
    monkeypatch.setattr(ncu, "calibrate_tensor_ops", lambda metrics, cmd="ncu": 512.0)
    monkeypatch.setattr(ncu, "ncu_version", lambda cmd="ncu": "Version 2025.3.1.0")
    monkeypatch.setattr(ncu, "replay", _fake_replay(calls))
    return path, calls


def test_profile_results_adds_counters_to_the_sdpa_records_and_keeps_ours(sweep_file, capsys):
    path, calls = sweep_file
    before = {measure.config_key(r): r for r in json.loads(path.read_text())["records"]}
    out = ncu.profile_results(str(path), chunk=3, command="python -m benchmarks ncu sweep.json")
    assert sum(calls, []) == [r["kernel"] for r in before.values() if r["kernel"] != "ioaware-numba"]
    assert max(len(c) for c in calls) == 3
    doc = json.loads(path.read_text())
    assert doc == out
    for rec in doc["records"]:
        key = measure.config_key(rec)
        if rec["kernel"] == "ioaware-numba":          # already had counters: untouched
            assert rec == before[key]
            continue
        assert rec["global_load_bytes"] is not None and rec["ncu_kernels"]
        launches = LAUNCHES.get((rec["kernel"], rec["pass"]))
        if launches:
            assert rec["dram_read_bytes"] == _sum(launches, DR)
            assert [k["name"] for k in rec["ncu_kernels"]] == [n[:160] for n, _ in launches]
    prov = doc["provenance"]
    assert prov["ncu"]["command"] == "python -m benchmarks ncu sweep.json"
    assert prov["ncu"]["tensor_flops_per_op"] == 512.0 and "torch" in prov["ncu"]
    assert prov["ncu_earlier"] == [{"version": "earlier", "command": "python -m benchmarks ncu "
                                    "sweep.json --kernels ioaware-numba"}]
    err = capsys.readouterr().err
    assert "records with counters: ioaware-numba 2/2, sdpa-flash 2/2" in err
    # resumable: nothing left to profile
    calls.clear()
    ncu.profile_results(str(path), chunk=3)
    assert calls == []


def test_profile_results_with_kernels_profiles_only_those(sweep_file):
    path, calls = sweep_file
    ncu.profile_results(str(path), chunk=8, kernels=["sdpa-cudnn"])
    assert calls == [["sdpa-cudnn", "sdpa-cudnn"]]
    recs = json.loads(path.read_text())["records"]
    assert all((r["global_load_bytes"] is None) == (r["kernel"] not in ("ioaware-numba", "sdpa-cudnn"))
               for r in recs)


# -- sim.compare on SDPA records with counters ---------------------------------------------------

def test_compare_scores_sdpa_records_on_global_and_dram_bytes_per_family(sweep_file):
    pd = pytest.importorskip("pandas")
    from sim import compare as C
    from sim.results import load_results
    path, _ = sweep_file
    ncu.profile_results(str(path), chunk=8)
    recs = [r for r in load_results(path) if r["kernel"] in SDPA_FUSED]
    df = C.compare(recs, l2="analytic", workers=1, calibrate_time=False)
    by = df.set_index(["kernel", "pass"])
    for kernel in ("sdpa-flash", "sdpa-efficient"):
        for p in ("fwd", "bwd"):
            launches = LAUNCHES[(kernel, p)]
            row = by.loc[(kernel, p)]
            assert row["measured_global_bytes"] == (_sum(launches, LD) + _sum(launches, ST)
                                                    + _sum(launches, RED))
            assert row["measured_dram_bytes"] == _sum(launches, DR) + _sum(launches, DW)
            assert not math.isnan(row["rel_error_global_bytes"])
            assert not math.isnan(row["rel_error_dram_bytes"])
    # cuDNN loads by TMA in its main kernels: global bytes left out, DRAM bytes scored, although
    # its helper kernels' LSU loads make the record's load sum non-zero
    for p in ("fwd", "bwd"):
        row = by.loc[("sdpa-cudnn", p)]
        assert math.isnan(row["measured_global_bytes"]) and math.isnan(row["rel_error_global_bytes"])
        assert not math.isnan(row["rel_error_dram_bytes"])
    assert by.loc[("sdpa-cudnn", "bwd")]["measured_dram_bytes"] == (
        _sum(LAUNCHES[("sdpa-cudnn", "bwd")], DR) + _sum(LAUNCHES[("sdpa-cudnn", "bwd")], DW))
    per = C.summary(df, by_kernel=True)
    assert isinstance(per, pd.DataFrame)
    got = set(zip(per["metric"], per["records"]))
    for fam in ("sdpa-flash", "sdpa-efficient"):
        assert ("global_bytes", fam) in got and ("dram_bytes", fam) in got
    assert ("dram_bytes", "sdpa-cudnn") in got and ("global_bytes", "sdpa-cudnn") not in got
    assert "sdpa-flash" in C.format_report(df)


def test_tma_launches_are_told_from_fills_and_from_lsu_kernels():
    from sim import compare as C
    fill = {"name": FILL, "global_load_bytes": 0.0, "global_store_bytes": 33554432.0,
            "dram_read_bytes": 4608.0, "dram_write_bytes": 10893312.0}
    lsu = {"name": "flash_bwd_dkdv_v2", "global_load_bytes": 1e9, "global_store_bytes": 6e7,
           "dram_read_bytes": 1.6e8, "dram_write_bytes": 8e7}
    nvjet = {"name": "nvjet_sm90_hsh_128x256_64x4_2x1_v_bz_coopA_TNN", "global_load_bytes": 0.0,
             "global_store_bytes": 0.0, "dram_read_bytes": 33674496.0, "dram_write_bytes": 2.4e8}
    tma_store = dict(lsu, name="lsu loads, TMA stores", global_store_bytes=0.0,
                     global_atomic_bytes=0.0)
    atomics_only = dict(tma_store, name="atomics only", global_atomic_bytes=1e6)
    assert C.tma_launches({"ncu_kernels": [fill, lsu]}) == []
    assert C.tma_launches({"ncu_kernels": [fill, nvjet, lsu]}) == [nvjet["name"]]
    assert C.tma_launches({"ncu_kernels": [tma_store, atomics_only]}) == ["lsu loads, TMA stores"]
    assert C.tma_launches({}) == []
    base = {"global_load_bytes": 100, "global_store_bytes": 10, "global_atomic_bytes": 5}
    assert C._measured(dict(base, ncu_kernels=[fill, lsu]), "global_bytes") == 115.0
    assert math.isnan(C._measured(dict(base, ncu_kernels=[lsu, nvjet]), "global_bytes"))
    assert C._measured(dict(base, ncu_kernels=[lsu, nvjet]), "dram_bytes") is not None


def test_shipped_sweeps_tma_rule_leaves_ours_and_math_as_they_were():
    """On the shipped sweeps the per-launch rule finds TMA launches only in eager float16's
    cuBLAS nvjet GEMMs: none in our kernels' records, MATH's or eager float32's, whose global
    bytes are read as before."""
    from pathlib import Path

    from sim import compare as C
    from sim.results import load_results
    root = Path(__file__).resolve().parents[1] / "results"
    hits = set()
    for name in ("h100_sweep_20261122.json", "h200_sweep_20261122.json"):
        for r in load_results(root / name):
            if C.tma_launches(r):
                hits.add((r["kernel"], r["dtype"]))
                assert all("nvjet" in n for n in C.tma_launches(r))
            elif r.get("global_load_bytes"):
                assert C._measured(r, "global_bytes") == (
                    r["global_load_bytes"] + r["global_store_bytes"]
                    + (r.get("global_atomic_bytes") or 0))
    assert hits == {("eager", "fp16")}


def test_stalls_file_prints_each_launch_with_its_largest_stalls(tmp_path, capsys):
    """``python -m benchmarks ncu --show-stalls FILE``: a row per launch, the tensor pipe as the
    larger of HMMA and GMMA, and the stall reasons largest first."""
    import json

    from benchmarks import ncu
    launch = {"name": "void flash_bwd_dq_dk_dv_loop_kernel<Flash_bwd_kernel_traits<128> >(Params)",
              "metrics": {"duration_ns": 2500.0, "hmma_pipe_pct": 41.5, "gmma_pipe_pct": 0.0,
                          "xu_pipe_pct": 17.25, "issue_active_pct": 30.0, "warps_active_pct": 12.4, "registers": 255,
                          "stall_barrier": 0.5, "stall_long_scoreboard": 2.25,
                          "stall_math_pipe_throttle": 1.0, "stall_wait": 0.25, "stall_misc": 0.0}}
    doc = {"provenance": {"gpu": "H100", "date": "d", "command": "c"},
           "records": [{"kernel": "sdpa-flash", "variant": None, "pass": "bwd", "dtype": "fp16",
                        "head_dim": 128, "seq_len_q": 3000, "batch": 4, "heads": 8,
                        "causal": False, "launches": [launch]}]}
    path = tmp_path / "stalls.json"
    path.write_text(json.dumps(doc))
    assert ncu.main(["--show-stalls", str(path)]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert row.startswith("flash_bwd_dq_dk_dv_loop_kernel ")
    assert "2.5" in row and "41.5" in row and "17.2" in row and "255" in row
    assert row.index("long_scoreboard 2.25") < row.index("math_pipe_throttle 1.00") \
        < row.index("barrier 0.50") < row.index("wait 0.25")
    assert "misc" not in row


def test_stalls_profile_several_results_files_into_one(tmp_path, monkeypatch):
    """``ncu --stalls A.json B.json``: the selected records of every file are replayed in one
    profile (here the replay is stubbed: which records reach it, in order)."""
    import json

    from benchmarks import ncu
    base = {"pass": "fwd", "dtype": "fp16", "head_dim": 128, "seq_len_q": 1500, "seq_len_k": 1500,
            "batch": 8, "heads": 8, "causal": False}
    a = [dict(base, kernel="sdpa-cudnn"), dict(base, kernel="sdpa-efficient"),
         dict(base, kernel="sdpa-flash", dtype="fp32")]
    b = [dict(base, kernel="ioaware-numba", variant="wgmma")]
    for name, recs in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps({"records": recs}))
    seen = []

    def replay(recs, metrics, ncu_cmd, timeout):
        seen.extend(recs)
        return recs, [[{"name": "k", "metrics": {"duration_ns": 1.0}}] for _ in recs], []
    monkeypatch.setattr(ncu, "_replay_records", replay)
    monkeypatch.setattr(ncu, "ncu_version", lambda cmd: "test")
    doc = ncu.profile_stalls([tmp_path / "a.json", tmp_path / "b.json"],
                             kernels=["sdpa-cudnn", "sdpa-flash", "ioaware-numba"], dtype="fp16")
    assert [r["kernel"] for r in seen] == ["sdpa-cudnn", "ioaware-numba"]
    assert [r["kernel"] for r in doc["records"]] == ["sdpa-cudnn", "ioaware-numba"]


def test_stalls_add_to_appends_records_of_the_same_gpu(tmp_path, monkeypatch):
    """``ncu --stalls ... --add-to FILE``: the new records are appended to FILE, whose
    provenance keeps the first run's and lists the added run; a file of another GPU is refused."""
    base = {"kernel": "ioaware-numba", "variant": "tf32", "pass": "bwd", "dtype": "fp32",
            "head_dim": 64, "seq_len_q": 2500, "seq_len_k": 2500, "batch": 4, "heads": 8,
            "causal": False}
    (tmp_path / "r.json").write_text(json.dumps({"records": [base]}))
    first = {"schema": "ioaware.ncu_stalls/1",
             "provenance": {"gpu": "GPU A", "command": "first"},
             "records": [dict(base, kernel="sdpa-cudnn", launches=[])]}
    target = tmp_path / "stalls.json"
    target.write_text(json.dumps(first))
    monkeypatch.setattr(ncu, "_replay_records", lambda recs, metrics, cmd, timeout: (
        recs, [[{"name": "k", "metrics": {"duration_ns": 1.0}}] for _ in recs], []))
    monkeypatch.setattr(ncu, "ncu_version", lambda cmd: "test")
    monkeypatch.setattr(ncu, "provenance", lambda command, extra=None: {
        "gpu": "GPU A", "command": command, "date": "today", **(extra or {})})
    ncu.profile_stalls([tmp_path / "r.json"], command="second", add_to=target)
    doc = json.loads(target.read_text())
    assert [r["kernel"] for r in doc["records"]] == ["sdpa-cudnn", "ioaware-numba"]
    assert doc["records"][1]["launches"][0]["metrics"]["duration_ns"] == 1.0
    assert doc["provenance"]["command"] == "first"
    assert [a["command"] for a in doc["provenance"]["added"]] == ["second"]
    monkeypatch.setattr(ncu, "provenance", lambda command, extra=None: {"gpu": "GPU B"})
    with pytest.raises(SystemExit, match="GPU A"):
        ncu.profile_stalls([tmp_path / "r.json"], command="third", add_to=target)
    assert len(json.loads(target.read_text())["records"]) == 2
