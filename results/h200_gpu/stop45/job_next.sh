#!/usr/bin/env bash
# For the next stop's device run (scripts/device_poll.sh; results under /tmp/res, each stage in its own folder):
# the CUDA build; the async decode GPU tests (-k async: the row compaction of stop 45 on the GPU, with step padding);
# decode at B = 64 and 256 (1B shape, 128/128, ITER 3), the default (patch 0020 on since stop 45) against async decode,
# each against its own llama-batched-bench; then the whole GPU suite with async decode on, last because it is long.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="async" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
OUT=/tmp/res/d STAGES="decode" NPL="64 256" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_ASYNC_DECODE=1 default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
CACHEFLOW_ASYNC_DECODE=1 OUT=/tmp/res/t2 STAGES="tests" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t2/run.log | tail -2 >> /tmp/res/run.log
say "exit 0"
