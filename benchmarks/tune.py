"""Command ``tune``: block sizes of one kernel family, or launch orders, timed against SDPA.
Both run on the same inputs as PyTorch SDPA, in the same process.

    python -m benchmarks tune --family simt|mma|tf32 [--n 4096] [--d 64 128] [--out FILE.json]
    python -m benchmarks tune --orders [--quick] [--out FILE.json]
    python -m benchmarks tune --backward-dq [--dq-family mma|wgmma] [--d 64 128] [--out FILE.json]
    ncu --clock-control none --profile-from-start off --csv --page raw --log-file FILE.csv \\
        --metrics METRICS python -m benchmarks tune --orders --profile CASE --out FILE.json
    python -m benchmarks tune --orders --show-ncu FILE.csv|FILE.json | --model-ncu FILE.json   (CPU)
    python -m benchmarks tune --orders --embed-ncu FILE.json                         (CPU)

Every case uses the benchmark's shapes (batch = 16384 / N, heads = 2048 / d) and times by CUDA
events behind a device-side sleep (GPU time only: ``"device"`` timing of `benchmarks.common`).

``--family``: for each head dim, causal off and on, and each block size of the family
(`candidates`; a `kernels.KernelConfig` pinning the family, the tiles and for the CUDA-core
forward its micro-tile), our forward, and for the CUDA-core family also our backward, next to
SDPA FLASH (float16) or EFFICIENT (float32): time, the ratio SDPA / ours (> 1: ours faster) and
the largest difference from SDPA's output (gradients for the backward). Block sizes the family
refuses are listed with the reason. These runs chose the families' default tiles.

``--orders``: for each case (dtype, head dim, causal, N; the benchmark's shape, or with GQA the
Llama shape of ``train-step``, `LLAMA_SHAPE`) our forward under each forward order
and our backward under each backward order (``KernelConfig.launch_order``: ``tiles``, ``heads``
or a head group size; `kernels.tile_scheduler`), the backward's two kernels also apart (an
event after each launch), SDPA's forward and forward + backward, and the forward + backward
ratio for each backward order. Each order's outputs are compared with the default order's: a
tile's arithmetic does not depend on which block runs it, so the difference should be exactly 0.
These runs chose `kernels.tile_scheduler.DEFAULT_HEAD_GROUP` ("default": where the Hopper
backward balances it, `ioaware.launch_order.launch_head_group`, that order).

``--backward-dq``: the tensor-core backwards' two ways of computing dQ
(``KernelConfig.backward_dq``: `kernels.mma_bwd` for float16 and bfloat16, or with
``--dq-family wgmma`` the Hopper backward `kernels.wgmma_bwd`; `kernels.tf32_bwd` for float32;
``--dtype``), each head dim, causal off and on and N in `DQ_SEQ_LENS`: the
backward alone under "kernel" (a dQ kernel, then the dK/dV kernel) and "atomic" (pre-pass, the
dK/dV kernel adding dS K into a float32 accumulator, conversion), each kernel's time, the
largest difference between the two modes' gradients, and SDPA's backward (its forward +
backward less its forward; FLASH for the halves, EFFICIENT for float32). These runs chose the
family's ``dq_mode`` default.

``--profile DTYPE:D:causal|full:N`` (e.g. ``fp32:128:causal:8192``) runs that case's forward and
backward once per order of `PROFILE_ORDERS`, each after a warm-up call, between
``cudaProfilerStart`` / ``Stop``, for a profiler started with ``--profile-from-start off`` (and
``--metrics`` `PROFILE_METRICS`, which ``--show-ncu`` and ``--model-ncu`` read): three kernels per
order (forward, dQ, dK/dV), in the order printed; with ``--out`` it writes the case, the orders
and the provenance (with the profiler's command line from the environment variable
``IOAWARE_PROFILER_COMMAND`` when the caller sets it). ``--show-ncu FILE.csv`` prints such a
profile's CSV as a table, one line per kernel (time, L2 hit rate, L2 read sectors, DRAM bytes
read). ``--embed-ncu FILE.json`` copies the CSV beside a ``--profile`` run's ``--out`` into it
(key ``ncu_csv``), so that one file carries the case and its counters; ``--show-ncu`` and
``--model-ncu`` read the CSV from the JSON where it is there. ``--model-ncu FILE.json`` (the
``--out`` of a ``--profile`` run, its CSV inside it or beside it) puts
the cost model's DRAM reads next to the measured ones: `sim.model.predict` with
``Schedule.launch_head_group`` set to each order, the L2 model replaying the trace in that
dispatch order.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from .common import (SLEEP_CYCLES, attention_flops, attention_problem, benchmark_inputs,
                     command_line, doc_usage, first_sentence, provenance, sdpa_context, time_cuda,
                     write_json)

#: CUDA-core forward candidates (block_q, block_k, tm, tn) and backward (block_q, block_k), per d.
SIMT_FWD_CANDIDATES = {
    64: [(64, 32, 8, 4), (64, 32, 4, 4), (64, 16, 4, 2), (64, 32, 2, 4), (64, 32, 4, 8),
         (32, 32, 2, 4), (32, 32, 4, 4), (64, 64, 8, 8), (48, 32, 3, 4)],
    128: [(32, 16, 4, 2), (32, 16, 2, 2), (32, 16, 4, 4), (16, 32, 2, 4), (32, 8, 2, 1)],
}
SIMT_BWD_CANDIDATES = {64: [(32, 32), (32, 16), (16, 32)], 128: [(16, 16), (16, 8), (8, 16)]}
FAMILY_DTYPE = {"simt": "fp32", "mma": "fp16", "tf32": "fp32"}

FWD_ORDERS = ("tiles", "heads", "4")
BWD_ORDERS = ("tiles", "heads", "4", "8")
#: A GQA case at the shape of `benchmarks.train_step`'s model (B 4, Hq 16 / Hkv 4): few, long
#: dK/dV programs, where the Hopper backward balances its launch order (docs/kernels.md).
LLAMA_SHAPE = {"batch": 4, "heads": 16, "heads_kv": 4}
ORDER_CASES = ([("fp32", 128, True, n) for n in (1024, 4096, 8192, 16384)]
               + [("fp32", 128, False, 4096), ("fp32", 64, True, 4096)]
               + [("fp16", 128, True, 4096), ("fp16", 64, True, 4096), ("fp16", 128, False, 4096)]
               + [("bf16", 64, True, 2048, LLAMA_SHAPE), ("bf16", 128, True, 2048, LLAMA_SHAPE)])
QUICK_ORDER_CASES = [("fp32", 128, True, 4096), ("fp16", 64, True, 4096),
                     ("bf16", 64, True, 2048, LLAMA_SHAPE)]
PROFILE_ORDERS = ("tiles", "heads", "4")
PROFILE_KERNELS = ("forward", "dQ", "dK/dV")
PROFILE_METRICS = ("gpu__time_duration.sum,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,"
                   "lts__t_sectors_op_read.sum,launch__grid_size")


def candidates(family: str, head_dim: int) -> list[tuple[str, object]]:
    """``(pass, KernelConfig)`` of every block size ``--family`` times for a head dim."""
    from kernels import KernelConfig, tf32_fwd
    from kernels.mma_fwd import BLOCK_K_CHOICES, BLOCK_Q_CHOICES
    if family == "simt":
        return ([("fwd", KernelConfig(family="simt", block_q=bq, block_k=bk, micro_tile=(tm, tn)))
                 for bq, bk, tm, tn in SIMT_FWD_CANDIDATES.get(head_dim, [])]
                + [("bwd", KernelConfig(family="simt", block_q=bq, block_k=bk))
                   for bq, bk in SIMT_BWD_CANDIDATES.get(head_dim, [])])
    if family == "mma":
        q_choices, k_choices = BLOCK_Q_CHOICES, BLOCK_K_CHOICES
    else:
        q_choices, k_choices = tf32_fwd.BLOCK_Q_CHOICES, tf32_fwd.BLOCK_K_CHOICES
    return [("fwd", KernelConfig(family=family, block_q=bq, block_k=bk))
            for bq in q_choices for bk in k_choices]


def sdpa_kernel_name(dtype: str) -> str:
    """The SDPA backend ours is held against: FLASH for half precision, EFFICIENT for float32."""
    return "sdpa-efficient" if dtype == "fp32" else "sdpa-flash"


def _max_diff(a, b) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))


# ------------------------------------------------------------------------------------------------
# --family: block sizes
# ------------------------------------------------------------------------------------------------

def tune_blocks(torch, family, head_dims, seq_len, causals, progress=print, checkpoint=None):
    """The ``--family`` rows (module docstring)."""
    import torch.nn.functional as F

    import kernels
    dtype, rows = FAMILY_DTYPE[family], []
    sdpa = sdpa_kernel_name(dtype)
    for d in head_dims:
        b, h, q, k, v, do = benchmark_inputs(torch, dtype, d, seq_len)
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
        for causal in causals:
            pb = attention_problem(q, k, v, causal=causal)
            with sdpa_context(sdpa):
                ref_out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                ref_grads = torch.autograd.grad(ref_out, (qg, kg, vg), do, retain_graph=True)
                t_ref = {"fwd": time_cuda(torch, lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=causal), timing="device")[0],
                    "bwd": time_cuda(torch, lambda: torch.autograd.grad(
                        ref_out, (qg, kg, vg), do, retain_graph=True), timing="device")[0]}
            out, lse = kernels.forward(pb, kernels.KernelConfig(family=family))
            for pass_, cfg in candidates(family, d):
                row = {"family": family, "pass": pass_, "dtype": dtype, "head_dim": d,
                       "causal": causal, "seq_len": seq_len, "batch": b, "heads": h,
                       "block_q": cfg.block_q, "block_k": cfg.block_k,
                       "micro_tile": list(cfg.micro_tile) if cfg.micro_tile else None}
                try:
                    kernels.family_for(pb, cfg, pass_)
                except ValueError as exc:          # tiles this family does not take
                    rows.append(dict(row, refused=str(exc)))
                    progress(f"{d:>4} {str(causal):>6} {pass_} {cfg.block_q:>3} x "
                             f"{cfg.block_k:<3} refused: {exc}")
                    continue
                if pass_ == "fwd":
                    def ours(cfg=cfg):
                        return kernels.forward(pb, cfg)
                    err = _max_diff(ours()[:1], (ref_out,))
                else:
                    def ours(cfg=cfg):
                        return kernels.backward(pb, out, lse, do, cfg)
                    err = _max_diff(ours(), ref_grads)
                t = time_cuda(torch, ours, timing="device")[0]
                fl = attention_flops(b, h, seq_len, seq_len, d, causal, pass_)
                rows.append(dict(row, time_ms=t, tflops=fl / t / 1e9, sdpa_kernel=sdpa,
                                 sdpa_time_ms=t_ref[pass_], ratio=t_ref[pass_] / t,
                                 max_abs_err_vs_sdpa=err))
                progress(f"{d:>4} {str(causal):>6} {pass_} {cfg.block_q:>3} x {cfg.block_k:<3} "
                         f"{row['micro_tile'] or '':>8} {t:8.3f} ms {fl / t / 1e9:6.1f} TFLOP/s "
                         f"{sdpa} {t_ref[pass_]:8.3f} ms ratio {t_ref[pass_] / t:5.2f} "
                         f"max |diff| {err:.1e}")
            if checkpoint:
                checkpoint(rows)
        q = k = v = do = qg = kg = vg = ref_out = ref_grads = out = lse = None
        torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------------------
# --orders: launch orders
# ------------------------------------------------------------------------------------------------

def order_config(order: str):
    """The `kernels.KernelConfig` of a launch order's name (None: the default order)."""
    from ioaware.launch_order import parse_head_group

    from kernels import KernelConfig
    return KernelConfig(launch_order=None if order is None else parse_head_group(order))


