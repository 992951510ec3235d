"""Command ``bench``: our kernels against PyTorch SDPA's backends, timed in one run on one GPU.

    python -m benchmarks bench [--dtype fp32 fp16] [--d 64 128] [--n ...] [--causal false true]
                               [--pass fwd fwd+bwd] [--quick] [--out FILE_OR_DIR]
    python -m benchmarks bench --show FILE          (the table of a results file; no GPU)
    python -m benchmarks bench --summary FILE [FILE ...] [--readme README.md]     (no GPU)
    python -m benchmarks bench --summary FILE [FILE ...] --small-table            (no GPU)

For every (N, d, causal, dtype, pass) it times our kernels (``ioaware-numba``:
``ioaware.attention(..., backend="numba")``, forward + backward through autograd, so the family
the registry picks for the problem; its record names it as ``variant``) and SDPA's FLASH,
EFFICIENT, CUDNN and MATH backends in the same process: median of CUDA-event times after
warm-up (``--timing sync``, the default: each call synchronous, its host code inside the timed
span; ``--timing device``: a device-side sleep first, so only the GPU's time counts; our
records also carry ``host_ms``, the host time of one call), TFLOP/s (4 B H Nq Nk d per forward,
halved when causal; forward + backward counts 3.5 forwards), peak extra device memory over the
inputs (torch allocator), and the speed ratio ``t_backend / t_ours`` (> 1: ours is faster),
printed from the same run. Shapes keep B * N = 16384 tokens and H * d = 2048; the small shapes
(`SMALL_SHAPES`: N 512 and 1024 at B * H = 64 and 128, H = 16, where a call's host time and the
backward's fixed costs show; ``--no-small`` leaves them out, ``--quick`` too) are timed as well,
their records marked ``"grid": "small"``. A backend that
refuses a configuration (FLASH on float32) or runs out of memory is listed under "skipped"; MATH
is skipped where its materialised scores would not fit. The seed experiment times a small
transformer encoder layer (d_model 512, 8 heads, forward + backward) whose attention is
``ioaware.attention(backend="numba")``, SDPA MATH or SDPA FLASH.

Writes ``results/bench_<gpu>_<date>.json`` (schema ``ioaware.results/1``, with provenance; a
directory given as ``--out`` gets that name inside it), after every configuration.

``--summary FILE [FILE ...]`` prints, from results files, one Markdown table (with several
files, each row comes whole from the last file that timed it): per dtype, head dim and causal
mask, the lowest and highest ratio over N of the forward and of the forward + backward
against the peers that matter (FLASH and CUDNN for float16/bfloat16, EFFICIENT for float32),
with the GPU and the date in a caption line. ``--small-table``: instead, the table of the small
shapes of the last file that has them, one row per (dtype, d, causal, N, B * H). ``--readme README.md`` writes that table into the
README between its marker lines (`README_BEGIN`, `README_END`) instead of printing it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .common import (RESULTS_DIR, SCHEMA, SDPA_BACKENDS, TIMINGS, attention_flops,
                     attention_problem, benchmark_inputs, command_line, doc_usage,
                     first_sentence, format_provenance, host_call_ms, peak_extra_bytes,
                     provenance, sdpa_context, time_cuda, torch_dtype, write_json)

OURS = "ioaware-numba"
#: The small shapes timed besides the benchmark's: (N, batch, heads), B * H = 64 and 128.
SMALL_SHAPES = ((512, 4, 16), (512, 8, 16), (1024, 4, 16), (1024, 8, 16))
KERNELS = (OURS,) + tuple(SDPA_BACKENDS)
#: The peers the summary compares with, per dtype, and their names in it.
SUMMARY_PEERS = {"fp16": ("sdpa-flash", "sdpa-cudnn"), "bf16": ("sdpa-flash", "sdpa-cudnn"),
                 "fp32": ("sdpa-efficient",)}
PEER_LABELS = {"sdpa-flash": "FLASH", "sdpa-cudnn": "CUDNN", "sdpa-efficient": "EFFICIENT"}
README_BEGIN = "<!-- summary-table:begin (python -m benchmarks bench --summary) -->"
README_END = "<!-- summary-table:end -->"


def _make_runner(torch, kernel, q, k, v, dout, causal, pass_):
    """One call of ``kernel`` on the inputs: the forward, or forward + backward by autograd."""
    import torch.nn.functional as F
    if kernel == OURS:
        from ioaware import attention

        def attn(q, k, v):
            return attention(q, k, v, causal=causal, backend="numba")
    else:
        def attn(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if pass_ == "fwd":
        def run():
            with sdpa_context(kernel):
                attn(q, k, v)
        return run
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

    def run():
        with sdpa_context(kernel):
            attn(qg, kg, vg).backward(dout)
        qg.grad = kg.grad = vg.grad = None
    return run


def bench_attention(torch, ns, ds, dtypes, causals, passes, kernel_names, progress=print,
                    checkpoint=None, timing="sync", small=()):
    """Time each kernel on each configuration (module docstring); ``timing`` is one of
    `benchmarks.common.TIMINGS`; ``small``: (N, batch, heads) shapes timed too, their records
    marked ``"grid": "small"``. Returns (records, skipped)."""
    import kernels
    records, skipped = [], []
    free_bytes = torch.cuda.mem_get_info()[0]
    configs = [(n, None, None, d, dt, c, p) for d in ds for dt in dtypes for c in causals
               for p in passes for n in ns]
    configs += [(n, b, h, d, dt, c, p) for d in ds for dt in dtypes for c in causals
                for p in passes for n, b, h in small]
    for ci, (n, b_small, h_small, d, dt, causal, pass_) in enumerate(configs):
        b, h, q, k, v, do = benchmark_inputs(torch, dt, d, n, b_small, h_small)
        for kern in kernel_names:
            base = {"kernel": kern, "schedule": "naive" if kern == "sdpa-math" else "flash2",
                    "pass": pass_, "dtype": dt, "batch": b, "heads": h, "heads_kv": h,
                    "seq_len_q": n, "seq_len_k": n, "head_dim": d, "causal": causal,
                    **({} if b_small is None else {"grid": "small"})}
            if kern == OURS:
                pb = attention_problem(q, k, v, causal=causal)
                base["variant"] = kernels.family_for(pb, None, "fwd")
                if base["variant"] == "wgmma":      # the tiles and schedule its plan runs
                    from kernels import wgmma_fwd
                    from sim.plans.wgmma_fwd import record_schedule
                    cfg = wgmma_fwd.plan(pb, kernels.KernelConfig()).config
                    base.update(record_schedule(cfg), block_q=cfg["block_q"],
                                block_k=cfg["block_k"])
                if pass_ == "fwd+bwd":
                    base["variant_bwd"] = kernels.family_for(pb, None, "bwd")
                    if base["variant_bwd"] in ("mma", "tf32"):     # how its backward adds dQ
                        bwd_module = getattr(kernels, f"{base['variant_bwd']}_bwd")
                        base["dq_mode"] = bwd_module.dq_mode(pb, kernels.KernelConfig())
                    if base["variant_bwd"] == "wgmma":   # its backward's tiles and order
                        from sim.plans.wgmma_bwd import record_fields
                        base.update(record_fields(d, n))
            if kern == "sdpa-math":
                # the materialised scores and probabilities (plus their grads) in the input dtype
                est = b * h * n * n * q.element_size() * (6 if pass_ == "fwd+bwd" else 3)
                if est > 0.6 * free_bytes:
                    skipped.append(dict(base, reason=f"needs ~{est / 2**30:.0f} GiB"))
                    continue
            try:
                run = _make_runner(torch, kern, q, k, v, do, causal, pass_)
                run()
                torch.cuda.synchronize()
                peak = peak_extra_bytes(torch, run)
                med, p10, p90 = time_cuda(torch, run, timing=timing)
                host = {"host_ms": host_call_ms(torch, run)} if kern == OURS else {}
            except Exception as exc:  # noqa: BLE001 - a backend refusing this configuration, or OOM
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                skipped.append(dict(base, reason=f"{type(exc).__name__}: "
                                                 f"{str(exc).splitlines()[0][:160]}"))
                continue
            fl = attention_flops(b, h, n, n, d, causal, pass_)
            records.append(dict({"block_q": None, "block_k": None, **base}, time_ms=med,
                                time_ms_p10=p10,
                                time_ms_p90=p90, peak_extra_bytes=peak, dram_read_bytes=None,
                                dram_write_bytes=None, l2_bytes=None, global_load_bytes=None,
                                global_store_bytes=None, flops_executed=None,
                                tflops=fl / (med * 1e-3) / 1e12, timing=timing, **host))
        progress(f"[{ci + 1}/{len(configs)}] N={n} B={b} H={h} d={d} {dt} causal={causal} "
                 f"{pass_}")
        if checkpoint is not None:
            checkpoint(records, skipped)
        del q, k, v, do
        torch.cuda.empty_cache()
    return records, skipped


def seed_experiment(torch, seq_lens, dtypes=("fp16",), progress=print):
    """A pre-norm transformer encoder layer (d_model 512, 8 heads, MLP 2048), forward +
    backward, with its attention from ioaware (our kernels), SDPA MATH or SDPA FLASH."""
    import torch.nn as nn
    import torch.nn.functional as F

    from ioaware import attention

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

    def sdpa(kernel):
        def f(q, k, v):
            with sdpa_context(kernel):
                return F.scaled_dot_product_attention(q, k, v)
        return f

    variants = {OURS: lambda q, k, v: attention(q, k, v, backend="numba"),
                "sdpa-math": sdpa("sdpa-math"), "sdpa-flash": sdpa("sdpa-flash")}
    rows = []
    for dt in dtypes:
        for n in seq_lens:
            b = max(1, 8192 // n)
            for name, fn in variants.items():
                torch.manual_seed(0)
                layer = Layer(fn).to("cuda", torch_dtype(torch, dt))
                x = torch.randn(b, n, d_model, device="cuda", dtype=torch_dtype(torch, dt),
                                requires_grad=True)
                row = {"variant": name, "dtype": dt, "batch": b, "seq_len": n}

                def step():
                    layer(x).float().square().mean().backward()
                try:
                    step()
                    peak = peak_extra_bytes(torch, step)
                    med, p10, p90 = time_cuda(torch, step)
                    rows.append(dict(row, d_model=d_model, heads=n_heads, **{"pass": "fwd+bwd"},
                                     time_ms=med, time_ms_p10=p10, time_ms_p90=p90,
                                     peak_extra_bytes=peak))
                except Exception as exc:  # noqa: BLE001 - recorded
                    rows.append(dict(row, skipped=f"{type(exc).__name__}: "
                                                  f"{str(exc).splitlines()[0][:160]}"))
                layer = x = None      # free before empty_cache
                torch.cuda.empty_cache()
            progress(f"seed experiment {dt} N={n}")
    return rows


# ------------------------------------------------------------------------------------------------
# tables (no GPU)
# ------------------------------------------------------------------------------------------------

def format_table(records):
    """Our kernel vs each backend per configuration: times, TFLOP/s, memory, ratios (small
    shapes: N followed by their B * H)."""
    by = {}
    for r in records:
        n = str(r["seq_len_q"]) + (f"/{r['batch'] * r['heads']}" if r.get("grid") == "small"
                                   else "")
        key = (r["pass"], r["dtype"], r["head_dim"], r["causal"], r.get("grid") == "small",
               r["seq_len_q"], n)
        by.setdefault(key, {})[r["kernel"]] = r
    names = [OURS, "sdpa-efficient", "sdpa-flash", "sdpa-cudnn", "sdpa-math"]
    head = (f"{'pass':8} {'dtype':5} {'d':>4} {'causal':6} {'N':>8} | "
            + " ".join(f"{n.replace('sdpa-', ''):>9}" for n in names)
            + " | ours TF/s | x_eff  x_flash x_cudnn x_math | MiB ours/math"
            + (" | host ms" if any("host_ms" in r for r in records) else ""))
    lines = [head, "-" * len(head)]
    for key in sorted(by):
        row = by[key]
        ours = row.get(OURS)
        times = " ".join(f"{row[n]['time_ms']:9.3f}" if n in row else f"{'-':>9}" for n in names)
        ratios = " ".join(f"{row[n]['time_ms'] / ours['time_ms']:6.2f}" if (ours and n in row)
                          else f"{'-':>6}" for n in names[1:])
        tf = f"{ours['tflops']:9.2f}" if ours else f"{'-':>9}"
        mem = (f"{ours['peak_extra_bytes'] / 2**20:.1f}/" if ours else "-/") + (
            f"{row['sdpa-math']['peak_extra_bytes'] / 2**20:.0f}" if "sdpa-math" in row else "-")
        host = (f" | {ours['host_ms']:7.3f}" if ours and "host_ms" in ours
                else (" |       -" if "host ms" in head else ""))
        lines.append(f"{key[0]:8} {key[1]:5} {key[2]:4d} {str(key[3]):6} {key[6]:>8} | {times} | "
                     f"{tf} | {ratios} | {mem}{host}")
    timings = sorted({r["timing"] for r in records if "timing" in r})
    lines.append("times in ms (median); x_<backend> = t_backend / t_ours (> 1: ours faster)"
                 + (f"; timing: {', '.join(timings)}" if timings else "")
                 + (" (host ms: host time of one call of ours)" if "host ms" in head else ""))
    return "\n".join(lines)


def format_seed(rows):
    lines = [f"{'variant':14} {'dtype':5} {'N':>5} {'B':>3} {'ms':>9} {'peak MiB':>9}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['variant']:14} {r['dtype']:5} {r['seq_len']:5d} {r['batch']:3d}  "
                         f"skipped: {r['skipped']}")
        else:
            lines.append(f"{r['variant']:14} {r['dtype']:5} {r['seq_len']:5d} {r['batch']:3d} "
                         f"{r['time_ms']:9.3f} {r['peak_extra_bytes'] / 2**20:9.1f}")
    return "\n".join(lines)


def ratio_ranges(records) -> dict:
    """Per (dtype, head_dim, causal): ``"N"``: the sequence lengths of our records, and per
    (pass, peer) of `SUMMARY_PEERS` the (lowest, highest) ratio t_peer / t_ours over N."""
    times = {}
    for r in records:
        if r.get("grid") == "small":
            continue
        times[(r["dtype"], r["head_dim"], r["causal"], r["pass"], r["seq_len_q"], r["kernel"])] = \
            r["time_ms"]
    out: dict = {}
    for (dt, d, causal, pass_, n, kernel), t_ours in times.items():
        if kernel != OURS:
            continue
        row = out.setdefault((dt, d, causal), {"N": set()})
        row["N"].add(n)
        for peer in SUMMARY_PEERS.get(dt, ()):
            t_peer = times.get((dt, d, causal, pass_, n, peer))
            if t_peer is not None:
                row.setdefault((pass_, peer), []).append(t_peer / t_ours)
    return {key: {k: (sorted(v) if k == "N" else (min(v), max(v))) for k, v in row.items()}
            for key, row in out.items()}


def summary_table(doc, name) -> str:
    """The Markdown summary of a benchmark results object (module docstring); ``name`` is the
    file named in the caption line. ``doc`` and ``name`` may also be lists (several runs): a
    row (dtype, head dim, causal) comes whole from the last run that timed it, ratios are never
    mixed across runs, and a column says which run."""
    if isinstance(doc, dict):
        return _summary_table([doc], [name])
    return _summary_table(list(doc), list(name))


def _summary_table(docs: list, names: list) -> str:
    ranges, source = {}, {}
    for i, doc in enumerate(docs):
        for key, row in ratio_ranges(doc["records"]).items():
            ranges[key], source[key] = row, i
    order = {dt: i for i, dt in enumerate(SUMMARY_PEERS)}
    several = len(docs) > 1

    def caption(doc, name):
        prov = doc["provenance"]
        return (f"`{name}` ({prov['gpu']}, {prov['date'][:10]}, "
                f"{prov.get('timing', 'sync')} timing)")

    def span(lo, hi, fmt):
        return fmt(lo) if lo == hi else f"{fmt(lo)}–{fmt(hi)}"

    def cell(dt, row, pass_):
        parts = [f"{PEER_LABELS[peer]} {span(*row[(pass_, peer)], lambda x: f'{x:.2f}')}"
                 for peer in SUMMARY_PEERS[dt] if (pass_, peer) in row]
        return ", ".join(parts) or "–"
    if several:
        runs = "; ".join(f"[{i + 1}] {caption(d, n)}" for i, (d, n) in enumerate(zip(docs, names)))
        where = f"each row from one run: {runs}"
    else:
        where = f"from {caption(docs[0], names[0])}"
    lines = [f"Speed of our kernels relative to PyTorch SDPA: t_SDPA / t_ours (above 1: ours "
             f"faster), lowest–highest over N, {where}.", "",
             "| dtype | d | causal | N | forward | forward + backward |" + (" run |" if several else ""),
             "| --- | --- | --- | --- | --- | --- |" + (" --- |" if several else "")]
    for dt, d, causal in sorted(ranges, key=lambda k: (order.get(k[0], 99), k[1], k[2])):
        row = ranges[(dt, d, causal)]
        lines.append(f"| {dt} | {d} | {'yes' if causal else 'no'} | "
                     f"{span(row['N'][0], row['N'][-1], str)} | {cell(dt, row, 'fwd')} | "
                     f"{cell(dt, row, 'fwd+bwd')} |"
                     + (f" [{source[(dt, d, causal)] + 1}] |" if several else ""))
    return "\n".join(lines)


def small_table(docs: list, names: list) -> str:
    """The small-shape table (records marked ``"grid": "small"``) of the last run that has
    them: per (dtype, d, causal, N, B * H) the ratio t_peer / t_ours of the forward and of the
    forward + backward; "" where no run has any."""
    for doc, name in list(zip(docs, names))[::-1]:
        recs = [r for r in doc["records"] if r.get("grid") == "small"]
        if recs:
            break
    else:
        return ""
    times = {(r["dtype"], r["head_dim"], r["causal"], r["seq_len_q"], r["batch"] * r["heads"],
              r["pass"], r["kernel"]): r["time_ms"] for r in recs}
    keys = sorted({k[:5] for k in times if k[6] == OURS},
                  key=lambda k: (list(SUMMARY_PEERS).index(k[0]) if k[0] in SUMMARY_PEERS else 99,
                                 k[1], k[2], k[3], k[4]))

    def cell(key, pass_):
        ours = times.get((*key, pass_, OURS))
        parts = [f"{PEER_LABELS[p]} {times[(*key, pass_, p)] / ours:.2f}"
                 for p in SUMMARY_PEERS.get(key[0], ()) if ours and (*key, pass_, p) in times]
        return ", ".join(parts) or "–"
    lines = [f"Small shapes (H = 16; N = 512 and 1024 at B · H = 64 and 128), same ratios, from "
             f"`{name}`:", "", "| dtype | d | causal | N | B · H | forward | forward + backward |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for key in keys:
        dt, d, causal, n, bh = key
        lines.append(f"| {dt} | {d} | {'yes' if causal else 'no'} | {n} | {bh} | "
                     f"{cell(key, 'fwd')} | {cell(key, 'fwd+bwd')} |")
    return "\n".join(lines)


def replace_readme_block(text: str, table: str) -> str:
    """``text`` with the lines between `README_BEGIN` and `README_END` replaced by ``table``
    (a blank line on each side). ValueError when the markers are missing or out of order."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.strip() == README_BEGIN]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == README_END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"the README needs one line {README_BEGIN!r} and, after it, one line "
                         f"{README_END!r}")
    return "".join(lines[:starts[0] + 1] + ["\n", table.rstrip("\n") + "\n", "\n"]
                   + lines[ends[0]:])


