// paged_prefill_mma.cu - the opt-in tensor-core prefill path; contract, selection and numerics in
// paged_prefill_mma.cuh.
#include "paged_prefill_mma.cuh"

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cf {
namespace cuda {

namespace {

#define CF_PF_STR2(x) #x
#define CF_PF_STR(x) CF_PF_STR2(x)
#define CF_PF_WHERE __FILE__ ":" CF_PF_STR(__LINE__) ": "

constexpr int kWarps = kPagedPrefillRows / 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = kPagedPrefillKeys;
constexpr int kScanThreads = 1024;
constexpr int kMaxDevices = 64;
static_assert(kPagedPrefillRows % 16 == 0 && kKeys % 16 == 0, "tiles are made of 16 x 16 MMA fragments");

// -1 = not read yet, 0 = off, 1 = on.
std::atomic<int> g_mode{-1};

int mode_from_env() {
    const char * v = std::getenv("CACHEFLOW_PAGED_PREFILL");
    if (v == nullptr || v[0] == '\0' || std::strcmp(v, "rows") == 0) {
        return 0;
    }
    if (std::strcmp(v, "mma") == 0) {
        return 1;
    }
    std::fprintf(stderr, "cacheflow: CACHEFLOW_PAGED_PREFILL=%s is neither \"mma\" nor \"rows\"; using rows\n", v);
    return 0;
}

// Compute capability major of the current device (cached per device; 0 if unknown).
int device_major() {
    static std::atomic<int> major_of[kMaxDevices] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
        return 0;
    }
    int m = major_of[dev].load(std::memory_order_relaxed);
    if (m == 0 && cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess) {
        major_of[dev].store(m, std::memory_order_relaxed);
    }
    return m;
}

// Workspace layout: run_start [n_tokens] (first token of the token's MMA run, -1 for rows-kernel tokens),
// rows_ctx [n_tokens] (the rows kernel's context lengths), run_len [n_tokens] (scratch of the scan).
struct Workspace {
    int32_t * run_start;
    int32_t * rows_ctx;
    int32_t * run_len;
};

Workspace carve(void * ws, int n) {
    int32_t * p = static_cast<int32_t *>(ws);
    return {p, p + n, p + 2 * (size_t) n};
}

// ---- run detection (one CTA) ------------------------------------------------------------------------

// Inclusive max-scan over the CTA (kScanThreads threads, in thread order); ends with a __syncthreads.
__device__ int block_scan_max(int v, int * warp_s /* [32] */) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, v, off);
        if (lane >= off) {
            v = max(v, x);
        }
    }
    if (lane == 31) {
        warp_s[warp] = v;
    }
    __syncthreads();
    if (warp == 0) {
        int w = lane < kScanThreads / 32 ? warp_s[lane] : -1;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int x = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) {
                w = max(w, x);
            }
        }
        warp_s[lane] = w;
    }
    __syncthreads();
    if (warp > 0) {
        v = max(v, warp_s[warp - 1]);
    }
    __syncthreads();  // warp_s is reused by the next call
    return v;
}

