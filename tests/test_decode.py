"""Decoding with a KV cache: ``ioaware.attention(..., cache_seqlens=...)``, the split-KV kernel
(`kernels.decode_fwd`) and its plan (`sim.decode`).

The rule is written out here: batch row b sees its first ``L_b`` keys only, and with
``causal="bottom_right"`` / a window the band is aligned to ``L_b`` (query i sees key j iff
``i + L_b - Nq - left <= j <= i + L_b - Nq + right``, causal adding ``j <= i + L_b - Nq``).
Every result is compared with the float64 reference on that rule as a boolean mask. Tolerances
per dtype: float32 atol 2e-5 / rtol 1e-4, float16 4e-3 (tests/helpers.py); the logsumexp 1e-4.

The kernel tests run under Numba's CUDA simulator on small shapes (CI); those marked ``gpu``
run bfloat16 and float16 at decoding sizes on a GPU against SDPA in float32.
"""
from __future__ import annotations

import numpy as np
import pytest

from ioaware import attention
from sim.decode import (MAX_SPLITS, MIN_KEYS_PER_SPLIT, RESIDENT_PROGRAMS_PER_SM, choose_splits, rows_per_program,
                        split_kv_costs, split_kv_plan)
from sim.profiles import load_profile

from .helpers import ATOL, RTOL

#: The shipped decode measurement (`python -m benchmarks decode --splits --window --ncu --graph`).
DECODE_FILE = "decode_h200_2026-11-28.json"


def cache_rule(nq, nk, length, window=None, causal=False):
    """Allowed [Nq, Nk] pairs of one batch row with ``length`` valid keys."""
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    off = length - nq
    allowed = np.broadcast_to(j < length, (nq, nk)).copy()
    left, right = window if window is not None else (-1, -1)
    if left >= 0:
        allowed &= j >= i + off - left
    if right >= 0:
        allowed &= j <= i + off + right
    if causal:
        allowed &= j <= i + off
    return allowed


def reference(q, k, v, lengths, window=None, causal=False):
    """Float64 out and lse with the cache rule as a mask (the reference backend)."""
    b, _, nq, _ = q.shape
    nk = k.shape[2]
    mask = np.stack([cache_rule(nq, nk, int(n), window, causal) for n in lengths])[:, None]
    return attention(q, k, v, mask=mask, backend="reference", return_lse=True)


def make(rng, b, hq, hkv, nq, nk, d, dtype=np.float32):
    q = rng.standard_normal((b, hq, nq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, nk, d)).astype(dtype)
    return q, k, v


def check(out, lse, want_out, want_lse, dtype):
    np.testing.assert_allclose(out.astype(np.float64), want_out, atol=ATOL[dtype], rtol=RTOL[dtype])
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isneginf(lse), ~finite)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=1e-4, rtol=1e-5)
    assert np.all(out[~finite] == 0)


# -- the rule on the CPU paths ------------------------------------------------------------------
@pytest.mark.parametrize("window, causal", [(None, False), (None, "bottom_right"), ((5, 0), False),
                                            ((3, 2), "bottom_right"), ((0, 0), False), ((400, 400), False)])
@pytest.mark.parametrize("backend", ["numpy", "reference"])
def test_cpu_backends_apply_the_cache_rule(window, causal, backend):
    rng = np.random.default_rng(1)
    q, k, v = make(rng, 4, 4, 2, 3, 50, 8)
    lengths = np.array([50, 0, 1, 23])
    out, lse = attention(q, k, v, cache_seqlens=lengths, window_size=window, causal=causal, backend=backend,
                         return_lse=True)
    want_out, want_lse = reference(q, k, v, lengths, window, bool(causal))
    check(out, lse, want_out, want_lse, np.float32)
    assert np.all(out[1] == 0) and np.all(np.isneginf(lse[1]))          # an empty cache


def test_keys_past_a_length_are_never_read():
    rng = np.random.default_rng(2)
    q, k, v = make(rng, 2, 2, 1, 1, 40, 8)
    lengths = np.array([17, 40])
    k[0, :, 17:] = np.nan
    v[0, :, 17:] = np.nan
    want = reference(np.nan_to_num(q), np.nan_to_num(k), np.nan_to_num(v), lengths)
    # the NaN scan of CPU inputs would refuse them: the kernel path, which never reads them
    from ioaware._backends import _run_forward_with_cache
    from ioaware._inputs import check_cache_seqlens, check_inputs
    import dataclasses
    pb = check_inputs(q, k, v)
    _, lens = check_cache_seqlens(lengths, pb)
    out, lse = _run_forward_with_cache(dataclasses.replace(pb, cache_seqlens=lens), lengths, "numba")
    check(out, lse, *want, np.float32)


def test_an_int_length_and_leading_dimensions():
    rng = np.random.default_rng(3)
    q, k, v = make(rng, 2, 2, 2, 1, 30, 8)
    q5, k5, v5 = (x.reshape(1, 2, *x.shape[1:]) for x in (q, k, v))
    out = attention(q5, k5, v5, cache_seqlens=np.array([30, 12]), backend="numpy")
    assert out.shape == q5.shape
    out_int = attention(q, k, v, cache_seqlens=12, backend="numpy")
    np.testing.assert_allclose(out_int[1], out.reshape(q.shape)[1], rtol=1e-6, atol=1e-7)


