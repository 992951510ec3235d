"""The ring of context-parallel attention as a plan, priced step by step: :func:`predict_ring`.

P GPUs each hold N/P tokens (a layout of :mod:`ioaware.ring_plan`); at step t GPU r computes its
query shard against the K/V shard of GPU ``(r - t) mod P`` while the next K/V shard travels to
it, as ``ioaware.distributed.ring_attention`` runs. Per step:

* **compute**: each GPU's pair attention, the sum over the pair's blocks of :func:`sim.predict`
  on the block's workload (:func:`pair_workload`: a Q chunk against a K chunk, full or causal);
  the step waits for the slowest GPU;
* **transfer**: one K/V shard, ``2 * B * Hkv * N/P * d * dtype bytes`` (:func:`kv_shard_bytes`),
  in ``latency + bytes / bandwidth`` over the profile's interconnect (:class:`Interconnect`);
  the backward also carries the dK/dV accumulated so far (float32) to the next GPU;
* **step time** = ``max(compute, transfer)``: the transfer was started before the step's
  attention and overlaps it;
* **what does not overlap**: the merges of partial results into the running output (forward:
  ``out``, ``lse``; backward: dQ, dK, dV), priced as their bytes at the DRAM bandwidth, and in the
  backward the last dK/dV transfer to the shard's owner. The forward's first transfer overlaps
  step 0, whose pair is the GPU's own (the K/V it already holds).

Reported: the total time, the scaling efficiency ``T(1 GPU, N) / (P * T(P GPUs, N))`` with the
single GPU priced by the same :func:`sim.predict` on the whole workload, and the shard length
below which a step's transfer outlasts its attention (:func:`crossover_shard_len`:
communication dominates). Every price is the raw roofline of :func:`sim.predict` (no
calibration) and the interconnect figures of the profile (shipped: datasheet bandwidth, an
estimated latency; ``sources`` says which) or of a measured file (:func:`load_interconnect`).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

from ioaware.ring_plan import check_layout, kv_source, pair_blocks, shard_length

from .model import predict
from .profiles import GPUProfile, load_profile
from .workload import DTYPE_BYTES, STAT_BYTES, Schedule, Workload

__all__ = ["Interconnect", "RingStep", "RingPrediction", "predict_ring", "crossover_shard_len",
           "kv_shard_bytes", "pair_workload", "interconnect_for", "load_interconnect"]

#: Bytes per element of the float32 accumulators the ring keeps and sends (out, dQ, dK, dV).
ACC_BYTES = 4
#: The largest shard length the crossover search tries.
MAX_SHARD_LEN = 1 << 30
#: The crossover search stops doubling once every step's attention takes this many times its
#: transfer (attention grows quadratically with the shard, the transfer linearly: no way back).
CLEAR_MARGIN = 2.0


@dataclass(frozen=True)
class Interconnect:
    """A GPU-to-GPU link: one direction's bandwidth (bytes/s) and the latency of one transfer (s)."""

    bandwidth_bytes_per_s: float
    latency_s: float
    source: str = ""

    def __post_init__(self):
        for name in ("bandwidth_bytes_per_s", "latency_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or \
                    (name == "bandwidth_bytes_per_s" and v == 0):
                raise ValueError(f"Interconnect.{name} must be a {'positive' if 'band' in name else 'non-negative'} "
                                 f"number, got {v!r}")

    def transfer_ms(self, nbytes: int) -> float:
        """Milliseconds to send ``nbytes`` in one transfer (0 bytes: no transfer, 0 ms)."""
        return 0.0 if nbytes == 0 else 1e3 * (self.latency_s + nbytes / self.bandwidth_bytes_per_s)


def interconnect_for(profile, bandwidth_bytes_per_s=None, latency_s=None) -> Interconnect:
    """The profile's interconnect, with either figure overridden; ValueError naming the missing
    field when neither the profile nor the caller gives it."""
    prof = load_profile(profile)
    bw = bandwidth_bytes_per_s if bandwidth_bytes_per_s is not None else prof.interconnect_bandwidth_bytes_per_s
    lat = latency_s if latency_s is not None else prof.interconnect_latency_s
    for name, value in (("interconnect_bandwidth_bytes_per_s", bw), ("interconnect_latency_s", lat)):
        if value is None:
            raise ValueError(f"profile {prof.name!r} has no {name}: give it (--interconnect FILE, or "
                             f"--interconnect-bandwidth / --interconnect-latency)")
    sources = prof.sources or {}
    source = "; ".join(
        f"{what}: {'given' if given is not None else sources.get(key, 'profile ' + prof.name)}"
        for what, key, given in (("bandwidth", "interconnect_bandwidth_bytes_per_s", bandwidth_bytes_per_s),
                                 ("latency", "interconnect_latency_s", latency_s)))
    return Interconnect(float(bw), float(lat), source)


def load_interconnect(path) -> Interconnect:
    """The interconnect figures of a JSON file: a GPU profile, or what ``benchmarks.ring --p2p``
    writes (``interconnect_bandwidth_bytes_per_s``, ``interconnect_latency_s``, ``sources``)."""
    with open(os.fspath(path)) as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    missing = [k for k in ("interconnect_bandwidth_bytes_per_s", "interconnect_latency_s") if k not in data]
    if missing:
        raise ValueError(f"{path}: missing {', '.join(missing)}")
    sources = data.get("sources") or {}
    source = f"{path}: " + "; ".join(str(sources.get(k, k)) for k in ("interconnect_bandwidth_bytes_per_s",
                                                                     "interconnect_latency_s"))
    return Interconnect(data["interconnect_bandwidth_bytes_per_s"], data["interconnect_latency_s"], source)


def kv_shard_bytes(batch: int, heads_kv: int, shard_len: int, head_dim: int, dtype: str) -> int:
    """Bytes of one K/V shard: ``2 * B * Hkv * N/P * d * dtype bytes`` (K and V)."""
    return 2 * batch * heads_kv * shard_len * head_dim * DTYPE_BYTES[dtype]


def pair_workload(block, *, batch, heads, heads_kv, head_dim, dtype, pass_) -> Workload:
    """The workload of one block of a ring step (:class:`ioaware.ring_plan.PairBlock`): its query
    rows against its key rows, full or causal (top-left, equal lengths)."""
    return Workload(batch=batch, heads=heads, heads_kv=heads_kv, seq_len_q=block.q_len,
                    seq_len_k=block.k_len, head_dim=head_dim, dtype=dtype, causal=block.causal, pass_=pass_)


@dataclass(frozen=True)
class RingStep:
    """One step of one pass. Times in ms; ``compute_ms`` is the slowest GPU's."""

    pass_: str
    index: int
    compute_ms_per_rank: tuple
    transfer_bytes: int
    transfer_ms: float
    merge_ms: float

    @property
    def compute_ms(self) -> float:
        return max(self.compute_ms_per_rank)

    @property
    def step_ms(self) -> float:
        """``max(compute, transfer)`` (they overlap) plus the merge (it does not)."""
        return max(self.compute_ms, self.transfer_ms) + self.merge_ms

    @property
    def communication_bound(self) -> bool:
        return self.transfer_ms > self.compute_ms

    def to_dict(self) -> dict:
        return dict(asdict(self), compute_ms=self.compute_ms, step_ms=self.step_ms,
                    communication_bound=self.communication_bound)


@dataclass(frozen=True)
class RingPrediction:
    """What :func:`predict_ring` says about one ring. Times in ms, bytes in bytes."""

    seq_len: int
    world_size: int
    shard_len: int
    layout: str
    causal: bool
    pass_: str
    device: str
    kv_shard_bytes: int
    steps: tuple
    exposed_transfer_ms: float        # transfers nothing overlaps (the backward's last dK/dV)
    total_ms: float
    single_gpu_ms: float
    scaling_efficiency: float         # single_gpu_ms / (world_size * total_ms)
    crossover_shard_len: int | None   # below this shard length a step's transfer outlasts its attention
    interconnect: Interconnect
    workload: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.single_gpu_ms / self.total_ms

    @property
    def transfers(self) -> int:
        """Transfers in flight over all steps (the backward's last dK/dV one included)."""
        return sum(1 for s in self.steps if s.transfer_bytes) + (1 if self.exposed_transfer_ms else 0)

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("steps", "interconnect")}
        d.update(speedup=self.speedup, steps=[s.to_dict() for s in self.steps],
                 interconnect=asdict(self.interconnect))
        return d


