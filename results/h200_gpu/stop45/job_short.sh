#!/usr/bin/env bash
# Stop 45's short device run, for a budget under ~650 s (scripts/device_poll.sh; results under /tmp/res, each stage in
# its own folder): the CUDA build; decode at B = 64 only (1B shape, 128/128, ITER 2) with the default, patch 0020
# (CACHEFLOW_CUDA_GEMM=7) and 0020 with async decode, each against its own llama-batched-bench; then the GPU tests
# -k "add_rms_norm or async"; then the B=64 CUPTI timeline with 0020 (does the fusion engage).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/d STAGES="decode" NPL="64" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_CUDA_GEMM=7 CACHEFLOW_CUDA_GEMM=7,CACHEFLOW_ASYNC_DECODE=1" \
    bash scripts/h200_gpu_tests.sh
grep -E "decode:|iter|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="add_rms_norm or async" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed|agreement" /tmp/res/t/run.log | tail -4 >> /tmp/res/run.log
OUT=/tmp/res/tr STAGES="trace" TRACE_NPL=64 TRACE_KV_MODES=paged TRACE_BB=0 TRACE_LINES=24 \
    TRACE_ENVS="CACHEFLOW_CUDA_GEMM=7" bash scripts/h200_gpu_tests.sh
say "trace: $(grep -v "\] exit " /tmp/res/tr/run.log | tail -1)"
say "exit 0"
