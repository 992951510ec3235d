"""Command ``pick``: how well the cost model picks a kernel family's tiles, checked by timing every legal configuration on the GPU.

    python -m benchmarks pick [--family mma tf32] [--quick] [--out FILE.json]
    python -m benchmarks pick --dry-run [--quick]             (CPU: the grid and the estimate)
    python -m benchmarks pick --report FILE.json [--rates RATES.json] [--profile h100] [--json]

The families' default tiles are to come from `sim`: for a problem, list the family's legal
configurations (`sim.plans.CONFIGS`), price each one's plan and take the cheapest
(`sim.plans.choose`, as ``python -m sim plan --choose`` does). This command checks that choice
against the GPU; the dashboard's block-size page draws the same choice beside a pick file's
times. (``python -m sim search`` ranks tiles with `sim.search_blocks`, the schedule model over a
generic tile grid: not what is checked here.)

**Measuring** (a GPU): for every family and pass of `sim.plans.CONFIGS` (``--family`` narrows
them; a family whose configurations are not `kernels.KernelConfig` fields is skipped with the
reason) and every group of the grid, every legal configuration is timed through `kernels` with
``KernelConfig(family=..., **config)`` (the wgmma backward's configurations are tile pairs,
``dq_tile`` and ``kv_tile``), as ``python -m benchmarks tune`` times one: CUDA events
behind a device-side sleep (GPU time only: ``"device"`` timing of `benchmarks.common`), the
median of up to 30 calls after 3 warm-up calls, with p10 and p90. Each configuration's output
is compared with the family's default configuration's (``max_abs_diff_vs_default``: a tile
changes the order of the sums, not the result). A configuration the kernels refuse is recorded
with the reason. The default grid (`grid`), per family: its dtype (the first of fp16, fp32 its
plan takes; ``--dtypes`` for others, e.g. bf16), d 64 and 128, causal off and on, N 512, 2048,
8192 and 16384: 16 groups. The shape: B = 16384 / N tokens (32, 8, 2, 1) and H = `HEAD_WIDTH`
/ d (mma 1024: H 16 at d=64, 8 at d=128; tf32 256: H 4 and 2), so that a call of the family's
default tiles takes about 0.1-10 ms on an H100 (``results/bench_*``: mma 0.24-4.9 ms, tf32
0.14-5.4 ms). ``--quick``: d=64, N 512 and 2048 (4 groups per family). The grid and a time
estimate are printed first; a line per group as it finishes. The file (schema
``ioaware.pick/1``): ``provenance`` (`benchmarks.common.provenance`, with the grid's options),
``grid`` (the groups), ``records`` (one per configuration and group: the group's fields,
``config``, ``time_ms``, ``time_ms_p10``, ``time_ms_p90``, ``tflops``,
``max_abs_diff_vs_default``; or ``refused`` / ``failed`` with the reason), ``skipped``,
``complete``; written after every group, so that a run cut short keeps its groups. At the end
the report of the file is printed.

**The report** (`pick_report`, CPU, pure): per group, the model's pick (`sim.plans.choose` on
the profile, with measured rates when given: ``--rates``), the measured best, the loss of
following the model (pick / best - 1, %), whether it is within 5 %, and the same for the
family's default tiles today (the plan's defaults); per family and pass, the share of groups
within 5 % (target at least 90 %) and the time lost in total (the sum over groups of pick -
best, ms and % of the best's sum). Nothing is fitted on the measured times. It reads the files
of this command (shipped: ``results/pick_h100_*`` for mma and tf32, ``results/pick_wgmma_h100_*``),
of ``python -m benchmarks tune --family`` (``ioaware.tune_blocks/1``) and of the older float16
forward tile sweep (``ioaware.tune_tc/1``).
``--profile``: the model's profile (default: the one matching the file's GPU, else h100).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass

from .common import (SLEEP_CYCLES, attention_flops, attention_problem, command_line,
                     first_sentence, doc_usage, provenance, time_cuda, torch_dtype, write_json)

SCHEMA = "ioaware.pick/1"
#: The files `pick_report` reads: this command's, ``tune --family``'s, the shipped tile sweep's.
READABLE_SCHEMAS = (SCHEMA, "ioaware.tune_blocks/1", "ioaware.tune_tc/1")
#: The dtypes a family's default grid tries, in order: the first its plan takes is its dtype.
DTYPE_ORDER = ("fp16", "fp32", "bf16")
DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (64, 128)
CAUSALS = (False, True)
SEQ_LENS = (512, 2048, 8192, 16384)
QUICK_HEAD_DIMS = (64,)
QUICK_SEQ_LENS = (512, 2048)
#: Tokens per call: B = TOKENS // N (at least 1).
TOKENS = 16384
#: H * d per family (H = HEAD_WIDTH // d): a call of the default tiles takes 0.1-10 ms on an
#: H100 over the grid (results/bench_*: mma 0.49-9.7 ms and tf32 1.1-43 ms at H * d = 2048);
#: a family not named here takes `DEFAULT_HEAD_WIDTH`.
HEAD_WIDTH = {"mma": 1024, "tf32": 256}
DEFAULT_HEAD_WIDTH = 1024
#: Loss (pick / best - 1) within which a pick counts as good, and the share of groups that
#: should be good.
WITHIN = 0.05
TARGET_SHARE = 0.90
#: Configuration keys that each choose a kernel of their own, (family, pass) -> keys: the
#: wgmma backward's dQ kernel depends on ``dq_tile`` alone, its dK/dV kernel on ``kv_tile``
#: (elsewhere a configuration is one kernel).
OWN_KERNEL_KEYS = {("wgmma", "bwd"): ("dq_tile", "kv_tile")}
#: Seconds to compile one kernel configuration when the kernel cache is cold (an H100's first
#: forward compiles in 3.7-5.2 s with numba-cuda's import: results/first_call_h100_*).
COMPILE_S = 4.0
#: Seconds of the device-side sleep before each timed call (SLEEP_CYCLES at about 1.8 GHz).
SLEEP_S = SLEEP_CYCLES / 1.8e9
#: time_cuda's bounds (benchmarks.common.time_cuda defaults).
WARMUP_CALLS, MIN_REPS, MAX_REPS, BUDGET_MS = 3, 5, 30, 400.0


@dataclass(frozen=True)
class Group:
    """One problem of the grid: every legal configuration of ``family``'s ``pass_`` is timed on
    it."""

    family: str
    pass_: str
    dtype: str
    head_dim: int
    causal: bool
    seq_len: int
    batch: int
    heads: int

    def fields(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return d

    def workload(self):
        from sim.workload import Workload
        return Workload(batch=self.batch, heads=self.heads, seq_len_q=self.seq_len,
                        head_dim=self.head_dim, dtype=self.dtype, causal=self.causal,
                        pass_=self.pass_)

    def label(self) -> str:
        return (f"{self.family} {self.pass_} {self.dtype} d={self.head_dim} "
                f"{'causal' if self.causal else 'full'} N={self.seq_len} B={self.batch} "
                f"H={self.heads}")


# ------------------------------------------------------------------------------------------------
# the grid
# ------------------------------------------------------------------------------------------------

def families() -> list[tuple[str, str]]:
    """(family, pass) of every family with listed configurations (`sim.plans.CONFIGS`)."""
    from sim.plans import CONFIGS
    return sorted(CONFIGS)


def legal_configs(family: str, pass_: str, workload) -> list[dict]:
    """The family's legal configurations for ``workload`` (`sim.plans.CONFIGS`)."""
    import importlib

    from sim.plans import CONFIGS
    module, function = CONFIGS[(family, pass_)].split(":")
    return list(getattr(importlib.import_module(module), function)(workload))


