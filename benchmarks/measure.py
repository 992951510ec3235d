"""Command ``measure``: the measured sweep of our kernels and the baselines, one record per
configuration. It times our kernels, PyTorch SDPA's backends and an unfused eager attention on
a CUDA GPU and writes a results file (``ioaware.results/1``, validated by
`sim.results.load_results`, with provenance).

Our kernels (``kernel: "ioaware-numba"``) run one family per record (``variant``: "simt", the
CUDA-core kernels; "mma", tensor-core float16/bfloat16; "tf32", 3xTF32 tensor-core float32;
"wgmma", the Hopper float16/bfloat16 forward and backward),
pinned by a `kernels.KernelConfig` (`kernel_config`) with the record's tiles; the baselines are
SDPA's FLASH, EFFICIENT, CUDNN and MATH backends and eager attention (matmul, scale, mask,
softmax, matmul).

How a configuration is timed (`time_config`):

* inputs: ``n_sets`` independent sets of (q, k, v, dout), rotated from run to run; ``n_sets`` is
  chosen so that the bytes touched between two uses of one set are at least twice the L2 size
  (`rotation_sets`), so no run finds its inputs in the L2 left over from an earlier one;
* warm-up runs first (compilation, cuDNN plans, allocator growth stay out of the numbers);
* each run is bracketed by CUDA events after a device-side sleep that keeps the GPU busy while
  the host enqueues the run (``"device"`` timing of `benchmarks.common`: host time not timed);
* ``time_ms`` is the median of ``repeats`` (>= 20) runs, ``time_ms_p10``/``time_ms_p90`` the 10th
  and 90th percentiles;
* ``peak_extra_bytes``: ``torch.cuda.max_memory_allocated()`` during one run minus the memory
  allocated before it (inputs, and for a backward pass the forward's outputs or autograd graph,
  already allocated), i.e. what the run itself adds: outputs, workspaces, intermediates;
* ``check_rel_err``: our forward's relative L2 error against SDPA in float32 (a guard that what
  is timed computes attention).

Hardware counters (DRAM, L2, global load/store bytes, executed FLOPs) are added afterwards by
``python -m benchmarks ncu RESULTS``, for the records of every kernel alike (ours, each SDPA
backend, eager: all launches of the record's call, `benchmarks.ncu.profiled_call`); until then
they are null. The sweep is resumable: with
``resume=True`` the configurations already in the output file are skipped, and the file is
rewritten after every configuration.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

from .common import (SCHEMA, SDPA_BACKENDS, SLEEP_CYCLES, command_line, event_ms, provenance,
                     sdpa_context, summarize_times, torch_dtype, write_json)

#: Kernels the harness can time, and the `sim` schedule that models each.
KERNELS = ("ioaware-numba", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "eager")
SCHEDULE_OF_KERNEL = {
    "ioaware-numba": "flash2",
    "sdpa-flash": "flash2",       # FlashAttention-2 (Dao), outer loop over Q tiles
    "sdpa-efficient": "flash2",   # xFormers/CUTLASS memory-efficient: Q tiles outer, K/V streamed
    "sdpa-cudnn": "flash2",       # cuDNN fused flash attention
    "sdpa-math": "naive",         # ATen composite: S and P materialised in global memory
    "eager": "naive",             # matmul, scale, mask, softmax, matmul as separate kernels
}
assert set(SDPA_BACKENDS) <= set(KERNELS)
PASSES = ("fwd", "bwd", "fwd+bwd")
DTYPES = ("fp32", "fp16", "bf16")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
#: Our kernel families (`kernels.FAMILY_NAMES`), as a record's ``variant``.
VARIANTS = ("simt", "mma", "tf32", "wgmma")
#: Input dtypes of each tensor-core family, and the head dims they run.
VARIANT_DTYPES = {"mma": ("fp16", "bf16"), "tf32": ("fp32",), "wgmma": ("fp16", "bf16")}
#: Passes of each tensor-core family.
VARIANT_PASSES = {"mma": ("fwd", "bwd"), "tf32": ("fwd", "bwd"), "wgmma": ("fwd", "bwd")}
VARIANT_HEAD_DIMS = (64, 128)
#: Threads per block the CUDA-core kernels aim their micro-tiles at on a GPU
#: (`kernels.simt_fwd.target_threads`).
SIMT_TARGET_THREADS = 128

#: Fields that identify a configuration (a record's key for resuming and joining).
KEY_FIELDS = ("kernel", "variant", "pass", "dtype", "batch", "heads", "heads_kv", "seq_len_q",
              "seq_len_k", "head_dim", "causal", "block_q", "block_k")
#: Measured fields of a record (null = not measured).
TIME_FIELDS = ("time_ms", "time_ms_p10", "time_ms_p90", "peak_extra_bytes")
COUNTER_FIELDS = ("dram_read_bytes", "dram_write_bytes", "l2_bytes", "global_load_bytes",
                  "global_store_bytes", "flops_executed")

DEFAULT_L2_BYTES = 50 * 1024 * 1024
MIN_REPEATS = 20


# ------------------------------------------------------------------------------------------------
# configurations (pure: no GPU needed)
# ------------------------------------------------------------------------------------------------

def _as_int(cfg: dict, name: str, minimum: int = 1) -> int:
    val = cfg.get(name)
    if isinstance(val, bool) or not isinstance(val, int):
        raise TypeError(f"config field {name!r} must be an int, got {val!r}")
    if val < minimum:
        raise ValueError(f"config field {name!r} must be >= {minimum}, got {val}")
    return val


def simt_forward_tiles(head_dim: int, block_q: int, block_k: int) -> tuple[int, int]:
    """The per-thread micro-tile (tm, tn) of the CUDA-core forward for a block size on a GPU:
    the tuned `kernels.config.FWD_TILES`, else `kernels.config.choose_tiles`."""
    from kernels.config import FWD_TILES, choose_tiles
    tiles = FWD_TILES.get((head_dim, block_q, block_k))
    if tiles is None:
        t = choose_tiles(block_q, block_k, head_dim, SIMT_TARGET_THREADS)
        tiles = (t.tm, t.tn)
    return int(tiles[0]), int(tiles[1])


def default_blocks(cfg: dict) -> tuple[int, int] | tuple[None, None]:
    """The (block_q, block_k) our kernel runs when none are given; for a tensor-core backward
    its dQ kernel's (query rows, keys per stage); (None, None) for the other kernels."""
    if cfg["kernel"] != "ioaware-numba":
        return None, None
    variant, d = cfg.get("variant"), cfg["head_dim"]
    if variant == "wgmma":
        if cfg["pass"] != "fwd":
            from sim.plans.wgmma_bwd import wgmma_bwd_default_tiles
            return tuple(int(x) for x in wgmma_bwd_default_tiles(d)["dq"])
        from sim.plans.wgmma_fwd import wgmma_default_blocks
        return tuple(int(x) for x in wgmma_default_blocks(d, bool(cfg.get("causal")),
                                                          cfg.get("seq_len_q")))
    if variant == "mma" or variant == "tf32":
        from kernels import mma_bwd, mma_fwd, tf32_bwd, tf32_fwd
        if cfg["pass"] == "fwd":
            blocks = (mma_fwd.default_blocks(d, bool(cfg.get("causal"))) if variant == "mma"
                      else tf32_fwd.default_blocks(d))
            return tuple(int(x) for x in blocks)
        mod = mma_bwd if variant == "mma" else tf32_bwd
        return tuple(int(x) for x in mod.default_tiles(d)["dq"])
    from kernels.config import default_blocks as simt_default
    return simt_default(d, cfg["pass"] == "bwd", False)


