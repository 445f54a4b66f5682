// paged_attention_pipelined.cuh - the pipelined split-K kernel of paged_attention.cu and its combine kernel
// (issue 11: long rows); included by paged_attention.cu only. Contract and batch invariance: paged_attention.cuh.
//
// Why another kernel. The two-pass kernel (paged_attention.cu) runs each 256-key split as serial phases: read
// the split's block ids, load K in 4 rounds, a block-wide softmax, load V in 4 rounds, reduce across warps. At
// long contexts and small batches (B=1 8K: 256 CTAs, two per SM) a CTA is a chain of ~10 memory round trips
// with little in flight, and in one-wave grids (B=8 8K) all CTAs hit the same phase at once: 20-45% of the
// copy bandwidth on the H200 (results/h200_gpu/stop28/kernel_bench.txt). Here:
//   - each warp streams its own tiles of the split with an online softmax (flash-decoding inside the CTA, Dao
//     et al. 2023; FlashInfer's decode keeps the same per-thread (m, d, o) state), so no block-wide barrier
//     runs until the split's end;
//   - K and V of a tile are loaded together, and the next tile's block ids, K rows and V rows are issued
//     while this tile is computed (register double-buffering: K[i+1] in flight during the softmax and P.V of
//     tile i, V[i+1] during the scores of tile i+1);
//   - one lane group of D/8 lanes per key, each lane 16 bytes of the row and all G query heads of the KV head,
//     as in the two-pass kernel: every K/V byte is loaded and converted once per GQA group;
//   - splits have a length chosen by the row's own context (split_keys_for below), with enough splits per
//     row to fill the GPU at B=1, and the combine kernel loads all of a row's partial results at once (one
//     round trip) instead of a serial loop; both kernels use programmatic dependent launch (PDL, sm_90), so
//     the combine's launch overlaps the split kernel's tail.
// Reduction order (batch invariance): the split length, the tiles of each warp, the order of the keys in a
// tile, the lane butterflies, the merge of the warps (0..3) and of the splits (by a layout fixed by the split
// count) depend on the row's context length alone, so a row's output is bit-identical in any batch.
#pragma once

#include "paged_attention.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

