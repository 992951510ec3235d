"""Global loads of a results file's configurations split by instruction kind (Nsight Compute).

    python -m kernels.ncu_loads RESULTS.json [--variant mma] [--pass fwd] [--out FILE.json]

`kernels.ncu` records ``global_load_bytes`` as ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum``.
To explain where such bytes come from, this replays the selected records (same child process as
`kernels.ncu`, so the same inputs and launches) under ``ncu --clock-control none`` with the load
counters split into plain loads (``op_ld``: LDG) and asynchronous global-to-shared copies
(``op_ldgsts``: ``cp.async``), each as executed warp instructions, requests, sectors and bytes,
plus the L2 read sectors from L1. It prints one row per record (counters summed over the
record's launches) and writes the raw sums with provenance to ``--out``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels import measure
from kernels.ncu import (MARKER_NAME, filter_available, ncu_version, parse_ncu_csv,
                         split_by_marker)

#: Counters, by short name (those the GPU lacks are dropped, and said so).
METRICS = {
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.ncu_loads", description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--variant", default="mma")
    ap.add_argument("--pass", dest="pas", default="fwd")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", default="ncu")
    args = ap.parse_args(argv)

    recs = [r for r in json.loads(Path(args.results).read_text())["records"]
            if r.get("variant") == args.variant and r.get("pass") == args.pas]
    if not recs:
        raise SystemExit(f"no records with variant={args.variant!r} pass={args.pas!r}")
    configs = [{k: r[k] for k in measure.KEY_FIELDS if k in r} for r in recs]
    query = subprocess.run([args.ncu, "--query-metrics"], capture_output=True, text=True,
                           timeout=120).stdout
    have = filter_available(list(METRICS.values()), query)
    missing = [m for m in METRICS.values() if m not in have]
    if missing:
        print("not on this GPU:", ", ".join(missing), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        cfg_path, log_path = Path(tmp) / "configs.json", Path(tmp) / "ncu.csv"
        cfg_path.write_text(json.dumps(configs))
        cmd = [args.ncu, "--clock-control", "none", "--cache-control", "all",
               "--profile-from-start", "off", "--csv", "--page", "raw", "--print-units", "base",
               "--metrics", ",".join(have), "--log-file", str(log_path),
               sys.executable, "-m", "kernels.ncu", "--child", str(cfg_path)]
        subprocess.run(cmd, check=True, timeout=1800)
        rows = parse_ncu_csv(log_path.read_text())
    groups = split_by_marker(rows, len(configs))
    short = {v: k for k, v in METRICS.items()}
    out_recs = []
    print(f"{'d':>4} {'causal':>6} {'N':>6} {'B*H':>5} | " + " ".join(f"{k:>14}" for k in METRICS))
    for cfg, rec, grp in zip(configs, recs, groups):
        sums = {k: 0.0 for k in METRICS}
        names = []
        for row in grp:
            if row["name"].startswith(MARKER_NAME):
                continue
            names.append(row["name"])
            for m, val in row["metrics"].items():
                if m in short and val is not None:
                    sums[short[m]] += val
        out_recs.append(dict(cfg, kernels=names, counters=sums,
                             global_load_bytes_recorded=rec.get("global_load_bytes")))
        print(f"{cfg['head_dim']:>4} {str(cfg['causal']):>6} {cfg['seq_len_q']:>6} "
              f"{cfg['batch'] * cfg['heads']:>5} | "
              + " ".join(f"{sums[k]:>14.0f}" for k in METRICS), flush=True)
    if args.out:
        import torch
        from kernels.bench import _versions
        prov = dict(_versions(torch), ncu=ncu_version(args.ncu),
                    command="python -m kernels.ncu_loads " + " ".join(
                        sys.argv[1:] if argv is None else argv), metrics=METRICS,
                    missing_metrics=missing)
        Path(args.out).write_text(json.dumps({"schema": "ioaware.ncu_loads/1", "provenance": prov,
                                              "records": out_recs}, indent=1))
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