def predict_ring(*, seq_len: int, world_size: int, batch: int = 1, heads: int = 16, heads_kv: int | None = None,
                 head_dim: int = 128, dtype: str = "bf16", causal: bool = True, layout: str = "zigzag",
                 pass_: str = "fwd", profile="h100", interconnect: Interconnect | None = None,
                 schedule: Schedule | None = None, l2: str = "analytic", crossover: bool = True) -> RingPrediction:
    """Price ring attention of a sequence of ``seq_len`` tokens over ``world_size`` GPUs.

    ``pass_``: "fwd", "bwd" or "fwd+bwd". ``schedule``: the per-pair schedule (default flash2 with
    its default blocks). ``l2``: :func:`sim.predict`'s L2 model, analytic by default (the
    trace replay ``"auto"`` picks for small pairs costs seconds per crossover probe). ``interconnect``: default the profile's (:func:`interconnect_for`).
    ``crossover=False`` skips the crossover search (:func:`crossover_shard_len`).
    Raises ValueError naming the argument for a length the layout cannot split.
    """
    prof = load_profile(profile)
    link = interconnect if interconnect is not None else interconnect_for(prof)
    heads_kv = heads if heads_kv is None else heads_kv
    schedule = schedule or Schedule("flash2")
    n = shard_length(seq_len, world_size, layout)
    if pass_ not in ("fwd", "bwd", "fwd+bwd"):
        raise ValueError(f"pass_ must be 'fwd', 'bwd' or 'fwd+bwd', got {pass_!r}")
    shape = dict(batch=batch, heads=heads, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype)
    steps, exposed = _priced_steps(n, world_size, layout, causal, pass_, shape, prof, link, schedule, l2)
    total = sum(s.step_ms for s in steps) + exposed
    whole = Workload(seq_len_q=seq_len, causal=causal, pass_=pass_, **shape)
    single = predict(whole, schedule, prof, l2=l2).predicted_ms
    cross = (crossover_shard_len(world_size=world_size, layout=layout, causal=causal, pass_=pass_, profile=prof,
                                 interconnect=link, schedule=schedule, l2=l2, **shape)
             if crossover else None)
    return RingPrediction(seq_len, world_size, n, layout, causal, pass_, prof.name,
                          kv_shard_bytes(batch, heads_kv, n, head_dim, dtype), tuple(steps), exposed, total, single,
                          single / (world_size * total), cross, link, workload=shape)