def readme_block(text: str) -> str | None:
    """What stands between the README's markers (stripped), or None without markers."""
    m = re.search(re.escape(README_BEGIN) + r"\n(.*?)^" + re.escape(README_END), text,
                  flags=re.S | re.M)
    return m.group(1).strip() if m else None


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def _out_path(out, prov) -> Path:
    name = ("bench_" + re.sub(r"[^A-Za-z0-9]+", "-", prov["gpu"]).strip("-").lower() + "_"
            + prov["date"][:10] + ".json")
    if out is None:
        return RESULTS_DIR / name
    out = Path(out)
    return out / name if out.is_dir() else out


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks bench",
                                 description=first_sentence(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc_usage(__doc__))
    ap.add_argument("--n", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--causal", nargs="+", default=["false", "true"], choices=["false", "true"])
    ap.add_argument("--pass", dest="passes", nargs="+", default=["fwd", "fwd+bwd"],
                    choices=["fwd", "fwd+bwd"])
    ap.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    ap.add_argument("--seed-lens", type=int, nargs="*", default=[128, 256, 512, 1024, 2048, 4096],
                    help="sequence lengths of the seed experiment (none: skip it)")
    ap.add_argument("--quick", action="store_true",
                    help="N in {1024, 4096}, d=64, no seed experiment, no small shapes")
    ap.add_argument("--no-small", dest="small", action="store_false",
                    help="leave out the small shapes (SMALL_SHAPES)")
    ap.add_argument("--out", default=None,
                    help="results file, or a directory for the default name "
                         "(default results/bench_<gpu>_<date>.json)")
    ap.add_argument("--timing", choices=TIMINGS, default="sync",
                    help="sync: events around each synchronous call, host code included "
                         "(default); device: a device-side sleep first, GPU time only")
    ap.add_argument("--show", metavar="FILE", default=None,
                    help="print the table of a results file (within --n/--d/... ) and exit")
    ap.add_argument("--summary", metavar="FILE", nargs="+", default=None,
                    help="print the Markdown summary table of results files and exit (several: "
                         "each row from the last file that has it)")
    ap.add_argument("--readme", metavar="README", default=None,
                    help="with --summary: write the table between the README's markers")
    ap.add_argument("--small-table", action="store_true",
                    help="with --summary: print the small shapes' table instead")
    args = ap.parse_args(argv)
    if args.readme and not args.summary:
        ap.error("--readme needs --summary FILE")
    if args.summary:
        paths = [Path(f) for f in args.summary]
        docs, names = [json.loads(p.read_text()) for p in paths], [p.name for p in paths]
        if args.small_table:
            if args.readme:
                ap.error("--small-table prints its table; it takes no --readme")
            print(small_table(docs, names) or "no small-shape records in these files")
            return 0
        table = summary_table(docs, names)
        if not args.readme:
            print(table)
            return 0
        readme = Path(args.readme)
        try:
            readme.write_text(replace_readme_block(readme.read_text(), table))
        except ValueError as exc:
            print(f"{readme}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote the summary of {' '.join(args.summary)} into {readme}")
        return 0
    if args.show:
        doc = json.loads(Path(args.show).read_text())
        print(format_provenance(doc["provenance"]))
        keep = [r for r in doc["records"] if r["seq_len_q"] in args.n and r["head_dim"] in args.d
                and r["dtype"] in args.dtype and r["pass"] in args.passes
                and str(r["causal"]).lower() in args.causal]
        print(format_table(keep))
        if doc.get("seed_experiment"):
            print("\n# seed experiment: transformer encoder layer fwd+bwd")
            print(format_seed([r for r in doc["seed_experiment"]
                               if r["seq_len"] in (args.seed_lens or [])]))
        return 0
    if args.quick:
        args.n, args.d, args.seed_lens, args.small = [1024, 4096], [64], [], False

    import torch
    if not torch.cuda.is_available():
        raise SystemExit("python -m benchmarks bench needs a CUDA GPU "
                         "(torch.cuda.is_available() is False)")
    prov = provenance(command_line("bench", argv), extra={"timing": args.timing})
    out = _out_path(args.out, prov)
    doc = {"schema": SCHEMA, "provenance": prov, "records": [], "skipped": [],
           "seed_experiment": [], "complete": False}

    def save(records, skipped):   # after every configuration: a cut-off run keeps its data
        doc["records"], doc["skipped"] = records, skipped
        write_json(doc, out)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    records, skipped = bench_attention(torch, args.n, args.d, args.dtype,
                                       [c == "true" for c in args.causal], args.passes,
                                       args.kernels, progress=log, checkpoint=save,
                                       timing=args.timing,
                                       small=SMALL_SHAPES if args.small else ())
    doc["seed_experiment"] = seed_experiment(torch, args.seed_lens, progress=log) \
        if args.seed_lens else []
    doc["complete"] = True
    save(records, skipped)
    print(format_provenance(prov))
    print(format_table(records))
    if doc["seed_experiment"]:
        print("\n# seed experiment: transformer encoder layer fwd+bwd")
        print(format_seed(doc["seed_experiment"]))
    print(f"\nwrote {out}")
    return 0