namespace cf {
namespace cuda {
namespace pipelined {

// 16 bytes of f16 (8 halves, in order) as f32.
__device__ __forceinline__ void halves_to_float(const uint4 & raw, float out[8]) {
    const half2 * h2 = reinterpret_cast<const half2 *>(&raw);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h2[j]);
        out[2 * j] = f.x;
        out[2 * j + 1] = f.y;
    }
}

// Pointer to column `col` of K or V row r: the pool's row, or with streaming (r >= stage_base, see
// PagedAttentionCudaArgs) the staging slot's row r - stage_base. Without streaming the launcher sets
// stage_base to INT32_MAX, so the pool row is always taken.
__device__ __forceinline__ const half * kv_row(const half * pool, const half * stage, int64_t stride, int32_t r,
                                               int32_t stage_base, int col) {
    return r < stage_base ? pool + (int64_t) r * stride + col : stage + (int64_t) (r - stage_base) * stride + col;
}

// PDL (sm_90): wait until the grids this one depends on have completed and their writes are visible (a no-op
// when launched without the PDL attribute), and let the next grid in the stream be scheduled early.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kCombineThreads = 128;
// Most splits of any row (the combine kernel's buffers); split_keys_for never gives more.
constexpr int kMaxSplits = 1024;

// Split rule: a row of ctx keys uses splits of S = max(kMinSplitKeys, pow2 >= ctx / kTargetSplits) keys, i.e.
// every row of up to kMinSplitKeys keys is one split, longer rows get about kTargetSplits splits of a power of
// two keys (B=1 at 8K: 8 KV heads x 32 splits = 256 CTAs, one wave of the wide variant's 2 CTAs per SM on 132
// SMs; 32K: 1,024-key splits, 8 tiles per warp). A function of ctx alone (batch invariance). Where it comes from:
// a lone long row must fill the GPU (FlashInfer's plan gives it 64-128 CTAs per KV head:
// results/h200_gpu/stop28/flashinfer_vs_cacheflow.txt), the rule may not look at the batch, so at B=32 8K the same
// 256-key splits give 8,192 CTAs whose prologue (block ids, q) the pipelined loop must amortize; short rows keep
// the two-pass kernel's one 256-key split (its B=64/256 ctx 200 figures). Not measured yet: `--bench` sweeps
// fixed S = 128..2,048 at >= 8K to confirm or move it. CF_PA_PIPE_MIN_SPLIT / CF_PA_PIPE_TARGET_SPLITS are build
// knobs; PagedAttentionCudaArgs::split_keys (CACHEFLOW_PA_SPLIT_KEYS) fixes S at run time.
#ifndef CF_PA_PIPE_MIN_SPLIT
#define CF_PA_PIPE_MIN_SPLIT 256
#endif
#ifndef CF_PA_PIPE_TARGET_SPLITS
#define CF_PA_PIPE_TARGET_SPLITS 32
#endif
constexpr int kMinSplitKeys = CF_PA_PIPE_MIN_SPLIT;
constexpr int kTargetSplits = CF_PA_PIPE_TARGET_SPLITS;
static_assert(kMinSplitKeys >= 1 && kTargetSplits >= 1 && kTargetSplits <= kMaxSplits, "pipelined split rule knobs");

__host__ __device__ inline int pow2_at_least(int x) {
    int p = 1;
    while (p < x) {
        p <<= 1;
    }
    return p;
}

// Keys per split of a row of ctx keys; fixed_keys > 0 replaces the rule (still at least ctx / kMaxSplits).
__host__ __device__ inline int split_keys_for(int ctx, int fixed_keys) {
    const int at_least = pow2_at_least((ctx + kMaxSplits - 1) / kMaxSplits);
    if (fixed_keys > 0) {
        return fixed_keys > at_least ? fixed_keys : at_least;
    }
    const int keys = pow2_at_least((ctx + kTargetSplits - 1) / kTargetSplits);
    return keys > kMinSplitKeys ? keys : kMinSplitKeys;
}

__host__ __device__ inline int split_count(int ctx, int fixed_keys) {
    const int keys = split_keys_for(ctx, fixed_keys);
    return (ctx + keys - 1) / keys;
}

// Splits of the grid: the most split_count(ctx) of any ctx <= max_ctx (a function of the block table width alone,
// so a captured CUDA graph stays valid while rows grow). split_keys_for is constant between its steps at
// kMaxSplits * 2^k and kTargetSplits * 2^k (and the rule's floor), and split_count grows within a step, so the
// step ends and max_ctx are the only candidates.
inline int max_split_count(int64_t max_ctx, int fixed_keys) {
    const int top = (int) (max_ctx < INT_MAX ? max_ctx : INT_MAX);
    int most = split_count(top, fixed_keys);
    for (int base : {kMaxSplits, kTargetSplits}) {
        for (int64_t c = base; c < top; c *= 2) {
            const int n = split_count((int) c, fixed_keys);
            most = n > most ? n : most;
        }
    }
    return most;
}

// Two register budgets (PagedAttentionCudaArgs::tile_rows): K/V rows per lane in one tile, and CTAs per SM the
// compiler must fit. Wide (8): 8 rows of K and 8 of V per lane (128 bytes each, 4 KiB of K + 4 KiB of V per warp
// at head size 64), ~230 registers at G = 4 (ptxas, sm_90), 2 CTAs (8 warps) per SM. Narrow (4): 4 rows, 168
// registers, 3 CTAs (12 warps) per SM (2 beyond 6 query heads per KV head, which would spill): less in flight per
// warp, more warps. Beyond 4 query heads per KV head both halve their rows (the scores of a tile live in
// registers, rows x G floats).
constexpr int kTileRowsWide = 8;
constexpr int kTileRowsNarrow = 4;

template <int G, int kTileRows>
__host__ __device__ constexpr int rows_per_lane() {
    return G <= 4 ? kTileRows : kTileRows / 2;
}

template <int G, int kTileRows>
__host__ __device__ constexpr int min_ctas_per_sm() {
    return kTileRows == kTileRowsWide || G > 6 ? 2 : 3;  // 3 x 128 threads: 168 registers, G > 6 would spill
}

// One CTA: KV head blockIdx.y, token blockIdx.z, keys [split * S, split * S + S) of the row, S =
// split_keys_for(ctx, fixed_split_keys). D: head size; G: query heads per KV head; kTileRows: see above. Lane li
// of a group of TG = D / 8 lanes holds dims [8 li, 8 li + 8) of one key's K and V rows (16 bytes each) and of all
// G heads;
// a warp covers KPW = 32 / TG keys per load, and a tile is U loads per lane (TK = U * KPW keys). Warp w takes
// tiles w, w + 4, ... of the split:
//
//   split keys  [ tile 0 | tile 1 | tile 2 | tile 3 | tile 4 | ... ]     tile j: keys [j TK, j TK + TK)
//                 warp 0   warp 1   warp 2   warp 3   warp 0
//   in a tile   key u * KPW + g is load u of lane group g (g = lane / TG)
//
// bs_shift: log2(block_size) when it is a power of two, else -1 (division). pdl: launched with programmatic
// dependent launch; only then is the next grid let in early (without it nothing is triggered, as in the two-pass
// kernel: a next grid launched with PDL would take SM slots this grid's later waves need).
template <int D, int G, int kTileRows>
__global__ void __launch_bounds__(kThreads, min_ctas_per_sm<G, kTileRows>())
split_kernel(const PagedAttentionCudaArgs a, float * part_o /* [n_tokens][n_head][n_splits][D] */,
             float * part_ml /* [n_tokens][n_head][n_splits][2] */, int n_splits, int fixed_split_keys, int bs_shift,
             bool pdl) {
    constexpr int TG = D / 8;
    constexpr int KPW = 32 / TG;
    constexpr int U = rows_per_lane<G, kTileRows>();
    constexpr int TK = U * KPW;
    static_assert(TG >= 1 && TG <= 32 && 32 % TG == 0, "head size must be 8 to 256");

    __shared__ __align__(16) float o_s[kWarps][G][D];  // per-warp partial outputs, merged in warp order
    __shared__ float m_s[kWarps][G];
    __shared__ float l_s[kWarps][G];

    grid_dependency_wait();  // q, K/V and the tables may come from the previous kernels
    if (pdl) {
        grid_launch_dependents();
    }

    const int split = blockIdx.x;
    const int kvh = blockIdx.y;
    const int t = blockIdx.z;
    const int ctx = a.token_ctx_len[t];
    const int seq = a.token_seq_idx[t];  // loaded beside ctx: the block ids wait for one round trip, not two
    const int split_keys = split_keys_for(ctx, fixed_split_keys);
    const int k0 = split * split_keys;
    if (k0 >= ctx) {
        return;  // beyond this row's context (the grid covers the most splits any row may have)
    }
    const int nkeys = min(split_keys, ctx - k0);
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int g = lane / TG;
    const int li = lane % TG;
    const int col = kvh * D + li * 8;
    const int32_t stage_base = (int32_t) a.stage_base_row;  // INT32_MAX without streaming (launch)
    const int32_t * table = a.block_tables + (int64_t) seq * a.block_table_stride;

    float q[G][8];  // this lane's 8 dims of every head, pre-multiplied by the KQ scale
#pragma unroll
    for (int h = 0; h < G; ++h) {
        const float * qh = a.q + (int64_t) t * a.q_stride_token + (int64_t) (kvh * G + h) * a.q_stride_head + li * 8;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            q[h][j] = qh[j] * a.scale;
        }
    }

