"""Benchmark of the tensor-core half-precision attention against PyTorch SDPA, in one run.

``python -m kernels.bench_mma --out results/bench_mma_fwd_<gpu>.json`` times
`kernels.flash_mma_fwd.forward` and SDPA's FLASH_ATTENTION (FlashAttention-2) and CUDNN backends
on the same float16 inputs, N in {2048, 4096}, d in {64, 128}, causal on and off, with
FlashAttention's benchmark shapes (batch = 16384 / N, heads = 2048 / d). Median (p10, p90) of
CUDA-event times after warm-up; TFLOP/s counts 4 N^2 d per head (halved when causal). It writes
a ``ioaware.results/1`` file with provenance and prints the table with our ratio to each backend.

``--mode fwdbwd`` (default N in {1024, 2048, 4096, 8192}) times forward + backward instead:
ours is `kernels.forward` then `kernels.backward` (the tensor-core forward and backward through
the package's dispatch), SDPA's is its forward then ``torch.autograd.grad`` of the output with
the same random ``dout``. TFLOP/s count 3.5 x the forward's FLOPs (2 matmuls forward, 5
backward), halved when causal. Our backward alone is timed too (``ours_bwd_ms``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import subprocess
import sys


def _provenance(command):
    import numba
    import torch
    try:
        import importlib.metadata as md
        numba_cuda = md.version("numba-cuda")
    except Exception:
        numba_cuda = "unknown"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True).stdout.strip().splitlines()[0]
    except Exception:
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "cuda": str(torch.version.cuda),
            "torch": torch.__version__, "numba": numba.__version__, "numba_cuda": numba_cuda,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command}


def time_ms(fn, warmup=5, reps=30):
    """Median, p10, p90 of ``reps`` CUDA-event timings (ms) after ``warmup`` calls."""
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    from kernels.bench import event_ms
    times = sorted(event_ms(torch, fn) for _ in range(reps))
    q = lambda f: times[min(len(times) - 1, int(round(f * (len(times) - 1))))]  # noqa: E731
    return q(0.5), q(0.1), q(0.9)


def main(argv=None):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from kernels.flash_mma_fwd import default_blocks, forward

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="results JSON path")
    ap.add_argument("--seq", type=int, nargs="+", default=None,
                    help="sequence lengths (default 2048 4096; fwdbwd: 1024 2048 4096 8192)")
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--mode", choices=("fwd", "fwdbwd"), default="fwd")
    args = ap.parse_args(argv)
    command = "python -m kernels.bench_mma " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.mode == "fwdbwd":
        return bench_fwdbwd(args, command)
    if args.seq is None:
        args.seq = [2048, 4096]

    dtype = torch.float16
    records, rows = [], []
    configs = [(n, d, c) for n in args.seq for d in args.dims for c in (False, True)]
    for i, (n, d, causal) in enumerate(configs):
        batch, heads = max(1, 16384 // n), 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn((batch, heads, n, d), device="cuda", dtype=dtype, generator=g)
                   for _ in range(3))
        scale = 1 / math.sqrt(d)
        flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
        bq, bk = default_blocks(d, causal)
        runs = {"ioaware-numba": lambda: forward(q, k, v, scale=scale, causal=causal)}
        blocks = {"ioaware-numba": (bq, bk)}
        if d == 64:  # the first version's tiles (64 x 64, one m-tile per warp), same run
            runs["ioaware-numba-64x64"] = lambda: forward(q, k, v, scale=scale, causal=causal,
                                                          block_q=64, block_k=64)
            blocks["ioaware-numba-64x64"] = (64, 64)
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            runs[name] = run
        times = {}
        for name, fn in runs.items():
            try:
                med, p10, p90 = time_ms(fn, reps=args.reps)
            except Exception as exc:  # a backend unavailable for this shape
                print(f"  {name}: not run ({type(exc).__name__}: {exc})", flush=True)
                continue
            times[name] = med
            records.append({
                "kernel": name.replace("-64x64", ""), "schedule": "flash2", "pass": "fwd", "dtype": "fp16",
                "batch": batch, "heads": heads, "heads_kv": heads, "seq_len_q": n, "seq_len_k": n,
                "head_dim": d, "causal": causal,
                "block_q": blocks.get(name, (None, None))[0],
                "block_k": blocks.get(name, (None, None))[1],
                "time_ms": med, "time_ms_p10": p10, "time_ms_p90": p90,
                "peak_extra_bytes": None, "dram_read_bytes": None, "dram_write_bytes": None,
                "l2_bytes": None, "global_load_bytes": None, "global_store_bytes": None,
                "flops_executed": None, "tflops": flops / med / 1e9,
                "implementation": "kernels.flash_mma_fwd" if name in blocks else None,
            })
        ours = times.get("ioaware-numba")
        row = {"N": n, "d": d, "causal": causal, "ours_ms": ours,
               "ours_tflops": flops / ours / 1e9 if ours else None}
        if "ioaware-numba-64x64" in times:
            row["ours_64x64_tflops"] = flops / times["ioaware-numba-64x64"] / 1e9
        for name in ("sdpa-flash", "sdpa-cudnn"):
            if name in times and ours:
                row[name + "_tflops"] = flops / times[name] / 1e9
                row["ratio_vs_" + name] = times[name] / ours   # throughput ratio ours / theirs
        rows.append(row)
        print(f"[{i + 1}/{len(configs)}] " + json.dumps(row), flush=True)
        del q, k, v
        torch.cuda.empty_cache()

    result = {"schema": "ioaware.results/1", "provenance": _provenance(command), "records": records}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\n{'N':>5} {'d':>4} {'causal':>6} {'ours TF/s':>9} {'FA2 TF/s':>9} {'x FA2':>6} "
          f"{'cuDNN TF/s':>10} {'x cuDNN':>7}")
    for r in rows:
        f = lambda key, w, p=1: (f"{r[key]:{w}.{p}f}" if r.get(key) is not None else " " * (w - 1) + "-")  # noqa: E731,E501
        print(f"{r['N']:>5} {r['d']:>4} {str(r['causal']):>6} {f('ours_tflops', 9)} "
              f"{f('sdpa-flash_tflops', 9)} {f('ratio_vs_sdpa-flash', 6, 2)} "
              f"{f('sdpa-cudnn_tflops', 10)} {f('ratio_vs_sdpa-cudnn', 7, 2)}")
    print(f"provenance: {json.dumps(result['provenance'])}")
    return 0


def bench_fwdbwd(args, command):
    """Forward + backward of ours and SDPA FLASH / CUDNN; see the module docstring."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kernels
    from kernels import flash_mma_bwd

    seqs = args.seq or [1024, 2048, 4096, 8192]
    dtype = torch.float16
    records, rows = [], []
    configs = [(n, d, c) for n in seqs for d in args.dims for c in (False, True)]
    for i, (n, d, causal) in enumerate(configs):
        batch, heads = max(1, 16384 // n), 2048 // d
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn((batch, heads, n, d), device="cuda", dtype=dtype,
                                     generator=g) for _ in range(4))
        scale = 1 / math.sqrt(d)
        flops = 3.5 * 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
        out, lse = kernels.forward(q, k, v, scale=scale, causal=causal)

        def ours():
            o, l_ = kernels.forward(q, k, v, scale=scale, causal=causal)
            return kernels.backward(q, k, v, o, l_, dout, scale=scale, causal=causal)

        def ours_bwd():
            return kernels.backward(q, k, v, out, lse, dout, scale=scale, causal=causal)

        runs = {"ioaware-numba": ours, "ioaware-numba-bwd": ours_bwd}
        qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):
            def run(backend=backend):
                with sdpa_kernel(backend):
                    o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, scale=scale)
                    return torch.autograd.grad(o, (qg, kg, vg), dout)
            runs[name] = run
        times = {}
        for name, fn in runs.items():
            try:
                med, p10, p90 = time_ms(fn, reps=args.reps)
            except Exception as exc:  # a backend unavailable for this shape
                print(f"  {name}: not run ({type(exc).__name__}: {exc})", flush=True)
                continue
            times[name] = med
            ours_impl = name.startswith("ioaware")
            tiles = flash_mma_bwd.default_tiles(d)
            records.append({
                "kernel": "ioaware-numba" if ours_impl else name, "schedule": "flash2",
                "pass": "bwd" if name.endswith("-bwd") else "fwd+bwd", "dtype": "fp16",
                "batch": batch, "heads": heads, "heads_kv": heads, "seq_len_q": n, "seq_len_k": n,
                "head_dim": d, "causal": causal,
                "block_q": tiles["dq"][0] if ours_impl else None,
                "block_k": tiles["dkdv"][0] if ours_impl else None,
                "time_ms": med, "time_ms_p10": p10, "time_ms_p90": p90,
                "peak_extra_bytes": None, "dram_read_bytes": None, "dram_write_bytes": None,
                "l2_bytes": None, "global_load_bytes": None, "global_store_bytes": None,
                "flops_executed": None,
                "tflops": (flops / 3.5 * 2.5 if name.endswith("-bwd") else flops) / med / 1e9,
                "implementation": ("kernels.flash_mma_fwd + kernels.flash_mma_bwd" if ours_impl
                                   else None),
            })
        ours_ms = times.get("ioaware-numba")
        row = {"N": n, "d": d, "causal": causal, "ours_ms": ours_ms,
               "ours_bwd_ms": times.get("ioaware-numba-bwd"),
               "ours_tflops": flops / ours_ms / 1e9 if ours_ms else None}
        for name in ("sdpa-flash", "sdpa-cudnn"):
            if name in times and ours_ms:
                row[name + "_ms"] = times[name]
                row[name + "_tflops"] = flops / times[name] / 1e9
                row["ratio_vs_" + name] = times[name] / ours_ms   # throughput ratio ours / theirs
        rows.append(row)
        print(f"[{i + 1}/{len(configs)}] " + json.dumps(row), flush=True)
        del q, k, v, dout, qg, kg, vg, out, lse
        torch.cuda.empty_cache()

    result = {"schema": "ioaware.results/1", "provenance": _provenance(command), "records": records}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print("\nforward + backward, float16, TFLOP/s = 3.5 x forward FLOPs (halved when causal)")
    print(f"{'N':>5} {'d':>4} {'causal':>6} {'ours ms':>8} {'bwd ms':>7} {'ours TF/s':>9} "
          f"{'FA2 TF/s':>9} {'x FA2':>6} {'cuDNN TF/s':>10} {'x cuDNN':>7}")
    for r in rows:
        f = lambda key, w, p=1: (f"{r[key]:{w}.{p}f}" if r.get(key) is not None else " " * (w - 1) + "-")  # noqa: E731,E501
        print(f"{r['N']:>5} {r['d']:>4} {str(r['causal']):>6} {f('ours_ms', 8, 2)} "
              f"{f('ours_bwd_ms', 7, 2)} {f('ours_tflops', 9)} "
              f"{f('sdpa-flash_tflops', 9)} {f('ratio_vs_sdpa-flash', 6, 2)} "
              f"{f('sdpa-cudnn_tflops', 10)} {f('ratio_vs_sdpa-cudnn', 7, 2)}")
    print(f"provenance: {json.dumps(result['provenance'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
