#!/usr/bin/env bash
# One device call for the tensor-core path: GPU tests, SASS check, benchmark vs SDPA.
# Usage (repo root, on the GPU machine): bash kernels/gpu_check_mma.sh OUTDIR [quick|full|bwd|bench]
#   full (default): every tensor-core test, the SASS check, forward + backward benchmark
#   quick: the backward's tests and a forward + backward timing at N=4096
#   bwd: the backward's tests, the SASS check, the forward + backward benchmark
#   bench: the forward + backward benchmark, then compute-sanitizer memcheck of the backward
# Writes OUTDIR/{env.txt,pytest.log,mma_check.log,bench.log,bench_mma_fwdbwd.json,sanitizer.log}.
set -o pipefail
OUT_DIR=${1:?usage: gpu_check_mma.sh OUTDIR [quick|full|bwd|bench]}
MODE=${2:-full}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
  python3 -c "import torch, numba, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numba', numba.__version__, 'numpy', numpy.__version__)"
  python3 -m pip show numba-cuda 2>/dev/null | grep -i ^version
  for t in ptxas cuobjdump nvdisasm; do echo "$t: $(command -v $t)"; done
} 2>&1 | tee "$OUT_DIR/env.txt"
# SASS tools: use any nvdisasm/cuobjdump shipped with the image's CUDA packages
for tool in cuobjdump nvdisasm ptxas; do
  if ! command -v $tool >/dev/null; then
    p=$(timeout 30 find /usr/local /opt /usr/lib/python3* /usr/local/lib/python3* -name $tool -type f 2>/dev/null | head -1)
    [ -n "$p" ] && export PATH="$PATH:$(dirname "$p")" && echo "found $p" | tee -a "$OUT_DIR/env.txt"
  fi
done
if [ "$MODE" = bench ]; then
  timeout 240 python3 -m kernels.bench_mma --mode fwdbwd --out "$OUT_DIR/bench_mma_fwdbwd.json" 2>&1 | tee "$OUT_DIR/bench.log"
  timeout 90 compute-sanitizer --tool memcheck --report-api-errors no python3 -m kernels.sanitize_mma_bwd 2>&1 | tail -40 | tee "$OUT_DIR/sanitizer.log"
  exit 0
fi
if [ "$MODE" = full ]; then
  TESTS="tests/test_mma_fragments.py tests/test_mma_intrinsics.py tests/test_mma_fwd.py tests/test_mma_bwd.py"
else
  TESTS="tests/test_mma_bwd.py"
fi
timeout 300 python3 -m pytest $TESTS -q -x --no-header -p no:cacheprovider 2>&1 | tee "$OUT_DIR/pytest.log"
if [ "$MODE" = quick ]; then
  timeout 120 python3 -m kernels.bench_mma --mode fwdbwd --seq 4096 --reps 10 --out "$OUT_DIR/bench_mma_fwdbwd.json" 2>&1 | tee "$OUT_DIR/bench.log"
  exit 0
fi
timeout 240 python3 -m kernels.mma_check --out /tmp/mma_check 2>&1 | tee "$OUT_DIR/mma_check.log"
timeout 240 python3 -m kernels.bench_mma --mode fwdbwd --out "$OUT_DIR/bench_mma_fwdbwd.json" 2>&1 | tee "$OUT_DIR/bench.log"
