// test_paged_attention_invariance.cpp - the invariant paged attention kernel (paged_attention_cpu, the
// engine's default) gives each query row the same output bits whatever the step looks like.
//
// Sequences of 100 to 1,000 tokens have fixed queries, keys and values per position. The reference
// computes each sequence alone, its whole prompt in one call, on one thread. Every other run must
// reproduce each row bit for bit:
//   - chunking and batch composition: all sequences prefilled together under a per-step token budget
//     of 512, 64 and 17 (chunks cut anywhere, next to other sequences' chunks, in a shuffled order),
//     and the last positions run as decode steps one token at a time beside the others;
//   - block placement: other shuffles of the block pool, and other block sizes (1, 8, 32);
//   - threads: 1, 2 and 3 (items land on other threads).
// Pool rows that hold no position are NaN, so reading one would show. Shapes: SmolLM2-135M's (GQA 3,
// head_dim 64), GQA 1 and 4 with head_dim 128, and head_dim 72 (scalar tails); f16 and f32 pools.
#undef NDEBUG  // the checks must run in Release builds too
#include "kernels/cpu/paged_attention_cpu.h"

#include "ggml.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

struct Shape {
    int32_t n_head_kv;
    int32_t gqa;
    int32_t head_dim;
    ggml_type kv_type;
    int32_t n_head() const { return n_head_kv * gqa; }
    int32_t kv_row() const { return n_head_kv * head_dim; }        // floats per K/V position
    int32_t q_row() const { return n_head() * head_dim; }          // floats per query/output position
};

// Queries, keys and values of every position of every sequence (f16-representable for f16 pools).
struct Data {
    Shape shape;
    std::vector<int32_t> lens;
    std::vector<std::vector<float>> q, k, v;  // [seq][pos * row]
};

Data make_data(const Shape & sh, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    Data d;
    d.shape = sh;
    d.lens = { 1000, 100, 257, 640, 129, 383 };  // tile (64) and block boundaries +-1 among them
    for (int32_t len : d.lens) {
        std::vector<float> q((size_t) len * sh.q_row()), k((size_t) len * sh.kv_row()), v(k.size());
        for (float & x : q) {
            x = 2.0f * uni(rng);  // wide scores: maxima move between tiles, rescaling happens
        }
        for (std::vector<float> * kv : { &k, &v }) {
            for (float & x : *kv) {
                x = uni(rng);
                if (sh.kv_type == GGML_TYPE_F16) {
                    x = ggml_fp16_to_fp32(ggml_fp32_to_fp16(x));
                }
            }
        }
        d.q.push_back(std::move(q));
        d.k.push_back(std::move(k));
        d.v.push_back(std::move(v));
    }
    return d;
}

// A block pool holding every sequence's K/V: block size, shuffled block ids, NaN in unused rows.
struct Pool {
    int32_t block_size;
    int32_t max_blocks;
    std::vector<int32_t> tables;  // [n_seqs][max_blocks]
    std::vector<char> k, v;       // [kv_size][kv_row] of kv_type
    int64_t kv_size;
};

