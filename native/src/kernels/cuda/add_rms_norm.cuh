// add_rms_norm.cuh - a residual add, the RMS norm of its sum and the norm's weight in one kernel (one CTA per row).
//
// sum = a + b; out = rsqrtf(sum(sum_i^2) / n + eps) * sum * w, row by row, as a llama-family graph's ADD -> RMS_NORM ->
// MUL (ggml's fused RMS_NORM + MUL formula, norm.cu); optionally out rounded to F16 as well (round to nearest even, as
// ggml's F32 -> F16 conversion), for a GEMM that takes F16 inputs. Used on ggml-cuda through add_rms_norm_op.cu
// (patches/0020). The sum of squares is reduced in a fixed order that depends on n alone (float4 lanes, a warp tree,
// then the eight warps in order), so a row's result does not depend on the number of rows.
//
// Each CTA reads its whole row before writing any of it: sum and out may alias a or b row for row (same pointer and
// row stride), as when ggml-alloc runs the ADD in place; other overlaps are the caller's to exclude.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cf::cuda {

constexpr int kAddRmsNormThreads = 256;
constexpr int kAddRmsNormMaxCols = 8 * 4 * kAddRmsNormThreads;  // 8,192 floats a row

struct AddRmsNormArgs {
    const float * a;    // [rows][a_stride] F32, the first addend; row r at a + r * a_stride
    const float * b;    // [rows][b_stride] F32, the second addend
    const float * w;    // [n] F32, the norm's weight (broadcast over rows)
    float * sum;        // [rows][sum_stride] F32 out: a + b
    float * out;        // [rows][out_stride] F32 out: the normalized sum times w
    half * out_f16;     // [rows][n] F16 out, contiguous: out rounded to F16; nullptr: not written
    int64_t a_stride, b_stride, sum_stride, out_stride;  // floats between rows; multiples of 4
    int32_t rows;       // >= 0
    int32_t n;          // floats per row: a multiple of 4, at most kAddRmsNormMaxCols
    float eps;          // added to the mean square before rsqrtf
};

// nullptr if the launcher takes args, else why not (shape, stride or 16-byte alignment).
const char * add_rms_norm_check(const AddRmsNormArgs & args);

// Enqueues the kernel on stream (grid: one CTA per row). Call only where add_rms_norm_check said nullptr.
void add_rms_norm_launch(const AddRmsNormArgs & args, cudaStream_t stream);

}  // namespace cf::cuda
