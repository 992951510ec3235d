"""Page 2 — Block sizes: every legal tile configuration of one of our kernel families for the
sidebar's workload, priced by the model that picks the kernels' tiles (``sim.plans.choose``),
beside the times a tile sweep measured for the same configurations on a GPU: the model's pick,
the measured best, and the time lost by following the model."""
from __future__ import annotations

import streamlit as st

from dashboard import charts, data, fmt, ui

UPLOAD = "Upload a file of tile times…"
NO_SWEEP = "(none)"
NOT_MEASURED = "-"   # the measured-workload selector's entry for an unmeasured sidebar workload

st.title("Block sizes")
st.caption("Every tile shape (queries × keys per tile) the chosen kernel can run for the "
           "workload in the sidebar, each priced by the model that picks the kernels' tiles, "
           "beside the times measured for the same tiles on a GPU where a tile sweep has them. "
           "★ (solid outline) marks the model's pick, ◆ (dotted) the measured best.")

ui.require_sim()
for (family, pass_), why in data.NOT_A_TILE_PLANE.items():
    st.caption(f"Not drawn here: {data.tile_family_label(f'{family}/{pass_}')}, {why}.")
families = data.tile_families()
if not families:
    st.info("The model lists no kernel with tile configurations to compare.")
    st.stop()
sweeps = data.tile_sweep_choices()
#: The sequence length the page opens on when the file measured it (else its first workload).
OPEN_SEQ_LEN = 8192


def _load_shipped(name: str):
    try:
        return data.load_tile_sweep_choice(name), None
    except (ValueError, OSError) as exc:
        return None, str(exc)


def _measured_groups(name: str, family_key: str):
    """The workloads of ``family_key`` the shipped file ``name`` timed that the sidebar can
    show (empty when none, or when the file cannot be read)."""
    sweep = _load_shipped(name)[0] if name in sweeps else None
    if sweep is None:
        return None, data.tile_sweep_groups({"records": data.EMPTY_SWEEP}, family_key)
    groups = data.tile_sweep_groups(sweep, family_key)
    return sweep, groups[[ui.sidebar_takes(g) for _, g in groups.iterrows()]]


def _open_on_measured(name: str, family_key: str) -> None:
    """Set the sidebar to a workload ``name`` timed for ``family_key`` (the first at
    :data:`OPEN_SEQ_LEN`, else the first), and the GPU profile to the file's, unless the sidebar
    already shows one of its workloads. Runs before the sidebar is drawn (or in a callback)."""
    sweep, groups = _measured_groups(name, family_key)
    if groups is None or groups.empty or any(ui.sidebar_shows(g) for _, g in groups.iterrows()):
        return
    at = groups[groups["seq_len"] == OPEN_SEQ_LEN]
    group = (at if not at.empty else groups).iloc[0]
    ui.set_workload(group, profile=sweep["profile"])
    st.session_state["bs_opened_on"] = (data.group_label(group), sweep["name"], sweep["profile"])


def _family_changed() -> None:
    # another kernel: the shipped file that timed it, on one of its measured workloads
    family_key, name = st.session_state["bs_family"], st.session_state.get("bs_sweep")
    if name not in sweeps or _measured_groups(name, family_key)[1].empty:
        other = next((n for n in sweeps if not _measured_groups(n, family_key)[1].empty), None)
        if other is not None:
            st.session_state["bs_sweep"] = name = other
            st.session_state["bs_switched_to"] = other
    _open_on_measured(name, family_key)


def _sweep_changed() -> None:
    _open_on_measured(st.session_state["bs_sweep"], st.session_state["bs_family"])


# -- what the page opens on: the first kernel a shipped tile sweep measured, on a workload of it --
if st.session_state.get("bs_sweep") not in sweeps + [UPLOAD, NO_SWEEP]:
    st.session_state["bs_sweep"] = sweeps[0] if sweeps else NO_SWEEP
if st.session_state.get("bs_family") not in families:
    measured_families = [f for f in families if st.session_state["bs_sweep"] in sweeps
                         and not _measured_groups(st.session_state["bs_sweep"], f)[1].empty]
    st.session_state["bs_family"] = (measured_families or families)[0]
if not st.session_state.get("bs_opened"):
    st.session_state["bs_opened"] = True
    _open_on_measured(st.session_state["bs_sweep"], st.session_state["bs_family"])

w = ui.workload_sidebar(show_pass=False, show_density=False)

