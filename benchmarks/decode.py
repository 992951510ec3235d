"""Command ``decode``: decoding with a KV cache against PyTorch SDPA, and sliding-window attention.

    python -m benchmarks decode [--batch 1,8,64] [--seq-len-k 4k,32k,128k] [--dtypes bf16,fp16]
                                [--head-dims 128]
                                [--splits] [--window] [--graph] [--ncu] [--rates RATES.json]
                                [--unit mma|ffma] [--warps 4|8] [--out FILE.json]
    python -m benchmarks decode --report FILE.json [--rates RATES.json]      (no GPU)

Decode cases (Hq=32, Hkv=8, d=128 or the ``--head-dims``, one query per sequence, every cache
length Nk): in one run,
CUDA-event medians (`benchmarks.common.time_cuda`) of

* ``ioaware``: ``ioaware.attention(q, k, v, backend="numba")`` under ``torch.inference_mode``
  (the public path: checks, the split-KV kernel `kernels.decode_fwd` with its merge and cast);
* ``sdpa-flash`` / ``sdpa-efficient`` / ``sdpa-cudnn`` / ``sdpa-math``:
  ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` restricted to that
  backend (a backend that refuses the case, or runs out of memory, is recorded with its error;
  MATH runs only where its expanded K/V fit);

with the achieved DRAM bandwidth of each (K and V bytes / time), our GPU time alone
(``ioaware_device_ms``: the host enqueues while the GPU sleeps, `benchmarks.common.time_cuda`
``timing="device"``) as a fraction of the GPU's
bandwidth measured in the same run (``peak_copy``: a 2 GiB device-to-device copy, read + write
bytes / time), and the model's prediction for our plan (`sim.decode.split_kv_costs` on the
GPU's profile: time, DRAM bytes, the splits it chooses; ``plan``: the plan that ran, its kernel
``unit`` "mma" or "ffma" among its fields). ``--splits`` also times the split-KV
kernel alone at every split count 1, 2, 4, ... 64 (``KernelConfig(num_splits=...)``; GPU time
alone, ``timing="device"``: the split count does not change the host's work) and reports the
model's choice against the measured best. ``--graph`` also times each contender
(ours, SDPA FLASH / EFFICIENT / cuDNN) captured in a CUDA graph and replayed
(``graph_ms``, ``graph_ratio_vs_fastest_sdpa``): a call with no host work, as a decoding loop
captured with ``torch.cuda.graph`` (or ``torch.compile(mode="reduce-overhead")``) runs it; the
contenders' replays are timed in turn, round after round (`benchmarks.common.time_interleaved`),
so a drift of the GPU's state over the run reaches them alike, each replay device-timed (the
graph's launch from the host, which a loop of replays hides, is not in the span). ``--window`` adds sliding-window cases
(B=1, H=16, d=128, N=32k, window (4096, 0), causal, fp16/bf16): ours with the window, ours full
causal, and SDPA with the equivalent boolean band mask and with ``is_causal=True``. ``--ncu``
profiles our decode kernels once per case under Nsight Compute (``dram__bytes_read.sum``,
``dram__bytes_write.sum``, L2 flushed before each kernel) and records the measured DRAM bytes
beside the model's. ``--rates`` prices the model at the GPU's measured rates (a file of
``python -m benchmarks rates``; without it, the datasheet's). ``--unit mma|ffma`` pins our
kernel (the tensor-core or the CUDA-core split-KV kernel, ``KernelConfig.decode_unit``), and
``--warps 4|8`` the tensor-core kernel's warps a program (``KernelConfig.decode_warps``); either
times it through `kernels.decode_fwd.prepare` (the same launches without `ioaware.attention`'s
key lookup: compare the units by GPU time alone or graph replays). Writes a JSON file with
provenance.

``--report FILE`` re-prices every decode record (and every window record: `window_report`, the
windowed and the full-causal forward) of a results file with today's plan
(`sim.decode.split_kv_plan` of the kernel each record ran, its ``plan.unit``; records that name
none ran the CUDA-core kernel; `sim.decode.split_kv_costs` on the file's GPU profile, at the rates
of ``--rates``) and prints, per record and in all, the model against #17's targets: DRAM bytes
against Nsight Compute's (within 5 %), time against our GPU time alone (``ioaware_device_ms``;
within 15 %), and the split count it picks against the best of the ``--splits`` sweep (within
5 %; where today's pick is the one the file timed). Nothing is fitted on the file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from .common import (SDPA_BACKENDS, command_line, error_text, first_sentence, provenance,
                     sdpa_context, time_cuda, time_interleaved, time_or_error, torch_dtype,
                     write_json)

HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def _tokens(text: str) -> list[int]:
    from sim.cli import token_count
    return [token_count(t) for t in text.split(",")]


def decode_inputs(torch, batch, seq_len_k, dtype, seed=0, head_dim=HEAD_DIM):
    g = torch.Generator(device="cuda").manual_seed(seed + batch + seq_len_k)
    dt = torch_dtype(torch, dtype)
    q = torch.randn(batch, HEADS_Q, 1, head_dim, device="cuda", dtype=dt, generator=g)
    k = torch.randn(batch, HEADS_KV, seq_len_k, head_dim, device="cuda", dtype=dt, generator=g)
    v = torch.randn(batch, HEADS_KV, seq_len_k, head_dim, device="cuda", dtype=dt, generator=g)
    return q, k, v


def peak_copy_bandwidth(torch, gib=2) -> float:
    """Device-to-device copy bandwidth, bytes/s (read + write bytes over the median time)."""
    n = gib * 2**30 // 4
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_cuda(torch, lambda: dst.copy_(src), warmup=3, min_reps=10, max_reps=20)[0]
    src = dst = None        # freed before empty_cache (the timed lambda shares these cells)
    torch.cuda.empty_cache()
    return 2 * n * 4 / (ms * 1e-3)


def _sdpa(torch, q, k, v, backend, **kw):
    import torch.nn.functional as F
    with sdpa_context(backend):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)


def _captured_or_error(torch, fn):
    """A CUDA graph that captured one call of ``fn`` (under inference mode, after a warm-up
    call), replayed once; or ``{"error": ...}`` where the call cannot be captured."""
    try:
        with torch.inference_mode():
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            graph.replay()
            torch.cuda.synchronize()
            return graph
    except Exception as exc:  # noqa: BLE001 - a backend that cannot be captured is a result
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return {"error": error_text(exc)}


def _graph_times(torch, fns: dict) -> dict:
    """``{name: {"ms": ...} or {"error": ...}}``: each of ``fns`` (name -> call) captured in a
    CUDA graph and replayed, the replays of all timed in rounds (`time_interleaved`), so that
    ours and SDPA's see the same GPU state: the calls' GPU time with no host work, as a
    captured decoding loop runs them (each replay device-timed behind a sleep: the graph's
    launch from the host, which a loop of replays hides behind the previous step, is not in the
    span)."""
    graphs = {name: _captured_or_error(torch, fn) for name, fn in fns.items()}
    ready = {name: g.replay for name, g in graphs.items() if not isinstance(g, dict)}
    times = time_interleaved(torch, ready, timing="device")
    return {name: ({"ms": times[name][0]} if name in times else graphs[name]) for name in fns}


def ours_call(q, k, v, unit=None, warps=None):
    """Our decoding call on these operands: ``ioaware.attention(q, k, v, backend="numba")``, or
    with ``unit`` ("mma" or "ffma") and/or ``warps`` (the tensor-core kernel's, 4 or 8) the
    split-KV forward pinned to that kernel (`kernels.decode_fwd.prepare` with
    ``KernelConfig(decode_unit=unit, decode_warps=warps)``: the same launches, without
    `ioaware.attention`'s key lookup)."""
    if unit is None and warps is None:
        from ioaware import attention
        return lambda: attention(q, k, v, backend="numba")
    import kernels
    from ioaware._inputs import check_inputs
    run = kernels.decode_fwd.prepare(check_inputs(q, k, v), _config(unit, warps=warps))
    return lambda: run(q, k, v)


def _config(unit=None, splits=None, warps=None):
    import kernels
    return kernels.KernelConfig(family="split_kv", num_splits=splits, decode_unit=unit,
                                decode_warps=warps)


def decode_case(torch, gpu, batch, seq_len_k, dtype, peak, splits_sweep=False,
                graphs=False, unit=None, warps=None, head_dim=HEAD_DIM) -> dict:
    import kernels
    from ioaware._inputs import check_inputs
    from sim.decode import split_kv_costs
    q, k, v = decode_inputs(torch, batch, seq_len_k, dtype, head_dim=head_dim)
    kv_bytes = 2 * k.numel() * k.element_size()
    rec = {"batch": batch, "heads_q": HEADS_Q, "heads_kv": HEADS_KV, "head_dim": head_dim,
           "seq_len_q": 1, "seq_len_k": seq_len_k, "dtype": dtype, "kv_bytes": kv_bytes,
           "times_ms": {}}
    call = ours_call(q, k, v, unit, warps)
    rec["ours_call"] = ("ioaware.attention" if unit is None and warps is None
                        else "kernels.decode_fwd.prepare")
    rec["times_ms"]["ioaware"] = time_or_error(torch, call)
    with torch.inference_mode():     # the GPU's time alone: the host enqueues behind a sleep
        rec["ioaware_device_ms"] = time_cuda(torch, call, timing="device")[0]
    for name in SDPA_BACKENDS:
        if name == "sdpa-math" and 4 * kv_bytes > 16 * 2**30:
            rec["times_ms"][name] = {"error": "skipped: expanded K/V would not fit"}
            continue
        rec["times_ms"][name] = time_or_error(torch, lambda n=name: _sdpa(torch, q, k, v, n))
    for entry in rec["times_ms"].values():
        if "ms" in entry:
            entry["kv_bandwidth_fraction"] = kv_bytes / (entry["ms"] * 1e-3) / peak
    pb = check_inputs(q, k, v)
    plan = kernels.decode_fwd.plan(pb, _config(unit, warps=warps))
    model = split_kv_costs(plan, gpu)
    rec["plan"] = plan.as_dict()         # the kernel that ran: its unit, stages, grid, ...
    rec["model"] = {k_: model[k_] for k_ in ("splits", "time_s", "dram_read_bytes",
                                             "dram_write_bytes", "wave_efficiency")}
    ours = rec["times_ms"]["ioaware"].get("ms")
    if ours:
        rec["model"]["time_rel_error"] = model["time_s"] / (ours * 1e-3) - 1
    sdpa = [e["ms"] for n, e in rec["times_ms"].items() if n != "ioaware" and "ms" in e]
    if ours and sdpa:
        rec["ratio_vs_fastest_sdpa"] = min(sdpa) / ours
    if graphs:
        contenders = {"ioaware": call}
        contenders.update({name: (lambda n=name: _sdpa(torch, q, k, v, n))
                           for name in SDPA_BACKENDS if name != "sdpa-math"})
        g = rec["graph_ms"] = _graph_times(torch, contenders)
        for entry in g.values():
            if "ms" in entry:
                entry["kv_bandwidth_fraction"] = kv_bytes / (entry["ms"] * 1e-3) / peak
        ours_g = g["ioaware"].get("ms")
        sdpa_g = [e["ms"] for n, e in g.items() if n != "ioaware" and "ms" in e]
        if ours_g and sdpa_g:
            rec["graph_ratio_vs_fastest_sdpa"] = min(sdpa_g) / ours_g
    if splits_sweep:
        sweep = {}
        for s in (1, 2, 4, 8, 16, 32, 64):
            sweep[s] = kernels_time(torch, kernels, pb, s, unit, warps)
        rec["splits_ms"] = sweep
        done = {s: t for s, t in sweep.items() if t}
        if done:
            best = min(done, key=done.get)
            picked = sweep.get(plan.splits) or kernels_time(torch, kernels, pb, plan.splits, unit,
                                                            warps)
            rec["splits_best"] = best
            rec["splits_model_loss"] = picked / done[best] - 1 if picked else None
    q = k = v = None        # freed before empty_cache (the timed lambdas share these cells)
    torch.cuda.empty_cache()
    return rec


def kernels_time(torch, kernels, pb, splits, unit=None, warps=None):
    """GPU time alone (ms, device timing) of the split-KV forward of ``pb`` at ``splits``
    splits, or None where it raises."""
    cfg = _config(unit, splits, warps)
    return time_or_error(torch, lambda: kernels.forward(pb, cfg), timing="device").get("ms")


def window_case(torch, dtype, seq_len=32768, window=4096, heads=16) -> dict:
    from ioaware import attention
    dt = torch_dtype(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(seq_len)
    q, k, v = (torch.randn(1, heads, seq_len, HEAD_DIM, device="cuda", dtype=dt, generator=g)
               for _ in range(3))
    rec = {"batch": 1, "heads": heads, "head_dim": HEAD_DIM, "seq_len": seq_len,
           "window": [window, 0], "causal": True, "dtype": dtype, "times_ms": {}}
    t = rec["times_ms"]
    t["ioaware-window"] = time_or_error(torch, lambda: attention(
        q, k, v, causal=True, window_size=(window, 0), backend="numba"))
    t["ioaware-causal"] = time_or_error(torch, lambda: attention(q, k, v, causal=True,
                                                                    backend="numba"))
    i = torch.arange(seq_len, device="cuda")
    band = (i[None, :] <= i[:, None]) & (i[None, :] >= i[:, None] - window)
    import torch.nn.functional as F
    for name in ("sdpa-efficient", "sdpa-math"):
        with sdpa_context(name):
            t[f"{name}-band-mask"] = time_or_error(
                torch, lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=band))
    for name in ("sdpa-flash", "sdpa-cudnn"):
        with sdpa_context(name):
            t[f"{name}-causal"] = time_or_error(
                torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    ours = t["ioaware-window"].get("ms")
    if ours and t["ioaware-causal"].get("ms"):
        share = (window + 1) / seq_len * (2 - (window + 1) / seq_len)   # band pairs / causal pairs
        rec["window_over_causal_share"] = ours / (t["ioaware-causal"]["ms"] * share)
    masked = [e["ms"] for n, e in t.items() if n.endswith("band-mask") and "ms" in e]
    if ours and masked:
        rec["ratio_vs_fastest_band_mask"] = min(masked) / ours
    q = k = v = band = None     # freed before empty_cache (the timed lambdas share these cells)
    torch.cuda.empty_cache()
    return rec


def _ncu_child(cases_path) -> int:
    """Run our decode forward once per case (warm-up outside the profiled region)."""
    import torch

    cases = json.loads(open(cases_path).read())
    for c in cases:
        q, k, v = decode_inputs(torch, c["batch"], c["seq_len_k"], c["dtype"],
                                head_dim=c.get("head_dim", HEAD_DIM))
        ours = ours_call(q, k, v, c.get("unit"), c.get("warps"))
        with torch.inference_mode():
            ours()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            ours()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        q = k = v = None
        torch.cuda.empty_cache()
    return 0


def ncu_counters(cases: list[dict]) -> list[dict]:
    """DRAM bytes of our decode kernel per case: the child under ncu, one launch per case (the
    split-KV kernel, which merges its splits in the same launch)."""
    from .ncu import PROFILER_OPTIONS, parse_ncu_csv
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "cases.json")
        log = os.path.join(tmp, "ncu.csv")
        with open(path, "w") as f:
            json.dump(cases, f)
        cmd = ["ncu", *PROFILER_OPTIONS, "--kernel-name", "regex:decode_",
               "--csv", "--page", "raw", "--print-units", "base",
               "--metrics", ",".join(NCU_METRICS), "--log-file", log,
               sys.executable, "-m", "benchmarks", "decode", "--ncu-child", path]
        subprocess.run(cmd, check=True)
        rows = parse_ncu_csv(open(log).read())
    if len(rows) != len(cases):
        raise RuntimeError(f"ncu profiled {len(rows)} decode kernels for {len(cases)} cases")
    return [{"kernels": [r["name"]], **{m: r["metrics"][m] for m in NCU_METRICS}} for r in rows]


#: #17's targets for the decode model: DRAM bytes, time, and the split count's loss.
REPORT_TARGETS = {"dram": 0.05, "time": 0.15, "splits": 0.05}


def record_tensor_cores(rec: dict) -> bool:
    """Whether a decode record ran the tensor-core kernel: its ``plan.unit`` is "mma" (records
    written before that kernel existed name no plan: they ran the CUDA-core one)."""
    return (rec.get("plan") or {}).get("unit", "ffma") == "mma"


def record_mma_warps(rec: dict) -> int | None:
    """The warps a program of the tensor-core kernel a decode record ran (its ``plan.warps``);
    None for the CUDA-core kernel (the plan's rule then has no warps to choose)."""
    return rec["plan"]["warps"] if record_tensor_cores(rec) else None


def decode_report(doc: dict, profile) -> tuple[list[dict], dict]:
    """``(rows, summary)``: each decode record of a results document re-priced by today's plan of
    the kernel it ran (the record's ``plan.unit``; a record without one ran the CUDA-core
    kernel, the only one before the tensor-core kernel) on ``profile`` (a `sim.profiles.GPUProfile`, with measured rates if loaded with them): splits,
    predicted ms, our GPU ms (of the run's call; where today's plan splits otherwise, the split
    sweep's time at today's count, and no DRAM error), the relative errors of time and DRAM read
    bytes (None where the record has no GPU time or counters), and the loss of the split pick
    (None where the file did not time today's pick); ``summary``: per metric the records scored, the median
    |error| and how many are within `REPORT_TARGETS`."""
    from sim.decode import split_kv_costs, split_kv_plan
    rows = []
    for r in doc.get("decode", []):
        element = 4 if r["dtype"] == "fp32" else 2
        plan = split_kv_plan(r["batch"], r["heads_q"], r["heads_kv"], r["seq_len_q"],
                             r["seq_len_k"], r["head_dim"], element, profile.num_sms,
                             tensor_cores=record_tensor_cores(r),
                             smem_bytes_per_sm=profile.smem_bytes_per_sm,
                             mma_warps=record_mma_warps(r), gpu=profile)
        cost = split_kv_costs(plan, profile)
        gpu_ms = r.get("ioaware_device_ms")
        dram = (r.get("ncu") or {}).get("dram__bytes_read.sum")
        sweep = {int(k): v for k, v in (r.get("splits_ms") or {}).items() if v}
        ran = (r.get("plan") or {}).get("splits")
        if ran is not None and ran != plan.splits:
            # today's plan splits otherwise than the run's: its time is the sweep's at its count,
            # and the DRAM counters (of the run's count) do not price it
            gpu_ms, dram = sweep.get(plan.splits), None
        loss = None
        if sweep:
            best = min(sweep.values())
            if plan.splits in sweep:
                loss = sweep[plan.splits] / best - 1
            elif (r.get("model") or {}).get("splits") == plan.splits:
                loss = r.get("splits_model_loss")      # the run timed this pick apart
        rows.append({"batch": r["batch"], "seq_len_k": r["seq_len_k"], "dtype": r["dtype"],
                     "head_dim": r["head_dim"],
                     "splits": plan.splits, "splits_best": r.get("splits_best"),
                     "model_ms": cost["time_s"] * 1e3, "gpu_ms": gpu_ms,
                     "time_rel_error": cost["time_s"] / (gpu_ms * 1e-3) - 1 if gpu_ms else None,
                     "dram_rel_error": cost["dram_read_bytes"] / dram - 1 if dram else None,
                     "splits_loss": loss})
    summary = {}
    for metric, key in (("dram", "dram_rel_error"), ("time", "time_rel_error"),
                        ("splits", "splits_loss")):
        errs = [abs(row[key]) for row in rows if row[key] is not None]
        summary[metric] = {"n": len(errs), "target": REPORT_TARGETS[metric],
                           "median_abs": statistics.median(errs) if errs else None,
                           "within": sum(e <= REPORT_TARGETS[metric] for e in errs)}
    return rows, summary


def window_report(doc: dict, profile) -> list[dict]:
    """Each sliding-window record of a results document priced by today's plan of the forward
    our launchers run on ``profile``'s GPU (``wgmma`` from compute capability 9.0, else
    ``mma``), windowed and full causal: predicted and measured ms (sync-timed calls, host time
    included), their relative errors, and the window's time over the causal time, predicted
    and measured."""
    from sim.plan import price
    from sim.plans import plan_for
    from sim.workload import Workload
    cc = profile.compute_capability
    family = "wgmma" if cc is not None and tuple(cc) >= (9, 0) else "mma"
    rows = []
    for r in doc.get("window", []):
        times = r.get("times_ms", {})
        got = {k: (times.get(f"ioaware-{k}") or {}).get("ms") for k in ("window", "causal")}
        model = {}
        for kind, window in (("window", tuple(r["window"])), ("causal", None)):
            w = Workload(batch=r["batch"], heads=r["heads"], seq_len_q=r["seq_len"],
                         head_dim=r["head_dim"], dtype=r["dtype"], causal=bool(r["causal"]),
                         window_size=window)
            model[kind] = price(plan_for(family, "fwd", w), profile).time_s * 1e3
        rows.append({"dtype": r["dtype"], "family": family, "window": r["window"],
                     "seq_len": r["seq_len"], **{f"model_{k}_ms": v for k, v in model.items()},
                     **{f"{k}_ms": v for k, v in got.items()},
                     **{f"{k}_rel_error": model[k] / got[k] - 1 if got[k] else None
                        for k in model},
                     "model_ratio": model["window"] / model["causal"],
                     "ratio": got["window"] / got["causal"] if all(got.values()) else None})
    return rows


def _print_window_report(rows) -> None:
    if not rows:
        return

    def cell(v, fmt):
        return "—" if v is None else format(v, fmt)
    print(f"# sliding windows: today's plan of the {rows[0]['family']} forward against the "
          f"file's sync-timed calls")
    print(f"{'dtype':5} {'window':>10} {'model ms':>9} {'ms':>7} {'err':>7} {'causal model':>12} "
          f"{'ms':>7} {'err':>7} {'window/causal model':>19} {'measured':>8}")
    for row in rows:
        print(f"{row['dtype']:5} {str(tuple(row['window'])):>10} {row['model_window_ms']:>9.3f} "
              f"{cell(row['window_ms'], '.3f'):>7} {cell(row['window_rel_error'], '+.1%'):>7} "
              f"{row['model_causal_ms']:>12.3f} {cell(row['causal_ms'], '.3f'):>7} "
              f"{cell(row['causal_rel_error'], '+.1%'):>7} {row['model_ratio']:>19.3f} "
              f"{cell(row['ratio'], '.3f'):>8}")


def _print_report(path, profile, rows, summary) -> None:
    from sim.decode import DRAM_RATE
    from sim.plan import rates_of
    _, sources = rates_of(profile)
    print(f"# {path}: the decode model (today's plan, profile {profile.name}, DRAM and launch at "
          f"{sources[DRAM_RATE]}/{sources['launch_s']} rates) against the file's "
          f"measurements; nothing fitted on the file")
    print(f"{'dtype':5} {'d':>3} {'B':>3} {'Nk':>7} {'splits':>6} {'best':>4} {'model ms':>9} "
          f"{'GPU ms':>8} {'time err':>8} {'DRAM err':>8} {'split loss':>10}")

    def pct(v):
        return "—" if v is None else f"{v:+.1%}"
    for row in rows:
        gpu = "—" if row["gpu_ms"] is None else f"{row['gpu_ms']:.4f}"
        print(f"{row['dtype']:5} {row['head_dim']:>3} {row['batch']:>3} {row['seq_len_k']:>7} "
              f"{row['splits']:>6} "
              f"{row['splits_best'] or '—':>4} {row['model_ms']:>9.4f} {gpu:>8} "
              f"{pct(row['time_rel_error']):>8} {pct(row['dram_rel_error']):>8} "
              f"{pct(row['splits_loss']):>10}")
    for metric, what in (("dram", "DRAM read bytes against Nsight Compute's"),
                         ("time", "time against our GPU time alone"),
                         ("splits", "the split pick's loss against the best timed")):
        m = summary[metric]
        med = "—" if m["median_abs"] is None else f"{m['median_abs']:.1%}"
        print(f"{what}: {m['n']} records, median |error| {med}, {m['within']} of {m['n']} within "
              f"{m['target']:.0%}")


def main(argv=None) -> int:
    from sim.decode import MMA_WARP_CHOICES
    ap = argparse.ArgumentParser(prog="python -m benchmarks decode",
                                 description=first_sentence(__doc__))
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--seq-len-k", default="4k,32k,128k", type=_tokens)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--head-dims", default=str(HEAD_DIM),
                    help=f"comma-separated head dims of the decode cases (default {HEAD_DIM})")
    ap.add_argument("--splits", action="store_true", help="time every split count too")
    ap.add_argument("--window", action="store_true", help="add the sliding-window cases")
    ap.add_argument("--graph", action="store_true",
                    help="also time each contender replayed from a CUDA graph (no host work)")
    ap.add_argument("--ncu", action="store_true", help="DRAM bytes of our kernels by Nsight Compute")
    ap.add_argument("--unit", choices=("mma", "ffma"), default=None,
                    help="pin our split-KV kernel (KernelConfig.decode_unit; timed through "
                         "kernels.decode_fwd.prepare); default: ioaware.attention's choice")
    ap.add_argument("--warps", type=int, choices=MMA_WARP_CHOICES, default=None,
                    help="pin the tensor-core split-KV kernel's warps a program "
                         "(KernelConfig.decode_warps; timed through kernels.decode_fwd.prepare)")
    ap.add_argument("--rates", default=None,
                    help="price the model at this GPU's measured rates (python -m benchmarks rates)")
    ap.add_argument("--report", default=None, metavar="FILE",
                    help="re-price a decode results file's records and score the model (no GPU)")
    ap.add_argument("--out", default=None, help="JSON file to write")
    ap.add_argument("--ncu-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.ncu_child:
        return _ncu_child(args.ncu_child)
    from sim.profiles import load_profile, profile_for_gpu_name
    if args.report:
        with open(args.report) as fh:
            doc = json.load(fh)
        gpu_name = doc.get("provenance", {}).get("gpu", "")
        name = doc.get("provenance", {}).get("profile") or profile_for_gpu_name(gpu_name).name
        profile = load_profile(name, rates=args.rates)
        rows, summary = decode_report(doc, profile)
        _print_report(args.report, profile, rows, summary)
        _print_window_report(window_report(doc, profile))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("python -m benchmarks decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    gpu_name = torch.cuda.get_device_name()
    gpu = profile_for_gpu_name(gpu_name)
    if args.rates:
        gpu = load_profile(gpu.name, rates=args.rates)
    peak = peak_copy_bandwidth(torch)
    print(f"# {gpu_name}: device-to-device copy {peak / 1e12:.2f} TB/s; model profile {gpu.name}")
    try:
        head_dims = [int(d) for d in args.head_dims.split(",")]
    except ValueError:
        head_dims = []
    if not head_dims or any(d < 1 or d > 256 for d in head_dims):
        print(f"python -m benchmarks decode: --head-dims {args.head_dims!r}: comma-separated "
              f"integers from 1 to 256", file=sys.stderr)
        return 2
    cases = [{"batch": batch, "seq_len_k": n, "dtype": dtype, "unit": args.unit,
              "warps": args.warps, "head_dim": d}
             for dtype in args.dtypes.split(",") for d in head_dims
             for batch in (int(b) for b in args.batch.split(",")) for n in args.seq_len_k]
    # the Nsight Compute child first, while this process holds none of the cases' memory
    counted = ncu_counters(cases) if args.ncu else None
    records = []
    for c in cases:
        batch, n, dtype = c["batch"], c["seq_len_k"], c["dtype"]
        rec = decode_case(torch, gpu, batch, n, dtype, peak, args.splits, args.graph,
                          args.unit, args.warps, c["head_dim"])
        records.append(rec)
        t = rec["times_ms"]
        cells = "  ".join(f"{k_}={e['ms']:.3f}" if "ms" in e else f"{k_}=—"
                          for k_, e in t.items())
        frac = t["ioaware"].get("kv_bandwidth_fraction")
        print(f"{dtype} d={c['head_dim']} B={batch} Nk={n}: {cells}  ours {frac or 0:.0%} of copy bw  "
              f"vs fastest SDPA {rec.get('ratio_vs_fastest_sdpa', 0):.2f}x  model "
              f"{rec['model']['time_s'] * 1e3:.3f} ms (splits {rec['model']['splits']}"
              f", best measured {rec.get('splits_best', '—')})", flush=True)
        if "graph_ms" in rec:
            print("    CUDA graph replay: " + "  ".join(
                f"{k_}={e['ms']:.3f}" if "ms" in e else f"{k_}=—"
                for k_, e in rec["graph_ms"].items())
                + f"  ours {rec['graph_ms']['ioaware'].get('kv_bandwidth_fraction', 0):.0%}"
                f" of copy bw  vs fastest SDPA "
                f"{rec.get('graph_ratio_vs_fastest_sdpa', 0):.2f}x", flush=True)
    if args.ncu:
        for rec, counters in zip(records, counted):
            rec["ncu"] = counters
            rec["model"]["dram_read_rel_error"] = (rec["model"]["dram_read_bytes"]
                                                   / counters["dram__bytes_read.sum"] - 1)
    windows = []
    if args.window:
        for dtype in args.dtypes.split(","):
            rec = window_case(torch, dtype)
            windows.append(rec)
            print(f"window {dtype}: " + "  ".join(
                f"{k_}={e['ms']:.2f}" if "ms" in e else f"{k_}=—"
                for k_, e in rec["times_ms"].items()), flush=True)
    doc = {"schema": "ioaware.decode/1",
           "provenance": provenance(command_line("decode", argv if argv is not None
                                                 else sys.argv[1:]),
                                    extra={"peak_copy_bytes_per_s": peak,
                                           "profile": gpu.name}),
           "decode": records, "window": windows}
    if args.out:
        write_json(doc, args.out)
        print(f"wrote {args.out}")
    return 0
