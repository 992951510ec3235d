"""``python -m benchmarks rates`` and measured rates in a profile.

* Each microbenchmark kernel computes what it is said to, at tiny sizes: in Numba's CUDA
  simulator here (the PTX operations replaced by Python stand-ins with the same results), with
  the PTX itself in the ``gpu`` test: the DRAM/L2 read, write and copy kernels touch the
  vectors of their index map, the pointer chase follows its cycle, the shared-memory loads
  sum to the closed form, every ``mma`` chain ends at ``iters * K``, the FFMA chains at
  ``x0 + c + steps``, the ex2 chains at the fixed point of ``x = 2**-x``, and the ``cp.async``
  pipeline (depths 1, 2, 3) consumes every copied word exactly once.
* The ``wgmma`` group's kernels compile for sm_90a (CPU, ``ptxas``): the products unrolled in
  commit groups, no serialisation, no spills; under the simulator its rates are skipped with
  the reason, and on a compute-capability-9.0 GPU they are measured below 1.2x the datasheet.
* The command (in the simulator) writes a ``ioaware.rates/1`` file with provenance, every rate
  of `sim.profiles.RATE_UNITS` measured or skipped with a reason; bad ``--only`` and no GPU
  are one-line errors with exit code 2. ``--add-to FILE`` replaces the groups it measures and
  keeps the rest of FILE, recording the run in ``groups_added``; another GPU's file or a file
  that is not a rates file is refused naming ``--add-to``.
* ``load_profile(name, rates=FILE)`` gives a copy carrying the measured values (predictions
  unchanged); without ``rates`` the profile is the shipped one; a missing file, a wrong schema,
  a wrong unit, a bad value, another GPU's file are refused naming ``rates``.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from functools import reduce
from pathlib import Path

import numpy as np
import pytest

import sim
from benchmarks import rates as R
from sim.profiles import (DECODE_RATE_UNITS, RATE_UNITS, RATES_SCHEMA, load_profile,
                          profile_for_gpu_name)

from .conftest import REAL_GPU
from .helpers import assemble_sm90a, compile_sm90a_in_child

ROOT = Path(__file__).resolve().parents[1]


def _xor(a) -> int:
    return int(reduce(np.bitwise_xor, np.asarray(a, np.uint32).ravel(), np.uint32(0)))


# -- the kernels ---------------------------------------------------------------------------------

def check_dram_kernels(threads=32, per_thread=2):
    read, write, copy = R.dram_kernels(threads, per_thread)
    span, blocks = threads * per_thread, 2
    rng = np.random.default_rng(1)
    for n_vec in (blocks * span, span // 2):          # exactly covered; wrapped (the L2 case)
        buf = rng.integers(0, 2**32, n_vec * 4, dtype=np.uint64).astype(np.uint32)
        sink = np.zeros(blocks * threads, np.uint32)
        read[blocks, threads](buf, n_vec - 1, sink, 1)
        vecs = buf.reshape(-1, 4)
        for b in range(blocks):
            for t in range(threads):
                idx = [((b * per_thread + k) * threads + t) & (n_vec - 1) for k in range(per_thread)]
                assert sink[b * threads + t] == _xor(vecs[idx]), (n_vec, b, t)
    n_vec = blocks * span
    out = np.zeros(n_vec * 4, np.uint32)
    write[blocks, threads](out, n_vec - 1)
    assert (out.reshape(-1, 4) == np.arange(n_vec)[:, None] + np.arange(4)).all()
    src = rng.integers(0, 2**32, n_vec * 4, dtype=np.uint64).astype(np.uint32)
    dst = np.zeros_like(src)
    copy[blocks, threads](src, dst, n_vec - 1)
    assert (dst == src).all()


def check_chase():
    nxt, start = R.chase_buffer(1024, 64, seed=3)
    step = 64 // 4
    seen, j = [], start
    for _ in range(1024 // 64):
        seen.append(j)
        j = int(nxt[j])
    assert j == start and sorted(seen) == list(range(0, 1024 // 4, step))   # one cycle, all nodes
    out = np.zeros(1, np.uint32)
    R.chase_kernel()[1, 1](nxt, start, 21, out)
    assert out[0] == seen[21 % len(seen)]


def check_smem(threads=64, iters=3):
    for conflicted in (False, True):
        out = np.zeros(2 * threads, np.float32)
        R.smem_kernel(threads, conflicted)[2, threads](out, iters)
        expected = R.smem_expected(threads, conflicted, iters)
        assert (out == np.tile(expected, 2)).all(), conflicted


def check_mma(iters=3):
    for dtype, k in R.MMA_K.items():
        operands = np.full(6, R.MMA_ONES[dtype], np.uint32)
        out = np.zeros(64, np.float32)
        R.mma_kernel(dtype)[2, 32](operands, out, iters)
        assert (out == 4 * R.MMA_CHAINS * iters * k).all(), dtype     # 16 registers a thread


def check_ffma(iters=2):
    out = np.zeros(64, np.float32)
    one = np.float32(1)
    R.ffma_kernel()[2, 32](np.float32(0.5), one, one, iters, out)
    steps = iters * R.UNROLL
    assert (out == sum(0.5 + c + steps for c in range(R.CHAINS))).all()


def check_ex2(iters=3):
    out = np.zeros(32, np.float32)
    R.ex2_kernel()[1, 32](np.float32(0), iters, out)
    np.testing.assert_allclose(out, R.CHAINS * R.EX2_FIXED_POINT, rtol=2e-6)


def check_cp_async(threads=32, per_thread=2, blocks=2, tiles=4):
    words = tiles * blocks * threads * per_thread * 4
    src = np.random.default_rng(2).integers(0, 2**32, words + 64, dtype=np.uint64).astype(np.uint32)
    for depth in (1, 2, 3):
        out = np.zeros(blocks * threads, np.uint32)
        R.cp_async_kernel(depth, threads, per_thread)[blocks, threads](src, tiles, out)
        assert _xor(out) == _xor(src[:words]), depth        # every copied word consumed once


CHECKS = (check_dram_kernels, check_chase, check_smem, check_mma, check_ffma, check_ex2,
          check_cp_async)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__[6:])
def test_kernel_computes_its_closed_form(check):
    check()


def test_cp_async_depth_is_checked():
    with pytest.raises(ValueError, match="depth"):
        R.cp_async_kernel(4, 32, 1)


def test_full_sizes_fit_the_gpu():
    """On an H100's figures: DRAM buffers >= 4x L2, many waves of blocks; the L2 buffer about
    L2 / 4; every size a whole number of blocks."""
    sz = R.sizes_for("full", 132, 50 * 2**20)
    assert sz.dram_bytes >= 4 * 50 * 2**20 and sz.dram_bytes % (sz.threads * sz.per_thread * 16) == 0
    assert sz.dram_bytes // 16 // (sz.threads * sz.per_thread) >= 100 * 132
    assert 50 * 2**20 / 8 < sz.l2_buffer_bytes <= 50 * 2**20 / 4
    assert sz.chase_bytes <= sz.l2_buffer_bytes and sz.repeats >= 5
    # wgmma: 4 warpgroups per SM, many waves, each warpgroup about 10 ms of fp16 work or less
    assert sz.wgmma_per_sm * R.WGMMA_WARPGROUPS >= 4 and sz.wgmma_waves >= 4
    fp16 = 132 * sz.wgmma_per_sm * sz.wgmma_waves * R.WGMMA_WARPGROUPS * sz.wgmma_iters \
        * R.WGMMA_UNROLL * 2 * 64 * 64 * 16
    assert 1e-3 < fp16 / 989e12 < 20e-3
    with pytest.raises(ValueError, match="preset"):
        R.sizes_for("huge", 132, 2**20)


# -- the wgmma group ------------------------------------------------------------------------------

WGMMA_NAMES = {f"wgmma_{d}_flops_per_s" for d in R.WGMMA_K}


def test_wgmma_is_a_group_of_its_own():
    assert "wgmma" in R.GROUPS and R.GROUPS.index("mma") < R.GROUPS.index("wgmma")
    assert R.parse_groups("ffma, wgmma,mma") == ("mma", "wgmma", "ffma")
    assert WGMMA_NAMES <= set(RATE_UNITS) and {RATE_UNITS[n] for n in WGMMA_NAMES} == {"flop/s"}
    assert "``wgmma``" in R.__doc__ and all(n in R.__doc__ for n in WGMMA_NAMES)


@pytest.mark.parametrize("cc, word", [((8, 0), "8.0"), ((8, 9), "8.9"), ((10, 0), "10.0")])
def test_wgmma_is_skipped_off_sm90(cc, word):
    """wgmma is an sm_90a instruction: below 9.0 and on later architectures (which dropped it)
    the rates are skipped, naming the GPU's compute capability."""
    dev = type("Dev", (), {"simulator": False, "cc": cc})()
    rates, skipped = R.measure_wgmma(dev, R.sizes_for("tiny", 1, 4096))
    assert rates == {} and set(skipped) == WGMMA_NAMES
    assert all("9.0" in why and word in why for why in skipped.values())


