// swiglu_f16.cuh - SwiGLU of a gated feed-forward (silu(gate) * up, row by row) with its result also written in F16.
//
// out[r][c] = silu(gate[r][c]) * up[r][c], silu(x) = x / (1 + exp(-x)): the expression of ggml-cuda's SWIGLU
// (unary.cuh, ggml_cuda_op_silu_single, then the product in unary.cu's gated kernel), so that compiled with the same
// flags (inside the ggml-cuda target) out is bit for bit ggml's. out_f16: out rounded to F16, round to nearest even,
// as ggml's F32 -> F16 conversion ahead of a cuBLAS F16 GEMM; the FFN's down projection reads it instead of converting
// (swiglu_f16_op.cu, patches/0021). Elementwise: no result depends on the number of rows.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cf::cuda {

constexpr int kSwigluThreads = 256;  // one float4 of a row per thread

struct SwigluArgs {
    const float * gate;  // [rows][gate_stride] F32 (device): silu's input; row r at gate + r * gate_stride
    const float * up;    // [rows][up_stride] F32 (device): the other factor (may be the same allocation as gate)
    float * out;         // [rows][n] F32 out (device), contiguous; must not overlap gate or up
    half * out_f16;      // [rows][n] F16 out (device), contiguous: out rounded to F16; nullptr: not written
    int64_t gate_stride, up_stride;  // floats between rows, multiples of 4, at least n
    int32_t rows;        // in [0, 65535] (the grid's y dimension)
    int32_t n;           // floats per row: a positive multiple of 4
};

// nullptr if the launcher takes args, else why not (shape, stride or 16-byte alignment).
const char * swiglu_f16_check(const SwigluArgs & args);

// Enqueues the kernel on stream (grid: n / 4 / kSwigluThreads CTAs per row, rounded up, times rows). Call only where
// swiglu_f16_check said nullptr.
void swiglu_f16_launch(const SwigluArgs & args, cudaStream_t stream);

}  // namespace cf::cuda
