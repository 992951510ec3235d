"""Command ``replace``: put re-measured records into a results file in place of the ones they
measure again.

    python -m benchmarks replace NEW.json INTO.json --note TEXT [--earlier TEXT] [--add]

``NEW.json`` is a `benchmarks measure` file (with its counters from `benchmarks ncu`) of a
subset of ``INTO.json``'s configurations, measured again on newer kernels, on the same GPU. Each
record of ``NEW.json`` replaces the record of ``INTO.json`` with the same configuration
(`record_key`: kernel, variant, pass, dtype, sizes, causal); a record of ``NEW.json`` without a
match is an error (with ``--add``: it is appended, e.g. a family the file's grid did not have
yet, measured on the same grid), one measured on another GPU always, and nothing is written. ``INTO.json`` keeps its
other records and its provenance, to which an entry is appended under ``records_replaced``:
``--note`` (which records, and why), how many records were replaced and added, the new file's command, counters command, date, code version
and GPU, and ``--earlier`` (where the replaced records stay, e.g. ``git show REV:FILE``).
"""
from __future__ import annotations

import argparse
import json

from .common import first_sentence, write_json

#: What names one measured configuration in a results file.
KEY_FIELDS = ("kernel", "variant", "pass", "dtype", "batch", "heads", "heads_kv", "seq_len_q",
              "seq_len_k", "head_dim", "causal")


def record_key(record: dict) -> tuple:
    """The configuration a record measures."""
    return tuple(record.get(name) for name in KEY_FIELDS)


def replace_records(into: dict, new: dict, note: str, earlier: str | None = None,
                    add: bool = False) -> dict:
    """``into`` (a results document) with ``new``'s records in place of those of the same
    `record_key` (``add``: those that match none appended), and a ``records_replaced`` entry in
    its provenance; ``into`` is not changed. Raises ValueError when the GPUs differ or a new
    record matches several, or none without ``add``."""
    gpu, new_gpu = into["provenance"].get("gpu"), new["provenance"].get("gpu")
    if gpu != new_gpu:
        raise ValueError(f"the new records were measured on {new_gpu!r}, the file on {gpu!r}")
    records = list(into["records"])
    where = {}
    for i, r in enumerate(records):
        where.setdefault(record_key(r), []).append(i)
    added = 0
    for r in new["records"]:
        hits = where.get(record_key(r), [])
        if not hits and add:
            where[record_key(r)] = [len(records)]
            records.append(r)
            added += 1
            continue
        if len(hits) != 1:
            raise ValueError(f"{len(hits)} records of the file measure {dict(zip(KEY_FIELDS, record_key(r)))}"
                             " (need exactly one)")
        records[hits[0]] = r
    p = new["provenance"]
    ncu = p.get("ncu")
    entry = {"records": note, "count": len(new["records"]) - added, "added": added,
             "command": p.get("command"),
             "ncu_command": ncu.get("command") if isinstance(ncu, dict) else None,
             "date": p.get("date"), "code_version": p.get("code_version"),
             "kernels_sha": p.get("kernels_sha"), "sources_sha": p.get("sources_sha"),
             "gpu": new_gpu, "driver": p.get("driver"), "torch": p.get("torch"),
             "numba_cuda": p.get("numba_cuda")}
    if earlier:
        entry["earlier"] = earlier
    prov = dict(into["provenance"])
    before = prov.get("records_replaced")
    prov["records_replaced"] = ([] if before is None else
                                list(before) if isinstance(before, list) else [before]) + [entry]
    return {**into, "provenance": prov, "records": records}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks replace",
                                 description=first_sentence(__doc__))
    ap.add_argument("new", help="the re-measured records (benchmarks measure, then ncu)")
    ap.add_argument("into", help="the results file to put them into (rewritten in place)")
    ap.add_argument("--note", required=True, help="which records, and why they were measured again")
    ap.add_argument("--earlier", default=None,
                    help="where the replaced records stay (e.g. 'git show REV:FILE')")
    ap.add_argument("--add", action="store_true",
                    help="append the records that match none (instead of refusing them)")
    args = ap.parse_args(list(argv or []))
    with open(args.new) as fh:
        new = json.load(fh)
    with open(args.into) as fh:
        into = json.load(fh)
    out = replace_records(into, new, args.note, args.earlier, add=args.add)
    entry = out["provenance"]["records_replaced"][-1]
    write_json(out, args.into)
    print(f"replaced {entry['count']} and added {entry['added']} records of {args.into}")
    return 0
