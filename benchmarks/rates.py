"""Command ``rates``: the hardware rates of this GPU (memory bandwidths, latencies, instruction throughputs, launch cost) measured by microbenchmarks.

    python -m benchmarks rates [--only dram,l2,smem,clock,mma,wgmma,wgmma-wait,ffma,ex2,cp-async,launch,decode]
                               [--quick] [--repeats 10] [--out FILE.json]
    python -m benchmarks rates --only wgmma --add-to results/rates_h100_2026-11-24.json
    python -m benchmarks rates --to-profile sim/profiles/h200.json --from RATES.json

The time model's profiles (`sim.profiles`) carry datasheet peaks; this command measures what
the GPU achieves, once per GPU, and writes a rates file (schema ``ioaware.rates/1``) that a
profile takes only when asked: ``sim.load_profile("h100", rates=FILE)``. Each rate is the
median over ``--repeats`` timed launches (at least; more while under 0.4 s of timed work)
after a warm-up launch, timed by CUDA events behind a device-side sleep
(`benchmarks.common.time_cuda` ``timing="device"``: the GPU's time only), with the rates at
the 90th and 10th percentile times as ``range``. The groups (``--only``):

* ``dram``: ``dram_read_bytes_per_s``, ``dram_write_bytes_per_s``, ``dram_copy_bytes_per_s``:
  16-byte vector loads (``ld.global.cg.v4``) / stores (``st.global.v4``) over buffers of
  max(1 GiB, 8x L2), 256 threads a block, 4 vectors a thread, a grid of many waves; copy counts
  the bytes read and written;
* ``l2``: ``l2_read_bytes_per_s``, the read kernel over a buffer of about L2 / 4 (the largest
  power of two under it) read again and again (the grid wraps around it), L1 bypassed;
  ``l2_hit_latency_s``, one thread chasing pointers through that buffer (a random cycle of
  128-byte lines, ``ld.global.cg``): time / loads;
* ``smem``: ``smem_read_bytes_per_s_per_sm`` (and ``smem_read_bytes_per_clk_per_sm`` with the
  measured clock): conflict-free 4-byte ``ld.shared`` (lane i reads word i of a 128-byte row),
  8 blocks of 256 threads per SM; ``smem_read_conflict32_bytes_per_s_per_sm``: lane i reads
  word 32 i + c, every load 32-way bank-conflicted (useful bytes counted);
* ``clock``: ``sm_clock_hz``, cycles of a spin kernel (``torch.cuda._sleep``) over its time,
  measured after the memory groups (the GPU busy for seconds: the clock it runs kernels at);
* ``mma``: ``mma_fp16_flops_per_s``, ``mma_bf16_flops_per_s`` (``mma.sync`` m16n8k16, f32
  accumulate), ``mma_tf32_flops_per_s`` (m16n8k8), 4 independent accumulators per warp,
  4 blocks of 8 warps per SM (2 m n k FLOPs per instruction);
* ``wgmma``: ``wgmma_fp16_flops_per_s``, ``wgmma_bf16_flops_per_s`` (``wgmma.mma_async``
  m64n64k16, f32 accumulate), ``wgmma_fp8_flops_per_s`` (m64n64k32, e4m3): Hopper's warpgroup
  products with A and B from shared memory (zeros; K-major, 128-byte swizzle, as
  `kernels.wgmma_fwd` lays them out), 8 products per commit group alternating 2 accumulators,
  ``wgmma.wait_group 1`` (a group in flight while the next is issued), 2 warpgroups a block,
  2 blocks per SM, 8 waves of blocks (2 x 64 x 64 x k FLOPs per instruction per warpgroup);
  sm_90a only (compute capability 9.0);
* ``wgmma-wait``: ``wgmma_wait_latency_s``, ``wgmma_dependent_product_s``: one warpgroup alone
  on each SM issues commit groups of a dependent chain of 1 and of 4 float16 m64n64k16
  products into one accumulator and waits for each (``wgmma.wait_group 0``, the accumulator
  read back); the time per group against the chain's length is a line, its intercept the wait
  latency (what a waited-for group costs beyond its products), its slope a product's time in
  a dependent chain; sm_90a only. The wgmma backward's plan prices its consumer warpgroups'
  three or four waits a tile with the first (the "wait" level of `sim.plan`, docs/model.md);
* ``ffma``: ``ffma_flops_per_s``, 8 independent float32 FMA chains per thread (2 FLOPs each);
* ``ex2``: ``ex2_ops_per_s``, 8 independent chains ``x = ex2(-x)`` (``ex2.approx.ftz.f32``);
* ``cp-async``: ``cp_async_depth{1,2,3}_bytes_per_s``, a DRAM -> shared copy loop of
  ``cp.async.cg`` 16-byte copies (128 threads, 8 KiB tiles, 2 blocks per SM) with 1, 2 or 3
  tiles in flight per block, each tile read from shared memory once it lands;
* ``launch``: ``kernel_launch_s``, host seconds per launch of an empty kernel launched back to
  back through `kernels.host.launch` (the product's launch path), and ``kernel_launch_numba_s``
  through Numba's ``kernel[grid, block, stream]()``;
* ``decode``: the split-KV decoding kernel's own figures (`measure_decode`): its stream rate at
  1 to 128 programs, the fixed GPU time of a call, the fill of a longer stream and the merge's
  handoff, on shapes of one KV head a sequence (no decoding benchmark's).

``--to-profile PROFILE.json --from RATES.json`` writes the decode group of a rates file into a
GPU profile (``sim/profiles/h200.json``) as its ``decode_rates``: the decoding launcher picks
its split count with them on that GPU without any rates file (`sim.decode.split_kv_plan`).

``--add-to FILE`` measures the ``--only`` groups and writes FILE, a rates file of this GPU
(the same GPU name), with their rates added or replaced and its other rates as they were; its
provenance lists each such run under ``groups_added`` (groups, date, command, code version,
kernels fingerprint, GPU, sizes): ``--out`` writes the result elsewhere instead.

Rate names and units are `sim.profiles.RATE_UNITS`. ``--quick`` uses smaller sizes (for a
smoke test; less accurate). Needs a CUDA GPU and torch; under Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) it runs every kernel at tiny sizes with wall-clock times (the
values are not hardware rates; the file says ``"simulator": true``), which is how the tests run
it. Rates that need compute capability 8.0 (``mma.sync``, ``cp.async``), 9.0 (``wgmma``, which
the simulator cannot run either) or a clock are listed under ``skipped`` with the reason where
they cannot be measured.
"""
from __future__ import annotations

import argparse
import functools
import re
import sys
import time
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from numba import cuda      # a module global: the CUDA simulator swaps it in kernels' globals

from .common import command_line, first_sentence, provenance, time_cuda, write_json

SCHEMA = "ioaware.rates/1"
#: The groups, in the order they run (the clock after seconds of load: at the clock the other
#: kernels run at).
GROUPS = ("dram", "l2", "smem", "clock", "mma", "wgmma", "wgmma-wait", "ffma", "ex2",
          "cp-async", "launch", "decode")
#: Accumulator chains (registers) per thread in the FFMA and ex2 kernels, and how many steps of
#: each chain one trip of the loop makes (a constant trip count: the loop is unrolled).
CHAINS, UNROLL = 8, 16
#: Independent mma accumulators per warp.
MMA_CHAINS = 4
#: Shared-memory kernel: float32 words per block (two halves, alternated per iteration), loads
#: per iteration per thread.
SMEM_WORDS, SMEM_LOADS = 2048, 8
#: The fixed point of x = 2**-x (what every ex2 chain converges to).
EX2_FIXED_POINT = 0.6411857445049859
#: K of the mma shapes: m16n8k16 (fp16, bf16) and m16n8k8 (tf32).
MMA_K = {"fp16": 16, "bf16": 16, "tf32": 8}
#: One in every element of A and B, as the packed registers hold it.
MMA_ONES = {"fp16": 0x3C003C00, "bf16": 0x3F803F80, "tf32": 0x3F800000}
#: K of the wgmma shapes: m64n64k16 (fp16, bf16) and m64n64k32 (fp8, e4m3).
WGMMA_K = {"fp16": 16, "bf16": 16, "fp8": 32}
#: wgmma products per commit group (unrolled), accumulators (32 float32 registers a thread each)
#: they alternate between, warpgroups (128 threads) per block.
WGMMA_UNROLL, WGMMA_ACCS, WGMMA_WARPGROUPS = 8, 2, 2
#: Products per commit group of the ``wgmma-wait`` kernels (each group waited for before the
#: next is issued), a dependent chain into one accumulator: the short and the long chain.
WGMMA_WAIT_CHAINS = (1, 4)
#: Threads of a ``wgmma-wait`` block: one warpgroup.
WAIT_THREADS = 128
_MAGIC = 0x9E3779B9       # a value the read kernels' XOR is never expected to equal


# ------------------------------------------------------------------------------------------------
# sizes
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sizes:
    """How much work each microbenchmark does (``preset``: "full", "quick" or "tiny", the
    simulator's). Bytes are per buffer; ``*_per_sm`` counts blocks per SM."""
    preset: str
    threads: int            # threads per block (DRAM, L2, smem, mma, FFMA, ex2)
    per_thread: int         # 16-byte vectors per thread (DRAM, L2)
    dram_bytes: int
    l2_buffer_bytes: int
    l2_read_bytes: int      # bytes read by one launch of the L2 kernel
    chase_bytes: int
    chase_stride: int       # bytes between two nodes of the pointer chase
    chase_steps: int
    smem_per_sm: int
    smem_iters: int
    mma_per_sm: int
    mma_iters: int
    wgmma_per_sm: int       # blocks of WGMMA_WARPGROUPS warpgroups
    wgmma_waves: int        # grid: num_sms x wgmma_per_sm x wgmma_waves blocks
    wgmma_iters: int        # commit groups per warpgroup
    wgmma_wait_iters: int   # waited-for groups per warpgroup (wgmma-wait: one block per SM)
    flop_per_sm: int        # FFMA and ex2
    ffma_iters: int
    ex2_iters: int
    cp_threads: int
    cp_per_thread: int      # 16-byte copies per thread per tile
    cp_per_sm: int
    cp_bytes: int
    launches: int
    repeats: int


