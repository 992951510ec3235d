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
import sys
import tempfile

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "0")


def signature():
    """Argument types of the 3xTF32 forward kernel (`kernels.mma_check.signature`, float32)."""
    from kernels.mma_check import signature as sig
    return sig(operand="float32")


def bwd_signature(which):
    """Argument types of the backward's dQ (``which="dq"``) or dK/dV (``"dkdv"``) kernel."""
    from kernels.mma_check import bwd_signature as sig
    return sig(which, operand="float32")


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
    from kernels.mma_check import inspect_ptx
    ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
    rep = {"kernel": kernel, "head_dim": d, "causal": causal, "mask": has_mask,
           "dropout": dropout, "block_q": bq, "block_k": bk, "q_split_once": split_once,
           "ptx_mma": len(re.findall(r"\bmma\.sync", ptx)),
           "ptx_cvt_tf32": len(re.findall(r"\bcvt\.rna\.tf32", ptx)),
           "ptx_local_decl": len(re.findall(r"\.local\b", ptx)),
           "ptx_ld_st_local": len(re.findall(r"\b(?:ld|st)\.local", ptx))}
    name = (f"tf32_{kernel}_d{d}_{bq}x{bk}_{'causal' if causal else 'full'}"
            f"{'_mask' if has_mask else ''}{'_drop' if dropout else ''}"
            f"{'' if split_once else '_qraw'}")
    rep.update(inspect_ptx(ptx, name, workdir or tempfile.mkdtemp(), cc,
                           sass_counts=(("sass_lds", r"\bLDS\b"), ("sass_lds64", r"\bLDS\.64\b"))))
    return rep


def main(argv=None):
    from kernels.mma_check import bad
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
                failed = bad(rep)
                ok &= not failed
                print(("FAIL " if failed else "ok   ") + " ".join(f"{k}={v}" for k, v in rep.items()),
                      flush=True)
        for extra in (dict(d=64, causal=True, has_mask=True, dropout=True),
                      dict(d=128, causal=True, has_mask=True, dropout=True)):
            rep = check_one(workdir=out, kernel=kernel, **extra)
            print("info " + " ".join(f"{k}={v}" for k, v in rep.items()), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
