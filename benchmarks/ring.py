"""Command ``ring``: ring attention on several GPUs, measured against one GPU and PyTorch's context parallelism.

Launched with torchrun, one process per GPU: ``torchrun --nproc-per-node 2 -m benchmarks ring``.

Two modes, both launched with torchrun (one process per GPU, NCCL):

* **ring** (default): for every N of ``--seq-len`` (default 32k, 128k, 512k tokens; bfloat16,
  d = 128, causal, zigzag), times the forward and the forward + backward of

  - ``ioaware-ring``: :func:`ioaware.distributed.ring_attention` over the P GPUs (our Numba
    kernels per pair);
  - ``ioaware-single``: :func:`ioaware.attention` on one GPU at the same total N (every rank runs
    it on its own GPU at once; rank 0's time is kept), where it fits;
  - ``torch-cp-flash``: PyTorch's ``torch.distributed.tensor.experimental.context_parallel``
    with SDPA's FLASH backend, on the same inputs in the same run (its head-tail load balancer
    is the zigzag layout, so its shards are ours);

  and writes, beside each measurement, ``sim.ring``'s prediction for it; the scaling
  efficiency ``T(1 GPU) / (P * T(ring))`` measured and predicted; the largest difference of our
  ring's output from the single GPU's and from PyTorch's (a check that all three computed the
  same attention); peak memory per rank.
* **p2p** (``--p2p``): bandwidth and latency between two GPUs with ``torch.distributed`` P2P
  (NCCL): a ping-pong of small messages (latency: half the round trip) and a simultaneous
  exchange of large ones (both GPUs sending, as a ring step of two does), written in the GPU
  profile's format (``interconnect_bandwidth_bytes_per_s``, ``interconnect_latency_s``, their
  ``sources`` saying MEASURED and how) that ``python -m sim ring --interconnect FILE`` reads.

Timing: every repetition starts after a barrier, is timed by CUDA events on every rank, and
counts the slowest rank's time (all-reduced MAX); the median over ``--repeats`` repetitions
after ``--warmup`` ones, with p10 and p90. Results are written by rank 0 after every
configuration (a run cut short keeps what it measured), with provenance: GPU, driver, CUDA,
NCCL, torch, numba, numba-cuda and NumPy versions, the GPU topology (``nvidia-smi topo -m``), date
(UTC), the exact command, the git commit (and whether the tree had changes).

Arguments are checked before anything touches a GPU, so ``--help`` and the checks work on any
machine (sequence lengths against the launched world size, or 2 outside torchrun). Memory:
``peak_extra_bytes_per_rank`` is the allocator's peak during a configuration over what was
allocated before it (the whole inputs and, for the ring, their shards). A configuration that
runs out of memory on every rank alike is listed under ``skipped``; one that fails on a single
rank leaves the others waiting in a collective until the process group's timeout (2 hours).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
from pathlib import Path

from sim.cli import token_count

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "ioaware.ring-results/1"
P2P_SCHEMA = "ioaware.interconnect/1"
DEFAULT_SEQ_LENS = (32 * 1024, 128 * 1024, 512 * 1024)
KERNELS = ("ioaware-ring", "ioaware-single", "torch-cp-flash")
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: The P2P latency is taken from messages up to this size (bytes), where bandwidth adds < 1 %.
LATENCY_MAX_BYTES = 1024


# ------------------------------------------------------------------------------------------------
# arguments (checked on any machine)
# ------------------------------------------------------------------------------------------------
def _token_list(text: str) -> list[int]:
    return [token_count(part) for part in text.split(",")]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks ring",
        description="Ring attention on several GPUs (ours, our single-GPU kernel, PyTorch context_parallel "
                    "FLASH) with sim.ring's prediction beside each time; or, with --p2p, the GPU-to-GPU "
                    "bandwidth and latency in the GPU profile's format. Launch one process per GPU: "
                    "torchrun --nproc-per-node 2 -m benchmarks ring.")
    ap.add_argument("--seq-len", type=_token_list, default=list(DEFAULT_SEQ_LENS),
                    help="total sequence lengths N over all GPUs, comma-separated (default 32k,128k,512k)")
    ap.add_argument("--batch", type=_positive, default=1)
    ap.add_argument("--heads", type=_positive, default=16)
    ap.add_argument("--heads-kv", type=_positive, default=None, help="KV heads (GQA); default = heads")
    ap.add_argument("--head-dim", type=_positive, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--full", action="store_true", help="no causal mask (default: causal)")
    ap.add_argument("--layout", choices=("zigzag", "contiguous", "striped"), default="zigzag",
                    help="our ring's layout (PyTorch's is zigzag; the output check needs zigzag)")
    ap.add_argument("--kernels", type=lambda t: t.split(","), default=list(KERNELS),
                    help=f"comma-separated subset of {','.join(KERNELS)}")
    ap.add_argument("--cp-rotate", choices=("allgather", "alltoall"), default="allgather",
                    help="PyTorch context_parallel's K/V rotation (set_rotate_method; its default: allgather)")
    ap.add_argument("--repeats", type=_positive, default=10, help="timed repetitions per configuration")
    ap.add_argument("--warmup", type=int, default=1, help="untimed repetitions first (Numba compiles here)")
    ap.add_argument("--profile", default=None,
                    help="sim profile for the predictions (default: the one whose name matches the GPU)")
    ap.add_argument("--interconnect", default=None, metavar="FILE",
                    help="interconnect figures for the predictions (what --p2p wrote); default: the profile's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None,
                    help="results file (default results/ring_<gpu>_<date>.json, or results/p2p_<gpu>_<date>.json)")
    ap.add_argument("--p2p", action="store_true", help="measure GPU-to-GPU bandwidth and latency instead")
    ap.add_argument("--p2p-max-bytes", type=token_count, default=1 << 30,
                    help="largest message of --p2p, bytes (default 1G = 2**30); 8 bytes up, doubling")
    ap.add_argument("--p2p-iters", type=_positive, default=50, help="transfers per --p2p timing")
    return ap


def check_args(a, ap: argparse.ArgumentParser, world_size: int | None) -> None:
    """Every refusal that needs no GPU, with the option it concerns (``ap.error`` exits 2)."""
    from ioaware.ring_plan import shard_length
    bad = [k for k in a.kernels if k not in KERNELS]
    if bad or not a.kernels:
        ap.error(f"--kernels: expected a comma-separated subset of {','.join(KERNELS)}, got {','.join(a.kernels)!r}")
    heads_kv = a.heads_kv or a.heads
    if a.heads % heads_kv:
        ap.error(f"--heads ({a.heads}) must be a multiple of --heads-kv ({heads_kv})")
    if a.head_dim not in (64, 128):
        ap.error(f"--head-dim {a.head_dim}: our half-precision kernels (tensor cores) take 64 or 128")
    if a.warmup < 0:
        ap.error(f"--warmup must be >= 0, got {a.warmup}")
    if a.p2p and a.p2p_max_bytes < 8:
        ap.error(f"--p2p-max-bytes must be at least 8, got {a.p2p_max_bytes}")
    if a.interconnect and not Path(a.interconnect).is_file():
        ap.error(f"--interconnect {a.interconnect}: no such file")
    if a.profile is not None:
        import sim
        try:
            sim.load_profile(a.profile)
        except ValueError as exc:
            ap.error(f"--profile: {exc}")
    if a.p2p:
        if world_size is not None and world_size != 2:
            ap.error(f"--p2p measures between two GPUs: launch 2 processes (torchrun --nproc-per-node 2), "
                     f"not {world_size}")
        return
    if world_size is not None and world_size < 2:
        ap.error(f"ring attention needs at least 2 processes (torchrun --nproc-per-node 2), got {world_size}")
    for n in a.seq_len:
        try:
            shard_length(n, world_size or 2, a.layout, name="--seq-len")
        except ValueError as exc:
            ap.error(str(exc))
    if "torch-cp-flash" in a.kernels and heads_kv != a.heads:
        ap.error("--kernels torch-cp-flash: PyTorch's context_parallel is compared without GQA; give "
                 "--heads-kv equal to --heads, or leave torch-cp-flash out of --kernels")


def _launched_world_size() -> int | None:
    """WORLD_SIZE as torchrun sets it, or None outside torchrun."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value and value.isdigit() else None


