"""Hopper (sm_90a) instructions as Numba intrinsics, with their layouts as plain Python.

The instructions a FlashAttention-3-style kernel is built from, each emitted as inline PTX
through llvmlite's ``ir.InlineAsm`` in the style of `kernels.ptx`:

* **mbarrier** (a 64-bit barrier in shared memory that also counts transaction bytes):
  ``mbarrier_init(bar, count)``, ``mbarrier_arrive(bar)``,
  ``mbarrier_arrive_expect_tx(bar, nbytes)``, ``mbarrier_try_wait_parity(bar, parity)`` (1 when
  the phase of that parity has completed, else 0) and the device function
  ``mbarrier_wait_parity(bar, parity)`` that loops on it; ``fence_mbarrier_init()``
  (``fence.mbarrier_init.release.cluster``: make an initialised barrier visible to the async
  proxy before a copy completes on it).
* **proxy fences**: ``fence_proxy_async()`` (``fence.proxy.async.shared::cta``: shared memory
  written by ordinary stores becomes visible to ``wgmma`` / bulk copies) and
  ``fence_proxy_tensormap_acquire(tmap)`` (a tensor map written to global memory by the host
  becomes visible to the tensor-map proxy).
* **bulk copies** (the TMA unit): ``cp_async_bulk_g2s(dst, src, nbytes, bar)``, a 1-D copy of
  ``nbytes`` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory
  that completes ``nbytes`` transactions on ``bar``; ``cp_async_bulk_tensor_2d_g2s(dst, tmap,
  c0, c1, bar)``, one box of a 2-D tensor map at element coordinates (c0 innermost, c1) into
  shared memory, swizzled as the map says. The tensor map is made on the host
  (`encode_tensor_map_2d`, ``cuTensorMapEncodeTiled`` through ``cuda.bindings.driver``) and
  passed in global memory (a 16-word uint64 device array, `array_addr` gives its address).
* **wgmma** (one warpgroup = four consecutive warps, 128 threads, all executing it):
  ``wgmma_fence()``, ``wgmma_commit_group()``, ``wgmma_wait_group(n)`` (``n`` a compile-time
  constant, 0..7) and ``wgmma_m64n64k16_f32_f16(desc_a, desc_b, acc, scale_d)``:
  ``wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16``, D = A B (+ D when ``scale_d`` is
  non-zero), A (64 x 16) and B (16 x 64) both read from shared memory through 64-bit matrix
  descriptors, both K-major (no transpose), ``acc`` a 32-tuple of float32 (the accumulator
  fragment, `wgmma_d_elem`); ``f32_zeros(32)`` makes a zero accumulator. Start it with
  ``wgmma_fence()``, close the group with ``wgmma_commit_group()`` and read the result only
  after ``wgmma_wait_group(0)``. ``wgmma_m64n64k16_f32_bf16``: the same for bfloat16.
* **wgmma in place** (what `kernels.wgmma_fwd` uses): the accumulator is 32 float32 of a 1-D
  local array from ``base`` on (registers once the kernel's loops are unrolled), updated in
  place: ``wgmma_ss_f16/bf16(acc, base, desc_a, desc_b, scale_d)`` (A and B from shared memory,
  both K-major) and ``wgmma_rs_mn_f16/bf16(acc, base, a0, a1, a2, a3, desc_b, scale_d)`` (A
  from four .b32 registers of packed 16-bit values, `wgmma_a_elem`; B MN-major, i.e.
  ``imm-trans-b = 1``, `mnmajor_offset`: V [keys, d] as TMA lands it). These are m64n64;
  ``wgmma_ss(dtype, n)`` and ``wgmma_rs(dtype, n)`` give the same in-place forms at any width
  ``n`` (64..256, a multiple of 64; ``acc[base:base + n // 2]``), whose accumulator layout is
  that of ``n // 64`` m64n64 blocks side by side (`wgmma_d_elem`); ``wgmma_ss(dtype, n,
  mn_major=True)`` takes both operands MN-major (``imm-trans-a = imm-trans-b = 1``).
  ``wgmma_fence_operands(acc, base, n)`` after ``wgmma_wait_group`` keeps every later use of
  the accumulator below the wait (an empty ``asm volatile`` with ``+f`` operands, as CUTLASS's
  ``warpgroup_fence_operand``): without it LLVM may hoist register arithmetic on the results
  above the wait, which orders only memory.
* ``cp_async_bulk_tensor_4d_g2s(dst, tmap, c0, c1, c2, c3, bar)``: one box of a 4-D tensor map
  (`encode_tensor_map_4d`: [B, H, N, d] with any 16-byte-multiple strides; boxes never cross a
  head, out-of-bounds rows are zero-filled); ``cp_reduce_async_bulk_tensor_4d_add(tmap, c0, c1,
  c2, c3, src)`` the other way, adding a shared-memory box into global memory (out-of-bounds
  elements skipped), with ``cp_async_bulk_commit_group()`` and
  ``cp_async_bulk_wait_group_read()`` / ``cp_async_bulk_wait_group()``.
* **register reallocation**: ``setmaxnreg_inc(n)`` / ``setmaxnreg_dec(n)`` (``n`` a compile-time
  constant, 24..256, a multiple of 8; every thread of the warpgroup executes it). ptxas only
  honours it in a kernel whose launch bounds name a minimum of blocks per SM
  (``@cuda.jit(launch_bounds=(threads, 1))``: ``.maxntid`` and ``.minnctapersm``); with the
  thread count alone it drops the instruction ("(C7508) 'setmaxnreg' ignored").
* **tile products** (device functions built from the intrinsics, shared by the Hopper forward
  and backward): `tile_product_abt` (acc = A B^T, both operands from shared memory) and
  `tile_product_ab` (acc += A B, A from registers), each one commit group over a tile, each
  k-step one product as wide as the output tile (`product_blocks`: m64n128 for 128 columns);
  `tile_product_mn` (acc = A B, both operands from shared memory MN-major: the atomic-dQ
  backward's dQ = dS K from dS^T as its warpgroups stored it).
* utilities: ``array_addr(arr)`` (64-bit address of an array's first element),
  ``smem_descriptor(template, saddr)`` (a descriptor template from `encode_wgmma_descriptor`
  with start address 0, completed with a 32-bit shared-window address from
  `kernels.ptx.shared_addr`), ``descriptor_at(desc, offset)`` (that descriptor moved by a byte
  offset), ``aligned_shared_base(smem)`` and ``init_ring_barriers(first, stages, consumers)``
  (the Hopper kernels' common start: the 1024-aligned tile area, a TMA ring's mbarriers).

wgmma and setmaxnreg need the arch-specific target ``sm_90a`` (ptxas refuses them for
``sm_90``); the rest is sm_90. ``cuda.compile_ptx(..., cc=(9, 0, "a"))`` gives ``.target sm_90a``
on the CPU (then ``ptxas -arch=sm_90a``); on an H100, numba-cuda picks ``compute_90a`` itself
for devices of compute capability 9.0 and above. The CUDA simulator runs none of them; the
module imports under it, and the intrinsics are tested by compiling on the CPU and on a GPU
(``tests/test_hopper_intrinsics.py``).

Plain Python (no GPU, no compile), checked on the CPU:

* `encode_wgmma_descriptor` / `decode_wgmma_descriptor`: the 64-bit shared-memory matrix
  descriptor of ``wgmma`` (PTX ISA, "Matrix Descriptor Format"): bits 0-13 the start address,
  16-29 the leading-dimension byte offset (LBO), 32-45 the stride-dimension byte offset (SBO),
  each stored as ``(x & 0x3FFFF) >> 4``; bits 49-51 the matrix base offset; bits 62-63 the
  swizzle mode (0 none, 1 128-byte, 2 64-byte, 3 32-byte). Values that the encoding would
  truncate are refused (ValueError naming the argument).
* `wgmma_d_elem` / `wgmma_d_owner`: the m64nNk16 accumulator layout (PTX ISA, "Matrix Fragments
  for wgmma.mma_async.m64nNk16", accumulator D). Thread ``t`` of the warpgroup is lane
  ``t % 32`` of warp ``t // 32``; with ``group = lane // 4`` and ``tig = lane % 4``, register
  ``i`` (0 <= i < N/2) holds::

      row = 16 * warp + group + 8 * ((i >> 1) & 1)
      col = 8 * (i >> 2) + 2 * tig + (i & 1)

* `kmajor_offset` / `kmajor_strides` / `swizzle_offset`: where element (row, k) of a K-major
  16-bit operand tile lies in shared memory, in the canonical layouts a descriptor describes
  (8 x 16-byte "core matrices"; no swizzle, or 32/64/128-byte swizzle, the pattern TMA writes
  with ``CU_TENSOR_MAP_SWIZZLE_*``), and the LBO, SBO and per-k16-step advance that go with it.
* `mnmajor_offset` / `mnmajor_strides`: the same for an MN-major (transposed) B operand, K x N
  with N contiguous, as TMA lands a box of rows x one swizzle width (LBO between 64-element N
  blocks, SBO between 8-row groups of K: PTX ISA canonical MN-major layouts).
* `wgmma_a_elem` / `wgmma_a_owner`: the A-in-registers fragment of m64nNk16 (four .b32 of two
  16-bit values); `wgmma_p_from_d`: which accumulator registers of a score tile form the A
  registers of its k16 slice (P feeds O += P V without leaving registers).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

from llvmlite import ir
from numba import cuda, int64, types, uint64
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

from .ptx import shared_addr

__all__ = [
    # layouts (plain Python)
    "WARPGROUP", "SWIZZLE_MODES", "WgmmaDescriptor", "encode_wgmma_descriptor",
    "decode_wgmma_descriptor", "wgmma_d_elem", "wgmma_d_owner", "swizzle_offset",
    "kmajor_offset", "kmajor_strides", "check_maxnreg", "encode_tensor_map_2d",
    "TENSOR_MAP_WORDS", "mnmajor_offset", "mnmajor_strides", "wgmma_a_elem", "wgmma_a_owner",
    "wgmma_p_from_d", "encode_tensor_map_4d", "wgmma_a8_elem", "wgmma_a8_owner",
    "fp8_key_order", "wgmma_p8_from_d",
    # intrinsics
    "mbarrier_init", "mbarrier_arrive", "mbarrier_arrive_expect_tx", "mbarrier_try_wait_parity",
    "mbarrier_wait_parity", "fence_mbarrier_init", "fence_proxy_async",
    "fence_proxy_tensormap_acquire", "cp_async_bulk_g2s", "cp_async_bulk_tensor_2d_g2s",
    "wgmma_fence", "wgmma_commit_group", "wgmma_wait_group", "wgmma_m64n64k16_f32_f16",
    "WGMMA_M64N64K16_F16_PTX", "f32_zeros", "setmaxnreg_inc", "setmaxnreg_dec", "array_addr",
    "smem_descriptor", "wgmma_m64n64k16_f32_bf16", "named_barrier_sync", "named_barrier_arrive",
    "WGMMA_M64N64K16_BF16_PTX",
    "cp_async_bulk_tensor_4d_g2s", "cp_reduce_async_bulk_tensor_4d_add",
    "cp_async_bulk_commit_group", "cp_async_bulk_wait_group_read", "cp_async_bulk_wait_group",
    "wgmma_ss_f16", "wgmma_ss_bf16", "wgmma_rs_mn_f16",
    "wgmma_rs_mn_bf16", "WGMMA_RS_MN_F16_PTX", "WGMMA_RS_MN_BF16_PTX", "wgmma_fence_operands",
    "wgmma_ss_e4m3", "wgmma_rs_e4m3", "WGMMA_SS_E4M3_PTX", "WGMMA_RS_E4M3_PTX", "pack_e4m3x4",
    "wgmma_ss", "wgmma_rs", "WGMMA_MAX_N", "SWIZZLE_128B_ROW", "aligned_shared_base",
    "init_ring_barriers", "descriptor_at",
    # device functions built from them
    "product_blocks", "tile_product_abt", "tile_product_ab", "tile_product_mn",
]

WARPGROUP = 128

# -- the wgmma shared-memory matrix descriptor ---------------------------------------------------
#: Swizzle mode name -> the 2-bit field value (bits 62-63).
SWIZZLE_MODES = {"none": 0, "128B": 1, "64B": 2, "32B": 3}
_SWIZZLE_NAMES = {v: k for k, v in SWIZZLE_MODES.items()}
_ADDR_LIMIT = 1 << 18          # (x & 0x3FFFF) >> 4 keeps 14 bits of x / 16
_FIELD_MASK = 0x3FFF
_USED_BITS = (_FIELD_MASK | _FIELD_MASK << 16 | _FIELD_MASK << 32 | 0x7 << 49 | 0x3 << 62)


class WgmmaDescriptor(NamedTuple):
    """The fields of a wgmma matrix descriptor, in bytes (offsets) and by name (swizzle)."""
    start_address: int
    leading_byte_offset: int
    stride_byte_offset: int
    swizzle: str = "none"
    base_offset: int = 0


def _check_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def _check_byte_field(name, value):
    _check_int(name, value)
    if not 0 <= value < _ADDR_LIMIT:
        raise ValueError(f"{name} must be in [0, {_ADDR_LIMIT}) bytes (14 bits of bytes / 16), "
                         f"got {value}")
    if value % 16:
        raise ValueError(f"{name} must be a multiple of 16 bytes, got {value}")


def encode_wgmma_descriptor(start_address: int, leading_byte_offset: int,
                            stride_byte_offset: int, swizzle: str = "none",
                            base_offset: int = 0) -> int:
    """The 64-bit wgmma matrix descriptor (an int in [0, 2**64)) of a shared-memory operand.

    ``start_address``: shared-window byte address (`kernels.ptx.shared_addr`; 0 for a template
    completed in the kernel by `smem_descriptor`); ``leading_byte_offset`` (LBO) and
    ``stride_byte_offset`` (SBO): bytes, see `kmajor_strides`; ``swizzle``: a key of
    `SWIZZLE_MODES`; ``base_offset``: 0..7, the matrix base offset for a swizzled operand whose
    start is not aligned to the swizzle pattern's repeat (0 when it is).
    """
    _check_byte_field("start_address", start_address)
    _check_byte_field("leading_byte_offset", leading_byte_offset)
    _check_byte_field("stride_byte_offset", stride_byte_offset)
    if swizzle not in SWIZZLE_MODES:
        raise ValueError(f"swizzle must be one of {sorted(SWIZZLE_MODES)}, got {swizzle!r}")
    _check_int("base_offset", base_offset)
    if not 0 <= base_offset < 8:
        raise ValueError(f"base_offset must be in [0, 8), got {base_offset}")
    return ((start_address >> 4) | (leading_byte_offset >> 4) << 16
            | (stride_byte_offset >> 4) << 32 | base_offset << 49
            | SWIZZLE_MODES[swizzle] << 62)


def decode_wgmma_descriptor(desc: int) -> WgmmaDescriptor:
    """The fields of a descriptor from `encode_wgmma_descriptor` (its inverse)."""
    _check_int("desc", desc)
    if not 0 <= desc < 1 << 64:
        raise ValueError(f"desc must be a 64-bit unsigned value, got {desc}")
    if desc & ~_USED_BITS:
        raise ValueError(f"desc has reserved bits set: {desc & ~_USED_BITS:#x}")
    return WgmmaDescriptor(start_address=(desc & _FIELD_MASK) << 4,
                           leading_byte_offset=(desc >> 16 & _FIELD_MASK) << 4,
                           stride_byte_offset=(desc >> 32 & _FIELD_MASK) << 4,
                           swizzle=_SWIZZLE_NAMES[desc >> 62 & 0x3],
                           base_offset=desc >> 49 & 0x7)


# -- shared-memory operand layouts (K-major, 16-bit elements) -------------------------------------
_SWIZZLE_BYTES = {"none": 16, "32B": 32, "64B": 64, "128B": 128}
#: Bytes of one row of a 128-byte swizzled tile (and of a TMA box written with that swizzle).
SWIZZLE_128B_ROW = _SWIZZLE_BYTES["128B"]


def swizzle_offset(offset: int, swizzle: str) -> int:
    """Byte ``offset`` (from a base aligned to 8 x the swizzle width) after the swizzle: the
    16-byte chunk index (bits 4..) is XORed with the row within the 8-row pattern (bits 7..);
    ``Swizzle<b, 4, 3>`` of CuTe with b = 1, 2, 3 for 32, 64, 128 bytes; the identity for
    "none". An involution, and a bijection on each 8 x width block."""
    if swizzle not in _SWIZZLE_BYTES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLE_BYTES)}, got {swizzle!r}")
    _check_int("offset", offset)
    if offset < 0:
        raise ValueError(f"offset must be >= 0, got {offset}")
    mask = _SWIZZLE_BYTES[swizzle] // 16 - 1
    return offset ^ (((offset >> 7) & mask) << 4)


def kmajor_strides(swizzle: str, k_elems: int) -> tuple[int, int, int]:
    """``(lbo, sbo, k_step)`` in bytes for a compact K-major tile of 16-bit elements, ``k_elems``
    wide, in the layout `kmajor_offset` gives: the descriptor's LBO and SBO, and how far the
    start address moves for the next 16 columns of K (one wgmma k16 step).

    * "none": core matrices (8 rows x 16 bytes, 128 contiguous bytes) side by side along K
      (LBO = 128), 8-row groups one after another (SBO = 16 * k_elems); ``k_elems`` a multiple
      of 16; the k16 step is two core matrices (256 bytes).
    * "32B" / "64B" / "128B": rows of exactly the swizzle width (``k_elems`` = 16, 32, 64),
      8-row groups 8 rows apart (SBO = 8 x width); LBO is unused for K-major swizzled operands
      (16 by convention); the k16 step is 32 bytes.
    """
    if swizzle not in _SWIZZLE_BYTES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLE_BYTES)}, got {swizzle!r}")
    _check_int("k_elems", k_elems)
    if swizzle == "none":
        if k_elems <= 0 or k_elems % 16:
            raise ValueError(f"k_elems must be a positive multiple of 16, got {k_elems}")
        return 128, 16 * k_elems, 256
    width = _SWIZZLE_BYTES[swizzle]
    if k_elems != width // 2:
        raise ValueError(f"k_elems must be {width // 2} (one {swizzle} row of 16-bit elements), "
                         f"got {k_elems}")
    return 16, 8 * width, 32


def kmajor_offset(row: int, k: int, swizzle: str, k_elems: int) -> int:
    """Byte offset of element (row, k) of a K-major tile of 16-bit elements (row = M for A, N
    for B; ``k_elems`` columns of K) in the layout of `kmajor_strides`, from a base aligned to
    the swizzle pattern (1024 bytes for 128B). "none": ``(row // 8) * SBO + (k // 8) * 128 +
    (row % 8) * 16 + (k % 8) * 2``; swizzled: `swizzle_offset` of ``(row // 8) * SBO + (row % 8)
    * width + 2 * k`` (what TMA writes for a box of ``width`` bytes a row)."""
    lbo, sbo, _ = kmajor_strides(swizzle, k_elems)
    _check_int("row", row)
    _check_int("k", k)
    if row < 0:
        raise ValueError(f"row must be >= 0, got {row}")
    if not 0 <= k < k_elems:
        raise ValueError(f"k must be in [0, {k_elems}), got {k}")
    if swizzle == "none":
        return (row // 8) * sbo + (k // 8) * lbo + (row % 8) * 16 + (k % 8) * 2
    width = _SWIZZLE_BYTES[swizzle]
    return swizzle_offset((row // 8) * sbo + (row % 8) * width + 2 * k, swizzle)



def mnmajor_strides(swizzle: str, k_rows: int) -> tuple[int, int, int]:
    """``(lbo, sbo, k_step)`` in bytes for a swizzled MN-major operand of 16-bit elements (B
    with ``imm-trans-b = 1``: a K x N tile whose N elements are contiguous, e.g. V [keys, d]) in
    the layout `mnmajor_offset` gives: N cut into blocks of one swizzle width (64 elements for
    "128B", 32 for "64B", 16 for "32B"), each block ``k_rows`` rows of K, one row per swizzle
    width, as TMA writes a box of ``k_rows`` rows x one swizzle width; blocks one after another.

    PTX ISA, "Shared Memory Matrix Layout", canonical MN-major swizzled layouts
    ``((T, W/T, m), (8, k)) : ((1, T, LBO), (W, SBO))`` (in elements; T = 8 elements of 16 bits,
    W the swizzle width in elements): LBO is the distance between the N blocks (here
    ``k_rows`` x width bytes), SBO between groups of 8 rows of K (8 x width bytes, the rows
    being packed), and a k16 step moves the start address by 16 rows (16 x width bytes, a
    multiple of the pattern's repeat, so the base offset stays 0). Without swizzle the
    MN-major layout is not what a TMA box holds: refused."""
    if swizzle not in _SWIZZLE_BYTES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLE_BYTES)}, got {swizzle!r}")
    if swizzle == "none":
        raise ValueError("swizzle must be '32B', '64B' or '128B' for an MN-major operand (the "
                         "interleaved layout is not one a TMA box holds)")
    _check_int("k_rows", k_rows)
    if k_rows <= 0 or k_rows % 16:
        raise ValueError(f"k_rows must be a positive multiple of 16, got {k_rows}")
    width = _SWIZZLE_BYTES[swizzle]
    return k_rows * width, 8 * width, 16 * width


def mnmajor_offset(k: int, n: int, swizzle: str, k_rows: int) -> int:
    """Byte offset of element (k, n) of a K x N MN-major tile of 16-bit elements (``k_rows``
    rows of K, any N) in the layout of `mnmajor_strides`, from a base aligned to the swizzle
    pattern (1024 bytes for 128B): ``(n // W) * LBO`` plus the swizzled offset ``k * width +
    2 * (n % W)`` inside the block (what TMA writes for a box of ``k_rows`` rows x ``width``
    bytes), W = width / 2 elements."""
    lbo, _sbo, _ = mnmajor_strides(swizzle, k_rows)
    _check_int("k", k)
    _check_int("n", n)
    if not 0 <= k < k_rows:
        raise ValueError(f"k must be in [0, {k_rows}), got {k}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    width = _SWIZZLE_BYTES[swizzle]
    w_elems = width // 2
    return (n // w_elems) * lbo + swizzle_offset(k * width + 2 * (n % w_elems), swizzle)

# -- the m64nNk16 accumulator fragment -----------------------------------------------------------
def _check_n(n):
    _check_int("n", n)
    if not (8 <= n <= 256 and n % 8 == 0):
        raise ValueError(f"n must be a multiple of 8 in [8, 256], got {n}")


def wgmma_d_elem(thread: int, reg: int, n: int = 64) -> tuple[int, int]:
    """(row, col) of the 64 x ``n`` accumulator element in float32 register ``reg`` of
    ``thread`` (0..127 within the warpgroup) of ``wgmma.mma_async.m64nNk16`` (.f32 D)."""
    _check_n(n)
    _check_int("thread", thread)
    _check_int("reg", reg)
    if not 0 <= thread < WARPGROUP:
        raise ValueError(f"thread must be in [0, {WARPGROUP}), got {thread}")
    if not 0 <= reg < n // 2:
        raise ValueError(f"reg must be in [0, {n // 2}) for n={n}, got {reg}")
    warp, lane = divmod(thread, 32)
    group, tig = divmod(lane, 4)
    return 16 * warp + group + 8 * ((reg >> 1) & 1), 8 * (reg >> 2) + 2 * tig + (reg & 1)


def wgmma_d_owner(row: int, col: int, n: int = 64) -> tuple[int, int]:
    """(thread, reg) holding accumulator element (row, col) of the 64 x ``n`` tile (inverse of
    `wgmma_d_elem`)."""
    _check_n(n)
    _check_int("row", row)
    _check_int("col", col)
    if not (0 <= row < 64 and 0 <= col < n):
        raise ValueError(f"(row, col) must lie in the 64 x {n} tile, got ({row}, {col})")
    thread = 32 * (row // 16) + 4 * (row % 8) + (col % 8) // 2
    reg = 4 * (col // 8) + 2 * ((row % 16) // 8) + col % 2
    return thread, reg



def _a_fragment_thread(thread, reg, part_name, part, parts, plural) -> tuple[int, int, int]:
    """``(warp, group, tig)`` of ``thread`` (0..127) after checking it, ``reg`` (0..3) and the
    ``part`` (0..parts - 1) of the register: an A-in-registers fragment's arguments."""
    _check_int("thread", thread)
    _check_int("reg", reg)
    _check_int(part_name, part)
    if not 0 <= thread < WARPGROUP:
        raise ValueError(f"thread must be in [0, {WARPGROUP}), got {thread}")
    if not (0 <= reg < 4 and 0 <= part < parts):
        raise ValueError(f"A has registers 0..3 and {plural} 0..{parts - 1}, got reg={reg}, "
                         f"{part_name}={part}")
    warp, lane = divmod(thread, 32)
    group, tig = divmod(lane, 4)
    return warp, group, tig


def _check_a_element(row, k, columns) -> None:
    """Check ``(row, k)`` of a 64 x ``columns`` A operand: an A fragment owner's arguments."""
    _check_int("row", row)
    _check_int("k", k)
    if not (0 <= row < 64 and 0 <= k < columns):
        raise ValueError(f"(row, k) must lie in the 64 x {columns} tile, got ({row}, {k})")


def wgmma_a_elem(thread: int, reg: int, half: int) -> tuple[int, int]:
    """(row, k) of the element of the 64 x 16 A operand held in half ``half`` (0: low 16 bits)
    of .b32 register ``reg`` (0..3) of ``thread`` (0..127) of ``wgmma.mma_async.m64nNk16``
    with A in registers (PTX ISA, "Matrix Fragments for wgmma.mma_async.m64nNk16", A; .f16 and
    .bf16): warp ``w`` holds rows 16w..16w+15 in ``mma.m16n8k16``'s A layout
    (`kernels.fragments.a_elem`). With ``e = 2 * reg + half``::

        row = 16 * warp + group + 8 * ((e >> 1) & 1)
        k   = 2 * tig + (e & 1) + 8 * (e >> 2)
    """
    warp, group, tig = _a_fragment_thread(thread, reg, "half", half, 2, "halves")
    e = 2 * reg + half
    return 16 * warp + group + 8 * ((e >> 1) & 1), 2 * tig + (e & 1) + 8 * (e >> 2)


def wgmma_a_owner(row: int, k: int) -> tuple[int, int, int]:
    """(thread, reg, half) holding element (row, k) of the 64 x 16 A operand (inverse of
    `wgmma_a_elem`)."""
    _check_a_element(row, k, 16)
    thread = 32 * (row // 16) + 4 * (row % 8) + (k % 8) // 2
    e = (k & 1) + 2 * ((row % 16) // 8) + 4 * (k // 8)
    return thread, e // 2, e % 2


def wgmma_p_from_d(kc: int, reg: int, half: int) -> int:
    """The accumulator register (`wgmma_d_elem`, any N) whose value, rounded to 16 bits, is
    half ``half`` of A register ``reg`` for the k16 slice ``kc`` (columns 16 kc .. 16 kc + 15)
    of a score tile: ``8 * kc + 2 * reg + half``. The same thread holds both, so P = softmax(S)
    becomes the A operand of O += P V without leaving registers (as ``mma.sync``'s C -> A,
    `kernels.fragments.c_pair_to_a`)."""
    for name, v in (("kc", kc), ("reg", reg), ("half", half)):
        _check_int(name, v)
    if kc < 0 or not 0 <= reg < 4 or half not in (0, 1):
        raise ValueError(f"need kc >= 0, reg in 0..3, half in 0..1; got {kc}, {reg}, {half}")
    return 8 * kc + 2 * reg + half


# -- the m64nNk32 float8 (e4m3) A fragment and P's key order ---------------------------------------
def wgmma_a8_elem(thread: int, reg: int, byte: int) -> tuple[int, int]:
    """(row, k) of the element of the 64 x 32 A operand held in byte ``byte`` (0: lowest) of
    .b32 register ``reg`` (0..3) of ``thread`` (0..127) of ``wgmma.mma_async.m64nNk32`` with
    8-bit A (.e4m3/.e5m2) in registers (PTX ISA, "Matrix Fragments for wgmma.mma_async.m64nNk32";
    CUTLASS's ``ALayout_64x32``)::

        row = 16 * warp + group + 8 * (reg & 1)
        k   = 4 * tig + byte + 16 * (reg >> 1)
    """
    warp, group, tig = _a_fragment_thread(thread, reg, "byte", byte, 4, "bytes")
    return 16 * warp + group + 8 * (reg & 1), 4 * tig + byte + 16 * (reg >> 1)


def wgmma_a8_owner(row: int, k: int) -> tuple[int, int, int]:
    """(thread, reg, byte) holding element (row, k) of the 64 x 32 8-bit A operand (inverse of
    `wgmma_a8_elem`)."""
    _check_a_element(row, k, 32)
    thread = 32 * (row // 16) + 4 * (row % 8) + (k % 16) // 4
    return thread, ((row % 16) // 8) + 2 * (k // 16), k % 4


def fp8_key_order(position: int) -> int:
    """The key (0..31, within a 32-key slice of a score tile) whose probability sits at K
    position ``position`` of the 8-bit A operand when P is built in place from the accumulator
    (`wgmma_p8_from_d`): ``16 * (p >> 4) + 8 * ((p & 3) >> 1) + 2 * ((p >> 2) & 3) + (p & 1)``.

    The accumulator gives each thread the columns ``8 j + 2 tig + {0, 1}`` of a row; the 8-bit
    A fragment wants ``4 tig + {0..3}`` and ``16 + 4 tig + {0..3}``. Rather than exchange values
    between threads, the keys of P V are taken in this order: V's rows (the B operand, K-major,
    i.e. V transposed) are stored permuted the same way, and the sum over keys is unchanged."""
    _check_int("position", position)
    if not 0 <= position < 32:
        raise ValueError(f"position must be in [0, 32), got {position}")
    p = position
    return 16 * (p >> 4) + 8 * ((p & 3) >> 1) + 2 * ((p >> 2) & 3) + (p & 1)


def wgmma_p8_from_d(kc: int, reg: int, byte: int) -> int:
    """The accumulator register (`wgmma_d_elem`, any N) whose value, rounded to e4m3, is byte
    ``byte`` of 8-bit A register ``reg`` for the k32 slice ``kc`` (score columns 32 kc ..
    32 kc + 31) when the keys follow `fp8_key_order`: ``16 kc + 8 (reg >> 1) + 4 (byte >> 1)
    + 2 (reg & 1) + (byte & 1)`` (the same thread holds both)."""
    for name, v in (("kc", kc), ("reg", reg), ("byte", byte)):
        _check_int(name, v)
    if kc < 0 or not 0 <= reg < 4 or not 0 <= byte < 4:
        raise ValueError(f"need kc >= 0, reg in 0..3, byte in 0..3; got {kc}, {reg}, {byte}")
    return 16 * kc + 8 * (reg >> 1) + 4 * (byte >> 1) + 2 * (reg & 1) + (byte & 1)

def check_maxnreg(n: int) -> int:
    """``n`` if it is a valid ``setmaxnreg`` register count (24..256, a multiple of 8)."""
    _check_int("n", n)
    if not (24 <= n <= 256 and n % 8 == 0):
        raise ValueError(f"setmaxnreg count must be a multiple of 8 in [24, 256], got {n}")
    return n


# -- the host-side tensor map (TMA) --------------------------------------------------------------
#: A CUtensorMap is 128 bytes: 16 uint64 words, to be stored 64-byte aligned.
TENSOR_MAP_WORDS = 16
_TMAP_DTYPES = {"float16": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT16", 2),
                "bfloat16": ("CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", 2),
                "float32": ("CU_TENSOR_MAP_DATA_TYPE_FLOAT32", 4),
                "uint16": ("CU_TENSOR_MAP_DATA_TYPE_UINT16", 2),
                "uint8": ("CU_TENSOR_MAP_DATA_TYPE_UINT8", 1)}


def _tensor_map_common(address, dtype, shape, box, swizzle, count: str, order: str) -> int:
    """The checks every tensor map shares (dtype, address, ``shape`` and ``box`` as ``count``
    ints listed ``order``, the innermost box extent against 16 bytes and the swizzle width);
    returns the element size in bytes."""
    if dtype not in _TMAP_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_TMAP_DTYPES)}, got {dtype!r}")
    elem = _TMAP_DTYPES[dtype][1]
    _check_int("address", address)
    if address <= 0 or address % 16:
        raise ValueError(f"address must be a non-zero multiple of 16, got {address:#x}")
    rank = {"two": 2, "four": 4}[count]
    if len(shape) != rank or any(isinstance(s, bool) or not isinstance(s, int)
                                 or not 0 < s <= 1 << 32 for s in shape):
        raise ValueError(f"shape must be {count} ints in [1, 2**32] ({order}), got {shape}")
    if len(box) != rank or any(isinstance(b, bool) or not isinstance(b, int) or not 0 < b <= 256
                               for b in box):
        raise ValueError(f"box must be {count} ints in [1, 256] ({order}), got {box}")
    if box[-1] * elem % 16:
        raise ValueError(f"box must be a multiple of 16 bytes wide, got {box[-1]} x {elem} bytes")
    if swizzle not in _SWIZZLE_BYTES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLE_BYTES)}, got {swizzle!r}")
    if swizzle != "none" and box[-1] * elem > _SWIZZLE_BYTES[swizzle]:
        raise ValueError(f"a {swizzle} swizzle takes boxes at most {_SWIZZLE_BYTES[swizzle]} "
                         f"bytes wide, got {box[-1] * elem}")
    return elem


def _tensor_map_args(address, shape, row_stride_bytes, box, dtype, swizzle):
    """The checked arguments of `encode_tensor_map_2d` (plain Python; what the driver would
    refuse, refused first with the argument named); returns the element size in bytes."""
    elem = _tensor_map_common(address, dtype, shape, box, swizzle, "two", "rows, cols")
    _check_int("row_stride_bytes", row_stride_bytes)
    if row_stride_bytes % 16 or not 0 < row_stride_bytes < 1 << 40:
        raise ValueError(f"row_stride_bytes must be a positive multiple of 16 below 2**40, "
                         f"got {row_stride_bytes}")
    if row_stride_bytes < shape[1] * elem:
        raise ValueError(f"row_stride_bytes ({row_stride_bytes}) is less than a row "
                         f"({shape[1]} x {elem} bytes)")
    return elem


def _encode_tiled(dtype: str, address: int, dims, strides_bytes, box, swizzle: str):
    """``cuTensorMapEncodeTiled`` on arguments already checked, every list innermost first
    (``strides_bytes`` without the innermost, contiguous dimension's); the map as a NumPy array
    of `TENSOR_MAP_WORDS` uint64. Zero fill out of bounds, 128-byte L2 promotion."""
    import numpy as np
    from cuda.bindings import driver as drv

    swz = {"none": "CU_TENSOR_MAP_SWIZZLE_NONE", "32B": "CU_TENSOR_MAP_SWIZZLE_32B",
           "64B": "CU_TENSOR_MAP_SWIZZLE_64B", "128B": "CU_TENSOR_MAP_SWIZZLE_128B"}[swizzle]
    (err,) = drv.cuInit(0)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuInit failed: {err!r}")
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    err, tmap = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, _TMAP_DTYPES[dtype][0]), len(dims), address,
        [u64(x) for x in dims], [u64(x) for x in strides_bytes], [u32(x) for x in box],
        [u32(1)] * len(dims), drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, swz),
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed: {err!r}")
    return np.array([int(w) for w in tmap.opaque], dtype=np.uint64)


def encode_tensor_map_2d(address: int, shape, row_stride_bytes: int, box, dtype: str = "float16",
                         swizzle: str = "none"):
    """A 2-D tiled tensor map (``cuTensorMapEncodeTiled``) as a NumPy array of
    `TENSOR_MAP_WORDS` uint64, to be copied to the device and read by
    `cp_async_bulk_tensor_2d_g2s`.

    ``address``: device address of element (0, 0) of a row-major matrix (16-byte aligned);
    ``shape`` (rows, cols) in elements; ``row_stride_bytes``: bytes between rows (a multiple of
    16); ``box`` (rows, cols): the tile one copy moves (each at most 256; ``cols`` x element
    size a multiple of 16, and at most the swizzle width when swizzled); ``swizzle``: "none",
    "32B", "64B" or "128B" (the shared-memory layout `kmajor_offset` describes). Out-of-bounds
    elements of a box are filled with zeros. Needs the CUDA driver (``cuda.bindings``)."""
    _tensor_map_args(address, shape, row_stride_bytes, box, dtype, swizzle)
    return _encode_tiled(dtype, address, (shape[1], shape[0]), (row_stride_bytes,),
                         (box[1], box[0]), swizzle)


def _tensor_map_4d_args(address, shape, strides_bytes, box, dtype, swizzle):
    """The checked arguments of `encode_tensor_map_4d` (plain Python); returns the element
    size in bytes."""
    elem = _tensor_map_common(address, dtype, shape, box, swizzle, "four", "outermost first")
    if len(strides_bytes) != 3 or any(isinstance(s, bool) or not isinstance(s, int)
                                      or s % 16 or not 0 < s < 1 << 40 for s in strides_bytes):
        raise ValueError(f"strides_bytes must be three positive multiples of 16 below 2**40 (the "
                         f"outer three dimensions, outermost first), got {strides_bytes}")
    if strides_bytes[2] < shape[3] * elem:
        raise ValueError(f"strides_bytes[2] ({strides_bytes[2]}) is less than a row "
                         f"({shape[3]} x {elem} bytes)")
    return elem


def encode_tensor_map_4d(address: int, shape, strides_bytes, box, dtype: str = "uint16",
                         swizzle: str = "none"):
    """A 4-D tiled tensor map (``cuTensorMapEncodeTiled``) as a NumPy array of
    `TENSOR_MAP_WORDS` uint64, read by `cp_async_bulk_tensor_4d_g2s`.

    ``address``: device address of element (0, 0, 0, 0) (16-byte aligned); ``shape``: four
    extents, outermost first as NumPy orders them (e.g. [B, H, N, d]; the last is contiguous);
    ``strides_bytes``: the byte strides of the outer three dimensions, outermost first
    (multiples of 16; give any valid value for a dimension of extent 1); ``box``: the extents
    one copy moves, outermost first (each at most 256; the innermost times the element size a
    multiple of 16, and at most the swizzle width when swizzled). The copy's coordinates are
    innermost first: (c0, c1, c2, c3) = (column, row, dim 1, dim 0). Out-of-bounds elements of
    a box are filled with zeros (and counted in the transaction bytes). Needs the CUDA driver
    (``cuda.bindings``)."""
    _tensor_map_4d_args(address, shape, strides_bytes, box, dtype, swizzle)
    return _encode_tiled(dtype, address, tuple(reversed(shape)), tuple(reversed(strides_bytes)),
                         tuple(reversed(box)), swizzle)


# -- intrinsics ----------------------------------------------------------------------------------
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_VOID = ir.VoidType()


def _asm(builder, ret_ty, arg_tys, text, constraints, args, side_effect=True):
    fnty = ir.FunctionType(ret_ty, arg_tys)
    return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), args)


