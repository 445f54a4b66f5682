#!/usr/bin/env bash
# Stop 49's second device call (slim: the device time left could not hold a CUDA build): two standalone paged attention
# test binaries built on the lead's machine (nvcc 13.0, sm_90), carried in _carry/bin (carry ["_carry/bin"]):
#   tpa    the tree of run1 (stop 48's combine kernel);
#   tpa_c  the combine kernel staged in rounds of whole splits through shared memory (this stop).
# 1. timings alone, default loads: tpa vs tpa_c --bench long, alternating twice; ncu's per-kernel durations of tpa_c
#    on the long shapes (run1 has tpa's);
# 2. tpa_c's correctness tests (every shape and variant; last, since they take ~3 minutes).
# scripts/device_poll.sh; last line of /tmp/res/run.log "[time] exit 0".
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
B=_carry/bin
chmod +x $B/* 2>/dev/null
for round in 1 2; do
  for bin in tpa tpa_c; do
    say "combine A/B round $round: $bin --bench long (default loads, timings only)"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "$B/$bin" --bench long > "/tmp/res/k/long_${bin}_$round.txt" 2>&1
    grep -E "bench decode|copy" "/tmp/res/k/long_${bin}_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for shape in 1,8192,64 8,8192,64 1,32768,64 4,32768,64; do
  say "ncu tpa_c $shape"
  CF_BENCH_ONLY=$shape CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 timeout 60 "$NCU" --clock-control none \
      --metrics gpu__time_duration.sum --launch-skip 40 --launch-count 2 "$B/tpa_c" --bench long \
      > "/tmp/res/k/ncu_tpa_c_${shape//,/_}.txt" 2>&1
  grep -E "^  [a-z_].*\(|gpu__time_duration" "/tmp/res/k/ncu_tpa_c_${shape//,/_}.txt" | cut -c1-120 >> /tmp/res/run.log
done
say "tpa_c: tests"
$B/tpa_c > /tmp/res/k/tests_c.txt 2>&1
echo "rc $?" >> /tmp/res/k/tests_c.txt
grep -E "PASS|FAIL|failed|^rc" /tmp/res/k/tests_c.txt | cut -c1-170 >> /tmp/res/run.log
say "exit 0"
