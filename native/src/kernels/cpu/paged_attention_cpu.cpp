// paged_attention_cpu.cpp - see paged_attention_cpu.h.
//
// Per (tile of consecutive tokens of one sequence, kv head h) item, for each token t of the tile,
// with G = n_head / n_head_kv query heads sharing h:
//
//   for each block b of t's sequence covering positions [b*bs, min((b+1)*bs, ctx_len)):
//     s[g][j] = scale * q_g . K[row_j]           K row converted to f32 once per tile, used by all
//                                               G heads of all its tokens
//     m_g' = max(m_g, max_j s[g][j]); acc_g, l_g *= exp(m_g - m_g')   (online softmax, once per block)
//     p[g][j] = exp(s[g][j] - m_g'); l_g += sum_j p[g][j]
//     acc_g += sum_j p[g][j] * V[row_j]         V row likewise
//   out_g = acc_g / l_g
//
// Scores of a block come from its K rows transposed ([head_dim][block], one lane per row: no
// horizontal sums) and its softmax weights from a vector e^x (Taylor series after range
// reduction, about 1e-7 relative). The vector helpers use AVX-512 or AVX2+F16C+FMA when the build
// enables them (CMake compiles this file for the build machine, like ggml's CPU backend), else
// portable scalar code.
#include "paged_attention_cpu.h"
#include "paged_attention_simd.h"  // also <immintrin.h> where the vector paths are built

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace cf {

namespace {

// e^x for x <= 0, lane-wise: x = k ln2 + y with k integer and |y| <= ln2 / 2, e^y by its Taylor
// series to y^7 (truncation below 6e-9 relative), 2^k through the exponent bits; x < -87 gives
// about 1.6e-38 instead of a denormal (the softmax weight is negligible either way).
#if defined(__AVX512F__)
inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504089f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 y = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145752f), x);  // ln2 split in two floats
    y = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.42860677e-6f), y);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, y, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}
#elif defined(__AVX2__) && defined(__FMA__)
inline __m256 exp_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504089f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 y = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);
    y = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), y);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, y, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

// s[j] = e^(s[j] - m) for j < n and 0 for j in [n, width) (width a multiple of kLanes, m >= every
// s[j], j < n); returns the sum over j < n.
inline float exp_shifted_sum(float * s, float m, int32_t n, int32_t width) {
    float sum = 0.0f;
    int32_t j0 = 0;
#if defined(__AVX512F__)
    __m512 total = _mm512_setzero_ps();
    for (; j0 < n; j0 += kLanes) {
        const __mmask16 live = n - j0 >= kLanes ? (__mmask16) 0xFFFF : (__mmask16) ((1u << (n - j0)) - 1);
        const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + j0), _mm512_set1_ps(m));
        const __m512 p = _mm512_maskz_mov_ps(live, exp_nonpositive(x));
        _mm512_storeu_ps(s + j0, p);
        total = _mm512_add_ps(total, p);
    }
    sum = _mm512_reduce_add_ps(total);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 total = _mm256_setzero_ps();
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (; j0 < n; j0 += kLanes) {
        const __m256 live = _mm256_cmp_ps(lane, _mm256_set1_ps((float) (n - j0)), _CMP_LT_OQ);
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(s + j0), _mm256_set1_ps(m));
        const __m256 p = _mm256_and_ps(live, exp_nonpositive(x));
        _mm256_storeu_ps(s + j0, p);
        total = _mm256_add_ps(total, p);
    }
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    sum = _mm_cvtss_f32(r);
#else
    for (; j0 < n; ++j0) {
        s[j0] = std::exp(s[j0] - m);
        sum += s[j0];
    }
#endif
    for (int32_t j = std::max(j0, n); j < width; ++j) {
        s[j] = 0.0f;
    }
    return sum;
}

// A K/V row slice as f32: f32 rows are used in place, f16 rows are converted into buf[n].
inline const float * row_f32(const char * src, ggml_type type, int32_t n, float * buf) {
    if (type == GGML_TYPE_F32) {
        return (const float *) src;
    }
    const ggml_fp16_t * h = (const ggml_fp16_t *) src;
    int32_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(buf + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (h + i))));
    }
#elif defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(buf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i))));
    }
#endif
    for (; i < n; ++i) {
        buf[i] = ggml_fp16_to_fp32(h[i]);
    }
    return buf;
}

// Per-thread scratch, grown on demand; ggml's worker threads live as long as the threadpool.
std::vector<float> & thread_scratch() {
    thread_local std::vector<float> scratch;
    return scratch;
}

// Query tokens processed together: consecutive tokens of one sequence (a prefill chunk) share
// each K/V block, so its rows are converted to f32 once per tile instead of once per token.
constexpr int32_t kTileTokens = 8;

