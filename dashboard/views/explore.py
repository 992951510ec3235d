"""Page 1 — Explore: standard attention, FlashAttention and FlashAttention-2 side by side for one
workload on one GPU profile."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, fmt, ui

st.title("Explore")
st.caption("One workload (sidebar), three schedules: standard attention (S and P written to "
           "memory and read back), FlashAttention and FlashAttention-2 (tiles kept on chip, "
           "S and P never leave it). Every number is a prediction of the cost model.")

ui.require_sim()
w = ui.workload_sidebar()
rates, rates_name = ui.rates_picker(st.sidebar, upload_key="ex_rates_upload",
                                    profile=w["profile"])
l2 = st.sidebar.selectbox("DRAM bytes from", list(data.L2_MODES), key="w_l2",
                          format_func=data.L2_MODES.get,
                          help="How DRAM bytes are predicted from the global-memory traffic: the "
                               "analytic estimate, or a replay of every memory access of the "
                               "schedule through a model of the GPU's L2 cache.")
if l2 == "trace" and not data.trace_l2_affordable(w["batch"], w["heads"], w["seq_len"]):
    st.info("The L2 replay is offered up to batch·heads·N² = "
            f"{data.TRACE_L2_MAX_SCORES:,} scores (beyond, it takes minutes); showing the "
            "analytic estimate.")
    l2 = "analytic"
calibrate_on = st.sidebar.selectbox(
    "Calibrate time on", [data.NO_CALIBRATION] + data.results_choices(), key="ex_calibrate_on",
    help="A measured results file: the calibrated time uses efficiency factors fitted on its "
         "records of the profile's GPU and the same kernel. (none): the roofline bound only.")


def _compare(**kwargs):
    if l2 != "trace":
        return data.compare_schedules(**w, l2=l2, rates=rates, **kwargs)
    passes = 2 if w["pass_"] == "fwd+bwd" else 1
    eta = data.estimated_trace_seconds(w["seq_len"], w["batch"], w["heads"], passes)
    with st.spinner(f"Replaying every memory access through the L2 model (about "
                    f"{max(1, round(eta))} s)…"):
        return data.compare_schedules(**w, l2=l2, rates=rates, **kwargs)


try:
    table, ceilings = _compare(calibrate_on=calibrate_on)
except ValueError as exc:
    st.warning(f"The model rejected these inputs: {exc}")
    st.stop()
except FileNotFoundError as exc:
    st.warning(f"Could not calibrate: {exc}")
    table, ceilings = _compare()

by = table.set_index("schedule")
naive, flash2 = by.loc["naive"], by.loc["flash2"]
st.markdown("**FlashAttention-2** against standard attention")
m = st.columns(4)
m[0].metric("Global memory", fmt.bytes_(flash2["global_bytes"]),
            delta=f"{fmt.ratio(naive['global_bytes'] / flash2['global_bytes'])} less",
            delta_color="off")
m[1].metric("DRAM", fmt.bytes_(flash2["dram_bytes"]),
            delta=f"{fmt.ratio(naive['dram_bytes'] / flash2['dram_bytes'])} less", delta_color="off")
planned = flash2["time_from"] == data.PRICED_BY_PLAN
m[2].metric(data.rates_metric_label(flash2["rates"]) if planned else data.ROOFLINE,
            fmt.ms(flash2["time_ms"]),
            delta=f"{fmt.ratio(naive['time_ms'] / flash2['time_ms'])} faster",
            delta_color="off",
            help=("FlashAttention-2's plan priced at the rates measured on the GPU: the model's "
                  "forecast of its run time." if flash2["rates"] == "measured rates" and planned
                  else "At the GPU's datasheet peaks: a lower bound on the run time, not a "
                       "forecast of it (real kernels reach a fraction of the peaks)."))
m[3].metric("On-chip memory per block", fmt.bytes_(flash2["sram_bytes_per_block"]),
            delta=f"tile {int(flash2['block_q'])} × {int(flash2['block_k'])}", delta_color="off")

if ceilings["rates_error"]:
    st.warning(f"The rates file was not used ({ceilings['rates_error']}); the model prices with "
               "the datasheet rates.")
shown, columns = data.schedule_table(table)
ui.table(shown, "explore-schedules", columns=columns)
st.caption(ui.rates_note(ceilings["rates"], rates_name, ceilings["rates_error"], rates)
           + " On the roofline the datasheet's peaks are drawn as what they are, a bound; the "
             "measured points of a results file are on *Predicted vs measured*.")

c1, c2 = st.columns(2)
with c1:
    ui.chart(figures.schedule_bytes(table), "explore-bytes")
with c2:
    ui.chart(figures.roofline(table, ceilings), "explore-roofline")
st.caption(data.model_notes())
