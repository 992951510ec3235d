"""Host side of the kernels: argument checks, array interop, tile schedules, compile cache, launch.

* Interop: NumPy host arrays are copied to the device and results come back as NumPy (this is
  how CI runs the kernels under Numba's CUDA simulator); Numba device arrays are used in place;
  torch CUDA tensors are wrapped zero-copy through ``__cuda_array_interface__`` and the kernels
  are launched on ``torch.cuda.current_stream()``; results come back as torch tensors. Strided
  (non-contiguous) inputs are read in place through their strides. bfloat16 tensors are staged
  as float32 copies (Numba has no bfloat16 array type) and the outputs cast back.
* Schedules: the K/V tiles each Q tile visits (and the reverse for dK/dV) come from
  `ioaware.block_info.BlockInfo` as CSR arrays, one schedule per distinct (batch, head) slice of
  the block mask, cached on the device.
* Kernels are built per (tile config, head dim, causal, mask, dropout) and cached; a config whose
  static shared memory exceeds the device's per-block limit is refused with a ValueError naming
  the limit.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict

import numpy as np
from numba import config as numba_config
from numba import cuda

from ioaware.block_info import BlockInfo, cdiv

from ._device import dropout_args
from .config import (FWD_TILES, STATIC_SMEM_LIMIT_BYTES, TileConfig, choose_tiles, default_blocks,
                     dkdv_smem_bytes, dq_smem_bytes, fwd_smem_bytes)
from .flash_bwd import (DELTA_ROWS, make_delta_kernel, make_delta_kernel_v2, make_dkdv_kernel,
                        make_dkdv_kernel_v2, make_dq_kernel)
from .flash_fwd import make_forward_kernel, make_forward_kernel_v2, make_forward_kernel_v3
from . import flash_mma_fwd

__all__ = ["forward", "backward", "simulator", "DQ_MODE"]

#: How dQ is computed in the backward: "atomic" (float32 atomics from the dK/dV kernel) or
#: "kernel" (a second kernel parallel over Q tiles, which recomputes S and dP). Atomics measured
#: 1.4x faster for the whole backward on an H200 (kernels/NOTES.md, v1 sweep).
DQ_MODE = "atomic"
#: Forward kernel version: 1 (signed indices), 2 (unsigned tile indices, per-head views) or 3
#: (flattened shared tiles, hoisted offsets); environment override KERNELS_FWD_VERSION.
#: See kernels/NOTES.md.
FWD_VERSION = int(os.environ.get("KERNELS_FWD_VERSION", "2"))
#: Backward version, likewise (KERNELS_BWD_VERSION): 1, 2 (dK/dV kernel v2), 3 (dK/dV v2 and the
#: coalesced one-warp-per-row delta pre-pass). Default 3: same time as 2 within run-to-run spread
#: on an H200, and its pre-pass reads O and dO once instead of ~8x in 32-byte sectors (ncu), so
#: the global-memory bytes are the schedule's (kernels/NOTES.md).
BWD_VERSION = int(os.environ.get("KERNELS_BWD_VERSION", "3"))

_KERNELS: dict = {}
_SCHEDULES: "OrderedDict" = OrderedDict()
_SCHEDULE_CACHE_SIZE = 64


def simulator() -> bool:
    """Whether Numba's CUDA simulator is active (NUMBA_ENABLE_CUDASIM=1)."""
    return bool(numba_config.ENABLE_CUDASIM)


def _target_threads() -> int:
    return 16 if simulator() else 128


def smem_limit_bytes() -> int:
    """Static shared memory a block may use on the current device (48 KiB on every GPU since
    Kepler; larger carve-outs need dynamic shared memory)."""
    if simulator():
        return STATIC_SMEM_LIMIT_BYTES
    try:
        attr = cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK
        return min(int(attr), STATIC_SMEM_LIMIT_BYTES)
    except Exception:  # pragma: no cover - attribute names differ between versions
        return STATIC_SMEM_LIMIT_BYTES


def _check_smem(what: str, nbytes: int, cfg: TileConfig, head_dim: int) -> None:
    limit = smem_limit_bytes()
    if nbytes > limit:
        raise ValueError(
            f"{what}: tile block_m={cfg.block_m}, block_n={cfg.block_n} with head_dim={head_dim} "
            f"needs {nbytes} bytes of static shared memory per block, over the device limit of "
            f"{limit} bytes (48 KiB static shared memory per block); choose smaller block_q/block_k")