def per_kernel_ms(torch, fn, reps=5):
    """Milliseconds of each kernel ``fn`` launches through `kernels.host.launch` (an event
    recorded after each launch, behind a device-side sleep); the median run by total."""
    from kernels import host
    events, runs, orig = [], [], host.launch

    def traced(*args, **kw):
        orig(*args, **kw)
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        events.append(e)

    host.launch = traced
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
        host.launch = orig
    runs.sort(key=sum)
    return runs[len(runs) // 2]


def order_case(torch, dt, d, causal, n, shape=None, progress=print) -> dict:
    """One ``--orders`` case (module docstring); ``shape``: ``{"batch", "heads", "heads_kv"}``
    (None: the benchmark's shape, no GQA)."""
    import torch.nn.functional as F

    import kernels
    shape = shape or {}
    b, h, q, k, v, do = benchmark_inputs(torch, dt, d, n, shape.get("batch"), shape.get("heads"))
    h_kv = shape.get("heads_kv", h)
    k, v = k[:, :h_kv].contiguous(), v[:, :h_kv].contiguous()
    pb = attention_problem(q, k, v, causal=causal)
    rec = {"dtype": dt, "head_dim": d, "causal": causal, "seq_len": n, "batch": b, "heads": h,
           "heads_kv": h_kv,
           "family": {p: kernels.family_for(pb, None, p) for p in ("fwd", "bwd")},
           "fwd_ms": {}, "bwd_ms": {}, "bwd_kernel_ms": {}, "max_abs_diff_vs_default": {}}
    out, lse = kernels.forward(pb)
    ref_grads = kernels.backward(pb, out, lse, do)
    for order in FWD_ORDERS + (None,):
        cfg = order_config(order)
        name = order or "default"
        rec["max_abs_diff_vs_default"][f"fwd:{name}"] = _max_diff(kernels.forward(pb, cfg)[:1],
                                                                   (out,))
        rec["fwd_ms"][name] = time_cuda(torch, lambda: kernels.forward(pb, cfg), timing="device")[0]
    for order in BWD_ORDERS + (None,):
        cfg = order_config(order)
        name = order or "default"

        def bwd():
            return kernels.backward(pb, out, lse, do, cfg)
        rec["max_abs_diff_vs_default"][f"bwd:{name}"] = _max_diff(bwd(), ref_grads)
        rec["bwd_ms"][name] = time_cuda(torch, bwd, timing="device")[0]
        rec["bwd_kernel_ms"][name] = per_kernel_ms(torch, bwd)
    sdpa = sdpa_kernel_name(dt)
    rec["sdpa_kernel"] = sdpa
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

    def sdpa_run(backward):
        with sdpa_context(sdpa):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                               enable_gqa=h_kv != h)
            if backward:
                o.backward(do)
                qg.grad = kg.grad = vg.grad = None
    rec["sdpa_fwd_ms"] = time_cuda(torch, lambda: sdpa_run(False), timing="device")[0]
    rec["sdpa_fwdbwd_ms"] = time_cuda(torch, lambda: sdpa_run(True), timing="device")[0]
    rec["fwdbwd_ratio"] = {o: rec["sdpa_fwdbwd_ms"] / (rec["fwd_ms"]["default"] + t)
                           for o, t in rec["bwd_ms"].items()}
    f, bw = rec["fwd_ms"], rec["bwd_ms"]
    progress(f"{dt} d={d} causal={causal} N={n} B={b} H={h}/{h_kv}: fwd " + " ".join(
        f"{o} {t:.3f}" for o, t in f.items()) + " | bwd " + " ".join(
        f"{o} {bw[o]:.2f} ({'+'.join(f'{x:.2f}' for x in rec['bwd_kernel_ms'][o])})"
        for o in bw) + f" | SDPA {sdpa} fwd {rec['sdpa_fwd_ms']:.3f} fwd+bwd "
        f"{rec['sdpa_fwdbwd_ms']:.2f} | fwd+bwd ratio " + " ".join(
        f"{o} {r:.3f}" for o, r in rec["fwdbwd_ratio"].items())
        + f" | max |diff| vs default {max(rec['max_abs_diff_vs_default'].values()):.3g}")
    return rec


