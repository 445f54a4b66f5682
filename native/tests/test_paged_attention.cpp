// test_paged_attention.cpp - the CPU paged attention op against a naive reference on random inputs.
//
// The op runs exactly as llama.cpp runs it: one ggml_paged_attn node (GGML_OP_PAGED_ATTN, its
// contract at ggml_paged_attn in ggml.h) computed by ggml's CPU backend and threadpool. The reference gathers each
// token's keys through the block table, computes softmax(scale * q.k) v in double precision, and
// shares nothing with the kernel but the f16 -> f32 conversion of the inputs.
//
// Grid: GQA ratios 1, 3, 4, 8; head sizes 64 and 128; block sizes 8, 16, 32; 1 and 3 threads.
// Each case has ragged sequences (lengths 1, block boundaries +-1, random), decode tokens and prefill
// chunks, shuffled block tables over a pool larger than needed, a q view with padded strides, and
// NaN in every pool row that holds no position (reading one shows up as NaN in the output).
#undef NDEBUG  // the checks must run in Release builds too
#include "kernels/cpu/paged_attention_cpu.h"

#include "ggml-cpu.h"
#include "ggml.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

namespace {

constexpr float kTolerance = 2e-5f;  // max |kernel - reference|; outputs are O(1)

struct Shape {
    int32_t n_head_kv;
    int32_t gqa;  // query heads per kv head
    int32_t head_dim;
    int32_t block_size;
};

// One sequence of the batch: len tokens in the cache after the batch, of which the last
// n_new are batch tokens (positions [len - n_new, len)).
struct SeqSpec {
    int32_t len;
    int32_t n_new;
};

struct Case {
    Shape shape;
    ggml_type kv_type;
    std::vector<SeqSpec> seqs;
    int32_t num_blocks;              // pool size
    std::vector<int32_t> tables;     // [n_seqs][max_blocks], CF_BLOCK_ID_NONE-like -1 padding
    int32_t max_blocks;
    std::vector<int32_t> tok_seq;    // [n_tokens]
    std::vector<int32_t> tok_ctx;    // [n_tokens] = pos + 1
    std::vector<float> q;            // [n_tokens][n_head][head_dim]
    std::vector<float> k_f32;        // [kv_size][n_head_kv * head_dim], what the pool holds as f32
    std::vector<float> v_f32;
    int32_t n_tokens() const { return (int32_t) tok_seq.size(); }
    int32_t n_head() const { return shape.n_head_kv * shape.gqa; }
    int32_t kv_size() const { return num_blocks * shape.block_size; }
};

int32_t div_up(int32_t a, int32_t b) {
    return (a + b - 1) / b;
}

// Ragged lengths around block boundaries, a length-1 sequence, and random ones.
std::vector<SeqSpec> make_seqs(int32_t block_size, std::mt19937 & rng) {
    const int32_t bs = block_size;
    std::vector<SeqSpec> seqs = {
        { 1, 1 },             // first token of a prompt
        { std::max(1, bs - 1), 1 },  // decode, last block one short of full
        { bs, 1 },            // decode filling a block exactly
        { bs + 1, 1 },        // decode opening a new block
        { 2 * bs, 2 * bs },   // whole prompt in one chunk, ends on a boundary
        { 3 * bs + 5, 7 },    // a prefill chunk crossing a boundary
    };
    std::uniform_int_distribution<int32_t> len(1, 6 * bs);
    for (int i = 0; i < 3; ++i) {
        const int32_t n = len(rng);
        seqs.push_back({ n, std::uniform_int_distribution<int32_t>(1, std::min(n, 9))(rng) });
    }
    return seqs;
}

Case make_case(const Shape & shape, ggml_type kv_type, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    Case c;
    c.shape = shape;
    c.kv_type = kv_type;
    c.seqs = make_seqs(shape.block_size, rng);

    int32_t blocks_needed = 0;
    c.max_blocks = 0;
    for (const SeqSpec & s : c.seqs) {
        blocks_needed += div_up(s.len, shape.block_size);
        c.max_blocks = std::max(c.max_blocks, div_up(s.len, shape.block_size));
    }
    c.max_blocks += 1;  // padding columns the kernel must not read
    c.num_blocks = blocks_needed + 5;

    // shuffled block ids: sequences own scattered, non-contiguous blocks
    std::vector<int32_t> ids((size_t) c.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    c.tables.assign(c.seqs.size() * (size_t) c.max_blocks, -1);
    std::vector<bool> owned((size_t) c.num_blocks * shape.block_size, false);  // rows holding a position
    size_t next = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
        for (int32_t b = 0; b < div_up(c.seqs[s].len, shape.block_size); ++b) {
            c.tables[s * (size_t) c.max_blocks + (size_t) b] = ids[next++];
        }
        for (int32_t p = 0; p < c.seqs[s].len; ++p) {
            const int32_t block_id = c.tables[s * (size_t) c.max_blocks + (size_t) (p / shape.block_size)];
            owned[(size_t) block_id * shape.block_size + p % shape.block_size] = true;
        }
    }

    // tokens: sequences interleaved in a random order, each sequence's tokens in position order
    std::vector<int32_t> order;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
        order.insert(order.end(), (size_t) c.seqs[s].n_new, (int32_t) s);
    }
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int32_t> emitted(c.seqs.size(), 0);
    for (int32_t s : order) {
        const SeqSpec & spec = c.seqs[(size_t) s];
        const int32_t pos = spec.len - spec.n_new + emitted[(size_t) s]++;
        c.tok_seq.push_back(s);
        c.tok_ctx.push_back(pos + 1);
    }

