"""Compile-only checks of the tensor-core kernels: PTX, ptxas resource usage, SASS.

``python -m kernels.mma_check [--out DIR]`` compiles `kernels.flash_mma_fwd` and the two
backward kernels of `kernels.flash_mma_bwd` (dQ, dK/dV) for head dims 64
and 128, float16 and bfloat16, causal and not, for sm_90, without launching anything (it needs
NVVM; no GPU). For each configuration it reports what the inner loop must not contain and must
contain: ``mma.sync`` count in the PTX, ``.local`` declarations / ``ld.local`` / ``st.local``
(local-memory traffic), and, where ``ptxas`` is on PATH, its register count and spill bytes;
where ``nvdisasm``/``cuobjdump`` is available, the SASS count of ``HMMA`` and ``LDL``/``STL``
(all, and inside loops). ``--fwd-tiles 64:128x64`` also reports other forward tilings.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")


def _allow_offline_compile():
    """Let Numba compile PTX without NVRTC/driver present (target sm_90 given explicitly)."""
    try:
        import numba.cuda.cudadrv.nvrtc as nvrtc
        import numba.cuda.cuda_paths as cuda_paths
        try:
            nvrtc.get_supported_ccs()
        except Exception:
            nvrtc.get_supported_ccs = lambda: ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
            cuda_paths._get_nvrtc_path = lambda: None
    except ImportError:
        pass


def signature(has_mask=False, operand="int16"):
    """Argument types of a tensor-core forward kernel; ``operand`` is the element type of q, k,
    v and out (int16 words for the half-precision kernel, float32 for the 3xTF32 one)."""
    from numba import types
    A = lambda dt, nd: types.Array(dt, nd, "C")  # noqa: E731
    x4 = A(getattr(types, operand), 4)
    return (x4, x4, x4, x4, A(types.float32, 3), A(types.int32, 2), A(types.int32, 1),
            types.int64, types.int64, types.int64, types.int64, types.int64,
            A(types.uint8, 4), types.int64, types.int64, types.int64, types.float32,
            types.uint32, types.uint32, types.float32)


def bwd_signature(which, operand="int16"):
    """Argument types of the dQ (``which="dq"``) or dK/dV (``"dkdv"``) kernel; ``operand`` as
    in `signature`."""
    from numba import types
    A = lambda dt, nd: types.Array(dt, nd, "C")  # noqa: E731
    x4, f3 = A(getattr(types, operand), 4), A(types.float32, 3)
    tail = (A(types.int32, 2), A(types.int32, 1), types.int64, types.int64, types.int64,
            types.int64, types.int64, A(types.uint8, 4), types.int64, types.int64, types.int64,
            types.float32, types.float32, types.uint32, types.uint32, types.float32)
    if which == "dq":
        return (x4, x4, x4, x4, x4, f3, f3, x4) + tail
    return (x4, x4, x4, x4, f3, f3, x4, x4) + tail


def local_in_loops(sass: str) -> int:
    """LDL/STL instructions inside a loop of a SASS listing (nvdisasm or cuobjdump): between a
    label and a later branch back to it."""
    lines = sass.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = i
    spans = []
    for i, line in enumerate(lines):
        m = re.search(r"\bBRA\b.*?(\.L_x_\d+)", line)
        if m and labels.get(m.group(1), i) < i:
            spans.append((labels[m.group(1)], i))
    return sum(1 for i, line in enumerate(lines) if re.search(r"\b(?:LDL|STL)\b", line)
               and any(a < i < b for a, b in spans))


def inspect_ptx(ptx: str, name: str, workdir: str, cc=(9, 0), sass_counts=()) -> dict:
    """Write ``name``.ptx, run ``ptxas -v`` (if on PATH) and a disassembler (cuobjdump or
    nvdisasm, if on PATH): registers, stack/spill bytes, and SASS counts of HMMA, LDL/STL (all,
    and inside loops: `local_in_loops`), LDGSTS and each extra ``(key, regex)`` of
    ``sass_counts``."""
    rep: dict = {}
    os.makedirs(workdir, exist_ok=True)
    ptx_path = os.path.join(workdir, name + ".ptx")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    ptxas = shutil.which("ptxas")
    if not ptxas:
        return rep
    cubin = os.path.join(workdir, name + ".cubin")
    r = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", ptx_path, "-o", cubin],
                       capture_output=True, text=True)
    info = r.stderr
    if r.returncode:
        rep["ptxas_error"] = info.strip().splitlines()[-1] if info.strip() else r.returncode
    m = re.search(r"Used (\d+) registers", info)
    rep["registers"] = int(m.group(1)) if m else None
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                  info)
    rep["stack_spill_st_ld"] = tuple(int(x) for x in m.groups()) if m else None
    tool = shutil.which("cuobjdump") or shutil.which("nvdisasm")
    if tool and r.returncode == 0:
        args = [tool, "-sass", cubin] if tool.endswith("cuobjdump") else [tool, cubin]
        sass = subprocess.run(args, capture_output=True, text=True).stdout
        with open(os.path.join(workdir, name + ".sass"), "w") as f:
            f.write(sass)
        rep["sass_hmma"] = len(re.findall(r"\bHMMA\.", sass))
        rep["sass_ldl_stl"] = len(re.findall(r"\b(?:LDL|STL)\b", sass))
        rep["sass_ldl_stl_in_loop"] = local_in_loops(sass)
        for key, pattern in sass_counts:
            rep[key] = len(re.findall(pattern, sass))
        rep["sass_ldgsts"] = len(re.findall(r"\bLDGSTS\b", sass))
    return rep


def bad(rep: dict) -> bool:
    """Whether a report fails the check: local memory in the PTX or SASS, spills, no mma."""
    return bool(rep["ptx_local_decl"] or rep["ptx_ld_st_local"] or rep["ptx_mma"] == 0
                or rep.get("ptxas_error")
                or rep.get("stack_spill_st_ld") not in (None, (0, 0, 0))
                or rep.get("sass_ldl_stl", 0) or rep.get("sass_hmma", 1) == 0)


def check_one(d, bf16, causal, has_mask=False, dropout=False, workdir=None, cc=(9, 0),
              block_q=None, kernel="fwd", block_k=None):
    """Compile one configuration of ``kernel`` ("fwd", "dq" or "dkdv") and report its counts."""
    from numba import cuda
    from kernels.flash_mma_fwd import default_blocks, get_kernel
    if kernel == "fwd":
        bq, bk = default_blocks(d, causal)
        bq, bk = block_q or bq, block_k or bk
        kern = get_kernel(d, bq, bk, bf16, causal, has_mask, dropout)
        sig = signature(has_mask)
    else:
        from kernels import flash_mma_bwd as B
        tiles = B.default_tiles(d)
        if kernel == "dq":
            bq, bk = tiles["dq"]
            kern = B.get_dq_kernel(d, bq, bk, bf16, causal, has_mask, dropout)
        else:
            bk, bq = tiles["dkdv"]
            kern = B.get_dkdv_kernel(d, bk, bq, bf16, causal, has_mask, dropout)
        sig = bwd_signature(kernel)
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
    rep = {"kernel": kernel, "head_dim": d, "dtype": "bf16" if bf16 else "fp16", "causal": causal,
           "mask": has_mask, "dropout": dropout, "block_q": bq, "block_k": bk,
           "ptx_mma": len(re.findall(r"\bmma\.sync", ptx)),
           "ptx_ldmatrix": len(re.findall(r"\bldmatrix", ptx)),
           "ptx_local_decl": len(re.findall(r"\.local\b", ptx)),
           "ptx_ld_st_local": len(re.findall(r"\b(?:ld|st)\.local", ptx))}
    name = (f"{kernel}_d{d}_bq{bq}_bk{bk}_{rep['dtype']}_{'causal' if causal else 'full'}"
            + ("_mask_drop" if has_mask or dropout else ""))
    rep.update(inspect_ptx(ptx, name, workdir or tempfile.mkdtemp(), cc,
                           sass_counts=(("sass_ldsm", r"\bLDSM\b"),)))
    return rep


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for .ptx/.cubin/.sass files")
    ap.add_argument("--fwd-tiles", nargs="*", default=[], metavar="D:BQxBK",
                    help="also report these forward tilings, causal and not (e.g. 64:128x64)")
    args = ap.parse_args(argv)
    _allow_offline_compile()
    out = args.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    ok = True

    def verdict(rep):
        failed = bad(rep)
        print(("FAIL " if failed else "ok   ") + " ".join(f"{k}={v}" for k, v in rep.items()),
              flush=True)
        return not failed

    for kernel in ("fwd", "dq", "dkdv"):
        for d in (64, 128):
            for bf16 in (False, True):
                for causal in (False, True):
                    ok &= verdict(check_one(d, bf16, causal, workdir=out, kernel=kernel))
    for extra in (dict(has_mask=True, dropout=True), dict(block_q=64)):
        rep = check_one(64, False, True, workdir=out, **extra)
        print("info " + " ".join(f"{k}={v}" for k, v in rep.items()), flush=True)
    for kernel in ("dq", "dkdv"):     # backward with mask and dropout: checked like the defaults
        for d in (64, 128):
            ok &= verdict(check_one(d, False, True, has_mask=True, dropout=True, workdir=out,
                                    kernel=kernel))
    for spec in args.fwd_tiles:       # other tilings: reported, not checked
        d, tile = spec.split(":")
        bq, bk = (int(x) for x in tile.lower().split("x"))
        for causal in (False, True):
            rep = check_one(int(d), False, causal, workdir=out, block_q=bq, block_k=bk)
            print("info " + " ".join(f"{k}={v}" for k, v in rep.items()), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