#: ``--backward-dq``: sequence lengths (the benchmark's shapes: B * N = 16384, H * d = 2048).
DQ_SEQ_LENS = (1024, 2048, 4096, 8192)
DQ_MODES = ("kernel", "atomic")


def backward_dq_case(torch, dt, d, causal, n, progress=print, half_family="mma") -> dict:
    """One ``--backward-dq`` case (module docstring); ``half_family``: the family timed for
    float16 and bfloat16 ("mma" or "wgmma")."""
    import torch.nn.functional as F

    import kernels
    from kernels import mma_bwd, tf32_bwd, wgmma_bwd
    family, module = (("tf32", tf32_bwd) if dt == "fp32" else
                      ("wgmma", wgmma_bwd) if half_family == "wgmma" else ("mma", mma_bwd))
    backend = "sdpa-efficient" if dt == "fp32" else "sdpa-flash"
    b, h, q, k, v, do = benchmark_inputs(torch, dt, d, n)
    pb = attention_problem(q, k, v, causal=causal)
    rec = {"dtype": dt, "head_dim": d, "causal": causal, "seq_len": n, "batch": b, "heads": h,
           "family": family, "default": module.dq_mode(pb, kernels.KernelConfig()),
           "bwd_ms": {}, "bwd_kernel_ms": {}, "sdpa_backend": backend}
    out, lse = kernels.forward(pb)
    grads = {}
    for mode in DQ_MODES:
        cfg = kernels.KernelConfig(family=family, backward_dq=mode)
        run = kernels.prepare_backward(pb, cfg)
        grads[mode] = run(q, k, v, out, lse, do)
        rec["bwd_ms"][mode] = time_cuda(torch, lambda: run(q, k, v, out, lse, do),
                                        timing="device")[0]
        rec["bwd_kernel_ms"][mode] = per_kernel_ms(
            torch, lambda: kernels.backward(pb, out, lse, do, cfg))
    rec["max_abs_diff_between_modes"] = _max_diff(grads["kernel"], grads["atomic"])
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

    def sdpa_run(backward):
        with sdpa_context(backend):
            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            if backward:
                o.backward(do)
                qg.grad = kg.grad = vg.grad = None
    fwd = time_cuda(torch, lambda: sdpa_run(False), timing="device")[0]
    rec["sdpa_bwd_ms"] = time_cuda(torch, lambda: sdpa_run(True), timing="device")[0] - fwd
    rec["atomic_speedup"] = rec["bwd_ms"]["kernel"] / rec["bwd_ms"]["atomic"]
    progress(f"{dt} d={d} causal={causal} N={n}: " + " ".join(
        f"{m} {rec['bwd_ms'][m]:.3f} ms ({'+'.join(f'{x:.3f}' for x in rec['bwd_kernel_ms'][m])})"
        for m in DQ_MODES) + f" | atomic {rec['atomic_speedup']:.2f}x faster | {backend} bwd "
        f"{rec['sdpa_bwd_ms']:.3f} ms | max |diff| {rec['max_abs_diff_between_modes']:.3g}")
    return rec


