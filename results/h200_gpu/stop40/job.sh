#!/usr/bin/env bash
# Stop 40's second device run (one job, started by scripts/device_poll.sh, results under /tmp/res):
# the standalone paged attention test and its two-pass bench (PagedHeads: one query head per CTA against the whole
# GQA group) beside the CUDA build, then GPU tests and the decode table with the head placements as A/B.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
(
  nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
      native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa \
      > /tmp/res/kernel_nvcc.log 2>&1 || exit 1
  /tmp/tpa > /tmp/res/kernel_test.txt 2>&1; echo "exit $?" >> /tmp/res/kernel_test.txt
  CF_BENCH_TWO_PASS_ONLY=1 /tmp/tpa --bench short > /tmp/res/kernel_bench_short.txt 2>&1
  echo "exit $?" >> /tmp/res/kernel_bench_short.txt
) &
kernel_job=$!
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
wait "$kernel_job"
OUT=/tmp/res STAGES="${STAGES2:-tests decode}" GPU_TESTS_K="${GPU_TESTS_K:-embedding or runs_on_the_gpu}" \
    NPL="${NPL:-1 8 64 256}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_PA_HEADS=group}" \
    bash scripts/h200_gpu_tests.sh
