"""The lab without a GPU: the command line (``python -m benchmarks``), the shared CUDA-event
timing driven by a stand-in for torch.cuda, and ``bench``'s tables: the per-configuration table
and the summary the README embeds."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import bench, common
from benchmarks.__main__ import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
#: The shipped benchmark results file (one per GPU: the newest by name).
#: The README's summary reads these, in this order (a later file's rows replace an earlier's).
README_BENCHES = (ROOT / "results" / "bench_nvidia-h100-80gb-hbm3_2026-11-24.json",
                  ROOT / "results" / "bench_half_h200_2026-11-29.json",
                  ROOT / "results" / "bench_fp32_h100_2026-11-28.json")
SHIPPED_BENCH = README_BENCHES[0]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


# -- the command line --------------------------------------------------------------------------

@pytest.mark.parametrize("args", [(), ("--help",)])
def test_listing_names_every_command_with_one_line(args):
    r = _run(*args)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("commands:\n", 1)[1].splitlines()
    assert [ln.split()[0] for ln in lines] == list(COMMANDS)
    assert all(len(ln.split()) > 3 for ln in lines)          # a description on the same line
    doc = sys.modules["benchmarks"].__doc__
    assert all(f"``{name}``" in doc for name in COMMANDS)


def test_unknown_command_fails_with_a_message():
    r = _run("benchmark")
    assert r.returncode != 0
    assert "unknown command 'benchmark'" in r.stderr and "bench" in r.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_help(command):
    r = _run(command, "--help")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(f"usage: python -m benchmarks {command}")


# -- timing --------------------------------------------------------------------------------------

class _FakeCuda:
    """Records the order of stream operations; events are 1 ms apart."""

    def __init__(self):
        self.log = []
        self.clock = 0.0
        cuda = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                cuda.clock += 1.0
                self.t = cuda.clock
                cuda.log.append("record")

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                return other.t - self.t

        self.Event = Event

    def _sleep(self, cycles):
        self.log.append(("sleep", cycles))

    def synchronize(self):
        self.log.append("sync")


class _FakeTorch:
    def __init__(self):
        self.cuda = _FakeCuda()


@pytest.mark.parametrize("timing,sleeps", [("sync", False), ("device", True)])
def test_time_cuda_sleeps_before_each_timed_call_only_in_device_timing(timing, sleeps):
    torch = _FakeTorch()
    calls = []
    med, p10, p90 = common.time_cuda(torch, lambda: calls.append(1), warmup=1, min_reps=3,
                                     max_reps=3, budget_s=0.0, timing=timing)
    assert med == p10 == p90 == 1.0
    assert len(calls) == 1 + 1 + 3             # the probe call, the warm-up, three timed calls
    n_sleep = sum(1 for e in torch.cuda.log if isinstance(e, tuple))
    assert n_sleep == (1 + 3 if sleeps else 0)
    if sleeps:   # every first event of a timed call follows a sleep
        for i, e in enumerate(torch.cuda.log):
            if isinstance(e, tuple):
                assert torch.cuda.log[i + 1] == "record"
                assert e[1] == common.SLEEP_CYCLES


def test_time_interleaved_times_every_callable_once_a_round():
    """Rounds of one timed call of each callable in turn (a drift of the GPU's state reaches
    them alike), after the warm-up calls of each; each callable's median is its own."""
    torch = _FakeTorch()
    order = []
    fns = {"a": lambda: order.append("a"), "b": lambda: order.append("b")}
    out = common.time_interleaved(torch, fns, warmup=2, min_reps=4, max_reps=4, budget_s=0.0)
    assert set(out) == {"a", "b"} and out["a"] == out["b"] == (1.0, 1.0, 1.0)
    assert order == ["a", "a", "b", "b"] + ["a", "b"] * 4
    assert common.time_interleaved(torch, {}) == {}
    with pytest.raises(ValueError, match="timing"):
        common.time_interleaved(torch, fns, timing="wall")


def test_time_interleaved_stops_at_the_budget_of_the_slowest():
    """More rounds while the slowest callable's timed work is under the budget, at most
    ``max_reps``; in device timing each timed call follows a sleep."""
    torch = _FakeTorch()
    out = common.time_interleaved(torch, {"a": lambda: None}, warmup=0, min_reps=1,
                                  max_reps=50, budget_s=0.0105, timing="device")
    assert out["a"][0] == 1.0
    assert torch.cuda.log.count(("sleep", common.SLEEP_CYCLES)) == 11   # 11 ms >= 10.5 ms