def _sdpa_bwd_ms(row) -> tuple[str, float]:
    """(backend, backward ms) of a ``--backward-dq`` row (files before float32 rows name FLASH's
    alone)."""
    if "sdpa_bwd_ms" in row:
        return row["sdpa_backend"].removeprefix("sdpa-").upper(), row["sdpa_bwd_ms"]
    return "FLASH", row["sdpa_flash_bwd_ms"]


def show_backward_dq(path) -> None:
    """The table of a ``--backward-dq`` file: per case the two modes' backward times, the
    atomic mode's speed-up and SDPA's backward (FLASH, or EFFICIENT for float32) against each
    mode."""
    with open(path) as f:
        data = json.load(f)
    print(f"# {data['provenance'].get('gpu', '?')}  "
          f"{data['provenance'].get('date', '?')}  ({data['provenance'].get('command', '?')})")
    print(f"{'dtype':>5} {'d':>4} {'causal':>6} {'N':>5} {'kernel ms':>10} {'atomic ms':>10} "
          f"{'speed-up':>8} {'SDPA':>9} {'SDPA/kernel':>11} {'SDPA/atomic':>11}")
    for r in data["rows"]:
        backend, sd = _sdpa_bwd_ms(r)
        print(f"{r['dtype']:>5} {r['head_dim']:>4} {str(r['causal']):>6} {r['seq_len']:>5} "
              f"{r['bwd_ms']['kernel']:10.3f} {r['bwd_ms']['atomic']:10.3f} "
              f"{r['atomic_speedup']:8.2f} {backend:>9} {sd / r['bwd_ms']['kernel']:11.2f} "
              f"{sd / r['bwd_ms']['atomic']:11.2f}")


