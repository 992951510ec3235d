"""Measured results files (``results/*.json``): the schema, a validating loader, shipped files.

Schema ``ioaware.results/1``: one JSON object ``{"schema", "provenance", "records"}`` — see
:data:`RECORD_FIELDS` and :data:`PROVENANCE_FIELDS`. Null means "not measured"; extra keys are
kept. :func:`load_results` raises :class:`ResultsFormatError` (a ValueError) naming the file,
record and field on malformed input.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

__all__ = ["SCHEMA", "RESULTS_DIR", "RECORD_FIELDS", "PROVENANCE_FIELDS", "KERNELS",
           "ResultsFormatError", "load_results", "load_results_file", "validate_results",
           "shipped_results", "records_for_profile"]

SCHEMA = "ioaware.results/1"
RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"
KERNELS = ("ioaware-numba", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math", "eager")
PROVENANCE_FIELDS = ("gpu", "driver", "cuda", "torch", "numba", "numba_cuda", "date", "command")

_INT, _FLOAT, _BOOL, _STR = "int", "float", "bool", "str"
# field -> (type, nullable)
RECORD_FIELDS = {
    "kernel": (_STR, False), "schedule": (_STR, False), "pass": (_STR, False), "dtype": (_STR, False),
    "batch": (_INT, False), "heads": (_INT, False), "heads_kv": (_INT, False),
    "seq_len_q": (_INT, False), "seq_len_k": (_INT, False), "head_dim": (_INT, False),
    "causal": (_BOOL, False), "block_q": (_INT, True), "block_k": (_INT, True),
    "time_ms": (_FLOAT, False), "time_ms_p10": (_FLOAT, False), "time_ms_p90": (_FLOAT, False),
    "peak_extra_bytes": (_INT, True), "dram_read_bytes": (_INT, True), "dram_write_bytes": (_INT, True),
    "l2_bytes": (_INT, True), "global_load_bytes": (_INT, True), "global_store_bytes": (_INT, True),
    "flops_executed": (_INT, True),
}


class ResultsFormatError(ValueError):
    """A results file does not follow the ``ioaware.results/1`` schema."""


def _type_ok(v, kind) -> bool:
    if kind == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == _FLOAT:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if kind == _BOOL:
        return isinstance(v, bool)
    return isinstance(v, str)


def validate_results(obj, origin: str = "<results>") -> dict:
    """Check a parsed results object; return it. Raises ResultsFormatError."""
    if not isinstance(obj, dict):
        raise ResultsFormatError(f"{origin}: expected a JSON object, got {type(obj).__name__}")
    if obj.get("schema") != SCHEMA:
        raise ResultsFormatError(f"{origin}: 'schema' must be {SCHEMA!r}, got {obj.get('schema')!r}")
    prov = obj.get("provenance")
    if not isinstance(prov, dict):
        raise ResultsFormatError(f"{origin}: 'provenance' must be an object")
    for k in PROVENANCE_FIELDS:
        if not isinstance(prov.get(k), str):
            raise ResultsFormatError(f"{origin}: provenance.{k} must be a string, got {prov.get(k)!r}")
    recs = obj.get("records")
    if not isinstance(recs, list):
        raise ResultsFormatError(f"{origin}: 'records' must be a list")
    for i, rec in enumerate(recs):
        if not isinstance(rec, dict):
            raise ResultsFormatError(f"{origin}: records[{i}] must be an object")
        for k, (kind, nullable) in RECORD_FIELDS.items():
            if k not in rec:
                raise ResultsFormatError(f"{origin}: records[{i}] is missing {k!r}")
            v = rec[k]
            if v is None and nullable:
                continue
            if not _type_ok(v, kind):
                raise ResultsFormatError(f"{origin}: records[{i}].{k} must be {kind}"
                                         f"{' or null' if nullable else ''}, got {v!r}")
        if rec["kernel"] not in KERNELS:
            raise ResultsFormatError(f"{origin}: records[{i}].kernel must be one of {KERNELS}, got {rec['kernel']!r}")
        if rec["pass"] not in ("fwd", "bwd", "fwd+bwd"):
            raise ResultsFormatError(f"{origin}: records[{i}].pass must be fwd, bwd or fwd+bwd, got {rec['pass']!r}")
        if rec["dtype"] not in ("fp16", "bf16", "fp32"):
            raise ResultsFormatError(f"{origin}: records[{i}].dtype must be fp16, bf16 or fp32, got {rec['dtype']!r}")
        if rec["time_ms"] <= 0:
            raise ResultsFormatError(f"{origin}: records[{i}].time_ms must be > 0, got {rec['time_ms']!r}")
    return obj


def load_results_file(path_or_fileobj) -> dict:
    """The whole validated results object (provenance and records)."""
    if isinstance(path_or_fileobj, (str, os.PathLike)):
        origin = str(path_or_fileobj)
        try:
            with open(path_or_fileobj) as f:
                obj = json.load(f)
        except json.JSONDecodeError as exc:
            raise ResultsFormatError(f"{origin}: not valid JSON ({exc})") from None
    else:
        origin = getattr(path_or_fileobj, "name", "<file>")
        data = path_or_fileobj.read()
        if isinstance(data, bytes):
            data = data.decode()
        try:
            obj = json.load(io.StringIO(data))
        except json.JSONDecodeError as exc:
            raise ResultsFormatError(f"{origin}: not valid JSON ({exc})") from None
    return validate_results(obj, origin)


def load_results(path_or_fileobj) -> list[dict]:
    """Validated records of a results file; each record also gets ``provenance`` (the file's)."""
    obj = load_results_file(path_or_fileobj)
    return [dict(rec, provenance=obj["provenance"]) for rec in obj["records"]]


def _declares_results_schema(path: Path) -> bool:
    """Whether a JSON file's opening declares an ``ioaware.results/`` schema (``results/`` also
    holds other measurements: kernel resources, host cost, counter splits, block-size timings)."""
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return b'"ioaware.results/' in head


def shipped_results() -> list[Path]:
    """The results files (schema ``ioaware.results/1``) shipped in the repository's ``results/``."""
    if not RESULTS_DIR.is_dir():
        return []
    return [p for p in sorted(RESULTS_DIR.glob("*.json")) if _declares_results_schema(p)]


def records_for_profile(profile) -> list[dict]:
    """Shipped records measured on the GPU a profile describes (matched on provenance.gpu)."""
    from .profiles import profile_for_gpu_name
    out = []
    for path in shipped_results():
        try:
            recs = load_results(path)
        except ResultsFormatError:
            continue
        for r in recs:
            p = profile_for_gpu_name(r["provenance"]["gpu"])
            if p is not None and p.name == profile.name:
                out.append(r)
    return out
