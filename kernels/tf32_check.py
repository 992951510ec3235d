"""Compile-only checks of the 3xTF32 kernels: PTX, ptxas resource usage, SASS.

``python -m kernels.tf32_check [--out DIR] [--kernels fwd dq dkdv]`` compiles the forward of
`kernels.flash_tf32_fwd` and the dQ and dK/dV kernels of `kernels.flash_tf32_bwd` for head dims
64 and 128, causal and not (plus mask + dropout, as information), for
sm_90, without launching anything (it needs NVVM; no GPU). For each configuration it reports
the ``mma.sync`` and ``cvt.rna.tf32`` counts in the PTX, ``.local`` declarations and
``ld.local`` / ``st.local`` (local-memory traffic), and, where ``ptxas`` is on PATH, registers
and spill bytes; where ``cuobjdump``/``nvdisasm`` is available, the SASS count of ``HMMA``,
``LDL``/``STL``, ``LDS`` and ``LDGSTS``. Exit status 1 if a default configuration has local
memory, spills or no mma.
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


def signature():
    from numba import types
    A = lambda dt, nd: types.Array(dt, nd, "C")  # noqa: E731
    f4 = A(types.float32, 4)
    return (f4, f4, f4, f4, A(types.float32, 3), A(types.int32, 2), A(types.int32, 1),
            types.int64, types.int64, types.int64, types.int64, types.int64,
            A(types.uint8, 4), types.int64, types.int64, types.int64, types.float32,
            types.uint32, types.uint32, types.float32)


def bwd_signature(which):
    """Argument types of the backward's dQ (``which="dq"``) or dK/dV (``"dkdv"``) kernel."""
    from numba import types
    A = lambda dt, nd: types.Array(dt, nd, "C")  # noqa: E731
    f4, f3 = A(types.float32, 4), A(types.float32, 3)
    tail = (A(types.int32, 2), A(types.int32, 1), types.int64, types.int64, types.int64,
            types.int64, types.int64, A(types.uint8, 4), types.int64, types.int64, types.int64,
            types.float32, types.float32, types.uint32, types.uint32, types.float32)
    if which == "dq":
        return (f4, f4, f4, f4, f4, f3, f3, f4) + tail
    return (f4, f4, f4, f4, f3, f3, f4, f4) + tail


def check_one(d, causal, has_mask=False, dropout=False, workdir=None, cc=(9, 0), block_q=None,
              block_k=None, split_once=None, kernel="fwd"):
    """Compile one configuration of ``kernel`` ("fwd", "dq" or "dkdv"); returns a dict of counts
    (see the module docstring). For the backward, block_q/block_k are the kernel's tile (rows
    per block, rows per stage)."""
    from numba import cuda
    if kernel == "fwd":
        from kernels.flash_tf32_fwd import default_blocks, get_kernel, q_split_once
        bq, bk = default_blocks(d)
        bq, bk = block_q or bq, block_k or bk
        split_once = q_split_once(d) if split_once is None else split_once
        kern = get_kernel(d, bq, bk, causal, has_mask, dropout, split_once)
        sig = signature()
    else:
        from kernels import flash_tf32_bwd as B
        bq, bk = B.default_tiles(d)[kernel]
        bq, bk = block_q or bq, block_k or bk
        split_once = False
        get = B.get_dq_kernel if kernel == "dq" else B.get_dkdv_kernel
        kern = get(d, bq, bk, causal, has_mask, dropout)
        sig = bwd_signature(kernel)
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
    rep = {"kernel": kernel, "head_dim": d, "causal": causal, "mask": has_mask,
           "dropout": dropout, "block_q": bq, "block_k": bk, "q_split_once": split_once,
           "ptx_mma": len(re.findall(r"\bmma\.sync", ptx)),
           "ptx_cvt_tf32": len(re.findall(r"\bcvt\.rna\.tf32", ptx)),
           "ptx_local_decl": len(re.findall(r"\.local\b", ptx)),
           "ptx_ld_st_local": len(re.findall(r"\b(?:ld|st)\.local", ptx))}
    workdir = workdir or tempfile.mkdtemp()
    os.makedirs(workdir, exist_ok=True)
    name = (f"tf32_{kernel}_d{d}_{bq}x{bk}_{'causal' if causal else 'full'}"
            f"{'_mask' if has_mask else ''}{'_drop' if dropout else ''}"
            f"{'' if split_once else '_qraw'}")
    ptx_path = os.path.join(workdir, name + ".ptx")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    ptxas = shutil.which("ptxas")
    if ptxas:
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
            rep["sass_lds"] = len(re.findall(r"\bLDS\b", sass))
            rep["sass_lds64"] = len(re.findall(r"\bLDS\.64\b", sass))
            rep["sass_ldgsts"] = len(re.findall(r"\bLDGSTS\b", sass))
    return rep


def _bad(rep):
    return bool(rep["ptx_local_decl"] or rep["ptx_ld_st_local"] or rep["ptx_mma"] == 0
                or rep.get("ptxas_error")
                or rep.get("stack_spill_st_ld") not in (None, (0, 0, 0))
                or rep.get("sass_ldl_stl", 0) or rep.get("sass_hmma", 1) == 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="folder for .ptx/.cubin/.sass files")
    ap.add_argument("--kernels", nargs="+", default=["fwd", "dq", "dkdv"],
                    choices=["fwd", "dq", "dkdv"], help="which kernels to compile")
    args = ap.parse_args(argv)
    from kernels.mma_check import _allow_offline_compile
    _allow_offline_compile()
    out = args.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    ok = True
    for kernel in args.kernels:
        for d in (64, 128):
            for causal in (False, True):
                rep = check_one(d, causal, workdir=out, kernel=kernel)
                bad = _bad(rep)
                ok &= not bad
                print(("FAIL " if bad else "ok   ") + " ".join(f"{k}={v}" for k, v in rep.items()),
                      flush=True)
        for extra in (dict(d=64, causal=True, has_mask=True, dropout=True),
                      dict(d=128, causal=True, has_mask=True, dropout=True)):
            rep = check_one(workdir=out, kernel=kernel, **extra)
            print("info " + " ".join(f"{k}={v}" for k, v in rep.items()), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
