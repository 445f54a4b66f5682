// paged_attention_two_pass.cuh - the two-pass split kernel of paged_attention.cu and its combine kernel; included
// by paged_attention.cu and by native/tests/cuda/emulate_paged_attention.cpp (the same code under g++, for
// checking its logic where no GPU is at hand). Contract, work split and batch invariance: paged_attention.cuh.
#pragma once

#include "paged_attention.cuh"
#include "paged_attention_pipelined.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cf {
namespace cuda {
namespace two_pass {

constexpr int kMaxGqa = 8;
// Threads per CTA and K/V rows in flight per thread group, measured on the H200 with
// scripts/cuda_kernel_variants.sh (results/h200_gpu/stop19_kernel_variants.txt): 256 threads halve a
// lone short row's latency (B=1, 200 keys: 8.2 vs 12.3 us/layer) but lose 8-15% at large batches and
// long contexts (B=256: 61.8 vs 56.9 us; B=32 at 8K: 240 vs 208 us), where attention fills the step;
// 128 threads and 4 rows in flight are the default. The count fixes the order of the sums, so it may
// not depend on the batch (batch invariance); head size 256 always uses 128 (shared memory).
// CF_PA_THREADS / CF_PA_ROWS_IN_FLIGHT: tuning knobs for the standalone benchmark (-D at compile time).
#ifndef CF_PA_THREADS
#define CF_PA_THREADS 128
#endif
#ifndef CF_PA_ROWS_IN_FLIGHT
#define CF_PA_ROWS_IN_FLIGHT 4
#endif
__host__ __device__ constexpr int threads_for(int D) { return D <= 128 ? CF_PA_THREADS : 128; }

// Split length by the row's own context length (paged_attention.cuh): rows of at most
// 8 * kShortSplitKeys keys use splits of kShortSplitKeys, rows of at most 8 * 2 * kShortSplitKeys
// splits of 2 * kShortSplitKeys, longer rows kPagedSplitKeys. The choice depends on ctx alone, never
// on the batch, so batch invariance holds. CF_PA_SHORT_SPLIT (a power of two in [32, 256]) is a knob
// for scripts/cuda_kernel_variants.sh, and 256, every row in 256-key splits, is the default: on the
// H200 (results/h200_gpu/stop24/kernel_short_splits.txt) 64-key splits cut a lone 200-key row from
// 12.4 to 9.5 us per layer but cost B=64 15.5 -> 26.0 us and B=256 57.2 -> 86.1 us at the same
// length (4x the CTAs, each loading its query heads and reducing, plus the combine), and since the
// rule may not look at the batch, short rows of big batches would pay for it.
#ifndef CF_PA_SHORT_SPLIT
#define CF_PA_SHORT_SPLIT 256
#endif
constexpr int kShortSplitKeys = CF_PA_SHORT_SPLIT;
static_assert(kShortSplitKeys >= 32 && kShortSplitKeys <= kPagedSplitKeys &&
                  (kShortSplitKeys & (kShortSplitKeys - 1)) == 0,
              "CF_PA_SHORT_SPLIT must be a power of two in [32, 256]");

// Longer splits for long rows (stop 48, a build knob): rows of more than kLongFromKeys (4,096) keys use splits of
// CF_PA_LONG_SPLIT keys (a power of two in [256, 1024]; 256, the default, keeps 256-key splits for every row past the
// short-split range). Fewer, longer splits amortize each CTA's fixed work (query and block-table loads, two
// block-wide reductions, the partial state's writes) and the combine's per-split loads over more keys, and shrink the
// grid of a batch of long rows; a lone long row, or a few, gets fewer CTAs than the SMs could run. Measured on an H100
// (results/h200_gpu/stop48, us per layer, 256 -> 1,024 keys, two runs each): B=4 at 32K 128 -> 109 (69% -> 81% of
// copy), B=32 at 8K 224 -> 206, D 128 B=32 at 8K 408 -> 393; but B=8 at 8K 67 -> 83, D 128 B=8 at 8K 114 -> 154,
// B=1 at 8K 19 -> 32, B=1 at 32K 43 -> 52. A rule may look at ctx alone (batch invariance), so no length wins both
// ways and the default stays 256. The knob also enlarges every CTA's static shared memory (kMaxSplitKeys), short
// rows' too: at 1,024 keys, G 8 and D 256 it is 44 KB of the 48 a static declaration may take.
#ifndef CF_PA_LONG_SPLIT
#define CF_PA_LONG_SPLIT 256
#endif
constexpr int kLongSplitKeys = CF_PA_LONG_SPLIT;
constexpr int kLongFromKeys = 16 * kPagedSplitKeys;
constexpr int kMaxSplitKeys = kLongSplitKeys;
static_assert(kLongSplitKeys >= kPagedSplitKeys && kLongSplitKeys <= 1024 &&
                  (kLongSplitKeys & (kLongSplitKeys - 1)) == 0,
              "CF_PA_LONG_SPLIT must be a power of two in [256, 1024]");

__host__ __device__ inline int split_keys_for(int ctx) {
    if (ctx <= 8 * kShortSplitKeys) {
        return kShortSplitKeys;
    }
    if (2 * kShortSplitKeys <= kPagedSplitKeys && ctx <= 16 * kShortSplitKeys) {
        return 2 * kShortSplitKeys;
    }
    return ctx > kLongFromKeys ? kLongSplitKeys : kPagedSplitKeys;
}

__host__ __device__ inline int split_count(int ctx) {
    const int keys = split_keys_for(ctx);
    return (ctx + keys - 1) / keys;
}
// K/V rows each thread group loads before using any of them, in the two load shapes of the two-pass kernel
// (PagedLoads). Narrow: CF_PA_ROWS_IN_FLIGHT (4) rows per round, 70-72 registers at D 64, G 4 (ptxas, sm_90), the
// shape every grid used before. Wide: 16 rows per round, so that a split of 256 keys at head size 64 (16 groups of
// 8 lanes) is one round of K loads and one of V, with the first round of V issued before the softmax: for grids that
// leave most SMs idle (B=1: 8 CTAs for a 200-key row), where the kernel is a chain of memory round trips.
// Neither the rows in flight nor the prefetch change any sum: a key's score is computed by one lane group whatever
// the round, and group g accumulates P.V over keys g, g + NG, g + 2 NG, ... in that order in every shape, so the
// two shapes give bit-identical outputs and the launcher may pick one by the grid (test_paged_attention_cuda.cu
// asserts it: a row alone runs wide, the same row in a batch narrow).
constexpr int kRowsInFlight = CF_PA_ROWS_IN_FLIGHT;
constexpr int kRowsInFlightWide = 16;
// Narrow8 (kPagedLoadsNarrow8): the narrow shape compiled for 8 resident CTAs per SM (__launch_bounds__'s second
// argument: at most 64 registers at 128 threads; at D 64 and 128 with G 4 one 4-byte spill outside the loops, against
// 70-72 registers and 7 CTAs). For grids larger than the SMs hold of the narrow kernel at once, where more CTAs in
// flight hide more memory round trips.
// On an H100 (results/h200_gpu/stop47, us per layer, two alternating runs each, D 64 unless said): B=256 at 200 keys
// 61.3 -> 54.4, B=16 at 2K 48.0 -> 37.7, B=8 at 8K 77.1 -> 69.3, B=1 at 32K 57.4 -> 47.4, B=128 at 256 keys D 128
// 78.4 -> 57.7, B=8 at 8K D 128 132.8 -> 115.7; but B=64 at 200 keys (one resident wave either way) 16.5 -> 17.3,
// and every wide-load grid 1.5x slower (its 16 rows do not fit 64 registers), so the launcher picks it by the grid.
// Register allocation only: the floating-point operations are the same, in the same order (PTX and SASS compared for
// D 64 / 128 and G 1-4), so the bits are too; the integer and address code differs. Applied at 128 threads, D <= 128
// and at most 4 heads per CTA, the shapes measured or close to them (a heuristic: D 256 at G 1-2 would fit too);
// elsewhere bounded_ctas is 1 (no bound) and narrow8 is narrow. The launcher runs it only where the bound adds a CTA
// per SM (paged_attention.cu, bounded_for_grid).
__host__ __device__ constexpr int bounded_ctas(int D, int HG) {
    return D <= 128 && HG <= 4 && threads_for(D) == 128 ? 8 : 1;
}


__device__ __forceinline__ float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, off);
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int off = 16; off > 0; off >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    }
    return v;
}

