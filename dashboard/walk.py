"""The *Step through* page's model: a small attention problem walked tile by tile, and one query
row's online softmax (forward) or recomputed probabilities (backward) in step with the walk.

Plain NumPy/pandas, no Streamlit and no cost-model import: the memory events come in as a table
(``dashboard.data.trace_events``, from the cost model's event trace, the same one it counts), the
arithmetic of the chosen row is done here in float64 on seeded inputs.

Counting conventions of what this module returns: steps, tiles, rows and keys are **1-based**
(step 1 is the first step, "Q tile 1" holds query rows 1..block_q); "no tile" is ``None``,
never -1.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

__all__ = ["Walk", "build_walk", "inputs", "INPUT_KINDS", "row_forward", "row_backward",
           "TENSOR_NAMES", "KEY_SIDE", "tensor_label", "phase_label", "step_at_row"]

#: Display names of the tensors the event trace names.
TENSOR_NAMES = {
    "Q": "Q", "K": "K", "V": "V", "O": "O", "lse": "logsumexp L", "l": "row sum l",
    "m": "row max m", "dO": "dO", "dQ": "dQ", "dK": "dK", "dV": "dV",
    "D": "D = rowsum(dO∘O)", "dQacc": "dQ accumulator (float32)", "S": "scores S",
    "P": "probabilities P", "Pd": "P after dropout", "dP": "dP", "dS": "dS",
    "drop_mask": "dropout mask", "mask": "mask", "dK_exp": "dK per query head",
    "dV_exp": "dV per query head",
}
#: Tensors whose rows are key positions (their row blocks are K tiles); the rest are query rows.
KEY_SIDE = frozenset({"K", "V", "dK", "dV", "dK_exp", "dV_exp"})
#: Display order of the tensors in the bytes table and the row strips.
TENSOR_ORDER = ("Q", "K", "V", "S", "P", "Pd", "O", "l", "m", "lse", "dO", "D", "dP", "dS",
                "dQacc", "dQ", "dK", "dV", "dK_exp", "dV_exp", "mask", "drop_mask")

INPUT_KINDS = {
    "drift": "Drifting keys (the max rises tile by tile)",
    "random": "Random (standard normal)",
}

# What each kernel phase computes, per kind of step ("start" of a program, a "tile", its "end");
# {m} and {n} are 1-based Q and K/V tile numbers, {rows} / {keys} their row ranges.
_PHASES = {
    ("flash2", "fwd"): ("Forward", {
        "start": "Q tile {m}: its rows go on chip; running max m = −∞, running sum l = 0, "
                 "output accumulator = 0.",
        "tile": "Q tile {m} × K/V tile {n}: scores S = QKᵀ/√d of the tile on chip; the running "
                "max and sum are updated, the accumulator is rescaled by α and P·V is added.",
        "end": "Q tile {m} done: O = accumulator / l and the logsumexp L = m + log l are written "
               "(one number per row is all the backward needs)."}),
    ("flash1", "fwd"): ("Forward", {
        "start": "O = 0, l = 0, m = −∞ are written to memory for every row.",
        "tile": "K/V tile {n} (outer loop) × Q tile {m}: Q, O, l and m are read back, S = QKᵀ/√d "
                "and the online softmax update run on chip, and O, l, m are written again.",
        "end": "Done."}),
    ("flash2", "bwd.pre"): ("Backward: preprocessing", {
        "start": "Q tile {m}: D = rowsum(dO ∘ O) for its rows; the dQ accumulator is zeroed."}),
    ("flash2", "bwd.main"): ("Backward: main loop", {
        "start": "K/V tile {n}: K and V go on chip once; dK = dV = 0 on chip.",
        "tile": "K/V tile {n} × Q tile {m}: S = QKᵀ/√d and P = exp(S − L) are recomputed from the "
                "saved logsumexp L; dV += PᵀdO, dP = dO Vᵀ, dS = P∘(dP − D), dK += dSᵀQ; dS·K "
                "is added to dQ in memory (atomic add).",
        "end": "K/V tile {n} done: dK and dV are written."}),
    ("flash2", "bwd.dq"): ("Backward: dQ", {
        "start": "Q tile {m}: Q, dO, L and D go on chip.",
        "tile": "Q tile {m} × K/V tile {n}: S and P recomputed from L; dQ += dS·K on chip.",
        "end": "Q tile {m} done: dQ is written."}),
    ("flash2", "bwd.post"): ("Backward: dQ conversion", {
        "start": "Q tile {m}: the float32 dQ accumulator is converted to the input type."}),
    ("flash1", "bwd.main"): ("Backward", {
        "start": "dQ = 0 is written to memory.",
        "tile": "K/V tile {n} × Q tile {m}: Q, O, dO, dQ, l, m are read; S and P = exp(S − m)/l "
                "are recomputed; dV, dK accumulate on chip and dQ is written back.",
        "end": "K/V tile {n} done: dK and dV are written."}),
    ("naive", "fwd.qk"): ("Forward", {"start": "S = QKᵀ: the N×N scores are written to memory."}),
    ("naive", "fwd.scale_mask"): ("Forward", {"start": "S is scaled (and masked): read and "
                                                      "written again."}),
    ("naive", "fwd.softmax"): ("Forward", {"start": "P = softmax(S): the N×N scores are read "
                                                   "back and the N×N probabilities written."}),
    ("naive", "fwd.dropout"): ("Forward", {"start": "Dropout on P."}),
    ("naive", "fwd.pv"): ("Forward", {"start": "O = PV: P is read back once more."}),
    ("naive", "bwd.dv"): ("Backward", {"start": "dV = PᵀdO: the stored P is read back."}),
    ("naive", "bwd.dp"): ("Backward", {"start": "dP = dO Vᵀ: an N×N matrix is written."}),
    ("naive", "bwd.dropout"): ("Backward", {"start": "Dropout on dP."}),
    ("naive", "bwd.softmax"): ("Backward", {"start": "dS = P∘(dP − rowsum(dP∘P)): P and dP are "
                                                    "read, dS written."}),
    ("naive", "bwd.scale_mask"): ("Backward", {"start": "dS is scaled (and masked)."}),
    ("naive", "bwd.dq"): ("Backward", {"start": "dQ = dS K: dS is read back."}),
    ("naive", "bwd.dk"): ("Backward", {"start": "dK = dSᵀQ: dS is read back once more."}),
}


def tensor_label(t: str) -> str:
    return TENSOR_NAMES.get(t, t)


def phase_label(schedule: str, phase: str) -> str:
    return _PHASES.get((schedule, phase), (phase, {}))[0]


def _rows(r0: int, r1: int) -> str:
    """Rows [r0, r1) of the trace as 1-based inclusive text."""
    return f"{r0 + 1}" if r1 - r0 == 1 else f"{r0 + 1}–{r1}"


# ------------------------------------------------------------------------------------------------
# The tile walk
# ------------------------------------------------------------------------------------------------
@dataclass
class Walk:
    """A schedule's memory events grouped into steps, with everything a step's view needs
    precomputed (``state(i)`` is then a lookup)."""

    schedule: str
    direction: str                  # "forward" or "backward"
    seq_len: int
    block_q: int
    block_k: int
    causal: bool
    steps: pd.DataFrame             # one row per step (see build_walk)
    events: pd.DataFrame            # memory events, 1-based step / tiles, readable names
    tensors: list                   # tensors with memory traffic, display order
    tensor_bytes: dict              # tensor -> size in bytes
    cum: dict                       # "read" / "written" / "added" -> int array [steps, tensors]
    block_counts: np.ndarray        # [steps, tensors, blocks]: transfers of each row block so far
    touched: list                   # per step: {tensor: set of 0-based blocks moved this step}
    visited: set = field(default_factory=set)   # 0-based (m, n) tiles that are ever computed

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def n_blocks_q(self) -> int:
        return -(-self.seq_len // self.block_q)

    @property
    def n_blocks_k(self) -> int:
        return -(-self.seq_len // self.block_k)

    def tensor_table(self, step: int) -> pd.DataFrame:
        """Bytes moved per tensor up to ``step`` (1-based), with how many times each tensor's
        size that is (re-reads counted)."""
        i = step - 1
        rows = []
        for j, t in enumerate(self.tensors):
            size = self.tensor_bytes[t]
            rd, wr, ad = (int(self.cum[k][i, j]) for k in ("read", "written", "added"))
            rows.append({"tensor": tensor_label(t), "size": size, "read": rd,
                         "times read": rd / size if size else np.nan, "written": wr,
                         "times written": wr / size if size else np.nan, "added": ad})
        df = pd.DataFrame(rows)
        if not df["added"].any():
            df = df.drop(columns=["added"])
        return df

    def tiles_done(self, step: int) -> list[tuple[int, int]]:
        """0-based (m, n) of the tiles computed at steps 1..``step``."""
        upto = self.steps.iloc[:step]
        sel = upto[upto["q_tile"].notna() & upto["k_tile"].notna()]
        return list(zip(sel["q_tile"].astype(int) - 1, sel["k_tile"].astype(int) - 1))

    def on_chip(self, step: int) -> dict:
        """``{tensor: set of 0-based row blocks}`` moved at ``step`` or held for its tile."""
        cur = self.steps.iloc[step - 1]
        out = {t: set(self.touched[step - 1].get(t, ())) for t in self.tensors}
        m = None if pd.isna(cur["q_tile"]) else int(cur["q_tile"]) - 1
        n = None if pd.isna(cur["k_tile"]) else int(cur["k_tile"]) - 1
        if self.schedule != "naive":
            for t in self.tensors:
                if t in KEY_SIDE and n is not None and t in ("K", "V"):
                    out[t].add(n)
                elif t not in KEY_SIDE and m is not None and t in ("Q", "O") \
                        and self.direction == "forward":
                    out[t].add(m)
        return out


def build_walk(events: pd.DataFrame, tensor_shapes: dict, *, schedule: str, direction: str,
               seq_len: int, block_q: int, block_k: int, causal: bool) -> Walk:
    """Group the trace's memory events into steps.

    ``events``: one row per memory event, columns ``phase, program, step, op ("load", "store",
    "atomic"), tensor, q_block, k_block`` (0-based, -1 = none), ``row_start, row_stop, bytes``,
    in trace order; compute events may be included (``op == "compute"``: they give the step's
    tile). ``tensor_shapes``: tensor -> (rows, bytes per row).

    A step is one (phase, program, step) group of consecutive events: one tile of work of one
    thread block (or its start or end), or for standard attention one kernel's pass.
    """
    ev = events.reset_index(drop=True)
    n_ev = len(ev)
    phase = ev["phase"].astype(str).to_numpy()
    program = ev["program"].to_numpy(np.int64)
    stepc = ev["step"].to_numpy(np.int64)
    op = ev["op"].astype(str).to_numpy()
    tensor = ev["tensor"].astype(str).to_numpy()
    qb, kb = ev["q_block"].to_numpy(np.int64), ev["k_block"].to_numpy(np.int64)
    r0s, r1s = ev["row_start"].to_numpy(np.int64), ev["row_stop"].to_numpy(np.int64)
    nbytes = ev["bytes"].to_numpy(np.int64)
    new = np.ones(n_ev, dtype=bool)
    new[1:] = (phase[1:] != phase[:-1]) | (program[1:] != program[:-1]) | (stepc[1:] != stepc[:-1])
    idx = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n_ev)
    n_steps = len(starts)

    is_mem = op != "compute"
    present = set(tensor[is_mem].tolist())
    tensors = [t for t in TENSOR_ORDER if t in present] + sorted(present - set(TENSOR_ORDER))
    tix = {t: j for j, t in enumerate(tensors)}
    nbq, nbk = -(-seq_len // block_q), -(-seq_len // block_k)
    width = max(nbq, nbk)

    step_read = np.zeros((n_steps, len(tensors)), dtype=np.int64)
    step_written = np.zeros_like(step_read)
    step_added = np.zeros_like(step_read)
    step_blocks = np.zeros((n_steps, len(tensors), width), dtype=np.int64)
    touched: list[dict] = [dict() for _ in range(n_steps)]
    mem_idx = np.flatnonzero(is_mem)
    targets = {"load": step_read, "store": step_written, "atomic": step_added}
    for e in mem_idx.tolist():
        i, t = int(idx[e]), tensor[e]
        j = tix[t]
        targets[op[e]][i, j] += int(nbytes[e])
        r0, r1 = int(r0s[e]), int(r1s[e])
        if r1 > r0:
            size = block_k if t in KEY_SIDE else block_q
            b0, b1 = r0 // size, (r1 - 1) // size
            step_blocks[i, j, b0:b1 + 1] += 1
            touched[i].setdefault(t, set()).update(range(b0, b1 + 1))
    cum = {"read": np.cumsum(step_read, 0), "written": np.cumsum(step_written, 0),
           "added": np.cumsum(step_added, 0)}

    rows = []
    prog_key = [f"{phase[a]}|{program[a]}" for a in starts.tolist()]
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        m_raw, n_raw = int(qb[a:b].max()), int(kb[a:b].max())
        m = m_raw if m_raw >= 0 else None
        n = n_raw if n_raw >= 0 else None
        first = i == 0 or prog_key[i] != prog_key[i - 1]
        last = i == n_steps - 1 or prog_key[i] != prog_key[i + 1]
        if m is not None and n is not None:
            kind = "tile"
        elif first or schedule == "naive":
            kind = "start"
        elif last:
            kind = "end"
        else:
            kind = "start"
        ph = str(phase[a])
        texts = _PHASES.get((schedule, ph), (ph, {}))[1]
        sel = [e for e in range(a, b) if is_mem[e]]
        m_txt = m + 1 if m is not None else _infer_block(
            [(tensor[e], r0s[e], r1s[e]) for e in sel], False, block_q, block_k)
        n_txt = n + 1 if n is not None else _infer_block(
            [(tensor[e], r0s[e], r1s[e]) for e in sel], True, block_q, block_k)
        what = (texts.get(kind) or texts.get("start") or "").format(m=m_txt or "", n=n_txt or "")
        rows.append({"step": i + 1, "phase": ph, "stage": phase_label(schedule, ph),
                     "kind": kind, "program": int(program[a]) + 1,
                     "q_tile": m + 1 if m is not None else None,
                     "k_tile": n + 1 if n is not None else None,
                     "what": what,
                     "moves": _moves_text([(op[e], tensor[e], r0s[e], r1s[e]) for e in sel]),
                     "read_bytes": int(step_read[i].sum()),
                     "written_bytes": int(step_written[i].sum() + step_added[i].sum())})
    steps = pd.DataFrame(rows)
    steps["q_tile"] = steps["q_tile"].astype("Int64")
    steps["k_tile"] = steps["k_tile"].astype("Int64")
    steps["cum_read"] = steps["read_bytes"].cumsum()
    steps["cum_written"] = steps["written_bytes"].cumsum()

    tensor_bytes = {t: int(tensor_shapes[t][0]) * int(tensor_shapes[t][1]) for t in tensors}
    visited = {(int(m) - 1, int(n) - 1) for m, n in zip(steps["q_tile"], steps["k_tile"])
               if not pd.isna(m) and not pd.isna(n)}
    block_counts = np.cumsum(step_blocks, 0)
    shown = pd.DataFrame({"step": idx[mem_idx] + 1, "op": op[mem_idx], "tensor": tensor[mem_idx],
                          "row_start": r0s[mem_idx], "row_stop": r1s[mem_idx],
                          "bytes": nbytes[mem_idx]})
    return Walk(schedule, direction, seq_len, block_q, block_k, causal, steps, shown, tensors,
                tensor_bytes, cum, block_counts, touched, visited)


def _infer_block(items, key_side: bool, block_q: int, block_k: int):
    """The 1-based tile of a start/end step from the rows its events ``(tensor, row_start,
    row_stop)`` touch on one side (None if none, or more than one tile)."""
    size = block_k if key_side else block_q
    blocks = set()
    for t, r0, r1 in items:
        if (t in KEY_SIDE) == key_side:
            blocks |= {int(r0) // size, (int(r1) - 1) // size}
    return min(blocks) + 1 if len(blocks) == 1 else None


def _moves_text(items) -> str:
    """``"read K rows 17–32, V rows 17–32; write O rows 1–16"`` from ``(op, tensor, row_start,
    row_stop)`` events."""
    parts = []
    for kind, verb in (("load", "read"), ("store", "write"), ("atomic", "add to")):
        names = [f"{tensor_label(t)} rows {_rows(int(r0), int(r1))}"
                 for o, t, r0, r1 in items if o == kind]
        if names:
            parts.append(f"{verb} " + ", ".join(names))
    return "; ".join(parts) or "no memory traffic"


def step_events(walk: Walk, step: int) -> pd.DataFrame:
    """The memory events of ``step`` as the page lists them (1-based rows, plain names)."""
    sub = walk.events[walk.events["step"] == step]
    return pd.DataFrame({
        "action": sub["op"].map({"load": "read", "store": "write", "atomic": "add (atomic)"}),
        "tensor": sub["tensor"].map(tensor_label),
        "rows": [_rows(int(a), int(b)) for a, b in zip(sub["row_start"], sub["row_stop"])],
        "bytes": sub["bytes"].astype(int),
    }).reset_index(drop=True)


# ------------------------------------------------------------------------------------------------
# Inputs and one row's arithmetic
# ------------------------------------------------------------------------------------------------
#: Rise of the "drift" inputs' scores per key position, in score units: a tile of 16 keys
#: rises by about 2.4, more than the spread of 16 standard-normal scores, so the running max of a
#: row usually moves up at every tile.
DRIFT_PER_KEY = 0.15


def inputs(seq_len: int, head_dim: int, kind: str = "drift", seed: int = 0) -> dict:
    """Seeded float64 Q, K, V, dO ``[seq_len, head_dim]`` and the softmax scale 1/√d.

    ``kind="drift"``: every query's first component is ``a`` and key j gets
    ``j · DRIFT_PER_KEY · √d / a`` added to its first component, so the score of key j grows by
    ``DRIFT_PER_KEY`` per position on top of the random part, for every query (keys further
    along score higher, as in attention biased towards recent tokens). ``"random"``: standard
    normal.
    """
    if kind not in INPUT_KINDS:
        raise ValueError(f"kind must be one of {sorted(INPUT_KINDS)}, got {kind!r}")
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((seq_len, head_dim)) for _ in range(4))
    scale = 1.0 / np.sqrt(head_dim)
    if kind == "drift":
        a = 2.0
        q[:, 0] = a
        k[:, 0] += np.arange(seq_len) * DRIFT_PER_KEY * np.sqrt(head_dim) / a
    return {"q": q, "k": k, "v": v, "do": do, "scale": scale}


def _visible(seq_len: int, row: int, causal: bool) -> np.ndarray:
    keys = np.arange(seq_len)
    return keys <= row if causal else np.ones(seq_len, dtype=bool)


def _exact(x: dict, row: int, causal: bool) -> dict:
    """Materialised float64 attention of one row: scores, P, O, logsumexp, and the backward's
    D, dP, dS and dQ row (with dO from ``x``)."""
    q, k, v, do, scale = x["q"], x["k"], x["v"], x["do"], x["scale"]
    s = (k @ q[row]) * scale
    vis = _visible(len(k), row, causal)
    s_vis = np.where(vis, s, -np.inf)
    mx = s_vis.max()
    p = np.exp(s_vis - mx)
    lse = mx + np.log(p.sum())
    p = np.exp(s_vis - lse)
    o = p @ v
    d_row = float(do[row] @ o)
    dp = v @ do[row]
    ds = p * (dp - d_row)
    dq = scale * (ds @ k)
    return {"s": s, "visible": vis, "p": p, "o": o, "lse": float(lse), "D": d_row, "dp": dp,
            "ds": ds, "dq": dq}


def row_tiles(walk: Walk, row: int, phase: str | None = None) -> pd.DataFrame:
    """The steps at which query ``row`` (0-based) is in the tile being computed: columns step,
    k_tile (1-based), in walk order."""
    m = row // walk.block_q + 1
    st = walk.steps
    sel = st[(st["q_tile"] == m) & st["k_tile"].notna()]
    if phase is not None:
        sel = sel[sel["phase"] == phase]
    return sel[["step", "k_tile"]].reset_index(drop=True)


def row_forward(walk: Walk, x: dict, row: int) -> dict:
    """One query row's online softmax over the K/V tiles in the order the walk visits them.

    Returns ``{"tiles": DataFrame (one row per tile of this row: step, k_tile, keys, tile_max,
    m_old, m, alpha, l_old, tile_sum, l, acc1_old, pv1, acc1, err), "acc": [tiles, d] array of
    the output accumulator after each tile, "pv": [tiles, d] array of what each tile adds to it,
    "o": [tiles, d] array of the output after each tile (accumulator / l), "exact":
    _exact(...)}``. ``alpha`` is exp(m_old − m): NaN for the first tile (nothing was summed
    before it). Each tile updates ``l = alpha · l_old + tile_sum`` (``tile_sum``: Σ exp(s − m)
    over the tile's visible keys) and ``acc = alpha · acc_old + pv`` (``pv``: Σ exp(s − m) · v);
    ``acc1_old``, ``pv1``, ``acc1`` are the first components of those vectors.
    """
    ex = _exact(x, row, walk.causal)
    s, vis, v = ex["s"], ex["visible"], x["v"]
    tiles = row_tiles(walk, row, "fwd") if walk.schedule != "naive" else pd.DataFrame(
        columns=["step", "k_tile"])
    m_run, l_run = -np.inf, 0.0
    d = v.shape[1]
    acc = np.zeros(d)
    rows, outs, accs, pvs = [], [], [], []
    for step, n in zip(tiles["step"], tiles["k_tile"]):
        k0, k1 = (int(n) - 1) * walk.block_k, min(int(n) * walk.block_k, walk.seq_len)
        keys = np.arange(k0, k1)
        keys = keys[vis[k0:k1]]
        tile_max = float(s[keys].max()) if len(keys) else -np.inf
        m_new = max(m_run, tile_max)
        alpha = float(np.exp(m_run - m_new)) if np.isfinite(m_run) else np.nan
        p = np.exp(s[keys] - m_new)
        pv = p @ v[keys]
        l_old, acc_old = l_run, acc
        l_run = (l_run * alpha if np.isfinite(m_run) else 0.0) + float(p.sum())
        acc = (acc * alpha if np.isfinite(m_run) else acc) + pv
        o = acc / l_run if l_run > 0 else np.zeros_like(acc)
        rows.append({"step": int(step), "k_tile": int(n), "keys": _rows(k0, k1),
                     "tile_max": tile_max, "m_old": m_run, "m": m_new, "alpha": alpha,
                     "l_old": l_old, "tile_sum": float(p.sum()), "l": l_run,
                     "acc1_old": float(acc_old[0]), "pv1": float(pv[0]), "acc1": float(acc[0]),
                     "err": float(np.abs(o - ex["o"]).max())})
        outs.append(o)
        accs.append(acc)
        pvs.append(pv)
        m_run = m_new
    return {"tiles": pd.DataFrame(rows, columns=["step", "k_tile", "keys", "tile_max", "m_old",
                                                 "m", "alpha", "l_old", "tile_sum", "l",
                                                 "acc1_old", "pv1", "acc1", "err"]),
            "acc": np.array(accs).reshape(len(accs), d),
            "pv": np.array(pvs).reshape(len(pvs), d),
            "o": np.array(outs).reshape(len(outs), d), "exact": ex}


def row_backward(walk: Walk, x: dict, row: int) -> dict:
    """One query row in the backward: at each tile of this row, P is recomputed from the
    forward's logsumexp L (exp(S − L), no running max) and dS·K is added to the row's dQ.

    Returns ``{"tiles": DataFrame (step, k_tile, keys, p_err (max |P recomputed − P of the
    forward|), dq_err (max |dQ so far − final dQ|)), "p": recomputed P of the visited keys
    (NaN elsewhere), "dq": [tiles, d] dQ of the row after each tile, "exact": _exact(...)}``.
    """
    ex = _exact(x, row, walk.causal)
    s, vis, k, scale = ex["s"], ex["visible"], x["k"], x["scale"]
    phase = "bwd.main" if "bwd.main" in set(walk.steps["phase"]) else None
    tiles = row_tiles(walk, row, phase) if walk.schedule != "naive" else pd.DataFrame(
        columns=["step", "k_tile"])
    # the logsumexp the forward saved: its online softmax over the row's tiles, m + log l
    m_run, l_run = -np.inf, 0.0
    for n in sorted(int(t) for t in tiles["k_tile"]):
        k0, k1 = (n - 1) * walk.block_k, min(n * walk.block_k, walk.seq_len)
        sv = s[k0:k1][vis[k0:k1]]
        if len(sv):
            m_new = max(m_run, float(sv.max()))
            l_run = l_run * float(np.exp(m_run - m_new)) + float(np.exp(sv - m_new).sum())
            m_run = m_new
    lse = m_run + np.log(l_run) if l_run > 0 else ex["lse"]
    dq = np.zeros(k.shape[1])
    p_rec = np.full(len(s), np.nan)
    rows, outs = [], []
    for step, n in zip(tiles["step"], tiles["k_tile"]):
        k0, k1 = (int(n) - 1) * walk.block_k, min(int(n) * walk.block_k, walk.seq_len)
        keys = np.arange(k0, k1)
        keys = keys[vis[k0:k1]]
        p = np.exp(s[keys] - lse)                      # recomputed from the logsumexp
        p_rec[keys] = p
        ds = p * (ex["dp"][keys] - ex["D"])
        dq = dq + scale * (ds @ k[keys])
        rows.append({"step": int(step), "k_tile": int(n), "keys": _rows(k0, k1),
                     "p_err": float(np.abs(p - ex["p"][keys]).max()) if len(keys) else 0.0,
                     "dq_err": float(np.abs(dq - ex["dq"]).max())})
        outs.append(dq.copy())
    return {"tiles": pd.DataFrame(rows, columns=["step", "k_tile", "keys", "p_err", "dq_err"]),
            "p": p_rec, "dq": np.array(outs).reshape(len(outs), k.shape[1]), "exact": ex,
            "lse": float(lse)}


def step_at_row(tiles: pd.DataFrame, step: int) -> int:
    """How many of a row's tiles (``row_forward``/``row_backward`` ``tiles``) are done at
    ``step`` (1-based; the tile computed at ``step`` counts as done)."""
    return int((tiles["step"] <= step).sum()) if len(tiles) else 0