# -- the split-KV kernel (simulator) ------------------------------------------------------------
CASES = [  # (b, hq, hkv, nq, nk, d, lengths, window, causal, splits)
    (2, 4, 2, 1, 70, 16, [70, 33], None, False, None),
    (3, 4, 1, 2, 45, 8, [45, 0, 1], None, "bottom_right", 3),      # MQA, empty and one-key caches
    (1, 2, 2, 3, 40, 12, [29], (4, 1), False, 2),
    (2, 3, 3, 1, 37, 16, [37, 36], (0, 0), "bottom_right", 5),
    (1, 8, 2, 4, 30, 8, [30], (100, 100), False, 8),             # more splits than key steps
    (1, 8, 2, 4, 20, 128, [19], None, "bottom_right", 2),          # 16 rows at d=128: four row chunks
    (1, 2, 1, 1, 90, 128, [90], None, False, 13),                  # the merge's unrolled loads
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("b, hq, hkv, nq, nk, d, lengths, window, causal, splits", CASES)
def test_split_kv_kernel_equals_the_float64_rule(b, hq, hkv, nq, nk, d, lengths, window, causal, splits, dtype):
    import kernels
    from ioaware._inputs import check_cache_seqlens, check_inputs
    import dataclasses
    rng = np.random.default_rng(nk + nq)
    q, k, v = make(rng, b, hq, hkv, nq, nk, d, dtype)
    pb = check_inputs(q, k, v, causal=causal, window_size=window)
    _, lens = check_cache_seqlens(np.array(lengths), pb)
    pb = dataclasses.replace(pb, cache_seqlens=lens)
    cfg = kernels.KernelConfig(family="split_kv", num_splits=splits)
    out, lse = kernels.forward(pb, cfg)
    assert out.dtype == dtype and lse.dtype == np.float32
    check(out, lse, *reference(q, k, v, lengths, window, bool(causal)), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("d, splits", [(8, 1), (8, 40), (96, 6), (128, 13), (256, 9)])
def test_the_last_program_merges_every_split(d, splits, dtype):
    """The split-KV kernel's merge, by the last program of each group to finish, over many
    splits and head dims (the merge's loads: one round of `MERGE_LOADS` splits or several, the
    last one partial; units per thread one or several in turn): full rows are exact against
    float64, a row with no key gives 0 and -inf, a row with a length the kernel refuses gives
    NaN, and one split writes the output directly."""
    import dataclasses
    import kernels
    from ioaware._inputs import check_inputs
    rng = np.random.default_rng(d + splits)
    nk = 4 * splits + 3
    q, k, v = make(rng, 3, 2, 1, 1, nk, d, dtype)
    lengths = np.array([nk, 0, nk + 1], np.int32)
    pb = dataclasses.replace(check_inputs(q, k, v), cache_seqlens=lengths)
    out, lse = kernels.forward(pb, kernels.KernelConfig(family="split_kv", num_splits=splits))
    want_out, want_lse = reference(q[:2], k[:2], v[:2], lengths[:2])
    check(out[:2], lse[:2], want_out, want_lse, dtype)
    assert np.isnan(out[2]).all() and np.isnan(lse[2]).all()


def test_public_api_runs_the_kernel_and_matches_numpy():
    rng = np.random.default_rng(4)
    q, k, v = make(rng, 2, 4, 2, 1, 300, 8)
    lengths = np.array([300, 130])
    import kernels
    from ioaware._inputs import check_inputs
    assert kernels.family_for(check_inputs(q, k, v)) == "split_kv"
    got = attention(q, k, v, cache_seqlens=lengths, causal="bottom_right", backend="numba", return_lse=True)
    want = attention(q, k, v, cache_seqlens=lengths, causal="bottom_right", backend="numpy", return_lse=True)
    np.testing.assert_allclose(got[0], want[0], atol=2e-6)
    np.testing.assert_allclose(got[1], want[1], atol=2e-6)


def test_registry_takes_split_kv_for_decoding_only():
    import kernels
    from ioaware._inputs import check_inputs
    rng = np.random.default_rng(5)
    pick = lambda nq, nk, **kw: kernels.family_for(check_inputs(*make(rng, 1, 2, 1, nq, nk, 8), **kw))
    assert pick(1, 256) == "split_kv" and pick(16, 4096) == "split_kv"
    assert pick(17, 4096) != "split_kv" and pick(1, 255) != "split_kv"
    assert pick(1, 4096, mask=np.ones((1, 1, 1, 4096), bool)) != "split_kv"
    assert pick(1, 4096, dropout_p=0.1, seed=1) != "split_kv"
    pb = check_inputs(*make(rng, 1, 2, 1, 1, 300, 8))
    with pytest.raises(ValueError, match="forward only"):
        kernels.family_for(pb, kernels.KernelConfig(family="split_kv"), "bwd")
    with pytest.raises(ValueError, match="num_splits"):
        kernels.KernelConfig(num_splits=0)


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(cache_seqlens=np.array([3, 4, 5])), ValueError, r"shape \(2,\)"),
    (dict(cache_seqlens=np.array([3, 41])), ValueError, r"\[0, Nk=40\].*41"),
    (dict(cache_seqlens=-1), ValueError, r"\[0, Nk=40\]"),
    (dict(cache_seqlens=np.array([1.0, 2.0])), TypeError, "integers"),
    (dict(cache_seqlens=True), TypeError, "bool"),
    (dict(cache_seqlens="7"), TypeError, "cache_seqlens"),
    (dict(cache_seqlens=5, causal=True), ValueError, "bottom_right"),
    (dict(cache_seqlens=5, dropout_p=0.1), ValueError, "dropout_p"),
    (dict(cache_seqlens=5, block_mask=(np.ones((1, 1)), (8, 64))), ValueError, "block_mask"),
])
def test_bad_cache_arguments_are_refused_naming_them(kwargs, error, match):
    q, k, v = make(np.random.default_rng(6), 2, 2, 1, 1, 40, 8)
    with pytest.raises(error, match=match):
        attention(q, k, v, backend="numpy", **kwargs)


def test_cache_seqlens_with_gradients_is_refused():
    torch = pytest.importorskip("torch")
    q, k, v = (torch.randn(1, 2, n, 8, requires_grad=True) for n in (1, 20, 20))
    with pytest.raises(ValueError, match="forward only"):
        attention(q, k, v, cache_seqlens=torch.tensor([10]))
    with torch.no_grad():
        out = attention(q, k, v, cache_seqlens=torch.tensor([10]), causal="bottom_right")
    want = attention(q.detach(), k.detach()[:, :, :10], v.detach()[:, :, :10], causal="bottom_right")
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)


# -- the plan and its costs (sim.decode) -------------------------------------------------------
H100 = load_profile("h100")


