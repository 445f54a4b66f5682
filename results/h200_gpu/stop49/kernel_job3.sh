#!/usr/bin/env bash
# Stop 49's last device call, with ~260 s of device time left (a machine's start takes ~200 of them): kernel_job2.sh cut
# to one round: tpa_c then tpa --bench long (default loads, timings only), then tpa_c's correctness tests for as long
# as the call lasts (their output so far comes back). carry ["_carry/bin"]; run directly, no device_poll.sh.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p "$OUT/k"
B=_carry/bin
chmod +x $B/* 2>/dev/null
for bin in tpa_c tpa; do
  echo "[$(date +%H:%M:%S)] $bin --bench long"
  CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "$B/$bin" --bench long > "$OUT/k/long_${bin}.txt" 2>&1
  grep -E "bench decode|copy" "$OUT/k/long_${bin}.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' | cut -c1-120
done
echo "[$(date +%H:%M:%S)] tpa_c tests"
stdbuf -oL "$B/tpa_c" > "$OUT/k/tests_c.txt" 2>&1
echo "rc $?" >> "$OUT/k/tests_c.txt"
