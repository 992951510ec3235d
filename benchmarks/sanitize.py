"""Command ``sanitize``: one small case per kernel family, forward and backward, for
compute-sanitizer.

    compute-sanitizer --tool memcheck --report-api-errors no python -m benchmarks sanitize [FAMILY ...]

FAMILY is any of ``simt``, ``mma``, ``tf32``, ``split_kv``, ``wgmma``, ``wgmma_fp8`` (default:
all six on compute capability 9.0, the first four elsewhere), so that the
families can run as separate sanitizer processes side by side. ``wgmma`` (the Hopper forward,
compute capability 9.0) runs `WGMMA_CASES` (it takes no masks or dropout), the forward of each
case at the default configuration (128-row tiles: ping-pong and the intra-warpgroup overlap)
and at `WGMMA_SCHEDULES`: 128-row tiles serial and with the overlap alone, 64-row tiles with
the overlap (64-row tiles serial: the default at ``block_q`` = 64), 192-row tiles at d = 64,
then the Hopper backward (`kernels.wgmma_bwd`: its dQ and dK/dV kernels, and with dQ by
atomics its pre-pass, dK/dV kernel with the TMA reduction, and conversion); and a causal d = 64
forward on `WGMMA_WALK_HEADS`, more work items than the SMs, so that each persistent program
walks several (`run_wgmma_walk`).
``wgmma_fp8`` (the FP8 forward, `kernels.wgmma_fwd.forward_fp8`: V's transpose and the kernel)
runs d=128 with the same lengths and GQA, causal and not, on e4m3 inputs with descales, at the
default and at each of `WGMMA_SCHEDULES` but the 192-row one.
``split_kv`` (the decoding forward, `kernels.decode_fwd`: the split kernels, tensor-core and
CUDA-core, whose last program of each group merges the splits) runs
`DECODE_CASES`: 1 and 3 queries against 1000 keys, four query heads per KV head, per-sequence
cache lengths 1000, 0, 1 and 517 (and, once, a length past the cache: that row must come out
NaN, the others finite), three splits, full and with a bottom-right causal window, and once with
no lengths (the kernel that reads none). Each family (pinned by `kernels.KernelConfig`)
runs `CASES`: GQA (two query heads per key/value head) and lengths that are not multiples of
any tile (150 queries, 97 keys) throughout; causal at d=64; a boolean mask and dropout at
d=128; a block mask on 64 x 32 tiles, which the kernels read at finer tiles (the tensor-core
backward's 2-warp dK/dV blocks at d=128). Inputs are torch CUDA tensors (``--arrays torch``,
the default when torch has CUDA: launched in place on torch's stream) or NumPy arrays
(``--arrays numpy``: copied to the device and back), float16 for ``mma``, float32 otherwise;
the tensor-core backwards run with their dQ kernel and with dQ by atomics
(``KernelConfig.backward_dq``). Every output must be finite.
"""
from __future__ import annotations

import argparse

import numpy as np

from .common import attention_problem, first_sentence

FAMILIES = ("simt", "mma", "tf32", "split_kv", "wgmma", "wgmma_fp8")
FAMILY_DTYPE = {"simt": np.float32, "mma": np.float16, "tf32": np.float32, "wgmma": np.float16}
#: Families that are forwards only (their cases run no backward).
FORWARD_ONLY = ("wgmma_fp8", "split_kv")
#: Families that need compute capability 9.0.
HOPPER_ONLY = ("wgmma", "wgmma_fp8")
#: The decoding forward's cases: (head dim, queries, cache lengths, problem options).
DECODE_SEQ_K = 1000
DECODE_CASES = ((128, 1, (1000, 0, 1, 517), {}),
                (64, 3, (1000, 0, 1, 517), {"causal": "bottom_right", "window_size": (100, 0)}),
                (128, 2, (1000, 1001, 1, 517), {}),
                (128, 1, None, {}))
BATCH, HEADS_Q, HEADS_KV, SEQ_Q, SEQ_K = 2, 2, 1, 150, 97
#: (head dim, problem options) of each case; masks are drawn per case (`_case_inputs`).
CASES = ((64, {"causal": True}),
         (128, {"mask": 0.7, "dropout_p": 0.25, "seed": 3}),
         (128, {"block_mask": (64, 32, 0.6)}))
#: The wgmma forward's cases: causal at d=64, not causal at d=128 (both with tails), a sliding
#: window (bottom-right causal band, Nq != Nk) at d=128.
WGMMA_CASES = ((64, {"causal": True}), (128, {}),
               (128, {"causal": "bottom_right", "window_size": (40, 0)}))


