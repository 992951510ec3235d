"""CPU tests of `kernels.fragments_tf32`: the m16n8k8 tf32 fragment maps in both directions, the
k permutation the 3xTF32 forward uses, and the operand split (runs everywhere, no GPU).

The permutation tests simulate one warp in NumPy: registers are filled from matrices through the
maps, the "mma" multiplies the matrices the registers describe, and the result is read back
through the C map; with the kernel's permutations the product must equal Q K^T and P V.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels import fragments_tf32 as fr


def test_a_maps_are_inverse_bijections():
    seen = set()
    for lane, reg in itertools.product(range(32), range(4)):
        row, k = fr.a_elem(lane, reg)
        assert fr.a_owner(row, k) == (lane, reg)
        seen.add((row, k))
    assert seen == set(itertools.product(range(16), range(8)))
    for row, k in itertools.product(range(16), range(8)):
        assert fr.a_elem(*fr.a_owner(row, k)) == (row, k)


def test_a_map_is_the_ptx_table():
    for lane in range(32):
        g, t = lane // 4, lane % 4
        assert [fr.a_elem(lane, r) for r in range(4)] == [(g, t), (g + 8, t), (g, t + 4),
                                                          (g + 8, t + 4)]
        assert [fr.b_elem(lane, r) for r in range(2)] == [(t, g), (t + 4, g)]
        assert [fr.c_elem(lane, r) for r in range(4)] == [(g, 2 * t), (g, 2 * t + 1),
                                                          (g + 8, 2 * t), (g + 8, 2 * t + 1)]


def test_b_and_c_maps_are_inverse_bijections():
    seen_b, seen_c = set(), set()
    for lane, reg in itertools.product(range(32), range(2)):
        k, n = fr.b_elem(lane, reg)
        assert fr.b_owner(k, n) == (lane, reg)
        seen_b.add((k, n))
    for lane, reg in itertools.product(range(32), range(4)):
        row, col = fr.c_elem(lane, reg)
        assert fr.c_owner(row, col) == (lane, reg)
        seen_c.add((row, col))
    assert seen_b == set(itertools.product(range(8), range(8)))
    assert seen_c == set(itertools.product(range(16), range(8)))
    for k, n in itertools.product(range(8), range(8)):
        assert fr.b_elem(*fr.b_owner(k, n)) == (k, n)
    for row, col in itertools.product(range(16), range(8)):
        assert fr.c_elem(*fr.c_owner(row, col)) == (row, col)


def test_bad_indices_raise():
    with pytest.raises(ValueError, match="lane"):
        fr.a_elem(32, 0)
    with pytest.raises(ValueError, match="registers"):
        fr.b_elem(0, 2)
    with pytest.raises(ValueError, match="16x8"):
        fr.c_owner(16, 0)
    with pytest.raises(ValueError, match="k must"):
        fr.k_perm(8)


def test_k_permutation():
    assert [fr.k_perm(k) for k in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]
    for j in range(8):
        assert fr.k_perm(fr.k_perm_inv(j)) == j
    # a thread's two A columns / B rows are adjacent (a 64-bit load for K)
    for lane in range(32):
        t = lane % 4
        assert fr.q_a_elem(lane, 0)[1] == 2 * t and fr.q_a_elem(lane, 2)[1] == 2 * t + 1
        assert fr.k_b_elem(lane, 0) == (lane // 4, 2 * t)
        assert fr.k_b_elem(lane, 1) == (lane // 4, 2 * t + 1)
        assert fr.v_b_elem(lane, 0) == (2 * t, lane // 4)
        assert fr.v_b_elem(lane, 1) == (2 * t + 1, lane // 4)


def test_score_c_fragment_is_p_a_fragment():
    # register a of P's A fragment holds (row, key k_perm(k)) = what C register p_a_from_c(a) holds
    for lane, a_reg in itertools.product(range(32), range(4)):
        row, k = fr.a_elem(lane, a_reg)
        assert fr.c_elem(lane, fr.p_a_from_c(a_reg)) == (row, fr.k_perm(k))


def _warp_mma(a_regs, b_regs):
    """The 16x8 product the registers describe, back in C registers (what mma.sync computes)."""
    a = np.zeros((16, 8))
    b = np.zeros((8, 8))
    for lane, reg in itertools.product(range(32), range(4)):
        a[fr.a_elem(lane, reg)] = a_regs[lane, reg]
    for lane, reg in itertools.product(range(32), range(2)):
        b[fr.b_elem(lane, reg)] = b_regs[lane, reg]
    d = a @ b
    return np.array([[d[fr.c_elem(lane, reg)] for reg in range(4)] for lane in range(32)])


def _from_c(c_regs):
    m = np.zeros((16, 8))
    for lane, reg in itertools.product(range(32), range(4)):
        m[fr.c_elem(lane, reg)] = c_regs[lane, reg]
    return m


def test_permuted_products_equal_qk_and_pv():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((16, 8))      # 16 rows x 8 head dims
    kt = rng.standard_normal((8, 8))      # 8 keys x 8 head dims
    v = rng.standard_normal((8, 8))       # 8 keys x 8 head dims
    # S = Q K^T with A = Q[row][k_perm(k)], B[k][n] = K[n][k_perm(k)]
    a = np.array([[q[fr.q_a_elem(l, r)] for r in range(4)] for l in range(32)])
    b = np.array([[kt[fr.k_b_elem(l, r)] for r in range(2)] for l in range(32)])
    s_c = _warp_mma(a, b)
    np.testing.assert_allclose(_from_c(s_c), q @ kt.T, rtol=1e-12, atol=1e-12)
    # O = P V with P's A registers taken from S's C registers, B[k][n] = V[k_perm(k)][n]
    p_a = np.stack([s_c[:, fr.p_a_from_c(r)] for r in range(4)], axis=1)
    b_v = np.array([[v[fr.v_b_elem(l, r)] for r in range(2)] for l in range(32)])
    np.testing.assert_allclose(_from_c(_warp_mma(p_a, b_v)), (q @ kt.T) @ v, rtol=1e-12,
                               atol=1e-12)


def test_tf32_split_is_float32_accurate():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(10000) * np.exp(rng.uniform(-20, 20, 10000))).astype(np.float32)
    big, small = fr.tf32_split(x)
    for part in (big, small):   # 10-bit mantissas: low 13 bits zero
        assert (part.view(np.uint32) & 0x1FFF == 0).all()
    x64 = x.astype(np.float64)
    # big is x truncated to TF32 (under one TF32 ulp, 2**-10, below |x|); small rounds the rest
    np.testing.assert_array_equal(big, fr.tf32_truncate(x))
    assert (np.abs(big - x64) < np.abs(x64) * 2.0**-10).all() and (np.abs(big) <= np.abs(x64)).all()
    assert (np.abs(big.astype(np.float64) + small - x64) <= np.abs(x64) * 2.0**-21).all()
    # ties round away from zero (cvt.rna)
    tie = np.array([1 + 2.0**-11, -(1 + 2.0**-11)], np.float32)
    np.testing.assert_array_equal(fr.tf32_round(tie), [1 + 2.0**-10, -(1 + 2.0**-10)])


# -- the 3xTF32 backward's maps (kernels.flash_tf32_bwd) ------------------------------------------
@pytest.mark.parametrize("stride", [64 + 4, 128 + 4])
def test_backward_shared_offsets_are_the_maps_and_conflict_free(stride):
    for reg in range(2):
        banks_b, banks_t = set(), set()
        for lane in range(32):
            row, dim = fr.dim_b_elem(lane, reg)
            assert fr.bwd_b_offset(lane, reg, stride) == row * stride + dim
            row, dim = fr.v_b_elem(lane, reg)
            assert fr.bwd_t_offset(lane, reg, stride) == row * stride + dim
            banks_b.add(fr.smem_bank(fr.bwd_b_offset(lane, reg, stride)))
            banks_t.add(fr.smem_bank(fr.bwd_t_offset(lane, reg, stride)))
        assert len(banks_b) == 32 and len(banks_t) == 32
    for lane in range(32):
        g, t = lane // 4, lane % 4
        assert [fr.dim_a_elem(lane, r) for r in range(4)] == [(g, t), (g + 8, t), (g, t + 4),
                                                              (g + 8, t + 4)]


def _warp_mma3(a_regs, b_regs, c_regs):
    """3xTF32 on the emulated warp: the float32 operands split into tf32 big/small, the three
    products accumulated in float32 (the order of the kernels' ``mma3``)."""
    ab, as_ = fr.tf32_split(a_regs.astype(np.float32))
    bb, bs = fr.tf32_split(b_regs.astype(np.float32))
    d = c_regs.astype(np.float32)
    for x, y in ((as_, bb), (ab, bs), (ab, bb)):
        d = (d + _warp_mma(x.astype(np.float64), y.astype(np.float64))).astype(np.float32)
    return d


def test_backward_products_equal_the_gradient_matmuls():
    """One warp, one 16x8 tile of each of the five products, with the backward's maps: S^T =
    K Q^T (dims not permuted), then dV = P^T dO and dK = dS^T Q with the C fragment used as A
    under k_perm and B loaded as v_b_elem; dQ += dS K is the same shape with Q/K swapped.
    With 3xTF32 every product is float32-accurate against float64."""
    rng = np.random.default_rng(2)
    kk = rng.standard_normal((16, 8))     # 16 keys x 8 head dims
    qq = rng.standard_normal((8, 8))      # 8 queries x 8 head dims
    do = rng.standard_normal((8, 8))      # 8 queries x 8 head dims
    a = np.array([[kk[fr.dim_a_elem(l, r)] for r in range(4)] for l in range(32)])
    b = np.array([[qq[fr.dim_b_elem(l, r)] for r in range(2)] for l in range(32)])
    st_c = _warp_mma(a, b)
    np.testing.assert_allclose(_from_c(st_c), kk @ qq.T, rtol=1e-12, atol=1e-12)
    st3 = _warp_mma3(a, b, np.zeros((32, 4)))
    assert np.abs(_from_c(st3) - kk @ qq.T).max() <= 2.0**-19 * (np.abs(kk) @ np.abs(qq).T).max()
    # the C fragment (16 keys x 8 queries) as A of a product over queries
    pt_a = np.stack([st_c[:, fr.p_a_from_c(r)] for r in range(4)], axis=1)
    b_do = np.array([[do[fr.v_b_elem(l, r)] for r in range(2)] for l in range(32)])
    np.testing.assert_allclose(_from_c(_warp_mma(pt_a, b_do)), (kk @ qq.T) @ do, rtol=1e-12,
                               atol=1e-12)
    got = _from_c(_warp_mma3(pt_a, b_do, np.zeros((32, 4))))
    want = (kk @ qq.T) @ do
    assert np.abs(got - want).max() <= 2.0**-19 * (np.abs(kk @ qq.T) @ np.abs(do)).max()
