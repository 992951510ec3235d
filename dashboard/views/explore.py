"""Page 1 — Explore: naive, flash1 and flash2 side by side for one workload on one GPU profile."""
from __future__ import annotations

import streamlit as st

from dashboard import data, figures, ui

st.title("Explore")
st.caption("One workload (sidebar), three schedules: standard attention (`naive`, S and P "
           "written to memory), FlashAttention (`flash1`) and FlashAttention-2 (`flash2`). "
           "All numbers are predictions of the `sim` cost model.")

ui.require_sim()
w = ui.workload_sidebar()
l2 = st.sidebar.selectbox("L2 model", list(data.L2_MODES), key="w_l2",
                          format_func=data.L2_MODES.get,
                          help="How DRAM bytes are predicted from the global-memory traffic: sim's "
                               "analytic estimate, or the replay of the full event trace through "
                               "an LRU L2 (what `python -m sim predict` does by default).")
if l2 == "trace" and not data.trace_l2_affordable(w["batch"], w["heads"], w["seq_len"]):
    st.info("The trace replay of the L2 model is limited to batch·heads·N² ≤ "
            f"{data.TRACE_L2_MAX_SCORES:,} scores here (it takes minutes beyond that); "
            "showing the analytic estimate.")
    l2 = "analytic"
calibrate_on = st.sidebar.selectbox(
    "Calibrate time on", [data.NO_CALIBRATION] + data.results_choices(), key="ex_calibrate_on",
    help="A measured results file: the calibrated time uses efficiency factors fitted on its "
         "records of the profile's GPU and the same kernel program (`python -m sim predict "
         "--calibrate-on FILE`). (none): the raw roofline only.")
try:
    table, ceilings = data.compare_schedules(**w, l2=l2, calibrate_on=calibrate_on)
except ValueError as exc:
    st.warning(f"The model rejected these inputs: {exc}")
    st.stop()
except FileNotFoundError as exc:
    st.warning(f"Could not calibrate: {exc}")
    table, ceilings = data.compare_schedules(**w, l2=l2)

naive, flash2 = table.set_index("schedule").loc["naive"], table.set_index("schedule").loc["flash2"]
m = st.columns(4)
m[0].metric("flash2 global bytes", figures.fmt_bytes(flash2["global_bytes"]),
            delta=f"{flash2['global_bytes'] / naive['global_bytes']:.1%} of naive",
            delta_color="off")
m[1].metric("flash2 DRAM bytes", figures.fmt_bytes(flash2["dram_bytes"]),
            delta=f"{flash2['dram_bytes'] / naive['dram_bytes']:.1%} of naive", delta_color="off")
m[2].metric("flash2 predicted time", f"{flash2['predicted_ms']:.3g} ms",
            delta=f"{naive['predicted_ms'] / flash2['predicted_ms']:.2f}× faster than naive",
            delta_color="off")
m[3].metric("flash2 SRAM per block", figures.fmt_bytes(flash2["sram_bytes_per_block"]),
            delta=f"block {int(flash2['block_q'])}×{int(flash2['block_k'])}", delta_color="off")

ui.table(data.display_schedule_table(table), "explore-schedules", hide_index=True)

c1, c2 = st.columns(2)
with c1:
    ui.chart(figures.schedule_bytes(table), "explore-bytes")
with c2:
    ui.chart(figures.roofline(table, ceilings), "explore-roofline")
st.caption(data.model_notes())