def takes(family: str, pass_: str, dtype: str, head_dim: int) -> bool:
    """Whether the family's plan builds for this dtype and head dim (some legal config)."""
    from sim.plans import plan_for
    from sim.workload import Workload
    w = Workload(batch=1, heads=1, seq_len_q=128, head_dim=head_dim, dtype=dtype, pass_=pass_)
    try:
        cfgs = legal_configs(family, pass_, w)
        if not cfgs:
            return False
        plan_for(family, pass_, w, **cfgs[0])
    except ValueError:
        return False
    return True


def shape(family: str, head_dim: int, seq_len: int) -> tuple[int, int]:
    """(batch, heads) of a group: B = `TOKENS` / N, H = `HEAD_WIDTH` / d (each at least 1)."""
    width = HEAD_WIDTH.get(family, DEFAULT_HEAD_WIDTH)
    return max(1, TOKENS // seq_len), max(1, width // head_dim)


def grid(families_=None, *, dtypes=None, quick=False, passes=None) -> list[Group]:
    """The groups to time. ``families_``: family names (default every family of
    `sim.plans.CONFIGS`), ``passes``: "fwd" / "bwd" (default every listed pass), ``dtypes``:
    the dtypes to time where the family takes them (default: its first of `DTYPE_ORDER`),
    ``quick``: d=64, N 512 and 2048. Raises ValueError naming the argument for an unknown
    family, pass or dtype, or a selection with no group."""
    listed = families()
    names = sorted({f for f, _p in listed})
    if families_ is not None:
        unknown = [f for f in families_ if f not in names]
        if unknown:
            raise ValueError(f"family: unknown {unknown[0]!r}; families with configurations "
                             f"(sim.plans.CONFIGS): {names}")
    if passes is not None:
        bad = [p for p in passes if p not in ("fwd", "bwd")]
        if bad:
            raise ValueError(f"pass: expected 'fwd' or 'bwd', got {bad[0]!r}")
    if dtypes is not None:
        bad = [d for d in dtypes if d not in DTYPES]
        if bad:
            raise ValueError(f"dtypes: expected some of {DTYPES}, got {bad[0]!r}")
    head_dims = QUICK_HEAD_DIMS if quick else HEAD_DIMS
    seq_lens = QUICK_SEQ_LENS if quick else SEQ_LENS
    out = []
    for family, pass_ in listed:
        if families_ is not None and family not in families_:
            continue
        if passes is not None and pass_ not in passes:
            continue
        if dtypes is None:
            chosen = next(([dt] for dt in DTYPE_ORDER
                           if any(takes(family, pass_, dt, d) for d in head_dims)), [])
        else:
            chosen = list(dtypes)
        for dt in chosen:
            for d in head_dims:
                if not takes(family, pass_, dt, d):
                    continue
                for n in seq_lens:          # causal innermost: both share one set of inputs
                    for causal in CAUSALS:
                        out.append(Group(family, pass_, dt, d, causal, n, *shape(family, d, n)))
    if not out:
        raise ValueError(f"no group: no family of {families_ or names} takes dtypes {dtypes} "
                         f"at head dims {head_dims}")
    return out


def kernel_config(family: str, config: dict):
    """``kernels.KernelConfig(family=family, **config)``; ValueError naming the keys that are
    not `KernelConfig` fields (such a configuration cannot be pinned through `kernels`)."""
    import dataclasses

    from kernels import KernelConfig
    fields = {f.name for f in dataclasses.fields(KernelConfig)}
    extra = sorted(set(config) - fields)
    if extra:
        raise ValueError(f"configuration keys {extra} of {family} are not KernelConfig fields")
    return KernelConfig(family=family, **config)


def timed_call_s(time_ms: float) -> float:
    """Seconds `benchmarks.common.time_cuda` spends on a call of ``time_ms``: the probe call,
    the warm-up calls, the timed calls, and a device sleep before the probe and each timed
    call; plus the check call against the default configuration."""
    reps = min(MAX_REPS, max(MIN_REPS, math.ceil(BUDGET_MS / max(time_ms, 1e-6))))
    return (2 + WARMUP_CALLS + reps) * time_ms / 1e3 + (1 + reps) * SLEEP_S


def estimate(groups, profile="h100") -> dict:
    """What measuring ``groups`` costs, estimated before any work: ``configs`` (timings),
    ``kernels`` (distinct kernels to compile: a kernel does not depend on N, B or H),
    ``compile_s`` (at `COMPILE_S` each, a cold kernel cache), ``timing_s`` (`timed_call_s` at
    the model's time of each configuration, which runs low: docs/model.md), ``total_s``."""
    from sim.plans import choose
    configs, kernels_, timing = 0, set(), 0.0
    for g in groups:
        try:
            _cfg, _cost, ranked = choose(g.family, g.pass_, g.workload(), profile)
        except ValueError:
            continue
        own = OWN_KERNEL_KEYS.get((g.family, g.pass_), ())
        for t_s, cfg in ranked:
            configs += 1
            base = (g.family, g.pass_, g.dtype, g.head_dim, g.causal)
            joint = tuple(sorted((k, v) for k, v in cfg.items() if k not in own))
            if joint:
                kernels_.add(base + (joint,))
            kernels_.update(base + ((k, cfg[k]),) for k in own if k in cfg)
            timing += timed_call_s(t_s * 1e3)
        timing += timed_call_s(ranked[0][0] * 1e3)          # the default configuration's call
    compile_s = len(kernels_) * COMPILE_S
    return {"groups": len(groups), "configs": configs, "kernels": len(kernels_),
            "compile_s": compile_s, "timing_s": timing, "total_s": compile_s + timing}


# ------------------------------------------------------------------------------------------------
# measuring (a GPU)
# ------------------------------------------------------------------------------------------------

def _max_diff(a, b) -> float:
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))


