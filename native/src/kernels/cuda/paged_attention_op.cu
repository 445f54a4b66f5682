// paged_attention_op.cu - GGML_OP_PAGED_ATTN on ggml-cuda: the op's tensors (contract at ggml_paged_attn in
// ggml.h and in README.md here) as PagedAttentionCudaArgs, then the kernel of paged_attention.cu.
//
// Compiled into the ggml-cuda target (hook of patches/0004-ggml-paged-attn-op.patch), which declares the two
// functions below and calls them from its compute and supports_op switches.
//
// KV streaming (../kv_stream.h): a node whose op params [4..5] hold a non-null cf_kv_stream_desc pointer streams
// layer op params [6]: kv_stream.cu's before-hook (wait for the layer's staged rows; at layer 0 fork the side stream
// and start the first copies), the kernel reading ids >= stage_base_block from the staging slot, the after-hook
// (prefetch layer + depth into the slot just read). The desc must be reserved and agree with the node's tensors.
#include "ggml-cuda/common.cuh"
#include "kv_stream.cuh"
#include "paged_attention.cuh"

#include <cstring>

namespace {

float op_param_f32(const ggml_tensor * t, int i) {
    float v;
    std::memcpy(&v, reinterpret_cast<const char *>(t->op_params) + i * sizeof(int32_t), sizeof(v));
    return v;
}

int32_t op_param_i32(const ggml_tensor * t, int i) {
    return reinterpret_cast<const int32_t *>(t->op_params)[i];
}

cf::cuda::PagedAttentionCudaArgs paged_attention_cuda_args(const ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    cf::cuda::PagedAttentionCudaArgs a{};
    a.q = static_cast<const float *>(q->data);
    a.q_stride_head = (int64_t) (q->nb[1] / sizeof(float));
    a.q_stride_token = (int64_t) (q->nb[2] / sizeof(float));
    a.k_pool = static_cast<const half *>(k->data);
    a.v_pool = static_cast<const half *>(v->data);
    a.k_stride_row = (int64_t) (k->nb[1] / sizeof(half));
    a.v_stride_row = (int64_t) (v->nb[1] / sizeof(half));
    a.kv_size = k->ne[1];
    a.block_tables = static_cast<const int32_t *>(dst->src[3]->data);
    a.block_table_stride = dst->src[3]->ne[0];
    a.token_seq_idx = static_cast<const int32_t *>(dst->src[4]->data);
    a.token_ctx_len = static_cast<const int32_t *>(dst->src[5]->data);
    a.out = static_cast<float *>(dst->data);
    a.n_tokens = (int32_t) q->ne[2];
    a.n_head = (int32_t) q->ne[1];
    a.head_dim = (int32_t) q->ne[0];
    a.n_head_kv = a.head_dim > 0 ? (int32_t) (k->ne[0] / a.head_dim) : 0;
    a.block_size = op_param_i32(dst, 2);
    a.scale = op_param_f32(dst, 0);
    a.softcap = op_param_f32(dst, 1);
    return a;
}

// nullptr when the kernel covers `op`, else why not (layouts the launcher cannot check itself).
const char * paged_attention_cuda_layout_unsupported(const ggml_tensor * op) {
    const ggml_tensor * q = op->src[0];
    const ggml_tensor * k = op->src[1];
    const ggml_tensor * v = op->src[2];
    if (q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float) || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return "q and the output must be f32 with contiguous rows";
    }
    if (k->type != GGML_TYPE_F16 || v->type != GGML_TYPE_F16) {
        return "the K/V pools must be f16";
    }
    if (op->ne[0] != q->ne[0] || v->ne[0] != k->ne[0]) {
        return "K and V head sizes must be equal";
    }
    for (int i = 3; i <= 5; ++i) {
        if (op->src[i]->type != GGML_TYPE_I32 || !ggml_is_contiguous(op->src[i])) {
            return "block tables and token inputs must be contiguous i32";
        }
    }
    if (q->ne[0] == 0 || k->ne[0] % q->ne[0] != 0) {
        return "the K pool row must hold whole heads";
    }
    if (op_param_i32(op, 3) != GGML_PAGED_ATTN_KERNEL_INVARIANT) {
        return "only the invariant kernel is implemented on CUDA (ggml-cuda's flash attention arithmetic is not replayed)";
    }
    return nullptr;
}

