"""Layout pieces shared by the dashboard's pages: the workload sidebar, charts and tables with
their download buttons (tables formatted with units, downloads with the raw numbers), the results
format description, and the guard that explains a missing cost model instead of a traceback.

Nothing here computes model numbers; that is `dashboard.data`.
"""
from __future__ import annotations

import importlib.util
import inspect
import re

import pandas as pd
import streamlit as st

from dashboard import data, fmt
from dashboard.fmt import Col

__all__ = ["workload_sidebar", "chart", "table", "require_sim", "slug", "results_format_help",
           "show_problems", "set_workload", "sidebar_shows", "sidebar_takes", "rates_picker",
           "profile_sidebar"]

_HAS_KALEIDO = importlib.util.find_spec("kaleido") is not None

# Sequence lengths offered by the N slider (powers of two, the usual sweep points).
SEQ_LENS = [2**k for k in range(7, 17)]  # 128 .. 65536
HEAD_DIMS = [32, 64, 96, 128, 256]
DTYPES = ["fp16", "bf16", "fp32"]
PASSES = ["fwd", "bwd", "fwd+bwd"]

# Widget keys of the sidebar controls, with their defaults. Values persist across pages.
WORKLOAD_DEFAULTS = {
    "w_seq_len": 4096,
    "w_head_dim": 64,
    "w_batch": 1,
    "w_heads": 16,
    "w_dtype": "fp16",
    "w_pass": "fwd",
    "w_causal": False,
    "w_density": 1.0,
    "w_window": 0,
    "w_profile": None,  # filled with the first profile (h100 when present)
    "w_l2": "analytic",
}


def slug(text: str) -> str:
    """File-name-safe form of ``text`` (``"Block sizes: time"`` -> ``"block-sizes-time"``)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "figure"


def require_sim():
    """Return the imported cost model, or show why it is unavailable and stop the page."""
    sim, err = data.import_sim()
    if sim is None:
        st.error(
            "The cost model could not be imported, so this page has nothing to show.\n\n"
            f"`{err}`\n\nInstall the project (`pip install -e \".[dashboard]\"`) from the "
            "repository root and start the app from there."
        )
        st.stop()
    return sim


def _keep_state(keys) -> None:
    # A widget's value is dropped from st.session_state on a run where the widget is not drawn
    # (e.g. on a page without the sidebar); re-assigning it keeps it across page switches.
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


#: Choices of a page kept while other pages are open (the block-size page's kernel, measured
#: file and rates: the rates are every page's, :func:`rates_picker`; the scaling page's file;
#: the decoding page's workload and file).
PAGE_KEYS = ("bs_family", "bs_sweep", "bs_rates", "sc_source", "dc_batch", "dc_heads_q",
             "dc_heads_kv", "dc_head_dim", "dc_seq_len_q", "dc_seq_len_k", "dc_dtype", "dc_splits",
             "dc_source")


def keep_workload_state() -> None:
    """Keep the sidebar's workload values (and the choices of :data:`PAGE_KEYS`) alive on pages
    that do not draw them."""
    _keep_state(list(WORKLOAD_DEFAULTS) + list(data.CUSTOM_PROFILE_FIELDS_KEYS) + list(PAGE_KEYS))


#: Sidebar keys of the workload fields a measured group names.
_GROUP_KEYS = {"seq_len": "w_seq_len", "head_dim": "w_head_dim", "batch": "w_batch",
               "heads": "w_heads", "dtype": "w_dtype", "causal": "w_causal"}


def sidebar_takes(group) -> bool:
    """Whether the sidebar's controls can express a measured workload (``group``: its N, head
    dim, batch, heads, dtype)."""
    return (int(group["seq_len"]) in SEQ_LENS and int(group["head_dim"]) in HEAD_DIMS
            and str(group["dtype"]) in DTYPES and 1 <= int(group["batch"]) <= 512
            and 1 <= int(group["heads"]) <= 256)


def sidebar_shows(group) -> bool:
    """Whether the sidebar's workload (as set now, defaults where unset) is ``group``, with no
    sliding window."""
    state = st.session_state
    return (int(state.get("w_window", WORKLOAD_DEFAULTS["w_window"])) == 0
            and all(str(state.get(key, WORKLOAD_DEFAULTS[key])) == str(group[field])
                    for field, key in _GROUP_KEYS.items()))


def set_workload(group, profile: str | None = None) -> None:
    """Set the sidebar to a measured workload (no sliding window), and to ``profile`` when
    given; call before the sidebar is drawn in a run, or from a widget's callback."""
    for field, key in _GROUP_KEYS.items():
        value = group[field]
        st.session_state[key] = (bool(value) if field == "causal" else
                                 str(value) if field == "dtype" else int(value))
    st.session_state["w_window"] = 0
    if profile is not None:
        st.session_state["w_profile"] = profile


