"""Page 4 — Predicted vs measured: a results file joined with the model's predictions for the same
configurations; error per metric and per kernel, the predicted time's error against N, achieved
and predicted points on a roofline, scatter per metric, filters, provenance."""
from __future__ import annotations

import streamlit as st

from dashboard import charts, data, fmt, ui

UPLOAD = "Upload a results file…"

st.title("Predicted vs measured")
st.caption("Measured runs (a results file: shipped in `results/`, or your own) next to what the "
           "cost model predicts for the same configuration. Points on the dashed y = x line are "
           "predicted exactly; the error table says by how much the rest miss.")
ui.results_format_help(key="measured")

choices = data.results_choices()
if not choices:
    st.info("No results files were found in `results/`, so there is nothing measured to compare "
            "yet. Measure on a GPU (see the *Measure* page) and copy the file into `results/`, "
            "or upload one below.")
wanted = st.query_params.get("results")  # deep link: .../measured?results=<file in the list>
if wanted in choices and "pm_source" not in st.session_state:
    st.session_state["pm_source"] = wanted
sb = st.sidebar
sb.header("Measurements")
FILTERS = ("gpu", "family", "dtype", "pass")


def _new_file():
    # another file has other GPUs, kernels, dtypes and passes: show all of its records
    for f in FILTERS:
        st.session_state.pop(f"pm_{f}", None)


source = sb.selectbox("Results file", choices + [UPLOAD], key="pm_source", on_change=_new_file)

loaded, name = None, source
try:
    if source == UPLOAD:
        upload = st.file_uploader(f"Results file (JSON, up to {data.MAX_UPLOAD_MB} MB)",
                                  type=["json"], key="pm_upload")
        if upload is None:
            st.stop()
        name = upload.name
        if upload.size > data.MAX_UPLOAD_MB * 10**6:
            st.error(f"**{name}** is {upload.size / 1e6:,.0f} MB; files up to "
                     f"{data.MAX_UPLOAD_MB} MB are accepted. Split the sweep into several files "
                     "(or leave out the per-kernel counter details) and upload them one by one.")
            st.stop()
        loaded = data.load_results_bytes(upload.getvalue(), name)
    else:
        loaded = data.load_results_choice(source)
except data.ResultsUnavailable as exc:
    st.error(f"Results files cannot be read in this installation: {exc}")
    st.stop()
except data.format_error_types() as exc:
    ui.show_problems(name, exc)
    st.stop()

records = loaded["records"]
prov = loaded["provenance"]
if loaded["warnings"]:
    st.warning("The provenance of this file is incomplete, so it cannot say where and how it was "
               "measured; the records are compared anyway.\n\n"
               + "\n".join(f"- **{p.where}**: {p.what}" for p in loaded["warnings"]))
with st.expander(f"Provenance: {prov.get('gpu', 'GPU not recorded')}, "
                 f"{str(prov.get('date', 'date not recorded'))[:10]}"):
    ui.table(data.provenance_table(prov), "provenance",
             columns={"field": fmt.Col("Field"), "value": fmt.Col("Value")})
if records.empty:
    st.info(f"`{loaded['name']}` is valid but holds no records.")
    st.stop()

# -- model settings -----------------------------------------------------------------------------
ui.require_sim()
profiles = data.profile_names()
guess = data.profile_for_gpu(str(prov.get("gpu", "")))
sb.header("Model")
profile = sb.selectbox("Predict with GPU profile", profiles,
                       index=profiles.index(guess) if guess in profiles else 0, key="pm_profile",
                       format_func=data.profile_label,
                       help="Defaults to the profile matching the GPU named in the provenance.")
l2 = sb.selectbox("DRAM bytes from", ["analytic", "auto"], key="pm_l2",
                  format_func={"analytic": "analytic estimate (instant)",
                               "auto": "trace replay where affordable (minutes; runs in the "
                                       "background)"}.get,
                  help="The trace replay walks every memory access of a record through a model "
                       f"of the L2 cache; records of more than {data.MAX_TRACE_EVENTS:,} "
                       "accesses keep the analytic estimate.")
if guess is None:
    sb.caption(f"No built-in profile matches the GPU `{prov.get('gpu', '?')}`; choose the one "
               "to predict with.")
rates, rates_name = ui.rates_picker(sb, upload_key="pm_rates_upload", profile=profile)
rates_path = data.rates_file_path(rates)
model_key = f"{profile} {rates_path or ''}"

try:
    with st.spinner(f"Predicting {len(loaded['raw']):,} records with the cost model…"):
        joined = data.compare_measured(loaded["digest"], profile, _records=loaded["raw"],
                                       rates_path=rates_path)
except (ValueError, KeyError, TypeError) as exc:
    st.error(f"Could not predict the records of this file: {exc}")
    st.stop()