def test_splits_fill_one_wave_and_stop_when_it_is_full():
    wave = 132 * RESIDENT_PROGRAMS_PER_SM
    assert choose_splits(programs=1000, seqlen_k=131072, num_sms=132) == 1
    assert choose_splits(programs=wave, seqlen_k=131072, num_sms=132) == 1
    assert choose_splits(programs=8, seqlen_k=131072, num_sms=132) == wave // 8   # 33: one wave
    assert choose_splits(programs=64, seqlen_k=131072, num_sms=132) == 4
    assert choose_splits(programs=8, seqlen_k=4096, num_sms=132) == 4096 // MIN_KEYS_PER_SPLIT
    assert choose_splits(programs=8, seqlen_k=MIN_KEYS_PER_SPLIT, num_sms=132) == 1
    for programs in (1, 3, 8, 64, 200, 300):
        for nk in (256, 4096, 32768, 131072):
            s = choose_splits(programs, nk, 132)
            assert 1 <= s <= max(1, min(MAX_SPLITS, nk // MIN_KEYS_PER_SPLIT))
            assert s == 1 or programs * s <= wave                      # never a second wave
            if s < min(MAX_SPLITS, nk // MIN_KEYS_PER_SPLIT):
                assert programs * (s + 1) > wave                       # the most that fit


def test_rows_per_program_keeps_the_accumulators_in_registers():
    assert rows_per_program(4, 128) == 4 and rows_per_program(8, 64) == 4
    assert rows_per_program(64, 128) == 4 and rows_per_program(3 * 16, 256) == 4
    assert rows_per_program(3, 128) == 3 and rows_per_program(16, 128, 4) == 8
    plan = split_kv_plan(2, 32, 8, 16, 4096, 128, 2, 132, tensor_cores=False)
    assert plan.rows_per_program == 4 and plan.row_chunks == 16 and plan.grid[0] == 2 * 8 * 16
    assert plan.unit == "ffma"


def test_tensor_core_plan_takes_16_rows_and_its_warps_from_the_programs():
    """16-bit inputs at d 64/128 plan the tensor-core kernel: 16 rows a program (one mma tile),
    eight warps a program (one program an SM at d = 128) where the groups are fewer than the
    SMs (one program an SM), else four (two programs an SM at d = 128, four at d = 64: their
    registers and shared memory), two stages a warp; float32 and other head dims plan the CUDA-core kernel."""
    from sim.decode import MMA_ROWS, mma_resident_per_sm, mma_shared_bytes, uses_tensor_cores
    assert uses_tensor_cores(128, 2) and uses_tensor_cores(64, 2)
    assert not uses_tensor_cores(128, 4) and not uses_tensor_cores(96, 2)
    few = split_kv_plan(1, 32, 8, 1, 32768, 128, 2, 132)
    assert few.unit == "mma" and few.rows_per_program == MMA_ROWS and few.row_chunks == 1
    assert few.warps == 8 and few.stages == 2 and few.resident_per_sm == 1
    assert few.splits == 132 // 8 and few.threads == 256
    assert few.dynamic_shared_bytes == mma_shared_bytes(128, 8, 16, 2)[0] == 8 * 2 * 2 * 16 * 136 * 2
    many = split_kv_plan(64, 32, 8, 1, 32768, 128, 2, 132)
    assert many.warps == 4 and many.stages == 2 and many.resident_per_sm == 2 and many.splits == 1
    pinned = split_kv_plan(1, 32, 8, 1, 32768, 128, 2, 132, mma_warps=4)
    assert pinned.warps == 4 and pinned.resident_per_sm == 2 and pinned.splits == 264 // 8
    assert mma_resident_per_sm(128, 228 * 1024, 4) == 2 and mma_resident_per_sm(64, 228 * 1024, 4) == 4
    assert mma_resident_per_sm(128, 228 * 1024, 8) == 1 and mma_resident_per_sm(64, 228 * 1024, 8) == 1
    spec = split_kv_plan(2, 32, 8, 16, 4096, 64, 2, 132)           # 64 rows a group: 4 chunks
    assert spec.row_chunks == 4 and spec.grid[0] == 2 * 8 * 4
    assert split_kv_plan(1, 32, 8, 1, 32768, 128, 4, 132).unit == "ffma"
    assert split_kv_plan(1, 32, 8, 1, 32768, 96, 2, 132).unit == "ffma"


def test_simulator_plans_the_cuda_core_kernel_and_refuses_mma_by_name():
    """Under the CUDA simulator (no tensor-core instruction) the launcher plans the CUDA-core
    kernel; asking for the tensor-core one is refused with a message naming the argument."""
    import kernels
    from ioaware._inputs import check_inputs
    from kernels import decode_fwd
    rng = np.random.default_rng(0)
    pb = check_inputs(*make(rng, 1, 8, 2, 1, 300, 128, np.float16))
    assert decode_fwd.plan(pb, kernels.KernelConfig(family="split_kv")).unit == "ffma"
    with pytest.raises(ValueError, match="decode_unit"):
        decode_fwd.plan(pb, kernels.KernelConfig(family="split_kv", decode_unit="mma"))
    with pytest.raises(ValueError, match="decode_unit"):
        kernels.KernelConfig(decode_unit="wgmma")


def test_lanes_per_key_give_each_lane_four_words():
    from sim.decode import lanes_per_key
    assert lanes_per_key(128, 2) == 16 and lanes_per_key(64, 2) == 8 and lanes_per_key(128, 4) == 32
    assert lanes_per_key(8, 4) == 4 and lanes_per_key(256, 4) == 32


def test_kv_is_counted_once_per_kv_head():
    """GQA 32/8: the plan reads K/V once per KV head, a quarter of once per query head."""
    plan = split_kv_plan(8, 32, 8, 1, 32768, 128, 2, H100.num_sms)
    costs = split_kv_costs(plan, H100)
    assert costs["kv_bytes"] == 8 * 8 * 32768 * 2 * 128 * 2
    mha = split_kv_costs(split_kv_plan(8, 32, 32, 1, 32768, 128, 2, H100.num_sms), H100)
    assert mha["kv_bytes"] == 4 * costs["kv_bytes"]
    assert costs["dram_read_bytes"] >= costs["kv_bytes"]
    assert costs["time_s"] >= costs["kv_bytes"] / H100.hbm_bandwidth_bytes_per_s


def test_costs_take_the_measured_rates_and_one_launch(tmp_path):
    """At a profile loaded with a rates file, the time is the DRAM bytes at the measured DRAM
    read rate (stretched by the wave) plus the merge's partials, plus one measured launch cost (the
    merge is in the same launch); at datasheet rates there is no launch cost and the datasheet
    bandwidth prices the bytes. One split writes no partials and merges nothing."""
    import json
    from pathlib import Path
    rates_file = Path(__file__).resolve().parent.parent / "results" / "rates_h100_2026-11-24.json"
    rates = {k: v["value"] for k, v in json.loads(rates_file.read_text())["rates"].items()}
    measured = load_profile("h100", rates=str(rates_file))
    plan = split_kv_plan(8, 32, 8, 1, 32768, 128, 2, H100.num_sms)
    assert plan.splits > 1
    c, d = split_kv_costs(plan, measured), split_kv_costs(plan, H100)
    assert plan.unit == "mma"
    assert c["rates"] == {"dram_read_bytes_per_s": "measured", "mma_bf16_flops_per_s": "measured",
                          "launch_s": "measured"}
    cuda_cores = split_kv_plan(8, 32, 8, 1, 32768, 128, 2, H100.num_sms, tensor_cores=False)
    assert split_kv_costs(cuda_cores, measured)["rates"] == {
        "dram_read_bytes_per_s": "measured", "ffma_flops_per_s": "measured", "launch_s": "measured"}
    assert d["rates"]["launch_s"] == "datasheet"
    bw = rates["dram_read_bytes_per_s"]        # a read stream: the read bandwidth, not the copy
    main_dram = c["dram_read_bytes"]        # what the split loop moves: K/V, Q and the partials
    assert c["time_main_s"] == pytest.approx(rates["kernel_launch_s"] + main_dram / bw
                                             / c["wave_efficiency"])
    partials = plan.splits * 8 * 32 * (128 + 1) * 4
    assert c["time_merge_s"] == pytest.approx(partials / bw)
    assert c["time_s"] == pytest.approx(c["time_main_s"] + c["time_merge_s"])
    assert d["time_main_s"] == pytest.approx(main_dram / H100.hbm_bandwidth_bytes_per_s
                                             / d["wave_efficiency"])
    assert c["launches"] == 1 and c["dram_read_bytes"] == d["dram_read_bytes"]
    one = split_kv_costs(split_kv_plan(64, 32, 8, 1, 32768, 128, 2, H100.num_sms, splits=1),
                         measured)
    assert one["time_merge_s"] == 0 and one["dram_write_bytes"] == 64 * 32 * (128 * 2 + 4)
    assert one["dram_read_bytes"] == one["kv_bytes"] + 64 * 32 * 128 * 2


def test_decode_report_scores_the_shipped_file_against_its_targets(capsys):
    """`benchmarks decode --report`: every record of the shipped decode file re-priced by today's
    plan of the kernel it ran (its ``plan``), the DRAM error against its Nsight Compute bytes, the
    time error against our GPU time and the split pick's loss, and the summary against #17's
    targets."""
    import dataclasses
    import json
    from pathlib import Path

    from benchmarks.decode import REPORT_TARGETS, decode_report, main
    root = Path(__file__).resolve().parent.parent / "results"
    doc = json.loads((root / DECODE_FILE).read_text())
    profile = load_profile("h200", rates=str(root / "rates_h200_2026-11-24.json"))
    rows, summary = decode_report(doc, profile)
    assert len(rows) == len(doc["decode"]) == 18
    r0, row0 = doc["decode"][0], rows[0]
    assert row0["gpu_ms"] == r0["ioaware_device_ms"]
    plan0 = split_kv_plan(r0["batch"], r0["heads_q"], r0["heads_kv"], 1, r0["seq_len_k"],
                          r0["head_dim"], 2, profile.num_sms, tensor_cores=True,
                          mma_warps=r0["plan"]["warps"])
    assert row0["dram_rel_error"] == pytest.approx(
        split_kv_costs(plan0, profile)["dram_read_bytes"] / r0["ncu"]["dram__bytes_read.sum"] - 1)
    for metric in ("dram", "time", "splits"):
        m = summary[metric]
        assert m["target"] == REPORT_TARGETS[metric] and 0 <= m["within"] <= m["n"] <= 18
    assert summary["dram"]["within"] == 18            # the counters of the shipped file
    # what docs/model.md states of the shipped file
    assert (summary["time"]["within"], summary["splits"]["within"]) == (18, 18)
    assert main(["--report", str(root / DECODE_FILE), "--rates",
                 str(root / "rates_h200_2026-11-24.json")]) == 0
    out = capsys.readouterr().out
    assert "nothing fitted on the file" in out and f"{summary['time']['within']} of 18 within 15%" in out
    # the shipped records name the plan that ran (the tensor-core kernel); a record that names
    # none ran the CUDA-core kernel, the only one before, and is priced by that kernel's plan
    assert all(r["plan"]["unit"] == "mma" for r in doc["decode"])
    ffma = split_kv_plan(r0["batch"], r0["heads_q"], r0["heads_kv"], 1, 32768, r0["head_dim"], 2,
                         profile.num_sms, tensor_cores=False)
    mma = split_kv_plan(r0["batch"], r0["heads_q"], r0["heads_kv"], 1, 32768, r0["head_dim"], 2,
                        profile.num_sms, tensor_cores=True)
    assert (ffma.splits, mma.splits, mma.warps) == (33, 16, 8)    # 2 and 1 resident an SM
    four = dataclasses.replace(mma, warps=4)             # a record of four warps: its own plan
    for plan in (ffma, mma, four):
        rec = {k: v for k, v in r0.items() if k != "plan"} | {"seq_len_k": 32768}
        if plan.unit == "mma":
            rec["plan"] = plan.as_dict()
        (row,), _ = decode_report({"decode": [rec]}, profile)
        want = split_kv_plan(r0["batch"], r0["heads_q"], r0["heads_kv"], 1, 32768, r0["head_dim"],
                             2, profile.num_sms, tensor_cores=plan.unit == "mma",
                             mma_warps=plan.warps if plan.unit == "mma" else None, gpu=profile)
        assert row["splits"] == want.splits
        assert row["model_ms"] == pytest.approx(split_kv_costs(want, profile)["time_s"] * 1e3)


def _decode_rates(stream: dict, fixed=6e-6, fill=1.5e-6, handoff=3e-6, head_dim=128) -> dict:
    """Decode figures at ``head_dim`` by their rate names (``stream``: programs -> bytes/s)."""
    from sim.profiles import decode_rate_name
    rates = {decode_rate_name(head_dim, "stream", p): a for p, a in stream.items()}
    return rates | {decode_rate_name(head_dim, w): v for w, v in
                    (("fixed", fixed), ("fill", fill), ("handoff", handoff))}


def _decode_profile(stream: dict, base="h200", **times):
    """The ``base`` profile with these d=128 decode figures shipped (``stream``: programs ->
    bytes/s), and no others."""
    import dataclasses
    return dataclasses.replace(load_profile(base), decode_rates=_decode_rates(stream, **times),
                               measured_rates=None)


def test_stream_rate_interpolates_the_measured_program_counts():
    from sim.decode import stream_rate
    stream = {1: 80e9, 64: 4.4e12, 128: 4.6e12}
    assert stream_rate(stream, 1) == 80e9
    assert stream_rate(stream, 96) == pytest.approx(4.5e12)                # linear between
    assert stream_rate(stream, 32) == pytest.approx(80e9 + (4.4e12 - 80e9) * 31 / 63)
    assert stream_rate(stream, 132) == 4.6e12                               # the last, above
    assert stream_rate({8: 640e9}, 2) == pytest.approx(160e9)              # per program, below


def test_decode_rates_come_from_a_rates_file_before_the_profile():
    """`sim.decode.decode_rates` at a head dim: a rates file's decode group (measured) over the
    profile's shipped one; None where either lacks a figure at that head dim; the shipped H200
    profile has them at d 64 and 128, H100's has none."""
    import dataclasses
    from sim.decode import decode_rates
    from sim.profiles import RATE_UNITS, RATES_SCHEMA
    shipped = _decode_profile({1: 80e9, 128: 4.6e12})
    got, source = decode_rates(shipped, 128)
    assert source == "profile" and got == {"fixed": 6e-6, "fill": 1.5e-6, "handoff": 3e-6,
                                           "stream": {1: 80e9, 128: 4.6e12}}
    assert decode_rates(shipped, 64) is None                # no figures at that head dim
    mine = _decode_rates({4: 3e11}, fixed=1e-6, fill=1e-6, handoff=9e-6)
    doc = {"schema": RATES_SCHEMA, "provenance": {"gpu": "NVIDIA H200"},
           "rates": {n: {"value": v, "unit": RATE_UNITS[n]} for n, v in mine.items()}}
    got, source = decode_rates(shipped.with_rates(doc), 128)
    assert source == "measured" and got["handoff"] == 9e-6 and got["stream"] == {4: 3e11}
    doc["rates"].pop("decode_d128_fill_s")                  # incomplete: the shipped ones
    assert decode_rates(shipped.with_rates(doc), 128)[1] == "profile"
    assert decode_rates(load_profile("h100"), 128) is None
    assert all(decode_rates(load_profile("h200"), d)[1] == "profile" for d in (64, 128))
    with pytest.raises(ValueError, match="decode_rates"):
        dataclasses.replace(load_profile("h100"), decode_rates={"decode_d128_fixed_s": -1.0})
    with pytest.raises(ValueError, match="unknown rate"):
        dataclasses.replace(load_profile("h100"), decode_rates={"dram_read_bytes_per_s": 1e12})


def test_costs_at_the_decode_figures_are_fixed_fill_stream_and_handoff():
    """With a GPU's decode figures the tensor-core plan costs its fixed GPU time, the ring's fill
    where a warp's share of the split is more blocks than its ring, the DRAM bytes at the stream
    rate of its programs, and with splits the handoff plus the partials at the read rate; no
    launch cost. The CUDA-core plan keeps the bandwidth-and-waves price."""
    from sim.decode import MMA_BLOCK_K, MMA_STAGES, decode_rates, stream_rate
    prof = _decode_profile({1: 80e9, 64: 4.4e12, 128: 4.6e12})
    d, _ = decode_rates(prof, 128)
    bw = prof.hbm_bandwidth_bytes_per_s                    # datasheet read rate: no rates file
    for batch, nk, splits in ((8, 4096, 1), (8, 4096, 2), (1, 4096, 16), (1, 256, 1)):
        plan = split_kv_plan(batch, 32, 8, 1, nk, 128, 2, 132, splits=splits)
        assert plan.unit == "mma" and plan.warps == 8 and plan.resident_per_sm == 1
        c = split_kv_costs(plan, prof)
        assert c["rates"]["decode"] == "profile"
        per_warp = -(-(-(-nk // splits)) // (plan.warps * MMA_BLOCK_K))
        fill = d["fill"] if per_warp > MMA_STAGES else 0.0
        stream = c["dram_read_bytes"] / stream_rate(d["stream"], plan.programs * splits)
        assert c["time_main_s"] == pytest.approx(d["fixed"] + fill + stream)
        partials = c["dram_read_bytes"] - c["kv_bytes"] - batch * 32 * 128 * 2
        merge = d["handoff"] + partials / bw if splits > 1 else 0.0
        assert c["time_merge_s"] == pytest.approx(merge)
    assert split_kv_costs(split_kv_plan(1, 32, 8, 1, 4096, 128, 2, 132, splits=16), prof)[
        "time_main_s"] < split_kv_costs(split_kv_plan(1, 32, 8, 1, 4096, 128, 2, 132, splits=8),
                                        prof)["time_main_s"]     # 2 blocks a warp: no fill
    ffma = split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132, tensor_cores=False)
    assert "decode" not in split_kv_costs(ffma, prof)["rates"]


def test_the_split_count_is_the_cheapest_at_the_decode_figures():
    """`split_kv_plan(gpu=...)` with decode figures takes the cheapest of
    `split_candidates` by `split_kv_costs` (ties to fewer splits): one split where the groups'
    programs already stream at the saturated rate (the handoff buys nothing), more where the
    rate still grows; without figures, for the CUDA-core kernel and for given splits, the rule
    and the splits as before."""
    import dataclasses
    from sim.decode import split_candidates
    flat = _decode_profile({1: 80e9, 64: 4.6e12, 128: 4.6e12})     # saturated at 64 programs
    rising = _decode_profile({1: 80e9, 64: 4.0e12, 128: 4.6e12})
    assert split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132, gpu=flat).splits == 1
    assert split_kv_plan(8, 32, 8, 1, 32768, 128, 2, 132, gpu=rising).splits == 2
    assert split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132).splits == 2          # the wave rule
    assert split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132, gpu="h100").splits == 2   # no figures
    assert split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132, gpu=flat, splits=4).splits == 4
    ffma = split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132, tensor_cores=False, gpu=flat)
    assert ffma.splits == choose_splits(ffma.programs, 4096, 132)
    for batch in (1, 2, 3, 8, 24, 64, 200):
        for nk in (512, 4096, 65536):
            plan = split_kv_plan(batch, 32, 8, 1, nk, 128, 2, 132, gpu=rising)
            cands = split_candidates(plan.programs, nk, 132, plan.resident_per_sm)
            assert plan.splits in cands and 1 in cands
            costs = {s: split_kv_costs(dataclasses.replace(plan, splits=s), rising)["time_s"]
                     for s in cands}
            assert costs[plan.splits] == min(costs.values())
            assert plan.splits == min(s for s in cands if costs[s] == costs[plan.splits])
    # the figures describe the plans they were measured on: their head dim, one row chunk
    for other in (split_kv_plan(8, 32, 8, 1, 4096, 64, 2, 132, gpu=flat),
                  split_kv_plan(8, 32, 8, 16, 4096, 128, 2, 132, gpu=flat)):
        assert other.row_chunks > 1 or other.head_dim == 64
        assert other.splits == choose_splits(other.programs, 4096, 132, other.resident_per_sm)
        assert "decode" not in split_kv_costs(other, flat)["rates"]
    assert split_candidates(8, 4096, 132, 1) == [1, 2, 4, 8, 16]
    assert split_candidates(24, 65536, 132, 1) == [1, 2, 4, 5]
    assert split_candidates(200, 65536, 132, 1) == [1]


