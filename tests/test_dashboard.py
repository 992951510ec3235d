"""The dashboard driven through Streamlit's testing API (``streamlit.testing.v1.AppTest``), and its
data functions on their own.

Every page is run with its defaults and with edge inputs; each test asserts that no exception
reached the page and that the expected elements are there. The results files offered by the app
are replaced per test (``dashboard.data.shipped_results``) so that the tests do not depend on
what ``results/`` holds. The results fixture is synthetic (see tests/data/make_fixture_results.py).
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")
from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard import data, figures, fmt, walk  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "dashboard" / "app.py"
FIXTURE = ROOT / "tests" / "data" / "fixture_results_synthetic.json"
TIMEOUT = 120
PAGES = {"explore": "Explore", "block_sizes": "Block sizes", "scaling": "Scaling",
         "measured": "Predicted vs measured", "decode": "Decoding",
         "hopper": "What asynchrony buys", "step": "Step through", "measure": "Measure"}
ROOFLINE_MS = data.ROOFLINE + " (ms)"
#: The header of the one predicted time at the GPU's datasheet rates.
PREDICTED = data.rates_label("datasheet rates")
PREDICTED_MS = PREDICTED + " (ms)"
#: ... and at the rates measured on the GPU (the pages' default where a rates file has them).
MEASURED_RATES = data.rates_label("measured rates")
RATES_H100 = ROOT / "results" / "rates_h100_2026-11-24.json"
RATES_H200 = ROOT / "results" / "rates_h200_2026-11-24.json"
BENCH = ROOT / "results" / "bench_nvidia-h100-80gb-hbm3_2026-11-24.json"
SWEEP = ROOT / "results" / "h100_sweep_20261122.json"
READS = "Times read (×)"

#: Words of the code that must not reach the screen: kernel and field names, the cost model's
#: package name and its trace's phase names (``bwd.main``), "-1" sentinels, issue numbers.
INTERNAL = re.compile(r"ioaware-numba|\bsim\b|flash_(fwd|bwd)|_v2\b|kernels_sha|\bq_block\b|"
                      r"\bk_block\b|(?<![\w.\d])-1(?![\d.])|\bissue\b|#\d{2,}|"
                      r"\b(fwd|bwd)\.[a-z]", re.IGNORECASE)


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


def texts(elements) -> str:
    return "\n".join(str(e.value) for e in elements)


def ok(at: AppTest) -> AppTest:
    assert not at.exception, at.exception
    assert not at.error, texts(at.error)
    return at


def table(at, label: str) -> pd.DataFrame:
    """The first table (``st.table`` or ``st.dataframe``) with a column ``label``."""
    for t in list(at.table) + list(at.dataframe):
        df = t.value
        if df.index.name is not None:
            df = df.reset_index()
        if label in df.columns:
            return df
    raise AssertionError(f"no table with a column {label!r}")


def _shown(node):
    """The elements of an AppTest tree outside expanders (what a reader sees unopened)."""
    for child in getattr(node, "children", {}).values():
        if getattr(child, "type", None) == "expander":
            continue
        if getattr(child, "children", None):
            yield from _shown(child)
        else:
            yield child


def _all(node):
    """Every element of an AppTest tree, expanders opened."""
    for child in getattr(node, "children", {}).values():
        if getattr(child, "children", None):
            yield from _all(child)
        else:
            yield child


def screen_text(at, expanders: bool = False) -> str:
    """What a page shows outside expanders (``expanders``: inside them too): titles, text,
    captions, alerts, metric labels and values, widget labels and options, table headers and
    cells."""
    parts = []
    for e in (_all if expanders else _shown)(at._tree):
        kind = getattr(e, "type", "")
        if kind == "metric":
            parts.append(f"{e.label} {e.value}")
        elif kind in ("dataframe", "table"):
            parts += [str(c) for c in e.value.columns] + [e.value.to_string()]
        elif kind in ("selectbox", "multiselect", "radio", "slider", "select_slider",
                      "number_input", "checkbox", "button", "download_button"):
            parts.append(str(e.label))
            parts += [str(o) for o in getattr(e, "options", [])]
        elif hasattr(e, "value") and kind not in ("code",):
            parts.append(str(e.value))
    return "\n".join(parts)


# -- every page ---------------------------------------------------------------------------------
@pytest.mark.parametrize("page", list(PAGES))
def test_every_page_runs_clean_and_speaks_plainly(page, offer):
    offer([FIXTURE])
    at = ok(open_page(page))
    assert at.title[0].value == PAGES[page]
    hits = sorted({m.group(0) for m in INTERNAL.finditer(screen_text(at))})
    assert not hits, f"{page}: internal words on screen: {hits}"
    assert_tables_drawn_whole_are_text(at)


def assert_tables_drawn_whole_are_text(at) -> None:
    """``st.table`` ignores column formats and prints an integer bare (``65536``, or ten digits
    for a byte count): every number in a table drawn whole must arrive as formatted text."""
    for t in at.table:
        df = t.value.reset_index() if t.value.index.name is not None else t.value
        bare = [c for c in df.columns if pd.api.types.is_numeric_dtype(df[c])]
        assert not bare, f"columns shown as bare numbers: {bare}"


def test_root_opens_explore():
    at = ok(AppTest.from_file(str(APP), default_timeout=TIMEOUT).run())
    assert at.title[0].value == "Explore"


# -- formatting -----------------------------------------------------------------------------------
def test_numbers_read_with_units():
    assert fmt.bytes_(512) == "512 B"
    assert fmt.bytes_(1_234_567) == "1.23 MB"
    assert fmt.bytes_(1_640_000_000) == "1.64 GB"
    assert fmt.ms(0.07162) == "0.0716 ms" and fmt.ms(1234.6) == "1,235 ms"
    assert fmt.ratio(13.46) == "13.5×"
    assert fmt.count(1234567) == "1,234,567"
    assert fmt.signed_pct(-0.05) == "−5.0 %" and fmt.pct(0.123) == "12.3 %"
    assert fmt.num(float("-inf")) == "−∞" and fmt.bytes_(None) == "—"
    assert fmt.num(0.06921) == "0.0692" and fmt.num(3.3e-16, 2) == "3.3e-16"


def test_counts_in_tables_drawn_whole_have_separators():
    from dashboard import ui

    df = pd.DataFrame({"n": [65536, 1_234_567_890], "b": [512, 1_640_000_000]})
    cols = {"n": fmt.Col("N", "count"), "b": fmt.Col("Bytes", "bytes")}
    whole, _, csv = ui.formatted(df, cols, static=True)
    assert list(whole["N"]) == ["65,536", "1,234,567,890"]
    assert list(whole["Bytes"]) == ["512 B", "1.64 GB"]
    assert list(csv["N"]) == [65536, 1_234_567_890]          # the download keeps raw numbers
    grid, config, _ = ui.formatted(df, cols, static=False)    # the grid formats by its column
    assert pd.api.types.is_numeric_dtype(grid["N"]) and "N" in config


# -- Explore --------------------------------------------------------------------------------------
def _plan_ms(name: str, w, profile="h100") -> float:
    """The textbook schedule's plan priced as the pages price it (every pass)."""
    from sim.plan import price
    from sim.plans import plan_for
    return sum(price(plan_for(name, p, w.replace(pass_=p), profile=profile), profile).time_ms
               for p in w.passes)


def _measured_h100():
    """The H100 profile with the rates the shipped rates file measured (what the pages price
    with by default)."""
    from sim.profiles import load_profile
    return load_profile("h100", rates=json.loads(RATES_H100.read_text()))


def test_rates_default_to_the_file_measured_on_the_profile_s_gpu():
    from dashboard import ui

    assert data.rates_for_profile("h100") == data._choice_name(RATES_H100)
    assert data.rates_for_profile("h200") == data._choice_name(RATES_H200)
    assert data.rates_for_profile("t4") is None and data.rates_for_profile(data.CUSTOM) is None
    assert data.rates_provenance(RATES_H100.read_bytes())["date"] == "2026-11-24"
    assert ui.rates_source(RATES_H100.read_bytes(), "results/rates_h100_2026-11-24.json") == (
        "rates_h100_2026-11-24.json, 2026-11-24")
    at = ok(open_page("explore"))
    assert at.selectbox(key="bs_rates").value == ui.MEASURED_HERE
    assert "Predicted from measured rates (rates_h100_2026-11-24.json, 2026-11-24)" in texts(
        at.caption)
    assert at.metric[2].label == "Predicted (measured rates)"
    at.selectbox(key="w_profile").set_value("h200").run()        # follows the GPU
    assert "(rates_h200_2026-11-24.json, 2026-11-24)" in texts(ok(at).caption)
    at.selectbox(key="w_profile").set_value("t4").run()          # none measured: the datasheet
    assert "Predicted from datasheet rates (no rates file was measured on this GPU)" in texts(
        ok(at).caption)
    assert at.metric[2].label == "Predicted (datasheet rates)"
    at.selectbox(key="w_profile").set_value("h100").run()
    at.selectbox(key="bs_rates").set_value(ui.DATASHEET).run()    # the user's explicit choice
    assert "Predicted from datasheet rates" in texts(ok(at).caption)
    assert at.metric[2].label == "Predicted (datasheet rates)"
    at.selectbox(key="bs_rates").set_value(data._choice_name(RATES_H200)).run()
    assert "measured on the NVIDIA H200, not this GPU" in texts(ok(at).caption)
    assert "was not used" in texts(at.warning)
    at.selectbox(key="bs_rates").set_value(ui.UPLOAD_RATES).run()  # the format, with an example
    assert '"ioaware.rates/1"' in texts(ok(at).caption)
    assert data.DEFAULT_RATES_FILES["h100"] == RATES_H100.name


def test_a_rates_file_added_to_results_changes_no_default(tmp_path, monkeypatch):
    """Only the file `DEFAULT_RATES_FILES` names is a profile's default: another H100 rates
    file in results/ (newer, say) is offered as a choice but priced with only when chosen."""
    newer = json.loads(RATES_H100.read_text())
    newer["provenance"]["date"] = "2030-01-01T00:00:00+00:00"
    extra = tmp_path / "rates_h100_2030-01-01.json"
    extra.write_text(json.dumps(newer))
    files = data.rates_files()
    monkeypatch.setattr(data, "rates_files", lambda: files + [extra])
    assert data._choice_name(extra) in data.rates_choices()
    assert data.rates_for_profile("h100") == data._choice_name(RATES_H100)


