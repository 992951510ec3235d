"""Numbers as the dashboard shows them: bytes in kB/MB/GB, times in ms, ratios as ×, counts with
thousands separators; and the column specifications its tables use (``Col``).

Plain Python (no Streamlit, no pandas at import), so that the formatting can be tested alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["bytes_", "ms", "ratio", "count", "flops", "pct", "signed_pct", "num", "duration",
           "Col", "BYTE_UNITS", "byte_unit"]

#: Byte units in powers of 1000 (bandwidths are quoted that way).
BYTE_UNITS = (("B", 1.0), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12), ("PB", 1e15))


def _bad(x) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return True


def byte_unit(largest: float) -> tuple[str, float]:
    """``(unit, factor)`` of :data:`BYTE_UNITS` in which ``largest`` reads as 1–999."""
    largest = abs(float(largest)) if not _bad(largest) else 0.0
    unit = BYTE_UNITS[0]
    for u in BYTE_UNITS:
        if largest >= u[1]:
            unit = u
    return unit


def bytes_(n, digits: int = 3) -> str:
    """``1234567`` -> ``"1.23 MB"``; whole bytes below 1 kB (``"512 B"``)."""
    if _bad(n):
        return "—"
    unit, factor = byte_unit(n)
    if unit == "B":
        return f"{float(n):,.0f} B"
    return f"{_sig(float(n) / factor, digits)} {unit}"


def _sig(x: float, digits: int = 3) -> str:
    """``x`` with ``digits`` significant digits, thousands separated, no exponent."""
    if x == 0 or _bad(x):
        return "0"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    return f"{x:,.{decimals}f}"


def ms(t, digits: int = 3) -> str:
    """A time in milliseconds: ``"0.123 ms"``, ``"12.3 ms"``, ``"1,234 ms"``."""
    return "—" if _bad(t) else f"{_sig(float(t), digits)} ms"


def ratio(x, digits: int = 3) -> str:
    """``12.34`` -> ``"12.3×"``."""
    return "—" if _bad(x) else f"{_sig(float(x), digits)}×"


def count(n) -> str:
    """``1234567`` -> ``"1,234,567"``."""
    return "—" if _bad(n) else f"{float(n):,.0f}"


def num(x, digits: int = 3) -> str:
    """A plain number with ``digits`` significant digits (``"0.527"``, ``"1,234"``; below 0.001
    in scientific notation, ``"3.3e-16"``)."""
    if _bad(x):
        return "—"
    x = float(x)
    if x != 0 and math.isfinite(x) and abs(x) < 1e-3:
        return f"{x:.{max(0, digits - 1)}e}"
    return _sig(x, digits)


def flops(n, digits: int = 3) -> str:
    """``1.2e12`` -> ``"1.20 TFLOP"``."""
    if _bad(n):
        return "—"
    for unit, f in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if abs(float(n)) >= f:
            return f"{_sig(float(n) / f, digits)} {unit}"
    return f"{float(n):,.0f} FLOP"


def pct(x, digits: int = 1) -> str:
    """A fraction as a percentage: ``0.1234`` -> ``"12.3 %"``."""
    return "—" if _bad(x) else f"{float(x) * 100:,.{digits}f} %"


def signed_pct(x, digits: int = 1) -> str:
    """A signed fraction as a percentage: ``-0.05`` -> ``"−5.0 %"``."""
    if _bad(x):
        return "—"
    v = float(x) * 100
    return f"{'+' if v > 0 else '−' if v < 0 else ''}{abs(v):,.{digits}f} %"


def duration(seconds) -> str:
    """A wall-clock duration, rounded to what a reader waits by: ``"45 s"``, ``"3 min 20 s"``,
    ``"1 h 05 min"``."""
    if _bad(seconds):
        return "—"
    s = max(0, int(round(float(seconds))))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@dataclass(frozen=True)
class Col:
    """How a table shows one column: its ``label`` and ``kind``

    * ``"bytes"``: scaled to one unit for the whole column (the unit of its largest value), the
      unit in the header;
    * ``"ms"``, ``"ratio"`` (×), ``"pct"`` (a fraction shown as %), ``"signed_pct"``;
    * ``"count"``: integers with thousands separators; ``"flops"``: in the column's unit;
    * ``"num"``: a plain number (``digits`` significant); ``"text"``, ``"bool"``: as they are.
    """

    label: str
    kind: str = "text"
    help: str | None = None
    digits: int = 3
