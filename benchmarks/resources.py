"""Per-kernel resources as ptxas reports them: registers, spills, static shared memory, threads.

``python -m kernels.resources --out results/kernel_resources_sm90.json`` compiles, on the CPU
(Numba's PTX for sm_90, then ``ptxas -v -arch=sm_90``; no GPU), every kernel configuration the
shipped sweeps ran for our kernels and writes, per configuration, registers per thread, spill
and stack bytes, static shared memory and threads per block, keyed by :func:`resource_key`,
with the provenance of the figures (ptxas, numba and numba-cuda versions, date, command).

Which configurations (:func:`sweep_configs`): the records of our kernel in
`kernels.measure.standard_sweep`, resolved as `kernels.launch` resolves them on a GPU —

* forward (variant "simt"): ``TileConfig(block_q, block_k, *simt_forward_tiles(...))`` (the
  micro-tile `kernels.measure` pins) and ``choose_tiles(block_q, block_k, d, 128)`` (the
  launch's rule before that, which the H200 sweep ran), ``cfg.threads`` threads, warp shuffles
  when the threads are a multiple of 32; both forward versions the shipped sweeps ran
  (``flash_fwd``, ``flash_fwd_v2``);
* backward: the delta pre-pass (``flash_bwd_delta``: 128 threads; ``flash_bwd_delta_v2``:
  ``32 * DELTA_ROWS``), the dK/dV kernel over ``choose_tiles(block_k, block_q, d, 128)``
  (``flash_bwd_dkdv`` and ``flash_bwd_dkdv_v2``, with and without dQ atomics) and the dQ kernel
  over ``choose_tiles(block_q, block_k, d, 128)`` (``flash_bwd_dq``);
* the tensor-core forward (variant "mma", `kernels.flash_mma_fwd`) at the sweep's blocks, and
  the default configurations of the other tensor-core kernels (`kernels.flash_mma_bwd`,
  `kernels.flash_tf32_fwd`, `kernels.flash_tf32_bwd`; d = 64 and 128, causal on and off).

Caveats: the figures are those of today's kernel sources compiled by this ptxas (the driver's
JIT compiles the same PTX on a GPU; the CUDA version of the shipped sweeps is 13.0, as here);
kernels without masks or dropout (none of the sweeps used them). :func:`parse_ptxas` and
:func:`resource_key` need neither Numba nor ptxas (the sim reads the JSON through
:func:`load_resources` and :func:`lookup`).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")

__all__ = ["resource_key", "parse_ptxas", "sweep_configs", "compile_resources", "load_resources",
           "lookup", "find_ptxas", "main", "DEFAULT_OUT", "DTYPES"]

DEFAULT_OUT = os.path.join("results", "kernel_resources_sm90.json")
DTYPES = ("fp32", "fp16")
_PTXAS_CANDIDATES = ("/usr/local/cuda-13.0/bin/ptxas", "/usr/local/cuda/bin/ptxas")


def resource_key(kernel: str, head_dim: int, dtype: str, causal: bool, *, block_m=None,
                 block_n=None, tile=None, dq_atomic=None, mask: bool = False,
                 dropout: bool = False) -> str:
    """The string that identifies one compiled kernel configuration in the JSON.

    ``kernel``: the Numba function name as Nsight Compute lists it (``flash_fwd_v2``,
    ``flash_bwd_dkdv_v2``, ``flash_mma_fwd``, ...); ``block_m x block_n``: the kernel's own tile
    (forward and dQ: block_q x block_k; dK/dV: block_k x block_q); ``tile``: the per-thread
    micro-tile (tm, tn) of the CUDA-core kernels; ``dq_atomic``: dK/dV kernels only.
    """
    if not isinstance(kernel, str) or not kernel:
        raise ValueError(f"kernel must be a non-empty string, got {kernel!r}")
    if dtype not in DTYPES + ("bf16",):
        raise ValueError(f"dtype must be one of {DTYPES + ('bf16',)}, got {dtype!r}")
    d = int(head_dim)
    if d < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim!r}")
    parts = [kernel, f"d{d}", dtype, "causal" if causal else "full"]
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither")
    if block_m is not None:
        parts.append(f"{int(block_m)}x{int(block_n)}")
    if tile is not None:
        if len(tile) != 2:
            raise ValueError(f"tile must be a pair (tm, tn), got {tile!r}")
        parts.append(f"t{int(tile[0])}x{int(tile[1])}")
    if dq_atomic is not None:
        parts.append("dq_atomic" if dq_atomic else "dq_kernel")
    if mask:
        parts.append("mask")
    if dropout:
        parts.append("dropout")
    return "/".join(parts)


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_RE_PROPS = re.compile(r"Function properties for (\S+)")
_RE_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")
_RE_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas(text: str) -> list[dict]:
    """Per entry function in ``ptxas -v`` output (its stderr): ``function``,
    ``registers_per_thread``, ``stack_frame_bytes``, ``spill_store_bytes``,
    ``spill_load_bytes``, ``static_smem_bytes`` (0 when ptxas prints no smem), ``barriers``.
    Raises ValueError when the text has no "Used N registers" line."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    out: list[dict] = []
    cur = None
    for line in text.splitlines():
        m = _RE_ENTRY.search(line)
        if m:
            cur = {"function": m.group(1), "registers_per_thread": None, "stack_frame_bytes": 0,
                   "spill_store_bytes": 0, "spill_load_bytes": 0, "static_smem_bytes": 0,
                   "barriers": 0}
            out.append(cur)
            continue
        if cur is None:
            continue
        m = _RE_SPILL.search(line)
        if m:
            cur["stack_frame_bytes"], cur["spill_store_bytes"], cur["spill_load_bytes"] = (
                int(x) for x in m.groups())
        m = _RE_USED.search(line)
        if m:
            cur["registers_per_thread"] = int(m.group(1))
            s = _RE_SMEM.search(line)
            cur["static_smem_bytes"] = int(s.group(1)) if s else 0
            b = _RE_BARRIERS.search(line)
            cur["barriers"] = int(b.group(1)) if b else 0
    out = [e for e in out if e["registers_per_thread"] is not None]
    if not out:
        raise ValueError("ptxas output has no 'Used N registers' line (was -v given?)")
    return out