@pytest.mark.skipif(REAL_GPU, reason="the simulator's run")
def test_wgmma_is_skipped_under_the_simulator(tmp_path, capsys):
    path = tmp_path / "rates.json"
    assert R.main(["--only", "wgmma", "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["rates"] == {} and set(doc["skipped"]) == WGMMA_NAMES
    assert all("simulator" in why and "9.0" in why for why in doc["skipped"].values())
    assert "[1/1] wgmma: wgmma_fp16_flops_per_s skipped" in capsys.readouterr().out


WAIT_NAMES = set(R.WGMMA_WAIT_NAMES)


def test_wgmma_wait_is_a_group_skipped_off_sm90_and_under_the_simulator():
    assert R.GROUPS.index("wgmma") < R.GROUPS.index("wgmma-wait")
    assert WAIT_NAMES <= set(RATE_UNITS) and {RATE_UNITS[n] for n in WAIT_NAMES} == {"s"}
    assert "``wgmma-wait``" in R.__doc__ and all(n in R.__doc__ for n in WAIT_NAMES)
    for cc in ((8, 0), (10, 0)):
        dev = type("Dev", (), {"simulator": False, "cc": cc})()
        rates, skipped = R.measure_wgmma_wait(dev, R.sizes_for("tiny", 1, 4096))
        assert rates == {} and set(skipped) == WAIT_NAMES
        assert all("9.0" in why for why in skipped.values())
    dev = type("Dev", (), {"simulator": True})()
    rates, skipped = R.measure_wgmma_wait(dev, R.sizes_for("tiny", 1, 4096))
    assert rates == {} and all("simulator" in why for why in skipped.values())


def test_wgmma_wait_line_through_the_two_chains(monkeypatch):
    """The rates are the line through (chain, time per group): a fake device whose group
    takes latency + chain x product seconds gives back both, with ranges around them (the
    kernels stand-ins: the simulator builds no sm_90a kernel)."""
    from types import SimpleNamespace
    latency, product = 400e-9, 20e-9
    sz = R.sizes_for("tiny", 4, 4096)
    fakes = {c: SimpleNamespace(chain=c, threads=128) for c in R.WGMMA_WAIT_CHAINS}
    monkeypatch.setattr(R, "wgmma_wait_kernel", lambda chain: fakes[chain])

    class Dev:
        simulator, cc, num_sms = False, (9, 0), 4

        def array(self, n, kind):
            return None

        def launch(self, kern, blocks, threads, args):
            self.last = (kern, blocks, threads, args)

        def seconds(self, fn):
            fn()
            kern, blocks, threads, (iters, flag, out) = self.last
            assert blocks == 4 and threads == 128 and flag == 0
            t = iters * (latency + kern.chain * product)
            return t, 0.99 * t, 1.01 * t

    rates, skipped = R.measure_wgmma_wait(Dev(), sz)
    assert skipped == {}
    assert rates["wgmma_wait_latency_s"]["value"] == pytest.approx(latency)
    assert rates["wgmma_dependent_product_s"]["value"] == pytest.approx(product)
    for r in rates.values():
        lo, hi = r["range"]
        assert lo < r["value"] < hi and r["unit"] == "s"


def compile_wgmma_rates(outdir) -> dict:
    """The ``wgmma`` group's kernels compiled for ``sm_90a`` into ``outdir/wgmma_<dtype>.ptx``
    (run in a process without the CUDA simulator), with the argument types `kernels.host.launch`
    gives them (two int64 and a float32 vector); returns dtype -> launch bounds."""
    from numba import cuda, types

    from benchmarks.common import allow_offline_compile
    allow_offline_compile()
    sig = (types.int64, types.int64, types.Array(types.float32, 1, "C"))
    bounds = {}
    for dtype in R.WGMMA_K:
        kern = R.wgmma_kernel(dtype)
        text, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0, "a"),
                                   launch_bounds=kern.launch_bounds)
        Path(outdir, f"wgmma_{dtype}.ptx").write_text(text)
        bounds[dtype] = list(kern.launch_bounds)
    for chain in R.WGMMA_WAIT_CHAINS:
        kern = R.wgmma_wait_kernel(chain)
        text, _ = cuda.compile_ptx(kern.py_func, sig, cc=(9, 0, "a"),
                                   launch_bounds=kern.launch_bounds)
        Path(outdir, f"wait_{chain}.ptx").write_text(text)
        bounds[f"wait_{chain}"] = list(kern.launch_bounds)
    return bounds