Pool make_pool(const Data & d, int32_t block_size, uint32_t seed) {
    const Shape & sh = d.shape;
    Pool p;
    p.block_size = block_size;
    p.max_blocks = 0;
    int32_t n_blocks = 3;  // spare blocks nobody owns
    for (int32_t len : d.lens) {
        p.max_blocks = std::max(p.max_blocks, (len + block_size - 1) / block_size);
        n_blocks += (len + block_size - 1) / block_size;
    }
    p.kv_size = (int64_t) n_blocks * block_size;
    std::vector<int32_t> ids((size_t) n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    p.tables.assign(d.lens.size() * (size_t) p.max_blocks, -1);
    std::vector<float> k_f32((size_t) p.kv_size * sh.kv_row(), std::nanf("")), v_f32(k_f32.size(), std::nanf(""));
    size_t next = 0;
    for (size_t s = 0; s < d.lens.size(); ++s) {
        for (int32_t pos = 0; pos < d.lens[s]; ++pos) {
            int32_t & block_id = p.tables[s * (size_t) p.max_blocks + (size_t) (pos / block_size)];
            if (pos % block_size == 0) {
                block_id = ids[next++];
            }
            const size_t dst = ((size_t) block_id * block_size + pos % block_size) * sh.kv_row();
            std::copy_n(d.k[s].begin() + (long) pos * sh.kv_row(), sh.kv_row(), k_f32.begin() + (long) dst);
            std::copy_n(d.v[s].begin() + (long) pos * sh.kv_row(), sh.kv_row(), v_f32.begin() + (long) dst);
        }
    }
    const size_t elt = ggml_type_size(sh.kv_type);
    p.k.resize(k_f32.size() * elt);
    p.v.resize(v_f32.size() * elt);
    if (sh.kv_type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(k_f32.data(), (ggml_fp16_t *) p.k.data(), (int64_t) k_f32.size());
        ggml_fp32_to_fp16_row(v_f32.data(), (ggml_fp16_t *) p.v.data(), (int64_t) v_f32.size());
    } else {
        std::memcpy(p.k.data(), k_f32.data(), p.k.size());
        std::memcpy(p.v.data(), v_f32.data(), p.v.size());
    }
    return p;
}

// One query range of one step: positions [pos0, pos1) of sequence seq.
struct Chunk {
    int32_t seq, pos0, pos1;
};

// Outputs of every position of every sequence: [seq][pos * q_row].
using Outputs = std::vector<std::vector<float>>;

// Run one step (one kernel call over the chunks, in order) on n_threads threads; store its rows.
void run_step(const Data & d, const Pool & p, const std::vector<Chunk> & chunks, int n_threads, Outputs & out) {
    const Shape & sh = d.shape;
    std::vector<float> q, o;
    std::vector<int32_t> tok_seq, tok_ctx;
    for (const Chunk & c : chunks) {
        for (int32_t pos = c.pos0; pos < c.pos1; ++pos) {
            q.insert(q.end(), d.q[(size_t) c.seq].begin() + (long) pos * sh.q_row(),
                     d.q[(size_t) c.seq].begin() + (long) (pos + 1) * sh.q_row());
            tok_seq.push_back(c.seq);
            tok_ctx.push_back(pos + 1);
        }
    }
    o.assign(q.size(), std::nanf(""));
    cf::PagedAttentionArgs a{};
    a.q = (const char *) q.data();
    a.q_stride_head_bytes = (size_t) sh.head_dim * sizeof(float);
    a.q_stride_token_bytes = (size_t) sh.q_row() * sizeof(float);
    a.k_pool = p.k.data();
    a.v_pool = p.v.data();
    a.k_type = a.v_type = sh.kv_type;
    a.k_stride_row_bytes = a.v_stride_row_bytes = (size_t) sh.kv_row() * ggml_type_size(sh.kv_type);
    a.kv_size = p.kv_size;
    a.block_tables = p.tables.data();
    a.block_table_stride = p.max_blocks;
    a.token_seq_idx = tok_seq.data();
    a.token_ctx_len = tok_ctx.data();
    a.out = o.data();
    a.n_tokens = (int32_t) tok_seq.size();
    a.n_head = sh.n_head();
    a.n_head_kv = sh.n_head_kv;
    a.head_dim_k = a.head_dim_v = sh.head_dim;
    a.block_size = p.block_size;
    a.scale = 1.0f / std::sqrt((float) sh.head_dim);
    a.softcap = 0.0f;
    std::vector<std::thread> workers;
    for (int t = 1; t < n_threads; ++t) {
        workers.emplace_back(cf::paged_attention_cpu, std::cref(a), t, n_threads);
    }
    cf::paged_attention_cpu(a, 0, n_threads);
    for (std::thread & w : workers) {
        w.join();
    }
    size_t t = 0;
    for (const Chunk & c : chunks) {
        for (int32_t pos = c.pos0; pos < c.pos1; ++pos, ++t) {
            std::copy_n(o.begin() + (long) t * sh.q_row(), sh.q_row(),
                        out[(size_t) c.seq].begin() + (long) pos * sh.q_row());
        }
    }
}

Outputs empty_outputs(const Data & d) {
    Outputs out;
    for (int32_t len : d.lens) {
        out.emplace_back((size_t) len * d.shape.q_row(), std::nanf(""));
    }
    return out;
}

// Each sequence alone, its whole prompt in one call, one thread.
Outputs run_alone(const Data & d, const Pool & p) {
    Outputs out = empty_outputs(d);
    for (int32_t s = 0; s < (int32_t) d.lens.size(); ++s) {
        run_step(d, p, { { s, 0, d.lens[(size_t) s] } }, 1, out);
    }
    return out;
}

// All sequences together, as the engine schedules them: each step gives every unfinished sequence
// (in a shuffled order) up to what is left of `budget` tokens, so prompts are cut anywhere and share
// steps; the last n_decode positions of each sequence run one token per step.
Outputs run_batched(const Data & d, const Pool & p, int32_t budget, int32_t n_decode, int n_threads, uint32_t seed) {
    Outputs out = empty_outputs(d);
    std::mt19937 rng(seed);
    std::vector<int32_t> done(d.lens.size(), 0);
    std::vector<int32_t> order(d.lens.size());
    std::iota(order.begin(), order.end(), 0);
    while (true) {
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<Chunk> step;
        int32_t left = budget;
        for (int32_t s : order) {
            const int32_t len = d.lens[(size_t) s];
            const int32_t prompt = len - n_decode;
            const int32_t want = done[(size_t) s] < prompt ? prompt - done[(size_t) s] : std::min(1, len - done[(size_t) s]);
            const int32_t n = std::min(want, left);
            if (n > 0) {
                step.push_back({ s, done[(size_t) s], done[(size_t) s] + n });
                done[(size_t) s] += n;
                left -= n;
            }
        }
        if (step.empty()) {
            break;
        }
        run_step(d, p, step, n_threads, out);
    }
    return out;
}

int g_num_runs = 0;

void expect_same_bits(const Outputs & want, const Outputs & got, const Shape & sh, const char * what) {
    for (size_t s = 0; s < want.size(); ++s) {
        if (std::memcmp(want[s].data(), got[s].data(), want[s].size() * sizeof(float)) != 0) {
            size_t i = 0;
            while (std::memcmp(&want[s][i], &got[s][i], sizeof(float)) == 0) {
                ++i;
            }
            std::fprintf(stderr, "not invariant (%s): gqa %d head_dim %d %s, sequence %zu position %zu: %.9g vs %.9g\n",
                         what, sh.gqa, sh.head_dim, ggml_type_name(sh.kv_type), s, i / (size_t) sh.q_row(),
                         got[s][i], want[s][i]);
            assert(false);
        }
    }
    ++g_num_runs;
}

void check_shape(const Shape & sh, uint32_t seed) {
    const Data d = make_data(sh, seed);
    const Pool pool = make_pool(d, 16, seed + 1);
    const Outputs alone = run_alone(d, pool);
    for (const std::vector<float> & rows : alone) {
        for (float x : rows) {
            assert(std::isfinite(x));  // every row written, no NaN row read
        }
    }
    for (int32_t budget : { 512, 64, 17 }) {
        expect_same_bits(alone, run_batched(d, pool, budget, 8, 2, seed + (uint32_t) budget), sh, "token budget");
    }
    expect_same_bits(alone, run_batched(d, pool, 40, 20, 3, seed + 2), sh, "3 threads");
    expect_same_bits(alone, run_batched(d, pool, 1024, 4, 1, seed + 3), sh, "1 thread");
    for (int32_t block_size : { 1, 8, 16, 32 }) {
        const Pool other = make_pool(d, block_size, seed + 100 + (uint32_t) block_size);
        expect_same_bits(alone, run_alone(d, other), sh, "block placement");
    }
}

}  // namespace

int main() {
    check_shape({ 3, 3, 64, GGML_TYPE_F16 }, 1);   // SmolLM2-135M
    check_shape({ 3, 3, 64, GGML_TYPE_F32 }, 2);
    check_shape({ 2, 1, 128, GGML_TYPE_F16 }, 3);
    check_shape({ 1, 4, 128, GGML_TYPE_F16 }, 4);
    check_shape({ 2, 2, 72, GGML_TYPE_F16 }, 5);   // head_dim not a multiple of 16: scalar tails
    check_shape({ 2, 2, 16, GGML_TYPE_F32 }, 6);   // the tiny test model's shape
    std::printf("test_paged_attention_invariance: ok (%d runs bit-identical to each sequence alone)\n", g_num_runs);
    return 0;
}