def measure_group(torch, g: Group, inputs) -> list[dict]:
    """The records of one group: every legal configuration timed (module docstring)."""
    import kernels
    q, k, v, do = inputs
    pb = attention_problem(q, k, v, causal=g.causal)
    default = kernels.KernelConfig(family=g.family)
    if g.pass_ == "fwd":
        def call(cfg):
            return kernels.forward(pb, cfg)[:1]
    else:
        out, lse = kernels.forward(pb, default)

        def call(cfg):
            return kernels.backward(pb, out, lse, do, cfg)
    ref = call(default)
    flops = attention_flops(g.batch, g.heads, g.seq_len, g.seq_len, g.head_dim, g.causal, g.pass_)
    records = []
    for cfg in legal_configs(g.family, g.pass_, g.workload()):
        rec = dict(g.fields(), config=cfg, timing="device")
        try:
            kc = kernel_config(g.family, cfg)
            kernels.family_for(pb, kc, g.pass_)
        except ValueError as exc:                       # a configuration the kernels refuse
            records.append(dict(rec, refused=str(exc)))
            continue
        try:
            err = _max_diff(call(kc), ref)                # compiles this configuration
        except Exception as exc:  # noqa: BLE001 - a compile or launch failure of one config
            records.append(dict(rec, failed=f"{type(exc).__name__}: {exc}"))
            continue
        t = time_cuda(torch, lambda kc=kc: call(kc), timing="device")
        if g.family == "wgmma" and g.pass_ == "fwd":    # the schedule the plan gave the tiles
            from sim.plans import plan_for
            from sim.plans.wgmma_fwd import record_schedule
            rec["schedule"] = record_schedule(plan_for(g.family, g.pass_, g.workload(),
                                                       **cfg).config)
        if g.family == "wgmma" and g.pass_ == "bwd":    # its launch order, balanced
            rec["launch_balanced"] = True
        records.append(dict(rec, time_ms=t[0], time_ms_p10=t[1], time_ms_p90=t[2],
                            tflops=flops / t[0] / 1e9, max_abs_diff_vs_default=err))
    return records