def test_shipped_decode_figures_are_those_of_the_rates_file_they_name():
    """The H200 profile's decode figures were written by ``rates --to-profile`` from the shipped
    rates file (not typed): the same values, and the source names that file and its run."""
    import json
    from pathlib import Path
    from sim.profiles import DECODE_RATE_UNITS
    root = Path(__file__).resolve().parent.parent
    doc = json.loads((root / "results" / "rates_h200_2026-11-24.json").read_text())
    prof = load_profile("h200")
    assert set(prof.decode_rates) == set(DECODE_RATE_UNITS)
    assert prof.decode_rates == {n: doc["rates"][n]["value"] for n in DECODE_RATE_UNITS}
    source = prof.sources["decode_rates"]
    run = [g for g in doc["provenance"]["groups_added"] if "decode" in g["groups"]][-1]
    assert "results/rates_h200_2026-11-24.json" in source and run["date"] in source


def test_to_profile_writes_the_decode_group_into_a_profile(tmp_path, capsys):
    """``python -m benchmarks rates --to-profile P --from R``: P gains R's decode group as its
    ``decode_rates`` and a source naming R and the run; refused (exit 2, a message) without a
    decode group in R, for a GPU the profile does not match, or with one of the two missing."""
    import json
    from benchmarks import rates as R
    from sim.profiles import DECODE_RATE_UNITS, PROFILE_DIR, RATES_SCHEMA
    prof_path = tmp_path / "h200.json"
    base = json.loads((PROFILE_DIR / "h200.json").read_text())
    base.pop("decode_rates", None), base["sources"].pop("decode_rates", None)
    prof_path.write_text(json.dumps(base))
    values = {n: (2e-6 if u == "s" else 1e12) for n, u in DECODE_RATE_UNITS.items()}
    doc = {"schema": RATES_SCHEMA,
           "provenance": {"gpu": "NVIDIA H200", "date": "2026-11-28T00:00:00+00:00",
                          "command": "python -m benchmarks rates --only decode",
                          "code_version": {"commit": "abc1234", "dirty": False}},
           "rates": {n: {"value": v, "unit": DECODE_RATE_UNITS[n]} for n, v in values.items()}}
    rates_path = tmp_path / "rates.json"
    rates_path.write_text(json.dumps(doc))
    assert R.main(["--to-profile", str(prof_path), "--from", str(rates_path)]) == 0
    got = load_profile(str(prof_path))
    assert got.decode_rates == values and str(rates_path) in got.sources["decode_rates"]
    assert "abc1234" in got.sources["decode_rates"] and got.l2_bytes == base["l2_bytes"]
    assert split_kv_plan(8, 32, 8, 1, 4096, 128, 2, 132, gpu=got).unit == "mma"
    part = dict(doc, rates={n: e for n, e in doc["rates"].items() if n != "decode_d64_fill_s"})
    rates_path.write_text(json.dumps(part))              # d=64 incomplete: d=128's alone
    assert R.main(["--to-profile", str(prof_path), "--from", str(rates_path)]) == 0
    assert set(load_profile(str(prof_path)).decode_rates) == {
        n for n in DECODE_RATE_UNITS if n.startswith("decode_d128_")}
    capsys.readouterr()
    for bad, why in (({"rates": {}}, "no decode group"),
                     ({"provenance": dict(doc["provenance"], gpu="NVIDIA H100 80GB HBM3")},
                      "does not match")):
        rates_path.write_text(json.dumps(doc | bad))
        assert R.main(["--to-profile", str(prof_path), "--from", str(rates_path)]) == 2
        assert why in capsys.readouterr().err
    assert R.main(["--to-profile", str(prof_path)]) == 2
    assert "go together" in capsys.readouterr().err


