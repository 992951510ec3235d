#!/usr/bin/env bash
# One GPU job for the fp32 kernels: GPU tests, compute-sanitizer (memcheck, racecheck) on a small
# configuration, resource usage and a tile sweep, optionally the benchmark.
#   bash kernels/gpu_check.sh [tests] [sanitize] [tune] [bench] [quick]
# Logs go to $OUT (or ./gpu_logs).
set -u
OUT=${OUT:-gpu_logs}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
steps=" $* "
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import numpy, numba, numba_cuda, torch; print(numpy.__version__, numba.__version__, numba_cuda.__version__, torch.__version__)" | tee -a "$OUT/gpu.txt"
if [[ $steps == *" tests "* ]]; then
  timeout 300 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider 2>&1 | tail -40 > "$OUT/tests.log"; tail -15 "$OUT/tests.log"
fi
if [[ $steps == *" sanitize "* ]]; then
  for tool in memcheck racecheck; do
    timeout 420 compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 python3 -m kernels.sanitize_case > "$OUT/sanitizer_$tool.log" 2>&1
    echo "sanitizer $tool rc=$?"; tail -4 "$OUT/sanitizer_$tool.log"
  done
fi
if [[ $steps == *" tune "* ]]; then
  timeout 400 python3 -m kernels.tune --d 64 128 2>&1 | tee "$OUT/tune.log"
fi
if [[ $steps == *" quick "* ]]; then
  timeout 300 python3 -m kernels.bench --quick --out "$OUT/bench_quick.json" 2>&1 | tee "$OUT/bench_quick.log"
fi
if [[ $steps == *" bench "* ]]; then
  timeout 560 python3 -m kernels.bench 2>&1 | tee "$OUT/bench.log"; cp results/bench_*.json "$OUT/" 2>/dev/null
fi
