"""Page 4 — Predicted vs measured: a results file joined with the model's predictions for the same
configurations; scatter per metric, error table, filters, provenance."""
from __future__ import annotations

import streamlit as st

from dashboard import charts, data, ui

UPLOAD = "Upload a results file…"

st.title("Predicted vs measured")
st.caption("Measured runs (a results file: shipped in `results/`, or your own) next to what "
           "`sim` predicts for the same configuration. Points on the dashed y = x line are "
           "predicted exactly; the error table says by how much the rest miss.")

choices = data.results_choices()
if not choices:
    st.info("No results files were found in `results/`, so there is nothing measured to compare "
            "yet. Measure on a GPU (`python -m benchmarks measure`, see the *Measure* page) and copy "
            "the file into `results/`, or upload one below.")
wanted = st.query_params.get("results")  # deep link: .../measured?results=<file in the list>
if wanted in choices and "pm_source" not in st.session_state:
    st.session_state["pm_source"] = wanted
source = st.selectbox("Results", choices + [UPLOAD], key="pm_source")

loaded = None
try:
    if source == UPLOAD:
        upload = st.file_uploader("Results file (JSON, format `ioaware.results/1`)", type=["json"],
                                  key="pm_upload")
        if upload is None:
            st.stop()
        loaded = data.load_results_bytes(upload.getvalue(), upload.name)
    else:
        loaded = data.load_results_choice(source)
except data.ResultsUnavailable as exc:
    st.error(f"Results files cannot be read in this installation: {exc}")
    st.stop()
except data.format_error_types() as exc:
    st.error(f"**{source if source != UPLOAD else upload.name}** is not a valid results file:\n\n"
             f"{exc}")
    st.stop()

records = loaded["records"]
with st.expander("Provenance of these measurements", expanded=True):
    ui.table(data.provenance_table(loaded["provenance"]), "provenance", hide_index=True)
if records.empty:
    st.info(f"`{loaded['name']}` is valid but holds no records.")
    st.stop()

# -- model settings and filters -----------------------------------------------------------------
sim = ui.require_sim()
profiles = data.profile_names()
guess = data.profile_for_gpu(str(loaded["provenance"].get("gpu", "")))
c1, c2 = st.columns(2)
profile = c1.selectbox("Predict with GPU profile", profiles,
                       index=profiles.index(guess) if guess in profiles else 0, key="pm_profile",
                       format_func=data.profile_label,
                       help="Defaults to the profile matching the GPU named in the provenance.")
l2 = c2.selectbox("L2 model", ["analytic", "auto"], key="pm_l2",
                  format_func={"analytic": "analytic estimate (fast)",
                               "auto": "trace replay where affordable (as `python -m sim.compare`)"}.get)
if guess is None:
    st.caption(f"No built-in profile matches the GPU `{loaded['provenance'].get('gpu', '?')}`; "
               "choose the one to predict with.")

try:
    joined = data.compare_measured(loaded["digest"], profile, l2, _records=loaded["raw"])
except (ValueError, KeyError, TypeError) as exc:
    st.error(f"Could not predict the records of this file: {exc}")
    st.stop()
records_df = joined["records"]
cols = st.columns(4)
filters = {}
for col, field in zip(cols, ("gpu", "family", "dtype", "pass")):
    options = sorted(map(str, records_df[field].dropna().unique())) if field in records_df else []
    label = "Kernel" if field == "family" else field.upper() if field == "gpu" else field.capitalize()
    filters[field] = col.multiselect(label, options, default=options, key=f"pm_{field}")
key = tuple((field, tuple(values)) for field, values in filters.items())
joined, view, cmp_summary, metrics = charts.measured_view(loaded["digest"], profile, l2, key,
                                                          _records=loaded["raw"])
if view.empty:
    st.info("No records match the filters.")
    st.stop()

st.subheader("Error by metric")
st.caption("Relative error = (predicted − measured) / measured, over the records shown; the "
           "targets are the model's (global bytes and FLOPs of our kernel within 5 % and 2 %, "
           "DRAM bytes within 20 % on 90 % of records, calibrated time within 25 %). Calibrated "
           "time uses efficiency factors fitted per kernel on these records (in-sample).")
ui.table(data.display_summary(cmp_summary), "prediction-error-summary", hide_index=True)
if not joined["blocks"].empty:
    st.subheader("Does the model pick a good block size?")
    st.caption("For each workload of our kernel measured at several block sizes: the measured "
               "fastest, the model's pick among them, and whether the pick runs within 10 %.")
    ui.table(joined["blocks"], "block-size-check", hide_index=True)

st.subheader("Predicted against measured")
if not metrics:
    st.info("These records carry no measured value the model predicts.")
else:
    metric = st.radio("Metric", list(metrics), format_func=metrics.get, horizontal=True,
                      key="pm_metric")
    if metric not in metrics:
        metric = next(iter(metrics))
    fig = charts.measured_scatter(loaded["digest"], profile, l2, key, metric, metrics[metric],
                                  _view=view)
    ui.chart(fig, f"predicted-vs-measured-{metric}")

st.subheader("Records")
ui.table(view, "predicted-vs-measured-records", hide_index=True)
