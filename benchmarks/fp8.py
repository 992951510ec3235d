"""Command ``fp8``: FlashAttention-3's FP8 forward against the 16-bit forwards, in one run, and its error.

    python -m benchmarks fp8 [--seq-lens 512,1024,2048,4096,8192,16384] [--causal both]
                             [--error-seq-len 2048] [--pingpong both] [--timing device]
                             [--out FILE.json]

Speed, d = 128, the benchmark's shapes (`benchmarks.common.benchmark_inputs`: B * N = 16384
tokens, H = 16), causal and not; CUDA-event medians (`benchmarks.common.time_cuda`) of

* ``ioaware-fp8``: ``ioaware.fp8.attention`` on e4m3 Q, K, V with per-(batch, head) descales
  (the public path: checks, V's transpose, the kernel `kernels.wgmma_fwd.forward_fp8`);
* ``ioaware-fp16``: ``ioaware.attention`` on float16 (the ``wgmma`` forward);
* ``sdpa-flash`` / ``sdpa-cudnn``: PyTorch SDPA on bfloat16, restricted to that backend;

and with ``--pingpong both`` what the ``wgmma`` kernels' ping-pong (the two consumer warpgroups
taking turns issuing S = Q K^T) buys, both variants of each kernel on the same inputs
(`kernels.prepare_forward` with ``KernelConfig(family="wgmma", pingpong=...)`` and
`kernels.wgmma_fwd.forward_fp8` with ``pingpong=...``, past ``ioaware``'s checks):
``kernel-fp16-pingpong`` / ``kernel-fp16-no-pingpong``, ``kernel-fp8-pingpong`` /
``kernel-fp8-no-pingpong``, and their ratios ``pingpong_gain_fp16`` and ``pingpong_gain_fp8``
(t_without / t_with: above 1, ping-pong is faster);
with TFLOP/s (4 B H N^2 d, halved when causal), the ratios ``fp16_over_fp8`` (t_ioaware-fp16 /
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


def pingpong_times(torch, q, k, v, q8, k8, v8, descales, causal, timing) -> dict:
    """The ping-pong variants of the 16-bit and FP8 ``wgmma`` kernels on the same inputs (the
    module docstring), as ``{name: {"ms": ...}}``."""
    from kernels import KernelConfig, prepare_forward
    from kernels.wgmma_fwd import forward_fp8
    from benchmarks.common import attention_problem
    problem = attention_problem(q, k, v, causal=causal)
    dq, dk, dv = descales
    times = {}
    for on in (True, False):
        tag = "pingpong" if on else "no-pingpong"
        run = prepare_forward(problem, KernelConfig(family="wgmma", block_q=128, pingpong=on))
        times[f"kernel-fp16-{tag}"] = time_or_error(torch, lambda run=run: run(q, k, v), timing)
        times[f"kernel-fp8-{tag}"] = time_or_error(torch, lambda on=on: forward_fp8(
            q8, k8, v8, dq, dk, dv, causal=causal, pingpong=on), timing)
    return times


def speed_case(torch, n, causal, profile, pingpong=False, timing="sync") -> dict:
    import torch.nn.functional as F

    import ioaware
    from ioaware import fp8
    from benchmarks.common import benchmark_inputs
    batch, heads, q, k, v, _ = benchmark_inputs(torch, "fp16", HEAD_DIM, n)
    (q8, dq), (k8, dk), (v8, dv) = (fp8.quantize(x) for x in (q, k, v))
    qb, kb, vb = (x.to(torch.bfloat16) for x in (q, k, v))
    times = {
        "ioaware-fp8": time_or_error(torch, lambda: fp8.attention(
            q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv, causal=causal), timing),
        "ioaware-fp16": time_or_error(torch, lambda: ioaware.attention(q, k, v, causal=causal),
                                      timing),
    }
    if pingpong:
        times.update(pingpong_times(torch, q, k, v, q8, k8, v8, (dq, dk, dv), causal, timing))
    for name, backend in (("sdpa-flash", "sdpa-flash"), ("sdpa-cudnn", "sdpa-cudnn")):
        def run(backend=backend):
            with sdpa_context(backend):
                return F.scaled_dot_product_attention(qb, kb, vb, is_causal=causal)
        times[name] = time_or_error(torch, run, timing)
    flops = attention_flops(batch, heads, n, n, HEAD_DIM, causal, "fwd")
    for entry in times.values():
        if "ms" in entry:
            entry["tflops"] = flops / entry["ms"] / 1e9
    rec = {"batch": batch, "heads": heads, "seq_len": n, "head_dim": HEAD_DIM, "causal": causal,
           "times_ms": times, "model_ms": _model_ms(batch, heads, n, causal, profile)}
    fp8_ms = times["ioaware-fp8"].get("ms")
    if fp8_ms:
        for key, name in (("fp16_over_fp8", "ioaware-fp16"), ("flash_over_fp8", "sdpa-flash"),
                          ("cudnn_over_fp8", "sdpa-cudnn")):
            if "ms" in times[name]:
                rec[key] = times[name]["ms"] / fp8_ms
        m = rec["model_ms"]
        rec["model_fp16_over_fp8"] = m["wgmma"] / m["wgmma_fp8"]
    for unit in ("fp16", "fp8") if pingpong else ():
        on, off = times[f"kernel-{unit}-pingpong"], times[f"kernel-{unit}-no-pingpong"]
        if "ms" in on and "ms" in off:
            rec[f"pingpong_gain_{unit}"] = off["ms"] / on["ms"]
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks fp8", description=first_sentence(__doc__))
    ap.add_argument("--seq-lens", default="512,1024,2048,4096,8192,16384", type=_sizes)
    ap.add_argument("--causal", default="both", choices=("both", "true", "false"))
    ap.add_argument("--error-seq-len", default=2048, type=int)
    ap.add_argument("--pingpong", default="default", choices=("default", "both"),
                    help="both: also time the wgmma kernels with and without ping-pong")
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
    records = []
    for causal in causals:
        for n in args.seq_lens:
            rec = speed_case(torch, n, causal, profile, args.pingpong == "both", args.timing)
            records.append(rec)
            cells = "  ".join(f"{k}={e['ms']:.3f}" if "ms" in e else f"{k}=—"
                              for k, e in rec["times_ms"].items())
            print(f"N={n} causal={causal}: {cells}  fp16/fp8 {rec.get('fp16_over_fp8', 0):.2f}x "
                  f"(model {rec.get('model_fp16_over_fp8', 0):.2f}x)  FLASH/fp8 "
                  f"{rec.get('flash_over_fp8', 0):.2f}x  cuDNN/fp8 "
                  f"{rec.get('cudnn_over_fp8', 0):.2f}x" + "".join(
                      f"  ping-pong {u} {rec[f'pingpong_gain_{u}']:.3f}x"
                      for u in ("fp16", "fp8") if f"pingpong_gain_{u}" in rec), flush=True)
    err = error_case(torch, args.error_seq_len)
    print("RMSE against float64 (inputs with outliers): " + "  ".join(
        f"{k}={v:.2e}" for k, v in err["rmse"].items())
        + "   paper: " + "  ".join(f"{k}={v:.1e}" for k, v in PAPER_RMSE.items()), flush=True)
    doc = {"schema": "ioaware.fp8/1",
           "provenance": provenance(command_line("fp8", argv if argv is not None
                                                 else sys.argv[1:]),
                                    extra={"profile": profile.name}),
           "speed": records, "error": err}
    if args.out:
        write_json(doc, args.out)
        print(f"wrote {args.out}")
    return 0