def _pow2_floor(x: int) -> int:
    return 1 << (max(int(x), 1).bit_length() - 1)


def sizes_for(preset: str, num_sms: int, l2_bytes: int, repeats: int | None = None) -> Sizes:
    """The sizes of ``preset`` for a GPU of ``num_sms`` SMs and ``l2_bytes`` of L2."""
    if preset == "tiny":
        s = Sizes("tiny", threads=32, per_thread=2, dram_bytes=4096, l2_buffer_bytes=1024,
                  l2_read_bytes=4096, chase_bytes=512, chase_stride=32, chase_steps=40,
                  smem_per_sm=1, smem_iters=2, mma_per_sm=1, mma_iters=2, wgmma_per_sm=1,
                  wgmma_waves=1, wgmma_iters=2, wgmma_wait_iters=2, flop_per_sm=1,
                  ffma_iters=2, ex2_iters=2, cp_threads=32, cp_per_thread=1, cp_per_sm=2,
                  cp_bytes=3 * 2 * 32 * 16, launches=3, repeats=1)
    elif preset in ("full", "quick"):
        quick = preset == "quick"
        l2_buf = _pow2_floor(l2_bytes // 4)
        s = Sizes(preset, threads=256, per_thread=4,
                  dram_bytes=(2**28 if quick else max(2**30, 1 << (8 * l2_bytes - 1).bit_length())),
                  l2_buffer_bytes=l2_buf, l2_read_bytes=2**29 if quick else 2**32,
                  chase_bytes=min(l2_buf, 4 * 2**20), chase_stride=128,
                  chase_steps=5_000 if quick else 100_000,
                  smem_per_sm=8, smem_iters=256 if quick else 4096,
                  mma_per_sm=4, mma_iters=512 if quick else 8192,
                  wgmma_per_sm=2, wgmma_waves=8, wgmma_iters=256 if quick else 2048,
                  wgmma_wait_iters=2000 if quick else 20000,
                  flop_per_sm=8, ffma_iters=64 if quick else 1024, ex2_iters=8 if quick else 128,
                  cp_threads=128, cp_per_thread=4, cp_per_sm=2,
                  cp_bytes=2**28 if quick else 2**30,
                  launches=200 if quick else 2000, repeats=3 if quick else 10)
    else:
        raise ValueError(f"preset must be full, quick or tiny, got {preset!r}")
    if repeats is not None:
        s = Sizes(**dict(asdict(s), repeats=int(repeats)))
    return s


# ------------------------------------------------------------------------------------------------
# the operations the kernels are made of: PTX on a GPU, Python stand-ins in the simulator
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _ptx_intrinsics():
    """The PTX this module adds to `kernels.ptx`, through the same mechanism (llvmlite inline
    assembly in a Numba intrinsic): ``elem_addr`` (64-bit address of an element of a 1-D
    array), ``ld_cg_v4`` (``ld.global.cg.v4.u32``: 16 bytes, cached in L2 only), ``st_v4``
    (``st.global.v4.u32``), ``ld_cg_u32`` (``ld.global.cg.u32``), ``ld_volatile_shared_f32``
    (``ld.volatile.shared.f32``: a shared load ``ptxas`` must issue every time; a plain
    ``ld.shared`` of an address read before, with no store between, is merged by ``ptxas``, which
    made the shared-memory rate read 2.3x the hardware's 128 bytes per clock) and
    ``cp_async_wait_2`` (``cp.async.wait_group 2``)."""
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    i32, i64 = ir.IntType(32), ir.IntType(64)

    def asm(builder, ret, args_ir, text, constraints, args):
        fnty = ir.FunctionType(ret, args_ir)
        return builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)

    @intrinsic
    def elem_addr(typingctx, arr, index):
        if not (isinstance(arr, types.Array) and arr.ndim == 1
                and isinstance(index, types.Integer)):
            return None
        sig = types.uint64(arr, index)

        def codegen(context, builder, sig, args):
            aryty, idxty = sig.args
            ary = context.make_array(aryty)(context, builder, value=args[0])
            idx = context.cast(builder, args[1], idxty, types.intp)
            ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx], wraparound=False)
            return builder.ptrtoint(ptr, i64)
        return sig, codegen

    @intrinsic
    def ld_cg_v4(typingctx, addr):
        sig = types.UniTuple(types.uint32, 4)(types.uint64)

        def codegen(context, builder, sig, args):
            res = asm(builder, ir.LiteralStructType([i32] * 4), [i64],
                      "ld.global.cg.v4.u32 {$0,$1,$2,$3}, [$4];", "=r,=r,=r,=r,l,~{memory}",
                      [args[0]])
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(res, i) for i in range(4)])
        return sig, codegen

    @intrinsic
    def st_v4(typingctx, addr, x0, x1, x2, x3):
        sig = types.void(types.uint64, types.uint32, types.uint32, types.uint32, types.uint32)

        def codegen(context, builder, sig, args):
            vals = [context.cast(builder, a, t, s) for a, t, s in zip(args, sig.args, sig.args)]
            asm(builder, ir.VoidType(), [i64] + [i32] * 4, "st.global.v4.u32 [$0], {$1,$2,$3,$4};",
                "l,r,r,r,r,~{memory}", vals)
            return context.get_dummy_value()
        return sig, codegen

    @intrinsic
    def ld_cg_u32(typingctx, addr):
        sig = types.uint32(types.uint64)

        def codegen(context, builder, sig, args):
            return asm(builder, i32, [i64], "ld.global.cg.u32 $0, [$1];", "=r,l,~{memory}",
                       [args[0]])
        return sig, codegen

    @intrinsic
    def ld_volatile_shared_f32(typingctx, saddr):
        sig = types.float32(types.uint32)

        def codegen(context, builder, sig, args):
            return asm(builder, ir.FloatType(), [i32], "ld.volatile.shared.f32 $0, [$1];",
                       "=f,r,~{memory}", [args[0]])
        return sig, codegen

    @intrinsic
    def cp_async_wait_2(typingctx):
        sig = types.void()

        def codegen(context, builder, sig, args):
            asm(builder, ir.VoidType(), [], "cp.async.wait_group 2;", "~{memory}", [])
            return context.get_dummy_value()
        return sig, codegen

    return SimpleNamespace(elem_addr=elem_addr, ld_cg_v4=ld_cg_v4, st_v4=st_v4,
                           ld_cg_u32=ld_cg_u32, ld_volatile_shared_f32=ld_volatile_shared_f32,
                           cp_async_wait_2=cp_async_wait_2)


@functools.lru_cache(maxsize=None)
def _gpu_ops():

    from kernels import ptx
    x = _ptx_intrinsics()
    elem_addr, ld_cg_v4, st_v4, ld_cg_u32 = x.elem_addr, x.ld_cg_v4, x.st_v4, x.ld_cg_u32
    wait2 = x.cp_async_wait_2
    shared_addr, cp_async_16 = ptx.shared_addr, ptx.cp_async_16
    ld_shared_f32 = x.ld_volatile_shared_f32
    commit, wait_all, wait_1 = ptx.cp_async_commit, ptx.cp_async_wait_all, ptx.cp_async_wait_1
    dev = cuda.jit(device=True, inline=True)

    @dev
    def ld4(buf, i):
        return ld_cg_v4(elem_addr(buf, i))

    @dev
    def st4(buf, i, a, b, c, d):
        st_v4(elem_addr(buf, i), a, b, c, d)

    @dev
    def ld1(buf, i):
        return ld_cg_u32(elem_addr(buf, i))

    @dev
    def smem_base(sm):
        return shared_addr(sm, 0)

    @dev
    def lds(sm, addr):
        return ld_shared_f32(addr)

    @dev
    def cp16(sm, sidx, src, gidx):
        cp_async_16(shared_addr(sm, sidx), elem_addr(src, gidx), 16)

    @dev
    def wait0():
        wait_all()

    @dev
    def wait1():
        wait_1()

    @dev
    def wait2_():
        wait2()

    return SimpleNamespace(ld4=ld4, st4=st4, ld1=ld1, smem_base=smem_base, lds=lds, cp16=cp16,
                           commit=commit, wait0=wait0, wait1=wait1, wait2=wait2_,
                           mma={"fp16": ptx.mma_f16, "bf16": ptx.mma_bf16, "tf32": ptx.mma_tf32},
                           ex2=ptx.ex2)


def _operand_value(word, dtype):
    """The number in the low element of a packed mma operand register (simulator stand-in)."""
    import numpy as np
    w = int(word) & 0xFFFFFFFF
    if dtype == "fp16":
        return float(np.array([w & 0xFFFF], np.uint16).view(np.float16)[0])
    if dtype == "bf16":
        return float(np.array([(w & 0xFFFF) << 16], np.uint32).view(np.float32)[0])
    return float(np.array([w], np.uint32).view(np.float32)[0])


