#!/usr/bin/env bash
# The CUDA paged attention kernel's tuning knobs side by side on the GPU machine: threads per CTA
# (head sizes <= 128) and K/V rows in flight per thread group (paged_attention.cu, CF_PA_THREADS and
# CF_PA_ROWS_IN_FLIGHT) and the split length of short rows (CF_PA_SHORT_SPLIT, 256 = every row splits
# at 256 keys, the kernel before short splits), each variant checked against the float64 reference and benchmarked on the
# decode shapes of native/tests/cuda/test_paged_attention_cuda.cu. Needs only nvcc (no full build).
# Usage: bash scripts/cuda_kernel_variants.sh ["THREADS ROWS [SHORT_SPLIT]" ...]   (default: 128/256 x 4/8, split 64)
set -euo pipefail
cd "$(dirname "$0")/.."
VARIANTS=("$@")
[ ${#VARIANTS[@]} -eq 0 ] && VARIANTS=("128 4" "128 8" "256 4" "256 8")
for v in "${VARIANTS[@]}"; do
  set -- $v
  nvcc -std=c++17 -O3 --use_fast_math -arch=native -DCF_PA_THREADS="$1" -DCF_PA_ROWS_IN_FLIGHT="$2" -DCF_PA_SHORT_SPLIT="${3:-64}" \
      -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
      native/tests/cuda/test_paged_attention_cuda.cu -o "/tmp/cf_pa_$1_$2_${3:-64}" &
done
wait
for v in "${VARIANTS[@]}"; do
  set -- $v
  echo "== threads $1, rows in flight $2, short split ${3:-64}"
  "/tmp/cf_pa_$1_$2_${3:-64}" --bench | grep -E "bench|PASS|FAIL"
done
