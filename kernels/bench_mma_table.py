"""Markdown table of a tensor-core benchmark results file (``kernels.bench_mma`` output).

``python -m kernels.bench_mma_table results/bench_mma_fwd_<gpu>_<version>.json`` prints, per
(N, d, causal), each of our tilings' TFLOP/s, SDPA FLASH (FA2) and CUDNN TFLOP/s, and our best
ratio to FA2, then the file's provenance. The notes file's tables are this command's output.
"""
import json, sys
from collections import defaultdict
d = json.load(open(sys.argv[1]))
t = defaultdict(dict)
for r in d["records"]:
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
