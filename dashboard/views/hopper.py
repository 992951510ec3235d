"""Page — What asynchrony buys: FlashAttention-3's three ideas on Hopper (a producer warp loading
ahead, ping-pong between two consumer warpgroups, each warpgroup overlapping its softmax with
its own products) for the sidebar's workload, as the cost model prices them step by step
(`sim.plans.flash3`); then what the same ideas measured in this toolkit's Hopper kernel (a file
of ``python -m benchmarks fp8 --schedules``), beside the model's prediction for them."""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from dashboard import data, figures, fmt, ui

UPLOAD = "Upload a schedules results file…"

st.title("What asynchrony buys")
st.caption("FlashAttention-3 runs FlashAttention-2's algorithm on Hopper with three ideas: a "
           "producer warp loads K and V ahead while the others compute (warp specialisation); "
           "two consumer warpgroups take turns on the tensor cores, so that one's softmax runs "
           "while the other multiplies (ping-pong); and each warpgroup runs its softmax while "
           "its own previous product is still on the tensor cores (intra-warpgroup overlap). "
           "The first part is the cost model's prediction for the sidebar's workload (forward "
           "only); the second sets what the same ideas measured beside it.")

ui.require_sim()
w = ui.workload_sidebar(show_pass=False, show_density=False)
sb = st.sidebar
precision_label = sb.radio("Inputs", list(data.ASYNC_PRECISIONS), key="hp_precision",
                           help="FlashAttention-3's FP8 forward multiplies e4m3 inputs at twice "
                                "the 16-bit rate; its exponentials are as many.")
precision = data.ASYNC_PRECISIONS[precision_label]
rates, rates_name = ui.rates_picker(sb, upload_key="hp_rates_upload", profile=w["profile"])

notes = []
if w["dtype"] == "fp32" and precision != "fp8":
    notes.append("FlashAttention-3 has no float32 forward: priced as 16-bit.")
if w["window"] or w["density"] < 1.0:
    notes.append("The sliding window and block sparsity of the sidebar are not applied here.")

# -- predicted -----------------------------------------------------------------------------------
st.subheader("Predicted, step by step")
try:
    table, info = data.asynchrony_steps(w["seq_len"], w["head_dim"], w["batch"], w["heads"],
                                        w["causal"], precision, w["profile"], w["custom"], rates)
except ValueError as exc:
    st.warning(f"The model does not price this workload: {data.plain_reason(exc)}")
    st.stop()
for note in notes:
    st.info(note)
by = table.set_index("key")
m = st.columns(4)
m[0].metric("No asynchrony", fmt.ms(by.loc["baseline", "time_ms"]),
            delta=f"{fmt.num(by.loc['baseline', 'tflops'])} TFLOP/s", delta_color="off")
m[1].metric("FlashAttention-3 (all three)", fmt.ms(by.loc["+intra_overlap", "time_ms"]),
            delta=f"{fmt.ratio(by.loc['+intra_overlap', 'speedup'])} faster", delta_color="off")
m[2].metric("Exponentials over products", fmt.ratio(info["mufu_over_matmul"]),
            help="The MUFU unit's time for the exponentials over the tensor cores' time for the "
                 "products, in the full kernel: above 1, the exponentials bound it.")
m[3].metric("Tiles (queries × keys)", info["tiles"])
ui.table(table, "asynchrony-steps", columns=data.asynchrony_columns())
c1, c2 = st.columns([3, 2])
with c1:
    ui.chart(figures.asynchrony_steps(table, info["peak_tflops"]), "asynchrony-steps-chart")
with c2:
    st.markdown("**How the model reads it.** Each step is FlashAttention-3's plan with the "
                "ideas so far; the time is the longest of its parts once what hides under what "
                "is taken out: loads under compute when a producer loads ahead, the softmax "
                "under the products with ping-pong or the overlap. In the full kernel the model "
                "hides " + (", ".join(info["hidden"]) or "nothing") + ". This is the most the "
                "design can buy: on the GPU the softmax and the products overlap far less "
                "(measured below, and against cuDNN's kernel in the model's notes).")
st.caption(ui.rates_note(info["rates"], rates_name, info["rates_error"], rates))

# -- measured beside predicted -------------------------------------------------------------------
st.subheader("Measured beside predicted")
choices = data.schedule_choices()
source = sb.selectbox("Schedules file", choices + [UPLOAD], key="hp_source",
                      help="A file of `python -m benchmarks fp8 --schedules`: our Hopper kernel "
                           "at each schedule on the same inputs in one run, beside PyTorch's "
                           "FLASH and cuDNN backends.")


def _load():
    try:
        if source == UPLOAD:
            up = st.file_uploader(f"Schedules file (JSON, up to {data.MAX_UPLOAD_MB} MB)",
                                  type=["json"], key="hp_upload")
            if up is None:
                return None
            return data.load_schedules(up.getvalue(), up.name)
        return data.load_schedules_choice(source)
    except (ValueError, FileNotFoundError) as exc:
        st.warning(str(exc))
    return None


loaded = None if (not choices and source != UPLOAD) else _load()
if loaded is None:
    if not choices and source != UPLOAD:
        st.info("No schedules file was found in `results/`; upload one (sidebar).")
    st.stop()
gains, priced = data.schedule_gains(loaded, w["head_dim"], w["causal"], precision,
                                    w["profile"], w["custom"], rates)
combo = (f"d = {w['head_dim']}, {'causal' if w['causal'] else 'not causal'}, "
         f"{'FP8' if precision == 'fp8' else '16-bit'}")
if gains.empty:
    st.info(f"`{Path(loaded['name']).name}` has no measured schedules at {combo}.")
    st.stop()
ui.table(gains, "schedule-gains", columns=data.schedule_gain_columns())
ui.chart(figures.schedule_gains(gains, data.SCHEDULE_IDEAS, mark_n=w["seq_len"]),
         "schedule-gains-chart")
st.caption(f"Measured on the {loaded['gpu'] or 'GPU the file names'} ({combo}; "
           f"{loaded['date'] or 'undated'}): our Hopper kernel at 128 × 128 tiles, its time run "
           "serially over its time with each schedule, on the same inputs in one run, at the "
           "batch and heads the file ran. Predicted: what the model says the same idea buys "
           "FlashAttention-3's plan on that problem (ping-pong and the overlap each over loading "
           f"ahead alone), {priced['rates']}, on the {data.profile_label(priced['profile'])} "
           "profile" + (" (no profile matches the file's GPU: the sidebar's)" if
                        priced["profile_guessed"] else "") + ". Our kernel's own plan declares "
           "its schedule and prices it as the serial kernel: the model does not yet price "
           "partial overlap.")