def test_explore_defaults_show_what_the_model_predicts():
    import sim

    from dashboard import ui

    at = ok(open_page("explore"))
    assert len(at.metric) == 4 and len(charts(at)) == 2
    shown = table(at, "Schedule").set_index("Schedule")
    assert list(shown.index) == ["Standard attention", "FlashAttention", "FlashAttention-2"]
    w = sim.Workload(batch=1, heads=16, seq_len_q=4096, head_dim=64, dtype="fp16")
    rated = _measured_h100()
    for name, label in data.SCHEDULE_LABELS.items():
        p = sim.predict(w, sim.Schedule(name), "h100", l2="analytic")
        assert shown.loc[label, "Global read"] == fmt.bytes_(p.hbm_read_bytes)
        assert shown.loc[label, "DRAM write"] == fmt.bytes_(p.dram_write_bytes)
        # one predicted time: the schedule's plan priced at the rates measured on the H100
        assert shown.loc[label, MEASURED_RATES + " (ms)"] == fmt.num(_plan_ms(name, w, rated))
    assert ROOFLINE_MS not in shown.columns
    assert "Time from" not in shown.columns        # every row a plan: the header says it
    assert at.metric[2].label == "Predicted (measured rates)"
    assert at.metric[2].value == fmt.ms(_plan_ms("flash2", w, rated))
    # at the datasheet's rates when asked, so labelled
    at.selectbox(key="bs_rates").set_value(ui.DATASHEET).run()
    shown = table(ok(at), "Schedule").set_index("Schedule")
    for name, label in data.SCHEDULE_LABELS.items():
        assert shown.loc[label, PREDICTED_MS] == fmt.num(_plan_ms(name, w))
    assert at.metric[2].label == "Predicted (datasheet rates)"
    assert at.metric[2].value == fmt.ms(_plan_ms("flash2", w))
    # the roofline draws the datasheet's peaks as a bound, named so
    table_, ceilings = data.compare_schedules(4096, 64, 1, 16, "fp16", "fwd", False, 1.0, "h100")
    names = [t.name for t in figures.roofline(table_, ceilings).data]
    assert sum(n.startswith("peak-rate bound (datasheet)") for n in names) == 3


def test_a_schedule_without_a_plan_keeps_the_roofline_named_as_a_bound(monkeypatch):
    priced = data.schedule_time
    monkeypatch.setattr(data, "schedule_time",
                        lambda w, name, prof: None if name == "naive" else priced(w, name, prof))
    table_, ceilings = data.compare_schedules(2048, 64, 1, 3, "fp16", "fwd", False, 1.0, "h100")
    by = table_.set_index("schedule")
    assert by.loc["naive", "time_ms"] == by.loc["naive", "predicted_ms"]
    assert not ceilings["all_planned"]
    shown, cols = data.schedule_table(table_)
    assert cols["time_ms"].label == "Predicted time"
    assert list(shown["time_from"]) == ["roofline at peak rates (a bound)",
                                        "plan, datasheet rates", "plan, datasheet rates"]


@pytest.mark.parametrize("seq_len", [128, 65536])
def test_explore_smallest_and_largest_n(seq_len):
    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(seq_len).run()
    ok(at)
    tab, _ = data.compare_schedules(seq_len, 64, 1, 16, "fp16", "fwd", False, 1.0, "h100")
    by = tab.set_index("schedule")
    assert by.loc["flash2", "hbm_read_bytes"] < by.loc["naive", "hbm_read_bytes"]
    assert len(charts(at)) == 2


def test_explore_custom_gpu_profile():
    at = open_page("explore")
    at.selectbox(key="w_profile").set_value(data.CUSTOM).run()
    ok(at)
    assert at.number_input(key="w_custom_num_sms").value == 132
    before = float(table(at, PREDICTED_MS).set_index("Schedule").loc["Standard attention",
                                                                     PREDICTED_MS])
    at.number_input(key="w_custom_hbm_bandwidth_bytes_per_s").set_value(500.0).run()
    ok(at)
    after = float(table(at, PREDICTED_MS).set_index("Schedule").loc["Standard attention",
                                                                    PREDICTED_MS])
    assert after > before  # standard attention is bandwidth-bound: a slower DRAM slows it
    # an impossible GPU (more shared memory per block than per SM) is explained, not raised
    at.number_input(key="w_custom_smem_bytes_per_block").set_value(512.0).run()
    assert not at.exception
    assert "smem_bytes_per_block" in texts(at.warning)


def test_explore_trace_l2_model_and_its_limit():
    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(1024)
    at.selectbox(key="w_l2").set_value("trace").run()
    ok(at)
    assert set(table(at, "DRAM bytes from")["DRAM bytes from"]) == {"trace replay"}
    at.select_slider(key="w_seq_len").set_value(65536).run()
    ok(at)
    assert "offered up to" in texts(at.info)
    assert set(table(at, "DRAM bytes from")["DRAM bytes from"]) == {"analytic estimate"}


def test_explore_calibrates_only_on_the_chosen_file(offer):
    import sim

    compare_fixture = ROOT / "tests" / "data" / "synthetic_results_fixture.json"
    offer([FIXTURE, compare_fixture])
    at = ok(open_page("explore"))
    assert "Calibrated time (ms)" not in table(at, "Schedule").columns
    at.select_slider(key="w_seq_len").set_value(2048).run()
    at.selectbox(key="ex_calibrate_on").set_value(data._choice_name(compare_fixture)).run()
    shown = table(ok(at), "Schedule").set_index("Schedule")
    w = sim.Workload(batch=1, heads=16, seq_len_q=2048, head_dim=64, dtype="fp16")
    p = sim.predict(w, sim.Schedule("flash2"), "h100", l2="analytic", calibration=compare_fixture)
    assert p.predicted_ms_calibrated is not None
    assert shown.loc["FlashAttention-2", "Calibrated time (ms)"] == fmt.num(
        p.predicted_ms_calibrated)


def test_workload_persists_across_pages(offer):
    at = open_page("explore")
    at.select_slider(key="w_seq_len").set_value(1024).run()
    at.switch_page("views/measured.py").run()
    at.switch_page("views/scaling.py").run()
    ok(at)
    assert at.select_slider(key="w_seq_len").value == 1024


# -- Block sizes ----------------------------------------------------------------------------------
#: The shipped tile sweeps (``python -m benchmarks pick``): the mma and tf32 forwards, and the
#: Hopper (wgmma) forward, every legal tile configuration timed on an H100.
PICK = ROOT / "results" / "pick_h100_2026-11-24.json"
PICK_WGMMA = ROOT / "results" / "pick_wgmma_h100_2026-11-24.json"
H100_GPU = "NVIDIA H100 80GB HBM3"
#: A workload of the model alone (not measured): its causal twin, and the tie below.
FIRST = dict(seq_len=4096, head_dim=64, batch=4, heads=32, dtype="fp16")
#: The workload the block-size page opens on: the pick file's first at N = 8192.
OPENED = dict(seq_len=8192, head_dim=64, batch=2, heads=16, dtype="fp16")


def _pick_sweep(path=PICK) -> dict:
    return data.load_tile_sweep(path.read_bytes(), path.name)


def test_tile_plane_has_one_cell_per_legal_configuration_priced_by_the_model():
    from sim import Workload
    from sim.plan import price
    from sim.plans import choose, plan_for
    from sim.plans.tensor_core_fwd import mma_forward_configs

    plane = data.tile_plane("mma", "fwd", causal=True, profile="h100", **FIRST)
    assert plane["refused"] is None and plane["rates"] == "datasheet rates"
    w = Workload(batch=4, heads=32, seq_len_q=4096, head_dim=64, dtype="fp16", causal=True)
    legal = mma_forward_configs(w)
    cells = plane["cells"]
    assert len(cells) == len(legal) == plane["n_legal"] and cells["legal"].all()
    for cfg in legal:
        cell = cells[(cells["block_q"] == cfg["block_q"]) & (cells["block_k"] == cfg["block_k"])]
        assert len(cell) == 1
        want = price(plan_for("mma", "fwd", w, **cfg), "h100").time_ms
        assert float(cell["predicted_ms"].iloc[0]) == pytest.approx(want, rel=1e-12)
    pick, cost, ranked = choose("mma", "fwd", w, "h100")
    assert plane["pick"] == pick and plane["pick_ms"] == pytest.approx(cost.time_ms)
    assert list(cells.sort_values("rank")["predicted_ms"]) == pytest.approx(
        [t * 1e3 for t, _c in ranked])
    # the first group: the model takes 128 x 64; the ties listed are the configurations priced
    # within the tie tolerance of the pick, none other
    first = data.tile_plane("mma", "fwd", causal=False, profile="h100", **FIRST)
    assert first["pick"] == {"block_q": 128, "block_k": 64}
    c = first["cells"]
    others = c[~((c["block_q"] == 128) & (c["block_k"] == 64)) & c["legal"]]
    tied = others[(others["predicted_ms"] - first["pick_ms"]).abs() <= data.TIE * first["pick_ms"]]
    assert sorted(map(dict, first["ties"]), key=str) == sorted(
        ({"block_q": int(r.block_q), "block_k": int(r.block_k)} for r in tied.itertuples()), key=str)


def test_tile_plane_illegal_cells_are_blank_with_a_reason():
    from sim import Workload
    from sim.plans.tensor_core_fwd import tf32_forward_configs

    plane = data.tile_plane("tf32", "fwd", seq_len=4096, head_dim=128, batch=4, heads=8,
                            dtype="fp32", causal=False, profile="h100")
    cells = plane["cells"]
    legal = tf32_forward_configs(Workload(batch=4, heads=8, seq_len_q=4096, head_dim=128,
                                          dtype="fp32"))
    assert int(cells["legal"].sum()) == len(legal) < len(cells)
    bad = cells[~cells["legal"]]
    assert bad["predicted_ms"].isna().all() and (bad["block_q"] == 32).all()
    assert all("split layout cannot take" in why for why in bad["why"])
    fig = data_figure(plane)
    heat = fig.data[0]
    row = list(heat.y).index("32")
    assert all(t == "" for t in heat.text[row])                     # blank cells
    assert all("not legal here" in h for h in heat.customdata[row])  # the reason on hover


def data_figure(plane, measured=None, best=None):
    from dashboard import figures
    pick = (plane["pick"]["block_q"], plane["pick"]["block_k"])
    return figures.tile_heatmaps(plane["cells"], measured, pick=pick, best=best,
                                 predicted_title="predicted", measured_title="measured")


def test_an_illegal_workload_gives_one_line_why():
    plane = data.tile_plane("mma", "fwd", causal=False, profile="h100",
                            **dict(FIRST, dtype="fp32"))
    assert plane["cells"] is None
    assert plane["refused"] == "the mma forward runs dtype fp16 or bf16, got dtype fp32"
    why = data.tile_plane("mma", "fwd", causal=False, profile="h100",
                          **dict(FIRST, head_dim=96))["refused"]
    assert "\n" not in why and "head dim 96" in why
    small = data.tile_plane("tf32", "fwd", causal=False, profile="t4", **dict(FIRST, dtype="fp32"))
    assert small["refused"].startswith("no tile configuration of this kernel fits one SM of the "
                                       "NVIDIA T4")


def test_measured_overlay_joins_the_pick_file_group():
    raw = json.loads(PICK.read_text())
    sweep = _pick_sweep()
    assert sweep["gpu"] == H100_GPU and sweep["profile"] == "h100"
    assert sweep["schema"] == "ioaware.pick/1"
    groups = data.tile_sweep_groups(sweep, "mma/fwd")
    assert len(groups) == 16 and set(groups["configs"]) == {4}
    assert len(data.tile_sweep_groups(sweep, "tf32/fwd")) == 16
    assert data.tile_sweep_groups(sweep, "wgmma/fwd").empty
    assert len(data.tile_sweep_groups(_pick_sweep(PICK_WGMMA), "wgmma/fwd")) == 16
    assert data.group_label(groups.iloc[0]) == ("N = 512, d = 64, batch 32, 16 heads, fp16, "
                                                "not causal")
    got = data.measured_tiles(sweep, "mma/fwd", causal=True, **OPENED)
    want = {(r["config"]["block_q"], r["config"]["block_k"]): r["time_ms"]
            for r in raw["records"] if r["family"] == "mma" and r["head_dim"] == 64
            and r["causal"] and r["seq_len"] == 8192}
    assert len(want) == 4
    assert {(int(q), int(k)): t for q, k, t in zip(got["block_q"], got["block_k"],
                                                    got["time_ms"])} == want
    assert data.measured_tiles(sweep, "tf32/fwd", causal=True, **OPENED).empty
    assert data.measured_tiles(sweep, "mma/fwd", causal=True, window=512, **OPENED).empty


