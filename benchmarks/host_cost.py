"""Host cost of one call of the tensor-core kernels, with and without `kernels.fastlaunch`.

    python -m kernels.host_cost [--n 2048] [--out results/host_cost_<gpu>_<date>.json]

For float16 and float32 torch CUDA inputs (B=8, H=16, d 64 and 128, non-causal), it times the
host side of `kernels.forward` and of `kernels.backward` (median of 30 calls, each made while the
GPU sleeps, so the call returns as soon as its launches are enqueued: `kernels.bench.host_call_ms`)
with Numba's own launch (``fastlaunch.FAST_LAUNCH = False``) and with the cached-overload launch,
in the same process, and the GPU time of the forward alone (CUDA events behind a device-side
sleep), and splits the fast-launch forward's host time into the code before the launch, the
launch, and the driver call alone (`launch_split`). It also prints the 25 most expensive
functions of a fast-launch forward (cProfile), by own and by cumulative time.
Writes a JSON file with provenance.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys


def launch_split(torch, fn, reps=30):
    """Where the host time of one fast-launch call of ``fn`` (a forward: one launch) goes:
    ``pre_launch`` (everything before `fastlaunch.launch`, which is replaced by a no-op that
    keeps its arguments), ``launch`` (`fastlaunch.launch` alone on those arguments: signature
    key, marshalling, the driver call) and ``driver_call`` (the driver call alone, arguments
    marshalled beforehand). Medians of ``reps`` calls, ms, by `kernels.bench.host_call_ms`."""
    from cuda.core import launch as core_launch

    from kernels import fastlaunch
    from kernels.bench import host_call_ms
    seen = {}
    orig = fastlaunch.launch

    def keep(kern, grid, block, stream, args, sharedmem=0):
        seen.update(kern=kern, grid=grid, block=block, stream=stream, args=args,
                    sharedmem=sharedmem)
    fastlaunch.launch = keep
    try:
        pre = host_call_ms(torch, fn, reps=reps)
    finally:
        fastlaunch.launch = orig
    k = seen

    def launch_only():
        orig(k["kern"], k["grid"], k["block"], k["stream"], k["args"], k["sharedmem"])
    launch_only()
    plan = fastlaunch.plan_for(k["kern"], k["args"])
    cfg = plan.config(k["grid"], k["block"], k["sharedmem"])
    handle = plan.handle(fastlaunch.current_device_id())
    marshalled = plan.marshal(k["args"], k["stream"])
    out = {"pre_launch": pre, "launch": host_call_ms(torch, launch_only, reps=reps),
           "driver_call": host_call_ms(torch, lambda: core_launch(k["stream"], cfg, handle,
                                                                  *marshalled), reps=reps),
           "launch_values": len(marshalled)}
    torch.cuda.synchronize()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import torch
    import kernels
    from kernels import fastlaunch
    from kernels.bench import provenance_versions, host_call_ms, time_cuda

    prov = dict(provenance_versions(torch), command="python -m kernels.host_cost " + " ".join(
        sys.argv[1:] if argv is None else argv))
    rows = []
    profile_text = ""
    for dt_name, dt in (("fp16", torch.float16), ("fp32", torch.float32)):
        for d in (64, 128):
            g = torch.Generator(device="cuda").manual_seed(d)
            q, k, v, do = (torch.randn(8, 16, args.n, d, device="cuda", dtype=dt, generator=g)
                           for _ in range(4))
            scale = d ** -0.5
            out, lse = kernels.forward(q, k, v, scale=scale)
            kernels.backward(q, k, v, out, lse, do, scale=scale)
            torch.cuda.synchronize()

            def fwd():
                kernels.forward(q, k, v, scale=scale)

            def bwd():
                kernels.backward(q, k, v, out, lse, do, scale=scale)

            row = {"dtype": dt_name, "head_dim": d, "batch": 8, "heads": 16, "seq_len": args.n}
            for fast in (False, True):
                fastlaunch.FAST_LAUNCH = fast
                fwd(), bwd()                          # fill the cache on the fast side
                tag = "fast" if fast else "numba"
                row[f"fwd_host_ms_{tag}"] = host_call_ms(torch, fwd, reps=30)
                row[f"bwd_host_ms_{tag}"] = host_call_ms(torch, bwd, reps=30)
            row["fwd_gpu_ms"] = time_cuda(torch, fwd, timing="device")[0]
            row.update({f"fwd_host_ms_{k}": v for k, v in launch_split(torch, fwd).items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
            if dt_name == "fp16" and d == 64:
                prof = cProfile.Profile()
                torch.cuda.synchronize()
                torch.cuda._sleep(40_000_000)
                prof.enable()
                for _ in range(20):
                    fwd()
                prof.disable()
                torch.cuda.synchronize()
                s = io.StringIO()
                st = pstats.Stats(prof, stream=s)
                st.sort_stats("tottime").print_stats(25)
                st.sort_stats("cumulative").print_stats(25)
                profile_text = s.getvalue()
                print(profile_text)
    doc = {"schema": "ioaware.host_cost/1", "provenance": prov, "records": rows,
           "profile_fp16_d64_fast_fwd": profile_text}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
