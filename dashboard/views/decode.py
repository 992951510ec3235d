"""Page — Decoding: what split-KV buys. One decoding workload (a few query rows against a long KV
cache) priced by the split-KV plan of the cost model (``sim.decode``): the number of key splits
it picks, its DRAM bytes and time, and its time against the number of splits, one split (a
FlashAttention-2-like grid) marked beside the pick. Then a file of measured decoding (``python -m
benchmarks decode``) re-priced as ``python -m benchmarks decode --report`` prices it: measured
against predicted per case, and each case's split sweep, measured beside predicted."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, figures, fmt, ui

UPLOAD = "Upload a decode results file…"
#: The workload the page opens on: one decoding step of a grouped-query model (32 query heads
#: sharing 8 KV heads, head dim 128) at batch 8 over a 32k-token cache, bfloat16.
DEFAULTS = {"dc_batch": 8, "dc_heads_q": 32, "dc_heads_kv": 8, "dc_head_dim": 128,
            "dc_seq_len_q": 1, "dc_seq_len_k": 32768, "dc_dtype": "bf16", "dc_splits": 0}
#: The sizes the page's widgets take (the model's own limits come from it: query rows, splits).
MAX_BATCH, MAX_HEADS, MAX_SEQ_LEN_K = 4096, 256, 1 << 22
ss = st.session_state

st.title("Decoding")
st.caption("Decoding attends a few new query rows to a long KV cache. One program per (batch, "
           "KV head) leaves most of the GPU idle; the split-KV plan also splits the keys, so "
           "that enough programs stream K and V at once, and the last program of each group "
           "merges the splits' partial outputs in the same launch. Every number on the first part is a prediction of the "
           "cost model; the second part sets a measured file beside it.")

ui.require_sim()
limits = data.decode_limits()
for key, default in DEFAULTS.items():
    ss.setdefault(key, default)

# -- the workload and the GPU (sidebar) ---------------------------------------------------------
sb = st.sidebar
sb.header("Decoding workload")
c1, c2 = sb.columns(2)
c1.number_input("Batch", min_value=1, max_value=MAX_BATCH, step=1, key="dc_batch")
c2.number_input("Query rows per sequence", min_value=1, max_value=limits["max_seqlen_q"], step=1,
                key="dc_seq_len_q",
                help="New tokens per step: 1 for plain decoding, more for speculative decoding "
                     f"(the kernel takes up to {limits['max_seqlen_q']}).")
c1.number_input("Query heads", min_value=1, max_value=MAX_HEADS, step=1, key="dc_heads_q")
c2.number_input("KV heads", min_value=1, max_value=MAX_HEADS, step=1, key="dc_heads_kv",
                help="Grouped-query attention: each KV head serves query heads ÷ KV heads "
                     "query heads, whose rows one program keeps, so K and V are read once per "
                     "KV head. Equal to the query heads: multi-head attention.")
sb.number_input("KV cache length Nk (keys)", min_value=1, max_value=MAX_SEQ_LEN_K, step=1024,
                key="dc_seq_len_k")
c1, c2 = sb.columns(2)
c1.selectbox("Head dim d", ui.HEAD_DIMS, key="dc_head_dim")
c2.selectbox("dtype", ui.DTYPES, key="dc_dtype")
sb.number_input("Splits (0 = the model's choice)", min_value=0, max_value=limits["max_splits"],
                step=1, key="dc_splits",
                help="Set the number of key splits instead of the model's pick, to see what "
                     "another split count would cost.")
profile, custom = ui.profile_sidebar(sb)
rates, rates_name = ui.rates_picker(sb, upload_key="dc_rates_upload", profile=profile)

workload = {"batch": int(ss["dc_batch"]), "heads_q": int(ss["dc_heads_q"]),
            "heads_kv": int(ss["dc_heads_kv"]), "seq_len_q": int(ss["dc_seq_len_q"]),
            "seq_len_k": int(ss["dc_seq_len_k"]), "head_dim": int(ss["dc_head_dim"]),
            "dtype": str(ss["dc_dtype"])}
given = int(ss["dc_splits"]) or None


# -- the model ----------------------------------------------------------------------------------
def _model() -> dict | None:
    """The model's part of the page; returns its prediction (None where it refused)."""
    try:
        pred = data.decode_prediction(**workload, profile=profile, custom=custom, rates=rates,
                                      splits=given)
    except ValueError as exc:
        st.warning(f"The split-KV plan does not take this workload: {exc}.")
        return None
    if pred["rates_error"]:
        st.warning(f"The rates file was not used ({pred['rates_error']}); the model prices with "
                   "the datasheet rates.")
    predicted = data.rates_metric_label(pred["rates"])
    rate_text = (f"{fmt.bytes_(pred['dram_rate'])}/s, "
                 + ("the read bandwidth measured on this GPU" if
                    pred["rate_sources"].get("dram_read_bytes_per_s") == "measured" else
                    "the datasheet's peak"))
    m = st.columns(4)
    m[0].metric("Splits the model picks", f"{pred['chosen']:,}",
                delta=f"{pred['splits']:,} given" if pred["given"] else None, delta_color="off",
                help="The fewest splits that keep the GPU about as busy as the most would "
                     "(more splits cost merge traffic).")
    m[1].metric("Predicted DRAM bytes", fmt.bytes_(pred["dram_read_bytes"]
                                                   + pred["dram_write_bytes"]),
                delta=f"read {fmt.bytes_(pred['dram_read_bytes'])}, write "
                      f"{fmt.bytes_(pred['dram_write_bytes'])}", delta_color="off")
    m[2].metric(predicted, fmt.ms(pred["time_ms"]),
                delta=f"{pred['splits']:,} split{'s' * (pred['splits'] != 1)}"
                      + (" (given)" if pred["given"] else ""), delta_color="off",
                help="The split-KV kernel, its merge in the same launch, with the launch cost.")
    m[3].metric("K/V bandwidth it implies", fmt.pct(pred["bandwidth_fraction"]),
                delta=f"of {fmt.bytes_(pred['dram_rate'])}/s", delta_color="off",
                help="K and V bytes / the predicted time, as a fraction of the DRAM rate the "
                     f"model streams at ({rate_text}). The measured files report theirs "
                     "against the copy bandwidth measured in their run.")

    st.markdown("**What split-KV buys**")
    b = st.columns(3)
    b[0].metric("1 split (a FlashAttention-2-like grid)", fmt.ms(pred["one_split_ms"]),
                delta=f"{pred['plan']['grid'][0]:,} programs", delta_color="off",
                help="The same plan with one split: one program per (batch, KV head, row "
                     "chunk), each streaming all its keys, as a FlashAttention-2 grid "
                     "parallelises. FlashAttention-2 itself also reads K and V once per query "
                     "head (not per KV head), so this understates what it costs.")
    b[1].metric(f"The model's pick: {pred['chosen']:,} splits", fmt.ms(pred["chosen_ms"]),
                delta=f"{fmt.ratio(pred['one_split_ms'] / pred['chosen_ms'])} faster than 1 split",
                delta_color="off")
    if pred["given"] and pred["splits"] != pred["chosen"]:
        b[2].metric(f"Given: {pred['splits']:,} splits", fmt.ms(pred["time_ms"]),
                    delta=f"{fmt.ratio(pred['time_ms'] / pred['chosen_ms'])} the pick's time",
                    delta_color="off")

    title = f"{data.decode_case_label(workload)}, on the {pred['gpu']}"
    ui.chart(figures.decode_splits(pred["curve"], chosen=pred["chosen"], splits=pred["splits"],
                                   given=pred["given"],
                                   predicted_name=data.rates_label(pred["rates"]).lower(),
                                   title=f"Predicted time against splits: {title}"),
             "decode-splits")
    st.caption(f"Every split count from 1 to {pred['most']:,} (each split keeps at least "
               f"{limits['min_keys_per_split']:,} keys, at most {limits['max_splits']:,} "
               "splits). The time falls while more programs fill the GPU's last wave and jumps "
               "where one more wave starts; the model takes the fewest splits close to the "
               "best wave, so its pick need not be the lowest point. "
               + ui.rates_note(pred["rates"], rates_name, pred["rates_error"], rates))
    with st.expander("The plan"):
        p = pred["plan"]
        rows = [("Split-KV kernel's grid", f"{p['grid'][0]:,} × {p['grid'][1]:,} programs of "
                                           f"{p['threads']:,} threads"),
                ("Query rows per program", f"{p['rows_per_program']:,} ({p['row_chunks']:,} "
                                           f"chunk{'s' * (p['row_chunks'] != 1)} per KV head)"),
                ("Kernels launched", f"{pred['launches']:,} (the split-KV kernel, the merge)"),
                ("K and V bytes", fmt.bytes_(pred["kv_bytes"])),
                ("DRAM read", fmt.bytes_(pred["dram_read_bytes"])),
                ("DRAM written", fmt.bytes_(pred["dram_write_bytes"])),
                ("FLOPs", fmt.flops(pred["flops"])),
                ("Last wave busy", fmt.pct(pred["wave_efficiency"])),
                ("Split-KV kernel", fmt.ms(pred["time_main_ms"])),
                ("Merge", fmt.ms(pred["time_merge_ms"]))]
        ui.table(pd.DataFrame(rows, columns=["quantity", "value"]), "decode-plan",
                 columns={"quantity": fmt.Col("Quantity"), "value": fmt.Col("Value")})
    return pred


