#!/usr/bin/env bash
# Stop 48's device run (scripts/device_poll.sh; results under /tmp/res, each stage in its own folder; last line of
# /tmp/res/run.log "[time] exit 0"). Two binaries of the standalone paged attention test: /tmp/tpa from this tree
# and /tmp/tpa_old from stop 47's commit 696ac35 (the combine kernel that waited on one split state at a time; its
# sources carried as _carry/old/src_696ac35.tgz, `git archive 696ac35 native/src/kernels/cuda native/tests/cuda`),
# both built by nvcc here beside the CUDA build. Carry: ["_carry/llama.cpp", "_carry/tokenizer.gguf",
# "_carry/wheels", "_carry/old"] (the whole _carry is over the 64 MiB a call takes).
#  1. beside the CUDA build: tpa with narrow8 as a load shape of its own (bit identity with the others, every test
#     shape; default / narrow / narrow8 timed in one process, CF_BENCH_NARROW8);
#     Beside it: tpa_l512 / tpa_l1024, this tree with two_pass::kLongSplitKeys 512 / 1,024 (-DCF_PA_LONG_SPLIT: splits
#     of that many keys for rows over 4,096 keys), and tpa_l1024's tests (the long rows against float64, bit identity,
#     invariance);
#  2. after the build: the long decode shapes (>= 8K) with the default load shape, tpa_old, tpa, tpa_l512, tpa_l1024
#     in turn, twice (the new combine's A/B: same bits by construction; the long splits' A/B; timings only);
#  3. decode at B=256 / 64 (128/128) and B=8 at 8K, default against CACHEFLOW_PA_LOADS=narrow, each row against its
#     own llama-batched-bench;
#  4. the whole GPU suite (long: keep polling, a machine with no call in flight goes back with the job).
set -u
cd "$(dirname "$0")/../../.."
mkdir -p /tmp/res/k
say() { echo "[$(date +%H:%M:%S)] $*" >> /tmp/res/run.log; }
say "start"
mkdir -p /tmp/old && tar xzf _carry/old/src_696ac35.tgz -C /tmp/old
( cd /tmp/old && nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math -I native/src/kernels/cuda \
      native/src/kernels/cuda/paged_attention.cu native/src/kernels/cuda/paged_prefill_mma.cu \
      native/tests/cuda/test_paged_attention_cuda.cu -o /tmp/tpa_old > /tmp/res/k/nvcc_old.log 2>&1 ) &
tpa() {  # $1: binary, then extra nvcc flags
  local bin=$1; shift
  nvcc -std=c++17 -arch=sm_90 -O3 --use_fast_math "$@" -I native/src/kernels/cuda native/src/kernels/cuda/paged_attention.cu \
      native/src/kernels/cuda/paged_prefill_mma.cu native/tests/cuda/test_paged_attention_cuda.cu -o "$bin" \
      > "/tmp/res/k/nvcc_$(basename "$bin").log" 2>&1
}
tpa /tmp/tpa_l512 -DCF_PA_LONG_SPLIT=512 &
tpa /tmp/tpa_l1024 -DCF_PA_LONG_SPLIT=1024 &
( tpa /tmp/tpa && CF_BENCH_NARROW8=1 /tmp/tpa --bench > /tmp/res/k/kernel_bench_narrow8.txt 2>&1
  echo "rc $?" >> /tmp/res/k/kernel_bench_narrow8.txt ) &
OUT=/tmp/res/b STAGES="build" bash scripts/h200_gpu_tests.sh
grep -v "] exit " /tmp/res/b/run.log | tail -2 >> /tmp/res/run.log  # not its exit line: device_poll.sh waits for ours
wait
grep -E "bench decode|issue 11|PASS|FAIL|failed|^rc" /tmp/res/k/kernel_bench_narrow8.txt \
    | sed 's/heads 32\/8 //' | cut -c1-170 >> /tmp/res/run.log
say "tests of the 1,024-key long splits (tpa_l1024, no bench):"
/tmp/tpa_l1024 > /tmp/res/k/tests_l1024.txt 2>&1
echo "rc $?" >> /tmp/res/k/tests_l1024.txt
grep -E "ctx<=20000 two_pass |PASS|FAIL|failed|^rc" /tmp/res/k/tests_l1024.txt | cut -c1-170 >> /tmp/res/run.log
for round in 1 2; do
  for bin in /tmp/tpa_old /tmp/tpa /tmp/tpa_l512 /tmp/tpa_l1024; do
    say "combine A/B round $round: $bin --bench long (default loads)"
    CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 "$bin" --bench long > "/tmp/res/k/long_$(basename "$bin")_$round.txt" 2>&1
    grep -E "bench decode|copy" "/tmp/res/k/long_$(basename "$bin")_$round.txt" | sed 's/heads 32\/8 //; s/ max|diff| 0.0e+00//' \
        | cut -c1-150 >> /tmp/res/run.log
  done
done
OUT=/tmp/res/d STAGES="decode" NPL="256 64" ITER="3" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow default" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d/run.log >> /tmp/res/run.log
OUT=/tmp/res/d8 STAGES="decode" NPP=8192 NPL="8" ITER="2" DECODE_MODES=paged \
    DECODE_PA_KERNELS="default CACHEFLOW_PA_LOADS=narrow" bash scripts/h200_gpu_tests.sh
grep -E "decode:|ratio_tg|median" /tmp/res/d8/run.log >> /tmp/res/run.log
OUT=/tmp/res/t STAGES="tests" bash scripts/h200_gpu_tests.sh
grep -E "passed|failed" /tmp/res/t/run.log | tail -2 >> /tmp/res/run.log
say "exit 0"
