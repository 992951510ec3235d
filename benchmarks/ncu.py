"""Command ``ncu``: Nsight Compute counters for the records of a results file. It replays their
configurations under Nsight Compute.

``python -m benchmarks ncu RESULTS.json`` takes the records written by ``measure``, runs each
configuration once more in a child process under

    ncu --clock-control none --cache-control all --profile-from-start off --csv --page raw
        --print-units base --metrics <METRICS> python -m benchmarks ncu --child CONFIGS.json

and merges the counters, summed over every kernel launch of the configuration's pass, into the
records (the results file is rewritten after each chunk of configurations; records that already
carry counters are skipped, so the step is resumable):

* ``dram_read_bytes`` / ``dram_write_bytes`` — ``dram__bytes_read.sum`` / ``dram__bytes_write.sum``
  (the L2 is flushed before each kernel: ``--cache-control all``, so every kernel starts cold);
* ``l2_bytes`` — ``lts__t_bytes.sum`` (all traffic at the L2 slices' tag stage);
* ``global_load_bytes`` / ``global_store_bytes`` — ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum``
  / ``..._st.sum``: global-memory bytes the kernel's loads and stores request (L1 hits included),
  the papers' "HBM accesses" of a schedule; reductions and atomics go to ``global_atomic_bytes``;
* ``flops_executed`` — ``2 * FFMA + FADD + FMUL`` (float32, thread-level, predicated-on SASS
  instructions) ``+ 2 * HFMA + HADD + HMUL`` (half; a packed HFMA2 counts as one instruction, so
  packed half arithmetic is undercounted by half) ``+`` tensor-core FLOPs where the GPU exposes
  an ops counter for them (``sm__ops_path_tensor_*``, FLOPs per op measured on a float16 matrix
  product: `calibrate_tensor_ops`; else tensor work is counted in ``ncu_tensor_inst`` only and
  ``flops_tensor_counted`` is False).

The raw per-metric sums are kept as ``ncu_<metric>`` keys, the kernel names and per-launch
breakdown as ``ncu_kernels``, the fingerprint of the kernel code profiled as ``ncu_kernels_sha``.
Launches are attributed to configurations by a marker kernel (``ioaware_ncu_marker``) that the
child launches at the start of each configuration's profiled region; the launches between two
markers belong to the first one's configuration. Warm-up runs happen outside the profiled
region (``cudaProfilerStart``/``Stop``).

Which launches a record gets (`profiled_call`): the profiled region holds the marker and exactly
one call of the measured pass, the same ``run(0)`` that ``measure`` timed, and nothing else;
ncu profiles every kernel launched inside it, from any thread of the process (the autograd
engine launches a backward from its own thread), and no kernel outside it. There is no
kernel-name filter (no ``--kernel-name``, no ``--launch-skip``): the region is the selection,
as an NVTX range with ``--nvtx-include`` would be, so every kernel of every record is selected
the same way. That gives our kernels' records their forward, delta pre-pass, dQ fill and
dK/dV launches, and PyTorch's their whole call: SDPA FLASH ``pytorch_flash::flash_fwd_kernel``
(or the split-KV forward and its combine kernel), and in the backward
``flash_bwd_dot_do_o_kernel``, the zeroing of the float32 dQ accumulator,
``flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel`` and ``flash_bwd_convert_dq_kernel``; EFFICIENT
``fmha_cutlassF_*`` / ``fmha_cutlassB_*`` with their helper launches; cuDNN
``cudnn_generated_fort_native_sdpa_*`` fprop / bprop kernels with theirs; MATH and eager their
GEMMs and elementwise kernels. Copies made outside the call (the inputs, the forward that a
backward record differentiates) are outside the region. Memsets (``cudaMemsetAsync``) are not
kernels and are not profiled. `records_to_profile` picks the records (every record without
counters, optionally of the ``--kernels`` given); `backend_kernel_missing` warns when an SDPA
record's launches do not name its backend's kernel.

``--loads`` replays the selected records (``--variant``, ``--pass``; the same child, so the same
inputs and launches) with the global loads split into plain loads (``op_ld``: LDG) and
asynchronous global-to-shared copies (``op_ldgsts``: ``cp.async``), each as executed warp
instructions, requests, sectors and bytes, plus the L2 read sectors from L1, and writes the sums
with provenance to ``--out``; ``--show-loads FILE`` prints such a file (any machine). For the
tensor-core forward it also gives the breakdown of the load sectors (`mma_fwd_breakdown`).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import measure
from .common import (code_version, command_line, kernels_fingerprint, package_version, provenance,
                     write_json)

MARKER_NAME = "ioaware_ncu_marker"
#: Substrings of the names Nsight Compute lists for each SDPA backend's fused kernels (forward
#: or backward). Not a filter: `backend_kernel_missing` warns when none of a record's launches
#: carries one (e.g. a PyTorch build that dispatched to other kernels).
SDPA_KERNEL_NAMES = {
    "sdpa-flash": ("pytorch_flash::", "flash_fwd", "flash_bwd"),
    "sdpa-efficient": ("fmha_cutlassF", "fmha_cutlassB", "fmha_cutlass"),
    "sdpa-cudnn": ("cudnn_generated_fort_native_sdpa", "cudnn", "_sdpa_"),
}

#: Counters and how they map to results fields.
BYTE_METRICS = {
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "l2_bytes": "lts__t_bytes.sum",
    "global_load_bytes": "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "global_store_bytes": "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum",
}
#: Global reductions and atomics (e.g. float32 dQ accumulation) are neither loads nor stores to
#: ncu: summed into the extra field ``global_atomic_bytes``.
ATOMIC_METRICS = (
    "l1tex__t_bytes_pipe_lsu_mem_global_op_red.sum",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_atom.sum",
)
#: (metric, FLOPs per counted unit) summed into flops_executed.
FLOP_METRICS = {
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 2,
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": 1,
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": 1,
    "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum": 2,
    "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum": 1,
    "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum": 1,
}
#: Tensor-core "math ops" counters (HMMA and HGMMA together), FLOPs per op by
#: `calibrate_tensor_ops` (stored in the provenance as ``ncu.tensor_flops_per_op``).
TENSOR_OPS_METRICS = (
    "sm__ops_path_tensor_src_fp16.sum",
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
)
CALIBRATION_MNK = (2048, 2048, 2048)
TENSOR_INST_METRICS = (
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
)
EXTRA_METRICS = ("gpu__time_duration.sum",)
#: The ``--loads`` counters, by short name (those the GPU lacks are dropped, and said so).
LOAD_METRICS = {
    "ld_inst": "smsp__inst_executed_op_global_ld.sum",
    "ld_req": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "ld_sect": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "ld_bytes": "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum",
    "ldgsts_inst": "smsp__inst_executed_op_ldgsts.sum",
    "ldgsts_req": "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",
    "ldgsts_sect": "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
    "ldgsts_bytes": "l1tex__t_bytes_pipe_lsu_mem_global_op_ldgsts.sum",
    "ldgsts_sect_bypass": "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum",
    "ldgsts_sect_access": "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_access.sum",
    "l2_read_sect_from_tex": "lts__t_sectors_srcunit_tex_op_read.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
}
PROFILER_OPTIONS = ("--clock-control", "none", "--cache-control", "all", "--profile-from-start",
                    "off")


def wanted_metrics() -> list[str]:
    return (list(BYTE_METRICS.values()) + list(ATOMIC_METRICS) + list(FLOP_METRICS)
            + list(TENSOR_OPS_METRICS) + list(TENSOR_INST_METRICS) + list(EXTRA_METRICS))


def filter_available(metrics: list[str], query_output: str) -> list[str]:
    """The metrics whose base name (before the first ``.``: ``.sum``, ``.avg.pct_of_peak_...``)
    appears in ``ncu --query-metrics`` output."""
    names = {line.split()[0] for line in query_output.splitlines() if line.split()}
    return [m for m in metrics if m.split(".", 1)[0] in names]


def query_metrics(ncu: str = "ncu") -> str:
    return subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True,
                          timeout=120).stdout


def query_available(ncu: str = "ncu") -> list[str]:
    out = query_metrics(ncu)
    got = filter_available(wanted_metrics(), out)
    missing = [m for m in BYTE_METRICS.values() if m not in got]
    if missing:
        raise RuntimeError(f"ncu on this GPU lacks required metrics {missing}; query output "
                           f"began: {out[:400]!r}")
    return got


# ------------------------------------------------------------------------------------------------
# parsing ncu's CSV (pure)
# ------------------------------------------------------------------------------------------------

def _num(text: str) -> float | None:
    t = str(text).strip().replace(",", "")
    if t in ("", "n/a", "N/A"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw`` output as dicts ``{"id", "name", "metrics": {m: float}}``
    in launch order. Profiler chatter (``==PROF==`` lines) and the units row are skipped."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    body = "\n".join(ln for ln in lines[start:] if not ln.startswith("=="))
    reader = csv.reader(io.StringIO(body))
    header = next(reader)
    idx = {h: i for i, h in enumerate(header)}
    if "Kernel Name" not in idx:
        raise ValueError(f"ncu CSV has no 'Kernel Name' column: {header[:12]}")
    metric_cols = [h for h in header if "__" in h]
    rows = []
    for row in reader:
        if len(row) < len(header) or not row[idx["ID"]].strip():
            continue  # units row / short line
        ident = _num(row[idx["ID"]])
        if ident is None:
            continue
        rows.append({"id": int(ident), "name": row[idx["Kernel Name"]],
                     "metrics": {m: _num(row[idx[m]]) for m in metric_cols}})
    return rows


def split_by_marker(rows: list[dict], n_configs: int) -> list[list[dict]]:
    """Group kernel rows by the marker launched first in each configuration's region."""
    groups: list[list[dict]] = []
    for r in rows:
        if MARKER_NAME in r["name"]:
            groups.append([])
        elif groups:
            groups[-1].append(r)
    if len(groups) != n_configs:
        raise ValueError(f"found {len(groups)} marker launches in the ncu output for {n_configs} "
                         f"configurations; cannot attribute launches")
    return groups