def _cast_all(context, builder, sig, args, tys):
    return [context.cast(builder, v, t, s) for v, t, s in zip(args, sig.args, tys)]


def _make_void(name, ptx, arg_types, doc):
    """An intrinsic ``f(*args) -> None`` that emits ``ptx`` (operands $0.. in order) with a
    memory clobber; ``arg_types`` are Numba types (uint32 -> "r", uint64 -> "l")."""
    reg = {types.uint32: ("r", _I32), types.uint64: ("l", _I64)}
    constraints = ",".join([reg[t][0] for t in arg_types] + ["~{memory}"])
    ir_tys = [reg[t][1] for t in arg_types]

    def typer(typingctx, *args):
        if len(args) != len(arg_types) or not all(isinstance(a, types.Integer) for a in args):
            return None
        sig = types.void(*arg_types)

        def codegen(context, builder, sig, args):
            _asm(builder, _VOID, ir_tys, ptx, constraints,
                 _cast_all(context, builder, sig, args, arg_types))
            return context.get_dummy_value()

        return sig, codegen

    # @intrinsic reads the typer's positional parameters: one per operand
    arity = len(arg_types)
    if arity == 0:
        def f(typingctx):
            return typer(typingctx)
    elif arity == 1:
        def f(typingctx, a0):
            return typer(typingctx, a0)
    elif arity == 2:
        def f(typingctx, a0, a1):
            return typer(typingctx, a0, a1)
    elif arity == 4:
        def f(typingctx, a0, a1, a2, a3):
            return typer(typingctx, a0, a1, a2, a3)
    elif arity == 5:
        def f(typingctx, a0, a1, a2, a3, a4):
            return typer(typingctx, a0, a1, a2, a3, a4)
    elif arity == 6:
        def f(typingctx, a0, a1, a2, a3, a4, a5):
            return typer(typingctx, a0, a1, a2, a3, a4, a5)
    elif arity == 7:
        def f(typingctx, a0, a1, a2, a3, a4, a5, a6):
            return typer(typingctx, a0, a1, a2, a3, a4, a5, a6)
    else:
        raise ValueError(f"no intrinsic shape for {arity} operands")
    f.__name__ = f.__qualname__ = name
    f.__doc__ = doc
    return intrinsic(f)


