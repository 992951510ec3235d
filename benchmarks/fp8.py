"""Command ``fp8``: FlashAttention-3's FP8 forward against the 16-bit forwards, in one run, and its error.

    python -m benchmarks fp8 [--seq-lens 512,1024,2048,4096,8192,16384] [--causal both]
                             [--error-seq-len 2048] [--schedules] [--head-dims 128]
                             [--timing device] [--out FILE.json]

Speed, d = 128 (``--head-dims 64,128``: d = 64 too, its 16-bit rows only), the benchmark's
shapes (`benchmarks.common.benchmark_inputs`: B * N = 16384 tokens, H * d = 2048), causal and
not; CUDA-event medians (`benchmarks.common.time_cuda`) of

* ``ioaware-fp8``: ``ioaware.fp8.attention`` on e4m3 Q, K, V with per-(batch, head) descales
  (the public path: checks, V's transpose, the kernel `kernels.wgmma_fwd.forward_fp8`);
* ``ioaware-fp16``: ``ioaware.attention`` on float16 (the ``wgmma`` forward);
* ``sdpa-flash`` / ``sdpa-cudnn``: PyTorch SDPA on bfloat16, restricted to that backend;

and with ``--schedules`` what the ``wgmma`` kernels' schedules buy (`SCHEDULES`: ``serial``,
``pingpong`` (the two consumer warpgroups take turns issuing their products), ``overlap`` (a
warpgroup's softmax of a tile runs while its O += P V of the tile before is on the tensor cores)
and ``pingpong+overlap``, FlashAttention-3's two), each on the same inputs past ``ioaware``'s
checks: the 16-bit kernel at every legal tile (`kernels.prepare_forward` with
``KernelConfig(family="wgmma", block_q=..., block_k=..., pingpong=..., overlap=...)``; the
schedules at ``block_q`` = 128, ``serial`` at 64) as ``kernel-fp16-{block_q}x{block_k}-{schedule}``,
and the FP8 kernel (`kernels.wgmma_fwd.forward_fp8` with ``pingpong=..., overlap=...``) as
``kernel-fp8-{schedule}``; per kernel ``{unit}_default`` (the plan's default configuration's
name), ``{unit}_best`` (the fastest's) and ``{unit}_serial_over_default`` (t of the default tile
run serially / t of the default: above 1, the default schedule is faster);
with TFLOP/s (4 B H N^2 d, halved when causal), ``flash_over_fp16`` and ``cudnn_over_fp16``
(SDPA's time over ``ioaware-fp16``'s, every row), the ratios ``fp16_over_fp8`` (t_ioaware-fp16 /
t_ioaware-fp8), ``flash_over_fp8`` and ``cudnn_over_fp8``, and the model's time of both plans
(`sim.plan.price` of the ``wgmma_fp8`` and ``wgmma`` plans on the GPU's datasheet profile, or
on ``--rates FILE`` from ``python -m benchmarks rates``).

Error (FlashAttention-3's experiment, arXiv 2407.08608 §4.3): Q, K, V of B = 1, H = 16,
N = ``--error-seq-len``, d = 128 drawn from N(0, 1) plus, on 0.1 % of the entries, N(0, 10^2)
(`ioaware.fp8.outlier_inputs`); the RMSE (`ioaware.fp8.rmse`) of O against float64 attention of
the unquantised inputs, for: ``ioaware-fp16`` (float16 inputs), ``sdpa-flash-fp16``,
``ioaware-fp8`` (per-head scales) and ``ioaware-fp8-incoherent`` (Q and K rotated by
`ioaware.fp8.incoherent` before quantising), beside the paper's figures (Table 3). Writes a
JSON file with provenance.
"""
from __future__ import annotations

import argparse
import math
import sys

from .common import (attention_flops, command_line, first_sentence, provenance, sdpa_context,
                     time_or_error, write_json)
from sim.plans.wgmma_fwd import SCHEDULES, schedule_name    # name -> (pingpong, overlap)

