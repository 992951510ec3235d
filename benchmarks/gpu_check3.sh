#!/usr/bin/env bash
# GPU job 4: forward v3 (flattened shared tiles) and backward v3 (coalesced delta pre-pass).
# GPU tests on v3, v2-vs-v3 A/B in one process (kernels.tune --versions 2 3), then the full
# benchmark with the faster version of each (chosen from the A/B; v2 unless v3 passed the tests
# and was faster), its results file copied to $OUT. Total under ~525 s. BENCH=0 stops after the A/B.
set -u; OUT=${OUT:-gpu_logs}; mkdir -p "$OUT"; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
KERNELS_FWD_VERSION=3 KERNELS_BWD_VERSION=3 timeout 120 python3 -m pytest -m gpu tests/test_kernels.py \
  -q -x -p no:cacheprovider -W ignore 2>&1 | tail -30 > "$OUT/tests_v3.log"; tail -3 "$OUT/tests_v3.log"
timeout 150 python3 -W ignore -m kernels.tune --d 64 128 --versions 2 3 --max-variants 1 \
  --max-bwd-variants 1 --dq-modes atomic --json "$OUT/tune_ab.json" 2>&1 | tee "$OUT/tune_ab.log"
read -r FV BV < <(python3 - "$OUT/tune_ab.json" "$OUT/tests_v3.log" <<'PY'
import json, re, sys
fv = bv = 2
try:
    log = open(sys.argv[2]).read()
    ok = re.search(r"\d+ passed", log) and not re.search(r"failed|error", log)
    rep = json.load(open(sys.argv[1]))
    def total(ver, key):
        ms = [next((r["ms"] for r in rep[d]["rows"] if r.get("version") == ver and key in r), None)
              for d in rep]
        return None if None in ms or not ms else sum(ms)
    if ok:
        f2, f3, b2, b3 = total(2, "block_q"), total(3, "block_q"), total(2, "bwd_block_q"), total(3, "bwd_block_q")
        fv = 3 if f2 and f3 and f3 < f2 else 2
        bv = 3 if b2 and b3 and b3 < b2 else 2
except Exception as exc:
    print(exc, file=sys.stderr)
print(fv, bv)
PY
)
if [[ ${BENCH:-1} == 0 ]]; then exit 0; fi
echo "bench with KERNELS_FWD_VERSION=$FV KERNELS_BWD_VERSION=$BV" | tee "$OUT/chosen.txt"
KERNELS_FWD_VERSION=$FV KERNELS_BWD_VERSION=$BV timeout $((525 - SECONDS)) python3 -W ignore \
  -m kernels.bench --tag "fwdv${FV}-bwdv${BV}" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -5 "$OUT/bench.log"
cp results/bench_*_fwdv*.json "$OUT/" 2>/dev/null; ls "$OUT"