_U32, _U64 = types.uint32, types.uint64

mbarrier_init = _make_void(
    "mbarrier_init", "mbarrier.init.shared::cta.b64 [$0], $1;", (_U32, _U32),
    "mbarrier_init(bar, count): initialise the barrier at shared address ``bar`` to expect "
    "``count`` arrivals per phase (one thread, before anyone uses it).")
mbarrier_arrive = _make_void(
    "mbarrier_arrive", "mbarrier.arrive.shared::cta.b64 _, [$0];", (_U32,),
    "mbarrier_arrive(bar): one arrival on the barrier (release, CTA scope).")
mbarrier_arrive_expect_tx = _make_void(
    "mbarrier_arrive_expect_tx", "mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;",
    (_U32, _U32),
    "mbarrier_arrive_expect_tx(bar, nbytes): one arrival, and ``nbytes`` more transaction bytes "
    "for the current phase to wait for (the bytes of the copies that complete on ``bar``).")
fence_mbarrier_init = _make_void(
    "fence_mbarrier_init", "fence.mbarrier_init.release.cluster;", (),
    "Order earlier mbarrier.init before later operations of the async proxy (bulk copies).")
fence_proxy_async = _make_void(
    "fence_proxy_async", "fence.proxy.async.shared::cta;", (),
    "Make this thread's ordinary shared-memory writes visible to the async proxy (wgmma, bulk "
    "copies) and the reverse.")