def test_pick_files_are_read_without_the_benchmarks_package(monkeypatch):
    want = _pick_sweep()["records"]
    monkeypatch.setattr(data, "_timings_reader", lambda: data._read_pick)
    data.load_tile_sweep.clear()
    got = data.load_tile_sweep(PICK.read_bytes(), PICK.name)["records"]
    data.load_tile_sweep.clear()
    pd.testing.assert_frame_equal(got, want)


def test_an_older_tile_sweep_is_still_read(tmp_path):
    """A ``tune_tc`` file (the tile sweep before ``benchmarks pick``): its rows are the float16
    forward of the mma kernel."""
    pytest.importorskip("benchmarks.pick")
    row = dict(kernel="mma", head_dim=64, causal=False, seq_len=4096, batch=4, heads=32)
    doc = {"schema": "ioaware.tune_tc/1", "provenance": {"gpu": H100_GPU}, "rows": [
        dict(row, block_q=128, block_k=64, time_ms=2.0),
        dict(row, block_q=64, block_k=64, time_ms=2.5)]}
    path = tmp_path / "tune_tc.json"
    path.write_text(json.dumps(doc))
    sweep = data.load_tile_sweep(path.read_bytes(), path.name)
    got = data.measured_tiles(sweep, "mma/fwd", causal=False, **FIRST)
    assert list(got["time_ms"]) == [2.5, 2.0] and sweep["profile"] == "h100"


@pytest.mark.parametrize("path", [PICK, PICK_WGMMA], ids=lambda p: p.stem)
def test_the_page_s_verdict_is_the_pick_report_s(path):
    """Every measured group of the shipped tile sweeps: the page's pick, measured best and loss
    are those of ``benchmarks.pick.pick_report`` (the model of `sim.plans.choose`, at the rates
    measured on the H100)."""
    pick = pytest.importorskip("benchmarks.pick")
    report = pick.pick_report(str(path), profile="h100", rates=str(RATES_H100))
    sweep, rates = _pick_sweep(path), RATES_H100.read_bytes()
    assert report["groups"]
    for g in report["groups"]:
        key = f"{g['family']}/{g['pass']}"
        w = {k: g[k] for k in ("seq_len", "head_dim", "batch", "heads", "dtype", "causal")}
        plane = data.tile_plane(g["family"], g["pass"], profile="h100", rates=rates,
                                rates_name="rates.json", **w)
        assert plane["rates"] == "measured rates"
        v = data.tile_verdict(plane, data.measured_tiles(sweep, key, **w))
        assert v["pick"] == (g["pick"]["block_q"], g["pick"]["block_k"]), g
        assert v["best"] == (g["best"]["block_q"], g["best"]["block_k"]), g
        assert v["best_ms"] == pytest.approx(g["best_ms"])
        assert v["pick_ms"] == pytest.approx(g["pick_ms"])
        assert v["loss"] * 100 == pytest.approx(g["loss_pct"], abs=1e-9)
        assert plane["pick_ms"] == pytest.approx(g["model_pick_ms"])


def test_pick_best_and_loss_on_the_pick_file():
    sweep, rates = _pick_sweep(), RATES_H100.read_bytes()
    # d=64 causal, N = 8192: the model picks 128 x 32 (1.132 ms measured), the best is 128 x 64
    plane = data.tile_plane("mma", "fwd", causal=True, profile="h100", rates=rates, **OPENED)
    v = data.tile_verdict(plane, data.measured_tiles(sweep, "mma/fwd", causal=True, **OPENED))
    assert v["pick"] == (128, 32) and v["best"] == (128, 64) and v["pick_rank"] == 2
    assert v["pick_ms"] == pytest.approx(1.1315200328826904)
    assert v["best_ms"] == pytest.approx(0.9939360022544861)
    assert v["text"] == ("The model picks 128 × 32: 1.132 ms, 13.8 % slower than the measured "
                         "best 128 × 64: 0.994 ms.")
    # not causal: the pick is the measured best
    plane = data.tile_plane("mma", "fwd", causal=False, profile="h100", rates=rates, **OPENED)
    measured = data.measured_tiles(sweep, "mma/fwd", causal=False, **OPENED)
    v = data.tile_verdict(plane, measured)
    assert v["pick"] == v["best"] == (128, 64) and v["loss"] == 0
    assert "nothing is lost" in v["text"]
    # had the model taken 128 x 32: 2.330 / 2.003 - 1 = 16.3 % lost
    tie = dict(plane, pick={"block_q": 128, "block_k": 32})
    v = data.tile_verdict(tie, measured)
    assert v["loss"] == pytest.approx(2.3304638862609863 / 2.0031039714813232 - 1)
    assert v["text"] == ("The model picks 128 × 32: 2.330 ms, 16.3 % slower than the measured "
                         "best 128 × 64: 2.003 ms.")
    # predicted / measured over the group's configurations: bracketing 1, within a factor 5
    assert 0.2 < v["ratio_lo"] < 1 < v["ratio_hi"] < 5
    sheet = data.tile_plane("mma", "fwd", causal=False, profile="h100", **OPENED)
    assert sheet["rates"] == "datasheet rates" and sheet["pick_ms"] < plane["pick_ms"]


def test_tile_plane_prices_with_a_measured_rates_file():
    doc = {"schema": "ioaware.rates/1", "provenance": {"gpu": H100_GPU},
           "rates": {"smem_read_bytes_per_s_per_sm": {"value": 64 * 1.755e9,
                                                      "unit": "bytes/s"}}}
    args = dict(causal=False, profile="h100", **FIRST)
    sheet = data.tile_plane("mma", "fwd", **args)
    plane = data.tile_plane("mma", "fwd", rates=json.dumps(doc).encode(), rates_name="r.json",
                            **args)
    assert plane["rates_error"] is None and plane["rates"] == "measured rates"
    assert plane["rate_sources"]["smem_bytes_per_s"] == "measured"
    assert plane["pick_ms"] > sheet["pick_ms"]       # half the datasheet's shared-memory rate
    doc["provenance"]["gpu"] = "NVIDIA H200"
    other = data.tile_plane("mma", "fwd", rates=json.dumps(doc).encode(), **args)
    assert "H200" in other["rates_error"] and other["rates"] == "datasheet rates"


def test_tile_sweeps_of_the_pick_command_are_read():
    pick = pytest.importorskip("benchmarks.pick")
    group = {"family": "mma", "pass": "fwd", "dtype": "bf16", "head_dim": 128, "causal": False,
             "seq_len": 2048, "batch": 8, "heads": 8}
    doc = {"schema": pick.SCHEMA, "provenance": {"gpu": "NVIDIA H200"}, "records": [
        dict(group, config={"block_q": 64, "block_k": 64}, time_ms=1.0),
        dict(group, config={"block_q": 128, "block_k": 64}, time_ms=0.8),
        dict(group, config={"block_q": 64, "block_k": 32}, time_ms=None, refused="too big")]}
    sweep = data.load_tile_sweep(json.dumps(doc).encode(), "pick.json")
    assert sweep["profile"] == "h200"
    got = data.measured_tiles(sweep, "mma/fwd", seq_len=2048, head_dim=128, batch=8, heads=8,
                              dtype="bf16", causal=False)
    assert len(got) == 3 and got["time_ms"].isna().sum() == 1
    assert got.set_index(["block_q", "block_k"]).loc[(64, 32), "why"] == "too big"
    with pytest.raises(ValueError, match="not a file of measured tile times"):
        data.load_tile_sweep(FIXTURE.read_bytes(), "fixture.json")


def test_every_listed_family_draws_or_says_why():
    for key in data.tile_families():
        family, _, pass_ = key.partition("/")
        for dtype in ("fp16", "fp32"):
            plane = data.tile_plane(family, pass_, seq_len=1024, head_dim=64, batch=2, heads=8,
                                    dtype=dtype, causal=True, profile="h100")
            if plane["refused"] is None:
                assert plane["cells"]["legal"].sum() == plane["n_legal"] > 0
                assert data_figure(plane).data
            else:
                assert "\n" not in plane["refused"]


def test_block_sizes_opens_on_a_measured_workload():
    at = ok(open_page("block_sizes"))
    assert at.selectbox(key="bs_sweep").value == data._choice_name(PICK)
    assert at.selectbox(key="bs_family").value == "mma/fwd"
    assert at.select_slider(key="w_seq_len").value == 8192
    assert at.number_input(key="w_batch").value == 2 and at.number_input(key="w_heads").value == 16
    assert at.selectbox(key="w_profile").value == "h100"
    assert "a workload measured in `results/pick_h100_2026-11-24.json`" in texts(at.caption)
    assert len(charts(at)) == 1
    fig = charts(at)[0].proto.spec
    assert "Measured on the NVIDIA H100 80GB HBM3" in fig and '"coloraxis"' in fig
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["The model's pick"] == "128 × 64" and metrics["The measured best"] == "128 × 64"
    assert metrics["Lost by following the model"] == "0.0 %"
    assert "Predicted (measured rates)" in metrics                 # the H100's measured rates
    assert "nothing is lost" in texts(at.markdown)
    assert ("predicted from measured rates (rates_h100_2026-11-24.json, 2026-11-24"
            in texts(at.caption))
    shown = table(at, "Tile (queries × keys)")
    assert len(shown) == 4 and list(shown["Measured (ms)"]) == ["2.00", "2.33", "2.51", "2.63"]
    # the causal twin from the file's list of measured workloads
    options = at.selectbox(key="bs_group").options
    at.selectbox(key="bs_group").set_value(
        str(options.index("N = 8,192, d = 64, batch 2, 16 heads, fp16, causal") - 1)).run()
    ok(at)
    assert at.checkbox(key="w_causal").value is True
    assert "13.8 % slower than the measured best 128 × 64: 0.994 ms" in texts(at.markdown)
    assert {m.label: m.value for m in at.metric}["Lost by following the model"] == "13.8 %"
    hits = sorted({m.group(0) for m in INTERNAL.finditer(screen_text(at))})
    assert not hits, f"internal words on screen: {hits}"
    # at the datasheet's rates when asked: another predicted time, the same measured times
    from dashboard import ui
    before = {m.label: m.value for m in at.metric}
    at.selectbox(key="bs_rates").set_value(ui.DATASHEET).run()
    metrics = {m.label: m.value for m in ok(at).metric}
    assert "Predicted (datasheet rates)" in metrics
    assert metrics["Predicted (datasheet rates)"] != before["Predicted (measured rates)"]
    assert "predicted from datasheet rates" in texts(at.caption)


