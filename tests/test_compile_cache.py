"""The compiled-kernel cache: kernels built once per process (`kernels.compile_cache.built`),
compiled once per machine (cubins on disk, `kernels.compile_cache`), its directory
(`ioaware.kernel_cache`) and ``python -m ioaware cache / precompile``.

CPU: what the key hashes, whole-file writes, unreadable files as misses, the code dependencies
the key covers against what the kernels import, every kernel the simulator launches stamped
with its build key, the directory's rules. GPU (``-m gpu``): a fresh process compiles and
stores, a second loads without compiling and computes the same bits; a corrupt file is
recompiled.
"""
from __future__ import annotations

import ast
import logging
import pickle
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import ioaware
from ioaware import kernel_cache
from kernels import compile_cache, host

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_dir(tmp_path):
    before = compile_cache.directory()
    compile_cache.set_directory(tmp_path)
    yield tmp_path
    compile_cache.set_directory(before)


def _entry(label="k"):
    from numba.core import types as nt
    return compile_cache.Entry(cubin=b"\x7fELF fake", entry_name="_Z6kernel",
                               argument_types=(nt.Array(nt.float32, 2, "C"), nt.int64),
                               label=label)


def test_built_once_per_process_and_stamped():
    calls = []

    def builder(a, b):
        calls.append((a, b))
        return types.SimpleNamespace()

    k1 = compile_cache.built(builder, 64, True)
    assert compile_cache.built(builder, 64, True) is k1 and calls == [(64, True)]
    k2 = compile_cache.built(builder, 128, True)
    assert k2 is not k1 and calls == [(64, True), (128, True)]
    assert k1.build_key == (__name__, "test_built_once_per_process_and_stamped.<locals>.builder",
                            (64, True))


def test_store_then_load_round_trip(cache_dir):
    key = compile_cache.entry_key(("m", "b", (1,)), ("sig",), (9, 0))
    assert compile_cache.load(key) is None
    compile_cache.store(key, _entry())
    assert compile_cache.load(key) == _entry()
    assert [p.name for p in cache_dir.iterdir()] == [f"{key}.kernel"]   # no temporary left


def test_no_directory_no_cache():
    before = compile_cache.directory()
    compile_cache.set_directory(None)
    try:
        compile_cache.store("abc", _entry())            # a no-op
        assert compile_cache.load("abc") is None
    finally:
        compile_cache.set_directory(before)


@pytest.mark.parametrize("content", [b"", b"not a pickle", pickle.dumps({"cubin": b""})])
def test_unreadable_file_is_a_miss(cache_dir, caplog, content):
    (cache_dir / "bad.kernel").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="ioaware.kernels"):
        assert compile_cache.load("bad") is None
    assert "unreadable" in caplog.text