    const int32_t row = shape.n_head_kv * shape.head_dim;
    c.q.resize((size_t) c.n_tokens() * c.n_head() * shape.head_dim);
    for (float & x : c.q) {
        x = uni(rng);
    }
    c.k_f32.assign((size_t) c.kv_size() * row, std::nanf(""));
    c.v_f32.assign((size_t) c.kv_size() * row, std::nanf(""));
    for (int32_t r = 0; r < c.kv_size(); ++r) {
        if (!owned[(size_t) r]) {
            continue;  // stays NaN: free blocks and the unused tail of last blocks
        }
        for (int32_t i = 0; i < row; ++i) {
            // round through f16 when the pool is f16, so that the reference sees the stored values
            float kx = uni(rng);
            float vx = uni(rng);
            if (kv_type == GGML_TYPE_F16) {
                kx = ggml_fp16_to_fp32(ggml_fp32_to_fp16(kx));
                vx = ggml_fp16_to_fp32(ggml_fp32_to_fp16(vx));
            }
            c.k_f32[(size_t) r * row + i] = kx;
            c.v_f32[(size_t) r * row + i] = vx;
        }
    }
    return c;
}

// softmax(scale * q.k) v over the token's positions [0, ctx), in double. [n_tokens][n_head][head_dim]
std::vector<float> reference(const Case & c, float scale) {
    const Shape & sh = c.shape;
    const int32_t row = sh.n_head_kv * sh.head_dim;
    std::vector<float> out((size_t) c.n_tokens() * c.n_head() * sh.head_dim);
    for (int32_t t = 0; t < c.n_tokens(); ++t) {
        const int32_t * table = c.tables.data() + (size_t) c.tok_seq[(size_t) t] * c.max_blocks;
        const int32_t ctx = c.tok_ctx[(size_t) t];
        for (int32_t hq = 0; hq < c.n_head(); ++hq) {
            const int32_t hk = hq / sh.gqa;
            const float * q = c.q.data() + ((size_t) t * c.n_head() + hq) * sh.head_dim;
            std::vector<double> w((size_t) ctx);
            double w_max = -INFINITY;
            for (int32_t p = 0; p < ctx; ++p) {
                const int64_t slot = (int64_t) table[p / sh.block_size] * sh.block_size + p % sh.block_size;
                const float * k = c.k_f32.data() + slot * row + (size_t) hk * sh.head_dim;
                double dot = 0.0;
                for (int32_t d = 0; d < sh.head_dim; ++d) {
                    dot += (double) q[d] * k[d];
                }
                w[(size_t) p] = scale * dot;
                w_max = std::max(w_max, w[(size_t) p]);
            }
            double sum = 0.0;
            for (double & x : w) {
                x = std::exp(x - w_max);
                sum += x;
            }
            float * o = out.data() + ((size_t) t * c.n_head() + hq) * sh.head_dim;
            for (int32_t d = 0; d < sh.head_dim; ++d) {
                double acc = 0.0;
                for (int32_t p = 0; p < ctx; ++p) {
                    const int64_t slot = (int64_t) table[p / sh.block_size] * sh.block_size + p % sh.block_size;
                    acc += w[(size_t) p] * c.v_f32[slot * row + (size_t) hk * sh.head_dim + d];
                }
                o[d] = (float) (acc / sum);
            }
        }
    }
    return out;
}