# -- array interop -------------------------------------------------------------------------------

def _is_torch(x) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


class _Io:
    """Converts the caller's arrays to Numba device arrays and the results back."""

    def __init__(self, ref, name="q"):
        if isinstance(ref, np.ndarray):
            self.kind = "numpy"
        elif _is_torch(ref):
            if not ref.is_cuda:
                raise TypeError(f"{name} is a CPU torch tensor; pass a CUDA tensor or a NumPy array")
            self.kind = "torch"
        elif cuda.is_cuda_array(ref):
            self.kind = "numba"
        else:
            raise TypeError(f"{name} must be a NumPy array, a Numba device array or a torch CUDA "
                            f"tensor, got {type(ref).__name__}")
        self.bf16 = False
        if self.kind == "torch":
            import torch
            self.torch = torch
            self.device = ref.device
            self.dtype = ref.dtype
            self.bf16 = ref.dtype == torch.bfloat16
            self.stream = cuda.external_stream(torch.cuda.current_stream(ref.device).cuda_stream)
        else:
            self.dtype = np.dtype(ref.dtype)
            self.stream = 0 if simulator() else cuda.default_stream()

    def dtype_name(self) -> str:
        return str(self.dtype).replace("torch.", "")

    def check(self, x, name):
        if x is None:
            raise ValueError(f"{name} must be an array, got None")
        if self.kind == "torch":
            if not _is_torch(x) or not x.is_cuda:
                raise TypeError(f"{name} must be a torch CUDA tensor like q")
        elif self.kind == "numpy":
            if not isinstance(x, np.ndarray):
                raise TypeError(f"{name} must be a NumPy array like q, got {type(x).__name__}")
        elif not cuda.is_cuda_array(x) or isinstance(x, np.ndarray):
            raise TypeError(f"{name} must be a Numba device array like q")

    def to_dev(self, x, compute=True):
        """Device view of an input (float32 staging for bfloat16 when ``compute``)."""
        if self.kind == "numpy":
            return cuda.to_device(np.ascontiguousarray(x), stream=self.stream)
        if self.kind == "torch":
            x = x.detach()
            if compute and x.dtype == self.torch.bfloat16:
                x = x.float()
            if x.dtype == self.torch.bool:
                x = x.view(self.torch.uint8)
            return cuda.as_cuda_array(x, sync=False)
        return x

    def mask_to_dev(self, mask):
        if self.kind == "numpy":
            return cuda.to_device(np.ascontiguousarray(mask).view(np.uint8), stream=self.stream)
        if self.kind == "torch":
            return cuda.as_cuda_array(mask.detach().view(self.torch.uint8), sync=False)
        return mask.view(np.uint8) if mask.dtype == np.bool_ else mask

    def empty(self, shape, float32=False):
        """(caller-facing handle, device view) of a new output array."""
        if self.kind == "torch":
            torch = self.torch
            dt = torch.float32 if (float32 or self.bf16) else self.dtype
            t = torch.empty(shape, dtype=dt, device=self.device)
            return t, cuda.as_cuda_array(t, sync=False)
        dt = np.float32 if float32 else self.dtype
        d = cuda.device_array(shape, dtype=dt, stream=self.stream)
        return d, d

    def zeros_f32(self, shape):
        if self.kind == "torch":
            t = self.torch.zeros(shape, dtype=self.torch.float32, device=self.device)
            return t, cuda.as_cuda_array(t, sync=False)
        d = cuda.to_device(np.zeros(shape, np.float32), stream=self.stream)
        return d, d

    def result(self, handle, float32=False):
        if self.kind == "torch":
            if self.bf16 and not float32:
                return handle.to(self.torch.bfloat16)
            return handle
        if self.kind == "numpy":
            return handle.copy_to_host(stream=self.stream)
        return handle

    def sync_host(self):
        if self.kind == "numpy" and not simulator():
            self.stream.synchronize()


_DUMMY_MASK = None


def _dummy_mask():
    global _DUMMY_MASK
    if _DUMMY_MASK is None:
        _DUMMY_MASK = cuda.to_device(np.ones((1, 1, 1, 1), np.uint8))
    return _DUMMY_MASK


