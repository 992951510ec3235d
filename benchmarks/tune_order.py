"""Launch orders of the tensor-core kernels, timed: which head group (`kernels.tile_order`) to
default to per pass.

    python -m kernels.tune_order [--quick] [--out FILE.json]
    ncu --clock-control none --profile-from-start off --csv --page raw --log-file FILE.csv \
        --metrics gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,\
lts__t_sectors_op_read.sum,launch__grid_size python -m kernels.tune_order --profile CASE

For each case (dtype, head dim, causal, N; the benchmark's shapes, batch = 16384 / N and heads =
2048 / d) it times our forward under each forward order and our backward under each backward
order (``KERNELS_TILE_ORDER``: ``tiles``, ``heads`` or a head group size), by CUDA events behind
a device-side sleep (GPU time only, `kernels.bench.time_cuda(timing="device")`), and the
backward's two kernels apart (an event after each launch). Next to them, SDPA EFFICIENT
(float32) or FLASH (float16) forward and forward+backward on the same inputs, and the
forward+backward ratio (SDPA / ours) for each backward order with the default forward. Each
order's outputs are compared with the default order's: a tile's arithmetic does not depend on
which block runs it, so the recorded difference should be exactly 0. Prints a line per case and
writes the rows with provenance.

``--profile DTYPE:D:causal|full:N`` (e.g. ``fp32:128:causal:8192``) runs that case's forward
and backward once per order of `PROFILE_ORDERS`, each after a warm-up call, between
``cudaProfilerStart`` / ``Stop``, for a profiler started with ``--profile-from-start off``: it
records three kernels per order (forward, dQ, dK/dV), in the order printed; with ``--out`` it
writes the case, the orders and its provenance. ``--show-ncu FILE.csv`` prints such a
profile's CSV as a table, one line per kernel (time, L2 hit rate, L2 read sectors, DRAM
bytes read). ``--model-ncu FILE.json`` (the ``--out`` of a ``--profile`` run, its CSV beside it)
puts the cost model's DRAM reads next to the measured ones: `sim.model.predict` with
``Schedule.launch_head_group`` set to each order, the L2 model replaying the trace in that
dispatch order (on the CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

FWD_ORDERS = ("tiles", "heads", "4")
BWD_ORDERS = ("tiles", "heads", "4", "8")
CASES = ([("fp32", 128, True, n) for n in (1024, 4096, 8192, 16384)]
         + [("fp32", 128, False, 4096), ("fp32", 64, True, 4096)]
         + [("fp16", 128, True, 4096), ("fp16", 64, True, 4096), ("fp16", 128, False, 4096)])
QUICK_CASES = [("fp32", 128, True, 4096), ("fp16", 64, True, 4096)]
PROFILE_ORDERS = ("tiles", "heads", "4")


def _case_inputs(torch, dt, d, n):
    """(batch, heads, q, k, v, dout) of a case: the benchmark's shapes (batch = 16384 / N,
    heads = 2048 / d), seeded by N and d."""
    b, h = max(1, 16384 // n), max(1, 2048 // d)
    tdt = {"fp32": torch.float32, "fp16": torch.float16}[dt]
    g = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=tdt, generator=g)
                   for _ in range(4))
    return b, h, q, k, v, do


def profile_case(torch, dt, d, causal, n):
    """One forward and one backward per order of `PROFILE_ORDERS`, each inside a profiler range
    (see the module docstring). Returns the case's shape."""
    import kernels
    b, h, q, k, v, do = _case_inputs(torch, dt, d, n)
    scale = d ** -0.5
    for order in PROFILE_ORDERS:
        def both():
            out, lse = kernels.forward(q, k, v, scale=scale, causal=causal)
            kernels.backward(q, k, v, out, lse, do, scale=scale, causal=causal)
        _with_order(order, both)                  # compiles this order's kernels
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        _with_order(order, both)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"profiled order {order}: forward, dQ, dK/dV ({dt} d={d} causal={causal} N={n} "
              f"B={b} H={h})", flush=True)
    return {"dtype": dt, "head_dim": d, "causal": causal, "seq_len": n, "batch": b, "heads": h}