void fill_pool(ggml_tensor * t, const std::vector<float> & values) {
    if (t->type == GGML_TYPE_F32) {
        std::memcpy(t->data, values.data(), values.size() * sizeof(float));
    } else {
        ggml_fp32_to_fp16_row(values.data(), (ggml_fp16_t *) t->data, (int64_t) values.size());
    }
}

// Run the op through a ggml graph on n_threads CPU threads. [n_tokens][n_head][head_dim]
std::vector<float> run_op(const Case & c, float scale, int n_threads,
                          ggml_paged_attn_kernel kernel = GGML_PAGED_ATTN_KERNEL_INVARIANT) {
    const Shape & sh = c.shape;
    const size_t mem = 64 * ggml_tensor_overhead() + ggml_graph_overhead() + 2 * c.k_f32.size() * sizeof(float) +
                       2 * c.q.size() * sizeof(float) + c.tables.size() * sizeof(int32_t) + (1u << 20);
    ggml_init_params ip = { mem, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    assert(ctx != nullptr);

    // q with padded strides between heads, as a view: the op must honor nb[1] and nb[2]
    const int32_t pad = 16;
    ggml_tensor * q_buf = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, sh.head_dim + pad, c.n_head(), c.n_tokens());
    for (int32_t t = 0; t < c.n_tokens(); ++t) {
        for (int32_t h = 0; h < c.n_head(); ++h) {
            float * dst = (float *) ((char *) q_buf->data + t * q_buf->nb[2] + h * q_buf->nb[1]);
            std::memcpy(dst, c.q.data() + ((size_t) t * c.n_head() + h) * sh.head_dim, sh.head_dim * sizeof(float));
        }
    }
    ggml_tensor * q = ggml_view_3d(ctx, q_buf, sh.head_dim, c.n_head(), c.n_tokens(), q_buf->nb[1], q_buf->nb[2], 0);
    ggml_tensor * k = ggml_new_tensor_2d(ctx, c.kv_type, sh.n_head_kv * sh.head_dim, c.kv_size());
    ggml_tensor * v = ggml_new_tensor_2d(ctx, c.kv_type, sh.n_head_kv * sh.head_dim, c.kv_size());
    fill_pool(k, c.k_f32);
    fill_pool(v, c.v_f32);
    ggml_tensor * bt = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, c.max_blocks, (int64_t) c.seqs.size());
    std::memcpy(bt->data, c.tables.data(), c.tables.size() * sizeof(int32_t));
    ggml_tensor * ts = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.n_tokens());
    ggml_tensor * tc = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, c.n_tokens());
    std::memcpy(ts->data, c.tok_seq.data(), c.tok_seq.size() * sizeof(int32_t));
    std::memcpy(tc->data, c.tok_ctx.data(), c.tok_ctx.size() * sizeof(int32_t));

    ggml_tensor * out = ggml_paged_attn(ctx, q, k, v, bt, ts, tc, scale, 0.0f, sh.block_size, kernel);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    const ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    assert(st == GGML_STATUS_SUCCESS);

    std::vector<float> res((size_t) ggml_nelements(out));
    std::memcpy(res.data(), out->data, res.size() * sizeof(float));
    ggml_free(ctx);
    return res;
}

int g_num_cases = 0;
float g_worst = 0.0f;

void check_case(const Shape & sh, ggml_type kv_type, int n_threads, uint32_t seed) {
    const Case c = make_case(sh, kv_type, seed);
    const float scale = 1.0f / std::sqrt((float) sh.head_dim);
    const std::vector<float> want = reference(c, scale);
    const std::vector<float> got = run_op(c, scale, n_threads);
    assert(got.size() == want.size());
    float worst = 0.0f;
    for (size_t i = 0; i < got.size(); ++i) {
        const float err = std::fabs(got[i] - want[i]);
        if (!(err <= kTolerance)) {  // also catches NaN
            std::fprintf(stderr,
                         "mismatch: n_head_kv=%d gqa=%d head_dim=%d block_size=%d %s threads=%d seed=%u: "
                         "out[%zu] = %g, reference %g\n",
                         sh.n_head_kv, sh.gqa, sh.head_dim, sh.block_size, ggml_type_name(kv_type), n_threads, seed,
                         i, got[i], want[i]);
            assert(false);
        }
        worst = std::max(worst, err);
    }
    g_worst = std::max(g_worst, worst);
    ++g_num_cases;
}

