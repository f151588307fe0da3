#!/usr/bin/env bash
# Tile-configuration experiments for the portable kernel (docs/history/products.md): builds
# bench/portable_timing.cu against copies of src/kernels/sm80/portable_*.cu(h) whose Config<BM> rows
# (portable_config.cuh) are replaced, then times each copy on the workloads it changes. Each copy is compiled here (it is
# made here), linked with the build's libsparsek_internal.a and libsparsek_timing.a (the timing the
# CMake-built timers use). Run from the repository root after building them
# (cmake --build BUILD_DIR --target portable_timing):
#   bench/portable_configs.sh BUILD_DIR OUT_DIR [reps] [build-only]
set -uo pipefail
SRC=src/kernels/sm80
B=${1:-build}
O=${2:-/tmp/portable-configs}
REPS=${3:-20}
mkdir -p "$O"
GENCODE=${GENCODE:-90a}

# variant NAME WORKLOADS "BM=row" ...   row: the new body of Config<BM>'s constants
variant() {
  local name=$1 filter=$2
  shift 2
  local args=()
  for kv in "$@"; do
    args+=(-e "/^struct Config<${kv%%=*}> {/,/^};/ s/static constexpr int .*;/static constexpr int ${kv#*=};/")
  done
  # The copy's headers are found first (-I$O/$name before -Isrc): its portable_sm80.cu includes them
  # as "kernels/sm80/...".
  local d="$O/$name/kernels/sm80"
  mkdir -p "$d"
  if [ ${#args[@]} -gt 0 ]; then sed "${args[@]}" "$SRC/portable_config.cuh" > "$d/portable_config.cuh"
  else cp "$SRC/portable_config.cuh" "$d/"; fi
  cp "$SRC/portable_kernel.cuh" "$d/"
  sed -e 's/portable_variants()/portable_variants_exp()/' "$SRC/portable_sm80.cu" > "$d/portable_sm80.cu"
  echo "$filter" > "$O/$name.filter"
  nvcc -O3 -std=c++17 -gencode=arch=compute_$GENCODE,code=sm_$GENCODE --expt-relaxed-constexpr \
    -Xptxas=-v,--warn-on-spills -DPORTABLE_SRC="\"$d/portable_sm80.cu\"" bench/portable_timing.cu -I"$O/$name" \
    -Iinclude -Isrc -Itools/sparsek -L"$B" -lsparsek_timing -lsparsek_internal -lcublasLt -lcublas -lcusparse -lgomp \
    -o "$O/$name" > "$O/$name.build.log" 2>&1 || echo "$name: BUILD FAILED"
}

W128="128x"
WSMALL="64x64,32x32,16x16"
# base: the source as it is (chosen from this list on an H100, docs/history/products.md); the others
# replace one or more Config<BM> rows.
variant base "$W128,$WSMALL" &
variant kc32s4 "$W128" "128=BN = 128, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2" &
variant kc32s3 "$W128" "128=BN = 128, WARPS_M = 2, KC = 32, STAGES = 3, IDX_CAP = 1024, MIN_CTAS = 2" &
variant kc32s5 "$W128" "128=BN = 128, WARPS_M = 2, KC = 32, STAGES = 5, IDX_CAP = 1024, MIN_CTAS = 2" &
variant bn256 "$W128" "128=BN = 256, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 256, MIN_CTAS = 1" &
variant bn256s3 "$W128" "128=BN = 256, WARPS_M = 2, KC = 32, STAGES = 3, IDX_CAP = 1024, MIN_CTAS = 1" &
variant small_bn128 "$WSMALL" "64=BN = 128, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2" \
  "32=BN = 128, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2" \
  "16=BN = 128, WARPS_M = 1, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2" &
variant m64_bn256_1 "64x64" "64=BN = 256, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 1" &
variant small_kc64 "$WSMALL" "64=BN = 128, WARPS_M = 2, KC = 64, STAGES = 3, IDX_CAP = 1024, MIN_CTAS = 2" \
  "32=BN = 128, WARPS_M = 2, KC = 64, STAGES = 3, IDX_CAP = 1024, MIN_CTAS = 2" \
  "16=BN = 128, WARPS_M = 1, KC = 64, STAGES = 3, IDX_CAP = 1024, MIN_CTAS = 2" &
wait
[ "${4:-}" = build-only ] && exit 0
for f in "$O"/*.filter; do
  name=$(basename "$f" .filter)
  [ -x "$O/$name" ] || continue
  echo "== $name"
  LD_LIBRARY_PATH="$B" timeout 120 "$O/$name" "$REPS" "$(cat "$f")" | grep -v '^device' | sed "s/^RESULT|/RESULT|$name|/"
done
