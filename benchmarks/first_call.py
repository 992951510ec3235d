"""Command ``first-call``: the first call of a configuration in a fresh process, compiling and from the kernel cache.

    python -m benchmarks first-call [--configs fp16:64:causal,bf16:128:full,fp32:64:full]
                                    [--out FILE.json]

For each configuration (dtype, head dim, causal or full; B=2, H=8, N=1024, torch CUDA tensors)
it starts a new Python process twice on one new, empty kernel-cache directory
(``IOAWARE_CACHE_DIR``): *cold* (nothing stored: Numba compiles every kernel and the cache
keeps it) and *warm* (the kernels are loaded from the cache). Each process first initialises
torch's CUDA context and runs one tiny torch backward (``torch_first_backward_s``: torch's own
one-time autograd set-up, which imports sympy, and which SDPA pays as well; not counted in ours),
then times, wall clock with a device synchronisation: ``import_s`` (``import ioaware``, which
imports neither numba nor the kernels), ``forward_s`` (the first ``ioaware.attention`` forward,
``backend="numba"``: importing numba-cuda and the kernels, checks, kernel load or compile,
launch), ``backward_s`` (the first ``out.backward``), and ``second_forward_s`` (the same forward
again: what a call costs once loaded). The number of kernels compiled (the ``ioaware.kernels``
log), whether the cold and warm out, dK and dV are bitwise equal (``bitwise_equal``) and how far
their dQ differ (``dq_rel_diff``: the float32 backward on sm_90 sums dQ by float32 atomics, in
an order that varies from run to run; the half-precision Hopper backward is deterministic) are
recorded too. Writes a JSON file with provenance.

Python's bytecode is cached as on an installed package (``pip`` compiles it at install; a
checkout writes it on first import): the children run with ``PYTHONPYCACHEPREFIX`` set to a new
temporary directory and without ``PYTHONDONTWRITEBYTECODE``, so the cold process compiles the
sources and the warm one reads them, wherever the environment would forbid writing them
(``bytecode_cached`` in each record says what the child saw).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from .common import command_line, first_sentence, provenance, write_json

DEFAULT_CONFIGS = "fp16:64:causal,fp16:128:full,bf16:128:causal,fp32:64:full"
SHAPE = (2, 8, 1024)          # B, H, N


def parse_configs(text: str) -> list[dict]:
    """``dtype:head_dim:causal|full`` items, comma-separated."""
    out = []
    for item in text.split(","):
        try:
            dtype, d, mode = item.split(":")
            if dtype not in ("fp16", "bf16", "fp32") or mode not in ("causal", "full"):
                raise ValueError
            out.append({"dtype": dtype, "head_dim": int(d), "causal": mode == "causal"})
        except ValueError:
            raise SystemExit(f"--configs: {item!r} is not dtype:head_dim:causal|full "
                             f"(dtype fp16, bf16 or fp32)") from None
    return out


# The child process: run as ``python -c CHILD CONFIG_JSON``; prints one JSON line.
CHILD = r"""
import json, logging, sys, time
import torch
c = json.loads(sys.argv[1])
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t = time.perf_counter()                  # torch's own one-time autograd set-up, not ours
w = torch.ones(4, device="cuda", requires_grad=True); y = w * 2; y.backward(torch.ones_like(y))
torch.cuda.synchronize(); torch_first_backward_s = time.perf_counter() - t
compiled = []
class H(logging.Handler):
    def emit(self, r):
        if r.getMessage().startswith("compiled "): compiled.append(r.getMessage())
log = logging.getLogger("ioaware.kernels"); log.addHandler(H(level=logging.INFO)); log.setLevel(logging.INFO)
t = time.perf_counter(); import ioaware; import_s = time.perf_counter() - t
dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[c["dtype"]]
g = torch.Generator(device="cuda").manual_seed(0)
B, H, N = c["shape"]
q, k, v, do = (torch.randn(B, H, N, c["head_dim"], device="cuda", dtype=dt, generator=g) for _ in range(4))
for x in (q, k, v): x.requires_grad_(True)
torch.cuda.synchronize()
def timed(fn):
    t = time.perf_counter(); r = fn(); torch.cuda.synchronize(); return r, time.perf_counter() - t