void test_grid() {
    uint32_t seed = 1;
    for (int32_t gqa : { 1, 3, 4, 8 }) {
        for (int32_t head_dim : { 64, 128 }) {
            for (int32_t block_size : { 8, 16, 32 }) {
                for (int n_threads : { 1, 3 }) {
                    check_case({ 2, gqa, head_dim, block_size }, GGML_TYPE_F16, n_threads, seed++);
                }
            }
        }
    }
}

void test_f32_pool_and_odd_head_dim() {
    check_case({ 3, 3, 64, 16 }, GGML_TYPE_F32, 2, 1001);   // SmolLM2-135M's shape, f32 pools
    check_case({ 1, 8, 72, 16 }, GGML_TYPE_F16, 2, 1002);   // head_dim not a multiple of 16: scalar tails
    check_case({ 2, 2, 64, 1 }, GGML_TYPE_F16, 4, 1003);    // one-token blocks
}

// Softcap: s = softcap * tanh(s / softcap) on the scaled scores, checked on one query against
// a hand computation over two keys.
void test_softcap() {
    const int32_t d = 16;
    std::vector<float> q((size_t) d, 0.0f), k((size_t) 2 * d, 0.0f), v((size_t) 2 * d, 0.0f);
    q[0] = 1.0f;
    k[0] = 3.0f;       // key 0: q.k = 3
    k[d] = -1.0f;      // key 1: q.k = -1
    v[0] = 1.0f;       // out[0] = p0
    v[d + 1] = 1.0f;   // out[1] = p1
    const int32_t table[1] = { 0 };
    const int32_t seq[1] = { 0 };
    const int32_t ctx_len[1] = { 2 };
    std::vector<float> out((size_t) d, 0.0f);
    cf::PagedAttentionArgs a{};
    a.q = (const char *) q.data();
    a.q_stride_head_bytes = d * sizeof(float);
    a.q_stride_token_bytes = d * sizeof(float);
    a.k_pool = (const char *) k.data();
    a.v_pool = (const char *) v.data();
    a.k_type = a.v_type = GGML_TYPE_F32;
    a.k_stride_row_bytes = a.v_stride_row_bytes = d * sizeof(float);
    a.kv_size = 2;
    a.block_tables = table;
    a.block_table_stride = 1;
    a.token_seq_idx = seq;
    a.token_ctx_len = ctx_len;
    a.out = out.data();
    a.n_tokens = 1;
    a.n_head = a.n_head_kv = 1;
    a.head_dim_k = a.head_dim_v = d;
    a.block_size = 2;
    a.scale = 0.5f;
    a.softcap = 1.0f;
    cf::paged_attention_cpu(a, 0, 1);
    const double s0 = std::tanh(1.5), s1 = std::tanh(-0.5);
    const double p0 = 1.0 / (1.0 + std::exp(s1 - s0));
    assert(std::fabs(out[0] - p0) < 1e-6 && std::fabs(out[1] - (1.0 - p0)) < 1e-6);
}

// ---- ggml numerics: paged_attention_cpu_ggml against ggml_flash_attn_ext, bit for bit ----------------
//
// Stock KV mode in split mode: each sequence is a stream whose cells 0..len-1 hold its positions,
// n_kv = len rounded up to 256 (llama.cpp's padding), the KQ mask hides cells past each token's
// position. Each sequence runs through its own ggml_flash_attn_ext node (as a stream does) and the
// paged op runs once over all of them: the outputs must be identical bits. Sequences have 1..63 new
// tokens (ggml's one-chunk path) or 64 and more (its tiled path); single-token sequences stay under
// 512 cells, where ggml would split the keys over threads (a path the paged op does not reproduce).

struct StreamSeq {
    int32_t len;
    int32_t n_new;
};