def profile_case(torch, dt, d, causal, n) -> dict:
    """One forward and one backward per order of `PROFILE_ORDERS`, each inside a profiler range
    (module docstring). Returns the case's shape."""
    import kernels
    b, h, q, k, v, do = benchmark_inputs(torch, dt, d, n)
    pb = attention_problem(q, k, v, causal=causal)
    for order in PROFILE_ORDERS:
        cfg = order_config(order)

        def both():
            out, lse = kernels.forward(pb, cfg)
            kernels.backward(pb, out, lse, do, cfg)
        both()                                    # compiles this order's kernels
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        both()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
        print(f"profiled order {order}: forward, dQ, dK/dV ({dt} d={d} causal={causal} N={n} "
              f"B={b} H={h})", flush=True)
    return {"dtype": dt, "head_dim": d, "causal": causal, "seq_len": n, "batch": b, "heads": h}


def _profile_csv(path) -> str:
    """The ncu CSV text of a ``--profile`` run: ``path`` itself (a CSV), the ``ncu_csv`` of its
    JSON (`embed_ncu`), or the CSV beside that JSON."""
    from pathlib import Path
    path = Path(path)
    if path.suffix == ".json":
        doc = json.loads(path.read_text())
        if "ncu_csv" in doc:
            return doc["ncu_csv"]
        path = path.with_suffix(".csv")
    return path.read_text()