using pipelined::halves_to_float;  // 16 bytes of f16 as 8 f32
// Block-wide reduction of G values per thread (one per query head) in one pass; every thread gets
// the G results in v. The order (lane butterfly, then warps 0..kWarps-1) is fixed, so the results
// depend only on the inputs.
template <bool kMax, int G, int kWarps>
__device__ void block_reduce(float (&v)[G], float (*scratch)[G] /* [kWarps][G] */) {
    const int warp = threadIdx.x / 32;
#pragma unroll
    for (int h = 0; h < G; ++h) {
        v[h] = kMax ? warp_max(v[h]) : warp_sum(v[h]);
        if (threadIdx.x % 32 == 0) {
            scratch[warp][h] = v[h];
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float r = scratch[0][h];
        for (int w = 1; w < kWarps; ++w) {
            r = kMax ? fmaxf(r, scratch[w][h]) : r + scratch[w][h];
        }
        v[h] = r;
    }
    __syncthreads();  // scratch is reused by the next call
}

using pipelined::kv_row;  // K/V row pointer, pool or staging slot (streaming)

// A CTA's inputs in shared memory: its G query heads head0 .. head0 + G - 1 (q_s[G][D]; all or part of one GQA
// group) and the pool rows of its split's keys (row_s[i] = slot of position k0 + i, i < nkeys); ends with a
// __syncthreads.
template <int D, int G, int kThreads>
__device__ __forceinline__ void load_split_inputs(const PagedAttentionCudaArgs & a, int t, int head0, int k0, int nkeys,
                                                  float (*q_s)[D], int32_t * row_s) {
    const int tid = threadIdx.x;
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t] * a.block_table_stride;
    for (int i = tid; i < G * D; i += kThreads) {
        const int h = i / D;
        const int d = i % D;
        q_s[h][d] = a.q[(int64_t) t * a.q_stride_token + (int64_t) (head0 + h) * a.q_stride_head + d];
    }
    for (int i = tid; i < nkeys; i += kThreads) {
        const int p = k0 + i;
        row_s[i] = table[p / a.block_size] * a.block_size + p % a.block_size;
    }
    __syncthreads();
}

