// paged_attention_cpu.cpp - see paged_attention_cpu.h: the invariant kernel (the engine's default).
//
// Per work item (up to kQueryTile consecutive tokens of one sequence, kv head h), with G = n_head /
// n_head_kv query heads sharing h, rows r = (token i, head g), r = i * G + g:
//
//   for each key tile c of the sequence, positions [64c, 64c + 64) (aligned to absolute positions):
//     K tile -> kT [head_dim][64] f32, V tile -> f32 rows      converted once for all rows of the item
//     for each row whose context reaches into the tile (n_r = its visible keys of the tile, > 0):
//       s[j] = scale * (q_r . k_j), j < n_r                  FMA chain over d (paged_attention_tiles.h)
//       m' = max(m, max_j s[j]); if m' > m: acc, l *= e^(m - m')   (online softmax, once per tile)
//       p[j] = e^(s[j] - m'); l += sum_j p[j]                vector e^x, one lane per key
//       acc[d] += p[j] * v_j[d], j = 0 .. n_r - 1            one FMA per key, j order
//   out_r = acc / l
//
// Outputs that do not depend on the load: every step above is a function of the row's query, its
// sequence's keys and values and its context length alone. Tiles start at absolute positions (not at
// the chunk, the item or a block), a row never sees a key past its context (no masked entries: the
// score, max, exponent and P.V chains stop at n_r), and the register blocking of rows and key groups
// runs whole chains side by side without changing any. So a row's output is the same bits whatever
// the chunking of its prompt, the other sequences of the step, the item it falls in, the thread
// count, the block size or where its blocks sit (test_paged_attention checks it).
//
// Vector e^x: a Taylor series after range reduction (about 1e-7 relative). The vector paths use
// AVX-512 or AVX2+F16C+FMA when the build enables them (CMake compiles this file for the build
// machine, like ggml's CPU backend), else portable scalar code.
#include "paged_attention_cpu.h"
#include "paged_attention_tiles.h"  // also <immintrin.h> where the vector paths are built

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

// s[j] = e^(s[j] - m) for j < n and 0 for j in [n, width) (width a multiple of kVecLanes, m >= every
// s[j], j < n); returns the sum over j < n.
inline float exp_shifted_sum(float * s, float m, int32_t n, int32_t width) {
    float sum = 0.0f;
    int32_t j0 = 0;
#if defined(__AVX512F__)
    __m512 total = _mm512_setzero_ps();
    for (; j0 < n; j0 += kVecLanes) {
        const __mmask16 live = n - j0 >= kVecLanes ? (__mmask16) 0xFFFF : (__mmask16) ((1u << (n - j0)) - 1);
        const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + j0), _mm512_set1_ps(m));
        const __m512 p = _mm512_maskz_mov_ps(live, exp_nonpositive(x));
        _mm512_storeu_ps(s + j0, p);
        total = _mm512_add_ps(total, p);
    }
    sum = _mm512_reduce_add_ps(total);
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 total = _mm256_setzero_ps();
    const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    for (; j0 < n; j0 += kVecLanes) {
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

// dst[i] = f32(src[i]) for n f16 values; returns dst.
inline const float * row_f16_to_f32(const char * src, int32_t n, float * dst) {
    const ggml_fp16_t * h = (const ggml_fp16_t *) src;
    int32_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (h + i))));
    }
#elif defined(__AVX2__) && defined(__F16C__)
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) (h + i))));
    }
#endif
    for (; i < n; ++i) {
        dst[i] = ggml_fp16_to_fp32(h[i]);
    }
    return dst;
}

// Max of s[0, n) (n >= 1).
inline float row_max(const float * s, int32_t n) {
    int32_t j = 0;
    float m = -std::numeric_limits<float>::infinity();
#if defined(__AVX512F__)
    __m512 mv = _mm512_set1_ps(m);
    for (; j + 16 <= n; j += 16) {
        mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
    }
    m = _mm512_reduce_max_ps(mv);
#endif
    for (; j < n; ++j) {
        m = std::max(m, s[j]);
    }
    return m;
}

