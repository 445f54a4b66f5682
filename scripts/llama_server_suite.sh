#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of the pinned tree in vendor/llama.cpp)
# against stock llama-server built from the same tree and against `cacheflow serve`, both on the
# default model; prints the comparison (scripts/llama_server_suite/compare.py). Fetches nothing:
# the suite's --hf-repo/--hf-file become -m <default model> (llama_server_suite/server_wrapper.sh)
# and its download fixture is a no-op (llama_server_suite/suite_plugin.py).
#
#   scripts/llama_server_suite.sh            # both halves, then the comparison
#   scripts/llama_server_suite.sh cacheflow  # CacheFlow only, against the committed list of
#                                            # tests stock passes (stock_passed.txt): CI
#   scripts/llama_server_suite.sh stock      # stock only; rewrites stock_passed.txt
#
# Environment: MODEL (default: `cacheflow model path`), OUT (results/tmp/llama_server_suite),
# BUILD (the CMake build folder; default: the one `pip install .` made, build/cp3*, else build/dev), PORT (18380), TEST_TIMEOUT (s per test, 300),
# SUITE_FILES (the test files). Needs: the model pulled, the tree fetched (by a build), and
# pytest, requests, openai, numpy, prometheus_client, filelock, pytest-timeout in the Python env.
# Exit status: that of compare.py (1 when a test stock passes fails against CacheFlow and is not
# listed with its reason in llama_server_suite/known_failures.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
HERE=$ROOT/scripts/llama_server_suite
MODE=${1:-both}
TESTS=$ROOT/vendor/llama.cpp/tools/server/tests
OUT=$(mkdir -p "${OUT:-results/tmp/llama_server_suite}" && cd "${OUT:-results/tmp/llama_server_suite}" && pwd)
BUILD=${BUILD:-$(ls -d build/cp3*/ 2>/dev/null | head -1)}
BUILD=${BUILD:-build/dev}
BUILD=${BUILD%/}
MODEL=${MODEL:-$(cacheflow model path)}
SUITE_FILES=${SUITE_FILES:-"test_basic.py test_tokenize.py test_security.py test_completion.py
  test_chat_completion.py test_ignore_eos.py test_ctx_shift.py test_metrics.py"}
[ -d "$TESTS" ] || { echo "error: $TESTS missing (build CacheFlow first: it fetches the tree)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "error: model $MODEL missing (cacheflow model pull)" >&2; exit 2; }

run_half() {  # name, server command
  local name=$1 server=$2 files=()
  for f in $SUITE_FILES; do files+=("unit/$f"); done
  echo "== $name: $server" >&2
  (cd "$TESTS" && SUITE_SERVER="$server" SUITE_MODEL="$MODEL" SUITE_RESULTS="$OUT/$name.txt" \
    LLAMA_SERVER_BIN_PATH="$HERE/server_wrapper.sh" PORT="${PORT:-18380}" \
    PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" \
    python -m pytest -p suite_plugin -p no:cacheprovider -q -rN --timeout "${TEST_TIMEOUT:-300}" \
      "${files[@]}" > "$OUT/$name.log" 2>&1) || true
  tail -1 "$OUT/$name.log" >&2
}

if [ "$MODE" = stock ] || [ "$MODE" = both ]; then
  cmake --build "$BUILD" --target llama-server > "$OUT/build_llama_server.log" 2>&1 \
    || { echo "error: building llama-server failed (see $OUT/build_llama_server.log)" >&2; exit 2; }
  run_half stock "$(find "$ROOT/$BUILD" -name llama-server -type f -perm -u+x | head -1)"
fi
if [ "$MODE" = stock ]; then
  python "$HERE/compare.py" --stock "$OUT/stock.txt" --cacheflow "$OUT/stock.txt" \
    --write-stock-passed "$HERE/stock_passed.txt" > /dev/null || true
  echo "wrote $HERE/stock_passed.txt ($(wc -l < "$HERE/stock_passed.txt") tests)"
  exit 0
fi
run_half cacheflow "$(command -v cacheflow) serve"
if [ "$MODE" = both ]; then
  exec python "$HERE/compare.py" --stock "$OUT/stock.txt" --cacheflow "$OUT/cacheflow.txt" \
    --known "$HERE/known_failures.txt"
fi
exec python "$HERE/compare.py" --stock-passed "$HERE/stock_passed.txt" \
  --cacheflow "$OUT/cacheflow.txt" --known "$HERE/known_failures.txt"