// The kernel's per-key arithmetic, in functions of their own so that another way of moving K/V (e.g. the
// cp.async-staged variant measured in stop 28: slower, removed) can reuse it and compute the same bits.
// Thread (group g, lane li) of a TG-lane group holds dims [8 li, 8 li + 8).

// Score of key i for every query head from this lane's 16 bytes of its K row: the lanes' partial dots meet
// in a butterfly over the TG lanes; lane 0 stores scale * dot (soft-capped) in p_s[h][i] when i < nkeys.
// Every lane of the warp must call it (shuffles).
template <int G, int TG, int kRow = kPagedSplitKeys>
__device__ __forceinline__ void store_scores(const float (&qr)[G][8], const uint4 & raw, int i, int nkeys, int li,
                                             const PagedAttentionCudaArgs & a, float (*p_s)[kRow]) {
    float kf[8];
    halves_to_float(raw, kf);
#pragma unroll
    for (int h = 0; h < G; ++h) {
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            s = fmaf(qr[h][j], kf[j], s);
        }
#pragma unroll
        for (int off = TG / 2; off > 0; off >>= 1) {
            s += __shfl_xor_sync(0xffffffffu, s, off, TG);
        }
        if (i < nkeys && li == 0) {
            s *= a.scale;
            if (a.softcap != 0.0f) {
                s = a.softcap * tanhf(s / a.softcap);
            }
            p_s[h][i] = s;
        }
    }
}

