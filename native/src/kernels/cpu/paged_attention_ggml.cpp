// paged_attention_ggml.cpp - paged attention with the numerics of ggml's CPU flash attention.
//
// ggml_compute_forward_flash_attn_ext (ggml/src/ggml-cpu/ops.cpp of the pinned llama.cpp), which stock
// KV mode runs on the CPU, takes one of two paths per attention call, chosen by the number of query
// rows of a KV stream in the ubatch (neq1):
//
//   neq1 >= GGML_FA_TILE_Q (64), "tiled": q stays f32; keys in tiles of GGML_FA_TILE_KV (64) cells,
//     per tile s = scale * q.k (an f32 FMA chain over d), masked entries -inf, running max updated
//     once per tile, p = ggml_vec_soft_max_f32(row of 64), acc += p.V (an f32 FMA chain over the 64
//     keys); out = acc / sum.
//   otherwise, "one chunk": q rounded to the K row's vec_dot type (f16 for an f16 cache), per key
//     s = vec_dot(k, q) * scale and an online softmax updated key by key, with the V accumulator
//     kept in f16 for an f16 cache (ggml_vec_mad_f16 / ggml_vec_scale_f16); out = acc / sum.
//
// This file replays those operations in the same order over a sequence's blocks, calling ggml's own
// vector routines, so that paged mode produces the bits stock mode produces when each sequence's
// positions sit in cells 0, 1, 2, ... of its stream (stock split mode, or aligned sequences in a
// unified cache) and the tiled path is taken for a sequence with at least 64 tokens in the ubatch.
// Not reproduced: the split-KV path ggml takes for a single decode row over 512 or more cells (it
// splits the keys per thread), ALiBi and attention sinks (paged mode rejects those models).
//
// Work items are (run of consecutive tokens of one sequence, kv head), as in the invariant kernel
// (paged_attention_cpu.cpp): each K/V tile is converted once for all query heads of its GQA group
// and, on the tiled path, for up to 64 tokens.
#include "paged_attention_cpu.h"
#include "paged_attention_simd.h"

// ggml-cpu's internal headers (the pinned tree's ggml/src/ggml-cpu): its vector routines (vec.h) and
// flash attention tile sizes (common.h). This file is compiled into the CPU backend (patches/0004),
// with its include directories and options.
#include "common.h"
#include "vec.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace cf {

