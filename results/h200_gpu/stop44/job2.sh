#!/usr/bin/env bash
# Stop 44's device run, ordered for a short budget (scripts/device_poll.sh; results under /tmp/res, each stage in its
# own folder, so a run cut short still brings back the stages it finished): the CUDA build; decode at B = 64 and 256
# (1B shape, 128/128) with four engine settings, each against its own llama-batched-bench: the default, patch 0020
# (CACHEFLOW_CUDA_GEMM=7), 0020 with async decode, async decode alone; the GPU tests -k "add_rms_norm or async" (0020's
# standalone kernel test and the engine's agreement with the default graph; async decode plain and with requests that
# stop early); the B=64 CUPTI timeline with 0020 (does the fusion engage: add_rms_norm_kernel in place of k_bin_bcast
# and rms_norm_f32); the GEMM microbenchmark.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/d STAGES="decode" NPL="${NPL:-64 256}" ITER="${ITER:-3}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_CUDA_GEMM=7 CACHEFLOW_CUDA_GEMM=7,CACHEFLOW_ASYNC_DECODE=1 CACHEFLOW_ASYNC_DECODE=1" \
    bash scripts/h200_gpu_tests.sh
grep -E "decode:|iter|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="add_rms_norm or async" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed|agreement" /tmp/res/t/run.log | tail -4 >> /tmp/res/run.log
grep -E "us per call|FAIL|PASS" /tmp/res/t/gpu_tests.log | head -8 >> /tmp/res/run.log
OUT=/tmp/res/tr STAGES="trace" TRACE_NPL=64 TRACE_KV_MODES=paged TRACE_BB=0 TRACE_LINES=24 \
    TRACE_ENVS="CACHEFLOW_CUDA_GEMM=7" bash scripts/h200_gpu_tests.sh
say "trace: $(grep -v "\] exit " /tmp/res/tr/run.log | tail -1)"
( cd /tmp && nvcc -std=c++17 -arch=sm_90a -O3 -o bench_skinny_gemm "$OLDPWD/native/tests/cuda/bench_skinny_gemm.cu" \
    -lcublasLt -lcublas && ./bench_skinny_gemm ) > /tmp/res/gemm_bench.txt 2>&1
say "exit 0"
