"""GPU tests of the half-precision PTX intrinsics in `kernels.ptx` (marked ``gpu``: the CUDA
simulator runs no PTX).

* one warp's ``mma_f16`` / ``mma_bf16`` against the float64 product of the same half-precision
  matrices (inputs exactly representable, float32 accumulation of 16 products: rtol 1e-6);
* ``ldmatrix_x4`` / ``ldmatrix_x4_trans`` registers against `kernels.fragments` (bit-exact);
* ``cp_async_16`` and ``cp_async_16_ca`` copy (and zero-fill with source size 0) bit-exactly;
* ``ex2`` against 2**x (approx: relative 2**-21), ``pack_*x2`` against NumPy/torch rounding.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kernels import fragments as fr

pytestmark = pytest.mark.gpu


def _build():
    from numba import cuda, uint16, uint32
    from kernels import ptx

    @cuda.jit
    def warp_mma(a_regs, b_regs, c_regs, d_regs, use_bf16):
        lane = cuda.threadIdx.x
        a = a_regs[lane]
        b = b_regs[lane]
        c = c_regs[lane]
        if use_bf16:
            d = ptx.mma_bf16(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3])
        else:
            d = ptx.mma_f16(a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3])
        for i in range(4):
            d_regs[lane, i] = d[i]

    @cuda.jit
    def ldm(tile, row_of_lane, col_of_lane, out, out_t):
        # tile: 16x16 uint16 in global; staged into shared with stride 24 (padded)
        sm = cuda.shared.array(16 * 24, dtype=uint16)
        lane = cuda.threadIdx.x
        for i in range(lane, 256, 32):
            sm[(i // 16) * 24 + i % 16] = tile[i // 16, i % 16]
        cuda.syncwarp()
        addr = ptx.shared_addr(sm, row_of_lane[lane] * 24 + col_of_lane[lane])
        r = ptx.ldmatrix_x4(addr)
        rt = ptx.ldmatrix_x4_trans(addr)
        for i in range(4):
            out[lane, i] = r[i]
            out_t[lane, i] = rt[i]

    @cuda.jit
    def copy_async(src, dst, nvalid, through_l1):
        # src, dst: [1, 1, rows, 8] uint16 (16 bytes a row); rows >= nvalid are zero-filled
        sm = cuda.shared.array(64 * 8, dtype=uint16)
        t = cuda.threadIdx.x
        ok = t < nvalid[0]
        g = ptx.global_addr(src, 0, 0, t if ok else 0, 0)
        s_addr = ptx.shared_addr(sm, t * 8)
        if through_l1:
            ptx.cp_async_16_ca(s_addr, g, uint32(16) if ok else uint32(0))
        else:
            ptx.cp_async_16(s_addr, g, uint32(16) if ok else uint32(0))
        ptx.cp_async_commit()
        ptx.cp_async_wait_all()
        cuda.syncthreads()
        for c in range(8):
            dst[0, 0, t, c] = sm[t * 8 + c]

    @cuda.jit
    def misc(x, e, lo, hi, p16, pb16):
        i = cuda.grid(1)
        if i < x.size:
            e[i] = ptx.ex2(x[i])
            p16[i] = ptx.pack_f16x2(lo[i], hi[i])
            pb16[i] = ptx.pack_bf16x2(lo[i], hi[i])

    return warp_mma, ldm, copy_async, misc


def _bits(x_half):
    return x_half.view(np.uint16).astype(np.uint32)


def _to_bf16_bits(x32):
    b = np.asarray(x32, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint32)  # round to nearest even


def _from_bf16_bits(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_warp_mma_matches_float64(dtype):
    from numba import cuda
    warp_mma = _build()[0]
    rng = np.random.default_rng(5)
    for trial in range(3):
        a32 = rng.standard_normal((16, 16)).astype(np.float32)
        b32 = rng.standard_normal((16, 8)).astype(np.float32)
        c = rng.standard_normal((16, 8)).astype(np.float32)
        if dtype == "fp16":
            a_bits, b_bits = _bits(a32.astype(np.float16)), _bits(b32.astype(np.float16))
            a64 = a32.astype(np.float16).astype(np.float64)
            b64 = b32.astype(np.float16).astype(np.float64)
        else:
            a_bits, b_bits = _to_bf16_bits(a32), _to_bf16_bits(b32)
            a64 = _from_bf16_bits(a_bits).astype(np.float64)
            b64 = _from_bf16_bits(b_bits).astype(np.float64)
        a_regs = np.zeros((32, 4), np.uint32)
        b_regs = np.zeros((32, 2), np.uint32)
        c_regs = np.zeros((32, 4), np.float32)
        for lane, reg, half in itertools.product(range(32), range(4), range(2)):
            a_regs[lane, reg] |= a_bits[fr.a_elem(lane, reg, half)] << (16 * half)
        for lane, reg, half in itertools.product(range(32), range(2), range(2)):
            b_regs[lane, reg] |= b_bits[fr.b_elem(lane, reg, half)] << (16 * half)
        for lane, reg in itertools.product(range(32), range(4)):
            c_regs[lane, reg] = c[fr.c_elem(lane, reg)]
        d_regs = cuda.to_device(np.zeros((32, 4), np.float32))
        warp_mma[1, 32](cuda.to_device(a_regs), cuda.to_device(b_regs), cuda.to_device(c_regs),
                        d_regs, dtype == "bf16")
        got = d_regs.copy_to_host()
        d = np.zeros((16, 8))
        for lane, reg in itertools.product(range(32), range(4)):
            d[fr.c_elem(lane, reg)] = got[lane, reg]
        want = a64 @ b64 + c.astype(np.float64)
        # exact products, float32 sums of 17 terms of size ~4: a few ulp of 16
        np.testing.assert_allclose(d, want, rtol=0, atol=16 * 17 * 2.0**-23)


def test_ldmatrix_registers_match_fragment_maps():
    from numba import cuda
    ldm = _build()[1]
    tile = np.arange(256, dtype=np.uint16).reshape(16, 16) * 7 + 3
    for pattern in (fr.q_ldmatrix_row_col, fr.k_ldmatrix_row_col, fr.v_ldmatrix_row_col):
        rows = np.array([pattern(l)[0] for l in range(32)], np.int32)
        cols = np.array([pattern(l)[1] for l in range(32)], np.int32)
        out = cuda.to_device(np.zeros((32, 4), np.uint32))
        out_t = cuda.to_device(np.zeros((32, 4), np.uint32))
        ldm[1, 32](cuda.to_device(tile), cuda.to_device(rows), cuda.to_device(cols), out, out_t)
        for trans, got in ((False, out.copy_to_host()), (True, out_t.copy_to_host())):
            for lane, reg, half in itertools.product(range(32), range(4), range(2)):
                m, r, c = fr.ldmatrix_elem(lane, reg, half, trans)
                src_lane = 8 * m + r
                want = tile[rows[src_lane], cols[src_lane] + c]
                assert (got[lane, reg] >> (16 * half)) & 0xFFFF == want


@pytest.mark.parametrize("through_l1", [False, True])
def test_cp_async_copies_and_zero_fills(through_l1):
    from numba import cuda
    copy_async = _build()[2]
    src = np.random.default_rng(0).integers(1, 60000, (1, 1, 64, 8)).astype(np.uint16)
    dst = cuda.to_device(np.full((1, 1, 64, 8), 7, np.uint16))
    copy_async[1, 64](cuda.to_device(src), dst, cuda.to_device(np.array([37], np.int32)),
                      through_l1)
    got = dst.copy_to_host()
    np.testing.assert_array_equal(got[0, 0, :37], src[0, 0, :37])
    assert (got[0, 0, 37:] == 0).all()


def test_ex2_and_packing():
    from numba import cuda
    misc = _build()[3]
    rng = np.random.default_rng(1)
    n = 4096
    x = np.concatenate([rng.uniform(-30, 10, n - 2), [-np.inf, 0.0]]).astype(np.float32)
    lo = rng.standard_normal(n).astype(np.float32)
    hi = (rng.standard_normal(n) * 100).astype(np.float32)
    e, p16, pb16 = (cuda.to_device(np.zeros(n, t)) for t in (np.float32, np.uint32, np.uint32))
    misc[n // 128, 128](cuda.to_device(x), e, cuda.to_device(lo), cuda.to_device(hi), p16, pb16)
    want = np.exp2(x.astype(np.float64))
    np.testing.assert_allclose(e.copy_to_host(), want, rtol=2.0**-21, atol=1e-38)
    got16 = p16.copy_to_host()
    np.testing.assert_array_equal(got16 & 0xFFFF, _bits(lo.astype(np.float16)))
    np.testing.assert_array_equal(got16 >> 16, _bits(hi.astype(np.float16)))
    gotb = pb16.copy_to_host()
    np.testing.assert_array_equal(gotb & 0xFFFF, _to_bf16_bits(lo))
    np.testing.assert_array_equal(gotb >> 16, _to_bf16_bits(hi))
