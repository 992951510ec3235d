"""Page 5 — Step through: a small attention problem walked tile by tile (forward or backward),
played like an animation, with one query row's online softmax (or, backward, its probabilities
recomputed from the logsumexp) in step with the walk."""
from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboard import charts, data, figures, fmt, ui, walk as wk
from dashboard.fmt import Col

SPEEDS = {0.5: "fast (2 steps/s)", 1.0: "normal (1 step/s)", 2.0: "slow (1 step / 2 s)"}
DEFAULT_ROW = 5          # 1-based; in the first Q tile, so that playing from step 1 shows it
ss = st.session_state

st.title("Step through")

sim, sim_err = data.import_sim()
if sim is None:
    st.error(f"The cost model could not be imported, so there is no trace to walk: `{sim_err}`")
    st.stop()


def _pause():
    ss["st_playing"] = False


sb = st.sidebar
sb.header("Problem")
schedule = sb.selectbox("Schedule", ["flash2", "flash1", "naive"], key="st_schedule",
                        format_func=data.schedule_label, on_change=_pause)
direction = sb.radio("Pass", ["forward", "backward"], key="st_direction", on_change=_pause,
                     horizontal=True,
                     help="Backward: dQ, dK and dV, with S and P recomputed tile by tile from "
                          "the logsumexp the forward saved.")
kind = sb.selectbox("Inputs", list(wk.INPUT_KINDS), key="st_inputs",
                    format_func=wk.INPUT_KINDS.get, on_change=_pause,
                    help="Seeded inputs. With drifting keys, later keys score higher, so the "
                         "running max of a row rises from tile to tile and the sum and output "
                         "computed so far must be rescaled (α < 1).")
causal = sb.checkbox("Causal", key="st_causal", on_change=_pause)
c1, c2 = sb.columns(2)
seq_len = c1.selectbox("Sequence length N", [32, 64, 128, 256], index=1, key="st_seq_len",
                       on_change=_pause)
head_dim = c2.selectbox("Head dim d", [8, 16, 32, 64], index=1, key="st_head_dim",
                        on_change=_pause)
block_q = c1.selectbox("Queries per tile", [8, 16, 32, 64], index=1, key="st_block_q",
                       on_change=_pause)
block_k = c2.selectbox("Keys per tile", [8, 16, 32, 64], index=1, key="st_block_k",
                       on_change=_pause)
ss.setdefault("st_row", DEFAULT_ROW)
if ss["st_row"] > seq_len:
    ss["st_row"] = seq_len
row1 = sb.number_input(f"Query row to follow (1–{seq_len})", min_value=1, max_value=seq_len,
                       step=1, key="st_row")
row = int(row1) - 1
block_q, block_k = min(block_q, seq_len), min(block_k, seq_len)
ss.setdefault("st_speed", 1.0)
sb.selectbox("Speed", list(SPEEDS), key="st_speed", format_func=SPEEDS.get)

walk_key = (schedule, seq_len, head_dim, block_q, block_k, causal, direction, "fp16")
try:
    walk = data.step_walk(*walk_key)
except ValueError as exc:
    st.warning(f"The cost model rejected this problem: {exc}")
    st.stop()
n_steps = walk.n_steps
x = data.step_inputs(seq_len, head_dim, kind)

whole = walk.tensor_table(n_steps)
reread = [f"{r['tensor']} {fmt.num(r['times read'], 2)}×" for _, r in whole.iterrows()
          if r["times read"] > 1.001]
total = int(walk.steps["read_bytes"].sum() + walk.steps["written_bytes"].sum())
summary = (f"{data.schedule_label(schedule)}, {direction}, N = {seq_len}, d = {head_dim}, tiles "
           f"of {block_q} queries × {block_k} keys: {n_steps} steps, {fmt.bytes_(total)} through "
           "global memory"
           + (f"; read more than once: {', '.join(reread)}" if reread else "") + ".")
if schedule != "naive":
    std = data.step_walk("naive", seq_len, head_dim, block_q, block_k, causal, direction, "fp16")
    std_total = int(std.steps["read_bytes"].sum() + std.steps["written_bytes"].sum())
    summary += (f" Standard attention moves {fmt.bytes_(std_total)} "
                f"({fmt.ratio(std_total / total)}), its N×N matrices included.")
st.caption("Which tiles are on chip, how many bytes each tensor has moved (re-reads counted), "
           "and what happens to one query row, step by step. The memory traffic is the cost "
           "model's own event trace; the row's numbers are computed here in float64. "
           + summary)