def test_block_sizes_each_measured_kernel_opens_on_its_file():
    at = ok(open_page("block_sizes"))
    at.selectbox(key="bs_family").set_value("wgmma/fwd").run()
    ok(at)
    assert at.selectbox(key="bs_sweep").value == data._choice_name(PICK_WGMMA)
    assert ("Measured tile times from `results/pick_wgmma_h100_2026-11-24.json`"
            in texts(at.caption))
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["The model's pick"] == "64 × 128" and metrics["The measured best"] == "64 × 128"
    assert metrics["Lost by following the model"] == "0.0 %"
    at.selectbox(key="bs_family").set_value("tf32/fwd").run()
    ok(at)
    assert at.selectbox(key="bs_sweep").value == data._choice_name(PICK)
    assert at.selectbox(key="w_dtype").value == "fp32" and at.number_input(key="w_heads").value == 4
    assert "The measured best" in [m.label for m in at.metric]
    assert "Opened on N = 8,192, d = 64, batch 2, 4 heads, fp32" in texts(at.caption)
    hits = sorted({m.group(0) for m in INTERNAL.finditer(screen_text(at))})
    assert not hits, f"internal words on screen: {hits}"


def test_block_sizes_upload_describes_its_format_with_an_example():
    example = data.example_tile_sweep_json()
    sweep = data.load_tile_sweep(example.encode(), "example.json")
    assert sweep["profile"] == "h100" and len(data.tile_sweep_groups(sweep, "mma/fwd")) == 1
    at = ok(open_page("block_sizes"))
    at.selectbox(key="bs_sweep").set_value("Upload a file of tile times…").run()
    shown = screen_text(ok(at), expanders=True)
    assert '"ioaware.pick/1"' in shown and "Files up to 50 MB are read" in shown
    assert "Download an example file (JSON)" in shown


def test_block_sizes_other_gpu_or_illegal_workload():
    at = ok(open_page("block_sizes"))
    at.selectbox(key="w_profile").set_value("h200").run()
    ok(at)
    assert "measured on the NVIDIA H100 80GB HBM3" in texts(at.warning)
    assert "The measured best" not in [m.label for m in at.metric]      # not overlaid
    assert "(rates_h200_2026-11-24.json, 2026-11-24)" in texts(at.caption)   # the H200's rates
    at.checkbox(key="bs_anyway").check().run()
    assert "The measured best" in [m.label for m in ok(at).metric]
    at.selectbox(key="w_dtype").set_value("fp32").run()
    ok(at)
    assert len(at.warning) >= 1 and not charts(at)
    assert "does not run this workload: the mma forward runs dtype fp16 or bf16" in texts(at.warning)
    at.selectbox(key="bs_family").set_value("simt/fwd").run()        # a kernel no file timed
    ok(at)
    assert len(charts(at)) == 1 and "has no times of this kernel" in texts(at.info)
    hits = sorted({m.group(0) for m in INTERNAL.finditer(screen_text(at))})
    assert not hits, f"internal words on screen: {hits}"


# -- Scaling --------------------------------------------------------------------------------------
def test_scaling_ranges_and_the_n_slider(offer):
    offer([BENCH])
    at = ok(open_page("scaling"))
    assert len(charts(at)) == 5      # measured TFLOP/s and time; the schedules' bytes, time, memory
    shown = table(at, "Schedule")
    assert shown["N"].min() == 128 and shown["N"].max() == 65536
    assert "N = 4,096" in texts(at.markdown)
    # the sidebar's N is what the metrics and the measured table at N are about
    before = [m.value for m in at.metric]
    assert at.metric[1].label == MEASURED_RATES          # the rates measured on the H100
    at_n = table(at, "Implementation").set_index("Implementation")
    at.select_slider(key="w_seq_len").set_value(1024).run()
    ok(at)
    assert "N = 1,024" in texts(at.markdown)
    assert [m.value for m in at.metric] != before
    assert not table(at, "Implementation").set_index("Implementation").equals(at_n)
    at.select_slider(key="sc_range").set_value((128, 256)).run()
    ok(at)
    assert sorted(table(at, "Schedule")["N"].unique()) == ["128", "256"]   # drawn whole: as text
    assert "outside the range" in texts(at.info)
    at.select_slider(key="w_seq_len").set_value(65536).run()
    assert "N = 65,536 is not among them" in texts(ok(at).info)
    at.select_slider(key="sc_range").set_value((512, 512)).run()
    assert "at least two" in texts(ok(at).info)


def _bench_records(path=BENCH) -> list[dict]:
    doc = json.loads(path.read_text())
    return [dict(r, provenance=doc["provenance"]) for r in doc["records"]]


def test_tflops_are_counted_as_the_benchmark_file_counts_them():
    """The pages' TFLOP/s use the benchmarks' FLOP count (causal halves, the backward 2.5
    forwards): every record of the shipped benchmark file gives back its own ``tflops``."""
    recs = _bench_records()
    for r in recs:
        fl = data.attention_flops(r["batch"], r["heads"], r["seq_len_q"], r["seq_len_k"],
                                  r["head_dim"], r["causal"], r["pass"])
        assert fl / (r["time_ms"] * 1e-3) / 1e12 == pytest.approx(r["tflops"], rel=1e-12)
        assert data._bench_flops(r["batch"], r["heads"], r["seq_len_q"], r["seq_len_k"],
                                 r["head_dim"], r["causal"], r["pass"]) == fl
    assert data.attention_flops(1, 1, 8, 8, 4, True, "fwd+bwd") == 4 * 64 * 4 * 0.5 * 3.5


def test_scaling_measured_series_are_the_file_s_records_and_the_plans_prices():
    import sim
    from sim.plan import price
    from sim.plans import plans_for_record

    recs = _bench_records()
    res = data.scaling_measured("bench", 64, "fp16", False, "fwd", "h100", _records=recs)
    assert res["empty"] is None and res["profile"] == "h100" and not res["profile_guessed"]
    mine = [r for r in recs if (r["head_dim"], r["dtype"], r["causal"], r["pass"])
            == (64, "fp16", False, "fwd")]
    measured = res["measured"]
    assert len(measured) == len(mine)                  # one record per implementation and N
    assert set(measured["impl"]) == {"ioaware-numba/mma", "sdpa-flash", "sdpa-cudnn",
                                     "sdpa-efficient", "sdpa-math"}
    for r in mine:
        row = measured[(measured["impl"] == data.record_family(r))
                       & (measured["seq_len"] == r["seq_len_q"])].iloc[0]
        assert row["time_ms"] == r["time_ms"] and row["tflops"] == pytest.approx(r["tflops"])
        assert (row["batch"], row["heads"]) == (r["batch"], r["heads"])
    # by hand: SDPA FLASH at N = 4096 is 4 sequences of 32 heads, 1.862 ms, 295 TFLOP/s
    flash = measured[(measured["impl"] == "sdpa-flash") & (measured["seq_len"] == 4096)].iloc[0]
    assert (flash["batch"], flash["heads"]) == (4, 32)
    assert flash["time_ms"] == pytest.approx(1.86176, rel=1e-5)
    assert flash["tflops"] == pytest.approx(4 * 4 * 32 * 4096**2 * 64 / 1.86176e-3 / 1e12,
                                            rel=1e-5)
    # the dashed line at one point: the record's plans priced on the H100 at datasheet rates
    rec = next(r for r in mine if r["kernel"] == "ioaware-numba" and r["seq_len_q"] == 2048)
    want = sum(price(pl, sim.load_profile("h100")).time_ms for pl in plans_for_record(rec))
    pred = res["predicted"]
    got = pred[(pred["impl"] == "ioaware-numba/mma") & (pred["seq_len"] == 2048)].iloc[0]
    assert got["time_ms"] == pytest.approx(want, rel=1e-12)
    assert got["rates"] == "datasheet rates" and res["rates"] == "datasheet rates"
    assert got["tflops"] == pytest.approx(data.attention_flops(8, 32, 2048, 2048, 64, False, "fwd")
                                          / (want * 1e-3) / 1e12)
    # cuDNN's backward has no plan: no dashed line, said so
    both = data.scaling_measured("bench", 128, "fp16", True, "fwd+bwd", "h100", _records=recs)
    assert "sdpa-cudnn" in both["no_plan"]
    assert "sdpa-cudnn" not in set(both["predicted"]["impl"])
    assert "sdpa-cudnn" in set(both["measured"]["impl"])
    # a combination the file does not hold: one line saying what it holds
    none = data.scaling_measured("bench", 96, "fp16", False, "fwd", "h100", _records=recs)
    assert none["measured"].empty and none["predicted"].empty
    assert none["empty"] == ("has no records of d = 96, fp16, not causal, forward; it measures "
                             "d 64, 128 · fp16, fp32 · not causal, causal · forward, forward + "
                             "backward.")


def test_scaling_page_draws_measured_beside_predicted(offer, tmp_path):
    offer([SWEEP, BENCH])
    at = ok(open_page("scaling"))
    assert at.selectbox(key="sc_source").value == data._choice_name(BENCH)   # the benchmark file
    figs = charts(at)
    tflops = json.loads(figs[0].proto.spec)
    names = [t.get("name", "") for t in tflops["data"]]
    assert "dashed: predicted from measured rates" in names
    assert data.family_label("sdpa-flash") in names
    caption = texts(at.caption)
    assert "predicted from measured rates" in caption
    assert "Predicted times come from measured rates (rates_h100_2026-11-24.json, 2026-11-24" in (
        caption)
    from dashboard import ui
    at.selectbox(key="bs_rates").set_value(ui.DATASHEET).run()
    names = [t.get("name", "") for t in json.loads(charts(ok(at))[0].proto.spec)["data"]]
    assert "dashed: predicted from datasheet rates" in names
    assert "predicted from datasheet rates" in texts(at.caption)
    at.checkbox(key="w_causal").check()
    at.selectbox(key="w_pass").set_value("fwd+bwd").run()
    assert "No prediction for PyTorch SDPA: cuDNN" in texts(ok(at).caption)
    at.select_slider(key="w_head_dim").set_value(96).run()
    assert "has no records of d = 96" in texts(ok(at).info)
    assert len(charts(at)) == 3                    # the model's schedules are still drawn
    hits = sorted({m.group(0) for m in INTERNAL.finditer(screen_text(at, expanders=True))})
    assert not hits, hits


def test_scaling_and_explore_price_with_a_measured_rates_file():
    doc = {"schema": "ioaware.rates/1", "provenance": {"gpu": H100_GPU},
           "rates": {"dram_copy_bytes_per_s": {"value": 2.0e12, "unit": "bytes/s"}}}
    rates = json.dumps(doc).encode()
    sheet, _ = data.compare_schedules(4096, 64, 1, 16, "fp16", "fwd", False, 1.0, "h100")
    rated, ceilings = data.compare_schedules(4096, 64, 1, 16, "fp16", "fwd", False, 1.0, "h100",
                                             rates=rates)
    assert ceilings["rates"] == "measured rates" and ceilings["rates_error"] is None
    assert set(rated["rates"]) == {"measured rates"}
    naive = rated.set_index("schedule").loc["naive"]
    assert naive["time_ms"] > sheet.set_index("schedule").loc["naive", "time_ms"]   # DRAM-bound
    assert data.time_label(rated) == "Predicted from measured rates"
    assert ceilings["dram_bandwidth"] == 3.35e12      # the bound stays the datasheet's
    res = data.scaling_measured("bench", 64, "fp16", False, "fwd", "h100", rates=rates,
                                _records=_bench_records())
    assert res["rates"] == "measured rates"
    plain = data.scaling_measured("bench", 64, "fp16", False, "fwd", "h100",
                                  _records=_bench_records())
    assert (res["predicted"]["time_ms"].to_numpy() >= plain["predicted"]["time_ms"].to_numpy()).all()
    doc["provenance"]["gpu"] = "NVIDIA H200"
    other, ceilings = data.compare_schedules(4096, 64, 1, 16, "fp16", "fwd", False, 1.0, "h100",
                                             rates=json.dumps(doc).encode())
    assert "H200" in ceilings["rates_error"] and set(other["rates"]) == {"datasheet rates"}


