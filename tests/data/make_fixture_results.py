"""Write ``fixture_results_synthetic.json``: a SYNTHETIC results file for the dashboard's tests.

Nothing in it was measured. Its numbers come from the closed-form expressions below (a crude
flop/byte model with a made-up efficiency), so that the file has the shape of real results —
our kernel over N and block sizes, SDPA and eager baselines, some counters missing (null) — and
the dashboard's pages have something to draw in tests. Regenerate with
``python tests/data/make_fixture_results.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_name("fixture_results_synthetic.json")


def _record(kernel, schedule, n, d, bq, bk, *, causal=False, dtype="fp16", pass_="fwd",
            batch=1, heads=16, counters=True):
    e = 4 if dtype == "fp32" else 2
    bh = batch * heads
    flops = 4 * bh * n * n * d // (2 if causal else 1)
    reads = bh * (n * d + (-(-n // (bq or 128))) * 2 * n * d) * e
    writes = bh * n * d * e
    if schedule == "naive":
        reads, writes = reads + bh * 4 * n * n * e, writes + bh * 3 * n * n * e
    penalty = 1.0 + 0.15 * abs((bq or 128) - 128) / 128 + 0.1 * abs((bk or 64) - 64) / 64
    time_ms = (flops / 350e12 + (reads + writes) / 2.5e12) * 1e3 * penalty
    return {
        "kernel": kernel, "schedule": schedule, "pass": pass_, "dtype": dtype,
        "batch": batch, "heads": heads, "heads_kv": heads, "seq_len_q": n, "seq_len_k": n,
        "head_dim": d, "causal": causal, "block_q": bq, "block_k": bk,
        "time_ms": round(time_ms, 6), "time_ms_p10": round(time_ms * 0.98, 6),
        "time_ms_p90": round(time_ms * 1.03, 6),
        "peak_extra_bytes": bh * n * 4 if schedule != "naive" else bh * 2 * n * n * e,
        "dram_read_bytes": bh * 3 * n * d * e if counters else None,
        "dram_write_bytes": writes if counters else None,
        "l2_bytes": None,
        "global_load_bytes": reads if counters else None,
        "global_store_bytes": writes if counters else None,
        "flops_executed": flops if counters else None,
    }


def build() -> dict:
    records = []
    for n in (1024, 4096):
        for bq, bk in ((32, 64), (64, 64), (64, 128), (128, 64), (128, 128)):
            records.append(_record("ioaware-numba", "flash2", n, 64, bq, bk))
        records.append(_record("ioaware-numba", "flash2", n, 64, 128, 64, causal=True))
        records.append(_record("sdpa-flash", "flash2", n, 64, None, None, counters=False))
        records.append(_record("eager", "naive", n, 64, None, None))
    records.append(_record("ioaware-numba", "flash2", 2048, 128, 64, 64, dtype="bf16", pass_="bwd"))
    return {
        "schema": "ioaware.results/1",
        "provenance": {
            "gpu": "SYNTHETIC TEST FIXTURE (not a measurement)", "driver": "n/a", "cuda": "n/a",
            "torch": "n/a", "numba": "n/a", "numba_cuda": "n/a", "date": "2025-01-01T00:00:00Z",
            "command": "python tests/data/make_fixture_results.py",
        },
        "records": records,
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {OUT} ({len(build()['records'])} records)")
