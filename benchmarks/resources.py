"""Command ``resources``: registers, spills and shared memory per kernel configuration (ptxas,
CPU). It writes the table the cost model's occupancy reads.

``python -m benchmarks resources [--out results/kernel_resources_sm90.json]`` compiles, on the
CPU (Numba's PTX for sm_90, then ``ptxas -v -arch=sm_90``; no GPU, ``NUMBA_ENABLE_CUDASIM=0``),
every configuration of today's kernels that the shipped sweeps ran and the tensor-core kernels'
defaults, and writes per configuration registers per thread, spill and stack bytes, static
shared memory and threads per block, keyed by `sim.resources.resource_key` (which reads the
table: `sim.resources.load_resources`, `lookup`), with provenance.

Which configurations (`sweep_configs`): the records of our kernel in
`benchmarks.measure.standard_sweep`, resolved as the families resolve them on a GPU —

* CUDA-core forward (``flash_fwd_v2``): ``TileConfig(block_q, block_k, tm, tn)`` with the
  micro-tile `benchmarks.measure.simt_forward_tiles` pins and with ``choose_tiles(block_q,
  block_k, d, 128)``'s (the launch's rule before the forward's micro-tiles were tuned, which
  the H200 sweep ran), warp shuffles when the threads are a multiple of 32;
* CUDA-core backward: the delta pre-pass (``flash_bwd_delta_v2``, ``32 * DELTA_ROWS`` threads)
  and the dK/dV kernel (``flash_bwd_dkdv_v2``, dQ by atomics) over ``choose_tiles(block_k,
  block_q, d, 128)``;
* the tensor-core forward (``flash_mma_fwd``) at the sweep's blocks and the launch order the
  shipped sweeps ran (tiles first: `benchmarks.measure.SHIPPED_HEAD_GROUP`), and the default
  configurations of every tensor-core kernel (``flash_{mma,tf32}_{fwd,bwd_dq,bwd_dkdv}``, and
  each family's dK/dV kernel with dQ by atomics at its own tiles, keyed ``dq_atomic``; d = 64 and
  128, causal on and off) at its pass's default launch order
  (`kernels.tile_scheduler.DEFAULT_HEAD_GROUP`), except where a sweep configuration has the
  same key (float16 d=64 causal forward, 128 x 32). Each entry names its ``launch_head_group``;
  the key has no part for it, so a configuration is in the table at one launch order only (a
  causal tensor-core kernel's registers differ between launch orders).

Caveats: the figures are those of today's kernel sources compiled by this ptxas (the driver's
JIT compiles the same PTX on a GPU); kernels without masks or dropout (no sweep used them).
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from sim.resources import RESOURCES_PATH, resource_key

from .common import (KERNEL_NAMES, allow_offline_compile, build_kernel, command_line,
                     compile_sm90, find_ptxas, first_sentence, parse_ptxas, provenance,
                     ptxas_version, write_json)

FIGURES = ("registers_per_thread", "spill_store_bytes", "spill_load_bytes", "stack_frame_bytes",
           "static_smem_bytes", "barriers")


def _cfg(family, kernel, head_dim, dtype, causal, *, block_m=None, block_n=None, tile=None,
         dq_atomic=None, head_group=None):
    """One configuration to compile: its `sim.resources.resource_key` and what builds it."""
    name = KERNEL_NAMES[(family, kernel)]
    key = resource_key(name, head_dim, dtype, causal, block_m=block_m, block_n=block_n,
                       tile=tile, dq_atomic=dq_atomic)
    return {"key": key, "kernel": name, "family": family, "head_dim": int(head_dim),
            "dtype": dtype, "causal": bool(causal), "block_m": block_m, "block_n": block_n,
            "tile": list(tile) if tile is not None else None, "dq_atomic": dq_atomic,
            **({} if family == "simt" else {"launch_head_group": head_group}),
            "pass_kernel": kernel}


def sweep_configs(tensor_core_defaults: bool = True) -> list[dict]:
    """The kernel configurations of our kernel's records in the shipped sweep, resolved as the
    families resolve them on a GPU (module docstring), deduplicated, plus
    (``tensor_core_defaults``) the tensor-core kernels' default configurations."""
    from kernels import mma_bwd, mma_fwd, tf32_bwd, tf32_fwd, tile_scheduler
    from kernels.config import choose_tiles

    from .measure import SHIPPED_HEAD_GROUP, SIMT_TARGET_THREADS, simt_forward_tiles, standard_sweep
    out: dict = {}

    def add(c):
        out.setdefault(c["key"], c)

    for rec in standard_sweep():
        if rec["kernel"] != "ioaware-numba":
            continue
        d, dt, causal = rec["head_dim"], rec["dtype"], bool(rec["causal"])
        bq, bk = rec["block_q"], rec["block_k"]
        if rec["variant"] == "mma":
            add(_cfg("mma", "fwd", d, dt, causal, block_m=bq, block_n=bk,
                     head_group=SHIPPED_HEAD_GROUP))
        elif rec["pass"] == "fwd":
            auto = choose_tiles(bq, bk, d, SIMT_TARGET_THREADS)
            for tile in (simt_forward_tiles(d, bq, bk), (auto.tm, auto.tn)):
                add(_cfg("simt", "fwd", d, dt, causal, block_m=bq, block_n=bk, tile=tile))
        else:
            add(_cfg("simt", "delta", d, dt, False))
            kv = choose_tiles(bk, bq, d, SIMT_TARGET_THREADS)
            add(_cfg("simt", "dkdv", d, dt, causal, block_m=bk, block_n=bq, tile=(kv.tm, kv.tn),
                     dq_atomic=True))
    if tensor_core_defaults:
        for d in (64, 128):
            for causal in (False, True):
                for family, dt, fwd, bwd in (("mma", "fp16", mma_fwd, mma_bwd),
                                             ("tf32", "fp32", tf32_fwd, tf32_bwd)):
                    bq, bk = (fwd.default_blocks(d, causal) if family == "mma"
                              else fwd.default_blocks(d))
                    add(_cfg(family, "fwd", d, dt, causal, block_m=bq, block_n=bk,
                             head_group=tile_scheduler.head_group(None, causal, "fwd")))
                    tiles = bwd.default_tiles(d)
                    group = tile_scheduler.head_group(None, causal, "bwd")
                    for kernel in ("dq", "dkdv"):
                        add(_cfg(family, kernel, d, dt, causal, block_m=tiles[kernel][0],
                                 block_n=tiles[kernel][1], head_group=group))
                    # the dK/dV kernel with dQ by atomics (sm_90)
                    add(_cfg(family, "dkdv", d, dt, causal, dq_atomic=True,
                             block_m=tiles["dkdv_atomic"][0],
                             block_n=tiles["dkdv_atomic"][1], head_group=group))
    return list(out.values())


