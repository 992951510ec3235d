"""Tile-size and dQ-mode sweep on a GPU, with each compiled kernel's resource usage.

    python -m kernels.tune [--n 4096] [--d 64] [--dtype fp32] [--versions 2 3]

Times the forward for several (block_q, block_k, tm, tn) and the backward with dQ by atomics
and by a second kernel, at B*N = 16384 tokens and H*d = 2048, against SDPA EFFICIENT measured
in the same run (``--versions``: the listed kernel versions A/B in one process); prints registers, local memory (spills) and shared memory per kernel. The
figures go to kernels/NOTES.md by hand only as copies of this command's output.
"""
from __future__ import annotations

import argparse

from .bench import attention_flops, time_cuda


def resources(dispatcher):
    """{signature: (regs/thread, local bytes/thread, static smem bytes/block)} of a compiled kernel."""
    out = {}
    for sig, kern in dispatcher.overloads.items():
        out[str(sig)] = (kern.regs_per_thread, kern.local_mem_per_thread, kern.shared_mem_per_block)
    return out


def sass_mix(dispatcher, top=14):
    """Opcode histogram of a compiled kernel's SASS (static counts): FFMA vs LDS vs integer work,
    and LDL/STL (local memory) if any."""
    import collections
    import re
    mixes = []
    for sig in dispatcher.overloads:
        try:
            sass = dispatcher.inspect_sass(sig)
        except Exception as exc:  # nvdisasm missing
            return f"inspect_sass failed: {exc}"
        ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?",
                         sass, flags=re.M)
        c = collections.Counter(ops)
        mixes.append(f"total {sum(c.values())}: " + " ".join(f"{k}={v}" for k, v in c.most_common(top))
                     + f" | LDL={c.get('LDL', 0)} STL={c.get('STL', 0)}")
    return "; ".join(mixes)