# -- Predicted vs measured ------------------------------------------------------------------------
def test_measured_with_no_results(offer):
    at = ok(open_page("measured"))
    assert "No results files" in texts(at.info)
    assert len(charts(at)) == 0


def test_measured_with_fixture(offer):
    offer([FIXTURE])
    at = ok(open_page("measured"))
    assert "SYNTHETIC" in table(at, "Value").to_string()  # provenance
    # the error against N, the roofline of the records with DRAM counters, the scatter
    fixture = json.loads(FIXTURE.read_text())["records"]
    with_counters = any(r.get("dram_read_bytes") is not None for r in fixture)
    assert len(charts(at)) == 2 + with_counters
    n_records = len(json.loads(FIXTURE.read_text())["records"])
    assert len(table(at, "Measured time (ms)")) == n_records
    summary = table(at, "Records of").set_index("Metric")
    assert int(summary.loc["Global-memory bytes", "Records"].replace(",", "")) > 0
    assert len(at.radio(key="pm_metric").options) == len(data.compared_metrics())
    for metric in data.compared_metrics():  # one scatter per metric, chosen by the radio
        at.radio(key="pm_metric").set_value(metric).run()
        assert len(charts(ok(at))) == 2 + with_counters
    at.multiselect(key="pm_family").set_value(["eager"]).run()
    assert set(table(ok(at), "Measured time (ms)")["Kernel"]) == {data.family_label("eager")}
    at.multiselect(key="pm_family").set_value([]).run()
    assert "No records match" in texts(ok(at).info)


def _joined(path) -> pd.DataFrame:
    return data.compare_measured(path.name, "h100", _records=_bench_records(path))["records"]


def test_error_against_n_has_one_row_per_record_with_its_n_and_kernel():
    view = _joined(BENCH)
    err = data.error_against_n(view)
    assert len(err) == len(view) == len(json.loads(BENCH.read_text())["records"])
    assert list(err["seq_len"]) == list(view["seq_len_q"])
    assert list(err["family"]) == list(view["family"])
    assert list(err["rel_error_time"]) == pytest.approx(list(view["rel_error_time"]),
                                                        nan_ok=True)
    assert set(err["family"]) >= {"ioaware-numba/mma", "ioaware-numba/tf32", "sdpa-flash"}
    # the plan's time where a plan prices the record, and the page says which
    flash = err[err["family"] == "sdpa-flash"]
    assert set(flash["priced_by"]) == {"plan, datasheet rates"}
    cudnn = err[(err["family"] == "sdpa-cudnn")]
    assert set(cudnn["priced_by"]) == {"plan, datasheet rates", "roofline at peak rates (a bound)"}
    fig = figures.error_against_n(err, data.FAMILY_LABELS)
    assert {t.name for t in fig.data if t.showlegend is not False} >= {"PyTorch SDPA: FLASH"}


def test_measured_records_are_priced_with_a_rates_file_and_say_so():
    doc = {"schema": "ioaware.rates/1", "provenance": {"gpu": H100_GPU},
           "rates": {"dram_copy_bytes_per_s": {"value": 2.0e12, "unit": "bytes/s"}}}
    path = data.rates_file_path(json.dumps(doc).encode())
    assert path == data.rates_file_path(json.dumps(doc).encode())      # one file per content
    rated = data.compare_measured("bench", "h100", _records=_bench_records(),
                                  rates_path=path)["records"]
    planned, at_measured = data.plan_priced(rated)
    assert planned == at_measured > 0
    assert "plan, measured rates" in set(data.error_against_n(rated)["priced_by"])
    sheet = _joined(BENCH)
    assert data.plan_priced(sheet)[1] == 0
    assert (rated["predicted_time"] >= sheet["predicted_time"] - 1e-12).all()


def test_error_per_kernel_is_the_median_and_worst_of_its_records():
    view = _joined(BENCH)
    fam, cols = data.family_summary(view)
    assert len(fam) == view["family"].nunique()
    row = fam.set_index("family").loc[data.family_label("sdpa-flash")]
    errs = view[view["family"] == "sdpa-flash"]["rel_error_time"].abs()
    assert row["records"] == len(errs)
    assert row["time_raw_median"] == pytest.approx(errs.median())
    assert row["time_raw_worst"] == pytest.approx(errs.max())
    assert row["priced_by"] == "plan, datasheet rates"
    assert cols["time_raw_median"].label == "Predicted time: median"
    assert "global_bytes_median" not in fam      # the benchmark file carries no byte counters


def test_roofline_points_are_achieved_as_nsight_compute_draws_them():
    view = _joined(SWEEP)
    pts = data.roofline_points(view)
    assert len(pts) == int(view["measured_dram_bytes"].notna().sum())
    i, rec = next((i, r) for i, r in enumerate(_bench_records(SWEEP))
                  if r.get("variant") == "mma")
    got = pts.set_index("record").loc[i]
    assert got["family"] == "ioaware-numba/mma" and got["seq_len"] == rec["seq_len_q"]
    flops, dram = rec["flops_executed"], rec["dram_read_bytes"] + rec["dram_write_bytes"]
    assert got["measured_intensity"] == pytest.approx(flops / dram)
    assert got["measured_tflops"] == pytest.approx(flops / (rec["time_ms"] * 1e-3) / 1e12)
    row = view.iloc[i]
    assert got["predicted_tflops"] == pytest.approx(
        row["predicted_flops"] / (row["predicted_time_raw"] * 1e-3) / 1e12)
    assert got["predicted_intensity"] == pytest.approx(row["predicted_flops"]
                                                       / row["predicted_dram_bytes"])
    fig = figures.measured_roofline(pts, data.roofline_ceilings("h100"), data.FAMILY_LABELS)
    names = [t.name for t in fig.data]
    assert "peak-rate bound (datasheet): matmul 989 TFLOP/s, DRAM 3.35 TB/s" in names
    assert data.roofline_points(_joined(BENCH)).empty          # no counters: no achieved point


def test_measured_page_labels_its_times_and_draws_error_and_roofline(offer):
    offer([SWEEP])
    at = ok(open_page("measured"))
    assert len(charts(at)) == 3
    records = table(at, "Predicted time (ms)")
    assert "Time from" in records.columns and ROOFLINE_MS not in records.columns
    assert set(records["Time from"]) <= {"plan, measured rates",
                                         "roofline at peak rates (a bound)"}
    assert "Predicted time" in set(table(at, "Records of")["Metric"])
    per_kernel = table(at, "Predicted time: median (%)")
    assert len(per_kernel) == len(set(records["Kernel"]))
    shown = screen_text(at)
    assert "from measured rates (rates_h100_2026-11-24.json, 2026-11-24)" in shown
    from dashboard import ui
    at.selectbox(key="bs_rates").set_value(ui.DATASHEET).run()
    records = table(ok(at), "Predicted time (ms)")
    assert set(records["Time from"]) <= {"plan, datasheet rates",
                                         "roofline at peak rates (a bound)"}
    shown = screen_text(at)
    assert "datasheet rates, peaks real kernels do not reach" in shown
    assert "Roofline: achieved and predicted" in texts(at.subheader)
    hits = sorted({m.group(0) for m in INTERNAL.finditer(shown)})
    assert not hits, hits


def _write(tmp_path, name, content) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_measured_lists_every_problem_records_first(offer, tmp_path):
    doc = json.loads(FIXTURE.read_text())
    del doc["provenance"]["gpu"]                     # a provenance problem ...
    for i in range(len(doc["records"])):             # ... and more record problems than shown
        doc["records"][i]["dtype"] = "fp64"
        doc["records"][i]["pass"] = "sideways"
    del doc["records"][4]["seq_len_q"]
    doc["records"][6]["time_ms"] = -1.0
    n_problems = 2 * len(doc["records"]) + 3
    assert n_problems > data.MAX_PROBLEMS
    offer([_write(tmp_path, "bad.json", doc)])
    at = open_page("measured")
    assert not at.exception
    shown = texts(at.error)
    assert f"({n_problems} problems)" in shown
    assert "record 5 (records[4])**: missing `seq_len_q`" in shown
    assert "record 7 (records[6])**: `time_ms` must be > 0" in shown
    assert shown.count("\n- ") == data.MAX_PROBLEMS
    assert f"and {n_problems - data.MAX_PROBLEMS} more" in shown
    assert "provenance.gpu" not in shown             # listed after every record problem
    problems = data.results_problems(doc)
    assert [p.provenance for p in problems] == [False] * (n_problems - 1) + [True]
    assert len(charts(at)) == 0


def test_measured_malformed_empty_and_provenance_only(offer, tmp_path):
    good = json.loads(FIXTURE.read_text())
    prov_only = json.loads(FIXTURE.read_text())
    del prov_only["provenance"]["driver"]
    files = {"not_json.json": "{this is not json",
             "wrong_schema.json": {"schema": "something/else", "records": []},
             "empty.json": {**good, "records": []},
             "provenance_only.json": prov_only}
    offer([_write(tmp_path, n, c) for n, c in files.items()])
    at = open_page("measured")
    for name in files:
        at.selectbox(key="pm_source").set_value(str(tmp_path / name)).run()
        assert not at.exception, (name, at.exception)
        if name == "empty.json":
            assert not at.error and "holds no records" in texts(at.info)
        elif name == "provenance_only.json":
            assert not at.error and "provenance.driver" in texts(at.warning)
            # the records are compared anyway: the scatter, error against N and roofline
            assert any(c.key.startswith("chart-predicted-vs-measured") for c in charts(at))
        else:
            assert "not a valid results file" in texts(at.error), name
            assert len(charts(at)) == 0


def test_example_results_file_is_valid_and_loads(offer, tmp_path):
    from sim.results import RECORD_FIELDS, validate_results

    assert set(data.RECORD_FIELD_HELP) == set(RECORD_FIELDS)  # the description is complete
    example = json.loads(data.example_results_json())
    validate_results(example)
    assert "not a measurement" in example["provenance"]["gpu"]
    path = _write(tmp_path, "example.json", example)
    offer([path])
    at = ok(open_page("measured"))
    assert len(table(at, "Measured time (ms)")) == len(example["records"])
    assert any(b.label.startswith("Download an example") for b in at.get("download_button"))


def test_uploads_are_capped():
    cfg = tomllib.loads((ROOT / "dashboard" / ".streamlit" / "config.toml").read_text())
    assert cfg["server"]["maxUploadSize"] == data.MAX_UPLOAD_MB
    with pytest.raises(data.ResultsInvalid, match="up to 50 MB"):
        data.load_results_bytes(b" " * (data.MAX_UPLOAD_MB * 10**6 + 1), "big.json")