def test_window_report_prices_the_forward_the_gpu_runs(capsys):
    """`decode --report` prices each window record's windowed and full-causal forward with the
    plan of the family our launchers run on the file's GPU (H200: the Hopper forward), and the
    window's share of the causal time; a GPU below compute capability 9.0 gets the mma plan."""
    import dataclasses
    import json
    from pathlib import Path

    from benchmarks.decode import main, window_report
    from sim.plan import price
    from sim.plans import plan_for
    from sim.workload import Workload
    root = Path(__file__).resolve().parent.parent / "results"
    doc = json.loads((root / DECODE_FILE).read_text())
    profile = load_profile("h200", rates=str(root / "rates_h200_2026-11-24.json"))
    rows = window_report(doc, profile)
    assert len(rows) == len(doc["window"]) >= 1
    rec, row = doc["window"][0], rows[0]
    w = Workload(batch=rec["batch"], heads=rec["heads"], seq_len_q=rec["seq_len"],
                 head_dim=rec["head_dim"], dtype=rec["dtype"], causal=True,
                 window_size=tuple(rec["window"]))
    assert row["family"] == "wgmma"
    assert row["model_window_ms"] == pytest.approx(price(plan_for("wgmma", "fwd", w), profile).time_s * 1e3)
    assert row["window_ms"] == rec["times_ms"]["ioaware-window"]["ms"]
    assert row["window_rel_error"] == pytest.approx(row["model_window_ms"] / row["window_ms"] - 1)
    assert 0 < row["model_ratio"] < 1 and 0 < row["ratio"] < 1
    ampere = dataclasses.replace(profile, compute_capability=(8, 0))
    assert window_report(doc, ampere)[0]["family"] == "mma"
    assert main(["--report", str(root / DECODE_FILE)]) == 0
    assert "sliding windows: today's plan of the wgmma forward" in capsys.readouterr().out


