"""A small configuration exercising every kernel path once, for compute-sanitizer:

    compute-sanitizer --tool memcheck python -m kernels.sanitize_case [PART ...]

PART is any of ``cuda-core``, ``fp32-tc``, ``fp16-tc`` (default: all three), so that the parts
can run as separate processes side by side.

CUDA-core kernels (NumPy inputs): forward and both backward dQ modes with causal, dropout, a
boolean mask, GQA and partial tiles. Tensor-core kernels (torch CUDA tensors, when torch has
CUDA): the 3xTF32 float32 forward and backward and the float16 forward and backward, causal,
GQA, lengths that are not multiples of the tiles.
"""
import numpy as np

import kernels


def cuda_core_paths():
    rng = np.random.default_rng(0)
    for d, causal, kw in ((64, True, {}), (64, False, {"dropout_p": 0.25, "seed": 3}),
                          (32, False, {"mask": rng.random((2, 1, 70, 45)) < 0.7})):
        q = rng.standard_normal((2, 2, 70, d)).astype(np.float32)
        k = rng.standard_normal((2, 1, 45, d)).astype(np.float32)
        v = rng.standard_normal((2, 1, 45, d)).astype(np.float32)
        out, lse = kernels.forward(q, k, v, scale=d ** -0.5, causal=causal, **kw)
        for mode in ("kernel", "atomic"):
            dq, dk, dv = kernels.backward(q, k, v, out, lse, out, scale=d ** -0.5, causal=causal,
                                          dq_mode=mode, **kw)
            assert np.isfinite(dq).all() and np.isfinite(dk).all()


def tensor_core_paths(dtypes=("fp32", "fp16")):
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype in [{"fp32": torch.float32, "fp16": torch.float16}[x] for x in dtypes]:
        for d, kw in ((64, {"causal": True}), (128, {"dropout_p": 0.25, "seed": 3})):
            q, do = (torch.randn(2, 2, 150, d, device="cuda", generator=g).to(dtype)
                     for _ in range(2))
            k, v = (torch.randn(2, 1, 97, d, device="cuda", generator=g).to(dtype)
                    for _ in range(2))
            out, lse = kernels.forward(q, k, v, scale=d ** -0.5, **kw)
            dq, dk, dv = kernels.backward(q, k, v, out, lse, do, scale=d ** -0.5, **kw)
            torch.cuda.synchronize()
            assert all(bool(torch.isfinite(x).all()) for x in (out, dq, dk, dv))


PARTS = ("cuda-core", "fp32-tc", "fp16-tc")


def main(argv=None):
    import sys
    parts = (sys.argv[1:] if argv is None else argv) or list(PARTS)
    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise SystemExit(f"unknown part(s) {bad}; choose from {PARTS}")
    if "cuda-core" in parts:
        cuda_core_paths()
    tc = [p.split("-")[0] for p in parts if p.endswith("-tc")]
    if tc:
        tensor_core_paths(tuple(tc))
    print("sanitize_case done:", " ".join(parts))


if __name__ == "__main__":
    main()
