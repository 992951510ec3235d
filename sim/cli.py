"""Command line: ``python -m sim predict ...``, ``python -m sim sweep ...``, ``python -m sim search ...``,
``python -m sim ring ...``, ``python -m sim flash3-ablation ...``.

``predict`` prints one JSON object (``--json``) or a readable table, with a calibrated time
only when ``--calibrate-on RESULTS.json [...]`` names the measurements to fit it on; ``sweep``
prints a table or writes CSV (``--csv PATH``), with a progress bar on stderr for large sweeps;
``search`` lists the feasible block sizes, the predicted best and the frontier; ``ring`` prices
context-parallel ring attention over P GPUs step by step (:mod:`sim.ring`). ``predict --schedule
flash3`` prices FlashAttention-3's forward plan (`sim.plans.flash3`) with its overlap model;
``flash3-ablation`` tabulates what each of its ideas buys and compares the model with the
FlashAttention-3 paper's figures and, given ``--measured FILE``, with measured records.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys

import numpy as np

from .model import predict
from .profiles import PROFILES, load_profile
from .ring import interconnect_for, load_interconnect, predict_ring
from .search import SWEEP_COLUMNS, progress_bar, search_blocks, sweep
from .workload import DELTA_KERNELS, DQ_MODES, EXP_FLOPS, NAIVE_VARIANTS, Schedule, Workload
from .decode import MMA_WARP_CHOICES

__all__ = ["main"]


def _int_list(text: str) -> list[int]:
    """"64", "64,128", "512..8192" (powers of two, doubling) or "16:128:16" (start:stop:step, inclusive)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if ".." in part:
                lo, hi = (int(x) for x in part.split(".."))
                v = lo
                while v <= hi:
                    out.append(v)
                    v *= 2
            elif ":" in part:
                lo, hi, step = (int(x) for x in part.split(":"))
                out.extend(range(lo, hi + 1, step))
            else:
                out.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected integers like 64, 64,128, 512..8192 or 16:128:16, got {text!r}") from None
    if not out or any(v < 1 for v in out):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return out


def _device(text: str):
    try:
        return load_profile(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(p: argparse.ArgumentParser, multi: bool, dtypes=("fp16", "bf16", "fp32")):
    conv = _int_list if multi else int
    p.add_argument("--batch", type=conv, default=[1] if multi else 1)
    p.add_argument("--heads", type=conv, default=[16] if multi else 16)
    p.add_argument("--heads-kv", type=int, default=None, help="KV heads (GQA/MQA); default = heads")
    p.add_argument("--seq-len", type=conv, required=not multi, default=[1024] if multi else None,
                   help="sequence length N (Nq = Nk unless --seq-len-k)")
    p.add_argument("--seq-len-k", type=int, default=None)
    p.add_argument("--head-dim", type=conv, default=[64] if multi else 64)
    p.add_argument("--dtype", choices=dtypes, default="fp16")
    p.add_argument("--device", type=_device, default=load_profile("h100"),
                   help=f"profile name ({', '.join(sorted(PROFILES))}, a100=a100-80gb) or a profile .json")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--dropout", action="store_true")
    p.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "fwd+bwd"), default="fwd")
    p.add_argument("--num-warps", type=int, default=4)


def _window(text: str) -> tuple[int, int]:
    """"LEFT,RIGHT": a sliding window as FlashAttention-2's window_size (-1 = unbounded side)."""
    try:
        left, right = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LEFT,RIGHT such as 4095,0 (-1 = unbounded), got "
                                         f"{text!r}") from None
    if min(left, right) < -1:
        raise argparse.ArgumentTypeError(f"window sides must be >= -1 (-1 = unbounded), got {text!r}")
    return left, right