HEAD_DIM = 128
#: FlashAttention-3's Table 3 (RMSE against FP64, inputs with outliers): its figures.
PAPER_RMSE = {"baseline-fp16": 3.2e-4, "flash3-fp16": 1.9e-4, "baseline-fp8": 2.4e-2,
              "flash3-fp8": 9.1e-3, "flash3-fp8-no-block-quant": 9.3e-3,
              "flash3-fp8-no-incoherent": 2.4e-2}


def _sizes(text: str) -> list[int]:
    return [int(t[:-1]) * 1024 if t.endswith("k") else int(t) for t in text.split(",") if t]


def _model_ms(batch, heads, n, causal, profile) -> dict:
    from sim.plan import price
    from sim.plans import plan_for
    from sim.workload import Workload
    out = {}
    for family, dtype in (("wgmma_fp8", "bf16"), ("wgmma", "fp16")):
        w = Workload(batch=batch, heads=heads, seq_len_q=n, head_dim=HEAD_DIM, dtype=dtype,
                     causal=causal)
        out[family] = price(plan_for(family, "fwd", w), profile).time_s * 1e3
    return out


def schedule_times(torch, q, k, v, fp8_inputs, causal, timing) -> tuple[dict, dict]:
    """The ``wgmma`` kernels at each schedule on the same inputs (the module docstring):
    ``({name: {"ms": ...}}, {unit: (default name, default tile's serial name)})``;
    ``fp8_inputs``: (q8, k8, v8, dq, dk, dv), or None (d = 64: no FP8 kernel)."""
    from kernels import KernelConfig, prepare_forward
    from kernels.wgmma_fwd import forward_fp8
    from sim.plans import plan_for
    from sim.plans.wgmma_fwd import schedule_refusal, wgmma_forward_configs
    from benchmarks.common import attention_problem
    from kernels.host import plan_workload
    problem = attention_problem(q, k, v, causal=causal)
    workload = plan_workload(problem, "fwd")
    times, defaults = {}, {}
    for tile in wgmma_forward_configs(workload):
        bq, bk = tile["block_q"], tile["block_k"]
        for name, (pp, ov) in SCHEDULES.items():
            # one consumer warpgroup: serial only; three: the overlap only (schedule_refusal)
            if (bq == 64 and (pp or ov)) or schedule_refusal(pp, ov, bq):
                continue
            run = prepare_forward(problem, KernelConfig(family="wgmma", block_q=bq, block_k=bk,
                                                        pingpong=pp, overlap=ov))
            times[f"kernel-fp16-{bq}x{bk}-{name}"] = time_or_error(
                torch, lambda run=run: run(q, k, v), timing)
    cfg = plan_for("wgmma", "fwd", workload).config
    tile = f"kernel-fp16-{cfg['block_q']}x{cfg['block_k']}"
    defaults["fp16"] = (f"{tile}-{schedule_name(cfg)}", f"{tile}-serial")
    if fp8_inputs is not None:
        q8, k8, v8, dq, dk, dv = fp8_inputs
        for name, (pp, ov) in SCHEDULES.items():
            times[f"kernel-fp8-{name}"] = time_or_error(torch, lambda pp=pp, ov=ov: forward_fp8(
                q8, k8, v8, dq, dk, dv, causal=causal, pingpong=pp, overlap=ov), timing)
        from kernels.wgmma_fwd import fp8_plan
        b, h, n = (int(x) for x in q8.shape[:3])
        cfg = fp8_plan(b, h, int(k8.shape[1]), n, int(k8.shape[2]), HEAD_DIM, causal).config
        defaults["fp8"] = (f"kernel-fp8-{schedule_name(cfg)}", "kernel-fp8-serial")
    return times, defaults


