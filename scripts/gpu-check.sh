#!/usr/bin/env bash
# The one script run on the GPU machine: build, GPU tests, verify, compute-sanitizer, benchmark,
# Python GPU tests. Full logs go to $OUT (or ./gpu-check-out); a short table is printed last.
#
#   scripts/gpu-check.sh [stage ...]     stages: build test verify sanitize bench products tune gate profile
#                                        python attention attention-bwd distributed (default: all)
#
# Environment: BUILD (default build-gpu), GENCODE (default 90a), BENCH_ARGS (extra `sparsek bench`
# flags), SAN_FILTER (gtest filter for the sanitizer runs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
GENCODE=${GENCODE:-90a}
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test verify sanitize bench products tune gate profile python attention attention-bwd distributed)
summary=()
note() { summary+=("$(printf '%-10s %s' "$1" "$2")"); }
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
export PATH=/usr/local/cuda/bin:$PATH

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
gpu=$(sed -n 2p "$OUT/gpu.txt")

if want build; then
  t0=$(date +%s)
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPARSEK_CUDA_GENCODE="$GENCODE" \
        -DSPARSEK_BUILD_PYTHON=ON > "$OUT/build.log" 2>&1 &&
     cmake --build "$BUILD" -j "$(nproc)" >> "$OUT/build.log" 2>&1; then
    note build "ok ($(( $(date +%s) - t0 )) s, gencode $GENCODE)"
  else
    tail -40 "$OUT/build.log"; note build "FAILED (see build.log)"; printf '%s\n' "${summary[@]}"; exit 1
  fi
fi
B=./$BUILD

if want attention; then
  # The attention kernel on its own (bench/attention_timer.cu): every output row of the edge cases
  # against fp64, once under compute-sanitizer memcheck (small cases), then the target workloads.
  cmake --build "$BUILD" --target attention_timer > "$OUT/attention-build.log" 2>&1
  timeout 120 "$B/attention_timer" check > "$OUT/attention-check.txt" 2>&1
  note attn-check "rc=$? $(tail -1 "$OUT/attention-check.txt")"
  grep -E 'FAIL|UNSUPPORTED' "$OUT/attention-check.txt" | head -12
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/attention_timer" check "${ATTN_SAN_FILTER:-tails}" \
    > "$OUT/attention-memcheck.log" 2>&1
  note attn-memchk "rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/attention-memcheck.log" | tail -1)"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/attention_timer" check "${ATTN_RACE_FILTER:-d64 b64}" \
    > "$OUT/attention-racecheck.log" 2>&1
  note attn-race "rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/attention-racecheck.log" | tail -1)"
  timeout 120 "$B/attention_timer" time ${ATTN_FILTER:-} > "$OUT/attention-time.txt" 2>&1
  note attn-time "rc=$? (attention-time.txt)"
fi

if want attention-bwd; then
  # The attention backward on its own (bench/attention_bwd_timer.cu): every element of dq, dk, dv of
  # the edge cases against fp64 and repeated runs bit-identical, memcheck and racecheck on small
  # cases, then the target workloads.
  cmake --build "$BUILD" --target attention_bwd_timer > "$OUT/attention-bwd-build.log" 2>&1
  timeout 240 "$B/attention_bwd_timer" check > "$OUT/attention-bwd-check.txt" 2>&1
  note bwd-check "rc=$? $(tail -1 "$OUT/attention-bwd-check.txt")"
  grep -E 'FAIL|UNSUPPORTED' "$OUT/attention-bwd-check.txt" | head -12
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/attention_bwd_timer" check "${BWD_SAN_FILTER:-tails}" \
    > "$OUT/attention-bwd-memcheck.log" 2>&1
  note bwd-memchk "rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/attention-bwd-memcheck.log" | tail -1)"
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 "$B/attention_bwd_timer" check "${BWD_RACE_FILTER:-fp16}" \
    > "$OUT/attention-bwd-racecheck.log" 2>&1
  note bwd-race "rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/attention-bwd-racecheck.log" | tail -1)"
  timeout 180 "$B/attention_bwd_timer" time ${BWD_FILTER:-} > "$OUT/attention-bwd-time.txt" 2>&1
  note bwd-time "rc=$? (attention-bwd-time.txt)"
fi

