#!/usr/bin/env bash
# Prefix caching through the HTTP servers (issue 14), CPU, the default model, one command:
# `cacheflow serve` with its prefix cache on, the same with --no-cache-prompt (cache off), and
# stock llama-server built from the same patched tree (cache_prompt on, its default), all three
# with -np $NP and -c $NP x 2048, loaded one at a time by `cacheflow bench serve` (the other two
# idle), on two workloads:
#   shared-prefix: a ~$P-token system prompt + a short question each, $N requests, $NP in flight;
#   multi-turn:    $CONVS conversations of $TURNS turns ($MT_P-token system prompt, $USER_LEN-token
#                  user messages, $MT_O-token replies), $NP conversations in flight, each turn
#                  resending the conversation so far with the server's own replies.
# Every request asks for cache_prompt; the hit rate is the servers' own count (usage
# prompt_tokens_details.cached_tokens). Runs from this checkout (python -m cli, the library in
# $BUILD), never an installed cacheflow. Results: $OUT/{shared_prefix,multi_turn}/serve_*.{csv,json},
# $OUT/uptime.txt (machine load before and after), the servers' logs.
#
#   scripts/bench_prefix_cache_serve.sh
#   NP=8 N=64 P=1000 O=32 CONVS=16 TURNS=4 OUT=results/prefix_cache/stop23 scripts/bench_prefix_cache_serve.sh
#   WORKLOADS=multi-turn OUT=/tmp/mt scripts/bench_prefix_cache_serve.sh   # one workload only
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/prefix_cache/stop23}
BUILD=${BUILD:-$(ls -d build/cp3*/ 2>/dev/null | head -1)}  # the folder `pip install .` made
BUILD=${BUILD:-build/dev}
BUILD=${BUILD%/}
NP=${NP:-8}
N=${N:-64}
P=${P:-1000}
O=${O:-32}
CONVS=${CONVS:-16}
TURNS=${TURNS:-4}
MT_P=${MT_P:-200}
MT_O=${MT_O:-64}
USER_LEN=${USER_LEN:-50}
THREADS=${THREADS:-$(nproc)}
WORKLOADS=${WORKLOADS:-shared-prefix multi-turn}  # either or both
export CACHEFLOW_LIB=${CACHEFLOW_LIB:-$PWD/$BUILD/libcacheflow.so}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
CF=(python -m cli)
mkdir -p "$OUT"
cmake --build "$BUILD" --target llama-server -j "${JOBS:-2}" > "$OUT/build_tools.log" 2>&1
SERVER_BIN=$(find "$BUILD" -name llama-server -type f | head -1)
MODEL=${MODEL:-$("${CF[@]}" model path)}
CTX=$((NP * 2048))
ON=http://127.0.0.1:8093 OFF=http://127.0.0.1:8094 STOCK=http://127.0.0.1:8095
{ echo "before: $(uptime)"; git log -1 --format='commit %h %s'; } > "$OUT/uptime.txt"

"${CF[@]}" serve -m "$MODEL" -np "$NP" -c "$CTX" -t "$THREADS" --host 127.0.0.1 --port 8093 \
    > "$OUT/cacheflow_cache_on.log" 2>&1 &
PIDS=($!)
"${CF[@]}" serve -m "$MODEL" -np "$NP" -c "$CTX" -t "$THREADS" --host 127.0.0.1 --port 8094 \
    --no-cache-prompt > "$OUT/cacheflow_cache_off.log" 2>&1 &
PIDS+=($!)
"$SERVER_BIN" -m "$MODEL" -np "$NP" -c "$CTX" -t "$THREADS" --host 127.0.0.1 --port 8095 \
    > "$OUT/llama_server.log" 2>&1 &
PIDS+=($!)
trap 'kill "${PIDS[@]}" 2>/dev/null || true' EXIT
for url in $ON $OFF $STOCK; do
  for _ in $(seq 1 180); do
    curl -sf "$url/health" > /dev/null && break
    sleep 1
  done
  # one short request each, so that no first-request warm-up lands in the measured runs
  curl -sf "$url/completion" -d '{"prompt": "Hello", "n_predict": 4}' > /dev/null
done

if [[ " $WORKLOADS " == *" shared-prefix "* ]]; then
echo "== shared-prefix: $N requests, ~$P-token system prompt, $O output tokens, $NP in flight"
"${CF[@]}" bench serve $ON --baseline $OFF --baseline $STOCK -m "$MODEL" --dataset shared-prefix \
    -n "$N" -p "$P" -o "$O" --max-concurrency "$NP" --cache-prompt --out "$OUT/shared_prefix" 2>&1 \
    | grep -v "req/s\]" | tail -8
fi
if [[ " $WORKLOADS " == *" multi-turn "* ]]; then
echo "== multi-turn: $CONVS conversations x $TURNS turns, ~$MT_P-token system prompt," \
     "$USER_LEN-token user messages, $MT_O-token replies, $NP conversations in flight"
"${CF[@]}" bench serve $ON --baseline $OFF --baseline $STOCK -m "$MODEL" --dataset multi-turn \
    -n "$CONVS" --turns "$TURNS" -p "$MT_P" --user-len "$USER_LEN" -o "$MT_O" \
    --max-concurrency "$NP" --cache-prompt --out "$OUT/multi_turn" 2>&1 | grep -v "req/s\]" | tail -8
fi
echo "after: $(uptime)" >> "$OUT/uptime.txt"
cat "$OUT/uptime.txt"
