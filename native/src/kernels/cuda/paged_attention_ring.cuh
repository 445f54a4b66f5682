// paged_attention_ring.cuh - the ring kernel of paged_attention.cu (PagedKernel kPagedKernelRing, opt-in): query heads
// across threads, K/V tiles through a cp.async ring in shared memory, an online softmax per key group, and CTAs that
// stream several splits of one row. Contract, work split and batch invariance: paged_attention.cuh.
//
// Why (issue 11, results/h200_gpu/stop51): under Nsight Compute the two-pass kernel's split CTA and FlashInfer's
// batch decode kernel had the same registers and occupancy at B=8 / 8K, yet the two-pass kernel ran 60.6 against
// 53.4 us. Its instruction stream stalled 2.5x as long on shared-memory and shuffle results and 2.6x on fixed-latency
// chains: each thread loops over its GQA group's heads (qr[HG][8]), the split's scores go through shared memory and
// two block-wide reductions separate the K phase from the V phase, and its grid ran 1.94 waves. This kernel takes the
// thread layout of FlashInfer's decode kernel (flashinfer/decode.cuh, BatchDecodeWithPagedKVCacheKernel: bdx lanes
// per head row, bdy = the GQA group, bdz key groups, cp.async stages; read to learn, not copied) under this project's
// rule that a row's sums run in an order fixed by its own length:
//   - splits are the two-pass kernel's (two_pass::split_keys_for: 256 keys for every row by default, absolute
//     boundaries); a split's partial state (m, l, o) is written exactly as the two-pass kernel writes it and merged by
//     the same combine kernel (two_pass::paged_attention_combine_kernel), so rows of one split write their output
//     directly and longer rows go through the combine in split order;
//   - a CTA streams `spc` consecutive splits of one (token, KV head), its K/V tiles flowing through the ring across
//     split boundaries; spc is the launcher's choice from the grid (about one resident wave) and changes no sum: each
//     split's state is reset at its start and written at its end;
//   - thread (x, y, z) of the CTA (x < TX = D / 8 lanes, 16 bytes of a head row each; y < G query heads; z < TZ key
//     groups) computes query head y over dims [8x, 8x + 8) for keys z * KPZ + j (j < KPZ) of every tile of KT keys:
//     one head's 8 FMAs per key, the lanes' partial dots summed in an xor butterfly over the TX lanes (offsets TX/2,
//     ..., 1), an online softmax over the key group's keys in key order (Milakov and Gimelshein 2018), and at the
//     split's end the TZ key groups' states merged in the order z = 0, 1, ..., TZ - 1;
//   - none of this looks at the batch: the bits of a row are a function of its context length, the model's shape and
//     the values, so the kernel is batch-invariant. They are not the two-pass kernel's bits (another order of the
//     same sums; the standalone test compares both with a float64 reference), so one node must not mix the two.
// Covered shapes: head sizes 64, 128 and 256, GQA groups 1, 2, 4 and 8 with TX * G <= 128 (ring::covers); the
// launcher runs the two-pass kernel elsewhere.
#pragma once

