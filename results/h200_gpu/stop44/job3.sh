#!/usr/bin/env bash
# Stop 44's last device call (too little budget was left for the CUDA build): standalone binaries only, results in
# $OUT. Patch 0020's kernel test (the same build as tests/kernels/test_add_rms_norm_cuda.py), the argmax bench
# (native/tests/cuda/bench_argmax_rows.cu) and the GEMM microbenchmark's second kernel version.
set -u
cd "$(dirname "$0")/../../.."
K=native/src/kernels
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT/gpu.txt"
nvcc -std=c++17 -O3 -use_fast_math -arch=native -I$K/cuda -I$K $K/cuda/add_rms_norm.cu \
    native/tests/cuda/test_add_rms_norm.cu -o /tmp/t_arn && /tmp/t_arn > "$OUT/add_rms_norm_test.txt" 2>&1
echo "add_rms_norm test: exit $?"
nvcc -std=c++17 -arch=sm_90a -O3 native/tests/cuda/bench_argmax_rows.cu -o /tmp/bam && /tmp/bam > "$OUT/argmax_bench.txt" 2>&1
echo "argmax bench: exit $?"
nvcc -std=c++17 -arch=sm_90a -O3 native/tests/cuda/bench_skinny_gemm.cu -lcublasLt -lcublas -o /tmp/bsg && \
    /tmp/bsg > "$OUT/gemm_bench.txt" 2>&1
echo "gemm bench: exit $?"
cat "$OUT"/*.txt