def normalize_config(cfg: dict) -> dict:
    """Check one configuration and fill in its defaults; returns a new dict with every
    `KEY_FIELDS` entry. Raises ValueError/TypeError naming the field on bad input.

    Accepted keys: ``kernel`` (one of `KERNELS`), ``pass`` (`PASSES`), ``dtype`` (`DTYPES`),
    ``batch``, ``heads``, ``heads_kv`` (default heads), ``seq_len_q``, ``seq_len_k`` (default
    seq_len_q), ``head_dim``, ``causal`` (default False), ``block_q``/``block_k`` (our kernel
    only; None = its default), ``variant`` (our kernel only: the family, `VARIANTS`, default
    "simt"; a tensor-core family runs pass "fwd" or "bwd" with its `VARIANT_DTYPES` and
    `VARIANT_HEAD_DIMS`, its backward at its own tiles).
    """
    if not isinstance(cfg, dict):
        raise TypeError(f"a configuration must be a dict, got {type(cfg).__name__}")
    out = dict(cfg)
    if out.get("kernel") not in KERNELS:
        raise ValueError(f"config field 'kernel' must be one of {KERNELS}, got {out.get('kernel')!r}")
    if out.get("pass") not in PASSES:
        raise ValueError(f"config field 'pass' must be one of {PASSES}, got {out.get('pass')!r}")
    if out.get("dtype") not in DTYPES:
        raise ValueError(f"config field 'dtype' must be one of {DTYPES}, got {out.get('dtype')!r}")
    for name in ("batch", "heads", "seq_len_q", "head_dim"):
        _as_int(out, name)
    out.setdefault("heads_kv", out["heads"])
    out.setdefault("seq_len_k", out["seq_len_q"])
    _as_int(out, "heads_kv")
    _as_int(out, "seq_len_k")
    if out["heads"] % out["heads_kv"]:
        raise ValueError(f"config field 'heads' ({out['heads']}) must be a multiple of "
                         f"'heads_kv' ({out['heads_kv']})")
    if not isinstance(out.get("causal", False), bool):
        raise TypeError(f"config field 'causal' must be a bool, got {out['causal']!r}")
    out["causal"] = out.get("causal", False)
    if out["kernel"] == "ioaware-numba":
        var = out["variant"] = out.get("variant") or "simt"
        if var not in VARIANTS:
            raise ValueError(f"config field 'variant' must be one of {VARIANTS}, got {var!r}")
        if var in VARIANT_DTYPES and (out["pass"] not in VARIANT_PASSES[var]
                                      or out["dtype"] not in VARIANT_DTYPES[var]
                                      or out["head_dim"] not in VARIANT_HEAD_DIMS):
            raise ValueError(f"variant {var!r} (tensor cores) runs pass "
                             f"{' or '.join(map(repr, VARIANT_PASSES[var]))} with dtype "
                             f"{' or '.join(VARIANT_DTYPES[var])} and head_dim "
                             f"{' or '.join(map(str, VARIANT_HEAD_DIMS))}, got pass={out['pass']!r}, "
                             f"dtype={out['dtype']!r}, head_dim={out['head_dim']}")
        if (var in VARIANT_DTYPES and out["pass"] == "bwd" and out.get("block_q") is not None
                and (out["block_q"], out.get("block_k")) != default_blocks(out)):
            raise ValueError(f"variant {var!r} backward runs its own tiles {default_blocks(out)} "
                             f"(its dQ kernel's); got block_q={out['block_q']}, "
                             f"block_k={out.get('block_k')}")
        bq, bk = out.get("block_q"), out.get("block_k")
        if (bq is None) != (bk is None):
            raise ValueError("give both block_q and block_k, or neither (the kernel's default)")
        if bq is None:
            bq, bk = default_blocks(out)
        out["block_q"] = _as_int({"block_q": bq}, "block_q")
        out["block_k"] = _as_int({"block_k": bk}, "block_k")
    else:
        if out.get("block_q") is not None or out.get("block_k") is not None:
            raise ValueError(f"block_q/block_k apply to kernel 'ioaware-numba' only, not {out['kernel']!r}")
        if out.get("variant") is not None:
            raise ValueError("config field 'variant' applies to kernel 'ioaware-numba' only")
        out["block_q"] = out["block_k"] = out["variant"] = None
    out["schedule"] = SCHEDULE_OF_KERNEL[out["kernel"]]
    return out


