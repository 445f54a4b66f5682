#!/usr/bin/env bash
# The CUDA paged attention kernels' build-time knobs side by side on the GPU machine: threads per CTA
# (head sizes <= 128) and K/V rows in flight per thread group (paged_attention_two_pass.cuh, CF_PA_THREADS and
# CF_PA_ROWS_IN_FLIGHT) and the split length of short rows (CF_PA_SHORT_SPLIT, 256 = every row splits
# at 256 keys, the kernel before short splits), plus any other -D flags (e.g. the warp-split kernel's
# CF_PA_WARP_ROUND_ROWS, CF_PA_WARP_MIN_CTAS, CF_PA_WARP_MIN_SPLIT, CF_PA_WARP_TARGET_SPLITS), each variant checked
# against the float64 reference and benchmarked on the decode shapes of native/tests/cuda/test_paged_attention_cuda.cu.
# Needs only nvcc (no full build).
# Usage: bash scripts/cuda_kernel_variants.sh ["THREADS ROWS [SHORT_SPLIT [-DKNOB=V ...]]" ...]
#   (default: 128/256 x 4/8, split 64). BENCH_ARGS: arguments of the test binary (default --bench).
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANTS=("$@")
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("128 4" "128 8" "256 4" "256 8")
i=0
for v in "${VARIANTS[@]}"; do
  set -- $v
  extra=("${@:4}")
  nvcc -std=c++17 -O3 --use_fast_math -arch=native -DCF_PA_THREADS="$1" -DCF_PA_ROWS_IN_FLIGHT="$2" -DCF_PA_SHORT_SPLIT="${3:-64}" \
      "${extra[@]}" -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
      native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o "/tmp/cf_pa_variant_$i" &
  i=$((i + 1))
done
wait
i=0
for v in "${VARIANTS[@]}"; do
  set -- $v
  echo "== threads $1, rows in flight $2, short split ${3:-64}${4:+, ${*:4}}"
  "/tmp/cf_pa_variant_$i" ${BENCH_ARGS:---bench} | grep -E "bench|PASS|FAIL|issue 11"
  i=$((i + 1))
done
