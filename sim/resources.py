"""Reading the kernel resources table: registers per thread (and spills, static shared memory,
threads) of each compiled configuration of our kernels, as ``ptxas -v`` reported them.

The table is a JSON file ``{"provenance": {...}, "kernels": [entry, ...]}``, one entry per
configuration keyed by :func:`resource_key` (``python -m benchmarks resources`` writes it; the
shipped one is :data:`RESOURCES_PATH`). The model reads it here, with no dependency on the
kernels or on Numba: :func:`load_resources` -> ``{key: entry}``, :func:`lookup` -> one entry.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

__all__ = ["resource_key", "load_resources", "lookup", "shipped_registers", "RESOURCES_PATH",
           "DTYPES"]

#: The shipped table (configurations of the shipped sweeps, compiled for sm_90).
RESOURCES_PATH = Path(__file__).resolve().parents[1] / "results" / "kernel_resources_sm90.json"
DTYPES = ("fp32", "fp16")


def resource_key(kernel: str, head_dim: int, dtype: str, causal: bool, *, block_m=None,
                 block_n=None, tile=None, dq_atomic=None, mask: bool = False,
                 dropout: bool = False) -> str:
    """The string that identifies one compiled kernel configuration in the JSON.

    ``kernel``: the Numba function name as Nsight Compute lists it (``flash_fwd_v2``,
    ``flash_bwd_dkdv_v2``, ``flash_mma_fwd``, ...); ``block_m x block_n``: the kernel's own tile
    (forward and dQ: block_q x block_k; dK/dV: block_k x block_q); ``tile``: the per-thread
    micro-tile (tm, tn) of the CUDA-core kernels; ``dq_atomic``: dK/dV kernels only.
    """
    if not isinstance(kernel, str) or not kernel:
        raise ValueError(f"kernel must be a non-empty string, got {kernel!r}")
    if dtype not in DTYPES + ("bf16",):
        raise ValueError(f"dtype must be one of {DTYPES + ('bf16',)}, got {dtype!r}")
    d = int(head_dim)
    if d < 1:
        raise ValueError(f"head_dim must be >= 1, got {head_dim!r}")
    parts = [kernel, f"d{d}", dtype, "causal" if causal else "full"]
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither")
    if block_m is not None:
        parts.append(f"{int(block_m)}x{int(block_n)}")
    if tile is not None:
        if len(tile) != 2:
            raise ValueError(f"tile must be a pair (tm, tn), got {tile!r}")
        parts.append(f"t{int(tile[0])}x{int(tile[1])}")
    if dq_atomic is not None:
        parts.append("dq_atomic" if dq_atomic else "dq_kernel")
    if mask:
        parts.append("mask")
    if dropout:
        parts.append("dropout")
    return "/".join(parts)


def load_resources(path=RESOURCES_PATH) -> dict:
    """``{key: entry}`` of a kernel resources JSON. Raises ValueError naming the file when it is
    not one."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("kernels"), list):
        raise ValueError(f"{path}: not a kernel resources file (no 'kernels' list)")
    out = {}
    for e in data["kernels"]:
        if not isinstance(e, dict) or "key" not in e or "registers_per_thread" not in e:
            raise ValueError(f"{path}: an entry lacks 'key' or 'registers_per_thread': {e!r:.200}")
        out[e["key"]] = e
    return out


def lookup(table: dict, kernel: str, head_dim: int, dtype: str, causal: bool, **kw) -> dict | None:
    """The entry of ``table`` (:func:`load_resources`) for one configuration, or None."""
    return table.get(resource_key(kernel, head_dim, dtype, causal, **kw))


@lru_cache(maxsize=None)
def _shipped_table() -> dict:
    try:
        return load_resources()
    except (OSError, ValueError):     # an installed package without the results folder
        return {}


@lru_cache(maxsize=None)
def shipped_registers(kernel: str, head_dim: int, dtype: str, causal: bool, **key) -> int | None:
    """Registers per thread of one configuration in the shipped table (:data:`RESOURCES_PATH`;
    ``key``: :func:`resource_key`'s keywords), or None where the table lacks it (or is absent)."""
    entry = lookup(_shipped_table(), kernel, head_dim, dtype, causal, **key)
    return None if entry is None else int(entry["registers_per_thread"])
