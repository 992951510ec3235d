"""PTX inline-assembly intrinsics for the kernels: tensor-core mma, ldmatrix, cp.async, TF32.

This module owns the warp-level instructions that Numba does not expose and that a
FlashAttention-style kernel needs, each emitted as PTX through llvmlite's ``ir.InlineAsm``:

* ``mma_f16`` / ``mma_bf16``: ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.*.f32``,
  D = A B + C on one warp; A is four .b32 registers (two halves each), B two, C and D four
  float32. Fragment layouts: `kernels.fragments`. ``mma_pair(mma_op)``: the kernels' usual
  step, one A fragment times the two B fragments of an ``ldmatrix_x4`` into two adjacent
  accumulator tiles (an inline device function).
* ``mma_tf32``: ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``, D = A B + C on one warp;
  A is four .b32 registers (one tf32 each), B two, C and D four float32. Fragment layouts:
  `kernels.fragments_tf32`.
* ``ldmatrix_x4`` / ``ldmatrix_x4_trans``: four 8x8 16-bit matrices from shared memory straight
  into fragment registers (each lane gives one row address).
* ``cp_async_16`` / ``cp_async_16_ca`` + ``cp_async_commit`` + ``cp_async_wait_all`` /
  ``cp_async_wait_1`` / ``cp_async_wait_2`` / ``cp_async_wait_3``:
  asynchronous 16-byte global -> shared copies (``cp.async.cg``, or ``cp.async.ca`` through
  L1 for a stream read once), zero-filled when the source size is 0, so a tail tile needs no
  branch; commit/wait groups give pipelines of two to four buffers.
* ``ex2`` (``ex2.approx.ftz.f32``), ``pack_f16x2`` / ``pack_bf16x2`` (``cvt.rn.*x2.f32``),
  ``shared_addr`` (32-bit shared-window address of a shared-array element), ``global_addr``
  (64-bit address of an element of a 4-D array, honouring its strides), ``ld_global_u32`` /
  ``st_global_u32`` (32-bit loads/stores of packed halves), ``ld_global_u8``.
* ``cvt_tf32`` (``cvt.rna.tf32.f32``: round to nearest, ties away from zero, to a 10-bit
  mantissa; the result is a .b32 whose low 13 bits are zero) and ``split_tf32``: a float32 x
  as ``big`` = x truncated to TF32 (its low 13 bits cleared) and ``small`` = x - big (exact in
  float32) plus half a TF32 ulp in its bits, which the tensor core then truncates: ``small``
  rounded to nearest, ties away (CUTLASS's ``NumericConverterFastF32`` with
  ``round_toward_zero`` and ``round_half_ulp_truncate``, as SDPA EFFICIENT's float32 kernels
  split). The operand split of 3xTF32: ``A B ~= A_small B_big + A_big B_small + A_big B_big``
  with float32 accumulation; the dropped ``A_small B_small`` and the rounding of ``small`` are
  at most ~2**-19 of ``|A| |B|`` per product (|small| < 2**-10 |x|). Three PTX instructions
  (and, sub, add), where the two ``cvt.rna.tf32`` of a rounded split took eight SASS
  instructions on sm_90, which has no instruction for it. A NaN keeps NaN in ``big``; an infinity gives an infinite ``big``.
* ``ld_shared_f32`` / ``ld_shared_f32x2``: 32- and 64-bit (``ld.shared.v2.f32``) shared-memory
  loads from a 32-bit shared-window address (``shared_addr``); ``ld_shared_v4_f32`` /
  ``ld_shared_v4_b32`` / ``st_shared_v4_b32``: 128-bit shared loads and stores (four float32,
  or four .b32 TF32 words), ``ld_shared_b32``: one .b32 word; ``st_shared_b16``: one half.
* ``red_global_add_f32``: ``red.global.add.f32``, a float32 added to global memory atomically
  with no value back (dQ accumulated by the dK/dV kernel, `kernels.mma_bwd`);
  ``red_global_add_v2_f32``: two consecutive float32 at an 8-byte aligned address in one
  instruction (``red.global.add.v2.f32``, sm_90).

None of this runs under the CUDA simulator (it cannot execute PTX); the kernels that use it are
tested on a real GPU (``pytest -m gpu``), the fragment maps on the CPU.
"""
from __future__ import annotations

import functools