def workload_sidebar(*, show_pass: bool = True, show_density: bool = True,
                     seq_len_help: str | None = None) -> dict:
    """Draw the workload and GPU-profile controls in the sidebar; return the chosen values.

    The returned dict is plain and hashable-friendly (ints, floats, strings, and the custom
    profile as a tuple of ``(field, value)`` pairs) so it can key ``st.cache_data``.
    """
    for key, default in WORKLOAD_DEFAULTS.items():
        if key not in st.session_state:
            st.session_state[key] = default
    sb = st.sidebar
    sb.header("Workload")
    sb.select_slider("Sequence length N", options=SEQ_LENS, key="w_seq_len",
                     format_func=lambda n: f"{n:,}", help=seq_len_help)
    sb.select_slider("Head dim d", options=HEAD_DIMS, key="w_head_dim")
    c1, c2 = sb.columns(2)
    c1.number_input("Batch", min_value=1, max_value=512, step=1, key="w_batch")
    c2.number_input("Heads", min_value=1, max_value=256, step=1, key="w_heads")
    c1, c2 = sb.columns(2)
    c1.selectbox("dtype", DTYPES, key="w_dtype")
    if show_pass:
        c2.selectbox("Pass", PASSES, key="w_pass", format_func=data.PASS_LABELS.get)
    sb.checkbox("Causal", key="w_causal")
    sb.number_input("Sliding window (keys; 0 = none)", min_value=0, max_value=1 << 20, step=256,
                    key="w_window",
                    help="Local attention: each query sees this many keys before it (and, without "
                         "causal, after it): window_size (w, 0) with causal, (w, w) without. Only "
                         "the band's tiles are visited.")
    if show_density:
        sb.slider("Block-mask density", min_value=0.05, max_value=1.0, step=0.05, key="w_density",
                  help="Fraction of (Q tile, K tile) pairs computed (block-sparse attention). "
                       "1.0 = dense.")
    profile, custom = profile_sidebar(sb)
    return {
        "seq_len": int(st.session_state["w_seq_len"]),
        "head_dim": int(st.session_state["w_head_dim"]),
        "batch": int(st.session_state["w_batch"]),
        "heads": int(st.session_state["w_heads"]),
        "dtype": st.session_state["w_dtype"],
        "pass_": st.session_state["w_pass"] if show_pass else "fwd",
        "causal": bool(st.session_state["w_causal"]),
        "density": float(st.session_state["w_density"]) if show_density else 1.0,
        "window": int(st.session_state["w_window"]),
        "profile": profile,
        "custom": custom,
    }


def profile_sidebar(sb) -> tuple:
    """Draw the GPU-profile controls (a "GPU" header, the profile, and the custom profile's
    fields when it is chosen) in ``sb``; return ``(profile, custom)``, ``custom`` the custom
    profile as a tuple of ``(field, value)`` pairs or None. The choice is every page's
    (``w_profile``)."""
    profiles = data.profile_names()
    if st.session_state.get("w_profile") not in profiles + [data.CUSTOM]:
        st.session_state["w_profile"] = data.default_profile_name()
    sb.header("GPU")
    profile = sb.selectbox("Profile", profiles + [data.CUSTOM], key="w_profile",
                           format_func=data.profile_label)
    return profile, (_custom_profile_inputs(sb) if profile == data.CUSTOM else None)


