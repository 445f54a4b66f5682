#!/usr/bin/env bash
# Stop 40, when the device time left could not pay for a CUDA build: the standalone paged attention test (float64
# reference, bit-identical load shapes and head placements, batch invariance) and its two-pass bench on the short
# decode shapes (one query head per CTA against the whole GQA group). Results under /tmp/res; the last line of
# /tmp/res/run.log is "[time] exit <rc>" (what scripts/device_poll.sh waits for).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
log() { echo "[$(date +%T)] $*" >> /tmp/res/run.log; }
trap 'log "exit $?"' EXIT
log "nvcc test_paged_attention_cuda"
nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
    native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa \
    > /tmp/res/kernel_nvcc.log 2>&1 || exit 1
log "test (correctness)"
/tmp/tpa > /tmp/res/kernel_test.txt 2>&1; log "test exit $?"
log "bench short, head placements"
CF_BENCH_HEADS_ONLY=1 /tmp/tpa --bench short > /tmp/res/kernel_bench_short.txt 2>&1