st.subheader("The model's split-KV plan")
pred = _model()


# -- measured -----------------------------------------------------------------------------------
st.subheader("Measured: predicted against a decode results file")
choices = data.decode_choices()
if ss.get("dc_source") not in choices + [UPLOAD]:
    ss["dc_source"] = data.default_decode_choice() or UPLOAD
sb.header("Measurements")
source = sb.selectbox("Decode results file", choices + [UPLOAD], key="dc_source",
                      help="A file `python -m benchmarks decode` wrote on a GPU.")


def _load():
    """The loaded decode file, or None with the reason on the page."""
    if source == UPLOAD:
        with st.expander("Decode results file format"):
            st.markdown(
                "One JSON object as `python -m benchmarks decode --splits --ncu --out FILE` "
                "writes it: `\"schema\": \"ioaware.decode/1\"`, a `\"provenance\"` object "
                "(`gpu`, `date`, `peak_copy_bytes_per_s`: the copy bandwidth measured in the "
                "run) and `\"decode\"`, one object per case: `batch`, `heads_q`, `heads_kv`, "
                "`head_dim`, `seq_len_q`, `seq_len_k`, `dtype`, `kv_bytes`, `times_ms` "
                "(`{\"ioaware\": {\"ms\", \"kv_bandwidth_fraction\"}, \"sdpa-flash\": {...}, "
                "...}`), `ioaware_device_ms` (GPU time alone), `ratio_vs_fastest_sdpa`, and "
                "optionally `splits_ms` (`{\"1\": ms, \"2\": ms, ...}`) and `ncu` "
                f"(`dram__bytes_read.sum`). Files up to {data.MAX_UPLOAD_MB} MB are read.")
        up = st.file_uploader(f"Decode results file (JSON, up to {data.MAX_UPLOAD_MB} MB)",
                              type=["json"], key="dc_upload")
        if up is None:
            st.info("Upload a decode results file to compare it with the model.")
            return None
        if up.size > data.MAX_UPLOAD_MB * 10**6:
            st.warning(f"{up.name} is {up.size / 1e6:,.0f} MB; files up to "
                       f"{data.MAX_UPLOAD_MB} MB are read.")
            return None
        content, name = up.getvalue(), up.name
        try:
            return data.load_decode(content, name)
        except ValueError as exc:
            st.warning(f"The decode results file could not be read: {exc}")
            return None
    try:
        return data.load_decode_choice(source)
    except (ValueError, OSError) as exc:
        st.warning(f"The decode results file could not be read: {exc}")
        return None


