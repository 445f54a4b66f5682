#!/usr/bin/env bash
# serve --data-parallel 2 on the CPU: `cacheflow bench serve --dataset shared-prefix` against the
# router with each --router-policy in turn (results/router/README.md). Run from the checkout:
#   scripts/bench_router.sh [MODEL] [OUT_DIR]
set -euo pipefail
MODEL=${1:-$HOME/.cache/cacheflow/models/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${2:-results/router}
PORT=${PORT:-18555}
RATE=${RATE:-2}  # requests per second
NUM=${NUM:-40}  # requests per policy
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
for policy in prefix round-robin; do
  python -m cli serve -m "$MODEL" -dp 2 -np 8 -c 8192 --router-policy "$policy" \
    --port "$PORT" 2> "$OUT/serve_$policy.log" &
  pid=$!
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    kill -0 "$pid" 2> /dev/null || { cat "$OUT/serve_$policy.log"; exit 1; }
    sleep 0.5
  done
  echo "[$policy] before: $(uptime)" | tee -a "$OUT/uptime.txt"
  python -m cli bench serve "http://127.0.0.1:$PORT" -m "$MODEL" --dataset shared-prefix \
    -n "$NUM" -p 512 -o 32 --request-rate "$RATE" --endpoint /v1/completions --no-client-check \
    --out "$OUT/$policy" | tee "$OUT/bench_$policy.txt"
  curl -s "http://127.0.0.1:$PORT/router" > "$OUT/router_$policy.json"
  echo "[$policy] after:  $(uptime)" | tee -a "$OUT/uptime.txt"
  kill -TERM "$pid"
  wait "$pid"
done
