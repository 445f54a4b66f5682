#!/usr/bin/env bash
# Stop 42's device run (one job, started by scripts/device_poll.sh, results under /tmp/res): the standalone paged
# attention test beside the CUDA build, the token feed's native test on the GPU (patches 0017 and 0018), the GPU tests
# of async decode and the embedding, then the decode table: the new two-pass defaults (wide loads + PDL on small
# grids) against the old ones, and async decode (CACHEFLOW_ASYNC_DECODE=1), each against its own llama-batched-bench.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
(
  nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
      native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa \
      > /tmp/res/kernel_nvcc.log 2>&1 || exit 1
  /tmp/tpa > /tmp/res/kernel_test.txt 2>&1; echo "exit $?" >> /tmp/res/kernel_test.txt
) &
kernel_job=$!
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
wait "$kernel_job"
# OUT=/tmp/res only for the last stage: its "] exit" line in /tmp/res/run.log ends device_poll.sh's wait.
# The tests stage writes the model first; then the token feed's native test on it (every layer on the GPU).
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="${GPU_TESTS_K:-async or embedding or runs_on_the_gpu}" \
    bash scripts/h200_gpu_tests.sh
CACHEFLOW_TEST_MODEL=/tmp/llama-1b-shape-f16.gguf timeout 300 /tmp/cf-cuda-build/test_token_feed \
    > /tmp/res/token_feed_cuda.txt 2>&1
rc=$?  # (run1 logged date's status here instead: the test had aborted, see README)
echo "[$(date +%T)] test_token_feed on CUDA: exit $rc" | tee -a /tmp/res/run.log
OUT=/tmp/res STAGES="decode" NPL="${NPL:-1 64 256 8}" ITER="${ITER:-3}" DECODE_MODES=paged \
    DECODE_PA_KERNELS="${DECODE_PA_KERNELS:-default CACHEFLOW_PA_LOADS=narrow,CACHEFLOW_PA_PDL=0 CACHEFLOW_ASYNC_DECODE=1}" \
    bash scripts/h200_gpu_tests.sh
