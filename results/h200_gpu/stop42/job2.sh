#!/usr/bin/env bash
# Stop 42's second device run (scripts/device_poll.sh, results under /tmp/res): fused projections (patch 0019).
# CUDA build; the GPU test of the fusion; the token feed test; decode at B = 1, 64, 256 with fused projections (the
# default) against CACHEFLOW_FUSE_PROJECTIONS=0, each against its own llama-batched-bench (kept short: the budget).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
# OUT=/tmp/res only for the last stage: its "] exit" line in /tmp/res/run.log ends device_poll.sh's wait
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="${GPU_TESTS_K:-fused}" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed|fused|async" /tmp/res/t/run.log | tail -5 >> /tmp/res/run.log
# the token feed's native test with the embedding on the GPU (run1 aborted with it on the CPU)
CACHEFLOW_TEST_MODEL=/tmp/llama-1b-shape-f16.gguf timeout 120 /tmp/cf-cuda-build/test_token_feed \
    > /tmp/res/token_feed_cuda.txt 2>&1
rc=$?
echo "[$(date +%T)] test_token_feed on CUDA: exit $rc" | tee -a /tmp/res/run.log
OUT=/tmp/res STAGES="decode" NPL="${NPL:-1 64 256}" ITER="${ITER:-2}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_FUSE_PROJECTIONS=0}" \
    bash scripts/h200_gpu_tests.sh