// acc[h][0..8) += p_s[h][i] * (this lane's 8 dims of key i's V row), for every query head.
template <int G, int kRow = kPagedSplitKeys>
__device__ __forceinline__ void accumulate_pv(float (&acc)[G][8], const uint4 & raw, int i,
                                              const float (*p_s)[kRow]) {
    float vf[8];
    halves_to_float(raw, vf);
#pragma unroll
    for (int h = 0; h < G; ++h) {
        const float p = p_s[h][i];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            acc[h][j] = fmaf(p, vf[j], acc[h][j]);
        }
    }
}

// Softmax over the split's nkeys scores, all heads at once: max, exp, sum (fixed orders, see block_reduce);
// p_s becomes the unnormalized probabilities, m_s/l_s the max and sum (written by thread 0, read after the
// caller's next __syncthreads). Ends with a __syncthreads (inside block_reduce): every p_s write is visible.
template <int G, int kThreads, int kRow = kPagedSplitKeys>
__device__ __forceinline__ void softmax_split(float (*p_s)[kRow], int nkeys, float (*scratch)[G],
                                              float * m_s, float * l_s) {
    constexpr int kWarps = kThreads / 32;
    const int tid = threadIdx.x;
    float m[G];
    float l[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
    }
    for (int i = tid; i < nkeys; i += kThreads) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            m[h] = fmaxf(m[h], p_s[h][i]);
        }
    }
    block_reduce<true, G, kWarps>(m, scratch);
    for (int i = tid; i < nkeys; i += kThreads) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float e = expf(p_s[h][i] - m[h]);
            p_s[h][i] = e;
            l[h] += e;
        }
    }
    block_reduce<false, G, kWarps>(l, scratch);
    if (tid == 0) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            m_s[h] = m[h];
            l_s[h] = l[h];
        }
    }
}

// After P.V: the TG-lane groups of a warp meet in a lane butterfly, the warps in order through big_s
// ([kWarps][G][D], which may alias p_s: the first __syncthreads here ends every read of it), then the
// split's output (one split: out = o / l) or its partial result (o, m, l) for the combine kernel.
template <int D, int G, int kThreads>
__device__ __forceinline__ void finish_split(float (&acc)[G][8], float * big_s, const float * m_s, const float * l_s,
                                             const PagedAttentionCudaArgs & a, int t, int head0, int split,
                                             bool one_split, float * part_o, float * part_ml, int n_splits) {
    constexpr int kWarps = kThreads / 32;
    constexpr int TG = D / 8;
    const int tid = threadIdx.x;
    const int li = tid % TG;
#pragma unroll
    for (int h = 0; h < G; ++h) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
#pragma unroll
            for (int off = 16; off >= TG; off >>= 1) {
                acc[h][j] += __shfl_xor_sync(0xffffffffu, acc[h][j], off);
            }
        }
    }
    __syncthreads();  // every thread is done reading p_s: big_s becomes the reduction buffer
    const int warp = tid / 32;
    if (tid % 32 < TG) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                big_s[(warp * G + h) * D + li * 8 + j] = acc[h][j];
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += kThreads) {
        const int h = i / D;
        const int d = i % D;
        float o = big_s[h * D + d];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) {
            o += big_s[(w * G + h) * D + d];
        }
        const int head = head0 + h;
        if (one_split) {
            const int64_t at = ((int64_t) t * a.n_head + head) * D + d;
            const float r = o / l_s[h];
            a.out[at] = r;
            if (a.out_f16 != nullptr) {
                a.out_f16[at] = __float2half(r);
            }
        } else {
            const int64_t part = ((int64_t) t * a.n_head + head) * n_splits + split;
            part_o[part * D + d] = o;
            if (d == 0) {
                part_ml[2 * part] = m_s[h];
                part_ml[2 * part + 1] = l_s[h];
            }
        }
    }
}

