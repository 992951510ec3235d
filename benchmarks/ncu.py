"""Hardware counters for a results file: replays its configurations under Nsight Compute.

``python -m kernels.ncu RESULTS.json`` takes the records written by `kernels.measure`, runs each
configuration once more in a child process under

    ncu --clock-control none --cache-control all --profile-from-start off --csv --page raw
        --print-units base --metrics <METRICS> python -m kernels.ncu --child CONFIGS.json

and merges the counters, summed over every kernel launch of the configuration's pass, into the
records (the results file is rewritten after each chunk of configurations; records that already
carry counters are skipped, so the step is resumable):

* ``dram_read_bytes`` / ``dram_write_bytes`` — ``dram__bytes_read.sum`` / ``dram__bytes_write.sum``
  (the L2 is flushed before each kernel: ``--cache-control all``, so every kernel starts cold);
* ``l2_bytes`` — ``lts__t_bytes.sum`` (all traffic at the L2 slices' tag stage);
* ``global_load_bytes`` / ``global_store_bytes`` — ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum``
  / ``..._st.sum``: global-memory bytes the kernel's loads and stores request (L1 hits included),
  the papers' "HBM accesses" of a schedule;
* ``flops_executed`` — ``2 * FFMA + FADD + FMUL`` (float32, thread-level, predicated-on SASS
  instructions) ``+ 2 * HFMA + HADD + HMUL`` (half; a packed HFMA2 counts as one instruction, so
  packed half arithmetic is undercounted by half) ``+`` tensor-core FLOPs where the GPU exposes
  an ops counter for them (``sm__ops_path_tensor_*``; else tensor work is counted in
  ``ncu_tensor_inst`` only and ``flops_tensor_counted`` is False).

The raw per-metric sums are kept as ``ncu_<metric>`` keys, the kernel names and per-launch
breakdown as ``ncu_kernels`` (which kernels PyTorch really launches, e.g. for the MATH backend).

Launches are attributed to configurations by a marker kernel (``ioaware_ncu_marker``) that the
child launches at the start of each configuration's profiled region; the launches between two
markers belong to the first one's configuration. Warm-up runs happen outside the profiled
region (``cudaProfilerStart``/``Stop``).
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

from kernels import measure

MARKER_NAME = "ioaware_ncu_marker"

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
#: Tensor-core "math ops" counters (HMMA and HGMMA together). How many FLOPs one counted op is
#: is measured, not assumed: `calibrate_tensor_ops` profiles a float16 matrix product of known
#: FLOPs (2 M N K) and stores the ratio in the provenance (``ncu.tensor_flops_per_op``).
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


def wanted_metrics() -> list[str]:
    return (list(BYTE_METRICS.values()) + list(ATOMIC_METRICS) + list(FLOP_METRICS)
            + list(TENSOR_OPS_METRICS)
            + list(TENSOR_INST_METRICS) + list(EXTRA_METRICS))


def filter_available(metrics: list[str], query_output: str) -> list[str]:
    """The metrics whose base name (before ``.sum``) appears in ``ncu --query-metrics`` output."""
    names = set()
    for line in query_output.splitlines():
        parts = line.split()
        if parts:
            names.add(parts[0])
    return [m for m in metrics if m.rsplit(".", 1)[0] in names]


def query_available(ncu: str = "ncu") -> list[str]:
    out = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    got = filter_available(wanted_metrics(), out.stdout)
    required = list(BYTE_METRICS.values())
    missing = [m for m in required if m not in got]
    if missing:
        raise RuntimeError(f"ncu on this GPU lacks required metrics {missing}; query output began: "
                           f"{out.stdout[:400]!r} {out.stderr[:400]!r}")
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


def aggregate(rows: list[dict], tensor_flops_per_op: float | None = None) -> dict:
    """Results-record fields from the kernel rows of one configuration (sums over launches).
    ``tensor_flops_per_op``: FLOPs per tensor "math op" (see `calibrate_tensor_ops`); None =
    tensor-core work is not added to ``flops_executed``."""
    out: dict = {}
    if not rows:
        return {f: None for f in BYTE_METRICS} | {"flops_executed": None, "ncu_launches": 0}
    metrics = sorted({m for r in rows for m in r["metrics"]})
    sums = {}
    for m in metrics:
        vals = [r["metrics"].get(m) for r in rows]
        sums[m] = None if any(v is None for v in vals) else sum(vals)
    for field, m in BYTE_METRICS.items():
        out[field] = int(round(sums[m])) if sums.get(m) is not None else None
    atom = [sums[m] for m in ATOMIC_METRICS if sums.get(m) is not None]
    out["global_atomic_bytes"] = int(round(sum(atom))) if atom else None
    flops = 0.0
    have_flop = False
    for m, w in FLOP_METRICS.items():
        if sums.get(m) is not None:
            flops += w * sums[m]
            have_flop = True
    ops = [sums[m] for m in TENSOR_OPS_METRICS if sums.get(m) is not None]
    if tensor_flops_per_op is not None:
        flops += tensor_flops_per_op * sum(ops)
    else:
        ops = []
    tinst = [sums[m] for m in TENSOR_INST_METRICS if sums.get(m) is not None]
    out["flops_executed"] = int(round(flops)) if have_flop else None
    out["flops_tensor_counted"] = bool(ops)
    out["ncu_tensor_inst"] = int(sum(tinst)) if tinst else None
    out["ncu_launches"] = len(rows)
    for m, v in sums.items():
        out["ncu_" + m] = None if v is None else (int(round(v)) if float(v).is_integer() else v)
    out["ncu_kernels"] = [
        {"name": r["name"][:160],
         "global_load_bytes": r["metrics"].get(BYTE_METRICS["global_load_bytes"]),
         "global_store_bytes": r["metrics"].get(BYTE_METRICS["global_store_bytes"]),
         "dram_read_bytes": r["metrics"].get(BYTE_METRICS["dram_read_bytes"]),
         "dram_write_bytes": r["metrics"].get(BYTE_METRICS["dram_write_bytes"]),
         "time_ns": r["metrics"].get("gpu__time_duration.sum")}
        for r in rows]
    return out


def needs_counters(rec: dict) -> bool:
    return rec.get("global_load_bytes") is None and not rec.get("ncu_error")


def merge_counters(records: list[dict], configs: list[dict], groups: list[list[dict]],
                   tensor_flops_per_op: float | None = None, kernels_sha: str | None = None) -> int:
    """Write the aggregated counters of each group into the record with the same key (with the
    fingerprint of the kernel code profiled, ``ncu_kernels_sha``)."""
    by_key = {measure.config_key(r): r for r in records}
    n = 0
    for cfg, rows in zip(configs, groups):
        rec = by_key.get(measure.config_key(cfg))
        if rec is None:
            continue
        rec.update(aggregate(rows, tensor_flops_per_op))
        if kernels_sha is not None:
            rec["ncu_kernels_sha"] = kernels_sha
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


def _child(config_path: str) -> int:
    import torch
    from numba import cuda

    @cuda.jit
    def ioaware_ncu_marker(x):
        x[0] = x[0] + 1

    flag = cuda.to_device(__import__("numpy").zeros(1, "int32"))
    ioaware_ncu_marker[1, 1](flag)
    cuda.synchronize()
    configs = json.loads(Path(config_path).read_text())
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    t0 = time.perf_counter()
    for i, cfg in enumerate(configs):
        cfg = measure.normalize_config(cfg)
        sets = [measure._make_set(torch, cfg, torch.device("cuda"), gen)]
        with measure._sdpa_context(torch, cfg["kernel"]):
            run = measure.build_runner(cfg, sets)
            run(0)                       # compile / plan outside the profiled region
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            ioaware_ncu_marker[1, 1](flag)
            res = run(0)
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        del res, run, sets
        torch.cuda.empty_cache()
        print(f"[ncu child {i + 1}/{len(configs)} {time.perf_counter() - t0:5.0f}s] "
              f"{measure._describe(cfg)}", file=sys.stderr, flush=True)
    return 0


# ------------------------------------------------------------------------------------------------
# the parent: chunks, ncu, merge
# ------------------------------------------------------------------------------------------------

def ncu_command(metrics: list[str], log_path: str, config_path: str, ncu: str = "ncu") -> list[str]:
    return [ncu, "--clock-control", "none", "--cache-control", "all", "--profile-from-start", "off",
            "--target-processes", "all", "--csv", "--page", "raw", "--print-units", "base",
            "--metrics", ",".join(metrics), "--log-file", log_path,
            sys.executable, "-m", "kernels.ncu", "--child", config_path]


def ncu_version(ncu: str = "ncu") -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip().splitlines()[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def profile_results(path: str, *, out_path: str | None = None, chunk: int = 40,
                    kernels: list[str] | None = None, limit: int | None = None,
                    time_budget_s: float | None = None, ncu: str = "ncu",
                    keep_logs: str | None = None) -> dict:
    """Add ncu counters to the records of the results file ``path`` (written to ``out_path``,
    default in place) that do not have them yet; returns the results object."""
    if shutil.which(ncu) is None:
        raise RuntimeError(f"{ncu!r} (Nsight Compute) is not on PATH")
    results = measure.load_existing(path)
    if results is None:
        raise FileNotFoundError(path)
    out_path = out_path or path
    metrics = query_available(ncu)
    prov = results["provenance"]
    factor = prov.get("ncu", {}).get("tensor_flops_per_op") if isinstance(prov.get("ncu"), dict) else None
    if factor is None:
        factor = calibrate_tensor_ops(metrics, ncu)
    prov["ncu"] = {"version": ncu_version(ncu), "metrics": metrics, "tensor_flops_per_op": factor,
                   "command": "python -m kernels.ncu " + " ".join(sys.argv[1:]),
                   "options": "--clock-control none --cache-control all --profile-from-start off"}
    sha = measure.kernels_fingerprint()
    timed_sha = prov.get("kernels_sha")
    if timed_sha and timed_sha != sha:
        print(f"[ncu] WARNING: kernels/ changed since the timings were taken (timed {timed_sha}, "
              f"now {sha}); records get ncu_kernels_sha so the comparison can tell", file=sys.stderr)
    todo = [r for r in results["records"] if needs_counters(r)
            and (kernels is None or r["kernel"] in kernels)]
    if limit is not None:
        todo = todo[:limit]
    print(f"[ncu] {len(todo)} records to profile, metrics: {', '.join(metrics)}", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    for start in range(0, len(todo), chunk):
        if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            print("[ncu] time budget spent; stopping (resume later)", file=sys.stderr, flush=True)
            break
        part = todo[start:start + chunk]
        cfgs = [{f: r.get(f) for f in measure.KEY_FIELDS} for r in part]
        with tempfile.TemporaryDirectory() as tmp:
            cfg_path = os.path.join(tmp, "configs.json")
            log_path = os.path.join(tmp, "ncu.csv")
            Path(cfg_path).write_text(json.dumps(cfgs))
            proc = subprocess.run(ncu_command(metrics, log_path, cfg_path, ncu), text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            sys.stderr.write(proc.stdout[-4000:])
            text = Path(log_path).read_text() if os.path.exists(log_path) else ""
            if keep_logs:
                with open(keep_logs, "a") as fh:
                    fh.write(text)
        rows = parse_ncu_csv(text)
        try:
            groups = split_by_marker(rows, len(cfgs))
        except ValueError as exc:
            # a child that died part-way: attribute what is attributable, mark the rest
            n_markers = sum(MARKER_NAME in r["name"] for r in rows)
            print(f"[ncu] {exc} (child rc={proc.returncode}); keeping the first "
                  f"{max(0, n_markers - 1)} configurations", file=sys.stderr, flush=True)
            groups = split_by_marker(rows, n_markers) if n_markers else []
            complete = max(0, n_markers - 1)
            groups = groups[:complete]
            if complete < len(part):
                part[complete]["ncu_error"] = f"child failed (rc={proc.returncode})"
        merge_counters(results["records"], cfgs[:len(groups)], groups, factor, sha)
        measure.write_results(results, out_path)
        print(f"[ncu] {min(start + chunk, len(todo))}/{len(todo)} records "
              f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.ncu",
                                 description="Add Nsight Compute hardware counters to a results file.")
    ap.add_argument("results", nargs="?", help="results file written by python -m kernels.measure")
    ap.add_argument("--out", help="write here instead of in place")
    ap.add_argument("--chunk", type=int, default=40, help="configurations per ncu process")
    ap.add_argument("--kernels", help="comma list: only these kernels")
    ap.add_argument("--limit", type=int, help="profile at most this many records")
    ap.add_argument("--time-budget", type=float, help="stop starting chunks after this many seconds")
    ap.add_argument("--keep-logs", help="append ncu's raw CSV here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--calibrate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.calibrate:
        return _calibrate_child()
    if args.child:
        return _child(args.child)
    if not args.results:
        ap.error("give the results file")
    profile_results(args.results, out_path=args.out, chunk=args.chunk,
                    kernels=args.kernels.split(",") if args.kernels else None, limit=args.limit,
                    time_budget_s=args.time_budget, keep_logs=args.keep_logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