namespace {

constexpr int32_t kQTile = 64;   // GGML_FA_TILE_Q: query rows from which ggml takes the tiled path
constexpr int32_t kKvTile = 64;  // GGML_FA_TILE_KV: keys per softmax tile of the tiled path
static_assert(kQTile == GGML_FA_TILE_Q && kKvTile == GGML_FA_TILE_KV, "ggml's flash attention tiles changed");

// Consecutive tokens of one sequence per work item: a tiled-path item shares each K/V tile's f32
// conversion among its tokens (ggml's Q tile, 64 rows, does the same); one-chunk items are
// per-token work grouped only to spread it over threads.
constexpr int32_t kTiledItemTokens = kQTile;
constexpr int32_t kOneChunkItemTokens = 8;

// Pool row of position p of the sequence whose block table is `table`.
inline int64_t pool_row(const int32_t * table, int32_t p, int32_t bs, int64_t n_pool_blocks) {
    const int32_t block_id = table[p / bs];
    if (block_id < 0 || block_id >= n_pool_blocks) {
        GGML_ABORT("paged attention: position %d reads block %d outside the pool of %lld blocks", p, block_id,
                   (long long) n_pool_blocks);
    }
    return (int64_t) block_id * bs + p % bs;
}

const float * q_row(const PagedAttentionArgs & a, int32_t t, int32_t head) {
    return (const float *) (a.q + (size_t) t * a.q_stride_token_bytes + (size_t) head * a.q_stride_head_bytes);
}

float * out_row(const PagedAttentionArgs & a, int32_t t, int32_t head) {
    return a.out + ((int64_t) t * a.n_head + head) * a.head_dim_v;
}

// ggml's scale and softcap order: with a softcap c, s = c * tanh(s * (scale / c)).
struct ScoreScale {
    float scale;
    float softcap;
    explicit ScoreScale(const PagedAttentionArgs & a) : scale(a.scale), softcap(a.softcap) {
        if (softcap != 0.0f) {
            scale /= softcap;
        }
    }
};

// The f16 accumulator updates of ggml's one-chunk path, y = f16(f32(y) * v) and
// y = f16(fma(f32(x), v, f32(y))) with round-to-nearest-even, in F16C/AVX-512 vectors. ggml's own
// ggml_vec_scale_f16 / ggml_vec_mad_f16 compute the same values, but fall back to a scalar loop with
// software conversions when the row is shorter than their unrolled step (128 halves with AVX512-FP16,
// longer than a 64-wide head), which makes them the bulk of the path's time; and on rows of whole
// steps they may compute in native f16 instead (AVX512-FP16), which rounds differently.
// fast_f16_matches_ggml(n) checks the equality for rows of n halves once at run time; where it fails,
// ggml's routines are used.
#if defined(__AVX512F__) || (defined(__F16C__) && defined(__FMA__))
constexpr bool kHaveFastF16 = true;

void fast_scale_f16(int32_t n, ggml_fp16_t * y, float v) {
    int32_t i = 0;
#if defined(__AVX512F__)
    const __m512 vv = _mm512_set1_ps(v);
    for (; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (y + i))), vv);
        _mm256_storeu_si256((__m256i *) (y + i), _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#else
    const __m256 vv = _mm256_set1_ps(v);
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (y + i))), vv);
        _mm_storeu_si128((__m128i *) (y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    if (i < n) {
        ggml_vec_scale_f16(n - i, y + i, v);
    }
}

void fast_mad_f16(int32_t n, ggml_fp16_t * y, const ggml_fp16_t * x, float v) {
    int32_t i = 0;
#if defined(__AVX512F__)
    const __m512 vv = _mm512_set1_ps(v);
    for (; i + 16 <= n; i += 16) {
        const __m512 xs = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (x + i)));
        const __m512 ys = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (y + i)));
        const __m512 r = _mm512_fmadd_ps(xs, vv, ys);
        _mm256_storeu_si256((__m256i *) (y + i), _mm512_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#else
    const __m256 vv = _mm256_set1_ps(v);
    for (; i + 8 <= n; i += 8) {
        const __m256 xs = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (x + i)));
        const __m256 ys = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (y + i)));
        const __m256 r = _mm256_fmadd_ps(xs, vv, ys);
        _mm_storeu_si128((__m128i *) (y + i), _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    if (i < n) {
        ggml_vec_mad_f16(n - i, y + i, x + i, v);
    }
}
#else
constexpr bool kHaveFastF16 = false;
void fast_scale_f16(int32_t n, ggml_fp16_t * y, float v) { ggml_vec_scale_f16(n, y, v); }
void fast_mad_f16(int32_t n, ggml_fp16_t * y, const ggml_fp16_t * x, float v) { ggml_vec_mad_f16(n, y, x, v); }
#endif

// Whether fast_scale_f16 / fast_mad_f16 give ggml's bits on rows of n halves: random rows, weights
// and long accumulations like the kernel's. Computed once per n (n <= 1024, else false).
bool compute_fast_f16_matches_ggml(int32_t n) {
    if (!kHaveFastF16) {
        return false;
    }
    uint32_t state = 12345u;
    auto next = [&state] {  // xorshift32 in [-1, 1)
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        return (float) (state >> 8) / (float) (1u << 23) - 1.0f;
    };
    std::vector<ggml_fp16_t> a((size_t) n), b((size_t) n), x((size_t) n);
    for (int32_t i = 0; i < n; ++i) {
        a[(size_t) i] = b[(size_t) i] = ggml_fp32_to_fp16(next());
    }
    for (int32_t step = 0; step < 400; ++step) {
        for (int32_t i = 0; i < n; ++i) {
            x[(size_t) i] = ggml_fp32_to_fp16(4.0f * next());
        }
        const float v = step % 7 == 0 ? 0.5f + 0.5f * next() : 0.5f + 0.5f * next() * next();
        if (step % 7 == 0) {
            ggml_vec_scale_f16(n, a.data(), v);
            fast_scale_f16(n, b.data(), v);
        } else {
            ggml_vec_mad_f16(n, a.data(), x.data(), v);
            fast_mad_f16(n, b.data(), x.data(), v);
        }
        if (std::memcmp(a.data(), b.data(), (size_t) n * sizeof(ggml_fp16_t)) != 0) {
            return false;
        }
    }
    return true;
}

bool fast_f16_matches_ggml(int32_t n) {
    constexpr int32_t kMaxN = 1024;
    static std::atomic<int8_t> known[kMaxN + 1];  // 0 unknown, 1 yes, -1 no (racing threads agree)
    if (n <= 0 || n > kMaxN) {
        return false;
    }
    int8_t k = known[n].load(std::memory_order_relaxed);
    if (k == 0) {
        k = compute_fast_f16_matches_ggml(n) ? 1 : -1;
        known[n].store(k, std::memory_order_relaxed);
    }
    return k > 0;
}