@pytest.fixture(scope="module")
def wgmma_ptx(tmp_path_factory):
    out = tmp_path_factory.mktemp("rates_wgmma")
    ptxas, bounds = compile_sm90a_in_child("tests.test_rates", "compile_wgmma_rates", out,
                                           timeout=600)
    return out, ptxas, bounds


@pytest.mark.parametrize("chain", R.WGMMA_WAIT_CHAINS)
def test_wgmma_wait_kernels_compile_for_sm90a(wgmma_ptx, chain):
    """Each group of `chain` products is committed and waited for (wait_group 0) before the
    next: the loop's groups (LLVM may unroll the runtime loop) each hold `chain` products."""
    outdir, ptxas, bounds = wgmma_ptx
    path = outdir / f"wait_{chain}.ptx"
    text = path.read_text()
    assert bounds[f"wait_{chain}"] == [128, 1]
    products = text.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 ")
    groups = text.count("wgmma.commit_group.sync.aligned")
    assert products == text.count("wgmma.mma_async") == chain * groups and groups >= 1
    assert text.count("wgmma.wait_group.sync.aligned 0;") == groups
    assert "wgmma.wait_group.sync.aligned 1;" not in text
    entry, _ = assemble_sm90a(ptxas, path)
    assert entry["spill_store_bytes"] == 0 and entry["stack_frame_bytes"] == 0, entry