    // Block id of the split's key i (i < nkeys), and K/V row loads of a tile from those ids.
    auto block_of = [&](int i) { return bs_shift >= 0 ? (k0 + i) >> bs_shift : (k0 + i) / a.block_size; };
    auto tile_blocks = [&](int tile, int32_t (&blk)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = tile * TK + u * KPW + g;
            blk[u] = i < nkeys ? table[block_of(i)] : 0;
        }
    };
    auto load_tile = [&](const half * pool, const half * stage, int64_t stride, int tile, const int32_t (&blk)[U],
                         uint4 (&buf)[U]) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int i = tile * TK + u * KPW + g;
            if (i < nkeys) {
                const int32_t r = blk[u] * a.block_size + (k0 + i - block_of(i) * a.block_size);
                buf[u] = *reinterpret_cast<const uint4 *>(kv_row(pool, stage, stride, r, stage_base, col));
            } else {
                buf[u] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    };

    float m[G];      // running max of this lane group's scores, per head
    float l[G];      // running sum of exp(score - m)
    float acc[G][8]; // running sum of exp(score - m) * V, this lane's 8 dims
#pragma unroll
    for (int h = 0; h < G; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            acc[h][j] = 0.0f;
        }
    }

    const int n_tiles = (nkeys + TK - 1) / TK;
    uint4 kb[U];
    uint4 vb[U];
    int32_t blk[U];
    int tile = warp;
    if (tile < n_tiles) {
        tile_blocks(tile, blk);
        load_tile(a.k_pool, a.k_stage, a.k_stride_row, tile, blk, kb);
        load_tile(a.v_pool, a.v_stage, a.v_stride_row, tile, blk, vb);
    }
    // Warp-uniform trip count (the butterflies need whole warps).
    for (; tile < n_tiles; tile += kWarps) {
        const int next = tile + kWarps;
        const bool more = next < n_tiles;
        if (more) {
            tile_blocks(next, blk);  // in flight during the scores
        }

        // Scores: partial dots over this lane's 8 dims, summed over the TG lanes of the key (butterfly).
        float s[U][G];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float kf[8];
            halves_to_float(kb[u], kf);
#pragma unroll
            for (int h = 0; h < G; ++h) {
                float d = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    d = fmaf(q[h][j], kf[j], d);
                }
#pragma unroll
                for (int off = TG / 2; off > 0; off >>= 1) {
                    d += __shfl_xor_sync(0xffffffffu, d, off);
                }
                s[u][h] = d;
            }
        }
        if (more) {
            load_tile(a.k_pool, a.k_stage, a.k_stride_row, next, blk, kb);
        }
        // Soft cap (a pass of its own: inside the loop above it costs ~20 registers), then keys past the split.
        if (a.softcap != 0.0f) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
                for (int h = 0; h < G; ++h) {
                    s[u][h] = a.softcap * tanhf(s[u][h] / a.softcap);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool valid = tile * TK + u * KPW + g < nkeys;
#pragma unroll
            for (int h = 0; h < G; ++h) {
                s[u][h] = valid ? s[u][h] : -INFINITY;
            }
        }

        // Online softmax over the tile's keys of this lane group: new max, rescale, probabilities.
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float mt = s[0][h];
#pragma unroll
            for (int u = 1; u < U; ++u) {
                mt = fmaxf(mt, s[u][h]);
            }
            const float m_new = fmaxf(m[h], mt);
            const float m_ref = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: keep exp() finite
            const float f = expf(m[h] - m_ref);
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < U; ++u) {
                s[u][h] = expf(s[u][h] - m_ref);
                sum += s[u][h];
            }
            l[h] = fmaf(l[h], f, sum);
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                acc[h][j] *= f;
            }
            m[h] = m_new;
        }

        // P.V (invalid keys: probability 0, V zero-filled).