def test_trace_replay_is_announced_then_runs_in_the_background(offer):
    offer([FIXTURE])
    at = ok(open_page("measured"))
    at.selectbox(key="pm_l2").set_value("auto").run()
    note = texts(ok(at).info)
    assert "Estimated time on this machine" in note
    assert set(table(at, "Measured time (ms)")["DRAM predicted by"]) == {"analytic estimate"}
    at.button(key="pm_replay_start").click().run()
    deadline = time.monotonic() + 90
    while not at.success and time.monotonic() < deadline:
        time.sleep(0.5)
        at.run()
    assert "Trace replay finished" in texts(ok(at).success)
    assert "trace replay" in set(table(at, "Measured time (ms)")["DRAM predicted by"])


# -- Step through ---------------------------------------------------------------------------------
def step_of(at) -> int:
    return int(at.slider(key="st_step").value)


def test_step_defaults_play_and_rescale():
    at = ok(open_page("step"))
    n = int(at.slider(key="st_step").max)
    assert 12 <= n <= 60 and at.slider(key="st_step").min == 1  # a few dozen steps, from 1
    assert step_of(at) == 1
    at.button(key="st_play").click().run()          # play: every run of the walk is a tick
    ok(at)
    first = step_of(at)
    at.run()
    at.run()
    assert step_of(at) > first > 1
    at.button(key="st_play").click().run()          # pause
    paused = step_of(at)
    at.run()
    assert step_of(at) == paused
    at.button(key="st_last").click().run()
    ok(at)
    tiles = table(at, "α = exp(m before − m after)")
    alphas = pd.to_numeric(tiles["α = exp(m before − m after)"], errors="coerce").dropna()
    assert (alphas < 1).sum() >= 2                  # the default row's max rises at several tiles
    assert list(tiles["K/V tile"]) == [str(n) for n in range(1, len(tiles) + 1)]
    assert "Accumulator after, dim 1" in tiles.columns
    assert "equals the materialised softmax(S)·V" in texts(at.success)


def test_step_row_panel_follows_the_slider():
    """At a step where the followed row's max rises, the panel shows that tile's α, l and
    output accumulator with the update in numbers, and the row's table ends at the slider's
    step (both counted from 1)."""
    at = ok(open_page("step"))
    row = int(at.number_input(key="st_row").value) - 1
    w = data.step_walk("flash2", 64, 16, 16, 16, False, "forward")
    rf = walk.row_forward(w, walk.inputs(64, 16, "drift"), row)
    tiles = rf["tiles"]
    i = int(np.flatnonzero(tiles["alpha"] < 1)[0])          # the first tile that rescales
    t = tiles.iloc[i]
    at.slider(key="st_step").set_value(int(t["step"])).run()
    ok(at)
    assert f"Step {int(t['step'])} of {w.n_steps}" in texts(at.markdown)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Rescale α, last tile"] == fmt.num(t["alpha"], 3)
    assert float(metrics["Rescale α, last tile"]) < 1
    assert metrics["Running max m"] == fmt.num(t["m"], 4)
    assert metrics["Running sum l"] == fmt.num(t["l"], 4)
    assert metrics["Accumulator, dim 1"] == fmt.num(rf["acc"][i, 0], 4)
    assert (f"{fmt.num(t['alpha'], 3)} × {fmt.num(t['l_old'], 4)} + {fmt.num(t['tile_sum'], 4)}"
            f" = **{fmt.num(t['l'], 4)}**") in texts(at.markdown)
    shown = table(at, "α = exp(m before − m after)")
    assert list(shown["Step"]) == [str(s) for s in tiles["step"].iloc[:i + 1]]
    assert shown["Step"].iloc[-1] == str(step_of(at))
    events = table(at, "Action")
    assert all(b.endswith(" B") or b.endswith("kB") for b in events["Bytes"])


def test_step_counts_rereads_and_speaks_plainly():
    at = ok(open_page("step"))
    at.button(key="st_last").click().run()
    per_tensor = table(ok(at), READS).set_index("Tensor")
    n_q_tiles = 64 // 16
    assert float(per_tensor.loc["K", READS]) == n_q_tiles     # once per Q tile
    assert float(per_tensor.loc["V", READS]) == n_q_tiles
    assert float(per_tensor.loc["Q", READS]) == 1.0
    assert float(per_tensor.loc["O", "Times written (×)"]) == 1.0
    assert "logsumexp L" in per_tensor.index
    events = table(at, "Action")
    assert set(events["Rows"]) == {"49–64"}          # the last Q tile's rows, counted from 1


def test_step_backward_recomputes_from_the_logsumexp():
    at = open_page("step")
    at.radio(key="st_direction").set_value("backward").run()
    ok(at)
    at.button(key="st_last").click().run()
    ok(at)
    assert any("P recomputed" in str(s.value) for s in at.subheader)
    metrics = {m.label: m.value for m in at.metric}
    p_err = metrics["max |P recomputed − P forward|"]
    assert p_err == "0 (identical)" or float(p_err) < 1e-12
    per_tensor = table(at, READS).set_index("Tensor")
    assert float(per_tensor.loc["K", READS]) == 1.0           # K/V once
    assert float(per_tensor.loc["Q", READS]) == 64 // 16      # Q once per K/V tile


@pytest.mark.parametrize("schedule", ["flash1", "naive"])
def test_step_other_schedules_and_edges(schedule):
    at = open_page("step")
    at.selectbox(key="st_schedule").set_value(schedule)
    at.selectbox(key="st_seq_len").set_value(32)
    at.selectbox(key="st_block_q").set_value(64)
    at.checkbox(key="st_causal").check().run()
    ok(at)
    at.number_input(key="st_row").set_value(1).run()
    at.button(key="st_last").click().run()
    assert len(charts(ok(at))) >= 3


@pytest.mark.parametrize("schedule,direction", [("flash2", "backward"), ("flash1", "forward"),
                                                ("flash1", "backward"), ("naive", "backward")])
def test_step_speaks_plainly_at_every_step_kind(schedule, direction):
    """Every kind of step (a program's start, a tile, its end; each phase of the backward),
    expanders opened: no internal names, no -1 sentinels."""
    at = open_page("step")
    at.selectbox(key="st_schedule").set_value(schedule)
    at.radio(key="st_direction").set_value(direction).run()
    w = data.step_walk(schedule, 64, 16, 16, 16, False, direction)
    firsts = w.steps.groupby(["phase", "kind"])["step"].min()
    for step in sorted({1, w.n_steps, *map(int, firsts)}):
        at.slider(key="st_step").set_value(step).run()
        hits = sorted({m.group(0) for m in INTERNAL.finditer(screen_text(ok(at), True))})
        assert not hits, f"step {step}: internal words on screen: {hits}"
        assert_tables_drawn_whole_are_text(at)


# -- the step-through's arithmetic --------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_walk_row_matches_exact_attention(causal):
    w = data.step_walk("flash2", 48, 8, 16, 16, causal, "forward")
    x = walk.inputs(48, 8, "random", seed=3)
    for row in (0, 20, 47):
        rf = walk.row_forward(w, x, row)
        tiles = rf["tiles"]
        assert (np.diff(tiles["m"]) >= 0).all()                # the running max never falls
        assert tiles["err"].iloc[-1] < 1e-12
        err = data.tiled_row_error(x, row, 16, 16, causal, rf["exact"]["o"])
        assert err is None or err < 1e-5                       # the library's float32 path
    wb = data.step_walk("flash2", 48, 8, 16, 16, causal, "backward")
    rb = walk.row_backward(wb, x, 20)
    assert rb["tiles"]["dq_err"].iloc[-1] < 1e-12
    assert rb["tiles"]["p_err"].max() < 1e-12


def test_walk_online_softmax_updates_add_up():
    """Each tile: l = α·l_old + Σexp(s − m), accumulator = α·accumulator_old + Σexp(s − m)·v,
    output = accumulator / l."""
    w = data.step_walk("flash2", 64, 16, 16, 16, False, "forward")
    rf = walk.row_forward(w, walk.inputs(64, 16, "drift"), 4)
    tiles, acc, pv = rf["tiles"], rf["acc"], rf["pv"]
    alpha = tiles["alpha"].fillna(0.0).to_numpy()          # nothing to rescale before tile 1
    assert np.allclose(tiles["l"], alpha * tiles["l_old"] + tiles["tile_sum"], rtol=1e-13)
    before = np.vstack([np.zeros(acc.shape[1]), acc[:-1]])
    assert np.allclose(acc, alpha[:, None] * before + pv, rtol=1e-13)
    assert np.allclose(rf["o"], acc / tiles["l"].to_numpy()[:, None], rtol=1e-13)
    assert np.allclose(tiles["acc1"], acc[:, 0]) and np.allclose(tiles["acc1_old"], before[:, 0])


def test_walk_default_inputs_rescale_every_row():
    w = data.step_walk("flash2", 64, 16, 16, 16, False, "forward")
    x = walk.inputs(64, 16, "drift")
    for row in range(64):
        alphas = walk.row_forward(w, x, row)["tiles"]["alpha"].dropna()
        assert (alphas < 1).sum() >= 2, row


def test_walk_steps_are_one_based_and_complete():
    w = data.step_walk("flash2", 64, 16, 16, 32, True, "forward")
    assert list(w.steps["step"]) == list(range(1, w.n_steps + 1))
    tiles = w.steps.dropna(subset=["q_tile", "k_tile"])
    assert tiles["q_tile"].min() == 1 and tiles["k_tile"].min() == 1
    # causal: the tiles computed are exactly those with a key at or before a row of the Q tile
    expected = {(m, n) for m in range(4) for n in range(2) if n * 32 <= m * 16 + 15}
    assert w.visited == expected


# -- Measure --------------------------------------------------------------------------------------
def test_measure_without_gpu(monkeypatch):
    monkeypatch.setattr(data, "cuda_device", lambda: None)
    at = ok(open_page("measure"))
    assert "No CUDA GPU was found" in texts(at.warning)
    code = texts(at.code)
    assert "python -m benchmarks measure" in code and "python -m benchmarks ncu" in code
    assert any(b.label.startswith("Download an example") for b in at.get("download_button"))


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
    assert "takes minutes" in texts(at.caption)           # announced before it is started
    assert [p.proto.text for p in at.get("progress")] == [
        data.sweep_progress(len(calls[0]), len(calls[0]), 0.0)]
    assert "saved.json" in texts(at.success)
    assert json.loads((tmp_path / "saved.json").read_text())["schema"] == "ioaware.results/1"


def test_sweep_progress_says_how_long_is_left():
    assert fmt.duration(42.4) == "42 s" and fmt.duration(200) == "3 min 20 s"
    assert fmt.duration(3900) == "1 h 05 min" and fmt.duration(None) == "—"
    assert data.sweep_progress(6, 24, 120.0) == \
        "6 / 24 configurations, 2 min 00 s so far, about 6 min 00 s left"
    assert "estimated after the first" in data.sweep_progress(0, 24, 3.0)
    assert data.sweep_progress(24, 24, 480.0) == "24 configurations measured in 8 min 00 s"