def test_cli_prices_split_kv_at_measured_rates_when_given(capsys):
    """``sim predict --schedule split-kv --rates FILE``: the measured rates (launch cost included)
    price the plan; the textbook schedules refuse ``--rates`` by name."""
    import json
    from pathlib import Path

    from sim.cli import main
    rates = str(Path(__file__).resolve().parent.parent / "results" / "rates_h100_2026-11-24.json")
    args = ["predict", "--schedule", "split-kv", "--seq-len", "1", "--seq-len-k", "4096", "--heads", "32",
            "--heads-kv", "8", "--head-dim", "128", "--batch", "1", "--dtype", "bf16", "--json"]
    assert main(args) == 0
    datasheet = json.loads(capsys.readouterr().out)
    assert main(args + ["--rates", rates]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert measured["rates"]["launch_s"] == "measured" and datasheet["rates"]["launch_s"] == "datasheet"
    assert measured["dram_read_bytes"] == datasheet["dram_read_bytes"]
    assert measured["time_s"] > datasheet["time_s"] + 1e-6     # a launch and a slower DRAM rate
    with pytest.raises(SystemExit, match="--rates applies to --schedule split-kv and flash3"):
        main(["predict", "--schedule", "flash2", "--seq-len", "64", "--rates", rates])


def test_cli_predicts_split_kv_with_the_chosen_or_given_splits(capsys):
    import json

    from sim.cli import main
    args = ["predict", "--schedule", "split-kv", "--seq-len", "1", "--seq-len-k", "32768", "--heads", "32",
            "--heads-kv", "8", "--head-dim", "128", "--batch", "8", "--dtype", "bf16", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    # 64 groups, fewer than the SMs: the eight-warp plan, one program an SM
    assert d["plan"]["unit"] == "mma" and d["plan"]["warps"] == 8 and d["plan"]["threads"] == 256
    assert d["splits"] == choose_splits(64, 32768, H100.num_sms, 1) == 2 and d["dram_read_bytes"] > 2**30
    assert main(args + ["--splits", "3"]) == 0
    assert json.loads(capsys.readouterr().out)["splits"] == 3
    # four warps a program pinned: two resident an SM, so twice the splits fill the wave
    assert main(args + ["--decode-warps", "4"]) == 0
    four = json.loads(capsys.readouterr().out)
    assert four["plan"]["warps"] == 4 and four["splits"] == choose_splits(64, 32768, H100.num_sms, 2)
    with pytest.raises(SystemExit, match="--decode-warps"):
        main(args[:-2] + ["fp32", "--json", "--decode-warps", "4"])
    # the table (no --json): on the H200 the kernel's shipped decode figures price it
    for device, priced in (("h100", "DRAM at datasheet rates"),
                           ("h200", "the kernel's measured decode figures (profile)")):
        assert main(args[:-1] + ["--device", device]) == 0
        out = capsys.readouterr().out
        assert "splits" in out and "(chosen by the model)" in out and priced in out
    with pytest.raises(SystemExit, match="split-kv"):
        main(["predict", "--schedule", "flash2", "--seq-len", "64", "--splits", "2"])


# -- on a GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("nq, causal, window", [(1, False, None), (4, "bottom_right", None),
                                                (2, "bottom_right", (500, 0))])
def test_gpu_decoding_matches_sdpa_in_float32(dtype, nq, causal, window):
    import torch
    import torch.nn.functional as F
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(nq)
    b, hq, hkv, nk, d = 3, 32, 8, 5000, 128
    q = torch.randn(b, hq, nq, d, device="cuda", generator=g).to(dt)
    k = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(dt)
    v = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(dt)
    lengths = torch.tensor([nk, 1, 2048], dtype=torch.int32, device="cuda")
    out, lse = attention(q, k, v, cache_seqlens=lengths, causal=causal, window_size=window, return_lse=True)
    assert out.dtype == dt and lse.dtype == torch.float32
    mask = torch.stack([torch.from_numpy(cache_rule(nq, nk, int(n), window, bool(causal))) for n in lengths])
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask[:, None].cuda(),
                                          enable_gqa=True)
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)


