#!/usr/bin/env bash
# For the next stop's device run (scripts/device_poll.sh; results under /tmp/res, each stage in its own folder): the
# standalone paged attention test with narrow8 as a load shape of one binary (bit-identity with the other shapes, and
# default / narrow / narrow8 timed in one process, CF_BENCH_NARROW8); the CUDA build; decode where by_grid now picks
# narrow8 (B=256 at 128/128, B=8 at 8K) against CACHEFLOW_PA_LOADS=narrow (stop 46's choice there), each row against
# its own llama-batched-bench, and B=64 (which keeps narrow: one resident wave); then the whole GPU suite, last because
# it is long (keep polling: a machine with no call in flight goes back, and the job with it).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
( nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
      native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa \
      > /tmp/res/k/nvcc.log 2>&1 && CF_BENCH_NARROW8=1 /tmp/tpa --bench > /tmp/res/k/kernel_bench_narrow8.txt 2>&1
  echo "rc $?" >> /tmp/res/k/kernel_bench_narrow8.txt ) &
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
wait
grep -E "bench decode|issue 11|PASS|FAIL|failed|^rc" /tmp/res/k/kernel_bench_narrow8.txt \
    | sed 's/heads 32\/8 //' | cut -c1-170 >> /tmp/res/run.log
OUT=/tmp/res/d STAGES="decode" NPL="256 64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/d8 STAGES="decode" NPP=8192 NPL="8" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d8/run.log >> /tmp/res/run.log
OUT=/tmp/res/t STAGES="tests" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
say "exit 0"
