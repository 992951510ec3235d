"""Which tiles a tiled attention visits: the single answer to "which K/V blocks does Q block m see".

`BlockInfo` is used by the NumPy tiled path (`ioaware.tiled`), by the Numba kernels
(`kernels`, through `BlockInfo.kv_schedule()` / `BlockInfo.q_schedule()`) and by the cost model's
trace (`sim`), so that what the model counts is exactly what runs.

Conventions
-----------
* Q block ``m`` covers query rows ``[m * block_q, min((m + 1) * block_q, seqlen_q))``;
  K block ``n`` covers key columns ``[n * block_k, min((n + 1) * block_k, seqlen_k))``.
  The last block of each may be partial.
* ``causal`` masks by position, with one of two alignments (they coincide when
  ``seqlen_q == seqlen_k``):

  - ``"top_left"`` (the default), as PyTorch's ``scaled_dot_product_attention(is_causal=True)``
    and ``torch.nn.attention.bias.causal_upper_left``: query row ``i`` may attend to key column
    ``j`` iff ``j <= i``;
  - ``"bottom_right"``, FlashAttention-2's convention for ``seqlen_q != seqlen_k`` and
    ``torch.nn.attention.bias.causal_lower_right``: ``j <= i + seqlen_k - seqlen_q``, so the
    last query row sees every key (the queries are the last ``seqlen_q`` positions of the
    sequence, as when decoding with a KV cache). With ``seqlen_q > seqlen_k`` the first
    ``seqlen_q - seqlen_k`` rows see no key at all.
* ``window_size = (left, right)`` (optional) is FlashAttention-2's sliding (local) window,
  always bottom-right aligned: with ``off = seqlen_k - seqlen_q``, row ``i`` may attend to
  column ``j`` iff ``i + off - left <= j <= i + off + right``; ``-1`` leaves that side unbounded
  and ``(-1, -1)`` (or None) is no window. Causal masking adds ``j <= i + causal offset``; with a
  window the causal alignment must be the window's (``"bottom_right"``, or either when
  ``seqlen_q == seqlen_k``), so causal with a window is the band ``[i + off - left, i + off]``.
  A row whose band holds no key sees nothing (its output is 0, its logsumexp ``-inf``).
* Causal and window together are the *band*: row ``i`` sees ``j`` iff ``j >= i + lo`` and
  ``j <= i + hi`` (:attr:`BlockInfo.band`, either bound possibly absent). K/V tiles wholly
  outside the band are skipped; tiles the band cuts are masked per element
  (:meth:`BlockInfo.tile_needs_mask`, :meth:`BlockInfo.tile_position_mask`).
* ``block_mask[m][n]`` (optional) says whether tile ``(m, n)`` is computed at all
  (FlashAttention's block-sparse attention). A skipped tile is never loaded.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["BlockInfo", "CAUSAL_ALIGNMENTS", "cdiv", "check_window_size", "band_offsets"]

CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def check_window_size(window_size, name: str = "window_size") -> tuple[int, int] | None:
    """``window_size`` as ``(left, right)``, or None for no window (None or ``(-1, -1)``).

    It must be a pair (tuple or list) of integers, each ``>= -1`` (``-1``: that side
    unbounded); anything else raises ``TypeError`` / ``ValueError`` naming ``name``.
    """
    if window_size is None:
        return None
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"{name} must be None or a pair (left, right) of integers >= -1, got "
                        f"{window_size!r}")
    for side, value in zip(("left", "right"), window_size):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be a pair (left, right) of integers >= -1; its {side} "
                            f"entry is {value!r} ({type(value).__name__})")
        if value < -1:
            raise ValueError(f"{name} must be a pair (left, right) of integers >= -1 (-1: "
                             f"unbounded on that side); its {side} entry is {int(value)}")
    left, right = int(window_size[0]), int(window_size[1])
    return None if (left, right) == (-1, -1) else (left, right)


def band_offsets(seqlen_q: int, seqlen_k: int, causal: bool, causal_alignment: str,
                 window_size: tuple[int, int] | None) -> tuple[int | None, int | None]:
    """``(lo, hi)``: row ``i`` may attend to column ``j`` iff ``j >= i + lo`` (when ``lo`` is
    not None) and ``j <= i + hi`` (when ``hi`` is not None): the causal rule and the window
    (bottom-right aligned, ``off = seqlen_k - seqlen_q``) in one band. ``window_size`` is
    already checked (:func:`check_window_size`)."""
    off = seqlen_k - seqlen_q
    lo = hi = None
    if causal:
        hi = off if causal_alignment == "bottom_right" else 0
    if window_size is not None:
        left, right = window_size
        if left >= 0:
            lo = off - left
        if right >= 0:
            hi = off + right if hi is None else min(hi, off + right)
    return lo, hi


@dataclass(frozen=True)
class BlockInfo:
    """The tile iteration space of one attention problem (one batch-head slice).

    Parameters
    ----------
    seqlen_q, seqlen_k : number of query rows and key columns (>= 1).
    block_q, block_k : tile sizes in rows / columns (>= 1).
    causal : causal masking, aligned as ``causal_alignment`` says.
    block_mask : optional tuple of tuples of bool, shape ``[n_blocks_q][n_blocks_k]``;
        ``False`` tiles are skipped. Build it from an array with :meth:`with_block_mask`.
    causal_alignment : ``"top_left"`` (default; ``j <= i``) or ``"bottom_right"``
        (``j <= i + seqlen_k - seqlen_q``); ignored unless ``causal``.
    window_size : optional sliding window ``(left, right)`` (see the module docstring; -1 =
        unbounded side, ``(-1, -1)`` is stored as None). With ``causal`` and
        ``seqlen_q != seqlen_k`` it needs ``causal_alignment="bottom_right"`` (the window's own
        alignment): a top-left causal rule with a bottom-right window is refused.
    """

    seqlen_q: int
    seqlen_k: int
    block_q: int
    block_k: int
    causal: bool = False
    block_mask: tuple[tuple[bool, ...], ...] | None = None
    causal_alignment: str = "top_left"
    window_size: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("seqlen_q", "seqlen_k", "block_q", "block_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"BlockInfo.{name} must be a positive integer, got {value!r}")
        if self.causal_alignment not in CAUSAL_ALIGNMENTS:
            raise ValueError(f"BlockInfo.causal_alignment must be one of {CAUSAL_ALIGNMENTS}, "
                             f"got {self.causal_alignment!r}")
        object.__setattr__(self, "window_size",
                           check_window_size(self.window_size, "BlockInfo.window_size"))
        if (self.window_size is not None and self.causal and self.causal_alignment == "top_left"
                and self.seqlen_q != self.seqlen_k):
            raise ValueError(
                f"BlockInfo.window_size={self.window_size} with top-left causal alignment and "
                f"seqlen_q={self.seqlen_q} != seqlen_k={self.seqlen_k} would mix two alignments (the "
                f"window is bottom-right aligned); use causal_alignment='bottom_right'")
        if self.block_mask is not None:
            shape = (len(self.block_mask), len(self.block_mask[0]) if self.block_mask else 0)
            if shape != (self.n_blocks_q, self.n_blocks_k) or any(
                len(row) != self.n_blocks_k for row in self.block_mask
            ):
                raise ValueError(
                    f"block_mask must have shape (n_blocks_q, n_blocks_k) = "
                    f"({self.n_blocks_q}, {self.n_blocks_k}), got {shape}"
                )

    @classmethod
    def with_block_mask(cls, seqlen_q: int, seqlen_k: int, block_q: int, block_k: int,
                        causal: bool = False, block_mask=None,
                        causal_alignment: str = "top_left",
                        window_size: tuple[int, int] | None = None) -> "BlockInfo":
        """Build a BlockInfo from a 2-D boolean array-like block mask (or None)."""
        rows = None
        if block_mask is not None:
            arr = np.asarray(block_mask, dtype=bool)
            if arr.ndim != 2:
                raise ValueError(f"block_mask must be 2-D (n_blocks_q, n_blocks_k), got shape {arr.shape}")
            rows = tuple(tuple(bool(x) for x in row) for row in arr)
        return cls(int(seqlen_q), int(seqlen_k), int(block_q), int(block_k), bool(causal), rows,
                   causal_alignment, window_size)

    # -- sizes ---------------------------------------------------------------------------------
    @property
    def n_blocks_q(self) -> int:
        return cdiv(self.seqlen_q, self.block_q)

    @property
    def n_blocks_k(self) -> int:
        return cdiv(self.seqlen_k, self.block_k)

    def q_range(self, m: int) -> tuple[int, int]:
        """Query rows ``[start, stop)`` of Q block ``m``."""
        return m * self.block_q, min((m + 1) * self.block_q, self.seqlen_q)

    def k_range(self, n: int) -> tuple[int, int]:
        """Key columns ``[start, stop)`` of K block ``n``."""
        return n * self.block_k, min((n + 1) * self.block_k, self.seqlen_k)

    # -- which tiles are visited ----------------------------------------------------------------
    @property
    def causal_offset(self) -> int:
        """``c`` in the causal rule "row ``i`` sees column ``j`` iff ``j <= i + c``": 0 top-left,
        ``seqlen_k - seqlen_q`` bottom-right."""
        return self.seqlen_k - self.seqlen_q if self.causal_alignment == "bottom_right" else 0

    @property
    def window_offset(self) -> int:
        """``off = seqlen_k - seqlen_q``: the window's (bottom-right) alignment."""
        return self.seqlen_k - self.seqlen_q

    @cached_property
    def band(self) -> tuple[int | None, int | None]:
        """``(lo, hi)``: row ``i`` may attend to column ``j`` iff ``j >= i + lo`` and
        ``j <= i + hi`` (a None bound is absent): the causal rule and the window together
        (:func:`band_offsets`). ``(None, None)`` without either."""
        return band_offsets(self.seqlen_q, self.seqlen_k, self.causal, self.causal_alignment,
                            self.window_size)

    def k_block_range(self, m: int) -> tuple[int, int]:
        """K blocks ``[lo, hi)`` that Q block ``m`` may see before block-sparse filtering.

        The band's columns of the block's rows ``r0 .. r1 - 1`` are the contiguous
        ``[r0 + lo, r1 - 1 + hi]`` (each row's interval is one column right of the previous
        one's), clipped to the keys: every K block that meets it holds an allowed entry, the
        others are skipped entirely (all of them when the block's rows see no column).
        """
        r0, r1 = self.q_range(m)
        lo, hi = self.band
        first_col = 0 if lo is None else max(0, r0 + lo)
        last_col = self.seqlen_k - 1 if hi is None else min(self.seqlen_k - 1, r1 - 1 + hi)
        if last_col < first_col:
            return 0, 0
        return first_col // self.block_k, last_col // self.block_k + 1

    def k_blocks(self, m: int) -> tuple[int, ...]:
        """K blocks visited by Q block ``m``, in the order they are streamed."""
        lo, hi = self.k_block_range(m)
        if self.block_mask is None:
            return tuple(range(lo, hi))
        row = self.block_mask[m]
        return tuple(n for n in range(lo, hi) if row[n])

    def q_blocks(self, n: int) -> tuple[int, ...]:
        """Q blocks that visit K block ``n`` (the backward's inner loop, K/V outer)."""
        return tuple(m for m in range(self.n_blocks_q) if n in self._visit_sets[m])

    @cached_property
    def _visit_sets(self) -> tuple[frozenset, ...]:
        return tuple(frozenset(self.k_blocks(m)) for m in range(self.n_blocks_q))

    def tile_needs_mask(self, m: int, n: int) -> bool:
        """Whether tile ``(m, n)`` needs an elementwise positional mask: the band's upper edge
        (the causal diagonal, or the window's right edge) or its lower edge (the window's left
        edge) crosses it."""
        lo, hi = self.band
        r0, r1 = self.q_range(m)
        c0, c1 = self.k_range(n)
        return (hi is not None and c1 - 1 > r0 + hi) or (lo is not None and c0 < r1 - 1 + lo)

    def tile_position_mask(self, m: int, n: int) -> np.ndarray | None:
        """The elementwise positional mask (causal and window) of tile ``(m, n)``: bool
        ``[rows, cols]``, True = may attend; None when the tile needs none
        (:meth:`tile_needs_mask` is False)."""
        if not self.tile_needs_mask(m, n):
            return None
        r0, r1 = self.q_range(m)
        c0, c1 = self.k_range(n)
        return self._band_mask(np.arange(r0, r1)[:, None], np.arange(c0, c1)[None, :])

    def tile_causal_mask(self, m: int, n: int) -> np.ndarray | None:
        """The causal rule alone on tile ``(m, n)``: bool ``[rows, cols]``; None when it does
        not cut the tile (or without causal masking). The window is not included (see
        :meth:`tile_position_mask`)."""
        if not self.causal:
            return None
        r0, r1 = self.q_range(m)
        c0, c1 = self.k_range(n)
        if c1 - 1 <= r0 + self.causal_offset:
            return None
        return np.arange(c0, c1)[None, :] <= np.arange(r0, r1)[:, None] + self.causal_offset

    def causal_pattern(self) -> np.ndarray:
        """The whole ``[seqlen_q, seqlen_k]`` causal pattern as a boolean array (all True when
        not causal); the window and block-sparse skipping not included."""
        rows = np.arange(self.seqlen_q)[:, None]
        cols = np.arange(self.seqlen_k)[None, :]
        if not self.causal:
            return np.ones((self.seqlen_q, self.seqlen_k), dtype=bool)
        return cols <= rows + self.causal_offset

    def position_pattern(self) -> np.ndarray:
        """The whole ``[seqlen_q, seqlen_k]`` band (causal and window) as a boolean array;
        block-sparse skipping not included. For references and tests."""
        mask = self._band_mask(np.arange(self.seqlen_q)[:, None], np.arange(self.seqlen_k)[None, :])
        return np.broadcast_to(mask, (self.seqlen_q, self.seqlen_k)).copy()

    def _band_mask(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """``lo <= cols - rows <= hi`` (absent bounds: no constraint), broadcast."""
        lo, hi = self.band
        diff = cols - rows
        keep = np.ones(diff.shape, dtype=bool)
        if lo is not None:
            keep &= diff >= lo
        if hi is not None:
            keep &= diff <= hi
        return keep

    def tiles(self) -> list[tuple[int, int]]:
        """All visited tiles ``(m, n)`` in FlashAttention-2 forward order (Q outer, K inner)."""
        return [(m, n) for m in range(self.n_blocks_q) for n in self.k_blocks(m)]

    @property
    def n_tiles(self) -> int:
        """Number of visited tiles."""
        return sum(len(self.k_blocks(m)) for m in range(self.n_blocks_q))

    # -- compact schedules for kernels ----------------------------------------------------------
    def kv_schedule(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR form of :meth:`k_blocks`: ``(offsets[int32, n_blocks_q + 1], kv_index[int32])``.

        Q block ``m`` visits ``kv_index[offsets[m]:offsets[m + 1]]``.
        """
        lists = [self.k_blocks(m) for m in range(self.n_blocks_q)]
        return _csr(lists)

    def q_schedule(self) -> tuple[np.ndarray, np.ndarray]:
        """CSR form of :meth:`q_blocks`: ``(offsets[int32, n_blocks_k + 1], q_index[int32])``."""
        lists = [self.q_blocks(n) for n in range(self.n_blocks_k)]
        return _csr(lists)


def _csr(lists) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(lists) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(x) for x in lists])
    index = np.fromiter((i for x in lists for i in x), dtype=np.int32, count=int(offsets[-1]))
    return offsets, index