FWD_VARIANTS = {
    64: [(64, 32, 8, 4), (64, 32, 4, 4), (64, 16, 4, 2), (64, 32, 2, 4), (64, 32, 4, 8),
         (32, 32, 2, 4), (32, 32, 4, 4), (64, 64, 8, 8) , (48, 32, 3, 4)],
    128: [(32, 16, 4, 2), (32, 16, 2, 2), (32, 16, 4, 4), (16, 32, 2, 4), (32, 8, 2, 1)],
}
BWD_VARIANTS = {64: [(32, 32, None), (32, 16, None), (16, 32, None), (32, 32, (4, 4))],
                128: [(16, 16, None), (16, 8, None), (8, 16, None)]}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[64])
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--fwd-only", action="store_true")
    ap.add_argument("--max-variants", type=int, default=99)
    ap.add_argument("--max-bwd-variants", type=int, default=99)
    ap.add_argument("--dq-modes", nargs="+", default=["kernel", "atomic"], choices=["kernel", "atomic"])
    ap.add_argument("--versions", type=int, nargs="+", default=None,
                    help="kernel versions to A/B in this run (sets launch.FWD_VERSION and "
                         "BWD_VERSION for each); default: the current ones")
    ap.add_argument("--json", default=None, help="also write the report to this JSON file")
    args = ap.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kernels
    from kernels import launch

    tdt = {"fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    report = {}
    for d in args.d:
        n = args.n
        b, h = max(1, 16384 // n), 2048 // d
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=tdt) for _ in range(4))
        scale = d ** -0.5
        fl = attention_flops(b, h, n, n, d, args.causal, "fwd")

        def sdpa_fwd():
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
        t_eff = time_cuda(torch, sdpa_fwd)[0]
        ref = sdpa_fwd().float()
        print(f"d={d} N={n} B={b} H={h} {args.dtype} causal={args.causal}: SDPA efficient fwd "
              f"{t_eff:.3f} ms = {fl / t_eff / 1e9:.1f} TFLOP/s", flush=True)
        rows = []
        versions = args.versions or [launch.FWD_VERSION]
        fwd_kind = {1: "fwd", 2: "fwd2"}
        for ver in versions:
            launch.FWD_VERSION = ver
            kind = fwd_kind.get(ver, "fwd3")
            for bq, bk, tm, tn in FWD_VARIANTS.get(d, [])[:args.max_variants]:
                try:
                    run = lambda: kernels.forward(q, k, v, scale=scale, causal=args.causal,  # noqa: E731
                                                  block_q=bq, block_k=bk, tiles=(tm, tn))
                    out, _ = run()
                    err = (out.float() - ref).abs().max().item()
                    t = time_cuda(torch, run)[0]
                except Exception as exc:
                    print(f"  v{ver} fwd {bq}x{bk} tiles {tm}x{tn}: {type(exc).__name__}: {exc}", flush=True)
                    continue
                res = [r for key, kern in launch._KERNELS.items() if key[0] == kind and key[2] == d
                       and key[1].block_m == bq and key[1].block_n == bk and key[1].tm == tm
                       and key[1].tn == tn for r in resources(kern).values()]
                rows.append({"version": ver, "block_q": bq, "block_k": bk, "tm": tm, "tn": tn, "ms": t,
                             "tflops": fl / t / 1e9, "x_eff": t_eff / t, "max_err": err,
                             "regs_local_smem": res})
                print(f"  v{ver} fwd {bq:3d}x{bk:3d} tiles {tm}x{tn}: {t:8.3f} ms {fl / t / 1e9:6.2f} "
                      f"TFLOP/s x_eff {t_eff / t:5.2f} err {err:.1e} regs/local/smem {res}", flush=True)
        if args.fwd_only:
            report[d] = {"sdpa_efficient_fwd_ms": t_eff, "rows": rows}
            for key, kern in launch._KERNELS.items():
                if key[0].startswith("fwd") and key[2] == d:
                    print(f"  SASS {key[0]} {key[1]}: {sass_mix(kern)}", flush=True)
            continue
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

        def sdpa_bwd():
            with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal).backward(do)
        t_eff_fb = time_cuda(torch, sdpa_bwd)[0]
        flb = attention_flops(b, h, n, n, d, args.causal, "fwd+bwd") - fl
        print(f"  SDPA efficient fwd+bwd {t_eff_fb:.3f} ms", flush=True)
        for ver in (args.versions or [launch.BWD_VERSION]):
            launch.BWD_VERSION = ver
            out, lse = kernels.forward(q, k, v, scale=scale, causal=args.causal)
            for bq, bk, tiles in BWD_VARIANTS.get(d, [])[:args.max_bwd_variants]:
                for mode in args.dq_modes:
                    try:
                        run = lambda: kernels.backward(q, k, v, out, lse, do, scale=scale,  # noqa: E731
                                                       causal=args.causal, block_q=bq, block_k=bk,
                                                       dq_mode=mode, tiles=tiles)
                        run()
                        t = time_cuda(torch, run)[0]
                    except Exception as exc:
                        print(f"  v{ver} bwd {bq}x{bk} {mode}: {type(exc).__name__}: {exc}", flush=True)
                        continue
                    rows.append({"version": ver, "bwd_block_q": bq, "bwd_block_k": bk, "tiles": tiles,
                                 "dq_mode": mode, "ms": t, "tflops": flb / t / 1e9})
                    print(f"  v{ver} bwd {bq:3d}x{bk:3d} tiles {tiles} dq={mode:6}: {t:8.3f} ms "
                          f"{flb / t / 1e9:6.2f} TFLOP/s", flush=True)
        report[d] = {"sdpa_efficient_fwd_ms": t_eff, "sdpa_efficient_fwdbwd_ms": t_eff_fb, "rows": rows}
        for key, kern in launch._KERNELS.items():
            if len(key) > 2 and key[0].startswith(("dkdv", "dq", "delta")) and key[2] == d:
                print(f"  {key[0]} {key[1]}: regs/local/smem {list(resources(kern).values())}", flush=True)
        for key, kern in launch._KERNELS.items():
            if len(key) > 2 and key[0].startswith(("fwd", "dkdv", "dq")) and key[2] == d:
                print(f"  SASS {key[0]} {key[1]}: {sass_mix(kern)}", flush=True)
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
