"""What several commands of the lab share: timing by CUDA events, our kernels' calls, PyTorch
SDPA's backends, provenance, results files, and compiling kernels for sm_90 without a GPU.

* Timing (`time_cuda`, `event_ms`, `host_call_ms`, `peak_extra_bytes`): CUDA events around a
  call, median / p10 / p90 in milliseconds (`summarize_times`). Two methods (`TIMINGS`):
  ``"sync"`` times each synchronous call with its host code inside the timed span (what a
  caller that synchronises sees); ``"device"`` first enqueues a device-side sleep of
  `SLEEP_CYCLES` GPU cycles, so the host has enqueued the call before the GPU reaches the first
  event and only the GPU's time counts.
* Inputs and calls (`benchmark_inputs`, `attention_problem`, `attention_flops`, `sdpa_context`):
  the benchmark's shapes, the validated problem `kernels.forward` and `kernels.backward` take
  (built by `ioaware` from arrays), the FLOPs the benchmarks count, one SDPA backend at a time.
* Provenance (`provenance`): GPU, driver, CUDA, torch, numba, numba-cuda and NumPy versions, date
  (UTC), the exact command line (`command_line`), the code version (``git rev-parse --short
  HEAD`` and whether the working tree differs from it, `code_version`) and a fingerprint of the
  kernel sources (`kernels_fingerprint`).
* Compile-only helpers (`build_kernel`, `compile_sm90`, `parse_ptxas`): a kernel configuration
  built as the families build it, compiled to PTX by Numba and assembled by ``ptxas -v`` for
  sm_90 on the CPU; used by ``check`` and ``resources``, which need ``NUMBA_ENABLE_CUDASIM=0``
  (``python -m benchmarks`` sets it for them).
* Command lines: each command's one-line description (`first_sentence`) and usage examples
  (`doc_usage`) come from its module docstring.

Nothing here imports torch, numba or the kernels at import time.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import platform
import re
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "results"
KERNELS_DIR = ROOT / "kernels"
SCHEMA = "ioaware.results/1"

# ------------------------------------------------------------------------------------------------
# timing
# ------------------------------------------------------------------------------------------------

#: Timing methods (see the module docstring).
TIMINGS = ("sync", "device")
#: GPU clock cycles of the device-side sleep before a "device"-timed call (~2 ms at 2 GHz;
#: longer than the host code of one call).
SLEEP_CYCLES = 4_000_000


def summarize_times(times_ms) -> tuple[float, float, float]:
    """(median, 10th percentile, 90th percentile) of run times in ms, linear interpolation."""
    if not len(times_ms):
        raise ValueError("no run times to summarize")
    xs = sorted(float(t) for t in times_ms)

    def pct(p):
        pos = (len(xs) - 1) * p
        lo, hi = math.floor(pos), math.ceil(pos)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return pct(0.5), pct(0.1), pct(0.9)


def event_ms(torch, fn, sleep_cycles=0) -> float:
    """Milliseconds of one call of ``fn`` between two CUDA events; with ``sleep_cycles`` the
    stream first sleeps that many GPU cycles (outside the events) while the host enqueues."""
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    if sleep_cycles:
        torch.cuda._sleep(int(sleep_cycles))
    a.record()
    fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b)


def time_cuda(torch, fn, warmup=3, min_reps=5, max_reps=30, budget_s=0.4, timing="sync"):
    """(median, p10, p90) milliseconds of ``fn`` by CUDA events after ``warmup`` calls: at least
    ``min_reps`` and at most ``max_reps`` timed calls, more while under ``budget_s`` seconds of
    timed work; ``timing`` is one of `TIMINGS`. A call over 50 ms gets no warm-up and 3 calls."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    if event_ms(torch, fn, SLEEP_CYCLES if timing == "device" else 0) > 50.0:
        warmup, min_reps = 0, 3
    return time_interleaved(torch, {"fn": fn}, warmup, min_reps, max_reps, budget_s,
                            timing)["fn"]


