"""Global loads of a results file's configurations split by instruction kind (Nsight Compute).

    python -m kernels.ncu_loads RESULTS.json [--variant mma] [--pass fwd] [--out FILE.json]
    python -m kernels.ncu_loads --show FILE.json        (any machine: the saved counters)

`kernels.ncu` records ``global_load_bytes`` as ``l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum``.
To explain where such bytes come from, this replays the selected records (the same ncu command
and child process as `kernels.ncu`, so the same inputs and launches) with the load
counters split into plain loads (``op_ld``: LDG) and asynchronous global-to-shared copies
(``op_ldgsts``: ``cp.async``), each as executed warp instructions, requests, sectors and bytes,
plus the L2 read sectors from L1. It prints one row per record (counters summed over the
record's launches) and writes the raw sums with provenance to ``--out``.

For the tensor-core forward (variant ``mma``, `kernels.flash_mma_fwd`) it also prints the
breakdown of the load sectors (`mma_fwd_breakdown`): the Q fragment loads the kernel issues
(per warp ``m-tiles x head_dim / 16 x 4`` LDG of 16-byte row segments, 8 sectors each), the other
LDG (the schedule's uniform ``kv_index``/offset loads, 1 sector each) and what is left per
``cp.async`` warp instruction (512 bytes moved = 16 sectors).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kernels import measure
from kernels.ncu import (MARKER_NAME, filter_available, ncu_command, ncu_version,
                         parse_ncu_csv, split_by_marker)

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


def mma_fwd_breakdown(cfg: dict, c: dict) -> dict:
    """Load sectors of a tensor-core forward record ``cfg`` with summed counters ``c`` (keys of
    `METRICS`): Q fragment LDG instructions and sectors, the other LDG instructions (1 sector
    each), the sectors counted per cp.async instruction, the other LDG's share of all load
    sectors, and the load requests beyond one per LDG and cp.async instruction, per warp."""
    from kernels.flash_mma_fwd import warp_m_tiles
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


def show(path) -> int:
    """Print a saved file's rows (and the tensor-core forward's breakdown)."""
    doc = json.loads(Path(path).read_text())
    print(f"# {doc['provenance'].get('gpu')}  {doc['provenance'].get('date')}  "
          f"({doc['provenance'].get('command')})")
    print(f"{'d':>4} {'causal':>6} {'N':>6} {'B*H':>5} | {'ld_sect':>12} {'ldgsts_inst':>12} "
          f"{'Q ldg':>9} {'other ldg':>9} {'sect/cp.async':>13} {'other share':>11} "
          f"{'req-inst/warp':>13}")
    for r in doc["records"]:
        c = r["counters"]
        bd = mma_fwd_breakdown(r, c) if r.get("variant") == "mma" and r["pass"] == "fwd" else None
        row = (f"{r['head_dim']:>4} {str(r['causal']):>6} {r['seq_len_q']:>6} "
               f"{r['batch'] * r['heads']:>5} | {c['ld_sect']:>12.0f} {c['ldgsts_inst']:>12.0f}")
        if bd:
            row += (f" {bd['q_ldg_inst']:>9.0f} {bd['other_ldg_inst']:>9.0f} "
                    f"{bd['sectors_per_cp_async']:>13.3f} {100 * bd['other_ldg_share']:>10.1f}% "
                    f"{bd['requests_over_instructions_per_warp']:>13.2f}")
        print(row)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.ncu_loads",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?")
    ap.add_argument("--show", metavar="FILE", help="print a file this command wrote, and exit")
    ap.add_argument("--variant", default="mma")
    ap.add_argument("--pass", dest="pas", default="fwd")
    ap.add_argument("--out", default=None)
    ap.add_argument("--ncu", default="ncu")
    args = ap.parse_args(argv)
    if args.show:
        return show(args.show)
    if not args.results:
        ap.error("give the results file (or --show FILE)")

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
        subprocess.run(ncu_command(have, str(log_path), str(cfg_path), args.ncu), check=True,
                       timeout=1800)
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
        from kernels.bench import provenance_versions
        prov = dict(provenance_versions(torch), ncu=ncu_version(args.ncu),
                    command="python -m kernels.ncu_loads " + " ".join(
                        sys.argv[1:] if argv is None else argv), metrics=METRICS,
                    missing_metrics=missing)
        Path(args.out).write_text(json.dumps({"schema": "ioaware.ncu_loads/1", "provenance": prov,
                                              "records": out_recs}, indent=1))
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
