"""benchmarks.ring without a GPU: --help, every argument refusal (each naming its option), the
launch checks, the timing rule on a stand-in for torch.cuda and torch.distributed, and the P2P
file's derivation read back by sim.ring."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import ring as bench_ring
from sim.ring import Interconnect, load_interconnect

ROOT = Path(__file__).resolve().parents[1]


def test_help_runs_on_the_cpu():
    r = subprocess.run([sys.executable, "-m", "benchmarks.ring", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "torchrun" in r.stdout and "--p2p" in r.stdout


def _refusal(capsys, monkeypatch, argv, env=None):
    for key in ("WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in (env or {}).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as exc:
        bench_ring.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--seq-len", "1001"], "--seq-len = 1001 cannot be split"),
    (["--seq-len", "32k,abc"], "--seq-len: expected a token count such as 131072 or 128k"),
    (["--kernels", "ioaware-ring,flash3"], "--kernels: expected a comma-separated subset"),
    (["--heads", "16", "--heads-kv", "5"], "--heads (16) must be a multiple of --heads-kv (5)"),
    (["--head-dim", "96"], "--head-dim 96"),
    (["--heads-kv", "4"], "--kernels torch-cp-flash: PyTorch's context_parallel is compared without GQA"),
    (["--repeats", "0"], "--repeats: expected a positive integer"),
    (["--warmup", "-1"], "--warmup must be >= 0"),
    (["--profile", "h900"], "--profile: unknown device/profile"),
    (["--interconnect", "/nonexistent/p2p.json"], "--interconnect /nonexistent/p2p.json: no such file"),
    (["--p2p", "--p2p-max-bytes", "4"], "--p2p-max-bytes must be at least 8"),
])
def test_arguments_are_refused_naming_the_option(capsys, monkeypatch, argv, message):
    assert message in _refusal(capsys, monkeypatch, argv)


def test_launch_is_checked_after_the_arguments(capsys, monkeypatch):
    err = _refusal(capsys, monkeypatch, ["--seq-len", "32k"])
    assert "launch one process per GPU with torchrun" in err
    err = _refusal(capsys, monkeypatch, ["--seq-len", "32k"], {"WORLD_SIZE": "4"})
    assert "launch one process per GPU with torchrun" in err          # no LOCAL_RANK: not torchrun
    err = _refusal(capsys, monkeypatch, ["--p2p"], {"WORLD_SIZE": "4", "LOCAL_RANK": "0"})
    assert "--p2p measures between two GPUs" in err
    err = _refusal(capsys, monkeypatch, ["--seq-len", "24"], {"WORLD_SIZE": "8", "LOCAL_RANK": "0"})
    assert "divisible by 16" in err                                     # 2P for the launched P
    err = _refusal(capsys, monkeypatch, [], {"WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    assert "at least 2 processes" in err
    err = _refusal(capsys, monkeypatch, ["--seq-len", "32k"], {"WORLD_SIZE": "2", "LOCAL_RANK": "0"})
    assert "needs a CUDA GPU per process" in err


class _Stand:
    """torch.cuda events 1 ms apart on this rank; the other rank 3 ms per call (all_reduce MAX)."""

    def __init__(self):
        self.log, self.clock = [], 0.0
        stand = self

        class Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                stand.clock += 1.0
                self.t = stand.clock
                stand.log.append("record")

            def elapsed_time(self, other):
                return other.t - self.t

        class Cuda:
            def __init__(self):
                self.Event = Event

            def synchronize(self):
                stand.log.append("sync")

        class Dist:
            class ReduceOp:
                MAX = "max"

            def barrier(self):
                stand.log.append("barrier")

            def all_reduce(self, t, op):
                assert op == "max"
                stand.log.append("max")
                t.fill_(max(float(t.item()), 3.0))

        import torch
        self.cuda = Cuda()
        self.dist = Dist()
        self.float64 = torch.float64
        self.tensor = lambda values, device=None, dtype=None: torch.tensor(values, dtype=dtype)


def test_timing_takes_the_slowest_rank_after_a_barrier():
    stand = _Stand()
    calls = []
    t = bench_ring._timed(stand, stand.dist, lambda: calls.append(1), repeats=5, warmup=2)
    assert len(calls) == 7 and t["repeats"] == 5 and t["warmup"] == 2
    one = stand.log[:7]
    assert one == ["barrier", "sync", "record", "record", "sync", "max"] + one[6:]
    assert t["time_ms"] == t["time_ms_p10"] == t["time_ms_p90"] == 3.0     # the other rank's, not this one's 1 ms


def test_p2p_file_gives_back_the_largest_transfer_and_is_read_by_sim(tmp_path):
    prov = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-01-01T00:00:00+00:00",
            "command": "torchrun --nproc-per-node 2 -m benchmarks ring --p2p"}
    samples = [{"bytes": b, "ping_pong_ms_per_round_trip": 2 * lat * 1e3, "one_way_latency_s": lat,
                "exchange_ms_per_transfer": 1e3 * lat}
               for b, lat in ((8, 1e-5), (16, 3e-5), (1024, 2e-5), (4096, 9e-5))]
    samples.append({"bytes": 1 << 30, "ping_pong_ms_per_round_trip": 6.0, "one_way_latency_s": 3e-3,
                    "exchange_ms_per_transfer": 3.0})
    doc = bench_ring.p2p_document(samples, prov, iters=50)
    assert doc["interconnect_latency_s"] == 2e-5          # median of the messages up to 1 KiB
    link = Interconnect(doc["interconnect_bandwidth_bytes_per_s"], doc["interconnect_latency_s"])
    assert link.transfer_ms(1 << 30) == pytest.approx(3.0)
    assert all(v.startswith("MEASURED") for v in doc["sources"].values())
    path = tmp_path / "p2p.json"
    path.write_text(json.dumps(doc))
    read = load_interconnect(path)
    assert read.latency_s == 2e-5 and "MEASURED" in read.source
    with pytest.raises(ValueError, match="--p2p-max-bytes"):
        bench_ring.p2p_document(samples[:-1] + [dict(samples[-1], exchange_ms_per_transfer=0.001)], prov, 50)
    with pytest.raises(ValueError, match="at most 1024 bytes"):
        bench_ring.p2p_document(samples[-1:], prov, 50)