def time_interleaved(torch, fns: dict, warmup=3, min_reps=5, max_reps=30, budget_s=0.4,
                     timing="sync") -> dict:
    """``{name: (median, p10, p90)}`` milliseconds of each of ``fns`` (name -> callable), timed
    as `time_cuda` times one, but in rounds: each round times every callable once, in turn, so
    that a drift of the GPU's state over the run (clocks, power, temperature) reaches them all
    alike rather than whichever ran last. At least ``min_reps`` and at most ``max_reps`` rounds,
    more while the slowest callable's timed work is under ``budget_s`` seconds; ``warmup`` calls
    of each first. With one callable this is `time_cuda`'s loop."""
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {TIMINGS}, got {timing!r}")
    if not fns:
        return {}
    sleep = SLEEP_CYCLES if timing == "device" else 0
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    rounds = 0
    while rounds < max_reps and (rounds < min_reps
                                 or max(sum(t) for t in times.values()) < budget_s * 1e3):
        for name, fn in fns.items():
            times[name].append(event_ms(torch, fn, sleep))
        rounds += 1
    return {name: summarize_times(t) for name, t in times.items()}


def error_text(exc) -> str:
    """An exception as a results file records it: its type and first 160 characters."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"


def time_or_error(torch, fn, timing="sync") -> dict:
    """``{"ms": ...}``: `time_cuda`'s median of ``fn`` (``timing`` as it takes it) under
    ``torch.inference_mode`` after one warm-up call, or ``{"error": ...}`` when it raises (a
    backend that refuses the case, or runs out of memory, is a result; the cache is emptied for
    the next)."""
    try:
        with torch.inference_mode():
            fn()
            torch.cuda.synchronize()
            return {"ms": time_cuda(torch, fn, timing=timing)[0]}
    except Exception as exc:  # noqa: BLE001 - a contender that refuses is a result
        torch.cuda.empty_cache()
        return {"error": error_text(exc)}


def host_call_ms(torch, fn, reps=10) -> float:
    """Median milliseconds the host spends in one call of ``fn`` (its Python code and launches,
    not the GPU's work): each call is made while the GPU sleeps, so it returns once enqueued."""
    import time
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return summarize_times(times)[0]


def loop_call_us(torch, fn, calls=200) -> float:
    """Mean microseconds the host spends per call of ``fn`` over ``calls`` calls in a row, made
    while the GPU sleeps (so every call returns once enqueued): the rate at which a loop of
    such calls can issue work, steadier than one call's time on a busy host."""
    import time
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(100 * SLEEP_CYCLES)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def peak_extra_bytes(torch, fn) -> int:
    """Peak device memory allocated during ``fn`` above what was allocated before it, bytes."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated() - base)


def attention_flops(batch, heads, seq_len_q, seq_len_k, head_dim, causal, pass_) -> float:
    """FLOPs of attention as the benchmarks count them: 4 B H Nq Nk d per forward (two
    matmuls), halved when causal; ``pass_`` "fwd+bwd" counts 3.5 forwards, "bwd" 2.5."""
    f = 4.0 * batch * heads * seq_len_q * seq_len_k * head_dim * (0.5 if causal else 1.0)
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}[pass_]


# ------------------------------------------------------------------------------------------------
# inputs, our kernels, PyTorch SDPA
# ------------------------------------------------------------------------------------------------

TORCH_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
#: PyTorch SDPA's backends by the name results files give them (`torch.nn.attention.SDPBackend`).
SDPA_BACKENDS = {"sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION",
                 "sdpa-cudnn": "CUDNN_ATTENTION", "sdpa-math": "MATH"}


def torch_dtype(torch, name: str):
    """The torch dtype of a results file's dtype name ("fp32", "fp16", "bf16")."""
    return getattr(torch, TORCH_DTYPES[name])


def benchmark_inputs(torch, dtype: str, head_dim: int, seq_len: int, batch=None, heads=None):
    """``(batch, heads, q, k, v, dout)`` of the benchmark's shape for (dtype, d, N): B * N =
    16384 tokens and H * d = 2048 (FlashAttention's benchmark shapes; ``batch`` / ``heads``
    given: those), random normal on the current CUDA device, seeded by N + d."""
    b = max(1, 16384 // seq_len) if batch is None else int(batch)
    h = max(1, 2048 // head_dim) if heads is None else int(heads)
    g = torch.Generator(device="cuda").manual_seed(seq_len + head_dim)
    q, k, v, dout = (torch.randn(b, h, seq_len, head_dim, device="cuda",
                                 dtype=torch_dtype(torch, dtype), generator=g) for _ in range(4))
    return b, h, q, k, v, dout


def sdpa_context(kernel: str):
    """A context that restricts SDPA to ``kernel``'s backend (`SDPA_BACKENDS`); a no-op for
    other kernels."""
    if kernel not in SDPA_BACKENDS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[kernel])])