def _sums(rows: list[dict]) -> dict:
    """Per metric, the sum over ``rows`` (None if any row lacks it)."""
    out = {}
    for m in sorted({m for r in rows for m in r["metrics"]}):
        vals = [r["metrics"].get(m) for r in rows]
        out[m] = None if any(v is None for v in vals) else sum(vals)
    return out


def aggregate(rows: list[dict], tensor_flops_per_op: float | None = None) -> dict:
    """Results-record fields from the kernel rows of one configuration (sums over launches).
    ``tensor_flops_per_op``: FLOPs per tensor "math op" (see `calibrate_tensor_ops`); None =
    tensor-core work is not added to ``flops_executed``."""
    if not rows:
        return {f: None for f in BYTE_METRICS} | {"flops_executed": None, "ncu_launches": 0}
    sums = _sums(rows)
    out: dict = {field: int(round(sums[m])) if sums.get(m) is not None else None
                 for field, m in BYTE_METRICS.items()}
    atom = [sums[m] for m in ATOMIC_METRICS if sums.get(m) is not None]
    out["global_atomic_bytes"] = int(round(sum(atom))) if atom else None
    flop_terms = [w * sums[m] for m, w in FLOP_METRICS.items() if sums.get(m) is not None]
    ops = [sums[m] for m in TENSOR_OPS_METRICS if sums.get(m) is not None]
    if tensor_flops_per_op is None:
        ops = []
    flops = sum(flop_terms) + (tensor_flops_per_op or 0.0) * sum(ops)
    tinst = [sums[m] for m in TENSOR_INST_METRICS if sums.get(m) is not None]
    out["flops_executed"] = int(round(flops)) if flop_terms else None
    out["flops_tensor_counted"] = bool(ops)
    out["ncu_tensor_inst"] = int(sum(tinst)) if tinst else None
    out["ncu_launches"] = len(rows)
    for m, v in sums.items():
        out["ncu_" + m] = None if v is None else (int(round(v)) if float(v).is_integer() else v)
    out["ncu_kernels"] = [
        {"name": r["name"][:160],
         **{f: r["metrics"].get(BYTE_METRICS[f]) for f in ("global_load_bytes", "global_store_bytes",
                                                           "dram_read_bytes", "dram_write_bytes")},
         "global_atomic_bytes": _launch_atomic_bytes(r),
         "time_ns": r["metrics"].get("gpu__time_duration.sum")}
        for r in rows]
    return out


