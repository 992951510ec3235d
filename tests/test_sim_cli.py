"""sim: the command line contract (predict JSON keys for every schedule and pass, sweep, search)
and the results-file schema."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from contextlib import redirect_stdout

import pytest

import sim
from sim.cli import main
from sim.results import ResultsFormatError, load_results

KEYS = ("flops", "matmul_flops", "hbm_read_bytes", "hbm_write_bytes", "dram_read_bytes", "dram_write_bytes",
        "sram_bytes_per_block", "block_q", "block_k", "predicted_ms")


def run(argv):
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(argv)
    return rc, buf.getvalue()


@pytest.mark.parametrize("schedule", ["naive", "flash1", "flash2"])
@pytest.mark.parametrize("pass_", ["fwd", "bwd", "fwd+bwd"])
def test_predict_json_has_the_contract_keys(schedule, pass_):
    rc, out = run(["predict", "--schedule", schedule, "--batch", "1", "--heads", "2", "--seq-len", "300",
                   "--head-dim", "64", "--dtype", "fp16", "--device", "a100", "--pass", pass_, "--causal", "--json"])
    d = json.loads(out)
    assert rc == 0 and all(k in d for k in KEYS)
    p = sim.predict(sim.Workload(batch=1, heads=2, seq_len_q=300, head_dim=64, causal=True, pass_=pass_),
                    schedule, "a100")
    assert (d["hbm_read_bytes"], d["flops"], d["block_q"]) == (p.hbm_read_bytes, p.flops, p.block_q)
    assert d["predicted_ms"] > 0


def test_predict_flags_and_table():
    rc, out = run(["predict", "--schedule", "flash2", "--seq-len", "512", "--head-dim", "128", "--device", "t4",
                   "--block-q", "64", "--block-k", "32", "--dropout", "--dtype", "bf16"])
    assert rc == 0 and "64 x 32" in out and "predicted time (raw)" in out


def test_cli_module_entry_point_and_errors():
    r = subprocess.run([sys.executable, "-m", "sim", "predict", "--schedule", "flash2", "--seq-len", "64",
                        "--device", "nosuchgpu", "--json"], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown device" in r.stderr
    r = subprocess.run([sys.executable, "-m", "sim", "predict", "--schedule", "flash2", "--seq-len", "64",
                        "--head-dim", "256", "--block-q", "256", "--block-k", "256", "--device", "t4", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "shared memory" in r.stderr


def test_predict_takes_a_window_and_reports_it():
    """--window LEFT,RIGHT for every schedule; --json reports window_size; the tiled schedules
    count only the band's tiles (closed form, as sim.predict)."""
    base = ["predict", "--seq-len", "1024", "--head-dim", "64", "--device", "h100", "--l2", "none", "--json"]
    for schedule in ("naive", "flash1", "flash2"):
        rc, out = run(base + ["--schedule", schedule, "--causal", "--window", "127,0"])
        d = json.loads(out)
        p = sim.predict(sim.Workload(heads=16, seq_len_q=1024, head_dim=64, causal=True, window_size=(127, 0)),
                        schedule, "h100", l2="none")
        assert rc == 0 and d["window_size"] == [127, 0] and d["causal"] is True
        assert (d["flops"], d["hbm_read_bytes"]) == (p.flops, p.hbm_read_bytes)
        rc, out = run(base + ["--schedule", schedule, "--causal"])
        assert json.loads(out)["window_size"] is None
        if schedule != "naive":            # (flash1's default tiles are wide: a smaller saving)
            assert d["matmul_flops"] < json.loads(out)["matmul_flops"] / (2 if schedule == "flash2" else 1)
    rc, out = run(base + ["--schedule", "flash2", "--seq-len-k", "2048", "--window=-1,0"])
    assert json.loads(out)["window_size"] == [-1, 0]
    rc, out = run(["predict", "--schedule", "flash2", "--seq-len", "512", "--window", "64,64", "--l2", "none"])
    assert "window (left, right)         (64, 64)" in out
    for bad in ("64", "a,b", "-2,0"):
        with pytest.raises(SystemExit):
            run(["predict", "--schedule", "flash2", "--seq-len", "512", f"--window={bad}"])
    with pytest.raises(SystemExit):      # top-left causal with a window and Nq != Nk
        run(["predict", "--schedule", "flash2", "--seq-len", "512", "--seq-len-k", "1024", "--causal",
             "--window", "8,0"])