from llvmlite import ir
from numba import cuda, types
from numba.cuda import cgutils
from numba.cuda.extending import intrinsic

__all__ = [
    "mma_f16", "mma_bf16", "mma_pair", "ldmatrix_x4", "ldmatrix_x4_trans", "cp_async_16",
    "cp_async_16_ca",
    "cp_async_commit", "cp_async_wait_all", "cp_async_wait_1", "cp_async_wait_2", "cp_async_wait_3", "ex2", "pack_f16x2",
    "pack_bf16x2", "shared_addr", "global_addr", "ld_global_u32", "st_global_u32",
    "ld_global_u8", "MMA_F16_PTX", "MMA_BF16_PTX",
    "mma_tf32", "cvt_tf32", "split_tf32", "ld_shared_f32", "ld_shared_f32x2",
    "ld_shared_v4_f32", "ld_shared_v4_b32", "st_shared_v4_b32", "ld_shared_b32", "st_shared_b32",
    "st_shared_b16",
    "st_shared_v2_f32", "atom_add_acq_rel",
    "MMA_TF32_PTX",
    "red_global_add_f32", "red_global_add_v2_f32",
]

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()

MMA_F16_PTX = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")
MMA_BF16_PTX = MMA_F16_PTX.replace(".f16.f16.", ".bf16.bf16.")


def _asm(builder, ret_ty, arg_tys, text, constraints, args, side_effect=False):
    fnty = ir.FunctionType(ret_ty, arg_tys)
    return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=side_effect), args)


def _make_mma(ptx):
    @intrinsic
    def _mma(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
        u32, f32 = types.uint32, types.float32
        sig = types.UniTuple(f32, 4)(u32, u32, u32, u32, u32, u32, f32, f32, f32, f32)

        def codegen(context, builder, sig, args):
            ints = [context.cast(builder, v, t, u32) for v, t in zip(args[:6], sig.args[:6])]
            flts = [context.cast(builder, v, t, f32) for v, t in zip(args[6:], sig.args[6:])]
            ret = ir.LiteralStructType([_F32] * 4)
            res = _asm(builder, ret, [_I32] * 6 + [_F32] * 4, ptx,
                       "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", ints + flts)
            vals = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen
    return _mma


mma_f16 = _make_mma(MMA_F16_PTX)
mma_f16.__doc__ = "D = A B + C, m16n8k16, f16 inputs, f32 accumulate (one warp, all lanes)."
mma_bf16 = _make_mma(MMA_BF16_PTX)
mma_bf16.__doc__ = "D = A B + C, m16n8k16, bf16 inputs, f32 accumulate (one warp, all lanes)."


@functools.cache
def mma_pair(mma_op):
    """The inline device function of the kernels' usual step, two ``mma_op`` products (``mma_f16``
    or ``mma_bf16``) of one A fragment with the two B fragments of one ``ldmatrix_x4``::

        mma_pair(a0, a1, a2, a3, b, acc, j)

    ``acc[j : j + 4] += A (b[0], b[1])`` and ``acc[j + 4 : j + 8] += A (b[2], b[3])``: two
    adjacent 16x8 tiles of the float32 accumulator array ``acc``."""
    @cuda.jit(device=True, inline=True)
    def pair(a0, a1, a2, a3, b, acc, j):
        d0 = mma_op(a0, a1, a2, a3, b[0], b[1], acc[j], acc[j + 1], acc[j + 2], acc[j + 3])
        d1 = mma_op(a0, a1, a2, a3, b[2], b[3], acc[j + 4], acc[j + 5], acc[j + 6], acc[j + 7])
        for i in range(4):
            acc[j + i] = d0[i]
            acc[j + 4 + i] = d1[i]
    return pair


def _make_ldmatrix(trans):
    ptx = ("ldmatrix.sync.aligned.m8n8.x4" + (".trans" if trans else "")
           + ".shared.b16 {$0,$1,$2,$3}, [$4];")

    @intrinsic
    def _ldmatrix(typingctx, saddr):
        sig = types.UniTuple(types.uint32, 4)(types.uint32)

        def codegen(context, builder, sig, args):
            addr = context.cast(builder, args[0], sig.args[0], types.uint32)
            res = _asm(builder, ir.LiteralStructType([_I32] * 4), [_I32], ptx,
                       "=r,=r,=r,=r,r,~{memory}", [addr], side_effect=True)
            vals = [builder.extract_value(res, i) for i in range(4)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen
    return _ldmatrix


ldmatrix_x4 = _make_ldmatrix(False)
ldmatrix_x4.__doc__ = "Four 8x8 b16 matrices from shared memory (row addresses from lanes 0..31)."
ldmatrix_x4_trans = _make_ldmatrix(True)
ldmatrix_x4_trans.__doc__ = "As ldmatrix_x4, each 8x8 matrix transposed on the way."


@intrinsic
def shared_addr(typingctx, arr, index):
    """32-bit shared-window address of ``arr[index]`` (``arr`` a 1-D shared array)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(index, types.Integer)):
        return None
    sig = types.uint32(arr, index)

    def codegen(context, builder, sig, args):
        aryty, idxty = sig.args
        ary = context.make_array(aryty)(context, builder, value=args[0])
        idx = context.cast(builder, args[1], idxty, types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)
        generic = builder.ptrtoint(ptr, _I64)
        return _asm(builder, _I32, [_I64],
                    "{ .reg .u64 t; cvta.to.shared.u64 t, $1; cvt.u32.u64 $0, t; }",
                    "=r,l", [generic])

    return sig, codegen


@intrinsic
def atom_add_acq_rel(typingctx, arr, index, value):
    """``atom.acq_rel.gpu.global.add.u32``: add ``value`` to ``arr[index]`` (a 1-D int32 array
    in global memory) and return the old value, as a release of what this thread (and, through
    a barrier before it, its block) wrote and an acquire of what the releases it reads from
    made visible: a ticket with no ``fence.sc`` on either side."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int32
            and isinstance(index, types.Integer) and isinstance(value, types.Integer)):
        return None
    sig = types.int32(arr, index, value)

    def codegen(context, builder, sig, args):
        aryty, idxty, valty = sig.args
        ary = context.make_array(aryty)(context, builder, value=args[0])
        idx = context.cast(builder, args[1], idxty, types.intp)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)
        val = context.cast(builder, args[2], valty, types.int32)
        return _asm(builder, _I32, [_I64, _I32], "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;",
                    "=r,l,r,~{memory}", [builder.ptrtoint(ptr, _I64), val], side_effect=True)

    return sig, codegen