def group_inputs(torch, g: Group):
    """Random normal q, k, v, dout of the group's shape on the GPU, seeded by N + d."""
    gen = torch.Generator(device="cuda").manual_seed(g.seq_len + g.head_dim)
    return tuple(torch.randn(g.batch, g.heads, g.seq_len, g.head_dim, device="cuda",
                             dtype=torch_dtype(torch, g.dtype), generator=gen) for _ in range(4))


def _cfg_label(cfg: dict) -> str:
    if set(cfg) == {"block_q", "block_k"}:
        return f"{cfg['block_q']}x{cfg['block_k']}"
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def group_line(g: Group, records, profile="h100") -> str:
    """One line of a measured group: each configuration's time, the model's pick, its loss."""
    from sim.plans import choose
    timed = [r for r in records if "time_ms" in r]
    cells = " ".join(f"{_cfg_label(r['config'])} {r['time_ms']:.3f}" if "time_ms" in r else
                     f"{_cfg_label(r['config'])} {'refused' if 'refused' in r else 'failed'}"
                     for r in records)
    tail = ""
    if timed:
        best = min(timed, key=lambda r: r["time_ms"])
        pick = choose(g.family, g.pass_, g.workload(), profile)[0]
        t_pick = next((r["time_ms"] for r in timed if r["config"] == pick), None)
        loss = "untimed" if t_pick is None else f"{100 * (t_pick / best['time_ms'] - 1):+.1f}%"
        tail = f" | best {_cfg_label(best['config'])}, model {_cfg_label(pick)} ({loss})"
    return f"{g.label()}: {cells} ms{tail}"


def run(torch, groups, *, doc, out, progress=print, profile="h100") -> dict:
    """Time every group (`measure_group`), writing ``doc`` to ``out`` after each."""
    import time
    inputs_key, inputs = None, None
    t0 = time.perf_counter()
    for i, g in enumerate(groups):
        key = (g.dtype, g.head_dim, g.seq_len, g.batch, g.heads)
        if key != inputs_key:
            inputs = None
            torch.cuda.empty_cache()
            inputs, inputs_key = group_inputs(torch, g), key
        records = measure_group(torch, g, inputs)
        doc["records"].extend(records)
        doc["complete"] = i + 1 == len(groups)
        write_json(doc, out)
        elapsed = time.perf_counter() - t0
        progress(f"[{i + 1}/{len(groups)} {elapsed / 60:.1f} min] "
                 f"{group_line(g, records, profile)}")
    return doc


# ------------------------------------------------------------------------------------------------
# the report (CPU)
# ------------------------------------------------------------------------------------------------

#: The dtype of a ``ioaware.tune_tc/1`` row by its ``kernel`` (that sweep timed float16 for the
#: mma kernel and float32 for the tf32 one).
TUNE_TC_DTYPE = {"mma": "fp16", "tf32": "fp32"}
_GROUP_KEYS = ("family", "pass", "dtype", "head_dim", "causal", "seq_len", "batch", "heads")


def _fail(where: str, what: str):
    raise ValueError(f"file {where}: {what}")


def load_timings(file) -> tuple[dict, list[dict]]:
    """``(doc, records)`` of a timings file (a path or a parsed object) of one of
    `READABLE_SCHEMAS`, each record with the group's fields (`_GROUP_KEYS`), ``config`` and
    ``time_ms`` (None for a refused or failed configuration, with ``why``). Raises ValueError
    starting "file ...: " for a file that cannot be read or is malformed; a file whose records
    are malformed gets one error listing each bad record's problem with its index (the first
    `MAX_PROBLEMS`, then how many more)."""
    where = "<object>" if isinstance(file, dict) else str(file)
    if isinstance(file, dict):
        doc = file
    else:
        try:
            with open(file) as fh:
                doc = json.load(fh)
        except OSError as exc:
            _fail(where, f"cannot be read ({exc.strerror or exc})")
        except json.JSONDecodeError as exc:
            _fail(where, f"is not JSON ({exc})")
    if not isinstance(doc, dict):
        _fail(where, f"holds a {type(doc).__name__}, expected an object with 'schema'")
    schema = doc.get("schema")
    if schema not in READABLE_SCHEMAS:
        _fail(where, f"schema {schema!r} is not one of {list(READABLE_SCHEMAS)}")
    rows = doc.get("records" if schema == SCHEMA else "rows")
    if not isinstance(rows, list):
        _fail(where, f"has no list of {'records' if schema == SCHEMA else 'rows'}")
    parsed = [_parse_record(schema, i, row) for i, row in enumerate(rows)]
    out = [r for r in parsed if isinstance(r, dict)]
    problems = [r for r in parsed if isinstance(r, str)]
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS])
        more = f"; and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        _fail(where, f"{len(problems)} malformed record{'s' * (len(problems) != 1)}: "
                     f"{shown}{more}")
    return doc, out