fence_proxy_tensormap_acquire = _make_void(
    "fence_proxy_tensormap_acquire",
    "fence.proxy.tensormap::generic.acquire.gpu [$0], 128;", (_U64,),
    "fence_proxy_tensormap_acquire(tmap): acquire the 128-byte tensor map at global address "
    "``tmap`` (written through the generic proxy, e.g. by a host copy) for the tensor-map proxy.")
cp_async_bulk_g2s = _make_void(
    "cp_async_bulk_g2s",
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
    (_U32, _U64, _U32, _U32),
    "cp_async_bulk_g2s(dst, src, nbytes, bar): copy ``nbytes`` (a multiple of 16) from global "
    "address ``src`` to shared address ``dst`` (both 16-byte aligned); completes ``nbytes`` "
    "transaction bytes on the barrier at shared address ``bar``. One thread issues it.")
cp_async_bulk_tensor_2d_g2s = _make_void(
    "cp_async_bulk_tensor_2d_g2s",
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
    "[$0], [$1, {$2, $3}], [$4];", (_U32, _U64, _U32, _U32, _U32),
    "cp_async_bulk_tensor_2d_g2s(dst, tmap, c0, c1, bar): one box of the 2-D tensor map at "
    "global address ``tmap``, starting at element column ``c0`` and row ``c1``, to shared "
    "address ``dst`` (128-byte aligned; 1024 for the 128-byte swizzle's pattern to line up); "
    "completes the box's bytes on ``bar``. One thread issues it.")
