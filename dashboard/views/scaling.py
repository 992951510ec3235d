"""Page 3 — Scaling: time and TFLOP/s against N as a benchmark file measured them, one series per
implementation with the model's prediction beside each; then bytes, time and memory against N
for the model's three schedules, with the papers' asymptotic curves."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import data, figures, fmt, ui

UPLOAD = "Upload a results file…"

st.title("Scaling")
st.caption("How time grows with the sequence length N: first as measured on a GPU, each "
           "implementation (ours and PyTorch's attention backends) with the model's prediction "
           "for it dashed beside it; then the model's three schedules against the "
           "FlashAttention paper's bounds. The sidebar's N is marked on every chart.")

ui.require_sim()
w = ui.workload_sidebar(seq_len_help="Marked on every chart; the measured and predicted times "
                                     "at this N are listed under the measured charts, the "
                                     "model's schedules at this N under theirs.")
sb = st.sidebar
rates, rates_name = ui.rates_picker(sb, upload_key="sc_rates_upload", profile=w["profile"])
sb.header("Measurements")
choices = data.results_choices()
if st.session_state.get("sc_source") not in choices + [UPLOAD]:
    bench = [c for c in choices if Path(c).name.startswith("bench_")]
    st.session_state["sc_source"] = (bench or choices or [UPLOAD])[0]
source = sb.selectbox("Results file", choices + [UPLOAD], key="sc_source",
                      help="A file of measured times (`python -m benchmarks bench` writes one "
                           "with every implementation at every N).")
n = w["seq_len"]


def _load():
    """``(loaded results file, its name)``, or ``(None, None)`` with the reason on the page."""
    try:
        if source == UPLOAD:
            up = st.file_uploader(f"Results file (JSON, up to {data.MAX_UPLOAD_MB} MB)",
                                  type=["json"], key="sc_upload")
            if up is None:
                return None, None
            return data.load_results_bytes(up.getvalue(), up.name), up.name
        return data.load_results_choice(source), source
    except data.ResultsUnavailable as exc:
        st.warning(f"Results files cannot be read in this installation: {exc}")
    except FileNotFoundError as exc:
        st.warning(str(exc))
    except data.format_error_types() as exc:
        ui.show_problems(source, exc)
    return None, None


# -- measured ------------------------------------------------------------------------------------
st.subheader("Measured against N")
loaded, name = _load()
if loaded is None and not choices and source != UPLOAD:
    st.info("No results files were found in `results/`; upload one (sidebar).")
elif loaded is not None:
    res = data.scaling_measured(loaded["digest"], w["head_dim"], w["dtype"], w["causal"],
                                w["pass_"], w["profile"], rates, _records=loaded["raw"])
    if res["empty"]:
        st.info(f"`{Path(name).name}` {res['empty']}")
    else:
        predicted = data.rates_label(res["rates"]).lower()
        combo = (f"d = {w['head_dim']}, {w['dtype']}, {'causal' if w['causal'] else 'not causal'}"
                 f", {data.PASS_LABELS.get(w['pass_'], w['pass_'])}")
        notes = [f"Measured on the {res['gpu'] or 'GPU the file names'} ({combo}), each "
                 "implementation at the batch and heads the file ran at each N (the sidebar's "
                 "batch and heads are the model's, below). Solid: measured; dashed: the model's "
                 f"time for the same problem, {predicted}, on the "
                 f"{data.profile_label(res['profile'])} profile."]
        if res["profile_guessed"]:
            notes.append("No profile matches the file's GPU: the sidebar's is used.")
        if res["no_plan"]:
            notes.append("No prediction for " + ", ".join(data.family_label(i)
                                                         for i in res["no_plan"])
                         + ": the model has no plan of the kernels it launches here.")
        notes.append(ui.rates_note(res["rates"], rates_name, res["rates_error"], rates))
        if w["window"] or w["density"] < 1:
            notes.append("The measured records are dense, without a sliding window; the window "
                         "and block mask apply to the model's schedules below.")
        st.caption(" ".join(notes))
        labels = data.FAMILY_LABELS
        ns = sorted(res["measured"]["seq_len"].unique())
        mark = n if ns[0] <= n <= ns[-1] else None
        c1, c2 = st.columns(2)
        with c1:
            ui.chart(figures.scaling_measured(res, "tflops", labels, predicted, mark,
                                              "TFLOP/s against N"), "scaling-measured-tflops")
        with c2:
            ui.chart(figures.scaling_measured(res, "time_ms", labels, predicted, mark,
                                              "Time against N"), "scaling-measured-time")
        at = data.scaling_at(res, n)
        if at.empty:
            st.info(f"The file measures N = {', '.join(f'{m:,}' for m in ns)}; the sidebar's "
                    f"N = {n:,} is not among them.")
        else:
            st.markdown(f"At the sidebar's **N = {n:,}**")
            pred = data.rates_label(res["rates"])
            ui.table(at.assign(impl=at["impl"].map(data.family_label)), "scaling-measured-at-n",
                     columns={"impl": fmt.Col("Implementation"),
                              "measured_ms": fmt.Col("Measured", "ms"),
                              "predicted_ms": fmt.Col(pred, "ms"),
                              "ratio": fmt.Col("Predicted ÷ measured", "ratio"),
                              "measured_tflops": fmt.Col("Measured TFLOP/s", "num")})
        with st.expander("Every measured and predicted point"):
            shown, columns = data.scaling_measured_table(res)
            ui.table(shown, "scaling-measured", columns=columns)

# -- the model's schedules -----------------------------------------------------------------------
st.subheader("The model's schedules against N")
st.caption("Traffic, time and memory of standard attention, FlashAttention and FlashAttention-2 "
           "for the sidebar's workload (log-log). Dashed: the FlashAttention paper's bounds — "
           "standard attention moves Θ(Nd + N²) elements, FlashAttention Θ(N²d²/M) for on-chip "
           "memory M — drawn through the model's value at the smallest N so that the slopes can "
           "be compared.")
lo, hi = st.select_slider("Range of N drawn", options=ui.SEQ_LENS,
                          value=(ui.SEQ_LENS[0], ui.SEQ_LENS[-1]), key="sc_range",
                          format_func=lambda v: f"{v:,}")
if lo == hi:
    st.info("Pick a range with at least two sequence lengths.")
    st.stop()
seq_lens = tuple(v for v in ui.SEQ_LENS if lo <= v <= hi)
try:
    table, bounds = data.scaling(seq_lens=seq_lens, rates=rates,
                                 **{k: v for k, v in w.items() if k != "seq_len"})
except ValueError as exc:
    st.warning(f"The model rejected these inputs: {exc}")
    st.stop()
time_label = data.time_label(table)

if lo <= n <= hi:
    at = table[table["seq_len"] == n].set_index("schedule")
    naive, flash2 = at.loc["naive"], at.loc["flash2"]
    st.markdown(f"At the sidebar's **N = {n:,}**, FlashAttention-2 against standard attention")
    m = st.columns(3)
    m[0].metric("Global memory", fmt.bytes_(flash2["global_bytes"]),
                delta=f"{fmt.ratio(naive['global_bytes'] / flash2['global_bytes'])} less",
                delta_color="off")
    m[1].metric(time_label, fmt.ms(flash2["time_ms"]),
                delta=f"{fmt.ratio(naive['time_ms'] / flash2['time_ms'])} faster",
                delta_color="off", help=data.model_notes())
    m[2].metric("Memory beyond Q, K, V, O", fmt.bytes_(flash2["extra_memory_bytes"]),
                delta=f"standard attention: {fmt.bytes_(naive['extra_memory_bytes'])}",
                delta_color="off")
    mark = n
else:
    st.info(f"The sidebar's N = {n:,} is outside the range drawn ({lo:,} to {hi:,}).")
    mark = None

c1, c2 = st.columns(2)
with c1:
    ui.chart(figures.scaling_bytes(table, bounds, mark), "scaling-bytes")
with c2:
    ui.chart(figures.scaling_time(table, mark, time_label), "scaling-time")
ui.chart(figures.scaling_memory(table, mark), "scaling-memory")
ui.table(table.assign(schedule=table["schedule"].map(data.schedule_label)), "scaling",
         columns=data.scaling_columns(table))