c1, c2, c3 = st.columns(3)
family_key = c1.selectbox("Kernel", families, key="bs_family", format_func=data.tile_family_label,
                          on_change=_family_changed,
                          help="The kernels whose legal tile configurations the model lists; "
                               "the model picks their default tiles. A kernel a shipped file "
                               "timed opens on that file and one of its workloads.")
source = c2.selectbox("Measured tile times", sweeps + [UPLOAD, NO_SWEEP], key="bs_sweep",
                      on_change=_sweep_changed,
                      help="A tile sweep: every legal tile configuration timed on a GPU "
                           "(`python -m benchmarks pick` writes one).")
rates, rates_name = ui.rates_picker(c3, upload_key="bs_rates_upload",
                                    profile=w["profile"])

sweep, sweep_error = None, None
if source == UPLOAD:
    with st.expander("Tile times file format"):
        st.markdown(
            "One JSON object, as `python -m benchmarks pick` writes it: `\"schema\": "
            "\"ioaware.pick/1\"`, a `\"provenance\"` object whose `\"gpu\"` names the GPU (it "
            "picks the model's profile) and `\"records\"`, one object per timed configuration: "
            "the workload (`family` (`mma`, `tf32`, `wgmma`, `simt`), `pass` (`fwd`, `bwd`), "
            "`dtype`, `head_dim`, `causal`, `seq_len`, `batch`, `heads`), `config` "
            "(`{\"block_q\": 128, \"block_k\": 64}`) and `time_ms` (milliseconds), or, for a "
            "configuration that did not run, `time_ms: null` with `refused` or `failed` "
            f"giving the reason. Files up to {data.MAX_UPLOAD_MB} MB are read.")
        example = data.example_tile_sweep_json()
        if example:
            st.download_button("Download an example file (JSON)", example,
                               file_name="tile-times-example.json", mime="application/json",
                               key="dl-example-tiles", on_click="ignore",
                               help="One workload of a shipped file of tile times, its times "
                                    "measured on the GPU it names.")
    up = st.file_uploader(f"File of tile times (JSON, up to {data.MAX_UPLOAD_MB} MB)",
                          type=["json"], key="bs_upload")
    if up is not None:
        if up.size > data.MAX_UPLOAD_MB * 10**6:
            sweep_error = (f"{up.name} is {up.size / 1e6:,.0f} MB; files up to "
                           f"{data.MAX_UPLOAD_MB} MB are read")
        else:
            try:
                sweep = data.load_tile_sweep(up.getvalue(), up.name)
            except ValueError as exc:
                sweep_error = str(exc)
elif source != NO_SWEEP:
    sweep, sweep_error = _load_shipped(source)
if sweep_error:
    st.warning(f"The measured tile times could not be read: {sweep_error}")

# -- the measured workloads of the file, to jump to --------------------------------------------
groups = data.tile_sweep_groups(sweep, family_key) if sweep is not None else None
if groups is not None and not groups.empty:
    reachable = groups[[ui.sidebar_takes(g) for _, g in groups.iterrows()]]
    here = [str(i) for i, g in reachable.iterrows() if ui.sidebar_shows(g)]
    st.session_state["bs_group"] = here[0] if here else NOT_MEASURED

    def _jump(rows=reachable):
        chosen = st.session_state.get("bs_group", NOT_MEASURED)
        if chosen != NOT_MEASURED:
            ui.set_workload(rows.loc[int(chosen)])

    st.selectbox(f"Workloads measured in this file ({len(reachable)})",
                 [NOT_MEASURED] + [str(i) for i in reachable.index], key="bs_group",
                 on_change=_jump,
                 format_func=lambda i: ("the sidebar's workload (not measured in this file)"
                                        if i == NOT_MEASURED else
                                        data.group_label(reachable.loc[int(i)])),
                 help="Sets the sidebar to a workload the file timed.")
switched = st.session_state.pop("bs_switched_to", None)
opened = st.session_state.pop("bs_opened_on", None)
if switched and not opened:
    st.caption(f"Measured tile times from `{switched}`, which times this kernel.")
if opened:
    on = f" on the {data.profile_label(opened[2])} profile" if opened[2] else ""
    st.caption(f"Opened on {opened[0]}{on}, a workload measured in `{opened[1]}`: change it "
               "here or in the sidebar.")

# -- the model ----------------------------------------------------------------------------------
family, _, pass_ = family_key.partition("/")
plane = data.tile_plane(family, pass_, seq_len=w["seq_len"], head_dim=w["head_dim"],
                        batch=w["batch"], heads=w["heads"], dtype=w["dtype"], causal=w["causal"],
                        profile=w["profile"], custom=w["custom"], window=w["window"], rates=rates,
                        rates_name=rates_name)