cp_async_bulk_tensor_4d_g2s = _make_void(
    "cp_async_bulk_tensor_4d_g2s",
    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
    "[$0], [$1, {$2, $3, $4, $5}], [$6];", (_U32, _U64, _U32, _U32, _U32, _U32, _U32),
    "cp_async_bulk_tensor_4d_g2s(dst, tmap, c0, c1, c2, c3, bar): one box of the 4-D tensor map "
    "at global address ``tmap`` (`encode_tensor_map_4d`) at element coordinates innermost "
    "first (column ``c0``, row ``c1``, then the two outer dimensions) to shared address "
    "``dst`` (1024-byte aligned for the 128-byte swizzle); completes the box's bytes (the "
    "zero-filled out-of-bounds part included) on ``bar``. One thread issues it.")
cp_reduce_async_bulk_tensor_4d_add = _make_void(
    "cp_reduce_async_bulk_tensor_4d_add",
    "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group "
    "[$0, {$1, $2, $3, $4}], [$5];", (_U64, _U32, _U32, _U32, _U32, _U32),
    "cp_reduce_async_bulk_tensor_4d_add(tmap, c0, c1, c2, c3, src): add the box at shared "
    "address ``src`` (laid out as `cp_async_bulk_tensor_4d_g2s` lands one) element by element "
    "into the 4-D tensor map's box at coordinates innermost first, atomically per element "
    "(out-of-bounds elements skipped); asynchronous, in the thread's bulk group: "
    "`cp_async_bulk_commit_group`, then `cp_async_bulk_wait_group_read` before ``src`` is "
    "written again. One thread issues it.")
cp_async_bulk_commit_group = _make_void(
    "cp_async_bulk_commit_group", "cp.async.bulk.commit_group;", (),
    "Close this thread's bulk operations issued so far into one bulk group.")
cp_async_bulk_wait_group_read = _make_void(
    "cp_async_bulk_wait_group_read", "cp.async.bulk.wait_group.read 0;", (),
    "Wait until this thread's bulk groups have read their shared-memory sources.")
cp_async_bulk_wait_group = _make_void(
    "cp_async_bulk_wait_group", "cp.async.bulk.wait_group 0;", (),
    "Wait until this thread's bulk groups are complete.")
wgmma_fence = _make_void(
    "wgmma_fence", "wgmma.fence.sync.aligned;", (),
    "Order register and shared-memory accesses before the next wgmma.mma_async (all threads of "
    "the warpgroup).")
wgmma_commit_group = _make_void(
    "wgmma_commit_group", "wgmma.commit_group.sync.aligned;", (),
    "Close the wgmma.mma_async operations issued so far into one group.")


@intrinsic
def wgmma_wait_group(typingctx, n):
    """Wait until at most ``n`` (a constant 0..7) wgmma groups are pending."""
    if not isinstance(n, types.IntegerLiteral) or not 0 <= n.literal_value <= 7:
        return None
    ptx = f"wgmma.wait_group.sync.aligned {n.literal_value};"
    sig = types.void(n)

    def codegen(context, builder, sig, args):
        _asm(builder, _VOID, [], ptx, "~{memory}", [])
        return context.get_dummy_value()

    return sig, codegen


def _make_setmaxnreg(kind):
    def _setmaxnreg(typingctx, n):
        if not isinstance(n, types.IntegerLiteral):
            return None
        count = check_maxnreg(n.literal_value)
        ptx = f"setmaxnreg.{kind}.sync.aligned.u32 {count};"
        sig = types.void(n)

        def codegen(context, builder, sig, args):
            _asm(builder, _VOID, [], ptx, "~{memory}", [])
            return context.get_dummy_value()

        return sig, codegen
    _setmaxnreg.__name__ = _setmaxnreg.__qualname__ = f"setmaxnreg_{kind}"
    return intrinsic(_setmaxnreg)