#: Malformed records one error lists before it says how many more there are.
MAX_PROBLEMS = 20


def _parse_record(schema: str, i: int, row) -> dict | str:
    """Record ``i`` of a timings file in `load_timings`' form, or what is wrong with it (a
    string "record i ...")."""
    if not isinstance(row, dict):
        return f"record {i} is a {type(row).__name__}, expected an object"
    if schema == SCHEMA:
        need, rec = _GROUP_KEYS + ("config",), dict(row)
    elif schema == "ioaware.tune_blocks/1":
        need = ("family", "pass", "dtype", "head_dim", "causal", "seq_len", "batch", "heads",
                "block_q", "block_k")
        rec = dict(row)
    else:
        need = ("kernel", "head_dim", "causal", "seq_len", "batch", "heads", "block_q",
                "block_k")
        rec = dict(row, family=row.get("kernel"), dtype=TUNE_TC_DTYPE.get(row.get("kernel")),
                   **{"pass": "fwd"})
    missing = [k for k in need if k not in row]
    if missing:
        return f"record {i} lacks {missing[0]!r}"
    if schema != SCHEMA:
        rec["config"] = {"block_q": row["block_q"], "block_k": row["block_k"]}
        if row.get("micro_tile"):
            rec["config"]["micro_tile"] = tuple(row["micro_tile"])
    if not isinstance(rec["config"], dict) or not rec["config"]:
        return f"record {i}: config must be a non-empty object, got {rec['config']!r}"
    why = rec.get("refused") or rec.get("failed")
    t = rec.get("time_ms")
    if why is None:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (
                math.isfinite(t) and t > 0):
            return f"record {i}: time_ms must be a positive number, got {t!r}"
        t = float(t)
    else:
        t = None
    out = {**{k: rec[k] for k in _GROUP_KEYS}, "config": rec["config"], "time_ms": t,
           "why": why}
    if "schedule" in rec:       # the wgmma forward's (pingpong, overlap) as it ran
        out["schedule"] = rec["schedule"]
    return out


def _config_key(cfg: dict) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in cfg.items()))


def _fixed(family: str, pass_: str, configs: dict, causal: bool) -> dict:
    """Options every plan of a group is priced with: for the wgmma forward, the serial schedule
    when the group's records name none (files measured before the schedules existed,
    `sim.plans.wgmma_fwd.SERIAL_SCHEDULE`); for the wgmma backward, its pass's default launch
    order unbalanced when no record is marked ``launch_balanced`` (files measured before the
    launcher balanced it, `sim.plans.wgmma_bwd.record_config`); otherwise the plans' defaults,
    which ran."""
    if (family, pass_) == ("wgmma", "bwd"):
        if any(r.get("launch_balanced") for r in configs.values()):
            return {}
        from ioaware.launch_order import DEFAULT_HEAD_GROUP
        return {"launch_order": DEFAULT_HEAD_GROUP[("bwd", bool(causal))]}
    if (family, pass_) != ("wgmma", "fwd") or any("schedule" in r for r in configs.values()):
        return {}
    from sim.plans.wgmma_fwd import SERIAL_SCHEDULE
    return dict(SERIAL_SCHEDULE)


def _profile_for(doc: dict, profile):
    from sim.profiles import load_profile, profile_for_gpu_name
    if profile is None:
        gpu = (doc.get("provenance") or {}).get("gpu") or ""
        return profile_for_gpu_name(gpu) or load_profile("h100")
    return load_profile(profile)