# -- playing: the fragment below reruns on a timer while playing ---------------------------------
ss.setdefault("st_step", 1)
ss.setdefault("st_playing", False)
if ss["st_step"] > n_steps:
    ss["st_step"] = n_steps
playing = bool(ss["st_playing"])
ss["_st_timer"] = playing


def _go(to):
    ss["st_playing"] = False
    ss["st_step"] = int(min(max(to, 1), n_steps))


def _toggle():
    if not ss["st_playing"] and ss["st_step"] >= n_steps:
        ss["st_step"] = 1                      # play again from the start
    ss["st_playing"] = not ss["st_playing"]


def _row_panel(step: int) -> None:
    """The followed row at ``step``: forward, its online softmax; backward, P recomputed."""
    m_tile = row // walk.block_q + 1
    if schedule == "naive":
        ex = wk.row_forward(walk, x, row)["exact"]
        st.subheader(f"Query row {row + 1}")
        st.markdown("Standard attention has no online softmax: it writes all N×N scores S to "
                    "memory, reads them back to take the softmax of whole rows, writes P, and "
                    "reads P again for O = PV"
                    + (" — and the backward reads the stored P back instead of recomputing it."
                       if direction == "backward" else ". Below, the row's final softmax."))
        ui.chart(figures.row_probabilities(ex["p"], ex["p"], ex["visible"]), "step-row-p",
                 downloads=False)
        return
    if direction == "forward":
        rf = wk.row_forward(walk, x, row)
        tiles, ex = rf["tiles"], rf["exact"]
        done = wk.step_at_row(tiles, step)
        st.subheader(f"Query row {row + 1}: the online softmax")
        _row_status(tiles, done, m_tile, step)
        last = tiles.iloc[done - 1] if done else None
        m = st.columns(5)
        m[0].metric("Running max m", fmt.num(last["m"], 4) if done else "−∞")
        m[1].metric("Running sum l", fmt.num(last["l"], 4) if done else "0")
        m[2].metric("Rescale α, last tile",
                    "—" if not done or pd.isna(last["alpha"]) else fmt.num(last["alpha"], 3),
                    help="α = exp(m_old − m_new): what the sum and the output accumulator "
                         "computed so far are multiplied by when a tile raises the row's max.")
        m[3].metric("Accumulator, dim 1", fmt.num(last["acc1"], 4) if done else "0",
                    help="The accumulator is Σ exp(s − m)·v over the keys seen, a vector of d "
                         "numbers, not yet divided by l; its first component is shown. The "
                         "output so far is accumulator / l.")
        seen = np.zeros(len(ex["s"]), dtype=bool)
        for n in tiles["k_tile"].iloc[:done]:
            seen[(int(n) - 1) * walk.block_k:min(int(n) * walk.block_k, walk.seq_len)] = True
        seen &= ex["visible"]
        seen_keys = int(seen.sum())
        m[4].metric("Keys seen", f"{seen_keys:,} of {int(ex['visible'].sum()):,}")
        if done:
            st.markdown(_explain_forward(last, done))
            st.markdown(_update_in_numbers(last))
        c1, c2 = st.columns(2)
        with c1:
            ui.chart(figures.row_scores(ex["s"], ex["visible"], seen, walk.block_k, tiles, done),
                     "step-row-scores", downloads=False)
        with c2:
            ui.chart(figures.row_vector(rf["o"][done - 1] if done else None, ex["o"],
                                        "output so far = accumulator / l",
                                        "exact softmax(S)·V", "The row's output (first dims)"),
                     "step-row-output", downloads=False)
        shown = tiles.iloc[:done].assign(
            m_old=lambda d: d["m_old"].where(np.isfinite(d["m_old"]), np.nan))
        if done:
            ui.table(shown, "step-row-tiles", columns={
            "step": Col("Step", "count"), "k_tile": Col("K/V tile", "count"), "keys": Col("Keys"),
            "tile_max": Col("Largest score in the tile", "num", digits=4),
            "m_old": Col("m before", "num", digits=4), "m": Col("m after", "num", digits=4),
            "alpha": Col("α = exp(m before − m after)", "num", digits=3),
            "l": Col("l after", "num", digits=4),
            "acc1": Col("Accumulator after, dim 1", "num", digits=4),
            "err": Col("max |output so far − exact|", "num", digits=2)}, download=False)
        if done == len(tiles) and len(tiles):
            err = data.tiled_row_error(x, row, walk.block_q, walk.block_k, causal, ex["o"])
            st.success(f"After the last tile the row's output equals the materialised "
                       f"softmax(S)·V to {tiles['err'].iloc[-1]:.1e}"
                       + (f"; the library's tiled float32 forward gives it to {err:.1e}."
                          if err is not None else "."))
    else:
        rb = wk.row_backward(walk, x, row)
        tiles, ex = rb["tiles"], rb["exact"]
        done = wk.step_at_row(tiles, step)
        st.subheader(f"Query row {row + 1}: P recomputed from the logsumexp")
        st.markdown(f"The forward saved one number for this row, its logsumexp L = m + log l = "
                    f"**{fmt.num(rb['lse'], 5)}**, not the row's N probabilities. Each tile of "
                    "the backward recomputes S = qKᵀ/√d and P = exp(S − L): the forward's "
                    "probabilities, with no running max and no rescaling, since L already holds "
                    "the final max and sum. Then dS = P∘(dP − D) and dQ += dS·K for this row.")
        _row_status(tiles, done, m_tile, step)
        last = tiles.iloc[done - 1] if done else None
        m = st.columns(3)
        m[0].metric("Tiles recomputed", f"{done} of {len(tiles)}")
        p_err = tiles["p_err"].iloc[:done].max() if done else None
        m[1].metric("max |P recomputed − P forward|",
                    "—" if p_err is None else "0 (identical)" if p_err == 0 else f"{p_err:.1e}")
        m[2].metric("max |dQ so far − final dQ|", f"{last['dq_err']:.2e}" if done else "—")
        p_now = np.where(np.isnan(rb["p"]), np.nan, rb["p"])
        seen = np.zeros(len(ex["s"]), dtype=bool)
        for n in tiles["k_tile"].iloc[:done]:
            seen[(int(n) - 1) * walk.block_k:min(int(n) * walk.block_k, walk.seq_len)] = True
        c1, c2 = st.columns(2)
        with c1:
            ui.chart(figures.row_probabilities(np.where(seen, p_now, np.nan), ex["p"],
                                               ex["visible"]), "step-row-p", downloads=False)
        with c2:
            ui.chart(figures.row_vector(rb["dq"][done - 1] if done else None, ex["dq"],
                                        "dQ row so far", "final dQ row", "The row's dQ (first dims)"),
                     "step-row-dq", downloads=False)