def main(argv=None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    world = _launched_world_size()
    check_args(a, ap, world)
    if world is None or "LOCAL_RANK" not in os.environ:
        ap.error("launch one process per GPU with torchrun, e.g. "
                 "torchrun --nproc-per-node 2 -m benchmarks ring " + " ".join(sys.argv[1:] if argv is None else argv))
    import torch
    if not torch.cuda.is_available() or torch.cuda.device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", world)):
        ap.error(f"needs a CUDA GPU per process: torch sees {torch.cuda.device_count()} GPU(s) for "
                 f"{os.environ.get('LOCAL_WORLD_SIZE', world)} local processes")
    return _run(a, argv)


# ------------------------------------------------------------------------------------------------
# measuring (GPU)
# ------------------------------------------------------------------------------------------------
def _run(a, argv) -> int:
    import torch
    import torch.distributed as dist
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=_dt.timedelta(hours=2), device_id=torch.device("cuda", local_rank))
    try:
        prov = _provenance(torch, dist, argv)
        if a.p2p:
            _p2p(a, torch, dist, prov)
        else:
            _ring(a, torch, dist, prov)
    finally:
        dist.destroy_process_group()
    return 0


def _timed(torch, dist, fn, repeats, warmup, prepare=None) -> dict:
    """Median, p10 and p90 over ``repeats`` of the slowest rank's CUDA-event time of ``fn()``, in ms."""
    times = []
    for i in range(warmup + repeats):
        if prepare is not None:
            prepare()
        dist.barrier()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        ms = torch.tensor([start.elapsed_time(end)], device="cuda", dtype=torch.float64)
        dist.all_reduce(ms, op=dist.ReduceOp.MAX)
        if i >= warmup:
            times.append(float(ms.item()))
    times.sort()
    pick = lambda q: times[min(len(times) - 1, max(0, round(q * (len(times) - 1))))]  # noqa: E731
    return {"time_ms": pick(0.5), "time_ms_p10": pick(0.1), "time_ms_p90": pick(0.9), "repeats": repeats,
            "warmup": warmup}


