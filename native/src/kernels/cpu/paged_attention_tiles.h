// paged_attention_tiles.h - register-blocked building blocks of the invariant paged attention kernel
// (paged_attention_cpu.cpp): a key tile transposed to f32, the scores of a few query rows against it,
// and P.V for a few rows.
//
// Invariance rests on one rule here: every output element is one fixed chain of operations that does
// not depend on how many rows or key groups a call handles. A score s[r][j] is
// fma(q[dk-1], k_j[dk-1], ... fma(q[1], k_j[1], q[0] * k_j[0])) in d order, one lane per key; an
// accumulator element acc[r][d] += p[r][j] * v_j[d] is one FMA per key in j order. Blocking rows and
// keys into registers only decides how many such chains run side by side.
//
// Vector width: AVX-512 (16 lanes) or AVX2+FMA (8 lanes) where the build enables them, else scalar.
// Everything is in an anonymous namespace (each including file compiles its own copy with its own
// target flags).
#pragma once

#include "ggml.h"

#include <cstddef>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace cf {
namespace {

constexpr int32_t kTileKeys = 64;  // keys per tile, the column count of a transposed tile

// ---- one vector of kVecLanes floats --------------------------------------------------------------
#if defined(__AVX512F__)
using vec = __m512;
constexpr int32_t kVecLanes = 16;
constexpr int32_t kRowBlock = 4;  // rows per register block (16 score / 16 P.V accumulators)
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float * p) { return _mm512_loadu_ps(p); }
inline void vstore(float * p, vec v) { _mm512_storeu_ps(p, v); }
inline vec vset1(float x) { return _mm512_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
#elif defined(__AVX2__) && defined(__FMA__)
using vec = __m256;
constexpr int32_t kVecLanes = 8;
constexpr int32_t kRowBlock = 2;  // 16 ymm registers
inline vec vzero() { return _mm256_setzero_ps(); }
inline vec vload(const float * p) { return _mm256_loadu_ps(p); }
inline void vstore(float * p, vec v) { _mm256_storeu_ps(p, v); }
inline vec vset1(float x) { return _mm256_set1_ps(x); }
inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
#else
using vec = float;
constexpr int32_t kVecLanes = 1;
constexpr int32_t kRowBlock = 2;
inline vec vzero() { return 0.0f; }
inline vec vload(const float * p) { return *p; }
inline void vstore(float * p, vec v) { *p = v; }
inline vec vset1(float x) { return x; }
inline vec vfma(vec a, vec b, vec c) { return a * b + c; }
inline vec vmul(vec a, vec b) { return a * b; }
#endif

constexpr int32_t kGroupBlock = 4;  // key groups (vectors of kVecLanes keys) per register block
static_assert(kTileKeys % (kVecLanes * kGroupBlock) == 0 || kVecLanes == 1, "tile of whole key blocks");

// ---- K tile transposed: kT[d][j] = k_j[d] as f32 ----------------------------------------------------

#if defined(__AVX512F__)
// In-register transpose of 16 rows of 16 floats: r[i][j] -> r[j][i].
inline void transpose16(__m512 r[16]) {
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // u[i + p]: column 4L + p of rows i..i+3, in 128-bit lane L
        const __m512d a = _mm512_castps_pd(t[i]), b = _mm512_castps_pd(t[i + 1]);
        const __m512d c = _mm512_castps_pd(t[i + 2]), d = _mm512_castps_pd(t[i + 3]);
        u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int p = 0; p < 4; ++p) {
        const __m512 v0 = _mm512_shuffle_f32x4(u[p], u[4 + p], 0x44);
        const __m512 v1 = _mm512_shuffle_f32x4(u[p], u[4 + p], 0xEE);
        const __m512 v2 = _mm512_shuffle_f32x4(u[8 + p], u[12 + p], 0x44);
        const __m512 v3 = _mm512_shuffle_f32x4(u[8 + p], u[12 + p], 0xEE);
        r[p] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[4 + p] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
        r[8 + p] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[12 + p] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
}
inline __m512 load_row16(const char * row, ggml_type type, int32_t d) {
    if (type == GGML_TYPE_F16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) ((const ggml_fp16_t *) row + d)));
    }
    return _mm512_loadu_ps((const float *) row + d);
}
#elif defined(__AVX2__) && defined(__FMA__)
// In-register transpose of 8 rows of 8 floats.
inline void transpose8(__m256 r[8]) {
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        const __m256d a = _mm256_castps_pd(t[i]), b = _mm256_castps_pd(t[i + 1]);
        const __m256d c = _mm256_castps_pd(t[i + 2]), d = _mm256_castps_pd(t[i + 3]);
        u[i] = _mm256_castpd_ps(_mm256_unpacklo_pd(a, c));
        u[i + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(a, c));
        u[i + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(b, d));
        u[i + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(b, d));
    }
    for (int p = 0; p < 4; ++p) {
        r[p] = _mm256_permute2f128_ps(u[p], u[4 + p], 0x20);
        r[4 + p] = _mm256_permute2f128_ps(u[p], u[4 + p], 0x31);
    }
}
inline __m256 load_row8(const char * row, ggml_type type, int32_t d) {
#if defined(__F16C__)
    if (type == GGML_TYPE_F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *) ((const ggml_fp16_t *) row + d)));
    }
