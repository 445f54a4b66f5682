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
// Work items are (tile of up to 8 consecutive tokens of one sequence, kv head), as in the f32 kernel
// (paged_attention_cpu.cpp): each K/V tile is converted once for all query heads of its GQA group.
#include "kernels/paged_attention_cpu.h"

// ggml-cpu's internal headers (the pinned tree's ggml/src/ggml-cpu): its vector routines (vec.h) and
// flash attention tile sizes (common.h). CMake adds their include directories for this file only and
// compiles it with the CPU backend's options.
#include "common.h"
#include "vec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace cf {

namespace {

constexpr int32_t kQTile = 64;   // GGML_FA_TILE_Q: query rows from which ggml takes the tiled path
constexpr int32_t kKvTile = 64;  // GGML_FA_TILE_KV: keys per softmax tile of the tiled path
static_assert(kQTile == GGML_FA_TILE_Q && kKvTile == GGML_FA_TILE_KV, "ggml's flash attention tiles changed");

constexpr int32_t kTileTokens = 8;  // consecutive tokens of one sequence per work item

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

std::vector<char> & thread_scratch() {
    thread_local std::vector<char> scratch;
    return scratch;
}

// The "one chunk" path for tokens [t0, t0 + nt) and kv head h: per (token, query head), keys in
// position order, exactly ggml_compute_forward_flash_attn_ext_f16_one_chunk's updates.
void attend_one_chunk(const PagedAttentionArgs & a, int32_t t0, int32_t nt, int32_t h) {
    const int32_t G = a.n_head / a.n_head_kv;
    const int32_t dk = a.head_dim_k;
    const int32_t dv = a.head_dim_v;
    const ScoreScale sc(a);

    const ggml_type k_vec_dot_type = ggml_get_type_traits_cpu(a.k_type)->vec_dot_type;
    const ggml_from_float_t q_to_vec_dot = ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    const ggml_vec_dot_t kq_vec_dot = ggml_get_type_traits_cpu(a.k_type)->vec_dot;

    std::vector<char> & scratch = thread_scratch();
    const size_t need = (size_t) dk * sizeof(float) + (size_t) dv * sizeof(float) * 2;
    if (scratch.size() < need) {
        scratch.resize(need);
    }
    void * q_q = scratch.data();                                              // q as the vec_dot type
    float * vkq32 = (float *) (scratch.data() + (size_t) dk * sizeof(float));  // [dv]
    ggml_fp16_t * vkq16 = (ggml_fp16_t *) (vkq32 + dv);                       // [dv] (f16 V)

    const size_t k_elt = ggml_type_size(a.k_type);
    const size_t v_elt = ggml_type_size(a.v_type);
    const int64_t n_pool_blocks = a.kv_size / a.block_size;
    const int32_t * table = a.block_tables + (int64_t) a.token_seq_idx[t0] * a.block_table_stride;

    for (int32_t i = 0; i < nt; ++i) {
        const int32_t t = t0 + i;
        const int32_t ctx = a.token_ctx_len[t];
        for (int32_t g = 0; g < G; ++g) {
            const int32_t head = h * G + g;
            q_to_vec_dot(q_row(a, t, head), q_q, dk);
            float S = 0.0f;
            float M = -INFINITY;
            if (a.v_type == GGML_TYPE_F16) {
                std::memset(vkq16, 0, (size_t) dv * sizeof(ggml_fp16_t));
            } else {
                std::memset(vkq32, 0, (size_t) dv * sizeof(float));
            }
            for (int32_t p = 0; p < ctx; ++p) {
                const int64_t row = pool_row(table, p, a.block_size, n_pool_blocks);
                const char * k_data = a.k_pool + row * a.k_stride_row_bytes + (size_t) h * dk * k_elt;
                const char * v_data = a.v_pool + row * a.v_stride_row_bytes + (size_t) h * dv * v_elt;
                float s;
                kq_vec_dot(dk, &s, 0, k_data, 0, q_q, 0, 1);
                s = s * sc.scale;
                if (sc.softcap != 0.0f) {
                    s = sc.softcap * tanhf(s);
                }
                s += 0.0f;  // ggml adds the mask value, 0 for a visible key (turns -0 into +0)

                const float M_old = M;
                float ms = 1.0f;
                float vs = 1.0f;
                if (a.v_type == GGML_TYPE_F16) {
                    if (s > M) {
                        M = s;
                        ms = expf(M_old - M);
                        ggml_vec_scale_f16(dv, vkq16, ms);
                    } else {
                        vs = expf(s - M);
                    }
                    ggml_vec_mad_f16(dv, vkq16, (const ggml_fp16_t *) v_data, vs);
                } else {
                    if (s > M) {
                        M = s;
                        ms = expf(M_old - M);
                        ggml_vec_scale_f32(dv, vkq32, ms);
                    } else {
                        vs = expf(s - M);
                    }
                    ggml_vec_mad_f32(dv, vkq32, (const float *) v_data, vs);
                }
                S = S*ms + vs;
            }
            if (a.v_type == GGML_TYPE_F16) {
                for (int32_t d = 0; d < dv; ++d) {
                    vkq32[d] = GGML_CPU_FP16_TO_FP32(vkq16[d]);
                }
            }
            const float S_inv = S == 0.0f ? 0.0f : 1.0f/S;
            ggml_vec_scale_f32(dv, vkq32, S_inv);
            std::memcpy(out_row(a, t, head), vkq32, (size_t) dv * sizeof(float));
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
                std::fill(kq, kq + kKvTile, 0.0f);
                for (int32_t d = 0; d < dk; ++d) {
                    const float qd = q[d];
                    const float * kd = kT + (size_t) d * kKvTile;
                    for (int32_t j = 0; j < kKvTile; ++j) {
                        kq[j] = std::fma(kd[j], qd, kq[j]);
                    }
                }
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
                float * acc_r = acc + (size_t) r * dv;
                for (int32_t j = 0; j < ni; ++j) {
                    const float pj = kq[j];
                    const float * vj = v32 + (size_t) j * dv;
                    for (int32_t d = 0; d < dv; ++d) {
                        acc_r[d] = std::fma(vj[d], pj, acc_r[d]);
                    }
                }
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
        for (int32_t t0 = run0; t0 < run0 + run; t0 += kTileTokens) {
            const int32_t nt = std::min(kTileTokens, run0 + run - t0);
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

void paged_attention_cpu_ggml_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    paged_attention_cpu_ggml(paged_attention_args(dst, userdata), ith, nth);
}

}  // namespace cf
