#!/usr/bin/env bash
# CacheFlow's CUDA paged-attention decode kernel next to FlashInfer's batch decode (issue 11), on the
# GPU machine: compiles native/tests/cuda/bench_flashinfer_decode.cu with FlashInfer's header-only
# kernels from _carry/flashinfer/include (scripts/prepare_gpu_carry.sh) and CacheFlow's
# native/src/kernels/cuda/paged_attention.cu, then runs it: plain launches (the method of
# `test_paged_attention_cuda --bench`), then the same replayed from CUDA graphs. Needs only nvcc (no
# full build). Writes $OUT/flashinfer_vs_cacheflow.txt (and its compile log); exit status 1 if a
# kernel failed the float64 check.
# Usage: OUT=results/h200_gpu bash scripts/bench_flashinfer_decode.sh [extra args for the binary]
#   ARCH (default native), FI_INCLUDE (default _carry/flashinfer/include), BIN (default /tmp/cf_fi_decode),
#   NVCC_FLAGS (more nvcc flags, e.g. -DCF_PA_THREADS=256 for a kernel variant); BUILD_ONLY=1: compile $BIN and stop
#   (for a caller that runs the binary itself, e.g. scripts/ncu_vs_flashinfer.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/h200_gpu}
ARCH=${ARCH:-native}
FI_INCLUDE=${FI_INCLUDE:-_carry/flashinfer/include}
BIN=${BIN:-/tmp/cf_fi_decode}
mkdir -p "$OUT"
if [ ! -f "$FI_INCLUDE/flashinfer/attention/decode.cuh" ]; then
  echo "FlashInfer headers not found in $FI_INCLUDE (run scripts/prepare_gpu_carry.sh where PyPI is reachable)" >&2
  exit 2
fi
# FlashInfer's JIT flags (flashinfer/jit/core.py: -O3 -DNDEBUG -use_fast_math, --expt-relaxed-constexpr,
# the dtype switches); CacheFlow's kernel is compiled with them too (its own build uses -O3 --use_fast_math)
nvcc -std=c++17 -O3 -DNDEBUG --use_fast_math --expt-relaxed-constexpr \
    -DFLASHINFER_ENABLE_F16 -DFLASHINFER_ENABLE_BF16 -DFLASHINFER_ENABLE_FP8_E4M3 -DFLASHINFER_ENABLE_FP8_E5M2 \
    -arch="$ARCH" ${NVCC_FLAGS:-} -I native/src/kernels/cuda -I "$FI_INCLUDE" \
    native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
    native/tests/cuda/bench_flashinfer_decode.cu -o "$BIN" \
    > "$OUT/flashinfer_vs_cacheflow_build.log" 2>&1 || { tail -30 "$OUT/flashinfer_vs_cacheflow_build.log" >&2; exit 1; }
if [ "${BUILD_ONLY:-0}" = 1 ]; then
  exit 0
fi
rc=0
{
  echo "== $(date -u +%FT%TZ) $(nvcc --version | tail -1); FlashInfer: $(cat "$FI_INCLUDE/../VERSION" 2>/dev/null || echo "$FI_INCLUDE")"
  echo "== plain launches"
  "$BIN" "$@" || rc=$?
  echo "== CUDA graphs (--graph)"
  "$BIN" --graph "$@" || rc=$?
  exit "$rc"
} 2>&1 | tee "$OUT/flashinfer_vs_cacheflow.txt"  # pipefail + set -e: a failed run is this script's status
