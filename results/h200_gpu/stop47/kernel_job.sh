#!/usr/bin/env bash
# Stop 47's second device call (no CUDA build: nvcc of the standalone paged attention test only). The two-pass
# kernel's L2 prefetch (PagedL2Prefetch: none, V, K and V; bit-identical, asserted by the correctness part), and a
# register bound of 8 CTAs per SM (-DCF_PA_MIN_CTAS=8), on the decode shapes of test_paged_attention_cuda.cu.
# Results under /tmp/res; the last line of /tmp/res/run.log is "[time] exit <rc>" (scripts/device_poll.sh waits for it).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
log() { echo "[$(date +%T)] $*" >> /tmp/res/run.log; }
trap 'log "exit $?"' EXIT
build() {  # $1: binary, then extra nvcc flags
  local bin=$1; shift
  nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math "$@" -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
      native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o "$bin"
}
log "nvcc (default, and -DCF_PA_MIN_CTAS=8)"
build /tmp/tpa > /tmp/res/nvcc.log 2>&1 &
build /tmp/tpa8 -DCF_PA_MIN_CTAS=8 > /tmp/res/nvcc8.log 2>&1 &
wait
log "correctness + bench: default, l2_v, l2_kv"
CF_BENCH_L2_ONLY=1 /tmp/tpa --bench > /tmp/res/kernel_bench_l2.txt 2>&1; log "exit of the first: $?"
grep -E "bench decode|issue 11|PASS|FAIL|failed" /tmp/res/kernel_bench_l2.txt >> /tmp/res/run.log
log "CF_PA_MIN_CTAS=8: bench long"
CF_BENCH_L2_ONLY=1 /tmp/tpa8 --bench long > /tmp/res/kernel_bench_l2_min8.txt 2>&1; log "exit of the second: $?"
grep -E "bench decode|issue 11|PASS|FAIL|failed" /tmp/res/kernel_bench_l2_min8.txt >> /tmp/res/run.log