std::vector<char> & thread_scratch() {
    thread_local std::vector<char> scratch;
    return scratch;
}

// The "one chunk" path for tokens [t0, t0 + nt) and kv head h: per (token, query head), keys in
// position order, exactly ggml_compute_forward_flash_attn_ext_f16_one_chunk's updates. The G query
// heads of the group walk the keys together (each K/V row is read once per token), each with its
// own running state, so every head sees the same sequence of operations as in ggml.
void attend_one_chunk(const PagedAttentionArgs & a, int32_t t0, int32_t nt, int32_t h) {
    const int32_t G = a.n_head / a.n_head_kv;
    const int32_t bs = a.block_size;
    const int32_t dk = a.head_dim_k;
    const int32_t dv = a.head_dim_v;
    const ScoreScale sc(a);
    const bool v_f16 = a.v_type == GGML_TYPE_F16;
    const bool fast = v_f16 && fast_f16_matches_ggml(dv);

    const ggml_type k_vec_dot_type = ggml_get_type_traits_cpu(a.k_type)->vec_dot_type;
    const ggml_from_float_t q_to_vec_dot = ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    const ggml_vec_dot_t kq_vec_dot = ggml_get_type_traits_cpu(a.k_type)->vec_dot;
    const size_t q_bytes = ggml_row_size(k_vec_dot_type, dk);

    // per head g: q as the vec_dot type, the f32 accumulator (f32 V, and the output), the f16 one
    std::vector<char> & scratch = thread_scratch();
    const size_t q_stride = (q_bytes + 63) / 64 * 64;
    const size_t need = (size_t) G * (q_stride + (size_t) dv * (sizeof(float) + sizeof(ggml_fp16_t))) + 2 * G * sizeof(float);
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    char * q_q = scratch.data();                                       // [G][q_stride] bytes
    float * vkq32 = (float *) (q_q + (size_t) G * q_stride);          // [G][dv]
    ggml_fp16_t * vkq16 = (ggml_fp16_t *) (vkq32 + (size_t) G * dv);   // [G][dv]
    float * S = (float *) (vkq16 + (size_t) G * dv);                   // [G]
    float * M = S + G;                                                 // [G]

    const size_t k_off = (size_t) h * dk * ggml_type_size(a.k_type);
    const size_t v_off = (size_t) h * dv * ggml_type_size(a.v_type);
    const int64_t n_pool_blocks = a.kv_size / bs;
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t0] * a.block_table_stride;

    for (int32_t i = 0; i < nt; ++i) {
        const int32_t t = t0 + i;
        const int32_t ctx = a.token_ctx_len[t];
        for (int32_t g = 0; g < G; ++g) {
            q_to_vec_dot(q_row(a, t, h * G + g), q_q + (size_t) g * q_stride, dk);
            S[g] = 0.0f;
            M[g] = -INFINITY;
        }
        if (v_f16) {
            std::memset(vkq16, 0, (size_t) G * dv * sizeof(ggml_fp16_t));
        } else {
            std::memset(vkq32, 0, (size_t) G * dv * sizeof(float));
        }
        for (int32_t p0 = 0; p0 < ctx; p0 += bs) {
            const int64_t row0 = pool_row(table, p0, bs, n_pool_blocks);
            const int32_t n = std::min(bs, ctx - p0);
            for (int32_t j = 0; j < n; ++j) {
                const char * k_data = a.k_pool + (row0 + j) * a.k_stride_row_bytes + k_off;
                const char * v_data = a.v_pool + (row0 + j) * a.v_stride_row_bytes + v_off;
                for (int32_t g = 0; g < G; ++g) {
                    float s;
                    kq_vec_dot(dk, &s, 0, k_data, 0, q_q + (size_t) g * q_stride, 0, 1);
                    s = s * sc.scale;
                    if (sc.softcap != 0.0f) {
                        s = sc.softcap * tanhf(s);
                    }
                    s += 0.0f;  // ggml adds the mask value, 0 for a visible key (turns -0 into +0)

                    const float M_old = M[g];
                    float ms = 1.0f;
                    float vs = 1.0f;
                    if (v_f16) {
                        ggml_fp16_t * acc = vkq16 + (size_t) g * dv;
                        if (s > M[g]) {
                            M[g] = s;
                            ms = expf(M_old - s);
                            if (fast) {
                                fast_scale_f16(dv, acc, ms);
                            } else {
                                ggml_vec_scale_f16(dv, acc, ms);
                            }
                        } else {
                            vs = expf(s - M[g]);
                        }
                        if (fast) {
                            fast_mad_f16(dv, acc, (const ggml_fp16_t *) v_data, vs);
                        } else {
                            ggml_vec_mad_f16(dv, acc, (const ggml_fp16_t *) v_data, vs);
                        }
                    } else {
                        float * acc = vkq32 + (size_t) g * dv;
                        if (s > M[g]) {
                            M[g] = s;
                            ms = expf(M_old - s);
                            ggml_vec_scale_f32(dv, acc, ms);
                        } else {
                            vs = expf(s - M[g]);
                        }
                        ggml_vec_mad_f32(dv, acc, (const float *) v_data, vs);
                    }
                    S[g] = S[g]*ms + vs;
                }
            }
        }
        for (int32_t g = 0; g < G; ++g) {
            float * out = vkq32 + (size_t) g * dv;
            if (v_f16) {
                for (int32_t d = 0; d < dv; ++d) {
                    out[d] = GGML_CPU_FP16_TO_FP32(vkq16[(size_t) g * dv + d]);
                }
            }
            const float S_inv = S[g] == 0.0f ? 0.0f : 1.0f/S[g];
            ggml_vec_scale_f32(dv, out, S_inv);
            std::memcpy(out_row(a, t, h * G + g), out, (size_t) dv * sizeof(float));
        }
    }
}