// Run ggml_flash_attn_ext for sequence s of case c (split mode). [n_new][n_head][head_dim]
std::vector<float> run_stock_stream(const Case & c, size_t s, float scale, int n_threads) {
    const Shape & sh = c.shape;
    const int32_t len = c.seqs[s].len;
    const int32_t n_new = c.seqs[s].n_new;
    const int32_t n_kv = div_up(len, 256) * 256;
    const int32_t row = sh.n_head_kv * sh.head_dim;
    const size_t mem = 64 * ggml_tensor_overhead() + ggml_graph_overhead() + 4 * (size_t) n_kv * row * sizeof(float) +
                       4 * (size_t) n_new * c.n_head() * sh.head_dim * sizeof(float) +
                       (size_t) n_kv * n_new * sizeof(ggml_fp16_t) + (1u << 20);
    ggml_init_params ip = { mem, nullptr, false };
    ggml_context * ctx = ggml_init(ip);
    assert(ctx != nullptr);

    // the stream's cells: positions 0..len-1 from the paged pool's rows, zeros past them (masked)
    std::vector<float> k_cells((size_t) n_kv * row, 0.0f), v_cells((size_t) n_kv * row, 0.0f);
    for (int32_t p = 0; p < len; ++p) {
        const int32_t block_id = c.tables[s * (size_t) c.max_blocks + (size_t) (p / sh.block_size)];
        const size_t src = ((size_t) block_id * sh.block_size + p % sh.block_size) * row;
        std::copy(c.k_f32.begin() + (long) src, c.k_f32.begin() + (long) (src + row), k_cells.begin() + (long) p * row);
        std::copy(c.v_f32.begin() + (long) src, c.v_f32.begin() + (long) (src + row), v_cells.begin() + (long) p * row);
    }
    ggml_tensor * k_stream = ggml_new_tensor_2d(ctx, c.kv_type, row, n_kv);
    ggml_tensor * v_stream = ggml_new_tensor_2d(ctx, c.kv_type, row, n_kv);
    fill_pool(k_stream, k_cells);
    fill_pool(v_stream, v_cells);
    // llama.cpp's views: [head_dim, n_kv, n_head_kv], rows of the cache strided per cell
    ggml_tensor * k = ggml_view_3d(ctx, k_stream, sh.head_dim, n_kv, sh.n_head_kv, k_stream->nb[1],
                                   ggml_row_size(c.kv_type, sh.head_dim), 0);
    ggml_tensor * v = ggml_view_3d(ctx, v_stream, sh.head_dim, n_kv, sh.n_head_kv, v_stream->nb[1],
                                   ggml_row_size(c.kv_type, sh.head_dim), 0);

    // q of the sequence's tokens [head_dim, n_head, n_new], permuted to [head_dim, n_new, n_head]
    ggml_tensor * q_tok = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, sh.head_dim, c.n_head(), n_new);
    int32_t t_first = 0;
    while (c.tok_seq[(size_t) t_first] != (int32_t) s) {
        ++t_first;
    }
    std::memcpy(q_tok->data, c.q.data() + (size_t) t_first * c.n_head() * sh.head_dim,
                (size_t) n_new * c.n_head() * sh.head_dim * sizeof(float));
    ggml_tensor * q = ggml_permute(ctx, q_tok, 0, 2, 1, 3);

    ggml_tensor * mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, n_kv, n_new);
    for (int32_t i = 0; i < n_new; ++i) {
        const int32_t pos = len - n_new + i;
        ggml_fp16_t * m = (ggml_fp16_t *) mask->data + (size_t) i * n_kv;
        for (int32_t j = 0; j < n_kv; ++j) {
            m[j] = ggml_fp32_to_fp16(j <= pos ? 0.0f : -INFINITY);
        }
    }
    ggml_tensor * out = ggml_flash_attn_ext(ctx, q, k, v, mask, scale, 0.0f, 0.0f);
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    const ggml_status st = ggml_graph_compute_with_ctx(ctx, gf, n_threads);
    assert(st == GGML_STATUS_SUCCESS);
    std::vector<float> res((size_t) ggml_nelements(out));  // [n_new][n_head][head_dim]
    std::memcpy(res.data(), out->data, res.size() * sizeof(float));
    ggml_free(ctx);
    return res;
}

int g_num_bitwise = 0;