def crossover_shard_len(*, world_size: int, layout: str = "zigzag", causal: bool = True, pass_: str = "fwd",
                        batch: int = 1, heads: int = 16, heads_kv: int | None = None, head_dim: int = 128,
                        dtype: str = "bf16", profile="h100", interconnect: Interconnect | None = None,
                        schedule: Schedule | None = None, l2: str = "analytic") -> int | None:
    """The shard length (tokens per GPU) from which on no step of the pass waits for its transfer:
    below it, communication dominates. None for one GPU (nothing is sent) or when shards of
    :data:`MAX_SHARD_LEN` tokens still wait.

    The roofline's wave quantisation makes "communication-bound" flip more than once at small
    shards, so the search doubles the shard length (from the layout's smallest, 2 for zigzag)
    until every step's attention takes :data:`CLEAR_MARGIN` times its transfer, then bisects
    between the largest doubling that was communication-bound and the next one.
    """
    if world_size == 1:
        return None
    prof = load_profile(profile)
    link = interconnect if interconnect is not None else interconnect_for(prof)
    heads_kv = heads if heads_kv is None else heads_kv
    schedule = schedule or Schedule("flash2")
    shape = dict(batch=batch, heads=heads, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype)
    unit = 2 if check_layout(layout) == "zigzag" else 1

    def steps(n):
        return _priced_steps(n, world_size, layout, causal, pass_, shape, prof, link, schedule, l2)[0]

    last_bound, n = None, unit
    while True:
        priced = steps(n)
        if any(s.communication_bound for s in priced):
            last_bound = n
        elif all(s.compute_ms >= CLEAR_MARGIN * s.transfer_ms for s in priced):
            break
        n *= 2
        if n > MAX_SHARD_LEN:
            return None
    if last_bound is None:
        return unit
    a, b = last_bound // unit, 2 * last_bound // unit      # bound at a, not at b (up to the margin)
    while b - a > 1:
        mid = (a + b) // 2
        if any(s.communication_bound for s in steps(mid * unit)):
            a = mid
        else:
            b = mid
    return b * unit