def compile_one(c: dict, ptxas: str, workdir: str) -> dict:
    """Compile one configuration (`benchmarks.common.build_kernel`, `compile_sm90`); the entry of
    the table: the configuration's fields and the ptxas figures."""
    kern, sig, threads = build_kernel(c["family"], c["pass_kernel"], c["head_dim"], c["dtype"],
                                      c["causal"], block_m=c["block_m"], block_n=c["block_n"],
                                      tile=c["tile"], head_group=c.get("launch_head_group"),
                                      dq_atomic=c["dq_atomic"] if c["family"] != "simt" else None)
    res = compile_sm90(kern, sig, c["key"], workdir, ptxas)
    if res["returncode"]:
        raise RuntimeError(f"ptxas failed on {c['key']}: {res['ptxas_log'].strip()[-400:]}")
    ents = parse_ptxas(res["ptxas_log"])
    if len(ents) != 1:
        raise RuntimeError(f"expected one entry function in {c['key']}, ptxas printed {len(ents)}")
    entry = {k: v for k, v in c.items() if k not in ("family", "pass_kernel")}
    entry["threads_per_block"] = int(threads)
    entry.update({k: ents[0][k] for k in FIGURES})
    return entry


def compile_resources(configs, ptxas: str, *, workdir: str | None = None, progress=None) -> list[dict]:
    """`compile_one` over ``configs`` (entries in the same order)."""
    from numba import config as numba_config
    if numba_config.ENABLE_CUDASIM:
        raise RuntimeError("Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it cannot emit "
                           "PTX; run with NUMBA_ENABLE_CUDASIM=0 (python -m benchmarks resources "
                           "sets it)")
    allow_offline_compile()
    workdir = workdir or tempfile.mkdtemp(prefix="kernel_resources_")
    out = []
    for i, c in enumerate(configs):
        out.append(compile_one(c, ptxas, workdir))
        if progress is not None:
            progress(i + 1, len(configs), out[-1])
    return out


