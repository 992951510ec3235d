"""Benchmark: the Numba fused attention kernel against PyTorch SDPA's backends, on one GPU.

    python -m kernels.bench                      # the full sweep of issue 4 + seed experiment
    python -m kernels.bench --quick              # N in {1024, 4096}, d=64, no seed experiment

For every (N, d, causal, dtype, pass) it times our kernel (``ioaware-numba``) and SDPA's FLASH,
EFFICIENT, CUDNN and MATH backends in the same process: median of CUDA-event times after
warm-up (``--timing sync``, the default: each call synchronous, its host code inside the timed
span; ``--timing device``: a device-side sleep first, so only the GPU's time counts; our
kernel's records also carry ``host_ms``, the host time of one call), TFLOP/s (4*B*H*Nq*Nk*d per forward, halved when causal; fwd+bwd counts 3.5x),
peak extra device memory over the inputs (torch allocator), and our kernel's speed ratio
``t_backend / t_ours`` (> 1: ours is faster). Shapes keep B*N = 16384 tokens and H*d = 2048.
A backend that refuses a configuration (FLASH on float32) or runs out of memory is listed
under "skipped". The seed experiment times a small transformer encoder layer (d_model 512, 8 heads,
fwd+bwd) whose attention is ``ioaware.attention(backend="numba")``, SDPA MATH or SDPA FLASH.

Writes ``results/bench_<gpu>_<date>.json`` (schema ``ioaware.results/1`` with provenance) and
prints the table.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
SDPA_KERNELS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                "sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-math": "MATH"}


def provenance_versions(torch):
    import numba
    try:
        from importlib.metadata import version
        numba_cuda = version("numba-cuda")
    except Exception:
        numba_cuda = "unknown"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except Exception:
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "cuda": str(torch.version.cuda),
            "torch": torch.__version__, "numba": numba.__version__, "numba_cuda": numba_cuda,
            "numpy": np.__version__, "python": platform.python_version(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m kernels.bench " + " ".join(sys.argv[1:]),
            "kernel_versions": _kernel_versions()}


def _kernel_versions():
    """The float32 kernel versions this run uses (kernels.launch FWD_VERSION / BWD_VERSION,
    set by KERNELS_FWD_VERSION / KERNELS_BWD_VERSION)."""
    from kernels import launch
    return {"fwd": launch.FWD_VERSION, "bwd": launch.BWD_VERSION}


#: Timing methods. "sync": CUDA events around one synchronous call, so the call's host code
#: (argument checks, array wrapping, the launch) is inside the timed span whenever the GPU waits
#: for it — what a caller that synchronises sees. "device": a device-side sleep is enqueued
#: first, so the host has enqueued the call before the GPU reaches the first event — the GPU's
#: own time, as `kernels.measure` takes it.
TIMINGS = ("sync", "device")
#: GPU clock cycles of the device-side sleep in "device" timing (~2 ms at 2 GHz; longer than
#: the host code of one call).
SLEEP_CYCLES = 4_000_000


def event_ms(torch, fn, sleep_cycles=0):
    """Milliseconds of one call of ``fn``, between two CUDA events; with ``sleep_cycles`` the
    stream first sleeps that many GPU cycles (outside the events) while the host enqueues."""
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    if sleep_cycles:
        torch.cuda._sleep(int(sleep_cycles))
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def time_cuda(torch, fn, warmup=3, min_reps=5, max_reps=30, budget_s=0.4, timing="sync"):
    """(median, p10, p90) milliseconds of ``fn`` by CUDA events, after warm-up; ``timing`` is
    one of `TIMINGS`."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    sleep = SLEEP_CYCLES if timing == "device" else 0
    if event_ms(torch, fn, sleep) > 50.0:       # slow configuration: fewer repetitions
        warmup, min_reps = 0, 3
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    total = 0.0
    while len(times) < max_reps and (len(times) < min_reps or total < budget_s * 1e3):
        times.append(event_ms(torch, fn, sleep))
        total += times[-1]
    t = np.array(times)
    return float(np.median(t)), float(np.percentile(t, 10)), float(np.percentile(t, 90))


def host_call_ms(torch, fn, reps=10):
    """Median milliseconds the host spends in one call of ``fn`` (its Python code and launches,
    not the GPU's work): each call is made while the GPU sleeps, so it returns once enqueued."""
    import time
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return float(np.median(times))


