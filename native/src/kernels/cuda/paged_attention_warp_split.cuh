// paged_attention_warp_split.cuh - the warp-split paged attention decode kernel (PagedKernel kPagedKernelWarp,
// CACHEFLOW_PA_KERNEL=warp) and its combine kernel; included by paged_attention.cu and by
// native/tests/cuda/emulate_paged_attention.cpp (the same code under g++, where no GPU is at hand). Contract
// and batch invariance: paged_attention.cuh. Stop 34, written and checked on the CPU emulator only.
//
// Why a third kernel. The two-pass kernel gives each 256-key split a whole CTA whose four warps cooperate through
// block-wide barriers (scores, a block softmax, P.V, a cross-warp reduction): a lone short row (B=1) is 8 CTAs on a
// 132-SM GPU, each a chain of ~10 memory round trips, 11-12 us per layer where FlashInfer's decode takes 6.3
// (results/h200_gpu/stop28). Shorter splits cut that latency but cost big batches more CTAs and a combine pass
// (results/h200_gpu/stop24/kernel_short_splits.txt). Here a split is the unit of ONE WARP, as in FlashInfer's
// decode (each warp a chunk of keys, partial states merged after):
//   - split s of a row covers keys [s S, s S + S), S = split_keys_for(ctx) (64 for rows up to 4,096 keys, then a
//     power of two giving about 64 splits, at most 256 keys: a function of the row's length alone);
//   - CTA x takes splits Wx .. Wx+W-1 (warp w: split Wx + w), all of one row and KV head, in parallel: a row of at
//     most W splits is ONE CTA that merges its warps' states and writes the output (no combine launch); longer rows
//     write each split's (m, l, o) and a combine kernel merges all of them. W (warps per CTA, template argument) is
//     4 (kWarps), or 1 (kWarpsOne) as an A/B knob (cta_warps / CACHEFLOW_PA_WARP_CTA=1: a lone 256-key row is
//     32 CTAs on 32 SMs, not 8 on 8; measured slower, results/h200_gpu/stop38); the merge is the same formula in the
//     CTA and in the combine kernel, so W, like the load shape, changes no output bit;
//   - within a warp: one lane group of TG = D / 8 lanes per key (16 bytes of the K/V row each, all G query heads of
//     the KV head: each K/V byte is loaded once per GQA group), KPW = 32 / TG keys per load instruction, up to
//     kRoundRows rows per lane in flight per round (one round of K and one of V for a 64-key split at D 64), the
//     first V round issued before the softmax; the warp's scores in its own shared-memory slice, no block barrier
//     before the merge.
// Reduction order (fixed by the row's length only, so a row's output is bit-identical in any batch): the score of
// key i is one lane group's dot (lanes' 8 dims in order, then a butterfly over the TG lanes), times the scale, then
// the soft cap; the split's max is exact; its sum of exp: lane j adds keys j, j + 32, ... in order, then a warp
// butterfly (16, 8, 4, 2, 1); P.V: lane group g adds keys g, g + KPW, g + 2 KPW, ... in order, then a butterfly over
// the groups (TG, 2 TG, ...); the merge of a row's splits: m = max of the splits' maxima, l = sum in split order of
// exp(m_s - m) l_s, o = sum in split order of exp(m_s - m) o_s, output o / l (the same formula in the CTA and in the
// combine kernel; a row always takes the same one).
#pragma once