def _show_case(case) -> None:
    """Set the workload above to a measured case (a button's callback)."""
    ss.update(dc_batch=int(case["batch"]), dc_heads_q=int(case["heads_q"]),
              dc_heads_kv=int(case["heads_kv"]), dc_head_dim=int(case["head_dim"]),
              dc_seq_len_q=int(case["seq_len_q"]), dc_seq_len_k=int(case["seq_len_k"]),
              dc_dtype=str(case["dtype"]), dc_splits=0)


def _fits_widgets(case) -> bool:
    return (int(case["head_dim"]) in ui.HEAD_DIMS and str(case["dtype"]) in ui.DTYPES
            and 1 <= int(case["batch"]) <= MAX_BATCH and int(case["heads_q"]) <= MAX_HEADS
            and int(case["heads_kv"]) <= MAX_HEADS
            and int(case["seq_len_q"]) <= limits["max_seqlen_q"]
            and int(case["seq_len_k"]) <= MAX_SEQ_LEN_K)


def _measured() -> None:
    if not choices and source != UPLOAD:
        st.info("No decode results file was found in `results/`: measure one on a GPU with "
                "`python -m benchmarks decode --splits --ncu --out FILE` and copy it there, or "
                "upload one (sidebar).")
        return
    loaded = _load()
    if loaded is None:
        return
    kinds = loaded["kinds"]
    date = f", {loaded['date']}" if loaded["date"] else ""
    st.caption(f"`{loaded['name']}`: measured on the {loaded['gpu']}{date}; "
               f"{loaded['n_decode']:,} decode case{'s' * (loaded['n_decode'] != 1)}"
               + (f" ({loaded['n_window']:,} sliding-window case"
                  f"{'s' * (loaded['n_window'] != 1)} too, not shown here)"
                  if loaded["n_window"] else "") + ".")
    if not loaded["n_decode"]:
        st.info(f"`{loaded['name']}` holds no decode records: nothing to compare with the "
                "model.")
        return
    if pred is not None and loaded["profile"] != pred["profile"]:
        other = (f"the {data.profile_label(loaded['profile'])} profile" if loaded["profile"]
                 else "no built-in profile")
        st.warning(f"These cases were measured on the {loaded['gpu']} ({other}); the model "
                   f"prices the {pred['gpu']}.")
        if loaded["profile"] is not None:
            st.button(f"Price on the {data.profile_label(loaded['profile'])} profile",
                      key="dc_use_profile",
                      on_click=lambda p=loaded["profile"]: ss.update(w_profile=p))
    try:
        res = data.decode_measured(loaded["digest"], profile, custom, rates, _loaded=loaded)
    except data.ResultsUnavailable as exc:
        st.warning(f"The file cannot be re-priced in this installation: {exc}")
        return
    except (ValueError, KeyError, TypeError) as exc:
        st.warning(f"Could not price the cases of this file: {data.plain_reason(exc)}")
        return
    cases = res["cases"]
    notes = [f"Each case re-priced by the plan the model picks today on the {res['gpu']} "
             f"profile, {data.rates_label(res['rates']).lower()}, as `python -m benchmarks "
             "decode --report` prices it; nothing is fitted on the file. The time error is "
             "against our GPU time alone."]
    missing = [what for kind, what in (
        ("device", "our GPU time alone (no time error)"),
        ("ncu", "Nsight Compute's DRAM bytes (no DRAM error)"),
        ("splits", "a split-count sweep (no best split count)")) if not kinds[kind]]
    if missing:
        notes.append("This file has no " + "; no ".join(missing) + ": those columns are "
                     "blank.")
    ui.table(cases, "decode-measured-cases", columns=data.decode_cases_columns(res["rates"]))
    st.caption(" ".join(notes))
    scores, score_cols = data.decode_summary_table(res["summary"])
    st.markdown("**How close the model is on this file**")
    ui.table(scores, "decode-model-scores", columns=score_cols)

    st.subheader("Split sweep: measured against predicted")
    swept = cases[cases["has_sweep"]]
    if swept.empty:
        st.info(f"`{loaded['name']}` has no split-count sweep (`python -m benchmarks decode "
                "--splits` times every split count): there is no measured time against "
                "splits to show.")
        return
    options = [str(i) for i in swept.index]
    here = [str(i) for i, c in swept.iterrows()
            if all(c[k] == workload[k] for k in workload)]
    if ss.get("dc_case") not in options:
        ss["dc_case"] = here[0] if here else options[0]
    chosen = int(st.selectbox(f"Case ({len(options)} with a split sweep)", options,
                              key="dc_case", format_func=lambda i: cases.loc[int(i), "label"]))
    case, sweep = cases.loc[chosen], res["sweeps"][chosen]
    m = st.columns(4)
    m[0].metric("The model's pick", f"{sweep['pick']:,} splits",
                delta=(f"measured {fmt.ms(sweep['pick_measured_ms'])}"
                       if sweep["pick_measured_ms"] else "not in the sweep"), delta_color="off")
    m[1].metric("The measured best", f"{sweep['best']:,} splits",
                delta=f"measured {fmt.ms(sweep['best_ms'])}", delta_color="off")
    m[2].metric("Lost by following the model",
                "not timed" if sweep["loss"] is None else fmt.signed_pct(sweep["loss"]))
    if sweep["one_ms"]:
        at, at_ms = ((f"the pick ({sweep['pick']:,})", sweep["pick_measured_ms"])
                     if sweep["pick_measured_ms"] else
                     (f"the best ({sweep['best']:,})", sweep["best_ms"]))
        m[3].metric("What split-KV bought, measured", fmt.ratio(sweep["one_ms"] / at_ms),
                    delta=f"1 split {fmt.ms(sweep['one_ms'])} → {at} {fmt.ms(at_ms)}",
                    delta_color="off")
    ui.chart(figures.decode_sweep(
        sweep["measured"], sweep["predicted"], pick=sweep["pick"], best=sweep["best"],
        pick_ms=sweep["pick_ms"], predicted_name=data.rates_label(res["rates"]).lower(),
        measured_name=f"measured on the {loaded['gpu']}",
        title=f"Time against splits: {case['label']}"),
        "decode-sweep")
    st.caption("Measured: our split-KV kernel (its last programs merge the splits) at each "
               "split count timed, GPU time alone. Predicted: the same plan at every split "
               "count, with its launch cost. Read the prediction for where the time falls and "
               "turns, which picks the splits.")
    if _fits_widgets(case) and not all(case[k] == workload[k] for k in workload):
        st.button("Show this case in the model above", key="dc_show_case",
                  on_click=_show_case, args=(case,))


_measured()
