// paged_attention_op.cpp - GGML_OP_PAGED_ATTN on ggml's CPU backend.
//
// patches/0004 declares the two functions below in ggml-cpu's ops.h and calls them from the CPU
// backend's compute_forward and supports_op; CMake compiles this folder into ggml-cpu
// (GGML_CPU_PAGED_ATTN_SOURCES), so they are defined here, outside the fetched tree. The op's
// contract (shapes, dtypes, op params) is at ggml_paged_attn in ggml.h.
//
// KV streaming (kernels/kv_stream.h): a node whose op params [4..5] carry a cf_kv_stream_desc first copies
// layer L's (op param [6]) K and V rows of each staged host slot staged_slots[j] into the pool rows of block
// stage_base_block + j (the staging rows, which the block manager never hands out), split over the op's
// threads, then all threads meet at a barrier and the kernel runs unchanged. No overlap on the CPU.
#include "paged_attention_cpu.h"
#include "../kv_stream.h"

// ggml-cpu's internal headers: struct ggml_compute_params and the declarations this file defines
#include "ggml-cpu-impl.h"
#include "ops.h"

#include <cstring>

namespace cf {
namespace {

// op params of a GGML_OP_PAGED_ATTN node (ggml.h)
constexpr int kParamScale = 0;       // f32
constexpr int kParamSoftcap = 1;     // f32
constexpr int kParamBlockSize = 2;   // i32, tokens per block
constexpr int kParamKernel = 3;      // i32, enum ggml_paged_attn_kernel

bool is_f16_or_f32(const ggml_tensor * t) {
    return t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_F32;
}

float op_param_f32(const ggml_tensor * t, int i) {
    float value;
    std::memcpy(&value, (const char *) t->op_params + i * sizeof(int32_t), sizeof(value));
    return value;
}

int32_t op_param_i32(const ggml_tensor * t, int i) {
    return t->op_params[i];
}

// The node's KV streaming descriptor, or nullptr (op params [4..5] zero: no streaming).
const cf_kv_stream_desc * kv_stream_desc(const ggml_tensor * t) {
    const uint64_t lo = (uint32_t) op_param_i32(t, CF_KV_STREAM_PARAM_DESC_LO);
    const uint64_t hi = (uint32_t) op_param_i32(t, CF_KV_STREAM_PARAM_DESC_HI);
    return (const cf_kv_stream_desc *) (uintptr_t) (lo | (hi << 32));
}

// Thread ith of nth copies staged blocks j = ith, ith + nth, ... of layer `layer` from the host tier into the
// pools' staging rows (kv_stream.h: host slot layout, block id rule). Returns the number staged (all threads).
int32_t stage_host_blocks(const cf_kv_stream_desc & d, int32_t layer, ggml_tensor * k, ggml_tensor * v, int ith,
                          int nth) {
    const int32_t n = *d.num_staged;
    GGML_ASSERT(n >= 0 && n <= d.max_staged && layer >= 0 && layer < d.n_layer);
    if (n == 0) {
        return 0;
    }
    // the pools' rows are the host rows: same row bytes, rows contiguous (ggml_paged_attn checks contiguity)
    GGML_ASSERT((int64_t) k->nb[1] == d.k_row_bytes && (int64_t) v->nb[1] == d.v_row_bytes);
    GGML_ASSERT(d.stage_base_block >= 0 && (int64_t) (d.stage_base_block + d.max_staged) * d.block_size <= k->ne[1]);
    const int64_t k_block_bytes = (int64_t) d.block_size * d.k_row_bytes;
    const int64_t v_block_bytes = (int64_t) d.block_size * d.v_row_bytes;
    for (int32_t j = ith; j < n; j += nth) {
        const uint8_t * slot = d.host_base + (int64_t) d.staged_slots[j] * d.host_block_bytes +
                               (int64_t) layer * (k_block_bytes + v_block_bytes);
        const int64_t row0 = (int64_t) (d.stage_base_block + j) * d.block_size;
        std::memcpy((char *) k->data + row0 * k->nb[1], slot, (size_t) k_block_bytes);
        std::memcpy((char *) v->data + row0 * v->nb[1], slot + k_block_bytes, (size_t) v_block_bytes);
    }
    return n;
}

}  // namespace

PagedAttentionArgs paged_attention_args(const ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * block_tables = dst->src[3];
    const ggml_tensor * tok_seq = dst->src[4];
    const ggml_tensor * tok_ctx = dst->src[5];

    // the contract of ggml_paged_attn (ggml.h); its constructor checks it when the graph is built
    GGML_ASSERT(dst->op == GGML_OP_PAGED_ATTN);
    GGML_ASSERT(op_param_i32(dst, kParamBlockSize) > 0);
    GGML_ASSERT(q && k && v && block_tables && tok_seq && tok_ctx);
    GGML_ASSERT(dst->type == GGML_TYPE_F32 && ggml_is_contiguous(dst));
    GGML_ASSERT(q->type == GGML_TYPE_F32 && q->nb[0] == sizeof(float));
    GGML_ASSERT(is_f16_or_f32(k) && is_f16_or_f32(v) && ggml_is_contiguous_rows(k) && ggml_is_contiguous_rows(v));
    GGML_ASSERT(block_tables->type == GGML_TYPE_I32 && ggml_is_contiguous(block_tables));
    GGML_ASSERT(tok_seq->type == GGML_TYPE_I32 && tok_ctx->type == GGML_TYPE_I32);
    const int64_t head_dim_k = q->ne[0];
    const int64_t head_dim_v = dst->ne[0];
    const int64_t n_head = q->ne[1];
    const int64_t n_tokens = q->ne[2];
    const int64_t n_head_kv = k->ne[0] / head_dim_k;
    GGML_ASSERT(dst->ne[1] == n_head && dst->ne[2] == n_tokens);
    GGML_ASSERT(n_head_kv >= 1 && k->ne[0] == n_head_kv * head_dim_k && v->ne[0] == n_head_kv * head_dim_v);
    GGML_ASSERT(n_head % n_head_kv == 0);
    GGML_ASSERT(k->ne[1] == v->ne[1] && tok_seq->ne[0] == n_tokens && tok_ctx->ne[0] == n_tokens);

    PagedAttentionArgs args;
    args.q = (const char *) q->data;
    args.q_stride_head_bytes = q->nb[1];
    args.q_stride_token_bytes = q->nb[2];
    args.k_pool = (const char *) k->data;
    args.v_pool = (const char *) v->data;
    args.k_type = k->type;
    args.v_type = v->type;
    args.k_stride_row_bytes = k->nb[1];
    args.v_stride_row_bytes = v->nb[1];
    args.kv_size = k->ne[1];
    args.block_tables = (const int32_t *) block_tables->data;
    args.block_table_stride = block_tables->ne[0];
    args.token_seq_idx = (const int32_t *) tok_seq->data;
    args.token_ctx_len = (const int32_t *) tok_ctx->data;
    args.out = (float *) dst->data;
    args.n_tokens = (int32_t) n_tokens;
    args.n_head = (int32_t) n_head;
    args.n_head_kv = (int32_t) n_head_kv;
    args.head_dim_k = (int32_t) head_dim_k;
    args.head_dim_v = (int32_t) head_dim_v;
    args.block_size = op_param_i32(dst, kParamBlockSize);
    args.scale = op_param_f32(dst, kParamScale);
    args.softcap = op_param_f32(dst, kParamSoftcap);
    return args;
}

}  // namespace cf

