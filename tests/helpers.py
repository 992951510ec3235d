"""Shared test helpers: random problems, tolerances, a float64 reference in the user's layout."""
from __future__ import annotations

from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

# Tolerances, by input dtype. The reference is float64 on the same (already rounded) inputs, so
# the error is the tiled path's own: float32 accumulation over at most a few hundred terms
# (~1e-6 relative) for float32; for float16 the output's final rounding to float16
# (2**-11 ~ 4.9e-4 relative) dominates.
ATOL = {np.float32: 2e-5, np.float16: 4e-3}
RTOL = {np.float32: 1e-4, np.float16: 4e-3}
# Gradients sum Nq or Nk products: compare by relative Frobenius norm.
GRAD_REL = {np.float32: 2e-4, np.float16: 1e-2}


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    denom = max(np.linalg.norm(b), 1e-30)
    return float(np.linalg.norm(a - b) / denom)


def random_qkv(rng, batch, heads_q, heads_kv, nq, nk, d, dtype=np.float32, scale=1.0):
    def mk(h, n):
        shape = ((batch,) if batch else ()) + (h, n, d)
        return (rng.standard_normal(shape) * scale).astype(dtype)
    return mk(heads_q, nq), mk(heads_kv, nk), mk(heads_kv, nk)


def grads_close(got, want, dtype=np.float32) -> bool:
    """Relative Frobenius-norm agreement, with an absolute floor for gradients that are ~0
    (e.g. dq with a single key, where the exact value is 0 and float32 leaves ~1e-7)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    err = np.linalg.norm(got - want)
    return bool(err <= GRAD_REL[dtype] * np.linalg.norm(want) + ATOL[dtype] * np.sqrt(want.size))


def _float64(x):
    """A torch tensor (any device) or array-like as a NumPy float64 array."""
    if hasattr(x, "detach"):
        return x.detach().double().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def dense_attention_reference(q, k, v, dout=None, *, scale, causal=False, mask=None,
                              block_allowed=None, dropout_p=0.0, seed=0) -> dict:
    """The float64 materialised attention the GPU kernels' tests compare against.

    q [B, Hq, Nq, d], k/v [B, Hkv, Nk, d] (torch tensors on any device or NumPy arrays; their
    values as given, so half inputs are compared on the same rounded values); ``mask`` boolean
    broadcastable to [B, Hq, Nq, Nk] (True = may attend), ``block_allowed`` the expanded
    block-sparse mask; dropout keeps ``ioaware.dropout.keep_mask(seed, p, b*Hq+h, i, j)``.
    Returns NumPy float64 ``out`` and ``lse`` (natural log, -inf for a fully masked row, whose
    out is 0); with ``dout`` also ``dq``, ``dk``, ``dv`` (dk/dv summed over each GQA group) and
    the magnitudes ``eq``, ``ek``, ``ev`` of the terms each gradient element sums (for error
    bounds that scale with them).
    """
    from ioaware.dropout import keep_mask

    q64, k64, v64 = (_float64(x) for x in (q, k, v))
    batch, heads, n_q, _ = q64.shape
    heads_kv = k64.shape[1]
    group = heads // heads_kv
    kr, vr = np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q64, kr) * scale
    allowed = np.ones(s.shape, bool)
    if causal:
        allowed &= np.tril(np.ones(s.shape[-2:], bool))
    if mask is not None:
        allowed &= _float64(mask).astype(bool)
    if block_allowed is not None:
        allowed &= block_allowed
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    l = p.sum(-1, keepdims=True)
    lse = np.where(l[..., 0] > 0, m_safe[..., 0] + np.log(np.where(l > 0, l, 1.0))[..., 0],
                   -np.inf)
    p = np.where(l > 0, p / np.where(l > 0, l, 1.0), 0.0)
    z = np.ones(s.shape)
    if dropout_p > 0:
        bh = np.arange(batch * heads).reshape(batch, heads, 1, 1)
        rows = np.arange(n_q).reshape(1, 1, -1, 1)
        cols = np.arange(s.shape[-1]).reshape(1, 1, 1, -1)
        z = keep_mask(seed, dropout_p, bh, rows, cols) / (1.0 - dropout_p)
    pz = p * z
    o = np.einsum("bhij,bhjd->bhid", pz, vr)
    result = {"out": o, "lse": lse}
    if dout is None:
        return result

    def fold(x):  # sum over the query heads of each GQA group
        return x.reshape(batch, heads_kv, group, *x.shape[2:]).sum(2)

    do64 = _float64(dout)
    dv = np.einsum("bhij,bhid->bhjd", pz, do64)
    dp = np.einsum("bhid,bhjd->bhij", do64, vr) * z
    delta = (do64 * o).sum(-1, keepdims=True)
    ds = p * (dp - delta)
    dq = np.einsum("bhij,bhjd->bhid", ds, kr) * scale
    dk = np.einsum("bhij,bhid->bhjd", ds, q64) * scale
    mag = p * (np.abs(dp) + np.abs(delta) + np.abs(do64 * o).sum(-1, keepdims=True))
    ev = np.einsum("bhij,bhid->bhjd", pz, np.abs(do64))
    ek = np.einsum("bhij,bhid->bhjd", mag, np.abs(q64)) * scale
    eq = np.einsum("bhij,bhjd->bhid", mag, np.abs(kr)) * scale
    result.update(dq=dq, dk=fold(dk), dv=fold(dv), eq=eq, ek=fold(ek), ev=fold(ev))
    return result


def kernel_problem(q, k, v, *, scale=None, causal=False, mask=None, block_mask=None, block_q=None,
                   block_k=None, dropout_p=0.0, seed=0, window_size=None, check_finite=True):
    """The validated problem `kernels.forward`/`kernels.backward` take, from 4-D arrays (NumPy
    or torch CUDA tensors), as `ioaware` builds it: ``block_mask`` on the tiles
    (block_q, block_k); without one, block_q/block_k are the requested kernel tiles.
    ``check_finite=False`` lets NaN/inf through (tests that poison skipped tiles)."""
    from ioaware._inputs import check_inputs, check_values
    if block_mask is not None:
        block_mask = (block_mask, (block_q, block_k))
        block_q = block_k = None
    pb = check_inputs(q, k, v, causal=causal, mask=mask, block_mask=block_mask, scale=scale,
                      dropout_p=dropout_p, seed=seed, block_q=block_q, block_k=block_k,
                      window_size=window_size)
    if check_finite:
        check_values(pb)
    return pb


def kernels_forward(q, k, v, *, config=None, **kw):
    """``kernels.forward`` on `kernel_problem` (``config``: a `kernels.KernelConfig`)."""
    import kernels
    return kernels.forward(kernel_problem(q, k, v, **kw), config)


def kernels_backward(q, k, v, out, lse, dout, *, config=None, **kw):
    """``kernels.backward`` on `kernel_problem` (``config``: a `kernels.KernelConfig`)."""
    import kernels
    return kernels.backward(kernel_problem(q, k, v, **kw), out, lse, dout, config)


def assert_deterministic_backward(torch, bwd_module, q, k, v, out, lse, dout, *, config, **kw):
    """Under torch's deterministic algorithms a tensor-core backward (``bwd_module``:
    `kernels.mma_bwd` or `kernels.tf32_bwd`, run with ``config``) takes its dQ kernel, and
    three calls give the same bits."""
    from kernels import KernelConfig
    pb = kernel_problem(q, k, v, **kw)
    try:
        torch.use_deterministic_algorithms(True)
        assert bwd_module.dq_mode(pb, KernelConfig()) == "kernel"
        runs = [kernels_backward(q, k, v, out, lse, dout, config=config, **kw) for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(False)
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            assert torch.equal(a, b)


def default_half_forward() -> str:
    """The family the registry runs a plain float16/bfloat16 forward (d 64 or 128, no mask) on
    this GPU: ``wgmma`` on compute capability 9.0 and above, else ``mma``."""
    from kernels import host
    hopper = host.real_gpu() and host.compute_capability(host.current_device_id()) >= (9, 0)
    return "wgmma" if hopper else "mma"


# -- Hopper: the GPU check and the sm_90a compile on the CPU ---------------------------------------
def skip_unless_hopper(what: str = "wgmma, TMA") -> None:
    """Skip the calling test unless the current GPU has compute capability 9.0 or more."""
    import pytest
    from numba import cuda
    cc = tuple(cuda.get_current_device().compute_capability)
    if cc < (9, 0):
        pytest.skip(f"needs compute capability 9.0 ({what}); this GPU is {cc}")


def need_hopper_torch():
    """torch, for a test that needs torch with CUDA on a GPU of compute capability 9.0 (else the
    test is skipped)."""
    import pytest
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    skip_unless_hopper()
    return torch


def nvvm_missing() -> str | None:
    """Why Numba cannot reach NVVM in a fresh process, or None when it can."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    r = subprocess.run([sys.executable, "-c",
                        "from numba.cuda.cudadrv import nvvm; print(nvvm.NVVM().get_version())"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