DATASHEET = "GPU datasheet"
#: The rates choice that follows the GPU profile: the rates file named for that GPU
#: (``data.DEFAULT_RATES_FILES``, ``data.rates_for_profile``), the datasheet where there is
#: none. Every page's default.
MEASURED_HERE = "Measured on this GPU"
UPLOAD_RATES = "Upload a rates file…"
#: The widget key of the rates every page prices with (one choice, shared by the pages).
RATES_KEY = "bs_rates"


def rates_source(content: bytes | None, name: str) -> str:
    """A rates file as the pages name it: ``"rates_h100_2026-11-24.json, 2026-11-24"`` (the
    file and the day its provenance gives)."""
    date = data.rates_provenance(content)["date"]
    base = name.replace("\\", "/").rsplit("/", 1)[-1] or "uploaded file"
    return f"{base}, {date}" if date else base


def rates_picker(container, *, upload_key: str, profile: str | None = None
                 ) -> tuple[bytes | None, str]:
    """The "Rates the model prices with" choice, drawn in ``container`` with a caption saying
    what the predicted times come from: the rates measured on the chosen GPU (``profile``) by
    ``python -m benchmarks rates`` where a file in ``results/`` has them (the default), the
    GPU's datasheet figures, a named rates file or an uploaded one. Returns ``(rates file bytes
    or None, its name)``; the choice is shared by every page."""
    here = data.rates_for_profile(profile)
    choices = [MEASURED_HERE, DATASHEET] + data.rates_choices() + [UPLOAD_RATES]
    if st.session_state.get(RATES_KEY) not in choices:
        st.session_state[RATES_KEY] = MEASURED_HERE

    def label(choice: str) -> str:
        if choice == MEASURED_HERE:
            return (f"{MEASURED_HERE} ({here.rsplit('/', 1)[-1]})" if here else
                    f"{MEASURED_HERE} (none here: datasheet)")
        return choice

    choice = container.selectbox(
        "Rates the model prices with", choices, key=RATES_KEY, format_func=label,
        help="The rates `python -m benchmarks rates` measured on the chosen GPU (the file named "
             "for it in results/; the datasheet where there is none), the GPU's datasheet figures "
             "(peak rates, which real kernels do not reach), a given rates file, or your own.")
    content, name, why = None, "", ""
    if choice == UPLOAD_RATES:
        container.caption(
            "A rates file is what `python -m benchmarks rates --out FILE` writes on a GPU: "
            "JSON with `schema` \"ioaware.rates/1\", `provenance` (at least `gpu`, `date`) "
            "and `rates`: {name: {`value`, `unit`, `how`}} for any of the names the model "
            "prices with (`dram_copy_bytes_per_s`, `l2_read_bytes_per_s`, "
            "`smem_read_bytes_per_s_per_sm`, `mma_fp16_flops_per_s`, `ffma_flops_per_s`, "
            "`ex2_ops_per_s`, `kernel_launch_s`, ...); a rate it lacks comes from the datasheet.")
        example = data.rates_for_profile("h100")
        if example is not None:
            container.download_button("Example: the H100's rates file",
                                      data.rates_choice_bytes(example),
                                      file_name=example.rsplit("/", 1)[-1],
                                      mime="application/json", key=f"{upload_key}_example")
        up = container.file_uploader("Rates file (JSON)", type=["json"], key=upload_key)
        if up is not None:
            if up.size > data.MAX_UPLOAD_MB * 10**6:
                why = f"{up.name} is over {data.MAX_UPLOAD_MB} MB"
            else:
                content, name = up.getvalue(), up.name
        else:
            why = "no file uploaded yet"
    elif choice == MEASURED_HERE and here is None:
        why = "no rates file was measured on this GPU"
    elif choice != DATASHEET:
        name = here if choice == MEASURED_HERE else choice
        try:
            content = data.rates_choice_bytes(name)
        except OSError as exc:
            st.warning(f"The rates file could not be read: {exc}")
            content, name = None, ""
    if content is not None:
        gpu = data.rates_provenance(content)["gpu"]
        other = (profile and profile != data.CUSTOM and gpu
                 and data.profile_for_gpu(gpu) not in (None, profile))
        container.caption(
            f"Predicted from measured rates ({rates_source(content, name)})"
            + (f", measured on the {gpu}, not this GPU: the datasheet rates are used" if other
               else ""))
    else:
        container.caption("Predicted from datasheet rates" + (f" ({why})" if why else ""))
    return content, name