// Per-thread scratch, grown on demand; ggml's worker threads live as long as the threadpool.
std::vector<float> & thread_scratch() {
    thread_local std::vector<float> scratch;
    return scratch;
}

// Query tokens per work item: consecutive tokens of one sequence (a prefill chunk) share each key
// tile's f32 conversion. Grouping never changes a row's arithmetic, only the work per item.
constexpr int32_t kQueryTile = 64;

// One work item's rows (r = i * G + g for token t0 + i, query head h * G + g) and its key tile.
// Pointers go into the thread's scratch, which the item owns while it runs.
struct Item {
    std::vector<const float *> q;  // [R] query rows
    std::vector<float *> s;        // [R] score rows of the current tile, kTileKeys floats each
    std::vector<float *> acc;      // [R] P.V accumulators, head_dim_v floats each
    std::vector<int32_t> n_vis;    // [R] visible keys of the current tile (rows in `live`)
    std::vector<int32_t> live;     // rows whose context reaches into the current tile
    float * m = nullptr;           // [R] running max
    float * l = nullptr;           // [R] running sum of e^(s - m)
    float * kT = nullptr;          // [head_dim_k][kTileKeys] the tile's keys, f32, transposed
    float * v32 = nullptr;         // [kTileKeys][head_dim_v] its values as f32 (f16 pools)
    const float * v[kTileKeys];    // the tile's value rows as f32
};

// Sets up item's rows for tokens [t0, t0 + nt) and kv head h in the thread's scratch.
void init_item(const PagedAttentionArgs & a, int32_t t0, int32_t nt, int32_t h, Item & it) {
    const int32_t G = a.n_head / a.n_head_kv;
    const int32_t R = nt * G;
    const int32_t dv = a.head_dim_v;
    const bool v_f16 = a.v_type == GGML_TYPE_F16;
    std::vector<float> & scratch = thread_scratch();
    const size_t need = (size_t) a.head_dim_k * kTileKeys + (v_f16 ? (size_t) kTileKeys * dv : 0) +
                        (size_t) R * (kTileKeys + dv + 2);
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    it.kT = scratch.data();
    it.v32 = it.kT + (size_t) a.head_dim_k * kTileKeys;
    float * s = it.v32 + (v_f16 ? (size_t) kTileKeys * dv : 0);  // [R][kTileKeys]
    float * acc = s + (size_t) R * kTileKeys;                     // [R][dv]
    it.m = acc + (size_t) R * dv;
    it.l = it.m + R;
    std::fill(acc, acc + (size_t) R * dv, 0.0f);
    std::fill(it.m, it.m + R, -std::numeric_limits<float>::infinity());
    std::fill(it.l, it.l + R, 0.0f);
    it.q.resize((size_t) R);
    it.s.resize((size_t) R);
    it.acc.resize((size_t) R);
    it.n_vis.resize((size_t) R);
    for (int32_t r = 0; r < R; ++r) {
        const int32_t i = r / G;
        const int32_t g = r % G;
        it.q[(size_t) r] = (const float *) (a.q + (size_t) (t0 + i) * a.q_stride_token_bytes +
                                            (size_t) (h * G + g) * a.q_stride_head_bytes);
        it.s[(size_t) r] = s + (size_t) r * kTileKeys;
        it.acc[(size_t) r] = acc + (size_t) r * dv;
    }
}

