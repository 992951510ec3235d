"""Page 4 — Predicted vs measured: a results file joined with the model's predictions for the same
configurations; scatter per metric, error table, filters, provenance."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, ui

UPLOAD = "Upload a results file…"

st.title("Predicted vs measured")
st.caption("Measured runs (a results file: shipped in `results/`, or your own) next to what "
           "`sim` predicts for the same configuration. Points on the dashed y = x line are "
           "predicted exactly; the error table says by how much the rest miss.")

choices = data.results_choices()
if not choices:
    st.info("No results files were found in `results/`, so there is nothing measured to compare "
            "yet. Measure on a GPU (`python -m kernels.measure`, see the *Measure* page) and copy "
            "the file into `results/`, or upload one below.")
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

# -- filters ------------------------------------------------------------------------------------
cols = st.columns(5)
filters = {}
for col, field in zip(cols[:4], ("gpu", "kernel", "dtype", "pass")):
    options = sorted(map(str, records[field].dropna().unique())) if field in records else []
    filters[field] = col.multiselect(field.capitalize(), options, default=options, key=f"pm_{field}")
sim = ui.require_sim()
profiles = data.profile_names()
guess = data.profile_for_gpu(str(records["gpu"].iloc[0]) if "gpu" in records else "")
profile = cols[4].selectbox("Predict with profile", profiles,
                            index=profiles.index(guess) if guess in profiles else 0,
                            key="pm_profile", format_func=data.profile_label)

try:
    joined = data.compare_measured(loaded["digest"], profile, _records=records)
except ValueError as exc:
    st.error(f"Could not predict the records of this file: {exc}")
    st.stop()
view = data.filter_records(joined, filters)
if view.empty:
    st.info("No records match the filters.")
    st.stop()

summary = data.error_summary(view)
st.subheader("Error by metric")
ui.table(summary, "prediction-error-summary", hide_index=True)

metrics = [m for m in data.COMPARED_METRICS if view[f"measured_{m}"].notna().any()]
if not metrics:
    st.info("These records carry no measured value the model predicts.")
else:
    chart_cols = st.columns(min(3, len(metrics)))
    for i, metric in enumerate(metrics):
        with chart_cols[i % len(chart_cols)]:
            ui.chart(figures.predicted_vs_measured(view, metric, data.COMPARED_METRICS[metric]),
                     f"predicted-vs-measured-{metric}")

st.subheader("Records")
ui.table(view, "predicted-vs-measured-records", hide_index=True)