if plane["rates_error"]:
    st.warning(f"The rates file was not used ({plane['rates_error']}); the model prices with the "
               "datasheet rates.")
if plane["refused"]:
    st.warning(f"{data.tile_family_label(family_key)} does not run this workload: "
               f"{plane['refused']}.")
    st.stop()

# -- the measured times -------------------------------------------------------------------------
measured = None
if sweep is not None:
    found = data.measured_tiles(sweep, family_key, seq_len=w["seq_len"], head_dim=w["head_dim"],
                                batch=w["batch"], heads=w["heads"], dtype=w["dtype"],
                                causal=w["causal"], window=w["window"])
    if found.empty:
        listed = groups is not None and not groups.empty
        what = ("no sweep times a sliding window" if w["window"] else
                "pick one of its measured workloads above" if listed else
                "it times other kernels")
        st.info(f"`{sweep['name']}` has no times of this kernel for this workload; {what}.")
    elif sweep["profile"] is not None and sweep["profile"] == plane["profile"]:
        measured = found
    else:
        st.warning(f"These tile times were measured on the {sweep['gpu']}; the model is pricing "
                   f"the {plane['gpu']}. They are not overlaid unless you ask.")
        b1, b2 = st.columns(2)
        if sweep["profile"] is not None:
            b1.button(f"Price on the {data.profile_label(sweep['profile'])} profile",
                      key="bs_use_profile",
                      on_click=lambda p=sweep["profile"]: st.session_state.update(w_profile=p))
        if b2.checkbox("Compare with the measured times anyway", key="bs_anyway"):
            measured = found
verdict = data.tile_verdict(plane, measured) if measured is not None else None

# -- what the page says -------------------------------------------------------------------------
pick = (int(plane["pick"]["block_q"]), int(plane["pick"]["block_k"]))
predicted = f"predicted from {plane['rates']}"
m = st.columns(4)
m[0].metric("The model's pick", data.tiles_label(*pick))
m[1].metric(f"Predicted ({plane['rates']})", fmt.ms(plane["pick_ms"]))
if verdict is not None:
    m[2].metric("The measured best", data.tiles_label(*verdict["best"]))
    m[3].metric("Lost by following the model",
                "not timed" if verdict["loss"] is None else fmt.pct(verdict["loss"]))
    st.markdown(f"**{verdict['text']}**")
else:
    m[2].metric("Legal tile configurations", f"{plane['n_legal']:,}")
notes = []
if plane["ties"]:
    others = ", ".join(data.tiles_label(c["block_q"], c["block_k"]) for c in plane["ties"])
    notes.append(f"{data.tiles_label(*pick)} ties with {others} at {fmt.ms(plane['pick_ms'])} "
                 "predicted; on a tie the model takes the larger tiles.")
if plane["partial"]:
    notes.append("Some legal configurations do not fit one SM of this GPU (blank cells); the "
                 "pick is the fastest of the rest.")
source_text = (f"{ui.rates_source(rates, plane['rates_name'])}, datasheet figures where it has "
               "none" if plane["rates"] == "measured rates" else
               "the GPU's published peak bandwidths and throughputs")
notes.append(f"The model's times are {predicted} ({source_text}), not measured.")
if verdict is not None and verdict["ratio_mid"] is not None:
    notes.append(f"Here they are {verdict['ratio_lo']:.2f}–{verdict['ratio_hi']:.2f}× the "
                 "measured ones: read the left map for its order, which picks the tiles, not "
                 "for its values.")
if verdict is not None and verdict["not_legal"]:
    notes.append(f"Measured but not a legal configuration of the model for this workload: "
                 f"{', '.join(verdict['not_legal'])}.")

best = verdict["best"] if verdict is not None else None
key = (family_key, tuple(sorted((k, v) for k, v in w.items() if k != "custom")), w["custom"],
       plane["rates"], rates_name, hash(rates) if rates else None,
       sweep["digest"] if measured is not None else None)
ui.chart(charts.tile_figure(
    key, plane["cells"], measured, pick, best,
    predicted_title=f"Predicted from {plane['rates']} (ms)",
    measured_title=f"Measured on the {sweep['gpu']} (ms)" if measured is not None else None,
    title=(f"{data.tile_family_label(family_key)}: {data.group_label(w)}"
           + (f", window {w['window']:,}" if w["window"] else ""))),
    "block-sizes")
st.caption(" ".join(notes))
table, columns = data.tile_table(plane, measured)
ui.table(table, "block-sizes-configurations", columns=columns)