// The tiled path for tokens [t0, t0 + nt) and kv head h: key tiles of 64 positions from position 0,
// exactly ggml_compute_forward_flash_attn_ext_tiled's updates for each query row. Entries past a
// token's context are -inf (ggml's causal mask and tile padding); their weights are 0, so the P.V
// chain may stop at the last visible key.
void attend_tiled(const PagedAttentionArgs & a, int32_t t0, int32_t nt, int32_t h) {
    const int32_t G = a.n_head / a.n_head_kv;
    const int32_t dk = a.head_dim_k;
    const int32_t dv = a.head_dim_v;
    const int32_t R = nt * G;  // (token, head) rows, r = i * G + g
    const ScoreScale sc(a);

    std::vector<char> & scratch = thread_scratch();
    const size_t n_floats = (size_t) dk * kKvTile + (size_t) kKvTile * dv + kKvTile + (size_t) R * dv + 2 * (size_t) R;
    if (scratch.size() < n_floats * sizeof(float)) {
        scratch.resize(n_floats * sizeof(float));
    }
    float * kT = (float *) scratch.data();           // [dk][kKvTile] K tile transposed, f32
    float * v32 = kT + (size_t) dk * kKvTile;         // [kKvTile][dv]
    float * kq = v32 + (size_t) kKvTile * dv;         // [kKvTile] scores, then weights, of one row
    float * acc = kq + kKvTile;                       // [R][dv]
    float * M = acc + (size_t) R * dv;                // [R]
    float * S = M + R;                                // [R]
    const float * v_rows[kKvTile];                    // the tile's V rows, for add_weighted_rows
    for (int32_t j = 0; j < kKvTile; ++j) {
        v_rows[j] = v32 + (size_t) j * dv;
    }
    std::fill(acc, acc + (size_t) R * dv, 0.0f);
    std::fill(M, M + R, -INFINITY);
    std::fill(S, S + R, 0.0f);

    const size_t k_elt = ggml_type_size(a.k_type);
    const size_t v_elt = ggml_type_size(a.v_type);
    const int64_t n_pool_blocks = a.kv_size / a.block_size;
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t0] * a.block_table_stride;
    int32_t max_ctx = 0;
    for (int32_t i = 0; i < nt; ++i) {
        max_ctx = std::max(max_ctx, a.token_ctx_len[t0 + i]);
    }

    for (int32_t c0 = 0; c0 < max_ctx; c0 += kKvTile) {
        const int32_t n = std::min(kKvTile, max_ctx - c0);
        for (int32_t j = 0; j < n; ++j) {
            const int64_t row = pool_row(table, c0 + j, a.block_size, n_pool_blocks);
            const char * k_data = a.k_pool + row * a.k_stride_row_bytes + (size_t) h * dk * k_elt;
            const char * v_data = a.v_pool + row * a.v_stride_row_bytes + (size_t) h * dv * v_elt;
            if (a.k_type == GGML_TYPE_F16) {
                const ggml_fp16_t * k16 = (const ggml_fp16_t *) k_data;
                for (int32_t d = 0; d < dk; ++d) {
                    kT[(size_t) d * kKvTile + j] = GGML_CPU_FP16_TO_FP32(k16[d]);
                }
                ggml_cpu_fp16_to_fp32((const ggml_fp16_t *) v_data, v32 + (size_t) j * dv, dv);
            } else {
                const float * k32 = (const float *) k_data;
                for (int32_t d = 0; d < dk; ++d) {
                    kT[(size_t) d * kKvTile + j] = k32[d];
                }
                std::memcpy(v32 + (size_t) j * dv, v_data, (size_t) dv * sizeof(float));
            }
        }
        for (int32_t d = 0; d < dk; ++d) {
            std::fill(kT + (size_t) d * kKvTile + n, kT + (size_t) (d + 1) * kKvTile, 0.0f);
        }

        for (int32_t i = 0; i < nt; ++i) {
            const int32_t ni = std::min(n, a.token_ctx_len[t0 + i] - c0);  // visible keys of the tile
            if (ni <= 0) {
                continue;  // ggml: the row's tile is all -inf, skipped
            }
            for (int32_t g = 0; g < G; ++g) {
                const int32_t r = i * G + g;
                const float * q = q_row(a, t0 + i, h * G + g);
                // s[j] = sum_d q[d] * k[d][j] as one FMA chain in d order (simd_gemm's C += A.B)
                block_scores(q, kT, dk, kKvTile, kq);
                ggml_vec_scale_f32(kKvTile, kq, sc.scale);
                if (sc.softcap != 0.0f) {
                    ggml_vec_tanh_f32(kKvTile, kq, kq);
                    ggml_vec_scale_f32(kKvTile, kq, sc.softcap);
                }
                for (int32_t j = ni; j < kKvTile; ++j) {
                    kq[j] = -INFINITY;
                }
                float tile_max;
                ggml_vec_max_f32(kKvTile, &tile_max, kq);
                const float M_old = M[r];
                const float M_new = fmaxf(M_old, tile_max);
                if (M_new > M_old) {
                    const float ms = expf(M_old - M_new);
                    ggml_vec_scale_f32(dv, acc + (size_t) r * dv, ms);
                    S[r] *= ms;
                }
                M[r] = M_new;
                S[r] += ggml_vec_soft_max_f32(kKvTile, kq, kq, M_new);

                // acc[d] += sum_j p[j] * v[j][d], one FMA chain in j order (zero weights past ni)
                add_weighted_rows(acc + (size_t) r * dv, kq, v_rows, ni, dv);
            }
        }
    }

    for (int32_t i = 0; i < nt; ++i) {
        for (int32_t g = 0; g < G; ++g) {
            const int32_t r = i * G + g;
            float * acc_r = acc + (size_t) r * dv;
            const float S_inv = S[r] == 0.0f ? 0.0f : 1.0f/S[r];
            ggml_vec_scale_f32(dv, acc_r, S_inv);
            std::memcpy(out_row(a, t0 + i, h * G + g), acc_r, (size_t) dv * sizeof(float));
        }
    }
}

}  // namespace

void paged_attention_cpu_ggml(const PagedAttentionArgs & args, int ith, int nth) {
    // Sequences' tokens are consecutive in the batch; a run of 64 or more tokens of one sequence takes
    // the tiled path (ggml's choice for a stream with that many query rows), shorter runs one chunk.
    int64_t item = 0;
    for (int32_t run0 = 0; run0 < args.n_tokens;) {
        int32_t run = 1;
        while (run0 + run < args.n_tokens && args.token_seq_idx[run0 + run] == args.token_seq_idx[run0]) {
            ++run;
        }
        const bool tiled = run >= kQTile;
        const int32_t item_tokens = tiled ? kTiledItemTokens : kOneChunkItemTokens;
        for (int32_t t0 = run0; t0 < run0 + run; t0 += item_tokens) {
            const int32_t nt = std::min(item_tokens, run0 + run - t0);
            for (int32_t h = 0; h < args.n_head_kv; ++h, ++item) {
                if (item % nth != ith) {
                    continue;
                }
                if (tiled) {
                    attend_tiled(args, t0, nt, h);
                } else {
                    attend_one_chunk(args, t0, nt, h);
                }
            }
        }
        run0 += run;
    }
}

}  // namespace cf