def run_ptxas_sm90a(ptxas, ptx_path):
    """``ptxas -v -arch=sm_90a`` run on ``ptx_path`` (the cubin beside it): the completed
    process (its ``stderr`` holds the figures and any C75xx warning)."""
    import subprocess
    from pathlib import Path
    path = Path(ptx_path)
    return subprocess.run([ptxas, "-v", "-arch=sm_90a", str(path), "-o",
                           str(path.with_suffix(".cubin"))], capture_output=True, text=True,
                          timeout=600)


def assemble_sm90a(ptxas, ptx_path) -> tuple[dict, str]:
    """``(entry, stderr)``: `run_ptxas_sm90a` on ``ptx_path``, asserted to succeed without
    serialising any ``wgmma`` (C7520 and kin: a product issued on a divergent path, or with too
    few registers for it); ``entry``: its figures (`benchmarks.common.parse_ptxas`, one
    kernel)."""
    from benchmarks.common import parse_ptxas
    r = run_ptxas_sm90a(ptxas, ptx_path)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "serializ" not in r.stderr.lower(), r.stderr[-2000:]
    (entry,) = parse_ptxas(r.stderr)
    return entry, r.stderr


def compile_sm90a_in_child(module: str, function: str, outdir, timeout: int = 1200):
    """``(ptxas, result)``: ``module.function(outdir)`` run in a fresh process without the CUDA
    simulator (it compiles kernels for sm_90a into ``outdir`` and returns a JSON-able value),
    with the path of ``ptxas`` to assemble them; the test is skipped without ptxas or NVVM."""
    import json
    import os
    import subprocess
    import sys

    import pytest

    from benchmarks.common import find_ptxas
    ptxas = find_ptxas()
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) not available")
    why = nvvm_missing()
    if why:
        pytest.skip(f"NVVM not available to Numba: {why}")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    code = (f"import json, sys; from {module} import {function}; "
            f"print(json.dumps({function}(sys.argv[1])))")
    r = subprocess.run([sys.executable, "-c", code, str(outdir)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-4000:]
    return ptxas, json.loads(r.stdout.strip().splitlines()[-1])
