"""Page 6 — Measure: run a measurement sweep on this machine's GPU and add it to the results.

The sweep is announced as taking minutes and runs with a progress bar that says about how long
is left. Without a CUDA GPU the page says so and shows how to measure elsewhere.
"""
from __future__ import annotations

import json
import time

import streamlit as st

from dashboard import data, fmt, ui

st.title("Measure")
st.caption("Time this project's kernels and PyTorch's SDPA backends on this machine's GPU, "
           "with hardware counters, and add the sweep to the results that *Predicted vs "
           "measured* compares.")

gpu = data.cuda_device()

if gpu is None:
    st.warning(
        "**No CUDA GPU was found on this machine**, so nothing can be measured here.\n\n"
        + (f"({data.cuda_probe_note()})\n\n" if data.cuda_probe_note() else "")
        + "To measure elsewhere: on a machine with an NVIDIA GPU, from the repository root, run "
        "the measurement command below; it writes a results file. Copy that file into this "
        "repository's `results/` directory (or set `IOAWARE_RESULTS` to its path), or load it "
        "on the *Predicted vs measured* page with the file picker."
    )
    st.code("pip install -e \".[torch]\"\n"
            "python -m benchmarks measure --help         # all options of the sweep\n"
            "python -m benchmarks measure --out results/my-gpu.json \\\n"
            "    --seq-lens 1024,2048,4096 --head-dims 64,128 --dtypes fp16 --passes fwd,bwd\n"
            "python -m benchmarks ncu --help             # optional: add hardware counters",
            language="bash")
    ui.results_format_help(key="measure")
    st.stop()

st.success(f"CUDA GPU found: **{gpu}**")
ui.results_format_help(key="measure")
harness, harness_err = data.import_measure()
if harness is None:
    st.warning(f"The measurement harness `{data.MEASURE_MODULE}` is not available in this "
               f"installation (`{harness_err}`), so the sweep cannot be started from here. Update "
               "the repository, or run `python -m benchmarks measure` once it is present.")
    st.stop()

with st.form("measure"):
    c1, c2, c3 = st.columns(3)
    seq_lens = c1.multiselect("Sequence lengths N", ui.SEQ_LENS[:8], default=[1024, 2048, 4096])
    head_dims = c2.multiselect("Head dims d", ui.HEAD_DIMS, default=[64, 128])
    dtypes = c3.multiselect("dtypes", ui.DTYPES, default=["fp16"])
    c1, c2, c3 = st.columns(3)
    batch = c1.number_input("Batch", 1, 64, 1)
    heads = c2.number_input("Heads", 1, 128, 16)
    causal = c3.multiselect("Causal", [False, True], default=[False, True])
    passes = st.multiselect("Passes", ui.PASSES[:2], default=["fwd", "bwd"])
    st.caption("A sweep takes minutes: every configuration (one of each combination chosen "
               "above) times each kernel with warm-up and repeats. While it runs, a progress bar "
               "shows the configurations done and about how long is left; the file is rewritten "
               "after every configuration, so an interrupted sweep keeps what it measured.")
    submitted = st.form_submit_button("Run sweep", type="primary")

if submitted:
    configs = data.measure_configs(tuple(seq_lens), tuple(head_dims), tuple(dtypes), int(batch),
                                   int(heads), tuple(causal), tuple(passes))
    if not configs:
        st.warning("Pick at least one value of each option.")
        st.stop()
    t0 = time.perf_counter()
    bar = st.progress(0.0, text=data.sweep_progress(0, len(configs), 0.0))

    def progress(done, total=len(configs), *_, **__):
        frac = min(1.0, float(done) / max(1, total))
        bar.progress(frac, text=data.sweep_progress(int(done), int(total),
                                                    time.perf_counter() - t0))

    path = data.new_results_path(gpu)
    try:  # the harness rewrites `path` after every configuration (an interrupted sweep resumes)
        results = harness.run_sweep(configs, progress=progress, out_path=path)
    except Exception as exc:  # noqa: BLE001 - a failed sweep is reported, not raised
        st.error(f"The sweep failed: {type(exc).__name__}: {exc}")
        st.stop()
    content = json.dumps(results, indent=1).encode()
    try:
        loaded = data.load_results_bytes(content, path.name)
    except data.format_error_types() as exc:
        st.error(f"The sweep produced a results file that does not validate: {exc}")
        st.stop()
    if not path.exists():
        path.write_bytes(content)
    st.success(f"Measured {len(loaded['records']):,} records in "
               f"{fmt.duration(time.perf_counter() - t0)}; "
               f"saved to `{path}`. Open *Predicted vs measured* to compare; add hardware "
               f"counters with `python -m benchmarks ncu`.")
    st.download_button("Results (JSON)", content, file_name=path.name, mime="application/json",
                       on_click="ignore")