// One CTA: query heads [head0, head0 + HG) of KV head kvh (blockIdx.y = kvh * (G / HG) + the head group), token
// blockIdx.z, keys [split * S, (split + 1) * S) with S = split_keys_for(the row's context length) <= kMaxSplitKeys.
// D: head size; G: query heads per KV head; R: K/V rows in flight per lane group (kRowsInFlight or
// kRowsInFlightWide); kPrefetchV: the first round of V rows is loaded before the softmax; HG: query heads per CTA, a
// divisor of G (G: the whole GQA group, each K/V row loaded once per CTA; fewer: G / HG CTAs share each row through
// L2, each with 1/(G/HG) of the arithmetic, for grids that leave SMs idle). R, kPrefetchV and HG move loads and
// work only: every sum of a head runs over the same lanes, keys and warps in the same order whatever they are (no
// reduction crosses heads), so outputs are bit-identical for every choice (see kRowsInFlightWide). kMinCtas: CTAs per
// SM the register allocation must allow (1, or bounded_ctas for narrow8); registers only, the same bits.
template <int D, int G, int R, bool kPrefetchV, int HG = G, int kMinCtas = 1>
__global__ void __launch_bounds__(threads_for(D), kMinCtas)
paged_attention_split_kernel(const PagedAttentionCudaArgs a, float * part_o /* [n_tokens][n_head][n_splits][D] */,
                             float * part_ml /* [n_tokens][n_head][n_splits][2] */, int n_splits, bool pdl) {
    static_assert(HG >= 1 && G % HG == 0, "HG must divide G");
    constexpr int kGroups = G / HG;  // CTAs per KV head
    constexpr int kThreads = threads_for(D);
    constexpr int kWarps = kThreads / 32;
    constexpr int TG = D / 8;            // threads per key in Q.K (16 bytes of the K row each)
    constexpr int NG = kThreads / TG;    // keys in flight in Q.K
    // P.V uses the same split of a row: group g of TG threads per key, lane li holds dims [8 li, 8 li + 8).
    constexpr int kScoreFloats = HG * kMaxSplitKeys;
    constexpr int kReduceFloats = kWarps * HG * D;

    __shared__ float q_s[HG][D];
    // Scores, then probabilities [HG][kMaxSplitKeys]; after P.V the per-warp partial outputs
    // [kWarps][HG][D] reuse the space.
    __shared__ float big_s[kScoreFloats > kReduceFloats ? kScoreFloats : kReduceFloats];
    __shared__ int32_t row_s[kMaxSplitKeys];
    __shared__ float scratch[kWarps][HG];
    float (*p_s)[kMaxSplitKeys] = reinterpret_cast<float (*)[kMaxSplitKeys]>(big_s);

    // Programmatic dependent launch, when the launcher asks for it (opt-in, pdl = 1): nothing global is touched
    // before the wait (a no-op in a grid launched without PDL); the next grid is let in at once, and it waits for
    // this one's completion in turn. Without pdl nothing is triggered: a next grid launched with PDL (ggml-cuda's
    // kernels are) would otherwise take SM slots while this grid's later waves still need them.
    pipelined::grid_dependency_wait();
    if (pdl) {
        pipelined::grid_launch_dependents();
    }
    const int split = blockIdx.x;
    const int kvh = (int) blockIdx.y / kGroups;
    const int head0 = kvh * G + ((int) blockIdx.y % kGroups) * HG;
    const int t = blockIdx.z;
    const int tid = threadIdx.x;
    const int ctx = a.token_ctx_len[t];
    const int split_keys = split_keys_for(ctx);
    const int k0 = split * split_keys;
    if (k0 >= ctx) {
        return;  // beyond this row's context (the grid covers the most splits any row may have)
    }
    if (split_count(ctx) > n_splits) {
        return;  // a context longer than the block table allows: nothing is written (broken contract)
    }
    const int nkeys = min(split_keys, ctx - k0);
    const int32_t stage_base = (int32_t) a.stage_base_row;  // INT32_MAX without streaming (launch)
    load_split_inputs<D, HG, kThreads>(a, t, head0, k0, nkeys, q_s, row_s);

    // Q.K: group g of TG threads takes keys g, g + NG, ...; lane li holds dims [8 li, 8 li + 8).
    {
        const int g = tid / TG;
        const int li = tid % TG;
        float qr[HG][8];
#pragma unroll
        for (int h = 0; h < HG; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                qr[h][j] = q_s[h][li * 8 + j];
            }
        }
        // Every thread runs the same number of iterations (the lane shuffles below need whole warps),
        // and issues the loads of R keys before using any of them.
        for (int base = 0; base < nkeys; base += R * NG) {
            uint4 raw[R];
#pragma unroll
            for (int u = 0; u < R; ++u) {
                const int i = base + u * NG + g;
                raw[u] = i < nkeys ? *reinterpret_cast<const uint4 *>(kv_row(a.k_pool, a.k_stage, a.k_stride_row, row_s[i], stage_base, kvh * D + li * 8))
                                   : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < R; ++u) {
                store_scores<HG, TG, kMaxSplitKeys>(qr, raw[u], base + u * NG + g, nkeys, li, a, p_s);
            }
        }
    }
    __syncthreads();

    // The first round of V rows of this lane group (keys g, g + NG, ..., g + (R - 1) NG), in flight during the
    // softmax when kPrefetchV.
    const int g_pv = tid / TG;
    const int li_pv = tid % TG;
    auto load_v_round = [&](int base, uint4 (&raw)[R]) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
            const int i = base + u * NG;
            raw[u] = i < nkeys ? *reinterpret_cast<const uint4 *>(kv_row(a.v_pool, a.v_stage, a.v_stride_row, row_s[i], stage_base, kvh * D + li_pv * 8))
                               : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    uint4 v_first[R];
    if (kPrefetchV) {
        load_v_round(g_pv, v_first);
    }

    // Softmax over the split, all heads at once: max, exp, sum (fixed orders, see block_reduce).
    __shared__ float m_s[HG];
    __shared__ float l_s[HG];
    softmax_split<HG, kThreads, kMaxSplitKeys>(p_s, nkeys, scratch, m_s, l_s);
    // (block_reduce ended with __syncthreads: every p_s write is visible; m_s/l_s are read after the
    // __syncthreads that follows P.V)

    // P.V: NG keys in flight, TG threads per key, each thread 8 dims (16 bytes of V) of every head.
    // Partial sums meet across the groups of a warp (lane butterfly), then across warps in order.
    {
        const int g = g_pv;
        float acc[HG][8];
#pragma unroll
        for (int h = 0; h < HG; ++h) {
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                acc[h][j] = 0.0f;
            }
        }
        for (int base = g; base < nkeys; base += R * NG) {
            uint4 raw[R];
            if (kPrefetchV && base == g) {
#pragma unroll
                for (int u = 0; u < R; ++u) {
                    raw[u] = v_first[u];
                }
            } else {
                load_v_round(base, raw);
            }
#pragma unroll
            for (int u = 0; u < R; ++u) {
                const int i = base + u * NG;
                if (i >= nkeys) {
                    break;
                }
                accumulate_pv<HG, kMaxSplitKeys>(acc, raw[u], i, p_s);
            }
        }
        finish_split<D, HG, kThreads>(acc, big_s, m_s, l_s, a, t, head0, split, ctx <= split_keys, part_o, part_ml,
                                     n_splits);
    }
}

