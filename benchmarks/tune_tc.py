"""Block sizes of the tensor-core forwards, timed: which (block_q, block_k) to default to.

    python -m kernels.tune_tc [--kernel mma|tf32] [--n 4096] [--d 64 128] [--out FILE.json]

For each head dim, causal off and on, and each block size the kernel accepts, it times
`kernels.flash_mma_fwd.forward` (float16) or `kernels.flash_tf32_fwd.forward` (float32) on the
benchmark's shapes (batch = 16384 / N, heads = 2048 / d) by CUDA events behind a device-side
sleep (GPU time only: `kernels.bench.time_cuda(timing="device")`), next to SDPA FLASH (float16)
or EFFICIENT (float32) on the same inputs, checks each output against SDPA, and prints the
table with each block size's ratio to the SDPA backend. Writes the rows with provenance.
"""
from __future__ import annotations

import argparse
import json
import sys


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernel", choices=("mma", "tf32"), default="mma")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.bench import provenance_versions, time_cuda
    if args.kernel == "mma":
        from kernels import flash_mma_fwd as mod
        dtype, backend, choices = torch.float16, SDPBackend.FLASH_ATTENTION, [
            (bq, bk) for bq in (64, 128) for bk in (32, 64)]
    else:
        from kernels import flash_tf32_fwd as mod
        dtype, backend, choices = torch.float32, SDPBackend.EFFICIENT_ATTENTION, [
            (bq, bk) for bq in mod.BLOCK_Q_CHOICES for bk in mod.BLOCK_K_CHOICES]
    n = args.n
    rows = []
    print(f"{'d':>4} {'causal':>6} {'bq x bk':>8} {'ms':>8} {'sdpa ms':>8} {'ratio':>6} "
          f"{'max err':>9}")
    for d in args.d:
        b, h = max(1, 16384 // n), max(1, 2048 // d)
        g = torch.Generator(device="cuda").manual_seed(d)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype, generator=g)
                   for _ in range(3))
        for causal in (False, True):
            with sdpa_kernel([backend]):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def sdpa():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                t_ref = time_cuda(torch, sdpa, timing="device")[0]
            for bq, bk in choices:
                try:
                    out, _ = mod.forward(q, k, v, scale=d ** -0.5, causal=causal,
                                         block_q=bq, block_k=bk)
                except ValueError as exc:      # a block size this head dim does not take
                    print(f"{d:>4} {str(causal):>6} {bq:>3} x {bk:<3} refused: {exc}")
                    continue
                err = float((out.float() - ref.float()).abs().max())

                def ours():
                    mod.forward(q, k, v, scale=d ** -0.5, causal=causal, block_q=bq, block_k=bk)
                t = time_cuda(torch, ours, timing="device")[0]
                rows.append({"kernel": args.kernel, "head_dim": d, "causal": causal,
                             "seq_len": n, "batch": b, "heads": h, "block_q": bq, "block_k": bk,
                             "time_ms": t, "sdpa_time_ms": t_ref, "ratio": t_ref / t,
                             "max_abs_err_vs_sdpa": err})
                print(f"{d:>4} {str(causal):>6} {bq:>3} x {bk:<3} {t:8.3f} {t_ref:8.3f} "
                      f"{t_ref / t:6.2f} {err:9.2e}", flush=True)
    if args.out:
        prov = dict(provenance_versions(torch), timing="device",
                    command="python -m kernels.tune_tc " + " ".join(
                        sys.argv[1:] if argv is None else argv))
        with open(args.out, "w") as f:
            json.dump({"schema": "ioaware.tune_tc/1", "provenance": prov, "rows": rows}, f,
                      indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
