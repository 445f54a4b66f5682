#!/usr/bin/env bash
# Why FlashInfer's batch decode reads K/V faster than CacheFlow's split kernel on the shapes where issue 11's 70% is
# missed (B=8 at 8K: 67% against FlashInfer's 84%; B=1 at 32K: 56% against 71%, H100, stops 47-50): Nsight Compute's
# throughput, memory, occupancy, launch and warp-stall sections for each of the four kernels of one decode layer
# (CacheFlow's split and combine kernels, FlashInfer's decode kernel and its merge-states kernel), on the binary of
# scripts/bench_flashinfer_decode.sh run with `--only B,ctx,D` (that shape alone). One ncu run per kernel: the kernel
# name filter, then the 5th matching launch (past the correctness launch and the warm-up), caches flushed before it
# (ncu's default) as in the bench's "graph over cold K/V", clocks as the device runs them.
# Usage: scripts/ncu_vs_flashinfer.sh BIN OUTDIR SHAPE...   (SHAPE: B,ctx,D with D 64 or 128)
#   NCU_KERNELS: the kernel name filters (regexes over ncu's function names), default the four above; e.g. with
#   CACHEFLOW_PA_KERNEL=ring in the environment "^split_kernel paged_attention_combine_kernel" for the ring kernel's
#   (namespace cf::cuda::ring) split and the combine ("^": not paged_attention_split_kernel, which a shape the ring
#   kernel does not cover runs). NCU_TAG: a word added to the output files' names (the filters' other characters are
#   left out of them).
# Writes OUTDIR/ncu_fi_<B>_<ctx>_<D>_<kernel>.txt per kernel and prints, per kernel, its duration, DRAM throughput,
# achieved occupancy, registers and the top warp-stall lines (for the caller's log).
set -u
bin=$1 out=$2
shift 2
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$ncu" ]; then
  echo "ncu_vs_flashinfer.sh: no ncu on this machine" >&2
  exit 2
fi
mkdir -p "$out"
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
--section WarpStateStats --section SchedulerStats"
# the warp-stall reasons of WarpStateStats as numbers (cycles a warp waits per issued instruction, by reason)
stalls=""
for r in long_scoreboard barrier lg_throttle short_scoreboard wait math_pipe_throttle mio_throttle no_instruction \
         membar drain; do
  stalls="$stalls,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
for shape in "$@"; do
  for k in ${NCU_KERNELS:-paged_attention_split_kernel paged_attention_combine_kernel \
           BatchDecodeWithPagedKVCacheKernel PersistentVariableLengthMergeStatesKernel}; do
    f="$out/ncu_fi_${shape//,/_}_${NCU_TAG:+${NCU_TAG}_}${k//[^A-Za-z0-9_]/}.txt"
    echo "ncu $shape $k"
    # shellcheck disable=SC2086  # $sections: several words on purpose
    timeout 120 "$ncu" --clock-control none $sections --metrics "${stalls#,}" -k "regex:$k" --launch-skip 4 \
        --launch-count 1 "$bin" --only "$shape" > "$f" 2>&1
    grep -E "^    (Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per \
Thread|Grid Size|Block Limit Registers|Waves Per SM|Issued Warp Per Scheduler|No Eligible)|stalled_" "$f" \
        | sed 's/  */ /g; s/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//'
    grep -E "^ *(OPT|WRN) .*(stall|Stall)" "$f" | head -2 | cut -c1-200
  done
done
