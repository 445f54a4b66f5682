#!/usr/bin/env bash
# Stop 47's device run (scripts/device_poll.sh; results under /tmp/res, each stage in its own folder): the
# CUDA build (with llama-server); the GPU tests changed after stop 46's run (the RPC split on the stock GEMM path, async
# decode on by default); decode at B=64 with the new defaults (0021 and async decode), against llama-batched-bench;
# then cacheflow serve vs llama-server at 64 and 256 streams (greedy 128/128), with the decodes launched ahead from
# /metrics: the hold of admissions while every slot is taken (engine_step.cpp "Lookahead") on a GPU for the first time.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
BUILD_SERVER=1 OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/t STAGES="tests" GPU_TESTS_K="rpc or async or f16_producers" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
OUT=/tmp/res/d STAGES="decode" NPL="64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_ASYNC_DECODE=0 default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/s STAGES="vs_llama_server" VS_NP="64 256" bash scripts/h200_gpu_tests.sh
grep -E "serve|throughput|ratio|lookahead" /tmp/res/s/run.log | tail -20 >> /tmp/res/run.log
OUT=/tmp/res/f STAGES="flashinfer" bash scripts/h200_gpu_tests.sh
grep -E "ctx=(8192|32768)|copy" /tmp/res/f/flashinfer_vs_cacheflow.txt | head -40 >> /tmp/res/run.log
say "exit 0"