// Token t starts a run unless it continues token t - 1 (same sequence, context one longer). Writes
// run_start[t] (the run's first token if the run has >= min_run tokens, else -1) and rows_ctx[t] (1 for
// MMA tokens, else token_ctx_len[t]).
__global__ void __launch_bounds__(kScanThreads)
paged_prefill_runs_kernel(const int32_t * seq /* [n] */, const int32_t * ctx /* [n] */, int n, int min_run,
                          int32_t * run_start /* [n] */, int32_t * rows_ctx /* [n] */, int32_t * run_len /* [n] */) {
    __shared__ int warp_s[32];
    int carry = -1;
    for (int base = 0; base < n; base += kScanThreads) {
        const int t = base + (int) threadIdx.x;
        int v = -1;
        if (t < n) {
            const bool cont = t > 0 && seq[t] == seq[t - 1] && ctx[t] == ctx[t - 1] + 1;
            v = cont ? -1 : t;
        }
        v = max(block_scan_max(v, warp_s), carry);
        if (t < n) {
            run_start[t] = v;
        }
        // The scan is non-decreasing in t: the last thread holds the chunk's carry.
        if (threadIdx.x == kScanThreads - 1) {
            warp_s[0] = v;
        }
        __syncthreads();
        carry = warp_s[0];
        __syncthreads();
    }
    for (int t = threadIdx.x; t < n; t += kScanThreads) {
        if (t == n - 1 || run_start[t + 1] != run_start[t]) {  // t is the last token of its run
            run_len[run_start[t]] = t - run_start[t] + 1;
        }
    }
    __syncthreads();
    for (int t = threadIdx.x; t < n; t += kScanThreads) {
        const int s = run_start[t];
        const bool mma = run_len[s] >= min_run;
        run_start[t] = mma ? s : -1;
        rows_ctx[t] = mma ? 1 : ctx[t];
    }
}

// ---- tensor-core primitives (sm_80+) ------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return (uint32_t) __cvta_generic_to_shared(p);
}

// 16 bytes global -> shared, asynchronously; valid == false writes 16 zero bytes (src is not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void * src, bool valid) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Four 8x8 b16 matrices; lanes 8i .. 8i + 7 give the row addresses of matrix i, register i returns it.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
#if __CUDA_ARCH__ >= 800
    if (kTrans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr)
                     : "memory");
    }
#endif
}

// c (16 x 8 f32) += a (16 x 16 f16, row-major fragment) * b (16 x 8 f16, column-major fragment).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

// ---- the MMA kernel -------------------------------------------------------------------------------------
//
// Fragment layouts (PTX ISA, mma.m16n8k16; lane = 4 * g + c): A holds rows g and g + 8, columns 2c, 2c + 1
// (+ 8); B holds k = 2c, 2c + 1 (+ 8) of column g; the f32 accumulator holds rows g / g + 8, columns 2c,
// 2c + 1. A score accumulator pair (keys 16 s .. 16 s + 15) is therefore already the A fragment of P for
// the P.V product once rounded to f16 (FlashAttention-2's register reuse).

// Shared-memory row stride in halves: 16 bytes of padding put the 8 rows of an ldmatrix in distinct banks.
template <int D>
__host__ __device__ constexpr int smem_stride() {
    return D + 8;
}

template <int D>
constexpr size_t smem_bytes() {
    return (size_t) (kPagedPrefillRows + 4 * kKeys) * smem_stride<D>() * sizeof(half);
}

// What a CTA needs to know about the run segment it computes: tokens [ts, te) of one run, rows [0, n_rows).
struct Segment {
    int ts, te, n_rows, seq, ctx_last;
};

// Issue the cp.async copies of K/V positions [kt * kKeys, kt * kKeys + kKeys) of the segment's sequence into
// buffer (k_buf, v_buf) ([kKeys][stride] each); positions >= ctx_last become zeros. bs_shift = log2(block_size)
// for power-of-two block sizes, else -1.
template <int D>
__device__ __forceinline__ void load_kv_tile(const PagedAttentionCudaArgs & a, const int32_t * table, int kvh, int kt,
                                             int ctx_last, int32_t stage_base, int bs_shift, half * k_buf,
                                             half * v_buf) {
    constexpr int kStride = smem_stride<D>();
    constexpr int kChunks = D / 8;  // 16-byte pieces per row
    for (int i = threadIdx.x; i < kKeys * kChunks; i += kThreads) {
        const int row = i / kChunks;
        const int col = (i % kChunks) * 8;
        const int p = kt * kKeys + row;
        const bool valid = p < ctx_last;
        const half * ksrc = a.k_pool;
        const half * vsrc = a.v_pool;
        if (valid) {
            const int32_t r = bs_shift >= 0 ? (table[p >> bs_shift] << bs_shift) + (p & (a.block_size - 1))
                                            : table[p / a.block_size] * a.block_size + p % a.block_size;
            const int c = kvh * D + col;
            ksrc = r < stage_base ? a.k_pool + (int64_t) r * a.k_stride_row + c
                                  : a.k_stage + (int64_t) (r - stage_base) * a.k_stride_row + c;
            vsrc = r < stage_base ? a.v_pool + (int64_t) r * a.v_stride_row + c
                                  : a.v_stage + (int64_t) (r - stage_base) * a.v_stride_row + c;
        }
        cp_async16(smem_addr(k_buf + row * kStride + col), ksrc, valid);
        cp_async16(smem_addr(v_buf + row * kStride + col), vsrc, valid);
    }
}