def attention_problem(q, k, v, *, causal=False, scale=None, **kw):
    """The problem `kernels.forward` / `kernels.backward` take, validated by `ioaware` from
    4-D arrays [B, H, N, d] (``kw``: mask, block_mask, dropout_p, seed, ...)."""
    from ioaware._inputs import check_inputs
    return check_inputs(q, k, v, causal=causal, scale=scale, **kw)


def first_sentence(doc: str) -> str:
    """A command's one-line description: the first sentence of its module docstring, after
    "Command ``name``: "."""
    text = " ".join((doc or "").split())
    if text.startswith("Command ") and ": " in text:
        text = text.split(": ", 1)[1]
    return text.split(". ")[0].rstrip(".")


def doc_usage(doc: str) -> str:
    """The first block of indented lines of a module docstring (its usage examples)."""
    lines, block = (doc or "").splitlines(), []
    for line in lines:
        if line.startswith("    ") or (block and line.startswith(" ")):
            block.append(line)
        elif block:
            break
    return "usage examples:\n" + "\n".join(block) if block else ""


# ------------------------------------------------------------------------------------------------
# provenance and results files
# ------------------------------------------------------------------------------------------------

def command_line(command: str, argv) -> str:
    """The exact command as typed: ``python -m benchmarks <command>`` plus its arguments."""
    return " ".join(["python", "-m", "benchmarks", command] + [shlex.quote(str(a)) for a in argv])


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - not installed
        return "not installed"