def _launch_atomic_bytes(row: dict) -> float | None:
    """Global reduction and atomic bytes of one launch (None when ncu gave neither counter)."""
    vals = [row["metrics"].get(m) for m in ATOMIC_METRICS]
    vals = [v for v in vals if v is not None]
    return sum(vals) if vals else None


def backend_kernel_missing(kernel: str, rows: list[dict]) -> bool:
    """Whether the launches ``rows`` of an SDPA record of ``kernel`` (FLASH, EFFICIENT, cuDNN)
    lack every name of `SDPA_KERNEL_NAMES` for its backend; False for other kernels."""
    marks = SDPA_KERNEL_NAMES.get(kernel)
    if not marks:
        return False
    return not any(m in r["name"] for r in rows for m in marks)


def needs_counters(rec: dict) -> bool:
    return rec.get("global_load_bytes") is None and not rec.get("ncu_error")


def records_to_profile(records: list[dict], kernels: list[str] | None = None,
                       limit: int | None = None) -> list[dict]:
    """The records a run profiles, in file order: those without counters (`needs_counters`),
    of every kernel — ours, the SDPA backends, eager — or only of ``kernels`` (names of
    `benchmarks.measure.KERNELS`; an unknown name raises ValueError rather than selecting
    nothing), at most ``limit``."""
    if kernels is not None:
        unknown = [k for k in kernels if k not in measure.KERNELS]
        if unknown:
            raise ValueError(f"unknown kernel(s) {unknown}; choose from {', '.join(measure.KERNELS)}")
    todo = [r for r in records if needs_counters(r)
            and (kernels is None or r["kernel"] in kernels)]
    return todo[:limit]


def merge_counters(records: list[dict], configs: list[dict], groups: list[list[dict]],
                   tensor_flops_per_op: float | None = None, kernels_sha: str | None = None,
                   torch_version: str | None = None) -> int:
    """Write the aggregated counters of each group into the record with the same key (with the
    fingerprint of the kernel code profiled, ``ncu_kernels_sha``, and the torch version the
    call ran under, ``ncu_torch``: PyTorch's kernels are the baselines' code); returns how many.
    A group with no launch marks its record with ``ncu_error`` instead (nothing was profiled
    between its marker and the next). An SDPA record whose launches do not name its backend's
    kernel is merged, with a warning."""
    by_key = {measure.config_key(r): r for r in records}
    n = 0
    for cfg, rows in zip(configs, groups):
        rec = by_key.get(measure.config_key(cfg))
        if rec is None:
            continue
        if not rows:
            rec["ncu_error"] = "no kernel launch profiled in the configuration's region"
            continue
        if backend_kernel_missing(rec["kernel"], rows):
            print(f"[ncu] WARNING: {measure.describe(rec)}: none of its {len(rows)} launches names "
                  f"a {rec['kernel']} kernel ({', '.join(SDPA_KERNEL_NAMES[rec['kernel']])}): "
                  f"{', '.join(r['name'][:60] for r in rows)}", file=sys.stderr, flush=True)
        rec.update(aggregate(rows, tensor_flops_per_op))
        if kernels_sha is not None:
            rec["ncu_kernels_sha"] = kernels_sha
        if torch_version is not None:
            rec["ncu_torch"] = torch_version
        n += 1
    return n


