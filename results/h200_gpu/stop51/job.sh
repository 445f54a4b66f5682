#!/usr/bin/env bash
# For the next stop's device run (stop 51 had no machine: new loans were paused for the whole session). Stop 50's
# job.sh (never run either), with one addition: the FlashInfer side-by-side binary is built during the CUDA build, and
# right after the first timing round Nsight Compute's sections (throughput, memory, occupancy, warp stalls) run on
# CacheFlow's split and combine kernels and FlashInfer's decode and merge kernels at B=8 / 8K and B=1 / 32K
# (scripts/ncu_vs_flashinfer.sh): why FlashInfer reads K/V at 84% / 71% of the copy bandwidth there and the split
# kernel at 67% / 56%, before any further kernel design (stops 47-50's attempts were each measured slower).
# scripts/device_poll.sh, results under /tmp/res, last line of /tmp/res/run.log "[time] exit 0"; carry
# ["_carry/llama.cpp", "_carry/tokenizer.gguf", "_carry/wheels", "_carry/old48", "_carry/flashinfer"] (_carry/old48:
# paged_attention_two_pass.cuh of commit 4a512b4, stop 48's combine kernel; scripts/prepare_gpu_carry.sh makes the
# rest). About 1,400 s with the machine's start.
# Order:
# 1. the CUDA build, beside it the standalone test binaries `tpa_c` (this tree; its correctness tests run then, to the
#    end: stops 49 and 50 reached 240 of their lines) and `tpa` (stop 48's two-pass header), and the FlashInfer bench;
# 2. timings alone: tpa_c's long shapes with CACHEFLOW_PA_PDL=1; ncu's per-kernel durations of tpa_c's long shapes;
#    ncu's sections of both libraries' kernels at B=8 / 8K and B=1 / 32K;
# 3. the engine's decode with the staged combine: B=256 and 64 at 128/128, B=8 at 8K, each against its own
#    llama-batched-bench;
# 4. the GPU suite (not run since stop 46) but its standalone kernel test (tpa_c's, run in 1) and the kv_stream
#    standalone test (~170 s; its kernels are unchanged since stop 46); 5. the staged combine's A/B, tpa vs tpa_c
#    --bench; 6. FlashInfer side by side (the whole table, plain launches and graphs).
# Keep polling: a machine with no call in flight goes back, and the job with it.
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
say "start"
rm -rf /tmp/old48 && cp -r native/src/kernels/cuda /tmp/old48
cp _carry/old48/paged_attention_two_pass.cuh /tmp/old48/
nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I /tmp/old48 /tmp/old48/paged_attention.cu \
    /tmp/old48/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa \
    > /tmp/res/k/nvcc_tpa.log 2>&1 &
(nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda \
     native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
     native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa_c > /tmp/res/k/nvcc_tpa_c.log 2>&1 \
 && /tmp/tpa_c > /tmp/res/k/tests_c.txt 2>&1; echo "rc $?" >> /tmp/res/k/tests_c.txt) &
BUILD_ONLY=1 OUT=/tmp/res/k BIN=/tmp/cf_fi_decode ARCH=sm_90 bash scripts/bench_flashinfer_decode.sh &
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
wait
say "tpa_c: tests, run during the build"
grep -E "PASS|FAIL|failed|^rc" /tmp/res/k/tests_c.txt | cut -c1-170 >> /tmp/res/run.log
ab_round() {  # round [bins]: tpa / tpa_c --bench each (the staged combine's A/B), then the PDL bench
  local round=$1 bin name
  for bin in ${2:-}; do
    name=$(basename "$bin")
    say "combine A/B round $round: $name --bench (default loads, timings only)"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "$bin" --bench > "/tmp/res/k/bench_${name}_$round.txt" 2>&1
    grep -E "bench decode|copy" "/tmp/res/k/bench_${name}_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
  say "round $round: tpa_c --bench long with CACHEFLOW_PA_PDL=1 (PDL between the split and the combine on every grid)"
  CACHEFLOW_PA_PDL=1 CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 /tmp/tpa_c --bench long \
      > "/tmp/res/k/long_tpa_c_pdl_$round.txt" 2>&1
  grep -E "bench decode" "/tmp/res/k/long_tpa_c_pdl_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
      | cut -c1-150 >> /tmp/res/run.log
}
ab_round 1  # (the staged combine's A/B in round 2, after the suite)
bash scripts/ncu_decode_layer.sh /tmp/tpa_c /tmp/res/k 1,8192,64 8,8192,64 1,32768,64 4,32768,64 >> /tmp/res/run.log
say "ncu sections: CacheFlow's kernels and FlashInfer's, one layer (scripts/ncu_vs_flashinfer.sh)"
bash scripts/ncu_vs_flashinfer.sh /tmp/cf_fi_decode /tmp/res/k 8,8192,64 1,32768,64 >> /tmp/res/run.log 2>&1
OUT=/tmp/res/d STAGES="decode" NPL="256 64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/d8 STAGES="decode" NPP=8192 NPL="8" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d8/run.log >> /tmp/res/run.log
# the suite without its standalone kernel test (~210 s), which tpa_c ran above (the same source, built the same way),
# and the kv_stream standalone test (~170 s)
OUT=/tmp/res/t STAGES="tests" \
    GPU_TESTS_K="not test_paged_attention_cuda_matches_reference and not test_kv_stream_cuda_matches_resident_pools" \
    bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
ab_round 2 "/tmp/tpa /tmp/tpa_c"
OUT=/tmp/res/f STAGES="flashinfer" bash scripts/h200_gpu_tests.sh
grep -E "ctx=(8192|32768)|copy" /tmp/res/f/flashinfer_vs_cacheflow.txt | head -40 >> /tmp/res/run.log
say "exit 0"