# ------------------------------------------------------------------------------------------------
# which configurations
# ------------------------------------------------------------------------------------------------

def _cfg(kernel, head_dim, dtype, causal, threads, *, block_m=None, block_n=None, tile=None,
         dq_atomic=None, **build):
    key = resource_key(kernel, head_dim, dtype, causal, block_m=block_m, block_n=block_n,
                       tile=tile, dq_atomic=dq_atomic)
    return {"key": key, "kernel": kernel, "head_dim": int(head_dim), "dtype": dtype,
            "causal": bool(causal), "block_m": block_m, "block_n": block_n,
            "tile": list(tile) if tile is not None else None, "dq_atomic": dq_atomic,
            "threads_per_block": threads, "build": build}


def sweep_configs(extra_tensor_core: bool = True) -> list[dict]:
    """The kernel configurations of our kernel's records in `kernels.measure.standard_sweep`,
    resolved as `kernels.launch` resolves them on a GPU (module docstring), deduplicated, plus
    (``extra_tensor_core``) the tensor-core kernels' default configurations."""
    from kernels.config import TileConfig, choose_tiles
    from kernels.flash_bwd import DELTA_ROWS
    from kernels.measure import simt_forward_tiles, standard_sweep
    out: dict = {}

    def add(c):
        out.setdefault(c["key"], c)

    for rec in standard_sweep():
        if rec["kernel"] != "ioaware-numba":
            continue
        d, dt, causal = rec["head_dim"], rec["dtype"], bool(rec["causal"])
        bq, bk = rec["block_q"], rec["block_k"]
        if rec.get("variant") == "mma":
            add(_cfg("flash_mma_fwd", d, dt, causal, None, block_m=bq, block_n=bk,
                     family="mma_fwd"))
            continue
        if rec["pass"] == "fwd":
            # the micro-tile kernels.measure pins today, and choose_tiles' (the launch's rule
            # before the forward tiles were pinned: the H200 sweep's timings)
            auto = choose_tiles(bq, bk, d, 128)
            for tm, tn in (simt_forward_tiles(d, bq, bk), (auto.tm, auto.tn)):
                cfg = TileConfig(bq, bk, tm, tn)
                for name in ("flash_fwd", "flash_fwd_v2"):
                    add(_cfg(name, d, dt, causal, cfg.threads, block_m=bq, block_n=bk,
                             tile=(tm, tn), family="simt", use_shfl=cfg.threads % 32 == 0))
            continue
        add(_cfg("flash_bwd_delta", d, dt, False, 128, family="simt"))
        add(_cfg("flash_bwd_delta_v2", d, dt, False, 32 * DELTA_ROWS, family="simt",
                 use_shfl=True))
        ckv = choose_tiles(bk, bq, d, 128)
        for name in ("flash_bwd_dkdv", "flash_bwd_dkdv_v2"):
            for atomic in (True, False):
                add(_cfg(name, d, dt, causal, ckv.threads, block_m=bk, block_n=bq,
                         tile=(ckv.tm, ckv.tn), dq_atomic=atomic, family="simt"))
        cq = choose_tiles(bq, bk, d, 128)
        add(_cfg("flash_bwd_dq", d, dt, causal, cq.threads, block_m=bq, block_n=bk,
                 tile=(cq.tm, cq.tn), family="simt"))
    if extra_tensor_core:
        from kernels import flash_mma_bwd, flash_mma_fwd, flash_tf32_bwd, flash_tf32_fwd
        for d in (64, 128):
            for causal in (False, True):
                for prefix, dt, fwd, bwd in (("mma", "fp16", flash_mma_fwd, flash_mma_bwd),
                                             ("tf32", "fp32", flash_tf32_fwd, flash_tf32_bwd)):
                    bq, bk = (fwd.default_blocks(d, causal) if prefix == "mma"
                              else fwd.default_blocks(d))
                    add(_cfg(f"flash_{prefix}_fwd", d, dt, causal, None, block_m=bq, block_n=bk,
                             family=f"{prefix}_fwd"))
                    t = bwd.default_tiles(d)
                    for part in ("dq", "dkdv"):
                        add(_cfg(f"flash_{prefix}_bwd_{part}", d, dt, causal, None,
                                 block_m=t[part][0], block_n=t[part][1],
                                 family=f"{prefix}_{part}"))
    return list(out.values())