// Rows [0, n_rows) of the segment as f16 in q_s ([kPagedPrefillRows][stride]); the other rows zero.
// Row r is token ts + r / G, query head kvh * G + r % G.
template <int D>
__device__ __forceinline__ void load_q_tile(const PagedAttentionCudaArgs & a, const Segment & sg, int G, int kvh,
                                            half * q_s) {
    constexpr int kStride = smem_stride<D>();
    for (int i = threadIdx.x; i < kPagedPrefillRows * (D / 4); i += kThreads) {
        const int r = i / (D / 4);
        const int col = (i % (D / 4)) * 4;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < sg.n_rows) {
            const int t = sg.ts + r / G;
            const int head = kvh * G + r % G;
            v = *reinterpret_cast<const float4 *>(a.q + (int64_t) t * a.q_stride_token +
                                                  (int64_t) head * a.q_stride_head + col);
        }
        half2 * dst = reinterpret_cast<half2 *>(q_s + r * kStride + col);
        dst[0] = __floats2half2_rn(v.x, v.y);
        dst[1] = __floats2half2_rn(v.z, v.w);
    }
}

// One warp's 16 x kKeys scores of key tile kt against K in k_buf: s = Q K^T, then scale, softcap, log2(e)
// (the softmax runs in base 2) and the causal mask (key p counts for a row only when p < its ctx).
template <int D>
__device__ __forceinline__ void tile_scores(float (&s)[kKeys / 8][4], const uint32_t (&qf)[D / 16][4],
                                            const half * k_buf, const PagedAttentionCudaArgs & a, int kt,
                                            const int (&row_ctx)[2], bool need_mask) {
    constexpr int kStride = smem_stride<D>();
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    }
    // ldmatrix x4 of keys 16 n .. 16 n + 15, dims 16 k .. 16 k + 15: matrices (keys +0, dims +0), (+0, +8),
    // (+8, +0), (+8, +8) = b0, b1 of key n-tile 2n and b0, b1 of key n-tile 2n + 1.
    const int key_in = (lane % 8) + (lane / 16) * 8;
    const int dim_in = ((lane / 8) % 2) * 8;
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
#pragma unroll
        for (int n = 0; n < kKeys / 16; ++n) {
            uint32_t b[4];
            ldmatrix_x4<false>(b, smem_addr(k_buf + (16 * n + key_in) * kStride + 16 * k + dim_in));
            mma_16816(s[2 * n], qf[k], b[0], b[1]);
            mma_16816(s[2 * n + 1], qf[k], b[2], b[3]);
        }
    }
    const float log2e = 1.4426950408889634f;
    const float scale_log2 = a.scale * log2e;
    const int c = lane % 4;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float x;
            if (a.softcap != 0.0f) {
                x = a.softcap * log2e * tanhf(s[j][e] * a.scale / a.softcap);
            } else {
                x = s[j][e] * scale_log2;
            }
            if (need_mask) {
                const int p = kt * kKeys + 8 * j + 2 * c + (e & 1);
                x = p < row_ctx[e / 2] ? x : -INFINITY;
            }
            s[j][e] = x;
        }
    }
}