def speed_case(torch, n, causal, profile, schedules=False, timing="sync",
               head_dim=HEAD_DIM) -> dict:
    import torch.nn.functional as F

    import ioaware
    from ioaware import fp8
    from benchmarks.common import benchmark_inputs
    batch, heads, q, k, v, _ = benchmark_inputs(torch, "fp16", head_dim, n)
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    times = {}
    fp8_inputs = None
    if head_dim == HEAD_DIM:
        (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize(x) for x in (q, k, v))
        fp8_inputs = (q8, k8, v8, dq, dk, dv)
        times["ioaware-fp8"] = time_or_error(torch, lambda: fp8.attention(
            q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv, causal=causal), timing)
    times["ioaware-fp16"] = time_or_error(torch, lambda: ioaware.attention(q, k, v,
                                                                           causal=causal), timing)
    defaults = {}
    if schedules:
        extra, defaults = schedule_times(torch, q, k, v, fp8_inputs, causal, timing)
        times.update(extra)
    for name, backend in (("sdpa-flash", "sdpa-flash"), ("sdpa-cudnn", "sdpa-cudnn")):
        def run(backend=backend):
            with sdpa_context(backend):
                return F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
        times[name] = time_or_error(torch, run, timing)
    flops = attention_flops(batch, heads, n, n, head_dim, causal, "fwd")
    for entry in times.values():
        if "ms" in entry:
            entry["tflops"] = flops / entry["ms"] / 1e9
    rec = {"batch": batch, "heads": heads, "seq_len": n, "head_dim": head_dim, "causal": causal,
           "times_ms": times}
    for key, name in (("flash_over_fp16", "sdpa-flash"), ("cudnn_over_fp16", "sdpa-cudnn")):
        if "ms" in times[name] and "ms" in times["ioaware-fp16"]:
            rec[key] = times[name]["ms"] / times["ioaware-fp16"]["ms"]
    for unit, (default, serial) in defaults.items():
        timed = {k: e["ms"] for k, e in times.items()
                 if k.startswith(f"kernel-{unit}-") and "ms" in e}
        rec[f"{unit}_default"] = default
        if timed:
            rec[f"{unit}_best"] = min(timed, key=timed.get)
        if default in timed and serial in timed:
            rec[f"{unit}_serial_over_default"] = timed[serial] / timed[default]
    if head_dim != HEAD_DIM:
        return rec
    rec["model_ms"] = _model_ms(batch, heads, n, causal, profile)
    fp8_ms = times["ioaware-fp8"].get("ms")
    if fp8_ms:
        for key, name in (("fp16_over_fp8", "ioaware-fp16"), ("flash_over_fp8", "sdpa-flash"),
                          ("cudnn_over_fp8", "sdpa-cudnn")):
            if "ms" in times[name]:
                rec[key] = times[name]["ms"] / fp8_ms
        m = rec["model_ms"]
        rec["model_fp16_over_fp8"] = m["wgmma"] / m["wgmma_fp8"]
    return rec


def error_case(torch, n, seed=0) -> dict:
    """FlashAttention-3's numerical-error experiment at sequence length ``n`` (see the module
    docstring): RMSE of each path against float64."""
    import torch.nn.functional as F

    import ioaware
    from ioaware import fp8
    shape = (1, 16, n, HEAD_DIM)
    q, k, v = (fp8.outlier_inputs(shape, seed=seed + i, device="cuda") for i in range(3))
    scale = 1 / math.sqrt(HEAD_DIM)
    ref = torch.softmax((q.double() @ k.double().transpose(-1, -2)) * scale, -1) @ v.double()
    out = {}
    q16, k16, v16 = (x.half() for x in (q, k, v))
    out["ioaware-fp16"] = fp8.rmse(ioaware.attention(q16, k16, v16), ref)
    with sdpa_context("sdpa-flash"):
        out["sdpa-flash-fp16"] = fp8.rmse(F.scaled_dot_product_attention(q16, k16, v16), ref)
    (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize(x) for x in (q, k, v))
    out["ioaware-fp8"] = fp8.rmse(fp8.attention(q8, k8, v8, descale_q=dq, descale_k=dk,
                                                descale_v=dv), ref)
    qr, kr = fp8.incoherent(q, k, seed=seed)
    (q8, dq), (k8, dk) = fp8.quantize(qr), fp8.quantize(kr)
    out["ioaware-fp8-incoherent"] = fp8.rmse(fp8.attention(q8, k8, v8, descale_q=dq,
                                                           descale_k=dk, descale_v=dv), ref)
    return {"batch": 1, "heads": 16, "seq_len": n, "head_dim": HEAD_DIM, "rmse": out,
            "paper_rmse": PAPER_RMSE}


