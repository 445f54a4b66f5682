#!/usr/bin/env bash
# Stop 47's third device call: the two-pass split kernel with a register bound of 8 CTAs per SM (-DCF_PA_MIN_CTAS=8,
# 64 registers at D 64) against the default (70 registers, 7 CTAs), alternating binaries twice on every decode shape
# of test_paged_attention_cuda.cu --bench (timings only: CF_BENCH_SKIP_TESTS, CF_BENCH_DEFAULT_ONLY), so that the
# difference can be told from run-to-run noise. Results under /tmp/res; last line "[time] exit <rc>".
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
for round in 1 2; do
  for bin in tpa tpa8; do
    log "round $round: $bin"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "/tmp/$bin" --bench > "/tmp/res/bench_${bin}_$round.txt" 2>&1
    grep -E "bench decode" "/tmp/res/bench_${bin}_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
done