// Online softmax step for one warp's two rows per thread (row g: e = 0, 1; row g + 8: e = 2, 3): new maxima,
// s becomes exp2(s - m), l the thread's partial sums, o rescaled. A row with no unmasked key so far keeps
// m = -inf and contributes zeros (it is a padding row; no real row reaches its first key tile masked).
template <int D>
__device__ __forceinline__ void online_softmax(float (&s)[kKeys / 8][4], float (&m)[2], float (&l)[2],
                                               float (&o)[D / 8][4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
            mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2f(m[i] - m_use);
        m[i] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kKeys / 8; ++j) {
            s[j][2 * i] = exp2f(s[j][2 * i] - m_use);
            s[j][2 * i + 1] = exp2f(s[j][2 * i + 1] - m_use);
            sum += s[j][2 * i] + s[j][2 * i + 1];
        }
        l[i] = l[i] * alpha + sum;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[j][2 * i] *= alpha;
            o[j][2 * i + 1] *= alpha;
        }
    }
}

// o += P V for one warp: P from the probabilities in s (rounded to f16), V from v_buf via ldmatrix.trans.
template <int D>
__device__ __forceinline__ void tile_pv(float (&o)[D / 8][4], const float (&s)[kKeys / 8][4], const half * v_buf) {
    constexpr int kStride = smem_stride<D>();
    const int lane = threadIdx.x % 32;
    // ldmatrix.trans x4 of keys 16 k .., dims 16 n ..: matrices (keys +0, dims +0), (+8, +0), (+0, +8),
    // (+8, +8) = b0, b1 of dim n-tile 2n and b0, b1 of dim n-tile 2n + 1.
    const int key_in = (lane % 8) + ((lane / 8) % 2) * 8;
    const int dim_in = (lane / 16) * 8;
#pragma unroll
    for (int k = 0; k < kKeys / 16; ++k) {
        const uint32_t pa[4] = {pack_half2(s[2 * k][0], s[2 * k][1]), pack_half2(s[2 * k][2], s[2 * k][3]),
                                pack_half2(s[2 * k + 1][0], s[2 * k + 1][1]),
                                pack_half2(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
            uint32_t b[4];
            ldmatrix_x4<true>(b, smem_addr(v_buf + (16 * k + key_in) * kStride + 16 * n + dim_in));
            mma_16816(o[2 * n], pa, b[0], b[1]);
            mma_16816(o[2 * n + 1], pa, b[2], b[3]);
        }
    }
}

// One run segment: the whole CTA streams the K/V tiles (double-buffered cp.async), each warp computes its
// 16 rows and skips the tiles that lie wholly beyond its rows' contexts. Ends with a __syncthreads, so the
// next segment may reuse the shared memory.
template <int D>
__device__ void run_segment(const PagedAttentionCudaArgs & a, const Segment & sg, int G, int kvh, half * smem) {
    constexpr int kStride = smem_stride<D>();
    half * q_s = smem;                                    // [kPagedPrefillRows][kStride]
    half * k_s = q_s + kPagedPrefillRows * kStride;       // [2][kKeys][kStride]
    half * v_s = k_s + 2 * kKeys * kStride;               // [2][kKeys][kStride]
    const int32_t stage_base = (int32_t) a.stage_base_row;  // INT32_MAX without streaming (launcher)
    const int32_t * table = a.block_tables + (int64_t) sg.seq * a.block_table_stride;
    const int n_kt = (sg.ctx_last + kKeys - 1) / kKeys;
    const int bs_shift = (a.block_size & (a.block_size - 1)) == 0 ? __ffs(a.block_size) - 1 : -1;

    load_kv_tile<D>(a, table, kvh, 0, sg.ctx_last, stage_base, bs_shift, k_s, v_s);
    cp_async_commit();
    load_q_tile<D>(a, sg, G, kvh, q_s);
    __syncthreads();

    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    const int g = lane / 4;
    // Context lengths of this thread's rows (0 for padding rows) and the warp's smallest / largest.
    int row_ctx[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = 16 * warp + g + 8 * i;
        row_ctx[i] = r < sg.n_rows ? a.token_ctx_len[sg.ts + r / G] : 0;
    }
    const int w_first = 16 * warp;
    const int w_last = min(16 * warp + 15, sg.n_rows - 1);
    const int warp_ctx_max = w_first < sg.n_rows ? a.token_ctx_len[sg.ts + w_last / G] : 0;
    const int warp_ctx_min = w_first < sg.n_rows ? a.token_ctx_len[sg.ts + w_first / G] : 0;
    const bool warp_has_pad = w_first + 15 >= sg.n_rows;

    uint32_t qf[D / 16][4];
    {
        const int r = 16 * warp + lane % 16;
        const int col = (lane / 16) * 8;
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
            ldmatrix_x4<false>(qf[k], smem_addr(q_s + r * kStride + 16 * k + col));
        }
    }
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    }
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};

    for (int kt = 0; kt < n_kt; ++kt) {
        if (kt + 1 < n_kt) {
            const int b = (kt + 1) % 2;
            load_kv_tile<D>(a, table, kvh, kt + 1, sg.ctx_last, stage_base, bs_shift, k_s + b * kKeys * kStride,
                            v_s + b * kKeys * kStride);
        }
        cp_async_commit();
        cp_async_wait<1>();  // tile kt has landed (only tile kt + 1 may be pending)
        __syncthreads();
        if (kt * kKeys < warp_ctx_max) {
            const int b = kt % 2;
            const bool need_mask = warp_has_pad || (kt + 1) * kKeys > warp_ctx_min;
            float s[kKeys / 8][4];
            tile_scores<D>(s, qf, k_s + b * kKeys * kStride, a, kt, row_ctx, need_mask);
            online_softmax<D>(s, m, l, o);
            tile_pv<D>(o, s, v_s + b * kKeys * kStride);
        }
        __syncthreads();  // buffer kt % 2 is free for tile kt + 2
    }

    // Rows: out = o / l, the row sums meeting across the 4 lanes of a row first.
    const int c = lane % 4;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        const int r = 16 * warp + g + 8 * i;
        if (r >= sg.n_rows) {
            continue;
        }
        const int t = sg.ts + r / G;
        const int head = kvh * G + r % G;
        float * dst = a.out + ((int64_t) t * a.n_head + head) * D;
        const float inv = 1.0f / li;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            *reinterpret_cast<float2 *>(dst + 8 * j + 2 * c) = make_float2(o[j][2 * i] * inv, o[j][2 * i + 1] * inv);
        }
    }
}

