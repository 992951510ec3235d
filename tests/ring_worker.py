"""The rank side of the distributed tests (tests/test_distributed.py): one process per rank runs
every case and writes what it measured to ``<out_dir>/rank<r>.json``; the test process asserts.

A case's full sequence is drawn from its seed identically on every rank, rounded to the case's
dtype, and the float64 reference is computed on the rounded values: single-process
``ioaware.attention`` on the whole sequence (output, logsumexp, and the gradients of
``sum(out * g)`` through its autograd), and for the cases with a gradient through the logsumexp,
a materialised float64 attention in torch (``sum(out * g) + sum(lse * h)``). Each rank then runs
``ring_attention`` on its shards and records the relative errors of its shard against the
reference's, plus the errors raised by the refusal cases (every rank must raise).
"""
from __future__ import annotations

import json
import math
import os
import re
import traceback
import zlib
from pathlib import Path

import torch
import torch.distributed as dist

from ioaware import attention
from ioaware.distributed import ring_attention, shard, unshard

#: name -> (layout, causal, batch, Hq, Hkv, N per rank, d, lse gradient). Two cases have d = 64,
#: which on a GPU in bfloat16 runs the tensor-core kernels (the others run the CUDA-core ones).
CASES = {
    "zigzag-causal": ("zigzag", True, 1, 2, 2, 8, 64, False),
    "zigzag-full-gqa": ("zigzag", False, 2, 4, 2, 6, 8, False),
    "zigzag-causal-gqa-lse": ("zigzag", True, 1, 4, 1, 6, 16, True),
    "contiguous-causal": ("contiguous", True, 1, 2, 2, 7, 16, False),
    "contiguous-full": ("contiguous", False, 1, 2, 2, 5, 8, False),
    "contiguous-causal-gqa-lse": ("contiguous", True, 2, 4, 2, 4, 8, True),
    "striped-causal": ("striped", True, 1, 2, 2, 7, 16, False),
    "striped-full-gqa": ("striped", False, 1, 6, 3, 5, 8, False),
    "striped-causal-gqa-lse": ("striped", True, 1, 4, 2, 6, 64, True),
}


def _rel(got, want) -> float:
    got = got.detach().double().cpu()
    want = want.detach().double().cpu()
    return float((got - want).norm() / max(float(want.norm()), 1e-30))


def _materialised(q, k, v, scale, causal):
    """float64 attention in torch (out, lse), differentiable through both."""
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.einsum("bhid,bhjd->bhij", q, kr) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.einsum("bhij,bhjd->bhid", torch.exp(s - lse[..., None]), vr), lse


def _reference(layout, causal, batch, hq, hkv, seq_len, d, lse_grad, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    draw = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype).double()  # noqa: E731
    q, k, v = draw(batch, hq, seq_len, d), draw(batch, hkv, seq_len, d), draw(batch, hkv, seq_len, d)
    grad_out, grad_lse = draw(batch, hq, seq_len, d), draw(batch, hq, seq_len)
    scale = 1 / math.sqrt(d)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attention(*leaves, causal=causal, return_lse=True, backend="numpy")
    ref = {"q": q, "k": k, "v": v, "g": grad_out, "h": grad_lse, "out": out.detach(), "lse": lse.detach()}
    if lse_grad:
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        m_out, m_lse = _materialised(*leaves, scale, causal)
        ref["materialised_out_error"] = _rel(m_out, out)
        ((m_out * grad_out).sum() + (m_lse * grad_lse).sum()).backward()
    else:
        (out * grad_out).sum().backward()
    ref.update(dq=leaves[0].grad, dk=leaves[1].grad, dv=leaves[2].grad)
    return ref


def run_case(name, group, device, dtype, backend):
    layout, causal, batch, hq, hkv, n, d, lse_grad = CASES[name]
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    ref = _reference(layout, causal, batch, hq, hkv, n * world, d, lse_grad, seed=zlib.crc32(name.encode()),
                     dtype=dtype)
    sh = lambda x: shard(x, rank, world, layout, dim=2)  # noqa: E731
    q, k, v = (sh(ref[x]).to(device=device, dtype=dtype).requires_grad_() for x in "qkv")
    out, lse = ring_attention(q, k, v, group=group, causal=causal, layout=layout, return_lse=True,
                              backend=backend)
    loss = (out * sh(ref["g"]).to(device=device, dtype=dtype)).sum()
    if lse_grad:
        loss = loss + (lse * sh(ref["h"]).to(device)).sum()
    loss.backward()
    gathered = unshard(out.detach(), group, layout)
    result = {"out": _rel(out, sh(ref["out"])), "lse": _rel(lse, sh(ref["lse"])),
              "dq": _rel(q.grad, sh(ref["dq"])), "dk": _rel(k.grad, sh(ref["dk"])), "dv": _rel(v.grad, sh(ref["dv"])),
              "unshard": _rel(gathered, ref["out"]), "out_dtype": str(out.dtype), "lse_dtype": str(lse.dtype),
              "finite": bool(torch.isfinite(out).all() and torch.isfinite(q.grad).all())}
    if "materialised_out_error" in ref:
        result["materialised_out_error"] = ref["materialised_out_error"]
    return result