def config_key(cfg: dict) -> tuple:
    """The identity of a (normalized) configuration or record: the values of `KEY_FIELDS`."""
    return tuple(cfg.get(f) for f in KEY_FIELDS)


def unsupported_reason(cfg: dict) -> str | None:
    """Why a normalized configuration cannot run (known before running it), or None."""
    k, dt, d = cfg["kernel"], cfg["dtype"], cfg["head_dim"]
    if k in ("sdpa-flash", "sdpa-cudnn") and dt == "fp32":
        return f"{k} supports fp16/bf16 only"
    if k == "sdpa-flash" and d > 256:
        return "sdpa-flash supports head_dim <= 256"
    if k == "ioaware-numba" and cfg["variant"] == "simt":
        from kernels.config import (STATIC_SMEM_LIMIT_BYTES, TileConfig, choose_tiles,
                                    dkdv_smem_bytes, fwd_smem_bytes)
        bq, bk = cfg["block_q"], cfg["block_k"]
        need = []
        try:
            if cfg["pass"] in ("fwd", "fwd+bwd"):
                tile = TileConfig(bq, bk, *simt_forward_tiles(d, bq, bk))
                tile.validate(d)
                need.append(("forward", fwd_smem_bytes(tile, d)))
            if cfg["pass"] in ("bwd", "fwd+bwd"):
                fb = default_blocks(dict(cfg, **{"pass": "bwd"})) if cfg["pass"] == "fwd+bwd" else (bq, bk)
                tile = choose_tiles(fb[1], fb[0], d, SIMT_TARGET_THREADS)
                tile.validate(d)
                need.append(("backward dK/dV", dkdv_smem_bytes(tile, d)))
        except ValueError as exc:
            return str(exc)
        for what, nbytes in need:
            if nbytes > STATIC_SMEM_LIMIT_BYTES:
                return (f"{what} tile {bq}x{bk} at head_dim={d} needs {nbytes} B of shared memory "
                        f"> {STATIC_SMEM_LIMIT_BYTES} B")
    return None


