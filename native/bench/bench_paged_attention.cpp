// bench_paged_attention.cpp - one layer of CPU paged attention, the invariant kernel against the
// ggml-numerics one, on SmolLM2-135M's shape (9 query heads, 3 kv heads, head_dim 64, f16 cache,
// block size 16), shuffled block tables.
//
// Build and run (one thread by default; the first argument sets the thread count):
//   cmake --build build/dev --target bench_paged_attention && build/dev/bench_paged_attention [n_threads]
// Prints the median time per call of each kernel over alternating rounds, and their ratio.
#include "kernels/cpu/paged_attention_cpu.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr int32_t kHeads = 9, kHeadsKv = 3, kHeadDim = 64, kBlockSize = 16;

// One sequence of the step: positions [len - n_new, len) are its tokens in the batch.
struct Seq {
    int32_t len;
    int32_t n_new;
};

// Inputs of one paged attention call and the arrays its args point into.
struct Step {
    std::vector<ggml_fp16_t> k, v;
    std::vector<float> q, out;
    std::vector<int32_t> tables, tok_seq, tok_ctx;
    cf::PagedAttentionArgs args{};
};

Step make_step(const std::vector<Seq> & seqs, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    Step st;
    int32_t max_blocks = 0, n_blocks = 0;
    for (const Seq & s : seqs) {
        max_blocks = std::max(max_blocks, (s.len + kBlockSize - 1) / kBlockSize);
        n_blocks += (s.len + kBlockSize - 1) / kBlockSize;
    }
    std::vector<int32_t> ids((size_t) n_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    st.tables.assign(seqs.size() * (size_t) max_blocks, -1);
    size_t next = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
        for (int32_t b = 0; b < (seqs[s].len + kBlockSize - 1) / kBlockSize; ++b) {
            st.tables[s * (size_t) max_blocks + (size_t) b] = ids[next++];
        }
        for (int32_t i = 0; i < seqs[s].n_new; ++i) {
            st.tok_seq.push_back((int32_t) s);
            st.tok_ctx.push_back(seqs[s].len - seqs[s].n_new + i + 1);
        }
    }
    const size_t row = (size_t) kHeadsKv * kHeadDim;
    const size_t kv_size = (size_t) n_blocks * kBlockSize;
    st.k.resize(kv_size * row);
    st.v.resize(kv_size * row);
    for (size_t i = 0; i < st.k.size(); ++i) {
        st.k[i] = ggml_fp32_to_fp16(uni(rng));
        st.v[i] = ggml_fp32_to_fp16(uni(rng));
    }
    const int32_t n_tokens = (int32_t) st.tok_seq.size();
    st.q.resize((size_t) n_tokens * kHeads * kHeadDim);
    for (float & x : st.q) {
        x = 2.0f * uni(rng);
    }
    st.out.assign(st.q.size(), 0.0f);

    cf::PagedAttentionArgs & a = st.args;
    a.q = (const char *) st.q.data();
    a.q_stride_head_bytes = kHeadDim * sizeof(float);
    a.q_stride_token_bytes = (size_t) kHeads * kHeadDim * sizeof(float);
    a.k_pool = (const char *) st.k.data();
    a.v_pool = (const char *) st.v.data();
    a.k_type = a.v_type = GGML_TYPE_F16;
    a.k_stride_row_bytes = a.v_stride_row_bytes = row * sizeof(ggml_fp16_t);
    a.kv_size = (int64_t) kv_size;
    a.block_tables = st.tables.data();
    a.block_table_stride = max_blocks;
    a.token_seq_idx = st.tok_seq.data();
    a.token_ctx_len = st.tok_ctx.data();
    a.out = st.out.data();
    a.n_tokens = n_tokens;
    a.n_head = kHeads;
    a.n_head_kv = kHeadsKv;
    a.head_dim_k = a.head_dim_v = kHeadDim;
    a.block_size = kBlockSize;
    a.scale = 0.125f;
    a.softcap = 0.0f;
    return st;
}

using Kernel = void (*)(const cf::PagedAttentionArgs &, int, int);

// Seconds per call of kernel on n_threads threads (each call runs every thread's share), timed
// over about 50 ms.
double time_calls(Kernel kernel, const cf::PagedAttentionArgs & a, int n_threads) {
    auto call = [&] {
        std::vector<std::thread> workers;
        for (int t = 1; t < n_threads; ++t) {
            workers.emplace_back(kernel, std::cref(a), t, n_threads);
        }
        kernel(a, 0, n_threads);
        for (std::thread & w : workers) {
            w.join();
        }
    };
    call();  // warm up: scratch buffers, caches
    int32_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0.0;
    do {
        call();
        ++n;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (elapsed < 0.05);
    return elapsed / n;
}

double median(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}

void bench(const char * name, const std::vector<Seq> & seqs, int n_threads) {
    const Step st = make_step(seqs, 42);
    std::vector<double> inv, ggml;
    for (int round = 0; round < 7; ++round) {  // alternating, so both see the same machine load
        inv.push_back(time_calls(cf::paged_attention_cpu, st.args, n_threads));
        ggml.push_back(time_calls(cf::paged_attention_cpu_ggml, st.args, n_threads));
    }
    const double a = median(inv) * 1e6, b = median(ggml) * 1e6;
    std::printf("%-34s invariant %9.1f us   ggml %9.1f us   ggml / invariant %.2fx\n", name, a, b, b / a);
}

}  // namespace

int main(int argc, char ** argv) {
    const int n_threads = argc > 1 ? std::max(1, std::atoi(argv[1])) : 1;
    std::printf("one attention layer, %d thread(s), median of 7 alternating rounds\n", n_threads);
    std::mt19937 rng(7);
    std::vector<Seq> decode16;
    for (int i = 0; i < 16; ++i) {
        decode16.push_back({ std::uniform_int_distribution<int32_t>(128, 256)(rng), 1 });
    }
    bench("decode, 16 seqs, ctx 128..256", decode16, n_threads);
    bench("decode, 1 seq, ctx 200", { { 200, 1 } }, n_threads);
    bench("decode, 1 seq, ctx 1000", { { 1000, 1 } }, n_threads);
    bench("prefill, 512 tokens from 0", { { 512, 512 } }, n_threads);
    bench("prefill chunk, 64 tokens at 448", { { 512, 64 } }, n_threads);
    std::vector<Seq> mixed = decode16;
    mixed.push_back({ 300, 100 });
    bench("mixed, 16 decode + 100-token chunk", mixed, n_threads);
    return 0;
}