# ------------------------------------------------------------------------------------------------
def _priced_steps(n, world, layout, causal, pass_, shape, prof: GPUProfile, link: Interconnect, schedule, l2):
    """The steps of each pass (forward first), and the transfer time nothing overlaps."""
    cache = {}

    def pair_ms(rank, step, p):
        total = 0.0
        for b in pair_blocks(layout, rank, kv_source(rank, step, world), world, n, causal):
            key = (b.q_len, b.k_len, b.causal, p)
            if key not in cache:
                cache[key] = predict(pair_workload(b, pass_=p, **shape), schedule, prof, l2=l2).predicted_ms
            total += cache[key]
        return total

    batch, heads, heads_kv, d = shape["batch"], shape["heads"], shape["heads_kv"], shape["head_dim"]
    e = DTYPE_BYTES[shape["dtype"]]
    kv_bytes = kv_shard_bytes(batch, heads_kv, n, d, shape["dtype"])
    dkv_bytes = 2 * batch * heads_kv * n * d * ACC_BYTES
    steps, exposed = [], 0.0
    for p in ("fwd", "bwd"):
        if p not in pass_.split("+"):
            continue
        for t in range(world):
            rows = [sum(b.q_len for b in pair_blocks(layout, r, kv_source(r, t, world), world, n, causal))
                    for r in range(world)]
            if p == "fwd":
                # read the running out (float32) and the block's out, write out; lse read twice, written once
                merge_bytes = [batch * heads * q * (d * (2 * ACC_BYTES + e) + 3 * STAT_BYTES) for q in rows]
                sends = [kv_bytes] if t < world - 1 else []
            else:
                # dQ += block dQ (read, read, write); dK, dV likewise per key row; + the arriving dK/dV
                k_rows = [sum(b.k_len for b in pair_blocks(layout, r, kv_source(r, t, world), world, n, causal))
                          for r in range(world)]
                merge_bytes = [batch * heads * q * d * (2 * ACC_BYTES + e)
                               + 2 * batch * heads_kv * k * d * (2 * ACC_BYTES + e)
                               + (3 * dkv_bytes if t else 0) for q, k in zip(rows, k_rows)]
                sends = ([kv_bytes] if t < world - 1 else []) + ([dkv_bytes] if t and world > 1 else [])
            steps.append(RingStep(p, t, tuple(pair_ms(r, t, p) for r in range(world)), sum(sends),
                                  sum(link.transfer_ms(s) for s in sends),
                                  1e3 * max(merge_bytes) / prof.hbm_bandwidth_bytes_per_s))
        if p == "bwd" and world > 1:
            exposed += link.transfer_ms(dkv_bytes)      # the last dK/dV, to the shard's owner
    return steps, exposed