@intrinsic
def global_addr(typingctx, arr, i0, i1, i2, i3):
    """64-bit address of ``arr[i0, i1, i2, i3]`` (a 4-D array in global memory, any strides)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 4):
        return None
    sig = types.uint64(arr, i0, i1, i2, i3)

    def codegen(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, value=args[0])
        idx = [context.cast(builder, v, t, types.intp) for v, t in zip(args[1:], sig.args[1:])]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, idx, wraparound=False)
        return builder.ptrtoint(ptr, _I64)

    return sig, codegen


def _make_cp_async_16(cache_op: str, doc: str):
    @intrinsic
    def _cp(typingctx, saddr, gaddr, src_bytes):
        sig = types.void(types.uint32, types.uint64, types.uint32)

        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, v, t, s) for v, t, s in
                    zip(args, sig.args, (types.uint32, types.uint64, types.uint32))]
            _asm(builder, ir.VoidType(), [_I32, _I64, _I32],
                 f"cp.async.{cache_op}.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}",
                 vals, side_effect=True)
            return context.get_dummy_value()

        return sig, codegen
    _cp.__doc__ = doc
    return _cp


cp_async_16 = _make_cp_async_16(
    "cg", "``cp_async_16(saddr, gaddr, src_bytes)``: asynchronous 16-byte copy global -> shared "
    "(``cp.async.cg``: L1 bypassed); bytes past ``src_bytes`` (0 or 16) are zeroed. The tiled "
    "kernels' copies, whose tiles many programs read again from L2.")
cp_async_16_ca = _make_cp_async_16(
    "ca", "``cp_async_16_ca(saddr, gaddr, src_bytes)``: as `cp_async_16`, through L1 "
    "(``cp.async.ca``). A warp's 512 contiguous bytes then reach L2 as four 128-byte requests "
    "of 16 sectors, where ``.cg`` makes about ten of 24 sectors (Nsight Compute on an H200); "
    "the split-KV decoding kernel streams its cache with it (docs/kernels.md).")


def _make_nullary(ptx, doc):
    @intrinsic
    def _f(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            _asm(builder, ir.VoidType(), [], ptx, "~{memory}", [], side_effect=True)
            return context.get_dummy_value()

        return sig, codegen
    _f.__doc__ = doc
    return _f


cp_async_commit = _make_nullary("cp.async.commit_group;", "Close the current cp.async group.")
cp_async_wait_all = _make_nullary("cp.async.wait_group 0;", "Wait until no cp.async group is pending.")
cp_async_wait_1 = _make_nullary("cp.async.wait_group 1;", "Wait until at most one group is pending.")
cp_async_wait_2 = _make_nullary("cp.async.wait_group 2;", "Wait until at most two groups pend.")
cp_async_wait_3 = _make_nullary("cp.async.wait_group 3;", "Wait until at most three groups pend.")


@intrinsic
def ex2(typingctx, x):
    """2**x in float32 (``ex2.approx.ftz.f32``; ex2(-inf) = 0)."""
    sig = types.float32(types.float32)

    def codegen(context, builder, sig, args):
        return _asm(builder, _F32, [_F32], "ex2.approx.ftz.f32 $0, $1;", "=f,f", list(args))

    return sig, codegen


def _make_pack(kind):
    @intrinsic
    def _pack(typingctx, lo, hi):
        sig = types.uint32(types.float32, types.float32)

        def codegen(context, builder, sig, args):
            lo_v = context.cast(builder, args[0], sig.args[0], types.float32)
            hi_v = context.cast(builder, args[1], sig.args[1], types.float32)
            # cvt.rn.f16x2.f32 d, a, b puts a in the upper half, b in the lower half
            return _asm(builder, _I32, [_F32, _F32], f"cvt.rn.{kind}x2.f32 $0, $1, $2;",
                        "=r,f,f", [hi_v, lo_v])

        return sig, codegen
    return _pack


pack_f16x2 = _make_pack("f16")
pack_f16x2.__doc__ = "Two float32 -> one .b32 of two f16 (``lo`` in the low 16 bits), round to nearest."
pack_bf16x2 = _make_pack("bf16")
pack_bf16x2.__doc__ = "Two float32 -> one .b32 of two bf16 (``lo`` in the low 16 bits), round to nearest."


@intrinsic
def ld_global_u32(typingctx, gaddr):
    """32-bit load from a global address."""
    sig = types.uint32(types.uint64)

    def codegen(context, builder, sig, args):
        return _asm(builder, _I32, [_I64], "ld.global.u32 $0, [$1];", "=r,l,~{memory}",
                    list(args), side_effect=True)

    return sig, codegen


@intrinsic
def ld_global_u8(typingctx, gaddr):
    """8-bit load (zero-extended to 32 bits) from a global address."""
    sig = types.uint32(types.uint64)

    def codegen(context, builder, sig, args):
        return _asm(builder, _I32, [_I64], "ld.global.u8 $0, [$1];", "=r,l,~{memory}",
                    list(args), side_effect=True)

    return sig, codegen


@intrinsic
def st_global_u32(typingctx, gaddr, value):
    """32-bit store to a global address."""
    sig = types.void(types.uint64, types.uint32)

    def codegen(context, builder, sig, args):
        val = context.cast(builder, args[1], sig.args[1], types.uint32)
        _asm(builder, ir.VoidType(), [_I64, _I32], "st.global.u32 [$0], $1;", "l,r,~{memory}",
             [args[0], val], side_effect=True)
        return context.get_dummy_value()

    return sig, codegen


# -- appended for the backward (kernels.mma_bwd) -------------------------------------------
def _make_unpack(ptx):
    @intrinsic
    def _unpack(typingctx, word):
        sig = types.UniTuple(types.float32, 2)(types.uint32)

        def codegen(context, builder, sig, args):
            w = context.cast(builder, args[0], sig.args[0], types.uint32)
            res = _asm(builder, ir.LiteralStructType([_F32, _F32]), [_I32], ptx, "=f,=f,r", [w])
            vals = [builder.extract_value(res, i) for i in range(2)]
            return context.make_tuple(builder, sig.return_type, vals)

        return sig, codegen
    return _unpack


unpack_f16x2 = _make_unpack(
    "{ .reg .f16 lo, hi; mov.b32 {lo, hi}, $2; cvt.f32.f16 $0, lo; cvt.f32.f16 $1, hi; }")
unpack_f16x2.__doc__ = "One .b32 of two f16 -> (low, high) as float32 (inverse of pack_f16x2)."
unpack_bf16x2 = _make_unpack(
    "{ .reg .b32 t; shl.b32 t, $2, 16; mov.b32 $0, t; and.b32 t, $2, 0xFFFF0000; mov.b32 $1, t; }")
unpack_bf16x2.__doc__ = "One .b32 of two bf16 -> (low, high) as float32 (inverse of pack_bf16x2)."
__all__ += ["unpack_f16x2", "unpack_bf16x2"]


# -- TF32 (3xTF32 kernels) ----------------------------------------------------------------------
MMA_TF32_PTX = ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};")


@intrinsic
def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """D = A B + C, m16n8k8, tf32 inputs (.b32 registers), f32 accumulate (one warp, all lanes)."""
    u32, f32 = types.uint32, types.float32
    sig = types.UniTuple(f32, 4)(u32, u32, u32, u32, u32, u32, f32, f32, f32, f32)

    def codegen(context, builder, sig, args):
        ints = [context.cast(builder, v, t, u32) for v, t in zip(args[:6], sig.args[:6])]
        flts = [context.cast(builder, v, t, f32) for v, t in zip(args[6:], sig.args[6:])]
        ret = ir.LiteralStructType([_F32] * 4)
        res = _asm(builder, ret, [_I32] * 6 + [_F32] * 4, MMA_TF32_PTX,
                   "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3", ints + flts)
        vals = [builder.extract_value(res, i) for i in range(4)]
        return context.make_tuple(builder, sig.return_type, vals)

    return sig, codegen


@intrinsic
def cvt_tf32(typingctx, x):
    """float32 -> tf32 bits (``cvt.rna.tf32.f32``; low 13 bits zero)."""
    sig = types.uint32(types.float32)

    def codegen(context, builder, sig, args):
        xv = context.cast(builder, args[0], sig.args[0], types.float32)
        return _asm(builder, _I32, [_F32], "cvt.rna.tf32.f32 $0, $1;", "=r,f", [xv])

    return sig, codegen


@intrinsic
def split_tf32(typingctx, x):
    """float32 x -> (big, small) .b32 operands of ``mma_tf32``: big = x with its low 13 bits
    cleared (truncated to TF32), small = the bits of x - big plus 0x1000 (half a TF32 ulp; the
    tensor core ignores the low 13 bits, so it reads x - big rounded to nearest, ties away)."""
    sig = types.UniTuple(types.uint32, 2)(types.float32)

    def codegen(context, builder, sig, args):
        xv = context.cast(builder, args[0], sig.args[0], types.float32)
        res = _asm(builder, ir.LiteralStructType([_I32, _I32]), [_F32],
                   "{ .reg .b32 tb, ts; .reg .f32 tr; and.b32 tb, $2, 0xFFFFE000; "
                   "sub.f32 tr, $2, tb; mov.b32 ts, tr; add.u32 $1, ts, 0x1000; mov.b32 $0, tb; }",
                   "=r,=r,f", [xv])
        vals = [builder.extract_value(res, i) for i in range(2)]
        return context.make_tuple(builder, sig.return_type, vals)

    return sig, codegen


def _ld_shared(n, elem):
    """An intrinsic ``saddr -> value`` (n = 1) or ``-> n-tuple`` (n = 2, 4): ``n`` consecutive
    32-bit words of type ``elem`` (float32 or uint32, the latter for TF32 operands) from a
    shared-window address aligned to 4 n bytes, in one ``ld.shared`` (vector for n > 1)."""
    ptx, ir_ty, reg = {types.float32: ("f32", _F32, "f"), types.uint32: ("b32", _I32, "r")}[elem]
    if n == 1:
        asm, ret_ir, ret_ty = f"ld.shared.{ptx} $0, [$1];", ir_ty, elem
    else:
        regs = ",".join(f"${i}" for i in range(n))
        asm = f"ld.shared.v{n}.{ptx} {{{regs}}}, [${n}];"
        ret_ir, ret_ty = ir.LiteralStructType([ir_ty] * n), types.UniTuple(elem, n)
    constraints = ",".join([f"={reg}"] * n) + ",r,~{memory}"

    @intrinsic
    def ld_shared(typingctx, saddr):
        sig = ret_ty(types.uint32)

        def codegen(context, builder, sig, args):
            addr = context.cast(builder, args[0], sig.args[0], types.uint32)
            res = _asm(builder, ret_ir, [_I32], asm, constraints, [addr], side_effect=True)
            if n == 1:
                return res
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(res, i) for i in range(n)])
        return sig, codegen

    return ld_shared


#: 32-bit float load from a shared-window address.
ld_shared_f32 = _ld_shared(1, types.float32)
#: Two consecutive floats from an 8-byte aligned shared-window address (one 64-bit load).
ld_shared_f32x2 = _ld_shared(2, types.float32)
#: Four float32 from shared memory, one 128-bit load (16-byte aligned address).
ld_shared_v4_f32 = _ld_shared(4, types.float32)
#: Four .b32 words (TF32 operands) from shared memory, one 128-bit load.
ld_shared_v4_b32 = _ld_shared(4, types.uint32)
#: One .b32 word from shared memory.
ld_shared_b32 = _ld_shared(1, types.uint32)


@intrinsic
def st_shared_v4_b32(typingctx, saddr, x0, x1, x2, x3):
    """Four .b32 words to shared memory, one 128-bit store."""
    sig = types.void(types.uint32, types.uint32, types.uint32, types.uint32, types.uint32)

    def codegen(context, builder, sig, args):
        vals = [context.cast(builder, a, t, types.uint32) for a, t in zip(args, sig.args)]
        _asm(builder, ir.VoidType(), [_I32] * 5,
             "st.shared.v4.b32 [$0], {$1,$2,$3,$4};", "r,r,r,r,r,~{memory}", vals,
             side_effect=True)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def st_shared_b32(typingctx, saddr, x):
    """One .b32 word to a 4-byte aligned shared-window address."""
    sig = types.void(types.uint32, types.uint32)

    def codegen(context, builder, sig, args):
        addr, val = (context.cast(builder, a, t, types.uint32) for a, t in zip(args, sig.args))
        _asm(builder, ir.VoidType(), [_I32, _I32], "st.shared.b32 [$0], $1;", "r,r,~{memory}",
             [addr, val], side_effect=True)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def st_shared_v2_f32(typingctx, saddr, x0, x1):
    """Two float32 to an 8-byte aligned shared-window address, one 64-bit store."""
    sig = types.void(types.uint32, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        addr = context.cast(builder, args[0], sig.args[0], types.uint32)
        _asm(builder, ir.VoidType(), [_I32, _F32, _F32], "st.shared.v2.f32 [$0], {$1,$2};",
             "r,f,f,~{memory}", [addr, args[1], args[2]], side_effect=True)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def st_shared_b16(typingctx, saddr, value):
    """The low 16 bits of a 32-bit word (one half of a packed pair) to a shared-window address
    (``st.shared.b16``)."""
    sig = types.void(types.uint32, types.uint32)

    def codegen(context, builder, sig, args):
        addr, val = (context.cast(builder, a, t, types.uint32) for a, t in zip(args, sig.args))
        _asm(builder, ir.VoidType(), [_I32, ir.IntType(16)], "st.shared.b16 [$0], $1;",
             "r,h,~{memory}", [addr, builder.trunc(val, ir.IntType(16))], side_effect=True)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def red_global_add_f32(typingctx, gaddr, value):
    """``red.global.add.f32``: add a float32 to a global address, atomically, no value back
    (the FlashAttention-2-structured backward's dQ accumulation)."""
    sig = types.void(types.uint64, types.float32)

    def codegen(context, builder, sig, args):
        val = context.cast(builder, args[1], sig.args[1], types.float32)
        _asm(builder, ir.VoidType(), [_I64, _F32], "red.global.add.f32 [$0], $1;",
             "l,f,~{memory}", [args[0], val], side_effect=True)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def red_global_add_v2_f32(typingctx, gaddr, x, y):
    """``red.global.add.v2.f32``: add two float32 to two consecutive floats at an 8-byte aligned
    global address, atomically (each element), no value back; sm_90 and later."""
    sig = types.void(types.uint64, types.float32, types.float32)

    def codegen(context, builder, sig, args):
        xv = context.cast(builder, args[1], sig.args[1], types.float32)
        yv = context.cast(builder, args[2], sig.args[2], types.float32)
        _asm(builder, ir.VoidType(), [_I64, _F32, _F32], "red.global.add.v2.f32 [$0], {$1, $2};",
             "l,f,f,~{memory}", [args[0], xv, yv], side_effect=True)
        return context.get_dummy_value()

    return sig, codegen
