// paged_attention_cpu.h - CPU paged attention: each token attends over its own sequence's KV
// blocks, read through a block table; no KQ mask, no gathered copy of the context.
//
// These are the CPU implementation of GGML_OP_PAGED_ATTN (ggml_paged_attn, patches/0004), the op of
// every attention layer in paged KV mode (patches/0002); its contract (shapes, dtypes, op params) is
// documented at ggml_paged_attn in ggml.h. CMake compiles this folder into ggml's CPU backend
// (GGML_CPU_PAGED_ATTN_SOURCES), whose compute_forward calls paged_attention_op.cpp; the op param
// `kernel` picks the implementation (llama_context_params.paged_attn_kernel, from the engine's
// paged_attention setting).
//
// Causality comes from per-token context lengths: a token at position pos of its sequence attends to
// positions [0, pos] (ctx_len = pos + 1). Position p lives in pool row
// block_table[p / block_size] * block_size + p % block_size.
//
// Work is split over (run of tokens of one sequence, kv head) items: all query heads of one KV head
// (GQA group) share each K/V row load and its f16 -> f32 conversion. Softmax is online (running max
// and sum per query head). Two implementations (below) differ in rounding only: the invariant one
// (the engine's default, CF_PAGED_ATTENTION_INVARIANT), or llama.cpp's own flash attention arithmetic.
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

namespace cf {

// One paged attention call over plain pointers (what the ggml op adaptor extracts from its tensors).
struct PagedAttentionArgs {
    const char * q;                  // [n_tokens][n_head][head_dim_k] f32, strides below
    size_t q_stride_head_bytes;
    size_t q_stride_token_bytes;
    const char * k_pool;             // [kv_size][n_head_kv * head_dim_k] k_type rows
    const char * v_pool;             // [kv_size][n_head_kv * head_dim_v] v_type rows
    ggml_type k_type;                // GGML_TYPE_F16 or GGML_TYPE_F32
    ggml_type v_type;
    size_t k_stride_row_bytes;
    size_t v_stride_row_bytes;
    int64_t kv_size;                 // rows in each pool
    const int32_t * block_tables;    // [n_seqs][block_table_stride] block ids in position order
    int64_t block_table_stride;      // int32 entries per block table row
    const int32_t * token_seq_idx;   // [n_tokens] block table row of each token
    const int32_t * token_ctx_len;   // [n_tokens] token i attends to positions [0, token_ctx_len[i])
    float * out;                     // [n_tokens][n_head][head_dim_v] f32, contiguous
    int32_t n_tokens;
    int32_t n_head;                  // query heads, a multiple of n_head_kv
    int32_t n_head_kv;
    int32_t head_dim_k;
    int32_t head_dim_v;
    int32_t block_size;              // tokens per block
    float scale;                     // KQ scale
    float softcap;                   // 0 = none, else s = softcap * tanh(s / softcap) after scaling
};

// Two implementations of one contract, differing only in floating-point rounding:
//   paged_attention_cpu       invariant: f32 throughout, key tiles of 64 aligned to absolute
//                             positions, one reduction order per (sequence, position), so a row's
//                             output bits do not depend on the other rows of the call, on how its
//                             sequence's tokens are split across calls, on the block size or on
//                             block placement; the fastest (paged_attention_cpu.cpp).
//   paged_attention_cpu_ggml  the operations of ggml's CPU flash attention (ggml_flash_attn_ext) in
//                             its order and precision, so paged mode reproduces stock mode's outputs
//                             bit for bit given the same batches; like ggml, its arithmetic changes
//                             with the number of a sequence's rows in the call
//                             (paged_attention_ggml.cpp says when).
// Each computes the work items of thread ith of nth (nth >= 1; thread-safe for distinct ith) and
// aborts (GGML_ABORT) on a block id outside the pool.
void paged_attention_cpu(const PagedAttentionArgs & args, int ith, int nth);
void paged_attention_cpu_ggml(const PagedAttentionArgs & args, int ith, int nth);

// A GGML_OP_PAGED_ATTN node's tensors and op params as PagedAttentionArgs (paged_attention_op.cpp):
// checks shapes and types against the contract in ggml.h, aborting on a mismatch (ggml_paged_attn
// checks them when the graph is built, so a mismatch is a bug). The pointers alias the tensors' data.
PagedAttentionArgs paged_attention_args(const ggml_tensor * dst);

}  // namespace cf