void check_ggml_numerics(const Shape & sh, ggml_type kv_type, const std::vector<StreamSeq> & spec, int n_threads,
                         uint32_t seed) {
    Case c = make_case(sh, kv_type, seed);
    // replace make_case's sequences and token order: each sequence's tokens consecutive, in order
    std::mt19937 rng(seed + 7);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    c.seqs.clear();
    for (const StreamSeq & x : spec) {
        c.seqs.push_back({ x.len, x.n_new });
    }
    int32_t blocks_needed = 0;
    c.max_blocks = 0;
    for (const SeqSpec & x : c.seqs) {
        blocks_needed += div_up(x.len, sh.block_size);
        c.max_blocks = std::max(c.max_blocks, div_up(x.len, sh.block_size));
    }
    c.num_blocks = blocks_needed + 3;
    std::vector<int32_t> ids((size_t) c.num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    c.tables.assign(c.seqs.size() * (size_t) c.max_blocks, -1);
    size_t next = 0;
    c.tok_seq.clear();
    c.tok_ctx.clear();
    for (size_t s = 0; s < c.seqs.size(); ++s) {
        for (int32_t b = 0; b < div_up(c.seqs[s].len, sh.block_size); ++b) {
            c.tables[s * (size_t) c.max_blocks + (size_t) b] = ids[next++];
        }
        for (int32_t i = 0; i < c.seqs[s].n_new; ++i) {
            c.tok_seq.push_back((int32_t) s);
            c.tok_ctx.push_back(c.seqs[s].len - c.seqs[s].n_new + i + 1);
        }
    }
    const int32_t row = sh.n_head_kv * sh.head_dim;
    c.q.resize((size_t) c.n_tokens() * c.n_head() * sh.head_dim);
    for (float & x : c.q) {
        x = 2.0f * uni(rng);  // wide scores, so maxima move and rescaling happens
    }
    c.k_f32.assign((size_t) c.kv_size() * row, 0.0f);
    c.v_f32.assign((size_t) c.kv_size() * row, 0.0f);
    for (size_t i = 0; i < c.k_f32.size(); ++i) {
        float kx = uni(rng);
        float vx = uni(rng);
        if (kv_type == GGML_TYPE_F16) {
            kx = ggml_fp16_to_fp32(ggml_fp32_to_fp16(kx));
            vx = ggml_fp16_to_fp32(ggml_fp32_to_fp16(vx));
        }
        c.k_f32[i] = kx;
        c.v_f32[i] = vx;
    }

    const float scale = 1.0f / std::sqrt((float) sh.head_dim);
    const std::vector<float> paged = run_op(c, scale, n_threads, GGML_PAGED_ATTN_KERNEL_GGML);
    const size_t per_token = (size_t) c.n_head() * sh.head_dim;
    size_t t0 = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
        const std::vector<float> stock = run_stock_stream(c, s, scale, n_threads);
        for (size_t i = 0; i < stock.size(); ++i) {
            const float got = paged[t0 * per_token + i];
            if (std::memcmp(&got, &stock[i], sizeof(float)) != 0) {
                std::fprintf(stderr,
                             "ggml numerics: n_head_kv=%d gqa=%d head_dim=%d block_size=%d %s threads=%d: sequence "
                             "%zu (len %d, %d new), out[%zu] = %.9g, ggml_flash_attn_ext %.9g\n",
                             sh.n_head_kv, sh.gqa, sh.head_dim, sh.block_size, ggml_type_name(kv_type), n_threads, s,
                             c.seqs[s].len, c.seqs[s].n_new, i, got, stock[i]);
                assert(false);
            }
        }
        t0 += (size_t) c.seqs[s].n_new;
        ++g_num_bitwise;
    }
}

void test_ggml_numerics() {
    // one-chunk path (1..63 new tokens) and tiled path (>= 64), tile and block boundaries
    const std::vector<StreamSeq> seqs = {
        { 1, 1 }, { 17, 1 }, { 64, 1 }, { 65, 1 }, { 200, 1 }, { 256, 1 }, { 300, 5 }, { 63, 63 },
        { 64, 64 }, { 100, 64 }, { 129, 90 }, { 700, 64 },
    };
    uint32_t seed = 5000;
    for (ggml_type kv_type : { GGML_TYPE_F16, GGML_TYPE_F32 }) {
        for (const Shape & sh : { Shape{ 3, 3, 64, 16 }, Shape{ 2, 4, 128, 32 }, Shape{ 1, 1, 64, 8 } }) {
            for (int n_threads : { 1, 3 }) {
                check_ggml_numerics(sh, kv_type, seqs, n_threads, seed++);
            }
        }
    }
}

}  // namespace

int main() {
    ggml_cpu_init();
    test_grid();
    test_f32_pool_and_odd_head_dim();
    test_softcap();
    test_ggml_numerics();
    std::printf("test_paged_attention: ggml numerics equal ggml_flash_attn_ext bit for bit (%d sequences)\n",
                g_num_bitwise);
    std::printf("test_paged_attention: ok (%d cases, max |kernel - reference| = %.2g, tolerance %.0g)\n",
                g_num_cases, g_worst, kTolerance);
    return 0;
}
