#!/usr/bin/env bash
# Stop 49's device call: stop 48's job_next.sh with the two-splits-per-CTA binary's correctness tests run while the
# CUDA build compiles (they time nothing), so that the whole call fits the device time. scripts/device_poll.sh; results
# under /tmp/res, last line of /tmp/res/run.log "[time] exit 0"; carry ["_carry/llama.cpp", "_carry/tokenizer.gguf",
# "_carry/wheels"]. Order: build || (nvcc tpa, tpa_s2; tpa_s2 tests); then timings alone: tpa vs tpa_s2 --bench
# (default loads) alternating twice; the engine's decode (B=256 and 64 at 128/128, B=8 at 8K; the default kernels
# against CACHEFLOW_PA_LOADS=narrow, each row against its own llama-batched-bench); last the whole GPU suite.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
say "start"
mkdir -p /tmp/res/k
tpa() {  # the standalone paged attention test: $1 binary, then extra nvcc flags
  local bin=$1; shift
  nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math "$@" -I native/src/kernels/cuda \
      native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
      native/tests/cuda/test_paged_attention_cuda.cu -o "$bin" \
      > "/tmp/res/k/nvcc_$(basename "$bin").log" 2>&1
}
tpa /tmp/tpa &
(tpa /tmp/tpa_s2 -DCF_PA_SPLITS_PER_CTA=2 && /tmp/tpa_s2 > /tmp/res/k/tests_s2.txt 2>&1; \
    echo "rc $?" >> /tmp/res/k/tests_s2.txt) &
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
wait
say "tpa_s2 (two splits per CTA): tests, run during the build"
grep -E "PASS|FAIL|failed|^rc" /tmp/res/k/tests_s2.txt | cut -c1-170 >> /tmp/res/run.log
for round in 1 2; do
  for bin in tpa tpa_s2; do
    say "splits per CTA A/B round $round: $bin --bench (default loads, timings only)"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "/tmp/$bin" --bench > "/tmp/res/k/bench_${bin}_$round.txt" 2>&1
    grep -E "bench decode|copy" "/tmp/res/k/bench_${bin}_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
done
say "tpa --bench long, CF_BENCH_HEADS_ONLY (the default against group / one head per CTA at >= 8K)"
CF_BENCH_SKIP_TESTS=1 CF_BENCH_HEADS_ONLY=1 /tmp/tpa --bench long > /tmp/res/k/bench_heads_long.txt 2>&1
grep -E "bench decode" /tmp/res/k/bench_heads_long.txt | sed 's/heads 32\/8 //' | cut -c1-150 >> /tmp/res/run.log
# Where a long row's layer time goes: ncu's duration of each kernel (split kernel, combine kernel) of the 21st call
# (after the 20 warm-up calls), L2 flushed between kernels (ncu's default cache control), clocks left alone.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for shape in 1,8192,64 8,8192,64 32,8192,64 1,32768,64 4,32768,64; do
  for bin in tpa tpa_s2; do
    say "ncu $bin $shape"
    CF_BENCH_ONLY=$shape CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 timeout 90 "$NCU" --clock-control none \
        --metrics gpu__time_duration.sum --launch-skip 40 --launch-count 2 "/tmp/$bin" --bench long \
        > "/tmp/res/k/ncu_${bin}_${shape//,/_}.txt" 2>&1
    grep -E "^  [a-z_].*\(|gpu__time_duration" "/tmp/res/k/ncu_${bin}_${shape//,/_}.txt" | cut -c1-250 \
        >> /tmp/res/run.log
  done
done
OUT=/tmp/res/d STAGES="decode" NPL="256 64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/d8 STAGES="decode" NPP=8192 NPL="8" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d8/run.log >> /tmp/res/run.log
OUT=/tmp/res/t STAGES="tests" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
say "exit 0"