def driver_version() -> str:
    """The NVIDIA driver's version (nvidia-smi), else "unknown"."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def code_version() -> dict:
    """``{"commit": git rev-parse --short HEAD, "dirty": tracked files differ from it}`` of the
    repository; "unknown" / None where there is no git repository."""
    def git(*args):
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30)
    try:
        head = git("rev-parse", "--short", "HEAD")
        if head.returncode:
            return {"commit": "unknown", "dirty": None}
        status = git("status", "--porcelain", "--untracked-files=no")
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": "unknown", "dirty": None}


def kernels_fingerprint() -> str:
    """A short hash of the kernel sources (every ``kernels/*.py``), stored with timings and
    with counters, so that numbers taken from different kernel code can be told apart."""
    return _fingerprint([KERNELS_DIR])


def sources_fingerprint() -> str:
    """A short hash of the product's sources (``ioaware/``, ``kernels/`` and ``sim/``): the code
    version of a measurement even where the machine's copy of the repository has no history
    (match it against ``git`` trees with the same function)."""
    return _fingerprint([ROOT / "ioaware", KERNELS_DIR, ROOT / "sim"])


def _fingerprint(folders) -> str:
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            name = path.name if folder == KERNELS_DIR else str(path.relative_to(ROOT))
            h.update(name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def provenance(command: str, *, gpu: str | None = None, driver: str | None = None,
               cuda: str | None = None, extra: dict | None = None) -> dict:
    """The provenance block of a results file. ``gpu`` (name) and ``cuda`` (version) are read
    from torch unless given, ``driver`` from nvidia-smi; package versions from the installed
    distributions; ``date`` is now (UTC, ISO 8601); ``extra`` is merged in."""
    if gpu is None or cuda is None:
        import torch
        if gpu is None:
            gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        if cuda is None:
            cuda = str(torch.version.cuda)
    prov = {"gpu": gpu, "driver": driver if driver is not None else driver_version(),
            "cuda": cuda, "torch": package_version("torch"), "numba": package_version("numba"),
            "numba_cuda": package_version("numba-cuda"), "numpy": package_version("numpy"),
            "python": platform.python_version(), "host": platform.node(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "code_version": code_version(),
            "kernels_sha": kernels_fingerprint(), "sources_sha": sources_fingerprint()}
    prov.update(extra or {})
    return prov


def format_provenance(prov: dict) -> str:
    """One line naming where and how a file was measured."""
    code = prov.get("code_version")
    code = (f"  code {code['commit']}{' (dirty)' if code.get('dirty') else ''}" if code else "")
    return (f"# {prov.get('gpu')}  driver {prov.get('driver')}  CUDA {prov.get('cuda')}  "
            f"torch {prov.get('torch')}  numba {prov.get('numba')}  numba-cuda "
            f"{prov.get('numba_cuda')}  {prov.get('date')}{code}  ({prov.get('command')})")


def write_json(doc, path) -> None:
    """Write ``doc`` as JSON atomically (a partly written file never replaces a good one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# compiling kernel configurations for sm_90 on the CPU
# ------------------------------------------------------------------------------------------------

ARCH = (9, 0)
_PTXAS_CANDIDATES = ("/usr/local/cuda/bin/ptxas",)
#: Kernel names in the resources table (`sim.resources.resource_key`) by (family, kernel): the
#: CUDA-core kernels' function names, as profiles list them; the tensor-core kernels under the
#: names of their family's first modules, by which `sim.compare` looks them up.
KERNEL_NAMES = {("simt", "fwd"): "flash_fwd_v2", ("simt", "delta"): "flash_bwd_delta_v2",
                ("simt", "dkdv"): "flash_bwd_dkdv_v2",
                ("mma", "fwd"): "flash_mma_fwd", ("mma", "dq"): "flash_mma_bwd_dq",
                ("mma", "dkdv"): "flash_mma_bwd_dkdv",
                ("tf32", "fwd"): "flash_tf32_fwd", ("tf32", "dq"): "flash_tf32_bwd_dq",
                ("tf32", "dkdv"): "flash_tf32_bwd_dkdv"}


def allow_offline_compile() -> None:
    """Let Numba compile PTX without NVRTC or a driver (the target, sm_90, is given): without a
    driver, the device functions a kernel calls (which Numba compiles for the current device's
    compute capability) are compiled for sm_90 too."""
    try:
        import numba.cuda.cuda_paths as cuda_paths
        import numba.cuda.cudadrv.nvrtc as nvrtc
        import numba.cuda.dispatcher as dispatcher
    except ImportError:
        return
    try:
        nvrtc.get_supported_ccs()
    except Exception:  # noqa: BLE001 - no NVRTC: name the targets ourselves
        nvrtc.get_supported_ccs = lambda: ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
        cuda_paths._get_nvrtc_path = lambda: None
    try:
        dispatcher.get_current_device()
    except Exception:  # noqa: BLE001 - no driver: the target stands for the current device
        target = type("OfflineDevice", (), {"compute_capability": ARCH})
        dispatcher.get_current_device = lambda: target


def find_ptxas(path: str | None = None) -> str | None:
    """The ptxas to use: ``path``, else ``ptxas`` on PATH, else the CUDA toolkit's; None."""
    if path:
        return path if os.path.exists(path) else None
    return shutil.which("ptxas") or next((p for p in _PTXAS_CANDIDATES if os.path.exists(p)), None)


def ptxas_version(ptxas: str) -> str:
    """The release line and the build line of ``ptxas --version``."""
    r = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True)
    lines = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
    rel = [ln for ln in lines if "release" in ln]
    return "; ".join((rel[-1:] if rel else []) + lines[-1:])


_RE_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_RE_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RE_USED = re.compile(r"Used (\d+) registers")
_RE_SMEM = re.compile(r"(\d+) bytes smem")
_RE_BARRIERS = re.compile(r"used (\d+) barriers")


def parse_ptxas(text: str) -> list[dict]:
    """Per entry function in ``ptxas -v`` output (its stderr): ``function``,
    ``registers_per_thread``, ``stack_frame_bytes``, ``spill_store_bytes``,
    ``spill_load_bytes``, ``static_smem_bytes`` (0 when ptxas prints no smem), ``barriers``.
    Raises ValueError when the text has no "Used N registers" line."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a string, got {type(text).__name__}")
    out: list[dict] = []
    cur = None
    for line in text.splitlines():
        m = _RE_ENTRY.search(line)
        if m:
            cur = {"function": m.group(1), "registers_per_thread": None, "stack_frame_bytes": 0,
                   "spill_store_bytes": 0, "spill_load_bytes": 0, "static_smem_bytes": 0,
                   "barriers": 0}
            out.append(cur)
            continue
        if cur is None:
            continue
        m = _RE_SPILL.search(line)
        if m:
            cur["stack_frame_bytes"], cur["spill_store_bytes"], cur["spill_load_bytes"] = (
                int(x) for x in m.groups())
        m = _RE_USED.search(line)
        if m:
            cur["registers_per_thread"] = int(m.group(1))
            s = _RE_SMEM.search(line)
            cur["static_smem_bytes"] = int(s.group(1)) if s else 0
            b = _RE_BARRIERS.search(line)
            cur["barriers"] = int(b.group(1)) if b else 0
    out = [e for e in out if e["registers_per_thread"] is not None]
    if not out:
        raise ValueError("ptxas output has no 'Used N registers' line (was -v given?)")
    return out


def kernel_signature(family: str, kernel: str, dtype: str) -> tuple:
    """Numba argument types of a kernel as its family launches it (`kernels.host.launch`:
    contiguous arrays, Python ints as int64): inputs of ``dtype`` (the tensor-core half
    kernels take 16-bit words, the 3xTF32 ones float32), float32 statistics, a uint8 mask,
    int32 tile schedules; ``kernel`` is "fwd", "delta", "dkdv" (simt) or "fwd", "dq", "dkdv"."""
    from numba import types
    A = lambda dt, nd: types.Array(dt, nd, "C")  # noqa: E731
    f3, f4, u8 = A(types.float32, 3), A(types.float32, 4), A(types.uint8, 4)
    i2, i1 = A(types.int32, 2), A(types.int32, 1)
    i64, f32, u32, u64 = types.int64, types.float32, types.uint32, types.uint64
    if family == "simt":
        x4 = A(types.float16 if dtype == "fp16" else types.float32, 4)
        if kernel == "fwd":       # ... keep_scale, then the window's band_lo, band_hi
            return (x4, x4, x4, x4, f3, u8, i2, i1, i64, i64, i64, i64, f32, u64, u64, f32, i64,
                    i64)
        if kernel == "delta":
            return (x4, x4, f3)
        if kernel == "dkdv":
            return (x4, x4, x4, x4, f3, f3, x4, x4, f4, u8, i2, i1, i64, i64, i64, f32, u64,
                    u64, f32, i64, i64)
        raise ValueError(f"the simt kernels are fwd, delta and dkdv, got {kernel!r}")
    x4 = A(types.int16 if family == "mma" else types.float32, 4)
    tail = (i2, i1, i64, i64, i64, i64, i64, u8, i64, i64, i64)
    if kernel == "fwd":       # ... inv_keep, then the window's band_lo, band_hi
        return (x4, x4, x4, x4, f3) + tail + (f32, u32, u32, f32, i64, i64)
    tail += (f32, f32, u32, u32, f32, i64, i64)   # ..., inv_keep, band_lo, band_hi
    if kernel == "dq":
        return (x4, x4, x4, x4, x4, f3, f3, x4) + tail
    if kernel == "dkdv":      # the float32 dQ accumulator after dV
        return (x4, x4, x4, x4, f3, f3, x4, x4, f4) + tail
    raise ValueError(f"the tensor-core kernels are fwd, dq and dkdv, got {kernel!r}")


def build_kernel(family: str, kernel: str, head_dim: int, dtype: str, causal: bool, *,
                 block_m=None, block_n=None, tile=None, has_mask=False, dropout=False,
                 unroll=None, head_group=None, dq_atomic=None):
    """``(dispatcher, signature, threads per block)`` of one kernel configuration, built as its
    family builds it on a GPU: ``block_m x block_n`` is the kernel's own tile (forward and dQ:
    query rows x keys; dK/dV: key rows x queries), ``tile`` the CUDA-core micro-tile (tm, tn),
    ``head_group`` the tensor-core kernels' launch order (None: the default of the pass,
    `kernels.tile_scheduler.DEFAULT_HEAD_GROUP`), ``unroll`` the 3xTF32 backward's k-loop
    unrolling (None: its default), ``dq_atomic`` (the dK/dV kernels): it adds dQ by atomics,
    two floats per ``red`` (sm_90)."""
    from kernels import mma_bwd, mma_fwd, simt_bwd, simt_fwd, tf32_bwd, tf32_fwd, tile_scheduler
    from kernels.config import TileConfig
    d = int(head_dim)
    if family == "simt":
        if kernel == "delta":
            return (simt_bwd.make_delta_kernel(d, True), kernel_signature(family, kernel, dtype),
                    32 * simt_bwd.DELTA_ROWS)
        cfg = TileConfig(block_m, block_n, *tile)
        if kernel == "fwd":
            kern = simt_fwd.make_forward_kernel(cfg, d, causal, has_mask, dropout,
                                                cfg.threads % 32 == 0)
        else:
            kern = simt_bwd.make_dkdv_kernel(cfg, d, causal, has_mask, dropout)
        return kern, kernel_signature(family, kernel, dtype), cfg.threads
    group = tile_scheduler.head_group(head_group, causal, "fwd" if kernel == "fwd" else "bwd")
    bf16 = dtype == "bf16"
    if family == "mma":
        if kernel == "fwd":
            kern = mma_fwd.get_kernel(d, block_m, block_n, bf16, causal, has_mask, dropout, group)
        else:
            if kernel == "dq":
                kern = mma_bwd.get_dq_kernel(d, block_m, block_n, bf16, causal, has_mask, dropout,
                                             group)
            else:
                kern = mma_bwd.get_dkdv_kernel(d, block_m, block_n, bf16, causal, has_mask,
                                               dropout, group, dq_atomic="v2" if dq_atomic else False)
    elif family == "tf32":
        if kernel == "fwd":
            kern = tf32_fwd.get_kernel(d, block_m, block_n, causal, has_mask, dropout, group)
        else:
            if kernel == "dq":
                kern = tf32_bwd.get_dq_kernel(d, block_m, block_n, causal, has_mask, dropout,
                                              group, unroll=unroll)
            else:
                kern = tf32_bwd.get_dkdv_kernel(d, block_m, block_n, causal, has_mask, dropout,
                                                group, unroll=unroll,
                                                dq_atomic="v2" if dq_atomic else False)
    else:
        raise ValueError(f"family must be simt, mma or tf32, got {family!r}")
    return kern, kernel_signature(family, kernel, dtype), kern.threads


def compile_sm90(dispatcher, signature, name: str, workdir, ptxas: str | None) -> dict:
    """Numba's PTX of ``dispatcher`` for ``signature`` (sm_90, no GPU), written to
    ``workdir/name.ptx`` and, with ``ptxas``, assembled by ``ptxas -v``: ``{"ptx", "ptxas_log",
    "returncode", "cubin"}`` (cubin None when ptxas is missing or failed)."""
    from numba import cuda
    os.makedirs(workdir, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    ptx, _ = cuda.compile_ptx(dispatcher.py_func, signature, cc=ARCH)
    ptx_path = os.path.join(workdir, safe + ".ptx")
    with open(ptx_path, "w") as f:
        f.write(ptx)
    out = {"ptx": ptx, "ptxas_log": "", "returncode": None, "cubin": None}
    if ptxas:
        cubin = os.path.join(workdir, safe + ".cubin")
        r = subprocess.run([ptxas, "-v", f"-arch=sm_{ARCH[0]}{ARCH[1]}", ptx_path, "-o", cubin],
                           capture_output=True, text=True)
        out.update(ptxas_log=r.stderr, returncode=r.returncode,
                   cubin=cubin if r.returncode == 0 else None)
    return out
