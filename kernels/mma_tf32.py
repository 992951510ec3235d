"""PTX inline-assembly intrinsics for the 3xTF32 tensor-core kernel (float32-exact products).

This module owns the TF32 warp-level instructions that `kernels.flash_tf32_fwd` needs on top of
`kernels.mma` (whose ``cp.async``, ``ex2``, ``shared_addr`` and ``global_addr`` it reuses):

* ``mma_tf32``: ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``, D = A B + C on one warp;
  A is four .b32 registers (one tf32 each), B two, C and D four float32. Fragment layouts:
  `kernels.fragments_tf32`.
* ``cvt_tf32`` (``cvt.rna.tf32.f32``: round to nearest, ties away from zero, to a 10-bit
  mantissa; the result is a .b32 whose low 13 bits are zero) and ``split_tf32``: a float32 x
  as ``big = tf32(x)`` and ``small = tf32(x - big)`` (x - big is exact in float32), the operand
  split of 3xTF32: ``A B ~= A_small B_big + A_big B_small + A_big B_big`` with float32
  accumulation has float32-level accuracy (the dropped ``A_small B_small`` and the rounding of
  ``small`` are ~2**-22 relative to each product).
* ``ld_shared_f32`` / ``ld_shared_f32x2``: 32- and 64-bit (``ld.shared.v2.f32``) shared-memory
  loads from a 32-bit shared-window address (`kernels.mma.shared_addr`);
  ``ld_shared_v4_f32`` / ``ld_shared_v4_b32`` / ``st_shared_v4_b32``: 128-bit shared loads and
  stores (four float32, or four .b32 TF32 words), ``ld_shared_b32``: one .b32 word — the
  pre-split big/small tiles of the forward and backward kernels.

None of this runs under the CUDA simulator; tested on a real GPU in
``tests/test_tf32_intrinsics.py``.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic

from kernels.mma import _asm

__all__ = ["mma_tf32", "cvt_tf32", "split_tf32", "ld_shared_f32", "ld_shared_f32x2",
           "ld_shared_v4_f32", "ld_shared_v4_b32", "st_shared_v4_b32", "ld_shared_b32",
           "MMA_TF32_PTX"]

_I32 = ir.IntType(32)
_F32 = ir.FloatType()

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
    """float32 x -> (big, small) tf32 bits: big = tf32(x), small = tf32(x - big)."""
    sig = types.UniTuple(types.uint32, 2)(types.float32)

    def codegen(context, builder, sig, args):
        xv = context.cast(builder, args[0], sig.args[0], types.float32)
        res = _asm(builder, ir.LiteralStructType([_I32, _I32]), [_F32],
                   "{ .reg .b32 tb; .reg .f32 tr; cvt.rna.tf32.f32 tb, $2; "
                   "sub.f32 tr, $2, tb; cvt.rna.tf32.f32 $1, tr; mov.b32 $0, tb; }",
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