def test_decode_graph_times_time_the_captured_replays_in_rounds():
    """`benchmarks decode --graph`: every contender captured once, the replays timed in rounds
    (ours and SDPA's alternate), each behind a device-side sleep (the GPU's time of the replay,
    not the graph's launch from the host); one that cannot be captured is recorded with its
    error."""
    import contextlib

    from benchmarks import decode

    torch = _FakeTorch()
    replays = []

    class Graph:
        def __init__(self):
            self.name = None

        def replay(self):
            replays.append(self.name)

    capturing = []

    @contextlib.contextmanager
    def graph(g):
        capturing.append(g)
        yield
        capturing.pop()

    torch.inference_mode = contextlib.nullcontext
    torch.cuda.CUDAGraph = Graph
    torch.cuda.graph = graph
    torch.cuda.empty_cache = lambda: None

    def contender(name):
        def call():
            if capturing:
                capturing[-1].name = name
        return call

    def refuses():
        raise RuntimeError("No available kernel. Aborting execution.")

    out = decode._graph_times(torch, {"ioaware": contender("ioaware"), "sdpa-flash": refuses,
                                      "sdpa-cudnn": contender("sdpa-cudnn")})
    assert list(out) == ["ioaware", "sdpa-flash", "sdpa-cudnn"]
    assert out["ioaware"] == out["sdpa-cudnn"] == {"ms": 1.0}
    assert out["sdpa-flash"]["error"].startswith("RuntimeError: No available kernel")
    timed = replays[2 + 2 * 3:]                # after each graph's first replay and warm-ups
    assert timed[:4] == ["ioaware", "sdpa-cudnn"] * 2 and len(timed) % 2 == 0
    sleeps = [e for e in torch.cuda.log if isinstance(e, tuple)]
    assert len(sleeps) == len(timed) and all(e[1] == common.SLEEP_CYCLES for e in sleeps)


def test_time_cuda_refuses_unknown_timing():
    with pytest.raises(ValueError, match="timing"):
        common.time_cuda(_FakeTorch(), lambda: None, timing="wall")


def test_host_call_ms_measures_the_call_while_the_gpu_sleeps():
    torch = _FakeTorch()
    ms = common.host_call_ms(torch, lambda: sum(range(20000)), reps=5)
    assert ms > 0
    assert torch.cuda.log.count(("sleep", common.SLEEP_CYCLES)) == 5


def test_summarize_times_median_and_percentiles():
    med, p10, p90 = common.summarize_times([float(x) for x in range(1, 22)])  # 1..21
    assert med == 11.0 and p10 == pytest.approx(3.0) and p90 == pytest.approx(19.0)
    assert common.summarize_times([5.0, 1.0, 3.0])[0] == 3.0
    with pytest.raises(ValueError):
        common.summarize_times([])


# -- the per-configuration table --------------------------------------------------------------

def test_table_shows_timing_and_host_column_only_when_recorded():
    rec = {"pass": "fwd", "dtype": "fp16", "head_dim": 64, "causal": False, "seq_len_q": 1024,
           "time_ms": 2.0, "tflops": 1.0, "peak_extra_bytes": 2**20}
    old = bench.format_table([dict(rec, kernel="ioaware-numba"), dict(rec, kernel="sdpa-flash",
                                                                      time_ms=1.0)])
    assert "host ms" not in old and "timing" not in old and "0.50" in old
    new = bench.format_table([dict(rec, kernel="ioaware-numba", timing="device", host_ms=0.25),
                              dict(rec, kernel="sdpa-flash", time_ms=1.0, timing="device")])
    assert "host ms" in new and "0.250" in new and "timing: device" in new


# -- the summary ---------------------------------------------------------------------------------

def _doc(records):
    return {"provenance": {"gpu": "Test GPU", "date": "2030-01-02T03:04:05+00:00",
                           "timing": "sync"}, "records": records}


def _rec(kernel, dtype, d, causal, pass_, n, ms):
    return {"kernel": kernel, "dtype": dtype, "head_dim": d, "causal": causal, "pass": pass_,
            "seq_len_q": n, "time_ms": ms}