// Thread params->ith of params->nth computes its share of the work items (no scratch buffer). With KV
// streaming and staged blocks, the threads first stage their share of the blocks and meet at a barrier.
void ggml_compute_forward_paged_attn(const ggml_compute_params * params, ggml_tensor * dst) {
    const cf::PagedAttentionArgs args = cf::paged_attention_args(dst);
    if (const cf_kv_stream_desc * desc = cf::kv_stream_desc(dst)) {
        const int32_t layer = cf::op_param_i32(dst, CF_KV_STREAM_PARAM_LAYER);
        if (cf::stage_host_blocks(*desc, layer, dst->src[1], dst->src[2], params->ith, params->nth) > 0) {
            ggml_barrier(params->threadpool);  // every staged row is in place before any thread reads
        }
    }
    switch (cf::op_param_i32(dst, cf::kParamKernel)) {
        case GGML_PAGED_ATTN_KERNEL_GGML:
            cf::paged_attention_cpu_ggml(args, params->ith, params->nth);
            break;
        case GGML_PAGED_ATTN_KERNEL_INVARIANT:
            cf::paged_attention_cpu(args, params->ith, params->nth);
            break;
        default:
            GGML_ABORT("GGML_OP_PAGED_ATTN: unknown kernel %d", cf::op_param_i32(dst, cf::kParamKernel));
    }
}

// F16 or F32 pools and a known kernel; any head size (the kernels take head_dim at run time).
bool ggml_cpu_paged_attn_supported(const ggml_tensor * op) {
    const int32_t kernel = cf::op_param_i32(op, cf::kParamKernel);
    return cf::is_f16_or_f32(op->src[1]) && cf::is_f16_or_f32(op->src[2]) && op->src[0]->type == GGML_TYPE_F32 &&
           (kernel == GGML_PAGED_ATTN_KERNEL_GGML || kernel == GGML_PAGED_ATTN_KERNEL_INVARIANT);
}