def pick_report(file, profile="h100", rates=None) -> dict:
    """The model's picks against the measured times of a timings file (`load_timings`): a
    path or a parsed object. ``profile``: the model's GPU (a name, a `sim.GPUProfile`, or
    None: the profile matching the file's GPU, else h100); ``rates``: a rates file (path or
    object, ``python -m benchmarks rates``) the profile takes (`sim.load_profile`). Pure:
    nothing is measured, nothing is fitted on the file's times.

    Returns ``{"file", "schema", "gpu", "profile", "rate_sources", "groups", "families",
    "skipped"}``: ``groups`` one entry per group with a timed configuration (its fields,
    ``configs_timed``, ``configs_legal``, ``pick``, ``pick_ms`` (None: the pick was not timed:
    ``pick_untimed_why``), ``best``, ``best_ms``, ``loss_pct``, ``within_5pct``,
    ``pick_rank`` (1 = the measured best), ``model_pick_ms``, ``default``, ``default_ms``,
    ``default_loss_pct``, ``default_within_5pct``); ``families`` per "family pass": ``groups``,
    ``within_5pct``, ``share_within_5pct``, ``meets_target`` (share >= 90 %), ``untimed_picks``,
    ``lost_ms`` (sum of pick - best over groups with a timed pick), ``best_ms`` (sum of best),
    ``lost_pct``, ``worst_loss_pct`` and the same four for the defaults (``default_*``);
    ``skipped``: groups not reported, with the reason."""
    from sim.plans import CONFIGS, choose, plan_for
    doc, records = load_timings(file)
    prof = _profile_for(doc, profile)
    if rates is not None:
        from sim.profiles import load_profile
        prof = load_profile(prof, rates=rates)
    from sim.plan import rates_of
    sources = rates_of(prof)[1]
    groups: dict = {}
    for rec in records:
        key = tuple(rec[k] for k in _GROUP_KEYS)
        g = groups.setdefault(key, {})
        ck = _config_key(rec["config"])
        if ck in g:
            raise ValueError(f"file {file if not isinstance(file, dict) else '<object>'}: "
                             f"configuration {rec['config']} appears twice in group "
                             f"{dict(zip(_GROUP_KEYS, key))}")
        g[ck] = rec
    out_groups, skipped = [], []
    for key, configs in groups.items():
        fields = dict(zip(_GROUP_KEYS, key))
        family, pass_ = fields["family"], fields["pass"]
        if (family, pass_) not in CONFIGS:
            skipped.append(dict(fields, why=f"no configurations listed for {family} {pass_} "
                                            f"(sim.plans.CONFIGS)"))
            continue
        timed = {ck: r for ck, r in configs.items() if r["time_ms"] is not None}
        if not timed:
            skipped.append(dict(fields, why="no configuration was timed"))
            continue
        g = Group(family, pass_, fields["dtype"], int(fields["head_dim"]), bool(fields["causal"]),
                  int(fields["seq_len"]), int(fields["batch"]), int(fields["heads"]))
        w = g.workload()
        try:
            pick, cost, ranked = choose(family, pass_, w, prof,
                                       **_fixed(family, pass_, configs, g.causal))
        except ValueError as exc:
            skipped.append(dict(fields, why=f"the model cannot price it: {exc}"))
            continue
        best_key = min(timed, key=lambda ck: timed[ck]["time_ms"])
        best, best_ms = timed[best_key]["config"], timed[best_key]["time_ms"]
        pick_rec = configs.get(_config_key(pick))
        pick_ms = pick_rec["time_ms"] if pick_rec else None
        order = sorted(timed.values(), key=lambda r: r["time_ms"])
        default_cfg = plan_for(family, pass_, w).config
        default = {k: default_cfg[k] for k in pick if k in default_cfg}
        default_rec = configs.get(_config_key(default))
        default_ms = default_rec["time_ms"] if default_rec else None
        entry = dict(
            fields, configs_timed=len(timed), configs_legal=len(ranked), pick=pick,
            pick_ms=pick_ms, best=best, best_ms=best_ms,
            loss_pct=None if pick_ms is None else 100 * (pick_ms / best_ms - 1),
            pick_rank=None if pick_ms is None else 1 + sum(r["time_ms"] < pick_ms for r in order),
            model_pick_ms=cost.time_ms, default=default, default_ms=default_ms,
            default_loss_pct=None if default_ms is None else 100 * (default_ms / best_ms - 1))
        entry["within_5pct"] = pick_ms is not None and pick_ms <= best_ms * (1 + WITHIN)
        entry["default_within_5pct"] = (default_ms is not None
                                        and default_ms <= best_ms * (1 + WITHIN))
        if pick_ms is None:
            entry["pick_untimed_why"] = (pick_rec["why"] if pick_rec else
                                         "the file has no time for this configuration")
        out_groups.append(entry)
    fams: dict = {}
    for e in out_groups:
        f = fams.setdefault(f"{e['family']} {e['pass']}", {"groups": 0, "within_5pct": 0,
                                                           "untimed_picks": 0, "lost_ms": 0.0,
                                                           "best_ms": 0.0, "worst_loss_pct": None,
                                                           "default_within_5pct": 0,
                                                           "default_lost_ms": 0.0,
                                                           "default_best_ms": 0.0,
                                                           "default_worst_loss_pct": None})
        f["groups"] += 1
        f["within_5pct"] += e["within_5pct"]
        f["default_within_5pct"] += e["default_within_5pct"]
        if e["pick_ms"] is None:
            f["untimed_picks"] += 1
        else:
            f["lost_ms"] += e["pick_ms"] - e["best_ms"]
            f["best_ms"] += e["best_ms"]
            f["worst_loss_pct"] = max(f["worst_loss_pct"] or 0.0, e["loss_pct"])
        if e["default_ms"] is not None:
            f["default_lost_ms"] += e["default_ms"] - e["best_ms"]
            f["default_best_ms"] += e["best_ms"]
            f["default_worst_loss_pct"] = max(f["default_worst_loss_pct"] or 0.0,
                                              e["default_loss_pct"])
    for f in fams.values():
        f["share_within_5pct"] = f["within_5pct"] / f["groups"]
        f["meets_target"] = f["share_within_5pct"] >= TARGET_SHARE
        f["lost_pct"] = 100 * f["lost_ms"] / f["best_ms"] if f["best_ms"] else None
        f["default_share_within_5pct"] = f["default_within_5pct"] / f["groups"]
        f["default_lost_pct"] = (100 * f["default_lost_ms"] / f["default_best_ms"]
                                 if f["default_best_ms"] else None)
    prov = doc.get("provenance") or {}
    return {"file": "<object>" if isinstance(file, dict) else str(file),
            "schema": doc["schema"], "gpu": prov.get("gpu"), "date": prov.get("date"),
            "profile": prof.name, "rate_sources": sources, "groups": out_groups,
            "families": fams, "skipped": skipped}