def format_table(entries) -> str:
    """The table the command prints: one line per configuration."""
    lines = [f"{'key':58s} {'thr':>4s} {'regs':>4s} {'spill st/ld':>11s} {'smem B':>7s}"]
    for e in entries:
        lines.append(f"{e['key']:58s} {e['threads_per_block']:4d} {e['registers_per_thread']:4d} "
                     f"{e['spill_store_bytes']:5d}/{e['spill_load_bytes']:<5d} "
                     f"{e['static_smem_bytes']:7d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks resources",
                                 description=first_sentence(__doc__))
    ap.add_argument("--out", default=str(RESOURCES_PATH),
                    help="JSON to write (default: the shipped table, "
                         "results/kernel_resources_sm90.json)")
    ap.add_argument("--ptxas", default=None, help="ptxas binary (default: PATH, then the CUDA "
                                                  "toolkit's)")
    ap.add_argument("--only", default=None,
                    help="comma list of substrings: compile only configurations whose key "
                         "contains one of them (e.g. 'flash_bwd_delta_v2/d64')")
    ap.add_argument("--no-tensor-core-defaults", action="store_true",
                    help="skip the tensor-core kernels' default configurations")
    ap.add_argument("--workdir", default=None, help="keep .ptx/.cubin files here")
    args = ap.parse_args(argv)
    ptxas = find_ptxas(args.ptxas)
    if ptxas is None:
        print("ptxas not found: give --ptxas PATH (CUDA toolkit)", file=sys.stderr)
        return 2
    configs = sweep_configs(tensor_core_defaults=not args.no_tensor_core_defaults)
    if args.only:
        subs = [s for s in args.only.split(",") if s]
        configs = [c for c in configs if any(s in c["key"] for s in subs)]
        if not configs:
            print(f"--only {args.only!r} matches no configuration", file=sys.stderr)
            return 2

    def progress(i, n, e):
        print(f"[{i}/{n}] {e['key']}: {e['registers_per_thread']} registers", file=sys.stderr,
              flush=True)
    entries = compile_resources(configs, ptxas, workdir=args.workdir, progress=progress)
    version = ptxas_version(ptxas)
    prov = provenance(command_line("resources", argv), gpu="none (ptxas for sm_90 on the CPU)",
                      driver="none", cuda=version.split(";")[0],
                      extra={"ptxas": version, "ptxas_path": ptxas, "arch": "sm_90",
                             "source": "Numba PTX (numba.cuda.compile_ptx, cc=(9, 0)) of the "
                                       "kernel sources, then ptxas -v -arch=sm_90; "
                                       "configurations: benchmarks.resources.sweep_configs"})
    write_json({"provenance": prov, "kernels": entries}, args.out)
    print(format_table(entries))
    print(f"{len(entries)} configurations -> {args.out}")
    return 0