@pytest.mark.parametrize("dtype", list(R.WGMMA_K))
def test_wgmma_kernels_compile_for_sm90a(wgmma_ptx, dtype):
    outdir, ptxas, bounds = wgmma_ptx
    path = outdir / f"wgmma_{dtype}.ptx"
    text = path.read_text()
    threads, per_sm = bounds[dtype]
    assert ".target sm_90a" in text
    assert f".maxntid {threads}, 1, 1" in text and f".minnctapersm {per_sm}" in text
    k = R.WGMMA_K[dtype]
    ty = {"fp16": "f16", "fp8": "e4m3"}.get(dtype, dtype)
    products = text.count("wgmma.mma_async")
    groups = text.count("wgmma.commit_group.sync.aligned")
    assert text.count(f"wgmma.mma_async.sync.aligned.m64n64k{k}.f32.{ty}.{ty} ") == products
    # every commit group holds WGMMA_UNROLL products and is followed by wait_group 1: the loop
    # body as written (1 group), or LLVM's unrolling of the runtime loop by two plus the
    # remainder trip (3 groups; numba-cuda 0.30)
    assert products == R.WGMMA_UNROLL * groups and groups in (1, 3), (products, groups)
    assert text.count("wgmma.wait_group.sync.aligned 1;") == groups
    assert text.count("wgmma.wait_group.sync.aligned 0;") == 1
    assert "ld.local" not in text and "st.local" not in text      # accumulators in registers
    # no serialised wgmma (C7520: a product on a divergent path: `assemble_sm90a`), and no
    # warpgroup.arrive / warpgroup.wait injected between products (C7519 / C7517: other
    # instructions touching the accumulators while products are in flight)
    entry, stderr = assemble_sm90a(ptxas, path)
    assert "injected" not in stderr, stderr[-2000:]
    assert entry["spill_store_bytes"] == 0 and entry["stack_frame_bytes"] == 0, entry
    assert entry["registers_per_thread"] <= 65536 // (threads * per_sm), entry
    assert entry["static_smem_bytes"] == 2 * 64 * 64 * 2, entry      # A and B, 8 KiB each


@pytest.mark.gpu
def test_on_a_hopper_gpu_the_wgmma_rates():
    """The group on a compute-capability-9.0 GPU at the quick sizes, 3 repeats: each rate
    positive, its range around it, below 1.2x the H100's dense datasheet peak (989 TFLOP/s
    fp16 and bf16, 1979 fp8)."""
    torch = pytest.importorskip("torch")
    dev = R.Device(torch, repeats=3)
    if dev.cc != (9, 0):
        pytest.skip(f"wgmma needs compute capability 9.0; this GPU is {dev.cc}")
    sz = R.sizes_for("quick", dev.num_sms, dev.l2_bytes, repeats=3)
    rates, skipped = R.measure(dev, sz, ("wgmma",))
    assert not skipped and set(rates) == WGMMA_NAMES
    peak = load_profile("h100").tensor_flops_per_s
    for dtype in R.WGMMA_K:
        entry = rates[f"wgmma_{dtype}_flops_per_s"]
        assert entry["unit"] == "flop/s" and "wgmma.mma_async" in entry["how"]
        assert 0 < entry["range"][0] <= entry["value"] <= entry["range"][1], entry
        assert entry["value"] < 1.2 * peak[dtype], (dtype, entry["value"], peak[dtype])


