"""The event trace: each schedule walked tile by tile, every global-memory load and store recorded.

:func:`trace` returns a :class:`Trace` — a sequence of :class:`Event` backed by numpy columns
(fast enough for the L2 model and the dashboard's step-by-step view). Which tiles are visited
comes from :class:`ioaware.block_info.BlockInfo` only. ``Trace.totals()`` aggregates to the same
``{(phase, tensor, op): bytes}`` / ``{phase: (matmul, other)}`` shape as
:func:`sim.counts.closed_form`; the tests hold them equal.

Program and step: a *program* is one thread block (e.g. FlashAttention-2 forward: one per
(b, h, Q block), numbered in launch order, Q block fastest); ``step`` is its position in the
program's own loop (step 0 = prologue loads, one step per visited tile, last step = epilogue
stores). Compute events (op "compute", bytes 0, level "sm") carry each step's FLOPs.

Addresses: every tensor is a contiguous row-major buffer ``[B, H_t, N_t, width]`` at its own
2 MiB-aligned base; an event touches ``[addr, addr + bytes)``. K/V (and the forward's inputs)
of query head h live at KV head ``h // (heads // heads_kv)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .counts import (delta_load_amplification, flop_costs, segment_amplification,
                     store_sector_amplification)
from .workload import SECTOR_BYTES, STAT_BYTES, Schedule, Workload, block_infos

__all__ = ["Event", "Trace", "trace", "OPS", "LEVELS"]

OPS = ("load", "store", "atomic", "compute")
LEVELS = ("hbm", "sm")
_ALIGN = 2 << 20


class Event(NamedTuple):
    """One trace event.

    index: position in the trace; phase: kernel ("fwd", "bwd.main", "fwd.softmax", ...);
    program: thread block id within the phase (launch order); step: position within the
    program; op: load/store/atomic/compute; tensor: Q, K, V, O, lse, m, l, dO, dQ, dQacc, D, dK,
    dV, S, P, ...; b, h: batch and query head; m, n: Q and K block indices (-1 if not a tile of
    that axis); row_start, row_stop: rows of the tensor touched (query rows for Q/O/stats, key
    rows for K/V/dK/dV); bytes; level: "hbm" (global memory) or "sm" (compute); addr: byte
    address; matmul_flops, other_flops: FLOPs of a compute event.
    """

    index: int
    phase: str
    program: int
    step: int
    op: str
    tensor: str
    b: int
    h: int
    m: int
    n: int
    row_start: int
    row_stop: int
    bytes: int
    level: str
    addr: int
    matmul_flops: int
    other_flops: int


_INT_COLS = ("phase", "program", "step", "op", "tensor", "b", "h", "m", "n", "row_start",
             "row_stop", "bytes", "addr", "matmul_flops", "other_flops", "footprint")
#: Each column's dtype: indices, counts of programs, steps and rows in int32, bytes, addresses
#: and FLOPs in int64 (a trace of millions of events is mostly these columns).
_COL_DTYPES = {k: np.int64 if k in ("bytes", "addr", "matmul_flops", "other_flops", "footprint")
               else np.int32 for k in _INT_COLS}


class Trace(Sequence):
    """Events as numpy columns (``columns[name]``: int32 indices, steps and rows, int64 bytes,
    addresses and FLOPs), string columns coded against ``phases`` / ``tensors`` / :data:`OPS`.
    Indexing gives :class:`Event`; ``len`` the event count.

    meta: schedule, block_q, block_k, program counts per phase, tensor base addresses and sizes.
    """

    def __init__(self, columns: dict, phases: list, tensors: list, meta: dict):
        self.columns = columns
        self.phases = phases
        self.tensors = tensors
        self.meta = meta

    def __len__(self) -> int:
        return len(self.columns["op"])

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        c = self.columns
        op = OPS[c["op"][i]]
        return Event(i, self.phases[c["phase"][i]], int(c["program"][i]), int(c["step"][i]), op,
                     self.tensors[c["tensor"][i]] if c["tensor"][i] >= 0 else "",
                     int(c["b"][i]), int(c["h"][i]), int(c["m"][i]), int(c["n"][i]),
                     int(c["row_start"][i]), int(c["row_stop"][i]), int(c["bytes"][i]),
                     "sm" if op == "compute" else "hbm", int(c["addr"][i]),
                     int(c["matmul_flops"][i]), int(c["other_flops"][i]))

    def to_records(self, start: int = 0, stop: int | None = None) -> list[dict]:
        """Events ``[start, stop)`` as dicts (e.g. for a DataFrame)."""
        stop = len(self) if stop is None else min(stop, len(self))
        return [self[i]._asdict() for i in range(start, stop)]

    def totals(self):
        """``({(phase, tensor, op): bytes}, {phase: (matmul_flops, other_flops)})``."""
        c = self.columns
        out_b: dict = {}
        mem = c["op"] != OPS.index("compute")
        keys = np.stack([c["phase"][mem], c["tensor"][mem], c["op"][mem]], 1)
        if len(keys):
            uniq, inv = np.unique(keys, axis=0, return_inverse=True)
            sums = np.bincount(inv.ravel(), weights=None, minlength=len(uniq)).astype(np.int64) * 0
            np.add.at(sums, inv.ravel(), c["bytes"][mem])
            for (p, t, o), v in zip(uniq, sums):
                out_b[(self.phases[p], self.tensors[t], OPS[o])] = int(v)
        out_f: dict = {}
        comp = ~mem
        for p in np.unique(c["phase"][comp]):
            sel = comp & (c["phase"] == p)
            out_f[self.phases[p]] = (int(c["matmul_flops"][sel].sum()), int(c["other_flops"][sel].sum()))
        return out_b, out_f


class _Builder:
    """Appends events to column lists; tensors get 2 MiB-aligned base addresses.

    Finished stretches of events are kept as chunks of numpy columns (:meth:`_flush`), so that
    :meth:`slices` can append a copy of an earlier slice's events for another (b, h) as arrays
    instead of walking its tiles again; :meth:`build` concatenates the chunks in order."""

    def __init__(self, w: Workload, replicate: bool = True):
        self.w = w
        self.replicate = replicate
        self.cols = {k: [] for k in _INT_COLS}
        self.chunks: list = []
        self.phases: list = []
        self.tensors: list = []
        self.tensor_shape: dict = {}
        self.base: dict = {}
        self.next_base = 0
        self.phase_id = -1
        self.n_programs: dict = {}

    def tensor(self, name, heads, rows, row_bytes, batch=None):
        if name not in self.base:
            batch = self.w.batch if batch is None else batch
            size = batch * heads * rows * row_bytes
            self.base[name] = self.next_base
            self.tensor_shape[name] = (batch, heads, rows, row_bytes)
            self.tensors.append(name)
            self.next_base += -(-size // _ALIGN) * _ALIGN + _ALIGN
        return self.tensors.index(name)

    def phase(self, name):
        self.phases.append(name)
        self.phase_id = len(self.phases) - 1
        self.n_programs[name] = 0

    def _addr(self, name, b, h, r0):
        bt, ht, rows, rb = self.tensor_shape[name]
        return self.base[name] + (((b if bt > 1 else 0) * ht + (h if ht > 1 else 0)) * rows + r0) * rb

    def mem(self, program, step, op, name, b, h, m, n, r0, r1, amp=1):
        """One access of rows [r0, r1); ``amp``: the request bytes are ``amp`` times the rows'
        bytes (accesses that fetch or write whole 32-byte sectors for fewer useful bytes), the
        footprint the L2 replay sees stays the rows'."""
        rb = self.tensor_shape[name][3]
        c = self.cols
        c["phase"].append(self.phase_id); c["program"].append(program); c["step"].append(step)
        c["op"].append(op); c["tensor"].append(self.tensors.index(name)); c["b"].append(b)
        c["h"].append(h); c["m"].append(m); c["n"].append(n); c["row_start"].append(r0)
        c["row_stop"].append(r1); c["bytes"].append((r1 - r0) * rb * amp)
        c["footprint"].append((r1 - r0) * rb)
        c["addr"].append(self._addr(name, b, h, r0))
        c["matmul_flops"].append(0); c["other_flops"].append(0)

    def compute(self, program, step, b, h, m, n, mm, other):
        c = self.cols
        c["phase"].append(self.phase_id); c["program"].append(program); c["step"].append(step)
        c["op"].append(3); c["tensor"].append(-1); c["b"].append(b); c["h"].append(h)
        c["m"].append(m); c["n"].append(n); c["row_start"].append(0); c["row_stop"].append(0)
        c["bytes"].append(0); c["addr"].append(0); c["matmul_flops"].append(mm); c["other_flops"].append(other)
        c["footprint"].append(0)

    def _flush(self) -> int:
        """Move the events appended since the last flush into a chunk; the number of chunks."""
        if self.cols["op"]:
            self.chunks.append({k: np.asarray(v, dtype=_COL_DTYPES[k]) for k, v in self.cols.items()})
            self.cols = {k: [] for k in _INT_COLS}
        return len(self.chunks)

    def slices(self, slice_bi: dict, walk) -> int:
        """Every (b, h) slice of the workload in order, b outer, programs numbered from 0:
        ``walk(prog, b, h, bi, key_len)`` records one slice's events for programs from ``prog``
        on and returns the next program. A slice whose (BlockInfo, key length) an earlier slice
        had visits the same tiles in the same steps, so its events are that slice's with the
        program ids, b, h and addresses moved to it (h: the query head, or its KV head on
        tensors with the KV heads' count, as the walks record them); a walk whose events do not
        follow that rule is run for every slice. Returns the number of programs."""
        w = self.w
        templates: dict = {}
        prog = 0
        for b in range(w.batch):
            for h in range(w.heads):
                bi, key_len = slice_bi[(b, h)]
                key = (id(bi), key_len)
                tpl = templates.get(key)
                if tpl:
                    self._flush()
                    if tpl["cols"] is not None:
                        self.chunks.append((tpl, prog, b, h))     # filled in by build
                    prog += tpl["n_programs"]
                    continue
                start = self._flush()
                nxt = walk(prog, b, h, bi, key_len)
                if self.replicate and tpl is None:
                    self._flush()
                    templates[key] = self._template(self.chunks[start:], prog, nxt, b, h)
                prog = nxt
        return prog

    def _template(self, chunks, prog0, prog1, b, h):
        """The events of one walked slice (programs ``prog0`` to ``prog1``) as a template for
        :meth:`_fill`, or False when they do not follow the slice rule of :meth:`slices` (then
        every slice is walked)."""
        if not chunks:
            return {"cols": None, "n_programs": prog1 - prog0}
        cols = {k: np.concatenate([c[k] for c in chunks]) for k in _INT_COLS}
        g = self.w.group
        kv_heads = self.w.heads_kv
        tensor = cols["tensor"]
        mem = tensor >= 0
        names = self.tensors
        shape = np.array([self.tensor_shape[t] for t in names], dtype=np.int64).reshape(-1, 4)
        base = np.array([self.base[t] for t in names], dtype=np.int64)
        t = np.where(mem, tensor, 0)
        bt, ht, rows, rb = (shape[t, i] for i in range(4))
        kv_rows = mem & (ht == kv_heads) & (kv_heads != self.w.heads)
        if (np.any(cols["b"] != b) or np.any(cols["h"] != np.where(kv_rows, h // g, h))
                or np.any(cols["program"] < prog0) or np.any(cols["program"] >= prog1)):
            return False
        tpl = {"cols": cols, "n_programs": prog1 - prog0, "prog0": prog0, "kv_rows": kv_rows,
               "mem": mem, "bt": bt, "ht": ht, "rows": rows, "rb": rb, "base": base[t]}
        moved = {k: np.empty_like(v) for k, v in cols.items()}
        self._fill(moved, 0, tpl, prog0, b, h)
        if np.any(moved["addr"] != cols["addr"]):
            return False
        return tpl

    def _fill(self, out: dict, at: int, tpl: dict, prog: int, b: int, h: int) -> int:
        """Write a template's events, moved to slice (b, h) and programs from ``prog``, into the
        columns ``out`` from row ``at``; the row after them."""
        cols = tpl["cols"]
        n = len(cols["op"])
        end = at + n
        for k in _INT_COLS:
            if k not in ("program", "b", "h", "addr"):
                out[k][at:end] = cols[k]
        np.add(cols["program"], prog - tpl["prog0"], out=out["program"][at:end])
        out["b"][at:end] = b
        hh = out["h"][at:end]
        hh[:] = np.where(tpl["kv_rows"], h // self.w.group, h)
        bb = np.where(tpl["bt"] > 1, b, 0)
        hi = np.where(tpl["ht"] > 1, hh, 0)
        addr = tpl["base"] + ((bb * tpl["ht"] + hi) * tpl["rows"] + cols["row_start"]) * tpl["rb"]
        out["addr"][at:end] = np.where(tpl["mem"], addr, 0)
        return end

    def build(self, meta) -> Trace:
        self._flush()
        total = sum(len(c["op"]) if isinstance(c, dict) else len(c[0]["cols"]["op"]) for c in self.chunks)
        cols = {k: np.empty(total, dtype=_COL_DTYPES[k]) for k in _INT_COLS}
        at = 0
        for c in self.chunks:
            if isinstance(c, dict):
                n = len(c["op"])
                for k in _INT_COLS:
                    cols[k][at:at + n] = c[k]
                at += n
            else:
                at = self._fill(cols, at, *c)
        meta = dict(meta, n_programs=self.n_programs, tensor_base=dict(self.base),
                    tensor_shape=dict(self.tensor_shape))
        return Trace(cols, self.phases, self.tensors, meta)


LOAD, STORE, ATOMIC = 0, 1, 2


def trace(workload: Workload, schedule: Schedule, profile=None, *, block_q=None, block_k=None,
          _replicate: bool = True) -> Trace:
    """Walk ``schedule`` over ``workload`` tile by tile and record every global-memory access.

    Block sizes: ``block_q``/``block_k`` arguments, else the schedule's, else the default on
    ``profile`` (:func:`sim.workload.resolve_blocks`; profile defaults to "h100").
    """
    from .workload import resolve_blocks
    if isinstance(schedule, str):
        schedule = Schedule(schedule)
    if schedule.name != "naive" and (block_q is None or block_k is None):
        from .profiles import load_profile
        bq, bk = resolve_blocks(workload, schedule, load_profile(profile or "h100"))
        block_q, block_k = block_q or bq, block_k or bk
    w = workload
    tb = _Builder(w, _replicate)
    d, e, f = w.head_dim, w.dtype_bytes, STAT_BYTES
    Nq, Nk, B, H, Hkv, g = w.seq_len_q, w.seq_len_k, w.batch, w.heads, w.heads_kv, w.group
    gqa = H != Hkv
    # tensors
    for name in ("Q", "O", "dO", "dQ"):
        tb.tensor(name, H, Nq, d * e)
    for name in ("K", "V", "dK", "dV"):
        tb.tensor(name, Hkv, Nk, d * e)
    for name in ("lse", "l", "m", "D"):
        tb.tensor(name, H, Nq, f)
    tb.tensor("dQacc", H, Nq, d * f)
    tb.tensor("dK_exp", H, Nk, d * e)
    tb.tensor("dV_exp", H, Nk, d * e)
    kvh = lambda h: h // g  # noqa: E731
    meta = {"schedule": schedule.to_dict(), "block_q": block_q, "block_k": block_k,
            "workload": w.to_dict()}
    C = flop_costs(schedule.exp_flops)
    drop = C["dropout_per_score"] if w.dropout else 0
    simt = schedule.simt
    ntn = schedule.threads_per_row(block_k) if simt else 1
    mask_cost = 0 if simt else C["mask_per_score"]
    o_amp = store_sector_amplification(ntn, e) if schedule.micro_tile is not None else 1
    q_amp = segment_amplification(schedule.qo_segment_bytes)
    o_amp = max(o_amp, q_amp)
    kv_amp = (store_sector_amplification(schedule.kv_threads_per_row(block_q), e)
              if schedule.micro_tile_kv is not None else 1)
    if schedule.name == "naive" and schedule.variant is not None:
        _naive_variant(tb, w, schedule)
        return tb.build(meta)
    if schedule.name == "naive":
        _naive(tb, w, schedule, kvh, gqa)
        return tb.build(meta)

    groups = block_infos(w, block_q, block_k)
    slice_bi = {}
    for _mult, bi, key_len, members in groups:
        for bh in members:
            slice_bi[bh] = (bi, key_len)

    def needs_mask(bi, key_len, m, n):
        return bi.tile_needs_mask(m, n) or (key_len is not None and bi.k_range(n)[1] > key_len)

    def kv_mem(prog, step, op, name, b, h, n, bi):
        k0, k1 = bi.k_range(n)
        tb.mem(prog, step, op, name, b, kvh(h) if name in ("K", "V", "dK", "dV") else h, -1, n, k0, k1)

    def q_mem(prog, step, op, name, b, h, m, bi, amp=1):
        q0, q1 = bi.q_range(m)
        tb.mem(prog, step, op, name, b, h, m, -1, q0, q1, amp)

    # Q-block visitors of each K block, in Q-block order (BlockInfo.q_blocks, computed once per group)
    q_lists = {}
    for _mult, bi, _kl, _mem in groups:
        q_lists[id(bi)] = [bi.q_blocks(n) for n in range(bi.n_blocks_k)]

    for p in w.passes:
        if schedule.name == "flash2" and p == "fwd":
            tb.phase("fwd")

            def walk(prog, b, h, bi, key_len):
                for m in range(bi.n_blocks_q):
                    q0, q1 = bi.q_range(m)
                    r = q1 - q0
                    # -- load Q_m (CUDA-core kernels: scaled by the softmax scale on load) --
                    q_mem(prog, 0, LOAD, "Q", b, h, m, bi, q_amp)
                    if simt:
                        tb.compute(prog, 0, b, h, m, -1, 0, r * d)
                    step = 1
                    for n in bi.k_blocks(m):
                        k0, k1 = bi.k_range(n)
                        c = k1 - k0
                        # -- load K_n, V_n; compute qk, online softmax, acc += p v --
                        kv_mem(prog, step, LOAD, "K", b, h, n, bi)
                        kv_mem(prog, step, LOAD, "V", b, h, n, bi)
                        if simt:   # each of the row's ntn threads keeps its own m, l, alpha
                            other = ((C["simt_fwd_per_score"] + drop) * r * c
                                     + r * (d + ntn * C["simt_fwd_per_row_thread_tile"]))
                        else:
                            other = ((C["fwd_per_score"] + drop) * r * c + r * (d + C["fwd_per_row_tile"])
                                     + (C["mask_per_score"] * r * c if needs_mask(bi, key_len, m, n) else 0))
                        tb.compute(prog, step, b, h, m, n, 4 * d * r * c, other)
                        step += 1
                    # -- epilogue: O = acc / l, lse = m + log l --
                    if simt:   # row sum by shuffles, then 1/l and log l on every thread of the row
                        end = ntn * (ntn.bit_length() - 1 + C["simt_fwd_per_row_thread_end"]) + d
                        tb.compute(prog, step, b, h, m, -1, 0, r * end)
                    else:
                        tb.compute(prog, step, b, h, m, -1, 0, r * (d + 2))
                    q_mem(prog, step, STORE, "O", b, h, m, bi, o_amp)
                    q_mem(prog, step, STORE, "lse", b, h, m, bi)
                    prog += 1
                return prog

            tb.n_programs["fwd"] = tb.slices(slice_bi, walk)
        elif schedule.name == "flash1" and p == "fwd":
            tb.phase("fwd")

            def walk(prog, b, h, bi, key_len):
                # -- initialise O = 0, l = 0, m = -inf in HBM --
                for t in ("O", "l", "m"):
                    tb.mem(prog, 0, STORE, t, b, h, -1, -1, 0, Nq)
                step = 1
                for n, qs in enumerate(q_lists[id(bi)]):
                    if not qs:
                        continue
                    k0, k1 = bi.k_range(n)
                    c = k1 - k0
                    kv_mem(prog, step, LOAD, "K", b, h, n, bi)
                    kv_mem(prog, step, LOAD, "V", b, h, n, bi)
                    for m in qs:
                        q0, q1 = bi.q_range(m)
                        r = q1 - q0
                        for t in ("Q", "O", "l", "m"):
                            q_mem(prog, step, LOAD, t, b, h, m, bi)
                        other = ((C["fwd_per_score"] + drop) * r * c
                                 + r * (2 * d + C["flash1_fwd_per_row_tile"])
                                 + (C["mask_per_score"] * r * c if needs_mask(bi, key_len, m, n) else 0))
                        tb.compute(prog, step, b, h, m, n, 4 * d * r * c, other)
                        for t in ("O", "l", "m"):
                            q_mem(prog, step, STORE, t, b, h, m, bi)
                        step += 1
                return prog + 1

            tb.n_programs["fwd"] = tb.slices(slice_bi, walk)
        elif schedule.name == "flash1" and p == "bwd":
            tb.phase("bwd.main")
            dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")

            def walk(prog, b, h, bi, key_len):
                tb.mem(prog, 0, STORE, "dQ", b, h, -1, -1, 0, Nq)  # dQ = 0 in HBM
                step = 1
                for n, qs in enumerate(q_lists[id(bi)]):
                    k0, k1 = bi.k_range(n)
                    c = k1 - k0
                    if qs:
                        kv_mem(prog, step, LOAD, "K", b, h, n, bi)
                        kv_mem(prog, step, LOAD, "V", b, h, n, bi)
                    for m in qs:
                        q0, q1 = bi.q_range(m)
                        r = q1 - q0
                        for t in ("Q", "O", "dO", "dQ", "l", "m"):
                            q_mem(prog, step, LOAD, t, b, h, m, bi)
                        other = ((C["bwd_per_score"] + drop) * r * c + r * 3 * d
                                 + (C["mask_per_score"] * r * c if needs_mask(bi, key_len, m, n) else 0))
                        tb.compute(prog, step, b, h, m, n, 10 * d * r * c, other)
                        q_mem(prog, step, STORE, "dQ", b, h, m, bi)
                        step += 1
                    # -- write dK_j, dV_j (zeros if no Q block visits) --
                    tb.mem(prog, step, STORE, dk, b, h if gqa else kvh(h), -1, n, k0, k1)
                    tb.mem(prog, step, STORE, dv, b, h if gqa else kvh(h), -1, n, k0, k1)
                    step += 1
                return prog + 1

            tb.n_programs["bwd.main"] = tb.slices(slice_bi, walk)
        elif schedule.name == "flash2" and p == "bwd":
            dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")
            atomic = schedule.dq_mode == "atomic"
            post = atomic and e != f          # float32: the accumulator is dQ, no post pass
            acc = "dQacc" if post else "dQ"
            # -- preprocessing: D = rowsum(dO * O) (atomic: and the dQ accumulator = 0) --
            # (one thread per row: each element read fetches its own sector; the repeated
            # requests hit the lines the first one brought in)
            amp = delta_load_amplification(schedule.delta_kernel, d, e)
            warp_red = C["simt_delta_warp_per_row"] if (simt and schedule.delta_kernel == "warp") else 0
            d_amp = SECTOR_BYTES // f if (simt and schedule.delta_kernel == "warp") else 1
            tb.phase("bwd.pre")

            def walk(prog, b, h, bi, _key_len):
                for m in range(bi.n_blocks_q):
                    q0, q1 = bi.q_range(m)
                    q_mem(prog, 0, LOAD, "O", b, h, m, bi, amp)
                    q_mem(prog, 0, LOAD, "dO", b, h, m, bi, amp)
                    tb.compute(prog, 0, b, h, m, -1, 0, (2 * d + warp_red) * (q1 - q0))
                    q_mem(prog, 0, STORE, "D", b, h, m, bi, d_amp)
                    if atomic:
                        q_mem(prog, 0, STORE, acc, b, h, m, bi)
                    prog += 1
                return prog

            tb.n_programs["bwd.pre"] = tb.slices(slice_bi, walk)
            # -- main loop: one program per K/V block, Q blocks streamed (atomic: dQ by fp32 atomics) --
            tb.phase("bwd.main")
            mm_main = 10 if atomic else 8

            def walk(prog, b, h, bi, key_len):
                for n, qs in enumerate(q_lists[id(bi)]):
                    k0, k1 = bi.k_range(n)
                    c = k1 - k0
                    step = 0
                    if qs:
                        kv_mem(prog, 0, LOAD, "K", b, h, n, bi)
                        kv_mem(prog, 0, LOAD, "V", b, h, n, bi)
                        step = 1
                    for m in qs:
                        q0, q1 = bi.q_range(m)
                        r = q1 - q0
                        for t in ("Q", "dO", "lse", "D"):
                            q_mem(prog, step, LOAD, t, b, h, m, bi)
                        other = ((C["bwd_per_score"] + drop) * r * c + (r * d if atomic else 0)
                                 + (mask_cost * r * c if needs_mask(bi, key_len, m, n) else 0))
                        tb.compute(prog, step, b, h, m, n, mm_main * d * r * c, other)
                        if atomic:
                            q_mem(prog, step, ATOMIC, acc, b, h, m, bi)
                        step += 1
                    if simt:   # dK *= softmax scale as it is written
                        tb.compute(prog, step, b, h, -1, n, 0, c * d)
                    tb.mem(prog, step, STORE, dk, b, h if gqa else kvh(h), -1, n, k0, k1, kv_amp)
                    tb.mem(prog, step, STORE, dv, b, h if gqa else kvh(h), -1, n, k0, k1, kv_amp)
                    prog += 1
                return prog

            tb.n_programs["bwd.main"] = tb.slices(slice_bi, walk)
            if not atomic:
                # -- dQ kernel: one program per Q block, K/V blocks streamed; S, dP recomputed --
                tb.phase("bwd.dq")

                def walk(prog, b, h, bi, key_len):
                    for m in range(bi.n_blocks_q):
                        q0, q1 = bi.q_range(m)
                        r = q1 - q0
                        for t in ("Q", "dO", "lse", "D"):
                            q_mem(prog, 0, LOAD, t, b, h, m, bi)
                        step = 1
                        for n in bi.k_blocks(m):
                            k0, k1 = bi.k_range(n)
                            c = k1 - k0
                            kv_mem(prog, step, LOAD, "K", b, h, n, bi)
                            kv_mem(prog, step, LOAD, "V", b, h, n, bi)
                            other = ((C["bwd_per_score"] + drop) * r * c
                                     + (mask_cost * r * c if needs_mask(bi, key_len, m, n) else 0))
                            tb.compute(prog, step, b, h, m, n, 6 * d * r * c, other)
                            step += 1
                        # -- epilogue: dQ *= scale, store --
                        tb.compute(prog, step, b, h, m, -1, 0, r * d)
                        q_mem(prog, step, STORE, "dQ", b, h, m, bi, o_amp)
                        prog += 1
                    return prog

                tb.n_programs["bwd.dq"] = tb.slices(slice_bi, walk)
            if post:
                # -- convert dQacc (fp32) to dQ --
                tb.phase("bwd.post")

                def walk(prog, b, h, bi, _key_len):
                    for m in range(bi.n_blocks_q):
                        q_mem(prog, 0, LOAD, "dQacc", b, h, m, bi)
                        tb.compute(prog, 0, b, h, m, -1, 0, 0)
                        q_mem(prog, 0, STORE, "dQ", b, h, m, bi)
                        prog += 1
                    return prog

                tb.n_programs["bwd.post"] = tb.slices(slice_bi, walk)
        if p == "bwd" and gqa:
            _reduce(tb, w)
    tr = tb.build(meta)
    if schedule.name == "flash2" and schedule.launch_head_group is not None:
        _launch_order(tr, B * H, schedule.launch_head_group)
    return tr


#: flash2 phases whose programs the tensor-core kernels launch in `ioaware.launch_order`'s
#: order, and whether a head's tiles go longest first (reversed Q-block order).
_ORDERED_PHASES = {"fwd": True, "bwd.dq": True, "bwd.main": False}


def _launch_order(tr: Trace, n_bh: int, group: int) -> None:
    """Renumber the programs of `_ORDERED_PHASES` in the kernels' dispatch order under head
    group ``group``: programs are numbered (b, h, tile) there, one per tile of every (b, h)."""
    from ioaware.launch_order import dispatch_positions
    c = tr.columns
    for pid, name in enumerate(tr.phases):
        if name not in _ORDERED_PHASES:
            continue
        n_prog = tr.meta["n_programs"][name]
        if n_prog % n_bh:
            raise ValueError(f"phase {name}: {n_prog} programs for {n_bh} heads")
        n_tiles = n_prog // n_bh
        pos = dispatch_positions(n_tiles, n_bh, group)          # [bh, kernel tile]
        if _ORDERED_PHASES[name]:
            pos = pos[:, ::-1]                                  # trace tile j = kernel tile n-1-j
        sel = c["phase"] == pid
        c["program"][sel] = pos.reshape(-1)[c["program"][sel]]


def _reduce(tb: _Builder, w: Workload):
    """GQA: sum per-query-head dK/dV over each group; one program per (b, kv head)."""
    tb.phase("bwd.reduce")
    prog = 0
    Nk, d = w.seq_len_k, w.head_dim
    for b in range(w.batch):
        for hk in range(w.heads_kv):
            for h in range(hk * w.group, (hk + 1) * w.group):
                tb.mem(prog, 0, LOAD, "dK_exp", b, h, -1, -1, 0, Nk)
                tb.mem(prog, 0, LOAD, "dV_exp", b, h, -1, -1, 0, Nk)
            tb.compute(prog, 0, b, hk, -1, -1, 0, 2 * w.group * Nk * d)
            tb.mem(prog, 0, STORE, "dK", b, hk, -1, -1, 0, Nk)
            tb.mem(prog, 0, STORE, "dV", b, hk, -1, -1, 0, Nk)
            prog += 1
    tb.n_programs["bwd.reduce"] = prog


def _naive(tb: _Builder, w: Workload, schedule: Schedule, kvh, gqa):
    """Algorithm 0 as unfused PyTorch runs it: one kernel per pass, each reading and writing whole
    (Nq x Nk) matrices; one program per (b, h) per kernel (a coarse unit: library GEMMs and
    elementwise kernels tile internally, but each element crosses global memory once)."""
    C = flop_costs(schedule.exp_flops)
    Nq, Nk, d, e = w.seq_len_q, w.seq_len_k, w.head_dim, w.dtype_bytes
    for name in ("S", "P", "Pd", "dP", "dS"):
        tb.tensor(name, w.heads, Nq, Nk * e)
    tb.tensor("drop_mask", w.heads, Nq, Nk)
    tb.tensor("mask", 1, Nq, Nk, batch=w.batch if w.key_lengths is not None else 1)
    SS = Nq * Nk
    masked, fused, dropout = w.masked, schedule.fused_softmax, w.dropout
    mflag = 1 if masked else 0
    kv = ("K", "V", "dK", "dV")

    def kernel(phase, loads, stores, mm, other):
        tb.phase(phase)
        prog = 0
        for b in range(w.batch):
            for h in range(w.heads):
                for t in loads:
                    rows = Nk if t in kv or t.endswith("_exp") else Nq
                    tb.mem(prog, 0, LOAD, t, b, kvh(h) if t in kv else h, -1, -1, 0, rows)
                tb.compute(prog, 0, b, h, -1, -1, mm, other)
                for t in stores:
                    rows = Nk if t in kv or t.endswith("_exp") else Nq
                    tb.mem(prog, 0, STORE, t, b, kvh(h) if t in kv else h, -1, -1, 0, rows)
                prog += 1
        tb.n_programs[phase] = prog

    mask = ["mask"] if masked else []
    dk, dv = ("dK_exp", "dV_exp") if gqa else ("dK", "dV")
    for p in w.passes:
        if p == "fwd":
            kernel("fwd.qk", ["Q", "K"], ["S"], 2 * d * SS, 0)
            if not fused:
                kernel("fwd.scale_mask", ["S"] + mask, ["S"], 0,
                       (C["naive_scale_per_score"] + mflag * C["mask_per_score"]) * SS)
                kernel("fwd.softmax", ["S"], ["P"], 0, C["naive_softmax_per_score"] * SS)
            else:
                kernel("fwd.softmax", ["S"] + mask, ["P"], 0,
                       (C["naive_softmax_per_score"] + C["naive_scale_per_score"]
                        + mflag * C["mask_per_score"]) * SS)
            pname = "P"
            if dropout:
                kernel("fwd.dropout", ["P"], ["Pd", "drop_mask"], 0, C["dropout_per_score"] * SS)
                pname = "Pd"
            kernel("fwd.pv", [pname, "V"], ["O"], 2 * d * SS, 0)
        else:
            pname = "Pd" if dropout else "P"
            kernel("bwd.dv", [pname, "dO"], [dv], 2 * d * SS, 0)
            kernel("bwd.dp", ["dO", "V"], ["dP"], 2 * d * SS, 0)
            if dropout:
                kernel("bwd.dropout", ["dP", "drop_mask"], ["dP"], 0, C["dropout_per_score"] * SS)
            if not fused:
                kernel("bwd.softmax", ["P", "dP"], ["dS"], 0, C["naive_softmax_bwd_per_score"] * SS)
                kernel("bwd.scale_mask", ["dS"] + mask, ["dS"], 0,
                       (C["naive_scale_per_score"] + mflag * C["mask_per_score"]) * SS)
            else:
                kernel("bwd.softmax", ["P", "dP"] + mask, ["dS"], 0,
                       (C["naive_softmax_bwd_per_score"] + C["naive_scale_per_score"]
                        + mflag * C["mask_per_score"]) * SS)
            kernel("bwd.dq", ["dS", "K"], ["dQ"], 2 * d * SS, 0)
            kernel("bwd.dk", ["dS", "Q"], [dk], 2 * d * SS, 0)
            if gqa:
                _reduce(tb, w)


def _naive_variant(tb: _Builder, w: Workload, schedule: Schedule):
    """PyTorch's kernel sequence for a naive variant (:func:`sim.counts.naive_variant_kernels`):
    one program per (b, h) per kernel, one for a kernel shared by the whole workload."""
    from .counts import check_naive_variant, naive_variant_kernels
    check_naive_variant(w, schedule.variant)
    Nq, Nk, d = w.seq_len_q, w.seq_len_k, w.head_dim
    rows_of = {"q": Nq, "k": Nk, "s": Nq, "r": Nq}
    row_elems = {"q": d, "k": d, "s": Nk, "r": 1}
    for p in w.passes:
        for phase, loads, stores, mm, other, shared in naive_variant_kernels(
                schedule.variant, p, Nq, Nk, d, w.dtype_bytes, causal=w.causal,
                exp_flops=schedule.exp_flops):
            tb.phase(phase)
            for t, kind, width in loads + stores:
                tb.tensor(t, 1 if shared or t in ("mask", "mask_f") else w.heads, rows_of[kind],
                          row_elems[kind] * width, batch=1 if t in ("mask", "mask_f") else None)
            prog = 0
            for b, h in ([(0, 0)] if shared else [(b, h) for b in range(w.batch) for h in range(w.heads)]):
                for t, kind, _w in loads:
                    tb.mem(prog, 0, LOAD, t, b, h, -1, -1, 0, rows_of[kind])
                tb.compute(prog, 0, b, h, -1, -1, mm, other)
                for t, kind, _w in stores:
                    tb.mem(prog, 0, STORE, t, b, h, -1, -1, 0, rows_of[kind])
                prog += 1
            tb.n_programs[phase] = prog
