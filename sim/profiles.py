"""Hardware profiles: what the cost model knows about a GPU, as data.

Profiles live in ``sim/profiles/*.json`` (one object per GPU, every figure with its source in
``sources``). :data:`PROFILES` maps a short name (``a100-40gb``, ``a100-80gb``, ``h100``,
``h200``, ``t4``) to a :class:`GPUProfile`; :func:`load_profile` also reads a user's JSON file,
and a custom profile can be built directly from keyword arguments.

Measured rates (a file of ``python -m benchmarks rates``, schema ``ioaware.rates/1``) join a
profile only when asked: ``load_profile("h100", rates="rates.json")`` or
``profile.with_rates("rates.json")`` return a new profile whose ``measured_rates`` holds them
(:data:`RATE_UNITS` names each rate and its unit); nothing is read from a folder by itself.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["GPUProfile", "PROFILES", "PROFILE_DIR", "RATES_SCHEMA", "RATE_UNITS",
           "DECODE_RATE_UNITS", "DECODE_HEAD_DIMS", "DECODE_STREAM_PROGRAMS", "DECODE_TIMES",
           "decode_rate_name", "decode_rate_names", "gpu_matches",
           "load_profile", "profile_for_gpu_name", "read_rates"]

PROFILE_DIR = Path(__file__).resolve().parent / "profiles"

# Aliases accepted by the CLI's --device and by load_profile.
_ALIASES = {"a100": "a100-80gb", "a100-40": "a100-40gb", "a100-80": "a100-80gb",
            "h100-sxm": "h100", "h200-sxm": "h200"}

#: The format of a measured rates file (``python -m benchmarks rates``).
RATES_SCHEMA = "ioaware.rates/1"

#: The measured rates a profile can carry (`GPUProfile.measured_rates`), each with its unit; the
#: microbenchmark behind each is described in docs/measuring.md and in the file's ``how``.
RATE_UNITS = {
    "sm_clock_hz": "Hz",
    "dram_read_bytes_per_s": "bytes/s",
    "dram_write_bytes_per_s": "bytes/s",
    "dram_copy_bytes_per_s": "bytes/s",
    "l2_read_bytes_per_s": "bytes/s",
    "l2_hit_latency_s": "s",
    "smem_read_bytes_per_s_per_sm": "bytes/s",
    "smem_read_bytes_per_clk_per_sm": "bytes/clk",
    "smem_read_conflict32_bytes_per_s_per_sm": "bytes/s",
    "mma_fp16_flops_per_s": "flop/s",
    "mma_bf16_flops_per_s": "flop/s",
    "mma_tf32_flops_per_s": "flop/s",
    "wgmma_fp16_flops_per_s": "flop/s",
    "wgmma_bf16_flops_per_s": "flop/s",
    "wgmma_fp8_flops_per_s": "flop/s",
    "wgmma_wait_latency_s": "s",
    "wgmma_dependent_product_s": "s",
    "ffma_flops_per_s": "flop/s",
    "ex2_ops_per_s": "op/s",
    "cp_async_depth1_bytes_per_s": "bytes/s",
    "cp_async_depth2_bytes_per_s": "bytes/s",
    "cp_async_depth3_bytes_per_s": "bytes/s",
    "kernel_launch_s": "s",
    "kernel_launch_numba_s": "s",
}

#: Head dims and program counts at which ``python -m benchmarks rates --only decode`` measures
#: the split-KV kernel (the tensor-core kernel's head dims; the counts under the GPU's SMs).
DECODE_HEAD_DIMS = (64, 128)
DECODE_STREAM_PROGRAMS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 96, 112, 128)
#: The times of a decoding call it measures per head dim (`decode_rate_name`).
DECODE_TIMES = ("fixed", "fill", "handoff")


def gpu_matches(match, gpu: str) -> bool:
    """Whether a GPU name such as torch reports it holds one of a profile's ``match`` strings
    (case-insensitive)."""
    return any(str(m).lower() in str(gpu).lower() for m in match)


def decode_rate_name(head_dim: int, what: str, programs: int | None = None) -> str:
    """The rate name of one of the split-KV kernel's figures at ``head_dim``: ``what`` one of
    `DECODE_TIMES` (seconds), or "stream" with ``programs`` (bytes/s)."""
    if what == "stream":
        return f"decode_d{int(head_dim)}_stream_p{int(programs)}_bytes_per_s"
    if what not in DECODE_TIMES:
        raise ValueError(f"what must be one of {DECODE_TIMES} or 'stream', got {what!r}")
    return f"decode_d{int(head_dim)}_{what}_s"


def decode_rate_names(head_dim: int) -> dict:
    """The rate names of the split-KV kernel's figures at ``head_dim``, each with its unit: the
    GPU time of a call around its stream, the fill of a longer stream, the merge's handoff
    (`DECODE_TIMES`, seconds), and the stream's aggregate rate at each of
    `DECODE_STREAM_PROGRAMS` programs (bytes/s)."""
    return {decode_rate_name(head_dim, w): "s" for w in DECODE_TIMES} | {
        decode_rate_name(head_dim, "stream", p): "bytes/s" for p in DECODE_STREAM_PROGRAMS}


#: The split-KV decoding kernel's own figures at each of `DECODE_HEAD_DIMS` (group ``decode`` of
#: ``python -m benchmarks rates``; `sim.decode` prices its plan and picks its split count with
#: them): `decode_rate_names`.
DECODE_RATE_UNITS = {n: u for d in DECODE_HEAD_DIMS for n, u in decode_rate_names(d).items()}
RATE_UNITS.update(DECODE_RATE_UNITS)


@dataclass(frozen=True)
class GPUProfile:
    """One GPU, as the cost model sees it. Units are in the field names (bytes, bytes/s, FLOP/s).

    ``tensor_flops_per_s`` maps a dtype (``fp16``, ``bf16``, ``tf32``) to the dense tensor-core
    matmul peak; a dtype missing there runs its matmuls on CUDA cores at ``fp32_flops_per_s``.
    ``l2_bandwidth_bytes_per_s`` is not a datasheet figure on any GPU: the shipped values are
    estimates and say so in ``sources``. ``smem_bytes_per_clk_per_sm`` (shared-memory bandwidth
    of one SM: 32 banks x 4 bytes per clock) and ``sm_clock_hz`` give
    :attr:`smem_bandwidth_bytes_per_s`, the shared-memory level of the roofline (None: no level).
    The register file (``registers_per_sm`` 32-bit registers, allocated per warp in units of
    ``register_alloc_unit`` registers, in ``register_sub_partitions`` equal parts per SM; at most
    ``max_registers_per_thread`` per thread) sets the register limit of the occupancy model
    (:func:`sim.workload.occupancy`); None: registers do not limit occupancy.
    ``async_copy_counted_sectors_per_512b`` is how many 32-byte sectors the L1TEX load counter
    (ncu ``l1tex__t_sectors_pipe_lsu_mem_global_op_ld``) counts for one warp's ``cp.async`` of
    512 contiguous bytes (16 per thread): 16 would be the bytes moved; None: counted as moved.
    It changes the predicted *counter* of global-load bytes only, not DRAM/L2 traffic or time.
    ``interconnect_bandwidth_bytes_per_s`` (one direction, GPU to GPU) and
    ``interconnect_latency_s`` price a transfer to a neighbouring GPU as ``latency + bytes /
    bandwidth`` (:mod:`sim.ring`); None: not known (the ring model then needs them given).
    ``compute_capability`` (major, minor) decides what our launchers choose on this GPU where
    that depends on the hardware (the mma backward's dQ mode,
    `sim.plans.tensor_core_bwd.mma_default_dq_mode`); None: not known.

    ``measured_rates`` (None unless asked for: :meth:`with_rates`, ``load_profile(...,
    rates=PATH)``) maps a rate's name to its value measured on a GPU by ``python -m benchmarks
    rates``; :meth:`rate` reads one with a default. The names, with their units
    (:data:`RATE_UNITS`):

    * ``sm_clock_hz`` (Hz): SM clock while a spin kernel runs (cycles counted / event time);
    * ``dram_read_bytes_per_s``, ``dram_write_bytes_per_s``, ``dram_copy_bytes_per_s``
      (bytes/s): 16-byte vector loads, stores, load + store (read + write bytes counted) over
      buffers of at least 4x L2, many waves of blocks;
    * ``l2_read_bytes_per_s`` (bytes/s): 16-byte loads that bypass L1, repeated over a buffer
      of about L2 / 4; ``l2_hit_latency_s`` (s): one dependent load (pointer chase) that hits L2;
    * ``smem_read_bytes_per_s_per_sm`` (bytes/s) and ``smem_read_bytes_per_clk_per_sm``
      (bytes/clk, with the measured clock): one SM's conflict-free 4-byte shared loads;
      ``smem_read_conflict32_bytes_per_s_per_sm`` (bytes/s): the same with every warp's load
      32-way bank-conflicted (useful bytes counted);
    * ``mma_fp16_flops_per_s``, ``mma_bf16_flops_per_s`` (``mma.sync`` m16n8k16, f32
      accumulate), ``mma_tf32_flops_per_s`` (m16n8k8) (flop/s, 2 per multiply-add);
    * ``wgmma_fp16_flops_per_s``, ``wgmma_bf16_flops_per_s`` (``wgmma.mma_async`` m64n64k16, f32
      accumulate), ``wgmma_fp8_flops_per_s`` (m64n64k32, e4m3) (flop/s): Hopper's warpgroup
      products, A and B from shared memory, several warpgroups per SM (sm_90a only);
    * ``wgmma_wait_latency_s``, ``wgmma_dependent_product_s`` (s): one warpgroup alone on its
      SM issuing commit groups of a dependent chain of m64n64k16 float16 products and waiting
      for each: the time per group against the chain's length is a line, its intercept the
      first (what a waited-for group costs beyond its products), its slope the second (sm_90a
      only; the first prices the "wait" level of the plans that declare waits, `sim.plan`);
    * ``ffma_flops_per_s`` (flop/s, 2 per FMA): float32 FMA chains on CUDA cores;
    * ``ex2_ops_per_s`` (op/s): ``ex2.approx.ftz.f32`` (the MUFU unit) results per second;
    * ``cp_async_depth{1,2,3}_bytes_per_s`` (bytes/s): DRAM -> shared copies by ``cp.async``
      with 1, 2 or 3 tiles in flight per block;
    * ``kernel_launch_s``, ``kernel_launch_numba_s`` (s): host time per launch of an empty
      kernel, back to back, through `kernels.host.launch` and through Numba's own launch;
    * the split-KV decoding kernel's own (:data:`DECODE_RATE_UNITS`, per head dim ``D`` of
      `DECODE_HEAD_DIMS`): ``decode_dD_fixed_s`` (s), the GPU time of a one-split call around
      its stream where each warp's ring holds all its blocks; ``decode_dD_fill_s`` (s), what a
      longer stream adds once (a warp waits for its ring's first block before it refills it);
      ``decode_dD_handoff_s`` (s), what a second split adds at the same stream (the partials,
      the ticket, the merge); ``decode_dD_stream_pP_bytes_per_s`` (bytes/s), the aggregate
      stream rate of ``P`` programs.

    ``decode_rates`` holds the last group as shipped with the profile (measured on one GPU of
    the model, ``sources["decode_rates"]`` says where; written by ``python -m benchmarks rates
    --to-profile``): the split-KV plan reads it to pick its split count where no rates file is
    given, as the launcher does (`sim.decode.decode_rates`); a rates file's own decode group
    replaces it.

    The datasheet fields above stay as they are; a rate's presence changes no prediction by
    itself (the time model reads what it chooses through :meth:`rate`).
    """

    name: str
    hbm_bandwidth_bytes_per_s: float
    l2_bytes: int
    num_sms: int
    smem_bytes_per_sm: int
    smem_bytes_per_block: int
    fp32_flops_per_s: float
    tensor_flops_per_s: dict = field(default_factory=dict)
    l2_bandwidth_bytes_per_s: float | None = None
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    smem_bytes_per_clk_per_sm: float | None = None
    sm_clock_hz: float | None = None
    memory_bytes: int | None = None
    registers_per_sm: int | None = None
    register_alloc_unit: int | None = None
    register_sub_partitions: int | None = None
    max_registers_per_thread: int | None = None
    async_copy_counted_sectors_per_512b: int | None = None
    interconnect_bandwidth_bytes_per_s: float | None = None
    interconnect_latency_s: float | None = None
    compute_capability: tuple | None = None
    description: str = ""
    match: tuple = ()
    sources: dict = field(default_factory=dict)
    measured_rates: dict | None = None
    decode_rates: dict | None = None

    def __post_init__(self) -> None:
        for name in ("hbm_bandwidth_bytes_per_s", "fp32_flops_per_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"GPUProfile.{name} must be a positive number, got {v!r}")
        for name in ("l2_bytes", "num_sms", "smem_bytes_per_sm", "smem_bytes_per_block",
                     "max_threads_per_sm", "max_blocks_per_sm"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"GPUProfile.{name} must be a positive integer, got {v!r}")
        for name in ("smem_bytes_per_clk_per_sm", "sm_clock_hz", "interconnect_bandwidth_bytes_per_s",
                     "interconnect_latency_s"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"GPUProfile.{name} must be a positive number or None, got {v!r}")
        regs = ("registers_per_sm", "register_alloc_unit", "register_sub_partitions",
                "max_registers_per_thread")
        for name in regs:
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"GPUProfile.{name} must be a positive integer or None, got {v!r}")
        given = [getattr(self, n) is not None for n in regs]
        if any(given) and not all(given):
            raise ValueError(f"GPUProfile: give all of {regs} or none, got "
                             f"{ {n: getattr(self, n) for n in regs} }")
        if self.registers_per_sm is not None and self.registers_per_sm % self.register_sub_partitions:
            raise ValueError("GPUProfile.registers_per_sm must be a multiple of register_sub_partitions")
        v = self.async_copy_counted_sectors_per_512b
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 16):
            raise ValueError(f"GPUProfile.async_copy_counted_sectors_per_512b must be an integer "
                             f">= 16 or None, got {v!r}")
        if self.smem_bytes_per_block > self.smem_bytes_per_sm:
            raise ValueError("GPUProfile.smem_bytes_per_block must be <= smem_bytes_per_sm")
        if not isinstance(self.tensor_flops_per_s, dict):
            raise TypeError("GPUProfile.tensor_flops_per_s must be a dict dtype -> FLOP/s")
        if self.measured_rates is not None:
            if not isinstance(self.measured_rates, dict):
                raise TypeError("GPUProfile.measured_rates must be a dict name -> value or None")
            for k, v in self.measured_rates.items():
                if not _positive(v):
                    raise ValueError(f"GPUProfile.measured_rates[{k!r}] must be a positive "
                                     f"finite number, got {v!r}")
        if self.decode_rates is not None:
            if not isinstance(self.decode_rates, dict):
                raise TypeError("GPUProfile.decode_rates must be a dict name -> value or None")
            for k, v in self.decode_rates.items():
                if k not in DECODE_RATE_UNITS:
                    raise ValueError(f"GPUProfile.decode_rates: unknown rate {k!r} (expected "
                                     f"names of sim.profiles.DECODE_RATE_UNITS)")
                if not _positive(v):
                    raise ValueError(f"GPUProfile.decode_rates[{k!r}] must be a positive "
                                     f"finite number, got {v!r}")
        object.__setattr__(self, "match", tuple(self.match))

    @property
    def smem_bandwidth_bytes_per_s(self) -> float | None:
        """Shared-memory bandwidth of the whole GPU: bytes/clk/SM x SMs x clock (None if the
        profile lacks either figure)."""
        if self.smem_bytes_per_clk_per_sm is None or self.sm_clock_hz is None:
            return None
        return float(self.smem_bytes_per_clk_per_sm) * self.num_sms * float(self.sm_clock_hz)

    @property
    def models_registers(self) -> bool:
        """Whether the profile has the register-file figures the occupancy model needs."""
        return self.registers_per_sm is not None

    def matmul_flops_per_s(self, dtype: str, unit: str = "tensor") -> float:
        """Peak matmul FLOP/s for ``dtype`` on ``unit`` ("tensor" or "cuda").

        fp32 on "tensor" uses the TF32 peak only if the profile lists ``tf32`` *and* the caller
        asks for unit "tf32"; otherwise fp32 matmuls run on CUDA cores.
        """
        if unit == "cuda":
            return self.fp32_flops_per_s
        key = "tf32" if unit == "tf32" else dtype
        if unit == "tensor" and dtype == "fp32":
            return self.fp32_flops_per_s
        return float(self.tensor_flops_per_s.get(key, self.fp32_flops_per_s))

    def rate(self, name: str, default=None):
        """The measured rate ``name`` (a key of :data:`RATE_UNITS`, in its unit), or
        ``default`` where the profile carries no measured value of it."""
        if name not in RATE_UNITS:
            raise ValueError(f"unknown rate {name!r}: expected one of {sorted(RATE_UNITS)}")
        if not self.measured_rates or name not in self.measured_rates:
            return default
        return float(self.measured_rates[name])

    def with_rates(self, rates, *, check_gpu: bool = True) -> "GPUProfile":
        """A copy of this profile carrying the measured rates of ``rates`` (a path to a file of
        ``python -m benchmarks rates``, or its parsed JSON object) as ``measured_rates``; the
        file is named in ``sources["measured_rates"]``. With ``check_gpu`` the GPU the file was
        measured on must match one of the profile's ``match`` strings (when it has any).
        Raises FileNotFoundError / ValueError naming ``rates``."""
        doc, origin = read_rates(rates)
        prov = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
        gpu = str(prov.get("gpu", "unknown GPU"))
        if check_gpu and self.match and not gpu_matches(self.match, gpu):
            raise ValueError(f"rates: {origin} was measured on {gpu!r}, which profile "
                             f"{self.name!r} does not match (match strings {list(self.match)}); "
                             f"pass check_gpu=False to use it anyway")
        values = {}
        for name, entry in doc["rates"].items():
            if not isinstance(entry, dict) or not _positive(entry.get("value")):
                raise ValueError(f"rates: {origin}: rate {name!r} needs a positive finite "
                                 f"'value', got {entry!r}")
            unit = RATE_UNITS.get(name)
            if unit is not None and entry.get("unit") != unit:
                raise ValueError(f"rates: {origin}: rate {name!r} must be in {unit!r}, the file "
                                 f"says {entry.get('unit')!r}")
            values[name] = float(entry["value"])
        code = prov.get("code_version") if isinstance(prov.get("code_version"), dict) else {}
        note = (f"MEASURED by python -m benchmarks rates: {origin} ({gpu}, {prov.get('date')}, "
                f"code {code.get('commit', 'unknown')}, command: {prov.get('command')})")
        return dataclasses.replace(self, measured_rates=values,
                                   sources=dict(self.sources, measured_rates=note))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["match"] = list(self.match)
        return d


def _from_dict(data: dict, origin: str) -> GPUProfile:
    if not isinstance(data, dict):
        raise ValueError(f"profile {origin}: expected a JSON object")
    known = set(GPUProfile.__dataclass_fields__)
    kwargs = {k: v for k, v in data.items() if k in known}
    for k in ("l2_bytes", "num_sms", "smem_bytes_per_sm", "smem_bytes_per_block",
              "max_threads_per_sm", "max_blocks_per_sm", "memory_bytes", "registers_per_sm",
              "register_alloc_unit", "register_sub_partitions", "max_registers_per_thread",
              "async_copy_counted_sectors_per_512b"):
        if isinstance(kwargs.get(k), float) and float(kwargs[k]).is_integer():
            kwargs[k] = int(kwargs[k])
    if kwargs.get("compute_capability") is not None:
        kwargs["compute_capability"] = tuple(int(x) for x in kwargs["compute_capability"])
    try:
        return GPUProfile(**kwargs)
    except TypeError as exc:
        raise ValueError(f"profile {origin}: {exc}") from None


def _positive(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v > 0)


def read_rates(rates) -> tuple[dict, str]:
    """(the rates document, where it came from) of a path or a parsed JSON object; raises
    FileNotFoundError / ValueError naming the ``rates`` argument."""
    if isinstance(rates, dict):
        doc, origin = rates, "<dict>"
    elif isinstance(rates, (str, os.PathLike)):
        path = Path(rates)
        if not path.is_file():
            raise FileNotFoundError(f"rates: no such file {str(rates)!r} (a file written by "
                                    f"python -m benchmarks rates)")
        origin = str(path)
        try:
            doc = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"rates: {origin} is not JSON ({exc})") from None
    else:
        raise TypeError(f"rates must be a path or a dict, got {type(rates).__name__}")
    if not isinstance(doc, dict) or doc.get("schema") != RATES_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"rates: {origin} is not a rates file (schema {RATES_SCHEMA!r} "
                         f"expected, got {got!r})")
    if not isinstance(doc.get("rates"), dict):
        raise ValueError(f"rates: {origin} has no 'rates' object")
    return doc, origin


def _load_shipped() -> dict[str, GPUProfile]:
    out = {}
    for path in sorted(PROFILE_DIR.glob("*.json")):
        with open(path) as f:
            prof = _from_dict(json.load(f), str(path))
        out[prof.name] = prof
    return out


PROFILES: dict[str, GPUProfile] = _load_shipped()


def load_profile(name_or_path, rates=None, *, check_gpu: bool = True) -> GPUProfile:
    """A profile by shipped name (``h100``, ``a100`` = ``a100-80gb``, ...), by JSON path, or as is.

    With ``rates`` (a rates file's path or parsed object), a copy carrying its measured rates
    (:meth:`GPUProfile.with_rates`, ``check_gpu`` as there); without, the profile unchanged.
    Raises ValueError naming the known profiles when the name is unknown.
    """
    prof = _load_profile(name_or_path)
    return prof if rates is None else prof.with_rates(rates, check_gpu=check_gpu)


def _load_profile(name_or_path) -> GPUProfile:
    if isinstance(name_or_path, GPUProfile):
        return name_or_path
    if isinstance(name_or_path, dict):
        return _from_dict(name_or_path, "<dict>")
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"profile must be a name, a path or a GPUProfile, got {type(name_or_path).__name__}")
    key = str(name_or_path).lower()
    key = _ALIASES.get(key, key)
    if key in PROFILES:
        return PROFILES[key]
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        with open(path) as f:
            return _from_dict(json.load(f), str(path))
    raise ValueError(f"unknown device/profile {name_or_path!r}: expected one of "
                     f"{sorted(PROFILES) + sorted(_ALIASES)} or a path to a profile .json file")


def profile_for_gpu_name(gpu: str) -> GPUProfile | None:
    """The shipped profile whose ``match`` strings occur in a GPU name such as torch reports it."""
    for prof in PROFILES.values():
        if gpu_matches(prof.match, gpu):
            return prof
    return None
