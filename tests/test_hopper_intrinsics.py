"""The Hopper (sm_90a) intrinsics of `kernels.hopper`, at three levels.

* CPU, plain Python: the wgmma matrix descriptor (bit fields against examples worked by hand
  from the PTX ISA's "Matrix Descriptor Format", the round trip, refusals naming the
  argument); the m64nNk16 accumulator layout (a bijection onto the 64 x N tile, named threads
  against the ISA's figure); the K-major shared-memory layouts and swizzles; the tensor-map
  argument checks.
* CPU, compile only: kernels using every intrinsic compile to PTX for ``sm_90a`` (Numba +
  NVVM, ``cuda.compile_ptx(..., cc=(9, 0, "a"))``) and assemble with ``ptxas -arch=sm_90a``, in
  a fresh process (the test run uses Numba's CUDA simulator, which emits no PTX); skipped
  without ptxas or NVVM.
* GPU (``gpu``, compute capability 9.0 and above): one warpgroup runs m64n64k16 wgmma over
  K = 64 from shared memory filled by a 1-D bulk copy (no swizzle and 128-byte swizzle), by
  ordinary stores + ``fence.proxy.async``, and by 2-D TMA copies from host-made tensor maps
  (128-byte swizzle), each against float64 ``A @ B``; an mbarrier with 128 arrivals over two
  phases; ``setmaxnreg`` in a two-warpgroup kernel. What `kernels.wgmma_fwd` adds: the bf16
  form; the in-place forms from 4-D tensor maps (a head coordinate, a zero-filled edge); A from
  registers with an MN-major B (O += P V's instruction), float16 and bfloat16.
* CPU, plain Python, for those: the MN-major layout against the ISA's canonical form, the
  A-register fragment, the accumulator registers that form the next A fragment, the 4-D
  tensor-map argument checks.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels import hopper as hp

from .helpers import compile_sm90a_in_child, skip_unless_hopper

ROOT = Path(__file__).resolve().parents[1]
K_TOTAL = 64              # the GPU kernels' K: four k16 steps


# ------------------------------------------------------------------------------------------------
# CPU: the matrix descriptor
# ------------------------------------------------------------------------------------------------
def test_descriptor_fields_by_hand():
    # start 0x400 -> 0x40 in bits 0-13; LBO 128 -> 8 in bits 16-29; SBO 256 -> 16 in bits 32-45
    assert hp.encode_wgmma_descriptor(0x400, 128, 256) == 0x40 | 8 << 16 | 16 << 32
    assert hp.encode_wgmma_descriptor(0x400, 128, 256) == 0x0000_0010_0008_0040
    # 128-byte swizzle: mode 1 in bits 62-63; LBO unused (16 -> 1), SBO 1024 -> 64
    assert hp.encode_wgmma_descriptor(0, 16, 1024, "128B") == 0x4000_0040_0001_0000
    # 64-byte swizzle = 2, 32-byte = 3, base offset 5 in bits 49-51
    assert hp.encode_wgmma_descriptor(0, 0, 0, "64B") == 2 << 62
    assert hp.encode_wgmma_descriptor(0, 0, 0, "32B") == 0xC000_0000_0000_0000
    assert hp.encode_wgmma_descriptor(0, 0, 0, base_offset=5) == 0x000A_0000_0000_0000
    # the largest encodable address: 14 bits of address / 16
    assert hp.encode_wgmma_descriptor(2**18 - 16, 2**18 - 16, 2**18 - 16) == \
        0x3FFF | 0x3FFF << 16 | 0x3FFF << 32
    # the PTX ISA's encode: (x & 0x3FFFF) >> 4, for addresses that fit
    for x in (0, 16, 0x1230, 0x3FFF0):
        assert hp.encode_wgmma_descriptor(x, 0, 0) == (x & 0x3FFFF) >> 4


def test_descriptor_round_trip():
    rng = np.random.default_rng(0)
    for _ in range(500):
        fields = hp.WgmmaDescriptor(int(rng.integers(0, 2**14)) * 16,
                                    int(rng.integers(0, 2**14)) * 16,
                                    int(rng.integers(0, 2**14)) * 16,
                                    str(rng.choice(list(hp.SWIZZLE_MODES))),
                                    int(rng.integers(0, 8)))
        desc = hp.encode_wgmma_descriptor(*fields)
        assert 0 <= desc < 2**64
        assert hp.decode_wgmma_descriptor(desc) == fields
    # every used bit decodes and re-encodes to itself
    for bit in [*range(14), *range(16, 30), *range(32, 46), 49, 50, 51, 62, 63]:
        assert hp.encode_wgmma_descriptor(*hp.decode_wgmma_descriptor(1 << bit)) == 1 << bit


@pytest.mark.parametrize("kwargs, name", [
    (dict(start_address=0x408), "start_address"),          # not 16-byte aligned
    (dict(start_address=2**18), "start_address"),          # would be truncated
    (dict(start_address=-16), "start_address"),
    (dict(leading_byte_offset=8), "leading_byte_offset"),
    (dict(leading_byte_offset=2**18), "leading_byte_offset"),
    (dict(stride_byte_offset=1000), "stride_byte_offset"),
    (dict(stride_byte_offset=2**20), "stride_byte_offset"),
    (dict(swizzle="256B"), "swizzle"),
    (dict(base_offset=8), "base_offset"),
])
def test_descriptor_refusals_name_the_argument(kwargs, name):
    args = dict(start_address=0, leading_byte_offset=128, stride_byte_offset=256)
    args.update(kwargs)
    with pytest.raises(ValueError, match=name):
        hp.encode_wgmma_descriptor(**args)


def test_descriptor_type_errors_and_bad_decodes():
    with pytest.raises(TypeError, match="start_address"):
        hp.encode_wgmma_descriptor(16.0, 0, 0)
    with pytest.raises(TypeError, match="stride_byte_offset"):
        hp.encode_wgmma_descriptor(0, 0, True)
    with pytest.raises(ValueError, match="reserved"):
        hp.decode_wgmma_descriptor(1 << 14)
    with pytest.raises(ValueError, match="reserved"):
        hp.decode_wgmma_descriptor(1 << 48)
    with pytest.raises(ValueError, match="desc"):
        hp.decode_wgmma_descriptor(1 << 64)


# ------------------------------------------------------------------------------------------------
# CPU: the accumulator layout
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [8, 16, 64, 128, 256])
def test_accumulator_layout_is_a_bijection(n):
    seen = {}
    for thread, reg in itertools.product(range(128), range(n // 2)):
        row, col = hp.wgmma_d_elem(thread, reg, n)
        assert 0 <= row < 64 and 0 <= col < n
        assert (row, col) not in seen
        seen[row, col] = (thread, reg)
        assert hp.wgmma_d_owner(row, col, n) == (thread, reg)
    assert len(seen) == 64 * n


def test_accumulator_layout_matches_the_isa_figure():
    # PTX ISA, "WGMMA .m64nNk16 register fragment layout for accumulator matrix D": warp w owns
    # rows 16w..16w+15; in row 0, T0 holds d0 d1 at columns 0, 1, T1 columns 2, 3, ... T3 6, 7;
    # d2 d3 sit 8 rows below d0 d1; d4..d7 repeat d0..d3 eight columns to the right.
    assert [hp.wgmma_d_elem(0, r) for r in range(8)] == [
        (0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert hp.wgmma_d_elem(1, 0) == (0, 2) and hp.wgmma_d_elem(3, 1) == (0, 7)
    assert hp.wgmma_d_elem(4, 0) == (1, 0)                   # T4 starts row 1
    assert hp.wgmma_d_elem(31, 3) == (15, 7)                 # last lane of warp 0
    assert hp.wgmma_d_elem(32, 0) == (16, 0)                 # warp 1: rows 16..31
    assert hp.wgmma_d_elem(127, 31) == (63, 63)              # the last register of N = 64
    assert hp.wgmma_d_elem(127, 127, n=256) == (63, 255)
    # N/2 registers per thread; the same (thread, reg) is the same element for every N
    for n in (8, 64, 256):
        assert hp.wgmma_d_elem(77, 3, n) == hp.wgmma_d_elem(77, 3, 8)
    # within a warp it is mma.m16n8's C layout (kernels.fragments) on each 16 x 8 block
    from kernels import fragments as fr
    for lane, reg, block in itertools.product(range(32), range(4), range(8)):
        r, c = fr.c_elem(lane, reg)
        assert hp.wgmma_d_elem(64 + lane, 4 * block + reg) == (32 + r, 8 * block + c)


def test_accumulator_layout_refusals():
    with pytest.raises(ValueError, match="thread"):
        hp.wgmma_d_elem(128, 0)
    with pytest.raises(ValueError, match="reg"):
        hp.wgmma_d_elem(0, 32, 64)
    with pytest.raises(ValueError, match="n must"):
        hp.wgmma_d_elem(0, 0, 12)
    with pytest.raises(ValueError, match="tile"):
        hp.wgmma_d_owner(64, 0)


# ------------------------------------------------------------------------------------------------
# CPU: shared-memory layouts, setmaxnreg counts, tensor-map arguments
# ------------------------------------------------------------------------------------------------
def test_swizzle_patterns():
    # 128B: the 16-byte chunk index XOR (row within 8 rows of 128 bytes)
    assert hp.swizzle_offset(0, "128B") == 0
    assert hp.swizzle_offset(128, "128B") == 128 + 16           # row 1, chunk 0 -> chunk 1
    assert hp.swizzle_offset(7 * 128 + 3 * 16 + 6, "128B") == 7 * 128 + (3 ^ 7) * 16 + 6
    assert hp.swizzle_offset(1024 + 128, "128B") == 1024 + 128 + 16   # repeats every 1024 B
    assert hp.swizzle_offset(3 * 128 + 16, "64B") == 3 * 128 + (1 ^ 3) * 16
    assert hp.swizzle_offset(5 * 128, "32B") == 5 * 128 + 16
    assert hp.swizzle_offset(5 * 128 + 32, "32B") == 5 * 128 + 32 + 16
    for mode, block in (("none", 256), ("32B", 256), ("64B", 512), ("128B", 1024)):
        image = [hp.swizzle_offset(o, mode) for o in range(0, 2 * block)]
        assert sorted(image[:block]) == list(range(block))       # a bijection per block
        assert all(hp.swizzle_offset(x, mode) == o for o, x in enumerate(image))  # involution
    with pytest.raises(ValueError, match="swizzle"):
        hp.swizzle_offset(0, "16B")


@pytest.mark.parametrize("swizzle, k_elems", [("none", 16), ("none", 64), ("32B", 16),
                                              ("64B", 32), ("128B", 64)])
def test_kmajor_layout_fills_the_tile_and_matches_the_descriptor(swizzle, k_elems):
    rows = 64
    lbo, sbo, k_step = hp.kmajor_strides(swizzle, k_elems)
    offs = {(r, k): hp.kmajor_offset(r, k, swizzle, k_elems)
            for r, k in itertools.product(range(rows), range(k_elems))}
    assert sorted(offs.values()) == list(range(0, 2 * rows * k_elems, 2))   # compact, 2 B each
    for (r, k), off in offs.items():
        # each 8 x 16-byte core matrix (8 rows x 8 k) sits in one 16-byte column of 8 rows
        base = off - 2 * (k % 8)
        assert base % 16 == 0
        if swizzle == "none":
            # the descriptor's walk: SBO between 8-row groups, LBO between the two k8 halves of a
            # k16 step, k_step between k16 steps, 16 bytes between rows of a core matrix
            assert off == ((r // 8) * sbo + (k // 16) * k_step + ((k % 16) // 8) * lbo
                           + (r % 8) * 16 + (k % 8) * 2)
        else:
            # unswizzled, the same walk with rows of the swizzle width; the hardware applies the
            # swizzle to the address bits, so the start can move by k_step = 32 bytes a step
            width = 2 * k_elems
            logical = (r // 8) * sbo + (r % 8) * width + (k // 16) * k_step + (k % 16) * 2
            assert off == hp.swizzle_offset(logical, swizzle)
    with pytest.raises(ValueError, match="k_elems"):
        hp.kmajor_strides("128B", 32)
    with pytest.raises(ValueError, match="k_elems"):
        hp.kmajor_strides("none", 24)
    with pytest.raises(ValueError, match="k must"):
        hp.kmajor_offset(0, k_elems, swizzle, k_elems)



@pytest.mark.parametrize("swizzle", ["32B", "64B", "128B"])
@pytest.mark.parametrize("k_rows", [16, 64, 128])
def test_mnmajor_layout_is_the_isa_canonical_form(swizzle, k_rows):
    """`mnmajor_offset` (what TMA writes for boxes of k_rows x one swizzle width, side by side)
    equals the PTX ISA's canonical MN-major layout ((T, W/T, m), (8, k)) : ((1, T, LBO),
    (W, SBO)) (elements; T = 8, W the swizzle width in elements) with `mnmajor_strides`' LBO
    and SBO, swizzled; the k16 step moves by whole 8-row groups, so descriptors of every
    k-step see the same form; the layout is compact."""
    lbo, sbo, k_step = hp.mnmajor_strides(swizzle, k_rows)
    width = {"32B": 32, "64B": 64, "128B": 128}[swizzle]
    w_elems = width // 2
    n_total = 2 * w_elems                                     # two N blocks: LBO is used
    offs = {}
    for k, n in itertools.product(range(k_rows), range(n_total)):
        off = hp.mnmajor_offset(k, n, swizzle, k_rows)
        n0, n1, n2 = n % 8, (n // 8) % (w_elems // 8), n // w_elems
        k0, k1 = k % 8, k // 8
        canon = 2 * (n0 + 8 * n1 + w_elems * k0) + n2 * lbo + k1 * sbo
        assert off == hp.swizzle_offset(canon, swizzle), (k, n)
        offs[k, n] = off
    assert sorted(offs.values()) == list(range(0, 2 * k_rows * n_total, 2))
    assert k_step == 2 * sbo and sbo == 8 * width and lbo == k_rows * width
    for k, n in itertools.product(range(16, k_rows), range(n_total)):
        # element (k, n) is element (k % 16, n) of the operand whose start is k // 16 steps on
        assert offs[k, n] == hp.swizzle_offset(
            (k // 16) * k_step + hp.swizzle_offset(offs[k % 16, n], swizzle), swizzle)


def test_mnmajor_refusals():
    with pytest.raises(ValueError, match="swizzle"):
        hp.mnmajor_strides("none", 64)
    with pytest.raises(ValueError, match="k_rows"):
        hp.mnmajor_strides("128B", 24)
    with pytest.raises(ValueError, match="k must"):
        hp.mnmajor_offset(64, 0, "128B", 64)


def test_a_register_fragment_layout():
    """wgmma's A from registers: a bijection onto the 64 x 16 tile; warp w holds rows
    16w..16w+15 in mma.m16n8k16's A layout (`kernels.fragments.a_elem`); owner is the
    inverse."""
    from kernels import fragments as fr
    seen = set()
    for t, reg, half in itertools.product(range(128), range(4), range(2)):
        row, k = hp.wgmma_a_elem(t, reg, half)
        assert 0 <= row < 64 and 0 <= k < 16 and (row, k) not in seen
        seen.add((row, k))
        assert hp.wgmma_a_owner(row, k) == (t, reg, half)
        r16, c16 = fr.a_elem(t % 32, reg, half)
        assert (row, k) == (16 * (t // 32) + r16, c16)
    assert len(seen) == 64 * 16
    with pytest.raises(ValueError, match="reg"):
        hp.wgmma_a_elem(0, 4, 0)
    with pytest.raises(ValueError, match="tile"):
        hp.wgmma_a_owner(0, 16)


@pytest.mark.parametrize("n", [64, 128])
def test_accumulator_registers_are_the_next_a_fragment(n):
    """P = softmax(S) needs no shuffle: for every k16 slice kc of an m64nNk16 accumulator, the
    registers `wgmma_p_from_d` names hold, in the same thread, exactly the A fragment of
    columns 16 kc .. 16 kc + 15."""
    for kc, t, reg, half in itertools.product(range(n // 16), range(128), range(4), range(2)):
        row, k = hp.wgmma_a_elem(t, reg, half)
        assert hp.wgmma_d_elem(t, hp.wgmma_p_from_d(kc, reg, half), n) == (row, 16 * kc + k)


def test_wide_products_are_blocks_side_by_side():
    """A tile product issues one m64nN per k-step for N = 64 n_blocks (up to 256): its
    accumulator must be the n64 blocks' registers in order, the layout the kernels index."""
    for n in (128, 192, 256):
        for t in range(128):
            for r in range(n // 2):
                row, col = hp.wgmma_d_elem(t, r % 32, 64)
                assert hp.wgmma_d_elem(t, r, n) == (row, col + 64 * (r // 32))
    assert [hp.product_blocks(nb) for nb in (1, 2, 3, 4, 8)] == [(1, 1), (1, 2), (1, 3), (1, 4),
                                                                (2, 4)]
    for bad in (0, -1):
        with pytest.raises(ValueError, match="n_blocks"):
            hp.product_blocks(bad)
    with pytest.raises(ValueError, match="n_blocks"):
        hp.product_blocks(6)                 # 6 x 64 columns: not whole 256-column products
    for dtype, n, word in (("f32", 64, "dtype"), ("f16", 96, "n"), ("bf16", 320, "n")):
        with pytest.raises(ValueError, match=word):
            hp.wgmma_ss(dtype, n)
        with pytest.raises(ValueError, match=word):
            hp.wgmma_rs(dtype, n)
    assert hp.wgmma_ss("f16", 128) is hp.wgmma_ss("f16", 128)


def test_descriptor_at_moves_the_start_address_field():
    """`descriptor_at(desc, offset)` (one add) must equal the descriptor `smem_descriptor`
    builds from the moved address (template | (addr & 0x3FFFF) >> 4) everywhere in an SM's
    228 KiB of shared memory, and leave the other fields alone."""
    from numba import uint64
    tmpl = hp.encode_wgmma_descriptor(0, 16, 1024, "128B")
    at = hp.descriptor_at.py_func
    rng = np.random.default_rng(0)
    limit = 228 * 1024
    for _ in range(2000):
        a = int(rng.integers(0, limit // 16)) * 16
        off = int(rng.integers(0, (limit - a) // 16 + 1)) * 16
        base = uint64(tmpl | ((a & 0x3FFFF) >> 4))
        moved = int(at(base, off))
        assert moved == tmpl | (((a + off) & 0x3FFFF) >> 4)
        d = hp.decode_wgmma_descriptor(moved)
        assert (d.start_address, d.leading_byte_offset, d.stride_byte_offset) == (a + off, 16, 1024)


def test_wide_products_refuse_operands_one_descriptor_cannot_span():
    k_tmpl = hp.encode_wgmma_descriptor(0, *hp.kmajor_strides("128B", 64)[:2], "128B")
    lbo, sbo, step = hp.mnmajor_strides("128B", 128)
    v_tmpl = hp.encode_wgmma_descriptor(0, lbo, sbo, "128B")
    # B rows of a K-major chunk are one 128-byte row apart only with 64-row boxes of 8 KiB
    with pytest.raises(ValueError, match="box_bytes"):
        hp.tile_product_abt("f16", 4, 2, k_tmpl, 32, 128 * 128, 4096)
    # MN-major B: the next 64 output columns must be where the template's LBO says
    with pytest.raises(ValueError, match="b_chunk_bytes"):
        hp.tile_product_ab("f16", 8, 2, v_tmpl, step, 64 * 128)
    with pytest.raises(ValueError, match="b_chunk_bytes"):
        hp.tile_product_ab("e4m3", 4, 2, k_tmpl, 32, 64 * 256)
    # one 64-column block: nothing to span, any layout
    hp.tile_product_abt("f16", 4, 1, k_tmpl, 32, 128 * 128, 4096)
    hp.tile_product_ab("f16", 8, 2, v_tmpl, step, lbo)


def test_tensor_map_4d_arguments_are_checked_before_the_driver():
    ok = dict(address=0x7F0000000000, shape=(2, 4, 100, 128), strides_bytes=(4 * 100 * 256,
              100 * 256, 256), box=(1, 1, 64, 64), dtype="uint16", swizzle="128B")
    assert hp._tensor_map_4d_args(**ok) == 2
    for change, name in [(dict(address=0x7F0000000008), "address"),
                         (dict(shape=(2, 4, 100)), "shape"),
                         (dict(strides_bytes=(0, 100 * 256, 256)), "strides_bytes"),
                         (dict(strides_bytes=(4 * 100 * 256, 100 * 256, 200)), "strides_bytes"),
                         (dict(strides_bytes=(4 * 100 * 256, 100 * 256, 128)), "strides_bytes"),
                         (dict(box=(1, 1, 300, 64)), "box"),
                         (dict(box=(1, 1, 64, 4)), "box"),
                         (dict(box=(1, 1, 64, 128)), "128B"),
                         (dict(dtype="int8"), "dtype"),
                         (dict(swizzle="16B"), "swizzle")]:
        with pytest.raises(ValueError, match=name):
            hp._tensor_map_4d_args(**{**ok, **change})

def test_setmaxnreg_counts():
    assert hp.check_maxnreg(24) == 24 and hp.check_maxnreg(256) == 256
    for bad in (16, 20, 100, 264):
        with pytest.raises(ValueError, match="setmaxnreg"):
            hp.check_maxnreg(bad)


def test_tensor_map_arguments_are_checked_before_the_driver():
    ok = dict(address=0x7F0000000000, shape=(64, 64), row_stride_bytes=128, box=(64, 64),
              dtype="float16", swizzle="128B")
    assert hp._tensor_map_args(**ok) == 2
    for change, name in [(dict(address=0x7F0000000008), "address"),
                         (dict(row_stride_bytes=120), "row_stride_bytes"),
                         (dict(row_stride_bytes=64), "row_stride_bytes"),
                         (dict(box=(64, 300)), "box"),
                         (dict(box=(64, 4)), "box"),
                         (dict(box=(64, 128), shape=(64, 128), row_stride_bytes=256), "128B"),
                         (dict(shape=(64,)), "shape"),
                         (dict(dtype="float64"), "dtype"),
                         (dict(swizzle="16B"), "swizzle")]:
        with pytest.raises(ValueError, match=name):
            hp._tensor_map_args(**{**ok, **change})


def test_module_imports_in_the_simulator():
    """CI runs Numba's CUDA simulator: importing `kernels.hopper` there works (it emits no PTX
    until a kernel using it is compiled)."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    r = subprocess.run([sys.executable, "-c", "import kernels.hopper as h; print(len(h.__all__))"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------
# The kernels (compiled on the CPU for sm_90a, run on a GPU)
# ------------------------------------------------------------------------------------------------
def _build():
    """name -> (dispatcher, signature, launch_bounds) of the kernels that use every intrinsic."""
    from numba import cuda, float32, uint16, uint32, uint64

    from kernels import ptx

    @cuda.jit(device=True, inline=True)
    def mma_64x64x64(smem, tmpl_a, tmpl_b, k_step, out):
        # A (64 x 64) at smem[0:4096], B^T (64 x 64, K-major) at smem[4096:8192], both 16-bit
        sa = ptx.shared_addr(smem, 0)
        sb = ptx.shared_addr(smem, 4096)
        acc = hp.f32_zeros(32)
        hp.wgmma_fence()
        for s in range(4):
            da = hp.smem_descriptor(tmpl_a, sa + uint32(s) * k_step)
            db = hp.smem_descriptor(tmpl_b, sb + uint32(s) * k_step)
            acc = hp.wgmma_m64n64k16_f32_f16(da, db, acc, uint32(1 if s > 0 else 0))
        hp.wgmma_commit_group()
        hp.wgmma_wait_group(0)
        t = cuda.threadIdx.x
        for i in range(32):
            out[t, i] = acc[i]

    @cuda.jit
    def wgmma_bulk(a_img, b_img, out, tmpl_a, tmpl_b, k_step):
        # a_img, b_img: the 8192-byte shared-memory images of A and B^T, copied verbatim
        smem = cuda.shared.array(8192, uint16, alignment=1024)
        bar = cuda.shared.array(1, uint64)
        sbar = ptx.shared_addr(bar, 0)
        if cuda.threadIdx.x == 0:
            hp.mbarrier_init(sbar, 1)
            hp.fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            hp.mbarrier_arrive_expect_tx(sbar, 16384)
            hp.cp_async_bulk_g2s(ptx.shared_addr(smem, 0), hp.array_addr(a_img), 8192, sbar)
            hp.cp_async_bulk_g2s(ptx.shared_addr(smem, 4096), hp.array_addr(b_img), 8192, sbar)
        hp.mbarrier_wait_parity(sbar, 0)
        mma_64x64x64(smem, tmpl_a, tmpl_b, k_step, out)

    @cuda.jit
    def wgmma_stores(a_img, b_img, out, tmpl_a, tmpl_b, k_step):
        # the same images written by ordinary shared stores, handed to wgmma by the proxy fence
        smem = cuda.shared.array(8192, uint16, alignment=1024)
        t = cuda.threadIdx.x
        for i in range(t, 4096, 128):
            smem[i] = a_img[i]
            smem[4096 + i] = b_img[i]
        hp.fence_proxy_async()
        cuda.syncthreads()
        mma_64x64x64(smem, tmpl_a, tmpl_b, k_step, out)

    @cuda.jit
    def wgmma_tma(tmap_a, tmap_b, out, tmpl_a, tmpl_b, k_step):
        # tmap_a, tmap_b: 2-D tensor maps (16 x uint64 in global memory) of row-major A and B^T
        smem = cuda.shared.array(8192, uint16, alignment=1024)
        bar = cuda.shared.array(1, uint64)
        sbar = ptx.shared_addr(bar, 0)
        ga = hp.array_addr(tmap_a)
        gb = hp.array_addr(tmap_b)
        if cuda.threadIdx.x == 0:
            hp.fence_proxy_tensormap_acquire(ga)
            hp.fence_proxy_tensormap_acquire(gb)
            hp.mbarrier_init(sbar, 1)
            hp.fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            hp.mbarrier_arrive_expect_tx(sbar, 16384)
            hp.cp_async_bulk_tensor_2d_g2s(ptx.shared_addr(smem, 0), ga, 0, 0, sbar)
            hp.cp_async_bulk_tensor_2d_g2s(ptx.shared_addr(smem, 4096), gb, 0, 0, sbar)
        hp.mbarrier_wait_parity(sbar, 0)
        mma_64x64x64(smem, tmpl_a, tmpl_b, k_step, out)

    @cuda.jit
    def barrier_phases(out):
        # 128 arrivals a phase, two phases; try_wait polled by hand in the second
        bar = cuda.shared.array(1, uint64)
        sbar = ptx.shared_addr(bar, 0)
        t = cuda.threadIdx.x
        if t == 0:
            hp.mbarrier_init(sbar, 128)
        cuda.syncthreads()
        hp.mbarrier_arrive(sbar)
        hp.mbarrier_wait_parity(sbar, 0)
        out[t] = 1
        hp.mbarrier_arrive(sbar)
        polls = 1
        while hp.mbarrier_try_wait_parity(sbar, 1) == 0:
            polls += 1
        out[t] += 1
        out[128 + t] = polls

    @cuda.jit
    def maxnreg(out):
        # FlashAttention-3's register split for three warpgroups: the producer gives registers
        # back (24), the two consumers take them (240): 24*128 + 240*256 = 168 * 384, the
        # block's allocation at launch with launch_bounds=(384, 1)
        t = cuda.threadIdx.x
        if t < 128:
            hp.setmaxnreg_dec(24)
            out[t] = float32(t) * 2.0
        else:
            hp.setmaxnreg_inc(240)
            out[t] = float32(t) * 3.0

    @cuda.jit
    def copies(src, tmap, c0, c1, out1, out2):
        # a 1-D bulk copy of src (4096 uint16) and one 64 x 64 box of a 2-D tensor map (no
        # swizzle) at column c0, row c1, both completing on one barrier; the bytes written back
        smem = cuda.shared.array(8192, uint16, alignment=128)
        bar = cuda.shared.array(1, uint64)
        sbar = ptx.shared_addr(bar, 0)
        g = hp.array_addr(tmap)
        t = cuda.threadIdx.x
        if t == 0:
            hp.fence_proxy_tensormap_acquire(g)
            hp.mbarrier_init(sbar, 1)
            hp.fence_mbarrier_init()
        cuda.syncthreads()
        if t == 0:
            hp.mbarrier_arrive_expect_tx(sbar, 16384)
            hp.cp_async_bulk_g2s(ptx.shared_addr(smem, 0), hp.array_addr(src), 8192, sbar)
            hp.cp_async_bulk_tensor_2d_g2s(ptx.shared_addr(smem, 4096), g, c0, c1, sbar)
        hp.mbarrier_wait_parity(sbar, 0)
        for i in range(t, 4096, cuda.blockDim.x):
            out1[i] = smem[i]
            out2[i] = smem[4096 + i]

    @cuda.jit
    def wait_groups(out):
        # the other constant forms of the wait (no wgmma pending: returns at once)
        hp.wgmma_fence()
        hp.wgmma_commit_group()
        hp.wgmma_wait_group(1)
        hp.wgmma_wait_group(7)
        out[cuda.threadIdx.x] = 1.0

    @cuda.jit
    def wgmma_bulk_bf16(a_img, b_img, out, tmpl_a, tmpl_b, k_step):
        # wgmma_bulk with bfloat16 operands (the tuple-form bf16 intrinsic)
        smem = cuda.shared.array(8192, uint16, alignment=1024)
        bar = cuda.shared.array(1, uint64)
        sbar = ptx.shared_addr(bar, 0)
        if cuda.threadIdx.x == 0:
            hp.mbarrier_init(sbar, 1)
            hp.fence_mbarrier_init()
        cuda.syncthreads()
        if cuda.threadIdx.x == 0:
            hp.mbarrier_arrive_expect_tx(sbar, 16384)
            hp.cp_async_bulk_g2s(ptx.shared_addr(smem, 0), hp.array_addr(a_img), 8192, sbar)
            hp.cp_async_bulk_g2s(ptx.shared_addr(smem, 4096), hp.array_addr(b_img), 8192, sbar)
        hp.mbarrier_wait_parity(sbar, 0)
        sa = ptx.shared_addr(smem, 0)
        sb = ptx.shared_addr(smem, 4096)
        acc = hp.f32_zeros(32)
        hp.wgmma_fence()
        for s in range(4):
            da = hp.smem_descriptor(tmpl_a, sa + uint32(s) * k_step)
            db = hp.smem_descriptor(tmpl_b, sb + uint32(s) * k_step)
            acc = hp.wgmma_m64n64k16_f32_bf16(da, db, acc, uint32(1 if s > 0 else 0))
        hp.wgmma_commit_group()
        hp.wgmma_wait_group(0)
        t = cuda.threadIdx.x
        for i in range(32):
            out[t, i] = acc[i]

    def make_ss_tma4d(bf16):
        mma = hp.wgmma_ss_bf16 if bf16 else hp.wgmma_ss_f16

        @cuda.jit
        def ss_tma4d(tmap_a, tmap_b, head_a, out, tmpl, k_step):
            # A: box (64 rows x 64) of head ``head_a`` of a [1, H, 64, 64] 4-D map; B^T: the
            # first 64 rows of a [1, 1, Nb, 64] map (rows past Nb zero-filled); the in-place
            # product into acc[32:64] (acc[0:32] untouched), then the operand fence
            smem = cuda.shared.array(8192, uint16, alignment=1024)
            bar = cuda.shared.array(1, uint64)
            sbar = ptx.shared_addr(bar, 0)
            ga = hp.array_addr(tmap_a)
            gb = hp.array_addr(tmap_b)
            t = cuda.threadIdx.x
            if t == 0:
                hp.fence_proxy_tensormap_acquire(ga)
                hp.fence_proxy_tensormap_acquire(gb)
                hp.mbarrier_init(sbar, 1)
                hp.fence_mbarrier_init()
            cuda.syncthreads()
            if t == 0:
                hp.mbarrier_arrive_expect_tx(sbar, 16384)
                hp.cp_async_bulk_tensor_4d_g2s(ptx.shared_addr(smem, 0), ga, 0, 0, head_a, 0,
                                               sbar)
                hp.cp_async_bulk_tensor_4d_g2s(ptx.shared_addr(smem, 4096), gb, 0, 0, 0, 0,
                                               sbar)
            hp.mbarrier_wait_parity(sbar, 0)
            acc = cuda.local.array(64, float32)
            for i in range(64):
                acc[i] = float32(-1.0)
            sa = ptx.shared_addr(smem, 0)
            sb = ptx.shared_addr(smem, 4096)
            hp.wgmma_fence()
            for s in range(4):
                da = hp.smem_descriptor(tmpl, sa + uint32(s) * k_step)
                db = hp.smem_descriptor(tmpl, sb + uint32(s) * k_step)
                mma(acc, 32, da, db, uint32(1 if s > 0 else 0))
            hp.wgmma_commit_group()
            hp.wgmma_wait_group(0)
            hp.wgmma_fence_operands(acc, 32, 32)
            for i in range(64):
                out[t, i] = acc[i]
        return ss_tma4d

    def make_rs_mn(bf16):
        mma = hp.wgmma_rs_mn_bf16 if bf16 else hp.wgmma_rs_mn_f16

        @cuda.jit
        def rs_mn(tmap_b, a_words, out, tmpl_b):
            # A (64 x 64) from registers: a_words[t, 4 s + r] is thread t's register r of k-step
            # s (packed on the host by wgmma_a_elem); B (K = 64 x N = 128, N contiguous: as V
            # [keys, d]) by two 64-column boxes of a 4-D map into 64 x 128-byte swizzled rows,
            # box c at 8192 c; D = A B in acc[0:64] (two n64 halves), B MN-major
            smem = cuda.shared.array(8192, uint16, alignment=1024)
            bar = cuda.shared.array(1, uint64)
            sbar = ptx.shared_addr(bar, 0)
            g = hp.array_addr(tmap_b)
            t = cuda.threadIdx.x
            if t == 0:
                hp.fence_proxy_tensormap_acquire(g)
                hp.mbarrier_init(sbar, 1)
                hp.fence_mbarrier_init()
            cuda.syncthreads()
            if t == 0:
                hp.mbarrier_arrive_expect_tx(sbar, 16384)
                hp.cp_async_bulk_tensor_4d_g2s(ptx.shared_addr(smem, 0), g, 0, 0, 0, 0, sbar)
                hp.cp_async_bulk_tensor_4d_g2s(ptx.shared_addr(smem, 4096), g, 64, 0, 0, 0,
                                               sbar)
            hp.mbarrier_wait_parity(sbar, 0)
            acc = cuda.local.array(64, float32)
            sb = ptx.shared_addr(smem, 0)
            hp.wgmma_fence()
            for s in range(4):
                for c in range(2):
                    db = hp.smem_descriptor(tmpl_b, sb + uint32(8192 * c + 2048 * s))
                    mma(acc, 32 * c, a_words[t, 4 * s], a_words[t, 4 * s + 1],
                        a_words[t, 4 * s + 2], a_words[t, 4 * s + 3], db,
                        uint32(1 if s > 0 else 0))
            hp.wgmma_commit_group()
            hp.wgmma_wait_group(0)
            hp.wgmma_fence_operands(acc, 0, 64)
            for i in range(64):
                out[t, i] = acc[i]
        return rs_mn

    img = "void(uint16[::1], uint16[::1], float32[:, ::1], uint64, uint64, uint32)"
    tma = "void(uint64[::1], uint64[::1], float32[:, ::1], uint64, uint64, uint32)"
    ss4 = "void(uint64[::1], uint64[::1], int32, float32[:, ::1], uint64, uint32)"
    rs = "void(uint64[::1], uint32[:, ::1], float32[:, ::1], uint64)"
    return {"wgmma_bulk": (wgmma_bulk, img, None), "wgmma_stores": (wgmma_stores, img, None),
            "wgmma_tma": (wgmma_tma, tma, None),
            "barrier_phases": (barrier_phases, "void(int32[::1])", None),
            "maxnreg": (maxnreg, "void(float32[::1])", (384, 1)),
            # the same kernel with .maxntid only: ptxas ignores setmaxnreg (C7508)
            "maxnreg_maxntid_only": (maxnreg, "void(float32[::1])", (384,)),
            "copies": (copies, "void(uint16[::1], uint64[::1], int32, int32, uint16[::1], "
                               "uint16[::1])", None),
            "wait_groups": (wait_groups, "void(float32[::1])", None),
            "wgmma_bulk_bf16": (wgmma_bulk_bf16, img, None),
            "wgmma_ss_tma4d_f16": (make_ss_tma4d(False), ss4, None),
            "wgmma_ss_tma4d_bf16": (make_ss_tma4d(True), ss4, None),
            "rs_mn_f16": (make_rs_mn(False), rs, None),
            "rs_mn_bf16": (make_rs_mn(True), rs, None)}


def compile_all_sm90a(outdir) -> dict:
    """PTX (``cc=(9, 0, "a")``) of every kernel of `_build`, written to ``outdir/<name>.ptx``;
    returns name -> the ``.target`` line. Run in a process without the CUDA simulator; NVRTC
    is not needed (the targets are named: `benchmarks.common.allow_offline_compile`)."""
    from numba import cuda

    from benchmarks.common import allow_offline_compile
    allow_offline_compile()
    targets = {}
    for name, (kern, sig, bounds) in _build().items():
        kwargs = {"launch_bounds": bounds} if bounds else {}
        ptx_text, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0, "a"), **kwargs)
        Path(outdir, name + ".ptx").write_text(ptx_text)
        targets[name] = next(ln for ln in ptx_text.splitlines() if ln.startswith(".target"))
    return targets


@pytest.fixture(scope="module")
def sm90a_ptx(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90a")
    ptxas, launch = compile_sm90a_in_child("tests.test_hopper_intrinsics", "compile_all_sm90a",
                                           out, timeout=600)
    return out, ptxas, launch


KERNELS = ("wgmma_bulk", "wgmma_stores", "wgmma_tma", "barrier_phases", "maxnreg", "copies",
           "wait_groups", "wgmma_bulk_bf16", "wgmma_ss_tma4d_f16", "wgmma_ss_tma4d_bf16",
           "rs_mn_f16", "rs_mn_bf16")
#: wgmma.mma_async instructions each kernel's PTX holds (its loops unrolled)
WGMMA_COUNT = {"wgmma_bulk": 4, "wgmma_stores": 4, "wgmma_tma": 4, "wgmma_bulk_bf16": 4,
               "wgmma_ss_tma4d_f16": 4, "wgmma_ss_tma4d_bf16": 4, "rs_mn_f16": 8,
               "rs_mn_bf16": 8}
#: what each kernel's PTX must contain (the intrinsics it uses, as emitted)
EXPECTED_PTX = {
    "wgmma_bulk": ["mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster",
                   "mbarrier.arrive.expect_tx.shared::cta.b64",
                   "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes",
                   "mbarrier.try_wait.parity.shared::cta.b64", "wgmma.fence.sync.aligned",
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
                   "wgmma.commit_group.sync.aligned", "wgmma.wait_group.sync.aligned 0",
                   ".align 1024"],
    "wgmma_stores": ["fence.proxy.async.shared::cta", "wgmma.mma_async"],
    "wgmma_tma": ["fence.proxy.tensormap::generic.acquire.gpu",
                  "cp.async.bulk.tensor.2d.shared::cluster.global.tile"
                  ".mbarrier::complete_tx::bytes",
                  "wgmma.mma_async"],
    "barrier_phases": ["mbarrier.arrive.shared::cta.b64", "mbarrier.try_wait.parity"],
    "maxnreg": ["setmaxnreg.dec.sync.aligned.u32 24", "setmaxnreg.inc.sync.aligned.u32 240",
                ".maxntid 384, 1, 1", ".minnctapersm 1"],
    "copies": ["cp.async.bulk.shared::cluster.global", "cp.async.bulk.tensor.2d"],
    "wait_groups": ["wgmma.wait_group.sync.aligned 1", "wgmma.wait_group.sync.aligned 7"],
    "wgmma_bulk_bf16": ["wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"],
    "wgmma_ss_tma4d_f16": ["cp.async.bulk.tensor.4d.shared::cluster.global.tile"
                           ".mbarrier::complete_tx::bytes",
                           "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
                           ", p, 1, 1, 0, 0;"],
    "wgmma_ss_tma4d_bf16": ["cp.async.bulk.tensor.4d", "m64n64k16.f32.bf16.bf16"],
    # A from four registers ({...} after the accumulator), B transposed: imm-trans-b = 1
    "rs_mn_f16": ["cp.async.bulk.tensor.4d", "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
                  ", p, 1, 1, 1;"],
    "rs_mn_bf16": ["m64n64k16.f32.bf16.bf16", ", p, 1, 1, 1;"],
}


def _assemble(ptxas, ptx_path, arch):
    cubin = ptx_path.with_suffix(f".{arch}.cubin")
    r = subprocess.run([ptxas, "-v", f"-arch={arch}", str(ptx_path), "-o", str(cubin)],
                       capture_output=True, text=True, timeout=600)
    return r, cubin


@pytest.mark.parametrize("name", KERNELS)
def test_compiles_and_assembles_for_sm90a(sm90a_ptx, name):
    outdir, ptxas, targets = sm90a_ptx
    assert targets[name] == ".target sm_90a"
    ptx_text = (outdir / f"{name}.ptx").read_text()
    for text in EXPECTED_PTX[name]:
        assert text in ptx_text, text
    if name in WGMMA_COUNT:
        assert ptx_text.count("wgmma.mma_async") == WGMMA_COUNT[name]   # the loops, unrolled
    r, cubin = _assemble(ptxas, outdir / f"{name}.ptx", "sm_90a")
    assert r.returncode == 0, r.stderr[-4000:]
    assert cubin.stat().st_size > 0
    from benchmarks.common import parse_ptxas
    (entry,) = parse_ptxas(r.stderr)
    assert entry["spill_store_bytes"] == 0 and entry["stack_frame_bytes"] == 0, r.stderr
    if name in WGMMA_COUNT:
        # no serialisation of the wgmma pipeline (ptxas says so when it inserts waits)
        assert "serializ" not in r.stderr.lower(), r.stderr
    if name == "maxnreg":
        # the block's registers at launch are what the split redistributes: 168 a thread
        # for 384 threads; .inc 240 would otherwise wait for ever
        assert "setmaxnreg' ignored" not in r.stderr, r.stderr
        assert entry["registers_per_thread"] == 168, r.stderr
        assert 24 * 128 + 240 * 256 <= 168 * 384


def test_setmaxnreg_needs_min_blocks_in_the_launch_bounds(sm90a_ptx):
    """``launch_bounds=(384,)`` (``.maxntid`` alone) is not enough: ptxas cannot tell the
    register count at entry and drops setmaxnreg (C7508); ``(384, 1)`` keeps it."""
    outdir, ptxas, _ = sm90a_ptx
    r, _ = _assemble(ptxas, outdir / "maxnreg_maxntid_only.ptx", "sm_90a")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "setmaxnreg' ignored" in r.stderr, r.stderr


def test_which_instructions_need_sm90a(sm90a_ptx):
    """Why the ``a``: the same PTX with ``.target sm_90`` does not assemble where it uses wgmma
    or setmaxnreg; mbarrier, the bulk copies (1-D and tensor-map) and the fences are plain
    sm_90 instructions."""
    outdir, ptxas, _ = sm90a_ptx
    refused = {"wgmma_bulk": ["wgmma.fence", "wgmma.mma_async", "wgmma.commit_group",
                              "wgmma.wait_group"],
               "maxnreg": ["setmaxnreg.dec", "setmaxnreg.inc"]}
    for name in ("wgmma_bulk", "maxnreg", "barrier_phases", "copies"):
        text = (outdir / f"{name}.ptx").read_text().replace(".target sm_90a", ".target sm_90")
        path = outdir / f"{name}.sm90.ptx"
        path.write_text(text)
        r, _ = _assemble(ptxas, path, "sm_90")
        if name in refused:
            assert r.returncode != 0
            for instr in refused[name]:
                assert f"Instruction '{instr}" in r.stderr, (instr, r.stderr[-2000:])
            assert "not supported on .target 'sm_90'" in r.stderr
        else:
            assert r.returncode == 0, r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------------
def _need_sm90():
    skip_unless_hopper("wgmma, TMA, setmaxnreg")


def _problem(seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((64, K_TOTAL)).astype(np.float16)
    b = rng.standard_normal((K_TOTAL, 64)).astype(np.float16)
    return a, b


def _image(tile_rows_by_k, swizzle):
    """The 8192-byte shared-memory image (as 4096 uint16) of a 64 x 64 K-major tile."""
    bits = tile_rows_by_k.view(np.uint16)
    img = np.zeros(4096, np.uint16)
    for r, k in itertools.product(range(64), range(K_TOTAL)):
        img[hp.kmajor_offset(r, k, swizzle, K_TOTAL) // 2] = bits[r, k]
    return img


def _templates(swizzle):
    lbo, sbo, k_step = hp.kmajor_strides(swizzle, K_TOTAL)
    tmpl = hp.encode_wgmma_descriptor(0, lbo, sbo, swizzle)
    return np.uint64(tmpl), np.uint64(tmpl), np.uint32(k_step)


def _check(out, a, b):
    got = np.zeros((64, 64))
    for t, i in itertools.product(range(128), range(32)):
        got[hp.wgmma_d_elem(t, i)] = out[t, i]
    want = a.astype(np.float64) @ b.astype(np.float64)
    # exact half products, float32 accumulation of 64 terms of size ~1: a few ulp of ~8
    np.testing.assert_allclose(got, want, rtol=0, atol=64 * 8 * 2.0**-23)


@pytest.mark.gpu
@pytest.mark.parametrize("loader", ["wgmma_bulk", "wgmma_stores"])
@pytest.mark.parametrize("swizzle", ["none", "128B"])
def test_wgmma_from_shared_memory_matches_float64(loader, swizzle):
    _need_sm90()
    from numba import cuda
    kern = _build()[loader][0]
    for seed in range(3):
        a, b = _problem(seed)
        out = cuda.to_device(np.zeros((128, 32), np.float32))
        kern[1, 128](cuda.to_device(_image(a, swizzle)),
                     cuda.to_device(_image(np.ascontiguousarray(b.T), swizzle)), out,
                     *_templates(swizzle))
        _check(out.copy_to_host(), a, b)


def _device_address(d_arr) -> int:
    return int(d_arr.__cuda_array_interface__["data"][0])


@pytest.mark.gpu
def test_wgmma_from_tma_tensor_maps_matches_float64():
    """FlashAttention-3's load path: row-major A and B^T in global memory, one 64 x 64 box each
    by ``cp.async.bulk.tensor.2d`` with the 128-byte swizzle, straight into wgmma."""
    _need_sm90()
    from numba import cuda
    kern = _build()["wgmma_tma"][0]
    a, b = _problem(7)
    d_a = cuda.to_device(a.view(np.uint16))
    d_bt = cuda.to_device(np.ascontiguousarray(b.T).view(np.uint16))
    maps = [hp.encode_tensor_map_2d(_device_address(d), (64, 64), 128, (64, 64), "float16",
                                    "128B") for d in (d_a, d_bt)]
    out = cuda.to_device(np.zeros((128, 32), np.float32))
    kern[1, 128](cuda.to_device(maps[0]), cuda.to_device(maps[1]), out, *_templates("128B"))
    _check(out.copy_to_host(), a, b)


def _bf16_round(x):
    """float32 values rounded to bfloat16 (nearest even): (the bits as uint16, the values as
    float64)."""
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    top = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    vals = (top.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return top, vals


def _half_bits(x, bf16):
    """(uint16 bits, float64 values) of ``x`` in float16 or bfloat16."""
    if bf16:
        return _bf16_round(x)
    h = np.asarray(x, np.float16)
    return h.view(np.uint16), h.astype(np.float64)


def _assert_product(got, want, what):
    err = np.abs(got - want)
    idx = np.unravel_index(int(np.argmax(err)), err.shape)
    tol = 64 * 8 * 2.0**-23
    assert err[idx] <= tol, (f"{what}: max |error| {err[idx]:.3g} at (row, col) {idx}: got "
                             f"{got[idx]:.6g}, want {want[idx]:.6g}")


@pytest.mark.gpu
def test_wgmma_bf16_from_shared_memory_matches_float64():
    _need_sm90()
    from numba import cuda
    kern = _build()["wgmma_bulk_bf16"][0]
    rng = np.random.default_rng(11)
    a_bits, a = _bf16_round(rng.standard_normal((64, K_TOTAL)))
    b_bits, b = _bf16_round(rng.standard_normal((K_TOTAL, 64)))
    out = cuda.to_device(np.zeros((128, 32), np.float32))
    kern[1, 128](cuda.to_device(_image(a_bits.view(np.float16), "128B")),
                 cuda.to_device(_image(np.ascontiguousarray(b_bits.T).view(np.float16), "128B")),
                 out, *_templates("128B"))
    got = np.zeros((64, 64))
    host_out = out.copy_to_host()
    for t, i in itertools.product(range(128), range(32)):
        got[hp.wgmma_d_elem(t, i)] = host_out[t, i]
    _assert_product(got, a @ b, "bf16 wgmma")


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_wgmma_in_place_from_4d_tensor_maps(bf16):
    """`wgmma_ss_*` in place on acc[32:64] (acc[0:32] left alone), A = head 1 of a [1, 2, 64,
    64] tensor by a 4-D map (the head coordinate), B^T = a [1, 1, 40, 64] tensor read as a
    64-row box (rows 40..63 zero-filled: those output columns are 0), both 128-byte swizzled."""
    _need_sm90()
    from numba import cuda
    kern = _build()["wgmma_ss_tma4d_bf16" if bf16 else "wgmma_ss_tma4d_f16"][0]
    rng = np.random.default_rng(12 + bf16)
    a_bits, a = _half_bits(rng.standard_normal((1, 2, 64, 64)), bf16)
    bt_bits, bt = _half_bits(rng.standard_normal((1, 1, 40, 64)), bf16)
    d_a, d_bt = cuda.to_device(a_bits), cuda.to_device(bt_bits)
    map_a = hp.encode_tensor_map_4d(_device_address(d_a), (1, 2, 64, 64),
                                    (2 * 64 * 128, 64 * 128, 128), (1, 1, 64, 64), "uint16",
                                    "128B")
    map_b = hp.encode_tensor_map_4d(_device_address(d_bt), (1, 1, 40, 64),
                                    (40 * 128, 40 * 128, 128), (1, 1, 64, 64), "uint16", "128B")
    tmpl, _, k_step = _templates("128B")
    out = cuda.to_device(np.zeros((128, 64), np.float32))
    kern[1, 128](cuda.to_device(map_a), cuda.to_device(map_b), np.int32(1), out, tmpl, k_step)
    host_out = out.copy_to_host()
    assert (host_out[:, :32] == -1).all(), "the in-place product wrote outside acc[32:64]"
    got = np.zeros((64, 64))
    for t, i in itertools.product(range(128), range(32)):
        got[hp.wgmma_d_elem(t, i)] = host_out[t, 32 + i]
    want = np.zeros((64, 64))
    want[:, :40] = a[0, 1] @ bt[0, 0].T
    _assert_product(got, want, "in-place SS wgmma from 4-D maps")


@pytest.mark.gpu
@pytest.mark.parametrize("bf16", [False, True])
def test_wgmma_a_from_registers_b_mn_major_matches_float64(bf16):
    """O += P V's instruction: A (64 x 64) from registers in `wgmma_a_elem`'s layout, B (64 x
    128, N contiguous, as V [keys, d]) landed by two 64-column TMA boxes with the 128-byte
    swizzle and read MN-major (``imm-trans-b = 1``, `mnmajor_strides`: LBO between the boxes,
    SBO = 1024 between 8-row groups, k-steps of 2048 bytes), D in place in two n64 halves."""
    _need_sm90()
    from numba import cuda
    kern = _build()["rs_mn_bf16" if bf16 else "rs_mn_f16"][0]
    rng = np.random.default_rng(21 + bf16)
    a_bits, a = _half_bits(rng.standard_normal((64, 64)), bf16)
    b_bits, b = _half_bits(rng.standard_normal((64, 128)), bf16)
    words = np.zeros((128, 16), np.uint32)
    for t, s, reg in itertools.product(range(128), range(4), range(2 * 2)):
        lo = a_bits[hp.wgmma_a_elem(t, reg, 0)[0], 16 * s + hp.wgmma_a_elem(t, reg, 0)[1]]
        hi = a_bits[hp.wgmma_a_elem(t, reg, 1)[0], 16 * s + hp.wgmma_a_elem(t, reg, 1)[1]]
        words[t, 4 * s + reg] = int(lo) | int(hi) << 16
    d_b = cuda.to_device(np.ascontiguousarray(b_bits))
    map_b = hp.encode_tensor_map_4d(_device_address(d_b), (1, 1, 64, 128),
                                    (64 * 256, 64 * 256, 256), (1, 1, 64, 64), "uint16", "128B")
    lbo, sbo, k_step = hp.mnmajor_strides("128B", 64)
    assert (lbo, sbo, k_step) == (8192, 1024, 2048)     # what the kernel adds by hand
    tmpl = np.uint64(hp.encode_wgmma_descriptor(0, lbo, sbo, "128B"))
    out = cuda.to_device(np.zeros((128, 64), np.float32))
    kern[1, 128](cuda.to_device(map_b), cuda.to_device(words), out, tmpl)
    host_out = out.copy_to_host()
    got = np.zeros((64, 128))
    for t, i in itertools.product(range(128), range(64)):
        row, col = hp.wgmma_d_elem(t, i % 32)
        got[row, col + 64 * (i // 32)] = host_out[t, i]
    _assert_product(got, a @ b, "wgmma A from registers, B MN-major")

@pytest.mark.gpu
def test_bulk_copies_move_the_bytes():
    """The copies alone, bit for bit: a 1-D bulk copy, and a 64 x 64 tensor-map box (no
    swizzle) hanging over the bottom and right edges of a 100 x 72 matrix (zero-filled
    there)."""
    _need_sm90()
    from numba import cuda
    kern = _build()["copies"][0]
    rng = np.random.default_rng(3)
    src = rng.integers(1, 65535, 4096).astype(np.uint16)
    mat = rng.integers(1, 65535, (100, 72)).astype(np.uint16)
    d_mat = cuda.to_device(mat)
    tmap = hp.encode_tensor_map_2d(_device_address(d_mat), (100, 72), 144, (64, 64), "uint16")
    c0, c1 = 16, 48                                   # column, row of the box's corner
    out1 = cuda.to_device(np.zeros(4096, np.uint16))
    out2 = cuda.to_device(np.zeros(4096, np.uint16))
    kern[1, 128](cuda.to_device(src), cuda.to_device(tmap), np.int32(c0), np.int32(c1), out1,
                 out2)
    np.testing.assert_array_equal(out1.copy_to_host(), src)
    want = np.zeros((64, 64), np.uint16)
    part = mat[c1:c1 + 64, c0:c0 + 64]
    want[:part.shape[0], :part.shape[1]] = part
    np.testing.assert_array_equal(out2.copy_to_host().reshape(64, 64), want)


@pytest.mark.gpu
def test_mbarrier_phases():
    _need_sm90()
    from numba import cuda
    kern = _build()["barrier_phases"][0]
    out = cuda.to_device(np.zeros(256, np.int32))
    kern[1, 128](out)
    got = out.copy_to_host()
    assert (got[:128] == 2).all()
    assert (got[128:] >= 1).all()


@pytest.mark.gpu
def test_setmaxnreg_smoke():
    """Three warpgroups, the producer/consumer register split of FlashAttention-3 (24 / 240):
    the kernel runs to the end and every warpgroup wrote its part."""
    _need_sm90()
    from numba import cuda
    kern = cuda.jit(launch_bounds=(384, 1))(_build()["maxnreg"][0].py_func)
    out = cuda.to_device(np.zeros(384, np.float32))
    kern[1, 384](out)
    cuda.synchronize()
    t = np.arange(384, dtype=np.float32)
    np.testing.assert_array_equal(out.copy_to_host(), np.where(t < 128, 2 * t, 3 * t))


@pytest.mark.gpu
def test_wait_group_constants():
    _need_sm90()
    from numba import cuda
    kern = _build()["wait_groups"][0]
    out = cuda.to_device(np.zeros(128, np.float32))
    kern[1, 128](out)
    assert (out.copy_to_host() == 1).all()