if want test; then
  timeout 300 $B/sparsek_gpu_tests --gtest_brief=1 > "$OUT/gpu-tests.log" 2>&1
  rc=$?
  note gpu-tests "rc=$rc $(grep -E '^\[  (PASSED|FAILED)' "$OUT/gpu-tests.log" | tr '\n' ' ') $(grep -c '^\[  SKIPPED' "$OUT/gpu-tests.log") skipped"
  [ $rc -ne 0 ] && grep -E '^\[  FAILED|Failure|error' "$OUT/gpu-tests.log" | head -20
  $B/sparsek_cpu_tests --gtest_brief=1 > "$OUT/cpu-tests.log" 2>&1
  note cpu-tests "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/cpu-tests.log" | tr '\n' ' ')"
fi

if want verify; then
  $B/sparsek verify > "$OUT/verify.log" 2>&1
  note verify "rc=$? $(tail -1 "$OUT/verify.log")"
fi

if want sanitize; then
  f=${SAN_FILTER:-*}
  compute-sanitizer --tool memcheck --error-exitcode 9 $B/sparsek_gpu_tests --gtest_brief=1 --gtest_filter="$f" \
    > "$OUT/memcheck.log" 2>&1
  note memcheck "rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)"
  compute-sanitizer --tool racecheck --error-exitcode 9 $B/sparsek_gpu_tests --gtest_brief=1 \
    --gtest_filter="${SAN_RACE_FILTER:-*Small*:*small*:*Edge*:HopperAttention.RandomTopkLayouts}" > "$OUT/racecheck.log" 2>&1
  note racecheck "rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -1)"
fi

if want bench; then
  $B/sparsek bench --json "$OUT/bench.json" ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1
  note bench "rc=$? (bench.txt, bench.json)"
fi

if want products; then
  # The other products' tables: the layer forward (dds x*W^T), its weight gradient (sdd dy^T*x),
  # and the DSD table with op(A) = A^T and with column-major B. One text file, the JSON packed.
  : > "$OUT/products.txt"
  rc_all=0
  for flags in "--op dds --trans" "--op sdd --a-layout col" "--trans" "--b-layout col"; do
    name=$(echo "$flags" | tr -d '-' | tr ' ' '_')
    echo "### sparsek bench $flags" >> "$OUT/products.txt"
    $B/sparsek bench $flags --json "$OUT/bench_$name.json" >> "$OUT/products.txt" 2>&1 || rc_all=$?
  done
  (cd "$OUT" && tar czf products-json.tgz bench_*.json && rm -f bench_*.json)
  note products "rc=$rc_all (products.txt, products-json.tgz)"
fi

if want tune; then
  # The tuner's figures: run() overhead over the bare launch, and the tuner's pick against the best
  # candidate on the GPU workload table (a second timing pass; nothing stored).
  export SPARSEK_CACHE=$OUT/tune-cache.json
  $B/sparsek tune --run-overhead > "$OUT/tune-overhead.txt" 2>&1
  note overhead "rc=$? $(grep 'overhead over' "$OUT/tune-overhead.txt")"
  $B/sparsek tune --spec-workloads --no-store --budget 0.1 > "$OUT/tune-compare.txt" 2>&1
  note tuner "rc=$? $(grep -i 'worst' "$OUT/tune-compare.txt" | tail -1)"
  unset SPARSEK_CACHE
fi

if want gate; then
  # The performance gate: the workload table against this GPU's recorded baseline (bench/baselines/).
  $B/sparsek bench --compare bench/baselines --json "$OUT/gate.json" > "$OUT/gate.txt" 2>&1
  note gate "rc=$? (expect 0) $(grep -E '^gate: (PASSED|FAILED)' "$OUT/gate.txt")"
  # ... and it must fail a slowed run: the same, while a second process keeps the GPU busy.
  ( while :; do $B/sparsek bench --variants cublas_dense_gemm --m 8192 --n 8192 --k 8192 --reps 500 --warmup 0 \
      > /dev/null 2>&1; done ) &
  load=$!
  sleep 10
  $B/sparsek bench --compare bench/baselines > "$OUT/gate-slowed.txt" 2>&1
  rc=$?
  pkill -P $load; kill $load; wait $load 2>/dev/null
  note gate-slow "rc=$rc (expect 1) $(grep -E '^gate: (PASSED|FAILED)' "$OUT/gate-slowed.txt")"
fi

if want profile; then
  # Nsight Compute's key metrics of one launch, normalized (diffable against an earlier profile.txt).
  $B/sparsek profile --m 8192 --n 8192 --k 8192 --block 128x128 --density 0.125 --out "$OUT/profile.txt" \
    --raw "$OUT/profile-ncu.csv" > "$OUT/profile.log" 2>&1
  note profile "rc=$? $(grep -E '^(duration_us|tensor_pipe_wgmma_active_pct|l2_throughput_pct) ' "$OUT/profile.txt" | tr -s ' ' | tr '\n' ';')"