def _ring(a, torch, dist, prov):
    import torch.nn.functional as F

    import ioaware
    import sim
    from ioaware.distributed import ring_attention, shard
    from sim.ring import load_interconnect, predict_ring

    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, DTYPES[a.dtype])
    heads_kv = a.heads_kv or a.heads
    causal = not a.full
    profile = sim.load_profile(a.profile) if a.profile else sim.profiles.profile_for_gpu_name(prov["gpu"])
    link = load_interconnect(a.interconnect) if a.interconnect else None
    out_path = Path(a.out or ROOT / "results" / f"ring_{_slug(prov['gpu'])}_{prov['date'][:10]}.json")
    doc = {"schema": SCHEMA, "provenance": dict(prov, world_size=world, layout=a.layout, cp_rotate=a.cp_rotate,
                                                sim_profile=profile.name if profile else None,
                                                sim_interconnect=a.interconnect),
           "records": [], "summary": [], "skipped": []}

    def write():
        if rank == 0:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(doc, indent=1) + "\n")

    def predicted(n, pass_):
        if profile is None:
            return None
        try:
            r = predict_ring(seq_len=n, world_size=world, batch=a.batch, heads=a.heads, heads_kv=heads_kv,
                             head_dim=a.head_dim, dtype=a.dtype, causal=causal, layout=a.layout, pass_=pass_,
                             profile=profile, interconnect=link)
        except ValueError as exc:          # e.g. a profile without interconnect figures
            return {"error": str(exc)}
        return {"predicted_ms": r.total_ms, "predicted_single_gpu_ms": r.single_gpu_ms,
                "predicted_scaling_efficiency": r.scaling_efficiency,
                "predicted_crossover_shard_len": r.crossover_shard_len, "interconnect": r.interconnect.source}

    for n in a.seq_len:
        gen = torch.Generator(device="cuda").manual_seed(a.seed)     # the same sequence on every rank
        draw = lambda h: torch.randn(a.batch, h, n, a.head_dim, device="cuda", dtype=dtype,  # noqa: E731
                                     generator=gen)
        q, k, v = draw(a.heads), draw(heads_kv), draw(heads_kv)
        dout = draw(a.heads)
        shard_of = lambda x: shard(x, rank, world, a.layout, dim=2)  # noqa: E731
        shards = [shard_of(x) for x in (q, k, v, dout)]
        outputs = {}
        base = dict(seq_len=n, world_size=world, batch=a.batch, heads=a.heads, heads_kv=heads_kv,
                    head_dim=a.head_dim, dtype=a.dtype, causal=causal)
        measured = {}
        for kernel in a.kernels:
            for pass_ in ("fwd", "fwd+bwd"):
                try:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                    before = torch.cuda.memory_allocated()
                    if kernel == "ioaware-ring":
                        t, out = _time_ring(a, torch, dist, ring_attention, *shards, causal, pass_)
                    elif kernel == "ioaware-single":
                        t, out = _time_single(a, torch, dist, ioaware.attention, q, k, v, dout, causal, pass_)
                        out = shard_of(out) if out is not None else None
                    else:
                        t, out = _time_torch_cp(a, torch, dist, F, q, k, v, dout, causal, pass_)
                    peak = torch.cuda.max_memory_allocated() - before
                except (torch.cuda.OutOfMemoryError, MemoryError) as exc:
                    doc["skipped"].append({"kernel": kernel, "pass": pass_, "seq_len": n,
                                           "reason": f"out of memory: {' '.join(str(exc).split())[:300]}"})
                    write()
                    continue
                if out is not None:
                    outputs[kernel] = out
                record = dict(base, kernel=kernel, **{"pass": pass_}, **t, peak_extra_bytes_per_rank=peak)
                if kernel == "ioaware-ring":
                    record["sim"] = predicted(n, pass_)
                measured[(kernel, pass_)] = t["time_ms"]
                doc["records"].append(record)
                write()
        doc["summary"].append(_summary(n, world, a.layout, measured, outputs, predicted, torch, dist))
        write()
        del q, k, v, dout, shards, outputs