def expand_grid(*, kernels: Iterable[str], seq_lens: Iterable[int], head_dims: Iterable[int],
                dtypes: Iterable[str], causal: Iterable[bool], passes: Iterable[str],
                heads: int = 16, tokens: int | None = None, batch: int | None = None,
                blocks: dict | None = None, variants: Iterable[str] = ("simt",)) -> list[dict]:
    """The cross product of a sweep's choices as normalized configurations (unsupported ones
    dropped; see `unsupported_reason`).

    Batch: ``batch`` if given, else ``max(1, tokens // seq_len)`` (constant work per N), else 1.
    ``blocks``: {(head_dim, pass): [(block_q, block_k), ...]} for our CUDA-core kernels; a
    missing entry means the kernel's default only. ``variants`` applies to our kernel (a
    tensor-core family is added only where it runs: `VARIANT_DTYPES`, `VARIANT_HEAD_DIMS`,
    forward or backward).
    """
    out, seen = [], set()
    for n in seq_lens:
        b = batch if batch is not None else (max(1, int(tokens) // int(n)) if tokens else 1)
        for d in head_dims:
            for dt in dtypes:
                for c in causal:
                    for p in passes:
                        for k in kernels:
                            base = {"kernel": k, "pass": p, "dtype": dt, "batch": int(b),
                                    "heads": int(heads), "seq_len_q": int(n), "head_dim": int(d),
                                    "causal": bool(c)}
                            cands = []
                            if k == "ioaware-numba":
                                for var in variants:
                                    if var in VARIANT_DTYPES and (
                                            p not in VARIANT_PASSES[var] or dt not in VARIANT_DTYPES[var]
                                            or int(d) not in VARIANT_HEAD_DIMS):
                                        continue
                                    bl = (blocks or {}).get((int(d), p)) if var == "simt" else None
                                    for bq_bk in (bl or [(None, None)]):
                                        cands.append(dict(base, variant=var, block_q=bq_bk[0],
                                                          block_k=bq_bk[1]))
                            else:
                                cands.append(base)
                            for cand in cands:
                                cfg = normalize_config(cand)
                                key = config_key(cfg)
                                if key in seen or unsupported_reason(cfg):
                                    continue
                                seen.add(key)
                                out.append(cfg)
    return out


def pending_configs(configs: list[dict], existing_records: list[dict]) -> list[dict]:
    """The configurations whose key is not among ``existing_records`` (resume)."""
    done = {config_key(r) for r in existing_records}
    return [c for c in configs if config_key(c) not in done]


def rotation_sets(set_bytes: int, l2_bytes: int, min_sets: int = 2, max_sets: int = 64) -> int:
    """How many input sets to rotate so that between two uses of one set at least ``2 *
    l2_bytes`` of other inputs were touched: ``(n - 1) * set_bytes >= 2 * l2_bytes``."""
    if set_bytes <= 0:
        raise ValueError(f"set_bytes must be > 0, got {set_bytes}")
    need = 1 + math.ceil(2 * l2_bytes / set_bytes)
    return int(min(max_sets, max(min_sets, need)))


def set_bytes(cfg: dict) -> int:
    """Bytes of one input set (q, k, v, dout) of a configuration."""
    e = DTYPE_BYTES[cfg["dtype"]]
    q = cfg["batch"] * cfg["heads"] * cfg["seq_len_q"] * cfg["head_dim"]
    kv = cfg["batch"] * cfg["heads_kv"] * cfg["seq_len_k"] * cfg["head_dim"]
    return e * (2 * q + 2 * kv)


def empty_record(cfg: dict) -> dict:
    """A results record for a normalized configuration with every measured field null; a
    tensor-core record also names its launch order (``launch_head_group``, the default of its
    pass: `kernels.tile_scheduler.head_group`), a tensor-core backward its ``dq_mode``
    (`kernels.mma_bwd.dq_mode`, `kernels.tf32_bwd.dq_mode`: "kernel" or "atomic"), and the
    wgmma forward its ``pingpong`` and ``overlap`` (`wgmma_schedule`; the wgmma backward has
    one schedule), the wgmma backward its default ``dq_tile``, ``kv_tile`` and
    ``launch_balanced`` (`sim.plans.wgmma_bwd.record_fields`)."""
    rec = {f: cfg[f] for f in ("kernel", "schedule", "pass", "dtype", "batch", "heads",
                               "heads_kv", "seq_len_q", "seq_len_k", "head_dim", "causal",
                               "block_q", "block_k")}
    for f in TIME_FIELDS + COUNTER_FIELDS:
        rec[f] = None
    rec["variant"] = cfg.get("variant")
    if cfg.get("variant") in VARIANT_DTYPES:
        from kernels import tile_scheduler
        rec["launch_head_group"] = tile_scheduler.head_group(
            None, cfg["causal"], "fwd" if cfg["pass"] == "fwd" else "bwd")
    if cfg.get("variant") in ("mma", "tf32") and cfg["pass"] != "fwd":
        from kernels import KernelConfig, mma_bwd, tf32_bwd
        module = mma_bwd if cfg["variant"] == "mma" else tf32_bwd
        rec["dq_mode"] = module.dq_mode(None, KernelConfig(family=cfg["variant"]),
                                         head_dim=cfg["head_dim"])
    if cfg.get("variant") == "wgmma" and cfg["pass"] == "fwd":
        rec.update(wgmma_schedule(cfg))
    if cfg.get("variant") == "wgmma" and cfg["pass"] != "fwd":
        from sim.plans.wgmma_bwd import record_fields
        rec.update(record_fields(cfg["head_dim"], cfg["seq_len_q"]))
    return rec


def new_results(prov: dict) -> dict:
    return {"schema": SCHEMA, "provenance": prov, "records": [], "skipped": []}


def load_existing(path: str | Path) -> dict | None:
    """The results object in ``path`` if the file exists (for resuming), else None."""
    path = Path(path)
    if not path.exists():
        return None
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("records"), list):
        raise ValueError(f"{path} is not a results file of schema {SCHEMA!r}; move it away or "
                         f"pass resume=False")
    data.setdefault("skipped", [])
    return data


# ------------------------------------------------------------------------------------------------
# running one configuration (needs torch with CUDA)
# ------------------------------------------------------------------------------------------------

def make_input_set(torch, cfg, device, gen) -> dict:
    """One set of random inputs (q, k, v, dout) of a configuration, on ``device``."""
    dt = torch_dtype(torch, cfg["dtype"])
    B, H, Hk = cfg["batch"], cfg["heads"], cfg["heads_kv"]
    Nq, Nk, d = cfg["seq_len_q"], cfg["seq_len_k"], cfg["head_dim"]

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(dt)
    return {"q": rnd(B, H, Nq, d), "k": rnd(B, Hk, Nk, d), "v": rnd(B, Hk, Nk, d),
            "dout": rnd(B, H, Nq, d)}


def _eager_attention(torch, q, k, v, causal, scale):
    """Unfused attention as written in plain PyTorch (nanoGPT's slow path): one kernel for
    Q K^T, one for the scale, one for the causal mask, one softmax, one for P V."""
    if k.shape[1] != q.shape[1]:
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    att = (q @ k.transpose(-2, -1)) * scale
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        keep = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril()
        att = att.masked_fill(~keep, float("-inf"))
    att = torch.softmax(att, dim=-1)
    return att @ v


def kernel_config(cfg: dict, pass_: str):
    """The `kernels.KernelConfig` that runs ``pass_`` ("fwd" or "bwd") of a configuration of our
    kernel: its family, and for the forward its tiles (the CUDA-core forward also its
    micro-tile); the CUDA-core backward takes the record's tiles when the record is of the
    backward; the tensor-core backwards choose their own."""
    from kernels import KernelConfig
    fam, bq, bk = cfg["variant"], cfg["block_q"], cfg["block_k"]
    if pass_ == "fwd":
        micro = simt_forward_tiles(cfg["head_dim"], bq, bk) if fam == "simt" else None
        return KernelConfig(family=fam, block_q=bq, block_k=bk, micro_tile=micro)
    if fam == "simt" and cfg["pass"] == "bwd":
        return KernelConfig(family=fam, block_q=bq, block_k=bk)
    return KernelConfig(family=fam)


def build_runner(cfg: dict, sets: list[dict]) -> Callable[[int], object]:
    """``run(i)`` runs the configuration's pass once on input set ``i``; for backward passes the
    forward's outputs (our kernel) or autograd graphs (PyTorch) are prepared here, outside the
    timed region, and so are our kernel's validated problems."""
    import torch
    import torch.nn.functional as F

    from .common import attention_problem

    kernel, p, causal = cfg["kernel"], cfg["pass"], cfg["causal"]
    scale = 1.0 / math.sqrt(cfg["head_dim"])

    if kernel == "ioaware-numba":
        import kernels
        problems = [attention_problem(s["q"], s["k"], s["v"], causal=causal, scale=scale)
                    for s in sets]
        fwd_cfg, bwd_cfg = kernel_config(cfg, "fwd"), kernel_config(cfg, "bwd")
        if p == "fwd":
            return lambda i: kernels.forward(problems[i], fwd_cfg)
        if p == "bwd":
            prepare = kernels.KernelConfig(family=cfg["variant"])   # its forward's defaults
            for s, pb in zip(sets, problems):
                s["out"], s["lse"] = kernels.forward(pb, prepare)

            def run(i):
                s = sets[i]
                return kernels.backward(problems[i], s["out"], s["lse"], s["dout"], bwd_cfg)
            return run

        def run(i):  # fwd+bwd: the forward at the record's tiles, the backward at its default
            out, lse = kernels.forward(problems[i], fwd_cfg)
            return kernels.backward(problems[i], out, lse, sets[i]["dout"], bwd_cfg)
        return run

    def attn(q, k, v):
        if kernel == "eager":
            return _eager_attention(torch, q, k, v, causal, scale)
        kw = {"enable_gqa": True} if cfg["heads_kv"] != cfg["heads"] else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, **kw)

    if p == "fwd":
        def run(i):
            s = sets[i]
            with torch.no_grad():
                return attn(s["q"], s["k"], s["v"])
        return run
    for s in sets:
        for name in ("q", "k", "v"):
            s[name] = s[name].detach().requires_grad_(True)
    if p == "bwd":
        for s in sets:
            s["out"] = attn(s["q"], s["k"], s["v"])

        def run(i):
            s = sets[i]
            return torch.autograd.grad(s["out"], (s["q"], s["k"], s["v"]), s["dout"],
                                       retain_graph=True)
        return run

    def run(i):
        s = sets[i]
        out = attn(s["q"], s["k"], s["v"])
        return torch.autograd.grad(out, (s["q"], s["k"], s["v"]), s["dout"])
    return run