# ------------------------------------------------------------------------------------------------
# building and compiling one configuration
# ------------------------------------------------------------------------------------------------

def _simt_signature(kind: str, dtype: str):
    """Numba argument types of a CUDA-core kernel as `kernels.launch` passes them (contiguous
    arrays of the input dtype, float32 statistics, uint8 mask, int32 schedules, Python ints as
    int64, float32 scale, uint64 dropout seed/threshold, float32 keep scale)."""
    from numba import types
    A = lambda dt, nd: types.Array(dt, nd, "C")  # noqa: E731
    x4 = A(types.float32 if dtype == "fp32" else types.float16, 4)
    f3, f4, u8 = A(types.float32, 3), A(types.float32, 4), A(types.uint8, 4)
    i2, i1 = A(types.int32, 2), A(types.int32, 1)
    i64, f32, u64 = types.int64, types.float32, types.uint64
    if kind == "fwd":
        return (x4, x4, x4, x4, f3, u8, i2, i1, i64, i64, i64, i64, f32, u64, u64, f32)
    if kind == "delta":
        return (x4, x4, f3)
    if kind == "dkdv":
        return (x4, x4, x4, x4, f3, f3, x4, x4, f4, u8, i2, i1, i64, i64, i64, f32, u64, u64, f32)
    if kind == "dq":
        return (x4, x4, x4, x4, f3, f3, x4, u8, i2, i1, i64, i64, i64, f32, u64, u64, f32)
    raise ValueError(f"kind must be fwd, delta, dkdv or dq, got {kind!r}")


