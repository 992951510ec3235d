"""Register fragment layouts of the warp-level tensor-core instructions, as plain Python.

This module owns the index maps that the half-precision kernel (`kernels.mma_fwd`) relies
on: which thread of a warp holds which matrix element in which register. The CUDA simulator
cannot execute inline PTX, so these maps are the part of the tensor-core path that is tested on
every commit on the CPU (`tests/test_mma_fragments.py`), in both directions.

Source: PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16/.bf16
A and B, .f32 C and D) and "Warp-level matrix load instruction: ldmatrix".
With ``group = lane // 4`` and ``tig = lane % 4`` (thread in group):

* A, 16x16 (M x K), row-major, four .b32 registers ``a0..a3`` of two halves each, element
  ``e = 2 * reg + half`` (``half`` 0 = low 16 bits)::

      row = group      for e in {0,1,4,5},   group + 8 for e in {2,3,6,7}
      col = 2*tig + (e & 1)  for e < 4,      2*tig + (e & 1) + 8 for e >= 4

* B, 16x8 (K x N), "col" layout, two .b32 registers ``b0, b1``, element ``e = 2 * reg + half``::

      k = 2*tig + (e & 1) (+ 8 for e >= 2),  n = group

* C and D, 16x8 (M x N), float32, four registers ``c0..c3``::

      row = group (+ 8 for c2, c3),  col = 2*tig + (reg & 1)

* ``ldmatrix.sync.aligned.m8n8.x4.b16``: lanes ``8*j .. 8*j + 7`` give the addresses of rows
  0..7 of matrix ``j``; afterwards register ``j`` of lane ``l`` holds row ``l // 4``, columns
  ``2*(l % 4)`` and ``2*(l % 4) + 1`` of matrix ``j`` (low half first). With ``.trans`` it holds
  the transposed pair: rows ``2*(l % 4)``, ``2*(l % 4) + 1`` of column ``l // 4``.

Two consequences the kernel uses are checked in the tests: the C fragments of two adjacent
16x8 score tiles are, register for register, the A fragment of the 16x16 probability tile
(`c_pair_to_a`), so P feeds the second mma without leaving registers; and the ldmatrix address
patterns below deliver exactly the A (Q), B (K, non-transposed) and B (V, transposed) fragments.
"""
from __future__ import annotations

__all__ = [
    "WARP", "a_elem", "a_owner", "b_elem", "b_owner", "c_elem", "c_owner",
    "ldmatrix_elem", "ldmatrix_owner", "c_pair_to_a",
    "q_ldmatrix_row_col", "k_ldmatrix_row_col", "v_ldmatrix_row_col",
]

WARP = 32


def _check_lane(lane: int) -> None:
    if not 0 <= lane < WARP:
        raise ValueError(f"lane must be in [0, 32), got {lane}")


# -- A: 16x16 row-major, 4 x .b32 (two halves each) ----------------------------------------------
def a_elem(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row, col) of the A element in half ``half`` of register ``reg`` of ``lane``."""
    _check_lane(lane)
    if not (0 <= reg < 4 and half in (0, 1)):
        raise ValueError(f"A has registers 0..3 and halves 0..1, got reg={reg}, half={half}")
    group, tig = lane // 4, lane % 4
    e = 2 * reg + half
    row = group + (8 if e in (2, 3, 6, 7) else 0)
    col = 2 * tig + (e & 1) + (8 if e >= 4 else 0)
    return row, col


def a_owner(row: int, col: int) -> tuple[int, int, int]:
    """(lane, reg, half) holding A element (row, col), 0 <= row, col < 16."""
    if not (0 <= row < 16 and 0 <= col < 16):
        raise ValueError(f"A is 16x16, got ({row}, {col})")
    lane = 4 * (row % 8) + (col % 8) // 2
    reg = (1 if row >= 8 else 0) + (2 if col >= 8 else 0)
    return lane, reg, col % 2


# -- B: 16x8 (K x N), 2 x .b32 -------------------------------------------------------------------
def b_elem(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(k, n) of the B element in half ``half`` of register ``reg`` of ``lane``."""
    _check_lane(lane)
    if not (0 <= reg < 2 and half in (0, 1)):
        raise ValueError(f"B has registers 0..1 and halves 0..1, got reg={reg}, half={half}")
    group, tig = lane // 4, lane % 4
    return 2 * tig + half + 8 * reg, group