def test_summary_rows_and_ranges_of_a_synthetic_file():
    recs = [_rec("ioaware-numba", "fp16", 64, False, "fwd", 1024, 2.0),
            _rec("ioaware-numba", "fp16", 64, False, "fwd", 4096, 4.0),
            _rec("sdpa-flash", "fp16", 64, False, "fwd", 1024, 1.0),      # ratio 0.5
            _rec("sdpa-flash", "fp16", 64, False, "fwd", 4096, 6.0),      # ratio 1.5
            _rec("sdpa-cudnn", "fp16", 64, False, "fwd", 4096, 3.0),      # ratio 0.75, one N
            _rec("sdpa-math", "fp16", 64, False, "fwd", 1024, 100.0),     # not a peer
            _rec("sdpa-efficient", "fp16", 64, False, "fwd", 1024, 100.0),
            _rec("ioaware-numba", "fp32", 128, True, "fwd+bwd", 512, 10.0),
            _rec("sdpa-efficient", "fp32", 128, True, "fwd+bwd", 512, 25.0)]
    text = bench.summary_table(_doc(recs), "x.json")
    lines = text.splitlines()
    assert "Test GPU" in lines[0] and "2030-01-02" in lines[0] and "`x.json`" in lines[0]
    assert lines[2].startswith("| dtype | d | causal | N | forward | forward + backward |")
    rows = [ln for ln in lines[4:]]
    assert rows == ["| fp16 | 64 | no | 1024–4096 | FLASH 0.50–1.50, CUDNN 0.75 | – |",
                    "| fp32 | 128 | yes | 512 | – | EFFICIENT 2.50 |"]