def embed_ncu(profile_json) -> None:
    """Copy the ncu CSV beside a ``--profile`` run's JSON into it (``ncu_csv``, verbatim; its
    kernels checked by `profile_rows` first), so that one file carries both."""
    from pathlib import Path
    path = Path(profile_json)
    doc = json.loads(path.read_text())
    text = path.with_suffix(".csv").read_text()
    _checked_rows(text, path.with_suffix(".csv"))
    doc["ncu_csv"] = text
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{path}: ncu_csv embedded ({len(text)} characters); the CSV beside it can go")


def profile_rows(csv_path) -> list[dict]:
    """The kernels of a ``--profile`` run's ncu CSV (`benchmarks.ncu.parse_ncu_csv`; ``csv_path``
    as `_profile_csv` takes it): three per order of `PROFILE_ORDERS`, in launch order."""
    return _checked_rows(_profile_csv(csv_path), csv_path)


def _checked_rows(text: str, csv_path) -> list[dict]:
    """The kernels of an ncu CSV's ``text`` (from ``csv_path``), three per order of
    `PROFILE_ORDERS`; SystemExit naming the file where there are not."""
    from .ncu import parse_ncu_csv
    rows = parse_ncu_csv(text)
    if len(rows) != len(PROFILE_ORDERS) * len(PROFILE_KERNELS):
        raise SystemExit(f"{csv_path}: {len(rows)} kernels, expected "
                         f"{len(PROFILE_ORDERS) * len(PROFILE_KERNELS)}")
    return rows


