"""Command ``check``: compile-only PTX, ptxas and SASS checks of the tensor-core kernels (CPU).

``python -m benchmarks check [--families mma tf32] [--kernels fwd dq dkdv dkdv_atomic] [--out DIR]``
compiles the forward, dQ and dK/dV kernels (and the dK/dV kernel that adds dQ by atomics,
``dkdv_atomic``) of the ``mma`` family (float16 and bfloat16) and the
``tf32`` family (float32) for head dims 64 and 128, causal and not, at the tiles and launch
order each runs by default, for sm_90 without launching anything (Numba's PTX; no GPU,
``NUMBA_ENABLE_CUDASIM=0``), and the same with a boolean mask and dropout. For each
configuration it reports what the inner loop must and must not contain: ``mma.sync`` count
(and ``ldmatrix`` / ``cvt.rna.tf32``) in the PTX, ``.local`` declarations and ``ld.local`` /
``st.local`` (local-memory traffic), the instructions and ``mma`` of each innermost PTX loop
that holds an ``mma`` (`ptx_mma_loops`: how much else a step issues per product); where
``ptxas`` is found, registers and stack / spill
bytes; where ``cuobjdump`` or ``nvdisasm`` is on PATH, the SASS count of ``HMMA``, ``LDL`` /
``STL`` (all, and inside loops: `local_in_loops`), ``LDGSTS`` and shared loads. A line starts
with ``FAIL`` when a configuration has local memory, spills or no mma (exit status 1), with
``info`` for the extra tilings of ``--fwd-tiles``. ``--opcodes N`` adds each listing's N most
frequent SASS opcodes and its instructions per ``HMMA``; ``--tf32-split`` prints only the SASS
of one 3xTF32 split (`kernels.ptx.split_tf32`: ``cvt.rna.tf32`` has no single SASS instruction
on sm_90, so what a split costs is read here).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile

from .common import (allow_offline_compile, build_kernel, compile_sm90, find_ptxas,
                     first_sentence, parse_ptxas)

FAMILY_DTYPES = {"mma": ("fp16", "bf16"), "tf32": ("fp32",)}
KERNELS = ("fwd", "dq", "dkdv", "dkdv_atomic")
#: Each family's kernels (both have the dK/dV kernel that adds dQ by atomics).
FAMILY_KERNELS = {"mma": KERNELS, "tf32": KERNELS}
HEAD_DIMS = (64, 128)
PTX_COUNTS = {"ptx_mma": r"\bmma\.sync", "ptx_local_decl": r"\.local\b",
              "ptx_ld_st_local": r"\b(?:ld|st)\.local"}
SASS_COUNTS = {"sass_hmma": r"\bHMMA\.", "sass_ldl_stl": r"\b(?:LDL|STL)\b",
               "sass_ldgsts": r"\bLDGSTS\b"}
#: What else each family's listing is searched for.
FAMILY_COUNTS = {"mma": ({"ptx_ldmatrix": r"\bldmatrix"}, {"sass_ldsm": r"\bLDSM\b"}),
                 "tf32": ({"ptx_cvt_tf32": r"\bcvt\.rna\.tf32"},
                          {"sass_lds": r"\bLDS\b", "sass_lds64": r"\bLDS\.64\b"})}


def loop_spans(lines: list[str], label: str, branch: str) -> list[tuple[int, int]]:
    """``(label line, branch line)`` of every loop of a listing's ``lines``: a label (``label``,
    a regex whose group 1 is its name) and a later branch back to it (``branch``, group 1 the
    target's name)."""
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(label, line)
        if m:
            labels[m.group(1)] = i
    spans = []
    for i, line in enumerate(lines):
        m = re.search(branch, line)
        if m and labels.get(m.group(1), i) < i:
            spans.append((labels[m.group(1)], i))
    return spans


def local_in_loops(sass: str) -> int:
    """LDL/STL instructions inside a loop of a SASS listing (nvdisasm or cuobjdump): between a
    label and a later branch back to it."""
    lines = sass.splitlines()
    spans = loop_spans(lines, r"\s*(\.L_x_\d+):", r"\bBRA\b.*?(\.L_x_\d+)")
    return sum(1 for i, line in enumerate(lines) if re.search(r"\b(?:LDL|STL)\b", line)
               and any(a < i < b for a, b in spans))


def ptx_mma_loops(ptx: str) -> list[tuple[int, int]]:
    """``[(instructions, mma), ...]`` of each innermost PTX loop that holds ``mma.sync`` (a span
    from a label to a later branch back to it, with no smaller such span inside it), in listing
    order: what a loop issues besides its products. Instructions are the lines that are neither
    labels, comments, braces nor directives (an inline-asm block counts per instruction line)."""
    lines = [line.strip() for line in ptx.splitlines()]
    spans = [(a, b) for a, b in loop_spans(lines, r"(\$L\w+):$", r"\bbra(?:\.uni)?\s+(\$L\w+);")
             if any(re.search(r"\bmma\.sync", x) for x in lines[a:b + 1])]
    inner = [(a, b) for a, b in spans
             if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    out = []
    for a, b in sorted(inner):
        body = [x for x in lines[a:b + 1] if x and not x.startswith(("//", ".", "{", "}", "$"))
                and not x.endswith(":")]
        out.append((len(body), sum(1 for x in body if re.search(r"\bmma\.sync", x))))
    return out


#: One SASS instruction of a cuobjdump / nvdisasm listing: its text up to the ``;`` and its
#: opcode (after any predicate).
SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/\s+((?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)[^;]*);")


def sass_instructions(sass: str) -> list[tuple[str, str]]:
    """``(opcode, text)`` of a listing's instructions in order (opcode without modifiers, text
    with its predicate and operands, spaces collapsed), NOPs left out."""
    return [(m.group(2), " ".join(m.group(1).split())) for m in SASS_INSTRUCTION.finditer(sass)
            if m.group(2) != "NOP"]


def sass_opcode_sequence(sass: str) -> list[str]:
    """The opcodes (without modifiers) of a listing's instructions in order, NOPs left out."""
    return [op for op, _text in sass_instructions(sass)]


def sass_opcodes(sass: str) -> collections.Counter:
    """Static count of each SASS opcode (without its modifiers) in a listing, NOPs left out."""
    return collections.Counter(sass_opcode_sequence(sass))


def split_probe(workdir, ptxas) -> list[str] | None:
    """The SASS instructions (text), in order, between the load and the store of a one-thread
    kernel that splits one float32 with `kernels.ptx.split_tf32` (``big``: x truncated to TF32
    by a mask; ``small = x - big`` plus half a TF32 ulp) and stores ``big ^ small``: what one
    split costs on sm_90 (the store's address arithmetic and the XOR are among them). None
    without ptxas or a disassembler."""
    from numba import cuda, types

    from kernels import ptx

    @cuda.jit
    def one_split(x, y):
        i = cuda.grid(1)
        big, small = ptx.split_tf32(x[i])
        y[i] = big ^ small
    res = compile_sm90(one_split, (types.float32[::1], types.uint32[::1]), "tf32_split_probe",
                       workdir, ptxas)
    sass = disassemble(res["cubin"]) if res["cubin"] else None
    if not sass:
        return None
    ins = sass_instructions(sass)
    start = next((i for i, (op, _t) in enumerate(ins) if op == "LDG"), 0)
    end = next((i for i, (op, _t) in enumerate(ins) if op == "STG"), len(ins))
    return [text for _op, text in ins[start + 1:end]]


def disassemble(cubin: str) -> str | None:
    """SASS of a cubin by cuobjdump or nvdisasm (None when neither is on PATH)."""
    tool = shutil.which("cuobjdump") or shutil.which("nvdisasm")
    if not tool or not cubin:
        return None
    args = [tool, "-sass", cubin] if tool.endswith("cuobjdump") else [tool, cubin]
    return subprocess.run(args, capture_output=True, text=True).stdout


def default_tiles(family: str, kernel: str, head_dim: int, causal: bool, dropout: bool):
    """``(block_m, block_n, unroll)`` a kernel runs by default: the forward's (block_q,
    block_k), the dQ kernel's (query rows, keys per stage), the dK/dV kernel's (key rows,
    queries per stage); the 3xTF32 dK/dV kernel's dropout override; unroll None = default."""
    from kernels import mma_bwd, mma_fwd, tf32_bwd, tf32_fwd
    if kernel == "fwd":
        blocks = (mma_fwd.default_blocks(head_dim, causal) if family == "mma"
                  else tf32_fwd.default_blocks(head_dim))
        return blocks[0], blocks[1], None
    bwd = mma_bwd if family == "mma" else tf32_bwd
    bm, bn = bwd.default_tiles(head_dim)[kernel]      # (dkdv_atomic: the family's own)
    if family == "tf32" and kernel in ("dkdv", "dkdv_atomic"):
        override = tf32_bwd.dkdv_dropout_config(head_dim, bn, dropout)
        return bm, override.get("block_q", bn), override.get("unroll")
    return bm, bn, None


def check_one(family, kernel, head_dim, dtype, causal, *, has_mask=False, dropout=False,
              block_m=None, block_n=None, workdir=None, ptxas=None, opcodes=0) -> dict:
    """Compile one configuration of ``kernel`` ("fwd", "dq" or "dkdv") of a tensor-core
    ``family`` (tiles: its defaults unless given) and count what the module docstring lists;
    with ``opcodes`` > 0 also the listing's most frequent SASS opcodes (static counts) and its
    instructions per ``HMMA``."""
    bm, bn, unroll = default_tiles(family, kernel, head_dim, causal, dropout)
    bm, bn = block_m or bm, block_n or bn
    atomic = kernel == "dkdv_atomic"
    kern, sig, _ = build_kernel(family, "dkdv" if atomic else kernel, head_dim, dtype, causal,
                                block_m=bm, block_n=bn, has_mask=has_mask, dropout=dropout,
                                unroll=unroll, dq_atomic=True if atomic else None)
    name = (f"{family}_{kernel}_d{head_dim}_{bm}x{bn}_{dtype}_{'causal' if causal else 'full'}"
            + ("_mask" if has_mask else "") + ("_dropout" if dropout else ""))
    res = compile_sm90(kern, sig, name, workdir or tempfile.mkdtemp(), ptxas)
    ptx_counts, sass_counts = FAMILY_COUNTS[family]
    rep = {"family": family, "kernel": kernel, "head_dim": head_dim, "dtype": dtype,
           "causal": causal, "mask": has_mask, "dropout": dropout, "block_m": bm, "block_n": bn}
    rep.update({k: len(re.findall(p, res["ptx"])) for k, p in {**PTX_COUNTS, **ptx_counts}.items()})
    rep["ptx_mma_loops"] = ptx_mma_loops(res["ptx"])
    if res["returncode"] is None:
        return rep
    if res["returncode"]:
        rep["ptxas_error"] = (res["ptxas_log"].strip().splitlines() or ["?"])[-1]
        return rep
    e = parse_ptxas(res["ptxas_log"])[0]
    rep["registers"] = e["registers_per_thread"]
    rep["stack_spill_st_ld"] = (e["stack_frame_bytes"], e["spill_store_bytes"],
                                e["spill_load_bytes"])
    sass = disassemble(res["cubin"])
    if sass is not None:
        with open(res["cubin"][:-len(".cubin")] + ".sass", "w") as f:
            f.write(sass)
        rep.update({k: len(re.findall(p, sass)) for k, p in {**SASS_COUNTS, **sass_counts}.items()})
        rep["sass_ldl_stl_in_loop"] = local_in_loops(sass)
        if opcodes:
            counts = sass_opcodes(sass)
            rep["sass_top_opcodes"] = ",".join(f"{op}:{n}" for op, n in counts.most_common(opcodes))
            if counts.get("HMMA"):
                rep["sass_per_hmma"] = round(sum(counts.values()) / counts["HMMA"], 2)
    return rep


def bad(rep: dict) -> bool:
    """Whether a report fails the check: local memory in the PTX or SASS, spills, no mma."""
    return bool(rep["ptx_local_decl"] or rep["ptx_ld_st_local"] or rep["ptx_mma"] == 0
                or rep.get("ptxas_error")
                or rep.get("stack_spill_st_ld") not in (None, (0, 0, 0))
                or rep.get("sass_ldl_stl", 0) or rep.get("sass_hmma", 1) == 0)


def _parse_tiles(spec: str):
    """'mma:64:128x64' -> ("mma", 64, 128, 64)."""
    try:
        family, d, tile = spec.split(":")
        bq, bk = (int(x) for x in tile.lower().split("x"))
        if family not in FAMILY_DTYPES:
            raise ValueError
        return family, int(d), bq, bk
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fwd-tiles entries look like mma:64:128x64, got {spec!r}")


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks check",
                                 description=first_sentence(__doc__))
    ap.add_argument("--families", nargs="+", default=list(FAMILY_DTYPES),
                    choices=list(FAMILY_DTYPES))
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    ap.add_argument("--out", default=None, help="folder for .ptx/.cubin/.sass files")
    ap.add_argument("--fwd-tiles", nargs="*", type=_parse_tiles, default=[],
                    metavar="FAMILY:D:BQxBK",
                    help="also report these forward tilings, causal and not (e.g. mma:64:128x64)")
    ap.add_argument("--ptxas", default=None, help="ptxas binary (default: PATH, then the CUDA "
                                                  "toolkit's)")
    ap.add_argument("--opcodes", type=int, default=0, metavar="N",
                    help="also report each listing's N most frequent SASS opcodes (static "
                         "counts) and its instructions per HMMA")
    ap.add_argument("--tf32-split", action="store_true",
                    help="only print the SASS opcodes of one 3xTF32 split (kernels.ptx.split_tf32)")
    args = ap.parse_args(argv)
    allow_offline_compile()
    out = args.out or tempfile.mkdtemp(prefix="check_")
    os.makedirs(out, exist_ok=True)
    ptxas = find_ptxas(args.ptxas)
    if ptxas is None:
        print("ptxas not found: PTX counts only", flush=True)
    if args.tf32_split:
        ins = split_probe(out, ptxas)
        if ins is None:
            print("no SASS: ptxas and cuobjdump or nvdisasm are needed", flush=True)
            return 1
        print(f"one split (ptx.split_tf32, with the probe's address arithmetic and its XOR), "
              f"{len(ins)} SASS instructions between its load and its store: "
              f"{' '.join(t.split()[0] for t in ins)}", flush=True)
        for text in ins:
            print(f"  {text}", flush=True)
        return 0
    ok = True

    def report(rep, checked=True):
        failed = checked and bad(rep)
        print(("FAIL " if failed else "ok   " if checked else "info ")
              + " ".join(f"{k}={v}" for k, v in rep.items()), flush=True)
        return not failed

    for family in args.families:
        for kernel in args.kernels:
            if kernel not in FAMILY_KERNELS[family]:
                continue
            for d in HEAD_DIMS:
                for dtype in FAMILY_DTYPES[family]:
                    for causal in (False, True):
                        ok &= report(check_one(family, kernel, d, dtype, causal, workdir=out,
                                               ptxas=ptxas, opcodes=args.opcodes))
                ok &= report(check_one(family, kernel, d, FAMILY_DTYPES[family][0], True,
                                       has_mask=True, dropout=True, workdir=out, ptxas=ptxas))
    for family, d, bq, bk in args.fwd_tiles:
        for causal in (False, True):
            report(check_one(family, "fwd", d, FAMILY_DTYPES[family][0], causal, block_m=bq,
                             block_n=bk, workdir=out, ptxas=ptxas), checked=False)
    return 0 if ok else 1