PROFILE_KERNELS = ("forward", "dQ", "dK/dV")


def _profile_rows(csv_path):
    """The kernels of a ``--profile`` run's ncu CSV (`kernels.ncu.parse_ncu_csv`): three per
    order of `PROFILE_ORDERS`, in launch order."""
    from kernels.ncu import parse_ncu_csv
    with open(csv_path) as f:
        rows = parse_ncu_csv(f.read())
    if len(rows) != len(PROFILE_ORDERS) * len(PROFILE_KERNELS):
        raise SystemExit(f"{csv_path}: {len(rows)} kernels, expected "
                         f"{len(PROFILE_ORDERS) * len(PROFILE_KERNELS)}")
    return rows


def show_ncu(path):
    """The table of a ``--profile`` run's ncu CSV (three kernels per order of
    `PROFILE_ORDERS`, in launch order)."""
    rows = _profile_rows(path)
    print(f"{'order':>6} {'kernel':>7} {'grid':>6} {'ms':>8} {'L2 hit %':>9} "
          f"{'L2 read sectors':>16} {'DRAM read GB':>13}")
    for i, r in enumerate(rows):
        m = r["metrics"]
        print(f"{PROFILE_ORDERS[i // 3]:>6} {PROFILE_KERNELS[i % 3]:>7} "
              f"{m['launch__grid_size']:6.0f} {m['gpu__time_duration.sum'] / 1e6:8.3f} "
              f"{m['lts__t_sector_hit_rate.pct']:9.2f} {m['lts__t_sectors_op_read.sum']:16,.0f} "
              f"{m['dram__bytes_read.sum'] / 1e9:13.3f}")