#include "paged_attention.cuh"
#include "paged_attention_pipelined.cuh"
#include "paged_attention_two_pass.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cf {
namespace cuda {
namespace warp_split {

using pipelined::halves_to_float;
using pipelined::kv_row;
// A key's score and its P.V term, as the two-pass kernel computes them (one lane group per key, 8 dims per lane).
using two_pass::accumulate_pv;
using two_pass::store_scores;

constexpr int kWarps = 4;           // warps (splits) per CTA on large grids
constexpr int kWarpsOne = 1;  // one-warp CTAs: an A/B knob (warps_per_cta in paged_attention.cu)
using two_pass::kCombineThreads;  // its combine kernel is the two-pass kernel's merge (two_pass::combine_splits)
// The split rule's knobs (build-time, for scripts/cuda_kernel_variants.sh): rows up to kMinSplitKeys x
// kTargetSplits keys use kMinSplitKeys-key splits; longer rows the power of two giving about kTargetSplits splits,
// at most kMaxSplitKeys keys (the warps' score slices: kWarps x G x kMaxSplitKeys floats of shared memory).
#ifndef CF_PA_WARP_MIN_SPLIT
#define CF_PA_WARP_MIN_SPLIT 64
#endif
#ifndef CF_PA_WARP_TARGET_SPLITS
#define CF_PA_WARP_TARGET_SPLITS 64
#endif
constexpr int kMinSplitKeys = CF_PA_WARP_MIN_SPLIT;
constexpr int kTargetSplits = CF_PA_WARP_TARGET_SPLITS;
constexpr int kMaxSplitKeys = 256;
static_assert(kMaxSplitKeys == kPagedSplitKeys, "the score slices are the two-pass kernel's [G][kPagedSplitKeys]");
// K/V rows per lane in flight in one round, in the kernel's two load shapes (the template argument kRows): wide
// (16: one round of K and one of V for a 64-key split at head size 64) for grids that leave SMs idle, narrow (4:
// fewer registers, more CTAs per SM) otherwise. Like the two-pass kernel's PagedLoads they move loads only: a key's
// score, the lane-strided softmax and each lane group's P.V run in the same order in both, so their outputs are
// bit-identical and the launcher may choose by the grid (emulate_paged_attention.cpp checks it).
#ifndef CF_PA_WARP_ROUND_ROWS
#define CF_PA_WARP_ROUND_ROWS 16
#endif
#ifndef CF_PA_WARP_ROUND_ROWS_NARROW
#define CF_PA_WARP_ROUND_ROWS_NARROW 4
#endif
constexpr int kRoundRowsWide = CF_PA_WARP_ROUND_ROWS;
constexpr int kRoundRowsNarrow = CF_PA_WARP_ROUND_ROWS_NARROW;
// CTAs of kWarps warps per SM the register allocation must allow (__launch_bounds__'s second argument, scaled for
// one-warp CTAs; 1 = the compiler's choice).
#ifndef CF_PA_WARP_MIN_CTAS
#define CF_PA_WARP_MIN_CTAS 1
#endif
static_assert(kMinSplitKeys >= 16 && kMinSplitKeys <= kMaxSplitKeys && (kMinSplitKeys & (kMinSplitKeys - 1)) == 0,
              "CF_PA_WARP_MIN_SPLIT must be a power of two in [16, 256]");
static_assert(kTargetSplits >= 1, "CF_PA_WARP_TARGET_SPLITS must be positive");

__host__ __device__ inline int split_keys_for(int ctx) {
    const int want = (ctx + kTargetSplits - 1) / kTargetSplits;
    int s = kMinSplitKeys;
    while (s < want && s < kMaxSplitKeys) {
        s <<= 1;
    }
    return s;
}

__host__ __device__ inline int split_count(int ctx) {
    const int s = split_keys_for(ctx);
    return (ctx + s - 1) / s;
}

// Most splits of any row of at most max_ctx keys (the grid and the workspace; a function of the block table width
// alone, so a captured CUDA graph stays valid while rows grow). split_count grows with ctx between the points where
// the split length doubles, so the candidates are max_ctx and the last length before each doubling.
inline int max_split_count(int64_t max_ctx) {
    int most = split_count((int) (max_ctx < (1 << 30) ? max_ctx : (1 << 30)));
    for (int64_t c = (int64_t) kMinSplitKeys * kTargetSplits; c < max_ctx && c < (1 << 30); c *= 2) {
        const int n = split_count((int) c);
        most = n > most ? n : most;
    }
    return most;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
    }
    return v;
}

// One CTA: splits W blockIdx.x + w (warp w) of token blockIdx.z's row, KV head blockIdx.y. D: head size; G: query
// heads per KV head; W: warps (splits) per CTA, kWarps or kWarpsOne (same bits). part_o / part_ml: the split
// states of rows of more than W splits (the combine kernel's input), [n_tokens][n_head][n_splits][D] and [..][2] f32.
// Programmatic dependent launch (pdl: the launcher used it, sm_90): nothing global is touched before the wait (q,
// K/V and the tables come from earlier grids, and the partial states may alias what they read); the next grid is let
// in at once, and it waits for this one's completion in turn. Without pdl nothing is triggered.
template <int D, int G, int kRoundRows, int W>
__global__ void __launch_bounds__(32 * W, CF_PA_WARP_MIN_CTAS * kWarps / W)
split_kernel(const PagedAttentionCudaArgs a, float * part_o, float * part_ml, int n_splits, bool pdl) {
    constexpr int TG = D / 8;           // lanes per key
    constexpr int KPW = 32 / TG;        // keys per load instruction of the warp
    constexpr int kThreads = 32 * W;
    static_assert(TG >= 1 && TG <= 32 && 32 % TG == 0, "head size must be 8 to 256");
    static_assert(G * kMaxSplitKeys >= G * D, "a warp's score slice must hold its output");
    constexpr int kSlice = G * kMaxSplitKeys;  // floats of one warp's score slice

    // Per warp: the scores, then the probabilities [G][kMaxSplitKeys] of its split; after P.V its output [G][D]
    // (the warp's own slice, after a __syncwarp). Pool rows of the split's keys.
    __shared__ __align__(16) float slice_s[W][kSlice];
    __shared__ int32_t row_s[W][kMaxSplitKeys];
    __shared__ float m_s[W][G];
    __shared__ float l_s[W][G];

    pipelined::grid_dependency_wait();
    if (pdl) {
        pipelined::grid_launch_dependents();  // only when launched with PDL (see the two-pass kernel)
    }
    const int t = blockIdx.z;
    const int kvh = blockIdx.y;
    const int ctx = a.token_ctx_len[t];
    const int seq = a.token_seq_idx[t];
    const int S = split_keys_for(ctx);
    const int ns = (ctx + S - 1) / S;  // splits of this row
    const int first = blockIdx.x * W;
    if (first >= ns || ns > n_splits) {
        // beyond this row (the grid covers the most splits any row may have), or a context longer than the block
        // table allows (a broken contract: nothing is written rather than another row's partial results)
        return;
    }
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / TG;
    const int li = lane % TG;
    const int split = first + warp;
    float(*sc)[kMaxSplitKeys] = reinterpret_cast<float(*)[kMaxSplitKeys]>(slice_s[warp]);

    if (split < ns) {
        const int k0 = split * S;
        const int nkeys = min(S, ctx - k0);
        const int32_t stage_base = (int32_t) a.stage_base_row;  // INT32_MAX without streaming (launcher)
        const int32_t * table = a.block_tables + (int64_t) seq * a.block_table_stride;
        for (int i = lane; i < nkeys; i += 32) {
            const int p = k0 + i;
            row_s[warp][i] = table[p / a.block_size] * a.block_size + p % a.block_size;
        }
        float q[G][8];  // this lane's 8 dims of every head of the group
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float * qh = a.q + (int64_t) t * a.q_stride_token + (int64_t) (kvh * G + h) * a.q_stride_head + li * 8;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                q[h][j] = qh[j];
            }
        }
        __syncwarp();

