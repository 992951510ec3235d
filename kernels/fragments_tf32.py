"""Register fragment layouts of ``mma.m16n8k8`` with tf32 inputs, and the index permutations of
the 3xTF32 forward, as plain Python.

This module owns the index maps that `kernels.tf32_fwd` relies on; they are tested on the
CPU in both directions (`tests/test_tf32_fragments.py`) and the bare instruction against them on
a GPU (`tests/test_tf32_intrinsics.py`).

Source: PTX ISA, "Matrix Fragments for mma.m16n8k8" (.tf32 A and B, .f32 C and D). With
``g = lane // 4`` (group) and ``t = lane % 4`` (thread in group):

* A, 16x8 (M x K), row-major, four .b32 registers: a0 = (g, t), a1 = (g + 8, t),
  a2 = (g, t + 4), a3 = (g + 8, t + 4);
* B, 8x8 (K x N), "col": b0 = (k = t, n = g), b1 = (k = t + 4, n = g);
* C and D, 16x8 float32: c0 = (g, 2t), c1 = (g, 2t + 1), c2 = (g + 8, 2t), c3 = (g + 8, 2t + 1).

A product sums over k, so the kernel may let logical k stand for any physical index as long as
A and B use the same map. It uses one permutation, `k_perm`: k = t -> 2t, k = t + 4 -> 2t + 1.

* S = Q K^T: k is a head-dim index; with `k_perm` a thread's two A columns (and its two B rows)
  are the adjacent dims 2t, 2t + 1, so K's B fragment is one 64-bit shared load.
* O += P V: k is a key index; with `k_perm` the C fragment of a 16x8 score tile *is* the A
  fragment of P (c0 -> a0, c2 -> a1, c1 -> a2, c3 -> a3, `p_a_from_c`), so P never leaves the
  registers; V's B fragment is then b0 = V[key 2t][g], b1 = V[key 2t + 1][g] (`v_b_elem`).
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "WARP", "a_elem", "a_owner", "b_elem", "b_owner", "c_elem", "c_owner", "k_perm",
    "k_perm_inv", "p_a_from_c", "q_a_elem", "k_b_elem", "v_b_elem", "tf32_round",
    "tf32_truncate", "tf32_split", "dim_a_elem", "dim_b_elem", "bwd_b_offset", "bwd_t_offset", "smem_bank",
]

WARP = 32


def _check_lane(lane: int) -> None:
    if not 0 <= lane < WARP:
        raise ValueError(f"lane must be in [0, 32), got {lane}")


def _check_reg(reg: int, n: int, what: str) -> None:
    if not 0 <= reg < n:
        raise ValueError(f"{what} has registers 0..{n - 1}, got reg={reg}")


# -- A: 16x8 (M x K), 4 x .b32 ---------------------------------------------------------------------
def a_elem(lane: int, reg: int) -> tuple[int, int]:
    """(row, k) of the A element in register ``reg`` of ``lane``."""
    _check_lane(lane)
    _check_reg(reg, 4, "A")
    g, t = lane // 4, lane % 4
    return g + 8 * (reg & 1), t + 4 * (reg >> 1)


def a_owner(row: int, k: int) -> tuple[int, int]:
    """(lane, reg) holding A element (row, k), 0 <= row < 16, 0 <= k < 8."""
    if not (0 <= row < 16 and 0 <= k < 8):
        raise ValueError(f"A is 16x8, got ({row}, {k})")
    return 4 * (row % 8) + k % 4, (row // 8) + 2 * (k // 4)


# -- B: 8x8 (K x N), 2 x .b32 ------------------------------------------------------------------------
def b_elem(lane: int, reg: int) -> tuple[int, int]:
    """(k, n) of the B element in register ``reg`` of ``lane``."""
    _check_lane(lane)
    _check_reg(reg, 2, "B")
    return lane % 4 + 4 * reg, lane // 4


def b_owner(k: int, n: int) -> tuple[int, int]:
    """(lane, reg) holding B element (k, n), 0 <= k, n < 8."""
    if not (0 <= k < 8 and 0 <= n < 8):
        raise ValueError(f"B is 8x8, got ({k}, {n})")
    return 4 * n + k % 4, k // 4


# -- C/D: 16x8 float32, 4 registers ---------------------------------------------------------------
def c_elem(lane: int, reg: int) -> tuple[int, int]:
    """(row, col) of the C/D element in register ``reg`` of ``lane``."""
    _check_lane(lane)
    _check_reg(reg, 4, "C")
    g, t = lane // 4, lane % 4
    return g + 8 * (reg >> 1), 2 * t + (reg & 1)


def c_owner(row: int, col: int) -> tuple[int, int]:
    """(lane, reg) holding C/D element (row, col), 0 <= row < 16, 0 <= col < 8."""
    if not (0 <= row < 16 and 0 <= col < 8):
        raise ValueError(f"C is 16x8, got ({row}, {col})")
    return 4 * (row % 8) + col // 2, 2 * (row // 8) + col % 2


# -- the kernel's permutation of the k index --------------------------------------------------------
def k_perm(k: int) -> int:
    """Physical index (head dim in Q K^T, key in P V) that logical k stands for: t -> 2t,
    t + 4 -> 2t + 1."""
    if not 0 <= k < 8:
        raise ValueError(f"k must be in [0, 8), got {k}")
    return 2 * (k % 4) + k // 4


def k_perm_inv(j: int) -> int:
    """Logical k of physical index j (inverse of `k_perm`)."""
    if not 0 <= j < 8:
        raise ValueError(f"index must be in [0, 8), got {j}")
    return j // 2 + 4 * (j % 2)


def p_a_from_c(a_reg: int) -> int:
    """The score C register that is P's A register ``a_reg`` in the same lane (under `k_perm`):
    a0 <- c0, a1 <- c2, a2 <- c1, a3 <- c3."""
    _check_reg(a_reg, 4, "A")
    return (0, 2, 1, 3)[a_reg]


def q_a_elem(lane: int, reg: int) -> tuple[int, int]:
    """(query row, head dim) within a 16x8 Q slice that A register ``reg`` of ``lane`` holds."""
    row, k = a_elem(lane, reg)
    return row, k_perm(k)


def k_b_elem(lane: int, reg: int) -> tuple[int, int]:
    """(key, head dim) within an 8-key x 8-dim K slice that B register ``reg`` of ``lane``
    holds for S = Q K^T (B[k][n] = K[n][k_perm(k)]): b0, b1 are dims 2t, 2t + 1 of key g."""
    k, n = b_elem(lane, reg)
    return n, k_perm(k)


def v_b_elem(lane: int, reg: int) -> tuple[int, int]:
    """(key, head dim) within an 8-key x 8-dim V slice that B register ``reg`` of ``lane``
    holds for O += P V (B[k][n] = V[k_perm(k)][n]): b0 = V[2t][g], b1 = V[2t + 1][g]."""
    k, n = b_elem(lane, reg)
    return k_perm(k), n


# -- tf32 rounding (what cvt.rna.tf32.f32 does), for reference ------------------------------------
def tf32_round(x):
    """float32 -> float32 rounded to a 10-bit mantissa, to nearest with ties away from zero
    (``cvt.rna.tf32.f32``) for finite x."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def tf32_truncate(x):
    """float32 -> float32 with the low 13 bits cleared (truncated to TF32; what the tensor core
    reads of any float32 operand)."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return (bits & np.uint32(0xFFFFE000)).view(np.float32)


def tf32_split(x):
    """(big, small) of `kernels.ptx.split_tf32` as the tensor core reads them, float32 arrays:
    big = x truncated to TF32, small = x - big rounded to TF32 (to nearest, ties away: half a
    TF32 ulp added to its bits, then truncated). The intrinsic's ``small`` bits carry the
    added half ulp below bit 13; compare them with `tf32_truncate` applied."""
    x = np.asarray(x, np.float32)
    big = tf32_truncate(x)
    return big, tf32_round((x - big).astype(np.float32))


# -- the 3xTF32 backward (`kernels.tf32_bwd`) -------------------------------------------------
# In S = Q K^T, dP = dO V^T (dQ kernel) and S^T = K Q^T, dP^T = V dO^T (dK/dV kernel) the k index
# is a head dim and is not permuted: the A operand (Q, dO, K or V rows) is `dim_a_elem`, the B
# operand X[row n][dim k] is `dim_b_elem`, two 32-bit shared loads at `bwd_b_offset`. In
# dQ += dS K, dV += (P^T Z) dO and dK += dS^T Q the A operand is the score tile's C fragment under
# `k_perm` (`p_a_from_c`) and the B operand is `v_b_elem` (X[row 2t][dim g], X[row 2t + 1][g]),
# loaded at `bwd_t_offset`. With shared rows padded to D + 4 floats both load patterns hit 32
# different banks (`smem_bank`).
def dim_a_elem(lane: int, reg: int) -> tuple[int, int]:
    """(row, head dim) within a 16x8 slice that A register ``reg`` of ``lane`` holds when k is
    a head dim and not permuted (the backward's Q, dO, K, V fragments): a0/a2 = dims t, t + 4."""
    return a_elem(lane, reg)


def dim_b_elem(lane: int, reg: int) -> tuple[int, int]:
    """(row, head dim) within an 8-row x 8-dim slice of X that B register ``reg`` of ``lane``
    holds for a product with X^T (B[k][n] = X[n][k], k not permuted): b0 = X[g][t],
    b1 = X[g][t + 4]."""
    k, n = b_elem(lane, reg)
    return n, k


def bwd_b_offset(lane: int, reg: int, stride: int) -> int:
    """Float offset in a shared tile with rows of ``stride`` floats of the element
    `dim_b_elem` names (the kernels' ``b_lane`` plus 4 floats for b1)."""
    g, t = lane // 4, lane % 4
    return g * stride + t + 4 * reg


def bwd_t_offset(lane: int, reg: int, stride: int) -> int:
    """Float offset in a shared tile with rows of ``stride`` floats of the element `v_b_elem`
    names (the kernels' ``t_lane`` plus one row for b1)."""
    g, t = lane // 4, lane % 4
    return (2 * t + reg) * stride + g


def smem_bank(float_offset: int) -> int:
    """Shared-memory bank (of 32, 4 bytes wide) of a float offset from a 128-byte aligned base."""
    return float_offset % 32