def _per_kernel_ms(torch, fn, reps=5):
    """Milliseconds of each kernel ``fn`` launches through `kernels.fastlaunch` (an event
    recorded after each launch, behind a device-side sleep); the median run by total."""
    from kernels import fastlaunch
    from kernels.bench import SLEEP_CYCLES
    events = []
    orig = fastlaunch.launch

    def traced(*args, **kw):
        orig(*args, **kw)
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        events.append(e)

    runs = []
    fastlaunch.launch = traced
    try:
        for _ in range(reps):
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_CYCLES)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            events.clear()
            fn()
            torch.cuda.synchronize()
            prev, ts = start, []
            for e in events:
                ts.append(prev.elapsed_time(e))
                prev = e
            runs.append(ts)
    finally:
        fastlaunch.launch = orig
    runs.sort(key=sum)
    return runs[len(runs) // 2]


def _with_order(order, fn):
    """``fn()`` with ``KERNELS_TILE_ORDER`` set to ``order`` (None: unset), restored after."""
    from kernels.tile_order import ENV

    def set_order(value):
        if value is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = value
    old = os.environ.get(ENV)
    set_order(order)
    try:
        return fn()
    finally:
        set_order(old)


def run_case(torch, dt, d, causal, n, progress=print):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kernels
    from kernels.bench import time_cuda

    b, h, q, k, v, do = _case_inputs(torch, dt, d, n)
    scale = d ** -0.5
    rec = {"dtype": dt, "head_dim": d, "causal": causal, "seq_len": n, "batch": b, "heads": h,
           "fwd_ms": {}, "bwd_ms": {}, "bwd_kernel_ms": {}, "max_abs_diff_vs_default": {}}

    def fwd():
        return kernels.forward(q, k, v, scale=scale, causal=causal)

    out, lse = fwd()
    ref_bwd = kernels.backward(q, k, v, out, lse, do, scale=scale, causal=causal)

    def bwd():
        return kernels.backward(q, k, v, out, lse, do, scale=scale, causal=causal)

    for order in FWD_ORDERS:
        o, _ = _with_order(order, fwd)
        rec["max_abs_diff_vs_default"][f"fwd:{order}"] = float((o - out).abs().max())
        rec["fwd_ms"][order] = _with_order(order, lambda: time_cuda(torch, fwd, timing="device")[0])
    rec["fwd_ms"]["default"] = time_cuda(torch, fwd, timing="device")[0]
    for order in BWD_ORDERS:
        grads = _with_order(order, bwd)
        rec["max_abs_diff_vs_default"][f"bwd:{order}"] = max(
            float((a - r).abs().max()) for a, r in zip(grads, ref_bwd))
        rec["bwd_ms"][order] = _with_order(order, lambda: time_cuda(torch, bwd, timing="device")[0])
        rec["bwd_kernel_ms"][order] = _with_order(order, lambda: _per_kernel_ms(torch, bwd))
    rec["bwd_ms"]["default"] = time_cuda(torch, bwd, timing="device")[0]

    backend = SDPBackend.EFFICIENT_ATTENTION if dt == "fp32" else SDPBackend.FLASH_ATTENTION
    rec["sdpa_backend"] = backend.name
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

    def sdpa(backward):
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            if backward:
                o.backward(do)
                qg.grad = kg.grad = vg.grad = None
    rec["sdpa_fwd_ms"] = time_cuda(torch, lambda: sdpa(False), timing="device")[0]
    rec["sdpa_fwdbwd_ms"] = time_cuda(torch, lambda: sdpa(True), timing="device")[0]
    rec["fwdbwd_ratio"] = {o: rec["sdpa_fwdbwd_ms"] / (rec["fwd_ms"]["default"] + t)
                           for o, t in rec["bwd_ms"].items()}
    f, bw = rec["fwd_ms"], rec["bwd_ms"]
    progress(f"{dt} d={d} causal={causal} N={n}: fwd " + " ".join(
        f"{o} {t:.3f}" for o, t in f.items()) + " | bwd " + " ".join(
        f"{o} {bw[o]:.2f} ({'+'.join(f'{x:.2f}' for x in rec['bwd_kernel_ms'][o])})"
        for o in BWD_ORDERS) + f" default {bw['default']:.2f} | SDPA {rec['sdpa_backend']} fwd "
        f"{rec['sdpa_fwd_ms']:.3f} fwd+bwd {rec['sdpa_fwdbwd_ms']:.2f} | fwd+bwd ratio " + " ".join(
        f"{o} {r:.3f}" for o, r in rec["fwdbwd_ratio"].items())
        + f" | max |diff| vs default {max(rec['max_abs_diff_vs_default'].values()):.3g}")
    return rec


def model_vs_ncu(profile_json, profile="h100"):
    """Measured (ncu) against predicted (sim, L2 model in each launch order) DRAM reads of a
    ``--profile`` run: ``profile_json`` is its ``--out``, the CSV has the same name ending in
    ``.csv``. Prints one line per (order, kernel); returns the rows."""
    from pathlib import Path

    from ioaware.launch_order import parse_head_group
    from sim.model import predict
    from sim.workload import Schedule, Workload
    with open(profile_json) as f:
        doc = json.load(f)
    case = doc["case"]
    rows = _profile_rows(Path(profile_json).with_suffix(".csv"))
    d, dt, causal = case["head_dim"], case["dtype"], case["causal"]
    if dt == "fp32":
        from kernels.flash_tf32_fwd import default_blocks
        fwd_blocks, unit = default_blocks(d), "tf32"
    else:
        from kernels.flash_mma_fwd import default_blocks
        fwd_blocks, unit = default_blocks(d, causal), "tensor"
    shape = dict(batch=case["batch"], heads=case["heads"], seq_len_q=case["seq_len"],
                 head_dim=d, dtype=dt, causal=causal)
    out = []
    print(f"{'order':>6} {'kernel':>7} {'measured GB':>12} {'predicted GB':>13} {'error':>7} "
          f"{'L2 model':>9}")
    for i, order in enumerate(PROFILE_ORDERS):
        g = parse_head_group(order)
        # the backward kernels' tiles are 64 rows (Q in the dQ kernel, K in the dK/dV kernel)
        pf = predict(Workload(**shape, pass_="fwd"),
                     Schedule("flash2", *fwd_blocks, matmul_unit=unit, exp_flops=0,
                              launch_head_group=g), profile, calibration=None)
        pb = predict(Workload(**shape, pass_="bwd"),
                     Schedule("flash2", 64, 64, matmul_unit=unit, exp_flops=0, dq_mode="kernel",
                              launch_head_group=g), profile, calibration=None)
        ph = {**pf.phases, **pb.phases}
        pred = {"forward": ph["fwd"]["dram_read_bytes"],
                # the dQ kernel computes delta itself (the model's bwd.pre)
                "dQ": ph["bwd.dq"]["dram_read_bytes"] + ph["bwd.pre"]["dram_read_bytes"],
                "dK/dV": ph["bwd.main"]["dram_read_bytes"]}
        for j, kern in enumerate(PROFILE_KERNELS):
            meas = rows[3 * i + j]["metrics"]["dram__bytes_read.sum"]
            err = pred[kern] / meas - 1
            out.append({"order": order, "kernel": kern, "measured_dram_read_bytes": meas,
                        "predicted_dram_read_bytes": pred[kern], "l2_model": pf.l2.model
                        if kern == "forward" else pb.l2.model})
            print(f"{order:>6} {kern:>7} {meas / 1e9:12.3f} {pred[kern] / 1e9:13.3f} "
                  f"{100 * err:+6.0f}% {out[-1]['l2_model']:>9}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two cases only")
    ap.add_argument("--out", default=None)
    ap.add_argument("--profile", metavar="DTYPE:D:causal|full:N", default=None,
                    help="run one case per order for a profiler (see the module docstring)")
    ap.add_argument("--show-ncu", metavar="FILE.csv", default=None,
                    help="print a --profile run's ncu CSV as a table")
    ap.add_argument("--model-ncu", metavar="FILE.json", default=None,
                    help="the cost model's DRAM reads against a --profile run's (CPU)")
    args = ap.parse_args(argv)
    if args.show_ncu:
        show_ncu(args.show_ncu)
        return
    if args.model_ncu:
        model_vs_ncu(args.model_ncu)
        return

    import torch

    from kernels import tile_order
    from kernels.bench import provenance_versions
    command = "python -m kernels.tune_order " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.profile:
        dt, d, c, n = args.profile.split(":")
        if dt not in ("fp32", "fp16") or c not in ("causal", "full"):
            ap.error(f"--profile: expected e.g. fp32:128:causal:8192, got {args.profile!r}")
        case = profile_case(torch, dt, int(d), c == "causal", int(n))
        if args.out:
            prov = dict(provenance_versions(torch), command=command,
                        profiler=os.environ.get("IOAWARE_PROFILER_COMMAND", "unknown"))
            with open(args.out, "w") as f:
                json.dump({"schema": "ioaware.tune_order_profile/1", "provenance": prov,
                           "case": case, "orders": list(PROFILE_ORDERS),
                           "kernels_per_order": list(PROFILE_KERNELS)}, f, indent=1)
        return

    print(torch.cuda.get_device_name(), "defaults:", tile_order.DEFAULT_HEAD_GROUP, flush=True)
    prov = dict(provenance_versions(torch), timing="device",
                default_head_group={f"{p}:{'causal' if c else 'full'}": g
                                    for (p, c), g in tile_order.DEFAULT_HEAD_GROUP.items()},
                command=command)
    rows = []
    for case in (QUICK_CASES if args.quick else CASES):
        rows.append(run_case(torch, *case, progress=lambda s: print(s, flush=True)))
        torch.cuda.empty_cache()
        if args.out:                   # after every case, so that a cut-off run keeps its rows
            with open(args.out, "w") as f:
                json.dump({"schema": "ioaware.tune_order/1", "provenance": prov, "rows": rows},
                          f, indent=1)
    if args.out:
        print("wrote", args.out)


if __name__ == "__main__":
    main()