#pragma unroll
        for (int u = 0; u < U; ++u) {
            float vf[8];
            halves_to_float(vb[u], vf);
#pragma unroll
            for (int h = 0; h < G; ++h) {
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    acc[h][j] = fmaf(s[u][h], vf[j], acc[h][j]);
                }
            }
        }
        if (more) {
            load_tile(a.v_pool, a.v_stage, a.v_stride_row, next, blk, vb);
        }
    }

    // The KPW lane groups of the warp meet in a butterfly over the lane bits >= TG (rescaling to the larger max).
#pragma unroll
    for (int off = TG; off < 32; off <<= 1) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[h], off);
            const float lo = __shfl_xor_sync(0xffffffffu, l[h], off);
            const float m_new = fmaxf(m[h], mo);
            const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
            const float fa = expf(m[h] - m_ref);
            const float fb = expf(mo - m_ref);
            l[h] = l[h] * fa + lo * fb;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const float ao = __shfl_xor_sync(0xffffffffu, acc[h][j], off);
                acc[h][j] = acc[h][j] * fa + ao * fb;
            }
            m[h] = m_new;
        }
    }
    if (lane < TG) {
#pragma unroll
        for (int h = 0; h < G; ++h) {
            float4 * o4 = reinterpret_cast<float4 *>(&o_s[warp][h][li * 8]);
            o4[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
            o4[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
            if (li == 0) {
                m_s[warp][h] = m[h];
                l_s[warp][h] = l[h];
            }
        }
    }
    __syncthreads();

    // Warps 0..3 in order (a warp without keys has m = -inf, l = 0, o = 0); then the output (one split) or the
    // split's partial result (o, m, l) for the combine kernel.
    const bool one_split = ctx <= split_keys;
    for (int i = threadIdx.x; i < G * D; i += kThreads) {
        const int h = i / D;
        const int d = i % D;
        float mx = m_s[0][h];
#pragma unroll
        for (int w = 1; w < kWarps; ++w) {
            mx = fmaxf(mx, m_s[w][h]);
        }
        float sum = 0.0f;
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const float e = m_s[w][h] == -INFINITY ? 0.0f : expf(m_s[w][h] - mx);
            sum = fmaf(e, l_s[w][h], sum);
            o = fmaf(e, o_s[w][h][d], o);
        }
        const int head = kvh * G + h;
        if (one_split) {
            a.out[((int64_t) t * a.n_head + head) * D + d] = o / sum;
        } else {
            const int64_t part = ((int64_t) t * a.n_head + head) * n_splits + split;
            part_o[part * D + d] = o;
            if (d == 0) {
                part_ml[2 * part] = mx;
                part_ml[2 * part + 1] = sum;
            }
        }
    }
}

