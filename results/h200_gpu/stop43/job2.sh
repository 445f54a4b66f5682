#!/usr/bin/env bash
# Stop 43's second device run (scripts/device_poll.sh, results under /tmp/res): patch 0020 (the residual add, RMS norm
# and norm weight in one kernel, with the F16 copy for the next GEMM). The CUDA build; the GPU test of 0020; decode at
# B = 64 and 256: the default (0008's options alone) against CACHEFLOW_CUDA_GEMM=7 (0020 on), each against its own
# llama-batched-bench.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
# kept lean (the session's device budget was down to about 660 s after failed machine starts): no timeline, two
# batch sizes, the A/B only
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="${GPU_TESTS_K:-add_rms_norm}" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -3 >> /tmp/res/run.log
OUT=/tmp/res STAGES="decode" NPL="${NPL:-64 256}" ITER="${ITER:-2}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_CUDA_GEMM=7}" \
    bash scripts/h200_gpu_tests.sh
