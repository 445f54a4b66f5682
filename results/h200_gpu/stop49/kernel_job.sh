#!/usr/bin/env bash
# Stop 49's slim device call, for when the device time left cannot hold job.sh (its CUDA build alone takes ~7 min):
# the standalone paged attention test only, two binaries built on the lead's machine (nvcc 13.0, sm_90) and carried in
# _carry/bin (carry ["_carry/bin"]): tpa (this tree) and tpa_s2 (-DCF_PA_SPLITS_PER_CTA=2). tpa_s2's correctness tests,
# then timings alone: tpa vs tpa_s2 --bench long (default loads) alternating twice, the head placements at >= 8K, and
# ncu's per-kernel durations of the long shapes. scripts/device_poll.sh; last line of /tmp/res/run.log "[time] exit 0".
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
B=_carry/bin
chmod +x $B/* 2>/dev/null
say "tpa_s2 (two splits per CTA): tests"
$B/tpa_s2 > /tmp/res/k/tests_s2.txt 2>&1
echo "rc $?" >> /tmp/res/k/tests_s2.txt
grep -E "PASS|FAIL|failed|^rc" /tmp/res/k/tests_s2.txt | cut -c1-170 >> /tmp/res/run.log
for round in 1 2; do
  for bin in tpa tpa_s2; do
    say "splits per CTA A/B round $round: $bin --bench long (default loads, timings only)"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "$B/$bin" --bench long > "/tmp/res/k/long_${bin}_$round.txt" 2>&1
    grep -E "bench decode|copy" "/tmp/res/k/long_${bin}_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
done
say "tpa --bench long, CF_BENCH_HEADS_ONLY (the default against group / one head per CTA at >= 8K)"
CF_BENCH_SKIP_TESTS=1 CF_BENCH_HEADS_ONLY=1 $B/tpa --bench long > /tmp/res/k/bench_heads_long.txt 2>&1
grep -E "bench decode" /tmp/res/k/bench_heads_long.txt | sed 's/heads 32\/8 //' | cut -c1-150 >> /tmp/res/run.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for shape in 1,8192,64 8,8192,64 32,8192,64 1,32768,64 4,32768,64; do
  for bin in tpa tpa_s2; do
    say "ncu $bin $shape"
    CF_BENCH_ONLY=$shape CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 timeout 90 "$NCU" --clock-control none \
        --metrics gpu__time_duration.sum --launch-skip 40 --launch-count 2 "$B/$bin" --bench long \
        > "/tmp/res/k/ncu_${bin}_${shape//,/_}.txt" 2>&1
    grep -E "^  [a-z_].*\(|gpu__time_duration" "/tmp/res/k/ncu_${bin}_${shape//,/_}.txt" | cut -c1-250 \
        >> /tmp/res/run.log
  done
done
say "exit 0"
