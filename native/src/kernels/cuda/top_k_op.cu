// top_k_op.cu - GGML_OP_TOP_K on ggml-cuda through top_k_rows.cu (all rows in one launch) where it applies:
// the batched top-k candidates of patches/0006 (one node over every output row of a decode), and any other
// top-k over f32 rows. The ids per row come in the order top_k_rows.cuh documents; ggml_top_k promises no
// order, so every caller is served.
//
// Compiled into the ggml-cuda target (hook of patches/0004 for CacheFlow's CUDA sources); patches/0006 declares
// the two functions below in ggml-cuda.cu and calls them first from its GGML_OP_TOP_K case.
#include "ggml-cuda/common.cuh"
#include "top_k_rows.cuh"

#include <climits>

bool ggml_cuda_cf_top_k_applies(const ggml_tensor * dst) {
    const ggml_tensor * src = dst->src[0];
    return src->type == GGML_TYPE_F32 && dst->type == GGML_TYPE_I32 && ggml_is_contiguous(src) &&
           ggml_is_contiguous(dst) && src->ne[0] <= INT_MAX && ggml_nrows(src) <= INT_MAX && dst->ne[0] >= 1 &&
           dst->ne[0] <= src->ne[0];
}

void ggml_cuda_cf_top_k(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * src = dst->src[0];
    cf::cuda::TopKRowsArgs a{};
    a.src = static_cast<const float *>(src->data);  // [n_rows][n_cols]
    a.src_stride = src->ne[0];
    a.dst_ids = static_cast<int32_t *>(dst->data);  // [n_rows][k]
    a.dst_stride = dst->ne[0];
    a.n_rows = (int32_t) ggml_nrows(src);
    a.n_cols = (int32_t) src->ne[0];
    a.k = (int32_t) dst->ne[0];
    // the tensors live in this backend's buffers: shapes only
    if (const char * err = cf::cuda::top_k_rows_check(a, /*check_device=*/false)) {
        GGML_ABORT("%s", err);
    }
    cf::cuda::top_k_rows_launch(a, ctx.stream());
    CUDA_CHECK(cudaGetLastError());
}