def rates_note(rates: str, rates_name: str, error: str | None,
               content: bytes | None = None) -> str:
    """One sentence on the rates a page's predicted times come from (``content``: the rates
    file's bytes, for its date)."""
    if error:
        return (f"The rates file was not used ({error}): the times are predicted from the "
                "datasheet rates, peaks real kernels do not reach.")
    if rates == "measured rates":
        return (f"Predicted times come from measured rates ({rates_source(content, rates_name)};"
                " datasheet figures where it has none).")
    return ("Predicted times come from the GPU's datasheet rates: peaks real kernels do not "
            "reach, so measured times are longer.")


def _custom_profile_inputs(container) -> tuple:
    """Number inputs for a user-given GPU; returns ``((field, value), ...)`` in the model's
    units."""
    with container.expander("Custom GPU", expanded=True):
        values = []
        for field in data.CUSTOM_PROFILE_FIELDS:
            key = "w_custom_" + field.name
            if key not in st.session_state:
                st.session_state[key] = field.default
            st.number_input(f"{field.label} ({field.unit})", min_value=field.minimum,
                            step=field.step, key=key, help=field.help)
            values.append((field.name, float(st.session_state[key])))
    return tuple(values)


def chart(fig, name: str, *, key: str | None = None, downloads: bool = True) -> None:
    """Show a Plotly figure with a download button (self-contained HTML; PNG if kaleido is
    installed). The figure's own toolbar also saves a PNG in the browser."""
    key = key or slug(name)
    st.plotly_chart(fig, key=f"chart-{key}", config={"displaylogo": False,
                                                      "toImageButtonOptions": {"filename": key}})
    if not downloads:
        return
    with st.container(horizontal=True):
        st.download_button(
            "Download chart (HTML)",
            data=lambda fig=fig: fig.to_html(include_plotlyjs=True, full_html=True),
            file_name=f"{key}.html", mime="text/html", key=f"dl-html-{key}", on_click="ignore",
        )
        if _HAS_KALEIDO:
            st.download_button(
                "Download chart (PNG)", data=lambda fig=fig: fig.to_image(format="png", scale=2),
                file_name=f"{key}.png", mime="image/png", key=f"dl-png-{key}", on_click="ignore",
            )


# -- tables ----------------------------------------------------------------------------------------
_UNIT_FORMATS = {"ms": ("ms", "%.3g"), "ratio": ("×", "%.3g"), "pct": ("%", "%.1f"),
                 "signed_pct": ("%", "%+.1f")}
#: Tables of at most this many rows show times, ratios and percentages as text (read, not
#: sorted: "—" where there is no value); longer ones keep them numeric, to sort by.
SMALL_TABLE = 50


def _plain(x: float, kind: str) -> str:
    if pd.isna(x):
        return "—"
    if kind == "signed_pct":
        return f"{'+' if x > 0 else '−' if x < 0 else ''}{abs(x):,.1f}"
    if kind == "pct":
        return f"{x:,.1f}"
    return fmt.num(x, 3)


