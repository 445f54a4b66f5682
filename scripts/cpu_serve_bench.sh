#!/usr/bin/env bash
# CPU serving comparison on the default model, same command: `cacheflow serve` vs llama-server
# built from the same pinned tree (persistent build folder), both with -np $NP and -c $NP x 2048
# (room for any ShareGPT request), loaded by `cacheflow bench serve`.
#   DATASET=random (default): N requests of 128 prompt / 64 output tokens, $NP in flight.
#   DATASET=sharegpt RATES="0.25 0.5 1": N ShareGPT requests (reply lengths as output budgets)
#     per Poisson request rate, one results folder per rate ($OUT/rate_<r>).
# Results: $OUT (default results/cpu_serve).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/cpu_serve}
NP=${NP:-8}
N=${N:-32}
DATASET=${DATASET:-random}
mkdir -p "$OUT"
BUILD=$(ls -d build/*/ | head -1)
cmake --build "$BUILD" --target llama-server -j "$(nproc)" > "$OUT/build_tools.log" 2>&1
SERVER_BIN=$(find "$BUILD" -name llama-server -type f | head -1)
MODEL=$(cacheflow model path)
CTX=$((NP * 2048))
"$SERVER_BIN" -m "$MODEL" -np "$NP" -c "$CTX" -t "$(nproc)" --port 8091 --host 127.0.0.1 \
    > "$OUT/llama_server.log" 2>&1 &
LS_PID=$!
cacheflow serve -m "$MODEL" -np "$NP" -c "$CTX" -t "$(nproc)" --port 8092 --host 127.0.0.1 \
    > "$OUT/cacheflow_serve.log" 2>&1 &
CF_PID=$!
trap 'kill $LS_PID $CF_PID 2>/dev/null || true' EXIT
for port in 8091 8092; do
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 1
  done
done
# The servers run one at a time under load (the other idles), so they do not share the cores.
if [ -z "${RATES:-}" ]; then
  cacheflow bench serve http://127.0.0.1:8092 --baseline http://127.0.0.1:8091 -m "$MODEL" \
      --dataset "$DATASET" -n "$N" -p 128 -o 64 --max-concurrency "$NP" --out "$OUT" 2>&1 \
      | grep -v "req/s\]" | tail -12
  exit 0
fi
for rate in $RATES; do
  echo "== request rate $rate/s"
  cacheflow bench serve http://127.0.0.1:8092 --baseline http://127.0.0.1:8091 -m "$MODEL" \
      --dataset "$DATASET" -n "$N" --request-rate "$rate" --out "$OUT/rate_$rate" 2>&1 \
      | grep -v "req/s\]" | tail -12
done