# -- argument checks -----------------------------------------------------------------------------

_DTYPES = ("float32", "float16", "bfloat16")


def _check_qkv(io, q, k, v):
    for name, x in (("q", q), ("k", k), ("v", v)):
        io.check(x, name)
        if len(x.shape) != 4:
            raise ValueError(f"{name} must be 4-D [batch, heads, seq_len, head_dim], got shape "
                             f"{tuple(x.shape)}")
        if str(x.dtype).replace("torch.", "") != io.dtype_name():
            raise TypeError(f"{name} has dtype {x.dtype}, expected {io.dtype} like q")
    if io.dtype_name() not in _DTYPES or (io.dtype_name() == "bfloat16" and io.kind != "torch"):
        raise TypeError(f"q must be float32 or float16 (or bfloat16 torch tensors), got {io.dtype}")
    B, Hq, Nq, D = (int(s) for s in q.shape)
    Bk, Hkv, Nk, Dk = (int(s) for s in k.shape)
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the shape of k {tuple(k.shape)}, got {tuple(v.shape)}")
    if Bk != B or Dk != D:
        raise ValueError(f"k must be [batch={B}, heads_kv, seq_len_k, head_dim={D}], got {tuple(k.shape)}")
    if Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv})")
    if min(B, Hq, Nq, Nk, D) < 1:
        raise ValueError(f"every dimension must be >= 1, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if D > 256:
        raise ValueError(f"head_dim must be <= 256, got {D}")
    return B, Hq, Nq, D, Hkv, Nk


def _check_mask(io, mask, B, Hq, Nq, Nk):
    if mask is None:
        return None
    io.check(mask, "mask")
    if str(mask.dtype).replace("torch.", "") not in ("bool",):
        raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
    shape = tuple(int(s) for s in mask.shape)
    if len(shape) != 4 or shape[0] not in (1, B) or shape[1] not in (1, Hq) \
            or shape[2] not in (1, Nq) or shape[3] != Nk:
        raise ValueError(f"mask must have shape [1|{B}, 1|{Hq}, 1|{Nq}, {Nk}], got {shape}")
    return io.mask_to_dev(mask)


def _resolve_blocks(D, block_q, block_k, backward):
    dq, dk = default_blocks(D, backward, simulator())
    bq = dq if block_q is None else int(block_q)
    bk = dk if block_k is None else int(block_k)
    if bq < 1 or bk < 1:
        raise ValueError(f"block_q and block_k must be >= 1, got {bq}, {bk}")
    return bq, bk


def _check_dropout(dropout_p, seed):
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    return dropout_args(p, int(seed))


# -- schedules (BlockInfo CSR arrays on the device) ----------------------------------------------

def _schedule(B, Hq, Nq, Nk, bq, bk, causal, block_mask, which):
    """Device CSR schedule ``(offsets[S, n+1], index, sched_sb, sched_sh)`` for `which` in
    {"kv", "q"}; S = number of distinct (batch, head) slices of the block mask."""
    nbq, nbk = cdiv(Nq, bq), cdiv(Nk, bk)
    if block_mask is None:
        key = (which, Nq, Nk, bq, bk, bool(causal), None)
        slices = None
    else:
        bm = np.asarray(block_mask)
        if bm.dtype != np.bool_:
            raise TypeError(f"block_mask must be a NumPy bool array, got dtype {bm.dtype}")
        if bm.ndim != 4 or bm.shape[0] not in (1, B) or bm.shape[1] not in (1, Hq) \
                or bm.shape[2:] != (nbq, nbk):
            raise ValueError(
                f"block_mask must have shape [1|{B}, 1|{Hq}, n_blocks_q={nbq}, n_blocks_k={nbk}] "
                f"for block_q={bq}, block_k={bk}, got {bm.shape}")
        key = (which, Nq, Nk, bq, bk, bool(causal), bm.shape, bm.tobytes())
        slices = bm
    hit = _SCHEDULES.get(key)
    if hit is not None:
        _SCHEDULES.move_to_end(key)
        return hit
    if slices is None:
        infos = [BlockInfo(Nq, Nk, bq, bk, bool(causal))]
        sb = sh = 0
    else:
        Bb, Hb = slices.shape[:2]
        infos = [BlockInfo.with_block_mask(Nq, Nk, bq, bk, causal, slices[i, j])
                 for i in range(Bb) for j in range(Hb)]
        sb = Hb if Bb > 1 else 0
        sh = 1 if Hb > 1 else 0
    offs, idxs, base = [], [], 0
    for info in infos:
        off, idx = info.kv_schedule() if which == "kv" else info.q_schedule()
        offs.append(off + base)
        idxs.append(idx)
        base += len(idx)
    off = np.stack(offs).astype(np.int32)
    idx = np.concatenate(idxs).astype(np.int32) if base else np.zeros(1, np.int32)
    hit = (cuda.to_device(off), cuda.to_device(idx), sb, sh)
    _SCHEDULES[key] = hit
    if len(_SCHEDULES) > _SCHEDULE_CACHE_SIZE:
        _SCHEDULES.popitem(last=False)
    return hit


def _kernel(kind, *key):
    k = (kind,) + key
    fn = _KERNELS.get(k)
    if fn is None:
        fn = {"fwd": make_forward_kernel, "fwd2": make_forward_kernel_v2,
              "fwd3": make_forward_kernel_v3, "delta2": make_delta_kernel_v2, "dkdv": make_dkdv_kernel, "dkdv2": make_dkdv_kernel_v2, "dq": make_dq_kernel,
              "delta": make_delta_kernel, "cast": _make_cast_kernel}[kind](*key)
        _KERNELS[k] = fn
    return fn


def _make_cast_kernel():
    @cuda.jit
    def cast4(src, dst):
        bh = cuda.blockIdx.y
        n_heads = src.shape[1]
        b = bh // n_heads
        h = bh % n_heads
        i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        n = src.shape[2] * src.shape[3]
        if i < n:
            r = i // src.shape[3]
            c = i % src.shape[3]
            dst[b, h, r, c] = src[b, h, r, c]
    return cast4


def _use_shfl(cfg: TileConfig) -> bool:
    return (not simulator()) and cfg.threads % 32 == 0


# -- entry points --------------------------------------------------------------------------------

def forward(q, k, v, *, scale, causal=False, mask=None, block_mask=None, dropout_p=0.0, seed=0,
            block_q=None, block_k=None, tiles=None):
    """Fused attention forward. Returns ``(out, lse)``.

    q: [B, Hq, Nq, d]; k, v: [B, Hkv, Nk, d] (Hq % Hkv == 0); out like q; lse float32
    [B, Hq, Nq] (natural-log logsumexp of the scaled, masked logits; -inf for a row with no
    allowed key, whose out row is 0). mask: boolean [1|B, 1|Hq, 1|Nq, Nk], True = may attend.
    block_mask: NumPy bool [1|B, 1|Hq, n_blocks_q, n_blocks_k] for tiles (block_q, block_k).
    Dropout keeps element (b, h, i, j) per `ioaware.dropout.keep_mask(seed, p, b*Hq+h, i, j)`,
    kept values scaled by 1/(1-p). ``tiles`` = (tm, tn) overrides the per-thread micro-tile.
    """
    # -- half-precision CUDA inputs take the tensor-core kernel (forward only; see NOTES_MMA.md) --
    if tiles is None and flash_mma_fwd.accepts(q, k, v, block_q, block_k):
        return flash_mma_fwd.forward(q, k, v, scale=scale, causal=causal, mask=mask,
                                     block_mask=block_mask, dropout_p=dropout_p, seed=seed,
                                     block_q=block_q, block_k=block_k)
    # -- float32 CUDA inputs (d 64/128) take the 3xTF32 tensor-core kernel; switch off with
    #    KERNELS_FP32_TENSOR_CORES=0 (see kernels/NOTES.md, "3xTF32 tensor-core forward") --
    from . import flash_tf32_fwd
    if (tiles is None and os.environ.get("KERNELS_FP32_TENSOR_CORES", "1") != "0"
            and flash_tf32_fwd.accepts(q, k, v, block_q, block_k, block_mask=block_mask)):
        return flash_tf32_fwd.forward(q, k, v, scale=scale, causal=causal, mask=mask,
                                      block_mask=block_mask, dropout_p=dropout_p, seed=seed,
                                      block_q=block_q, block_k=block_k)
    io = _Io(q)
    B, Hq, Nq, D, Hkv, Nk = _check_qkv(io, q, k, v)
    bq, bk = _resolve_blocks(D, block_q, block_k, backward=False)
    if tiles is None and not simulator():
        tiles = FWD_TILES.get((D, bq, bk))
    cfg = (choose_tiles(bq, bk, D, _target_threads()) if tiles is None
           else TileConfig(bq, bk, int(tiles[0]), int(tiles[1])))
    cfg.validate(D)
    _check_smem("forward kernel", fwd_smem_bytes(cfg, D), cfg, D)
    seed_pre, thresh, keep_scale = _check_dropout(dropout_p, seed)
    mask_d = _check_mask(io, mask, B, Hq, Nq, Nk)
    kv_off, kv_idx, sb, sh = _schedule(B, Hq, Nq, Nk, bq, bk, causal, block_mask, "kv")

    qd, kd, vd = io.to_dev(q), io.to_dev(k), io.to_dev(v)
    out_h, out_d = io.empty((B, Hq, Nq, D))
    lse_h, lse_d = io.empty((B, Hq, Nq), float32=True)
    kern = _kernel({1: "fwd", 2: "fwd2"}.get(FWD_VERSION, "fwd3"), cfg, D, bool(causal), mask_d is not None, float(dropout_p) > 0.0,
                   _use_shfl(cfg))
    nbq = cdiv(Nq, bq)
    kern[(nbq, B * Hq), cfg.threads, io.stream](
        qd, kd, vd, out_d, lse_d, mask_d if mask_d is not None else _dummy_mask(), kv_off, kv_idx,
        sb, sh, Hq // Hkv, nbq, np.float32(scale), seed_pre, thresh, keep_scale)
    out, lse = io.result(out_h), io.result(lse_h, float32=True)
    io.sync_host()
    return out, lse


def backward(q, k, v, out, lse, dout, *, scale, causal=False, mask=None, block_mask=None,
             dropout_p=0.0, seed=0, block_q=None, block_k=None, dq_mode=None, tiles=None):
    """Fused attention backward from the forward's ``out`` and ``lse``. Returns ``(dq, dk, dv)``
    in the input dtype (dk, dv summed over the query heads of each GQA group).

    Arguments as `forward`; block_q/block_k (the block mask's tile shape) default to the
    backward's own. ``dq_mode``: "kernel" or "atomic" (default `DQ_MODE`).
    """
    # -- half-precision CUDA inputs take the tensor-core backward (see NOTES_MMA.md) --
    from . import flash_mma_bwd
    if tiles is None and dq_mode is None and flash_mma_bwd.accepts(q, k, v, block_q, block_k,
                                                                   block_mask):
        return flash_mma_bwd.backward(q, k, v, out, lse, dout, scale=scale, causal=causal,
                                      mask=mask, block_mask=block_mask, dropout_p=dropout_p,
                                      seed=seed, block_q=block_q, block_k=block_k)
    # -- float32 CUDA inputs (d 64/128) take the 3xTF32 tensor-core backward; switch off with
    #    KERNELS_FP32_TENSOR_CORES=0 (see kernels/NOTES.md, "3xTF32 tensor-core backward") --
    from . import flash_tf32_bwd
    if (tiles is None and dq_mode is None
            and os.environ.get("KERNELS_FP32_TENSOR_CORES", "1") != "0"
            and flash_tf32_bwd.accepts(q, k, v, block_q, block_k, block_mask)):
        return flash_tf32_bwd.backward(q, k, v, out, lse, dout, scale=scale, causal=causal,
                                       mask=mask, block_mask=block_mask, dropout_p=dropout_p,
                                       seed=seed, block_q=block_q, block_k=block_k)
    io = _Io(q)
    B, Hq, Nq, D, Hkv, Nk = _check_qkv(io, q, k, v)
    for name, x, shape in (("out", out, (B, Hq, Nq, D)), ("dout", dout, (B, Hq, Nq, D)),
                           ("lse", lse, (B, Hq, Nq))):
        io.check(x, name)
        if tuple(int(s) for s in x.shape) != shape:
            raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    if str(lse.dtype).replace("torch.", "") != "float32":
        raise TypeError(f"lse must be float32, got {lse.dtype}")
    mode = DQ_MODE if dq_mode is None else dq_mode
    if mode not in ("kernel", "atomic"):
        raise ValueError(f"dq_mode must be 'kernel' or 'atomic', got {mode!r}")
    bq, bk = _resolve_blocks(D, block_q, block_k, backward=True)
    tt = _target_threads()
    if tiles is None:
        cfg_kv = choose_tiles(bk, bq, D, tt)
        cfg_q = choose_tiles(bq, bk, D, tt)
    else:
        cfg_kv = TileConfig(bk, bq, int(tiles[0]), int(tiles[1]))
        cfg_q = TileConfig(bq, bk, int(tiles[0]), int(tiles[1]))
    cfg_kv.validate(D)
    _check_smem("backward dK/dV kernel", dkdv_smem_bytes(cfg_kv, D), cfg_kv, D)
    if mode == "kernel":
        cfg_q.validate(D)
        _check_smem("backward dQ kernel", dq_smem_bytes(cfg_q, D), cfg_q, D)
    seed_pre, thresh, keep_scale = _check_dropout(dropout_p, seed)
    mask_d = _check_mask(io, mask, B, Hq, Nq, Nk)
    mask_arg = mask_d if mask_d is not None else _dummy_mask()
    has_mask, drop = mask_d is not None, float(dropout_p) > 0.0
    sm_scale = np.float32(scale)
    group = Hq // Hkv

    qd, kd, vd = io.to_dev(q), io.to_dev(k), io.to_dev(v)
    od, dod, lsed = io.to_dev(out), io.to_dev(dout), io.to_dev(lse)
    delta_h, delta_d = io.empty((B, Hq, Nq), float32=True)
    if BWD_VERSION >= 3:     # coalesced: one warp per row
        _kernel("delta2", D, not simulator())[(cdiv(Nq, DELTA_ROWS), B * Hq), 32 * DELTA_ROWS,
                                              io.stream](od, dod, delta_d)
    else:                    # one thread per row
        _kernel("delta", D)[(cdiv(Nq, 128), B * Hq), 128, io.stream](od, dod, delta_d)

    dk_h, dk_d = io.empty((B, Hkv, Nk, D))
    dv_h, dv_d = io.empty((B, Hkv, Nk, D))
    q_off, q_idx, sb, sh = _schedule(B, Hq, Nq, Nk, bq, bk, causal, block_mask, "q")
    if mode == "atomic":
        dqa_h, dqa_d = io.zeros_f32((B, Hq, Nq, D))
    else:
        dqa_h, dqa_d = None, _dummy_dq()
    kern = _kernel("dkdv" if BWD_VERSION == 1 else "dkdv2", cfg_kv, D, bool(causal), has_mask, drop, mode == "atomic")
    kern[(cdiv(Nk, bk), B * Hkv), cfg_kv.threads, io.stream](
        qd, kd, vd, dod, lsed, delta_d, dk_d, dv_d, dqa_d, mask_arg, q_off, q_idx, sb, sh,
        group, sm_scale, seed_pre, thresh, keep_scale)

    if mode == "kernel":
        dq_h, dq_d = io.empty((B, Hq, Nq, D))
        kv_off, kv_idx, sb, sh = _schedule(B, Hq, Nq, Nk, bq, bk, causal, block_mask, "kv")
        kern = _kernel("dq", cfg_q, D, bool(causal), has_mask, drop)
        kern[(cdiv(Nq, bq), B * Hq), cfg_q.threads, io.stream](
            qd, kd, vd, dod, lsed, delta_d, dq_d, mask_arg, kv_off, kv_idx, sb, sh, group,
            sm_scale, seed_pre, thresh, keep_scale)
    elif io.kind == "torch" or np.dtype(io.dtype) == np.float32:
        dq_h = dqa_h
    else:
        dq_h, dq_d = io.empty((B, Hq, Nq, D))
        _kernel("cast")[(cdiv(Nq * D, 256), B * Hq), 256, io.stream](dqa_d, dq_d)
    if io.kind == "torch" and mode == "atomic" and not io.bf16:
        dq = dq_h.to(io.dtype)
    else:
        dq = io.result(dq_h)
    dk, dv = io.result(dk_h), io.result(dv_h)
    io.sync_host()
    return dq, dk, dv


_DUMMY_DQ = None


def _dummy_dq():
    global _DUMMY_DQ
    if _DUMMY_DQ is None:
        _DUMMY_DQ = cuda.to_device(np.zeros((1, 1, 1, 1), np.float32))
    return _DUMMY_DQ