def peak_extra_bytes(torch, fn):
    """Peak device memory allocated during ``fn`` above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def attention_flops(b, h, nq, nk, d, causal, pas):
    f = 4.0 * b * h * nq * nk * d * (0.5 if causal else 1.0)
    return f * (3.5 if pas == "fwd+bwd" else 1.0)


def _make_runner(torch, kernel, q, k, v, do, causal, pas):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    scale = q.shape[-1] ** -0.5
    if kernel == "ioaware-numba":
        import kernels

        def run():
            out, lse = kernels.forward(q, k, v, scale=scale, causal=causal)
            if pas == "fwd+bwd":
                kernels.backward(q, k, v, out, lse, do, scale=scale, causal=causal)
        return run
    backend = getattr(SDPBackend, SDPA_KERNELS[kernel])
    qg, kg, vg = (x.detach().requires_grad_(pas == "fwd+bwd") for x in (q, k, v))

    def run():
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            if pas == "fwd+bwd":
                out.backward(do)
                qg.grad = kg.grad = vg.grad = None
    return run


def bench_attention(torch, ns, ds, dtypes, causals, passes, kernel_names, progress=print,
                    checkpoint=None, timing="sync"):
    """Time each kernel on each configuration (see the module docstring); ``timing`` is one of
    `TIMINGS`. Our kernel's records also carry ``host_ms``, the host time of one call
    (`host_call_ms`). Returns (records, skipped)."""
    records, skipped = [], []
    dev = "cuda"
    free_bytes = torch.cuda.mem_get_info()[0]
    configs = [(n, d, dt, c, p) for d in ds for dt in dtypes for c in causals for p in passes
               for n in ns]
    for ci, (n, d, dt, causal, pas) in enumerate(configs):
        b = max(1, 16384 // n)
        h = max(1, 2048 // d)
        tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        g = torch.Generator(device=dev).manual_seed(n + d)
        q, k, v, do = (torch.randn(b, h, n, d, device=dev, dtype=tdt, generator=g) for _ in range(4))
        for kern in kernel_names:
            base = {"kernel": kern, "schedule": "flash2" if kern != "sdpa-math" else "naive",
                    "pass": pas, "dtype": dt, "batch": b, "heads": h, "heads_kv": h,
                    "seq_len_q": n, "seq_len_k": n, "head_dim": d, "causal": causal}
            if kern == "sdpa-math":
                # the materialised scores and probabilities (plus their grads) in the input dtype
                est = b * h * n * n * q.element_size() * (6 if pas == "fwd+bwd" else 3)
                if est > 0.6 * free_bytes:
                    skipped.append(dict(base, reason=f"needs ~{est / 2**30:.0f} GiB"))
                    continue
            try:
                run = _make_runner(torch, kern, q, k, v, do, causal, pas)
                run()
                torch.cuda.synchronize()
                peak = peak_extra_bytes(torch, run)
                med, p10, p90 = time_cuda(torch, run, timing=timing)
                host = host_call_ms(torch, run) if kern == "ioaware-numba" else None
            except Exception as exc:  # a backend refusing this configuration, or OOM
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                skipped.append(dict(base, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"))
                continue
            fl = attention_flops(b, h, n, n, d, causal, pas)
            records.append(dict(base, block_q=None, block_k=None, time_ms=med, time_ms_p10=p10,
                                time_ms_p90=p90, peak_extra_bytes=peak, dram_read_bytes=None,
                                dram_write_bytes=None, l2_bytes=None, global_load_bytes=None,
                                global_store_bytes=None, flops_executed=None,
                                tflops=fl / (med * 1e-3) / 1e12, timing=timing,
                                **({"host_ms": host} if host is not None else {})))
        progress(f"[{ci + 1}/{len(configs)}] N={n} d={d} {dt} causal={causal} {pas}")
        if checkpoint is not None:
            checkpoint(records, skipped)
        del q, k, v, do
        torch.cuda.empty_cache()
    return records, skipped


def seed_experiment(torch, seq_lens, dtypes=("fp16",), progress=print):
    """A pre-norm transformer encoder layer (d_model 512, 8 heads, MLP 2048), fwd+bwd, with
    its attention from ioaware (numba kernels), SDPA MATH or SDPA FLASH."""
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from ioaware.attention import attention as io_attention

    d_model, n_heads = 512, 8

    class Layer(nn.Module):
        def __init__(self, attn):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                     nn.Linear(4 * d_model, d_model))
            self.attn = attn

        def forward(self, x):
            B, N, _ = x.shape
            qkv = self.qkv(self.ln1(x)).view(B, N, 3, n_heads, d_model // n_heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            a = self.attn(q, k, v).transpose(1, 2).reshape(B, N, d_model)
            x = x + self.proj(a)
            return x + self.mlp(self.ln2(x))

    def ours(q, k, v):
        return io_attention(q, k, v, backend="numba")

    def sdpa(backend):
        def f(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v)
        return f

    variants = {"ioaware-numba": ours, "sdpa-math": sdpa(SDPBackend.MATH),
                "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION)}
    rows = []
    for dt in dtypes:
        tdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dt]
        for n in seq_lens:
            b = max(1, 8192 // n)
            for name, fn in variants.items():
                torch.manual_seed(0)
                layer = Layer(fn).to("cuda", tdt)
                x = torch.randn(b, n, d_model, device="cuda", dtype=tdt, requires_grad=True)

                def step():
                    layer(x).float().square().mean().backward()
                try:
                    step()
                    peak = peak_extra_bytes(torch, step)
                    med, p10, p90 = time_cuda(torch, step)
                    rows.append({"variant": name, "dtype": dt, "batch": b, "seq_len": n,
                                 "d_model": d_model, "heads": n_heads, "pass": "fwd+bwd",
                                 "time_ms": med, "time_ms_p10": p10, "time_ms_p90": p90,
                                 "peak_extra_bytes": peak})
                except Exception as exc:
                    rows.append({"variant": name, "dtype": dt, "batch": b, "seq_len": n,
                                 "skipped": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"})
                del layer, x
                torch.cuda.empty_cache()
            progress(f"seed experiment {dt} N={n}")
    return rows


def format_table(records):
    """Our kernel vs each backend per configuration: times, TFLOP/s, memory, ratios."""
    by = {}
    for r in records:
        key = (r["pass"], r["dtype"], r["head_dim"], r["causal"], r["seq_len_q"])
        by.setdefault(key, {})[r["kernel"]] = r
    names = ["ioaware-numba", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "sdpa-math"]
    head = (f"{'pass':8} {'dtype':5} {'d':>4} {'causal':6} {'N':>6} | "
            + " ".join(f"{n.replace('sdpa-', ''):>9}" for n in names)
            + " | ours TF/s | x_eff  x_flash x_cudnn x_math | MiB ours/math"
            + (" | host ms" if any("host_ms" in r for r in records) else ""))
    lines = [head, "-" * len(head)]
    for key in sorted(by):
        row = by[key]
        ours = row.get("ioaware-numba")
        times = " ".join(f"{row[n]['time_ms']:9.3f}" if n in row else f"{'-':>9}" for n in names)
        ratios = " ".join(f"{row[n]['time_ms'] / ours['time_ms']:6.2f}" if (ours and n in row) else f"{'-':>6}"
                          for n in names[1:])
        tf = f"{ours['tflops']:9.2f}" if ours else f"{'-':>9}"
        mem = (f"{ours['peak_extra_bytes'] / 2**20:.1f}/" if ours else "-/") + (
            f"{row['sdpa-math']['peak_extra_bytes'] / 2**20:.0f}" if "sdpa-math" in row else "-")
        host = (f" | {ours['host_ms']:7.3f}" if ours and "host_ms" in ours
                else (" |       -" if "host ms" in head else ""))
        lines.append(f"{key[0]:8} {key[1]:5} {key[2]:4d} {str(key[3]):6} {key[4]:6d} | {times} | {tf} | {ratios} | {mem}{host}")
    timings = sorted({r["timing"] for r in records if "timing" in r})
    lines.append("times in ms (median); x_<backend> = t_backend / t_ours (> 1: ours faster)"
                 + (f"; timing: {', '.join(timings)}" if timings else "")
                 + (" (host ms: host time of one call of ours)" if "host ms" in head else ""))
    return "\n".join(lines)


def format_seed(rows):
    lines = [f"{'variant':14} {'dtype':5} {'N':>5} {'B':>3} {'ms':>9} {'peak MiB':>9}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['variant']:14} {r['dtype']:5} {r['seq_len']:5d} {r['batch']:3d}  skipped: {r['skipped']}")
        else:
            lines.append(f"{r['variant']:14} {r['dtype']:5} {r['seq_len']:5d} {r['batch']:3d} "
                         f"{r['time_ms']:9.3f} {r['peak_extra_bytes'] / 2**20:9.1f}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--causal", nargs="+", default=["false", "true"], choices=["false", "true"])
    ap.add_argument("--pass", dest="passes", nargs="+", default=["fwd", "fwd+bwd"],
                    choices=["fwd", "fwd+bwd"])
    ap.add_argument("--kernels", nargs="+", default=["ioaware-numba"] + list(SDPA_KERNELS))
    ap.add_argument("--seed-lens", type=int, nargs="*", default=[128, 256, 512, 1024, 2048, 4096])
    ap.add_argument("--quick", action="store_true", help="N in {1024, 4096}, d=64, no seed experiment")
    ap.add_argument("--out", default=None,
                    help="results file (default results/bench_<gpu>_<date>[_<tag>].json)")
    ap.add_argument("--tag", default=None, help="suffix of the default results file name")
    ap.add_argument("--timing", choices=TIMINGS, default="sync",
                    help="sync: events around each synchronous call, host code included (default); "
                         "device: a device-side sleep first, so only the GPU's time is timed")
    ap.add_argument("--show", metavar="RESULTS_JSON", default=None,
                    help="print the table of an existing results file (no GPU needed) and exit")
    args = ap.parse_args(argv)
    if args.show:
        doc = json.loads(Path(args.show).read_text())
        p = doc["provenance"]
        print(f"# {p['gpu']}  driver {p['driver']}  CUDA {p['cuda']}  torch {p['torch']}  "
              f"numba {p['numba']}  numba-cuda {p['numba_cuda']}  {p['date']}  ({p['command']})"
              + (f"  kernel versions {p['kernel_versions']}" if "kernel_versions" in p else ""))
        keep = [r for r in doc["records"] if r["seq_len_q"] in args.n and r["head_dim"] in args.d
                and r["dtype"] in args.dtype and r["pass"] in args.passes
                and str(r["causal"]).lower() in args.causal]
        print(format_table(keep))
        if doc.get("seed_experiment"):
            print("\n# seed experiment: transformer encoder layer fwd+bwd")
            print(format_seed([r for r in doc["seed_experiment"] if r["seq_len"] in (args.seed_lens or [])]))
        return doc
    if args.quick:
        args.n, args.d, args.seed_lens = [1024, 4096], [64], []

    import torch
    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    prov = dict(provenance_versions(torch), timing=args.timing)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    out = Path(args.out) if args.out else RESULTS_DIR / (
        "bench_" + re.sub(r"[^A-Za-z0-9]+", "-", prov["gpu"]).strip("-").lower()
        + "_" + prov["date"][:10] + (f"_{args.tag}" if args.tag else "") + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"schema": "ioaware.results/1", "provenance": prov, "records": [], "skipped": [],
           "seed_experiment": [], "complete": False}

    def save(records=None, skipped=None):   # after every configuration: a cut-off run keeps data
        if records is not None:
            doc["records"], doc["skipped"] = records, skipped
        out.write_text(json.dumps(doc, indent=1))
    records, skipped = bench_attention(torch, args.n, args.d, args.dtype,
                                       [c == "true" for c in args.causal], args.passes,
                                       args.kernels, progress=log, checkpoint=save,
                                       timing=args.timing)
    seed_rows = seed_experiment(torch, args.seed_lens, progress=log) if args.seed_lens else []
    doc["seed_experiment"], doc["complete"] = seed_rows, True
    save(records, skipped)
    print(f"# {prov['gpu']}  driver {prov['driver']}  CUDA {prov['cuda']}  torch {prov['torch']}  "
          f"numba {prov['numba']}  numba-cuda {prov['numba_cuda']}  {prov['date']}")
    print(format_table(records))
    if seed_rows:
        print("\n# seed experiment: transformer encoder layer fwd+bwd")
        print(format_seed(seed_rows))
    print(f"\nwrote {out}")
    return doc


if __name__ == "__main__":
    main()