def test_unwritable_directory_only_warns(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    before = compile_cache.directory()
    compile_cache.set_directory(blocker / "sub")        # a path under a file: cannot be made
    try:
        with caplog.at_level(logging.WARNING, logger="ioaware.kernels"):
            compile_cache.store("abc", _entry())
        assert "could not write" in caplog.text
    finally:
        compile_cache.set_directory(before)


def test_key_hashes_every_part():
    base = (("kernels.mma_fwd", "_build_kernel", (64, 128, 64)), (("t", "torch.int16", 4, "C"),),
            (9, 0))
    key = compile_cache.entry_key(*base)
    assert key == compile_cache.entry_key(*base) and len(key) == 64
    changed = [(("kernels.mma_fwd", "_build_kernel", (64, 128, 32)),) + base[1:],
               (base[0], (("t", "torch.int16", 4, "A"),), base[2]),
               base[:2] + ((8, 0),)]
    assert len({key} | {compile_cache.entry_key(*c) for c in changed}) == 4


def test_key_covers_every_module_the_kernels_import():
    """`CODE_DEPENDENCIES` is exactly the project modules outside ``kernels/`` that kernel
    modules import: a change to any of them changes every key."""
    imported = set()
    for path in (ROOT / "kernels").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            imported |= {n for n in names if n and n.split(".")[0] in ("ioaware", "sim")}
    assert imported == set(compile_cache.CODE_DEPENDENCIES)


def test_fingerprint_reads_the_dependencies(monkeypatch):
    fp = compile_cache.source_fingerprint()
    compile_cache.source_fingerprint.cache_clear()
    monkeypatch.setattr(compile_cache, "CODE_DEPENDENCIES", compile_cache.CODE_DEPENDENCIES[:-1])
    try:
        assert compile_cache.source_fingerprint() != fp
    finally:
        compile_cache.source_fingerprint.cache_clear()


def test_every_launched_kernel_has_a_build_key(monkeypatch):
    """Each kernel a forward, backward and decode launches is built through
    `compile_cache.built` (so the disk cache can know it)."""
    if not host.simulator():
        pytest.skip("runs the kernels in the CUDA simulator")
    import kernels
    from ioaware._inputs import check_inputs
    launched = []
    real = host.launch

    def record(kern, *args, **kw):
        launched.append(kern)
        return real(kern, *args, **kw)
    monkeypatch.setattr(host, "launch", record)
    rng = np.random.default_rng(0)
    q, k, v, do = (rng.standard_normal((1, 2, 20, 16)).astype(np.float32) for _ in range(4))
    pb = check_inputs(q, k, v, causal=True)
    out, lse = kernels.forward(pb)
    kernels.backward(pb, out, lse, do)
    qd = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    kd, vd = (rng.standard_normal((1, 1, 300, 16)).astype(np.float32) for _ in range(2))
    dec = check_inputs(qd, kd, vd)
    assert kernels.family_for(dec, None, "fwd") == "split_kv"
    kernels.forward(dec)
    assert len(launched) >= 4
    missing = [k for k in launched if getattr(k, "build_key", None) is None]
    assert not missing


# -- the directory -------------------------------------------------------------------------------
def test_directory_rules(monkeypatch, tmp_path):
    monkeypatch.delenv(kernel_cache.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert kernel_cache.default_kernel_cache_dir() == (tmp_path / "xdg" / "ioaware" / "kernels").resolve()
    monkeypatch.setenv(kernel_cache.ENV_VAR, str(tmp_path / "mine"))
    assert kernel_cache.default_kernel_cache_dir() == (tmp_path / "mine").resolve()
    monkeypatch.setenv(kernel_cache.ENV_VAR, "")
    assert kernel_cache.default_kernel_cache_dir() is None


def test_set_kernel_cache_dir_reaches_the_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel_cache, "_explicit", kernel_cache._UNSET)
    before = compile_cache.directory()
    try:
        kernel_cache.kernels()                          # kernels in use: applied at once
        ioaware.set_kernel_cache_dir(tmp_path / "k")
        assert compile_cache.directory() == (tmp_path / "k").resolve()
        assert kernel_cache.kernel_cache_dir() == (tmp_path / "k").resolve()
        ioaware.set_kernel_cache_dir(None)
        assert compile_cache.directory() is None
    finally:
        compile_cache.set_directory(before)


def _ioaware(*args, env=None):
    import os
    return subprocess.run([sys.executable, "-m", "ioaware", *args], capture_output=True,
                          text=True, cwd=ROOT, env=dict(os.environ, **(env or {})), timeout=300)


def test_cache_command_lists_and_clears(tmp_path):
    (tmp_path / "a.kernel").write_bytes(b"x" * 10)
    (tmp_path / "b.kernel").write_bytes(b"y" * 10)
    env = {kernel_cache.ENV_VAR: str(tmp_path)}
    r = _ioaware("cache", env=env)
    assert r.returncode == 0 and "2 compiled kernels" in r.stdout and str(tmp_path) in r.stdout
    r = _ioaware("cache", "--clear", env=env)
    assert r.returncode == 0 and "deleted 2" in r.stdout
    assert not list(tmp_path.glob("*.kernel"))
    r = _ioaware("cache", env={kernel_cache.ENV_VAR: ""})
    assert r.returncode == 0 and "off" in r.stdout


def test_precompile_needs_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _ioaware("precompile", env={kernel_cache.ENV_VAR: str(tmp_path)})
    assert r.returncode == 2 and "needs a CUDA GPU" in r.stderr


# -- GPU -----------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_second_process_loads_what_the_first_compiled(tmp_path):
    """A fresh process on an empty cache compiles (logged) and stores; the next loads every
    kernel (nothing compiled); its out, dK and dV are bitwise the same and its dQ (summed by
    float32 atomics on sm_90, in a varying order) equal to float32 rounding."""
    from benchmarks.first_call import same_results
    if not host.real_gpu():
        pytest.skip("needs a real CUDA GPU")
    from benchmarks.first_call import run_child
    for c in ({"dtype": "fp16", "head_dim": 64, "causal": True},
              {"dtype": "fp32", "head_dim": 128, "causal": False}):
        c = dict(c, shape=[1, 2, 300])
        where = tmp_path / c["dtype"]
        cold = run_child(c, str(where), str(tmp_path / "pyc"))
        assert cold["kernels_compiled"] >= 3      # forward, dQ and dK/dV (or pre-pass, conversion)
        assert len(list(where.glob("*.kernel"))) == cold["kernels_compiled"]
        warm = run_child(c, str(where), str(tmp_path / "pyc"))
        assert warm["kernels_compiled"] == 0
        same = same_results(cold, warm)
        assert same["bitwise_equal"] and same["dq_rel_diff"] < 1e-5, same


@pytest.mark.gpu
def test_corrupt_file_is_recompiled(tmp_path):
    if not host.real_gpu():
        pytest.skip("needs a real CUDA GPU")
    from benchmarks.first_call import run_child, same_results
    c = {"dtype": "bf16", "head_dim": 64, "causal": False, "shape": [1, 2, 200]}
    pyc = str(tmp_path / "pyc")
    cold = run_child(c, str(tmp_path), pyc)
    for f in tmp_path.glob("*.kernel"):
        f.write_bytes(b"torn")
    again = run_child(c, str(tmp_path), pyc)
    assert again["kernels_compiled"] == cold["kernels_compiled"]
    same = same_results(cold, again)
    assert same["bitwise_equal"] and same["dq_rel_diff"] < 1e-5, same
    assert run_child(c, str(tmp_path), pyc)["kernels_compiled"] == 0


@pytest.mark.gpu
def test_precompile_compiles_then_loads(tmp_path):
    """``python -m ioaware precompile`` on an empty directory compiles each configuration and
    stores it; run again, it loads every one."""
    if not host.real_gpu():
        pytest.skip("needs a real CUDA GPU")
    env = {kernel_cache.ENV_VAR: str(tmp_path)}
    args = ("precompile", "--dtype", "float32", "--head-dim", "64", "--forward-only")
    first = _ioaware(*args, env=env)
    assert first.returncode == 0, first.stderr
    lines = [ln for ln in first.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == 4 and all("compiled" in ln for ln in lines), first.stdout
    assert len(list(tmp_path.glob("*.kernel"))) >= 2          # causal and not, two layouts
    second = _ioaware(*args, env=env)
    assert second.returncode == 0, second.stderr
    lines = [ln for ln in second.stdout.splitlines() if ln.startswith("[")]
    assert len(lines) == 4 and all("loaded" in ln for ln in lines), second.stdout
    assert "0 kernels compiled" in second.stdout