def b_owner(k: int, n: int) -> tuple[int, int, int]:
    """(lane, reg, half) holding B element (k, n), 0 <= k < 16, 0 <= n < 8."""
    if not (0 <= k < 16 and 0 <= n < 8):
        raise ValueError(f"B is 16x8, got ({k}, {n})")
    return 4 * n + (k % 8) // 2, k // 8, k % 2


# -- C/D: 16x8 float32, 4 registers ----------------------------------------------------------------
def c_elem(lane: int, reg: int) -> tuple[int, int]:
    """(row, col) of the C/D element in register ``reg`` of ``lane``."""
    _check_lane(lane)
    if not 0 <= reg < 4:
        raise ValueError(f"C has registers 0..3, got reg={reg}")
    group, tig = lane // 4, lane % 4
    return group + (8 if reg >= 2 else 0), 2 * tig + (reg & 1)


def c_owner(row: int, col: int) -> tuple[int, int]:
    """(lane, reg) holding C/D element (row, col), 0 <= row < 16, 0 <= col < 8."""
    if not (0 <= row < 16 and 0 <= col < 8):
        raise ValueError(f"C is 16x8, got ({row}, {col})")
    return 4 * (row % 8) + col // 2, (2 if row >= 8 else 0) + col % 2


def c_pair_to_a(tile: int, reg: int) -> tuple[int, int]:
    """Where C register ``reg`` of score tile ``tile`` (0: cols 0-7, 1: cols 8-15) goes in A.

    Returns ``(a_reg, half)``: the same lane holds the same (row, col) of the 16x16 tile there.
    """
    if tile not in (0, 1) or not 0 <= reg < 4:
        raise ValueError(f"tile in (0, 1), reg in 0..3 expected, got {tile}, {reg}")
    return 2 * tile + reg // 2, reg % 2


# -- ldmatrix m8n8 x4 --------------------------------------------------------------------------------
def ldmatrix_elem(lane: int, reg: int, half: int, trans: bool = False) -> tuple[int, int, int]:
    """(matrix, row, col) of the element ldmatrix.x4 puts in ``lane``'s ``reg``/``half``."""
    _check_lane(lane)
    if not (0 <= reg < 4 and half in (0, 1)):
        raise ValueError(f"ldmatrix.x4 has registers 0..3 and halves 0..1, got {reg}, {half}")
    r, c = lane // 4, 2 * (lane % 4) + half
    return (reg, c, r) if trans else (reg, r, c)


def ldmatrix_owner(matrix: int, row: int, col: int, trans: bool = False) -> tuple[int, int, int]:
    """(lane, reg, half) that receives element (row, col) of 8x8 ``matrix`` from ldmatrix.x4."""
    if not (0 <= matrix < 4 and 0 <= row < 8 and 0 <= col < 8):
        raise ValueError(f"matrix in 0..3 and row, col in 0..7 expected, got {matrix}, {row}, {col}")
    if trans:
        row, col = col, row
    return 4 * row + col // 2, matrix, col % 2


# -- the address patterns the kernel gives ldmatrix (lane -> row/col of the first element) -------
def q_ldmatrix_row_col(lane: int) -> tuple[int, int]:
    """Row (query) and column (head dim) offsets whose address ``lane`` gives for a 16x16 A tile.

    Matrices: 0 = rows 0-7 x cols 0-7, 1 = rows 8-15 x cols 0-7, 2 = rows 0-7 x cols 8-15,
    3 = rows 8-15 x cols 8-15, so registers 0..3 are A registers a0..a3.
    """
    _check_lane(lane)
    return lane % 8 + 8 * ((lane // 8) % 2), 8 * (lane // 16)


def k_ldmatrix_row_col(lane: int) -> tuple[int, int]:
    """Key row and head-dim column ``lane`` addresses to load B fragments of S = Q K^T.

    One x4 load (no transpose) covers 16 keys x 16 dims: registers (0, 1) are B for keys 0-7,
    registers (2, 3) are B for keys 8-15.
    """
    _check_lane(lane)
    return lane % 8 + 8 * (lane // 16), 8 * ((lane // 8) % 2)


def v_ldmatrix_row_col(lane: int) -> tuple[int, int]:
    """Key row and head-dim column ``lane`` addresses to load B fragments of O = P V (.trans).

    One x4.trans load covers 16 keys x 16 dims: registers (0, 1) are B for dims 0-7,
    registers (2, 3) are B for dims 8-15.
    """
    _check_lane(lane)
    return lane % 8 + 8 * ((lane // 8) % 2), 8 * (lane // 16)
