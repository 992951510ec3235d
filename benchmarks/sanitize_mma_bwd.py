"""A small configuration exercising the tensor-core backward's kernels once, for compute-sanitizer:

    compute-sanitizer --tool memcheck python -m kernels.sanitize_mma_bwd

float16 NumPy inputs (copied to the device), lengths that are not multiples of the tiles, GQA:
d=64 causal with a boolean mask and dropout (the dK/dV kernel holds K in registers), d=128 with
a block mask of 32 x 32 tiles (K in shared memory, 2-warp dK/dV blocks).
"""
import numpy as np

from kernels import flash_mma_bwd, flash_mma_fwd


def main():
    rng = np.random.default_rng(0)
    cases = ((64, True, {"mask": rng.random((2, 1, 70, 45)) < 0.7, "dropout_p": 0.25, "seed": 3}),
             (128, False, {"block_mask": rng.random((1, 2, 3, 2)) < 0.6, "block_q": 32,
                           "block_k": 32}))
    for d, causal, kw in cases:
        q = rng.standard_normal((2, 2, 70, d)).astype(np.float16)
        k = rng.standard_normal((2, 1, 45, d)).astype(np.float16)
        v = rng.standard_normal((2, 1, 45, d)).astype(np.float16)
        do = rng.standard_normal((2, 2, 70, d)).astype(np.float16)
        fkw = {key: val for key, val in kw.items() if key not in ("block_q", "block_k")}
        if "block_mask" in kw:   # the forward's own tiles for this block mask: 64 x 32
            lse = np.full((2, 2, 70), 1.0, np.float32)
            out = q.copy()
        else:
            out, lse = flash_mma_fwd.forward(q, k, v, scale=d ** -0.5, causal=causal, **fkw)
        dq, dk, dv = flash_mma_bwd.backward(q, k, v, out, lse, do, scale=d ** -0.5, causal=causal,
                                            **kw)
        assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    print("sanitize_mma_bwd done")


if __name__ == "__main__":
    main()