def _row_status(tiles: pd.DataFrame, done: int, m_tile: int, step: int) -> None:
    if tiles.empty:
        st.info("No tile of this row is computed in this walk.")
        return
    at = ", ".join(str(int(s)) for s in tiles["step"])
    if done == 0:
        c1, c2 = st.columns([4, 1])
        c1.info(f"No tile of this row is computed yet: its tiles (Q tile {m_tile}) come at "
                f"steps {at}.")
        c2.button(f"Jump to step {int(tiles['step'].iloc[0])}", key="st_jump",
                  on_click=_go, args=(int(tiles["step"].iloc[0]),))
    elif done < len(tiles):
        st.caption(f"{done} of this row's {len(tiles)} tiles done (steps {at}).")
    else:
        st.caption(f"All {len(tiles)} tiles of this row done (steps {at}): the numbers below "
                   "are final.")


def _update_in_numbers(last) -> str:
    """The tile's update of l and of the accumulator's first component, with its numbers."""
    n, tile_sum, pv1 = int(last["k_tile"]), fmt.num(last["tile_sum"], 4), fmt.num(last["pv1"], 4)
    if pd.isna(last["alpha"]):
        return (f"In numbers, tile {n}: l = Σ exp(s − m) = **{fmt.num(last['l'], 4)}**; "
                f"accumulator (dim 1) = Σ exp(s − m)·v = **{fmt.num(last['acc1'], 4)}**.")
    alpha = fmt.num(last["alpha"], 3)
    return (f"In numbers, tile {n}: l = α × l before + Σ exp(s − m) = {alpha} × "
            f"{fmt.num(last['l_old'], 4)} + {tile_sum} = **{fmt.num(last['l'], 4)}**; "
            f"accumulator (dim 1) = α × accumulator before + Σ exp(s − m)·v = {alpha} × "
            f"{fmt.num(last['acc1_old'], 4)} + {pv1} = **{fmt.num(last['acc1'], 4)}**; "
            f"output (dim 1) = accumulator / l = **{fmt.num(last['acc1'] / last['l'], 4)}**.")


