// paged_attention_simd.h - vector building blocks of the ggml-numerics paged attention kernel
// (the invariant kernel's are in paged_attention_tiles.h).
//
// Both are FMA chains in a fixed order, the same order as ggml's simd_gemm (ggml-cpu/simd-gemm.h,
// C += A.B with one accumulator per output element, k ascending), so the ggml-numerics kernel can use
// them where ggml's tiled flash attention multiplies Q by a K tile and P by a V tile. Everything here
// is in an anonymous namespace: each kernel's translation unit compiles its own copy with its own
// target flags (no ODR clash between differently compiled definitions).
#pragma once

#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_* temporaries
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

namespace cf {
namespace {

// acc[d] += sum_j p[j] * rows[j][d] for j in [0, n), d in [0, dv): each element accumulates in j
// order, as n axpy calls would, but the acc slice stays in registers across the rows.
inline void add_weighted_rows(float * acc, const float * p, const float * const * rows, int32_t n, int32_t dv) {
    int32_t d = 0;
#if defined(__AVX512F__)
    for (; d + 64 <= dv; d += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + d);
        __m512 a1 = _mm512_loadu_ps(acc + d + 16);
        __m512 a2 = _mm512_loadu_ps(acc + d + 32);
        __m512 a3 = _mm512_loadu_ps(acc + d + 48);
        for (int32_t j = 0; j < n; ++j) {
            const __m512 w = _mm512_set1_ps(p[j]);
            const float * r = rows[j] + d;
            a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r + 16), a1);
            a2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r + 32), a2);
            a3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(r + 48), a3);
        }
        _mm512_storeu_ps(acc + d, a0);
        _mm512_storeu_ps(acc + d + 16, a1);
        _mm512_storeu_ps(acc + d + 32, a2);
        _mm512_storeu_ps(acc + d + 48, a3);
    }
    for (; d + 16 <= dv; d += 16) {
        __m512 a0 = _mm512_loadu_ps(acc + d);
        for (int32_t j = 0; j < n; ++j) {
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[j]), _mm512_loadu_ps(rows[j] + d), a0);
        }
        _mm512_storeu_ps(acc + d, a0);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    for (; d + 32 <= dv; d += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        __m256 a1 = _mm256_loadu_ps(acc + d + 8);
        __m256 a2 = _mm256_loadu_ps(acc + d + 16);
        __m256 a3 = _mm256_loadu_ps(acc + d + 24);
        for (int32_t j = 0; j < n; ++j) {
            const __m256 w = _mm256_set1_ps(p[j]);
            const float * r = rows[j] + d;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 24), a3);
        }
        _mm256_storeu_ps(acc + d, a0);
        _mm256_storeu_ps(acc + d + 8, a1);
        _mm256_storeu_ps(acc + d + 16, a2);
        _mm256_storeu_ps(acc + d + 24, a3);
    }
    for (; d + 8 <= dv; d += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + d);
        for (int32_t j = 0; j < n; ++j) {
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(rows[j] + d), a0);
        }
        _mm256_storeu_ps(acc + d, a0);
    }
#endif
    for (; d < dv; ++d) {
        float a = acc[d];
        for (int32_t j = 0; j < n; ++j) {
            a += p[j] * rows[j][d];
        }
        acc[d] = a;
    }
}

// y[i] *= c
inline void scale_f32(float * y, float c, int32_t n) {
    for (int32_t i = 0; i < n; ++i) {
        y[i] *= c;
    }
}

#if defined(__AVX512F__)
constexpr int32_t kLanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int32_t kLanes = 8;
#else
constexpr int32_t kLanes = 1;
#endif

// s[j] = q . K[j] for j in [0, width): kT is the block transposed, [dk][width] (width a multiple
// of kLanes, padding columns zero), so each lane accumulates one score and no horizontal sum is
// needed.
inline void block_scores(const float * q, const float * kT, int32_t dk, int32_t width, float * s) {
    for (int32_t j0 = 0; j0 < width; j0 += kLanes) {
#if defined(__AVX512F__)
        __m512 acc = _mm512_setzero_ps();
        for (int32_t d = 0; d < dk; ++d) {
            acc = _mm512_fmadd_ps(_mm512_set1_ps(q[d]), _mm512_loadu_ps(kT + (size_t) d * width + j0), acc);
        }
        _mm512_storeu_ps(s + j0, acc);
#elif defined(__AVX2__) && defined(__FMA__)
        __m256 acc = _mm256_setzero_ps();
        for (int32_t d = 0; d < dk; ++d) {
            acc = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(kT + (size_t) d * width + j0), acc);
        }
        _mm256_storeu_ps(s + j0, acc);
#else
        float acc = 0.0f;
        for (int32_t d = 0; d < dk; ++d) {
            acc += q[d] * kT[(size_t) d * width + j0];
        }
        s[j0] = acc;
#endif
    }
}

}  // namespace
}  // namespace cf
