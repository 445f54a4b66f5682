// bench_sampling.cpp - cost of the CPU sampling phase of top-k candidate rows: each of B sequences
// with llama-server's default chain (top_k 40 -> top_p 0.95 -> min_p 0.05 -> temp 0.8 -> dist)
// picks its token from 64 candidates (LlamaSession::kTopKCandidates, in no particular order, as
// ggml_top_k leaves them), on SamplingPool with 1..T threads.
//
// Build and run (arguments: rows per step, most threads, steps):
//   cmake --build build/dev --target bench_sampling && build/dev/bench_sampling [256 4 200]
// Each step's candidates are fresh (precomputed: a model-like spread of logits, shuffled); with
// "cold" a 32 MiB buffer is read between steps, as a decode would evict the caches. Prints per
// thread count the median time of a step's sampling phase and per row, and a checksum of the
// tokens (the same for every thread count: each row runs its own chain once).
#include "engine/config.h"
#include "engine/llama_session.h"
#include "engine/sampling.h"
#include "engine/sampling_pool.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

namespace {

constexpr int32_t kCandidates = cf::LlamaSession::kTopKCandidates;
constexpr size_t kEvictBytes = (size_t) 32 << 20;

struct StepCandidates {
    std::vector<int32_t> ids;   // [rows][kCandidates]
    std::vector<float> logits;  // [rows][kCandidates]
};

// Logits 12 - 3 ln(1 + rank) + noise, shuffled: a few likely tokens then a long tail, like a small
// instruct model's top 64 at temperature 0.8.
StepCandidates make_step(int32_t rows, std::mt19937 & rng) {
    StepCandidates s;
    s.ids.resize((size_t) rows * kCandidates);
    s.logits.resize(s.ids.size());
    std::normal_distribution<float> noise(0.0f, 0.5f);
    std::uniform_int_distribution<int32_t> token(0, 49151);
    for (int32_t r = 0; r < rows; ++r) {
        std::vector<int32_t> order((size_t) kCandidates);
        for (int32_t i = 0; i < kCandidates; ++i) {
            order[(size_t) i] = i;
        }
        std::shuffle(order.begin(), order.end(), rng);
        for (int32_t i = 0; i < kCandidates; ++i) {
            const size_t at = (size_t) r * kCandidates + (size_t) order[(size_t) i];
            s.ids[at] = token(rng);
            s.logits[at] = 12.0f - 3.0f * std::log(1.0f + (float) i) + noise(rng);
        }
    }
    return s;
}

std::vector<std::unique_ptr<cf::Sequence>> make_seqs(int32_t rows) {
    cf_sampling_params p = cf::default_sampling_params();
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    std::vector<std::unique_ptr<cf::Sequence>> seqs;
    const int32_t prompt[1] = {1};
    for (int32_t r = 0; r < rows; ++r) {
        p.seed = 1000 + r;
        cf::SamplingParams sp = cf::SamplingParams::from_c(p, 0);
        auto seq = std::make_unique<cf::Sequence>(r + 1, prompt, 1, sp, 0, 0, 16);
        seq->sampler = cf::make_sampler(sp, nullptr);
        seqs.push_back(std::move(seq));
    }
    return seqs;
}

double median(std::vector<double> x) {
    std::sort(x.begin(), x.end());
    return x[x.size() / 2];
}

// Median ns of one step's sampling phase with num_threads threads; *checksum: sum of the tokens.
double run(int32_t rows, int32_t num_threads, int32_t steps, bool cold, const std::vector<StepCandidates> & data,
           int64_t * checksum) {
    auto seqs = make_seqs(rows);
    cf::SamplingPool pool(num_threads, kCandidates);
    std::vector<cf::CandidateRow> batch((size_t) rows);
    std::vector<char> evict(cold ? kEvictBytes : 0);
    std::vector<double> step_ns;
    int64_t sum = 0;
    volatile char sink = 0;
    for (int32_t s = 0; s < steps; ++s) {
        const StepCandidates & c = data[(size_t) s % data.size()];
        for (int32_t r = 0; r < rows; ++r) {
            cf::CandidateRow & row = batch[(size_t) r];
            row.seq = seqs[(size_t) r].get();
            row.ids = c.ids.data() + (size_t) r * kCandidates;
            row.logits = c.logits.data() + (size_t) r * kCandidates;
            row.n = kCandidates;
        }
        for (size_t i = 0; i < evict.size(); i += 64) {
            evict[i] = (char) (evict[i] + 1);
            sink = (char) (sink + evict[i]);
        }
        const auto t0 = std::chrono::steady_clock::now();
        pool.sample(batch.data(), batch.size());
        step_ns.push_back((double) std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now() - t0).count());
        for (const cf::CandidateRow & row : batch) {
            sum += row.token;
        }
    }
    *checksum = sum;
    return median(step_ns);
}

}  // namespace

int main(int argc, char ** argv) {
    const int32_t rows = argc > 1 ? std::atoi(argv[1]) : 256;
    const int32_t max_threads = argc > 2 ? std::atoi(argv[2]) : 4;
    const int32_t steps = argc > 3 ? std::atoi(argv[3]) : 200;
    std::mt19937 rng(7);
    std::vector<StepCandidates> data;
    for (int32_t s = 0; s < 16; ++s) {
        data.push_back(make_step(rows, rng));
    }
    std::printf("top-k candidate sampling: %d rows of %d candidates, llama-server defaults, median of %d steps\n",
                rows, kCandidates, steps);
    for (const bool cold : {false, true}) {
        for (int32_t t = 1; t <= max_threads; ++t) {
            int64_t checksum = 0;
            const double ns = run(rows, t, steps, cold, data, &checksum);
            std::printf("%-4s threads %2d: %8.1f us per step, %6.2f us per row (token checksum %lld)\n",
                        cold ? "cold" : "warm", t, ns / 1e3, ns / 1e3 / rows, (long long) checksum);
        }
    }
    return 0;
}
