#!/usr/bin/env bash
# Stop 43's second device run (scripts/device_poll.sh, results under /tmp/res): patch 0020 (the residual add, RMS norm
# and norm weight in one kernel, with the F16 copy for the next GEMM). The CUDA build; the standalone kernel test and
# the GPU test of 0020; a CUPTI timeline at B = 64 with and without it; decode at
# B = 64 and 256: the default (0008's options alone) against CACHEFLOW_CUDA_GEMM=7 (0020 on), each against its own
# llama-batched-bench.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
# -k add_rms_norm takes both 0020 tests: the standalone kernel test (tests/kernels/test_add_rms_norm_cuda.py, with -s
# its time per call) and the engine's against the default graph
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="${GPU_TESTS_K:-add_rms_norm}" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -3 >> /tmp/res/run.log
grep -E "us per call|FAIL" /tmp/res/t/gpu_tests.log | head -5 >> /tmp/res/run.log
# the timeline shows whether the fusion engages (add_rms_norm_kernel in place of k_bin_bcast and rms_norm_f32): the
# GPU test's agreement alone would also pass if it never did
OUT=/tmp/res/tr STAGES="trace" TRACE_NPL=64 TRACE_KV_MODES=paged TRACE_BB=0 TRACE_LINES=24 \
    TRACE_ENVS="CACHEFLOW_CUDA_GEMM=7" bash scripts/h200_gpu_tests.sh
OUT=/tmp/res STAGES="decode" NPL="${NPL:-64 256}" ITER="${ITER:-2}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_CUDA_GEMM=7}" \
    bash scripts/h200_gpu_tests.sh