def _build(c: dict):
    """(python function, Numba signature, threads per block) of one configuration."""
    from kernels.config import TileConfig
    name, d, dt, causal = c["kernel"], c["head_dim"], c["dtype"], c["causal"]
    b = c["build"]
    fam = b["family"]
    if fam == "simt":
        from kernels import flash_bwd, flash_fwd
        if name.startswith("flash_fwd"):
            cfg = TileConfig(c["block_m"], c["block_n"], *c["tile"])
            make = flash_fwd.make_forward_kernel if name == "flash_fwd" else flash_fwd.make_forward_kernel_v2
            k = make(cfg, d, causal, False, False, b["use_shfl"])
            return k.py_func, _simt_signature("fwd", dt), cfg.threads
        if name == "flash_bwd_delta":
            return flash_bwd.make_delta_kernel(d).py_func, _simt_signature("delta", dt), 128
        if name == "flash_bwd_delta_v2":
            k = flash_bwd.make_delta_kernel_v2(d, b["use_shfl"])
            return k.py_func, _simt_signature("delta", dt), c["threads_per_block"]
        cfg = TileConfig(c["block_m"], c["block_n"], *c["tile"])
        if name.startswith("flash_bwd_dkdv"):
            make = flash_bwd.make_dkdv_kernel if name == "flash_bwd_dkdv" else flash_bwd.make_dkdv_kernel_v2
            k = make(cfg, d, causal, False, False, bool(c["dq_atomic"]))
            return k.py_func, _simt_signature("dkdv", dt), cfg.threads
        if name == "flash_bwd_dq":
            k = flash_bwd.make_dq_kernel(cfg, d, causal, False, False)
            return k.py_func, _simt_signature("dq", dt), cfg.threads
    if fam == "mma_fwd":
        from kernels import flash_mma_fwd, mma_check
        k = flash_mma_fwd.get_kernel(d, c["block_m"], c["block_n"], dt == "bf16", causal, False, False)
        return k.py_func, mma_check.signature(False), k.threads
    if fam in ("mma_dq", "mma_dkdv"):
        from kernels import flash_mma_bwd, mma_check
        get = flash_mma_bwd.get_dq_kernel if fam == "mma_dq" else flash_mma_bwd.get_dkdv_kernel
        k = get(d, c["block_m"], c["block_n"], dt == "bf16", causal, False, False)
        return k.py_func, mma_check.bwd_signature(fam[4:]), k.threads
    if fam == "tf32_fwd":
        from kernels import flash_tf32_fwd, tf32_check
        k = flash_tf32_fwd.get_kernel(d, c["block_m"], c["block_n"], causal, False, False,
                                      flash_tf32_fwd.q_split_once(d))
        return k.py_func, tf32_check.signature(), k.threads
    if fam in ("tf32_dq", "tf32_dkdv"):
        from kernels import flash_tf32_bwd, tf32_check
        get = flash_tf32_bwd.get_dq_kernel if fam == "tf32_dq" else flash_tf32_bwd.get_dkdv_kernel
        k = get(d, c["block_m"], c["block_n"], causal, False, False)
        return k.py_func, tf32_check.bwd_signature(fam[5:]), k.threads
    raise ValueError(f"no builder for configuration {c['key']!r}")


def find_ptxas(path: str | None = None) -> str | None:
    """The ptxas to use: ``path``, else ``ptxas`` on PATH, else CUDA 13.0's; None if none."""
    if path:
        return path if os.path.exists(path) else None
    found = shutil.which("ptxas")
    if found:
        return found
    return next((p for p in _PTXAS_CANDIDATES if os.path.exists(p)), None)


def ptxas_version(ptxas: str) -> str:
    """The last line of ``ptxas --version`` (e.g. ``Build cuda_13.0.r13.0/compiler.…``) plus
    its release line."""
    r = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True)
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    rel = [ln for ln in lines if "release" in ln]
    return "; ".join((rel[-1:] if rel else []) + lines[-1:])


def compile_one(c: dict, ptxas: str, workdir: str, cc=(9, 0)) -> dict:
    """Compile one configuration to PTX (Numba, no GPU) and run ``ptxas -v``; the entry of the
    JSON (the configuration's fields plus the parsed ptxas figures)."""
    from numba import cuda
    fn, sig, threads = _build(c)
    ptx, _ = cuda.compile_ptx(fn, sig, cc=cc)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", c["key"])
    ptx_path = os.path.join(workdir, safe + ".ptx")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-v", f"-arch=sm_{cc[0]}{cc[1]}", ptx_path, "-o",
                        os.path.join(workdir, safe + ".cubin")], capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"ptxas failed on {c['key']}: {r.stderr.strip()[-400:]}")
    ents = parse_ptxas(r.stderr)
    if len(ents) != 1:
        raise RuntimeError(f"expected one entry function in {c['key']}, ptxas printed {len(ents)}")
    e = ents[0]
    out = {k: v for k, v in c.items() if k != "build"}
    out["threads_per_block"] = int(threads)
    out.update({k: e[k] for k in ("registers_per_thread", "spill_store_bytes", "spill_load_bytes",
                                  "stack_frame_bytes", "static_smem_bytes", "barriers")})
    return out


