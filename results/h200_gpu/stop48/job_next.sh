#!/usr/bin/env bash
# For the next stop's device run (stop 48's job.sh did not fit the device time left; scripts/device_poll.sh, results
# under /tmp/res, last line of /tmp/res/run.log "[time] exit 0"; carry ["_carry/llama.cpp", "_carry/tokenizer.gguf",
# "_carry/wheels"]): the CUDA build, then the engine's decode with stop 47-48's kernels in place (narrow8 by the grid,
# the combine of stop 48) against CACHEFLOW_PA_LOADS=narrow, each row against its own llama-batched-bench: B=256 and
# 64 at 128/128, B=8 at 8K; then the whole GPU suite, last because it is long (keep polling: a machine with no call
# in flight goes back, and the job with it).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
say "start"
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/d STAGES="decode" NPL="256 64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/d8 STAGES="decode" NPP=8192 NPL="8" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d8/run.log >> /tmp/res/run.log
OUT=/tmp/res/t STAGES="tests" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
say "exit 0"