# ------------------------------------------------------------------------------------------------
# the child: runs configurations inside ncu's profiled regions
# ------------------------------------------------------------------------------------------------

def _calibrate_child() -> int:
    """A float16 matrix product of known FLOPs inside one profiled region."""
    import torch
    m, n, k = CALIBRATION_MNK
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    a @ b
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    a @ b
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


def profiled_call(run, marker, synchronize, start, stop):
    """One configuration's profiled region: a warm-up call outside it (compilation, cuDNN
    plans, allocator growth), then inside ``start()``/``stop()`` (``cudaProfilerStart`` /
    ``Stop``) the marker launch and exactly one call ``run(0)``, synchronised before the region
    closes so that every launch of the call, from any thread, falls inside it. Returns the
    call's result."""
    run(0)
    synchronize()
    start()
    marker()
    res = run(0)
    synchronize()
    stop()
    return res


def _child(config_path: str) -> int:
    import numpy as np
    import torch
    from numba import cuda

    from .common import sdpa_context

    @cuda.jit
    def ioaware_ncu_marker(x):
        x[0] = x[0] + 1

    flag = cuda.to_device(np.zeros(1, "int32"))
    ioaware_ncu_marker[1, 1](flag)
    cuda.synchronize()
    configs = json.loads(Path(config_path).read_text())
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    t0 = time.perf_counter()
    for i, cfg in enumerate(configs):
        cfg = measure.normalize_config(cfg)
        sets = [measure.make_input_set(torch, cfg, torch.device("cuda"), gen)]
        with sdpa_context(cfg["kernel"]):
            run = measure.build_runner(cfg, sets)
            res = profiled_call(run, lambda: ioaware_ncu_marker[1, 1](flag), torch.cuda.synchronize,
                                torch.cuda.profiler.start, torch.cuda.profiler.stop)
        del res, run, sets
        torch.cuda.empty_cache()
        print(f"[ncu child {i + 1}/{len(configs)} {time.perf_counter() - t0:5.0f}s] "
              f"{measure.describe(cfg)}", file=sys.stderr, flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# the parent: chunks, ncu, merge
# ------------------------------------------------------------------------------------------------

def ncu_command(metrics: list[str], log_path: str, config_path: str, ncu: str = "ncu") -> list[str]:
    return [ncu, *PROFILER_OPTIONS, "--target-processes", "all", "--csv", "--page", "raw",
            "--print-units", "base", "--metrics", ",".join(metrics), "--log-file", log_path,
            sys.executable, "-m", "benchmarks", "ncu", "--child", config_path]


def ncu_version(ncu: str = "ncu") -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def calibrate_tensor_ops(metrics: list[str], ncu: str = "ncu") -> float | None:
    """FLOPs per tensor "math op" counted by ncu, from a float16 matrix product of 2 M N K FLOPs
    (None if the GPU has no tensor ops counter or the product ran off the tensor cores)."""
    ops_metrics = [m for m in metrics if m in TENSOR_OPS_METRICS]
    if not ops_metrics:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        log_path = os.path.join(tmp, "cal.csv")
        cmd = ncu_command(ops_metrics, log_path, "", ncu)[:-2] + ["--calibrate"]
        subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        rows = parse_ncu_csv(Path(log_path).read_text() if os.path.exists(log_path) else "")
    total = sum((r["metrics"].get(m) or 0.0) for r in rows for m in ops_metrics)
    if total <= 0:
        return None
    m, n, k = CALIBRATION_MNK
    return round(2.0 * m * n * k / total, 3)


def replay(configs: list[dict], metrics: list[str], ncu: str = "ncu", keep_logs=None,
           timeout=None) -> tuple[list[dict], int]:
    """Run the child under ncu on ``configs``: ncu's rows and the child's exit status."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, log_path = os.path.join(tmp, "configs.json"), os.path.join(tmp, "ncu.csv")
        Path(cfg_path).write_text(json.dumps(configs))
        proc = subprocess.run(ncu_command(metrics, log_path, cfg_path, ncu), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        sys.stderr.write(proc.stdout[-4000:])
        text = Path(log_path).read_text() if os.path.exists(log_path) else ""
    if keep_logs:
        with open(keep_logs, "a") as fh:
            fh.write(text)
    return parse_ncu_csv(text), proc.returncode


def profile_results(path: str, *, out_path: str | None = None, chunk: int = 40,
                    kernels: list[str] | None = None, limit: int | None = None,
                    time_budget_s: float | None = None, ncu: str = "ncu",
                    keep_logs: str | None = None, command: str = "") -> dict:
    """Add ncu counters to the records of the results file ``path`` (written to ``out_path``,
    default in place) that do not have them yet (`records_to_profile`: every kernel, or those
    of ``kernels``); returns the results object. ``provenance.ncu`` describes this run; the
    runs before it on the same file are kept in ``provenance.ncu_earlier``."""
    if shutil.which(ncu) is None:
        raise RuntimeError(f"{ncu!r} (Nsight Compute) is not on PATH")
    results = measure.load_existing(path)
    if results is None:
        raise FileNotFoundError(path)
    todo = records_to_profile(results["records"], kernels, limit)
    out_path = out_path or path
    metrics = query_available(ncu)
    prov = results["provenance"]
    factor = (prov.get("ncu") or {}).get("tensor_flops_per_op")
    if factor is None:
        factor = calibrate_tensor_ops(metrics, ncu)
    sha = kernels_fingerprint()
    torch_version = package_version("torch")
    if prov.get("ncu"):
        prov.setdefault("ncu_earlier", []).append(prov["ncu"])
    prov["ncu"] = {"version": ncu_version(ncu), "metrics": metrics, "tensor_flops_per_op": factor,
                   "command": command, "options": " ".join(PROFILER_OPTIONS),
                   "code_version": code_version(), "kernels_sha": sha, "torch": torch_version}
    if prov.get("kernels_sha") and prov["kernels_sha"] != sha:
        print(f"[ncu] WARNING: kernels/ changed since the timings were taken (timed "
              f"{prov['kernels_sha']}, now {sha}); records get ncu_kernels_sha so the comparison "
              f"can tell", file=sys.stderr)
    if (prov.get("torch") and prov["torch"] != torch_version
            and any(r["kernel"] != "ioaware-numba" for r in todo)):
        print(f"[ncu] WARNING: the baselines were timed under torch {prov['torch']} and are "
              f"profiled under torch {torch_version}, whose SDPA may run other kernels; each "
              f"record names its own in ncu_torch", file=sys.stderr)
    print(f"[ncu] {len(todo)} records to profile, metrics: {', '.join(metrics)}", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    for start in range(0, len(todo), chunk):
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            print("[ncu] time budget spent; stopping (resume later)", file=sys.stderr, flush=True)
            break
        part = todo[start:start + chunk]
        cfgs = [{f: r.get(f) for f in measure.KEY_FIELDS} for r in part]
        rows, rc = replay(cfgs, metrics, ncu, keep_logs)
        try:
            groups = split_by_marker(rows, len(cfgs))
        except ValueError as exc:
            # a child that died part-way: attribute what is attributable, mark the rest
            n_markers = sum(MARKER_NAME in r["name"] for r in rows)
            complete = max(0, n_markers - 1)
            print(f"[ncu] {exc} (child rc={rc}); keeping the first {complete} configurations",
                  file=sys.stderr, flush=True)
            groups = split_by_marker(rows, n_markers)[:complete] if n_markers else []
            if complete < len(part):
                part[complete]["ncu_error"] = f"child failed (rc={rc})"
        merge_counters(results["records"], cfgs[:len(groups)], groups, factor, sha, torch_version)
        write_json(results, out_path)
        print(f"[ncu] {min(start + chunk, len(todo))}/{len(todo)} records "
              f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    print(f"[ncu] {counters_summary(results['records'])}", file=sys.stderr, flush=True)
    return results


def counters_summary(records: list[dict]) -> str:
    """Per kernel, how many records carry counters (and how many were marked ``ncu_error``)."""
    per: dict = {}
    for r in records:
        c = per.setdefault(r["kernel"], [0, 0, 0])
        c[0] += 1
        c[1] += r.get("global_load_bytes") is not None
        c[2] += bool(r.get("ncu_error"))
    return "records with counters: " + ", ".join(
        f"{k} {have}/{n}" + (f" ({err} ncu_error)" if err else "")
        for k, (n, have, err) in per.items())


# ------------------------------------------------------------------------------------------------
# --loads: global loads by instruction kind
# ------------------------------------------------------------------------------------------------

def mma_fwd_breakdown(cfg: dict, c: dict) -> dict:
    """Load sectors of a tensor-core forward record ``cfg`` with summed counters ``c`` (keys of
    `LOAD_METRICS`): the Q fragment LDG instructions the kernel issues (per warp ``m-tiles x
    head_dim / 16 x 4`` LDG of 16-byte row segments, 8 sectors each), the other LDG (the
    schedule's uniform loads, 1 sector each), the sectors counted per cp.async instruction (512
    bytes moved = 16 sectors), the other LDG's share of all load sectors, and the load requests
    beyond one per LDG and cp.async instruction, per warp."""
    from kernels.mma_fwd import warp_m_tiles
    d, bq = cfg["head_dim"], cfg["block_q"]
    mt = warp_m_tiles(d, bq)
    warps = bq // (16 * mt)
    blocks = cfg["batch"] * cfg["heads"] * -(-cfg["seq_len_q"] // bq)
    q_inst = blocks * warps * mt * (d // 16) * 4
    other = c["ld_inst"] - q_inst
    per_async = (c["ld_sect"] - 8 * q_inst - other) / c["ldgsts_inst"]
    extra_req = (c["ld_req"] - c["ld_inst"] - c["ldgsts_inst"]) / (blocks * warps)
    return {"q_ldg_inst": q_inst, "other_ldg_inst": other,
            "sectors_per_cp_async": per_async, "other_ldg_share": other / c["ld_sect"],
            "requests_over_instructions_per_warp": extra_req}


LOADS_HEADER = (f"{'d':>4} {'causal':>6} {'N':>6} {'B*H':>5} | {'ld_sect':>12} {'ldgsts_inst':>12} "
                f"{'Q ldg':>9} {'other ldg':>9} {'sect/cp.async':>13} {'other share':>11} "
                f"{'req-inst/warp':>13}")


def _loads_row(r: dict) -> str:
    c = r["counters"]
    row = (f"{r['head_dim']:>4} {str(r['causal']):>6} {r['seq_len_q']:>6} "
           f"{r['batch'] * r['heads']:>5} | {c['ld_sect']:>12.0f} {c['ldgsts_inst']:>12.0f}")
    if r.get("variant") == "mma" and r["pass"] == "fwd":
        bd = mma_fwd_breakdown(r, c)
        row += (f" {bd['q_ldg_inst']:>9.0f} {bd['other_ldg_inst']:>9.0f} "
                f"{bd['sectors_per_cp_async']:>13.3f} {100 * bd['other_ldg_share']:>10.1f}% "
                f"{bd['requests_over_instructions_per_warp']:>13.2f}")
    return row


def show_loads(path) -> int:
    """Print a ``--loads`` file's rows (and the tensor-core forward's breakdown)."""
    doc = json.loads(Path(path).read_text())
    p = doc["provenance"]
    print(f"# {p.get('gpu')}  {p.get('date')}  ({p.get('command')})")
    print(LOADS_HEADER)
    for r in doc["records"]:
        print(_loads_row(r))
    return 0


def _replay_records(recs: list[dict], metrics: dict, ncu: str, timeout: float):
    """Replay ``recs`` (records of a results file) under Nsight Compute with ``metrics`` (short
    name -> ncu metric; those this GPU lacks are printed and left out): ``(configs, groups,
    missing)``, ``groups`` holding per configuration its launches as ``{"name", "metrics"}``
    with the short names."""
    configs = [{k: r[k] for k in measure.KEY_FIELDS if k in r} for r in recs]
    have = filter_available(list(metrics.values()), query_metrics(ncu))
    missing = [m for m in metrics.values() if m not in have]
    if missing:
        print("not on this GPU:", ", ".join(missing), flush=True)
    rows, rc = replay(configs, have, ncu, timeout=timeout)
    if rc:
        raise SystemExit(f"the profiled child failed (rc={rc})")
    short = {v: k for k, v in metrics.items()}
    groups = [[{"name": row["name"],
                "metrics": {short[m]: v for m, v in row["metrics"].items() if m in short}}
               for row in grp]
              for grp in split_by_marker(rows, len(configs))]
    return configs, groups, missing


def _profile_provenance(command: str, ncu: str, metrics: dict, missing: list) -> dict:
    """Provenance of a ``--loads`` / ``--stalls`` run: the machine's, the Nsight Compute
    version, the metrics asked for and those this Nsight Compute lacks."""
    return provenance(command, extra={"ncu": ncu_version(ncu), "metrics": metrics,
                                      "missing_metrics": missing})


def _write_profile(schema: str, records: list, metrics: dict, missing: list, ncu: str,
                   command: str, out) -> dict:
    """The document of a ``--loads`` / ``--stalls`` profile, with provenance (written to
    ``out`` when given)."""
    doc = {"schema": schema, "provenance": _profile_provenance(command, ncu, metrics, missing),
           "records": records}
    if out:
        write_json(doc, out)
        print("wrote", out)
    return doc


def profile_loads(path, *, variant="mma", pass_="fwd", out=None, ncu="ncu", command="") -> dict:
    """Replay the records of ``path`` of our kernel's ``variant`` and ``pass_`` with the
    `LOAD_METRICS` counters; prints a row per record, writes the file to ``out``."""
    source = json.loads(Path(path).read_text())["records"]
    recs = [r for r in source if r.get("variant") == variant and r.get("pass") == pass_]
    if not recs:
        raise SystemExit(f"no records with variant={variant!r} pass={pass_!r} in {path}")
    configs, groups, missing = _replay_records(recs, LOAD_METRICS, ncu, timeout=1800)
    out_recs = []
    print(LOADS_HEADER)
    for cfg, rec, grp in zip(configs, recs, groups):
        sums = {k: 0.0 for k in LOAD_METRICS}
        for row in grp:
            for m, val in row["metrics"].items():
                if val is not None:
                    sums[m] += val
        out_recs.append(dict(cfg, kernels=[r["name"] for r in grp], counters=sums,
                             global_load_bytes_recorded=rec.get("global_load_bytes")))
        print(_loads_row(out_recs[-1]), flush=True)
    return _write_profile("ioaware.ncu_loads/1", out_recs, LOAD_METRICS, missing, ncu, command,
                          out)


# ------------------------------------------------------------------------------------------------
# --stalls: where a kernel's time goes (pipes, occupancy, warp stalls), per launch
# ------------------------------------------------------------------------------------------------

#: Per launch: duration, tensor-pipe activity (``mma.sync`` is HMMA, ``wgmma`` GMMA), the XU
#: pipe's (the MUFU: ``ex2``, reciprocals) share of its peak, the ALU and FMA pipes' activity,
#: warp instructions executed (in all and per pipe) and SM cycles, issue-slot use, achieved
#: occupancy, registers, DRAM throughput, and the warp stall reasons (warps stalled per issued
#: instruction, by reason: their sum is the cycles between a warp's instructions).
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "mio_throttle",
                 "math_pipe_throttle", "wait", "not_selected", "selected", "lg_throttle",
                 "dispatch_stall", "no_instruction", "membar", "branch_resolving", "drain",
                 "sleeping", "tex_throttle", "imc_miss", "misc")
STALL_METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "hmma_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "gmma_pipe_pct": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
    "xu_pipe_pct": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "alu_pipe_pct": "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "fma_pipe_pct": "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    # warp instructions executed, in all and per pipe (ALU: integer and logic, conversions
    # such as cvt.rna.tf32; FMA: float32 arithmetic; XU: ex2 and other transcendentals)
    "inst_executed": "smsp__inst_executed.sum",
    "inst_alu": "sm__inst_executed_pipe_alu.sum",
    "inst_fma": "sm__inst_executed_pipe_fma.sum",
    "inst_xu": "sm__inst_executed_pipe_xu.sum",
    "inst_lsu": "sm__inst_executed_pipe_lsu.sum",
    "inst_hmma": "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "sm_cycles": "sm__cycles_elapsed.avg",
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "warps_active_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    **{f"stall_{r}": f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"
       for r in STALL_REASONS},
}
STALLS_HEADER = (f"{'kernel':<34} {'us':>8} {'tensor%':>7} {'xu%':>5} {'alu%':>5} {'issue%':>6} "
                 f"{'occ%':>5} {'inst/mma':>8} {'alu/mma':>7} "
                 f"{'regs':>4}"
                 f"  top stalls (warps per issued instruction)")


def _short_name(name: str) -> str:
    """A kernel's name without its template arguments, parameters and Numba's ABI tags."""
    base = name.split("(")[0].split("<")[0].split("[")[0].split()
    return base[-1].rsplit("::", 1)[-1][:34] if base else name[:34]


def _per_mma(m: dict, name: str) -> str:
    """Warp instructions ``name`` per tensor-pipe (HMMA) instruction, or "-" where either count
    is missing or there is no HMMA (files profiled before the instruction counts were)."""
    n, mma = m.get(name), m.get("inst_hmma")
    return f"{n / mma:.2f}" if n is not None and mma else "-"


def stall_row(k: dict) -> str:
    """One launch of a ``--stalls`` record as a table row."""
    m = k["metrics"]
    tensor = max((m.get(x) or 0.0) for x in ("hmma_pipe_pct", "gmma_pipe_pct"))
    stalls = sorted(((v, r[len("stall_"):]) for r, v in m.items()
                     if r.startswith("stall_") and v), reverse=True)[:4]
    return (f"{_short_name(k['name']):<34} {(m.get('duration_ns') or 0) / 1e3:>8.1f} "
            f"{tensor:>7.1f} {m.get('xu_pipe_pct') or 0:>5.1f} {m.get('alu_pipe_pct') or 0:>5.1f} "
            f"{m.get('issue_active_pct') or 0:>6.1f} "
            f"{m.get('warps_active_pct') or 0:>5.1f} {_per_mma(m, 'inst_executed'):>8} "
            f"{_per_mma(m, 'inst_alu'):>7} {m.get('registers') or 0:>4.0f}  "
            + ", ".join(f"{r} {v:.2f}" for v, r in stalls))


def show_stalls(path) -> int:
    """Print a ``--stalls`` file: per record, a row per launch."""
    doc = json.loads(Path(path).read_text())
    p = doc["provenance"]
    print(f"# {p.get('gpu')}  {p.get('date')}  ({p.get('command')})")
    for r in doc["records"]:
        print(f"\n{r['kernel']} {r.get('variant') or ''} {r['pass']} {r['dtype']} d={r['head_dim']} "
              f"N={r['seq_len_q']} B={r['batch']} H={r['heads']} causal={r['causal']}")
        print(STALLS_HEADER)
        for k in r["launches"]:
            print(stall_row(k))
    return 0


def profile_stalls(paths, *, kernels=None, pass_=None, dtype=None, out=None, ncu="ncu",
                   command="", add_to=None) -> dict:
    """Replay the records of ``paths`` (a results file or a list of them; those of ``kernels``,
    ``pass_`` and ``dtype`` where given) under Nsight Compute with `STALL_METRICS`, one row per
    launch (not summed); prints them and writes the file to ``out``."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    recs = [r for path in paths for r in json.loads(Path(path).read_text())["records"]
            if (not kernels or r.get("kernel") in kernels) and (not pass_ or r.get("pass") == pass_)
            and (not dtype or r.get("dtype") == dtype)]
    if not recs:
        raise SystemExit(f"no records of kernels={kernels} pass={pass_} dtype={dtype} in "
                         f"{', '.join(map(str, paths))}")
    configs, groups, missing = _replay_records(recs, STALL_METRICS, ncu, timeout=3000)
    out_recs = []
    for cfg, launches in zip(configs, groups):
        out_recs.append(dict(cfg, launches=launches))
        print(f"\n{cfg['kernel']} {cfg.get('variant') or ''} {cfg['pass']} {cfg['dtype']} "
              f"d={cfg['head_dim']} N={cfg['seq_len_q']} causal={cfg['causal']}")
        print(STALLS_HEADER)
        for k in launches:
            print(stall_row(k), flush=True)
    if add_to:
        return _add_to_profile(add_to, out_recs, missing, ncu, command)
    return _write_profile("ioaware.ncu_stalls/1", out_recs, STALL_METRICS, missing, ncu, command,
                          out)