// Merge the splits of rows longer than one split: grid (n_head, n_tokens), kCombineThreads threads. All of a
// row's (m, l) are loaded at once into shared memory, then thread (r, c) sums splits r, r + R, ... of float4
// column c (R = kCombineThreads / (D / 4) split lanes side by side, every load in flight together), and the R
// partial sums meet in order r = 0..R-1.
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
combine_kernel(const PagedAttentionCudaArgs a, const float * part_o, const float * part_ml, int n_splits,
               int fixed_split_keys) {
    constexpr int kQuads = D / 4;
    constexpr int kLanesS = kCombineThreads / kQuads;
    static_assert(kLanesS >= 1 && kCombineThreads % kQuads == 0, "head size vs combine threads");
    __shared__ float w_s[kMaxSplits];  // max of each split, then its weight exp(m_s - m)
    __shared__ float l_s[kMaxSplits];
    __shared__ float4 o_s[kLanesS][kQuads];

    const int head = blockIdx.x;
    const int t = blockIdx.y;
    const int tid = threadIdx.x;
    // token_ctx_len is an input of the split kernel, which waited for its producers before it let this grid
    // launch (grid_launch_dependents after grid_dependency_wait), so it may be read before this grid's wait.
    const int ns = split_count(a.token_ctx_len[t], fixed_split_keys);
    grid_dependency_wait();  // every CTA waits, so this grid's completion implies the split kernel's
    if (ns <= 1) {
        return;  // written by the split kernel
    }
    const int64_t base = ((int64_t) t * a.n_head + head) * n_splits;
    for (int s = tid; s < ns; s += kCombineThreads) {
        const float2 ml = *reinterpret_cast<const float2 *>(part_ml + 2 * (base + s));
        w_s[s] = ml.x;
        l_s[s] = ml.y;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int s = 0; s < ns; ++s) {
        mx = fmaxf(mx, w_s[s]);
    }
    __syncthreads();  // every thread has read the maxima
    for (int s = tid; s < ns; s += kCombineThreads) {
        w_s[s] = expf(w_s[s] - mx);
    }
    __syncthreads();

    const int c = tid % kQuads;
    const int r = tid / kQuads;
    const float4 * po = reinterpret_cast<const float4 *>(part_o + base * D);
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int s = r; s < ns; s += kLanesS) {
        const float w = w_s[s];
        const float4 v = po[(int64_t) s * kQuads + c];
        o.x = fmaf(w, v.x, o.x);
        o.y = fmaf(w, v.y, o.y);
        o.z = fmaf(w, v.z, o.z);
        o.w = fmaf(w, v.w, o.w);
    }
    o_s[r][c] = o;
    __syncthreads();
    if (tid < kQuads) {
        float l = 0.0f;
        for (int s = 0; s < ns; ++s) {
            l = fmaf(w_s[s], l_s[s], l);
        }
        float4 sum = o_s[0][tid];
#pragma unroll
        for (int rr = 1; rr < kLanesS; ++rr) {
            const float4 p = o_s[rr][tid];
            sum.x += p.x;
            sum.y += p.y;
            sum.z += p.z;
            sum.w += p.w;
        }
        float * out = a.out + ((int64_t) t * a.n_head + head) * D + tid * 4;
        out[0] = sum.x / l;
        out[1] = sum.y / l;
        out[2] = sum.z / l;
        out[3] = sum.w / l;
    }
}

}  // namespace pipelined
}  // namespace cuda
}  // namespace cf