def _split_kv_cmd(a) -> int:
    """``predict --schedule split-kv``: the split-KV decoding plan (`sim.decode`) and its costs."""
    from .decode import DRAM_RATE, split_kv_costs, split_kv_plan, uses_tensor_cores
    for flag, value in (("--dropout", a.dropout), ("--density", a.density), ("--window", a.window),
                        ("--block-q", a.block_q), ("--block-k", a.block_k)):
        if value:
            raise SystemExit(f"error: {flag} does not apply to --schedule split-kv (a decoding forward)")
    if a.pass_ != "fwd":
        raise SystemExit("error: --schedule split-kv is a forward (--pass fwd)")
    heads_kv = a.heads_kv or a.heads
    if a.heads % heads_kv:
        raise SystemExit(f"error: --heads {a.heads} must be a multiple of --heads-kv {heads_kv}")
    seq_len_k = a.seq_len_k or a.seq_len
    element = {"fp16": 2, "bf16": 2, "fp32": 4}[a.dtype]
    if a.decode_warps is not None and not uses_tensor_cores(a.head_dim, element):
        raise SystemExit(f"error: --decode-warps sets the tensor-core kernel's warps; {a.dtype} at "
                         f"--head-dim {a.head_dim} runs the CUDA-core kernel")
    prof = a.device if a.rates is None else a.device.with_rates(a.rates)
    plan = split_kv_plan(a.batch, a.heads, heads_kv, a.seq_len, seq_len_k, a.head_dim, element,
                         a.device.num_sms, splits=a.splits,
                         smem_bytes_per_sm=a.device.smem_bytes_per_sm, mma_warps=a.decode_warps,
                         gpu=prof)
    costs = split_kv_costs(plan, prof)
    d = {"schedule": "split-kv", "profile": a.device.name, "plan": plan.as_dict(), **costs,
         "predicted_ms": costs["time_s"] * 1e3}
    if a.json:
        print(json.dumps(d, indent=None if a.compact else 2))
        return 0
    rows = [("schedule", f"split-kv (fwd) on {a.device.name}"),
            ("splits", f"{plan.splits}" + (" (given)" if a.splits else " (chosen by the model)")),
            ("kernel", f"tensor cores (mma), {plan.warps} warps a program"
             + (" (given)" if a.decode_warps else "") + f", {plan.stages} stages a warp, "
             f"{plan.resident_per_sm} resident an SM" if plan.unit == "mma" else "CUDA cores (ffma)"),
            ("grid x threads", f"{plan.grid[0]} x {plan.grid[1]} programs of {plan.threads} threads"),
            ("rows per program", f"{plan.rows_per_program} ({plan.row_chunks} chunk(s) per KV head)"),
            ("K/V bytes (read once per KV head)", _fmt(costs["kv_bytes"])),
            ("DRAM read bytes", _fmt(costs["dram_read_bytes"])),
            ("DRAM write bytes", _fmt(costs["dram_write_bytes"])),
            ("FLOPs", _fmt(costs["flops"])), ("wave efficiency", f"{costs['wave_efficiency']:.3f}"),
            ("predicted time", f"{costs['time_s'] * 1e3:.4f} ms (main {costs['time_main_s'] * 1e3:.4f}, "
                               f"merge {costs['time_merge_s'] * 1e3:.4f}; " + (
                                   f"the kernel's measured decode figures ({costs['rates']['decode']})"
                                   if "decode" in costs["rates"] else
                                   f"DRAM at {costs['rates'][DRAM_RATE]} rates, the launch cost in main")
                               + ")")]
    width = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _predict_cmd(a) -> int:
    if a.schedule == "flash3":
        return _flash3_cmd(a)
    for flag, value in (("--dtype fp8", a.dtype == "fp8"), ("--no-warp-specialise", a.no_warp_specialise),
                        ("--no-pingpong", a.no_pingpong), ("--no-intra-overlap", a.no_intra_overlap),
                        ("--stages", a.stages is not None), ("--cluster-m", a.cluster_m is not None)):
        if value:
            raise SystemExit(f"error: {flag} applies to --schedule flash3 only")
    if a.schedule == "split-kv":
        return _split_kv_cmd(a)
    if a.rates is not None:
        raise SystemExit("error: predict --rates applies to --schedule split-kv and flash3 (the "
                         "textbook schedules' model is the roofline; `python -m sim plan --family F "
                         "--rates` prices a kernel family's plan)")
    if a.splits is not None or a.decode_warps is not None:
        raise SystemExit("error: --splits and --decode-warps apply to --schedule split-kv only")
    w = Workload(batch=a.batch, heads=a.heads, heads_kv=a.heads_kv, seq_len_q=a.seq_len,
                 seq_len_k=a.seq_len_k, head_dim=a.head_dim, dtype=a.dtype, causal=a.causal,
                 dropout=a.dropout, pass_=a.pass_, block_density=a.density, block_mask_seed=a.seed,
                 window_size=a.window)
    try:
        s = Schedule(a.schedule, a.block_q, a.block_k, num_warps=a.num_warps,
                     fused_softmax=a.fused_softmax, matmul_unit=a.matmul_unit,
                     exp_flops=a.exp_flops, dq_mode=a.dq_mode, variant=a.variant,
                     micro_tile=a.micro_tile, micro_tile_kv=a.micro_tile_kv,
                     delta_kernel=a.delta_kernel)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    p = predict(w, s, a.device, l2=a.l2, calibration=a.calibrate_on)
    d = p.to_dict()
    if a.json:
        print(json.dumps(d, indent=None if a.compact else 2))
        return 0
    rows = [("schedule", f"{a.schedule} ({a.pass_}) on {p.profile.name}"),
            ("window (left, right)", "none" if w.window_size is None else str(w.window_size)),
            ("block_q x block_k", f"{p.block_q} x {p.block_k}"),
            ("sram bytes / block", _fmt(p.sram_bytes_per_block)), ("blocks / SM", p.blocks_per_sm),
            ("FLOPs (matmul)", _fmt(p.matmul_flops)), ("FLOPs (other)", _fmt(p.other_flops)),
            ("global (HBM) read bytes", _fmt(p.hbm_read_bytes)), ("global (HBM) write bytes", _fmt(p.hbm_write_bytes)),
            ("DRAM read bytes", _fmt(p.dram_read_bytes)), ("DRAM write bytes", _fmt(p.dram_write_bytes)),
            ("L2 model", f"{p.l2.model}" + (f", hit rate {p.l2.hit_rate:.3f}" if p.l2.hit_rate is not None else "")),
            ("arithmetic intensity", f"{p.arithmetic_intensity:.1f} FLOP/byte"),
            ("predicted time (raw)", f"{p.predicted_ms:.4f} ms ({p.bound}-bound)"),
            ("predicted time (calibrated)", _calibrated_text(p, a.calibrate_on))]
    for k, v in p.times_ms.items():
        rows.append((f"  {k} time", f"{v:.4f} ms"))
    width = max(len(r[0]) for r in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _flash3_cmd(a) -> int:
    """``predict --schedule flash3``: FlashAttention-3's forward plan (`sim.plans.flash3`) priced
    by `sim.plan.price`, with what hides under what."""
    from .plan import price
    from .plans import plan_for
    from .plans.flash3 import overlap_report, tflops
    for flag, value in (("--dropout", a.dropout), ("--density", a.density), ("--splits", a.splits),
                        ("--decode-warps", a.decode_warps), ("--fused-softmax", a.fused_softmax), ("--variant", a.variant),
                        ("--micro-tile", a.micro_tile), ("--micro-tile-kv", a.micro_tile_kv),
                        ("--calibrate-on", a.calibrate_on)):
        if value:
            raise SystemExit(f"error: {flag} does not apply to --schedule flash3")
    if a.pass_ != "fwd":
        raise SystemExit("error: --schedule flash3 is a forward (--pass fwd)")
    if a.dtype == "fp32":
        raise SystemExit("error: --dtype fp32: FlashAttention-3 has no float32 forward (fp16, bf16 or fp8)")
    if a.l2 == "trace":
        raise SystemExit("error: --l2 trace: flash3 plans are priced with the analytic L2 model (auto, "
                         "analytic or none)")
    w = Workload(batch=a.batch, heads=a.heads, heads_kv=a.heads_kv, seq_len_q=a.seq_len,
                 seq_len_k=a.seq_len_k, head_dim=a.head_dim, dtype="bf16" if a.dtype == "fp8" else a.dtype,
                 causal=a.causal, window_size=a.window)
    plan = plan_for("flash3", "fwd", w, block_q=a.block_q, block_k=a.block_k,
                    stages=2 if a.stages is None else a.stages, warp_specialised=not a.no_warp_specialise,
                    pingpong=not a.no_pingpong, intra_overlap=not a.no_intra_overlap, dtype=a.dtype,
                    cluster_m=a.cluster_m)
    prof = a.device if a.rates is None else a.device.with_rates(a.rates)
    cost = price(plan, prof, l2="none" if a.l2 == "none" else "analytic")
    rep = overlap_report(cost)
    k = cost.kernels[0]
    d = {"schedule": "flash3", "pass": "fwd", "profile": cost.profile, "workload": w.to_dict(),
         "config": dict(plan.config), "predicted_ms": cost.time_ms, "tflops": tflops(w, cost.time_s),
         "bound": rep["critical_path"], "global_bytes": cost.global_bytes, "dram_bytes": cost.dram_bytes,
         "flops": cost.flops, "matmul_flops": k.matmul_flops, "mufu_ops": k.mufu_ops,
         "resident_per_sm": k.resident_per_sm, "wave_utilisation": k.wave_utilisation,
         "overlap": rep, "rate_sources": dict(cost.rate_sources), "kernels": cost.to_dict()["kernels"]}
    d["workload"]["dtype"] = a.dtype
    if a.json:
        print(json.dumps(d, indent=None if a.compact else 2))
        return 0
    cfg = plan.config
    ideas = [n for n, on in (("warp specialisation", cfg["warp_specialised"]), ("ping-pong", cfg["pingpong"]),
                             ("intra-warpgroup overlap", cfg["intra_overlap"])) if on]
    rows = [("schedule", f"flash3 (fwd, {a.dtype}) on {cost.profile}"),
            ("ideas on", ", ".join(ideas) or "none (the FlashAttention-2-style baseline)"),
            ("block_q x block_k", f"{cfg['block_q']} x {cfg['block_k']} ({cfg['consumer_warpgroups']} consumer "
                                  f"warpgroups, {cfg['stages']} stages, cluster {cfg['cluster_m']})"),
            ("programs, resident / SM", f"{k.programs:,}, {k.resident_per_sm} (wave utilisation "
                                        f"{k.wave_utilisation:.3f})"),
            ("global bytes", _fmt(round(cost.global_bytes))), ("DRAM bytes", _fmt(round(cost.dram_bytes))),
            ("FLOPs (matmul)", _fmt(k.matmul_flops)), ("MUFU ops", _fmt(k.mufu_ops)),
            ("predicted time (raw)", f"{cost.time_ms:.4f} ms, {d['tflops']:.0f} TFLOP/s ({rep['critical_path']})")]
    for name, ms in rep["levels_ms"].items():
        if ms:
            rows.append((f"  {name}", f"{ms:.4f} ms" + ("  hidden" if name in rep["hidden"] else "")))
    for label, ms in rep["chains_ms"].items():
        rows.append((f"  chain {label}", f"{ms:.4f} ms"))
    width = max(len(r[0]) for r in rows)
    for name, v in rows:
        print(f"{name:<{width}}  {v}")
    return 0


def _plan_cmd(a) -> int:
    """``plan``: what one of our kernel families launches for a workload (`sim.plans`), priced
    by `sim.plan.price`; ``--choose``: every legal configuration ranked by the model."""
    from .plan import price
    from .plans import CONFIGS, PLANNERS, choose, plan_for
    families = sorted({f for f, _p in PLANNERS})
    if a.family not in families:
        raise SystemExit(f"error: --family: expected one of {families}, got {a.family!r}")
    if a.pass_ == "fwd+bwd":
        raise SystemExit("error: --pass: a plan is of one pass (fwd or bwd)")
    w = Workload(batch=a.batch, heads=a.heads, heads_kv=a.heads_kv, seq_len_q=a.seq_len,
                 seq_len_k=a.seq_len_k, head_dim=a.head_dim, dtype=a.dtype, causal=a.causal,
                 dropout=a.dropout, pass_=a.pass_, window_size=a.window)
    prof = a.device if a.rates is None else a.device.with_rates(a.rates)
    tiles = {k: v for k, v in (("block_q", a.block_q), ("block_k", a.block_k)) if v is not None}
    dq_mode = getattr(a, "plan_dq_mode", None)             # (`search --family` has no --dq-mode)
    if dq_mode is not None and (a.family not in ("mma", "tf32", "wgmma") or a.pass_ != "bwd"):
        raise SystemExit("error: --dq-mode: only the mma, tf32 and wgmma backwards have dQ modes")
    fixed = {}
    schedule = getattr(a, "plan_schedule", None)
    if schedule is not None:
        if a.family not in ("wgmma", "wgmma_fp8") or a.pass_ != "fwd":
            raise SystemExit("error: --schedule: only the wgmma forwards have schedules")
        from .plans.wgmma_fwd import SCHEDULES
        fixed["pingpong"], fixed["overlap"] = SCHEDULES[schedule]
    if a.family in ("mma", "tf32") and a.pass_ == "bwd":
        # what the launcher runs on this GPU unless asked otherwise
        from .plans.tensor_core_bwd import mma_default_dq_mode, tf32_default_dq_mode
        rule = mma_default_dq_mode if a.family == "mma" else tf32_default_dq_mode
        fixed["dq_mode"] = dq_mode or rule(prof.compute_capability, head_dim=w.head_dim)
    if a.family == "wgmma" and a.pass_ == "bwd" and dq_mode is not None:
        fixed["dq_mode"] = dq_mode          # (None: the plan's rule, wgmma_default_dq_mode)
    ranked = None
    if a.choose:
        if (a.family, a.pass_) not in CONFIGS:
            raise SystemExit(f"error: --choose: no configurations listed for {a.family} {a.pass_}")
        if tiles:
            raise SystemExit("error: --choose ranks every configuration: leave out --block-q/--block-k")
        cfg, cost, ranked = choose(a.family, a.pass_, w, prof, **fixed)
        plan = cost.plan
    else:
        plan = plan_for(a.family, a.pass_, w, **tiles, **fixed)
        cost = price(plan, prof)
    d = cost.to_dict()
    d["kernels_plan"] = [{"name": k.name, "grid": list(k.grid), "threads": k.threads,
                          "shared_bytes": k.shared_bytes, "registers": k.registers,
                          "accesses": [{"tensor": x.tensor, "op": x.op, "bytes": x.bytes, "how": x.how}
                                       for x in k.accesses],
                          "matmuls": [{"unit": m.unit, "flops": m.flops, "passes": m.passes}
                                      for m in k.matmuls],
                          "fp32_flops": k.fp32_flops, "mufu_ops": k.mufu_ops,
                          "shared_bytes_moved": k.shared_bytes_moved} for k in plan.kernels]
    if ranked is not None:
        d["ranked"] = [{"time_ms": t * 1e3, "config": c} for t, c in ranked]
    if a.json:
        print(json.dumps(d, indent=None if a.compact else 2, default=str))
        return 0
    print(f"{a.family} {a.pass_} plan on {cost.profile} ({', '.join(sorted(set(cost.rate_sources.values())))} "
          f"rates): {_fmt(round(cost.global_bytes))} global bytes, {_fmt(round(cost.dram_bytes))} DRAM "
          f"bytes, {_fmt(cost.flops)} FLOPs, {cost.time_ms:.4f} ms")
    if "overlap" in plan.config:
        print(f"  schedule: ping-pong {'on' if plan.config['pingpong'] else 'off'}, "
              f"intra-warpgroup overlap {'on' if plan.config['overlap'] else 'off'}, "
              f"{plan.config['stages']} stages (declared; priced as the serial kernel)")
    for k, kc in zip(plan.kernels, cost.kernels):
        print(f"  {k.name}: grid {k.grid}, {k.threads} threads, {_fmt(k.shared_bytes)} B shared, "
              f"{k.registers or '?'} registers, {kc.resident_per_sm} resident / SM, "
              f"{kc.time_s * 1e3:.4f} ms ({kc.bound}-bound)")
        for x in k.accesses:
            print(f"    {x.op:<6} {x.tensor:<6} {_fmt(x.bytes):>16} B  {x.how}")
    if ranked is not None:
        print("configurations, fastest first (the model's ranking):")
        for t, c in ranked:
            print(f"  {' '.join(f'{k}={v}' for k, v in c.items()):<28} {t * 1e3:.4f} ms")
    return 0


def _percent(v) -> str:
    return "" if v is None else f"{100 * v:+.0f}%"


def _number(v) -> str:
    return "" if v is None else f"{v:.0f}"


def _flash3_ablation_cmd(a) -> int:
    """``flash3-ablation``: what each of FlashAttention-3's ideas buys (`sim.plans.flash3`), the
    comparison with the paper's figures and, with ``--measured``, with measured records."""
    from .plans.flash3 import (SPEEDUP_TOLERANCE, ablation, compare_with_paper,
                               compare_with_records, in_paper_setting, pipe_shares,
                               speedup_agreement, speedups_from_rows)
    causals = {"full": (False,), "causal": (True,), "both": (False, True)}[a.mask]
    if a.rates is not None:
        a.device = a.device.with_rates(a.rates)
    rows = ablation(a.device, tuple(a.head_dim), tuple(a.seq_len), causals, tuple(a.dtype))
    paper = compare_with_paper(a.device)
    measured = compare_with_records(a.measured, a.device) if a.measured else None
    speedups = speedups_from_rows(measured) if measured is not None else None
    serial = speedups_from_rows(measured, "serial_softmax") if measured is not None else None
    pipes = pipe_shares(a.pipes, a.device) if a.pipes else None
    if a.json:
        print(json.dumps({"profile": a.device.name, "ablation": rows, "paper": paper,
                          "measured": measured, "speedups": speedups,
                          "speedups_serial_softmax": serial, "pipes": pipes}, indent=2))
        return 0
    print(f"FlashAttention-3 forward ablation on {a.device.name}: predicted TFLOP/s (4 N^2 d H B / time, "
          f"halved when causal), B N = 16k tokens, H d = 2048")
    cols = ("base", "+ws", "ws+intra", "ws+pp", "fa3")
    keys = ("baseline", "+warp_specialisation", "intra_only", "+pingpong", "+intra_overlap")
    print(f"{'dtype':>5} {'d':>4} {'mask':>6} {'N':>6} {'tiles':>8} " + " ".join(f"{c:>8}" for c in cols)
          + f"  {'mufu/mm':>7}  critical path")
    for r in rows:
        print(f"{r['dtype']:>5} {r['head_dim']:>4} {'causal' if r['causal'] else 'full':>6} {r['seq_len']:>6} "
              f"{str(r['block_q']) + 'x' + str(r['block_k']):>8} "
              + " ".join(f"{r['tflops'][k]:8.0f}" for k in keys)
              + f"  {r['mufu_over_matmul']:7.2f}  {r['critical_path']}")
    print("\nFP16 against the FlashAttention-3 paper (TFLOP/s; error of the predicted time vs the paper's)")
    print(f"{'d':>4} {'mask':>6} {'N':>6} {'FA2':>5} {'base':>5} {'err':>6}  {'FA3':>5} {'fa3':>5} {'err':>6}  "
          f"{'serial':>6} {'err':>6}  {'cuDNN':>5}  {'speedup paper':>13} {'model':>5}")
    for f in paper["figure"]:
        print(f"{f['head_dim']:>4} {'causal' if f['causal'] else 'full':>6} {f['seq_len']:>6} "
              f"{f['paper_fa2']:>5} {f['predicted_baseline']:5.0f} {_percent(f['baseline_error_vs_fa2']):>6}  "
              f"{_number(f['paper_fa3']):>5} {f['predicted_flash3']:5.0f} {_percent(f['fa3_error']):>6}  "
              f"{f['predicted_serial_softmax']:6.0f} {_percent(f['serial_softmax_error']):>6}  {f['paper_cudnn']:>5}  "
              f"{'' if f['paper_speedup'] is None else format(f['paper_speedup'], '.2f'):>13} "
              f"{f['predicted_speedup']:5.2f}")
    print("\nThe paper's Table 2 (FP16, B 4, N 8448, H 16, d 128, full mask)")
    for t in paper["table2"]:
        print(f"  {t['configuration']:<50} paper {t['paper_ms']:.3f} ms {t['paper_tflops']:>4} TFLOP/s   "
              f"model {t['predicted_ms']:.3f} ms {t['predicted_tflops']:4.0f} TFLOP/s ({t['critical_path']})")
    if measured is not None:
        print(f"\nMeasured ({a.measured}) against the model: error = (predicted - measured) / measured")
        print(f"{'kernel':>10} {'model':>8} {'d':>4} {'mask':>6} {'N':>6} {'measured ms':>11} {'predicted':>9} "
              f"{'error':>6}  {'serial softmax':>14}")
        for r in measured:
            print(f"{r['kernel']:>10} {r['model']:>8} {r['head_dim']:>4} {'causal' if r['causal'] else 'full':>6} "
                  f"{r['seq_len']:>6} {r['measured_ms']:11.4f} {r['predicted_ms']:9.4f} {100 * r['error']:+5.0f}%  "
                  f"{100 * r['error_by_model']['serial_softmax']:+13.0f}%")
        if speedups["pairs"]:
            print("\nFlashAttention-3 over FlashAttention-2, forward: measured t_flash / t_cudnn "
                  "(one run) against the model's t_baseline / t_flash3 and t_baseline / "
                  "t_serial_softmax")
            print(f"{'dtype':>5} {'d':>4} {'mask':>6} {'N':>6} {'B*H':>5} {'measured':>8} "
                  f"{'predicted':>9} {'error':>6}  {'serial':>6} {'error':>6}")
            for p, q in zip(speedups["pairs"], serial["pairs"]):
                print(f"{p['dtype']:>5} {p['head_dim']:>4} {'causal' if p['causal'] else 'full':>6} "
                      f"{p['seq_len']:>6} {p['batch'] * p['heads']:>5} {p['measured']:8.2f} "
                      f"{p['predicted']:9.2f} {100 * p['error']:+5.0f}%  {q['predicted']:6.2f} "
                      f"{100 * q['error']:+5.0f}%")
            for title, sp in (("cuDNN read as FlashAttention-3 with every overlap (t_flash3)",
                               speedups),
                              ("cuDNN read as the serial-softmax kernel (t_serial_softmax: the "
                               "pipe counters' reading, --pipes)", serial)):
                print(title)
                shapes = [p for p in sp["pairs"] if in_paper_setting(p)]
                for label, pairs, agree in (("  ", sp["pairs"], sp),
                                            ("  at B*N = 16384, H*d = 2048: ", shapes,
                                             speedup_agreement(shapes))):
                    if pairs:
                        n = len(pairs)
                        print(f"{label}within {100 * SPEEDUP_TOLERANCE:.0f} %: "
                              f"{round(agree['within'] * n)} of {n} ({100 * agree['within']:.0f} %); "
                              f"median |error| {100 * agree['median_abs_error']:.0f} %")
    if pipes is not None:
        print(f"\nPipes of cuDNN's forward ({a.pipes}, Nsight Compute): % of the kernel's time the "
              f"wgmma (tensor) and XU (MUFU) pipes are busy, against the model's serial (M / (M + S), "
              f"S / (M + S)) and overlapped (M / max, S / max) kernels")
        print(f"{'dtype':>5} {'d':>4} {'mask':>6} {'N':>6} {'tensor':>7} {'serial':>7} {'overlap':>7}  "
              f"{'xu':>5} {'serial':>7} {'overlap':>7}")
        for p in pipes:
            print(f"{p['dtype']:>5} {p['head_dim']:>4} {'causal' if p['causal'] else 'full':>6} "
                  f"{p['seq_len']:>6} {p['tensor_pct']:7.1f} {p['serial_tensor_pct']:7.1f} "
                  f"{p['overlap_tensor_pct']:7.1f}  {p['xu_pct']:5.1f} {p['serial_xu_pct']:7.1f} "
                  f"{p['overlap_xu_pct']:7.1f}")
    return 0


def _calibrated_text(p, calibrate_on) -> str:
    if not calibrate_on:
        return "n/a (give --calibrate-on RESULTS.json to fit efficiency factors)"
    if p.predicted_ms_calibrated is None:
        return (f"n/a (no record of {p.profile.name} and this kernel program in "
                f"{', '.join(calibrate_on)})")
    return f"{p.predicted_ms_calibrated:.4f} ms ({p.efficiency.source})"


def _calibrate_on(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibrate-on", nargs="+", default=None, metavar="FILE",
                   help="results files to fit the calibrated time on: their records measured on "
                        "--device's GPU with the same kernel program (schedule, pass, CUDA or "
                        "tensor cores); without it only the raw roofline time")


def _fmt(v):
    if v is None:
        return "n/a"
    return f"{v:,}"


def _sweep_cmd(a) -> int:
    schedules = a.schedule
    seqs = a.seq_len
    total = len(schedules) * len(seqs)
    n_configs = total * len(a.head_dim) * len(a.block_q) * len(a.block_k) * len(a.batch) * len(a.heads)
    show = (n_configs >= a.progress_threshold) and not a.no_progress
    parts = []
    done = 0
    for sch in schedules:
        for n in seqs:
            cols = sweep(schedule=sch, seq_len=[n], head_dim=a.head_dim,
                         block_q=a.block_q if sch != "naive" else [0], block_k=a.block_k if sch != "naive" else [0],
                         batch=a.batch, heads=a.heads,
                         heads_kv=[a.heads_kv] if a.heads_kv else None, dtype=a.dtype, causal=a.causal,
                         dropout=a.dropout, pass_=a.pass_, profile=a.device, seq_len_k=a.seq_len_k,
                         num_warps=a.num_warps)
            parts.append(cols)
            done += 1
            if show:
                progress_bar(done, total)
    cols = {k: np.concatenate([p[k] for p in parts]) for k in SWEEP_COLUMNS}
    if a.only_feasible:
        keep = cols["fits_sram"]
        cols = {k: v[keep] for k, v in cols.items()}
    n = len(cols["flops"])
    if a.csv:
        out = sys.stdout if a.csv == "-" else open(a.csv, "w", newline="")
        wr = csv.writer(out)
        wr.writerow(SWEEP_COLUMNS)
        for i in range(n):
            wr.writerow([_cell(cols[k][i]) for k in SWEEP_COLUMNS])
        if out is not sys.stdout:
            out.close()
            print(f"wrote {n} rows to {a.csv}", file=sys.stderr)
        return 0
    show_cols = ("schedule", "seq_len_q", "head_dim", "block_q", "block_k", "sram_bytes_per_block",
                 "hbm_read_bytes", "hbm_write_bytes", "flops", "predicted_ms", "bound")
    table = [[str(_cell(cols[k][i])) for k in show_cols] for i in range(min(n, a.max_rows))]
    widths = [max(len(c), *(len(r[j]) for r in table)) if table else len(c) for j, c in enumerate(show_cols)]
    print("  ".join(c.rjust(wd) for c, wd in zip(show_cols, widths)))
    for r in table:
        print("  ".join(x.rjust(wd) for x, wd in zip(r, widths)))
    if n > a.max_rows:
        print(f"... {n - a.max_rows} more rows (use --csv PATH for all)")
    return 0


def _cell(v):
    if isinstance(v, (np.floating, float)):
        return "" if np.isnan(v) else f"{float(v):.6g}"
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


def _search_cmd(a) -> int:
    if a.family is not None:   # one of our kernel families: its legal configurations, by its plans
        if a.calibrate_on:
            raise SystemExit("error: --calibrate-on applies to the textbook schedules; a family's "
                             "plans are priced with the profile's rates (--rates)")
        a.choose, a.block_q, a.block_k, a.window, a.compact = True, None, None, None, False
        return _plan_cmd(a)
    if a.rates is not None:
        raise SystemExit("error: --rates applies with --family (a kernel family's plans)")
    w = Workload(batch=a.batch, heads=a.heads, heads_kv=a.heads_kv, seq_len_q=a.seq_len,
                 seq_len_k=a.seq_len_k, head_dim=a.head_dim, dtype=a.dtype, causal=a.causal,
                 dropout=a.dropout, pass_=a.pass_)
    r = search_blocks(w, a.device, a.schedule, blocks=tuple(a.blocks), num_warps=a.num_warps, l2=a.l2,
                      calibration=a.calibrate_on)
    if a.json:
        print(json.dumps({"best": _slim(r.best), "frontier": [_slim(x) for x in r.frontier],
                          "grid": [_slim(x) for x in r.grid], "infeasible": r.infeasible,
                          "occupancy_model": r.occupancy_model}, indent=2))
        return 0
    cols = ("block_q", "block_k", "sram_bytes_per_block", "blocks_per_sm", "hbm_read_bytes", "predicted_ms", "on_frontier")
    print("  ".join(f"{c:>20}" for c in cols))
    for row in sorted(r.grid, key=lambda x: x["predicted_ms"]):
        print("  ".join(f"{_cell(row[c]) if not isinstance(row[c], float) else f'{row[c]:.5f}':>20}" for c in cols))
    if r.best:
        print(f"best: block_q={r.best['block_q']} block_k={r.best['block_k']} "
              f"predicted {r.best['predicted_ms']:.5f} ms; infeasible: {len(r.infeasible)} candidates")
    return 0


def _slim(row):
    if row is None:
        return None
    return {k: v for k, v in row.items() if k not in ("phases",)}


def token_count(text: str) -> int:
    """A token count: 131072, 128k (x 1024), 1M (x 1024**2) or 1G (x 1024**3); an argparse type."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}.get(t[-1:], 1)
    try:
        value = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a token count such as 131072 or 128k, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive token count, got {text!r}")
    return value


def _ring_cmd(a) -> int:
    from ioaware.ring_plan import shard_length
    shard_length(a.seq_len, a.world_size, a.layout, name="--seq-len")     # the message names the option
    if a.interconnect:
        if a.interconnect_bandwidth is not None or a.interconnect_latency is not None:
            raise ValueError("give --interconnect FILE or --interconnect-bandwidth/--interconnect-latency, not both")
        link = load_interconnect(a.interconnect)
    else:
        link = interconnect_for(a.device, a.interconnect_bandwidth, a.interconnect_latency)
    r = predict_ring(seq_len=a.seq_len, world_size=a.world_size, batch=a.batch, heads=a.heads,
                     heads_kv=a.heads_kv, head_dim=a.head_dim, dtype=a.dtype, causal=a.causal, layout=a.layout,
                     pass_=a.pass_, profile=a.device, interconnect=link,
                     schedule=Schedule("flash2", a.block_q, a.block_k), l2=a.l2)
    if a.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    print(f"ring attention: N = {r.seq_len:,} over P = {r.world_size} x {r.device} ({r.layout}, "
          f"{'causal' if r.causal else 'full'}, {r.pass_}), {r.shard_len:,} tokens per GPU, "
          f"K/V shard {r.kv_shard_bytes:,} bytes")
    print(f"{'pass':>4} {'step':>4} {'compute ms':>11} {'transfer ms':>12} {'merge ms':>9} {'step ms':>9}  bound")
    for s in r.steps:
        print(f"{s.pass_:>4} {s.index:>4} {s.compute_ms:11.4f} {s.transfer_ms:12.4f} {s.merge_ms:9.4f} "
              f"{s.step_ms:9.4f}  {'transfer' if s.communication_bound else 'compute'}")
    rows = [("exposed transfer", f"{r.exposed_transfer_ms:.4f} ms (the backward's last dK/dV)"),
            ("total (predicted, raw)", f"{r.total_ms:.4f} ms"),
            ("one GPU, same N", f"{r.single_gpu_ms:.4f} ms"),
            ("speedup", f"{r.speedup:.3f}x on {r.world_size} GPUs"),
            ("scaling efficiency", f"{r.scaling_efficiency:.3f}"),
            ("communication dominates below",
             "n/a (one GPU)" if r.crossover_shard_len is None and r.world_size == 1 else
             "every shard length searched" if r.crossover_shard_len is None else
             f"{r.crossover_shard_len:,} tokens per GPU"),
            ("interconnect", f"{r.interconnect.bandwidth_bytes_per_s:.4g} B/s, {r.interconnect.latency_s:.4g} s "
                             f"({r.interconnect.source})")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _dtype_list(text: str) -> list[str]:
    """"fp16" or "fp16,fp8": FlashAttention-3's input dtypes (an argparse type)."""
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in ("fp16", "bf16", "fp8")]
    if not out or bad:
        raise argparse.ArgumentTypeError(f"expected fp16, bf16 or fp8 (comma-separated), got {text!r}")
    return out