fi

if want python; then
  PYTHONPATH=$PWD/$BUILD/python:$PWD/python python3 -m pytest -q tests/python > "$OUT/pytest.log" 2>&1
  note pytest "rc=$? $(tail -1 "$OUT/pytest.log")"
  if [ -f bench/torch_peers.py ]; then
    PYTHONPATH=$PWD/$BUILD/python:$PWD/python python3 bench/torch_peers.py --json "$OUT/torch_peers.json" \
      > "$OUT/torch_peers.txt" 2>&1
    note torch-peers "rc=$? (torch_peers.txt)"
    # Attention forward + backward vs FlexAttention and SDPA, and the gate, in one run.
    PYTHONPATH=$PWD/$BUILD/python:$PWD/python python3 bench/torch_peers.py --attention --cases all \
      --json "$OUT/torch_peers_attention.json" > "$OUT/torch_peers_attention.txt" 2>&1
    note torch-peers-attention "rc=$? (torch_peers_attention.txt)"
  fi
  # Python host time per call and BlockSparseLinear vs nn.Linear (full table in logs.tgz).
  PYTHONPATH=$PWD/$BUILD/python:$PWD/python python3 bench/torch_layer.py > "$OUT/torch_layer.log" 2>&1
  note torch-layer "rc=$? $(sed -n 2p "$OUT/torch_layer.log")"
fi

if want distributed; then
  # The distributed DSD and context-parallel attention: their GPU tests (1 rank; 2 and 4 ranks when
  # as many GPUs answer), the torchrun examples on every GPU, and the 1/2/4-rank benchmarks (one
  # process, one rank per GPU; ranks beyond the GPUs run serially on GPU 0 in the attention one).
  ngpu=$(nvidia-smi -L | wc -l)
  timeout 300 $B/sparsek_gpu_tests --gtest_filter='DistributedGpu.*:ContextParallelGpu.*' > "$OUT/distributed-tests.log" 2>&1
  note dist-tests "rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/distributed-tests.log" | tr '\n' ' ') $(grep -c '^\[  SKIPPED' "$OUT/distributed-tests.log") skipped"
  PYTHONPATH=$PWD/$BUILD/python:$PWD/python timeout 300 torchrun --nproc_per_node="$ngpu" \
    examples/python/distributed_dsd.py > "$OUT/distributed-example.log" 2>&1
  note dist-example "rc=$? ($ngpu ranks)"
  PYTHONPATH=$PWD/$BUILD/python:$PWD/python timeout 300 torchrun --nproc_per_node="$ngpu" \
    examples/python/context_parallel_attention.py > "$OUT/cp-example.log" 2>&1
  note cp-example "rc=$? ($ngpu ranks)"
  timeout 600 $B/sparsek_distributed_bench > "$OUT/distributed-bench.txt" 2>&1
  note dist-bench "rc=$? (distributed-bench.txt)"
  timeout 600 $B/sparsek_distributed_bench --op attention --s 262144 --reps 3 >> "$OUT/distributed-bench.txt" 2>&1
  note cp-bench "rc=$? (distributed-bench.txt)"
fi

echo
[ -f "$OUT/distributed-bench.txt" ] && want distributed && cat "$OUT/distributed-bench.txt"
[ -f "$OUT/bench.txt" ] && want bench && tail -60 "$OUT/bench.txt"
[ -f "$OUT/products.txt" ] && want products && grep -E '^(###|==)|^ +(hopper|portable|cublas|cusparse)' "$OUT/products.txt"
# (the attention results are printed here, before they are packed into logs.tgz)
[ -f "$OUT/attention-time.txt" ] && want attention && cat "$OUT/attention-check.txt" "$OUT/attention-time.txt"
[ -f "$OUT/attention-bwd-time.txt" ] && want attention-bwd && cat "$OUT/attention-bwd-check.txt" "$OUT/attention-bwd-time.txt"

# The device tool brings back at most 8 files: keep the results loose, pack everything else.
(cd "$OUT" && pack=$(ls | grep -v -x -F -e bench.json -e bench.txt -e gate.txt -e gate.json -e profile.txt \
   -e torch_peers.json -e products.txt -e logs.tgz) && [ -n "$pack" ] && tar czf logs.tgz $pack && rm -f $pack)

echo "== gpu-check on: $gpu"
printf '%s\n' "${summary[@]}"
