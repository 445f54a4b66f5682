#!/usr/bin/env bash
# Prefix cache benchmark on the CPU (issue 14): a shared-prefix workload (a ~1,000-token system
# prompt + a ~20-token question each, 64 requests, 8 in flight, closed loop) through CacheFlow with
# its prefix cache on and off (the no-prefix-cache baseline: the same engine with
# enable_prefix_caching=False), same process, same requests. Prints and writes TTFT p50/p99,
# throughput and the hit rate in tokens (results/prefix_cache/latency_summary.json and CSVs).
#
#   scripts/bench_prefix_cache.sh            # defaults below
#   N=64 C=8 P=1000 O=32 OUT=results/prefix_cache scripts/bench_prefix_cache.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/prefix_cache}
exec cacheflow bench latency --dataset shared-prefix -p "${P:-1000}" -o "${O:-32}" -n "${N:-64}" \
  -c "${C:-8}" -i "${I:-1}" --threads "${THREADS:-0}" --baseline no-prefix-cache --out "$OUT"