def test_measure_configs_are_accepted_by_the_harness():
    measure = pytest.importorskip("benchmarks.measure")
    configs = data.measure_configs((1024,), (64, 128), ("fp16",), 1, 16, (False, True), ("fwd", "bwd"))
    assert len(configs) == 8
    for cfg in configs:
        for kernel in measure.KERNELS:
            measure.normalize_config(dict(cfg, kernel=kernel))  # raises on a field it rejects


def test_summary_display_and_filters():
    summary = pd.DataFrame([{"metric": "flops", "what": "x", "records": "ioaware-numba (all variants)",
                             "n": 2, "median_abs_err_pct": 1.5, "max_abs_err_pct": 3.0,
                             "mean_signed_err_pct": -0.5, "target_pct": 2.0,
                             "within_target_pct": 50.0, "required_pct": 100.0, "met": False}])
    shown, _ = data.display_summary(summary)
    row = shown.iloc[0]
    assert row["max_abs_err_pct"] == pytest.approx(0.03) and row["met"] == "no"
    assert row["records"] == "ioaware kernels (all)"
    df = pd.DataFrame({"kernel": ["a", "b"], "dtype": ["fp16", "fp16"]})
    assert list(data.filter_records(df, {"kernel": ["b"]})["kernel"]) == ["b"]
    assert data.filter_records(df, {"kernel": []}).empty


def test_explore_sliding_window_shows_the_band_s_bytes():
    """A sliding window in the sidebar reaches the model: FlashAttention-2 reads what
    sim.predict says for the band (w, 0) with causal, fewer bytes than full causal."""
    import sim
    at = open_page("explore")
    at.checkbox(key="w_causal").check().run()
    at.number_input(key="w_window").set_value(512).run()
    ok(at)
    shown = table(at, "Schedule").set_index("Schedule")
    w = sim.Workload(batch=1, heads=16, seq_len_q=4096, head_dim=64, dtype="fp16", causal=True,
                     window_size=(512, 0))
    band = sim.predict(w, sim.Schedule("flash2"), "h100", l2="analytic")
    full = sim.predict(dataclasses.replace(w, window_size=None), sim.Schedule("flash2"), "h100",
                       l2="analytic")
    assert shown.loc["FlashAttention-2", "Global read"] == fmt.bytes_(band.hbm_read_bytes)
    assert band.hbm_read_bytes < full.hbm_read_bytes
    assert data.window_size(512, True) == (512, 0) and data.window_size(512, False) == (512, 512)
    assert data.window_size(0, True) is None


# -- Decoding -------------------------------------------------------------------------------------
#: The shipped decode measurement (``python -m benchmarks decode --splits --window --ncu``) the
#: Decoding page opens on, and one without split sweeps or counters (``--graph``).
DECODE = ROOT / "results" / "decode_h200_2026-11-28.json"
#: The Decoding page's default workload.
DECODE_W = dict(batch=8, heads_q=32, heads_kv=8, seq_len_q=1, seq_len_k=32768, head_dim=128,
                dtype="bf16")


def metric(at, label: str):
    """The metric labelled ``label``."""
    found = [m for m in at.metric if m.label == label]
    assert found, f"no metric {label!r}: {[m.label for m in at.metric]}"
    return found[0]


def _sim_decode(w: dict, prof, splits=None, tensor_cores=None, mma_warps=None) -> tuple:
    """``(plan, costs)`` of sim.decode for the page's workload ``w`` on ``prof`` (the kernel by
    the plan's rule, or ``tensor_cores`` and ``mma_warps``: a measured record's)."""
    from sim.decode import split_kv_costs, split_kv_plan
    from sim.workload import DTYPE_BYTES
    plan = split_kv_plan(w["batch"], w["heads_q"], w["heads_kv"], w["seq_len_q"], w["seq_len_k"],
                         w["head_dim"], DTYPE_BYTES[w["dtype"]], prof.num_sms, splits=splits,
                         tensor_cores=tensor_cores, smem_bytes_per_sm=prof.smem_bytes_per_sm,
                         mma_warps=mma_warps, gpu=prof)
    return plan, split_kv_costs(plan, prof)


def _values(v) -> list:
    """A figure's array as a list (Plotly writes numeric arrays as ``{"dtype", "bdata"}``)."""
    if isinstance(v, dict) and "bdata" in v:
        import base64
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def open_decode() -> AppTest:
    at = ok(open_page("decode"))
    assert at.title[0].value == "Decoding"
    return at