def show_ncu(path) -> None:
    """The table of a ``--profile`` run's ncu CSV (three kernels per order of
    `PROFILE_ORDERS`, in launch order)."""
    rows = profile_rows(path)
    print(f"{'order':>6} {'kernel':>7} {'grid':>6} {'ms':>8} {'L2 hit %':>9} "
          f"{'L2 read sectors':>16} {'DRAM read GB':>13}")
    for i, r in enumerate(rows):
        m = r["metrics"]
        print(f"{PROFILE_ORDERS[i // 3]:>6} {PROFILE_KERNELS[i % 3]:>7} "
              f"{m['launch__grid_size']:6.0f} {m['gpu__time_duration.sum'] / 1e6:8.3f} "
              f"{m['lts__t_sector_hit_rate.pct']:9.2f} {m['lts__t_sectors_op_read.sum']:16,.0f} "
              f"{m['dram__bytes_read.sum'] / 1e9:13.3f}")


def model_vs_ncu(profile_json, profile="h100") -> list[dict]:
    """Measured (ncu) against predicted (sim, L2 model in each launch order) DRAM reads of a
    ``--profile`` run: ``profile_json`` is its ``--out``, with the CSV inside it (`embed_ncu`)
    or beside it (the same name ending in ``.csv``). Prints one line per (order, kernel);
    returns the rows."""
    from ioaware.launch_order import parse_head_group
    from kernels import mma_fwd, tf32_fwd
    from sim.model import predict
    from sim.workload import Schedule, Workload
    with open(profile_json) as f:
        case = json.load(f)["case"]
    rows = profile_rows(profile_json)
    d, dt, causal = case["head_dim"], case["dtype"], case["causal"]
    if dt == "fp32":
        fwd_blocks, unit = tf32_fwd.default_blocks(d), "tf32"
    else:
        fwd_blocks, unit = mma_fwd.default_blocks(d, causal), "tensor"
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
            out.append({"order": order, "kernel": kern, "measured_dram_read_bytes": meas,
                        "predicted_dram_read_bytes": pred[kern],
                        "l2_model": pf.l2.model if kern == "forward" else pb.l2.model})
            print(f"{order:>6} {kern:>7} {meas / 1e9:12.3f} {pred[kern] / 1e9:13.3f} "
                  f"{100 * (pred[kern] / meas - 1):+6.0f}% {out[-1]['l2_model']:>9}")
    return out


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def _causals(text):
    return {"off": [False], "on": [True], "both": [False, True]}[text]


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks tune",
                                 description=first_sentence(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc_usage(__doc__))
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--family", choices=tuple(FAMILY_DTYPE), help="time this family's block sizes")
    what.add_argument("--orders", action="store_true", help="time the launch orders")
    what.add_argument("--backward-dq", action="store_true",
                      help="time the tensor-core backwards' dQ kernel against dQ by atomics")
    what.add_argument("--show-backward-dq", metavar="FILE.json", default=None,
                      help="print a --backward-dq file as a table (CPU)")
    ap.add_argument("--n", type=int, default=4096, help="--family: sequence length")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128],
                    help="--family, --backward-dq: head dims")
    ap.add_argument("--dtype", nargs="+", choices=("fp16", "bf16", "fp32"),
                    default=["fp16", "bf16"], help="--backward-dq: dtypes (fp32: the tf32 family)")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=list(DQ_SEQ_LENS),
                    help="--backward-dq: sequence lengths")
    ap.add_argument("--dq-family", choices=("mma", "wgmma"), default="mma",
                    help="--backward-dq: the float16/bfloat16 backward timed (wgmma: Hopper's)")
    ap.add_argument("--causal", choices=("off", "on", "both"), default="both",
                    help="--family, --backward-dq: causal masking")
    ap.add_argument("--quick", action="store_true", help="--orders: two cases only")
    ap.add_argument("--profile", metavar="DTYPE:D:causal|full:N", default=None,
                    help="--orders: run one case per order for a profiler (ncu --metrics "
                         + PROFILE_METRICS + ")")
    ap.add_argument("--show-ncu", metavar="FILE.csv", default=None,
                    help="--orders: print a --profile run's ncu CSV (or its JSON with the CSV "
                         "embedded) as a table (CPU)")
    ap.add_argument("--embed-ncu", metavar="FILE.json", default=None,
                    help="--orders: copy the CSV beside a --profile run's JSON into it (CPU)")
    ap.add_argument("--model-ncu", metavar="FILE.json", default=None,
                    help="--orders: the cost model's DRAM reads against a --profile run's (CPU)")
    ap.add_argument("--out", default=None, help="JSON file to write (with provenance)")
    args = ap.parse_args(argv)
    if args.show_backward_dq:
        show_backward_dq(args.show_backward_dq)
        return 0
    if args.show_ncu:
        show_ncu(args.show_ncu)
        return 0
    if args.embed_ncu:
        embed_ncu(args.embed_ncu)
        return 0
    if args.model_ncu:
        model_vs_ncu(args.model_ncu)
        return 0

    import torch
    if not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks tune needs a CUDA GPU (torch.cuda.is_available() "
                         "is False)")
    from kernels import tile_scheduler
    command = command_line("tune", argv)
    if args.profile:
        dt, d, c, n = args.profile.split(":")
        if dt not in ("fp32", "fp16") or c not in ("causal", "full"):
            ap.error(f"--profile: expected e.g. fp32:128:causal:8192, got {args.profile!r}")
        case = profile_case(torch, dt, int(d), c == "causal", int(n))
        if args.out:
            prov = provenance(command, extra={
                "profiler": os.environ.get("IOAWARE_PROFILER_COMMAND", "unknown")})
            write_json({"schema": "ioaware.tune_order_profile/1", "provenance": prov,
                        "case": case, "orders": list(PROFILE_ORDERS),
                        "kernels_per_order": list(PROFILE_KERNELS)}, args.out)
        return 0
    extra = {"timing": "device"}
    if args.orders:
        extra["default_head_group"] = {f"{p}:{'causal' if c else 'full'}": g
                                       for (p, c), g in tile_scheduler.DEFAULT_HEAD_GROUP.items()}
    prov = provenance(command, extra=extra)
    schema = ("ioaware.tune_order/1" if args.orders else "ioaware.tune_backward_dq/1"
              if args.backward_dq else "ioaware.tune_blocks/1")

    def save(rows):                 # after every case, so that a cut-off run keeps its rows
        if args.out:
            write_json({"schema": schema, "provenance": prov, "rows": rows}, args.out)
    say = lambda s: print(s, flush=True)  # noqa: E731
    if args.backward_dq:
        rows = []
        for dt in args.dtype:
            for d in args.d:
                for causal in _causals(args.causal):
                    for n in args.seq_lens:
                        rows.append(backward_dq_case(torch, dt, d, causal, n, progress=say,
                                                     half_family=args.dq_family))
                        torch.cuda.empty_cache()
                        save(rows)
    elif args.orders:
        rows = []
        for case in (QUICK_ORDER_CASES if args.quick else ORDER_CASES):
            rows.append(order_case(torch, *case, progress=say))
            torch.cuda.empty_cache()
            save(rows)
    else:
        say(f"{torch.cuda.get_device_name()}: {args.family} family, N={args.n}, "
            f"{FAMILY_DTYPE[args.family]}")
        save(tune_blocks(torch, args.family, args.d, args.n, _causals(args.causal), say, save))
    if args.out:
        print("wrote", args.out, file=sys.stderr)
    return 0