def _time_pass(a, torch, dist, attend, q, k, v, dout, pass_):
    """``(timing, out)`` of ``attend(q, k, v)``: the forward under no_grad (``out`` kept), or
    forward and backward from ``dout`` on fresh leaves (``out`` None)."""
    out_holder = {}
    if pass_ == "fwd":
        def fn():
            with torch.no_grad():
                out_holder["out"] = attend(q, k, v)
        return _timed(torch, dist, fn, a.repeats, a.warmup), out_holder["out"]
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

    def prepare():
        for x in leaves:
            x.grad = None

    def fn():
        attend(*leaves).backward(dout)
    return _timed(torch, dist, fn, a.repeats, a.warmup, prepare), None


def _time_ring(a, torch, dist, ring_attention, q, k, v, dout, causal, pass_):
    return _time_pass(a, torch, dist, lambda *x: ring_attention(*x, causal=causal, layout=a.layout),
                      q, k, v, dout, pass_)


def _time_single(a, torch, dist, attention, q, k, v, dout, causal, pass_):
    """Our kernel on one GPU at the whole N: every rank runs it on its own GPU at the same time
    (no collective inside), so the slowest rank's time is one GPU's."""
    return _time_pass(a, torch, dist, lambda *x: attention(*x, causal=causal), q, k, v, dout, pass_)


