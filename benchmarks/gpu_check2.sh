#!/usr/bin/env bash
# GPU job 3: forward and dK/dV v2 (unsigned indices) — GPU tests, memcheck, v1/v2 forward timings.
set -u; OUT=${OUT:-gpu_logs}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
timeout 200 python3 -m pytest -m gpu tests/test_kernels.py -q -x -p no:cacheprovider -W ignore 2>&1 | tail -30 > "$OUT/tests.log"; tail -3 "$OUT/tests.log"
timeout 120 compute-sanitizer --tool memcheck --report-api-errors no python3 -W ignore -m kernels.sanitize_case > "$OUT/sanitizer_memcheck.log" 2>&1; echo "memcheck rc=$?"; tail -n 2 "$OUT/sanitizer_memcheck.log"
timeout 120 compute-sanitizer --tool racecheck --report-api-errors no python3 -W ignore -m kernels.sanitize_case > "$OUT/sanitizer_racecheck.log" 2>&1; echo "racecheck rc=$?"; tail -n 2 "$OUT/sanitizer_racecheck.log"
for ver in 1 2; do
  KERNELS_FWD_VERSION=$ver KERNELS_BWD_VERSION=$ver timeout 150 python3 -W ignore -m kernels.tune --d 64 128 --max-variants 2 --max-bwd-variants 1 2>&1 | tee "$OUT/tune_fwd_v$ver.log"
done