// Grid (query tiles, KV heads); tile x covers tokens [x T, x T + T), T = tokens_per_tile = kPagedPrefillRows / G,
// heaviest (last) tiles first. A tile computes each run segment inside it in turn (a tile may hold the end
// of one run and the start of the next) and skips its rows-kernel tokens.
template <int D>
__global__ void __launch_bounds__(kThreads, kWarps <= 4 ? 2 : 1)
paged_prefill_mma_kernel(const PagedAttentionCudaArgs a, const int32_t * run_start /* [n_tokens] */, int G,
                         int tokens_per_tile) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    half * smem = reinterpret_cast<half *>(smem_raw);
    const int tile = (int) (gridDim.x - 1 - blockIdx.x);
    const int kvh = blockIdx.y;
    const int t_end = min((tile + 1) * tokens_per_tile, a.n_tokens);
    int t = tile * tokens_per_tile;
    while (true) {
        while (t < t_end && run_start[t] < 0) {
            ++t;
        }
        if (t >= t_end) {
            return;
        }
        const int start = run_start[t];
        int te = t + 1;
        while (te < t_end && run_start[te] == start) {
            ++te;
        }
        const Segment sg{t, te, (te - t) * G, a.token_seq_idx[t], a.token_ctx_len[te - 1]};
        run_segment<D>(a, sg, G, kvh, smem);
        t = te;
    }
}

