#!/usr/bin/env bash
# The "server binary" llama.cpp's server tests start (LLAMA_SERVER_BIN_PATH): runs
# $SUITE_SERVER (stock llama-server, or `cacheflow serve`) with the suite's flags, except that
# --hf-repo/--hf-file (-hf/-hfr/-hff) become `-m $SUITE_MODEL`, so that both servers run the
# same local model and nothing is downloaded. Every other flag passes through unchanged.
set -euo pipefail
args=()
hf=0
while [ $# -gt 0 ]; do
  case "$1" in
    -hf|-hfr|--hf-repo|-hff|--hf-file) hf=1; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ "$hf" = 1 ]; then
  args+=(-m "$SUITE_MODEL")
fi
# shellcheck disable=SC2086  # SUITE_SERVER may be a command with arguments ("cacheflow serve")
exec $SUITE_SERVER "${args[@]}"