// Converts the keys and values of positions [c0, c0 + n) of kv head h (block table `table`) into
// item's tile: keys transposed to f32 (it.kT), values as f32 rows (it.v).
void load_tile(const PagedAttentionArgs & a, const int32_t * table, int32_t h, int32_t c0, int32_t n, Item & it) {
    const char * k_rows[kTileKeys];
    const size_t k_off = (size_t) h * a.head_dim_k * ggml_type_size(a.k_type);
    const size_t v_off = (size_t) h * a.head_dim_v * ggml_type_size(a.v_type);
    const int32_t bs = a.block_size;
    const int64_t n_pool_blocks = a.kv_size / bs;
    for (int32_t j = 0; j < n; ++j) {
        const int32_t p = c0 + j;
        const int32_t block_id = table[p / bs];
        if (block_id < 0 || block_id >= n_pool_blocks) {
            GGML_ABORT("paged attention: position %d reads block %d outside the pool of %lld blocks", p, block_id,
                       (long long) n_pool_blocks);
        }
        const int64_t row = (int64_t) block_id * bs + p % bs;
        k_rows[j] = a.k_pool + row * a.k_stride_row_bytes + k_off;
        const char * v_src = a.v_pool + row * a.v_stride_row_bytes + v_off;
        it.v[j] = a.v_type == GGML_TYPE_F16 ? row_f16_to_f32(v_src, a.head_dim_v, it.v32 + (size_t) j * a.head_dim_v)
                                            : (const float *) v_src;
    }
    for (int32_t j0 = 0; j0 < n; j0 += kVecLanes) {
        transpose_key_group(k_rows + j0, std::min(kVecLanes, n - j0), a.k_type, a.head_dim_k, it.kT, j0);
    }
}

// Row r's online softmax step over its n visible scores of the tile: scale (and softcap), new max,
// rescale of the running sum and accumulator when the max grows, scores -> weights e^(s - m).
void softmax_tile(const PagedAttentionArgs & a, Item & it, int32_t r, int32_t n) {
    float * sr = it.s[(size_t) r];
    for (int32_t j = 0; j < n; ++j) {
        sr[j] *= a.scale;
    }
    if (a.softcap != 0.0f) {
        for (int32_t j = 0; j < n; ++j) {
            sr[j] = a.softcap * std::tanh(sr[j] / a.softcap);
        }
    }
    const float m_tile = row_max(sr, n);
    if (m_tile > it.m[r]) {
        if (it.l[r] > 0.0f) {  // earlier tiles: rescale (the first tile starts from zeros)
            const float c = std::exp(it.m[r] - m_tile);
            it.l[r] *= c;
            float * acc = it.acc[(size_t) r];
            for (int32_t d = 0; d < a.head_dim_v; ++d) {
                acc[d] *= c;
            }
        }
        it.m[r] = m_tile;
    }
    it.l[r] += exp_shifted_sum(sr, it.m[r], n, (n + kVecLanes - 1) / kVecLanes * kVecLanes);
}

// Scores, online softmax and P.V of the live rows against the loaded tile, rows in register blocks
// of kRowBlock (a block's rows may see different numbers of keys: P.V runs the keys all of them see
// together, then each row's rest alone, which is the same chain per row).
void attend_tile(const PagedAttentionArgs & a, Item & it) {
    const int32_t n_live = (int32_t) it.live.size();
    const float * qb[kRowBlock];
    const float * pb[kRowBlock];
    float * sb[kRowBlock];
    float * ab[kRowBlock];
    for (int32_t b0 = 0; b0 < n_live; b0 += kRowBlock) {
        const int32_t nb = std::min(kRowBlock, n_live - b0);
        int32_t n_max = 0;
        for (int32_t b = 0; b < nb; ++b) {
            const int32_t r = it.live[(size_t) (b0 + b)];
            qb[b] = it.q[(size_t) r];
            sb[b] = it.s[(size_t) r];
            n_max = std::max(n_max, it.n_vis[(size_t) r]);
        }
        tile_scores(qb, nb, it.kT, a.head_dim_k, (n_max + kVecLanes - 1) / kVecLanes, sb);
    }
    for (int32_t r : it.live) {
        softmax_tile(a, it, r, it.n_vis[(size_t) r]);
    }
    for (int32_t b0 = 0; b0 < n_live; b0 += kRowBlock) {
        const int32_t nb = std::min(kRowBlock, n_live - b0);
        int32_t n_min = kTileKeys;
        for (int32_t b = 0; b < nb; ++b) {
            const int32_t r = it.live[(size_t) (b0 + b)];
            pb[b] = it.s[(size_t) r];
            ab[b] = it.acc[(size_t) r];
            n_min = std::min(n_min, it.n_vis[(size_t) r]);
        }
        tile_pv(ab, pb, nb, it.v, 0, n_min, a.head_dim_v);
        for (int32_t b = 0; b < nb; ++b) {
            const int32_t n = it.n_vis[(size_t) it.live[(size_t) (b0 + b)]];
            if (n > n_min) {
                tile_pv(ab + b, pb + b, 1, it.v, n_min, n, a.head_dim_v);
            }
        }
    }
}