def compile_resources(configs, ptxas: str, *, workdir: str | None = None, progress=None) -> list[dict]:
    """:func:`compile_one` over ``configs`` (entries in the same order)."""
    from numba import config as numba_config
    if numba_config.ENABLE_CUDASIM:
        raise RuntimeError("Numba's CUDA simulator is on (NUMBA_ENABLE_CUDASIM=1): it cannot emit "
                           "PTX; run with NUMBA_ENABLE_CUDASIM=0")
    from kernels.mma_check import _allow_offline_compile
    _allow_offline_compile()
    workdir = workdir or tempfile.mkdtemp(prefix="kernel_resources_")
    os.makedirs(workdir, exist_ok=True)
    out = []
    for i, c in enumerate(configs):
        out.append(compile_one(c, ptxas, workdir))
        if progress is not None:
            progress(i + 1, len(configs), out[-1])
    return out


# ------------------------------------------------------------------------------------------------
# reading the JSON (used by sim.compare)
# ------------------------------------------------------------------------------------------------

def load_resources(path=DEFAULT_OUT) -> dict:
    """``{key: entry}`` of a resources JSON written by this module. Raises ValueError naming the
    file when it is not one."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), list):
        raise ValueError(f"{path}: not a kernel resources file (no 'kernels' list)")
    out = {}
    for e in data["kernels"]:
        if not isinstance(e, dict) or "key" not in e or "registers_per_thread" not in e:
            raise ValueError(f"{path}: an entry lacks 'key' or 'registers_per_thread': {e!r:.200}")
        out[e["key"]] = e
    return out


def lookup(table: dict, kernel: str, head_dim: int, dtype: str, causal: bool, **kw) -> dict | None:
    """The entry of ``table`` (:func:`load_resources`) for one configuration, or None."""
    return table.get(resource_key(kernel, head_dim, dtype, causal, **kw))


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def _versions() -> dict:
    out = {}
    try:
        import numba
        out["numba"] = numba.__version__
    except ImportError:
        out["numba"] = None
    try:
        from importlib.metadata import version
        out["numba_cuda"] = version("numba-cuda")
    except Exception:
        out["numba_cuda"] = None
    return out


def format_table(entries) -> str:
    """The table the command prints: one line per configuration."""
    head = f"{'key':58s} {'thr':>4s} {'regs':>4s} {'spill st/ld':>11s} {'smem B':>7s}"
    lines = [head]
    for e in entries:
        lines.append(f"{e['key']:58s} {e['threads_per_block']:4d} {e['registers_per_thread']:4d} "
                     f"{e['spill_store_bytes']:5d}/{e['spill_load_bytes']:<5d} "
                     f"{e['static_smem_bytes']:7d}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.resources",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"JSON to write (default {DEFAULT_OUT})")
    ap.add_argument("--ptxas", default=None, help="ptxas binary (default: PATH, then CUDA 13.0's)")
    ap.add_argument("--only", default=None,
                    help="comma list of substrings: compile only configurations whose key "
                         "contains one of them (e.g. 'flash_bwd_delta_v2/d64')")
    ap.add_argument("--no-tensor-core", action="store_true",
                    help="skip the tensor-core kernels' default configurations")
    ap.add_argument("--workdir", default=None, help="keep .ptx/.cubin files here")
    args = ap.parse_args(argv)
    ptxas = find_ptxas(args.ptxas)
    if ptxas is None:
        print("ptxas not found: give --ptxas PATH (CUDA toolkit)", file=sys.stderr)
        return 2
    configs = sweep_configs(extra_tensor_core=not args.no_tensor_core)
    if args.only:
        subs = [s for s in args.only.split(",") if s]
        configs = [c for c in configs if any(s in c["key"] for s in subs)]
        if not configs:
            print(f"--only {args.only!r} matches no configuration", file=sys.stderr)
            return 2

    def prog(i, n, e):
        print(f"[{i}/{n}] {e['key']}: {e['registers_per_thread']} registers", file=sys.stderr,
              flush=True)
    entries = compile_resources(configs, ptxas, workdir=args.workdir, progress=prog)
    prov = {"ptxas": ptxas_version(ptxas), "ptxas_path": ptxas, "arch": "sm_90",
            **_versions(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m kernels.resources " + " ".join(argv if argv is not None else sys.argv[1:]),
            "source": "Numba PTX (numba.cuda.compile_ptx, cc=(9, 0)) of today's kernel sources, "
                      "then ptxas -v -arch=sm_90; configurations: kernels.resources.sweep_configs"}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"provenance": prov, "kernels": entries}, f, indent=1)
        f.write("\n")
    print(format_table(entries))
    print(f"{len(entries)} configurations -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