@functools.lru_cache(maxsize=None)
def _simulator_ops():
    """Python stand-ins of the PTX operations (the simulator runs no inline PTX): the same
    results for what the kernels here do with them. The mma stand-in is exact for operands
    whose elements are all equal (what the kernel uses): D = C + K a b."""
    import numpy as np
    dev = cuda.jit(device=True, inline=True)

    @dev
    def ld4(buf, i):
        return buf[i], buf[i + 1], buf[i + 2], buf[i + 3]

    @dev
    def st4(buf, i, a, b, c, d):
        buf[i], buf[i + 1], buf[i + 2], buf[i + 3] = a, b, c, d

    @dev
    def ld1(buf, i):
        return buf[i]

    @dev
    def smem_base(sm):
        return 0

    @dev
    def lds(sm, addr):
        return sm[addr // 4]

    @dev
    def cp16(sm, sidx, src, gidx):
        for j in range(4):
            sm[sidx + j] = src[gidx + j]

    @dev
    def nothing():
        pass

    def make_mma(dtype):
        k = MMA_K[dtype]

        @dev
        def mma(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
            ab = np.float32(k * _operand_value(a0, dtype) * _operand_value(b0, dtype))
            return c0 + ab, c1 + ab, c2 + ab, c3 + ab
        return mma

    @dev
    def ex2(x):
        return np.float32(2.0) ** x

    return SimpleNamespace(ld4=ld4, st4=st4, ld1=ld1, smem_base=smem_base, lds=lds, cp16=cp16,
                           commit=nothing, wait0=nothing, wait1=nothing, wait2=nothing,
                           mma={d: make_mma(d) for d in MMA_K}, ex2=ex2)


def simulator() -> bool:
    """Whether Numba's CUDA simulator runs the kernels."""
    from kernels import host
    return host.simulator()


def ops():
    """The operations of the current target (`_gpu_ops` on a GPU, `_simulator_ops`)."""
    return _simulator_ops() if simulator() else _gpu_ops()


# ------------------------------------------------------------------------------------------------
# the kernels
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def dram_kernels(threads: int, per_thread: int):
    """``(read, write, copy)`` over uint32 (int32) word buffers in 16-byte vectors. Block b,
    thread t touches vectors ``(b * per_thread + k) * threads + t`` (k < per_thread), wrapped
    by ``mask`` (number of vectors - 1, a power of two): coalesced, each vector once where the
    grid covers the buffer exactly, again and again where the buffer is smaller (L2).

    * ``read(buf, mask, sink, keep)``: XOR of the words read; ``keep``: written to
      ``sink[global thread]``, else only where it equals a magic value (never, in practice);
    * ``write(buf, mask)``: vector v gets the words ``v, v + 1, v + 2, v + 3``;
    * ``copy(src, dst, mask)``: dst = src."""
    from numba import uint32
    o = ops()
    ld4, st4 = o.ld4, o.st4
    span = threads * per_thread

    @cuda.jit
    def read(buf, mask, sink, keep):
        first = cuda.blockIdx.x * span + cuda.threadIdx.x
        acc = uint32(0)
        for k in range(per_thread):
            v = (first + k * threads) & mask
            w = ld4(buf, v * 4)
            acc ^= w[0] ^ w[1] ^ w[2] ^ w[3]
        if keep:
            sink[cuda.grid(1)] = acc
        elif acc == _MAGIC:
            sink[0] = acc

    @cuda.jit
    def write(buf, mask):
        first = cuda.blockIdx.x * span + cuda.threadIdx.x
        for k in range(per_thread):
            v = (first + k * threads) & mask
            st4(buf, v * 4, v, v + 1, v + 2, v + 3)

    @cuda.jit
    def copy(src, dst, mask):
        first = cuda.blockIdx.x * span + cuda.threadIdx.x
        for k in range(per_thread):
            v = (first + k * threads) & mask
            w = ld4(src, v * 4)
            st4(dst, v * 4, w[0], w[1], w[2], w[3])

    return read, write, copy


@functools.lru_cache(maxsize=None)
def chase_kernel():
    """``chase(nxt, start, steps, out)``: one thread follows ``j = nxt[j]`` ``steps`` times
    from ``start`` (``ld.global.cg``: L1 bypassed) and writes the last ``j`` to ``out[0]``."""
    from numba import uint32
    ld1 = ops().ld1

    @cuda.jit
    def chase(nxt, start, steps, out):
        j = uint32(start)
        for _ in range(steps):
            j = ld1(nxt, j)
        out[0] = j

    return chase


def chase_buffer(n_bytes: int, stride: int, seed: int = 0):
    """``(nxt, start)``: uint32 words where node ``i`` (at word ``i * stride / 4``) holds the
    word index of the next node of one random cycle through every node."""
    import numpy as np
    words, step = n_bytes // 4, stride // 4
    nodes = words // step
    order = np.random.default_rng(seed).permutation(nodes) * step
    nxt = np.zeros(words, np.uint32)
    nxt[order] = np.roll(order, -1)
    return nxt, int(order[0])


@functools.lru_cache(maxsize=None)
def smem_kernel(threads: int, conflicted: bool):
    """``smem(out, iters)``: each block fills ``SMEM_WORDS`` float32 shared words with ``j % 8``,
    then every thread makes ``iters x SMEM_LOADS`` 4-byte shared loads (``ld.volatile.shared.f32``,
    which neither LLVM nor ``ptxas`` may hoist out of the loop or merge) and writes their sum to ``out[global thread]``.
    Conflict-free: lane l's load c reads word ``l + 32 c`` (one 128-byte row per load, every
    bank once); ``conflicted``: word ``32 l + c`` (all 32 lanes in one bank: 32-way conflict)."""
    from numba import float32
    o = ops()
    smem_base, lds = o.smem_base, o.lds
    lane_bytes, step_bytes = (128, 4) if conflicted else (4, 128)

    @cuda.jit
    def smem(out, iters):
        sm = cuda.shared.array(SMEM_WORDS, float32)
        tid = cuda.threadIdx.x
        for j in range(tid, SMEM_WORDS, threads):
            sm[j] = float32(j % 8)
        cuda.syncthreads()
        row = smem_base(sm) + (tid % 32) * lane_bytes
        acc = float32(0)
        for _ in range(iters):
            for c in range(SMEM_LOADS):
                acc += lds(sm, row + c * step_bytes)
        out[cuda.grid(1)] = acc

    return smem


def smem_expected(threads: int, conflicted: bool, iters: int):
    """What `smem_kernel` writes for each thread of a block (float64)."""
    import numpy as np
    lane = np.arange(threads) % 32
    words = [(32 * lane + c if conflicted else lane + 32 * c) for c in range(SMEM_LOADS)]
    return iters * sum(w % 8 for w in words).astype(float)


@functools.lru_cache(maxsize=None)
def mma_kernel(dtype: str):
    """``mma(operands, out, iters)``: every warp runs ``MMA_CHAINS`` independent accumulator
    chains of ``iters`` ``mma.sync`` each (m16n8k16 for fp16/bf16, m16n8k8 for tf32, f32
    accumulate) on the operand registers ``operands[0:4]`` (A) and ``operands[4:6]`` (B), from
    C = 0, and writes the sum of its 16 accumulator registers to ``out[global thread]``. With
    every element of A and B equal to 1 each register ends at ``iters * K``."""
    from numba import float32
    op = ops().mma[dtype]

    @cuda.jit
    def mma(operands, out, iters):
        a0, a1, a2, a3 = operands[0], operands[1], operands[2], operands[3]
        b0, b1 = operands[4], operands[5]
        z = float32(0)
        c00, c01, c02, c03, c10, c11, c12, c13 = z, z, z, z, z, z, z, z
        c20, c21, c22, c23, c30, c31, c32, c33 = z, z, z, z, z, z, z, z
        for _ in range(iters):
            c00, c01, c02, c03 = op(a0, a1, a2, a3, b0, b1, c00, c01, c02, c03)
            c10, c11, c12, c13 = op(a0, a1, a2, a3, b0, b1, c10, c11, c12, c13)
            c20, c21, c22, c23 = op(a0, a1, a2, a3, b0, b1, c20, c21, c22, c23)
            c30, c31, c32, c33 = op(a0, a1, a2, a3, b0, b1, c30, c31, c32, c33)
        out[cuda.grid(1)] = (((c00 + c01) + (c02 + c03)) + ((c10 + c11) + (c12 + c13))
                             + ((c20 + c21) + (c22 + c23)) + ((c30 + c31) + (c32 + c33)))

    return mma


@functools.lru_cache(maxsize=None)
def wgmma_kernel(dtype: str):
    """``wg(iters, flag, out)``, sm_90a only (no simulator stand-in): the block zeroes a 64 x 64
    A tile and a 64 x 64 B tile (8 KiB each, K-major rows of 128 bytes, 128-byte swizzle: the
    layout `kernels.wgmma_fwd` reads) in shared memory; then each of its `WGMMA_WARPGROUPS`
    warpgroups runs ``iters`` commit groups of `WGMMA_UNROLL` ``wgmma.mma_async`` A B products
    (m64n64k16 for fp16/bf16, m64n64k32 for fp8 e4m3; product u at k-step u % 4 of the tiles),
    both operands from shared memory, alternating `WGMMA_ACCS` float32 accumulators, each
    group followed by ``wgmma.wait_group 1`` (one group left in flight), every product on
    straight-line code (ptxas serialises wgmma issued on a divergent path). Where ``flag`` is
    non-zero each thread writes the sum of its accumulator registers (0) to ``out[global
    thread]``. ``wg.threads``, ``wg.launch_bounds``: its block and launch bounds."""
    return _wgmma_loop_kernel(dtype, WGMMA_WARPGROUPS, WGMMA_ACCS, WGMMA_UNROLL, 1, 2)


@functools.lru_cache(maxsize=None)
def wgmma_wait_kernel(chain: int):
    """``ww(iters, flag, out)``, sm_90a only: one warpgroup (a block, one per SM) zeroes a 64 x
    64 A and B tile in shared memory as `wgmma_kernel` does, then runs ``iters`` commit groups
    of ``chain`` float16 ``wgmma.mma_async`` m64n64k16 products into one accumulator (a
    dependent chain, product u at k-step u % 4), each group followed by ``wgmma.wait_group 0``
    and `wgmma_fence_operands` (the accumulator read back, as the kernels do before their
    element-wise work): a group's time from issue to the end of its wait. ``flag``, ``out``:
    as `wgmma_kernel`'s."""
    return _wgmma_loop_kernel("fp16", WAIT_THREADS // 128, 1, int(chain), 0, 1)


def _wgmma_loop_kernel(dtype: str, warpgroups: int, accumulators: int, per_group: int,
                       in_flight: int, blocks_per_sm: int):
    """The kernel both wgmma groups time: ``warpgroups`` warpgroups a block (``blocks_per_sm``
    in its launch bounds) run ``iters`` commit groups of ``per_group`` products of ``dtype``
    (accumulator u % ``accumulators``, k-step u % 4), each group followed by
    ``wgmma.wait_group in_flight``; with ``in_flight`` 0 the accumulator is read back
    (`wgmma_fence_operands`) after every wait, else after the last."""
    from numba import float32, uint16, uint32

    from kernels import hopper as hp
    from kernels import ptx
    mma = {"fp16": hp.wgmma_ss_f16, "bf16": hp.wgmma_ss_bf16, "fp8": hp.wgmma_ss_e4m3}[dtype]
    lbo, sbo, step = hp.kmajor_strides("128B", 64)   # e4m3: the same bytes (128 a row, k32 = 32)
    tmpl = hp.encode_wgmma_descriptor(0, lbo, sbo, "128B")
    threads = hp.WARPGROUP * warpgroups
    words = 2 * 64 * 64                              # 16-bit words of A and B
    ACCS, PER_GROUP, IN_FLIGHT = accumulators, per_group, in_flight
    nacc = 32 * ACCS
    bounds = (threads, blocks_per_sm)

    @cuda.jit(launch_bounds=bounds)
    def wg(iters, flag, out):
        sm = cuda.shared.array(words, uint16, alignment=1024)
        tid = cuda.threadIdx.x
        for j in range(tid, words, threads):
            sm[j] = uint16(0)
        hp.fence_proxy_async()          # ordinary stores -> visible to wgmma
        cuda.syncthreads()
        a = ptx.shared_addr(sm, 0)
        b = ptx.shared_addr(sm, words // 2)
        acc = cuda.local.array(nacc, float32)
        for r in range(nacc):
            acc[r] = float32(0)
        hp.wgmma_fence_operands(acc, 0, nacc)   # opaque to LLVM: no first trip peeled off
        for _ in range(iters):
            hp.wgmma_fence()
            for u in range(PER_GROUP):
                mma(acc, 32 * (u % ACCS), hp.smem_descriptor(tmpl, a + (u % 4) * step),
                    hp.smem_descriptor(tmpl, b + (u % 4) * step), uint32(1))
            hp.wgmma_commit_group()
            hp.wgmma_wait_group(IN_FLIGHT)
            if IN_FLIGHT == 0:
                hp.wgmma_fence_operands(acc, 0, nacc)
        if IN_FLIGHT != 0:
            hp.wgmma_wait_group(0)
            hp.wgmma_fence_operands(acc, 0, nacc)
        if flag:
            s = float32(0)
            for r in range(nacc):
                s += acc[r]
            out[cuda.grid(1)] = s

    wg.threads, wg.launch_bounds = threads, bounds
    return wg


@functools.lru_cache(maxsize=None)
def ffma_kernel():
    """``ffma(x0, a, b, iters, out)``: ``CHAINS`` independent chains per thread, chain c from
    ``x0 + c``, each step ``x = x * a + b`` (one FFMA), ``iters x UNROLL`` steps; writes the sum
    of the chains to ``out[global thread]``. With a = b = 1: ``CHAINS x0 + 28 + CHAINS x iters x
    UNROLL``."""
    from numba import float32

    @cuda.jit
    def ffma(x0, a, b, iters, out):
        x_0, x_1, x_2, x_3 = x0, x0 + float32(1), x0 + float32(2), x0 + float32(3)
        x_4, x_5, x_6, x_7 = x0 + float32(4), x0 + float32(5), x0 + float32(6), x0 + float32(7)
        for _ in range(iters):
            for _ in range(UNROLL):
                x_0 = x_0 * a + b
                x_1 = x_1 * a + b
                x_2 = x_2 * a + b
                x_3 = x_3 * a + b
                x_4 = x_4 * a + b
                x_5 = x_5 * a + b
                x_6 = x_6 * a + b
                x_7 = x_7 * a + b
        out[cuda.grid(1)] = ((x_0 + x_1) + (x_2 + x_3)) + ((x_4 + x_5) + (x_6 + x_7))

    return ffma


@functools.lru_cache(maxsize=None)
def ex2_kernel():
    """``ex2k(x0, iters, out)``: ``CHAINS`` independent chains per thread, chain c from
    ``x0 + c / 8``, each step ``x = ex2(-x)`` (one ``ex2.approx.ftz.f32``), ``iters x UNROLL``
    steps; writes the sum of the chains to ``out[global thread]`` (each chain converges to
    `EX2_FIXED_POINT`)."""
    from numba import float32
    ex2 = ops().ex2

    @cuda.jit
    def ex2k(x0, iters, out):
        e = float32(0.125)
        x_0, x_1, x_2, x_3 = x0, x0 + e, x0 + float32(2) * e, x0 + float32(3) * e
        x_4, x_5 = x0 + float32(4) * e, x0 + float32(5) * e
        x_6, x_7 = x0 + float32(6) * e, x0 + float32(7) * e
        for _ in range(iters):
            for _ in range(UNROLL):
                x_0 = ex2(-x_0)
                x_1 = ex2(-x_1)
                x_2 = ex2(-x_2)
                x_3 = ex2(-x_3)
                x_4 = ex2(-x_4)
                x_5 = ex2(-x_5)
                x_6 = ex2(-x_6)
                x_7 = ex2(-x_7)
        out[cuda.grid(1)] = ((x_0 + x_1) + (x_2 + x_3)) + ((x_4 + x_5) + (x_6 + x_7))

    return ex2k


@functools.lru_cache(maxsize=None)
def cp_async_kernel(depth: int, threads: int, per_thread: int):
    """``cp(src, tiles, out)``: block b copies tiles ``b, b + grid, b + 2 grid, ...`` (``tiles``
    of them, ``threads x per_thread`` 16-byte chunks each) of the uint32 buffer ``src`` into
    shared memory with ``cp.async`` and ``depth`` tiles in flight (``depth`` shared stages;
    after issuing tile t + depth - 1 it waits until tile t has landed:
    ``cp.async.wait_group depth - 1``), then every thread XORs the chunks its neighbour
    (``t + 1``) copied into ``out[global thread]``; the XOR of ``out`` is the XOR of the words
    copied."""
    if depth not in (1, 2, 3):
        raise ValueError(f"depth must be 1, 2 or 3, got {depth!r}")
    from numba import uint32
    o = ops()
    cp16, commit, wait0, wait1, wait2 = o.cp16, o.commit, o.wait0, o.wait1, o.wait2
    stage = threads * per_thread * 4        # words of one tile
    words = depth * stage                   # shared words (a constant of the kernel)

    @cuda.jit(device=True, inline=True)
    def issue(sm, src, tile, nblk, blk, tid):
        g = (tile * nblk + blk) * stage
        s = (tile % depth) * stage
        for k in range(per_thread):
            w = (k * threads + tid) * 4
            cp16(sm, s + w, src, g + w)

    @cuda.jit
    def cp(src, tiles, out):
        sm = cuda.shared.array(words, uint32)
        tid = cuda.threadIdx.x
        nblk = cuda.gridDim.x
        blk = cuda.blockIdx.x
        peer = (tid + 1) % threads
        acc = uint32(0)
        for t in range(depth - 1):
            if t < tiles:
                issue(sm, src, t, nblk, blk, tid)
            commit()
        for t in range(tiles):
            if t + depth - 1 < tiles:
                issue(sm, src, t + depth - 1, nblk, blk, tid)
            commit()
            if depth == 1:
                wait0()
            elif depth == 2:
                wait1()
            else:
                wait2()
            cuda.syncthreads()
            s = (t % depth) * stage
            for k in range(per_thread):
                w = s + (k * threads + peer) * 4
                acc ^= sm[w] ^ sm[w + 1] ^ sm[w + 2] ^ sm[w + 3]
            cuda.syncthreads()
        out[cuda.grid(1)] = acc

    return cp


@functools.lru_cache(maxsize=None)
def empty_kernel():
    """A kernel that does nothing (the launch cost alone)."""

    @cuda.jit
    def empty():
        return

    return empty


# ------------------------------------------------------------------------------------------------
# where the kernels run: a GPU through torch and kernels.host, or the simulator
# ------------------------------------------------------------------------------------------------

class Device:
    """The target the microbenchmarks run on: a CUDA GPU (torch tensors, launches through
    `kernels.host.launch` on torch's current stream, CUDA-event times behind a device-side
    sleep) or, where ``torch`` is None, Numba's CUDA simulator (NumPy arrays, wall-clock times)."""

    def __init__(self, torch=None, repeats=10):
        self.torch, self.repeats = torch, int(repeats)
        self.simulator = torch is None
        if self.simulator:
            self.name, self.num_sms, self.l2_bytes, self.cc = "Numba CUDA simulator", 1, 4096, None
            self._stream = 0
            return
        from kernels import host
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        self.name = torch.cuda.get_device_name()
        self.num_sms = int(props.multi_processor_count)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
        self.cc = (int(props.major), int(props.minor))
        self._stream = host.launch_stream(torch.empty(1, device="cuda"))

    def array(self, n, kind="u32", fill=None):
        """A device array of ``n`` 32-bit words (``kind`` "u32": int32 words, "f32": float32),
        ``fill`` "random" (random bits), a NumPy array, or None (zeros)."""
        import numpy as np
        if self.simulator:
            dt = np.uint32 if kind == "u32" else np.float32
            if isinstance(fill, np.ndarray):
                return fill.astype(dt)
            if fill == "random":
                return np.random.default_rng(0).integers(0, 2**32, n, dtype=np.uint64).astype(dt)
            return np.zeros(n, dt)
        torch = self.torch
        dt = torch.int32 if kind == "u32" else torch.float32
        if isinstance(fill, np.ndarray):
            return torch.from_numpy(fill.astype(np.uint32 if kind == "u32" else np.float32)
                                    .view(np.int32 if kind == "u32" else np.float32)).cuda()
        if fill == "random":
            return torch.randint(-2**31, 2**31 - 1, (n,), dtype=dt, device="cuda")
        return torch.zeros(n, dtype=dt, device="cuda")

    def launch(self, kern, grid, block, args):
        from kernels import host
        host.launch(kern, grid, block, self._stream, tuple(args))

    def seconds(self, fn):
        """(median, 10th, 90th percentile) seconds of ``fn`` after one warm-up call: CUDA events
        behind a device-side sleep (`benchmarks.common.time_cuda`), or the wall clock."""
        if self.simulator:
            fn()
            times = []
            for _ in range(max(self.repeats, 1)):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            times.sort()
            mid = times[len(times) // 2]
            return mid, times[0], times[-1]
        fn()
        self.torch.cuda.synchronize()
        med, p10, p90 = time_cuda(self.torch, fn, warmup=2, min_reps=self.repeats,
                                  max_reps=max(self.repeats, 30), timing="device")
        return med * 1e-3, p10 * 1e-3, p90 * 1e-3

    def synchronize(self):
        if not self.simulator:
            self.torch.cuda.synchronize()


def _rate(amount, secs, unit, how):
    """A rate entry: ``amount`` per second at the median time, ``range`` at the 90th and 10th
    percentile times."""
    med, lo, hi = secs
    return {"value": float(amount / med), "unit": unit, "how": how,
            "range": [float(amount / hi), float(amount / lo)]}


def _latency(steps, secs, how):
    med, lo, hi = secs
    return {"value": med / steps, "unit": "s", "how": how, "range": [lo / steps, hi / steps]}


# ------------------------------------------------------------------------------------------------
# the measurements, one function per group: (rates, skipped)
# ------------------------------------------------------------------------------------------------

def measure_clock(dev, sz):
    if dev.simulator:
        return {}, {"sm_clock_hz": "the simulator has no clock"}
    torch = dev.torch
    cycles = 2_000_000 if sz.preset == "quick" else 20_000_000
    secs = dev.seconds(lambda: torch.cuda._sleep(cycles))
    return {"sm_clock_hz": _rate(cycles, secs, "Hz",
                                 f"torch.cuda._sleep({cycles}) (a clock64 spin of one thread) "
                                 f"timed by CUDA events: cycles / time")}, {}


def measure_dram(dev, sz):
    read, write, copy = dram_kernels(sz.threads, sz.per_thread)
    n_vec = sz.dram_bytes // 16
    span = sz.threads * sz.per_thread
    blocks, mask = n_vec // span, n_vec - 1
    a = dev.array(n_vec * 4, fill="random")
    b = dev.array(n_vec * 4)
    sink = dev.array(span)
    geo = (f"{sz.threads} threads x {sz.per_thread} vectors a block, {blocks} blocks "
           f"({blocks / dev.num_sms:.0f} per SM) over {_bytes(sz.dram_bytes)}")
    out = {
        "dram_read_bytes_per_s": _rate(
            sz.dram_bytes, dev.seconds(lambda: dev.launch(read, blocks, sz.threads,
                                                          (a, mask, sink, 0))),
            "bytes/s", f"16-byte ld.global.cg.v4 loads, XOR-reduced; {geo}; bytes read / time"),
        "dram_write_bytes_per_s": _rate(
            sz.dram_bytes, dev.seconds(lambda: dev.launch(write, blocks, sz.threads, (b, mask))),
            "bytes/s", f"16-byte st.global.v4 stores; {geo}; bytes written / time"),
        "dram_copy_bytes_per_s": _rate(
            2 * sz.dram_bytes, dev.seconds(lambda: dev.launch(copy, blocks, sz.threads,
                                                              (a, b, mask))),
            "bytes/s", f"16-byte loads then stores to a second buffer; {geo}; (bytes read + "
                       f"bytes written) / time"),
    }
    return out, {}


def measure_l2(dev, sz):
    read = dram_kernels(sz.threads, sz.per_thread)[0]
    n_vec = sz.l2_buffer_bytes // 16
    span = sz.threads * sz.per_thread
    blocks = sz.l2_read_bytes // 16 // span
    buf = dev.array(n_vec * 4, fill="random")
    sink = dev.array(span)
    out = {"l2_read_bytes_per_s": _rate(
        sz.l2_read_bytes,
        dev.seconds(lambda: dev.launch(read, blocks, sz.threads, (buf, n_vec - 1, sink, 0))),
        "bytes/s", f"16-byte ld.global.cg.v4 loads (L1 bypassed) of a {_bytes(sz.l2_buffer_bytes)} "
                   f"buffer (L2 {_bytes(dev.l2_bytes)}), read {sz.l2_read_bytes // sz.l2_buffer_bytes}"
                   f" times over by {blocks} blocks of {sz.threads} threads x {sz.per_thread} "
                   f"vectors; bytes read / time")}
    nxt, start = chase_buffer(sz.chase_bytes, sz.chase_stride)
    nxt_d, res = dev.array(nxt.size, fill=nxt), dev.array(1)
    chase = chase_kernel()
    secs = dev.seconds(lambda: dev.launch(chase, 1, 1, (nxt_d, start, sz.chase_steps, res)))
    out["l2_hit_latency_s"] = _latency(
        sz.chase_steps, secs,
        f"one thread, {sz.chase_steps} dependent ld.global.cg.u32 loads through a random cycle of "
        f"{sz.chase_bytes // sz.chase_stride} lines {sz.chase_stride} bytes apart "
        f"({_bytes(sz.chase_bytes)}, in L2 after the warm-up launch); time / loads")
    return out, {}


def measure_smem(dev, sz):
    blocks = dev.num_sms * sz.smem_per_sm
    out, rates = dev.array(blocks * sz.threads, "f32"), {}
    for conflicted, name in ((False, "smem_read_bytes_per_s_per_sm"),
                             (True, "smem_read_conflict32_bytes_per_s_per_sm")):
        iters = max(sz.smem_iters // (32 if conflicted else 1), 2)
        kern = smem_kernel(sz.threads, conflicted)
        nbytes = blocks * sz.threads * iters * SMEM_LOADS * 4
        secs = dev.seconds(lambda k=kern, it=iters: dev.launch(k, blocks, sz.threads, (out, it)))
        pattern = ("lane l reads word 32 l + c: every load 32-way bank-conflicted"
                   if conflicted else "lane l reads word l + 32 c: conflict-free")
        rates[name] = _rate(nbytes / dev.num_sms, secs, "bytes/s",
                            f"4-byte ld.volatile.shared.f32 loads, {pattern}; {sz.smem_per_sm} blocks of "
                            f"{sz.threads} threads per SM, {iters} x {SMEM_LOADS} loads a thread; "
                            f"bytes loaded / time / SMs")
    return rates, {}


def measure_mma(dev, sz):
    if dev.cc is not None and dev.cc < (8, 0):
        why = f"mma.sync needs compute capability 8.0; this GPU has {dev.cc[0]}.{dev.cc[1]}"
        return {}, {f"mma_{d}_flops_per_s": why for d in MMA_K}
    blocks = dev.num_sms * sz.mma_per_sm
    warps = blocks * sz.threads // 32
    out, rates = dev.array(blocks * sz.threads, "f32"), {}
    import numpy as np
    for dtype in MMA_K:
        kern = mma_kernel(dtype)
        operands = dev.array(6, fill=np.full(6, MMA_ONES[dtype], np.uint32))
        k = MMA_K[dtype]
        flops = warps * MMA_CHAINS * sz.mma_iters * 2 * 16 * 8 * k
        secs = dev.seconds(lambda kern=kern, ops_=operands: dev.launch(
            kern, blocks, sz.threads, (ops_, out, sz.mma_iters)))
        ty = {"fp16": "f16"}.get(dtype, dtype)
        rates[f"mma_{dtype}_flops_per_s"] = _rate(
            flops, secs, "flop/s",
            f"mma.sync.aligned.m16n8k{k}.row.col.f32.{ty}.{ty}.f32, {MMA_CHAINS} independent "
            f"accumulators per warp, {sz.mma_iters} each; {sz.mma_per_sm} blocks of "
            f"{sz.threads // 32} warps per SM; 2 x 16 x 8 x {k} FLOPs per instruction / time")
    return rates, {}


def _wgmma_refusal(dev) -> str | None:
    """Why ``dev`` cannot run the wgmma groups' kernels (sm_90a only), or None."""
    if dev.simulator:
        return ("wgmma needs a GPU of compute capability 9.0 (sm_90a): the CUDA simulator runs "
                "no wgmma")
    if dev.cc != (9, 0):
        return (f"wgmma.mma_async is an sm_90a instruction (compute capability 9.0); this GPU "
                f"has {dev.cc[0]}.{dev.cc[1]}")
    return None


def measure_wgmma(dev, sz):
    names = [f"wgmma_{d}_flops_per_s" for d in WGMMA_K]
    why = _wgmma_refusal(dev)
    if why:
        return {}, dict.fromkeys(names, why)
    per_sm = sz.wgmma_per_sm
    blocks = dev.num_sms * per_sm * sz.wgmma_waves
    products = blocks * WGMMA_WARPGROUPS * sz.wgmma_iters * WGMMA_UNROLL
    rates = {}
    for dtype, k in WGMMA_K.items():
        kern = wgmma_kernel(dtype)
        out = dev.array(blocks * kern.threads, "f32")
        secs = dev.seconds(lambda kern=kern, out=out: dev.launch(
            kern, blocks, kern.threads, (sz.wgmma_iters, 0, out)))
        ty = {"fp16": "f16", "fp8": "e4m3"}.get(dtype, dtype)
        rates[f"wgmma_{dtype}_flops_per_s"] = _rate(
            products * 2 * 64 * 64 * k, secs, "flop/s",
            f"wgmma.mma_async.sync.aligned.m64n64k{k}.f32.{ty}.{ty}, A and B from shared "
            f"memory (K-major, 128-byte swizzle), {WGMMA_UNROLL} products per commit group "
            f"alternating {WGMMA_ACCS} accumulators, wgmma.wait_group 1, {sz.wgmma_iters} groups "
            f"per warpgroup; {WGMMA_WARPGROUPS} warpgroups a block, {per_sm} blocks per SM x "
            f"{sz.wgmma_waves} waves ({blocks} blocks); 2 x 64 x 64 x {k} FLOPs per instruction "
            f"per warpgroup / time")
    return rates, {}


#: The ``wgmma-wait`` group's rates.
WGMMA_WAIT_NAMES = ("wgmma_wait_latency_s", "wgmma_dependent_product_s")


def measure_wgmma_wait(dev, sz):
    """What waiting for a ``wgmma`` group costs one warpgroup alone on its SM: the time per
    group of `wgmma_wait_kernel` at the chains of `WGMMA_WAIT_CHAINS` (1 and 4 products), a
    line through the two: ``wgmma_dependent_product_s`` its slope (a product's time in a
    dependent chain), ``wgmma_wait_latency_s`` its intercept (what a group costs beyond its
    products: the pipeline's latency until the wait returns)."""
    names = list(WGMMA_WAIT_NAMES)
    why = _wgmma_refusal(dev)
    if why:
        return {}, dict.fromkeys(names, why)
    blocks, iters = dev.num_sms, sz.wgmma_wait_iters
    per_group = {}
    for chain in WGMMA_WAIT_CHAINS:
        kern = wgmma_wait_kernel(chain)
        out = dev.array(blocks * kern.threads, "f32")
        secs = dev.seconds(lambda kern=kern, out=out: dev.launch(
            kern, blocks, kern.threads, (iters, 0, out)))
        per_group[chain] = [t / iters for t in secs]          # median, p10, p90 per group
    short, long_ = WGMMA_WAIT_CHAINS
    (s_med, s_lo, s_hi), (l_med, l_lo, l_hi) = per_group[short], per_group[long_]
    span = long_ - short
    slope = [(l_med - s_med) / span, (l_lo - s_hi) / span, (l_hi - s_lo) / span]
    intercept = [s_med - short * slope[0], s_lo - short * slope[2], s_hi - short * slope[1]]
    how = (f"one warpgroup per SM ({blocks} blocks of {WAIT_THREADS} threads), {iters} "
           f"commit groups of a dependent chain of float16 wgmma.mma_async m64n64k16 products "
           f"(A and B from shared memory), each followed by wgmma.wait_group 0; median time per "
           f"group at chains of {short} and {long_} products: {s_med:.3e} s and {l_med:.3e} s")
    return {"wgmma_dependent_product_s": {"value": slope[0], "unit": "s", "range": slope[1:],
                                          "how": how + "; the line's slope"},
            "wgmma_wait_latency_s": {"value": intercept[0], "unit": "s", "range": intercept[1:],
                                     "how": how + "; the line's intercept"}}, {}



def measure_ffma(dev, sz):
    import numpy as np
    blocks = dev.num_sms * sz.flop_per_sm
    out = dev.array(blocks * sz.threads, "f32")
    one = np.float32(1)
    kern = ffma_kernel()
    flops = 2 * blocks * sz.threads * CHAINS * UNROLL * sz.ffma_iters
    secs = dev.seconds(lambda: dev.launch(kern, blocks, sz.threads,
                                          (np.float32(0), one, one, sz.ffma_iters, out)))
    return {"ffma_flops_per_s": _rate(
        flops, secs, "flop/s",
        f"float32 x = x * a + b (FFMA), {CHAINS} independent chains a thread, "
        f"{sz.ffma_iters} x {UNROLL} steps each; {sz.flop_per_sm} blocks of {sz.threads} threads "
        f"per SM; 2 FLOPs per FMA / time")}, {}


def measure_ex2(dev, sz):
    import numpy as np
    blocks = dev.num_sms * sz.flop_per_sm
    out = dev.array(blocks * sz.threads, "f32")
    kern = ex2_kernel()
    n = blocks * sz.threads * CHAINS * UNROLL * sz.ex2_iters
    secs = dev.seconds(lambda: dev.launch(kern, blocks, sz.threads,
                                          (np.float32(0), sz.ex2_iters, out)))
    return {"ex2_ops_per_s": _rate(
        n, secs, "op/s",
        f"x = ex2.approx.ftz.f32(-x) (MUFU), {CHAINS} independent chains a thread, "
        f"{sz.ex2_iters} x {UNROLL} steps each; {sz.flop_per_sm} blocks of {sz.threads} threads "
        f"per SM; results / time")}, {}


def measure_cp_async(dev, sz):
    if dev.cc is not None and dev.cc < (8, 0):
        why = f"cp.async needs compute capability 8.0; this GPU has {dev.cc[0]}.{dev.cc[1]}"
        return {}, {f"cp_async_depth{d}_bytes_per_s": why for d in (1, 2, 3)}
    blocks = dev.num_sms * sz.cp_per_sm
    tile_bytes = sz.cp_threads * sz.cp_per_thread * 16
    tiles = sz.cp_bytes // tile_bytes // blocks
    nbytes = tiles * blocks * tile_bytes
    src = dev.array(sz.cp_bytes // 4, fill="random")
    out, rates = dev.array(blocks * sz.cp_threads), {}
    for depth in (1, 2, 3):
        kern = cp_async_kernel(depth, sz.cp_threads, sz.cp_per_thread)
        secs = dev.seconds(lambda k=kern: dev.launch(k, blocks, sz.cp_threads, (src, tiles, out)))
        rates[f"cp_async_depth{depth}_bytes_per_s"] = _rate(
            nbytes, secs, "bytes/s",
            f"cp.async.cg 16-byte global->shared copies of {_bytes(tile_bytes)} tiles, "
            f"{depth} tile(s) in flight per block (cp.async.wait_group {depth - 1}), each tile "
            f"read from shared memory once landed; {sz.cp_per_sm} blocks of {sz.cp_threads} "
            f"threads per SM, {tiles} tiles a block, {_bytes(nbytes)} in all; bytes copied / time")
    return rates, {}


def measure_launch(dev, sz):
    kern = empty_kernel()
    n = sz.launches

    def per_launch(fn):
        fn()
        dev.synchronize()
        times = []
        for _ in range(max(dev.repeats, 1)):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            dev.synchronize()
            times.append((time.perf_counter() - t0) / n)
        times.sort()
        return times[len(times) // 2], times[0], times[-1]

    stream = 0 if dev.simulator else _numba_stream(dev)
    how = (f"{n} launches of an empty kernel (1 block of 32 threads) back to back, then one "
           f"synchronisation; wall-clock time / launches (median of {dev.repeats})")
    return {
        "kernel_launch_s": _latency(1, per_launch(lambda: dev.launch(kern, 1, 32, ())),
                                    "kernels.host.launch: " + how),
        "kernel_launch_numba_s": _latency(1, per_launch(lambda: kern[1, 32, stream]()),
                                          "Numba's kernel[grid, block, stream](): " + how),
    }, {}


#: The decoding microbenchmark's calls (group ``decode``): one KV head of a group of 4 query
#: heads (one 16-row tile a program, as a 32/8 GQA model's), at each head dim of
#: `sim.profiles.DECODE_HEAD_DIMS`, bfloat16, the tensor-core kernel of eight warps; the
#: programs are the batch (one split) or half of it (two). Keys per program of the two stream
#: lengths, and the (programs, keys a program) of the handoff pairs.
DECODE_HEADS_Q = 4
DECODE_STREAM_KEYS = {"full": (8192, 32768), "quick": (4096, 16384)}
DECODE_HANDOFF = ((2, 2048), (8, 2048), (16, 8192), (32, 2048), (64, 8192), (128, 2048),
                  (128, 8192))


def measure_decode(dev, sz):
    """The split-KV kernel's own figures (`sim.profiles.DECODE_RATE_UNITS`) at each head dim
    ``D`` of `sim.profiles.DECODE_HEAD_DIMS`, on shapes apart from any decoding benchmark's (one
    KV head a sequence, the batch as the programs):

    * ``decode_dD_stream_pP_bytes_per_s``: ``P`` programs of one split each stream two cache
      lengths (`DECODE_STREAM_KEYS`); the rate is the extra K and V bytes over the extra time
      (what a longer stream costs, the call's fixed cost cancelled);
    * ``decode_dD_fixed_s``: one program, one split, as many keys as its warps' rings hold
      (eight warps x `sim.decode.MMA_STAGES` blocks of `sim.decode.MMA_BLOCK_K` keys): its
      time less those bytes at the one-program rate;
    * ``decode_dD_fill_s``: the median over ``P`` of the longer streams' fixed time (the shorter
      length's time less its bytes at the ``P``-program rate) less the fixed time: what a
      stream of more blocks than the rings hold adds once;
    * ``decode_dD_handoff_s``: the median over `DECODE_HANDOFF` of two splits of ``P / 2``
      sequences of ``2 L`` keys less one split of ``P`` of ``L`` (the same programs streaming
      the same bytes): the partials, the ticket and the merge."""
    from sim.profiles import DECODE_HEAD_DIMS, DECODE_RATE_UNITS
    if dev.simulator:
        return {}, dict.fromkeys(DECODE_RATE_UNITS, "the tensor-core decoding kernel needs a "
                                                    "GPU (the CUDA simulator runs no mma)")
    if dev.cc < (8, 0):
        return {}, dict.fromkeys(DECODE_RATE_UNITS, f"the tensor-core decoding kernel needs "
                                                    f"compute capability 8.0; this GPU has "
                                                    f"{dev.cc[0]}.{dev.cc[1]}")
    rates = {}
    for head_dim in DECODE_HEAD_DIMS:
        rates.update(_decode_figures(dev, sz, head_dim))
    return rates, {}


def _decode_figures(dev, sz, head_dim: int) -> dict:
    """`measure_decode`'s rates at one head dim."""
    import statistics
    import kernels
    from ioaware._inputs import check_inputs
    from sim.decode import MMA_BLOCK_K, MMA_STAGES, MMA_WARPS_FEW_PROGRAMS
    from sim.profiles import DECODE_STREAM_PROGRAMS, decode_rate_name
    torch, warps = dev.torch, MMA_WARPS_FEW_PROGRAMS

    def kv_bytes(batch, keys):
        return batch * keys * head_dim * 2 * 2

    def seconds(batch, keys, splits):
        g = torch.Generator(device="cuda").manual_seed(batch * 7919 + keys)
        q = torch.randn(batch, DECODE_HEADS_Q, 1, head_dim, device="cuda",
                        dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, 1, keys, head_dim, device="cuda", dtype=torch.bfloat16,
                            generator=g) for _ in range(2))
        pb = check_inputs(q, k, v)
        cfg = kernels.KernelConfig(family="split_kv", num_splits=splits, decode_unit="mma",
                                   decode_warps=warps)
        secs = dev.seconds(lambda: kernels.forward(pb, cfg))
        del q, k, v
        torch.cuda.empty_cache()
        return secs

    short, long_ = DECODE_STREAM_KEYS["quick" if sz.preset == "quick" else "full"]
    programs = [p for p in DECODE_STREAM_PROGRAMS if p < dev.num_sms]
    rates, fixed_at, d = {}, {}, head_dim
    for p in programs:
        t_short, t_long = seconds(p, short, 1), seconds(p, long_, 1)
        extra = kv_bytes(p, long_) - kv_bytes(p, short)
        rate = extra / (t_long[0] - t_short[0])
        fixed_at[p] = t_short[0] - kv_bytes(p, short) / rate
        rates[decode_rate_name(d, "stream", p)] = {
            "value": rate, "unit": "bytes/s",
            "how": (f"{p} programs (batch {p}, 1 KV head, {DECODE_HEADS_Q} query heads, d "
                    f"{d}, bfloat16, 1 split, {warps} warps): K and V bytes of "
                    f"{long_} keys less those of {short}, over the difference of the median "
                    f"times ({t_long[0] * 1e6:.2f} and {t_short[0] * 1e6:.2f} us)"),
            "range": [extra / max(t_long[2] - t_short[1], 1e-12),
                      extra / max(t_long[1] - t_short[2], 1e-12)]}
    ring_keys = warps * MMA_STAGES * MMA_BLOCK_K
    lone = rates[decode_rate_name(d, "stream", programs[0])]["value"] / programs[0]
    t0 = seconds(1, ring_keys, 1)
    fixed = t0[0] - kv_bytes(1, ring_keys) / lone
    rates[decode_rate_name(d, "fixed")] = {
        "value": fixed, "unit": "s",
        "how": (f"one program (d {d}), 1 split, {ring_keys} keys (its {warps} warps' rings of "
                f"{MMA_STAGES} blocks of {MMA_BLOCK_K}): median time {t0[0] * 1e6:.2f} us less "
                f"its K and V bytes at the one-program stream rate"),
        "range": [t0[1] - (t0[0] - fixed), t0[2] - (t0[0] - fixed)]}
    fills = {p: f - fixed for p, f in fixed_at.items()}
    rates[decode_rate_name(d, "fill")] = {   # a rate is positive: a fill within the noise is 1 ns
        "value": max(statistics.median(fills.values()), 1e-9), "unit": "s",
        "how": (f"median over the stream's program counts of the {short}-key time less its "
                f"bytes at that count's stream rate, less the fixed time (d {d}); per count "
                f"(us): " + ", ".join(f"{p}: {f * 1e6:.2f}" for p, f in fills.items())),
        "range": [min(fills.values()), max(fills.values())]}
    handoffs = {}
    for p, keys in DECODE_HANDOFF:
        if p < dev.num_sms and (sz.preset != "quick" or keys == 2048):
            handoffs[f"{p}x{keys}"] = seconds(p // 2, 2 * keys, 2)[0] - seconds(p, keys, 1)[0]
    rates[decode_rate_name(d, "handoff")] = {
        "value": statistics.median(handoffs.values()), "unit": "s",
        "how": (f"median over (programs x keys a program) of two splits of half the sequences "
                f"of twice the keys less one split (d {d}): " + ", ".join(
                    f"{k}: {v * 1e6:.2f} us" for k, v in handoffs.items())),
        "range": [min(handoffs.values()), max(handoffs.values())]}
    return rates


def _numba_stream(dev):
    """torch's current stream as Numba's launch takes it (0: the default stream)."""
    handle = dev.torch.cuda.current_stream().cuda_stream
    return cuda.external_stream(handle) if handle else 0


def _bytes(n) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} bytes"


MEASURES = {"clock": measure_clock, "dram": measure_dram, "l2": measure_l2,
            "smem": measure_smem, "mma": measure_mma, "wgmma": measure_wgmma,
            "wgmma-wait": measure_wgmma_wait,
            "ffma": measure_ffma, "ex2": measure_ex2,
            "cp-async": measure_cp_async, "launch": measure_launch, "decode": measure_decode}


#: Rates computed from others (`derived`), with the rates they are computed from.
DERIVED = {"smem_read_bytes_per_clk_per_sm": ("smem_read_bytes_per_s_per_sm", "sm_clock_hz")}


def derived(rates: dict, skipped: dict, same_run: bool = True) -> None:
    """Rates computed from others: ``smem_read_bytes_per_clk_per_sm`` (shared bytes per SM per
    second / the measured clock); ``same_run``: whether both were measured in one run."""
    smem, clock = rates.get("smem_read_bytes_per_s_per_sm"), rates.get("sm_clock_hz")
    if smem and clock:
        when = "same run" if same_run else "from different runs: provenance groups_added"
        rates["smem_read_bytes_per_clk_per_sm"] = {
            "value": smem["value"] / clock["value"], "unit": "bytes/clk",
            "how": f"smem_read_bytes_per_s_per_sm / sm_clock_hz ({when})", "range": None}
    elif smem:
        skipped["smem_read_bytes_per_clk_per_sm"] = "needs sm_clock_hz (group clock)"


def measure(dev, sizes, groups=GROUPS, progress=print) -> tuple[dict, dict]:
    """``(rates, skipped)`` of the ``groups`` on ``dev`` with ``sizes``; rates as the file
    holds them (`sim.profiles.RATE_UNITS` names and units), skipped rates with the reason."""
    from sim.profiles import RATE_UNITS
    rates, skipped = {}, {}
    for i, g in enumerate(groups, 1):
        t0 = time.perf_counter()
        got, skip = MEASURES[g](dev, sizes)
        rates.update(got)
        skipped.update(skip)
        text = "; ".join([f"{k} {_fmt(v['value'], v['unit'])}" for k, v in got.items()]
                         + [f"{k} skipped ({why})" for k, why in skip.items()])
        progress(f"[{i}/{len(groups)}] {g}: {text} ({time.perf_counter() - t0:.1f} s)")
    derived(rates, skipped)
    for name, entry in rates.items():
        if RATE_UNITS.get(name) != entry["unit"]:
            raise AssertionError(f"rate {name}: unit {entry['unit']!r}, sim.profiles.RATE_UNITS "
                                 f"says {RATE_UNITS.get(name)!r}")
    return rates, skipped


def _fmt(v, unit) -> str:
    if unit == "s":
        return f"{v * 1e6:.3g} us"
    if unit == "bytes/clk":
        return f"{v:.3g} bytes/clk"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if v >= scale:
            return f"{v / scale:.4g} {prefix}{unit.replace('bytes', 'B').replace('flop', 'FLOP')}"
    return f"{v:.4g} {unit}"


# ------------------------------------------------------------------------------------------------
# the command
# ------------------------------------------------------------------------------------------------

def parse_groups(text: str) -> tuple:
    items = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in items if x not in GROUPS]
    if bad or not items:
        raise ValueError(f"--only: unknown group(s) {bad or [text]}; groups: {', '.join(GROUPS)}")
    return tuple(g for g in GROUPS if g in items)


def _open_device(repeats):
    """The `Device`, or ``(None, message)`` when there is no CUDA GPU to measure."""
    try:
        from kernels import host
    except ImportError as exc:
        return None, f"needs Numba with CUDA ({exc})"
    if host.simulator():
        return Device(None, repeats), None
    try:
        import torch
    except ImportError:
        return None, "needs torch with CUDA"
    if not torch.cuda.is_available():
        return None, ("needs a CUDA GPU (torch sees none); NUMBA_ENABLE_CUDASIM=1 runs the "
                      "kernels at tiny sizes in Numba's simulator instead")
    return Device(torch, repeats), None


def read_rates_file(path, gpu: str) -> dict:
    """The rates file ``path`` that ``--add-to`` extends, parsed (`sim.profiles.read_rates`);
    ValueError naming ``--add-to`` where there is no such file, it is not a rates file (JSON of
    schema `SCHEMA` with ``rates`` and ``provenance`` objects) or it was measured on a GPU of
    another name than ``gpu``."""
    from sim.profiles import read_rates
    try:
        doc, _ = read_rates(str(path))
    except (FileNotFoundError, ValueError) as exc:
        raise ValueError(f"--add-to: {str(exc).removeprefix('rates: ')}") from None
    if not isinstance(doc.get("provenance"), dict):
        raise ValueError(f"--add-to: {path} is not a rates file (it has no 'provenance' object)")
    theirs = doc["provenance"].get("gpu")
    if theirs != gpu:
        raise ValueError(f"--add-to: {path} was measured on {theirs!r}, this GPU is {gpu!r}; "
                         f"rates of two GPUs are not merged")
    return doc


def add_groups(doc: dict, rates: dict, skipped: dict, entry: dict) -> dict:
    """A copy of the rates file ``doc`` with one run's ``rates`` and ``skipped`` (`measure`)
    in place of the entries of the same names, every other entry as it was, the `DERIVED`
    rates computed again where one of their inputs was measured again, and ``entry`` (what
    was measured, when, how) appended to its provenance's ``groups_added``. Entries whose
    names `sim.profiles.RATE_UNITS` no longer knows (a rate renamed since) are dropped."""
    from sim.profiles import RATE_UNITS
    new = set(rates) | set(skipped)
    redo = {name for name, inputs in DERIVED.items() if new & set(inputs)}
    stale = {name for name in list(doc["rates"]) + list(doc.get("skipped") or {})
             if name not in RATE_UNITS}
    drop = new | redo | stale

    def merged(old, got):
        out = {k: v for k, v in (old or {}).items() if k not in drop}
        out.update({k: v for k, v in got.items() if k not in DERIVED})
        return out
    out = dict(doc, rates=merged(doc["rates"], rates), skipped=merged(doc.get("skipped"), skipped))
    if redo:
        derived(out["rates"], out["skipped"],
                same_run=all(set(DERIVED[name]) <= set(rates) for name in redo))
    prov = doc["provenance"]
    out["provenance"] = dict(prov, groups_added=list(prov.get("groups_added") or []) + [entry])
    return out


def profile_with_decode_rates(profile: dict, rates_doc: dict, origin: str) -> dict:
    """A copy of the profile JSON object ``profile`` whose ``decode_rates`` are the decode group
    (`sim.profiles.DECODE_RATE_UNITS`) of the rates file ``rates_doc`` (read from ``origin``)
    and whose ``sources["decode_rates"]`` names that file, its GPU and the run that measured
    the group (its ``groups_added`` entry where one added it, else the file's provenance).
    ValueError where the file has no head dim's full set of decode figures, or its GPU is not
    one the profile matches."""
    from sim.decode import decode_figures
    from sim.profiles import DECODE_HEAD_DIMS, decode_rate_names, gpu_matches
    values = {n: e["value"] for n, e in rates_doc["rates"].items()}
    complete = [d for d in DECODE_HEAD_DIMS if decode_figures(values, d) is not None]
    if not complete:
        raise ValueError(f"--from: {origin} has no decode group (no head dim with its fixed, "
                         f"fill and handoff times and a stream rate): measure it with python -m "
                         f"benchmarks rates --only decode")
    prov = rates_doc.get("provenance") or {}
    gpu = str(prov.get("gpu"))
    match = profile.get("match") or []
    if match and not gpu_matches(match, gpu):
        raise ValueError(f"--from: {origin} was measured on {gpu!r}, which profile "
                         f"{profile.get('name')!r} does not match (match strings {match})")
    run = next((g for g in reversed(prov.get("groups_added") or []) if "decode" in g["groups"]),
               prov)
    code = run.get("code_version") if isinstance(run.get("code_version"), dict) else {}
    out = dict(profile, decode_rates={n: values[n] for d in complete
                                      for n in decode_rate_names(d) if n in values})
    out["sources"] = dict(profile.get("sources") or {}, decode_rates=(
        f"MEASURED by python -m benchmarks rates (group decode; head dims "
        f"{', '.join(map(str, complete))}) on {gpu}, {run.get('date')}, "
        f"code {code.get('commit', 'unknown')}{' (dirty)' if code.get('dirty') else ''}, kernels_sha"
        f" {run.get('kernels_sha')}, command: {run.get('command')}; kept in {origin}; written "
        f"here by python -m benchmarks rates --to-profile"))
    return out


def default_out(gpu: str, date: str) -> str:
    return "rates_" + re.sub(r"[^A-Za-z0-9]+", "-", gpu).strip("-").lower() + f"_{date[:10]}.json"


def main(argv=None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m benchmarks rates",
                                 description=first_sentence(__doc__))
    ap.add_argument("--only", default=",".join(GROUPS),
                    help=f"comma-separated groups to measure (default all: {','.join(GROUPS)})")
    ap.add_argument("--quick", action="store_true",
                    help="smaller sizes and fewer repeats (a smoke test; less accurate)")
    ap.add_argument("--repeats", type=int, default=None,
                    help="timed launches per rate, at least (default 10; --quick 3)")
    ap.add_argument("--out", default=None,
                    help="JSON file to write (default ./rates_<gpu>_<date>.json; with --add-to, "
                         "FILE itself)")
    ap.add_argument("--add-to", default=None, metavar="FILE",
                    help="a rates file of this GPU: write it with the --only groups' rates added "
                         "or replaced and its other rates kept; its provenance lists the run "
                         "under groups_added")
    ap.add_argument("--to-profile", default=None, metavar="PROFILE.json",
                    help="with --from RATES.json: write the decode group of that rates file into "
                         "this GPU profile as its decode_rates (what the decoding launcher picks "
                         "its split count with); measures nothing")
    ap.add_argument("--from", dest="from_file", default=None, metavar="RATES.json",
                    help="the rates file --to-profile reads")
    args = ap.parse_args(argv)
    if args.to_profile or args.from_file:
        return _to_profile(args.to_profile, args.from_file)
    try:
        groups = parse_groups(args.only)
    except ValueError as exc:
        print(f"python -m benchmarks rates: {exc}", file=sys.stderr)
        return 2
    if args.repeats is not None and args.repeats < 1:
        print("python -m benchmarks rates: --repeats must be >= 1", file=sys.stderr)
        return 2
    dev, why = _open_device(args.repeats or 1)
    if dev is None:
        print(f"python -m benchmarks rates: {why}", file=sys.stderr)
        return 2
    base = None
    if args.add_to:
        try:
            base = read_rates_file(args.add_to, dev.name)
        except ValueError as exc:
            print(f"python -m benchmarks rates: {exc}", file=sys.stderr)
            return 2
    preset = "tiny" if dev.simulator else ("quick" if args.quick else "full")
    sizes = sizes_for(preset, dev.num_sms, dev.l2_bytes, args.repeats)
    dev.repeats = sizes.repeats
    extra = {"num_sms": dev.num_sms, "l2_bytes": dev.l2_bytes, "simulator": dev.simulator,
             "compute_capability": None if dev.cc is None else f"{dev.cc[0]}.{dev.cc[1]}"}
    if dev.simulator:
        prov = provenance(command_line("rates", argv), gpu=dev.name, cuda="none (simulator)",
                          extra=extra)
        print("Numba's CUDA simulator: tiny sizes, wall-clock times; the values are not "
              "hardware rates", flush=True)
    else:
        prov = provenance(command_line("rates", argv), extra=extra)
    print(f"{dev.name}: {dev.num_sms} SMs, L2 {_bytes(dev.l2_bytes)}; sizes {preset}, "
          f"{sizes.repeats} repeats", flush=True)
    rates, skipped = measure(dev, sizes, groups, progress=lambda s: print(s, flush=True))
    if base is None:
        doc = {"schema": SCHEMA, "provenance": prov, "sizes": asdict(sizes), "rates": rates,
               "skipped": skipped}
        out = args.out or default_out(prov["gpu"], prov["date"])
    else:
        entry = {k: prov[k] for k in ("date", "command", "code_version", "kernels_sha", "gpu")}
        doc = add_groups(base, rates, skipped, dict(groups=list(groups), **entry,
                                                     sizes=asdict(sizes)))
        out = args.out or args.add_to
    write_json(doc, out)
    added = "" if base is None else f" ({', '.join(groups)} added to {args.add_to})"
    print(f"wrote {out}{added}")
    return 0


def _to_profile(profile_path, rates_path) -> int:
    """``--to-profile PROFILE --from RATES``: the decode group into the profile file."""
    import json
    from sim.profiles import load_profile, read_rates
    if not (profile_path and rates_path):
        print("python -m benchmarks rates: --to-profile and --from go together", file=sys.stderr)
        return 2
    try:
        doc, origin = read_rates(rates_path)
        with open(profile_path) as f:
            profile = json.load(f)
        out = profile_with_decode_rates(profile, doc, origin)
        load_profile(out)                       # the profile it makes must load
    except (OSError, ValueError, TypeError) as exc:
        print(f"python -m benchmarks rates: {exc}", file=sys.stderr)
        return 2
    with open(profile_path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"wrote decode_rates of {origin} into {profile_path}")
    return 0
