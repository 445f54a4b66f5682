#!/usr/bin/env bash
# Stop 50, kernel-only fallback for job.sh once device time no longer covered the CUDA build (959 s left after nine
# calls that found no machine): the standalone test binaries built here and carried (carry ["_carry/bin50"], ~20 MB):
# tpa_c = native/src/kernels/cuda + native/tests/cuda/test_paged_attention_cuda.cu of the commit that last changed
# this line's neighbours ("last-CTA merge: review fixes"), tpa = commit 32038b8's with stop 48's two-pass header
# (_carry/old48); nvcc 13.0 -arch=sm_90 -O3 --use_fast_math, stripped. Run with scripts/device_poll.sh; results under /tmp/res, last line "[time] exit 0".
# Order (494 s of device time left, so what matters most first): 1. the combine kernel against the last-CTA merge on
# every decode shape (CF_BENCH_LAST_CTA); 2. tpa_c's correctness tests (every two-pass variant including the last-CTA
# merge, D 64/128/256, long rows, prefill); then a second round of 1;
# 3. ncu's per-kernel durations at the long shapes with either merge; 4. tpa vs tpa_c --bench (the staged combine
# of stop 49 against stop 48's).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
strip_line() { sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' | cut -c1-150; }
say "start: $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader)"
B=_carry/bin50
chmod +x $B/tpa $B/tpa_c
last_cta_round() {
  say "round $1: tpa_c --bench, the combine kernel against the last-CTA merge (CF_BENCH_LAST_CTA, same binary)"
  CF_BENCH_LAST_CTA=1 CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 $B/tpa_c --bench \
      > "/tmp/res/k/bench_last_cta_$1.txt" 2>&1
  grep -E "bench decode|copy|FAIL" "/tmp/res/k/bench_last_cta_$1.txt" | strip_line >> /tmp/res/run.log
}
last_cta_round 1  # first: its lines also check the merge's outputs against the combine kernel's and the graph's bits
$B/tpa_c > /tmp/res/k/tests_c.txt 2>&1
echo "rc $?" >> /tmp/res/k/tests_c.txt
say "tpa_c: tests"
grep -cE "max \|err\|" /tmp/res/k/tests_c.txt | sed 's/^/result lines: /' >> /tmp/res/run.log
grep -E "FAIL|failed|differ|^rc" /tmp/res/k/tests_c.txt | cut -c1-170 | head -20 >> /tmp/res/run.log
grep -E "last_cta" /tmp/res/k/tests_c.txt | cut -c1-120 | head -8 >> /tmp/res/run.log
last_cta_round 2
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for shape in 1,8192,64 8,8192,64 1,32768,64 4,32768,64; do
  for comb in kernel last_cta; do
    say "ncu tpa_c $shape CACHEFLOW_PA_COMBINE=$comb"
    CACHEFLOW_PA_COMBINE=$comb CF_BENCH_ONLY=$shape CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 timeout 60 "$NCU" \
        --clock-control none --metrics gpu__time_duration.sum --launch-skip 40 --launch-count 2 $B/tpa_c \
        --bench long > "/tmp/res/k/ncu_tpa_c_${shape//,/_}_$comb.txt" 2>&1
    grep -E "^  [a-z_].*\(|gpu__time_duration" "/tmp/res/k/ncu_tpa_c_${shape//,/_}_$comb.txt" | cut -c1-120 \
        >> /tmp/res/run.log
  done
done
for bin in tpa tpa_c; do
  say "staged combine A/B: $bin --bench (default loads, timings only)"
  CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 $B/$bin --bench > "/tmp/res/k/bench_${bin}.txt" 2>&1
  grep -E "bench decode|copy" "/tmp/res/k/bench_${bin}.txt" | strip_line >> /tmp/res/run.log
done
say "exit 0"