def _pct(v) -> str:
    return "—" if v is None else f"{v:+.1f}"


def format_report(rep: dict) -> str:
    """The report as a table, a summary line per family and pass, and the skipped groups."""
    measured = sorted({s for s in rep["rate_sources"].values()})
    lines = [f"# {rep['file']} ({rep['schema']}; {rep['gpu']}, {rep['date']}); model: profile "
             f"{rep['profile']}, {'/'.join(measured)} rates; nothing fitted on the file"]
    head = (f"{'family':<6} {'pass':<4} {'dtype':<5} {'d':>4} {'causal':>6} {'N':>6} {'B':>3} "
            f"{'H':>3} {'cfgs':>5} {'model pick':>10} {'ms':>8} {'best':>8} {'ms':>8} "
            f"{'loss %':>7} {'<=5%':>4} {'default':>8} {'loss %':>7}")
    lines.append(head)
    for e in rep["groups"]:
        pick_ms = "—" if e["pick_ms"] is None else f"{e['pick_ms']:.3f}"
        lines.append(
            f"{e['family']:<6} {e['pass']:<4} {e['dtype']:<5} {e['head_dim']:>4} "
            f"{('on' if e['causal'] else 'off'):>6} {e['seq_len']:>6} {e['batch']:>3} "
            f"{e['heads']:>3} {e['configs_timed']:>2}/{e['configs_legal']:<2} "
            f"{_cfg_label(e['pick']):>10} {pick_ms:>8} "
            f"{_cfg_label(e['best']):>8} {e['best_ms']:8.3f} {_pct(e['loss_pct']):>7} "
            f"{('yes' if e['within_5pct'] else 'no'):>4} {_cfg_label(e['default']):>8} "
            f"{_pct(e['default_loss_pct']):>7}")
    for name, f in rep["families"].items():
        lost = "—" if f["lost_pct"] is None else f"{f['lost_pct']:.1f} %"
        dlost = "—" if f["default_lost_pct"] is None else f"{f['default_lost_pct']:.1f} %"
        lines.append(
            f"{name}: model's pick within 5 % of the measured best in {f['within_5pct']} of "
            f"{f['groups']} groups ({100 * f['share_within_5pct']:.0f} %; target >= "
            f"{100 * TARGET_SHARE:.0f} %: {'met' if f['meets_target'] else 'not met'}), time "
            f"lost {f['lost_ms']:.3f} ms of {f['best_ms']:.3f} ms ({lost}), worst "
            f"{_pct(f['worst_loss_pct'])} %"
            + (f", {f['untimed_picks']} picks not timed" if f["untimed_picks"] else "")
            + f"; today's default tiles: {f['default_within_5pct']} of {f['groups']} within 5 %, "
              f"time lost {f['default_lost_ms']:.3f} ms ({dlost})")
    for s in rep["skipped"]:
        lines.append(f"skipped {s['family']} {s['pass']} d={s['head_dim']} N={s['seq_len']}: "
                     f"{s['why']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------

def default_out(gpu: str, date: str) -> str:
    return "pick_" + re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() + f"_{date[:10]}.json"


def _error(message: str) -> int:
    print(f"python -m benchmarks pick: {message}", file=sys.stderr)
    return 2


def _open_gpu():
    """torch with a CUDA GPU the tensor-core kernels run on, or ``(None, why)``."""
    try:
        import torch
    except ImportError:
        return None, "needs torch with CUDA"
    if not torch.cuda.is_available():
        return None, ("needs a CUDA GPU (torch sees none); --report FILE and --dry-run run on "
                      "the CPU")
    from kernels import host
    if host.simulator():
        return None, ("needs a CUDA GPU: the tensor-core families do not run in Numba's CUDA "
                      "simulator (NUMBA_ENABLE_CUDASIM=1)")
    return torch, None


def main(argv=None) -> int:
    argv = list(argv or [])
    names = sorted({f for f, _p in families()})
    ap = argparse.ArgumentParser(prog="python -m benchmarks pick",
                                 description=first_sentence(__doc__),
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=doc_usage(__doc__))
    ap.add_argument("--family", nargs="+", default=None, metavar="FAMILY",
                    help=f"families to time (default every family of sim.plans.CONFIGS: {names})")
    ap.add_argument("--pass", dest="pass_", nargs="+", default=None, metavar="PASS",
                    help="passes to time: fwd, bwd (default every listed pass)")
    ap.add_argument("--dtypes", nargs="+", default=None, metavar="DTYPE",
                    help=f"dtypes to time where a family takes them ({', '.join(DTYPES)}; "
                         "default: each family's first of fp16, fp32)")
    ap.add_argument("--quick", action="store_true", help="a small grid: d=64, N 512 and 2048")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the grid, the model's picks and the time estimate; time nothing")
    ap.add_argument("--out", default=None,
                    help="JSON file to write (default ./pick_<gpu>_<date>.json)")
    ap.add_argument("--report", metavar="FILE.json", default=None,
                    help="analyse a timings file (this command's, tune --family's, or the shipped "
                         "tile sweep's) on the CPU")
    ap.add_argument("--rates", metavar="RATES.json", default=None,
                    help="measured rates the model's profile takes (python -m benchmarks rates)")
    ap.add_argument("--profile", default=None,
                    help="the model's profile (default: the one matching the file's GPU, "
                         "else h100)")
    ap.add_argument("--json", action="store_true", help="--report: print the report as JSON")
    args = ap.parse_args(argv)

    if args.report:
        try:
            rep = pick_report(args.report, args.profile, args.rates)
        except ValueError as exc:
            return _error(f"--report {args.report}: {exc}" if not str(exc).startswith("file ")
                          else str(exc))
        print(json.dumps(rep, indent=1) if args.json else format_report(rep))
        return 0
    try:
        groups = grid(args.family, dtypes=args.dtypes, quick=args.quick, passes=args.pass_)
    except ValueError as exc:
        arg = str(exc).split(":", 1)[0]
        flag = {"family": "--family", "pass": "--pass", "dtypes": "--dtypes"}.get(arg)
        return _error(f"{flag}: {str(exc).split(': ', 1)[1]}" if flag else str(exc))
    torch = None
    if not args.dry_run:
        torch, why = _open_gpu()
        if torch is None:
            return _error(why)
    skipped, timeable = [], []
    for g in groups:
        try:
            for cfg in legal_configs(g.family, g.pass_, g.workload())[:1]:
                kernel_config(g.family, cfg)
            timeable.append(g)
        except ValueError as exc:
            skipped.append(dict(g.fields(), why=str(exc)))
    profile = args.profile or "h100"
    if torch is not None and args.profile is None:
        from sim.profiles import profile_for_gpu_name
        found = profile_for_gpu_name(torch.cuda.get_device_name())
        profile = found.name if found else profile
    est = estimate(timeable, profile)
    per_family: dict = {}
    for g in timeable:
        name = f"{g.family} {g.pass_} {g.dtype}"
        per_family[name] = per_family.get(name, 0) + 1
    print(f"grid: {est['groups']} groups ({', '.join(f'{k}: {v}' for k, v in per_family.items())}),"
          f" {est['configs']} configurations, {est['kernels']} kernels to compile; about "
          f"{est['total_s'] / 60:.1f} GPU minutes ({est['compile_s'] / 60:.1f} compiling with a "
          f"cold kernel cache, {est['timing_s'] / 60:.1f} timing at the model's times on "
          f"{profile})", flush=True)
    for skip in skipped:
        print(f"skipped {skip['family']} {skip['pass']} {skip['dtype']} d={skip['head_dim']}: "
              f"{skip['why']}", flush=True)
    if args.dry_run:
        from sim.plans import choose
        for g in timeable:
            pick, cost, ranked = choose(g.family, g.pass_, g.workload(), profile)
            print(f"  {g.label()}: {len(ranked)} configurations, model's pick "
                  f"{_cfg_label(pick)} ({cost.time_ms:.3f} ms on {profile})")
        return 0
    if not timeable:
        return _error("no group can be timed through kernels.KernelConfig (see 'skipped' above)")
    prov = provenance(command_line("pick", argv), extra={
        "timing": "device", "grid_options": {"family": args.family, "pass": args.pass_,
                                             "dtypes": args.dtypes, "quick": args.quick},
        "shape": {"tokens": TOKENS, "head_width": HEAD_WIDTH,
                  "default_head_width": DEFAULT_HEAD_WIDTH}})
    out = args.out or default_out(prov["gpu"], prov["date"])
    doc = {"schema": SCHEMA, "provenance": prov, "grid": [g.fields() for g in timeable],
           "records": [], "skipped": skipped, "complete": False}
    print(f"{prov['gpu']}: writing {out} after every group", flush=True)
    run(torch, timeable, doc=doc, out=out, progress=lambda s: print(s, flush=True),
        profile=profile)
    print(f"wrote {out}", flush=True)
    print(format_report(pick_report(out, profile, args.rates)))
    return 0