def test_sweep_table_and_csv(tmp_path):
    rc, out = run(["sweep", "--schedule", "naive,flash2", "--seq-len", "256..1024", "--head-dim", "64,128",
                   "--block-q", "64,128", "--block-k", "64"])
    assert rc == 0 and "hbm_read_bytes" in out.splitlines()[0]
    path = tmp_path / "s.csv"
    rc, _ = run(["sweep", "--seq-len", "128:512:128", "--head-dim", "64", "--block-q", "16..256",
                 "--block-k", "16..256", "--device", "t4", "--csv", str(path), "--no-progress"])
    rows = list(csv.DictReader(open(path)))
    assert rc == 0 and len(rows) == 4 * 5 * 5
    w = sim.Workload(seq_len_q=384, head_dim=64, heads=16)
    row = next(r for r in rows if r["seq_len_q"] == "384" and r["block_q"] == "32" and r["block_k"] == "128")
    p = sim.predict(w, sim.Schedule("flash2", 32, 128), "t4", l2="none")
    assert int(row["hbm_read_bytes"]) == p.hbm_read_bytes
    infeasible = [r for r in rows if r["fits_sram"] == "False"]
    assert infeasible and all(r["predicted_ms"] == "" for r in infeasible)


def test_search_cli_json():
    rc, out = run(["search", "--seq-len", "1024", "--head-dim", "64", "--device", "t4", "--json"])
    d = json.loads(out)
    assert rc == 0 and d["best"]["sram_bytes_per_block"] <= sim.PROFILES["t4"].smem_bytes_per_block