const cf_kv_stream_desc * kv_stream_desc(const ggml_tensor * t) {
    const uint64_t lo = (uint32_t) op_param_i32(t, CF_KV_STREAM_PARAM_DESC_LO);
    const uint64_t hi = (uint32_t) op_param_i32(t, CF_KV_STREAM_PARAM_DESC_HI);
    return reinterpret_cast<const cf_kv_stream_desc *>((uintptr_t) (lo | (hi << 32)));
}

// Aborts, naming the field, when desc disagrees with dst's tensors or the context's device.
void kv_stream_check(const ggml_backend_cuda_context & ctx, const ggml_tensor * dst, const cf_kv_stream_desc * d,
                     int layer) {
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const char * why = nullptr;
    if (d->device != ctx.device) {
        why = "desc->device is not the device of the node";
    } else if (d->block_size != op_param_i32(dst, 2)) {
        why = "desc->block_size is not the op's block size (op params [2])";
    } else if (d->k_row_bytes != (int64_t) k->nb[1] || d->v_row_bytes != (int64_t) v->nb[1]) {
        why = "desc->k_row_bytes / v_row_bytes are not the K / V pool row strides (nb[1])";
    } else if ((int64_t) d->stage_base_block * d->block_size > k->ne[1]) {
        why = "desc->stage_base_block * block_size exceeds the pool's rows (CUDA: stage_base_block = kv_size / block_size)";
    } else if (layer < 0 || layer >= d->n_layer) {
        why = "op params [6] (layer) is not in [0, desc->n_layer)";
    }
    if (why != nullptr) {
        GGML_ABORT("paged attention (CUDA) KV streaming: %s (node %s, layer %d)", why, dst->name, layer);
    }
}

}  // namespace

bool ggml_cuda_paged_attn_supported(int device, const ggml_tensor * op) {
    (void) device;  // sm_70+ is enough: plain loads, warp shuffles, f16 conversions
    if (paged_attention_cuda_layout_unsupported(op) != nullptr) {
        return false;
    }
    return cf::cuda::paged_attention_cuda_unsupported(paged_attention_cuda_args(op)) == nullptr;
}

namespace {

// The op on ctx's stream; out_f16 as in ggml_cuda_cf_paged_attn_f16. Returns whether out_f16 was written.
bool run_paged_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst, half * out_f16) {
    if (const char * why = paged_attention_cuda_layout_unsupported(dst)) {
        GGML_ABORT("paged attention (CUDA): %s", why);
    }
    cf::cuda::PagedAttentionCudaArgs args = paged_attention_cuda_args(dst);
    args.out_f16 = out_f16 != nullptr && cf::cuda::paged_attention_cuda_writes_f16(args) ? out_f16 : nullptr;
    const cf_kv_stream_desc * desc = kv_stream_desc(dst);
    const int layer = op_param_i32(dst, CF_KV_STREAM_PARAM_LAYER);
    if (desc != nullptr) {
        kv_stream_check(ctx, dst, desc, layer);
        cf::cuda::KvStreamStage stage{};
        if (const char * err = cf::cuda::kv_stream_before_layer(ctx.stream(), desc, layer, &stage)) {
            GGML_ABORT("%s", err);
        }
        args.k_stage = stage.k;
        args.v_stage = stage.v;
        args.stage_base_row = stage.base_row;
    }
    const size_t workspace_bytes = cf::cuda::paged_attention_cuda_workspace_bytes(args);
    ggml_cuda_pool_alloc<char> workspace(ctx.pool());
    if (workspace_bytes > 0) {
        workspace.alloc(workspace_bytes);
    }
    if (const char * err = cf::cuda::paged_attention_cuda(args, workspace.ptr, ctx.stream())) {
        GGML_ABORT("%s", err);
    }
    if (desc != nullptr) {
        if (const char * err = cf::cuda::kv_stream_after_layer(ctx.stream(), desc, layer)) {
            GGML_ABORT("%s", err);
        }
    }
    return args.out_f16 != nullptr;
}

}  // namespace

void ggml_cuda_paged_attn(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    run_paged_attn(ctx, dst, nullptr);
}

// patches/0021: the op as above and, where the kernel writes one (paged_attention_cuda_writes_f16: the two-pass
// kernel), the F16 copy of dst in out_f16 ([n_tokens][n_head][head_dim] f16, device, contiguous; ggml-cuda's shared
// src1 buffer of patches/0008), so the output projection's GEMM that reads dst next converts nothing. Returns whether
// out_f16 was written; out_f16 == nullptr: nothing but dst.
bool ggml_cuda_cf_paged_attn_f16(ggml_backend_cuda_context & ctx, ggml_tensor * dst, half * out_f16) {
    return run_paged_attn(ctx, dst, out_f16);
}