#else
    if (type == GGML_TYPE_F16) {
        float x[8];
        for (int i = 0; i < 8; ++i) {
            x[i] = ggml_fp16_to_fp32(((const ggml_fp16_t *) row)[d + i]);
        }
        return _mm256_loadu_ps(x);
    }
#endif
    return _mm256_loadu_ps((const float *) row + d);
}
#endif

inline float load_elt(const char * row, ggml_type type, int32_t d) {
    return type == GGML_TYPE_F16 ? ggml_fp16_to_fp32(((const ggml_fp16_t *) row)[d]) : ((const float *) row)[d];
}

// kT[d][j0 + j] = rows[j][d] for j < nj (nj <= kVecLanes), d < dk, and 0 for j in [nj, kVecLanes):
// one key group of a tile, converted to f32. kT has kTileKeys columns; rows are f16 or f32 (type).
inline void transpose_key_group(const char * const * rows, int32_t nj, ggml_type type, int32_t dk, float * kT,
                                int32_t j0) {
    int32_t d0 = 0;
#if defined(__AVX512F__)
    for (; d0 + 16 <= dk; d0 += 16) {
        __m512 r[16];
        for (int j = 0; j < 16; ++j) {
            r[j] = j < nj ? load_row16(rows[j], type, d0) : _mm512_setzero_ps();
        }
        transpose16(r);
        for (int i = 0; i < 16; ++i) {
            _mm512_storeu_ps(kT + (size_t) (d0 + i) * kTileKeys + j0, r[i]);
        }
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; d0 + 8 <= dk; d0 += 8) {
        __m256 r[8];
        for (int j = 0; j < 8; ++j) {
            r[j] = j < nj ? load_row8(rows[j], type, d0) : _mm256_setzero_ps();
        }
        transpose8(r);
        for (int i = 0; i < 8; ++i) {
            _mm256_storeu_ps(kT + (size_t) (d0 + i) * kTileKeys + j0, r[i]);
        }
    }
#endif
    for (; d0 < dk; ++d0) {
        float * col = kT + (size_t) d0 * kTileKeys + j0;
        for (int32_t j = 0; j < kVecLanes; ++j) {
            col[j] = j < nj ? load_elt(rows[j], type, d0) : 0.0f;
        }
    }
}

// ---- scores: s[b][j] = q_b . k_j for RB rows and NG key groups -------------------------------------

// s[b] + g * kVecLanes receives the scores of key group g0 + g; kT as above.
template <int RB, int NG>
inline void scores_block(const float * const * q, const float * kT, int32_t dk, int32_t g0, float * const * s) {
    vec acc[RB][NG];
    for (int b = 0; b < RB; ++b) {
        for (int g = 0; g < NG; ++g) {
            acc[b][g] = vzero();
        }
    }
    const float * col = kT + (size_t) g0 * kVecLanes;
    for (int32_t d = 0; d < dk; ++d, col += kTileKeys) {
        vec k[NG];
        for (int g = 0; g < NG; ++g) {
            k[g] = vload(col + g * kVecLanes);
        }
        for (int b = 0; b < RB; ++b) {
            const vec qb = vset1(q[b][d]);
            for (int g = 0; g < NG; ++g) {
                acc[b][g] = vfma(qb, k[g], acc[b][g]);
            }
        }
    }
    for (int b = 0; b < RB; ++b) {
        for (int g = 0; g < NG; ++g) {
            vstore(s[b] + (size_t) (g0 + g) * kVecLanes, acc[b][g]);
        }
    }
}