l2_shown = "analytic"
if l2 == "auto":
    job = data.replay_job(loaded["digest"], profile, rates_path)
    if job is None or job.error:
        with st.spinner("Timing the replay of one record…"):
            plan = data.cached_replay_plan(loaded["digest"], profile, _joined=joined["records"],
                                           _records=loaded["raw"])
        if job is not None:
            st.error(f"The last replay failed: {job.error}")
        more = (f"; {plan['analytic']:,} larger record{'s' * (plan['analytic'] != 1)} keep the "
                "analytic estimate" if plan["analytic"] else "")
        st.info(f"The trace replay would replay {plan['replayed']:,} of {len(loaded['raw']):,} "
                f"records ({plan['events']:,} memory events){more}. Estimated time on this "
                f"machine: **about {fmt.num(max(1, plan['seconds']), 2)} s**. It runs in the "
                "background; the analytic estimate is shown until it has finished.")
        if st.button("Start the replay", key="pm_replay_start", type="primary"):
            data.start_replay(loaded["digest"], profile, loaded["raw"], plan["seconds"],
                              rates_path)
            st.rerun()
    elif job.result is None:
        @st.fragment(run_every=1.0)
        def _replay_progress():
            j = data.replay_job(loaded["digest"], profile, rates_path)
            if j is None or j.finished:
                st.rerun(scope="app")
            st.progress(min(1.0, j.done / max(1, j.total)),
                        text=f"Trace replay: {j.done:,} of {j.total:,} records, "
                             f"{fmt.num(j.elapsed, 2)} s so far, about "
                             f"{fmt.num(max(1, j.remaining_s), 2)} s left. The analytic "
                             "estimate is shown meanwhile.")
        _replay_progress()
    else:
        joined, l2_shown = job.result, "auto"
        st.success(f"Trace replay finished in {fmt.num(job.elapsed, 2)} s: DRAM bytes below come "
                   "from the replay where it was affordable (column *DRAM predicted by*).")

records_df = joined["records"]
sb.header("Records shown")
filters = {}
for col, (field, label, fmt_func) in zip([sb] * 4, (
        ("gpu", "GPU", str), ("family", "Kernel", data.family_label), ("dtype", "dtype", str),
        ("pass", "Pass", lambda p: data.PASS_LABELS.get(p, p)))):
    options = sorted(map(str, records_df[field].dropna().unique())) if field in records_df else []
    filters[field] = col.multiselect(label, options, default=options, key=f"pm_{field}",
                                     format_func=fmt_func)
key = tuple((field, tuple(values)) for field, values in filters.items())
view, cmp_summary, metrics = charts.measured_view(loaded["digest"], model_key, l2_shown, key,
                                                  _joined=joined)
if view.empty:
    st.info("No records match the filters.")
    st.stop()

planned, rated = data.plan_priced(view)
if rates is not None and planned and not rated:
    st.warning(f"`{rates_name}` was not measured on this file's GPU: the records are priced "
               "with the datasheet rates.")
how = (f"measured rates ({ui.rates_source(rates, rates_name)})" if rated else
       "the GPU's datasheet rates, peaks real kernels do not reach, so its error is expected "
       "to be negative")
rest = len(view) - planned
st.subheader("Error by metric")
st.caption("Relative error = (predicted − measured) / measured, over the records shown. The "
           "model's targets: global bytes and FLOPs of this project's kernels within 5 % and "
           "2 %, DRAM bytes within 20 % on 90 % of records, calibrated time within 25 %. The "
           f"predicted time of {planned:,} of these {len(view):,} records prices the plan of the "
           f"kernels they ran, from {how}"
           + (f"; {rest:,} have no plan and keep the roofline at peak rates, a bound. "
              if rest else ". ")
           + "The calibrated time uses efficiency factors fitted per kernel on these records "
             "(in-sample).")
shown, columns = data.display_summary(cmp_summary)
ui.table(shown, "prediction-error-summary", columns=columns, csv=cmp_summary)
st.caption(" ".join(f"*{label}*: {what}." for label, what in
                    (data.METRIC_LABELS[m] for m in cmp_summary["metric"]
                     if m in data.METRIC_LABELS)))

st.subheader("Error per kernel")
st.caption("For each kernel, the median and the worst |relative error| of each metric over its "
           "records shown, and how its time was predicted.")
fam, fam_cols = data.family_summary(view)
ui.table(fam, "prediction-error-per-kernel", columns=fam_cols)

st.subheader("Error against N")
err_n = data.error_against_n(view)
if err_n["rel_error_time"].notna().any():
    st.caption("The predicted time's error for every record shown, against its sequence length "
               "N; one colour per kernel, its median at each N joined by a line.")
    ui.chart(charts.error_figure(loaded["digest"], model_key, l2_shown, key, _points=err_n),
             "prediction-error-against-n")
else:
    st.info("No record shown has both a measured and a predicted time.")

st.subheader("Roofline: achieved and predicted")
points = data.roofline_points(view)
if points.empty:
    st.info("No record shown carries measured DRAM bytes and FLOPs (Nsight Compute counters): "
            "there is no achieved point to draw.")
else:
    st.caption(f"{len(points):,} records with Nsight Compute's DRAM bytes and FLOPs, each at the "
               "point it achieved (measured FLOPs / measured time against measured FLOPs per "
               "DRAM byte) and, hollow, at the model's point for it. The lines are the "
               "datasheet's peaks: a bound, not a prediction.")
    ui.chart(charts.measured_roofline(loaded["digest"], model_key, l2_shown, key, profile,
                                      _points=points), "prediction-roofline")
if not joined["blocks"].empty:
    st.subheader("Does the model pick a good tile shape?")
    st.caption("For each workload of this project's CUDA-core kernel measured at several tile "
               "shapes: the fastest measured, the model's pick among them, and whether the pick "
               "runs within 10 % of the fastest.")
    ui.table(data.display_blocks(joined["blocks"]), "block-size-check",
             columns=data.blocks_columns(), csv=joined["blocks"])

st.subheader("Predicted against measured")
if not metrics:
    st.info("These records carry no measured value the model predicts.")
else:
    metric = st.radio("Metric", list(metrics), format_func=metrics.get, horizontal=True,
                      key="pm_metric")
    if metric not in metrics:
        metric = next(iter(metrics))
    fig = charts.measured_scatter(loaded["digest"], model_key, l2_shown, key, metric,
                                  metrics[metric], _view=view)
    ui.chart(fig, f"predicted-vs-measured-{metric}")

st.subheader("Records")
shown, columns = data.records_view(view)
ui.table(shown, "predicted-vs-measured-records", columns=columns, csv=view)