setmaxnreg_inc = _make_setmaxnreg("inc")
setmaxnreg_inc.__doc__ = ("Raise this warpgroup's per-thread register limit to ``n`` (a constant, "
                          "24..256, multiple of 8); waits until the registers are free.")
setmaxnreg_dec = _make_setmaxnreg("dec")
setmaxnreg_dec.__doc__ = ("Lower this warpgroup's per-thread register limit to ``n`` (a constant, "
                          "24..256, multiple of 8), releasing the rest to the CTA's pool.")

named_barrier_sync = _make_void(
    "named_barrier_sync", "bar.sync $0, $1;", (_U32, _U32),
    "named_barrier_sync(bar_id, count): wait at CTA barrier ``bar_id`` (1..15; 0 is "
    "``cuda.syncthreads``'s) until ``count`` threads (a multiple of 32, whole warps) have "
    "arrived or synchronised on it; this warp counts as 32 of them.")
named_barrier_arrive = _make_void(
    "named_barrier_arrive", "bar.arrive $0, $1;", (_U32, _U32),
    "named_barrier_arrive(bar_id, count): count this warp's 32 threads towards barrier "
    "``bar_id``'s ``count`` without waiting (the producer side of a `named_barrier_sync`).")


@intrinsic
def f32_zeros(typingctx, n):
    """A tuple of ``n`` (a constant) float32 zeros: a fresh wgmma accumulator."""
    if not isinstance(n, types.IntegerLiteral) or not 0 < n.literal_value <= 128:
        return None
    count = n.literal_value
    sig = types.UniTuple(types.float32, count)(n)

    def codegen(context, builder, sig, args):
        zero = context.get_constant(types.float32, 0.0)
        return context.make_tuple(builder, sig.return_type, [zero] * count)

    return sig, codegen


def _wgmma_ptx(n, dtype, transposed=0):
    regs = ",".join(f"${i}" for i in range(n // 2))
    a, b, s = n // 2, n // 2 + 1, n // 2 + 2
    # scale-d is a predicate; imm-scale-a, imm-scale-b = 1 (no negation); imm-trans-a,
    # imm-trans-b = ``transposed`` (0: both operands K-major; 1: both MN-major)
    if dtype == "e4m3":     # 8-bit: k32, both operands K-major, no transpose arguments
        return ("{ .reg .pred p; "
                f"setp.ne.b32 p, ${s}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "
                f"{{{regs}}}, ${a}, ${b}, p, 1, 1; }}")
    return ("{ .reg .pred p; "
            f"setp.ne.b32 p, ${s}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} "
            f"{{{regs}}}, ${a}, ${b}, p, 1, 1, {transposed}, {transposed}; }}")


WGMMA_M64N64K16_F16_PTX = _wgmma_ptx(64, "f16")


def _make_wgmma(n, dtype):
    nreg = n // 2
    ptx = _wgmma_ptx(n, dtype)
    constraints = ",".join(["=f"] * nreg + ["l", "l", "r"] + [str(i) for i in range(nreg)])
    acc_ty = types.UniTuple(types.float32, nreg)

    def _wgmma(typingctx, desc_a, desc_b, acc, scale_d):
        if not (isinstance(desc_a, types.Integer) and isinstance(desc_b, types.Integer)
                and isinstance(scale_d, types.Integer) and acc == acc_ty):
            return None
        sig = acc_ty(types.uint64, types.uint64, acc_ty, types.uint32)

        def codegen(context, builder, sig, args):
            da = context.cast(builder, args[0], sig.args[0], types.uint64)
            db = context.cast(builder, args[1], sig.args[1], types.uint64)
            sd = context.cast(builder, args[3], sig.args[3], types.uint32)
            c = [builder.extract_value(args[2], i) for i in range(nreg)]
            res = _asm(builder, ir.LiteralStructType([_F32] * nreg),
                       [_I64, _I64, _I32] + [_F32] * nreg, ptx, constraints + ",~{memory}",
                       [da, db, sd] + c)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(res, i) for i in range(nreg)])

        return sig, codegen
    _wgmma.__name__ = _wgmma.__qualname__ = f"wgmma_m64n{n}k16_f32_{dtype}"
    return intrinsic(_wgmma)


wgmma_m64n64k16_f32_f16 = _make_wgmma(64, "f16")
wgmma_m64n64k16_f32_f16.__doc__ = (
    "wgmma_m64n64k16_f32_f16(desc_a, desc_b, acc, scale_d) -> acc: D = A B (+ acc if scale_d), "
    "A 64x16 and B 16x64 float16 in shared memory (K-major descriptors), acc a 32-tuple of "
    "float32 in the `wgmma_d_elem` layout; asynchronous: read the result after "
    "wgmma_commit_group() and wgmma_wait_group(0). All 128 threads of the warpgroup.")

wgmma_m64n64k16_f32_bf16 = _make_wgmma(64, "bf16")
wgmma_m64n64k16_f32_bf16.__doc__ = (
    "wgmma_m64n64k16_f32_bf16(desc_a, desc_b, acc, scale_d) -> acc: as "
    "`wgmma_m64n64k16_f32_f16`, A and B bfloat16.")
WGMMA_M64N64K16_BF16_PTX = _wgmma_ptx(64, "bf16")