def refusal_cases(group, device, dtype):
    """The error every rank raised (type and message) for inputs the ring cannot compute exactly."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    kw = dict(device=device, dtype=dtype)
    results = {}

    def attempt(label, fn):
        try:
            fn()
            results[label] = None
        except Exception as exc:  # noqa: BLE001 - the test checks type and message
            results[label] = [type(exc).__name__, str(exc)]

    def unequal():
        n = 8 if rank == 0 else 6
        x = torch.randn(1, 2, n, 8, **kw)
        ring_attention(x, x, x, group=group, layout="contiguous")

    def odd_zigzag():
        x = torch.randn(1, 2, 3, 8, **kw)
        ring_attention(x, x, x, group=group, layout="zigzag")

    def one_rank_bad_heads():
        q = torch.randn(1, 4, 4, 8, **kw)
        k = torch.randn(1, 3 if rank == world - 1 else 2, 4, 8, **kw)
        ring_attention(q, k, k, group=group)

    def causal_differs():
        x = torch.randn(1, 2, 4, 8, **kw)
        ring_attention(x, x, x, group=group, causal=rank == 0)

    attempt("unequal", unequal)
    attempt("odd_zigzag", odd_zigzag)
    attempt("one_rank_bad_heads", one_rank_bad_heads)
    attempt("causal_differs", causal_differs)
    attempt("shard_odd", lambda: shard(torch.zeros(1, 2, 10, 4), rank, 4, "zigzag"))
    attempt("unshard_grad", lambda: unshard(torch.zeros(1, 2, 4, 4, requires_grad=True), group, "zigzag"))
    return results


def recipe_case(group, device, dtype):
    """The docs/distributed.md recipe, its two blocks executed as written: the model whose attention
    is swapped for ring_attention gives the single-process model's output and (summed) gradients."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "distributed.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    namespace = {}
    for marker in ("# recipe: ring attention in a model", "# recipe: one training step"):
        code = next(b for b in blocks if b.startswith(marker))
        exec(compile(code, "docs/distributed.md", "exec"), namespace)
    torch.manual_seed(0)
    reference = namespace["SelfAttention"](64, 4, 2)
    y_ref = reference(namespace["x"])
    y_ref.square().sum().backward()
    model = namespace["model"]
    grads = {name: _rel(p.grad, dict(reference.named_parameters())[name].grad)
             for name, p in model.named_parameters()}
    return {"y": _rel(namespace["y"], y_ref), "x_local_tokens": int(namespace["x_local"].shape[1]),
            "max_grad": max(grads.values())}


def main(rank, world, store_path, out_dir, device_kind="cpu"):
    """Rank ``rank`` of ``world``: gloo on the CPU, or NCCL on ``cuda:rank``; every case, every
    refusal, the recipe; with 4 ranks also a ring over each half of the world (``group=``)."""
    torch.set_num_threads(1)
    if device_kind == "cuda":
        torch.cuda.set_device(rank)
        device, backend, dtypes = torch.device("cuda", rank), "nccl", (torch.float32, torch.bfloat16)
    else:
        device, backend, dtypes = torch.device("cpu"), "gloo", (torch.float32,)
    dist.init_process_group(backend, store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    results = {}
    try:
        groups = {"world": dist.group.WORLD}
        if world == 4:     # subgroups (every rank creates every group, in the same order)
            halves = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            singles = [dist.new_group([r]) for r in range(world)]
            groups["half"], groups["single"] = halves[rank // 2], singles[rank]
        for dtype in dtypes:
            tag = str(dtype).replace("torch.", "")
            for gname, group in groups.items():
                for name in CASES:
                    try:
                        results[f"{gname}/{tag}/{name}"] = run_case(name, group, device, dtype, "auto")
                    except Exception:  # noqa: BLE001 - reported to the test, which fails on it
                        results[f"{gname}/{tag}/{name}"] = {"error": traceback.format_exc()}
        results["refusals"] = refusal_cases(dist.group.WORLD, device, torch.float32)
        if device_kind == "cpu":       # the recipe's tensors are CPU tensors, as written
            results["recipe"] = recipe_case(dist.group.WORLD, device, torch.float32)
    except Exception:  # noqa: BLE001
        results["fatal"] = traceback.format_exc()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
        dist.barrier()           # no rank tears the group down while a peer still talks to it
        dist.destroy_process_group()


def spawn(world, tmp_path, device_kind="cpu", timeout_s=180):
    """Run :func:`main` on ``world`` processes; returns the per-rank results. Processes still
    running after ``timeout_s`` (a ring waiting for a transfer that never comes) are terminated
    and reported."""
    import time

    import torch.multiprocessing as mp
    store = os.path.join(tmp_path, "store")
    context = mp.spawn(main, args=(world, store, str(tmp_path), device_kind), nprocs=world, join=False)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
            raise TimeoutError(f"the {world} ranks did not finish within {timeout_s} s")
    return [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(world)]
