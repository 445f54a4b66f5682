// paged_prefill_mma.cuh - opt-in tensor-core path for the prefill chunks of a paged attention call.
//
// What it does: among the query tokens of one paged_attention_cuda call, a RUN is a maximal sequence of
// consecutive tokens t, t + 1, ... with the same token_seq_idx whose token_ctx_len grows by one from
// each token to the next (a prefill chunk: positions P .. P + n - 1 attending to [0, P + 1) .. [0, P + n)).
// Runs of at least kPagedPrefillMinRun tokens are computed by a FlashAttention-2-style kernel (Dao 2023):
// a CTA takes kPagedPrefillRows query rows (row = (token, query head) of one GQA group, tokens major) and
// streams the sequence's K/V through the block table in tiles of kPagedPrefillKeys positions (cp.async
// 16-byte copies into shared memory, ldmatrix, mma.sync m16n8k16 f16 x f16 -> f32), with an f32 online
// softmax and the causal mask taken from each token's token_ctx_len. Every other token (decode rows,
// shorter runs) keeps the kernel of paged_attention.cu, unchanged.
//
//   token index:  0    1    2  | 3    4   ...  3+n-1 | 3+n ...
//   seq / ctx:    a/9  b/40 c/7| d/P+1 d/P+2 .. d/P+n | e/1 ...
//                 rows kernel  | MMA (n >= kPagedPrefillMinRun)  | rows kernel or MMA
//
// Selection (read once per process, by the launcher, at its first call): environment variable
// CACHEFLOW_PAGED_PREFILL=mma turns the path on; unset, empty or "rows" leaves it off (the default);
// any other value leaves it off and says so once on stderr. The path applies to a call when it is on,
// the device is sm_80 or newer, head_dim is 64 or 128, q is 16-byte aligned with strides a multiple of
// 4 floats, and n_tokens >= kPagedPrefillMinRun; otherwise the call runs exactly as without it.
//
// Numerics (why it is opt-in): the MMA path rounds Q and the softmax probabilities to f16 and sums in
// the tensor cores' order, so a run's outputs differ from the rows kernel's by about 1e-3 of the output
// scale (test_paged_attention_cuda.cu measures it against float64). Each row's output still depends
// only on its own query, context length and K/V (key tiles start at absolute positions; a row never
// sees the other rows of its tile), but WHICH kernel computes a token depends on the batch: the same
// token is a rows-kernel token when its chunk is shorter than kPagedPrefillMinRun. With the path on, the
// batch invariance of paged_attention.cuh therefore holds only for tokens whose run classification does
// not change; with it off (default) outputs are bit-identical to before.
//
// CUDA graphs: both kernels' grids depend only on n_tokens and n_head_kv (and the GQA ratio); runs are
// found on the device from token_seq_idx / token_ctx_len by a one-CTA scan, and CTAs whose tiles hold no
// run exit at once, so a captured graph stays valid while the batch's composition changes.
//
// Streaming: rows >= stage_base_row are read from k_stage / v_stage, as in the rows kernel.
// Refused (falls back to the rows kernel): head size 256 (registers), pre-sm_80 devices.
#pragma once

#include "paged_attention.cuh"

#include <cuda_runtime.h>

#include <cstddef>

namespace cf {
namespace cuda {

constexpr int kPagedPrefillMinRun = 64;  // shortest run (tokens) the MMA path takes
// Warps per CTA (16 query rows each): CF_PF_WARPS, a build knob of the standalone benchmark (4 or 8). On the
// H200 (2048-token chunk, D 128, 32/8 heads) 8 warps run 453 / 1650 / 6689 us at context 2K / 8K / 32K, 4 warps
// 468 / 1834 / 7539 us (one vs two CTAs per SM, 220 registers a thread either way).
#ifndef CF_PF_WARPS
#define CF_PF_WARPS 8
#endif
constexpr int kPagedPrefillRows = 16 * CF_PF_WARPS;  // query rows (token, head) per CTA
constexpr int kPagedPrefillKeys = 64;    // K/V positions per shared-memory tile

// Whether CACHEFLOW_PAGED_PREFILL=mma (read at the first call, cached), or the test override below.
bool paged_prefill_mma_enabled();

// The standalone test and benchmark switch the path per call with this; the engine never calls it.
void paged_prefill_mma_set_enabled_for_testing(bool enabled);

// Whether the MMA path runs for these arguments (see "Selection"); args must already be accepted by
// paged_attention_cuda_unsupported.
bool paged_prefill_mma_applies(const PagedAttentionCudaArgs & args);

// Device workspace of the MMA path: 3 * n_tokens int32 (run starts, the rows kernel's context lengths,
// scratch), 0 when it does not apply. paged_attention_cuda_workspace_bytes includes it.
size_t paged_prefill_mma_workspace_bytes(const PagedAttentionCudaArgs & args);

// Step 1 (before the rows kernel): finds the runs on `stream` and writes into `workspace` the context
// lengths the rows kernel must use instead of args.token_ctx_len (1 for tokens of an MMA run, so the rows
// kernel does a one-key row whose output step 2 overwrites; the others unchanged); *rows_ctx_len points
// at them ([n_tokens] int32, device). Returns nullptr or a message with file and line.
const char * paged_prefill_mma_prepare(const PagedAttentionCudaArgs & args, void * workspace, cudaStream_t stream,
                                       const int32_t ** rows_ctx_len);

// Step 2 (after the rows kernel, same stream and workspace): the MMA kernel writes the outputs of every
// token of a run. Returns nullptr or a message with file and line.
const char * paged_prefill_mma_launch(const PagedAttentionCudaArgs & args, void * workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace cf
