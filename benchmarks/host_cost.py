"""Command ``host-cost``: the host time of one kernel call, with Numba's launch and with ours.
Ours is the cached launch of `kernels.host`.

    python -m benchmarks host-cost [--n 2048] [--out FILE.json]

For float16 and float32 torch CUDA inputs (B=8, H=16, d 64 and 128, not causal) it times the
host side of `kernels.forward` and `kernels.backward` on a validated problem, and of
``ioaware.attention(backend="numba")`` (validation included): the median of 30 calls, each made
while the GPU sleeps, so that a call returns as soon as its launches are enqueued
(`benchmarks.common.host_call_ms`), with ``KernelConfig(fast_launch=False)`` (Numba's launch)
and ``fast_launch=True`` in the same process; of ``ioaware.attention`` prepared (its checks and
choices made on the first call of a key) and unprepared (`attention_host_ms`), also for a
decoding case (B=8, 32/8 heads, d=128, 4096 keys, bfloat16; also with cache lengths on the GPU,
prepared and not: `cache_lengths_host_ms`), with PyTorch's SDPA on the same tensors, both as one call's time and as the time per call of a loop of calls (ours and SDPA's
taken in turn, three rounds: the steadier figure on a host whose speed varies), and for a
training call (forward and backward through autograd) as a loop; the forward's GPU time (CUDA events behind a
device-side sleep); and the split of the fast forward's host time (`launch_split`) into the code
before the launch, the launch, and the driver call alone. It also prints the 25 most expensive
functions of a fast forward (cProfile), by own and by cumulative time, and writes a JSON file
with provenance.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats

from .common import (attention_problem, command_line, first_sentence, host_call_ms, loop_call_us,
                     provenance, time_cuda, write_json)


def launch_split(torch, fn, reps=30) -> dict:
    """Where the host time of one fast-launch call of ``fn`` (a forward: one launch) goes, ms
    (medians of ``reps`` calls): ``pre_launch`` (everything before `kernels.host.launch`, which
    is replaced by a no-op that keeps its arguments), ``launch`` (`kernels.host.launch` alone on
    those arguments: signature key, marshalling, the driver call) and ``driver_call`` (the
    driver call alone, its arguments packed beforehand: `kernels.host._Plan.enqueue`)."""
    from kernels import host
    seen, orig = {}, host.launch

    def keep(kern, grid, block, stream, args, sharedmem=0, fast=True):
        seen.update(kern=kern, grid=grid, block=block, stream=stream, args=args,
                    sharedmem=sharedmem)
    host.launch = keep
    try:
        pre = host_call_ms(torch, fn, reps=reps)
    finally:
        host.launch = orig
    k = seen

    def launch_only():
        orig(k["kern"], k["grid"], k["block"], k["stream"], k["args"], k["sharedmem"])
    launch_only()
    plan = host.plan_for(k["kern"], k["args"])
    dev = host.current_device_id()
    plan.pack(k["args"])
    marshalled = plan.values(k["args"])
    out = {"pre_launch": pre, "launch": host_call_ms(torch, launch_only, reps=reps),
           "driver_call": host_call_ms(torch, lambda: plan.enqueue(k["grid"], k["block"],
                                                                   k["stream"], k["sharedmem"],
                                                                   dev), reps=reps),
           "launch_values": len(marshalled)}
    torch.cuda.synchronize()
    return out


def _profile(torch, fn, calls=20) -> str:
    """cProfile of ``calls`` calls of ``fn`` made while the GPU sleeps: top 25 by own and by
    cumulative time."""
    prof = cProfile.Profile()
    torch.cuda.synchronize()
    torch.cuda._sleep(40_000_000)
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(25)
    st.sort_stats("cumulative").print_stats(25)
    return s.getvalue()


def attention_host_ms(torch, attention, q, k, v, reps=100, rounds=3, training=True) -> dict:
    """Host time of ``ioaware.attention(q, k, v, backend="numba")`` under inference mode:
    ``fwd_host_ms_attention`` (one prepared call, ms: the call's checks and choices made once,
    `ioaware._backends.prepared_key`) and ``fwd_host_ms_attention_unprepared`` (every call
    checked and dispatched in full: ``prepared_key`` replaced by one that prepares nothing), and
    ``fwd_host_ms_sdpa``, PyTorch's SDPA (its default backend choice) on the same tensors;
    ``fwd_loop_us_attention`` / ``fwd_loop_us_sdpa``: microseconds per call in a loop of calls
    (`benchmarks.common.loop_call_us`), the median of ``rounds`` rounds taken in turn with
    SDPA's; with ``training``, ``train_loop_us_attention`` / ``train_loop_us_sdpa``: the same
    for a forward and backward through autograd (operands that require grad)."""
    out = {}
    with torch.inference_mode():
        fn = lambda: attention(q, k, v, backend="numba")      # noqa: E731
        fn()
        fn()                  # (the second full run records the launches a prepared call repeats)
        out["fwd_host_ms_attention"], out["fwd_host_ms_attention_unprepared"] = \
            _prepared_and_not(torch, fn, "prepared_key", reps)
        import torch.nn.functional as F
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)   # noqa: E731
        sdpa()
        out["fwd_host_ms_sdpa"] = host_call_ms(torch, sdpa, reps=reps)
        out.update(_loop_rounds(torch, "fwd", fn, sdpa, rounds))
    if training:
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        dout = torch.randn_like(q)

        def step(f):
            f(qg, kg, vg).backward(dout)
            qg.grad = kg.grad = vg.grad = None
        ours = lambda: step(lambda *a: attention(*a, backend="numba"))    # noqa: E731
        theirs = lambda: step(lambda *a: F.scaled_dot_product_attention(*a, enable_gqa=True))  # noqa: E731
        ours()
        out.update(_loop_rounds(torch, "train", ours, theirs, rounds, calls=100))
    return out


def cache_lengths_host_ms(torch, attention, q, k, v, lengths, reps=100) -> dict:
    """Host time (ms) of a decoding call with its cache lengths on the GPU,
    ``ioaware.attention(q, k, v, cache_seqlens=lengths, causal="bottom_right")`` under inference
    mode: ``fwd_host_ms_attention_lengths`` (prepared: `ioaware._backends.cache_key`) and
    ``fwd_host_ms_attention_lengths_unprepared`` (every call checked in full: ``cache_key``
    replaced by one that keys nothing)."""
    out = {}
    with torch.inference_mode():
        fn = lambda: attention(q, k, v, backend="numba", cache_seqlens=lengths,   # noqa: E731
                               causal="bottom_right")
        for _ in range(3):    # checked and prepared, then run in full twice (the launch recorded)
            fn()
        out["fwd_host_ms_attention_lengths"], out["fwd_host_ms_attention_lengths_unprepared"] = \
            _prepared_and_not(torch, fn, "cache_key", reps)
    return out


def _prepared_and_not(torch, fn, key_function, reps) -> tuple:
    """Host ms of ``fn`` (a call whose key an earlier call prepared), and with
    ``ioaware._backends.<key_function>`` replaced by one that keys nothing (every call checked
    and dispatched in full)."""
    from ioaware import _backends
    prepared = host_call_ms(torch, fn, reps=reps)
    real = getattr(_backends, key_function)
    setattr(_backends, key_function, lambda *a, **kw: None)
    try:
        return prepared, host_call_ms(torch, fn, reps=reps)
    finally:
        setattr(_backends, key_function, real)


def _loop_rounds(torch, tag, ours, sdpa, rounds, calls=200) -> dict:
    """``{tag}_loop_us_attention`` and ``{tag}_loop_us_sdpa``: medians of ``rounds`` loops of
    ``calls`` calls each (`loop_call_us`), ours and SDPA's taken in turn."""
    import statistics
    mine, theirs = [], []
    for _ in range(rounds):
        mine.append(loop_call_us(torch, ours, calls))
        theirs.append(loop_call_us(torch, sdpa, calls))
    return {f"{tag}_loop_us_attention": statistics.median(mine),
            f"{tag}_loop_us_sdpa": statistics.median(theirs)}


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks host-cost",
                                 description=first_sentence(__doc__))
    ap.add_argument("--n", type=int, default=2048, help="sequence length")
    ap.add_argument("--out", default=None, help="JSON file to write (with provenance)")
    args = ap.parse_args(argv)

    import torch

    import kernels
    from ioaware import attention
    prov = provenance(command_line("host-cost", argv))
    rows, profile_text = [], ""
    batch, heads = 8, 16
    for dt_name, dt in (("fp16", torch.float16), ("fp32", torch.float32)):
        for d in (64, 128):
            g = torch.Generator(device="cuda").manual_seed(d)
            q, k, v, do = (torch.randn(batch, heads, args.n, d, device="cuda", dtype=dt,
                                       generator=g) for _ in range(4))
            pb = attention_problem(q, k, v)
            out, lse = kernels.forward(pb)
            row = {"dtype": dt_name, "head_dim": d, "batch": batch, "heads": heads,
                   "seq_len": args.n, "family": kernels.family_for(pb, None, "fwd")}
            for fast in (False, True):
                cfg = kernels.KernelConfig(fast_launch=fast)

                def fwd(cfg=cfg):
                    kernels.forward(pb, cfg)

                def bwd(cfg=cfg):
                    kernels.backward(pb, out, lse, do, cfg)
                fwd(), bwd()                          # compile, fill the launch cache
                tag = "fast" if fast else "numba"
                row[f"fwd_host_ms_{tag}"] = host_call_ms(torch, fwd, reps=30)
                row[f"bwd_host_ms_{tag}"] = host_call_ms(torch, bwd, reps=30)
            row.update(attention_host_ms(torch, attention, q, k, v))
            # fwd, bwd: the fast launch's (the loop's last)
            row["fwd_gpu_ms"] = time_cuda(torch, fwd, timing="device")[0]
            row.update({f"fwd_host_ms_{key}": val for key, val in launch_split(torch, fwd).items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
            if dt_name == "fp16" and d == 64:
                profile_text = _profile(torch, fwd)
                print(profile_text)
    # decoding: one query per sequence against a 4096-key cache, GQA 32/8, d=128 (split_kv)
    for dt_name, dt in (("bf16", torch.bfloat16),):
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(8, 32, 1, 128, device="cuda", dtype=dt, generator=g)
        k, v = (torch.randn(8, 8, 4096, 128, device="cuda", dtype=dt, generator=g)
                for _ in range(2))
        row = {"dtype": dt_name, "head_dim": 128, "batch": 8, "heads": 32, "heads_kv": 8,
               "seq_len": 1, "seq_len_k": 4096,
               "family": kernels.family_for(attention_problem(q, k, v), None, "fwd")}
        row.update(attention_host_ms(torch, attention, q, k, v, training=False))
        lengths = torch.full((8,), 4000, dtype=torch.int32, device="cuda")
        row.update(cache_lengths_host_ms(torch, attention, q, k, v, lengths))
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        write_json({"schema": "ioaware.host_cost/1", "provenance": prov, "records": rows,
                    "profile_fp16_d64_fast_fwd": profile_text}, args.out)
        print("wrote", args.out)
    return 0
