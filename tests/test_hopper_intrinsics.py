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
  phases; ``setmaxnreg`` in a two-warpgroup kernel.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernels import hopper as hp

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

    img = "void(uint16[::1], uint16[::1], float32[:, ::1], uint64, uint64, uint32)"
    tma = "void(uint64[::1], uint64[::1], float32[:, ::1], uint64, uint64, uint32)"
    return {"wgmma_bulk": (wgmma_bulk, img, None), "wgmma_stores": (wgmma_stores, img, None),
            "wgmma_tma": (wgmma_tma, tma, None),
            "barrier_phases": (barrier_phases, "void(int32[::1])", None),
            "maxnreg": (maxnreg, "void(float32[::1])", (384, 1)),
            # the same kernel with .maxntid only: ptxas ignores setmaxnreg (C7508)
            "maxnreg_maxntid_only": (maxnreg, "void(float32[::1])", (384,)),
            "copies": (copies, "void(uint16[::1], uint64[::1], int32, int32, uint16[::1], "
                               "uint16[::1])", None),
            "wait_groups": (wait_groups, "void(float32[::1])", None)}


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


def _ptxas():
    from benchmarks.common import find_ptxas
    return find_ptxas()


def _nvvm_missing() -> str | None:
    """Why Numba cannot reach NVVM in a fresh process, or None when it can."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    r = subprocess.run([sys.executable, "-c",
                        "from numba.cuda.cudadrv import nvvm; print(nvvm.NVVM().get_version())"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


@pytest.fixture(scope="module")
def sm90a_ptx(tmp_path_factory):
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) not available")
    why = _nvvm_missing()
    if why:
        pytest.skip(f"NVVM not available to Numba: {why}")
    out = tmp_path_factory.mktemp("sm90a")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    code = ("import json, sys; from tests.test_hopper_intrinsics import compile_all_sm90a; "
            "print(json.dumps(compile_all_sm90a(sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out, ptxas, json.loads(r.stdout.strip().splitlines()[-1])


KERNELS = ("wgmma_bulk", "wgmma_stores", "wgmma_tma", "barrier_phases", "maxnreg", "copies",
           "wait_groups")
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
    if name.startswith("wgmma_"):
        assert ptx_text.count("wgmma.mma_async") == 4          # the k loop, unrolled
    r, cubin = _assemble(ptxas, outdir / f"{name}.ptx", "sm_90a")
    assert r.returncode == 0, r.stderr[-4000:]
    assert cubin.stat().st_size > 0
    from benchmarks.common import parse_ptxas
    (entry,) = parse_ptxas(r.stderr)
    assert entry["spill_store_bytes"] == 0 and entry["stack_frame_bytes"] == 0, r.stderr
    if name.startswith("wgmma_"):
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
    from numba import cuda
    cc = cuda.get_current_device().compute_capability
    if tuple(cc) < (9, 0):
        pytest.skip(f"needs compute capability 9.0 (wgmma, TMA, setmaxnreg); this GPU is {cc}")


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