def test_decode_page_is_registered_at_slash_decode():
    import ast

    tree = ast.parse(APP.read_text())
    pages = next(ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PAGES")
    assert ("decode.py", "Decoding", "decode") in pages
    urls = [u for _f, _t, u in pages]
    assert urls.index("decode") == urls.index("measured") + 1      # after Predicted vs measured
    assert (APP.parent / "views" / "decode.py").is_file()


def test_decode_defaults_show_sim_decode_s_pick_bytes_and_time():
    at = open_decode()
    prof = _measured_h100()                  # the default: the H100 at its measured rates
    plan, costs = _sim_decode(DECODE_W, prof)
    assert metric(at, "Splits the model picks").value == f"{plan.splits:,}"
    assert metric(at, "Predicted DRAM bytes").value == fmt.bytes_(
        costs["dram_read_bytes"] + costs["dram_write_bytes"])
    assert metric(at, "Predicted (measured rates)").value == fmt.ms(costs["time_s"] * 1e3)
    from sim.plan import rates_of
    rate = rates_of(prof)[0]["dram_read_bytes_per_s"]
    assert metric(at, "K/V bandwidth it implies").value == fmt.pct(
        costs["kv_bytes"] / costs["time_s"] / rate)
    one = _sim_decode(DECODE_W, prof, splits=1)[1]
    assert metric(at, "1 split (a FlashAttention-2-like grid)").value == fmt.ms(one["time_s"] * 1e3)
    assert metric(at, f"The model's pick: {plan.splits} splits").delta == (
        f"{fmt.ratio(one['time_s'] / costs['time_s'])} faster than 1 split")
    assert len(charts(at)) == 2                    # the model's curve, the measured sweep
    assert not INTERNAL.search(screen_text(at))
    assert_tables_drawn_whole_are_text(at)


@pytest.mark.parametrize("changes", [dict(batch=1, seq_len_k=131072), dict(batch=64),
                                     dict(seq_len_q=4, heads_kv=32, dtype="fp32", seq_len_k=5000)],
                         ids=["B1-128k", "B64", "mha-4rows-fp32"])
def test_decode_pick_follows_the_inputs_as_sim_decode_does(changes):
    at = open_decode()
    for field, value in changes.items():
        widget = (at.selectbox(key=f"dc_{field}") if field in ("dtype", "head_dim") else
                  at.number_input(key=f"dc_{field}"))
        widget.set_value(value)
    ok(at.run())
    w = {**DECODE_W, **changes}
    plan, costs = _sim_decode(w, _measured_h100())
    assert metric(at, "Splits the model picks").value == f"{plan.splits:,}"
    assert metric(at, "Predicted (measured rates)").value == fmt.ms(costs["time_s"] * 1e3)


def test_decode_datasheet_profile_and_custom_gpu():
    import sim

    from dashboard import ui
    at = open_decode()
    at.selectbox(key="w_profile").set_value("t4").run()          # no rates file: the datasheet
    plan, costs = _sim_decode(DECODE_W, sim.PROFILES["t4"])
    assert metric(ok(at), "Splits the model picks").value == f"{plan.splits:,}"
    assert metric(at, "Predicted (datasheet rates)").value == fmt.ms(costs["time_s"] * 1e3)
    assert "measured on the NVIDIA H200" in texts(at.warning)     # the file is another GPU's
    at.button(key="dc_use_profile").click().run()
    assert ok(at).selectbox(key="w_profile").value == "h200"
    at.selectbox(key="w_profile").set_value(data.CUSTOM).run()
    ok(at)
    assert metric(at, "Predicted (datasheet rates)").value != "—"
    assert at.selectbox(key="bs_rates").value == ui.MEASURED_HERE


def test_decode_split_override_changes_the_shown_prediction():
    at = open_decode()
    prof = _measured_h100()
    plan, costs = _sim_decode(DECODE_W, prof)
    before = metric(at, "Predicted (measured rates)").value
    at.number_input(key="dc_splits").set_value(1).run()
    ok(at)
    given = _sim_decode(DECODE_W, prof, splits=1)[1]
    shown = metric(at, "Predicted (measured rates)")
    assert shown.value == fmt.ms(given["time_s"] * 1e3) != before
    assert shown.delta == "1 split (given)"
    pick = metric(at, "Splits the model picks")
    assert pick.value == f"{plan.splits:,}" and pick.delta == "1 given"   # the pick stays shown
    assert metric(at, "Given: 1 splits").value == fmt.ms(given["time_s"] * 1e3)
    at.number_input(key="dc_splits").set_value(0).run()          # back to the model's choice
    assert metric(ok(at), "Predicted (measured rates)").value == before


def test_decode_refused_workload_says_why_and_keeps_the_measured_part():
    at = open_decode()
    at.number_input(key="dc_heads_kv").set_value(5).run()
    ok(at)
    assert "query heads must be a multiple of KV heads" in texts(at.warning)
    assert len(table(at, "Measured, GPU time alone (ms)")) == len(
        json.loads(DECODE.read_text())["decode"])


def test_decode_measured_table_has_one_row_per_decode_record():
    doc = json.loads(DECODE.read_text())
    at = open_decode()
    assert at.selectbox(key="dc_source").value == data._choice_name(DECODE)   # the default
    shown = table(at, "Measured, GPU time alone (ms)")
    assert len(shown) == len(doc["decode"]) == 18
    # the predicted column is decode --report's, re-priced at the page's rates
    from benchmarks.decode import decode_report
    rows, summary = decode_report(doc, _measured_h100())
    assert list(shown["Predicted from measured rates (ms)"]) == [
        fmt.num(r["model_ms"], 3) for r in rows]
    assert list(shown["Splits the model picks"]) == [r["splits"] for r in rows]
    scores = table(at, "Within the target")
    assert list(scores["Within the target"]) == [f"{s['within']} of {s['n']}"
                                                for s in summary.values()]


def test_decode_measured_cases_are_the_file_s_and_the_plan_s():
    from benchmarks.decode import record_mma_warps, record_tensor_cores
    doc = json.loads(DECODE.read_text())
    loaded = data.load_decode(DECODE.read_bytes(), DECODE.name)
    assert loaded["n_decode"] == len(doc["decode"]) and loaded["n_window"] == len(doc["window"])
    assert loaded["profile"] == "h200" and loaded["kinds"]["splits"] == len(doc["decode"])
    res = data.decode_measured(loaded["digest"], "h200", None, RATES_H200.read_bytes(),
                               _loaded=loaded)
    cases = res["cases"]
    from sim.profiles import load_profile
    prof = load_profile("h200", rates=json.loads(RATES_H200.read_text()))
    peak = doc["provenance"]["peak_copy_bytes_per_s"]
    for (_, case), rec in zip(cases.iterrows(), doc["decode"]):
        w = {k: rec[k] for k in DECODE_W}
        ran = record_tensor_cores(rec)                  # priced as the kernel that ran
        warps = record_mma_warps(rec)                   # with its warps
        plan, costs = _sim_decode(w, prof, tensor_cores=ran, mma_warps=warps)
        assert case["splits"] == plan.splits
        assert case["model_ms"] == pytest.approx(costs["time_s"] * 1e3)
        assert case["gpu_ms"] == rec["ioaware_device_ms"]
        assert case["time_rel_error"] == pytest.approx(
            costs["time_s"] / (rec["ioaware_device_ms"] * 1e-3) - 1)
        assert case["bw_fraction"] == rec["times_ms"]["ioaware"]["kv_bandwidth_fraction"]
        assert case["gpu_bw_fraction"] == pytest.approx(
            rec["kv_bytes"] / (rec["ioaware_device_ms"] * 1e-3) / peak)
        assert case["sdpa_ratio"] == rec["ratio_vs_fastest_sdpa"]
        sdpa = {n: e["ms"] for n, e in rec["times_ms"].items() if n != "ioaware" and "ms" in e}
        assert case["fastest_sdpa"] == data.family_label(min(sdpa, key=sdpa.get))
        assert case["splits_best"] == rec["splits_best"]
        sweep = res["sweeps"][_]
        timed = {int(k): v for k, v in rec["splits_ms"].items() if v}
        assert dict(zip(sweep["measured"]["splits"], sweep["measured"]["measured_ms"])) == timed
        pred = sweep["predicted"].set_index("splits")["time_ms"]
        assert list(pred.index) == list(range(1, max(max(timed), plan.splits) + 1))
        for s in (1, max(timed)):
            assert pred.loc[s] == pytest.approx(
                _sim_decode(w, prof, splits=s, tensor_cores=ran, mma_warps=warps)[1]["time_s"] * 1e3)


def test_decode_sweep_chart_follows_the_chosen_case(tmp_path, monkeypatch):
    doc = json.loads(DECODE.read_text())
    at = open_decode()
    # opens on the case of the workload above (batch 8, Nk 32k, bf16)
    i = next(j for j, r in enumerate(doc["decode"])
             if all(r[k] == v for k, v in DECODE_W.items()))
    assert at.selectbox(key="dc_case").value == str(i)
    assert metric(at, "The measured best").value == f"{doc['decode'][i]['splits_best']} splits"
    # a pick the sweep did not time (as a sweep of other split counts leaves it): the shipped run
    # with the pick's time of one case taken out of its sweep, timed apart as the benchmark does
    j, first = 0, doc["decode"][0]
    picked = first["splits_ms"].pop(str(first["model"]["splits"]))
    best = min(first["splits_ms"], key=first["splits_ms"].get)
    first["splits_best"] = int(best)
    first["splits_model_loss"] = picked / first["splits_ms"][best] - 1
    cut = tmp_path / "decode_cut.json"
    cut.write_text(json.dumps(doc))
    monkeypatch.setenv("IOAWARE_RESULTS", str(cut))
    at = open_decode()
    at.selectbox(key="dc_source").set_value(str(cut)).run()
    at.selectbox(key="dc_case").set_value(str(j)).run()
    ok(at)
    assert metric(at, "The measured best").value == f"{first['splits_best']} splits"
    assert metric(at, "The model's pick").delta == "not in the sweep"
    assert metric(at, "Lost by following the model").value == fmt.signed_pct(
        first["splits_model_loss"])
    measured = json.loads(charts(at)[1].proto.spec)["data"][0]
    assert _values(measured["x"]) == [int(s) for s in first["splits_ms"]]
    assert _values(measured["y"]) == pytest.approx(list(first["splits_ms"].values()))
    at.button(key="dc_show_case").click().run()                # the case into the model
    ok(at)
    assert at.number_input(key="dc_batch").value == first["batch"]
    assert at.number_input(key="dc_seq_len_k").value == first["seq_len_k"]
    plan, _ = _sim_decode({k: first[k] for k in DECODE_W}, _measured_h100())
    assert metric(at, "Splits the model picks").value == f"{plan.splits:,}"


def test_decode_file_without_sweeps_counters_or_records_says_so(tmp_path, monkeypatch):
    doc = json.loads(DECODE.read_text())        # the shipped run without its sweeps and counters
    for rec in doc["decode"]:
        for key in ("splits_ms", "splits_best", "splits_model_loss", "ncu"):
            rec.pop(key, None)
    bare = tmp_path / "decode_bare.json"
    bare.write_text(json.dumps(doc))
    monkeypatch.setenv("IOAWARE_RESULTS", str(bare))
    at = open_decode()
    at.selectbox(key="dc_source").set_value(str(bare)).run()
    ok(at)
    assert len(table(at, "Measured, GPU time alone (ms)")) == len(doc["decode"])
    assert "has no split-count sweep" in texts(at.info)
    assert "no Nsight Compute's DRAM bytes" in texts(at.caption)
    assert len(charts(at)) == 1
    empty = tmp_path / "decode_empty.json"
    empty.write_text(json.dumps({"schema": "ioaware.decode/1",
                                 "provenance": {"gpu": "NVIDIA H100 80GB HBM3"},
                                 "decode": [], "window": []}))
    monkeypatch.setenv("IOAWARE_RESULTS", str(empty))
    at = open_decode()
    at.selectbox(key="dc_source").set_value(str(empty)).run()
    ok(at)
    assert "holds no decode records" in texts(at.info)
    broken = tmp_path / "decode_broken.json"
    broken.write_text(json.dumps({"schema": "ioaware.decode/1", "decode": [{"batch": 1}]}))
    monkeypatch.setenv("IOAWARE_RESULTS", str(broken))
    at = open_decode()
    at.selectbox(key="dc_source").set_value(str(broken)).run()
    ok(at)
    assert "decode record 0 lacks heads_q" in texts(at.warning)
    assert metric(at, "Splits the model picks")          # the model's part still stands


# -- What asynchrony buys ------------------------------------------------------------------------
SCHEDULES_FILE = ROOT / "results" / "fp8_h200_2026-11-28.json"


def _flash3_times(w, precision, prof) -> dict:
    """FlashAttention-3's plan priced at each of the page's steps, computed here from sim."""
    from sim.plan import price
    from sim.plans.flash3 import ABLATION_STEPS, INTRA_ONLY, flash3_forward_plan
    steps = dict(ABLATION_STEPS, intra_only=INTRA_ONLY)
    return {k: price(flash3_forward_plan(w, dtype=precision, **f), prof).time_s
            for k, f in steps.items()}


def test_hopper_page_is_registered_after_decoding():
    import ast

    tree = ast.parse(APP.read_text())
    pages = next(ast.literal_eval(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PAGES")
    urls = [u for _f, _t, u in pages]
    assert ("hopper.py", "What asynchrony buys", "hopper") in pages
    assert urls.index("hopper") == urls.index("decode") + 1


@pytest.mark.parametrize("precision", ["fp16", "fp8"])
def test_hopper_steps_are_flash3_s_plans_priced(precision):
    from sim.workload import Workload
    table, info = data.asynchrony_steps(4096, 128, 4, 16, True, precision, "h100", None,
                                        RATES_H100.read_bytes())
    w = Workload(batch=4, heads=16, seq_len_q=4096, head_dim=128, causal=True,
                 dtype="bf16" if precision == "fp8" else "fp16")
    want = _flash3_times(w, precision, _measured_h100())
    by = table.set_index("key")
    assert list(by.index) == ["baseline", "+warp_specialisation", "+pingpong", "+intra_overlap",
                              "intra_only"]
    for key, t in want.items():
        assert by.loc[key, "time_ms"] == pytest.approx(t * 1e3)
        assert by.loc[key, "speedup"] == pytest.approx(want["baseline"] / t)
    assert by.loc["+pingpong", "gain"] == pytest.approx(want["+warp_specialisation"]
                                                       / want["+pingpong"])
    assert by.loc["intra_only", "gain"] == pytest.approx(want["+warp_specialisation"]
                                                        / want["intra_only"])
    assert info["rates"] == "measured rates"
    assert info["peak_tflops"] == pytest.approx(
        1978.9 if precision == "fp8" else 989.4, rel=1e-3)


def test_hopper_measured_gains_are_the_file_s_ratios_beside_the_plans():
    from sim.profiles import load_profile
    from sim.workload import Workload
    loaded = data.load_schedules(SCHEDULES_FILE.read_bytes(), SCHEDULES_FILE.name)
    gains, priced = data.schedule_gains(loaded, 128, False, "fp16", "h100", None, None)
    assert priced["profile"] == "h200" and not priced["profile_guessed"]    # the file's GPU
    assert priced["rates"] == "measured rates"          # with its shipped rates
    doc = json.loads(SCHEDULES_FILE.read_text())
    rows = sorted((r for r in doc["speed"] if r["head_dim"] == 128 and not r["causal"]),
                  key=lambda r: r["seq_len"])
    assert list(gains["seq_len"]) == [r["seq_len"] for r in rows]
    prof = load_profile("h200", rates=json.loads(RATES_H200.read_text()))
    for (_, g), r in zip(gains.iterrows(), rows):
        t = {k: v["ms"] for k, v in r["times_ms"].items()}
        serial = t["kernel-fp16-128x128-serial"]
        assert g["pingpong+overlap_measured"] == pytest.approx(
            serial / t["kernel-fp16-128x128-pingpong+overlap"])
        assert g["cudnn_measured"] == pytest.approx(t["sdpa-flash"] / t["sdpa-cudnn"])
        want = _flash3_times(Workload(batch=r["batch"], heads=r["heads"], seq_len_q=r["seq_len"],
                                      head_dim=128, dtype="fp16"), "fp16", prof)
        assert g["pingpong_predicted"] == pytest.approx(want["+warp_specialisation"]
                                                        / want["+pingpong"])
        assert g["cudnn_predicted"] == pytest.approx(want["baseline"] / want["+intra_overlap"])
    fp8, _ = data.schedule_gains(loaded, 128, True, "fp8", "h100", None, None)
    assert len(fp8) == len(rows) and "cudnn_measured" not in fp8      # SDPA's rows are 16-bit
    assert data.schedule_gains(loaded, 64, False, "fp8", "h100", None, None)[0].empty


def test_hopper_file_without_schedules_is_refused_plainly(tmp_path):
    doc = json.loads(SCHEDULES_FILE.read_text())
    for r in doc["speed"]:
        r["times_ms"] = {k: v for k, v in r["times_ms"].items() if not k.startswith("kernel-")}
    with pytest.raises(ValueError, match="times no schedules"):
        data.load_schedules(json.dumps(doc).encode(), "plain.json")
    with pytest.raises(ValueError, match="not a file of measured schedules"):
        data.load_schedules(b'{"schema": "ioaware.pick/1"}', "pick.json")


def test_hopper_page_shows_both_parts_and_follows_the_precision(offer):
    at = ok(open_page("hopper"))
    assert at.title[0].value == "What asynchrony buys"
    assert metric(at, "FlashAttention-3 (all three)").value.endswith("ms")
    assert len(table(at, "Step")) == 5
    assert len(table(at, "Both: measured (×)")) == 4        # the file's N at d = 64
    assert len(charts(at)) == 2
    at.sidebar.radio(key="hp_precision").set_value("FP8 (e4m3)").run()
    ok(at)
    assert any("no measured schedules at d = 64" in i.value for i in at.info)
    at.sidebar.select_slider(key="w_head_dim").set_value(128).run()
    ok(at)
    assert "cuDNN over FlashAttention-2: measured (×)" not in table(at, "Both: measured (×)")
    assert not INTERNAL.search(screen_text(at))
