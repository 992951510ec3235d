"""The dashboard driven through Streamlit's testing API (``streamlit.testing.v1.AppTest``).

Every page is run with its defaults and with edge inputs (smallest and largest N, a custom GPU
profile, no results, malformed and empty results files); each test asserts that no exception
reached the page and that the expected elements are there. The results files offered by the app
are replaced per test (``dashboard.data.shipped_results``) so that the tests do not depend on
what ``results/`` holds. The results fixture is synthetic (see tests/data/make_fixture_results.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import data  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
FIXTURE = ROOT / "tests" / "data" / "fixture_results_synthetic.json"
TIMEOUT = 120


@pytest.fixture
def offer(monkeypatch):
    """``offer(paths)``: make the app offer exactly these results files."""
    def _offer(paths):
        paths = [Path(p) for p in paths]
        monkeypatch.setattr(data, "shipped_results", lambda: list(paths))
    _offer([])
    return _offer


def open_page(page: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT).run()
    assert not at.exception, at.exception
    if page != "explore":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, at.exception
    return at


def charts(at) -> list:
    return at.get("plotly_chart")


def downloads(at) -> list:
    return at.get("download_button")


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def ok(at: AppTest) -> AppTest:
    assert not at.exception, at.exception
    assert not at.error, texts(at.error)
    return at


# -- Explore --------------------------------------------------------------------------------------
def test_explore_defaults():
    at = ok(open_page("explore"))
    assert at.title[0].value == "Explore"
    assert len(at.metric) == 4
    assert len(at.dataframe) == 1
    assert set(at.dataframe[0].value["schedule"]) == {"naive", "flash1", "flash2"}
    assert len(charts(at)) == 2
    assert len(downloads(at)) >= 3  # table CSV + one per chart


@pytest.mark.parametrize("seq_len", [128, 65536])
def test_explore_smallest_and_largest_n(seq_len):
    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(seq_len).run()
    ok(at)
    table = at.dataframe[0].value
    assert len(table) == 3 and len(charts(at)) == 2
    # flash2 moves less global memory than naive at every N on the slider
    by = table.set_index("schedule")
    assert by.loc["flash2", "global read (B)"] < by.loc["naive", "global read (B)"]


def test_explore_custom_gpu_profile():
    at = open_page("explore")
    at.selectbox(key="w_profile").set_value(data.CUSTOM).run()
    ok(at)
    assert at.number_input(key="w_custom_num_sms").value == 132
    before = at.dataframe[0].value.set_index("schedule").loc["naive", "predicted (ms)"]
    at.number_input(key="w_custom_hbm_bandwidth_bytes_per_s").set_value(500.0).run()
    ok(at)
    after = at.dataframe[0].value.set_index("schedule").loc["naive", "predicted (ms)"]
    assert after > before  # naive attention is bandwidth-bound: a slower DRAM slows it
    assert len(charts(at)) == 2
    # an impossible GPU (more shared memory per block than per SM) is explained, not raised
    at.number_input(key="w_custom_smem_bytes_per_block").set_value(512.0).run()
    assert not at.exception
    assert "smem_bytes_per_block" in texts(at.warning)


def test_explore_edge_workloads():
    at = open_page("explore")
    at.checkbox(key="w_causal").check()
    at.slider(key="w_density").set_value(0.05)
    at.selectbox(key="w_dtype").set_value("fp32")
    at.selectbox(key="w_pass").set_value("fwd+bwd")
    at.select_slider(key="w_head_dim").set_value(256).run()
    ok(at)
    assert len(charts(at)) == 2


def test_workload_persists_across_pages(offer):
    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(1024).run()
    at.switch_page("views/measured.py").run()
    at.switch_page("views/scaling.py").run()
    ok(at)
    assert at.select_slider(key="w_seq_len").value == 1024


# -- Block sizes ----------------------------------------------------------------------------------
def test_block_sizes_with_measured_overlay(offer):
    offer([FIXTURE])
    at = ok(open_page("block_sizes"))
    assert len(charts(at)) == 1
    grid = at.dataframe[0].value
    assert len(grid) == len(data.BLOCK_SIZES) ** 2
    assert grid["feasible"].any()
    # the fixture has runs of our kernel at the default workload: the measured optimum is shown
    assert "Measured optimum" in texts(at.caption)
    for metric in data.GRID_METRICS:
        at.selectbox(key="bs_metric").set_value(metric).run()
        ok(at)
    at.selectbox(key="bs_schedule").set_value("flash1").run()
    ok(at)
    assert len(charts(at)) == 1


def test_block_sizes_without_results_and_small_gpu(offer):
    at = open_page("block_sizes")
    at.selectbox(key="w_profile").set_value("t4").run()
    at.select_slider(key="w_head_dim").set_value(256).run()
    ok(at)
    grid = at.dataframe[0].value
    assert not grid["feasible"].all()  # big tiles of d=256 do not fit a T4's shared memory
    assert len(charts(at)) == 1


# -- Scaling --------------------------------------------------------------------------------------
def test_scaling_defaults_and_ranges():
    at = ok(open_page("scaling"))
    assert len(charts(at)) == 3
    table = at.dataframe[0].value
    assert set(table["schedule"]) == {"naive", "flash1", "flash2"}
    assert table["seq_len"].min() == 128 and table["seq_len"].max() == 65536
    at.select_slider(key="sc_range").set_value((128, 256)).run()
    ok(at)
    assert sorted(at.dataframe[0].value["seq_len"].unique()) == [128, 256]
    at.select_slider(key="sc_range").set_value((512, 512)).run()
    ok(at)
    assert "at least two" in texts(at.info)


# -- Predicted vs measured ------------------------------------------------------------------------
def test_measured_with_no_results(offer):
    at = ok(open_page("measured"))
    assert "No results files" in texts(at.info)
    assert len(charts(at)) == 0


def test_measured_with_fixture(offer):
    offer([FIXTURE])
    at = ok(open_page("measured"))
    assert "SYNTHETIC" in at.dataframe[0].value.to_string()  # provenance block
    assert len(charts(at)) == 1
    records = at.dataframe[-1].value
    assert len(records) == len(json.loads(FIXTURE.read_text())["records"])
    summary = at.dataframe[1].value.set_index("metric")  # sim.compare's table, shown as is
    assert summary.loc["global_bytes", "n"] > 0
    assert len(at.radio(key="pm_metric").options) == len(data.compared_metrics())
    for metric in data.compared_metrics():  # one scatter per metric, chosen by the radio
        at.radio(key="pm_metric").set_value(metric).run()
        ok(at)
        assert len(charts(at)) == 1
    at.multiselect(key="pm_family").set_value(["eager"]).run()
    ok(at)
    assert set(at.dataframe[-1].value["kernel"]) == {"eager"}
    at.selectbox(key="pm_l2").set_value("auto").run()
    ok(at)
    at.multiselect(key="pm_family").set_value([]).run()
    ok(at)
    assert "No records match" in texts(at.info)


def _write(tmp_path, name, content) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_measured_malformed_and_empty_files(offer, tmp_path):
    good = json.loads(FIXTURE.read_text())
    bad_record = json.loads(FIXTURE.read_text())
    del bad_record["records"][0]["seq_len_q"]
    files = {
        "not_json.json": "{this is not json",
        "wrong_schema.json": {"schema": "something/else", "records": []},
        "bad_record.json": bad_record,
        "empty.json": {**good, "records": []},
    }
    offer([_write(tmp_path, n, c) for n, c in files.items()])
    at = open_page("measured")
    for name in files:
        at.selectbox(key="pm_source").set_value(str(tmp_path / name)).run()
        assert not at.exception, (name, at.exception)
        if name == "empty.json":
            assert not at.error and "holds no records" in texts(at.info)
        else:
            assert at.error and "not a valid results file" in texts(at.error), name
        assert len(charts(at)) == 0


# -- Step through ---------------------------------------------------------------------------------
def test_step_defaults_and_last_step():
    at = ok(open_page("step"))
    assert len(charts(at)) == 5  # tiles, bytes so far, m/l, output, scores
    last = at.slider(key="st_step").max
    at.slider(key="st_step").set_value(last).run()
    ok(at)
    assert "100%" in texts(at.metric)


@pytest.mark.parametrize("schedule", ["flash1", "naive"])
def test_step_other_schedules_and_edges(schedule):
    at = open_page("step")
    at.selectbox(key="st_schedule").set_value(schedule)
    at.selectbox(key="st_seq_len").set_value(16)
    at.selectbox(key="st_block_q").set_value(64)
    at.checkbox(key="st_causal").check().run()
    ok(at)
    at.selectbox(key="st_seq_len").set_value(256).run()
    at.slider(key="st_row").set_value(0).run()
    ok(at)
    assert len(charts(at)) >= 3


# -- Measure --------------------------------------------------------------------------------------
def test_measure_without_gpu(monkeypatch):
    monkeypatch.setattr(data, "cuda_device", lambda: None)
    at = ok(open_page("measure"))
    assert "No CUDA GPU was found" in texts(at.warning)
    code = texts(at.code)
    assert "python -m benchmarks measure" in code and "python -m benchmarks ncu" in code
    assert "kernels." not in code


def test_measure_with_gpu_but_no_harness(monkeypatch):
    monkeypatch.setattr(data, "cuda_device", lambda: "Test GPU")
    monkeypatch.setattr(data, "import_measure", lambda: (None, "ModuleNotFoundError: test"))
    at = ok(open_page("measure"))
    assert "not available" in texts(at.warning) and "benchmarks.measure" in texts(at.warning)


def test_measure_page_imports_the_benchmarks_harness(monkeypatch):
    import sys
    import types

    harness = types.ModuleType("benchmarks.measure")
    monkeypatch.setitem(sys.modules, "benchmarks", types.ModuleType("benchmarks"))
    monkeypatch.setitem(sys.modules, "benchmarks.measure", harness)
    mod, err = data.import_measure()
    assert mod is None and "run_sweep" in err            # found, but not a harness
    harness.run_sweep = lambda configs, progress=None, out_path=None: None
    assert data.import_measure() == (harness, None)


def test_measure_runs_a_sweep_with_progress(monkeypatch, tmp_path):
    calls = []

    class Harness:
        @staticmethod
        def run_sweep(configs, progress=None, out_path=None):
            for i in range(len(configs)):
                progress(i + 1, len(configs), None)
            calls.append(configs)
            return json.loads(FIXTURE.read_text())

    monkeypatch.setattr(data, "cuda_device", lambda: "Test GPU")
    monkeypatch.setattr(data, "import_measure", lambda: (Harness, None))
    monkeypatch.setattr(data, "new_results_path", lambda gpu: tmp_path / "saved.json")
    at = ok(open_page("measure"))
    at.button[0].click().run()
    ok(at)
    assert calls and len(calls[0]) == 3 * 2 * 1 * 2 * 2  # N x d x dtype x causal x pass
    assert "saved.json" in texts(at.success)
    assert json.loads((tmp_path / "saved.json").read_text())["schema"] == "ioaware.results/1"


# -- data functions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_online_softmax_walk_matches_exact_softmax(causal):
    walk = data.online_softmax_walk(48, 8, 16, 20, causal, seed=3)
    assert walk["check"]["max_abs_err_vs_exact_softmax"] < 1e-12  # float64 throughout
    steps = walk["steps"]
    assert (np.diff(steps["m"]) >= 0).all()  # the running max never decreases
    assert steps["err_vs_final"].iloc[-1] < 1e-12
    if "max_abs_err_ioaware_tiled_fp32" in walk["check"]:
        assert walk["check"]["max_abs_err_ioaware_tiled_fp32"] < 1e-5  # float32 accumulation


def test_summary_display_and_filters():
    summary = pd.DataFrame([{"metric": "flops", "what": "x", "records": "all", "n": 2,
                             "median_abs_err_pct": 1.5, "max_abs_err_pct": 3.0,
                             "mean_signed_err_pct": -0.5, "target_pct": 2.0,
                             "within_target_pct": 50.0, "required_pct": 100.0, "met": False}])
    shown = data.display_summary(summary).iloc[0]
    assert shown["max |error|"] == "3.0%" and shown["target met"] == "NO"
    df = pd.DataFrame({"kernel": ["a", "b"], "dtype": ["fp16", "fp16"]})
    assert list(data.filter_records(df, {"kernel": ["b"]})["kernel"]) == ["b"]
    assert data.filter_records(df, {"kernel": []}).empty


def test_explore_shows_what_sim_predicts():
    """The Explore table is sim.predict's answer, not a number of the dashboard's own."""
    import sim

    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(2048).run()
    table = ok(at).dataframe[0].value.set_index("schedule")
    w = sim.Workload(batch=1, heads=16, seq_len_q=2048, head_dim=64, dtype="fp16")
    for name in ("naive", "flash1", "flash2"):
        p = sim.predict(w, sim.Schedule(name), "h100", l2="analytic")
        assert table.loc[name, "global read (B)"] == p.hbm_read_bytes
        assert table.loc[name, "DRAM write (B)"] == p.dram_write_bytes
        assert table.loc[name, "predicted (ms)"] == pytest.approx(p.predicted_ms)


def test_measure_configs_are_accepted_by_the_harness():
    measure = pytest.importorskip("benchmarks.measure")
    configs = data.measure_configs((1024,), (64, 128), ("fp16",), 1, 16, (False, True), ("fwd", "bwd"))
    assert len(configs) == 8
    for cfg in configs:
        for kernel in measure.KERNELS:
            measure.normalize_config(dict(cfg, kernel=kernel))  # raises on a field it rejects


def test_explore_calibrates_only_on_the_chosen_file(offer):
    """No calibrated time unless a results file is chosen; then sim.predict's, fitted on that
    file (calibration=path)."""
    import sim

    compare_fixture = ROOT / "tests" / "data" / "synthetic_results_fixture.json"
    offer([FIXTURE, compare_fixture])
    at = ok(open_page("explore"))
    assert "calibrated (ms)" not in at.dataframe[0].value.columns
    assert at.selectbox(key="ex_calibrate_on").value == data.NO_CALIBRATION
    at.select_slider(key="w_seq_len").set_value(2048).run()
    at.selectbox(key="ex_calibrate_on").set_value(data._choice_name(compare_fixture)).run()
    table = ok(at).dataframe[0].value.set_index("schedule")
    w = sim.Workload(batch=1, heads=16, seq_len_q=2048, head_dim=64, dtype="fp16")
    p = sim.predict(w, sim.Schedule("flash2"), "h100", l2="analytic", calibration=compare_fixture)
    assert p.predicted_ms_calibrated is not None
    assert table.loc["flash2", "calibrated (ms)"] == pytest.approx(p.predicted_ms_calibrated)
    assert table.loc["flash2", "predicted (ms)"] == pytest.approx(p.predicted_ms)


def test_explore_trace_l2_model_and_its_limit():
    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(1024)
    at.selectbox(key="w_l2").set_value("trace").run()
    ok(at)
    assert set(at.dataframe[0].value["L2 model"]) == {"trace"}
    at.select_slider(key="w_seq_len").set_value(65536).run()
    ok(at)
    assert "limited" in texts(at.info)
    assert set(at.dataframe[0].value["L2 model"]) == {"analytic"}