def _pair(text):
    try:
        a, b = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TMxTN such as 4x4, got {text!r}") from None
    return (a, b)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sim", description="IO cost model of attention schedules")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict", help="counts and predicted time of one configuration")
    p.add_argument("--schedule", choices=("naive", "flash1", "flash2", "split-kv", "flash3"), required=True,
                   help="split-kv: the decoding forward of sim.decode (few queries, a long KV cache); "
                        "flash3: FlashAttention-3's forward on Hopper (sim.plans.flash3)")
    _common(p, multi=False, dtypes=("fp16", "bf16", "fp32", "fp8"))
    p.add_argument("--no-warp-specialise", action="store_true",
                   help="flash3: no producer warp: the compute warps load each tile and wait for it")
    p.add_argument("--no-pingpong", action="store_true",
                   help="flash3: no ping-pong between the consumer warpgroups")
    p.add_argument("--no-intra-overlap", action="store_true",
                   help="flash3: no softmax/GEMM overlap inside a warpgroup")
    p.add_argument("--stages", type=int, default=None, help="flash3: K/V buffers in shared memory (default 2)")
    p.add_argument("--cluster-m", type=int, choices=(1, 2), default=None,
                   help="flash3: CTAs sharing K/V loads by TMA multicast (default FlashAttention-3's choice)")
    p.add_argument("--splits", type=int, default=None,
                   help="split-kv: key splits (default: the model's choice, sim.decode.choose_splits)")
    p.add_argument("--decode-warps", type=int, choices=MMA_WARP_CHOICES, default=None,
                   help="split-kv: the tensor-core kernel's warps a program (default: the plan's, "
                        "8 where the groups are fewer than the SMs, else 4)")
    p.add_argument("--block-q", type=int, default=None)
    p.add_argument("--block-k", type=int, default=None)
    p.add_argument("--density", type=float, default=None, help="block-sparse density in (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="seed of the density block mask")
    p.add_argument("--window", type=_window, default=None, metavar="LEFT,RIGHT",
                   help="sliding window (FlashAttention-2's window_size, bottom-right aligned): query i "
                        "sees keys i + Nk - Nq - LEFT .. i + Nk - Nq + RIGHT, -1 = unbounded side (write "
                        "--window=-1,0 when LEFT is -1); tiled schedules visit only the band's tiles")
    p.add_argument("--fused-softmax", action="store_true", help="naive: one fused scale/mask/softmax pass")
    p.add_argument("--matmul-unit", choices=("tensor", "tf32", "cuda"), default="tensor")
    p.add_argument("--exp-flops", type=int, default=EXP_FLOPS,
                   help=f"FLOPs per exp (default {EXP_FLOPS}, libdevice expf on sm_90; 1 = textbook)")
    p.add_argument("--dq-mode", choices=DQ_MODES, default="atomic",
                   help="flash2 backward: dQ by float32 atomics or by a separate dQ kernel")
    p.add_argument("--variant", choices=NAIVE_VARIANTS, default=None,
                   help="naive: PyTorch's MATH backend ('math') or eager attention ('eager')")
    p.add_argument("--micro-tile", type=_pair, default=None, metavar="TMxTN",
                   help="flash2 on CUDA cores: per-thread register micro-tile of the forward/dQ "
                        "kernel (e.g. 4x4); prices the shared-memory level")
    p.add_argument("--micro-tile-kv", type=_pair, default=None, metavar="TKxTQ",
                   help="the dK/dV kernel's micro-tile over its block_k x block_q tile")
    p.add_argument("--delta-kernel", choices=DELTA_KERNELS, default="warp",
                   help="flash2 backward's delta pre-pass: one warp or one thread per row")
    p.add_argument("--l2", choices=("auto", "trace", "analytic", "none"), default="auto")
    p.add_argument("--rates", default=None, metavar="RATES.json",
                   help="split-kv, flash3: price at the measured rates of `python -m benchmarks "
                        "rates` (default: the datasheet's)")
    _calibrate_on(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--compact", action="store_true", help="with --json: one line")
    p.set_defaults(func=_predict_cmd)

    pl = sub.add_parser("plan", help="what one of our kernel families launches (sim.plans), priced")
    pl.add_argument("--family", required=True, help="a kernel family with a plan (mma, tf32, ...)")
    _common(pl, multi=False)
    pl.add_argument("--block-q", type=int, default=None)
    pl.add_argument("--block-k", type=int, default=None)
    pl.add_argument("--window", type=_window, default=None, metavar="LEFT,RIGHT",
                    help="sliding window (as predict --window)")
    pl.add_argument("--rates", default=None, metavar="RATES.json",
                    help="measured rates of `python -m benchmarks rates` (default: datasheet rates)")
    pl.add_argument("--dq-mode", dest="plan_dq_mode", choices=("kernel", "atomic"), default=None,
                    help="the mma / tf32 / wgmma backward's dQ: its own kernel or float32 atomics "
                         "from the dK/dV kernel (default: what the launcher runs on --device, "
                         "sim.plans.tensor_core_bwd.mma_default_dq_mode / tf32_default_dq_mode: "
                         "atomic from sm_90, mma at d 128, tf32 at d 64 and 128; wgmma: "
                         "sim.plans.wgmma_bwd.wgmma_default_dq_mode, its dQ kernel)")
    pl.add_argument("--schedule", dest="plan_schedule", default=None,
                    choices=("serial", "pingpong", "overlap", "pingpong+overlap"),
                    help="the wgmma forwards' schedule (sim.plans.wgmma_fwd.SCHEDULES; default: "
                         "the plan's, ping-pong with the intra-warpgroup overlap at block_q 128)")
    pl.add_argument("--choose", action="store_true", help="rank every legal configuration")
    pl.add_argument("--json", action="store_true", help="print one JSON object")
    pl.add_argument("--compact", action="store_true", help="with --json: one line")
    pl.set_defaults(func=_plan_cmd)

    s = sub.add_parser("sweep", help="closed-form sweep over ranges (table or CSV)")
    s.add_argument("--schedule", type=lambda t: t.split(","), default=["flash2"],
                   help="one or more of naive,flash1,flash2 (comma-separated)")
    _common(s, multi=True)
    s.add_argument("--block-q", type=_int_list, default=[64])
    s.add_argument("--block-k", type=_int_list, default=[64])
    s.add_argument("--csv", default=None, help="write CSV to PATH ('-' = stdout)")
    s.add_argument("--only-feasible", action="store_true")
    s.add_argument("--max-rows", type=int, default=50)
    s.add_argument("--no-progress", action="store_true")
    s.add_argument("--progress-threshold", type=int, default=2000, help=argparse.SUPPRESS)
    s.set_defaults(func=_sweep_cmd)

    q = sub.add_parser("search", help="feasible block sizes, best and frontier; with --family, "
                                      "one of our kernel families' legal tiles ranked by its plans")
    q.add_argument("--schedule", choices=("flash1", "flash2"), default="flash2")
    q.add_argument("--family", default=None,
                   help="rank the legal configurations of this kernel family (mma, tf32, simt, ...) "
                        "by its plans, the model that picks the kernels' tiles (as `plan --choose`)")
    q.add_argument("--rates", default=None, metavar="RATES.json",
                   help="with --family: measured rates of `python -m benchmarks rates`")
    _common(q, multi=False)
    q.add_argument("--blocks", type=_int_list, default=[16, 32, 64, 128, 256])
    q.add_argument("--l2", choices=("auto", "trace", "analytic", "none"), default="none")
    _calibrate_on(q)
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=_search_cmd)

    r = sub.add_parser("ring", help="context-parallel ring attention over P GPUs: steps, efficiency, crossover")
    r.add_argument("--seq-len", type=token_count, required=True, help="total sequence length N over all GPUs (131072 or 128k)")
    r.add_argument("--world-size", type=int, required=True, help="GPUs in the ring, P")
    r.add_argument("--layout", choices=("zigzag", "contiguous", "striped"), default="zigzag")
    r.add_argument("--batch", type=int, default=1)
    r.add_argument("--heads", type=int, default=16)
    r.add_argument("--heads-kv", type=int, default=None, help="KV heads (GQA/MQA); default = heads")
    r.add_argument("--head-dim", type=int, default=128)
    r.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="bf16")
    r.add_argument("--device", type=_device, default=load_profile("h100"),
                   help=f"profile name ({', '.join(sorted(PROFILES))}) or a profile .json")
    r.add_argument("--causal", action="store_true")
    r.add_argument("--pass", dest="pass_", choices=("fwd", "bwd", "fwd+bwd"), default="fwd")
    r.add_argument("--block-q", type=int, default=None)
    r.add_argument("--block-k", type=int, default=None)
    r.add_argument("--interconnect", default=None, metavar="FILE",
                   help="JSON with interconnect_bandwidth_bytes_per_s and interconnect_latency_s (a profile, "
                        "or what `benchmarks.ring --p2p` measured); default: the --device profile's")
    r.add_argument("--interconnect-bandwidth", type=float, default=None, metavar="BYTES_PER_S",
                   help="one direction's GPU-to-GPU bandwidth, overriding the profile's")
    r.add_argument("--interconnect-latency", type=float, default=None, metavar="SECONDS",
                   help="latency of one transfer, overriding the profile's")
    r.add_argument("--l2", choices=("auto", "trace", "analytic", "none"), default="analytic")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=_ring_cmd)

    f = sub.add_parser("flash3-ablation", help="FlashAttention-3's forward: what each idea buys, against "
                                               "the paper and measurements")
    f.add_argument("--device", type=_device, default=load_profile("h100"),
                   help=f"profile name ({', '.join(sorted(PROFILES))}) or a profile .json")
    f.add_argument("--head-dim", type=_int_list, default=[64, 128, 256])
    f.add_argument("--seq-len", type=_int_list, default=[512, 1024, 2048, 4096, 8192, 16384],
                   help="lengths N; batch = 16384 / N, heads = 2048 / d (the paper's setting)")
    f.add_argument("--mask", choices=("full", "causal", "both"), default="both")
    f.add_argument("--dtype", type=_dtype_list, default=["fp16", "fp8"], help="fp16, bf16, fp8 (comma-separated)")
    f.add_argument("--measured", default=None, metavar="FILE",
                   help="a results file: compare its FlashAttention-2 (sdpa-flash) and cuDNN (sdpa-cudnn) "
                        "forward records with the model")
    f.add_argument("--pipes", default=None, metavar="NCU_STALLS.json",
                   help="an `ncu --stalls` file: cuDNN's tensor and XU pipe shares against the "
                        "model's serial and overlapped kernels")
    f.add_argument("--rates", default=None, metavar="RATES.json",
                   help="price at this GPU's measured rates (python -m benchmarks rates; wgmma, ex2, "
                        "DRAM, L2 where the file has them), else the profile's datasheet figures")
    f.add_argument("--json", action="store_true", help="print one JSON object")
    f.set_defaults(func=_flash3_ablation_cmd)
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if getattr(a, "cmd", None) == "sweep":
        for sch in a.schedule:
            if sch not in ("naive", "flash1", "flash2"):
                ap.error(f"--schedule: expected naive, flash1 or flash2, got {sch!r}")
    try:
        return a.func(a)
    except (ValueError, OSError) as exc:   # OSError: a --calibrate-on file that cannot be read
        ap.error(str(exc))
    return 2