_CP_MESH: dict = {}     # one device mesh per run


def _time_torch_cp(a, torch, dist, F, q, k, v, dout, causal, pass_):
    """PyTorch's context_parallel: the whole q, k, v (and dout) given as buffers, sharded in place by
    its head-tail load balancer (zigzag), SDPA's FLASH backend."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if "mesh" not in _CP_MESH:
        _CP_MESH["mesh"] = init_device_mesh("cuda", (dist.get_world_size(),))
    mesh = _CP_MESH["mesh"]
    set_rotate_method(a.cp_rotate)
    cq, ck, cv, cdo = (x.clone() for x in (q, k, v, dout))
    with context_parallel(mesh, buffers=[cq, ck, cv, cdo], buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers={cq, ck, cv, cdo}), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return _time_pass(a, torch, dist,
                          lambda *x: F.scaled_dot_product_attention(*x, is_causal=causal),
                          cq, ck, cv, cdo, pass_)


def _summary(n, world, layout, measured, outputs, predicted, torch, dist) -> dict:
    """Per N: scaling efficiency measured and predicted, ratios to PyTorch, output agreement."""
    row = {"seq_len": n, "world_size": world}
    for pass_ in ("fwd", "fwd+bwd"):
        ring, single, cp = (measured.get((k, pass_)) for k in KERNELS)
        p = predicted(n, pass_) or {}
        row[pass_] = {
            "ring_ms": ring, "single_gpu_ms": single, "torch_cp_flash_ms": cp,
            "scaling_efficiency": single / (world * ring) if ring and single else None,
            "torch_cp_flash_over_ring": cp / ring if ring and cp else None,
            "predicted_ring_ms": p.get("predicted_ms"), "predicted_single_gpu_ms": p.get("predicted_single_gpu_ms"),
            "predicted_scaling_efficiency": p.get("predicted_scaling_efficiency"),
            "ring_predicted_over_measured": p["predicted_ms"] / ring if ring and p.get("predicted_ms") else None}
    ours = outputs.get("ioaware-ring")
    for other in ("ioaware-single", "torch-cp-flash"):
        if ours is not None and other in outputs and (other != "torch-cp-flash" or layout == "zigzag"):
            diff = (ours.float() - outputs[other].float()).abs().max().reshape(1)
            dist.all_reduce(diff, op=dist.ReduceOp.MAX)
            row[f"fwd_out_max_abs_diff_vs_{other}"] = float(diff.item())
    return row


def _p2p(a, torch, dist, prov):
    """Ping-pong latency and exchange bandwidth between ranks 0 and 1, in the profile's format."""
    rank = dist.get_rank()
    peer = 1 - rank
    samples = []
    size = 8
    sizes = []
    while size <= a.p2p_max_bytes:
        sizes.append(size)
        size *= 2
    for nbytes in sizes:
        send = torch.ones(nbytes, dtype=torch.uint8, device="cuda")
        recv = torch.empty_like(send)

        def ping_pong():
            if rank == 0:
                dist.send(send, peer)
                dist.recv(recv, peer)
            else:
                dist.recv(recv, peer)
                dist.send(send, peer)

        def exchange():
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]):
                w.wait()

        row = {"bytes": nbytes}
        for name, fn in (("ping_pong", ping_pong), ("exchange", exchange)):
            for _ in range(3):                                     # warm-up (connection set-up)
                fn()
            t = _timed(torch, dist, lambda: [fn() for _ in range(a.p2p_iters)], repeats=5, warmup=1)
            row[f"{name}_ms_per_{'round_trip' if name == 'ping_pong' else 'transfer'}"] = t["time_ms"] / a.p2p_iters
        row["one_way_latency_s"] = row["ping_pong_ms_per_round_trip"] / 2 / 1e3
        row["exchange_bytes_per_s_per_direction"] = nbytes / (row["exchange_ms_per_transfer"] / 1e3)
        samples.append(row)
    doc = p2p_document(samples, prov, a.p2p_iters)
    if rank == 0:
        out_path = Path(a.out or ROOT / "results" / f"p2p_{_slug(prov['gpu'])}_{prov['date'][:10]}.json")
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {out_path}: one-way latency {doc['interconnect_latency_s']:.3g} s, bandwidth "
              f"{doc['interconnect_bandwidth_bytes_per_s']:.4g} B/s per direction")