        // Scores: round r0 covers keys (r0 + u) KPW + g, u < kRoundRows; lane group g's dot, butterfly over its lanes.
        const int rows = (nkeys + KPW - 1) / KPW;  // rows per lane group (warp-uniform trip counts)
        for (int r0 = 0; r0 < rows; r0 += kRoundRows) {
            uint4 raw[kRoundRows];
#pragma unroll
            for (int u = 0; u < kRoundRows; ++u) {
                const int i = (r0 + u) * KPW + g;
                raw[u] = r0 + u < rows && i < nkeys
                             ? *reinterpret_cast<const uint4 *>(
                                   kv_row(a.k_pool, a.k_stage, a.k_stride_row, row_s[warp][i], stage_base, kvh * D + li * 8))
                             : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < kRoundRows; ++u) {
                if (r0 + u >= rows) {
                    break;  // warp-uniform
                }
                store_scores<G, TG>(q, raw[u], (r0 + u) * KPW + g, nkeys, li, a, sc);
            }
        }
        // The first round of V rows, in flight during the softmax.
        uint4 v_first[kRoundRows];
#pragma unroll
        for (int u = 0; u < kRoundRows; ++u) {
            const int i = u * KPW + g;
            v_first[u] = u < rows && i < nkeys
                             ? *reinterpret_cast<const uint4 *>(
                                   kv_row(a.v_pool, a.v_stage, a.v_stride_row, row_s[warp][i], stage_base, kvh * D + li * 8))
                             : make_uint4(0u, 0u, 0u, 0u);
        }
        __syncwarp();

        // Softmax of the split: exact max, then exp and the lane-strided sums, then a warp butterfly.
        float m[G];
        float l[G];
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float mx = -INFINITY;
            for (int i = lane; i < nkeys; i += 32) {
                mx = fmaxf(mx, sc[h][i]);
            }
            m[h] = warp_max(mx);
        }
        __syncwarp();  // every lane has read the scores it compared before they become probabilities
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float sum = 0.0f;
            for (int i = lane; i < nkeys; i += 32) {
                const float e = expf(sc[h][i] - m[h]);
                sc[h][i] = e;
                sum += e;
            }
            l[h] = warp_sum(sum);
        }
        __syncwarp();

        // P.V: lane group g adds keys g, g + KPW, ... in order; then a butterfly over the groups.
        float acc[G][8];