def _check_forward(cfg, sets) -> float | None:
    """Relative L2 error of our kernel's forward output against PyTorch SDPA (float32) on the
    first input set."""
    if cfg["kernel"] != "ioaware-numba" or cfg["pass"] == "bwd":
        return None
    import torch.nn.functional as F

    import kernels

    from .common import attention_problem
    s = sets[0]
    scale = 1.0 / math.sqrt(cfg["head_dim"])
    pb = attention_problem(s["q"], s["k"], s["v"], causal=cfg["causal"], scale=scale)
    out = kernels.forward(pb, kernel_config(cfg, "fwd"))[0]
    q, k, v = (s[n].detach().float() for n in ("q", "k", "v"))
    kw = {"enable_gqa": True} if cfg["heads_kv"] != cfg["heads"] else {}
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=cfg["causal"], scale=scale, **kw)
    err = float((out.float() - ref).norm() / ref.norm())
    del out, ref
    return err


def time_config(cfg: dict, *, warmup: int = 3, repeats: int = 25, l2_bytes: int | None = None,
                seed: int = 0) -> dict:
    """Measure one normalized configuration on the current CUDA device; returns its record."""
    import torch

    if repeats < MIN_REPEATS:
        raise ValueError(f"repeats must be >= {MIN_REPEATS}, got {repeats}")
    device = torch.device("cuda")
    n_sets = rotation_sets(set_bytes(cfg), l2_bytes or _l2_bytes(torch))
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    rec = empty_record(cfg)
    sets = [make_input_set(torch, cfg, device, gen) for _ in range(n_sets)]
    with sdpa_context(cfg["kernel"]):
        rec["check_rel_err"] = _check_forward(cfg, sets)
        run = build_runner(cfg, sets)
        # -- peak extra memory of one run (also the first call: compilation, plans) --
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        res = run(0)
        torch.cuda.synchronize()
        rec["peak_extra_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        del res
        for i in range(warmup):
            run((i + 1) % n_sets)
        torch.cuda.synchronize()
        # -- timed runs, rotating input sets, each behind a device-side sleep --
        times = [event_ms(torch, lambda r=r: run((warmup + 1 + r) % n_sets), SLEEP_CYCLES)
                 for r in range(repeats)]
    rec["time_ms"], rec["time_ms_p10"], rec["time_ms_p90"] = summarize_times(times)
    rec["repeats"], rec["warmup"], rec["input_sets"], rec["timing"] = repeats, warmup, n_sets, "device"
    if cfg["kernel"] == "ioaware-numba" and cfg["variant"] == "simt" and cfg["pass"] != "bwd":
        rec["micro_tile"] = list(simt_forward_tiles(cfg["head_dim"], cfg["block_q"], cfg["block_k"]))
    sets = run = None         # free the inputs before empty_cache
    torch.cuda.empty_cache()
    return rec


def wgmma_schedule(cfg: dict) -> dict:
    """``{"pingpong", "overlap", "persistent"}`` the wgmma forward runs for a configuration (its plan's
    defaults at the configuration's tiles), recorded so that `sim.plans.plans_for_record` prices
    the kernel that ran (`sim.plans.wgmma_fwd.record_schedule`: serial when absent)."""
    from sim.plans import plan_for
    from sim.plans.wgmma_fwd import record_schedule
    from sim.workload import Workload
    w = Workload.from_record(dict(cfg, **{"pass": "fwd"}))
    return record_schedule(plan_for("wgmma", "fwd", w, block_q=cfg.get("block_q"),
                                    block_k=cfg.get("block_k")).config)


def _l2_bytes(torch) -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or DEFAULT_L2_BYTES)


