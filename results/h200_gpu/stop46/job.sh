#!/usr/bin/env bash
# Stop 46's device run (scripts/device_poll.sh; results under /tmp/res, each stage in its own folder): the CUDA build;
# the GPU tests of the new and changed code (patch 0021's SwiGLU kernel and F16 copies, bit for bit; the async decode
# row compaction of stop 45 on the GPU); decode at B=64 (1B shape, 128/128, ITER 3): the default (GEMM=7) against
# GEMM=15 (0021), with and without async decode, each row against its own llama-batched-bench; the CUPTI timeline at
# B=64 with GEMM=15 (do the conversions go, by kernel name?); B=256 and B=1; then the whole GPU suite with GEMM=15 and
# async decode on, last because it is long.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="swiglu or f16_producers or async" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed|FAIL|us per call" /tmp/res/t/run.log /tmp/res/t/gpu_tests.log | tail -6 >> /tmp/res/run.log
mkdir -p /tmp/res/standalone && nvcc -std=c++17 -arch=sm_90a -O3 -I native/tests/cuda native/tests/cuda/bench_argmax_rows.cu \
    -o /tmp/bench_argmax_rows > /tmp/res/standalone/argmax_build.log 2>&1 && /tmp/bench_argmax_rows \
    > /tmp/res/standalone/argmax.txt 2>&1
say "argmax bench: $(tail -3 /tmp/res/standalone/argmax.txt | tr '\n' ' ')"
G15=CACHEFLOW_CUDA_GEMM=15
OUT=/tmp/res/d STAGES="decode" NPL="64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default $G15 $G15,CACHEFLOW_ASYNC_DECODE=1 CACHEFLOW_ASYNC_DECODE=1 default" \
    bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/tr STAGES="trace" TRACE_NPL=64 TRACE_KV_MODES=paged TRACE_BB=0 TRACE_LINES=24 \
    TRACE_ENVS="$G15" bash scripts/h200_gpu_tests.sh
say "trace: $(grep -v "\] exit " /tmp/res/tr/run.log | tail -1)"
OUT=/tmp/res/d2 STAGES="decode" NPL="256 1" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default $G15,CACHEFLOW_ASYNC_DECODE=1" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d2/run.log >> /tmp/res/run.log
CACHEFLOW_CUDA_GEMM=15 CACHEFLOW_ASYNC_DECODE=1 OUT=/tmp/res/t2 STAGES="tests" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t2/run.log | tail -2 >> /tmp/res/run.log
say "exit 0"