def _case_inputs(rng, family, d, options, torch=None):
    """(q, k, v, dout, problem options) of one case as NumPy arrays or torch CUDA tensors."""
    dt = FAMILY_DTYPE[family]
    arrays = [rng.standard_normal(shape).astype(dt) for shape in (
        (BATCH, HEADS_Q, SEQ_Q, d), (BATCH, HEADS_KV, SEQ_K, d), (BATCH, HEADS_KV, SEQ_K, d),
        (BATCH, HEADS_Q, SEQ_Q, d))]
    kw = dict(options)
    if "mask" in kw:
        kw["mask"] = rng.random((BATCH, 1, SEQ_Q, SEQ_K)) < kw["mask"]
    if "block_mask" in kw:
        bq, bk, keep = kw.pop("block_mask")
        tiles = (1, HEADS_Q, -(-SEQ_Q // bq), -(-SEQ_K // bk))
        kw["block_mask"] = (rng.random(tiles) < keep, (bq, bk))
    if torch is not None:
        arrays = [torch.from_numpy(a).cuda() for a in arrays]
        if "mask" in kw:
            kw["mask"] = torch.from_numpy(kw["mask"]).cuda()
    return (*arrays, kw)


def run_fp8(torch, seed: int = 0) -> None:
    """The FP8 forward at d=128, causal and not, on the sanitizer's lengths (torch CUDA tensors);
    raises when an output is not finite."""
    if torch is None:
        raise SystemExit("wgmma_fp8 needs torch with CUDA (its inputs are float8_e4m3fn tensors)")
    from kernels.wgmma_fwd import forward_fp8
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((BATCH, HEADS_Q, SEQ_Q, 128), (BATCH, HEADS_KV, SEQ_K, 128),
              (BATCH, HEADS_KV, SEQ_K, 128))
    x8 = [torch.randn(s, device="cuda", generator=g).to(torch.float8_e4m3fn) for s in shapes]
    dq = torch.full((BATCH, HEADS_Q), 0.5, device="cuda")
    dkv = torch.full((BATCH, HEADS_KV), 0.5, device="cuda")
    for causal in (False, True):
        for schedule in ({}, *({"block_q": bq, "pingpong": pp, "overlap": ov}
                               for bq, pp, ov in WGMMA_SCHEDULES if bq != 192)):
            out, lse = forward_fp8(*x8, dq, dkv, dkv, causal=causal, **schedule)
            torch.cuda.synchronize()
            if not bool(torch.isfinite(out).all()):
                raise RuntimeError(f"wgmma_fp8 causal={causal} {schedule}: an output is not "
                                   f"finite")


def run_split_kv(torch=None, seed: int = 0) -> None:
    """`DECODE_CASES` on the decoding forward, each on both of its kernels where the GPU runs the
    tensor-core one (``KernelConfig.decode_unit``; float16; torch CUDA tensors with the lengths
    on the device when ``torch`` is given, else NumPy arrays); raises when a row with a valid
    length is not finite or a row with a length past the cache is not NaN."""
    import dataclasses

    import kernels
    from kernels import decode_fwd
    units = ("mma", "ffma") if decode_fwd.mma_available() else ("ffma",)
    rng = np.random.default_rng(seed)
    heads_q, heads_kv, seq_k = 4, 1, DECODE_SEQ_K
    for (d, nq, lengths, options), unit in ((c, u) for c in DECODE_CASES for u in units):
        config = kernels.KernelConfig(family="split_kv", num_splits=3, decode_unit=unit)
        batch = 2 if lengths is None else len(lengths)
        arrays = [rng.standard_normal(shape).astype(np.float16) for shape in (
            (batch, heads_q, nq, d), (batch, heads_kv, seq_k, d), (batch, heads_kv, seq_k, d))]
        if torch is not None:
            arrays = [torch.from_numpy(a).cuda() for a in arrays]
        pb = attention_problem(*arrays, **options)
        if lengths is not None:
            seqlens = np.array(lengths, np.int32)
            pb = dataclasses.replace(pb, cache_seqlens=(seqlens if torch is None
                                                        else torch.from_numpy(seqlens).cuda()))
        else:
            lengths = (seq_k,) * batch
        out, _ = kernels.forward(pb, config)
        if torch is not None:
            torch.cuda.synchronize()
            out = out.float().cpu().numpy()
        bad = np.array(lengths) > seq_k
        if not (np.isfinite(out[~bad]).all() and np.isnan(out[bad]).all()):
            raise RuntimeError(f"split_kv {unit} d={d} nq={nq} lengths={lengths}: a row with a valid "
                               f"length is not finite, or one past the cache is not NaN")


#: The ``wgmma`` schedules a case also runs: (block_q, pingpong, overlap).
WGMMA_SCHEDULES = ((128, False, False), (128, False, True), (64, False, True), (192, False, True))
#: The ``wgmma`` forward's case with more work items than an H100's or H200's 132 SMs, so that
#: its persistent programs walk two or more items each: (query heads, KV heads), at d = 64 and
#: the cases' lengths, causal, the default tiles and 192 x 128.
WGMMA_WALK_HEADS = (144, 16)


def run_family(family: str, torch=None, seed: int = 0) -> None:
    """`CASES` forward and backward on ``family`` (torch CUDA tensors when ``torch`` is given,
    else NumPy arrays); raises when an output is not finite."""
    if family == "wgmma_fp8":
        run_fp8(torch, seed)
        return
    if family == "split_kv":
        run_split_kv(torch, seed)
        return
    import kernels
    config = kernels.KernelConfig(family=family)
    rng = np.random.default_rng(seed)
    for d, options in (WGMMA_CASES if family == "wgmma" else CASES):
        q, k, v, dout, kw = _case_inputs(rng, family, d, options, torch)
        pb = attention_problem(q, k, v, **kw)
        out, lse = kernels.forward(pb, config)
        if family == "wgmma":        # and the other schedules
            for block_q, pingpong, overlap in WGMMA_SCHEDULES:
                if block_q == 192 and d != 64:
                    continue
                out, lse = kernels.forward(pb, kernels.KernelConfig(
                    family=family, block_q=block_q, pingpong=pingpong, overlap=overlap))
        grads = ()
        if family not in FORWARD_ONLY:       # the tensor-core backwards under both dQ modes
            modes = ("kernel", "atomic")
            grads = tuple(g for m in modes for g in kernels.backward(
                pb, out, lse, dout, kernels.KernelConfig(family=family, backward_dq=m)))
        if torch is not None:
            torch.cuda.synchronize()
            finite = all(bool(torch.isfinite(x).all()) for x in (out, *grads))
        else:
            finite = all(np.isfinite(x).all() for x in (out, *grads))
        if not finite:
            raise RuntimeError(f"{family} d={d} {sorted(options)}: an output is not finite")
    if family == "wgmma":
        run_wgmma_walk(torch, rng)


def run_wgmma_walk(torch, rng) -> None:
    """The wgmma forward on `WGMMA_WALK_HEADS` (persistent programs walking several items), at
    its default tiles and at 192 x 128; raises when an output is not finite."""
    import kernels
    hq, hkv = WGMMA_WALK_HEADS
    arrays = [rng.standard_normal(shape).astype(np.float16) for shape in (
        (1, hq, SEQ_Q, 64), (1, hkv, SEQ_K, 64), (1, hkv, SEQ_K, 64))]
    if torch is not None:
        arrays = [torch.from_numpy(a).cuda() for a in arrays]
    pb = attention_problem(*arrays, causal=True)
    for block_q in (None, 192):
        out, _lse = kernels.forward(pb, kernels.KernelConfig(family="wgmma", block_q=block_q,
                                                             block_k=block_q and 128))
        if torch is not None:
            torch.cuda.synchronize()
        if not (bool(torch.isfinite(out).all()) if torch is not None else np.isfinite(out).all()):
            raise RuntimeError(f"wgmma walk block_q={block_q}: an output is not finite")


def _on_hopper() -> bool:
    """Whether this machine's current GPU has compute capability 9.0 or more (wgmma's)."""
    from kernels import host
    return host.real_gpu() and host.compute_capability(host.current_device_id()) >= (9, 0)


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks sanitize",
                                 description=first_sentence(__doc__))
    ap.add_argument("families", nargs="*", metavar="FAMILY",
                    help="simt, mma, tf32, split_kv, wgmma, wgmma_fp8 (default: all)")
    ap.add_argument("--arrays", choices=("torch", "numpy"), default=None,
                    help="input arrays (default: torch CUDA tensors when torch has CUDA)")
    args = ap.parse_args(argv)
    families = args.families or [f for f in FAMILIES if f not in HOPPER_ONLY or _on_hopper()]
    if set(families) - set(FAMILIES):
        ap.error(f"unknown families {sorted(set(families) - set(FAMILIES))}; choose from "
                 f"{', '.join(FAMILIES)}")
    torch = None
    if args.arrays != "numpy":
        try:
            import torch
        except ImportError:
            torch = None
        if torch is not None and not torch.cuda.is_available():
            torch = None
        if torch is None and args.arrays == "torch":
            raise SystemExit("--arrays torch needs torch with CUDA")
    for family in families:
        run_family(family, torch)
    print("sanitize done:", " ".join(families),
          f"({'torch' if torch is not None else 'numpy'} arrays)")
    return 0