def _device_extra(torch) -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"sm_count": int(props.multi_processor_count), "l2_bytes_device": _l2_bytes(torch),
            "memory_bytes": int(props.total_memory),
            "compute_capability": f"{props.major}.{props.minor}"}


# ------------------------------------------------------------------------------------------------
# the sweep
# ------------------------------------------------------------------------------------------------

def run_sweep(configs: list[dict], progress: Callable | None = None, out_path: str | Path | None = None,
              resume: bool = True, *, warmup: int = 3, repeats: int = 25,
              command: str | None = None, log: Callable[[str], None] | None = None) -> dict:
    """Measure every configuration and return the results object (``ioaware.results/1``).

    ``configs``: dicts as accepted by `normalize_config`; a config without ``kernel`` stands
    for every kernel in `KERNELS` (the dashboard passes such configs). ``progress(done, total,
    record_or_None)`` is called after each configuration (a text progress line is printed to
    stderr when ``log`` is None). ``out_path``: the results file, rewritten after every
    configuration; with ``resume`` the configurations already in it are skipped. A configuration
    that fails at run time is recorded under the file's ``skipped`` list with its error, not
    raised. ``command``: the provenance's command line (default: this process's).
    """
    norm = []
    for cfg in configs:
        if "kernel" not in cfg:
            for k in KERNELS:
                c = normalize_config(dict(cfg, kernel=k))
                if not unsupported_reason(c):
                    norm.append(c)
        else:
            norm.append(normalize_config(cfg))
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("benchmarks.measure needs a CUDA GPU (torch.cuda.is_available() is False)")
    command = command or f"benchmarks.measure.run_sweep from: {shlex.join(sys.argv)}"
    prov = provenance(command, extra=_device_extra(torch))
    results = None
    if out_path is not None and resume:
        results = load_existing(out_path)
        if results is not None and results["provenance"].get("gpu") != prov["gpu"]:
            raise ValueError(f"{out_path} holds measurements from {results['provenance'].get('gpu')!r}, "
                             f"not this GPU ({prov['gpu']!r}); write to another file or resume=False")
    if results is None:
        results = new_results(prov)
    else:
        results["provenance"].setdefault("resumed", []).append(
            {"date": prov["date"], "command": command, "code_version": prov["code_version"],
             "kernels_sha": prov["kernels_sha"]})
    todo = pending_configs(norm, results["records"] + [s["config"] for s in results["skipped"]
                                                        if "config" in s])
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    total = len(todo)
    say(f"[measure] {len(norm)} configurations, {len(norm) - total} already in the results, "
        f"{total} to run on {prov['gpu']}")
    t_start = time.perf_counter()
    for i, cfg in enumerate(todo):
        reason = unsupported_reason(cfg)
        rec = None
        try:
            if reason:
                raise RuntimeError(reason)
            rec = time_config(cfg, warmup=warmup, repeats=repeats)
            rec["kernels_sha"] = prov["kernels_sha"]
            results["records"].append(rec)
        except Exception as exc:  # noqa: BLE001 - recorded, the sweep goes on
            results["skipped"].append({"config": {f: cfg.get(f) for f in KEY_FIELDS},
                                       "error": f"{type(exc).__name__}: {exc}"[:500]})
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                pass
        if out_path is not None:
            write_json(results, out_path)
        elapsed = time.perf_counter() - t_start
        if rec is not None:
            say(f"[measure {i + 1}/{total} {elapsed:6.0f}s] {describe(cfg)}: {rec['time_ms']:.3f} ms "
                f"(p10 {rec['time_ms_p10']:.3f}, p90 {rec['time_ms_p90']:.3f}), "
                f"peak extra {rec['peak_extra_bytes'] / 2**20:.1f} MiB")
        else:
            say(f"[measure {i + 1}/{total} {elapsed:6.0f}s] {describe(cfg)}: SKIPPED "
                f"{results['skipped'][-1]['error']}")
        if progress is not None:
            progress(i + 1, total, rec)
    return results