def test_search_calibrates_only_when_given_records(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    w = sim.Workload(seq_len_q=4096, head_dim=64)
    raw = sim.search_blocks(w, "h100", blocks=(64, 128))
    cal = sim.search_blocks(w, "h100", blocks=(64, 128), calibration=load_results(path))
    assert raw.grid and all(r["predicted_ms_calibrated"] is None for r in raw.grid)
    assert all(r["predicted_ms_calibrated"] > 0 for r in cal.grid)
    assert [r["predicted_ms"] for r in cal.grid] == [r["predicted_ms"] for r in raw.grid]
    rc, out = run(["search", "--seq-len", "4096", "--blocks", "64,128", "--json",
                   "--calibrate-on", str(path)])
    assert rc == 0 and json.loads(out)["best"]["efficiency"]["n_records"] == 1


GOOD = {"schema": "ioaware.results/1",
        "provenance": {"gpu": "NVIDIA H100 80GB HBM3", "driver": "1", "cuda": "12", "torch": "2", "numba": "0",
                       "numba_cuda": "0", "date": "2025-01-01T00:00:00", "command": "python -m kernels.measure"},
        "records": [{"kernel": "sdpa-flash", "schedule": "flash2", "pass": "fwd", "dtype": "fp16", "batch": 1,
                     "heads": 16, "heads_kv": 16, "seq_len_q": 4096, "seq_len_k": 4096, "head_dim": 64,
                     "causal": False, "block_q": None, "block_k": None, "time_ms": 0.2, "time_ms_p10": 0.19,
                     "time_ms_p90": 0.21, "peak_extra_bytes": None, "dram_read_bytes": 25165824,
                     "dram_write_bytes": None, "l2_bytes": None, "global_load_bytes": None,
                     "global_store_bytes": None, "flops_executed": None, "extra": "kept"}]}


def test_results_loader_validates(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    recs = load_results(str(path))
    assert recs[0]["extra"] == "kept" and recs[0]["provenance"]["gpu"].startswith("NVIDIA H100")
    assert load_results(io.StringIO(json.dumps(GOOD)))[0]["time_ms"] == 0.2
    rec = recs[0]
    p = sim.predict(sim.Workload.from_record(rec), sim.schedule_for_record(rec), "h100")
    assert p.dram_read_bytes == rec["dram_read_bytes"]  # Q, K, V read once (fp16, B=1, H=16, N=4096, d=64)
    for mutate, msg in ((lambda o: o.update(schema="x"), "schema"),
                        (lambda o: o["provenance"].pop("gpu"), "provenance.gpu"),
                        (lambda o: o["records"][0].pop("time_ms"), "missing 'time_ms'"),
                        (lambda o: o["records"][0].update(batch="1"), "batch must be int"),
                        (lambda o: o["records"][0].update(kernel="cuda"), "kernel"),
                        (lambda o: o["records"][0].update(time_ms=0), "time_ms must be > 0")):
        bad = json.loads(json.dumps(GOOD))
        mutate(bad)
        with pytest.raises(ResultsFormatError, match=msg):
            load_results(io.StringIO(json.dumps(bad)))
    with pytest.raises(ResultsFormatError, match="not valid JSON"):
        load_results(io.StringIO("{"))
    assert issubclass(ResultsFormatError, ValueError)


def test_predict_cli_calibrates_on_the_given_files_only(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    args = ["predict", "--schedule", "flash2", "--seq-len", "4096", "--head-dim", "64", "--l2", "none",
            "--json", "--compact"]
    rc, out = run(args)
    raw = json.loads(out)
    assert rc == 0 and raw["predicted_ms_calibrated"] is None and raw["efficiency"] is None
    rc, out = run(args + ["--calibrate-on", str(path)])
    cal = json.loads(out)
    p = sim.predict(sim.Workload(seq_len_q=4096, head_dim=64), "flash2", "h100", l2="none",
                    calibration=load_results(path))
    assert rc == 0 and cal["efficiency"]["n_records"] == 1
    assert cal["predicted_ms_calibrated"] == pytest.approx(p.predicted_ms_calibrated)
    assert cal["predicted_ms"] == raw["predicted_ms"]
    rc, out = run(args[:-2] + ["--calibrate-on", str(path)])
    assert "fitted from 1 measured records" in out
    rc, out = run(args[:-2] + ["--device", "h200", "--calibrate-on", str(path)])
    assert "n/a (no record of h200" in out      # the file's record is of another GPU
    with pytest.raises(SystemExit):
        run(args + ["--calibrate-on", str(tmp_path / "missing.json")])


def test_predict_cli_takes_exp_flops_dq_mode_and_naive_variant():
    import json as _json
    import subprocess
    import sys as _sys

    def run(*args):
        out = subprocess.run([_sys.executable, "-m", "sim", "predict", "--seq-len", "256", "--json",
                              "--compact", "--l2", "none", *args], capture_output=True, text=True)
        return out

    kern = _json.loads(run("--schedule", "flash2", "--pass", "bwd", "--dq-mode", "kernel").stdout)
    atom = _json.loads(run("--schedule", "flash2", "--pass", "bwd").stdout)
    assert "bwd.dq" in kern["phases"] and "bwd.dq" not in atom["phases"]
    assert kern["matmul_flops"] == atom["matmul_flops"] * 14 // 10
    one = _json.loads(run("--schedule", "flash2", "--exp-flops", "1").stdout)
    five = _json.loads(run("--schedule", "flash2").stdout)
    assert five["other_flops"] > one["other_flops"] and five["matmul_flops"] == one["matmul_flops"]
    math_ = _json.loads(run("--schedule", "naive", "--variant", "math", "--dtype", "fp16").stdout)
    assert "fwd.upcast" in math_["phases"]
    bad = run("--schedule", "flash2", "--variant", "eager")
    assert bad.returncode != 0 and "variant" in bad.stderr


def test_predict_cli_prices_a_micro_tile():
    import json as _json
    import subprocess
    import sys as _sys

    def run(*args):
        return subprocess.run([_sys.executable, "-m", "sim", "predict", "--schedule", "flash2",
                               "--seq-len", "256", "--dtype", "fp32", "--matmul-unit", "cuda",
                               "--block-q", "64", "--block-k", "32", "--l2", "none", *args],
                              capture_output=True, text=True)
    tiled = _json.loads(run("--json", "--micro-tile", "4x4").stdout)
    plain = _json.loads(run("--json").stdout)
    assert tiled["times_ms"]["smem"] > 0 and plain["times_ms"]["smem"] == 0
    assert tiled["smem_load_bytes"] > 0 and "smem_load_bytes" not in plain
    assert "smem time" in run("--micro-tile", "4x4").stdout
    bad = run("--micro-tile", "4by4")
    assert bad.returncode != 0 and "TMxTN" in bad.stderr


def test_shipped_results_are_the_results_files_only(tmp_path, monkeypatch):
    """`results/` also holds other measurements (kernel resources, host cost, counter splits,
    block-size timings); the files offered as results are those with the results schema, and
    each of them loads."""
    from sim import results as R
    (tmp_path / "a.json").write_text(json.dumps({"schema": "ioaware.results/1", "provenance": {},
                                                 "records": []}))
    (tmp_path / "b.json").write_text(json.dumps({"schema": "ioaware.ncu_loads/1", "records": []}))
    (tmp_path / "c.json").write_text(json.dumps({"entries": []}))
    monkeypatch.setattr(R, "RESULTS_DIR", tmp_path)
    assert [p.name for p in R.shipped_results()] == ["a.json"]
    monkeypatch.undo()
    shipped = R.shipped_results()
    assert shipped and not any(p.name.startswith(("kernel_resources", "host_cost", "ncu_loads",
                                                   "tune_")) for p in shipped)
    for p in shipped:
        load_results(p)