// The combine kernels' CTA size (two-pass and warp-split), the splits whose weights one pass stages in shared memory
// (a row of any length goes through them in chunks of this many, in split order) and the part_o floats one round
// stages in shared memory (kCombineStageFloats / D splits: 64 at D 64, 32 at D 128, 16 at D 256).
constexpr int kCombineThreads = 128;
constexpr int kCombineChunk = 1024;
constexpr int kCombineStageFloats = 4096;

// Merge the ns > 1 split states of query head `head` of token t (part_o [n_splits][D] and part_ml [n_splits][2] of
// that (token, head), the split kernels' layout; part_o 16-byte aligned, as the launcher checks the workspace) in
// split order: m = max_s m_s, w_s = exp(m_s - m), l = sum_s w_s l_s and o[d] = sum_s w_s o_s[d] (fmaf, s = 0, 1,
// ..., ns - 1), out[d] = o[d] / l, and out_f16 where set (launch clears it where the kernel does not write it). Each
// output element is summed by one thread, one split after another, so the bits are those of that serial loop whatever
// the CTA size or the staging: the one-thread-per-element kernel of stops 19-47 gave the same ones. Memory round
// trips (stop 49): the part_o values move in rounds of kCombineStageFloats / D whole splits, 16-byte loads spread
// over all threads, through shared memory; the first round is issued before the max over the splits' m_s and each
// next one before the current one is summed, and the (m_s, l_s) of the first chunk are staged by the max's own loads.
// Under ncu on an H100 (results/h200_gpu/stop49) stop 48's kernel, which waited on L2 or DRAM about once per 16
// splits, took 14.6 us of a 44 us layer at B=1 and 32K keys (128 splits per head); with the staged rounds the layer
// took 39.8 instead of 43.1 us, and 120.3 instead of 128.4 at B=4 and 32K (one A/B round, H100, stop 49).
// Every thread of a kCombineThreads-thread CTA calls it (barriers), once per CTA: a second call's first writes to w_s
// are not ordered after this one's last reads. Its cost in occupancy: 60-62 registers and 24.6 KB of shared memory,
// 8 CTAs per SM (stop 48's: 16). On a grid of several waves of them (B=64 at 2K: 2,048 CTAs) no loss seen: 121.9 /
// 118.6 us per layer back to back / graph (stop 50, H100), 122.1-122.7 / 118.9-119.0 with stop 48's (stop 49's runs,
// another H100). Stop 50 measured merging in each row's last split CTA instead of this kernel: slower (kernels README).
template <int D>
__device__ void combine_splits(const PagedAttentionCudaArgs & a, int t, int head, const float * part_o,
                               const float * part_ml, int n_splits, int ns) {
    constexpr int kPer = (D + kCombineThreads - 1) / kCombineThreads;  // output elements per thread
    constexpr int kRound = kCombineStageFloats / D;                   // splits per staged round
    constexpr int kVecs = kCombineStageFloats / 4 / kCombineThreads;  // 16-byte loads per thread per round
    static_assert(D % 4 == 0 && kRound * D == kCombineStageFloats && kCombineChunk % kRound == 0 &&
                      kVecs * 4 * kCombineThreads == kCombineStageFloats,
                  "combine staging: D must divide kCombineStageFloats");
    __shared__ float w_s[kCombineChunk];  // the chunk's m_s, then its weights exp(m_s - m)
    __shared__ float l_s[kCombineChunk];
    __shared__ float4 stage_s[kCombineStageFloats / 4];  // one round's part_o, [kRound][D] floats
    __shared__ float m_red[kCombineThreads / 32];
    const int tid = threadIdx.x;
    const int64_t base = ((int64_t) t * a.n_head + head) * n_splits;
    const float4 * po4 = reinterpret_cast<const float4 *>(part_o + base * D);
    const float * st = reinterpret_cast<const float *>(stage_s);
    // The part_o floats of splits [s0, s0 + kRound) (those below ns) into registers: a contiguous run of
    // kRound * D floats, float4 index tid + v * kCombineThreads of the run in next[v].
    float4 next[kVecs];
    auto load_round = [&](int s0) {
        const int n4 = min(kRound, ns - s0) * (D / 4);
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            const int q = tid + v * kCombineThreads;
            next[v] = q < n4 ? po4[(int64_t) s0 * (D / 4) + q] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    };
    load_round(0);
    float mx = -INFINITY;
    for (int s = tid; s < ns; s += kCombineThreads) {
        const float2 ml = *reinterpret_cast<const float2 *>(part_ml + 2 * (base + s));  // 8-byte aligned
        mx = fmaxf(mx, ml.x);
        if (s < kCombineChunk) {  // the first chunk's states, kept for its weights
            w_s[s] = ml.x;
            l_s[s] = ml.y;
        }
    }
    mx = warp_max(mx);  // a max: exact in any order
    if (tid % 32 == 0) {
        m_red[tid / 32] = mx;
    }
    __syncthreads();
    mx = m_red[0];
    for (int w = 1; w < kCombineThreads / 32; ++w) {
        mx = fmaxf(mx, m_red[w]);
    }
    float l = 0.0f;
    float o[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
        o[k] = 0.0f;
    }
    for (int s0 = 0; s0 < ns; s0 += kRound) {
        const int c0 = s0 - s0 % kCombineChunk;  // the chunk holding this round (rounds never straddle chunks)
        if (s0 == c0) {  // a chunk's first round: its weights, then l over them
            const int nc = min(kCombineChunk, ns - c0);
            if (c0 > 0) {
                __syncthreads();  // the previous chunk's weights are no longer read
                for (int s = tid; s < nc; s += kCombineThreads) {
                    const float2 ml = *reinterpret_cast<const float2 *>(part_ml + 2 * (base + c0 + s));
                    w_s[s] = ml.x;
                    l_s[s] = ml.y;
                }
            }
            for (int s = tid; s < nc; s += kCombineThreads) {  // the entries this thread stored
                w_s[s] = expf(w_s[s] - mx);
            }
            __syncthreads();
            for (int s = 0; s < nc; ++s) {
                l = fmaf(w_s[s], l_s[s], l);
            }
        }
        __syncthreads();  // the last round's stage_s reads are done
#pragma unroll
        for (int v = 0; v < kVecs; ++v) {
            stage_s[tid + v * kCombineThreads] = next[v];
        }
        __syncthreads();
        if (s0 + kRound < ns) {
            load_round(s0 + kRound);  // in flight during this round's sums
        }
        const int n = min(kRound, ns - s0);
        const float * w = w_s + (s0 - c0);
#pragma unroll
        for (int k = 0; k < kPer; ++k) {
            const int d = tid + k * kCombineThreads;
            if (d < D) {
                for (int s = 0; s < n; ++s) {
                    o[k] = fmaf(w[s], st[s * D + d], o[k]);
                }
            }
        }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
        const int d = tid + k * kCombineThreads;
        if (d < D) {
            const int64_t at = ((int64_t) t * a.n_head + head) * D + d;
            const float r = o[k] / l;
            a.out[at] = r;
            if (a.out_f16 != nullptr) {
                a.out_f16[at] = __float2half(r);
            }
        }
    }
}

