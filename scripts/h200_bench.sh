#!/usr/bin/env bash
# One-command GPU run on the H200 (shared/GPU.md): CUDA build, a random-weight model of the
# Llama-3.2-1B shape, then CacheFlow vs stock llama.cpp side by side in the same command:
#   1. decode throughput: scripts/bench_decode.py vs llama-batched-bench (-npl 64, 128/128);
#   2. serving: `cacheflow bench serve` against `cacheflow serve` and llama-server, both -np 64,
#      $NREQ requests (default 4 x NP).
# Inputs travel in the git-ignored _carry/ folder: llama.cpp/ (the pinned tree, trimmed),
# wheels/ (cp312 wheels the machine lacks), tokenizer.gguf (SmolLM2's tokenizer, 49,152 tokens).
# Results go to $OUT (default results/h200).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/h200}
mkdir -p "$OUT"
NP=${NP:-64}
NREQ=${NREQ:-$((NP * 4))}  # serving requests (more = steadier numbers)
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/run.log" >&2; }

log "install wheels"
python -m pip install -q --no-deps --no-index --find-links _carry/wheels cffi pycparser starlette uvicorn \
    prometheus_client httpx httpcore h11 anyio sniffio idna certifi typing_extensions tqdm gguf pyyaml 2>&1 | tail -2 || true

log "build (CUDA)"
export CACHEFLOW_LLAMA_CPP_DIR=$PWD/_carry/llama.cpp CACHEFLOW_CUDA=ON
rm -rf vendor/llama.cpp  # the carried tree may have changed; copies keep mtimes, so no full rebuild
python -m pip install -q --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
BUILD=$(ls -d build/*/ | head -1)
cmake --build "$BUILD" --target llama-server llama-batched-bench -j 16 > "$OUT/build_tools.log" 2>&1
SERVER_BIN=$(find "$BUILD" -name llama-server -type f | head -1)
log "built: $BUILD $SERVER_BIN"

MODEL=/tmp/llama-1b-shape-f16.gguf
if [ ! -f "$MODEL" ]; then
  log "write random-weight model"
  python scripts/make_tiny_gguf.py "$MODEL" --tokenizer-from _carry/tokenizer.gguf --dtype f16 \
      --n-layer 16 --n-embd 2048 --n-head 32 --n-head-kv 8 --n-ff 8192 --n-ctx-train 131072 --seed 0
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee -a "$OUT/run.log"

log "decode: cacheflow vs llama-batched-bench, npl $NP"
timeout 200 python scripts/bench_decode.py -m "$MODEL" --npp 128 --ntg 128 --npl "$NP" -i 3 -t 8 \
    -ngl 99 --out "$OUT" 2>&1 | tail -25 | tee -a "$OUT/run.log" || log "decode bench failed"

if [ "${COMPARE_HOST_SAMPLING:-0}" = 1 ]; then
  log "decode again with host sampling (CACHEFLOW_HOST_SAMPLING=1): the in-graph sampling A/B"
  mkdir -p "$OUT/host_sampling"
  CACHEFLOW_HOST_SAMPLING=1 timeout 200 python scripts/bench_decode.py -m "$MODEL" --npp 128 \
      --ntg 128 --npl "$NP" -i 3 -t 8 -ngl 99 --out "$OUT/host_sampling" 2>&1 | tail -6 \
      | tee -a "$OUT/run.log" || log "decode bench (host sampling) failed"
fi

log "serve: cacheflow serve vs llama-server, -np $NP"
CTX=$((NP * 512))
"$SERVER_BIN" -m "$MODEL" -ngl 99 -np "$NP" -c "$CTX" -fa on --port 8081 --host 127.0.0.1 \
    > "$OUT/llama_server.log" 2>&1 &
LS_PID=$!
cacheflow serve -m "$MODEL" -ngl 99 -np "$NP" -c "$CTX" --kv-mode stock --port 8082 --host 127.0.0.1 \
    > "$OUT/cacheflow_serve.log" 2>&1 &
CF_PID=$!
trap 'kill $LS_PID $CF_PID 2>/dev/null || true' EXIT
for port in 8081 8082; do
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 1
  done
done
timeout 240 cacheflow bench serve http://127.0.0.1:8082 --baseline http://127.0.0.1:8081 \
    -m "$MODEL" -n "$NREQ" -p 128 -o 128 --max-concurrency "$NP" --client-check \
    --out "$OUT" 2>&1 | tail -30 | tee -a "$OUT/run.log" || log "serve bench failed"
log "done"
