// add_rms_norm_op.cu - a graph's residual ADD -> RMS_NORM -> MUL on ggml-cuda as one kernel (add_rms_norm.cuh), for
// patches/0020, which declares the two functions below in ggml-cuda.cu and calls them from its fusion pass.
//
// At decode batch sizes each of the three is a tiny launch: on an H200 at 64 sequences (1B shape) the residual ADD took
// 3.1 us and the fused RMS_NORM + MUL 3.9 us, 32 and 33 times per step, and the F32 -> F16 conversion of the result
// ahead of the next cuBLAS GEMM another 1.25 us (results/h200_gpu/stop43). The kernel writes the ADD's sum (the next
// residual reads it) and the MUL's rows, and, where ggml-cuda passes its shared src1 buffer (patches/0008,
// CF_GEMM_REUSE_SRC1), the same rows in F16, so that GEMM converts nothing. The RMS_NORM's own result is elided.
//
// Compiled into the ggml-cuda target (hook of patches/0004 for CacheFlow's CUDA sources).
#include "ggml-cuda/common.cuh"
#include "add_rms_norm.cuh"
#include "op_util.cuh"

#include <cstdint>
#include <cstring>

namespace {

using cf::cuda::aligned16;
using cf::cuda::tensors_overlap;

// A destination may share an addend's memory only row for row (same start, same row stride).
bool alias_ok(const ggml_tensor * dst, const ggml_tensor * src) {
    return !tensors_overlap(dst, src) || (dst->data == src->data && dst->nb[1] == src->nb[1]);
}

// The norm's weight: mul's other source (MUL is commutative), or nullptr when neither source is the norm.
const ggml_tensor * norm_weight(const ggml_tensor * mul, const ggml_tensor * norm) {
    return mul->src[0] == norm ? mul->src[1] : mul->src[1] == norm ? mul->src[0] : nullptr;
}

}  // namespace

// Whether add -> norm -> mul is a residual add, an RMS norm of its sum and a multiplication by one weight row that
// this kernel computes: F32 everywhere, both addends of the sum's shape, 2-D rows with 16-byte aligned starts and
// strides, the norm's input the sum, the weight a contiguous row of the norm's width, no destination overlapping a
// source except row for row (add_rms_norm.cuh), rows of at most 8,192 floats.
bool ggml_cuda_cf_add_rms_norm_applies(const ggml_tensor * add, const ggml_tensor * norm, const ggml_tensor * mul) {
    if (add->op != GGML_OP_ADD || norm->op != GGML_OP_RMS_NORM || mul->op != GGML_OP_MUL || norm->src[0] != add) {
        return false;
    }
    const ggml_tensor * w = norm_weight(mul, norm);
    const ggml_tensor * a = add->src[0];
    const ggml_tensor * b = add->src[1];
    if (w == nullptr || a == nullptr || b == nullptr) {
        return false;
    }
    for (const ggml_tensor * t : {add, norm, mul, w, a, b}) {
        if (t->type != GGML_TYPE_F32 || t->data == nullptr || t->nb[0] != sizeof(float)) {
            return false;
        }
    }
    const int64_t n = add->ne[0];
    if (n < 4 || n % 4 != 0 || n > cf::cuda::kAddRmsNormMaxCols || ggml_nrows(add) > INT32_MAX) {
        return false;
    }
    for (const ggml_tensor * t : {a, b, mul}) {
        if (!ggml_are_same_shape(t, add)) {
            return false;
        }
    }
    if (!ggml_is_contiguous(w) || w->ne[0] != n || ggml_nrows(w) != 1) {
        return false;
    }
    for (const ggml_tensor * t : {add, mul, a, b}) {  // 2-D rows: one stride, 16-byte aligned starts
        if (t->ne[2] != 1 || t->ne[3] != 1 || t->nb[1] % 16 != 0 || !aligned16(t->data)) {
            return false;
        }
    }
    if (!aligned16(w->data)) {
        return false;
    }
    for (const ggml_tensor * dst : {add, mul}) {
        if (!alias_ok(dst, a) || !alias_ok(dst, b) || tensors_overlap(dst, w)) {
            return false;
        }
    }
    return !tensors_overlap(add, mul);
}

// Computes add, norm's result (not written: the norm is elided) and mul, as the file comment says; out_f16: the
// buffer for mul's rows in F16, [rows][n] contiguous, or nullptr. Call only where ..._applies said yes.
void ggml_cuda_cf_add_rms_norm(ggml_backend_cuda_context & ctx, ggml_tensor * add, const ggml_tensor * norm,
                               ggml_tensor * mul, half * out_f16) {
    const ggml_tensor * w = norm_weight(mul, norm);
    const ggml_tensor * a = add->src[0];
    const ggml_tensor * b = add->src[1];
    cf::cuda::AddRmsNormArgs p{};
    p.a = static_cast<const float *>(a->data);
    p.b = static_cast<const float *>(b->data);
    p.w = static_cast<const float *>(w->data);
    p.sum = static_cast<float *>(add->data);
    p.out = static_cast<float *>(mul->data);
    p.out_f16 = out_f16;
    p.a_stride = a->nb[1] / sizeof(float);
    p.b_stride = b->nb[1] / sizeof(float);
    p.sum_stride = add->nb[1] / sizeof(float);
    p.out_stride = mul->nb[1] / sizeof(float);
    p.rows = (int32_t) ggml_nrows(add);
    p.n = (int32_t) add->ne[0];
    memcpy(&p.eps, norm->op_params, sizeof(float));
    if (const char * err = cf::cuda::add_rms_norm_check(p)) {
        GGML_ABORT("%s", err);  // ..._applies said yes: a broken promise, not bad input
    }
    cf::cuda::add_rms_norm_launch(p, ctx.stream());
    CUDA_CHECK(cudaGetLastError());
}
