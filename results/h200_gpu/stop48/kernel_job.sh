#!/usr/bin/env bash
# Stop 48's device call, slimmed to the standalone paged attention test when the failed machine starts of the stop had
# left 13 minutes of device time (job.sh, the whole run with the CUDA build, did not fit). Three binaries built on the
# lead's machine with the device's nvcc (CUDA 13.0, sm_90) and carried in _carry/bin (carry: ["_carry/bin"]):
#   tpa       this tree (the default two-pass kernel, the combine kernel of stop 48);
#   tpa_old   stop 47's commit 696ac35 (the combine kernel that waited on one split state at a time);
#   tpa_l1024 this tree with -DCF_PA_LONG_SPLIT=1024 in paged_attention.cu (1,024-key splits for rows over 4,096 keys).
# 1. tpa: every correctness test (narrow8 as a load shape of its own, long rows to 20,000 keys) and the decode bench
#    of the default, narrow and narrow8 (CF_BENCH_NARROW8);
# 2. the long decode shapes (>= 8K), default loads, timings only: tpa_old, tpa, tpa_l1024 in turn, twice, with
#    tpa_l1024's correctness tests between the rounds.
# Results under /tmp/res (scripts/device_poll.sh); last line of /tmp/res/run.log "[time] exit 0".
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
B=_carry/bin
chmod +x $B/* 2>/dev/null
say "tpa: tests + CF_BENCH_NARROW8 bench"
CF_BENCH_NARROW8=1 $B/tpa --bench > /tmp/res/k/kernel_bench_narrow8.txt 2>&1
echo "rc $?" >> /tmp/res/k/kernel_bench_narrow8.txt
grep -E "bench decode|issue 11|PASS|FAIL|failed|^rc" /tmp/res/k/kernel_bench_narrow8.txt \
    | sed 's/heads 32\/8 //' | cut -c1-170 >> /tmp/res/run.log
ab() {
  for bin in tpa_old tpa tpa_l1024; do
    say "A/B round $1: $bin --bench long (default loads)"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "$B/$bin" --bench long > "/tmp/res/k/long_${bin}_$1.txt" 2>&1
    grep -E "bench decode|copy" "/tmp/res/k/long_${bin}_$1.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
}
ab 1
say "tpa_l1024: tests"
$B/tpa_l1024 > /tmp/res/k/tests_l1024.txt 2>&1
echo "rc $?" >> /tmp/res/k/tests_l1024.txt
grep -E "ctx<=20000 two_pass |PASS|FAIL|failed|^rc" /tmp/res/k/tests_l1024.txt | cut -c1-170 >> /tmp/res/run.log
ab 2
say "exit 0"