def _add_to_profile(path, records: list, missing: list, ncu: str, command: str) -> dict:
    """Append ``records`` to the ``--stalls`` file ``path`` (rewritten in place); its
    provenance keeps the first run's and lists this one under ``added`` (command, date, code
    version, metrics)."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != "ioaware.ncu_stalls/1":
        raise SystemExit(f"{path} is not an ncu --stalls file (schema {doc.get('schema')!r})")
    this = _profile_provenance(command, ncu, STALL_METRICS, missing)
    if this.get("gpu") != doc["provenance"].get("gpu"):
        raise SystemExit(f"{path} was measured on {doc['provenance'].get('gpu')}, this run on "
                         f"{this.get('gpu')}: profile into a file of this GPU")
    doc["provenance"].setdefault("added", []).append(
        {k: this[k] for k in ("command", "date", "code_version", "kernels_sha", "sources_sha",
                              "metrics", "missing_metrics") if k in this})
    doc["records"] = list(doc["records"]) + records
    write_json(doc, path)
    print("added", len(records), "records to", path)
    return doc


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks ncu",
                                 description="Add Nsight Compute hardware counters to a results "
                                             "file (or, with --loads, split its global loads).")
    ap.add_argument("results", nargs="*", help="results file written by python -m benchmarks "
                    "measure (--stalls: one or more, their records profiled into one file)")
    ap.add_argument("--out", help="counters: write here instead of in place; --loads: the file "
                                  "to write")
    ap.add_argument("--chunk", type=int, default=40, help="configurations per ncu process")
    ap.add_argument("--kernels", help="comma list: only these kernels' records (default: every "
                                      "record without counters; names: %s)" % ", ".join(measure.KERNELS))
    ap.add_argument("--limit", type=int, help="profile at most this many records")
    ap.add_argument("--time-budget", type=float, help="stop starting chunks after this many seconds")
    ap.add_argument("--keep-logs", help="append ncu's raw CSV here")
    ap.add_argument("--ncu", default="ncu", help="the Nsight Compute command line tool")
    ap.add_argument("--loads", action="store_true",
                    help="split the global loads of the --variant / --pass records instead")
    ap.add_argument("--variant", default="mma", help="--loads: our kernel family (default mma)")
    ap.add_argument("--pass", dest="pass_", default=None,
                    help="--loads: pass (default fwd); --stalls: only this pass (default any)")
    ap.add_argument("--show-loads", metavar="FILE", help="print a --loads file and exit (no GPU)")
    ap.add_argument("--stalls", action="store_true",
                    help="per launch of the --kernels / --pass / --dtype records: duration, "
                         "tensor-pipe and issue activity, occupancy, warp stall reasons "
                         "(written to --out)")
    ap.add_argument("--dtype", help="--stalls: only records of this dtype (fp16, bf16, fp32)")
    ap.add_argument("--show-stalls", metavar="FILE", help="print a --stalls file and exit (no GPU)")
    ap.add_argument("--add-to", metavar="FILE", help="--stalls: append the records to this "
                    "--stalls file of the same GPU (its provenance lists this run) instead of "
                    "writing --out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--calibrate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.calibrate:
        return _calibrate_child()
    if args.child:
        return _child(args.child)
    if args.show_loads:
        return show_loads(args.show_loads)
    if args.show_stalls:
        return show_stalls(args.show_stalls)
    if not args.results:
        ap.error("give the results file")
    if len(args.results) > 1 and not args.stalls:
        ap.error("several results files: only with --stalls")
    results = args.results[0]
    command = command_line("ncu", argv)
    kernels = [k for k in args.kernels.split(",") if k] if args.kernels else None
    unknown = [k for k in kernels or () if k not in measure.KERNELS]
    if unknown:
        ap.error(f"--kernels: unknown kernel(s) {', '.join(unknown)}; choose from "
                 f"{', '.join(measure.KERNELS)}")
    if args.stalls:
        profile_stalls(args.results, kernels=kernels, pass_=args.pass_, dtype=args.dtype,
                       out=args.out, ncu=args.ncu, command=command, add_to=args.add_to)
        return 0
    if args.loads:
        profile_loads(results, variant=args.variant, pass_=args.pass_ or "fwd", out=args.out,
                      ncu=args.ncu, command=command)
        return 0
    profile_results(results, out_path=args.out, chunk=args.chunk,
                    kernels=kernels, limit=args.limit,
                    time_budget_s=args.time_budget, ncu=args.ncu, keep_logs=args.keep_logs,
                    command=command)
    return 0
