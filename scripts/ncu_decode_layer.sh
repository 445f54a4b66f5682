#!/usr/bin/env bash
# Per-kernel GPU durations of one decode layer's attention under Nsight Compute, for each shape given: the standalone
# test binary's `--bench long` with CF_BENCH_ONLY="B,ctx,D" (its default kernel alone, no tests), two launches after
# 40 skipped (the split kernel and the combine kernel of one layer), `gpu__time_duration.sum`, clocks as the device
# runs them. Usage: scripts/ncu_decode_layer.sh BIN OUTDIR SHAPE... (SHAPE: B,ctx,D). Writes one ncu report per
# shape, OUTDIR/ncu_<bin>_<B>_<ctx>_<D>.txt, and prints each kernel's name and duration lines (for the caller's log).
set -u
bin=$1 out=$2
shift 2
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
mkdir -p "$out"
for shape in "$@"; do
  f="$out/ncu_$(basename "$bin")_${shape//,/_}.txt"
  echo "ncu $(basename "$bin") $shape"
  CF_BENCH_ONLY=$shape CF_BENCH_SKIP_TESTS=1 CF_BENCH_DEFAULT_ONLY=1 timeout 60 "$ncu" --clock-control none \
      --metrics gpu__time_duration.sum --launch-skip 40 --launch-count 2 "$bin" --bench long > "$f" 2>&1
  grep -E "^  [a-z_].*\(|gpu__time_duration" "$f" | cut -c1-120
done
