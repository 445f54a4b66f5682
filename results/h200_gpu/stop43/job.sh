#!/usr/bin/env bash
# Stop 43's first device run (scripts/device_poll.sh, results under /tmp/res): the CUDA build; the GPU test of fused
# projections (patch 0019); the token feed's native test with the embedding on the GPU; a CUPTI timeline of the paged
# decode graphs at B = 64 and 256, fused and unfused (where a step's device time goes now); then decode at B = 1, 64,
# 256 with fused projections (the default) against CACHEFLOW_FUSE_PROJECTIONS=0, each against its own
# llama-batched-bench. The GEMM microbenchmark (native/tests/cuda/bench_skinny_gemm.cu) runs beside the build when the
# file is in the tree.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
if [ -f native/tests/cuda/bench_skinny_gemm.cu ]; then
  ( nvcc -std=c++17 -arch=sm_90a -O3 native/tests/cuda/bench_skinny_gemm.cu -lcublasLt -lcublas -o /tmp/gemm_bench \
        > /tmp/res/gemm_nvcc.log 2>&1 || exit 1
    /tmp/gemm_bench > /tmp/res/gemm_bench.txt 2>&1; echo "exit $?" >> /tmp/res/gemm_bench.txt ) &
fi
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
wait
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="${GPU_TESTS_K:-fused}" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed|fused" /tmp/res/t/run.log | tail -5 >> /tmp/res/run.log
CACHEFLOW_TEST_MODEL=/tmp/llama-1b-shape-f16.gguf timeout 120 /tmp/cf-cuda-build/test_token_feed \
    > /tmp/res/token_feed_cuda.txt 2>&1
rc=$?
echo "[$(date +%T)] test_token_feed on CUDA: exit $rc" | tee -a /tmp/res/run.log
OUT=/tmp/res/tr STAGES="trace" TRACE_NPL="${TRACE_NPL:-64 256}" TRACE_KV_MODES=paged TRACE_BB=0 TRACE_LINES=40 \
    TRACE_ENVS="CACHEFLOW_FUSE_PROJECTIONS=0" bash scripts/h200_gpu_tests.sh
OUT=/tmp/res STAGES="decode" NPL="${NPL:-1 64 256}" ITER="${ITER:-2}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_FUSE_PROJECTIONS=0}" \
    bash scripts/h200_gpu_tests.sh