def test_small_shapes_get_their_own_table_and_stay_out_of_the_ranges():
    small = lambda kern, n, bh, t, pass_="fwd": dict(  # noqa: E731
        _rec(kern, "fp16", 64, False, pass_, n, t), batch=bh // 16, heads=16, grid="small")
    recs = [_rec("ioaware-numba", "fp16", 64, False, "fwd", 1024, 2.0),
            _rec("sdpa-flash", "fp16", 64, False, "fwd", 1024, 1.0),
            small("ioaware-numba", 1024, 64, 0.5), small("sdpa-flash", 1024, 64, 0.4),
            small("sdpa-cudnn", 1024, 64, 0.25),
            small("ioaware-numba", 1024, 64, 2.0, "fwd+bwd"), small("sdpa-flash", 1024, 64, 1.5,
                                                                    "fwd+bwd"),
            small("ioaware-numba", 512, 128, 1.0), small("sdpa-flash", 512, 128, 3.0)]
    main = bench.summary_table(_doc(recs), "x.json")
    assert main.splitlines()[4:] == ["| fp16 | 64 | no | 1024 | FLASH 0.50 | – |"]
    rest = bench.small_table([_doc(recs)], ["x.json"])
    assert "`x.json`" in rest
    rows = [ln for ln in rest.splitlines() if ln.startswith("| fp16")]
    assert rows == ["| fp16 | 64 | no | 512 | 128 | FLASH 3.00 | – |",
                    "| fp16 | 64 | no | 1024 | 64 | FLASH 0.80, CUDNN 0.50 | FLASH 0.75 |"]
    table = bench.format_table([dict(r, tflops=1.0, peak_extra_bytes=0) for r in recs])
    assert "1024/64" in table and "512/128" in table
    assert bench.small_table([_doc(recs[:2])], ["x.json"]) == ""


def test_show_backward_dq_prints_the_shipped_comparison(capsys):
    """``tune --show-backward-dq`` on the shipped file: a row per case, the speed-up column is
    the dQ kernel's time over the atomic mode's, as the rows record them."""
    from benchmarks import tune
    path = ROOT / "results" / "tune_backward_dq_h100_2026-11-25.json"
    rows = json.loads(path.read_text())["rows"]
    tune.show_backward_dq(str(path))
    lines = capsys.readouterr().out.splitlines()[2:]
    assert len(lines) == len(rows) == 32
    for line, r in zip(lines, rows):
        speedup = float(line.split()[6])
        assert speedup == pytest.approx(r["bwd_ms"]["kernel"] / r["bwd_ms"]["atomic"], abs=0.006)


def test_show_backward_dq_names_each_rows_sdpa_backend(tmp_path, capsys):
    """Rows that name their SDPA backend (float32: EFFICIENT) are compared with it; rows of the
    earlier format (FLASH's time alone) still print."""
    from benchmarks import tune
    rows = [{"dtype": "fp32", "head_dim": 128, "causal": False, "seq_len": 1024,
             "bwd_ms": {"kernel": 12.0, "atomic": 8.0}, "atomic_speedup": 1.5,
             "sdpa_backend": "sdpa-efficient", "sdpa_bwd_ms": 10.0},
            {"dtype": "fp16", "head_dim": 64, "causal": True, "seq_len": 2048,
             "bwd_ms": {"kernel": 2.0, "atomic": 4.0}, "atomic_speedup": 0.5,
             "sdpa_flash_bwd_ms": 1.0}]
    path = tmp_path / "dq.json"
    path.write_text(json.dumps({"provenance": {"gpu": "X"}, "rows": rows}))
    tune.show_backward_dq(str(path))
    lines = capsys.readouterr().out.splitlines()[2:]
    assert lines[0].split()[7:] == ["EFFICIENT", "0.83", "1.25"]
    assert lines[1].split()[7:] == ["FLASH", "0.50", "0.25"]


def _cell_ranges(cell):
    """{"FLASH": (lo, hi), ...} of a summary cell."""
    out = {}
    for part in cell.split(", "):
        if part.strip() == "–":
            continue
        label, span = part.split()
        lo, _, hi = span.partition("–")
        out[label] = (float(lo), float(hi or lo))
    return out


@pytest.mark.parametrize("path", README_BENCHES, ids=lambda p: p.name)
def test_summary_of_the_shipped_benchmark_recomputes_from_its_records(path):
    doc = json.loads(path.read_text())
    text = bench.summary_table(doc, path.name)
    times = {(r["kernel"], r["dtype"], r["head_dim"], r["causal"], r["pass"], r["seq_len_q"]):
             r["time_ms"] for r in doc["records"] if r.get("grid") != "small"}
    ours = {k[1:4] for k in times if k[0] == "ioaware-numba"}
    rows = [ln for ln in text.splitlines() if ln.startswith(("| fp", "| bf"))]
    assert len(rows) == len(ours) >= 4       # (a float32-only run has its four rows)
    labels = {"sdpa-flash": "FLASH", "sdpa-cudnn": "CUDNN", "sdpa-efficient": "EFFICIENT"}
    for row in rows:
        dt, d, causal, _, fwd, fwdbwd = (c.strip() for c in row.strip("|").split("|"))
        key = (dt, int(d), causal == "yes")
        for pass_, cell in (("fwd", fwd), ("fwd+bwd", fwdbwd)):
            peers = ("sdpa-efficient",) if dt == "fp32" else ("sdpa-flash", "sdpa-cudnn")
            want = {}
            for peer in peers:
                ratios = [times[(peer, *key, pass_, n)] / t for (k, *rest, n), t in times.items()
                          if k == "ioaware-numba" and tuple(rest) == (*key, pass_)
                          and (peer, *key, pass_, n) in times]
                if ratios:
                    want[labels[peer]] = (min(ratios), max(ratios))
            got = _cell_ranges(cell)
            assert got.keys() == want.keys(), (row, pass_)
            for label, (lo, hi) in want.items():
                assert got[label] == pytest.approx((lo, hi), abs=0.0051), (row, label)


def test_readme_embeds_the_summary_of_the_shipped_benchmark():
    text = (ROOT / "README.md").read_text()
    block = bench.readme_block(text)
    if block is None:
        pytest.skip("the README has no summary-table markers")
    assert block == bench.summary_table([json.loads(p.read_text()) for p in README_BENCHES],
                                        [p.name for p in README_BENCHES]).strip()


def test_summary_of_several_runs_takes_each_row_whole_from_the_last_run_that_has_it():
    old = [_rec("ioaware-numba", "fp16", 64, False, "fwd", 1024, 2.0),
           _rec("sdpa-flash", "fp16", 64, False, "fwd", 1024, 1.0),
           _rec("ioaware-numba", "fp32", 64, False, "fwd", 1024, 2.0),
           _rec("sdpa-efficient", "fp32", 64, False, "fwd", 1024, 3.0)]
    new = [_rec("ioaware-numba", "fp16", 64, False, "fwd", 2048, 1.0),
           _rec("sdpa-flash", "fp16", 64, False, "fwd", 2048, 1.2)]
    text = bench.summary_table([_doc(old), _doc(new)], ["old.json", "new.json"])
    lines = text.splitlines()
    assert "[1] `old.json`" in lines[0] and "[2] `new.json`" in lines[0]
    assert lines[2].endswith("| run |")
    assert lines[4:] == ["| fp16 | 64 | no | 2048 | FLASH 1.20 | – | [2] |",
                         "| fp32 | 64 | no | 1024 | EFFICIENT 1.50 | – | [1] |"]


def test_readme_option_rewrites_only_the_marked_block(tmp_path, capsys):
    readme = tmp_path / "README.md"
    before, after = "# Title\n\ntext before\n", "\n## Next\ntext after\n"
    readme.write_text(before + bench.README_BEGIN + "\nstale table\n" + bench.README_END + after)
    assert bench.main(["--summary", str(SHIPPED_BENCH), "--readme", str(readme)]) == 0
    new = readme.read_text()
    assert new.startswith(before) and new.endswith(bench.README_END + after)
    assert "stale table" not in new
    table = bench.summary_table(json.loads(SHIPPED_BENCH.read_text()), SHIPPED_BENCH.name)
    assert bench.readme_block(new) == table.strip()
    assert bench.main(["--summary", str(SHIPPED_BENCH), "--readme", str(readme)]) == 0
    assert readme.read_text() == new                         # idempotent
    capsys.readouterr()
    assert bench.main(["--summary", str(SHIPPED_BENCH)]) == 0
    assert capsys.readouterr().out.strip() == table.strip()
    readme.write_text("no markers\n")
    assert bench.main(["--summary", str(SHIPPED_BENCH), "--readme", str(readme)]) == 1
    with pytest.raises(SystemExit):
        bench.main(["--readme", str(readme)])                # --readme needs --summary


# -- the sanitizer's cases -----------------------------------------------------------------------

@pytest.mark.parametrize("family", ["simt", "mma", "tf32", "wgmma"])
def test_sanitize_cases_are_run_by_the_family_they_name(family, monkeypatch):
    """Each case of ``python -m benchmarks sanitize`` is one its family takes, forward and
    backward (the tensor-core families' checks as on a compute capability 9.0 GPU)."""
    import numpy as np

    import kernels
    from benchmarks import sanitize
    from kernels import host
    monkeypatch.setattr(host, "real_gpu", lambda: True)
    monkeypatch.setattr(host, "compute_capability", lambda device_id=0: (9, 0))
    monkeypatch.setattr(host, "current_device_id", lambda: 0)
    rng = np.random.default_rng(0)
    config = kernels.KernelConfig(family=family)
    cases = sanitize.WGMMA_CASES if family == "wgmma" else sanitize.CASES
    for d, options in cases:
        q, k, v, _, kw = sanitize._case_inputs(rng, family, d, options)
        pb = common.attention_problem(q, k, v, **kw)
        assert pb.seqlen_q % 64 and pb.seqlen_k % 32 and pb.heads_q > pb.heads_kv
        for pass_ in ("fwd",) if family in sanitize.FORWARD_ONLY else ("fwd", "bwd"):
            assert kernels.family_for(pb, config, pass_) == family


def test_sanitize_wgmma_walk_has_more_items_than_sms():
    """The persistent forward's sanitizer case: at its largest tile (192 rows) more work items
    than an H100's or H200's 132 SMs, so that some program walks two; GQA; a causal tail."""
    from benchmarks import sanitize
    hq, hkv = sanitize.WGMMA_WALK_HEADS
    assert hq * -(-sanitize.SEQ_Q // 192) > 132 and hq % hkv == 0 and hq > hkv
    assert (192, False, True) in sanitize.WGMMA_SCHEDULES


def test_sanitize_split_kv_checks_valid_rows_and_nan_rows(monkeypatch):
    """The decoding cases of ``python -m benchmarks sanitize split_kv`` run (here at 40 keys in
    Numba's CUDA simulator): rows with a valid length finite, a length past the cache NaN; and
    a kernel that let such a row through would be caught."""
    import numpy as np

    import kernels
    from benchmarks import sanitize
    monkeypatch.setattr(sanitize, "DECODE_SEQ_K", 40)
    monkeypatch.setattr(sanitize, "DECODE_CASES", (
        (8, 1, (40, 0, 1, 17), {}),
        (8, 2, (40, 41, 1, 17), {"causal": "bottom_right", "window_size": (5, 0)}),
        (8, 1, None, {})))
    sanitize.run_split_kv()
    real_forward = kernels.forward

    def forgets_the_nan(pb, config=None):
        out, lse = real_forward(pb, config)
        return np.nan_to_num(out), lse
    monkeypatch.setattr(kernels, "forward", forgets_the_nan)
    with pytest.raises(RuntimeError, match="past the cache is not NaN"):
        sanitize.run_split_kv()


def test_train_step_pair_computes_the_same_first_loss():
    """The training-step benchmark's two models (CPU, one layer, 8 tokens): same weights, so the
    same first loss under "sdpa" and "ioaware", and a step that changes the weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from benchmarks.train_step import build_pair, train_step
    pair = build_pair(torch, transformers, torch.float32, layers=1, seq_len=8, device="cpu")
    ids = torch.randint(0, 32000, (1, 8), generator=torch.Generator().manual_seed(0))
    before = pair[1][1].model.layers[0].self_attn.q_proj.weight.detach().clone()
    losses = [float(train_step(model, opt, ids).detach()) for _, model, opt in pair]
    assert all(math.isfinite(x) for x in losses) and abs(losses[0] - losses[1]) < 1e-4 * abs(losses[0])
    assert not torch.equal(before, pair[1][1].model.layers[0].self_attn.q_proj.weight)
