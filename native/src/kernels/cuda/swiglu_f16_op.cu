// swiglu_f16_op.cu - a graph's SWIGLU (GGML_OP_GLU, GGML_GLU_OP_SWIGLU) on ggml-cuda with its result also written in
// F16 (swiglu_f16.cuh), for patches/0021, which declares the two functions below in ggml-cuda.cu and calls them from
// its compute switch where CacheFlow's engine asks for it.
//
// At decode batch sizes the FFN's down projection (a cuBLAS F16 GEMM) first converts the SWIGLU's F32 rows to F16, a
// launch of its own per layer: 1.5 us 16 times a step at 64 sequences of the 1B shape on an H100
// (results/h200_gpu/stop45). Here the SWIGLU writes those F16 rows into ggml-cuda's shared src1 buffer (patches/0008)
// as it writes dst, and the GEMM reads them. dst itself is written as ggml's kernel writes it, bit for bit.
//
// Compiled into the ggml-cuda target (hook of patches/0004 for CacheFlow's CUDA sources).
#include "ggml-cuda/common.cuh"
#include "op_util.cuh"
#include "swiglu_f16.cuh"

#include <cstdint>

namespace {

using cf::cuda::aligned16;
using cf::cuda::tensors_overlap;

// gate and up of dst as ggml's gated op reads them (unary.cu, ggml_cuda_op_unary_gated): two sources, or the halves
// of one (op_params[1] "swapped": up first); the row strides in floats.
struct GateUp {
    const float * gate;
    const float * up;
    int64_t gate_stride, up_stride;
};

GateUp gate_up_of(const ggml_tensor * dst) {
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    const float * a = static_cast<const float *>(src0->data);
    if (src1 != nullptr) {
        return {a, static_cast<const float *>(src1->data), (int64_t) (src0->nb[1] / sizeof(float)),
                (int64_t) (src1->nb[1] / sizeof(float))};
    }
    const int64_t nc = dst->ne[0];
    const bool swapped = reinterpret_cast<const int32_t *>(dst->op_params)[1] != 0;
    const int64_t stride = (int64_t) (src0->nb[1] / sizeof(float));
    return {a + (swapped ? nc : 0), a + (swapped ? 0 : nc), stride, stride};
}

}  // namespace

// Whether dst is a SWIGLU this kernel computes: F32 throughout, 2-D (rows of dst->ne[0] floats, at most 65,535 rows),
// contiguous dst, sources with unit element stride, 16-byte aligned row starts and strides, dst overlapping neither
// source.
bool ggml_cuda_cf_swiglu_applies(const ggml_tensor * dst) {
    if (dst->op != GGML_OP_GLU || ggml_get_glu_op(dst) != GGML_GLU_OP_SWIGLU) {
        return false;
    }
    const ggml_tensor * src0 = dst->src[0];
    const ggml_tensor * src1 = dst->src[1];
    for (const ggml_tensor * t : {dst, src0, src1}) {
        if (t == nullptr) {
            continue;
        }
        if (t->type != GGML_TYPE_F32 || t->data == nullptr || t->nb[0] != sizeof(float) || t->ne[2] != 1 ||
            t->ne[3] != 1 || t->ne[1] != dst->ne[1]) {
            return false;
        }
    }
    if (tensors_overlap(dst, src0) || (src1 != nullptr && tensors_overlap(dst, src1))) {
        return false;
    }
    const int64_t n = dst->ne[0];
    if (!ggml_is_contiguous(dst) || n < 4 || n % 4 != 0 || dst->ne[1] > 65535) {
        return false;
    }
    if (src0->ne[0] != (src1 != nullptr ? n : 2 * n) || (src1 != nullptr && src1->ne[0] != n)) {
        return false;
    }
    const GateUp g = gate_up_of(dst);
    return aligned16(g.gate) && aligned16(g.up) && aligned16(dst->data) && g.gate_stride % 4 == 0 &&
           g.up_stride % 4 == 0;
}

// dst as ggml's SWIGLU computes it and, with out_f16 ([rows][n] f16, device, contiguous, 16-byte aligned; ggml-cuda's
// shared src1 buffer), its rows in F16 (nullptr: not written). Call only where ..._applies said yes.
void ggml_cuda_cf_swiglu(ggml_backend_cuda_context & ctx, ggml_tensor * dst, half * out_f16) {
    const GateUp g = gate_up_of(dst);
    cf::cuda::SwigluArgs p{};
    p.gate = g.gate;
    p.up = g.up;
    p.out = static_cast<float *>(dst->data);
    p.out_f16 = out_f16;
    p.gate_stride = g.gate_stride;
    p.up_stride = g.up_stride;
    p.rows = (int32_t) dst->ne[1];
    p.n = (int32_t) dst->ne[0];
    if (const char * err = cf::cuda::swiglu_f16_check(p)) {
        GGML_ABORT("%s", err);  // ..._applies said yes: a broken promise, not bad input
    }
    cf::cuda::swiglu_f16_launch(p, ctx.stream());
    CUDA_CHECK(cudaGetLastError());
}
