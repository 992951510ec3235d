"""The plan of context-parallel (ring) attention, as plain data: who holds which tokens, and what
each ring step computes.

A sequence of N tokens is split over P ranks; every rank keeps its shard of Q and sends its shard
of K/V around the ring, so at step t rank r holds the K/V shard of rank ``(r - t) mod P``
(:func:`kv_source`). This module owns the two questions every part of the ring asks:

* **Layouts** (:data:`LAYOUTS`, :func:`shard_positions`): which global token positions rank r
  holds, in shard order.

  - ``"contiguous"``: rank r holds chunk r of P equal chunks (positions ``[r n, (r + 1) n)``).
  - ``"zigzag"``: the sequence is cut into 2P chunks of ``c = N / 2P``; rank r holds chunks r
    and 2P - 1 - r, so every rank has as much causal work as every other.
  - ``"striped"``: rank r holds positions r, r + P, r + 2P, ... (every P-th token).

* **Pair blocks** (:func:`pair_blocks`): the attention calls of one (Q shard, K/V shard) pair, as
  :class:`PairBlock` rows and columns of the two local shards, each either full or causal
  (top-left causal between two slices of equal length). With a causal mask a pair is full,
  causal, split into a full sub-block, or skipped entirely: the skipped work is where a layout's
  load balance comes from. Together, a pair's blocks cover exactly the (query, key) entries the
  global mask allows, each once (tested against the positions).

Everything here is integer arithmetic on lengths: no arrays, no torch. ``ioaware.distributed``
runs the plan; ``sim.ring`` prices it.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LAYOUTS", "PairBlock", "check_layout", "check_world_size", "shard_length", "shard_positions",
           "kv_source", "pair_blocks"]

LAYOUTS = ("contiguous", "zigzag", "striped")
#: How many equal chunks of the sequence each rank holds under a layout (the sequence length must
#: be divisible by this times the world size). Striped shards are one strided run each.
_CHUNKS_PER_RANK = {"contiguous": 1, "zigzag": 2, "striped": 1}


@dataclass(frozen=True)
class PairBlock:
    """One attention call of a ring step: query rows ``[q_start, q_stop)`` of the local Q shard
    against key rows ``[k_start, k_stop)`` of the visiting K/V shard.

    ``causal``: query row ``q_start + i`` sees key row ``k_start + j`` iff ``j <= i`` (the two
    slices then have equal length); otherwise every pair of rows is allowed.
    """

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool

    @property
    def q_rows(self) -> slice:
        return slice(self.q_start, self.q_stop)

    @property
    def k_rows(self) -> slice:
        return slice(self.k_start, self.k_stop)

    @property
    def q_len(self) -> int:
        return self.q_stop - self.q_start

    @property
    def k_len(self) -> int:
        return self.k_stop - self.k_start


def check_layout(layout) -> str:
    """``layout`` if it is one of :data:`LAYOUTS`; else ValueError naming the argument."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    return layout


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    return world_size


def shard_length(seq_len: int, world_size: int, layout: str, name: str = "seq_len") -> int:
    """Tokens per rank for a sequence of ``seq_len`` tokens; ValueError (naming ``name``) when the
    layout cannot split it into equal shards."""
    check_layout(layout)
    check_world_size(world_size)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"{name} must be a positive integer, got {seq_len!r}")
    chunks = _CHUNKS_PER_RANK[layout] * world_size
    if seq_len % chunks:
        how = {"contiguous": f"P = {world_size} equal chunks",
               "zigzag": f"2P = {chunks} equal chunks (each rank holds chunks r and 2P-1-r)",
               "striped": f"P = {world_size} equal strided runs"}[layout]
        raise ValueError(f"{name} = {seq_len} cannot be split into {how}: layout={layout!r} needs it "
                         f"divisible by {chunks}")
    return seq_len // world_size


def shard_positions(layout: str, rank: int, world_size: int, seq_len: int) -> tuple[range, ...]:
    """The global token positions rank ``rank`` holds, in shard order, as ranges to concatenate."""
    n = shard_length(seq_len, world_size, layout)
    _check_rank("rank", rank, world_size)
    if layout == "contiguous":
        return (range(rank * n, (rank + 1) * n),)
    if layout == "zigzag":
        c = n // 2
        return (range(rank * c, (rank + 1) * c),
                range((2 * world_size - 1 - rank) * c, (2 * world_size - rank) * c))
    return (range(rank, seq_len, world_size),)


def kv_source(rank: int, step: int, world_size: int) -> int:
    """The rank whose K/V shard rank ``rank`` holds at ring step ``step`` (step 0: its own)."""
    return (rank - step) % world_size


def pair_blocks(layout: str, q_rank: int, kv_rank: int, world_size: int, shard_len: int,
                causal: bool) -> tuple[PairBlock, ...]:
    """The attention calls of rank ``q_rank``'s Q shard against rank ``kv_rank``'s K/V shard.

    Non-causal: the whole pair, full. Causal (position i sees position j iff j <= i), with
    ``n = shard_len``:

    * contiguous: ``kv_rank < q_rank`` full, ``==`` causal, ``>`` skipped;
    * zigzag (``c = n / 2``): ``==`` causal over the whole shard (its two chunks are in order);
      ``kv_rank < q_rank``: all Q rows against the first K chunk, full; ``>``: the second Q
      chunk against all K rows, full (half the work of a full pair either way);
    * striped: ``kv_rank <= q_rank`` causal (key j of the pair sees query i iff j <= i);
      ``>``: strictly below the diagonal (j < i), that is query rows ``[1, n)`` against key rows
      ``[0, n - 1)``, causal.
    """
    check_layout(layout)
    check_world_size(world_size)
    _check_rank("q_rank", q_rank, world_size)
    _check_rank("kv_rank", kv_rank, world_size)
    n = shard_len
    if n < 1 or (layout == "zigzag" and n % 2):
        raise ValueError(f"shard_len must be a positive{' even' if layout == 'zigzag' else ''} integer "
                         f"for layout={layout!r}, got {shard_len!r}")
    if not causal:
        return (PairBlock(0, n, 0, n, False),)
    if layout == "contiguous":
        if kv_rank < q_rank:
            return (PairBlock(0, n, 0, n, False),)
        return (PairBlock(0, n, 0, n, True),) if kv_rank == q_rank else ()
    if layout == "zigzag":
        c = n // 2
        if kv_rank == q_rank:
            return (PairBlock(0, n, 0, n, True),)
        if kv_rank < q_rank:
            return (PairBlock(0, n, 0, c, False),)
        return (PairBlock(c, n, 0, n, False),)
    if kv_rank <= q_rank:
        return (PairBlock(0, n, 0, n, True),)
    return (PairBlock(1, n, 0, n - 1, True),) if n > 1 else ()


def _check_rank(name, rank, world_size):
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{name} must be an integer in [0, {world_size}), got {rank!r}")
