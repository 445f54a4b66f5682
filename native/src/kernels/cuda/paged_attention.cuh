// paged_attention.cuh - CUDA paged attention over a block-table KV pool (decode and prefill rows).
//
// Contract (the same as the CPU kernels of native/src/kernels/paged_attention_cpu.h): every query
// token t belongs to one sequence (block table row token_seq_idx[t]) and attends to positions
// [0, token_ctx_len[t]) of that sequence; position p lives in pool row
// block_tables[row][p / block_size] * block_size + p % block_size. Causality comes from the context
// lengths, so no KQ mask exists. Query head h reads KV head h / (n_head / n_head_kv).
//
// Work decomposition (grid = splits x KV heads x tokens, 128 threads per CTA), four kernels behind one launcher
// (PagedAttentionCudaArgs::kernel, default CACHEFLOW_PA_KERNEL, else the two-pass kernel until the pipelined one has
// passed on a GPU):
//   - one CTA (in the warp-split kernel, one warp) computes all n_head / n_head_kv query heads of one KV
//     head for one token, so each K/V row is loaded once per GQA group (FlashInfer's GQA decode; vLLM's
//     legacy kernel loads it once per query head instead);
//   - keys are cut into splits of S positions at ABSOLUTE boundaries [S s, S s + S) (flash-decoding,
//     Dao et al. 2023), S a function of the row's own context length; a row with one split writes its
//     output directly, longer rows write (max, sum, partial output) per split and a combine kernel merges
//     them in an order fixed by the split count;
//   - two-pass kernel (paged_attention_two_pass.cuh): S = kPagedSplitKeys = 256 for every row (split_keys_for;
//     shorter splits for short rows and longer ones for rows over 4,096 keys behind build knobs), scores of the
//     whole split, a block-wide softmax, then P.V; load shapes with bit-identical outputs (PagedLoads): narrow (4
//     K/V rows in flight per lane group), for grids of at most two CTAs per SM wide (16 rows, the first V round
//     issued before the softmax), so a lone row's CTA waits for fewer memory round trips, and for grids beyond one
//     resident wave narrow8 (narrow with registers bounded for 8 CTAs per SM instead of 7);
//   - pipelined kernel (paged_attention_pipelined.cuh, issue 11's long rows): S = max(256, pow2 >= ctx / 32)
//     (about 32 splits per long row), each warp streams its own tiles with an online softmax, K/V of the next
//     tile in flight while one is computed; the combine kernel and the split kernel use programmatic
//     dependent launch on sm_90;
//   - ring kernel (paged_attention_ring.cuh, stop 52, opt-in): the two-pass kernel's splits and combine, the query
//     heads across threads, K/V tiles through a cp.async ring, an online softmax per key group, and CTAs that stream
//     several splits of their row (a grid choice: the same bits);
//   - warp-split kernel (paged_attention_warp_split.cuh, stop 34, opt-in): a split is one warp's (S = 64 keys up to
//     4,096-key rows, then about 64 splits of at most 256), four splits per CTA in parallel; a row of at most four
//     splits is merged in its CTA, longer rows by a combine kernel.
// Batch invariance (shared/ARCHITECTURE.md, "Outputs that do not depend on the load"): every
// reduction over keys (scores, max, sum, P.V) runs in an order fixed by the row's own context length
// alone: not by the number of tokens in the step, the other sequences, the grid's split count or where
// the blocks sit. A row's output is therefore bit-identical in any batch (the test proves it).
//
// Arithmetic: f16 K/V converted to f32, scores, softmax and accumulation in f32.
//
// Prefill on tensor cores (opt-in, paged_prefill_mma.cuh): with CACHEFLOW_PAGED_PREFILL=mma in the
// environment (read once, at the first call), runs of >= 64 consecutive tokens of one sequence whose
// contexts grow by one (prefill chunks) are computed by a FlashAttention-2-style mma.sync kernel instead;
// every other token still runs the kernel above, bit for bit. That path rounds Q and P to f16 (outputs
// within ~2e-4 of the output scale of float64 on the H200 test, vs ~1e-7 here) and a token's kernel then
// depends on the length of its chunk, so the batch invariance above holds only with the path off
// (default). The workspace size and the CUDA-graph rule below include it.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace cf {
namespace cuda {

// Keys per split of long rows, the most of any split (absolute position boundaries; also the score
// buffer of one CTA).
constexpr int kPagedSplitKeys = 256;

struct PagedAttentionCudaArgs {
    const float * q;                 // [n_tokens][n_head][head_dim] f32 (device), strides below
    int64_t q_stride_head;           // elements between heads of one token
    int64_t q_stride_token;          // elements between tokens
    const half * k_pool;             // [kv_size][k_stride_row] f16 (device); KV head j at columns
    const half * v_pool;             //   [j * head_dim, (j + 1) * head_dim); same for V
    int64_t k_stride_row;            // elements between pool rows (slots), a multiple of 8
    int64_t v_stride_row;
    int64_t kv_size;                 // rows in each pool
    const int32_t * block_tables;    // [n_seqs][block_table_stride] i32 (device), block ids in position order
    int64_t block_table_stride;      // entries per row; block_table_stride * block_size bounds every context
    const int32_t * token_seq_idx;   // [n_tokens] i32 (device): block table row of each token
    const int32_t * token_ctx_len;   // [n_tokens] i32 (device): token t attends to positions [0, ctx_len)
    float * out;                     // [n_tokens][n_head][head_dim] f32 (device), contiguous
    // Optional F16 copy of out for a GEMM that takes F16 inputs (patches/0021): [n_tokens][n_head][head_dim] f16
    // (device), contiguous, each element out's value rounded to nearest even (bit for bit ggml's F32
    // -> F16 conversion of out). Written only where paged_attention_cuda_writes_f16(args) says so (the two-pass kernel
    // without the tensor-core prefill path); nullptr: not written.
    half * out_f16;
    int32_t n_tokens;
    int32_t n_head;                  // query heads, a multiple of n_head_kv
    int32_t n_head_kv;
    int32_t head_dim;                // K and V head size: 64, 128 or 256
    int32_t block_size;              // tokens per block, >= 1
    float scale;                     // KQ scale
    float softcap;                   // 0 = none, else s = softcap * tanh(s / softcap) after scaling
    // KV streaming (../kv_stream.h, kv_stream.cuh): a row index r >= stage_base_row is row r - stage_base_row of
    // k_stage / v_stage ([*][k_stride_row] / [*][v_stride_row] f16, device, 16-byte aligned) instead of the pool's.
    // k_stage == nullptr: no streaming (stage_base_row is ignored; outputs bit-identical to before).
    const half * k_stage;
    const half * v_stage;
    int64_t stage_base_row;          // desc->stage_base_block * block_size, in [0, INT32_MAX]
    // Kernel choice, for A/B runs (all 0 = the defaults; each is constant for a node, so batch invariance and
    // captured CUDA graphs hold).
    //   kernel: a PagedKernel; 0 = CACHEFLOW_PA_KERNEL (two_pass | pipelined | warp | ring) if set, else two_pass
    //     (paged_attention.cu, EnvDefaults).
    //   split_keys (pipelined only): > 0 = every split that many keys (at least ctx / 1024); 0 =
    //     CACHEFLOW_PA_SPLIT_KEYS if set, else the rule (paged_attention_pipelined.cuh, split_keys_for).
    //   pdl: 1 = programmatic dependent launch, -1 = none, 0 = CACHEFLOW_PA_PDL (0 | 1) if set, else on where the
    //     device has it (sm_90+) for the pipelined and warp-split kernels, and for the two-pass kernel on grids of
    //     at most two CTAs per SM (paged_attention.cu, small_grid).
    //   tile_rows (pipelined only): K/V rows per lane per tile, 8 (wide) or 4 (narrow register budget, more CTAs
    //     per SM); 0 = CACHEFLOW_PA_TILE_ROWS if set, else 8.
    //   loads (two_pass only): a PagedLoads; 0 = CACHEFLOW_PA_LOADS (narrow | narrow_pf | wide | by_grid | narrow8) if
    //     set, else by_grid. Outputs are bit-identical for every value.
    //   cta_warps (warp-split only): warps (splits) per CTA, 1 or 4; 0 = CACHEFLOW_PA_WARP_CTA=1 if set, else 4
    //     (paged_attention.cu, warps_per_cta). Outputs are bit-identical for every value.
    //   heads (two_pass only): a PagedHeads, the query heads of one CTA; 0 = CACHEFLOW_PA_HEADS (group | one |
    //     by_grid) if set, else by_grid. Outputs are bit-identical for every value.
    int32_t kernel;
    int32_t split_keys;
    int32_t pdl;
    int32_t tile_rows;
    int32_t loads;
    int32_t cta_warps;
    int32_t heads;
    //   ring_spc (ring only): splits one CTA streams, 1 to ring::kMaxSplitsPerCta; 0 = CACHEFLOW_PA_RING_SPC if set,
    //     else by the grid (about one resident wave; paged_attention.cu, ring_splits_per_cta). Outputs are
    //     bit-identical for every value.
    int32_t ring_spc;
};

// How many query heads one CTA of the two-pass kernel computes (paged_attention_two_pass.cuh, template argument HG).
// Work placement only: every head's sums run in the same order either way, so no choice changes an output bit.
enum PagedHeads : int32_t {
    kPagedHeadsDefault = 0,  // CACHEFLOW_PA_HEADS, else by_grid
    kPagedHeadsGroup = 1,    // the whole GQA group: each K/V row loaded once per CTA (every grid before stop 40)
    kPagedHeadsOne = 2,      // one query head per CTA: G times the CTAs, each with 1/G of the arithmetic
    kPagedHeadsByGrid = 3,   // one while the group's grid fits in two CTAs per SM (small batches), else group
};

// How the two-pass kernel moves K/V (paged_attention.cu, kRowsInFlightWide): rows in flight per lane group and
// whether the first round of V is loaded before the softmax. Loads only: no choice changes an output bit.
enum PagedLoads : int32_t {
    kPagedLoadsDefault = 0,   // CACHEFLOW_PA_LOADS, else by_grid
    kPagedLoadsNarrow = 1,    // 4 rows per round (every grid before stop 34)
    kPagedLoadsNarrowPf = 2,  // 4 rows per round, first V round before the softmax
    kPagedLoadsWide = 3,      // 16 rows per round, first V round before the softmax
    kPagedLoadsByGrid = 4,    // wide where the grid leaves most SMs idle, narrow8 where it exceeds what SMs hold of the
                              // narrow kernel at once, else narrow (paged_attention.cu, loads_for_grid, bounded_for_grid)
    kPagedLoadsNarrow8 = 5,   // narrow, with registers bounded so that an SM holds 8 CTAs (two_pass::bounded_ctas)
};

enum PagedKernel : int32_t {
    kPagedKernelDefault = 0,
    kPagedKernelTwoPass = 1,    // paged_attention.cu's register kernel (the only one before issue 11's work)
    kPagedKernelPipelined = 2,  // paged_attention_pipelined.cuh
    kPagedKernelWarp = 3,       // paged_attention_warp_split.cuh: one warp per split, 4 (or cta_warps) per CTA
    kPagedKernelRing = 4,       // paged_attention_ring.cuh: heads across threads, a cp.async ring, several splits per
                                // CTA; shapes it does not cover (ring::covers) run the two-pass kernel
};

// nullptr if the kernel covers these shapes (head size, GQA ratio up to 8, alignment), else why not.
const char * paged_attention_cuda_unsupported(const PagedAttentionCudaArgs & args);

// Bytes of device workspace paged_attention_cuda needs (partial results of multi-split rows; 0 when
// block_table_stride * block_size <= one split, where every row has one split). Depends on the kernel chosen.
size_t paged_attention_cuda_workspace_bytes(const PagedAttentionCudaArgs & args);

// Whether paged_attention_cuda writes args.out_f16 (when set) for these arguments: the two-pass kernel only
// (PagedKernel, as the call would choose it), and not where the opt-in tensor-core prefill path overwrites rows of out.
bool paged_attention_cuda_writes_f16(const PagedAttentionCudaArgs & args);

// Launch on `stream` (asynchronous; capturable in a CUDA graph: the grid depends only on n_tokens,
// n_head_kv and block_table_stride * block_size). `workspace` must hold
// paged_attention_cuda_workspace_bytes(args) bytes, 16-byte aligned (may be nullptr when that is 0).
// Returns nullptr on success, else a message with file and line (unsupported shapes, launch error).
const char * paged_attention_cuda(const PagedAttentionCudaArgs & args, void * workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace cf
