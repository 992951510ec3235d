"""What an attention call will cost, estimated from shapes alone, before anything is allocated.

:func:`check_cost` is called by :func:`ioaware._inputs.check_inputs` once the shapes are known
and before any mask is broadcast, any input is copied or any value is scanned. It refuses a
problem whose host memory would exceed what the machine has available (``MemoryError``, with
the figures) and warns (:class:`PerformanceWarning`, with an estimated time) when the CPU
paths are asked for a problem that would run for more than :data:`WARN_SECONDS`.

The estimates are deliberately simple and stated here in full:

* memory: the outputs in the compute dtype plus their conversion to the caller's dtype (three
  copies of ``out`` and ``lse``), a compute-dtype copy of every input that is not contiguous
  (strided, broadcast or stride-0 inputs are copied when brought to the canonical layout) or is
  bfloat16 (converted to float32), the
  broadcast masks, and per backend the working arrays: one ``[B, Hq, block_q, block_k]`` tile of
  scores and its five temporaries for ``"numpy"``, four full ``[B, Hq, Nq, Nk]`` float64 arrays
  for ``"reference"``;
* time (``"numpy"`` and ``"reference"`` only): matmul FLOPs of the forward (``2 (E + Ev)`` per
  (query, key) pair the causal rule and the window allow) at :data:`CPU_FLOPS_PER_SECOND`,
  plus :data:`SECONDS_PER_TILE` of Python overhead per visited tile (``"numpy"``). The backward costs about twice the forward.
  These are orders of magnitude, not predictions; :mod:`sim` predicts GPU times properly.
"""
from __future__ import annotations

import math
import os
import warnings

__all__ = ["PerformanceWarning", "check_cost", "allowed_pairs", "band_pairs", "available_host_memory",
           "CPU_FLOPS_PER_SECOND", "SECONDS_PER_TILE", "WARN_SECONDS", "MEMORY_CHECK_BYTES"]

CPU_FLOPS_PER_SECOND = 2e10   # the NumPy tiled path on 64x64 tiles reaches 7-35 GFLOP/s on 2 cores
SECONDS_PER_TILE = 5e-5       # Python overhead of one visited tile of the NumPy path (~20-50 us measured)
WARN_SECONDS = 60.0           # warn when the CPU forward is estimated to take longer than this
MEMORY_CHECK_BYTES = 2**28    # below 256 MiB of estimated memory, available memory is not looked up


class PerformanceWarning(UserWarning):
    """An attention call was asked for a problem the chosen backend will take very long to run."""


def available_host_memory() -> int | None:
    """Bytes of host memory available to a new allocation (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def allowed_pairs(seqlen_q: int, seqlen_k: int, causal: bool, causal_offset: int) -> int:
    """Number of (query, key) pairs a causal rule ``j <= i + causal_offset`` allows (all if not causal)."""
    if not causal:
        return seqlen_q * seqlen_k
    # row i sees clamp(i + offset + 1, 0, Nk) keys: zero until i0, a ramp until i1, then Nk
    i0 = min(seqlen_q, max(0, -causal_offset))
    i1 = min(seqlen_q, max(i0, seqlen_k - causal_offset - 1))
    ramp = (i1 - i0) * (i0 + i1 - 1) // 2 + (i1 - i0) * (causal_offset + 1)
    return ramp + (seqlen_q - i1) * seqlen_k


def band_pairs(seqlen_q: int, seqlen_k: int, band: tuple[int | None, int | None]) -> int:
    """Number of (query, key) pairs with ``lo <= j - i <= hi`` for ``band = (lo, hi)`` (a None
    bound is absent; ``ioaware.block_info.band_offsets``): the pairs with ``j <= i + hi`` less
    those with ``j <= i + lo - 1`` (``lo <= hi``, so the second set lies in the first)."""
    lo, hi = band
    upper = allowed_pairs(seqlen_q, seqlen_k, hi is not None, 0 if hi is None else hi)
    below = 0 if lo is None else allowed_pairs(seqlen_q, seqlen_k, True, lo - 1)
    return upper - below


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:.1f} days"


def check_cost(*, backend, kind, device, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, value_dim,
               itemsize, compute_itemsize, band, block_q, block_k, n_block_groups,
               copied_inputs, mask_elements, bias_elements, q_shape, k_shape):
    """Refuse (``MemoryError``) or warn (:class:`PerformanceWarning`) from the shapes alone.

    ``band``: the causal rule and window as ``(lo, hi)`` (:func:`band_pairs`);
    ``copied_inputs``: element counts of the inputs that are not contiguous (they are copied on
    the way to the canonical layout); ``mask_elements`` / ``bias_elements``: elements of the
    broadcast masks; ``n_block_groups``: distinct block-mask slices (the NumPy path loops over
    them). Device (CUDA) memory is not estimated here: the kernels allocate their own outputs.
    """
    on_host = backend in ("numpy", "reference") or kind == "numpy" or device == "cpu"
    if not on_host:
        return
    rows = batch * heads_q * seqlen_q
    out_bytes = rows * value_dim * itemsize
    work = 3 * rows * (value_dim + 1) * compute_itemsize             # out and lse, computed and converted
    work += sum(copied_inputs) * compute_itemsize + mask_elements + bias_elements * compute_itemsize
    if backend == "numpy":
        bq, bk = min(block_q, max(seqlen_q, 1)), min(block_k, max(seqlen_k, 1))
        work += 6 * batch * heads_q * bq * bk * compute_itemsize
    elif backend == "reference":
        work += 4 * batch * heads_q * seqlen_q * seqlen_k * 8
    available = available_host_memory() if work > MEMORY_CHECK_BYTES else None
    if available is not None and work > available:
        raise MemoryError(
            f"q {q_shape} with k {k_shape}: attention on backend {backend!r} needs an estimated "
            f"{_gb(work)} of host memory (the output alone is {_gb(out_bytes)}) but {_gb(available)} "
            f"are available; nothing was allocated")
    if backend not in ("numpy", "reference"):
        return
    pairs_per_head = band_pairs(seqlen_q, seqlen_k, band)
    pairs = batch * heads_q * pairs_per_head
    seconds = 2.0 * (head_dim + value_dim) * pairs / CPU_FLOPS_PER_SECOND
    if backend == "numpy":
        tiles = math.ceil(pairs_per_head / (block_q * block_k))
        seconds += n_block_groups * tiles * SECONDS_PER_TILE
    if seconds > WARN_SECONDS:
        warnings.warn(
            f"q {q_shape} with k {k_shape}: attention on backend {backend!r} (CPU) is estimated to take "
            f"about {_duration(seconds)} for the forward alone ({2.0 * (head_dim + value_dim) * pairs:.2e} "
            f"matmul FLOPs at ~{CPU_FLOPS_PER_SECOND / 1e9:.0f} GFLOP/s); the backward takes about twice "
            f"that. CUDA tensors run on the fused kernels (backend 'numba').",
            PerformanceWarning, stacklevel=5)