def case_line(rec: dict) -> str:
    """One printed line of a speed record."""
    cells = "  ".join(f"{k}={e['ms']:.3f}" if "ms" in e else f"{k}=—"
                      for k, e in rec["times_ms"].items())
    line = f"d={rec['head_dim']} N={rec['seq_len']} causal={rec['causal']}: {cells}"
    if "flash_over_fp16" in rec and "cudnn_over_fp16" in rec:
        line += (f"  FLASH/fp16 {rec['flash_over_fp16']:.2f}x  cuDNN/fp16 "
                 f"{rec['cudnn_over_fp16']:.2f}x")
    if "fp16_over_fp8" in rec:
        line += (f"  fp16/fp8 {rec['fp16_over_fp8']:.2f}x (model "
                 f"{rec.get('model_fp16_over_fp8', 0):.2f}x)  FLASH/fp8 "
                 f"{rec.get('flash_over_fp8', 0):.2f}x  cuDNN/fp8 {rec.get('cudnn_over_fp8', 0):.2f}x")
    for unit in ("fp16", "fp8"):
        if f"{unit}_serial_over_default" in rec:
            line += (f"  {unit}: default {rec[f'{unit}_default']} "
                     f"{rec[f'{unit}_serial_over_default']:.3f}x its tile serial, best "
                     f"{rec[f'{unit}_best']}")
    return line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fp8", description=first_sentence(__doc__))
    ap.add_argument("--seq-lens", default="512,1024,2048,4096,8192,16384", type=_sizes)
    ap.add_argument("--causal", default="both", choices=("both", "true", "false"))
    ap.add_argument("--error-seq-len", default=2048, type=int)
    ap.add_argument("--schedules", action="store_true",
                    help="also time the wgmma kernels at every tile and schedule (SCHEDULES)")
    ap.add_argument("--head-dims", default=str(HEAD_DIM), type=_sizes,
                    help="head dims of the speed rows (64: the 16-bit rows only)")
    ap.add_argument("--timing", default="sync", choices=("sync", "device"),
                    help="sync: events around synchronous calls, host time included (default); "
                         "device: GPU time only, behind a device-side sleep")
    ap.add_argument("--rates", default=None,
                    help="rates file (python -m benchmarks rates) to price the plans with")
    ap.add_argument("--out", default=None, help="JSON file to write")
    args = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("python -m benchmarks fp8: needs a CUDA GPU", file=sys.stderr)
        return 2
    from sim.profiles import profile_for_gpu_name
    gpu_name = torch.cuda.get_device_name()
    profile = profile_for_gpu_name(gpu_name)
    if args.rates:
        profile = profile.with_rates(args.rates)
    causals = {"both": (False, True), "true": (True,), "false": (False,)}[args.causal]
    bad = [d for d in args.head_dims if d not in (64, HEAD_DIM)]
    if bad:
        print(f"python -m benchmarks fp8: --head-dims takes 64 and {HEAD_DIM}, got {bad}",
              file=sys.stderr)
        return 2
    records = []
    doc = {"schema": "ioaware.fp8/1",
           "provenance": provenance(command_line("fp8", argv if argv is not None
                                                 else sys.argv[1:]),
                                    extra={"profile": profile.name}),
           "speed": records, "error": None}
    for head_dim in args.head_dims:
        for causal in causals:
            for n in args.seq_lens:
                rec = speed_case(torch, n, causal, profile, args.schedules, args.timing,
                                 head_dim)
                records.append(rec)
                print(case_line(rec), flush=True)
                if args.out:        # kept as it grows: a run cut short keeps its rows
                    write_json(dict(doc, speed=records), args.out)
    err = error_case(torch, args.error_seq_len)
    print("RMSE against float64 (inputs with outliers): " + "  ".join(
        f"{k}={v:.2e}" for k, v in err["rmse"].items())
        + "   paper: " + "  ".join(f"{k}={v:.1e}" for k, v in PAPER_RMSE.items()), flush=True)
    doc["error"] = err
    if args.out:
        write_json(doc, args.out)
        print(f"wrote {args.out}")
    return 0
