#!/usr/bin/env bash
# Runs the usual measuring and checking sets of the lab on a GPU machine, from the repository root:
#
#   bash benchmarks/gpu_job.sh MODE [MODE ...]
#
# modes (in the order given):
#   env        versions (Python packages, nvidia-smi, CUDA tools, code version) -> env.txt
#   tests      python -m pytest -m gpu -q (in WORKERS processes with pytest-xdist) -> tests.log
#   bench      python -m benchmarks bench: the benchmark against PyTorch SDPA    -> bench_<gpu>_<date>.json, bench.log
#   sanitize   compute-sanitizer memcheck and racecheck on python -m benchmarks sanitize,
#              one process per tool and family                                  -> sanitizer_<tool>_<family>.log
#   measure    python -m benchmarks measure --standard (every family), then the Nsight Compute
#              counters by python -m benchmarks ncu where ncu is on PATH        -> sweep.json, measure.log, ncu.log
#   resources  python -m benchmarks resources (ptxas registers per kernel)       -> kernel_resources_sm90.json
#   check      python -m benchmarks check (PTX, ptxas, SASS of the tensor-core kernels) -> check.log
#   rates      python -m benchmarks rates (the hardware rates the model prices with) -> rates_<gpu>.json, rates.log
#   pick       python -m benchmarks pick (every legal tile configuration of 16 groups per family,
#              and the model's picks priced with the rates file of a rates step before it);
#              families from PICK_FAMILIES (default "mma tf32", the tensor-core forwards)
#                                                                                 -> pick.json, pick.log
#   tune-dq    python -m benchmarks tune --backward-dq for float16, bfloat16 and float32: the
#              tensor-core backwards' two dQ modes        -> tune_backward_dq.json, tune_dq.log;
#              then the Hopper backward's (--dq-family wgmma, on sm_90) -> tune_backward_dq_wgmma.json
#   decode     python -m benchmarks decode --splits --window --graph --ncu: decoding and sliding
#              windows against SDPA, priced at the rates of a rates step before it (or of the
#              file DECODE_RATES names)                   -> decode.json, decode.log
#
# Logs and results go to $OUT (default ./gpu_logs). Every step runs under `timeout`; its limit in
# seconds can be changed by the environment variable named in brackets: tests [T_TESTS], bench
# [T_BENCH], each sanitizer process [T_SANITIZE], measure [T_MEASURE], ncu [T_NCU], resources
# [T_RESOURCES], check [T_CHECK], rates [T_RATES], pick [T_PICK], tune-dq [T_TUNE_DQ], decode
# [T_DECODE]; ncu stops starting new chunks after 3/4 of its limit (the sweep
# file keeps what was profiled, and a rerun resumes). A step's exit status is printed after it;
# the script goes on with the next.
#
# Wheels in .whl/ (e.g. a NumPy that numba-cuda supports, when the image's is newer) are installed
# into /tmp/site first and put on PYTHONPATH.
set -u
if [ $# -eq 0 ]; then
  sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
  exit 2
fi
for mode in "$@"; do
  case $mode in
    env|tests|bench|sanitize|measure|resources|check|rates|pick|tune-dq|decode) ;;
    *) echo "unknown mode '$mode' (modes: env tests bench sanitize measure resources check rates pick tune-dq decode)" >&2
       exit 2 ;;
  esac
done
OUT=${OUT:-gpu_logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

step() {  # step NAME LIMIT_S LOG COMMAND...: run COMMAND under timeout, output to LOG and the terminal
  local name=$1 limit=$2 log=$3
  shift 3
  timeout "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  echo "[$name] exit status $rc (limit ${limit}s)"
}

for mode in "$@"; do
  case $mode in
    env)
      {
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
        python3 -c "import sys, numpy, numba, torch; print('python', sys.version.split()[0], 'numpy', numpy.__version__, 'numba', numba.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda)"
        python3 -m pip show numba-cuda 2>/dev/null | grep -i '^version'
        for tool in ptxas cuobjdump nvdisasm ncu compute-sanitizer; do echo "$tool: $(command -v $tool)"; done
        echo "code: $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
      } 2>&1 | tee "$OUT/env.txt"
      ;;
    tests)
      # pytest-xdist, where installed, compiles the kernels of different tests in parallel
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${WORKERS:-12}")
      step tests "${T_TESTS:-900}" "$OUT/tests.log" python3 -m pytest -m gpu -q -p no:cacheprovider \
        --durations=15 $workers
      ;;
    bench)
      step bench "${T_BENCH:-1800}" "$OUT/bench.log" python3 -m benchmarks bench --out "$OUT"
      ;;
    sanitize)
      for tool in memcheck racecheck; do
        for family in simt mma tf32 split_kv wgmma wgmma_fp8; do
          step "sanitize $tool $family" "${T_SANITIZE:-600}" "$OUT/sanitizer_${tool}_${family}.log" \
            compute-sanitizer --tool "$tool" --report-api-errors no --print-limit 20 \
            python3 -m benchmarks sanitize "$family"
        done
      done
      ;;
    measure)
      step measure "${T_MEASURE:-3600}" "$OUT/measure.log" \
        python3 -m benchmarks measure --standard --families simt,mma,tf32 --out "$OUT/sweep.json"
      if command -v ncu >/dev/null; then
        step ncu "${T_NCU:-3600}" "$OUT/ncu.log" python3 -m benchmarks ncu "$OUT/sweep.json" \
          --time-budget $(( ${T_NCU:-3600} * 3 / 4 ))
      else
        echo "[ncu] not on PATH: the sweep has no counters"
      fi
      ;;
    resources)
      step resources "${T_RESOURCES:-1800}" "$OUT/resources.log" \
        python3 -m benchmarks resources --out "$OUT/kernel_resources_sm90.json"
      ;;
    check)
      step check "${T_CHECK:-1800}" "$OUT/check.log" python3 -m benchmarks check --out "$OUT/check"
      ;;
    rates)
      step rates "${T_RATES:-600}" "$OUT/rates.log" python3 -m benchmarks rates --out "$OUT/rates.json"
      ;;
    pick)
      rates=()
      [ -f "$OUT/rates.json" ] && rates=(--rates "$OUT/rates.json")
      step pick "${T_PICK:-900}" "$OUT/pick.log" python3 -m benchmarks pick --out "$OUT/pick.json" \
        --family ${PICK_FAMILIES:-mma tf32} "${rates[@]}"
      ;;
    tune-dq)
      step tune-dq "${T_TUNE_DQ:-1200}" "$OUT/tune_dq.log" python3 -m benchmarks tune --backward-dq \
        --dtype fp16 bf16 fp32 --out "$OUT/tune_backward_dq.json"
      step tune-dq-wgmma "${T_TUNE_DQ:-1200}" "$OUT/tune_dq_wgmma.log" python3 -m benchmarks tune \
        --backward-dq --dq-family wgmma --dtype fp16 bf16 --out "$OUT/tune_backward_dq_wgmma.json"
      ;;
    decode)
      rates=()
      if [ -f "$OUT/rates.json" ]; then rates=(--rates "$OUT/rates.json")
      elif [ -n "${DECODE_RATES:-}" ]; then rates=(--rates "$DECODE_RATES"); fi
      step decode "${T_DECODE:-1500}" "$OUT/decode.log" python3 -m benchmarks decode --splits \
        --window --graph --ncu "${rates[@]}" --out "$OUT/decode.json"
      ;;
  esac
done
