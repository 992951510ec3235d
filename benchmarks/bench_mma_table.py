"""Markdown table of a tensor-core benchmark results file (``kernels.bench_mma`` output).

``python -m kernels.bench_mma_table results/bench_mma_fwd_<gpu>_<version>.json`` prints, per
(N, d, causal), each of our tilings' TFLOP/s, SDPA FLASH (FA2) and CUDNN TFLOP/s, and our best
ratio to FA2, then the file's provenance. The notes file's tables are this command's output.
For a ``--mode fwdbwd`` file (records of pass "fwd+bwd" and "bwd") the table is of forward +
backward TFLOP/s (3.5 x the forward's FLOPs), with our backward's own time in ms.
"""
import json
import sys
from collections import defaultdict

d = json.load(open(sys.argv[1]))
recs = d["records"]
if any(r.get("pass") == "fwd+bwd" for r in recs):
    t = defaultdict(dict)
    for r in recs:
        key = (r["seq_len_q"], r["head_dim"], r["causal"])
        name = r["kernel"] + ("-bwd" if r["pass"] == "bwd" else "")
        t[key][name] = r
    print("| N | d | causal | ours fwd+bwd ms | ours bwd ms | ours TF/s | FA2 TF/s | cuDNN TF/s "
          "| ours / FA2 | ours / cuDNN |")
    print("|---" * 10 + "|")
    for key in sorted(t):
        v = t[key]
        o, f, c = v.get("ioaware-numba"), v.get("sdpa-flash"), v.get("sdpa-cudnn")
        ob = v.get("ioaware-numba-bwd")
        fmt = lambda x, p=1: f"{x:.{p}f}" if x is not None else "-"  # noqa: E731
        print(f"| {key[0]} | {key[1]} | {key[2]} | {fmt(o and o['time_ms'], 2)} | "
              f"{fmt(ob and ob['time_ms'], 2)} | {fmt(o and o['tflops'])} | "
              f"{fmt(f and f['tflops'])} | {fmt(c and c['tflops'])} | "
              f"{fmt(o and f and f['time_ms'] / o['time_ms'], 2)} | "
              f"{fmt(o and c and c['time_ms'] / o['time_ms'], 2)} |")
else:
    t = defaultdict(dict)
    for r in recs:
        key = (r["seq_len_q"], r["head_dim"], r["causal"])
        name = r["kernel"] + (f"[{r['block_q']}x{r['block_k']}]" if r["kernel"] == "ioaware-numba" else "")
        t[key][name] = r["tflops"]
    names = sorted({n for v in t.values() for n in v if n.startswith("ioaware")})
    print("| N | d | causal | " + " | ".join(f"{n} TF/s" for n in names) + " | FA2 TF/s | cuDNN TF/s | best ours / FA2 |")
    print("|---" * (len(names) + 6) + "|")
    for key in sorted(t):
        v = t[key]; best = max(v[n] for n in names if n in v)
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(f"{v[n]:.1f}" if n in v else "-" for n in names)
              + f" | {v['sdpa-flash']:.1f} | {v.get('sdpa-cudnn', float('nan')):.1f} | {best / v['sdpa-flash']:.2f} |")
p = d["provenance"]; print(f"\n({p['gpu']}, driver {p['driver']}, CUDA {p['cuda']}, torch {p['torch']}, numba {p['numba']}, numba-cuda {p['numba_cuda']}, {p['date']})")