// Attention of the G query heads of kv head h for tokens [t0, t0 + nt) of one sequence (see the
// file comment); per (token, head) the operations and their order are those of a single token.
void attend_tile(const PagedAttentionArgs & a, int32_t t0, int32_t nt, int32_t h) {
    const int32_t G = a.n_head / a.n_head_kv;
    const int32_t bs = a.block_size;
    const int32_t dk = a.head_dim_k;
    const int32_t dv = a.head_dim_v;
    const int32_t R = nt * G;  // (token, head) rows of the tile, row r = i * G + g

    const int32_t W = (bs + kLanes - 1) / kLanes * kLanes;  // block width padded to whole vectors

    std::vector<float> & scratch = thread_scratch();
    const size_t need =
        (size_t) R * W + (size_t) bs * (dk + dv) + (size_t) dk * W + (size_t) R * dv + 2 * (size_t) R;
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    float * s = scratch.data();                 // [R][W] scores, then probabilities, of the block
    float * kblk = s + (size_t) R * W;          // [bs][dk] K rows of the block as f32
    float * vblk = kblk + (size_t) bs * dk;     // [bs][dv]
    float * kT = vblk + (size_t) bs * dv;       // [dk][W] K block transposed, padding columns zero
    float * acc = kT + (size_t) dk * W;         // [R][dv]
    float * m = acc + (size_t) R * dv;          // [R] running max
    float * l = m + R;                          // [R] running sum of exp(s - m)

    std::fill(acc, acc + (size_t) R * dv, 0.0f);
    std::fill(m, m + R, -std::numeric_limits<float>::infinity());
    std::fill(l, l + R, 0.0f);
    thread_local std::vector<const float *> k_rows;  // [bs] the block's rows as f32 (f32 pools in place)
    thread_local std::vector<const float *> v_rows;
    k_rows.resize((size_t) bs);
    v_rows.resize((size_t) bs);

    const size_t k_elt = ggml_type_size(a.k_type);
    const size_t v_elt = ggml_type_size(a.v_type);
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t0] * a.block_table_stride;
    const int64_t n_pool_blocks = a.kv_size / bs;
    int32_t max_ctx = 0;
    for (int32_t i = 0; i < nt; ++i) {
        max_ctx = std::max(max_ctx, a.token_ctx_len[t0 + i]);
    }

    for (int32_t b = 0, p0 = 0; p0 < max_ctx; ++b, p0 += bs) {
        const int32_t n = std::min(bs, max_ctx - p0);
        const int32_t block_id = table[b];
        if (block_id < 0 || block_id >= n_pool_blocks) {
            GGML_ABORT("paged attention: token %d reads block %d outside the pool of %lld blocks", t0, block_id,
                       (long long) n_pool_blocks);
        }
        const int64_t row0 = (int64_t) block_id * bs;
        for (int32_t j = 0; j < n; ++j) {
            const char * k_src = a.k_pool + (row0 + j) * a.k_stride_row_bytes + (size_t) h * dk * k_elt;
            k_rows[(size_t) j] = row_f32(k_src, a.k_type, dk, kblk + (size_t) j * dk);
        }
        for (int32_t d = 0; d < dk; ++d) {
            float * col = kT + (size_t) d * W;
            for (int32_t j = 0; j < n; ++j) {
                col[j] = k_rows[(size_t) j][d];
            }
            std::fill(col + n, col + W, 0.0f);
        }
        for (int32_t i = 0; i < nt; ++i) {
            const int32_t ni = std::min(n, a.token_ctx_len[t0 + i] - p0);  // <= 0: block past its context
            const char * q_tok = a.q + (size_t) (t0 + i) * a.q_stride_token_bytes + (size_t) h * G * a.q_stride_head_bytes;
            for (int32_t g = 0; g < G && ni > 0; ++g) {
                const int32_t r = i * G + g;
                float * sr = s + (size_t) r * W;
                const float * qg = (const float *) (q_tok + (size_t) g * a.q_stride_head_bytes);
                block_scores(qg, kT, dk, W, sr);
                for (int32_t j = 0; j < ni; ++j) {
                    float x = a.scale * sr[j];
                    if (a.softcap != 0.0f) {
                        x = a.softcap * std::tanh(x / a.softcap);
                    }
                    sr[j] = x;
                }
                const float m_block = *std::max_element(sr, sr + ni);
                if (m_block > m[r]) {
                    const float c = std::exp(m[r] - m_block);  // 0 on the first block (m = -inf)
                    l[r] *= c;
                    scale_f32(acc + (size_t) r * dv, c, dv);
                    m[r] = m_block;
                }
                l[r] += exp_shifted_sum(sr, m[r], ni, W);
            }
        }
        for (int32_t j = 0; j < n; ++j) {
            const char * v_src = a.v_pool + (row0 + j) * a.v_stride_row_bytes + (size_t) h * dv * v_elt;
            v_rows[(size_t) j] = row_f32(v_src, a.v_type, dv, vblk + (size_t) j * dv);
        }
        for (int32_t i = 0; i < nt; ++i) {
            const int32_t ni = std::min(n, a.token_ctx_len[t0 + i] - p0);
            for (int32_t g = 0; g < G && ni > 0; ++g) {
                const int32_t r = i * G + g;
                add_weighted_rows(acc + (size_t) r * dv, s + (size_t) r * W, v_rows.data(), ni, dv);
            }
        }
    }

    for (int32_t i = 0; i < nt; ++i) {
        for (int32_t g = 0; g < G; ++g) {
            const int32_t r = i * G + g;
            float * out = a.out + ((int64_t) (t0 + i) * a.n_head + (int64_t) h * G + g) * dv;
            const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
            for (int32_t d = 0; d < dv; ++d) {
                out[d] = acc[(size_t) r * dv + d] * inv;
            }
        }
    }
}

}  // namespace

void paged_attention_cpu(const PagedAttentionArgs & args, int ith, int nth) {
    // Tiles: runs of up to kTileTokens consecutive tokens of one sequence (decode tokens are tiles
    // of one). Items (tile, kv head) are interleaved over the threads, so sequences of very
    // different lengths (ragged decode batches, a growing prefill chunk) balance across threads.
    int64_t item = 0;
    for (int32_t t0 = 0; t0 < args.n_tokens;) {
        int32_t nt = 1;
        while (nt < kTileTokens && t0 + nt < args.n_tokens &&
               args.token_seq_idx[t0 + nt] == args.token_seq_idx[t0]) {
            ++nt;
        }
        for (int32_t h = 0; h < args.n_head_kv; ++h, ++item) {
            if (item % nth == ith) {
                attend_tile(args, t0, nt, h);
            }
        }
        t0 += nt;
    }
}

}  // namespace cf