#pragma unroll
        for (int h = 0; h < G; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                acc[h][j] = 0.0f;
            }
        }
        for (int r0 = 0; r0 < rows; r0 += kRoundRows) {
            uint4 raw[kRoundRows];
            if (r0 == 0) {
#pragma unroll
                for (int u = 0; u < kRoundRows; ++u) {
                    raw[u] = v_first[u];
                }
            } else {
#pragma unroll
                for (int u = 0; u < kRoundRows; ++u) {
                    const int i = (r0 + u) * KPW + g;
                    raw[u] = r0 + u < rows && i < nkeys
                                 ? *reinterpret_cast<const uint4 *>(kv_row(a.v_pool, a.v_stage, a.v_stride_row,
                                                                           row_s[warp][i], stage_base, kvh * D + li * 8))
                                 : make_uint4(0u, 0u, 0u, 0u);
                }
            }
#pragma unroll
            for (int u = 0; u < kRoundRows; ++u) {
                const int i = (r0 + u) * KPW + g;
                if (r0 + u >= rows || i >= nkeys) {
                    break;  // keys of a group only grow with u
                }
                accumulate_pv<G>(acc, raw[u], i, sc);
            }
        }
#pragma unroll
        for (int off = TG; off < 32; off <<= 1) {
#pragma unroll
            for (int h = 0; h < G; ++h) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    acc[h][j] += __shfl_xor_sync(0xffffffffu, acc[h][j], off);
                }
            }
        }
        __syncwarp();  // every lane is done with the probabilities: the slice becomes the output
        float(*o_w)[D] = reinterpret_cast<float(*)[D]>(slice_s[warp]);
        if (g == 0) {
#pragma unroll
            for (int h = 0; h < G; ++h) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    o_w[h][li * 8 + j] = acc[h][j];
                }
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int h = 0; h < G; ++h) {
                m_s[warp][h] = m[h];
                l_s[warp][h] = l[h];
            }
        }
    }
    __syncthreads();

    // A row of at most W splits: merge them here and write the output; else each split's state.
    const int n_here = min(W, ns - first);
    for (int i = threadIdx.x; i < G * D; i += kThreads) {
        const int h = i / D;
        const int d = i % D;
        const int head = kvh * G + h;
        if (ns <= W) {
            float mx = m_s[0][h];
            for (int w = 1; w < n_here; ++w) {
                mx = fmaxf(mx, m_s[w][h]);
            }
            float l = 0.0f;
            float o = 0.0f;
            for (int w = 0; w < n_here; ++w) {
                const float e = expf(m_s[w][h] - mx);
                l = fmaf(e, l_s[w][h], l);
                o = fmaf(e, reinterpret_cast<const float(*)[D]>(slice_s[w])[h][d], o);
            }
            a.out[((int64_t) t * a.n_head + head) * D + d] = o / l;
        } else {
            for (int w = 0; w < n_here; ++w) {
                const int64_t part = ((int64_t) t * a.n_head + head) * n_splits + first + w;
                part_o[part * D + d] = reinterpret_cast<const float(*)[D]>(slice_s[w])[h][d];
                if (d == 0) {
                    part_ml[2 * part] = m_s[w][h];
                    part_ml[2 * part + 1] = l_s[w][h];
                }
            }
        }
    }
}

// Merge the splits of rows of more than `merged` splits (the split kernel's W: rows of fewer were merged there), in
// split order (the formula above, two_pass::combine_splits): grid (n_head, n_tokens), kCombineThreads threads. PDL as
// in the split kernel. combine_splits writes a.out_f16 where it is set; the launcher clears it for this kernel (its
// split kernel never writes it), so rows of any split count leave it alone.
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(const PagedAttentionCudaArgs a, const float * part_o, const float * part_ml, int n_splits, int merged,
               bool pdl) {
    pipelined::grid_dependency_wait();  // the split kernel's states (every CTA waits, so completion implies its)
    if (pdl) {
        pipelined::grid_launch_dependents();
    }
    const int head = blockIdx.x;
    const int t = blockIdx.y;
    const int ns = split_count(a.token_ctx_len[t]);
    if (ns <= merged || ns > n_splits) {
        return;  // written by the split kernel (or a broken contract, see there)
    }
    two_pass::combine_splits<D>(a, t, head, part_o, part_ml, n_splits, ns);
}

}  // namespace warp_split
}  // namespace cuda
}  // namespace cf