#include "paged_attention.cuh"
#include "paged_attention_pipelined.cuh"
#include "paged_attention_two_pass.cuh"

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace cf {
namespace cuda {
namespace ring {

constexpr int kThreads = 128;
// Tiles in the ring (build knobs for the standalone bench, -D at compile time; no output bit depends on them): with one
// 16-byte chunk of K and one of V per thread per tile (GQA 8) CF_RING_STAGES_1, with two (GQA 4) CF_RING_STAGES_N,
// with four (GQA 1 and 2) 2.
#ifndef CF_RING_STAGES_1
#define CF_RING_STAGES_1 4
#endif
#ifndef CF_RING_STAGES_N
#define CF_RING_STAGES_N 2
#endif
// Most splits one CTA streams (the launcher's spc is clamped to it).
constexpr int kMaxSplitsPerCta = 16;

__host__ __device__ constexpr bool covers(int D, int G) {
    return (D == 64 || D == 128 || D == 256) && (G == 1 || G == 2 || G == 4 || G == 8) && (D / 8) * G <= kThreads;
}

// The CTA's layout for head size D and GQA group G (covers(D, G)):
//   TX lanes per head row (16 bytes = 8 halves each), TZ key groups, CH 16-byte chunks of K (and of V) each thread
//   copies per tile, KT = 1024 * CH / D keys per tile (CH * 2 KB of K and as much of V), KPZ = KT / TZ keys per key
//   group per tile, NS tiles in the ring (stages). Small groups take more chunks per thread, so that a tile carries
//   4-8 keys per key group (FlashInfer's tile_size_per_bdx plays that part): the per-tile work (block table, addresses,
//   barrier, the softmax's rescale) is paid once per KPZ keys. KPZ: 4 at GQA 1, 8 otherwise.
template <int D, int G> struct Shape {
    static constexpr int TX = D / 8;
    static constexpr int TZ = kThreads / (TX * G);
    static constexpr int CH = G <= 2 ? 4 : G == 4 ? 2 : 1;
    static constexpr int KT = 1024 * CH / D;
    static constexpr int KPZ = KT / TZ;
    static constexpr int NS = CH == 1 ? CF_RING_STAGES_1 : CH == 2 ? CF_RING_STAGES_N : 2;  // CH 4: 32 KB already
    static_assert(covers(D, G), "ring: head size 64/128/256, GQA 1/2/4/8, D / 8 * G <= 128");
    static_assert(NS >= 2, "ring: at least two stages");
    static_assert(TX * G * TZ == kThreads && KT * TX == CH * kThreads && KPZ * TZ == KT && KPZ >= 1, "ring layout");
};

// cp.async of 16 bytes global -> shared, bypassing L1 (.cg); src_bytes 0 fills the 16 bytes with zeros (keys past
// the range: their V must be 0, not stale or uninitialized shared memory, since p * NaN is NaN).
__device__ __forceinline__ void cp_async16(void * smem, const void * gmem, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = (unsigned) __cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#else
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (src_bytes > 0) {
        v = *reinterpret_cast<const uint4 *>(gmem);
    }
    *reinterpret_cast<uint4 *>(smem) = v;
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// One CTA: token blockIdx.z, KV head blockIdx.y (query heads kvh * G .. kvh * G + G - 1), splits [c * spc, c * spc +
// spc) of the row (c = blockIdx.x) that exist. Writes, per split and query head, the output (rows of one split:
// out = o / l, and out_f16 when set) or the partial state part_o [n_tokens][n_head][n_splits][D] / part_ml
// [n_tokens][n_head][n_splits][2] (the two-pass kernel's layout, merged by its combine kernel). bs_shift: log2 of the
// block size when it is a power of two, else -1. kSoftcap: a.softcap != 0 (the launcher's choice; a template argument
// so that the plain kernel carries no tanh path). 128 threads.
// Scores are kept in log2 units (FlashInfer's use of exp2): q is scaled by scale * log2(e) once (without a soft cap;
// with one by scale, and the capped score by log2(e)), so that every exponential is one ex2; the states written for
// the combine kernel carry m in natural units (m * ln 2), as the two-pass kernel's do.
template <int D, int G, bool kSoftcap>
__global__ void __launch_bounds__(kThreads)
split_kernel(const PagedAttentionCudaArgs a, float * part_o, float * part_ml, int n_splits, int spc, int bs_shift,
             bool pdl) {
    using S = Shape<D, G>;
    constexpr int TX = S::TX, TZ = S::TZ, CH = S::CH, KT = S::KT, KPZ = S::KPZ, NS = S::NS;
    __shared__ __align__(16) half k_s[NS][KT * D];  // the ring: tile i in stage i % NS, [key][D] as in the pool
    __shared__ __align__(16) half v_s[NS][KT * D];
    // the key groups' states at a split's end: o [TZ][G][D], m and l [TZ][G] (unused when TZ == 1)
    __shared__ float mo_s[TZ > 1 ? TZ * G * D : 1];
    __shared__ float mm_s[TZ > 1 ? TZ * G : 1];
    __shared__ float ml_s[TZ > 1 ? TZ * G : 1];

    pipelined::grid_dependency_wait();  // q, K/V and the tables may come from the previous kernels (PDL)
    if (pdl) {
        pipelined::grid_launch_dependents();
    }
    const int tid = threadIdx.x;
    const int tx = tid % TX;
    const int ty = (tid / TX) % G;
    const int tz = tid / (TX * G);
    const int kvh = blockIdx.y;
    const int t = blockIdx.z;
    const int ctx = a.token_ctx_len[t];
    const int split_keys = two_pass::split_keys_for(ctx);
    const int ns = two_pass::split_count(ctx);
    const int s_begin = (int) blockIdx.x * spc;
    if (s_begin >= ns || ns > n_splits) {
        return;  // past this row's splits, or a context longer than the table allows (nothing written)
    }
    const int s_end = min(s_begin + spc, ns);
    // split_keys and KT are powers of two, so tiles map to (split, tile of the split) by shifts
    const int tiles_per_split = (split_keys + KT - 1) / KT;
    const int tps_shift = __ffs(tiles_per_split) - 1;
    const int last_keys = ctx - (ns - 1) * split_keys;  // keys of the row's last split
    const int n_tiles = (s_end - s_begin - 1) * tiles_per_split +
                        (s_end == ns ? (last_keys + KT - 1) / KT : tiles_per_split);
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t] * a.block_table_stride;
    const int32_t stage_base = (int32_t) a.stage_base_row;  // INT32_MAX without streaming (launch)
    const int head = kvh * G + ty;

    // Pool rows of this thread's chunks of tile i (-1: past the tile's split or the row), chunk c = key
    // (tid + c * kThreads) / TX of the tile, 16 bytes at column part * 8 of the KV head's D.
    // Tile i's split sp and keys [k0, kend) (kend: the split's or the row's end, whichever comes first).
    auto tile_span = [&](int i, int & sp, int & k0, int & kend) {
        sp = s_begin + (i >> tps_shift);
        k0 = sp * split_keys + (i & (tiles_per_split - 1)) * KT;
        kend = min((sp + 1) * split_keys, ctx);
    };
    auto tile_rows = [&](int i, int32_t (&rows)[CH]) {
        int sp, k0, kend;
        tile_span(i, sp, k0, kend);
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int p = k0 + (tid + c * kThreads) / TX;
            int32_t r = -1;
            if (i < n_tiles && p < kend) {
                const int blk = bs_shift >= 0 ? p >> bs_shift : p / a.block_size;
                const int off = bs_shift >= 0 ? p & (a.block_size - 1) : p % a.block_size;
                r = __ldg(table + blk) * a.block_size + off;
            }
            rows[c] = r;
        }
    };
    auto issue_tile = [&](int i, const int32_t (&rows)[CH]) {
        const int st = i % NS;
#pragma unroll
        for (int c = 0; c < CH; ++c) {
            const int q = tid + c * kThreads;
            const int col = kvh * D + (q % TX) * 8;
            const int32_t r = rows[c];
            const bool ok = r >= 0;
            // pool row r, or with streaming row r - stage_base of the staging slot (pipelined::kv_row) as selects;
            // a chunk past the range reads nothing (row 0 of the pool as its address, zero-filled)
            const bool staged = r >= stage_base;
            const int64_t row = ok ? (staged ? r - stage_base : r) : 0;
            const half * kp = (staged ? a.k_stage : a.k_pool) + row * a.k_stride_row + col;
            const half * vp = (staged ? a.v_stage : a.v_pool) + row * a.v_stride_row + col;
            cp_async16(&k_s[st][q * 8], kp, ok ? 16 : 0);
            cp_async16(&v_s[st][q * 8], vp, ok ? 16 : 0);
        }
    };

    // the ring's first NS - 1 tiles, and the rows of tile NS - 1 (issued in the loop's first step)
    int32_t rows[CH];
#pragma unroll
    for (int i = 0; i < NS - 1; ++i) {
        tile_rows(i, rows);
        issue_tile(i, rows);
        cp_async_commit();
    }
    tile_rows(NS - 1, rows);

    constexpr float kLog2e = 1.4426950408889634f;
    constexpr float kLn2 = 0.6931471805599453f;
    const float cap_inv = kSoftcap ? 1.0f / a.softcap : 0.0f;
    const float cap_log2 = kSoftcap ? a.softcap * kLog2e : 0.0f;
    float q[8];
    {
        const float * qp = a.q + (int64_t) t * a.q_stride_token + (int64_t) head * a.q_stride_head + tx * 8;
        const float qscale = kSoftcap ? a.scale : a.scale * kLog2e;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            q[j] = qp[j] * qscale;
        }
    }
    float m = -INFINITY;
    float l = 0.0f;
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        o[j] = 0.0f;
    }

    for (int i = 0; i < n_tiles; ++i) {
        cp_async_wait<NS - 2>();  // this thread's copies of tile i have landed
        __syncthreads();          // everyone's have, and stage (i - 1) % NS is read by no one
        issue_tile(i + NS - 1, rows);
        cp_async_commit();  // one group per step (zero-fill copies past the range), so that the wait count holds
        tile_rows(i + NS, rows);  // its table loads are in flight during this tile's arithmetic

        const half * kt = &k_s[i % NS][0];
        const half * vt = &v_s[i % NS][0];
        int sp, k0, kend;
        tile_span(i, sp, k0, kend);
        // scores of this key group's KPZ keys for head ty
        float s[KPZ];
#pragma unroll
        for (int j = 0; j < KPZ; ++j) {
            const int kk = tz * KPZ + j;
            const uint4 raw = *reinterpret_cast<const uint4 *>(kt + kk * D + tx * 8);
            float kf[8];
            pipelined::halves_to_float(raw, kf);
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                d = fmaf(q[e], kf[e], d);
            }
#pragma unroll
            for (int off = TX / 2; off > 0; off >>= 1) {
                d += __shfl_xor_sync(0xffffffffu, d, off);
            }
            if (kSoftcap) {
                d = cap_log2 * tanhf(d * cap_inv);
            }
            s[j] = k0 + kk < kend ? d : -INFINITY;
        }
        // online softmax over the key group's keys, in key order
        float m_new = m;
#pragma unroll
        for (int j = 0; j < KPZ; ++j) {
            m_new = fmaxf(m_new, s[j]);
        }
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every weight below is 0
        const float alpha = exp2f(m - m_use);
        l *= alpha;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            o[e] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < KPZ; ++j) {
            const float p = exp2f(s[j] - m_use);
            l += p;
            const uint4 raw = *reinterpret_cast<const uint4 *>(vt + (tz * KPZ + j) * D + tx * 8);
            float vf[8];
            pipelined::halves_to_float(raw, vf);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                o[e] = fmaf(p, vf[e], o[e]);
            }
        }
        m = m_new;

        const bool split_end = ((i + 1) & (tiles_per_split - 1)) == 0 || i + 1 == n_tiles;
        if (!split_end) {
            continue;
        }
        // the split's state: merge the key groups (z in order), then the output or the partial state.
        // emit: dim dd of query head kvh * G + h, from the split's (o, m in log2 units, l)
        auto emit = [&](int h, int dd, float oo, float mm, float ll) {
            const int64_t row = (int64_t) t * a.n_head + kvh * G + h;
            if (ns == 1) {
                const float r = oo / ll;
                a.out[row * D + dd] = r;
                if (a.out_f16 != nullptr) {
                    a.out_f16[row * D + dd] = __float2half(r);
                }
                return;
            }
            const int64_t part = row * n_splits + sp;
            part_o[part * D + dd] = oo;
            if (dd == 0) {
                part_ml[2 * part] = mm * kLn2;
                part_ml[2 * part + 1] = ll;
            }
        };
        if (TZ == 1) {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                emit(ty, tx * 8 + e, o[e], m, l);
            }
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                mo_s[(tz * G + ty) * D + tx * 8 + e] = o[e];
            }
            if (tx == 0) {
                mm_s[tz * G + ty] = m;
                ml_s[tz * G + ty] = l;
            }
            __syncthreads();
            for (int idx = tid; idx < G * D; idx += kThreads) {
                const int h = idx / D;
                const int dd = idx % D;
                float mx = mm_s[h];
#pragma unroll
                for (int z = 1; z < TZ; ++z) {
                    mx = fmaxf(mx, mm_s[z * G + h]);
                }
                float oo = 0.0f;
                float ll = 0.0f;
#pragma unroll
                for (int z = 0; z < TZ; ++z) {
                    const float w = exp2f(mm_s[z * G + h] - mx);  // a key group without keys: exp2(-inf) = 0
                    oo = fmaf(w, mo_s[(z * G + h) * D + dd], oo);
                    ll = fmaf(w, ml_s[z * G + h], ll);
                }
                emit(h, dd, oo, mx, ll);
            }
            // mo_s / mm_s / ml_s are written again at the next split's end, after the next step's __syncthreads
        }
        m = -INFINITY;
        l = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            o[e] = 0.0f;
        }
    }
    cp_async_wait<0>();  // no copy outlives the CTA (the zero-fill groups past the range included)
}

}  // namespace ring
}  // namespace cuda
}  // namespace cf
