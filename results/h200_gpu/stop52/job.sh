#!/usr/bin/env bash
# Stop 52's device run: the ring kernel (paged_attention_ring.cuh, CACHEFLOW_PA_KERNEL=ring) against the two-pass
# kernel and FlashInfer's batch decode, then in the engine. scripts/device_poll.sh, results under /tmp/res, last line of
# /tmp/res/run.log "[time] exit 0"; carry ["_carry/llama.cpp", "_carry/tokenizer.gguf", "_carry/wheels",
# "_carry/flashinfer"] (scripts/prepare_gpu_carry.sh). About 1,000 s with the machine's start.
# Order:
# 1. the CUDA build (scripts/h200_gpu_tests.sh build) in the background, niced, for 3-4 below; the standalone test
#    binary `tpa_r` (this tree), `tpa_r6` (more ring stages: CF_RING_STAGES_1=6 for GQA 8, CF_RING_STAGES_N=3 for GQA
#    4, the bench's shapes; run1 of stop 52 had the first revision, where GQA 4 took CF_RING_STAGES_1) and the
#    FlashInfer bench binary;
# 2. timings: tpa_r and tpa_r6 --bench long with CF_BENCH_RING (two-pass, ring by the grid, ring at 1, 2, 4 splits
#    per CTA); then tpa_r's `--ring` correctness tests (the two-pass kernel and the ring kernel at 1, 2, 16 and
#    by-the-grid splits per CTA on 11 shapes, long rows included);
#    FlashInfer side by side with CACHEFLOW_PA_KERNEL=ring on the long shapes, plain launches and graphs; ncu of the
#    ring kernel at B=8 / 8K and B=1 / 32K (scripts/ncu_vs_flashinfer.sh, NCU_KERNELS);
# 3. the engine's decode, default (two-pass) and ring: B=256 and 64 at 128/128, B=8 at 8K, each against its own
#    llama-batched-bench;
# 4. the GPU suite with CACHEFLOW_PA_KERNEL=ring (greedy agreement, per-step logits against stock), without its two
#    long standalone tests; 5. tpa_r --bench short with CF_BENCH_RING (short rows, every batch).
# Keep polling: a machine with no call in flight goes back, and the job with it.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
strip() { sed 's/heads 32\/8 //; s/ max|diff| [0-9.e+-]*//' | cut -c1-160; }
say "start"
# the CUDA build in the background (niced: the kernel timings below run beside it, their launches on one core)
# KERNEL_ONLY=1: the standalone kernel stages alone (1-2), for a short device budget
if [ "${KERNEL_ONLY:-0}" != 1 ]; then
  (nice -n 10 env OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh > /tmp/res/build.out 2>&1) &
  build_pid=$!
fi
nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda \
    native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
    native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa_r > /tmp/res/k/nvcc_tpa_r.log 2>&1 &
p1=$!
nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -DCF_RING_STAGES_1=6 -DCF_RING_STAGES_N=3 -I native/src/kernels/cuda \
    native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
    native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa_r6 > /tmp/res/k/nvcc_tpa_r6.log 2>&1 &
p2=$!
BUILD_ONLY=1 OUT=/tmp/res/k BIN=/tmp/cf_fi_decode ARCH=sm_90 bash scripts/bench_flashinfer_decode.sh &
p3=$!
wait $p1 $p2 $p3
say "standalone binaries built"
say "tpa_r --bench long, CF_BENCH_RING (us per layer back to back | graph over cold K/V)"
CF_BENCH_RING=1 CF_BENCH_SKIP_TESTS=1 /tmp/tpa_r --bench long > /tmp/res/k/bench_ring_long.txt 2>&1
grep -E "bench decode|copy|issue 11|FAIL|fail" /tmp/res/k/bench_ring_long.txt | strip >> /tmp/res/run.log
say "tpa_r6 (CF_RING_STAGES_1=6, CF_RING_STAGES_N=3) --bench long, CF_BENCH_RING"
CF_BENCH_RING=1 CF_BENCH_SKIP_TESTS=1 /tmp/tpa_r6 --bench long > /tmp/res/k/bench_ring6_long.txt 2>&1
grep -E "bench decode|issue 11|FAIL|fail" /tmp/res/k/bench_ring6_long.txt | strip >> /tmp/res/run.log
/tmp/tpa_r --ring > /tmp/res/k/tests_ring.txt 2>&1; echo "rc $?" >> /tmp/res/k/tests_ring.txt
say "tpa_r --ring: tests"
grep -E "PASS|FAIL|failed|^rc" /tmp/res/k/tests_ring.txt | cut -c1-170 >> /tmp/res/run.log
say "FlashInfer side by side, CACHEFLOW_PA_KERNEL=ring, long shapes"
for g in "" --graph; do
  for s in 1,8192,64 8,8192,64 32,8192,64 1,32768,64 4,32768,64 8,8192,128 32,8192,128; do
    CACHEFLOW_PA_KERNEL=ring /tmp/cf_fi_decode $g --only $s >> /tmp/res/k/fi_ring.txt 2>&1
  done
done
grep -E "ctx=|copy|FAIL" /tmp/res/k/fi_ring.txt | cut -c1-200 >> /tmp/res/run.log
say "ncu: the ring kernel's split and the combine (scripts/ncu_vs_flashinfer.sh)"
CACHEFLOW_PA_KERNEL=ring NCU_TAG=ring NCU_KERNELS="^split_kernel paged_attention_combine_kernel" \
    bash scripts/ncu_vs_flashinfer.sh /tmp/cf_fi_decode /tmp/res/k 8,8192,64 1,32768,64 >> /tmp/res/run.log 2>&1
if [ "${KERNEL_ONLY:-0}" = 1 ]; then
  say "exit 0"
  exit 0
fi
wait $build_pid
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
OUT=/tmp/res/d STAGES="decode" NPL="256 64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default ring" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/d8 STAGES="decode" NPP=8192 NPL="8" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default ring" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d8/run.log >> /tmp/res/run.log
say "GPU suite with CACHEFLOW_PA_KERNEL=ring (without the two long standalone tests)"
CACHEFLOW_PA_KERNEL=ring OUT=/tmp/res/t STAGES="tests" \
    GPU_TESTS_K="not test_paged_attention_cuda_matches_reference and not test_kv_stream_cuda_matches_resident_pools" \
    bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
say "tpa_r --bench short, CF_BENCH_RING"
CF_BENCH_RING=1 CF_BENCH_SKIP_TESTS=1 /tmp/tpa_r --bench short > /tmp/res/k/bench_ring_short.txt 2>&1
grep -E "bench decode|FAIL|fail" /tmp/res/k/bench_ring_short.txt | strip >> /tmp/res/run.log
say "exit 0"