# -- in-place forms on a float32 array (the kernels' accumulators) -------------------------------
def _wgmma_rs_ptx(n, dtype, trans_b):
    regs = ",".join(f"${i}" for i in range(n // 2))
    a = ",".join(f"${n // 2 + i}" for i in range(4))
    b, s = n // 2 + 4, n // 2 + 5
    if dtype == "e4m3":     # 8-bit: k32, B K-major, no transpose argument
        return ("{ .reg .pred p; "
                f"setp.ne.b32 p, ${s}, 0; "
                f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3 "
                f"{{{regs}}}, {{{a}}}, ${b}, p, 1, 1; }}")
    # A from four .b32 registers (no imm-trans-a); imm-scale-a, imm-scale-b = 1; imm-trans-b
    return ("{ .reg .pred p; "
            f"setp.ne.b32 p, ${s}, 0; "
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dtype}.{dtype} "
            f"{{{regs}}}, {{{a}}}, ${b}, p, 1, 1, {trans_b}; }}")


WGMMA_RS_MN_F16_PTX = _wgmma_rs_ptx(64, "f16", 1)
WGMMA_RS_MN_BF16_PTX = _wgmma_rs_ptx(64, "bf16", 1)


def _acc_pointers(context, builder, aryty, ary_value, base_value, base_type, count):
    """Pointers to ``acc[base + i]``, i < count (a 1-D float32 array)."""
    ary = context.make_array(aryty)(context, builder, value=ary_value)
    base = context.cast(builder, base_value, base_type, types.intp)
    return [cgutils.get_item_pointer(context, builder, aryty, ary,
                                     [builder.add(base, ir.Constant(base.type, i))],
                                     wraparound=False)
            for i in range(count)]


def _is_acc(acc):
    return isinstance(acc, types.Array) and acc.ndim == 1 and acc.dtype == types.float32


def _make_wgmma_ss_inplace(dtype, n=64, transposed=0):
    nreg = n // 2
    ptx = _wgmma_ptx(n, dtype, transposed)
    constraints = ",".join(["=f"] * nreg + ["l", "l", "r"] + [str(i) for i in range(nreg)])

    def _wgmma(typingctx, acc, base, desc_a, desc_b, scale_d):
        if not (_is_acc(acc) and all(isinstance(x, types.Integer)
                                     for x in (base, desc_a, desc_b, scale_d))):
            return None
        sig = types.void(acc, base, types.uint64, types.uint64, types.uint32)

        def codegen(context, builder, sig, args):
            ptrs = _acc_pointers(context, builder, sig.args[0], args[0], args[1], sig.args[1],
                                 nreg)
            da = context.cast(builder, args[2], sig.args[2], types.uint64)
            db = context.cast(builder, args[3], sig.args[3], types.uint64)
            sd = context.cast(builder, args[4], sig.args[4], types.uint32)
            res = _asm(builder, ir.LiteralStructType([_F32] * nreg),
                       [_I64, _I64, _I32] + [_F32] * nreg, ptx, constraints + ",~{memory}",
                       [da, db, sd] + [builder.load(p) for p in ptrs])
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
            return context.get_dummy_value()

        return sig, codegen
    _wgmma.__name__ = _wgmma.__qualname__ = (f"wgmma_ss_{dtype}" + ("_mn" if transposed else "")
                                             + ("" if n == 64 else f"_n{n}"))
    return intrinsic(_wgmma)


def _make_wgmma_rs_inplace(dtype, trans_b, n=64):
    nreg = n // 2
    ptx = _wgmma_rs_ptx(n, dtype, trans_b)
    constraints = ",".join(["=f"] * nreg + ["r"] * 4 + ["l", "r"]
                           + [str(i) for i in range(nreg)])

    def _wgmma(typingctx, acc, base, a0, a1, a2, a3, desc_b, scale_d):
        if not (_is_acc(acc) and all(isinstance(x, types.Integer)
                                     for x in (base, a0, a1, a2, a3, desc_b, scale_d))):
            return None
        sig = types.void(acc, base, types.uint32, types.uint32, types.uint32, types.uint32,
                         types.uint64, types.uint32)

        def codegen(context, builder, sig, args):
            ptrs = _acc_pointers(context, builder, sig.args[0], args[0], args[1], sig.args[1],
                                 nreg)
            a = [context.cast(builder, args[2 + i], sig.args[2 + i], types.uint32)
                 for i in range(4)]
            db = context.cast(builder, args[6], sig.args[6], types.uint64)
            sd = context.cast(builder, args[7], sig.args[7], types.uint32)
            res = _asm(builder, ir.LiteralStructType([_F32] * nreg),
                       [_I32] * 4 + [_I64, _I32] + [_F32] * nreg, ptx,
                       constraints + ",~{memory}", a + [db, sd] + [builder.load(p) for p in ptrs])
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
            return context.get_dummy_value()

        return sig, codegen
    _wgmma.__name__ = _wgmma.__qualname__ = f"wgmma_rs_mn_{dtype}" + ("" if n == 64 else f"_n{n}")
    return intrinsic(_wgmma)


wgmma_ss_f16 = _make_wgmma_ss_inplace("f16")
wgmma_ss_f16.__doc__ = (
    "wgmma_ss_f16(acc, base, desc_a, desc_b, scale_d): m64n64k16 float16, A and B from shared "
    "memory (K-major descriptors), D in place in ``acc[base:base + 32]`` (a 1-D float32 local "
    "array in the `wgmma_d_elem` layout; + D when ``scale_d`` is non-zero). Asynchronous: "
    "`wgmma_fence` before, then `wgmma_commit_group`, `wgmma_wait_group` and "
    "`wgmma_fence_operands` before the registers are read. All 128 threads of the warpgroup.")
wgmma_ss_bf16 = _make_wgmma_ss_inplace("bf16")
wgmma_ss_bf16.__doc__ = "As `wgmma_ss_f16`, A and B bfloat16."
wgmma_rs_mn_f16 = _make_wgmma_rs_inplace("f16", 1)
wgmma_rs_mn_f16.__doc__ = (
    "wgmma_rs_mn_f16(acc, base, a0, a1, a2, a3, desc_b, scale_d): m64n64k16 float16 with A "
    "(64 x 16) from four .b32 registers of packed halves (`wgmma_a_elem`) and B (16 x 64) from "
    "shared memory MN-major (``imm-trans-b = 1``: N contiguous, `mnmajor_offset`), D in place in "
    "``acc[base:base + 32]``; as `wgmma_ss_f16` otherwise. The A registers must not change "
    "until the wait.")
wgmma_rs_mn_bf16 = _make_wgmma_rs_inplace("bf16", 1)
wgmma_rs_mn_bf16.__doc__ = "As `wgmma_rs_mn_f16`, A and B bfloat16."
wgmma_ss_e4m3 = _make_wgmma_ss_inplace("e4m3")
wgmma_ss_e4m3.__doc__ = (
    "wgmma_ss_e4m3(acc, base, desc_a, desc_b, scale_d): m64n64k32 float8 e4m3 (float32 "
    "accumulation), A (64 x 32) and B (32 x 64) from shared memory, both K-major (8-bit "
    "operands have no transposed form; a 128-byte swizzled row holds 128 elements, one k32 "
    "step is 32 bytes as for 16-bit k16), D in place as `wgmma_ss_f16`.")
wgmma_rs_e4m3 = _make_wgmma_rs_inplace("e4m3", 0)
wgmma_rs_e4m3.__doc__ = (
    "wgmma_rs_e4m3(acc, base, a0, a1, a2, a3, desc_b, scale_d): m64n64k32 float8 e4m3 with A "
    "(64 x 32) from four .b32 registers of four e4m3 bytes each (`wgmma_a8_elem`, "
    "`pack_e4m3x4`) and B (32 x 64) K-major from shared memory; D in place as `wgmma_ss_f16`. "
    "The A registers must not change until the wait.")
WGMMA_SS_E4M3_PTX = _wgmma_ptx(64, "e4m3")
WGMMA_RS_E4M3_PTX = _wgmma_rs_ptx(64, "e4m3", 0)


@intrinsic
def pack_e4m3x4(typingctx, x0, x1, x2, x3):
    """Four float32 -> one .b32 of four float8 e4m3 (``x0`` in the lowest byte), round to
    nearest even, saturating to +-448 (``cvt.rn.satfinite.e4m3x2.f32``, sm_89 and later)."""
    if not all(isinstance(x, types.Float) for x in (x0, x1, x2, x3)):
        return None
    sig = types.uint32(types.float32, types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        vals = [context.cast(builder, a, t, types.float32) for a, t in zip(args, sig.args)]
        # cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte, b in the lower byte
        text = ("{ .reg .b16 lo, hi; "
                "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
                "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
                "mov.b32 $0, {lo, hi}; }")
        return _asm(builder, _I32, [_F32] * 4, text, "=r,f,f,f,f", vals)

    return sig, codegen


@intrinsic
def wgmma_fence_operands(typingctx, acc, base, n):
    """``acc[base:base + n]`` (``n`` a constant, 1..128) passed through an empty ``asm
    volatile`` with read-write register operands (CUTLASS's ``warpgroup_fence_operand``): placed
    after `wgmma_wait_group`, no use of the accumulator can be moved above the wait (nor a
    write to it below a later `wgmma_fence`), since the volatile statements keep their order."""
    if not (_is_acc(acc) and isinstance(base, types.Integer)
            and isinstance(n, types.IntegerLiteral) and 0 < n.literal_value <= 128):
        return None
    count = n.literal_value
    sig = types.void(acc, base, n)
    constraints = ",".join(["=f"] * count + [str(i) for i in range(count)])

    def codegen(context, builder, sig, args):
        ptrs = _acc_pointers(context, builder, sig.args[0], args[0], args[1], sig.args[1], count)
        vals = [builder.load(p) for p in ptrs]
        if count == 1:
            res = _asm(builder, _F32, [_F32], "", constraints + ",~{memory}", vals)
            builder.store(res, ptrs[0])
        else:
            res = _asm(builder, ir.LiteralStructType([_F32] * count), [_F32] * count, "",
                       constraints + ",~{memory}", vals)
            for i, p in enumerate(ptrs):
                builder.store(builder.extract_value(res, i), p)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def mbarrier_try_wait_parity(typingctx, bar, parity):
    """1 if the phase with parity ``parity`` (0 or 1) of the barrier at shared address ``bar``
    has completed, else 0 (after a bounded, hardware-chosen wait)."""
    if not (isinstance(bar, types.Integer) and isinstance(parity, types.Integer)):
        return None
    sig = types.uint32(types.uint32, types.uint32)

    def codegen(context, builder, sig, args):
        vals = _cast_all(context, builder, sig, args, (types.uint32, types.uint32))
        return _asm(builder, _I32, [_I32, _I32],
                    "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; "
                    "selp.u32 $0, 1, 0, p; }", "=r,r,r,~{memory}", vals)

    return sig, codegen


@cuda.jit(device=True, inline=True)
def mbarrier_wait_parity(bar, parity):
    """Wait until the phase with parity ``parity`` of the barrier at shared address ``bar`` has
    completed (acquire, CTA scope)."""
    while mbarrier_try_wait_parity(bar, parity) == 0:
        pass


@intrinsic
def array_addr(typingctx, arr):
    """64-bit address of the first element of ``arr`` (any array; a global address for a
    device array)."""
    if not isinstance(arr, types.Array):
        return None
    sig = types.uint64(arr)

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        return builder.ptrtoint(ary.data, _I64)

    return sig, codegen


@intrinsic
def smem_descriptor(typingctx, template, saddr):
    """``template | ((saddr & 0x3FFFF) >> 4)``: a descriptor from a template with start address
    0 (`encode_wgmma_descriptor`) and a 32-bit shared-window address (16-byte aligned)."""
    if not (isinstance(template, types.Integer) and isinstance(saddr, types.Integer)):
        return None
    sig = types.uint64(types.uint64, types.uint32)

    def codegen(context, builder, sig, args):
        tmpl, addr = _cast_all(context, builder, sig, args, (types.uint64, types.uint32))
        field = builder.lshr(builder.and_(builder.zext(addr, _I64), ir.Constant(_I64, 0x3FFFF)),
                             ir.Constant(_I64, 4))
        return builder.or_(tmpl, field)

    return sig, codegen


@cuda.jit(device=True, inline=True)
def aligned_shared_base(smem):
    """The 64-bit shared-window address of the first 1024-byte boundary (the 128-byte swizzle's
    repeat) at or after the start of the dynamic shared array ``smem``: where the Hopper kernels
    lay out their tiles (the launch asks for 1024 bytes more)."""
    raw = int64(shared_addr(smem, 0))
    return (raw + 1023) & ~int64(1023)


@cuda.jit(device=True, inline=True)
def init_ring_barriers(first, stages, consumers):
    """One thread's set-up of a TMA ring's mbarriers, 8 bytes apart from shared address
    ``first``: the resident operands' barrier (one arrival: the producer's expect_tx), then
    ``stages`` *full* barriers (one arrival each) and ``stages`` *empty* barriers
    (``consumers`` arrivals each: every consumer thread releases its stage), then the fence
    that makes the initialisation visible to the async proxy. A CTA barrier must follow
    before any other thread uses them."""
    mbarrier_init(first, 1)
    for st in range(stages):
        mbarrier_init(first + 8 + 8 * st, 1)
        mbarrier_init(first + 8 + 8 * stages + 8 * st, consumers)
    fence_mbarrier_init()


@cuda.jit(device=True, inline=True)
def descriptor_at(desc, offset):
    """The descriptor of the operand ``offset`` bytes (a multiple of 16, usually a constant)
    past ``desc``'s start address: its start-address field (bits 0-13, the address / 16) plus
    ``offset`` / 16, one 64-bit add where `smem_descriptor` is four. Exact while the address
    stays inside the 256 KiB the field spans (shared memory is at most 228 KiB an SM)."""
    return desc + uint64(offset >> 4)


# -- a warpgroup's tile products, as the Hopper kernels issue them --------------------------------
#: The widest ``n`` of ``wgmma.mma_async.m64nNk16`` (PTX ISA: N a multiple of 8 up to 256).
WGMMA_MAX_N = 256


@functools.lru_cache(maxsize=None)
def wgmma_ss(dtype: str, n: int = 64, mn_major: bool = False):
    """The in-place ``wgmma`` with both operands in shared memory (as `wgmma_ss_f16`), m64nNk16
    (``dtype`` "f16" or "bf16") or m64nNk32 ("e4m3"), D in ``acc[base:base + n // 2]``; ``n`` a
    multiple of 64 up to `WGMMA_MAX_N`. ``mn_major``: both operands MN-major (``imm-trans-a =
    imm-trans-b = 1``: A's M and B's N elements contiguous, `mnmajor_offset`; 16-bit only)."""
    _check_wide(dtype, n)
    if mn_major and dtype == "e4m3":
        raise ValueError("8-bit operands have no MN-major (transposed) form")
    return _make_wgmma_ss_inplace(dtype, n, 1 if mn_major else 0)


@functools.lru_cache(maxsize=None)
def wgmma_rs(dtype: str, n: int = 64):
    """The in-place ``wgmma`` with A from registers (as `wgmma_rs_mn_f16`: B MN-major for
    "f16"/"bf16"; K-major for "e4m3", as `wgmma_rs_e4m3`), m64nN, D in ``acc[base:base + n //
    2]``."""
    _check_wide(dtype, n)
    return _make_wgmma_rs_inplace(dtype, 0 if dtype == "e4m3" else 1, n)


def _check_wide(dtype, n):
    if dtype not in ("f16", "bf16", "e4m3"):
        raise ValueError(f"dtype must be 'f16', 'bf16' or 'e4m3', got {dtype!r}")
    if not (isinstance(n, int) and 64 <= n <= WGMMA_MAX_N and n % 64 == 0):
        raise ValueError(f"n must be a multiple of 64 in [64, {WGMMA_MAX_N}], got {n!r}")


def product_blocks(n_blocks: int) -> tuple[int, int]:
    """``(instructions, blocks_each)``: how a tile product of ``n_blocks`` x 64 output columns
    is issued per k-step: as few instructions as `WGMMA_MAX_N` allows, each of ``blocks_each``
    x 64 columns. One wide product reads its A operand from shared memory once, where m64n64
    products read it once per 64 columns: an m64n64k16 with both operands in shared memory
    moves 4 KiB in the 32 cycles of its 65,536 multiply-adds at Hopper's dense 16-bit rate,
    the 128 bytes a cycle an SM's shared memory delivers, so narrow products wait for shared
    memory (docs/kernels.md, *Wide products*)."""
    _check_int("n_blocks", n_blocks)
    if n_blocks <= 0:
        raise ValueError(f"n_blocks must be >= 1, got {n_blocks}")
    each = min(n_blocks, WGMMA_MAX_N // 64)
    if n_blocks % each:
        raise ValueError(f"n_blocks ({n_blocks}) must be a multiple of {each}")
    return n_blocks // each, each


def tile_product_abt(dtype: str, k_steps: int, n_blocks: int, template: int, k_step: int,
                     b_chunk_bytes: int, box_bytes: int):
    """A device function ``issue(acc, a, b)``: acc = A B^T as one commit group of ``k_steps``
    products per k-step of `wgmma_ss` (``dtype``), both operands from shared memory, K-major,
    as ``template`` describes them (the first k-step overwrites acc); per k-step one product of
    all ``n_blocks`` x 64 columns (up to `WGMMA_MAX_N`: `product_blocks`). A: a warpgroup's
    64 rows at shared address ``a``, one box of ``box_bytes`` per 128-byte column chunk; B:
    ``n_blocks`` x 64 rows at ``b``, ``b_chunk_bytes`` per column chunk and a box (64 rows of
    128 bytes, so that the rows of a chunk are evenly spaced and one descriptor spans them) per
    64 rows; ``k_step`` bytes a k-step inside a chunk (four a chunk)."""
    from numba import uint32
    count, each = product_blocks(n_blocks)
    if each > 1 and box_bytes != 64 * SWIZZLE_128B_ROW:
        raise ValueError(f"a wide product needs boxes of 64 rows of {SWIZZLE_128B_ROW} bytes "
                         f"({64 * SWIZZLE_128B_ROW}), got box_bytes={box_bytes}")
    mma_ss = wgmma_ss(dtype, 64 * each)
    KS, NI, EACH, TMPL, STEP, CHUNK, BOX = (k_steps, count, each, template, k_step,
                                            b_chunk_bytes, box_bytes)

    @cuda.jit(device=True, inline=True)
    def issue(acc, a, b):
        # -- descriptors: each operand's once, then moved by the constant offset of each
        # k-step and block (`descriptor_at`) --
        da0 = smem_descriptor(TMPL, a)
        db0 = smem_descriptor(TMPL, b)
        for kk in range(KS):
            cc = kk // 4
            da = descriptor_at(da0, cc * BOX + (kk % 4) * STEP)
            for ni in range(NI):
                db = descriptor_at(db0, cc * CHUNK + ni * EACH * BOX + (kk % 4) * STEP)
                mma_ss(acc, 32 * EACH * ni, da, db, uint32(1 if kk > 0 else 0))
        wgmma_commit_group()
    return issue


def tile_product_ab(dtype: str, k_steps: int, n_blocks: int, template: int, k_step: int,
                    b_chunk_bytes: int):
    """A device function ``issue(acc, pa, b)``: acc += A B as one commit group of ``k_steps``
    products per k-step of `wgmma_rs` (``dtype``: A from registers, four words ``pa[4 kc ..]``
    a k-step, `wgmma_a_elem`; B from shared memory as ``template`` describes it), per k-step one
    product of all ``n_blocks`` x 64 output columns (up to `WGMMA_MAX_N`: `product_blocks`):
    B at ``b``, ``b_chunk_bytes`` per block of 64 output columns (the distance the template's
    leading byte offset gives, MN-major; K-major "e4m3": 64 rows of 128 bytes), ``k_step`` bytes
    a k-step."""
    from numba import uint32
    count, each = product_blocks(n_blocks)
    if each > 1:
        lbo = decode_wgmma_descriptor(template).leading_byte_offset
        if dtype != "e4m3" and lbo != b_chunk_bytes:
            raise ValueError(f"a wide MN-major product needs the template's leading byte "
                             f"offset ({lbo}) equal to b_chunk_bytes ({b_chunk_bytes})")
        if dtype == "e4m3" and b_chunk_bytes != 64 * SWIZZLE_128B_ROW:
            raise ValueError(f"a wide K-major product needs blocks of 64 rows of "
                             f"{SWIZZLE_128B_ROW} bytes, got b_chunk_bytes={b_chunk_bytes}")
    mma_rs = wgmma_rs(dtype, 64 * each)
    PS, NI, EACH, TMPL, STEP, CHUNK = k_steps, count, each, template, k_step, b_chunk_bytes

    @cuda.jit(device=True, inline=True)
    def issue(acc, pa, b):
        db0 = smem_descriptor(TMPL, b)
        for kc in range(PS):
            for ni in range(NI):
                db = descriptor_at(db0, ni * EACH * CHUNK + kc * STEP)
                mma_rs(acc, 32 * EACH * ni, pa[4 * kc], pa[4 * kc + 1], pa[4 * kc + 2],
                       pa[4 * kc + 3], db, uint32(1))
        wgmma_commit_group()
    return issue


def tile_product_mn(dtype: str, k_steps: int, n_blocks: int, a_template: int, b_template: int,
                    b_region_bytes: int, b_chunk_bytes: int):
    """A device function ``issue(acc, a, b)``: acc = A B as one commit group of ``k_steps``
    products per k-step of `wgmma_ss` with both operands MN-major (``dtype`` "f16"/"bf16"): A
    (64 x 16 k) at ``a``, its K rows one swizzle row (128 bytes) apart, as ``a_template``
    describes it (a k16 step moves it 16 rows); B (K x ``n_blocks`` x 64) at ``b`` in regions of
    64 K rows (``b_region_bytes`` apart; a TMA box of 64 rows per block of 64 columns,
    ``b_chunk_bytes`` apart, as ``b_template`` describes them). The first k-step overwrites acc.
    The atomic-dQ dK/dV kernel's dQ = dS K: dS^T (keys x queries) as its warpgroups stored it,
    K as TMA landed it."""
    from numba import uint32
    count, each = product_blocks(n_blocks)
    if each > 1 and decode_wgmma_descriptor(b_template).leading_byte_offset != b_chunk_bytes:
        raise ValueError("a wide MN-major product needs the B template's leading byte offset "
                         f"equal to b_chunk_bytes ({b_chunk_bytes})")
    mma_ss = wgmma_ss(dtype, 64 * each, mn_major=True)
    KS, NI, EACH, A_T, B_T = k_steps, count, each, a_template, b_template
    STEP = 16 * SWIZZLE_128B_ROW
    REGION, CHUNK = b_region_bytes, b_chunk_bytes

    @cuda.jit(device=True, inline=True)
    def issue(acc, a, b):
        da0 = smem_descriptor(A_T, a)
        db0 = smem_descriptor(B_T, b)
        for kk in range(KS):
            da = descriptor_at(da0, kk * STEP)
            for ni in range(NI):
                db = descriptor_at(db0, (kk // 4) * REGION + (kk % 4) * STEP + ni * EACH * CHUNK)
                mma_ss(acc, 32 * EACH * ni, da, db, uint32(1 if kk > 0 else 0))
        wgmma_commit_group()
    return issue