def _explain_forward(last, done: int) -> str:
    n, keys = int(last["k_tile"]), last["keys"]
    if not np.isfinite(last["tile_max"]):
        return (f"**K/V tile {n}** (keys {keys}): the causal mask hides all of its keys from this "
                "row (the tile is computed for other rows of the Q tile), so nothing changes.")
    if done == 1:
        return (f"**K/V tile {n}** (keys {keys}) is this row's first: the running max starts at "
                f"its largest score, m = {fmt.num(last['m'], 4)}, and l sums exp(s − m) over "
                "its keys. Nothing was summed before, so nothing is rescaled.")
    if last["alpha"] < 1:
        return (f"**K/V tile {n}** (keys {keys}) has a larger score ({fmt.num(last['tile_max'], 4)}) "
                f"than the running max ({fmt.num(last['m_old'], 4)}), so the max rises. The sum "
                "and the output accumulator so far were computed against the old max: both are "
                f"multiplied by **α = exp({fmt.num(last['m_old'], 4)} − {fmt.num(last['m'], 4)}) = "
                f"{fmt.num(last['alpha'], 3)}** before this tile's terms are added. That "
                "correction is what lets the softmax run over tiles without ever holding the "
                "whole row.")
    return (f"**K/V tile {n}** (keys {keys}): its largest score ({fmt.num(last['tile_max'], 4)}) "
            f"is below the running max ({fmt.num(last['m'], 4)}), so the max stays and α = 1: "
            "this tile's terms are simply added.")


@st.fragment(run_every=float(ss["st_speed"]) if playing else None)
def walk_view():
    if bool(ss.get("st_playing")) != bool(ss.get("_st_timer")):
        st.rerun(scope="app")                  # play / pause pressed: start or stop the timer
    if ss.get("st_playing"):
        if ss["st_step"] >= n_steps:
            ss["st_playing"] = False
            st.rerun(scope="app")
        ss["st_step"] = min(n_steps, int(ss["st_step"]) + 1)
    with st.container(horizontal=True, vertical_alignment="center"):
        st.button("◀◀ First", key="st_first", on_click=_go, args=(1,))
        st.button("◀ Back", key="st_back", on_click=lambda: _go(ss["st_step"] - 1))
        st.button("▮▮ Pause" if ss["st_playing"] else "▶ Play", key="st_play", on_click=_toggle,
                  type="primary")
        st.button("Next ▶", key="st_next", on_click=lambda: _go(ss["st_step"] + 1))
        st.button("Last ▶▶", key="st_last", on_click=_go, args=(n_steps,))
    step = st.slider("Step", 1, max(2, n_steps), key="st_step", on_change=_pause,
                     disabled=n_steps < 2, label_visibility="collapsed")
    step = min(int(step), n_steps)
    cur = walk.steps.iloc[step - 1]
    where = []
    if not pd.isna(cur["q_tile"]):
        where.append(f"Q tile {int(cur['q_tile'])}")
    if not pd.isna(cur["k_tile"]):
        where.append(f"K/V tile {int(cur['k_tile'])}")
    st.markdown(f"#### Step {step} of {n_steps} · {cur['stage']}"
                + (f" · {' × '.join(where)}" if where else ""))
    st.markdown(cur["what"])
    st.caption(f"Memory traffic of this step: {cur['moves']}. So far {fmt.bytes_(cur['cum_read'])} "
               f"read and {fmt.bytes_(cur['cum_written'])} written, "
               f"{fmt.pct((cur['cum_read'] + cur['cum_written']) / max(1, total), 0)} of the "
               "walk's traffic.")
    tiles_fig, traffic_fig = charts.step_figures(walk_key, step, row)
    c1, c2 = st.columns([3, 2])
    with c1:
        ui.chart(tiles_fig, "step-tiles", downloads=False)
        st.caption("Left: each tensor's row blocks, orange if on chip at this step, blue if "
                   "moved before; n× counts how often the block has crossed global memory. "
                   "Right: tiles done (blue), computed now (orange), skipped by the causal mask "
                   "(grey); dotted: the followed row's Q tile.")
    with c2:
        ui.chart(traffic_fig, "step-traffic", downloads=False)
    with st.expander("Bytes per tensor so far"):
        ui.table(walk.tensor_table(step), "step-tensors", columns={
            "tensor": Col("Tensor"), "size": Col("Size", "bytes"), "read": Col("Read", "bytes"),
            "times read": Col("Times read", "ratio", "Bytes read ÷ the tensor's size."),
            "written": Col("Written", "bytes"),
            "times written": Col("Times written", "ratio", "Bytes written ÷ the tensor's size."),
            "added": Col("Atomic adds", "bytes")})
    with st.expander("Memory events of this step"):
        ui.table(wk.step_events(walk, step), "step-events", columns={
            "action": Col("Action"), "tensor": Col("Tensor"), "rows": Col("Rows"),
            "bytes": Col("Bytes", "bytes")})
    _row_panel(step)


walk_view()