out, fwd = timed(lambda: ioaware.attention(q, k, v, causal=c["causal"], backend="numba"))
_, bwd = timed(lambda: out.backward(do))
_, again = timed(lambda: ioaware.attention(q, k, v, causal=c["causal"], backend="numba"))
digest = float(out.double().sum() + k.grad.double().sum() + v.grad.double().sum())
dq_sum, dq_abs = float(q.grad.double().sum()), float(q.grad.double().abs().sum())
print(json.dumps({"bytecode_cached": not sys.dont_write_bytecode, "torch_first_backward_s": torch_first_backward_s, "import_s": import_s, "forward_s": fwd, "backward_s": bwd,
                  "second_forward_s": again, "kernels_compiled": len(compiled), "digest": digest, "dq_sum": dq_sum, "dq_abs_sum": dq_abs}))
"""


#: The child's result checks (not reported per run): sums of out, dK and dV (``digest``) and of
#: dQ (``dq_sum``, with the sum of its magnitudes ``dq_abs_sum``).
CHECKS = ("digest", "dq_sum", "dq_abs_sum")


def same_results(cold: dict, warm: dict) -> dict:
    """``bitwise_equal``: out, dK and dV of the two runs have the same sums; ``dq_rel_diff``:
    the difference of their dQ sums relative to the sum of |dQ| (the half-precision backward
    adds dQ with float32 atomics on sm_90 at d = 128, the float32 one at d 64 and 128, in an
    order that varies from run to run)."""
    return {"bitwise_equal": cold["digest"] == warm["digest"],
            "dq_rel_diff": abs(cold["dq_sum"] - warm["dq_sum"]) / max(cold["dq_abs_sum"], 1e-30)}


def run_child(config: dict, cache_dir: str, pycache_dir: str) -> dict:
    """One child process on the kernel cache ``cache_dir`` and the bytecode cache
    ``pycache_dir``: its JSON line."""
    env = dict(os.environ, IOAWARE_CACHE_DIR=cache_dir, PYTHONPYCACHEPREFIX=pycache_dir)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(config)], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"first-call child failed ({config}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks first-call",
                                 description=first_sentence(__doc__))
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    help="comma-separated dtype:head_dim:causal|full")
    ap.add_argument("--out", default=None, help="JSON file to write (with provenance)")
    args = ap.parse_args(argv)
    configs = parse_configs(args.configs)
    prov = provenance(command_line("first-call", argv))
    rows = []
    for i, c in enumerate(configs, 1):
        c = dict(c, shape=list(SHAPE))
        with tempfile.TemporaryDirectory(prefix="ioaware-first-call-") as cache_dir, \
                tempfile.TemporaryDirectory(prefix="ioaware-pycache-") as pycache_dir:
            cold = run_child(c, cache_dir, pycache_dir)
            warm = run_child(c, cache_dir, pycache_dir)
        row = dict(c, **{f"cold_{k}": v for k, v in cold.items() if k not in CHECKS},
                   **{f"warm_{k}": v for k, v in warm.items() if k not in CHECKS},
                   **same_results(cold, warm))
        rows.append(row)
        print(f"[{i}/{len(configs)}] {c['dtype']} d={c['head_dim']} "
              f"{'causal' if c['causal'] else 'full'}: cold fwd {row['cold_forward_s']:.2f} s + "
              f"bwd {row['cold_backward_s']:.2f} s ({row['cold_kernels_compiled']} compiled); "
              f"warm fwd {row['warm_forward_s']:.3f} s + bwd {row['warm_backward_s']:.3f} s "
              f"({row['warm_kernels_compiled']} compiled); import {row['warm_import_s']:.2f} s; "
              f"equal {row['bitwise_equal']}", flush=True)
    doc = {"schema": "ioaware.first_call/1", "provenance": prov, "records": rows}
    if args.out:
        write_json(doc, args.out)
        print(f"wrote {args.out}")
    return 0