template <int RB>
inline void scores_rows(const float * const * q, const float * kT, int32_t dk, int32_t n_groups, float * const * s) {
    int32_t g0 = 0;
    for (; g0 + kGroupBlock <= n_groups; g0 += kGroupBlock) {
        scores_block<RB, kGroupBlock>(q, kT, dk, g0, s);
    }
    switch (n_groups - g0) {
        case 3: scores_block<RB, 3>(q, kT, dk, g0, s); break;
        case 2: scores_block<RB, 2>(q, kT, dk, g0, s); break;
        case 1: scores_block<RB, 1>(q, kT, dk, g0, s); break;
        default: break;
    }
}

// s[b][j] = q[b] . k_j for b < nb and the keys of groups [0, n_groups); s rows hold
// n_groups * kVecLanes floats.
inline void tile_scores(const float * const * q, int32_t nb, const float * kT, int32_t dk, int32_t n_groups,
                        float * const * s) {
    int32_t b0 = 0;
    for (; b0 + kRowBlock <= nb; b0 += kRowBlock) {
        scores_rows<kRowBlock>(q + b0, kT, dk, n_groups, s + b0);
    }
    switch (nb - b0) {
        case 3: scores_rows<3>(q + b0, kT, dk, n_groups, s + b0); break;
        case 2: scores_rows<2>(q + b0, kT, dk, n_groups, s + b0); break;
        case 1: scores_rows<1>(q + b0, kT, dk, n_groups, s + b0); break;
        default: break;
    }
}

// ---- P.V: acc[b][d] += sum_j p[b][j] * v_j[d] for j in [j0, j1), RB rows --------------------------

template <int RB, int ND>  // ND vectors of d per register block
inline void pv_block(float * const * acc, const float * const * p, const float * const * v, int32_t j0, int32_t j1,
                     int32_t d0) {
    vec a[RB][ND];
    for (int b = 0; b < RB; ++b) {
        for (int i = 0; i < ND; ++i) {
            a[b][i] = vload(acc[b] + d0 + i * kVecLanes);
        }
    }
    for (int32_t j = j0; j < j1; ++j) {
        vec x[ND];
        for (int i = 0; i < ND; ++i) {
            x[i] = vload(v[j] + d0 + i * kVecLanes);
        }
        for (int b = 0; b < RB; ++b) {
            const vec w = vset1(p[b][j]);
            for (int i = 0; i < ND; ++i) {
                a[b][i] = vfma(w, x[i], a[b][i]);
            }
        }
    }
    for (int b = 0; b < RB; ++b) {
        for (int i = 0; i < ND; ++i) {
            vstore(acc[b] + d0 + i * kVecLanes, a[b][i]);
        }
    }
}

template <int RB>
inline void pv_rows(float * const * acc, const float * const * p, const float * const * v, int32_t j0, int32_t j1,
                    int32_t dv) {
    constexpr int32_t kWide = 4 * kVecLanes;
    int32_t d0 = 0;
    for (; d0 + kWide <= dv; d0 += kWide) {
        pv_block<RB, 4>(acc, p, v, j0, j1, d0);
    }
    for (; d0 + kVecLanes <= dv; d0 += kVecLanes) {
        pv_block<RB, 1>(acc, p, v, j0, j1, d0);
    }
    for (; d0 < dv; ++d0) {  // scalar tail (dv not a multiple of the vector width)
        for (int b = 0; b < RB; ++b) {
            float x = acc[b][d0];
            for (int32_t j = j0; j < j1; ++j) {
                x = __builtin_fmaf(p[b][j], v[j][d0], x);
            }
            acc[b][d0] = x;
        }
    }
}

// acc[b][d] += sum_{j in [j0, j1)} p[b][j] * v[j][d] for b < nb, d < dv, each element one FMA per
// key in j order.
inline void tile_pv(float * const * acc, const float * const * p, int32_t nb, const float * const * v, int32_t j0,
                    int32_t j1, int32_t dv) {
    int32_t b0 = 0;
    for (; b0 + kRowBlock <= nb; b0 += kRowBlock) {
        pv_rows<kRowBlock>(acc + b0, p + b0, v, j0, j1, dv);
    }
    switch (nb - b0) {
        case 3: pv_rows<3>(acc + b0, p + b0, v, j0, j1, dv); break;
        case 2: pv_rows<2>(acc + b0, p + b0, v, j0, j1, dv); break;
        case 1: pv_rows<1>(acc + b0, p + b0, v, j0, j1, dv); break;
        default: break;
    }
}

}  // namespace
}  // namespace cf
