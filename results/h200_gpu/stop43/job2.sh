#!/usr/bin/env bash
# Stop 43's second device run (scripts/device_poll.sh, results under /tmp/res): patch 0020 (the residual add, RMS norm
# and norm weight in one kernel, with the F16 copy for the next GEMM). The CUDA build; the GPU tests of 0020 and 0019;
# a CUPTI timeline of the paged decode graphs at B = 64; then decode at B = 1, 64, 256: the default (0020 on) against
# CACHEFLOW_CUDA_GEMM=3 (0008's options alone, the graph before 0020) and against async decode, each against its own
# llama-batched-bench.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="${GPU_TESTS_K:-add_rms_norm or fused}" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed|add \+ rms|fused" /tmp/res/t/run.log | tail -6 >> /tmp/res/run.log
OUT=/tmp/res/tr STAGES="trace" TRACE_NPL="${TRACE_NPL:-64}" TRACE_KV_MODES=paged TRACE_BB=0 TRACE_LINES=30 \
    bash scripts/h200_gpu_tests.sh
OUT=/tmp/res STAGES="decode" NPL="${NPL:-1 64 256}" ITER="${ITER:-2}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_CUDA_GEMM=3 CACHEFLOW_ASYNC_DECODE=1}" \
    bash scripts/h200_gpu_tests.sh