TC_CASES = [  # (b, hq, hkv, nq, nk, d, lengths, window, causal, splits, warps)
    (2, 8, 2, 1, 300, 64, [300, 1], None, False, None, None),
    (3, 32, 8, 4, 1000, 128, [1000, 0, 513], None, "bottom_right", 7, 4),   # an empty cache
    (2, 16, 4, 2, 777, 128, [777, 40], (100, 0), "bottom_right", 3, None),
    (1, 64, 4, 16, 530, 128, [529], None, "bottom_right", None, 4),           # 16 row chunks
    (2, 4, 1, 3, 333, 64, [333, 2], (5, 5), False, 1, 4),                     # MQA, one split
    (2, 8, 8, 1, 250, 128, [250, 17], (0, 0), False, 40, 8),                  # window 0, 40 splits
    (40, 8, 8, 1, 200, 128, [200 - i for i in range(40)], None, False, None, None),  # many programs
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("b, hq, hkv, nq, nk, d, lengths, window, causal, splits, warps",
                         TC_CASES)
def test_gpu_tensor_core_decoding_equals_the_float64_rule(b, hq, hkv, nq, nk, d, lengths, window, causal,
                                                         splits, warps, dtype):
    """The tensor-core split-KV kernel (``decode_unit="mma"``) against float64 on the inputs as
    rounded: GQA and MQA, 16-row chunks, causal and windowed bands, cache lengths of 0, 1 and
    partial key blocks, one split to many, four and eight warps a program (the plan's choice:
    eight where the programs are fewer than the SMs); a length the kernel refuses gives NaN
    rows. Tolerances: float16 4e-3, bfloat16 2e-2 (P is rounded to 16 bits for the second
    product); the logsumexp 1e-4."""
    import dataclasses
    import torch
    import kernels
    from ioaware._inputs import check_inputs
    from kernels import decode_fwd
    dt = getattr(torch, dtype)
    rng = np.random.default_rng(nk + d)
    q, k, v = (torch.from_numpy(x).cuda().to(dt) for x in make(rng, b, hq, hkv, nq, nk, d))
    q = q * 3                                            # larger logits
    cfg = kernels.KernelConfig(family="split_kv", num_splits=splits, decode_unit="mma",
                               decode_warps=warps)
    bad = list(lengths) + [-1, nk + 1]
    qb, kb, vb = (torch.cat([x, x[:2]]) for x in (q, k, v))
    pb = dataclasses.replace(check_inputs(qb, kb, vb, causal=causal, window_size=window),
                             cache_seqlens=torch.tensor(bad, dtype=torch.int32, device="cuda"))
    p = decode_fwd.plan(pb, cfg)
    few = p.programs < decode_fwd._num_sms()         # (batch, KV head, row chunk) groups
    assert p.unit == "mma" and p.warps == (warps or (8 if few else 4))
    out, lse = kernels.forward(pb, cfg)
    assert out.dtype == dt and lse.dtype == torch.float32
    assert torch.isnan(out[b:]).all() and torch.isnan(lse[b:]).all()
    as64 = [x.float().cpu().numpy() for x in (q, k, v)]
    want_out, want_lse = reference(*as64, lengths, window, bool(causal))
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    np.testing.assert_allclose(out[:b].float().cpu().numpy(), want_out, atol=tol, rtol=tol)
    got_lse = lse[:b].cpu().numpy()
    finite = np.isfinite(want_lse)
    assert np.array_equal(np.isneginf(got_lse), ~finite)
    np.testing.assert_allclose(got_lse[finite], want_lse[finite], atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_cuda_core_decoding_equals_the_float64_rule(dtype):
    """The CUDA-core split-KV kernel (``decode_unit="ffma"``; the one float32 runs) on a GPU
    against float64: GQA, cache lengths of 0, 1 and partial, three splits and one; a length
    the kernel refuses gives NaN rows. Tolerances: float32 2e-5, float16 2e-3; the logsumexp
    1e-4."""
    import dataclasses
    import torch
    import kernels
    from ioaware._inputs import check_inputs
    dt = getattr(torch, dtype)
    rng = np.random.default_rng(17)
    b, nk, lengths = 3, 700, [700, 0, 333]
    q, k, v = (torch.from_numpy(x).cuda().to(dt) for x in make(rng, b, 8, 2, 2, nk, 128))
    bad = lengths + [-1]
    qb, kb, vb = (torch.cat([x, x[:1]]) for x in (q, k, v))
    as64 = [x.double().cpu().numpy() for x in (q, k, v)]
    want_out, want_lse = reference(*as64, lengths, None, False)
    for splits in (3, 1):
        cfg = kernels.KernelConfig(family="split_kv", num_splits=splits, decode_unit="ffma")
        pb = dataclasses.replace(check_inputs(qb, kb, vb),
                                 cache_seqlens=torch.tensor(bad, dtype=torch.int32,
                                                            device="cuda"))
        out, lse = kernels.forward(pb, cfg)
        assert torch.isnan(out[b:]).all() and torch.isnan(lse[b:]).all()
        tol = 2e-5 if dtype == "float32" else 2e-3
        np.testing.assert_allclose(out[:b].double().cpu().numpy(), want_out, atol=tol,
                                   rtol=tol)
        got_lse = lse[:b].cpu().numpy()
        finite = np.isfinite(want_lse)
        assert np.array_equal(np.isneginf(got_lse), ~finite)
        np.testing.assert_allclose(got_lse[finite], want_lse[finite], atol=1e-4, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("batch, d", [(64, 128), (1, 128), (64, 64), (1, 64)])
def test_gpu_tensor_core_launch_holds_an_sm_to_the_plans_resident_programs(batch, d):
    """The launch asks for the shared-memory carveout that fits just the plan's resident
    programs an SM (`kernels.host`): the driver's occupancy of the launched function, with the
    plan's threads and dynamic shared memory, is the plan's ``resident_per_sm`` (at d = 128,
    four warps, a third program fits the registers and would fit the whole carveout: it ran
    slower), for four warps (batch 64) and eight (batch 1)."""
    import torch
    from numba.cuda.cudadrv.driver import driver
    from ioaware import attention
    from ioaware._inputs import check_inputs
    from kernels import decode_fwd, host
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(batch, 32, 1, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(batch, 8, 1024, d, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))
    attention(q, k, v, backend="numba")
    torch.cuda.synchronize()
    p = decode_fwd.plan(check_inputs(q, k, v))
    assert p.unit == "mma" and p.warps == (8 if batch == 1 else 4)
    launched = [plan for plan in host._OVERLOADS.values()
                if getattr(plan.kern, "build_key", (None, None, ()))[1:] ==
                ("make_decode_mma_kernel", (d, 1, 4, "bfloat16", False, p.warps,
                                            p.keys_per_step, p.stages, p.resident_per_sm,
                                            False))]
    assert launched and all(plan.kern.resident_per_sm == p.resident_per_sm for plan in launched)
    for plan in launched:
        fn = plan.function(host.current_device_id())
        held = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn.handle, p.threads,
                                                                  p.dynamic_shared_bytes)
        assert held == p.resident_per_sm, (held, p.resident_per_sm)


@pytest.mark.gpu
def test_gpu_arrival_counters_stay_zero_between_calls():
    """The split-KV programs' arrival counters are zero after each call (the merging program sets
    its counter back), so calls with other split counts, batches and streams that follow are
    exact; a call on another stream gets its own counters."""
    import torch
    import torch.nn.functional as F
    import kernels
    from ioaware._inputs import check_inputs
    from kernels import decode_fwd
    g = torch.Generator(device="cuda").manual_seed(3)
    side = torch.cuda.Stream()
    for b, splits, stream in [(2, 7, None), (3, 13, None), (2, 5, side), (4, 1, None), (2, 29, side)]:
        q = torch.randn(b, 8, 1, 128, device="cuda", generator=g, dtype=torch.float16)
        k = torch.randn(b, 2, 3000, 128, device="cuda", generator=g, dtype=torch.float16)
        v = torch.randn(b, 2, 3000, 128, device="cuda", generator=g, dtype=torch.float16)
        run = decode_fwd.prepare(check_inputs(q, k, v),
                                 kernels.KernelConfig(family="split_kv", num_splits=splits))
        with torch.cuda.stream(stream or torch.cuda.current_stream()):
            for _ in range(4):                  # the full path twice, then the repeated one
                out, _ = run(q, k, v)
        torch.cuda.synchronize()
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
        torch.testing.assert_close(out.float(), want, atol=4e-3, rtol=4e-3)
        assert all(int(c.abs().sum()) == 0 for c in decode_fwd._COUNTERS.values())
    assert len({key[1] for key in decode_fwd._COUNTERS}) >= 2


@pytest.mark.gpu
def test_gpu_launcher_plans_with_the_profile_of_the_device():
    """The launcher's plan is `sim.decode.split_kv_plan` priced on the shipped profile whose name
    matches the device (its decode figures pick the split count where it has them), so what
    `sim` predicts for that GPU is what runs."""
    import torch
    from ioaware._inputs import check_inputs
    from kernels import decode_fwd
    from sim.profiles import profile_for_gpu_name
    prof = profile_for_gpu_name(torch.cuda.get_device_name())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for b, nk in ((1, 4096), (8, 4096), (8, 32768), (64, 4096)):
        q = torch.zeros(b, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.zeros(b, 8, nk, 128, device="cuda", dtype=torch.bfloat16)
        plan = decode_fwd.plan(check_inputs(q, k, k))
        want = split_kv_plan(b, 32, 8, 1, nk, 128, 2, sms, gpu=prof,
                             smem_bytes_per_sm=decode_fwd._smem_per_sm())
        assert plan == want


# -- cache lengths the host does not read --------------------------------------------------------
@pytest.mark.parametrize("bad", [-1, 41, 2**31 - 1])
def test_the_kernel_turns_an_unchecked_bad_length_into_nan_rows(bad):
    """Lengths on the device are not read by the host: the split-KV kernel checks them itself.
    A row whose length lies outside [0, Nk] comes out NaN (never a read past the cache, never a
    plausible number); the other rows are exact."""
    import dataclasses
    import kernels
    from ioaware._inputs import check_inputs
    rng = np.random.default_rng(7)
    q, k, v = make(rng, 3, 4, 2, 2, 40, 8)
    lengths = np.array([40, bad, 17], np.int32)
    pb = dataclasses.replace(check_inputs(q, k, v, causal="bottom_right"), cache_seqlens=lengths)
    out, lse = kernels.forward(pb, kernels.KernelConfig(family="split_kv", num_splits=3))
    assert np.isnan(out[1]).all() and np.isnan(lse[1]).all()
    good = np.array([0, 2])
    want_out, want_lse = reference(q[good], k[good], v[good], lengths[good], None, True)
    check(out[good], lse[good], want_out, want_lse, np.float32)


def test_a_call_without_lengths_runs_the_kernel_that_reads_none_and_agrees_with_one_that_does():
    """Without cache lengths the split-KV kernel is built not to read them (every length is
    Nk); with every length given as Nk the kernel that reads them runs. Both equal the float64
    reference, and each other bit for bit."""
    import dataclasses
    import kernels
    from ioaware._inputs import check_inputs
    rng = np.random.default_rng(11)
    q, k, v = make(rng, 2, 4, 2, 1, 300, 16)
    pb = check_inputs(q, k, v)
    config = kernels.KernelConfig(family="split_kv", num_splits=3)
    out, lse = kernels.forward(pb, config)
    full = np.full(2, 300, np.int32)
    out_l, lse_l = kernels.forward(dataclasses.replace(pb, cache_seqlens=full), config)
    want_out, want_lse = reference(q, k, v, full)
    check(out, lse, want_out, want_lse, np.float32)
    assert np.array_equal(out, out_l) and np.array_equal(lse, lse_l)


@pytest.mark.gpu
def test_gpu_one_prepared_call_alternates_calls_with_and_without_lengths():
    """A prepared decoding call keeps a kernel for calls without lengths (it reads none) and one
    for calls that give them; alternating the two, past the calls that record each fast path,
    every result equals a fresh call's on its own lengths."""
    import torch
    import torch.nn.functional as F
    import kernels
    from ioaware._inputs import check_inputs
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(2, 32, 1, 128, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(2, 8, 2048, 128, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2))
    run = kernels.decode_fwd.prepare(check_inputs(q, k, v),
                                     kernels.KernelConfig(family="split_kv", num_splits=4))
    lengths = torch.tensor([700, 2048], dtype=torch.int32, device="cuda")
    full = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    cut = torch.cat([F.scaled_dot_product_attention(
        q[i:i + 1].float(), k[i:i + 1, :, :n].float(), v[i:i + 1, :, :n].float(), enable_gqa=True)
        for i, n in enumerate((700, 2048))])
    with torch.inference_mode():
        for _ in range(4):
            out, _ = run(q, k, v)
            torch.testing.assert_close(out.float(), full, atol=4e-3, rtol=4e-3)
            out, _ = run(q, k, v, cache_seqlens=lengths)
            torch.testing.assert_close(out.float(), cut, atol=4e-3, rtol=4e-3)


def test_unread_lengths_are_read_and_checked_where_the_kernel_does_not_run():
    """The row-by-row path (any backend, or problems the split-KV kernel does not take) reads
    lengths that were left on the device, and refuses a bad one by name."""
    import dataclasses
    from ioaware._backends import _run_forward_with_cache
    from ioaware._inputs import check_inputs
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, k, v = (torch.from_numpy(x) for x in make(rng, 2, 2, 1, 1, 30, 8))
    pb = check_inputs(q, k, v)
    lengths = torch.tensor([30, 9], dtype=torch.int32)
    out, lse = _run_forward_with_cache(dataclasses.replace(pb, cache_seqlens=lengths), None, "numpy")
    want_out, want_lse = reference(*(x.numpy() for x in (q, k, v)), np.array([30, 9]), None, False)
    check(out.numpy(), lse.numpy(), want_out, want_lse, np.float32)
    with pytest.raises(ValueError, match="cache_seqlens"):
        _run_forward_with_cache(dataclasses.replace(pb, cache_seqlens=torch.tensor([31, 0])), None, "numpy")


@pytest.mark.gpu
def test_gpu_decoding_step_with_device_lengths_is_captured_and_replayed():
    """A decoding step whose cache lengths live on the GPU is captured in a CUDA graph; the
    lengths are updated in place between replays (as a decoding loop does), and each replay
    equals a fresh call on the new lengths. The lengths are never read by the host."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(0)
    b, hq, hkv, nk, d = 4, 32, 8, 3000, 128
    q = torch.randn(b, hq, 1, d, device="cuda", generator=g).to(torch.bfloat16)
    k = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(torch.bfloat16)
    v = torch.randn(b, hkv, nk, d, device="cuda", generator=g).to(torch.bfloat16)
    lengths = torch.tensor([100, 2999, 1, 1500], dtype=torch.int32, device="cuda")
    step = lambda: attention(q, k, v, cache_seqlens=lengths, causal="bottom_right", return_lse=True)
    with torch.inference_mode():
        step()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = step()
        for new in ([100, 2999, 1, 1500], [3000, 0, 7, 2048], [5, 6, 3001, 1]):
            lengths.copy_(torch.tensor(new, dtype=torch.int32))
            graph.replay()
            torch.cuda.synchronize()
            want_out, want_lse = attention(q, k, v, cache_seqlens=np.array([min(n, nk) for n in new]),
                                           causal="bottom_right", return_lse=True)
            ok = torch.tensor([n <= nk for n in new], device="cuda")
            torch.testing.assert_close(out[ok], want_out[ok], atol=0, rtol=0)
            torch.testing.assert_close(lse[ok], want_lse[ok], atol=0, rtol=0)
            assert torch.isnan(out[~ok]).all() and torch.isnan(lse[~ok]).all()


# -- the tensor-core kernel's registers (ptxas, CPU) ---------------------------------------------
def compile_decode_mma_kernels(outdir) -> list:
    """ptxas figures of the tensor-core split-KV kernel (PTX for sm_90, bfloat16, one query and
    GQA 4) at d = 64 and 128, with and without the band test, at both warp counts of its plan.
    Run in a process without the CUDA simulator."""
    from numba import types

    from benchmarks.common import allow_offline_compile, compile_sm90, find_ptxas, parse_ptxas
    allow_offline_compile()
    from kernels import decode_fwd
    from sim.decode import MMA_BLOCK_K, MMA_STAGES, MMA_WARPS, MMA_WARPS_FEW_PROGRAMS
    words, f32, i64 = types.Array(types.uint32, 4, "C"), types.float32, types.int64
    sig = (words, words, words, types.Array(f32, 2, "C"), types.Array(f32, 2, "C"),
           types.Array(types.int32, 4, "C"), types.Array(f32, 3, "C"),
           types.Array(types.int32, 1, "C"), types.Array(types.int32, 1, "C"), f32, i64, i64, i64,
           i64, i64, i64)
    out = []
    for d in (64, 128):
        for banded in (False, True):
            for warps in (MMA_WARPS, MMA_WARPS_FEW_PROGRAMS):
                kern = decode_fwd.make_decode_mma_kernel(d, 1, 4, "bfloat16", banded, warps,
                                                         MMA_BLOCK_K, MMA_STAGES)
                r = compile_sm90(kern, sig, f"decode_mma_{d}_{int(banded)}_{warps}", outdir,
                                 find_ptxas())
                (fig,) = parse_ptxas(r["ptxas_log"])
                out.append({"head_dim": d, "banded": banded, "warps": warps,
                            "ptx_mma": r["ptx"].count("mma.sync"),
                            "ptx_local": r["ptx"].count(".local"), **fig})
    return out


def test_tensor_core_kernel_fits_the_resident_programs_its_plan_assumes(tmp_path):
    """ptxas: no local memory or spills, the mma count of one 16-key block (S = QK^T and
    O += PV: d/16 x 2 and d/8 products), and no more registers a thread than
    `sim.decode.MMA_REGISTERS` says (the plan's resident programs an SM follow from them)."""
    from sim.decode import MMA_BLOCK_K, MMA_REGISTERS

    from .helpers import compile_sm90a_in_child
    _ptxas, figures = compile_sm90a_in_child("tests.test_decode", "compile_decode_mma_kernels",
                                             tmp_path, timeout=900)
    assert len(figures) == 8
    for f in figures:
        d, where = f["head_dim"], f"d={f['head_dim']} banded={f['banded']} warps={f['warps']}"
        assert f["ptx_local"] == 0 and f["spill_store_bytes"] == f["spill_load_bytes"] == 0, where
        per_block = (d // 16) * (MMA_BLOCK_K // 8) + (MMA_BLOCK_K // 16) * (d // 8)
        assert f["ptx_mma"] >= per_block, where
        assert f["registers_per_thread"] <= MMA_REGISTERS[d, f["warps"]], where


def test_decode_benchmark_pins_our_kernel_by_unit():
    """`benchmarks decode --unit / --warps`: our call pinned to one split-KV kernel (through
    `kernels.decode_fwd.prepare`) computes what `ioaware.attention` does; the tensor-core one,
    or its warps, are refused by name where it cannot run (the simulator)."""
    from benchmarks.decode import ours_call
    rng = np.random.default_rng(11)
    q, k, v = make(rng, 1, 4, 2, 1, 300, 16)
    out, _ = ours_call(q, k, v, "ffma")()
    np.testing.assert_allclose(out, ours_call(q, k, v)(), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="decode_unit"):
        ours_call(q, k, v, "mma")
    with pytest.raises(ValueError, match="decode_warps"):
        ours_call(q, k, v, None, 8)
    import kernels
    for bad in (6, 0, True, "8", 8.0):
        with pytest.raises(ValueError, match="decode_warps"):
            kernels.KernelConfig(decode_warps=bad)
