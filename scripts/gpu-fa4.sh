#!/usr/bin/env bash
# sparsek's attention beside FlashAttention-4's block-sparse attention (and FlexAttention, SDPA) on
# the GPU machine, in one call: builds the Python extension as scripts/gpu-check.sh does (only its
# target), then runs bench/torch_peers.py --attention. Results in $OUT (or ./gpu-check-out).
#
# FA4 comes from the wheels of ../shared/peers/fa4-wheels.sh (folders .peers/fa4a and .peers/fa4b,
# one per call: each is under the 64 MiB a call carries):
#   call 1 (carry .peers/fa4a):  bash .peers/fa4a/install.sh a
#   call 2 (carry .peers/fa4b):  bash scripts/gpu-fa4.sh      (installs the rest into /tmp/fa4 first)
# Without FA4 the benchmark still runs and prints "FA4 not installed".
#   scripts/gpu-fa4.sh [torch_peers.py flags, e.g. --cases d128,gqa]
# Environment: BUILD (default build-gpu), GENCODE (default 90a), BENCH_TIMEOUT (s, default 420: the
# build, the install and the run stay within a 10-minute call).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
export PATH=/usr/local/cuda/bin:$PATH

if [ ! -d /tmp/fa4/flash_attn ] && [ -f .peers/fa4b/install.sh ] && [ -d /tmp/fa4-wheels ]; then
  bash .peers/fa4b/install.sh b > "$OUT/fa4-install.log" 2>&1 || { tail -5 "$OUT/fa4-install.log"; echo "FA4 install failed"; }
fi
export PYTHONPATH=/tmp/fa4/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4:$PWD/$BUILD/python:$PWD/python${PYTHONPATH:+:$PYTHONPATH}

t0=$(date +%s)
if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEK_CUDA_GENCODE="${GENCODE:-90a}" \
         -DSPARSEK_BUILD_PYTHON=ON &&
       cmake --build "$BUILD" -j "$(nproc)" --target _sparsek; } > "$OUT/fa4-build.log" 2>&1; then
  tail -30 "$OUT/fa4-build.log"; echo "build FAILED (fa4-build.log)"; exit 1
fi
echo "build ok ($(( $(date +%s) - t0 )) s)"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
# -u: a run cut short by the timeout still leaves the rows it finished.
timeout "${BENCH_TIMEOUT:-420}" python3 -u bench/torch_peers.py --attention --json "$OUT/torch_peers_fa4.json" "$@" \
  > "$OUT/torch_peers_fa4.txt" 2>&1
rc=$?
grep -v -E '^(W|I)[0-9]{4} ' "$OUT/torch_peers_fa4.txt" | tail -60
echo "torch_peers --attention rc=$rc ($OUT/torch_peers_fa4.txt, torch_peers_fa4.json)"
exit $rc