def p2p_document(samples, prov, iters) -> dict:
    """The interconnect figures, in the GPU profile's format, from the measured ``samples`` (rows
    of :func:`_p2p`, smallest message first): latency = the median one-way time (half the
    ping-pong round trip) of the messages up to :data:`LATENCY_MAX_BYTES`; bandwidth = the largest
    message's bytes over its exchange time less that latency, so that ``latency + bytes /
    bandwidth`` (what ``sim.ring`` charges) gives back the largest transfer's measured time."""
    small = sorted(s["one_way_latency_s"] for s in samples if s["bytes"] <= LATENCY_MAX_BYTES)
    if not small:
        raise ValueError(f"samples: no message of at most {LATENCY_MAX_BYTES} bytes to take the latency from")
    latency = small[len(small) // 2] if len(small) % 2 else (small[len(small) // 2 - 1] + small[len(small) // 2]) / 2
    largest = samples[-1]
    transfer_s = largest["exchange_ms_per_transfer"] / 1e3
    if transfer_s <= latency:
        raise ValueError(f"samples: the largest exchange ({largest['bytes']} bytes, {transfer_s:.3g} s) took no "
                         f"longer than the latency ({latency:.3g} s); measure larger messages (--p2p-max-bytes)")
    bandwidth = largest["bytes"] / (transfer_s - latency)
    where = f"{prov['gpu']} x2 ({prov['date']}, `{prov['command']}`)"
    return {
        "schema": P2P_SCHEMA, "name": f"{_slug(prov['gpu'])}-p2p",
        "interconnect_bandwidth_bytes_per_s": bandwidth, "interconnect_latency_s": latency,
        "sources": {
            "interconnect_latency_s": f"MEASURED on {where}: half the round trip of an NCCL send/recv "
                                      f"ping-pong, median over the {len(small)} message sizes of 8 to "
                                      f"{LATENCY_MAX_BYTES} bytes ({iters} round trips per timing, median of 5 "
                                      f"timings each)",
            "interconnect_bandwidth_bytes_per_s": f"MEASURED on {where}: {largest['bytes']} bytes / (time per "
                                                  f"transfer - latency) of a simultaneous NCCL exchange (both "
                                                  f"GPUs sending, batch_isend_irecv, as a ring step of two), "
                                                  f"one direction"},
        "provenance": prov, "samples": samples}


# ------------------------------------------------------------------------------------------------
# provenance
# ------------------------------------------------------------------------------------------------
def _run_text(cmd) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT)
        return r.stdout.strip() if r.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _provenance(torch, dist, argv) -> dict:
    """`benchmarks.common.provenance` of this run, plus what a multi-GPU run adds: every rank's
    GPU, the NCCL version and the GPUs' topology (``nvidia-smi topo -m``)."""
    from .common import provenance
    args = list(sys.argv[1:] if argv is None else argv)
    local = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "?"))
    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    gpus = [None] * dist.get_world_size()
    dist.all_gather_object(gpus, torch.cuda.get_device_name())
    command = " ".join(["torchrun", f"--nproc-per-node {local}", "-m benchmarks ring"] + args)
    return provenance(command, extra={
        "gpus": gpus, "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "argv": list(getattr(sys, "orig_argv", sys.argv)), "topology": _run_text(["nvidia-smi", "topo", "-m"])})


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


if __name__ == "__main__":
    sys.exit(main())