template <int D>
cudaError_t launch_mma(const PagedAttentionCudaArgs & args, const int32_t * run_start, cudaStream_t stream) {
    static std::atomic<bool> smem_raised[kMaxDevices] = {};
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) {
        return err;
    }
    if (dev < 0 || dev >= kMaxDevices) {
        return cudaErrorInvalidDevice;
    }
    if (!smem_raised[dev].load()) {
        err = cudaFuncSetAttribute(paged_prefill_mma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int) smem_bytes<D>());
        if (err != cudaSuccess) {
            return err;
        }
        smem_raised[dev].store(true);
    }
    PagedAttentionCudaArgs a = args;
    if (a.k_stage == nullptr) {
        a.stage_base_row = INT32_MAX;  // no row index reaches it: every row is the pool's
    }
    const int G = a.n_head / a.n_head_kv;
    const int tokens_per_tile = kPagedPrefillRows / G;
    const dim3 grid((unsigned) ((a.n_tokens + tokens_per_tile - 1) / tokens_per_tile), (unsigned) a.n_head_kv);
    paged_prefill_mma_kernel<D><<<grid, kThreads, smem_bytes<D>(), stream>>>(a, run_start, G, tokens_per_tile);
    return cudaGetLastError();
}

}  // namespace

bool paged_prefill_mma_enabled() {
    int mode = g_mode.load();
    if (mode < 0) {
        int expected = -1;
        g_mode.compare_exchange_strong(expected, mode_from_env());
        mode = g_mode.load();
    }
    return mode == 1;
}

void paged_prefill_mma_set_enabled_for_testing(bool enabled) {
    g_mode.store(enabled ? 1 : 0);
}

bool paged_prefill_mma_applies(const PagedAttentionCudaArgs & a) {
    if (!paged_prefill_mma_enabled() || a.n_tokens < kPagedPrefillMinRun) {
        return false;
    }
    if (a.head_dim != 64 && a.head_dim != 128) {
        return false;
    }
    if (reinterpret_cast<uintptr_t>(a.q) % 16 != 0 || a.q_stride_head % 4 != 0 || a.q_stride_token % 4 != 0 ||
        reinterpret_cast<uintptr_t>(a.out) % 8 != 0) {
        return false;
    }
    return device_major() >= 8;
}

size_t paged_prefill_mma_workspace_bytes(const PagedAttentionCudaArgs & a) {
    return paged_prefill_mma_applies(a) ? 3 * (size_t) a.n_tokens * sizeof(int32_t) : 0;
}

const char * paged_prefill_mma_prepare(const PagedAttentionCudaArgs & a, void * workspace, cudaStream_t stream,
                                       const int32_t ** rows_ctx_len) {
    static thread_local char message[256];
    if (workspace == nullptr) {
        std::snprintf(message, sizeof(message), CF_PF_WHERE "paged prefill (MMA): no workspace");
        return message;
    }
    const Workspace w = carve(workspace, a.n_tokens);
    paged_prefill_runs_kernel<<<1, kScanThreads, 0, stream>>>(a.token_seq_idx, a.token_ctx_len, a.n_tokens,
                                                              kPagedPrefillMinRun, w.run_start, w.rows_ctx, w.run_len);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) {
        std::snprintf(message, sizeof(message), CF_PF_WHERE "paged prefill (MMA) run scan failed: %s",
                      cudaGetErrorString(err));
        return message;
    }
    *rows_ctx_len = w.rows_ctx;
    return nullptr;
}

const char * paged_prefill_mma_launch(const PagedAttentionCudaArgs & a, void * workspace, cudaStream_t stream) {
    static thread_local char message[256];
    const Workspace w = carve(workspace, a.n_tokens);
    const cudaError_t err = a.head_dim == 64 ? launch_mma<64>(a, w.run_start, stream)
                                             : launch_mma<128>(a, w.run_start, stream);
    if (err != cudaSuccess) {
        std::snprintf(message, sizeof(message), CF_PF_WHERE "paged prefill (MMA) launch failed: %s",
                      cudaGetErrorString(err));
        return message;
    }
    return nullptr;
}

}  // namespace cuda
}  // namespace cf