def describe(cfg: dict) -> str:
    """A configuration in one short line."""
    blk = f" {cfg['block_q']}x{cfg['block_k']}" if cfg.get("block_q") else ""
    var = f"/{cfg['variant']}" if cfg.get("variant") and cfg["variant"] != "simt" else ""
    return (f"{cfg['kernel']}{var} {cfg['pass']} {cfg['dtype']} B{cfg['batch']} H{cfg['heads']} "
            f"N{cfg['seq_len_q']} d{cfg['head_dim']}{' causal' if cfg['causal'] else ''}{blk}")


# ------------------------------------------------------------------------------------------------
# the shipped sweep and the command line
# ------------------------------------------------------------------------------------------------

#: Block sizes of our CUDA-core kernels swept per (head_dim, pass): each fits 48 KiB of static
#: shared memory.
SWEEP_BLOCKS = {
    (64, "fwd"): [(64, 32), (32, 32), (64, 16), (16, 64)],
    (128, "fwd"): [(32, 16), (16, 32), (16, 16), (32, 8)],
    (64, "bwd"): [(32, 32), (16, 32), (32, 16)],
    (128, "bwd"): [(16, 16), (8, 16), (16, 8)],
}
#: The tensor-core forward's block sizes in the shipped sweeps (its defaults then; the defaults
#: now depend on causality: `kernels.mma_fwd.default_blocks`).
SHIPPED_MMA_FWD_BLOCKS = {64: (128, 32), 128: (64, 32)}
#: The launch order the shipped sweeps' tensor-core records ran: tiles first (they predate
#: launch orders; `kernels.tile_scheduler`).
SHIPPED_HEAD_GROUP = 1


def standard_sweep(*, seq_lens=(512, 1024, 2048, 4096, 8192), baseline_seq_lens=(1024, 4096),
                   head_dims=(64, 128), heads=16, tokens=8192,
                   tensor_core_variants=()) -> list[dict]:
    """The sweep shipped in ``results/``: our CUDA-core kernels (float32, every block size of
    `SWEEP_BLOCKS`; float16 at their defaults), the tensor-core forward (float16) and every
    baseline at the same (N, d), causal on and off, forward and backward; batch = tokens // N.
    ``tensor_core_variants`` ("mma", "tf32") adds those families' other passes at the
    baselines' N (the shipped files predate them)."""
    common = dict(heads=heads, tokens=tokens, causal=(False, True), head_dims=head_dims)
    cfgs = expand_grid(kernels=["ioaware-numba"], seq_lens=seq_lens, dtypes=["fp32"],
                       passes=["fwd", "bwd"], blocks=SWEEP_BLOCKS, **common)
    cfgs += [c for c in expand_grid(kernels=["ioaware-numba"], seq_lens=baseline_seq_lens,
                                    dtypes=["fp16"], passes=["fwd", "bwd"],
                                    variants=("simt", "mma"), **common)
             if c["variant"] == "simt" or c["pass"] == "fwd"]
    for c in cfgs:            # the tensor-core forward at the blocks it had when shipped
        if c.get("variant") == "mma" and c["pass"] == "fwd":
            c["block_q"], c["block_k"] = SHIPPED_MMA_FWD_BLOCKS[c["head_dim"]]
    for var in tensor_core_variants:
        cfgs += [c for c in expand_grid(kernels=["ioaware-numba"], seq_lens=baseline_seq_lens,
                                        dtypes=list(VARIANT_DTYPES[var][:1]), passes=["fwd", "bwd"],
                                        variants=(var,), **common)
                 if c["variant"] == var and not (var == "mma" and c["pass"] == "fwd")]
    cfgs += expand_grid(kernels=[k for k in KERNELS if k != "ioaware-numba"],
                        seq_lens=baseline_seq_lens, dtypes=["fp32", "fp16"],
                        passes=["fwd", "bwd"], **common)
    return cfgs


