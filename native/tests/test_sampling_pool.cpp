// test_sampling_pool.cpp - SamplingPool (engine/sampling_pool.h): the same tokens on 1, 2 and 4
// threads, a failing row reported once every thread let go.
#undef NDEBUG  // the checks must run in Release builds too
#include "core/error.h"
#include "engine/config.h"
#include "engine/sampling.h"
#include "engine/sampling_pool.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace cf;

namespace {

constexpr int32_t kN = 64;  // LlamaSession::kTopKCandidates
constexpr int32_t kVocab = 49152;

struct Row {
    std::vector<int32_t> ids;
    std::vector<float> logits;
};

// kN distinct token ids and distinct logits with a model-like spread, in random order.
Row make_row(std::mt19937 & rng) {
    Row r;
    std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
    std::normal_distribution<float> noise(0.0f, 0.5f);
    while ((int32_t) r.ids.size() < kN) {
        const int32_t id = token(rng);
        if (std::find(r.ids.begin(), r.ids.end(), id) == r.ids.end()) {
            r.ids.push_back(id);
            r.logits.push_back(12.0f - 3.0f * std::log(1.0f + (float) r.ids.size()) + noise(rng));
        }
    }
    std::vector<size_t> order((size_t) kN);
    for (size_t i = 0; i < order.size(); ++i) {
        order[i] = i;
    }
    std::shuffle(order.begin(), order.end(), rng);
    Row shuffled;
    for (size_t i : order) {
        shuffled.ids.push_back(r.ids[i]);
        shuffled.logits.push_back(r.logits[i]);
    }
    return shuffled;
}

SamplingParams llama_server_defaults(int64_t seed) {
    cf_sampling_params p = default_sampling_params();
    p.temperature = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.seed = seed;
    return SamplingParams::from_c(p, 0);
}

std::unique_ptr<Sequence> make_seq(const SamplingParams & p, int64_t request_id = 1) {
    const int32_t prompt[1] = {1};
    auto seq = std::make_unique<Sequence>(request_id, prompt, 1, p, 0, 0, 16);
    seq->sampler = make_sampler(p, nullptr);
    return seq;
}

// Rows of a fixed set of sequences over several steps: every token, in row order.
std::vector<int32_t> pool_tokens(int32_t num_threads, int32_t num_rows, int32_t num_steps) {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int32_t i = 0; i < num_rows; ++i) {
        seqs.push_back(make_seq(llama_server_defaults(1000 + i), i + 1));
    }
    SamplingPool pool(num_threads, kN);
    assert(pool.num_threads() == num_threads);
    std::mt19937 rng(11);
    std::vector<Row> data;
    std::vector<CandidateRow> rows((size_t) num_rows);
    std::vector<int32_t> tokens;
    for (int32_t step = 0; step < num_steps; ++step) {
        data.clear();
        for (int32_t i = 0; i < num_rows; ++i) {
            data.push_back(make_row(rng));
        }
        for (int32_t i = 0; i < num_rows; ++i) {
            rows[(size_t) i] = CandidateRow{seqs[(size_t) i].get(), data[(size_t) i].ids.data(),
                                            data[(size_t) i].logits.data(), kN, (size_t) i, CF_TOKEN_NONE};
        }
        pool.sample(rows.data(), rows.size());
        for (const CandidateRow & row : rows) {
            assert(row.token != CF_TOKEN_NONE);
            tokens.push_back(row.token);
        }
    }
    return tokens;
}

void test_threads_give_the_serial_tokens() {
    for (int32_t num_rows : {3, (int32_t) SamplingPool::kMinParallelRows, 100}) {
        const std::vector<int32_t> serial = pool_tokens(1, num_rows, 30);
        assert(pool_tokens(2, num_rows, 30) == serial);
        assert(pool_tokens(4, num_rows, 30) == serial);
    }
}

void test_a_failing_row_is_reported_and_the_pool_goes_on() {
    std::vector<std::unique_ptr<Sequence>> seqs;
    for (int32_t i = 0; i < 40; ++i) {
        seqs.push_back(make_seq(llama_server_defaults(i), i + 1));
    }
    seqs[17]->sampler.reset();  // no chain: sample_candidates throws for it
    std::mt19937 rng(13);
    const Row r = make_row(rng);
    std::vector<CandidateRow> rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
        rows.push_back(CandidateRow{seqs[i].get(), r.ids.data(), r.logits.data(), kN, i, CF_TOKEN_NONE});
    }
    SamplingPool pool(4, kN);
    bool thrown = false;
    try {
        pool.sample(rows.data(), rows.size());
    } catch (const Error & e) {
        thrown = std::string(e.what()).find("request 18") != std::string::npos;
    }
    assert(thrown);
    rows.erase(rows.begin() + 17);
    pool.sample(rows.data(), rows.size());  // every worker let go of the failed job
    for (const CandidateRow & row : rows) {
        assert(row.token != CF_TOKEN_NONE);
    }
    rows[0].n = kN + 1;  // more than the scratch holds: refused before any row is sampled
    thrown = false;
    try {
        pool.sample(rows.data(), rows.size());
    } catch (const Error &) {
        thrown = true;
    }
    assert(thrown);
}

}  // namespace

int main() {
    test_threads_give_the_serial_tokens();
    test_a_failing_row_is_reported_and_the_pool_goes_on();
    std::printf("test_sampling_pool: ok\n");
    return 0;
}