// Merge the splits of rows longer than one split (combine_splits): grid (n_head, n_tokens), kCombineThreads threads.
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
paged_attention_combine_kernel(const PagedAttentionCudaArgs a, const float * part_o, const float * part_ml,
                               int n_splits, bool pdl) {
    pipelined::grid_dependency_wait();  // the split kernel's partial states (PDL, as there)
    if (pdl) {
        pipelined::grid_launch_dependents();
    }
    const int head = blockIdx.x;
    const int t = blockIdx.y;
    const int ns = split_count(a.token_ctx_len[t]);
    if (ns == 1 || ns > n_splits) {
        return;  // written by the split kernel (or a broken contract, see there); the whole CTA returns
    }
    combine_splits<D>(a, t, head, part_o, part_ml, n_splits, ns);
}

// Splits of the two-pass kernel's grid: the most split_count(ctx) of any ctx the block table width allows
// (a function of the width alone, so a captured CUDA graph stays valid while rows grow within it).
inline int two_pass_num_splits(const PagedAttentionCudaArgs & a) {
    const int64_t max_ctx = a.block_table_stride * a.block_size;
    const int64_t short_max = 8 * (int64_t) kShortSplitKeys;  // split_count(ctx) <= 8 up to twice that
    if (max_ctx <= short_max) {
        return (int) ((max_ctx + kShortSplitKeys - 1) / kShortSplitKeys);
    }
    // rows up to kLongFromKeys: at most 16 splits of kPagedSplitKeys (8 below that); longer rows: kLongSplitKeys each
    const int64_t mid_ctx = max_ctx < kLongFromKeys ? max_ctx : kLongFromKeys;
    const int64_t mid_splits = (mid_ctx + kPagedSplitKeys - 1) / kPagedSplitKeys;
    const int64_t long_splits = max_ctx > kLongFromKeys ? (max_ctx + kLongSplitKeys - 1) / kLongSplitKeys : 0;
    const int64_t most = mid_splits > long_splits ? mid_splits : long_splits;
    return (int) (most > 8 ? most : 8);
}

}  // namespace two_pass
}  // namespace cuda
}  // namespace cf