def _parse_list(text, conv=int):
    return [conv(x) for x in str(text).split(",") if x.strip()]


def _parse_bool_list(text):
    vals = {"on": [True], "off": [False], "both": [False, True], "true": [True], "false": [False]}
    if text.lower() not in vals:
        raise argparse.ArgumentTypeError(f"--causal must be on, off or both, got {text!r}")
    return vals[text.lower()]


def _parse_blocks(text):
    """'64x32,32x32' -> [(64, 32), (32, 32)]."""
    out = []
    for part in _parse_list(text, str):
        try:
            a, b = part.lower().split("x")
            out.append((int(a), int(b)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--blocks entries must look like 64x32, got {part!r}")
    return out


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks measure",
        description="Time our attention kernels and PyTorch's SDPA backends (and eager attention) "
                    "on this machine's CUDA GPU and write a results file (ioaware.results/1). "
                    "Add hardware counters afterwards with `python -m benchmarks ncu RESULTS`.")
    ap.add_argument("--out", required=True, help="results file to write (resumed if it exists)")
    ap.add_argument("--standard", action="store_true",
                    help="the shipped sweep (see standard_sweep); grid options other than "
                         "--families are ignored")
    ap.add_argument("--kernels", default=",".join(KERNELS), help="comma list of %s" % ", ".join(KERNELS))
    ap.add_argument("--families", default="simt",
                    help="comma list of our kernel families to time: simt, mma, tf32, wgmma "
                         "(a tensor-core family where it runs: forward and backward, d 64/128; "
                         "wgmma: the Hopper forward and backward)")
    ap.add_argument("--seq-lens", default="1024,4096", help="comma list of N (Nq = Nk)")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="fp32,fp16", help="comma list of fp32, fp16, bf16")
    ap.add_argument("--causal", default="both", type=_parse_bool_list, help="on, off or both")
    ap.add_argument("--passes", default="fwd,bwd", help="comma list of fwd, bwd, fwd+bwd")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=None, help="batch (default: tokens // N)")
    ap.add_argument("--tokens", type=int, default=8192, help="batch = max(1, tokens // N)")
    ap.add_argument("--blocks", type=_parse_blocks, default=None,
                    help="block sizes of the CUDA-core kernels, e.g. 64x32,32x32 (default: theirs)")
    ap.add_argument("--repeats", type=int, default=25, help=f"timed runs (>= {MIN_REPEATS})")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-resume", action="store_true", help="start the file afresh")
    ap.add_argument("--limit", type=int, default=None, help="run at most this many configurations")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    return ap


def configs_from_args(args) -> list[dict]:
    families = _parse_list(args.families, str)
    for f in families:
        if f not in VARIANTS:
            raise SystemExit(f"--families: unknown family {f!r}; choose from {', '.join(VARIANTS)}")
    if args.standard:
        return standard_sweep(tensor_core_variants=tuple(f for f in families if f != "simt"))
    kernels = _parse_list(args.kernels, str)
    for k in kernels:
        if k not in KERNELS:
            raise SystemExit(f"--kernels: unknown kernel {k!r}; choose from {', '.join(KERNELS)}")
    head_dims = _parse_list(args.head_dims)
    passes = _parse_list(args.passes, str)
    blocks = {(d, p): args.blocks for d in head_dims for p in passes} if args.blocks else None
    return expand_grid(kernels=kernels, seq_lens=_parse_list(args.seq_lens), head_dims=head_dims,
                       dtypes=_parse_list(args.dtypes, str), causal=args.causal, passes=passes,
                       heads=args.heads, tokens=args.tokens, batch=args.batch, blocks=blocks,
                       variants=families)


def main(argv=None) -> int:
    argv = list(argv or [])
    args = build_arg_parser().parse_args(argv)
    if args.repeats < MIN_REPEATS:
        raise SystemExit(f"--repeats must be >= {MIN_REPEATS}, got {args.repeats}")
    cfgs = configs_from_args(args)
    if args.list:
        for c in cfgs:
            print(describe(c))
        print(f"{len(cfgs)} configurations")
        return 0
    if args.limit is not None:
        cfgs = cfgs[:args.limit]
    results = run_sweep(cfgs, out_path=args.out, resume=not args.no_resume, warmup=args.warmup,
                        repeats=args.repeats, command=command_line("measure", argv))
    print(f"wrote {len(results['records'])} records ({len(results['skipped'])} skipped) to {args.out}")
    return 0
