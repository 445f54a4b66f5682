#!/usr/bin/env bash
# Stop 44's first device run (scripts/device_poll.sh, results under /tmp/res): the GEMM microbenchmark's second kernel
# version (seconds), then stop 43's job2.sh unchanged (CUDA build, both patch-0020 tests, the B=64 timeline with and
# without 0020, decode at B = 64 and 256 against llama-batched-bench) with four engine settings: the default, 0020
# (CACHEFLOW_CUDA_GEMM=7), 0020 with async decode, async decode alone.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
( cd /tmp && nvcc -std=c++17 -arch=sm_90a -O3 -o bench_skinny_gemm "$OLDPWD/native/tests/cuda/bench_skinny_gemm.cu" \
    -lcublasLt -lcublas && ./bench_skinny_gemm ) > /tmp/res/gemm_bench.txt 2>&1
DECODE_PA_KERNELS="default CACHEFLOW_CUDA_GEMM=7 CACHEFLOW_CUDA_GEMM=7,CACHEFLOW_ASYNC_DECODE=1 CACHEFLOW_ASYNC_DECODE=1" \
    bash results/h200_gpu/stop43/job2.sh
