"""``python -m ioaware <command>``: the compiled-kernel cache (`ioaware.kernel_cache`).

    python -m ioaware precompile [--dtype float16 bfloat16 float32] [--head-dim 64 128]
                                 [--forward-only] [--decode]
    python -m ioaware cache [--clear]

``precompile`` runs each common configuration once on a small torch CUDA problem, so that its
kernels are compiled and stored in the cache directory: every dtype and head dim given, causal
and not, forward and backward, for q/k/v both contiguous ``[B, H, N, d]`` and viewed from
``[B, N, H, d]`` (what models pass; a different argument signature). ``--decode`` adds the
split-KV decoding forward for one query against a 4096-key cache with 32 query heads and 8, 4
and 1 KV heads (d = 128, 16-bit dtypes). Masks, dropout and sliding windows compile on first
use. Each configuration prints whether it compiled or loaded, and its seconds.
``cache`` prints the directory, its files and bytes; ``--clear`` deletes the stored kernels.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time

from . import kernel_cache

DTYPES = ("float16", "bfloat16", "float32")
HEAD_DIMS = (64, 128)


def _configurations(dtypes, head_dims, decode):
    """(label, function of torch) for each configuration to run."""
    for dtype, d, causal, layout in itertools.product(dtypes, head_dims, (False, True),
                                                      ("contiguous", "heads-second view")):
        yield (f"{dtype} d={d} {'causal' if causal else 'full'} {layout}",
               dict(dtype=dtype, d=d, causal=causal, layout=layout))
    if decode:
        for dtype, heads_kv in itertools.product([t for t in dtypes if t != "float32"], (8, 4, 1)):
            yield (f"decode {dtype} d=128 32/{heads_kv} heads", dict(dtype=dtype, d=128,
                                                                     heads_kv=heads_kv))


def _run(torch, attention, c, backward):
    dtype = getattr(torch, c["dtype"])
    dev = torch.device("cuda")
    if "heads_kv" in c:                                   # decoding: 1 query, 4096 cached keys
        q = torch.randn(2, 32, 1, c["d"], device=dev, dtype=dtype)
        k, v = (torch.randn(2, c["heads_kv"], 4096, c["d"], device=dev, dtype=dtype)
                for _ in range(2))
        with torch.inference_mode():
            attention(q, k, v)
        return
    shape = (2, 4, 256, c["d"])
    if c["layout"] == "contiguous":
        q, k, v = (torch.randn(shape, device=dev, dtype=dtype) for _ in range(3))
    else:
        q, k, v = (torch.randn(2, 256, 4, c["d"], device=dev, dtype=dtype).transpose(1, 2)
                   for _ in range(3))
    q, k, v = (x.requires_grad_(backward) for x in (q, k, v))
    out = attention(q, k, v, causal=c["causal"])
    if backward:
        out.backward(torch.randn_like(out))


def precompile(args) -> int:
    try:
        import torch
    except ImportError:
        print("precompile needs torch (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("precompile needs a CUDA GPU: kernels are compiled for the GPU they run on",
              file=sys.stderr)
        return 2
    from .attention import attention
    if kernel_cache.kernel_cache_dir() is None:
        print(f"the kernel cache is off ({kernel_cache.ENV_VAR} is empty): nothing would be "
              "kept", file=sys.stderr)
        return 2
    compiled = []

    class Count(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("compiled "):
                compiled.append(record.getMessage())

    log = logging.getLogger("ioaware.kernels")
    handler = Count(level=logging.INFO)
    log.addHandler(handler)
    log.setLevel(min(log.level or logging.INFO, logging.INFO))
    configs = list(_configurations(args.dtype, args.head_dim, args.decode))
    print(f"kernel cache: {kernel_cache.kernel_cache_dir()}")
    t_all = time.perf_counter()
    try:
        for i, (label, c) in enumerate(configs, 1):
            before = len(compiled)
            t0 = time.perf_counter()
            _run(torch, attention, c, backward=not args.forward_only)
            torch.cuda.synchronize()
            n = len(compiled) - before
            what = f"compiled {n} kernel{'s' * (n != 1)}" if n else "loaded"
            print(f"[{i:>{len(str(len(configs)))}}/{len(configs)}] {label}: {what}, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        log.removeHandler(handler)
    print(f"{len(compiled)} kernels compiled in {time.perf_counter() - t_all:.0f} s")
    return 0


def cache(args) -> int:
    where = kernel_cache.kernel_cache_dir()
    if where is None:
        print(f"the kernel cache is off ({kernel_cache.ENV_VAR} is empty)")
        return 0
    files = sorted(where.glob("*.kernel")) if where.is_dir() else []
    size = sum(f.stat().st_size for f in files)
    print(f"{where}: {len(files)} compiled kernels, {size / 2**20:.1f} MiB")
    if args.clear:
        for f in files:
            f.unlink(missing_ok=True)
        print(f"deleted {len(files)} files")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ioaware", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("precompile", help="compile and store the common kernel configurations")
    p.add_argument("--dtype", nargs="+", choices=DTYPES, default=list(DTYPES))
    p.add_argument("--head-dim", nargs="+", type=int, choices=HEAD_DIMS, default=list(HEAD_DIMS))
    p.add_argument("--forward-only", action="store_true", help="skip the backward kernels")
    p.add_argument("--decode", action="store_true", help="add the split-KV decoding forward")
    p.set_defaults(run=precompile)
    c = sub.add_parser("cache", help="show (or --clear) the compiled-kernel cache")
    c.add_argument("--clear", action="store_true")
    c.set_defaults(run=cache)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
