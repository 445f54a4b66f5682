/* kv_stream.h - KV streaming (issue 16): KV blocks that live in a host tier are staged into memory the paged
 * attention op reads, layer by layer, just before that layer's attention. The C contract between the engine
 * (libcacheflow: owns the descriptor, the host tier and the per-decode list) and the op's implementations
 * (ggml-cpu: kernels/cpu/paged_attention_op.cpp; ggml-cuda: kernels/cuda/kv_stream.cu).
 *
 * How the op finds it: a GGML_OP_PAGED_ATTN node whose op params [4..5] hold a non-null pointer to a
 * cf_kv_stream_desc (op params [6]: the node's layer in the host layout) streams; null means no streaming
 * (patches/0002 sets them from llama_context_params.paged_kv_stream; ggml.h documents the op params).
 *
 * Block ids in the op's block tables:
 *   id <  stage_base_block   a block of the layer's K/V pools, as without streaming;
 *   id >= stage_base_block   staged block j = id - stage_base_block (0 <= j < *num_staged): its rows for this layer
 *                            are host slot staged_slots[j]'s rows for this layer, copied in before the layer's
 *                            attention runs.
 *   CPU: the staging rows are the pool's own rows (blocks [stage_base_block, stage_base_block + max_staged) of each
 *        layer's pool, which the block manager never hands out); the op copies layer L's rows of every staged block
 *        into them before its kernel (no overlap: the CPU has no second engine to overlap with).
 *   CUDA: stage_base_block is the pool's block count (kv_size / block_size) and the rows live in a separate device
 *        staging pool of `depth` layer slots x max_staged blocks (K and V), allocated once by
 *        ggml_cuda_cf_kv_stream_reserve; layer L reads slot L % depth. While layer L computes, a side stream copies
 *        the host rows that layer L + depth will read into slot (L + depth) % depth once layer L's attention has
 *        read it; an event orders each copy before its layer's attention (layer-ahead prefetch, FastFlowLM).
 *
 * Host tier layout (the swap space's, engine/swapper.h and patches/0007): slot h is bytes
 * [h * host_block_bytes, (h + 1) * host_block_bytes) of host_base; in it layer L's K rows (block_size rows of
 * k_row_bytes) start at L * (k_block_bytes + v_block_bytes) and its V rows k_block_bytes after them, where
 * k_block_bytes = block_size * k_row_bytes and v_block_bytes = block_size * v_row_bytes.
 *
 * Ownership and timing: the engine owns the descriptor and every buffer it names, and keeps them alive and unchanged
 * while any decode that can read them runs. It rewrites staged_slots / num_staged only between decodes whose
 * computation is complete (it synchronizes the context first). On CUDA host_base and the two lists are pinned host
 * memory, read by kernels through unified addressing at run time (so a captured CUDA graph stays valid while the list
 * changes); the op's grid does not depend on *num_staged.
 * Thread-safety: none beyond that ordering.
 */
#ifndef CF_KV_STREAM_H
#define CF_KV_STREAM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cf_kv_stream_desc {
    int32_t n_layer;           /* layers of the host layout (every layer has KV; op params [6] < n_layer) */
    int32_t block_size;        /* tokens per block, as the op's block size */
    int32_t stage_base_block;  /* first staged block id (see above) */
    int32_t max_staged;        /* staging capacity in blocks per layer slot, >= 1 */
    int32_t depth;             /* CUDA: layers whose staging may be in flight at once, 1 <= depth <= n_layer */
    int32_t device;            /* CUDA device ordinal of the pools, -1 on the CPU */
    int64_t k_row_bytes;       /* bytes of one K pool row (all KV heads) of one layer; same for every layer */
    int64_t v_row_bytes;       /* same for V */
    const uint8_t * host_base; /* [num_host_slots * host_block_bytes] host tier (pinned on CUDA) */
    int64_t host_block_bytes;  /* n_layer * block_size * (k_row_bytes + v_row_bytes) */
    const int32_t * staged_slots; /* [max_staged] host slot of staged block j (pinned on CUDA) */
    const int32_t * num_staged;   /* [1] staged blocks of the next decode, 0 <= *num_staged <= max_staged (pinned on CUDA) */
} cf_kv_stream_desc;

/* op params of a GGML_OP_PAGED_ATTN node that carry the descriptor (ggml.h): [4] low and [5] high 32 bits of the
 * cf_kv_stream_desc pointer, [6] the layer */
enum { CF_KV_STREAM_PARAM_DESC_LO = 4, CF_KV_STREAM_PARAM_DESC_HI = 5, CF_KV_STREAM_PARAM_LAYER = 6 };

/* "ggml_cuda_cf_kv_stream_reserve" (ggml-cuda's get_proc_address, kernels/cuda/kv_stream.cu): allocate the
 * device staging pool of desc (depth x max_staged blocks of K and V rows) on desc->device, its side stream and
 * events, before the first decode (never in the step loop). Keyed by desc: a second call with the same desc is a
 * no-op. 0, or a cudaError_t value, or -1 for invalid fields. */
typedef int (*cf_cuda_kv_stream_reserve_fn)(const cf_kv_stream_desc * desc);

/* "ggml_cuda_cf_kv_stream_release": free what reserve allocated for desc (after the context's last decode). */
typedef void (*cf_cuda_kv_stream_release_fn)(const cf_kv_stream_desc * desc);

/* "ggml_cuda_cf_kv_stream_stats": since reserve, out[0] = bytes staged (host -> device), out[1] = device time of the
 * staging copies in ns (on CUDA measured inside each layer's gather kernel, %globaltimer from its first CTA's start
 * to its last CTA's end, so CUDA graph replays count too; only completed copies are counted), out[2] = layers
 * whose attention had to wait for its copy (the copy's end event was not complete when the layer was enqueued,
 * eager launches only; -1 when unknown), out[3] = decodes that staged at least one block. out[0], out[1] and
 * out[3] count graph replays; call it between decodes, after the context synchronized (it waits for the side
 * stream). */
typedef void (*cf_cuda_kv_stream_stats_fn)(const cf_kv_stream_desc * desc, int64_t out[4]);

#ifdef __cplusplus
}
#endif

#endif /* CF_KV_STREAM_H */
