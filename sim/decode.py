"""The split-KV decoding plan ("flash-decoding"): what the ``split_kv`` kernel does, as data.

Decoding attends a few new query rows (``seqlen_q`` of 1 to 16) to a long KV cache. A
FlashAttention-2 grid (one program per Q tile per query head) then has few programs, leaves
most SMs idle and, with GQA, reads each KV head once per query head. The split-KV plan instead:

* runs one program per (batch, KV head, row chunk, key split): the program loads its split of
  the KV head's keys once and uses them for every query row of the KV group (the group's query
  heads times ``seqlen_q``; ``rows_per_program`` of them per chunk, so that the accumulators
  stay in registers), so K and V stream from DRAM once per KV head;
* splits the keys so that there are enough programs to fill the GPU: each program writes a
  partial output (normalised, float32) and its logsumexp;
* merges the partials in the same launch: the last program of each (batch, KV head, row chunk)
  to finish (an arrival counter per group) does the online-softmax merge the forward does
  between tiles, ``lse = logsumexp_s(lse_s)``, ``out = sum_s exp(lse_s - lse) out_s``. With one
  split there are no partials: the program writes the output.

Two kernels run the plan (its ``unit``): on the tensor cores (``"mma"``: float16/bfloat16 at
head dims 64 and 128; 16 rows a program, one ``mma.sync`` tile; each warp streams its own key
blocks through a ring of `MMA_STAGES` shared-memory buffers filled by ``cp.async``; `MMA_WARPS`
or `MMA_WARPS_FEW_PROGRAMS` warps a program) and on the CUDA cores (``"ffma"``: any input, and the only
one under the CUDA simulator; the rows its lanes keep in registers, `rows_per_program`).

:func:`split_kv_plan` builds the plan from the problem's sizes and the GPU's SM count and
shared memory (the kernel, its warps and resident programs, the number of splits: the cheapest
by :func:`split_kv_costs` where the GPU's profile has the kernel's measured decode figures,
:func:`decode_rates`, else :func:`choose_splits`, or given); `kernels.decode_fwd` launches
exactly this plan (its kernel, grid, threads, row chunks and shared memory, on the profile of
the device), and :func:`split_kv_costs` prices it: bytes per memory level, FLOPs and time on a
`sim.profiles.GPUProfile`. This module is pure Python.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from .plan import rates_of
from .workload import RESERVED_SMEM_PER_BLOCK

__all__ = ["SplitKVPlan", "split_kv_plan", "choose_splits", "split_candidates", "split_kv_costs",
           "decode_figures", "decode_rates", "stream_rate", "plan_decode_rates", "WARPS",
           "KEYS_PER_STEP", "MAX_SEQLEN_Q", "rows_per_program", "lanes_per_key", "elements_per_lane"]

#: Warps per program (a GPU launch; the CUDA simulator runs 2 to keep tests short).
WARPS = 4
#: Keys a lane group takes per step of its loop (loaded together, reduced together).
KEYS_PER_STEP = 4
#: The most query rows per sequence the decoding kernel takes (speculative decoding).
MAX_SEQLEN_Q = 16
#: Query-row elements a lane keeps in registers (rows x head-dim elements per lane, for Q and
#: for the accumulator each): 32, e.g. 4 rows of 8 elements for 16-bit inputs at any head dim.
MAX_ROW_ELEMENTS_PER_LANE = 32
#: Resident programs per SM the split choice and the time assume: 128 threads of over 200
#: registers each (ptxas, bfloat16 d=128, 4 rows), so two programs fit an SM's 65,536 registers
#: and three do not.
RESIDENT_PROGRAMS_PER_SM = 2
#: The fewest keys a split keeps (each warp then still runs a few steps).
MIN_KEYS_PER_SPLIT = 256
#: The most splits: what the model picks from and a `kernels.KernelConfig` may ask for (the
#: merging program keeps a weight per row and split in shared memory).
MAX_SPLITS = 128

# -- the tensor-core kernel (``unit`` "mma") ---------------------------------------------------
#: Head dims the tensor-core kernel takes (float16/bfloat16 only; compute capability 8.0 on).
MMA_HEAD_DIMS = (64, 128)
#: Its rows per program: one 16-row ``mma`` tile (the KV group's rows, padded).
MMA_ROWS = 16
#: Its warps per program: four where the programs fill the GPU (two resident an SM at
#: d = 128), eight where the (batch, KV head, row chunk) groups are fewer than the SMs (the
#: split count then makes about one program an SM). A warp runs one block at a time (its
#: loads, ``mma`` and softmax in turn), so the few-programs calls are bound by that chain; twice
#: the warps a program halve each warp's share of the split (docs/kernels.md has the figures,
#: ``python -m benchmarks decode --warps 4|8``).
MMA_WARPS = 4
MMA_WARPS_FEW_PROGRAMS = 8
#: The warp counts a `kernels.KernelConfig(decode_warps=...)` may pin.
MMA_WARP_CHOICES = (4, 8)
#: Keys per warp block, and each warp's ring of shared-memory buffers (blocks in flight while
#: one is computed: stages - 1).
MMA_BLOCK_K = 16
MMA_STAGES = 2
#: Its registers a thread, per (head dim, warps): bounds the CPU ptxas test holds the kernel
#: to (ptxas for sm_90, bfloat16, with or without the band test: 168 and 128 at 2026-11-28).
#: With registers allocated per warp in units of 256, these make two programs of four warps an
#: SM at d = 128 (which the launch's carveout holds it to: ptxas's 168 would let a third in)
#: and four at d = 64; one of eight warps at either.
MMA_REGISTERS = {(64, 4): 128, (64, 8): 130, (128, 4): 170, (128, 8): 170}
#: The rate (`sim.plan.RATE_NAMES`) the plan streams its DRAM bytes at: the read bandwidth, as
#: the kernel reads its cache once and writes almost nothing (the copy rate the tiled plans take
#: mixes reads and writes).
DRAM_RATE = "dram_read_bytes_per_s"
#: Shared memory per SM the resident count assumes where the caller gives none (sm_90: 228 KiB,
#: of which 1 KiB per resident program is the system's).
SMEM_BYTES_PER_SM = 228 * 1024


def mma_shared_bytes(head_dim: int, warps: int = MMA_WARPS, block_k: int = MMA_BLOCK_K,
                     stages: int = MMA_STAGES) -> tuple[int, int]:
    """``(dynamic, static)`` shared-memory bytes of one tensor-core program: each warp's ring
    of ``stages`` K and V buffers (``block_k`` rows of ``head_dim + 8`` halves: rows padded by
    16 bytes, so that ``ldmatrix`` reads have no bank conflicts; after the loop the warps'
    accumulators meet there), and the rows' statistics (each warp's max and sum, each row's
    1 / sum and logsumexp, the ticket)."""
    dynamic = warps * stages * 2 * block_k * (head_dim + 8) * 2
    static = 4 * (2 * warps * MMA_ROWS + 2 * MMA_ROWS + 1)
    return dynamic, static


def uses_tensor_cores(head_dim: int, element_bytes: int) -> bool:
    """Whether the decoding plan of this head dim and element size runs the tensor-core kernel
    (16-bit inputs at `MMA_HEAD_DIMS`; float32 and other head dims run the CUDA-core one)."""
    return element_bytes == 2 and head_dim in MMA_HEAD_DIMS


def mma_resident_per_sm(head_dim: int, smem_bytes_per_sm: int = SMEM_BYTES_PER_SM,
                        warps: int = MMA_WARPS) -> int:
    """Programs of ``warps`` warps of the tensor-core kernel one SM holds at once: by shared
    memory (its own plus 1 KiB each) and by registers (`MMA_REGISTERS`, allocated per warp in
    units of 256, of an SM's 65,536); ``head_dim`` one of `MMA_HEAD_DIMS`. The launch holds the
    SM to it: it asks for the shared-memory carveout that fits just this many programs
    (`kernels.host`), so the rest stays L1 for the kernel's ``cp.async.ca`` copies (at d = 128,
    four warps, a third program fits by ptxas's 168 registers and the whole carveout; it ran
    the B = 64 calls 11–22 % slower, H200, 2026-11-28)."""
    dynamic, static = mma_shared_bytes(head_dim, warps, MMA_BLOCK_K, MMA_STAGES)
    per_warp = -(-MMA_REGISTERS[head_dim, warps] * 32 // 256) * 256
    by_registers = 65536 // (per_warp * warps)
    return max(1, min(by_registers, smem_bytes_per_sm // (dynamic + static
                                                         + RESERVED_SMEM_PER_BLOCK)))


def lanes_per_key(head_dim: int, element_bytes: int) -> int:
    """Lanes that share one key row: each holds four 4-byte words (8 elements of 16 bits, or 4
    of float32) of it, between 4 and 32 lanes (a power of two). Fewer lanes per key mean fewer
    shuffles to sum a score and more keys at once per warp."""
    words = max(1, head_dim * element_bytes // 4)
    lanes = 4
    while lanes < 32 and lanes * 4 < words:
        lanes *= 2
    return lanes


def elements_per_lane(head_dim: int, element_bytes: int) -> int:
    """Elements of a key row (and of each query row) one lane holds."""
    per_word = max(1, 4 // element_bytes)
    words = -(-head_dim // per_word)
    return -(-words // lanes_per_key(head_dim, element_bytes)) * per_word


def rows_per_program(rows: int, head_dim: int, element_bytes: int = 2) -> int:
    """Query rows one program keeps in registers: all ``rows`` of a KV group when they fit
    (``rows x elements_per_lane <= MAX_ROW_ELEMENTS_PER_LANE``), else the largest power of
    two that fits."""
    cap = max(1, MAX_ROW_ELEMENTS_PER_LANE // elements_per_lane(head_dim, element_bytes))
    if rows <= cap:
        return max(rows, 1)
    return 1 << (cap.bit_length() - 1)


def choose_splits(programs: int, seqlen_k: int, num_sms: int,
                  resident_per_sm: int = RESIDENT_PROGRAMS_PER_SM) -> int:
    """Splits of the keys for ``programs`` programs (batch x KV heads x row chunks) on a GPU of
    ``num_sms`` SMs: the most splits that keep every program resident at once, i.e. the largest
    s with ``programs * s <= wave`` (one wave = ``num_sms * resident_per_sm`` programs), each
    split keeping at least `MIN_KEYS_PER_SPLIT` keys, at most `MAX_SPLITS`; 1 when the programs
    fill a wave already.

    Why: a program streams its keys at a rate set by the loads it keeps in flight, not by the
    GPU's bandwidth, so the cache streams fastest with every resident slot busy; past one wave
    the last wave's tail and the merge's partials only add time. (FlashAttention-2's rule, the
    fewest splits within 85 % of the best wave efficiency, took 14 or 29 splits where this
    CUDA-core kernel ran 7–8 % faster with 16 or 32 on an H100: the B = 1 cases of the H100
    decode grid this rule was written on; docs/model.md has the grids that score it.)"""
    wave = max(1, num_sms * resident_per_sm)
    most = max(1, min(MAX_SPLITS, seqlen_k // MIN_KEYS_PER_SPLIT))
    if programs >= wave:
        return 1
    return max(1, min(most, wave // max(programs, 1)))


def split_candidates(programs: int, seqlen_k: int, num_sms: int,
                     resident_per_sm: int = RESIDENT_PROGRAMS_PER_SM) -> list[int]:
    """The split counts the priced choice (:func:`split_kv_plan` with a GPU's decode rates)
    weighs: 1, the powers of two up to :func:`choose_splits`'s one-wave fill, and that fill."""
    fill = choose_splits(programs, seqlen_k, num_sms, resident_per_sm)
    out, s = {1, fill}, 2
    while s < fill:
        out.add(s)
        s *= 2
    return sorted(out)


def decode_figures(table: dict, head_dim: int) -> dict | None:
    """The split-KV kernel's figures at ``head_dim`` in ``table`` (rate name -> value, the names
    of `sim.profiles.decode_rate_names`), as ``{"fixed": s, "fill": s, "handoff": s, "stream":
    {programs: bytes/s}}``; None where it lacks one of the three times or every stream rate."""
    from .profiles import DECODE_STREAM_PROGRAMS, DECODE_TIMES, decode_rate_name
    times = {w: table.get(decode_rate_name(head_dim, w)) for w in DECODE_TIMES}
    stream = {}
    for p in DECODE_STREAM_PROGRAMS:
        v = table.get(decode_rate_name(head_dim, "stream", p))
        if v is not None:
            stream[p] = float(v)
    if not stream or any(v is None for v in times.values()):
        return None
    return {w: float(v) for w, v in times.items()} | {"stream": stream}


def decode_rates(gpu, head_dim: int) -> tuple[dict, str] | None:
    """``(figures, source)``: the split-KV kernel's own measured figures at ``head_dim``
    (`decode_figures`) on ``gpu`` (a `sim.profiles.GPUProfile`): a rates file's decode group
    where the profile was loaded with one that has them (source "measured"), else the profile's
    shipped ``decode_rates`` (source "profile"); None where neither has them at that head dim."""
    for source, table in (("measured", getattr(gpu, "measured_rates", None)),
                          ("profile", getattr(gpu, "decode_rates", None))):
        got = decode_figures(table or {}, head_dim)
        if got is not None:
            return got, source
    return None


def stream_rate(stream: dict, programs: int) -> float:
    """The aggregate bytes/s of ``programs`` programs streaming at once, from ``stream``
    (measured program counts -> bytes/s, `decode_rates`): linear between the two measured
    counts around it, each program at the first one's per-program rate below it, the last one's
    aggregate above it."""
    points = sorted(stream.items())
    p = max(int(programs), 1)
    if p <= points[0][0]:
        return points[0][1] * p / points[0][0]
    for (p0, a0), (p1, a1) in zip(points, points[1:]):
        if p <= p1:
            return a0 + (a1 - a0) * (p - p0) / (p1 - p0)
    return points[-1][1]


def plan_decode_rates(plan: "SplitKVPlan", gpu) -> tuple[dict, str] | None:
    """The measured figures that price ``plan`` on ``gpu`` (`decode_rates` at its head dim), or
    None: the CUDA-core kernel, plans of more than one row chunk a KV head (chunks share their
    K/V through L2, which the microbenchmark's programs do not) and GPUs without figures at that
    head dim keep the bandwidth-and-waves price and the one-wave rule."""
    if plan.unit != "mma" or plan.row_chunks != 1 or gpu is None:
        return None
    return decode_rates(gpu, plan.head_dim)


@dataclass(frozen=True)
class SplitKVPlan:
    """One split-KV decoding call, as launched: sizes of the problem and of the launch.

    ``grid`` is the kernel's ``(batch * heads_kv * row_chunks, splits)``; each of its programs
    has ``warps * 32`` threads and keeps ``rows_per_program`` query rows; the last program of
    each of the ``programs`` groups to finish merges the group's splits.
    """

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    element_bytes: int
    rows_per_program: int
    row_chunks: int
    splits: int
    warps: int
    keys_per_step: int
    lanes_per_key: int = 32
    #: "ffma" (the CUDA-core kernel) or "mma" (the tensor-core kernel; ``keys_per_step`` is then
    #: a warp's block of keys, ``stages`` its ring of shared-memory buffers).
    unit: str = "ffma"
    stages: int = 0
    dynamic_shared_bytes: int = 0
    resident_per_sm: int = RESIDENT_PROGRAMS_PER_SM

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    @property
    def programs(self) -> int:
        """Programs per split (and groups whose splits one program merges): batch x KV heads x
    row chunks."""
        return self.batch * self.heads_kv * self.row_chunks

    @property
    def grid(self) -> tuple[int, int]:
        return (self.programs, self.splits)

    @property
    def threads(self) -> int:
        return self.warps * 32

    def as_dict(self) -> dict:
        return asdict(self) | {"grid": list(self.grid), "threads": self.threads}


def split_kv_plan(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int,
                  head_dim: int, element_bytes: int, num_sms: int, splits: int | None = None,
                  warps: int = WARPS, tensor_cores: bool | None = None,
                  smem_bytes_per_sm: int = SMEM_BYTES_PER_SM,
                  mma_warps: int | None = None, gpu=None) -> SplitKVPlan:
    """The plan of one decoding call: the kernel (the tensor-core one where
    :func:`uses_tensor_cores`, unless ``tensor_cores`` says otherwise: the CUDA simulator runs
    no tensor-core instruction), rows per program and row chunks from the KV group's rows
    (``heads_q // heads_kv * seqlen_q``), splits by :func:`choose_splits` unless given.
    ``warps`` is the CUDA-core kernel's; the tensor-core kernel's are ``mma_warps``, by default
    `MMA_WARPS_FEW_PROGRAMS` where the (batch, KV head, row chunk) groups are fewer than the SMs,
    else `MMA_WARPS`.

    ``gpu``: a `sim.profiles.GPUProfile` (or a shipped profile's name). Where it has the
    tensor-core kernel's measured decode figures at the plan's head dim and the plan has one
    row chunk a KV head (`plan_decode_rates`), the split count is the
    cheapest of :func:`split_candidates` by :func:`split_kv_costs` (ties to fewer splits): more
    splits buy stream rate only until the programs saturate DRAM, and each split past the
    first costs the merge's handoff. Otherwise, and for the CUDA-core kernel,
    :func:`choose_splits`."""
    rows = (heads_q // heads_kv) * seqlen_q
    if tensor_cores is None:
        tensor_cores = uses_tensor_cores(head_dim, element_bytes)
    if tensor_cores:
        per = MMA_ROWS
        if mma_warps is None:
            few = batch * heads_kv * -(-rows // per) < num_sms
            mma_warps = MMA_WARPS_FEW_PROGRAMS if few else MMA_WARPS
        resident = mma_resident_per_sm(head_dim, smem_bytes_per_sm, mma_warps)
    else:
        per, resident = rows_per_program(rows, head_dim, element_bytes), RESIDENT_PROGRAMS_PER_SM
    chunks = -(-rows // per)
    if isinstance(gpu, str):
        from .profiles import load_profile
        gpu = load_profile(gpu)
    priced = splits is None and tensor_cores and gpu is not None
    if splits is None:
        splits = choose_splits(batch * heads_kv * chunks, seqlen_k, num_sms, resident)
    common = dict(batch=batch, heads_q=heads_q, heads_kv=heads_kv, seqlen_q=seqlen_q,
                  seqlen_k=seqlen_k, head_dim=head_dim, element_bytes=element_bytes,
                  rows_per_program=per, row_chunks=chunks, splits=int(splits),
                  resident_per_sm=resident)
    if tensor_cores:
        plan = SplitKVPlan(**common, warps=mma_warps, keys_per_step=MMA_BLOCK_K, unit="mma",
                           stages=MMA_STAGES,
                           dynamic_shared_bytes=mma_shared_bytes(head_dim, mma_warps, MMA_BLOCK_K,
                                                                 MMA_STAGES)[0])
        if priced and plan_decode_rates(plan, gpu):
            plans = [replace(plan, splits=s) for s in
                     split_candidates(plan.programs, seqlen_k, num_sms, resident)]
            plan = min(plans, key=lambda pl: (split_kv_costs(pl, gpu)["time_s"], pl.splits))
        return plan
    return SplitKVPlan(**common, warps=warps, keys_per_step=KEYS_PER_STEP,
                       lanes_per_key=lanes_per_key(head_dim, element_bytes))


def split_kv_costs(plan: SplitKVPlan, gpu, keys_read: int | None = None) -> dict:
    """Bytes, FLOPs and time of ``plan`` on ``gpu`` (a `sim.profiles.GPUProfile`).

    ``keys_read``: keys per sequence actually read (the cache length; default ``seqlen_k``).
    Counts (bytes are what the kernel loads and stores in global memory):

    * the split loop: K and V of each (batch, KV head) once per row chunk (``global``), once
      from DRAM (row chunks of one KV head run next to each other, so L2 serves the repeats);
      Q of each program's rows once per split; with more than one split, partial outputs and
      logsumexps written (float32);
    * the merge (more than one split; by the last program of each group): the partials read;
    * the output (in the input dtype: the cast is fused) and the float32 logsumexp written.

    Time, at the rates `sim.plan.price` prices every plan at (`sim.plan.rates_of`: the GPU's
    measured rates where its profile was loaded with a rates file, ``sim.load_profile(name,
    rates=FILE)``, else the datasheet's; ``rates`` says which): the main kernel streams its DRAM
    bytes at the DRAM read rate (`DRAM_RATE`) stretched by the last wave's idle SMs
    (``waves / ceil(waves)`` efficiency, one wave = ``num_sms`` times the plan's
    ``resident_per_sm`` programs) or runs its FLOPs at the FFMA rate (the CUDA-core kernel) or
    the tensor cores' 16-bit ``mma`` rate (the tensor-core kernel, its rows padded to 16),
    whichever is longer; the merge streams its partials' bytes at the same rate after that (the
    last programs merge at the end); the one launch adds the launch cost (``kernel_launch_s`` of
    a rates file, as `sim.plan.price` adds it per kernel; 0 at datasheet rates, which have none).

    The tensor-core kernel on a GPU with its own measured figures (`decode_rates`: a rates
    file's decode group, else the profile's shipped one; ``rates["decode"]`` says which) at its
    head dim, with one row chunk a KV head (`plan_decode_rates`), is priced by them instead:
    the call's fixed GPU time (``fixed``: launch, set-up, first round trip, output), plus the
    ring's fill (``fill``) where a warp's share of the
    split is more blocks than its ring of ``stages`` holds, plus its DRAM bytes at the measured
    stream rate of its programs at once (`stream_rate`; counted in eight-warp programs, the
    microbenchmark's: a four-warp program is half of one; past one wave, stretched by the last
    wave's idle slots as above), or its FLOPs, whichever is longer; with more than one split, plus the
    merge's handoff (``handoff``) and its partials at the read rate. No host launch
    cost: the figures are GPU time, as a captured decoding loop runs it.
    """
    p = plan
    keys = p.seqlen_k if keys_read is None else keys_read
    e = p.element_bytes
    kv_dram = p.batch * p.heads_kv * keys * 2 * p.head_dim * e
    q_bytes = p.batch * p.heads_q * p.seqlen_q * p.head_dim * e
    rows = p.batch * p.heads_q * p.seqlen_q
    partial_bytes = p.splits * rows * (p.head_dim + 1) * 4 if p.splits > 1 else 0
    out_bytes = rows * (p.head_dim * e + 4)                  # the output and its logsumexp
    main_global_read = kv_dram * p.row_chunks + q_bytes * p.splits
    main_dram = kv_dram + q_bytes + partial_bytes
    merge_bytes = partial_bytes
    flops = 4 * rows * keys * p.head_dim
    wave = gpu.num_sms * p.resident_per_sm
    waves = p.programs * p.splits / wave
    wave_efficiency = waves / math.ceil(waves) if waves > 0 else 1.0
    rates, sources = rates_of(gpu)
    bw = rates[DRAM_RATE]
    launches = 1
    launch_s = rates["launch_s"] or 0.0
    # the tensor-core kernel computes its padded 16-row tiles
    flops_run = flops * p.rows_per_program * p.row_chunks / max(p.group * p.seqlen_q, 1) \
        if p.unit == "mma" else flops
    unit_rate = (rates["mma_bf16_flops_per_s"] or rates["mma_f16_flops_per_s"]) \
        if p.unit == "mma" else rates["ffma_flops_per_s"]
    dec = plan_decode_rates(p, gpu)
    if dec is None:
        main_time = launch_s + max(main_dram / bw / wave_efficiency, flops_run / unit_rate)
        merge_time = merge_bytes / bw
    else:
        d, _ = dec
        # the programs at once, in the microbenchmark's eight-warp programs (a warp keeps the
        # same blocks in flight in either kernel); past one wave, the last wave's idle slots
        busy = min(p.programs * p.splits, wave) * p.warps / MMA_WARPS_FEW_PROGRAMS
        tail = wave_efficiency if waves > 1 else 1.0
        stream = main_dram / stream_rate(d["stream"], busy) / tail
        # a split of more blocks per warp than its ring holds waits once for the ring to fill
        per_warp = -(-(-(-keys // p.splits)) // (p.warps * p.keys_per_step))
        fill = d["fill"] if per_warp > p.stages else 0.0
        main_time = d["fixed"] + fill + max(stream, flops_run / unit_rate)
        merge_time = (d["handoff"] + merge_bytes / bw) if p.splits > 1 else 0.0
    return {
        "splits": p.splits,
        "rows_per_program": p.rows_per_program,
        "row_chunks": p.row_chunks,
        "grid": list(p.grid),
        "kv_bytes": kv_dram,
        "global_read_bytes": main_global_read + partial_bytes,
        "global_write_bytes": partial_bytes + out_bytes,
        "dram_read_bytes": kv_dram + q_bytes + partial_bytes,
        "dram_write_bytes": partial_bytes + out_bytes,
        "flops": flops,
        "wave_efficiency": wave_efficiency,
        "time_main_s": main_time,
        "time_merge_s": merge_time,
        "time_s": main_time + merge_time,
        "launches": launches,
        "rates": {name: sources[name] for name in (
            DRAM_RATE, "mma_bf16_flops_per_s" if p.unit == "mma" else "ffma_flops_per_s",
            "launch_s")} | ({"decode": dec[1]} if dec else {}),
    }