# right-aligned text columns where this Streamlit can (numbers with units are text there)
_RIGHT = ({"alignment": "right"} if "alignment" in inspect.signature(
    st.column_config.TextColumn).parameters else {})


def formatted(df: pd.DataFrame, columns: dict[str, Col] | None, *, static: bool = False
              ) -> tuple[pd.DataFrame, dict, pd.DataFrame]:
    """``(display frame, column_config, CSV frame)`` of ``df`` under ``columns`` (``{column:
    Col}``, in display order; None: every column as it is). Bytes and FLOPs are shown with a
    unit per cell, times, ratios and percentages with theirs in the header (as text in tables of
    at most ``SMALL_TABLE`` rows, as sortable numbers in longer ones); the CSV keeps the raw
    numbers, headers with their units.

    ``static``: the frame is drawn whole by ``st.table``, which ignores ``column_config`` and
    prints integers bare (``65536``), so counts become text with separators (``"65,536"``)
    there; in the grid they stay numbers, formatted by their column."""
    if columns is None:
        return df, {}, df
    cols = [c for c in columns if c in df]
    small = len(df) <= SMALL_TABLE
    disp = pd.DataFrame(index=df.index)
    csv = pd.DataFrame(index=df.index)
    config = {}
    for c in cols:
        spec = columns[c]
        s = df[c]
        if spec.kind in ("bytes", "flops"):
            # one unit per cell ("8.65 MB" next to "1.64 GB"): the columns span decades
            v = pd.to_numeric(s, errors="coerce").astype(float)
            show = fmt.bytes_ if spec.kind == "bytes" else fmt.flops
            label = spec.label
            disp[label] = [show(x) for x in v]
            config[label] = st.column_config.TextColumn(label, help=spec.help, **_RIGHT)
            csv[f"{spec.label} ({'bytes' if spec.kind == 'bytes' else 'FLOP'})"] = s
        elif spec.kind in _UNIT_FORMATS:
            unit, printf = _UNIT_FORMATS[spec.kind]
            v = pd.to_numeric(s, errors="coerce").astype(float)
            scale = 100.0 if spec.kind in ("pct", "signed_pct") else 1.0
            label = f"{spec.label} ({unit})"
            if small:   # read, not sorted: text, "—" where there is no value
                disp[label] = [_plain(x * scale, spec.kind) for x in v]
                config[label] = st.column_config.TextColumn(label, help=spec.help, **_RIGHT)
            else:
                disp[label] = v * scale
                config[label] = st.column_config.NumberColumn(label, help=spec.help, format=printf)
            csv[label] = v * scale
        elif spec.kind == "count":
            label = spec.label
            if static:
                disp[label] = [fmt.count(x) for x in pd.to_numeric(s, errors="coerce")]
                config[label] = st.column_config.TextColumn(label, help=spec.help, **_RIGHT)
            else:
                disp[label] = pd.to_numeric(s, errors="coerce")
                config[label] = st.column_config.NumberColumn(label, help=spec.help,
                                                              format="localized")
            csv[label] = s
        elif spec.kind == "num":
            label = spec.label
            disp[label] = [fmt.num(x, spec.digits) for x in pd.to_numeric(s, errors="coerce")]
            config[label] = st.column_config.TextColumn(label, help=spec.help, **_RIGHT)
            csv[label] = s
        elif spec.kind == "bool":
            label = spec.label
            disp[label] = s.map(lambda b: "—" if b is None or (isinstance(b, float) and b != b)
                                else "yes" if bool(b) else "no")
            config[label] = st.column_config.TextColumn(label, help=spec.help)
            csv[label] = s
        else:
            label = spec.label
            disp[label] = s.astype(object).where(s.notna(), "—").astype(str)
            config[label] = st.column_config.TextColumn(label, help=spec.help)
            csv[label] = s
    return disp.reset_index(drop=True), config, csv.reset_index(drop=True)