# -- the command ---------------------------------------------------------------------------------

def _check_doc(doc, path):
    assert doc["schema"] == RATES_SCHEMA == R.SCHEMA
    prov = doc["provenance"]
    for key in ("gpu", "driver", "cuda", "torch", "numba", "numba_cuda", "date", "command",
                "code_version", "kernels_sha", "num_sms", "l2_bytes", "simulator"):
        assert key in prov, key
    assert prov["command"].startswith("python -m benchmarks rates") and str(path) in prov["command"]
    for name, entry in doc["rates"].items():
        assert entry["unit"] == RATE_UNITS[name], name
        assert isinstance(entry["value"], float) and math.isfinite(entry["value"]) \
            and entry["value"] > 0, name
        assert isinstance(entry["how"], str) and entry["how"] and "\n" not in entry["how"]
    assert all(isinstance(why, str) and why for why in doc["skipped"].values())


@pytest.mark.skipif(REAL_GPU, reason="the tiny run is the simulator's")
def test_command_writes_a_rates_file_with_provenance(tmp_path, capsys):
    path = tmp_path / "rates.json"
    assert R.main(["--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    _check_doc(doc, path)
    assert doc["provenance"]["simulator"] is True and doc["sizes"]["preset"] == "tiny"
    assert set(doc["rates"]) | set(doc["skipped"]) == set(RATE_UNITS)   # each one, or why not
    assert "sm_clock_hz" in doc["skipped"]
    out = capsys.readouterr().out
    n = len(R.GROUPS)
    assert f"[{n}/{n}] decode" in out and f"wrote {path}" in out
    assert all("needs a GPU" in doc["skipped"][name] for name in DECODE_RATE_UNITS)
    prof = load_profile("h100", rates=path, check_gpu=False)       # the file loads
    assert prof.rate("ffma_flops_per_s") == doc["rates"]["ffma_flops_per_s"]["value"]
    path2 = tmp_path / "some.json"
    assert R.main(["--only", "launch,ffma", "--out", str(path2)]) == 0
    assert set(json.loads(path2.read_text())["rates"]) == {
        "ffma_flops_per_s", "kernel_launch_s", "kernel_launch_numba_s"}


def test_bad_groups_are_refused_before_work(capsys):
    assert R.main(["--only", "dram,hbm"]) == 2
    err = capsys.readouterr().err
    assert "--only" in err and "hbm" in err and "cp-async" in err and len(err.splitlines()) == 1
    assert R.main(["--repeats", "0"]) == 2


@pytest.mark.skipif(REAL_GPU, reason="needs a machine without a GPU")
def test_no_gpu_is_a_one_line_error():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    r = subprocess.run([sys.executable, "-m", "benchmarks", "rates", "--out", os.devnull],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "needs a CUDA GPU" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _shipped_like(gpu):
    """A small rates file as the command writes one (a few rates, one skipped, sizes)."""
    doc = _doc(gpu=gpu, dram_read_bytes_per_s=3.0e12, ffma_flops_per_s=1.0,
               smem_read_bytes_per_s_per_sm=3.6e11, sm_clock_hz=1.8e9)
    doc["rates"]["smem_read_bytes_per_clk_per_sm"] = {"value": 200.0, "unit": "bytes/clk",
                                                      "how": "test", "range": None}
    doc["skipped"] = {"wgmma_fp8_flops_per_s": "not measured then", "ex2_ops_per_s": "test"}
    doc["sizes"] = {"preset": "full"}
    return doc


@pytest.mark.skipif(REAL_GPU, reason="the simulator's run")
def test_add_to_replaces_the_groups_measured_and_keeps_the_rest(tmp_path, capsys):
    path = tmp_path / "rates_sim.json"
    before = _shipped_like(R.Device(None).name)
    path.write_text(json.dumps(before))
    assert R.main(["--only", "wgmma,ffma", "--add-to", str(path)]) == 0
    assert f"wrote {path} (wgmma, ffma added to {path})" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    assert doc["schema"] == RATES_SCHEMA and doc["sizes"] == before["sizes"]
    # the groups measured: ffma replaced, the wgmma rates skipped with this run's reason
    ffma = doc["rates"]["ffma_flops_per_s"]
    assert ffma["value"] != 1.0 and "FFMA" in ffma["how"] and ffma["unit"] == "flop/s"
    assert set(doc["skipped"]) == WGMMA_NAMES | {"ex2_ops_per_s"}
    assert all("simulator" in doc["skipped"][n] for n in WGMMA_NAMES)
    # the rest as it was, the derived rate included (neither of its inputs measured again)
    for name in ("dram_read_bytes_per_s", "smem_read_bytes_per_s_per_sm", "sm_clock_hz",
                 "smem_read_bytes_per_clk_per_sm"):
        assert doc["rates"][name] == before["rates"][name], name
    assert doc["skipped"]["ex2_ops_per_s"] == "test"
    prov = doc["provenance"]
    assert {k: prov[k] for k in before["provenance"]} == before["provenance"]
    (entry,) = prov["groups_added"]
    assert set(entry) == {"groups", "date", "command", "code_version", "kernels_sha", "gpu",
                          "sizes"}
    assert entry["groups"] == ["wgmma", "ffma"] and entry["gpu"] == before["provenance"]["gpu"]
    assert entry["command"] == f"python -m benchmarks rates --only wgmma,ffma --add-to {path}"
    assert entry["sizes"]["preset"] == "tiny" and "commit" in entry["code_version"]
    prof = load_profile("h100", rates=path, check_gpu=False)         # still a rates file
    assert prof.rate("ffma_flops_per_s") == ffma["value"]
    assert prof.rate("dram_read_bytes_per_s") == 3.0e12
    # a second run appends its entry; --out writes elsewhere and leaves FILE alone
    assert R.main(["--only", "launch", "--add-to", str(path)]) == 0
    doc2 = json.loads(path.read_text())
    assert [e["groups"] for e in doc2["provenance"]["groups_added"]] == [["wgmma", "ffma"],
                                                                        ["launch"]]
    assert doc2["rates"]["ffma_flops_per_s"] == ffma and "kernel_launch_s" in doc2["rates"]
    other = tmp_path / "other.json"
    assert R.main(["--only", "ex2", "--add-to", str(path), "--out", str(other)]) == 0
    assert json.loads(path.read_text()) == doc2
    doc3 = json.loads(other.read_text())
    assert "ex2_ops_per_s" in doc3["rates"] and "ex2_ops_per_s" not in doc3["skipped"]


def test_add_groups_computes_the_derived_rate_again():
    """A new shared-memory rate with the file's clock: bytes per clock from both, said to come
    from different runs; a skipped rate that is now measured leaves ``skipped``."""
    doc = _shipped_like("GPU")
    smem = {"value": 4.5e11, "unit": "bytes/s", "how": "new", "range": [4e11, 5e11]}
    out = R.add_groups(doc, {"smem_read_bytes_per_s_per_sm": smem},
                       {"smem_read_bytes_per_clk_per_sm": "needs sm_clock_hz (group clock)"},
                       {"groups": ["smem"]})
    clk = out["rates"]["smem_read_bytes_per_clk_per_sm"]
    assert clk["value"] == pytest.approx(4.5e11 / 1.8e9) and "different runs" in clk["how"]
    assert "smem_read_bytes_per_clk_per_sm" not in out["skipped"]
    assert out["provenance"]["groups_added"] == [{"groups": ["smem"]}]
    assert doc["rates"]["smem_read_bytes_per_clk_per_sm"]["value"] == 200.0    # doc unchanged
    assert "groups_added" not in doc["provenance"]
    wg = {"value": 6e14, "unit": "flop/s", "how": "new", "range": [5e14, 7e14]}
    out = R.add_groups(doc, {"wgmma_fp8_flops_per_s": wg}, {}, {"groups": ["wgmma"]})
    assert out["rates"]["wgmma_fp8_flops_per_s"] == wg
    assert "wgmma_fp8_flops_per_s" not in out["skipped"]
    assert out["rates"]["smem_read_bytes_per_clk_per_sm"]["value"] == 200.0
    # a rate of a name no longer known (renamed since) is dropped by the next addition
    old = dict(doc, rates=dict(doc["rates"], decode_fixed_s={"value": 1e-6, "unit": "s"}),
               skipped={"decode_fill_s": "renamed"})
    out = R.add_groups(old, {"wgmma_fp8_flops_per_s": wg}, {}, {"groups": ["wgmma"]})
    assert "decode_fixed_s" not in out["rates"] and "decode_fill_s" not in out["skipped"]
    assert set(out["rates"]) - {"wgmma_fp8_flops_per_s"} == set(doc["rates"])


def test_add_to_refuses_another_gpu_and_other_files(tmp_path, capsys):
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(_shipped_like("NVIDIA Imaginary GPU")))
    before = path.read_text()
    assert R.main(["--only", "ffma", "--add-to", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--add-to" in err and "'NVIDIA Imaginary GPU'" in err and len(err.splitlines()) == 1
    assert path.read_text() == before
    bad = tmp_path / "bad.json"
    for text, words in ((json.dumps(dict(_doc(), schema="ioaware.results/1")), "not a rates file"),
                        (json.dumps({"schema": RATES_SCHEMA, "rates": {}}), "not a rates file"),
                        ("{not json", "not JSON")):
        bad.write_text(text)
        assert R.main(["--only", "ffma", "--add-to", str(bad)]) == 2
        err = capsys.readouterr().err
        assert "--add-to" in err and words in err and len(err.splitlines()) == 1, err
    assert R.main(["--only", "ffma", "--add-to", str(tmp_path / "missing.json")]) == 2
    assert "--add-to: no such file" in capsys.readouterr().err


# -- measured rates in a profile -----------------------------------------------------------------

def _doc(gpu="NVIDIA H100 80GB HBM3", **rates):
    rates = rates or {"dram_read_bytes_per_s": 3.0e12, "l2_hit_latency_s": 1.4e-7,
                      "mma_fp16_flops_per_s": 6.5e14}
    return {"schema": RATES_SCHEMA,
            "provenance": {"gpu": gpu, "date": "2026-11-24T00:00:00+00:00",
                           "command": "python -m benchmarks rates",
                           "code_version": {"commit": "abc1234", "dirty": False}},
            "rates": {k: {"value": v, "unit": RATE_UNITS[k], "how": "test"}
                      for k, v in rates.items()}}


def test_profile_takes_measured_rates_only_when_asked(tmp_path):
    path = tmp_path / "rates.json"
    path.write_text(json.dumps(_doc()))
    h100 = sim.PROFILES["h100"]
    assert load_profile("h100") is h100 and h100.measured_rates is None
    assert h100.rate("dram_read_bytes_per_s") is None and h100.rate("dram_read_bytes_per_s", 7) == 7
    prof = load_profile("h100", rates=str(path))
    assert prof.measured_rates == {"dram_read_bytes_per_s": 3.0e12, "l2_hit_latency_s": 1.4e-7,
                                   "mma_fp16_flops_per_s": 6.5e14}
    assert prof.rate("mma_fp16_flops_per_s") == 6.5e14 and prof.rate("ffma_flops_per_s", 1.0) == 1.0
    assert "rates.json" in prof.sources["measured_rates"]
    assert h100.measured_rates is None and "measured_rates" not in h100.sources   # a copy
    same = {f: getattr(prof, f) for f in h100.__dataclass_fields__
            if f not in ("measured_rates", "sources")}
    assert same == {f: getattr(h100, f) for f in same}
    assert h100.with_rates(_doc()).measured_rates == prof.measured_rates       # a parsed object
    w = sim.Workload(batch=2, heads=8, seq_len_q=2048, head_dim=64, dtype="fp16")
    assert sim.predict(w, "flash2", prof).predicted_ms == sim.predict(w, "flash2", "h100").predicted_ms
    with pytest.raises(ValueError, match="unknown rate"):
        prof.rate("dram_bandwidth")


def test_bad_rates_are_refused_naming_the_argument(tmp_path):
    with pytest.raises(FileNotFoundError, match="rates: no such file"):
        load_profile("h100", rates=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(_doc(), schema="ioaware.results/1")))
    with pytest.raises(ValueError, match=r"rates: .*schema 'ioaware.rates/1' expected"):
        load_profile("h100", rates=bad)
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="rates: .* not JSON"):
        load_profile("h100", rates=bad)
    doc = _doc()
    doc["rates"]["l2_hit_latency_s"]["unit"] = "ms"
    with pytest.raises(ValueError, match="rates: .*'l2_hit_latency_s' must be in 's'"):
        load_profile("h100", rates=doc)
    for value in (0.0, -1.0, float("nan"), "fast", None):
        doc = _doc()
        doc["rates"]["dram_read_bytes_per_s"]["value"] = value
        with pytest.raises(ValueError, match="rates: .*positive finite"):
            load_profile("h100", rates=doc)
    with pytest.raises(ValueError, match="rates: .*no 'rates'"):
        load_profile("h100", rates={"schema": RATES_SCHEMA})
    with pytest.raises(TypeError, match="rates must be"):
        load_profile("h100", rates=3)
    h200 = _doc(gpu="NVIDIA H200")
    with pytest.raises(ValueError, match="rates: .*'NVIDIA H200'.*check_gpu=False"):
        load_profile("h100", rates=h200)
    assert load_profile("h100", rates=h200, check_gpu=False).rate("l2_hit_latency_s") == 1.4e-7
    assert load_profile("h200", rates=h200).rate("l2_hit_latency_s") == 1.4e-7
    with pytest.raises(ValueError, match="measured_rates"):
        sim.GPUProfile(name="x", hbm_bandwidth_bytes_per_s=1e12, l2_bytes=2**22, num_sms=10,
                       smem_bytes_per_sm=65536, smem_bytes_per_block=49152, fp32_flops_per_s=1e13,
                       measured_rates={"ffma_flops_per_s": -1.0})


# -- on a GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_on_a_gpu_the_ptx_kernels_and_a_quick_run(tmp_path):
    """The kernels with their PTX (ld/st.global v4, ld.shared, mma.sync, FFMA, ex2.approx,
    cp.async) against the same closed forms, then ``rates --quick``: every rate measured (an
    sm_80+ GPU; wgmma on 9.0 only), positive, within sight of the GPU's profile where there
    is one."""
    for check in CHECKS:
        check()
    path = tmp_path / "rates.json"
    assert R.main(["--quick", "--out", str(path)]) == 0
    doc = json.loads(path.read_text())
    _check_doc(doc, path)
    if doc["provenance"]["compute_capability"] == "9.0":
        assert set(doc["rates"]) == set(RATE_UNITS) and not doc["skipped"]
    else:                                               # wgmma: sm_90a only
        assert set(doc["rates"]) == set(RATE_UNITS) - WGMMA_NAMES - WAIT_NAMES
        assert set(doc["skipped"]) == WGMMA_NAMES | WAIT_NAMES
    rates = {name: entry["value"] for name, entry in doc["rates"].items()}
    if "wgmma_wait_latency_s" in rates:
        # a waited-for group costs something, and a product of a dependent chain on one
        # warpgroup cannot beat the SM's share of the measured throughput of independent ones
        sms = doc["provenance"].get("num_sms") or 132
        product_floor = 2 * 64 * 64 * 16 / (rates["wgmma_fp16_flops_per_s"] / sms)
        assert 0 < rates["wgmma_wait_latency_s"] < 1e-5
        assert 0.9 * product_floor < rates["wgmma_dependent_product_s"] < 1e-5
    # what no GPU can exceed: 32 banks x 4 bytes per SM per clock; a 32-way conflict serialises
    # a warp's load into 32 wavefronts (at least 8x slower, whatever the bank count)
    assert rates["smem_read_bytes_per_clk_per_sm"] <= 128 * 1.05
    assert rates["smem_read_conflict32_bytes_per_s_per_sm"] < rates["smem_read_bytes_per_s_per_sm"] / 8
    assert rates["cp_async_depth1_bytes_per_s"] <= rates["cp_async_depth3_bytes_per_s"] * 1.05
    prof = profile_for_gpu_name(doc["provenance"]["gpu"])
    if prof is not None:
        r = load_profile(prof, rates=path)
        copy = r.rate("dram_copy_bytes_per_s")
        for _ in range(2):      # other GPU tests (pytest-xdist workers) may share DRAM: again
            if copy > 0.3 * prof.hbm_bandwidth_bytes_per_s:
                break
            again = tmp_path / "dram.json"
            assert R.main(["--quick", "--only", "dram", "--out", str(again)]) == 0
            copy = max(copy, load_profile(prof, rates=again).rate("dram_copy_bytes_per_s"))
        assert 0.3 < copy / prof.hbm_bandwidth_bytes_per_s < 1.2
        assert 0.3 < r.rate("ffma_flops_per_s") / prof.fp32_flops_per_s < 1.2
        assert 0.1 < r.rate("mma_fp16_flops_per_s") / prof.tensor_flops_per_s["fp16"] < 1.2
        # the decoding kernel's stream: below the datasheet bandwidth, above a lone program's
        for d in (64, 128):
            lone = r.rate(f"decode_d{d}_stream_p1_bytes_per_s")
            most = r.rate(f"decode_d{d}_stream_p128_bytes_per_s")
            assert 5e9 < lone < most < 1.2 * prof.hbm_bandwidth_bytes_per_s
            assert 0 < r.rate(f"decode_d{d}_fixed_s") < 50e-6
            assert 0 < r.rate(f"decode_d{d}_handoff_s") < 50e-6
        assert r.rate("dram_read_bytes_per_s") <= prof.hbm_bandwidth_bytes_per_s * 1.02