// Attention of the G query heads of kv head h for tokens [t0, t0 + nt) of one sequence (see the
// file comment).
void attend_item(const PagedAttentionArgs & a, int32_t t0, int32_t nt, int32_t h) {
    const int32_t G = a.n_head / a.n_head_kv;
    thread_local Item it;
    init_item(a, t0, nt, h, it);
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t0] * a.block_table_stride;
    int32_t max_ctx = 0;
    for (int32_t i = 0; i < nt; ++i) {
        max_ctx = std::max(max_ctx, a.token_ctx_len[t0 + i]);
    }
    for (int32_t c0 = 0; c0 < max_ctx; c0 += kTileKeys) {  // tiles at absolute positions
        const int32_t n = std::min(kTileKeys, max_ctx - c0);
        load_tile(a, table, h, c0, n, it);
        it.live.clear();
        for (int32_t i = 0; i < nt; ++i) {
            const int32_t n_i = std::min(n, a.token_ctx_len[t0 + i] - c0);  // <= 0: tile past its context
            for (int32_t g = 0; g < G && n_i > 0; ++g) {
                it.live.push_back(i * G + g);
                it.n_vis[(size_t) (i * G + g)] = n_i;
            }
        }
        attend_tile(a, it);
    }
    for (int32_t r = 0; r < nt * G; ++r) {
        float * out = a.out + ((int64_t) (t0 + r / G) * a.n_head + (int64_t) h * G + r % G) * a.head_dim_v;
        const float inv = it.l[r] > 0.0f ? 1.0f / it.l[r] : 0.0f;
        for (int32_t d = 0; d < a.head_dim_v; ++d) {
            out[d] = it.acc[(size_t) r][d] * inv;
        }
    }
}

// Calls f(t0, nt) for each run of up to `tile` consecutive tokens of one sequence.
template <typename F>
void for_each_query_tile(const PagedAttentionArgs & args, int32_t tile, F && f) {
    for (int32_t t0 = 0; t0 < args.n_tokens;) {
        int32_t nt = 1;
        while (nt < tile && t0 + nt < args.n_tokens && args.token_seq_idx[t0 + nt] == args.token_seq_idx[t0]) {
            ++nt;
        }
        f(t0, nt);
        t0 += nt;
    }
}

}  // namespace

void paged_attention_cpu(const PagedAttentionArgs & args, int ith, int nth) {
    // Items (query tile, kv head) are interleaved over the threads, so sequences of very different
    // lengths (ragged decode batches, a growing prefill chunk) balance across threads. A step with
    // few items at kQueryTile tokens (a lone prefill chunk) splits them into tiles of 16 tokens, so
    // that every thread has work; either way each row's arithmetic is the same.
    int64_t n_items = 0;
    for_each_query_tile(args, kQueryTile, [&](int32_t, int32_t) { n_items += args.n_head_kv; });
    const int32_t tile = n_items >= 4 * (int64_t) nth ? kQueryTile : 16;
    int64_t item = 0;
    for_each_query_tile(args, tile, [&](int32_t t0, int32_t nt) {
        for (int32_t h = 0; h < args.n_head_kv; ++h, ++item) {
            if (item % nth == ith) {
                attend_item(args, t0, nt, h);
            }
        }
    });
}

}  // namespace cf