#: Tables of at most this many rows are drawn whole (``st.table``: every column, wrapped text,
#: nothing to scroll); longer ones in the scrollable, sortable grid (``st.dataframe``).
STATIC_TABLE = 12
_TABLE_HIDES_INDEX = "hide_index" in inspect.signature(st.table).parameters


def table(df: pd.DataFrame, name: str, *, columns: dict[str, Col] | None = None,
          key: str | None = None, csv: pd.DataFrame | None = None, height=None,
          download: bool = True) -> None:
    """Show a table formatted by ``columns`` (see :func:`formatted`) with a CSV download of the
    raw numbers (``csv``: another frame to download instead, e.g. with every column)."""
    key = key or slug(name)
    static = len(df) <= STATIC_TABLE and columns is not None and any(c in df for c in columns)
    disp, config, raw = formatted(df, columns, static=static)
    if static:
        if _TABLE_HIDES_INDEX:
            st.table(disp, hide_index=True)
        else:
            st.table(disp.set_index(disp.columns[0]))
    else:
        kwargs = {"height": height} if height else {}
        st.dataframe(disp, key=f"table-{key}", hide_index=True, column_config=config, **kwargs)
    if download:
        out = raw if csv is None else csv
        st.download_button("Download table (CSV)", data=lambda out=out: out.to_csv(index=False),
                           file_name=f"{key}.csv", mime="text/csv", key=f"dl-csv-{key}",
                           on_click="ignore")


# -- results files ---------------------------------------------------------------------------------
def results_format_help(*, expanded: bool = False, key: str = "format") -> None:
    """The results-file format (from the schema), with a downloadable example file."""
    try:
        rec, prov, schema = data.results_format()
    except data.ResultsUnavailable as exc:
        st.warning(f"The results format cannot be described here: {exc}")
        return
    with st.expander("Results file format", expanded=expanded):
        st.markdown(
            f"One JSON object: `\"schema\": \"{schema}\"`, a `\"provenance\"` object (where and "
            "how it was measured) and `\"records\"`, a list with one object per measured "
            "configuration. Null means *not measured*; keys beyond these are kept and ignored. "
            f"Files up to {data.MAX_UPLOAD_MB} MB are accepted. `python -m benchmarks measure` "
            "writes such files.")
        st.markdown("**Each record**\n\n| field | type | null allowed | meaning |\n|---|---|---|---|\n"
                    + "\n".join(f"| `{r.field}` | {r.type} | {r._3} | {r.meaning} |"
                                for r in rec.itertuples()))
        st.markdown("**Provenance** (every field a string; more fields are kept)\n\n"
                    "| field | meaning |\n|---|---|\n"
                    + "\n".join(f"| `{r.field}` | {r.meaning} |" for r in prov.itertuples()))
        try:
            example = data.example_results_json()
        except Exception as exc:  # noqa: BLE001 - the description stands without the example
            st.caption(f"(No example file: {type(exc).__name__}: {exc})")
            return
        st.download_button(
            "Download an example file (JSON)", example, file_name="results-example.json",
            mime="application/json", key=f"dl-example-{key}", on_click="ignore",
            help="Two records in the format, their numbers computed by the cost model, not "
                 "measured: a template to fill, and a file this page accepts.")


def show_problems(name: str, exc) -> None:
    """An error box listing every problem of an invalid results file (at most
    ``data.MAX_PROBLEMS``), record problems first."""
    problems = getattr(exc, "problems", None)
    if not problems:
        st.error(f"**{name}** is not a valid results file:\n\n{exc}")
        return
    total = getattr(exc, "total", len(problems))
    lines = "\n".join(f"- **{p.where}**: {p.what}" for p in problems)
    more = (f"\n\n… and {total - len(problems):,} more problem{'s' * (total - len(problems) != 1)}"
            if total > len(problems) else "")
    st.error(f"**{name}** is not a valid results file ({total:,} problem"
             f"{'s' * (total != 1)}):\n\n{lines}{more}")
